#!/usr/bin/env bash
# Makes the post-link profile release builds are laid out by (benches/pgo/modelgate.fdata, applied
# by the rustc wrapper benches/pgo/rustc after it links the gateway): builds the release binary as
# the wrapper would before BOLT (with the committed LLVM profile and its relocations kept), has
# BOLT instrument it, drives it with the same requests as benches/pgo.sh, and keeps the counts.
# The profile names functions and offsets in that binary, so it is made again whenever the LLVM
# profile is (pgo.sh runs this at its end) or the request path changes; a function whose code
# changed since is laid out as without a profile, never wrongly. Needs llvm-bolt (Debian's
# bolt-15 package), oha, and the benchbed's mock-upstream built. The next
# `cargo build --release` uses the new profile.
#   benches/bolt.sh [OUT]      (default benches/pgo/modelgate.fdata)
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
out=${1:-benches/pgo/modelgate.fdata}
mport=${MOCK_PORT:-18380}
gport=${GATEWAY_PORT:-18390}
bolt=$(command -v llvm-bolt-15 || command -v llvm-bolt) || {
    echo "benches/bolt.sh needs llvm-bolt (Debian: apt-get install bolt-15)" >&2
    exit 1
}
# Run from where it is installed: BOLT finds its instrumentation runtime in ../lib beside its own
# path, and Debian's /usr/bin/llvm-bolt-15 is a link to /usr/lib/llvm-15/bin/llvm-bolt.
bolt=$(realpath "$bolt")

work=$(mktemp -d)
mock_pid='' gw_pid=''
trap 'kill $mock_pid $gw_pid 2>/dev/null || true; rm -rf "$work"' EXIT

# A target directory of its own, so that the binary the profile is made on replaces no other.
MODELGATE_BOLT=off RUSTFLAGS="-Clink-arg=-Wl,--emit-relocs" \
    cargo build --release --bin modelgate --target-dir target/bolt-input
"$bolt" target/bolt-input/release/modelgate -o "$work/instrumented" -instrument \
    -instrumentation-file="$work/counts.fdata" \
    > "$work/instrument.log" 2>&1 || { tail "$work/instrument.log" >&2; exit 1; }

train_binary "$work/instrumented"

mkdir -p "$(dirname "$out")"
cp "$work/counts.fdata" "$out"
# cargo does not see a profile change: the gateway's binary is removed so that the next release
# build links (and lays out) it again.
rm -f target/release/modelgate target/release/deps/modelgate-*
echo "profile: $out ($(wc -l < "$out") branches)"
