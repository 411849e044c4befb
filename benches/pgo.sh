#!/usr/bin/env bash
# Makes the profile that release builds are laid out by (benches/pgo/modelgate.profdata, applied
# by the rustc wrapper benches/pgo/rustc that .cargo/config.toml names): builds an instrumented
# gateway, drives it with a fixed number of the benchbed's requests of each kind (chat JSON and
# stream passthrough, messages and responses translated to a chat upstream, a messages and a
# responses stream), and merges the counts. With them LLVM places the code a served request
# runs together and moves the rest out of its cache lines, which is most of what a request
# costs at a low rate (benches/footprint.sh). Run it again after a change on the request path:
# a function changed since the profile was made is built as without one. Needs rustup's
# llvm-tools component (for llvm-profdata; added when missing), oha, and the benchbed's
# mock-upstream built. The next `cargo build --release` uses the new profile. At its end it runs
# benches/bolt.sh, whose post-link profile is made on the binary this profile builds.
#   benches/pgo.sh [OUT]      (default benches/pgo/modelgate.profdata)
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
out=${1:-benches/pgo/modelgate.profdata}
mport=${MOCK_PORT:-18380}
gport=${GATEWAY_PORT:-18390}

sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
    rustup component add llvm-tools
fi

work=$(mktemp -d)
mock_pid='' gw_pid=''
trap 'kill $mock_pid $gw_pid 2>/dev/null || true; rm -rf "$work"' EXIT
profiles="$work/profiles"
mkdir -p "$profiles"

# A target directory of its own, so that the instrumented build replaces no other. RUSTFLAGS
# with a profile flag makes the wrapper leave the compile as it is.
RUSTFLAGS="-Cprofile-generate=$profiles" \
    cargo build --release --bin modelgate --target-dir target/pgo-generate
# The build scripts and proc macros the build ran were instrumented too, and wrote their own
# counts here: only the gateway's belong in its profile.
rm -f "$profiles"/*

# The gateway writes its profile when it exits.
train_binary target/pgo-generate/release/modelgate

# Sparse: functions that never ran are left out (a quarter of the size). A loop that is only
# ever left by being dropped (the connection's idle watch) has counted blocks whose successors
# never ran, and LLVM would warn on every build that it ignores part of that profile.
mkdir -p "$(dirname "$out")"
"$profdata" merge --sparse --no-function=idle_for -o "$out" "$profiles"
rustc -vV | sed -n 's/^LLVM version: //p' > "$(dirname "$out")/llvm-version"
# cargo does not see a profile change, so the release build it would reuse is removed.
cargo clean --release -q
echo "profile: $out"
# BOLT's profile names offsets in the binary this profile builds: made again with it.
if command -v llvm-bolt-15 > /dev/null || command -v llvm-bolt > /dev/null; then
    "$(dirname "$0")/bolt.sh"
else
    echo "llvm-bolt is not installed: run benches/bolt.sh where it is (benches/pgo/modelgate.fdata is now older than the profile)" >&2
fi
