#!/usr/bin/env bash
# Instructions per request, counted by callgrind over the whole gateway process: a run with N
# requests of one kind minus a run with none, so start-up and shutdown cancel out. Counts are
# repeatable whatever else the machine does, unlike timings. Needs valgrind, oha, and the
# benchbed's mock-upstream built (cd ../shared/benchbed && cargo build --release).
#   benches/instructions.sh [BIN] [json|stream|messages|messages-stream|responses|responses-stream|responses-history|responses-references|claude|claude-stream] [N]
# (messages: the benchbed's S3, an Anthropic Messages request translated to the chat upstream;
# messages-stream: the same request streamed, the mock's 23 chat events translated to Anthropic's;
# responses-stream: the same question as a streamed Responses request, translated likewise;
# claude: the benchbed's chat request for the mock's messages upstream, translated both ways;
# responses-references: after a 40-turn conversation made through the gateway first, in both
# runs, the next turn as the AI SDK sends it, each earlier answer an `item_reference`)
# With CG_KEEP=DIR the two callgrind outputs are kept there, for callgrind_annotate. GW_EXTRA is
# appended to the config (e.g. '[server]\nworkers = 0' for the one shared runtime). With FRESH=1
# every request opens a connection of its own (oha --disable-keepalive): what a new connection
# adds, which at a low rate is half the benchbed's requests (its load client opens 50 afresh).
# With CODE_LINES=1 it also prints the distinct code a request runs through, in 64-byte lines and
# 4 KB pages (benches/code_lines.py): what a request fetches anew when its caches are cold.
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
bin=$(realpath "${1:-target/release/modelgate}")
kind=${2:-json}
n=${3:-300}
mport=${MOCK_PORT:-18380}
gport=${GATEWAY_PORT:-18390}
work=$(mktemp -d)
trap 'kill $mock_pid 2>/dev/null || true; rm -rf "$work"' EXIT
start_mock "$mport" "$work/mock.log"
gateway_config "$work/cfg" "$gport" "$mport"
printf '%b' "${GW_EXTRA:-}" >> "$work/cfg/gw.toml"
request_of "$kind"
count() {
    local reqs=$1 out="$work/cg.$1.out"
    BENCHBED_UPSTREAM_KEY=k TOKIO_WORKER_THREADS=1 \
        valgrind --tool=callgrind ${CODE_LINES:+--dump-instr=yes} --callgrind-out-file="$out" "$bin" serve --config "$work/cfg/gw.toml" \
        > "$work/gw.log" 2>&1 &
    local pid=$!
    wait_ready "$gport"
    if [ "$kind" = responses-references ]; then body=$(references_body "$gport"); fi
    # One warm-up request in both runs: the first request's one-time costs cancel out too.
    curl -s -o /dev/null -H "authorization: Bearer $key" -H 'content-type: application/json' \
        -d "$body" "http://127.0.0.1:$gport$path"
    if [ "$reqs" -gt 0 ]; then
        oha -n "$reqs" -c 1 ${FRESH:+--disable-keepalive} --no-tui -m POST -H "authorization: Bearer $key" \
            -H 'content-type: application/json' -d "$body" \
            "http://127.0.0.1:$gport$path" > /dev/null
    fi
    sleep 0.5
    kill -INT "$pid"
    wait "$pid" || true
    if [ -n "${CG_KEEP:-}" ]; then mkdir -p "$CG_KEEP" && cp "$out" "$CG_KEEP/"; fi
    awk '/^(summary|totals):/ {print $2; exit}' "$out"
}
sleep 0.5
zero=$(count 0)
many=$(count "$n")
echo "$kind: $(( (many - zero) / n )) instructions per request ($n requests, $bin)"
if [ -n "${CODE_LINES:-}" ]; then
    python3 "$(dirname "$0")/code_lines.py" "$work/cg.0.out" "$work/cg.$n.out" "$n"
fi
