#!/usr/bin/env bash
# Memory of the gateway process: RSS when idle, and RSS per open stream. Starts the release
# binary on the benchbed's mock upstream (cd ../shared/benchbed && cargo build --release), sends
# one request of each kind as a warm-up, reads the idle RSS, then holds N streams open at once
# (the mock sends one event every 250 ms) and reads the RSS again: (open − idle) / N per stream,
# for a passthrough chat stream and for a messages client translated to the chat upstream.
# The idle figure counts the binary's own pages mapped, which depends on the page cache: a
# binary just written may sit in large folios that map a whole segment at the first touch
# (12.9 MB idle against 7.4 MB for the same file read afresh). To compare builds, drop the
# cache first (sync; echo 3 > /proc/sys/vm/drop_caches, as root).
#   benches/memory.sh [BIN] [N]
set -euo pipefail
bin=$(realpath "${1:-target/release/modelgate}")
n=${2:-400}
bb=$(realpath ../shared/benchbed)
mock="$bb/target/release/mock-upstream"
probe="$bb/target/release/sse-probe"
mport=${MOCK_PORT:-18381}
gport=${GATEWAY_PORT:-18391}
key=sk-benchbed-local-only-0123456789abcdef0123456789abcdef
work=$(mktemp -d)
trap 'kill $mock_pid $gw_pid 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
MOCK_THREADS=1 "$mock" "$mport" > "$work/mock.log" 2>&1 &
mock_pid=$!
gw_pid=
sed -e "s/@PROJECT_PORT@/$gport/" -e "s/@MOCK_PORT@/$mport/" "$bb/conf/modelgate.toml.in" > "$work/gw.toml"
cat >> "$work/gw.toml" <<'EOF'

[[models]]
name = "mock-gpt-hold"
upstream = "mock-chat"
upstream_model = "mock-gpt@delay_us=250000@chunks=80"
EOF
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$gw_pid/status"; }
# The anonymous part (heap, stacks): RSS also counts the binary's file pages faulted in, which
# move with the profile's layout from one build to the next.
anon() { awk '/^RssAnon:/ {print $2}' "/proc/$gw_pid/status"; }
url=http://127.0.0.1:$gport
auth=(-H "authorization: Bearer $key" -H 'content-type: application/json')
warm() {
    local chat='{"model":"mock-gpt","messages":[{"role":"user","content":"hi"}]'
    local msgs='{"model":"mock-gpt","max_tokens":64,"messages":[{"role":"user","content":"hi"}]'
    for _ in 1 2 3; do
        curl -s -o /dev/null "${auth[@]}" -d "$chat}" "$url/v1/chat/completions"
        curl -s -o /dev/null "${auth[@]}" -d "$chat,\"stream\":true}" "$url/v1/chat/completions"
        curl -s -o /dev/null "${auth[@]}" -d "$msgs}" "$url/v1/messages"
        curl -s -o /dev/null "${auth[@]}" -d "$msgs,\"stream\":true}" "$url/v1/messages"
    done
}
start() {
    BENCHBED_UPSTREAM_KEY=k "$bin" serve --config "$work/gw.toml" > "$work/gw.log" 2>&1 &
    gw_pid=$!
    for _ in $(seq 100); do curl -s -o /dev/null "$url/v1/models" && break; sleep 0.1; done
    sleep 1
}
stop() { kill "$gw_pid"; wait "$gw_pid" || true; }
hold() { # path body label: a fresh gateway each time, so one kind's freed memory is not the next one's baseline
    start
    warm
    sleep 1
    local before=$(rss) before_anon=$(anon) peak=0
    # All N requests go out within 1 s; each stream lasts 20 s, so all are open at the sample.
    "$probe" --url "$url$1" --body "$2" -H "authorization: Bearer $key" \
        --rate "$n" --duration 1 --warmup 0 --max-inflight $((n + 10)) --grace 30 --timeout 40 \
        --out "$work/probe.json" > "$work/probe.log" 2>&1 &
    local probe_pid=$!
    sleep 6
    local open=$(ss -Htn state established "( sport = :$gport )" | wc -l)
    peak=$(rss)
    local peak_anon=$(anon)
    echo "$3: $open client connections open, RSS $before -> $peak KiB, $(( (peak - before) * 1024 / n )) bytes per stream ($(( (peak_anon - before_anon) * 1024 / n )) anonymous)"
    kill "$probe_pid" 2>/dev/null || true
    wait "$probe_pid" 2>/dev/null || true
    stop
}
start
echo "idle RSS at start: $(rss) KiB ($(anon) KiB anonymous)"
warm
sleep 1
echo "idle RSS after three requests of each kind: $(rss) KiB ($(anon) KiB anonymous)"
stop
hold /v1/chat/completions '{"model":"mock-gpt-hold","stream":true,"messages":[{"role":"user","content":"hi"}]}' "passthrough chat stream"
hold /v1/messages '{"model":"mock-gpt-hold","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}' "messages -> chat stream"
