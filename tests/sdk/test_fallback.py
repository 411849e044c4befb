"""Retries and fallback (gateway.md §10) seen through the official SDKs, driving the real binary.

1. The `anthropic` SDK on /v1/messages: the model's only target, a messages upstream, answers
   503; its fallback model on a chat upstream serves the request, translated back into
   Anthropic's shape, plain and streamed.
2. The `openai` SDK on /v1/chat/completions: a model with two targets, the first answering 429,
   the second succeeding.
3. Both SDKs when every attempt fails: the SDK's own error class for the last failure's status.

The SDKs retry on their own by default; every client here has `max_retries=0`, so what the test
sees is the gateway's doing, read from the response headers `x-modelgate-attempts` and
`x-modelgate-upstream` (`with_raw_response`) and from what the fake upstream recorded.

The fake upstream is a small `http.server` on 127.0.0.1:0. One server plays every upstream:
each upstream's `base_url` carries its own path prefix (`/down/v1`, `/limited/v1`, `/up/v1`),
which decides the answer.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import anthropic
import openai
import pytest

from harness import Proc, sse_data, start_gateway

KEY = "sk-sdk-fallback"
UPSTREAM_KEY = "upstream-secret-fb01"
UPSTREAM_KEY_ENV = "MODELGATE_SDK_FALLBACK_KEY"

ANTHROPIC_OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
OPENAI_RATE_LIMITED = {
    "error": {
        "message": "Rate limit reached for requests",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}
REPLY_TEXT = "Served by the fallback."


@dataclass
class Call:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any


class Upstreams:
    """Every fake upstream on one loopback server, told apart by path prefix:
    `/down/...` 503 (Anthropic body), `/limited/...` 429 with retry-after: 1 (OpenAI body),
    `/up/v1/chat/completions` a chat completion (streamed when asked)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw)
                with fake.lock:
                    fake.calls.append(
                        Call(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                if self.path.startswith("/down/"):
                    self.reply(503, ANTHROPIC_OVERLOADED)
                elif self.path.startswith("/limited/"):
                    self.reply(429, OPENAI_RATE_LIMITED, {"retry-after": "1"})
                elif self.path == "/up/v1/chat/completions":
                    if body.get("stream"):
                        self.stream(body["model"])
                    else:
                        self.reply(200, chat_completion(body["model"]))
                else:
                    self.reply(404, {"error": {"message": f"no route {self.path}", "type": "x"}})

            def reply(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def stream(self, model: str) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for frame in chat_stream(model):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, prefix: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/{prefix}/v1"

    def calls_with(self, prompt: str) -> list[Call]:
        """The calls whose request carries `prompt` (each test sends its own)."""
        with self.lock:
            return [c for c in self.calls if prompt in json.dumps(c.body)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def chat_completion(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-Fallback01",
        "object": "chat.completion",
        "created": 1760000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY_TEXT, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
    }


def chat_stream(model: str) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse_data(
            {
                "id": "chatcmpl-Fallback02",
                "object": "chat.completion.chunk",
                "created": 1760000000,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    pieces = ["Served by", " the fallback."]
    return [
        chunk({"role": "assistant", "content": ""}),
        *[chunk({"content": p}) for p in pieces],
        chunk({}, "stop"),
        sse_data("[DONE]"),
    ]


@dataclass
class Gateway:
    base: str
    proc: Proc


@pytest.fixture(scope="module")
def upstreams() -> Iterator[Upstreams]:
    fake = Upstreams()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture(scope="module")
def gateway(workdir: Path, upstreams: Upstreams) -> Iterator[Gateway]:
    proc, listeners = start_gateway(
        "gateway-fallback",
        workdir,
        f"""\
[listen]
base = "127.0.0.1:0"

[limits]
connect_timeout_ms = 5000
first_byte_timeout_ms = 20000
idle_timeout_ms = 20000

[[keys]]
name = "sdk"
key = "{KEY}"

[[upstreams]]
name = "anthropic-down"
kind = "messages"
base_url = "{upstreams.url("down")}"
api_key_env = "{UPSTREAM_KEY_ENV}"

[[upstreams]]
name = "openai-limited"
kind = "chat"
base_url = "{upstreams.url("limited")}"
api_key_env = "{UPSTREAM_KEY_ENV}"

[[upstreams]]
name = "openai-up"
kind = "chat"
base_url = "{upstreams.url("up")}"
api_key_env = "{UPSTREAM_KEY_ENV}"

# A messages client's model whose Anthropic deployment is down; the fallback speaks chat.
[[models]]
name = "claude-fb"
upstream = "anthropic-down"
upstream_model = "claude-real"
fallbacks = ["gpt-fb"]

[[models]]
name = "gpt-fb"
upstream = "openai-up"
upstream_model = "gpt-real"

# Two targets, the rate-limited one weighted 99:1 so it is nearly always tried first; health
# off so it stays in the rotation however often it fails.
[[models]]
name = "gpt-two"
targets = [
  {{ upstream = "openai-limited", upstream_model = "gpt-real", weight = 99 }},
  {{ upstream = "openai-up", upstream_model = "gpt-real", weight = 1 }},
]
health = {{ eject_after = 0 }}

# Nothing works: every attempt fails.
[[models]]
name = "claude-down"
upstream = "anthropic-down"
upstream_model = "claude-real"
retry = {{ attempts = 2 }}

[[models]]
name = "gpt-limited"
upstream = "openai-limited"
upstream_model = "gpt-real"
retry = {{ attempts = 2 }}
""",
        listeners={"base"},
        extra_env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    )
    try:
        yield Gateway(listeners["base"], proc)
    finally:
        proc.stop()


@pytest.fixture(scope="module", autouse=True)
def sdk_env() -> Iterator[None]:
    """No SDK settings from the environment (custom headers, credentials, base URLs)."""
    with pytest.MonkeyPatch.context() as mp:
        for var in (
            "ANTHROPIC_CUSTOM_HEADERS",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_PROFILE",
            "ANTHROPIC_CONFIG_DIR",
            "OPENAI_BASE_URL",
        ):
            mp.delenv(var, raising=False)
        yield


def anthropic_client(gw: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=gw.base,
        api_key=KEY,
        max_retries=0,  # the gateway's retries only
        timeout=20.0,
        http_client=anthropic.DefaultHttpxClient(trust_env=False),
    )


def openai_client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{gw.base}/v1",
        api_key=KEY,
        max_retries=0,  # the gateway's retries only
        timeout=20.0,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )


_counter = iter(range(1_000_000))


def prompt(what: str) -> str:
    """A prompt no other request carries, to find this test's upstream calls."""
    return f"{what} #{next(_counter)}"


def access_log_line(gw: Gateway, request_id: str) -> str:
    """The gateway's access log line for `request_id` (§12). It is written when the body has
    ended, which may be just after the SDK returned: wait for it (harness.Proc.wait_for)."""
    pattern = re.compile(re.escape(request_id) + r".*\battempts\b")
    return gw.proc.wait_for(pattern)[-1].string


def logged(line: str, field: str, value: str) -> bool:
    """`field=value`, `field="value"` (text format) or `"field":value` (JSON format)."""
    pattern = rf'(\b{field}="?{re.escape(value)}"?(\s|$))|("{field}":"?{re.escape(value)}"?[,}}])'
    return re.search(pattern, line) is not None


def test_anthropic_messages_client_falls_back_to_a_chat_upstream(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    text = prompt("Which deployment answers?")
    with anthropic_client(gateway) as client:
        raw = client.messages.with_raw_response.create(
            model="claude-fb", max_tokens=64, messages=[{"role": "user", "content": text}]
        )
    assert raw.status_code == 200
    assert raw.headers["x-modelgate-attempts"] == "2"
    assert raw.headers["x-modelgate-upstream"] == "openai-up"
    message = raw.parse()
    assert message.type == "message"
    assert message.role == "assistant"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == REPLY_TEXT
    assert message.stop_reason == "end_turn"

    calls = upstreams.calls_with(text)
    assert [c.path for c in calls] == ["/down/v1/messages", "/up/v1/chat/completions"]
    down, up = calls
    # Each attempt is written in its own target's protocol, with the upstream's credential.
    assert down.body["model"] == "claude-real"
    assert down.headers.get("x-api-key") == UPSTREAM_KEY
    assert up.body["model"] == "gpt-real"
    assert up.body["messages"][-1] == {"role": "user", "content": text}
    assert up.headers.get("authorization") == f"Bearer {UPSTREAM_KEY}"
    assert all(KEY not in v for c in calls for v in c.headers.values())

    line = access_log_line(gateway, raw.headers["x-request-id"])
    assert logged(line, "attempts", "2"), line
    assert logged(line, "upstream", "openai-up"), line
    # Every attempt is in the line (issue 11: target, outcome, time), the failed one first.
    assert "anthropic-down" in line and "503" in line, line
    assert line.index("anthropic-down") < line.rindex("openai-up"), line


def test_anthropic_stream_falls_back_to_a_chat_upstream(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    text = prompt("Stream it from wherever works.")
    with anthropic_client(gateway) as client:
        with client.messages.stream(
            model="claude-fb", max_tokens=64, messages=[{"role": "user", "content": text}]
        ) as stream:
            headers = stream.response.headers
            deltas = list(stream.text_stream)
            final = stream.get_final_message()
    assert headers["x-modelgate-attempts"] == "2"
    assert headers["x-modelgate-upstream"] == "openai-up"
    assert "".join(deltas) == REPLY_TEXT
    assert final.content[0].text == REPLY_TEXT
    assert final.stop_reason == "end_turn"
    calls = upstreams.calls_with(text)
    assert [c.path for c in calls] == ["/down/v1/messages", "/up/v1/chat/completions"]
    assert calls[1].body.get("stream") is True


def test_openai_chat_rate_limited_target_then_the_second_target(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    # The 429 target comes first with p = 0.99 per request; five requests that all start on the
    # healthy one have p = 1e-10, so at least one shows the retry.
    retried = 0
    with openai_client(gateway) as client:
        for _ in range(5):
            text = prompt("Anyone free?")
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-two", messages=[{"role": "user", "content": text}]
            )
            assert raw.status_code == 200
            assert raw.headers["x-modelgate-upstream"] == "openai-up"
            completion = raw.parse()
            assert completion.choices[0].message.content == REPLY_TEXT
            paths = [c.path for c in upstreams.calls_with(text)]
            if raw.headers["x-modelgate-attempts"] == "2":
                retried += 1
                assert paths == ["/limited/v1/chat/completions", "/up/v1/chat/completions"]
            else:
                assert raw.headers["x-modelgate-attempts"] == "1"
                assert paths == ["/up/v1/chat/completions"]
    assert retried >= 1, "no request started on the rate-limited target"


def test_sdks_see_the_last_failure_when_every_attempt_fails(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    text = prompt("Is anyone up?")
    with anthropic_client(gateway) as client:
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(
                model="claude-down", max_tokens=64, messages=[{"role": "user", "content": text}]
            )
    err = caught.value
    assert err.status_code == 503
    assert err.response.headers["x-modelgate-attempts"] == "2"
    assert err.response.headers["x-modelgate-upstream"] == "anthropic-down"
    assert isinstance(err.body, dict)
    assert err.body["error"]["type"] == "overloaded_error"
    assert len(upstreams.calls_with(text)) == 2

    text = prompt("Still nobody?")
    with openai_client(gateway) as oclient:
        with pytest.raises(openai.RateLimitError) as rl:
            oclient.chat.completions.create(
                model="gpt-limited", messages=[{"role": "user", "content": text}]
            )
    assert rl.value.status_code == 429
    assert rl.value.response.headers["x-modelgate-attempts"] == "2"
    assert rl.value.response.headers["retry-after"] == "1"
    assert rl.value.code == "rate_limit_exceeded"
    assert len(upstreams.calls_with(text)) == 2
