#!/usr/bin/env bash
# Where a request's time goes inside the gateway, phase by phase (src/phases.rs): builds the
# gateway with the `phase-times` feature (into target/phases, laid out by the same PGO profile
# as a release build) and sends it the benchbed's requests as the benchbed does, 50 connections
# the load client opens afresh, at RATE per second for SECS seconds, ROUNDS times. Every 100
# requests each event loop prints the median of each phase in µs, apart for requests that came
# on a new connection and on a reused one; this prints those lines. At a low rate (20/s) each
# request finds the caches cold, as most real traffic does; at 500/s they are warm. The
# upstream's own time shows in `written` (the write returns only once the kernel lets the
# sender go on; on a busy core the upstream runs first) and `answered`.
# Needs oha and the benchbed's mock-upstream built (cd ../shared/benchbed && cargo build --release).
#   benches/phases.sh [RATE] [SECS] [ROUNDS] [json|stream|messages|messages-stream|responses-stream]
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
rate=${1:-20}
secs=${2:-10}
rounds=${3:-2}
kind=${4:-json}
mport=${MOCK_PORT:-18386}
gport=${GATEWAY_PORT:-18396}
cargo build --release --features phase-times --bin modelgate --target-dir target/phases >&2
bin=target/phases/release/modelgate
work=$(mktemp -d)
mock_pid='' gw_pid=''
trap 'kill $mock_pid $gw_pid 2>/dev/null || true; rm -rf "$work"' EXIT
start_mock "$mport" "$work/mock.log"
gateway_config "$work/cfg" "$gport" "$mport"
BENCHBED_UPSTREAM_KEY=k "$bin" serve --config "$work/cfg/gw.toml" > "$work/gw.log" 2>&1 &
gw_pid=$!
wait_ready "$gport"
request_of "$kind"
seen=0
for round in $(seq "$rounds"); do
    p50=$(oha -z "${secs}s" -q "$rate" -c 50 --latency-correction --no-tui --output-format json \
        -m POST -H "authorization: Bearer $key" -H 'content-type: application/json' -d "$body" \
        "http://127.0.0.1:$gport$path" |
        python3 -c "import json,sys; print(round(json.load(sys.stdin)['latencyPercentiles']['p50']*1000, 3))")
    echo "== round $round, $kind at $rate/s: client p50 $p50 ms"
    sleep 0.2
    # Only what this round added to the log.
    total=$(wc -l < "$work/gw.log")
    sed -n "$((seen + 1)),${total}p" "$work/gw.log" | grep -a '^phases' || true
    seen=$total
done
