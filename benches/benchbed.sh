# Sourced, not run: what the benches that run the gateway on the benchbed's fake provider share
# (instructions.sh, footprint.sh, pgo.sh, bolt.sh): the benchbed's mock, its client key, its requests,
# and the gateway's config for it. Run those from the project root, with ../shared beside it and
# the benchbed built (cd ../shared/benchbed && cargo build --release).
bb=$(realpath ../shared/benchbed)
mock=$(realpath "${MOCK_BIN:-$bb/target/release/mock-upstream}")
key=sk-benchbed-local-only-0123456789abcdef0123456789abcdef
# The benchbed's S1 chat request, and its S3 messages request (translated to a chat upstream).
chat_body='{"model":"mock-gpt","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in five words."}],"max_tokens":64,"temperature":0}'
messages_body='{"model":"mock-gpt","max_tokens":64,"system":"You are terse.","messages":[{"role":"user","content":"Say hello in five words."}]}'
# The same question as an OpenAI Responses request (translated to the chat upstream).
responses_body='{"model":"mock-gpt","max_output_tokens":64,"instructions":"You are terse.","input":"Say hello in five words."}'

# The same question after a conversation of 40 turns, each an easy-form message without an id,
# as an agent sends its whole history on every turn (about 9 KB).
history_body() {
    local turns='' i role
    for i in $(seq 40); do
        role=user
        [ $((i % 2)) -eq 0 ] && role=assistant
        turns+="{\"role\":\"$role\",\"content\":\"Turn $i of a long conversation: what was said, what was asked, and what the model answered, at about the length of a short paragraph of text.\"},"
    done
    printf '%s' "{\"model\":\"mock-gpt\",\"max_output_tokens\":64,\"instructions\":\"You are terse.\",\"input\":[${turns}{\"role\":\"user\",\"content\":\"Say hello in five words.\"}]}"
}

# The AI SDK's turn after a 40-turn conversation with `store` left on, held by the gateway on
# port $1: each earlier answer sent back as an `item_reference` (the conversation is made first,
# through the gateway, so the references are its own), and no `previous_response_id`.
references_body() {
    python3 - "$1" "$key" <<'PY'
import json, sys, urllib.request
port, key = sys.argv[1], sys.argv[2]
items = []
def ask(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses", data=json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())
for turn in range(1, 41):
    items.append({"role": "user", "content": f"Turn {turn} of a long conversation: what was said, what was asked, and what the model answered."})
    answer = ask({"model": "mock-gpt", "max_output_tokens": 64, "instructions": "You are terse.", "input": items})
    items += [{"type": "item_reference", "id": item["id"]} for item in answer["output"]]
items.append({"role": "user", "content": "Say hello in five words."})
print(json.dumps({"model": "mock-gpt", "max_output_tokens": 64, "instructions": "You are terse.", "input": items}, separators=(",", ":")))
PY
}

# A body with "stream":true added as its last member.
streamed() { printf '%s' "${1%\}},\"stream\":true}"; }

# Starts the mock on port $1 (20 events a stream, no delay, one thread), its log in $2; sets
# mock_pid.
start_mock() {
    MOCK_CHUNKS=20 MOCK_DELAY_US=0 MOCK_THREADS=1 "$mock" "$1" > "$2" 2>&1 &
    mock_pid=$!
}

# Writes the gateway's config for the benchbed, listening on port $2 with the mock on $3, as
# $1/gw.toml. $1 is a directory of its own: the gateway watches its config's directory for
# reloads, and a log written beside the config would wake the watcher on every line.
gateway_config() {
    mkdir -p "$1"
    sed -e "s/@PROJECT_PORT@/$2/" -e "s/@MOCK_PORT@/$3/" "$bb/conf/modelgate.toml.in" > "$1/gw.toml"
}

# Sets body and path to the request of kind $1: json (the default), stream, messages,
# messages-stream, responses, responses-stream, responses-history (a Responses request with a
# 40-turn history), responses-references (the same history as the AI SDK sends it), or claude
# and claude-stream (the chat request for the mock's messages upstream, its reply translated
# back to chat).
request_of() {
    body=$chat_body path=/v1/chat/completions
    case ${1:-json} in
        stream) body=$(streamed "$chat_body") ;;
        claude) body=${chat_body/mock-gpt/mock-claude} ;;
        claude-stream) body=$(streamed "${chat_body/mock-gpt/mock-claude}") ;;
        responses) body=$responses_body path=/v1/responses ;;
        messages) body=$messages_body path=/v1/messages ;;
        messages-stream) body=$(streamed "$messages_body") path=/v1/messages ;;
        responses-stream) body=$(streamed "$responses_body") path=/v1/responses ;;
        responses-history) body=$(history_body) path=/v1/responses ;;
        # Made once the gateway is up (references_body): the references must be its own.
        responses-references) body='' path=/v1/responses ;;
    esac
}

# Sets cmd to run $1 on port $2 before the mock on $mport, for the benches that count one
# process under valgrind: the gateway (config in $work/cfg), or with `nginx` for $1, Debian's
# nginx in the benchbed's configuration as one process (one worker, no master), files in $work.
serve_command() {
    if [ "$1" = nginx ]; then
        mkdir -p "$work/nginx-tmp"
        sed -e "s/@NGINX_WORKERS@/1/" -e "s#@STATE@#$work#g" -e "s/@MOCK_PORT@/$mport/" \
            -e "s/@NGINX_PORT@/$2/" "$bb/conf/nginx.conf.in" > "$work/nginx.conf"
        sed -i '1i master_process off;' "$work/nginx.conf"
        cmd=(nginx -c "$work/nginx.conf" -p "$work")
    else
        gateway_config "$work/cfg" "$2" "$mport"
        cmd=("$(realpath "$1")" serve --config "$work/cfg/gw.toml")
    fi
}

# Waits (up to 30 s) until a gateway answers on port $1.
wait_ready() {
    for _ in $(seq 150); do
        curl -s -o /dev/null "http://127.0.0.1:$1/v1/models" && return
        sleep 0.2
    done
}

# For the benches that measure two peers in turn (rate_cpu.sh, critical_path.sh): starts the mock
# on $mport, the gateway $bin on $pa (config in $work/a, with GW_EXTRA appended) and, on $pb,
# nginx as the benchbed runs it (one worker per core) or, when $other is a binary, a second
# gateway; waits for the gateway. Sets mock_pid, a_pid, b_pid and name_b, and the request of
# $kind (json, messages or stream) in body and path.
start_peers() {
    start_mock "$mport" "$work/mock.log"
    gateway_config "$work/a" "$pa" "$mport"
    printf '%b' "${GW_EXTRA:-}" >> "$work/a/gw.toml"
    BENCHBED_UPSTREAM_KEY=k "$bin" serve --config "$work/a/gw.toml" > "$work/a.log" 2>&1 &
    a_pid=$!
    if [ "$other" = nginx ]; then
        mkdir -p "$work/nginx-tmp"
        sed -e "s/@NGINX_WORKERS@/auto/" -e "s#@STATE@#$work#g" -e "s/@MOCK_PORT@/$mport/" \
            -e "s/@NGINX_PORT@/$pb/" "$bb/conf/nginx.conf.in" > "$work/nginx.conf"
        nginx -c "$work/nginx.conf" -p "$work" > "$work/nginx.out" 2>&1 &
        b_pid=$!
        name_b=nginx
    else
        gateway_config "$work/b" "$pb" "$mport"
        BENCHBED_UPSTREAM_KEY=k "$(realpath "$other")" serve --config "$work/b/gw.toml" \
            > "$work/b.log" 2>&1 &
        b_pid=$!
        name_b=$(basename "$other")
    fi
    request_of "$kind"
    wait_ready "$pa"
    sleep 0.5
}

# The requests both layout profiles are made from (pgo.sh, bolt.sh), sent to a gateway on
# $gport. A number of requests per kind, not a time: the counts, and so what is found hot, are
# then the same on a fast or a slow machine and from one run to the next. The mix follows what
# the benchbed measures (chat JSON, on reused and new connections, streams, the translated
# messages pair), with the other translated kinds present but few. With 4 s of each, the
# responses kinds took a quarter of the requests, and a new connection's blocks (under a tenth)
# stayed below LLVM's hot line. With messages at half of chat's count, the translated request's
# blocks were laid out behind the passthrough's and ran through more code lines (docs/performance-log.md, twelfth
# session).
train() {
    # COUNT PATH BODY [new]: COUNT requests over two connections, or each on a new one.
    drive() {
        oha -n "$1" -c 2 ${4:+--disable-keepalive} --no-tui -m POST \
            -H "authorization: Bearer $key" -H 'content-type: application/json' -d "$3" \
            "http://127.0.0.1:$gport$2" > /dev/null
    }
    drive 20000 /v1/chat/completions "$chat_body"
    # New connections too: at a low rate half the benchbed's requests open one (each load
    # client opens its 50 connections afresh).
    drive 10000 /v1/chat/completions "$chat_body" new
    drive 8000 /v1/chat/completions "$(streamed "$chat_body")"
    drive 16000 /v1/messages "$messages_body"
    drive 2000 /v1/messages "$(streamed "$messages_body")"
    drive 1000 /v1/responses "$responses_body"
    drive 500 /v1/responses "$(streamed "$responses_body")"
}

# Runs the gateway binary $1 on the mock (ports $mport and $gport, files in $work), sends it the
# training requests, and stops it with SIGINT: it drains and exits, and an instrumented binary
# writes what it counted as it exits. Sets mock_pid and gw_pid, for the caller's trap.
train_binary() {
    start_mock "$mport" "$work/mock.log"
    gateway_config "$work/cfg" "$gport" "$mport"
    BENCHBED_UPSTREAM_KEY=k "$1" serve --config "$work/cfg/gw.toml" > "$work/gw.log" 2>&1 &
    gw_pid=$!
    wait_ready "$gport"
    train
    kill -INT "$gw_pid"
    wait "$gw_pid" || true
}
