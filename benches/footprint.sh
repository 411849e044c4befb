#!/usr/bin/env bash
# Cache lines a request runs through, counted by cachegrind's cache simulation over the whole
# process (32 KiB L1 for code and for data, 1 MiB last level): a run with N requests of the
# benchbed's chat JSON request minus a run with none, as benches/instructions.sh does. At a low
# request rate, what a request costs is mostly these lines fetched anew (the machine runs other
# work between requests), more than its instructions; the counts are repeatable, unlike timings.
# Needs valgrind, oha, and the benchbed's mock-upstream built.
#   benches/footprint.sh [BIN|nginx] [N] [json|messages]
# (messages: the benchbed's S3, an Anthropic Messages request the gateway translates to the
# chat upstream; nginx passes it through, as in the benchbed.)
# With `nginx`, the same count for Debian's nginx in the benchbed's configuration, run as one
# process, for comparison. With CG_KEEP=DIR the two cachegrind outputs are kept there (for
# cg_diff and cg_annotate).
set -euo pipefail
source "$(dirname "$0")/benchbed.sh"
target=${1:-target/release/modelgate}
n=${2:-300}
kind=${3:-json}
mport=${MOCK_PORT:-18380}
port=${GATEWAY_PORT:-18390}
request_of "$kind"
work=$(mktemp -d)
trap 'kill $mock_pid 2>/dev/null || true; rm -rf "$work"' EXIT
start_mock "$mport" "$work/mock.log"
sim=(valgrind --tool=cachegrind --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=1048576,16,64)
serve_command "$target" "$port"
count() {
    local reqs=$1 out="$work/cg.$1.out"
    BENCHBED_UPSTREAM_KEY=k "${sim[@]}" --cachegrind-out-file="$out" "${cmd[@]}" \
        > "$work/run.log" 2>&1 &
    local pid=$!
    # One request before counting in both runs, so first-request costs cancel out.
    for _ in $(seq 150); do
        curl -sf -o /dev/null -H "authorization: Bearer $key" -H 'content-type: application/json' \
            -d "$body" "http://127.0.0.1:$port$path" && break
        sleep 0.2
    done
    if [ "$reqs" -gt 0 ]; then
        oha -n "$reqs" -c 1 --no-tui -m POST -H "authorization: Bearer $key" \
            -H 'content-type: application/json' -d "$body" \
            "http://127.0.0.1:$port$path" > /dev/null
    fi
    sleep 0.5
    # The gateway stops on SIGINT; nginx, run as one process, on SIGQUIT.
    kill -INT "$pid" 2>/dev/null || true
    kill -QUIT "$pid" 2>/dev/null || true
    wait "$pid" || true
    if [ -n "${CG_KEEP:-}" ]; then mkdir -p "$CG_KEEP" && cp "$out" "$CG_KEEP/"; fi
    grep '^summary:' "$out"
}
zero=$(count 0)
many=$(count "$n")
python3 - "$zero" "$many" "$n" "$target" "$kind" <<'EOF'
import sys
zero, many, n, target, kind = sys.argv[1].split()[1:], sys.argv[2].split()[1:], int(sys.argv[3]), sys.argv[4], sys.argv[5]
names = "Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw".split()
per = {k: (int(b) - int(a)) / n for k, a, b in zip(names, zero, many)}
print(f"{target} ({kind}): per request {per['Ir']:.0f} instructions, {per['I1mr']:.0f} code lines and "
      f"{per['D1mr'] + per['D1mw']:.0f} data lines missed in L1 "
      f"({per['ILmr'] + per['DLmr'] + per['DLmw']:.0f} in the last level), {n} requests")
EOF
