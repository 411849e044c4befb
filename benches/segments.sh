#!/usr/bin/env bash
# Instructions on each stretch of a request's way through the gateway, split at its socket calls:
# callgrind dumps its counts before every `recv` and `send`, so each dump holds what ran between
# two of them. For a keep-alive JSON request that is four stretches: the client's request read →
# the upstream write (the request side), that write → the answer's read (waiting: the event
# loop's own work), the answer read → the client write (the reply side), and that write → the
# next request's read (what the gateway does after the answer is out: the access line, drops).
# The first and third are what a client waits for; instructions.sh counts all four together.
# With `nginx` for BIN, the same for Debian's nginx in the benchbed's configuration, run as one
# process (it writes with `writev`). Needs valgrind, oha, and the benchbed's mock-upstream built.
# With CODE_LINES=1, also the distinct code lines each stretch runs through (benches/code_lines.py's
# count, per stretch): at a low rate each is fetched anew, so the request and reply stretches'
# lines are what a cold request waits for. With CG_KEEP=DIR the dumps are kept there, for
# callgrind_annotate on one stretch.
#   benches/segments.sh [BIN|nginx] [json|messages|claude|responses] [N]
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
here=$(dirname "$(realpath "$0")")
target=${1:-target/release/modelgate}
kind=${2:-json}
n=${3:-60}
mport=${MOCK_PORT:-18382}
gport=${GATEWAY_PORT:-18392}
work=$(mktemp -d)
gw_pid=''
trap 'kill $mock_pid $gw_pid 2>/dev/null || true; rm -rf "$work"' EXIT
start_mock "$mport" "$work/mock.log"
request_of "$kind"
send() {
    oha -n "$1" -c 1 --no-tui -m POST -H "authorization: Bearer $key" \
        -H 'content-type: application/json' -d "$body" "http://127.0.0.1:$gport$path" > /dev/null
}
serve_command "$target" "$gport"
# One event loop (one nginx process), so one thread's calls in order.
BENCHBED_UPSTREAM_KEY=k TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind ${CODE_LINES:+--dump-instr=yes} \
    --dump-before=recv --dump-before=send --dump-before=writev \
    --callgrind-out-file="$work/cg.out" "${cmd[@]}" > "$work/gw.log" 2>&1 &
gw_pid=$!
wait_ready "$gport"
send 20
sleep 1
# The requests counted are those after the dumps made so far.
first=$(find "$work" -name 'cg.out.*' | wc -l)
send "$n"
sleep 1
# The gateway stops on SIGINT; nginx, run as one process, on SIGQUIT.
kill -INT "$gw_pid" 2>/dev/null || true
kill -QUIT "$gw_pid" 2>/dev/null || true
wait "$gw_pid" 2>/dev/null || true
gw_pid=''
python3 "$here/segments.py" "$work" "$first" "$n" ${CODE_LINES:+--lines}
if [ -n "${CG_KEEP:-}" ]; then mkdir -p "$CG_KEEP" && cp "$work"/cg.out.* "$CG_KEEP/"; fi
