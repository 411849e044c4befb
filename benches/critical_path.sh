#!/usr/bin/env bash
# The proxy's own time on a request's critical path, beside nginx: the kernel's timestamps of
# its reads and writes (perf's syscall tracepoints, cheap enough not to move what they measure),
# from reading the client's request to writing it upstream, and from reading the upstream's
# answer to writing it to the client (benches/critical_path.py). The end-to-end latency the
# benchbed measures adds the loopback, the upstream and the scheduler, the same for any proxy,
# and their noise; these segments are the part a proxy's code decides, measured to the µs.
# Each round sends the benchbed's S1 (or S3, or the S2 stream) at RATE per second over 50
# connections the load client opens afresh, as the benchbed does, for SECS seconds to the
# gateway and then to nginx. Needs perf (Debian's linux-perf), oha, nginx, and the benchbed's
# mock-upstream built.
#   benches/critical_path.sh [BIN] [RATE] [SECS] [ROUNDS] [json|messages|stream] [BIN_B|nginx]
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
here=$(dirname "$(realpath "$0")")
bin=$(realpath "${1:-target/release/modelgate}")
rate=${2:-20}
secs=${3:-8}
rounds=${4:-2}
kind=${5:-json}
other=${6:-nginx}
mport=${MOCK_PORT:-18384}
pa=${GATEWAY_PORT:-18394}
pb=$((pa + 1))
work=$(mktemp -d)
mock_pid='' a_pid='' b_pid=''
trap 'kill $mock_pid $a_pid $b_pid 2>/dev/null || true; rm -rf "$work"' EXIT
start_peers
load() {
    oha "$@" -c 50 --no-tui -m POST -H "authorization: Bearer $key" \
        -H 'content-type: application/json' -d "$body" "$url"
}
events=syscalls:sys_enter_recvfrom,syscalls:sys_exit_recvfrom,syscalls:sys_enter_sendto
events=$events,syscalls:sys_enter_writev,syscalls:sys_exit_epoll_wait
for round in $(seq "$rounds"); do
    for peer in a b; do
        port=$pa pid=$a_pid name=$(basename "$bin")
        if [ "$peer" = b ]; then port=$pb pid=$b_pid name=$name_b; fi
        url="http://127.0.0.1:$port$path"
        load -n 100 > /dev/null
        # nginx serves from its workers; the gateway from its own threads.
        pids=$(echo "$pid" $(pgrep -P "$pid" || true) | tr ' ' ,)
        perf record -q -o "$work/perf.data" -e "$events" -p "$pids" -- sleep $((secs + 1)) \
            > /dev/null 2>&1 &
        perf_pid=$!
        sleep 0.3
        p50=$(load -z "${secs}s" -q "$rate" --latency-correction --output-format json \
            | python3 -c "import json,sys; p=json.load(sys.stdin)['latencyPercentiles']; print(round(p['p50']*1000, 3), 'ms, p99', round(p['p99']*1000, 3))")
        wait "$perf_pid" || true
        perf script -i "$work/perf.data" -F tid,time,event,trace > "$work/perf.txt" 2> /dev/null
        echo "== round $round, $name, $kind at $rate/s: client p50 $p50 ms"
        python3 "$here/critical_path.py" "$work/perf.txt"
    done
done
