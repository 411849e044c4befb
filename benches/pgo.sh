#!/usr/bin/env bash
# Makes the profile that release builds are laid out by (benches/pgo/modelgate.profdata, applied
# by the rustc wrapper benches/pgo/rustc that .cargo/config.toml names): builds an instrumented
# gateway, drives it with the benchbed's requests (chat JSON and stream passthrough, messages and
# responses translated to a chat upstream, a messages and a responses stream), and merges the
# counts. With them LLVM places the code a served request runs together and moves the rest out
# of its cache lines, which is most of what a request costs at a low rate
# (benches/footprint.sh). Run it again after
# a change on the request path: a function changed since the profile was made is built as
# without one. Needs rustup's llvm-tools component (for llvm-profdata; added when missing), oha,
# and the benchbed's mock-upstream built. The next `cargo build --release` uses the new profile.
#   benches/pgo.sh [OUT]      (default benches/pgo/modelgate.profdata)
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
out=${1:-benches/pgo/modelgate.profdata}
mport=${MOCK_PORT:-18380}
gport=${GATEWAY_PORT:-18390}
secs=${PGO_SECONDS:-4}

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

start_mock "$mport" "$work/mock.log"
gateway_config "$work/cfg" "$gport" "$mport"
BENCHBED_UPSTREAM_KEY=k target/pgo-generate/release/modelgate serve --config "$work/cfg/gw.toml" \
    > "$work/gw.log" 2>&1 &
gw_pid=$!
wait_ready "$gport"

responses='{"model":"mock-gpt","instructions":"You are terse.","input":"Say hello in five words.","max_output_tokens":64}'
drive() {
    oha -z "${secs}s" -c 2 --no-tui -m POST -H "authorization: Bearer $key" \
        -H 'content-type: application/json' -d "$2" "http://127.0.0.1:$gport$1" > /dev/null
}
# The mix follows what the benchbed measures: passthrough first, then the translated pairs.
drive /v1/chat/completions "$chat_body"
# New connections too: at a low rate half the benchbed's requests open one (each load client
# opens its 50 connections afresh).
oha -z 2s -c 2 --disable-keepalive --no-tui -m POST -H "authorization: Bearer $key" \
    -H 'content-type: application/json' -d "$chat_body" \
    "http://127.0.0.1:$gport/v1/chat/completions" > /dev/null
drive /v1/chat/completions "$(streamed "$chat_body")"
drive /v1/messages "$messages_body"
drive /v1/messages "$(streamed "$messages_body")"
drive /v1/responses "$responses"
drive /v1/responses "$(streamed "$responses")"
# The gateway writes its profile when it exits, and exits on SIGINT after draining.
kill -INT "$gw_pid"
wait "$gw_pid" || true

# Sparse: functions that never ran are left out (a quarter of the size). A loop that is only
# ever left by being dropped (the connection's idle watch) has counted blocks whose successors
# never ran, and LLVM would warn on every build that it ignores part of that profile.
mkdir -p "$(dirname "$out")"
"$profdata" merge --sparse --no-function=idle_for -o "$out" "$profiles"
rustc -vV | sed -n 's/^LLVM version: //p' > "$(dirname "$out")/llvm-version"
# cargo does not see a profile change, so the release build it would reuse is removed.
cargo clean --release -q
echo "profile: $out"
