#!/usr/bin/env bash
# CPU time per request at a fixed request rate, the gateway beside nginx (or a second gateway
# build), measured in turn on the benchbed's mock: each round sends the benchbed's S1 (or S3)
# request (or the S2 stream) at RATE per second over 50 kept-alive connections for SECS seconds to each peer, and
# divides the on-CPU time of all the peer's threads (/proc/PID/task/*/schedstat, kernel time
# included) by the requests served; the client's p50 latency beside it. At a low rate this is
# what a request costs with cold caches, which instruction counts do not show. Timings on this
# shared machine move from round to round: compare the peers within a round.
# Needs oha, nginx, and the benchbed's mock-upstream built.
#   benches/rate_cpu.sh [BIN] [RATE] [SECS] [ROUNDS] [json|messages|stream] [BIN_B|nginx]
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
bin=$(realpath "${1:-target/release/modelgate}")
rate=${2:-20}
secs=${3:-20}
rounds=${4:-2}
kind=${5:-json}
other=${6:-nginx}
mport=${MOCK_PORT:-18382}
pa=${GATEWAY_PORT:-18392}
pb=$((pa + 1))
work=$(mktemp -d)
mock_pid='' a_pid='' b_pid=''
trap 'kill $mock_pid $a_pid $b_pid 2>/dev/null || true; rm -rf "$work"' EXIT
start_peers
# The on-CPU nanoseconds of every thread of the given processes.
cpu_ns() {
    local total=0 pid task
    for pid in "$@"; do
        for task in /proc/"$pid"/task/*/schedstat; do
            total=$((total + $(cut -d' ' -f1 "$task")))
        done
    done
    echo "$total"
}
# The processes that serve: nginx's workers, or the gateway itself.
serving() {
    if [ "$1" = "$b_pid" ] && [ "$other" = nginx ]; then
        pgrep -P "$b_pid" | tr '\n' ' '
    else
        echo "$1"
    fi
}
printf '%-6s %-16s %9s %14s %9s\n' round peer requests "CPU/request" "p50 ms"
for round in $(seq "$rounds"); do
    for peer in a b; do
        port=$pa pid=$a_pid name=$(basename "$bin")
        if [ "$peer" = b ]; then port=$pb pid=$b_pid name=$name_b; fi
        url="http://127.0.0.1:$port$path"
        # Warm: connections, pools, the allocator.
        oha -n 50 -c 5 --no-tui -m POST -H "authorization: Bearer $key" \
            -H 'content-type: application/json' -d "$body" "$url" > /dev/null
        # shellcheck disable=SC2046
        before=$(cpu_ns $(serving "$pid"))
        oha -z "${secs}s" -q "$rate" -c 50 --latency-correction --no-tui --output-format json \
            -m POST -H "authorization: Bearer $key" -H 'content-type: application/json' \
            -d "$body" "$url" > "$work/oha.json"
        # shellcheck disable=SC2046
        after=$(cpu_ns $(serving "$pid"))
        read -r n p50 < <(python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
ok = d['statusCodeDistribution'].get('200', 0)
print(ok, round(d['latencyPercentiles']['p50'] * 1000, 3))" "$work/oha.json")
        if [ "$n" -eq 0 ]; then
            echo "no request of $name answered 200" >&2
            exit 1
        fi
        printf '%-6s %-16s %9s %11s µs %9s\n' "$round" "$name" "$n" \
            "$(( (after - before) / n / 1000 ))" "$p50"
    done
done
