"""Official SDKs across a protocol translation, driving the real `modelgate` binary.

Each client SDK talks to one protocol while the routed model's upstream speaks another:

1. the `anthropic` SDK on /v1/messages, upstream kind "chat": streamed text, and a tool call
   whose input the SDK hands back as a parsed dict; with both ways the SDK can send its key;
2. the `openai` SDK's `responses.stream` on /v1/responses, upstream kind "chat": text deltas as
   events and a function_call item in the final response;
3. the `openai` SDK's chat stream on /v1/chat/completions, upstream kind "messages", with two
   parallel tool_use blocks: two tool calls with their own index, id and complete arguments;

and each again with the upstream stream breaking midway, which the SDK must surface as an
error, never as a clean (short) reply. The upstreams are `harness.FakeUpstream`, replaying
hand-written transcripts in the shapes of ../shared/reference/protocols.md §A.5 (chat chunks) and
§B.5 (Anthropic events), and recording what the gateway sent them, which is checked to be a
request of the upstream's own protocol with the upstream's own credential.

Three ways a stream breaks (`FAILURES`):
* "cut":   the upstream's connection dies inside the chunked body (no last chunk);
* "error": the upstream sends its protocol's in-stream error (chat: a `data:` object with an
           `error` key, §A.5 rule 7; messages: `event: error`, §B.5), then ends the body;
* "eof":   the body ends cleanly but before the protocol's terminal frame (chat: no finish_reason
           and no `[DONE]`; messages: no `message_delta`/`message_stop`) — a truncated stream
           that must not look like a complete reply.

Besides: the anthropic path against `modelgate mock` too; parallel calls from a chat upstream in
three orders (OpenAI's sequential one, whole calls in one chunk, interleaved fragments); and
arrival times, so a gateway that held deltas back would fail. Interleaved parallel tool-call
fragments from a chat upstream must arrive whole, and a translated /v1/messages request must not
forward the client's anthropic-* headers to a chat upstream.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import anthropic
import openai
import pytest

from harness import FakeUpstream, Recorded, Script, sse_data, sse_event, start_gateway

KEY = "sk-sdk-translation"
UPSTREAM_KEY = "upstream-secret-7f3a"  # what the gateway must send upstream instead of KEY
UPSTREAM_KEY_ENV = "MODELGATE_SDK_UPSTREAM_KEY"
DEFAULT_MAX_TOKENS = 1234  # the messages models' default_max_tokens
MOCK_MODEL = "mock-chat-echo"  # the standalone `modelgate mock`, kind "chat"

FAILURES = ["cut", "error", "eof"]

# The happy-path transcripts pause this long after each frame, so a gateway that held deltas
# back (until a block ends, or the stream does) is caught by the arrival times at the client.
PACED_S = 0.03


def check_paced(arrivals: list[float], what: str) -> None:
    """`arrivals` are client-side times of deltas that the upstream sent one frame apart."""
    assert len(arrivals) > 1, f"{what}: arrived in one piece, not streamed"
    spread = arrivals[-1] - arrivals[0]
    minimum = (len(arrivals) - 1) * PACED_S
    # A lower bound only, halved for timer slack: a buffering gateway gives a spread near zero.
    assert spread >= minimum / 2, f"{what}: spread over {spread:.3f}s, expected ~{minimum:.3f}s"


SYSTEM = "You are terse."
WEATHER_DESCRIPTION = "Current weather for a city."
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
CHAT_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": WEATHER_DESCRIPTION,
        "parameters": WEATHER_SCHEMA,
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": WEATHER_DESCRIPTION,
    "input_schema": WEATHER_SCHEMA,
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": WEATHER_DESCRIPTION,
    "parameters": WEATHER_SCHEMA,
    "strict": False,
}


# ---------------------------------------------------------------------------------------------
# Transcripts
# ---------------------------------------------------------------------------------------------

CHAT_ERROR = {
    "error": {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": None,
        "code": None,
    }
}
ANTHROPIC_ERROR = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def chat_transcript(
    upstream_id: str,
    deltas: list[dict[str, Any]],
    finish_reason: str,
    usage: dict[str, Any],
) -> Callable[[Any], list[bytes]]:
    """A streamed chat completion as OpenAI sends it (§A.5): role chunk, deltas, finish chunk,
    the usage chunk only when the request asked for it (and `usage: null` on every chunk then),
    `[DONE]`."""

    def frames(body: Any) -> list[bytes]:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            c: dict[str, Any] = {
                "id": upstream_id,
                "object": "chat.completion.chunk",
                "created": 1760000000,
                "model": body["model"],
                "system_fingerprint": "fp_fake01",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                c["usage"] = None
            return sse_data(c)

        first_is_tool = "tool_calls" in deltas[0]
        role = {"role": "assistant", "content": None if first_is_tool else "", "refusal": None}
        out = [chunk(role)]
        out += [chunk(d) for d in deltas]
        out.append(chunk({}, finish_reason))
        if include_usage:
            out.append(
                sse_data(
                    {
                        "id": upstream_id,
                        "object": "chat.completion.chunk",
                        "created": 1760000000,
                        "model": body["model"],
                        "system_fingerprint": "fp_fake01",
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        out.append(sse_data("[DONE]"))
        return out

    return frames


def tool_fragment(index: int, arguments: str, call_id: str | None = None, name: str = "") -> dict:
    """A `delta.tool_calls` entry; the first for an index has id, type and name (§A.5 rule 3)."""
    entry: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        entry = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
    return {"tool_calls": [entry]}


# Case 1: text only.
TEXT_PIECES = ["Hello", "! The gateway", " streamed this", " reply in", " pieces."]
TEXT = "".join(TEXT_PIECES)
CHAT_TEXT_USAGE = {
    "prompt_tokens": 31,
    "completion_tokens": 12,
    "total_tokens": 43,
    "prompt_tokens_details": {"cached_tokens": 8, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}
CHAT_TEXT = chat_transcript(
    "chatcmpl-FakeText01", [{"content": p} for p in TEXT_PIECES], "stop", CHAT_TEXT_USAGE
)

# Cases 1 and 2: some text, then one tool call whose arguments arrive split mid-token.
TOOL_PREAMBLE = "Let me check."
CALL_ID = "call_Wx7kQ2fT9"
ARG_PIECES = ['{"ci', 'ty": "Par', 'is", "unit"', ': "celsius"}']
ARGS = {"city": "Paris", "unit": "celsius"}
CHAT_TOOL_USAGE = {
    "prompt_tokens": 88,
    "completion_tokens": 21,
    "total_tokens": 109,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}
TOOL_DELTAS = [
    {"content": "Let me"},
    {"content": " check."},
    tool_fragment(0, "", CALL_ID, "get_weather"),
    *[tool_fragment(0, p) for p in ARG_PIECES],
]
CHAT_TOOL_CALL = chat_transcript("chatcmpl-FakeTool01", TOOL_DELTAS, "tool_calls", CHAT_TOOL_USAGE)
# Frames kept before a break: the role chunk, both text chunks, the call's first fragment and one
# argument fragment: the break lands inside the tool call's arguments.
CHAT_TOOL_KEEP = 5


# Cases 1 and 2 with two parallel calls from a chat upstream, in the orders upstreams use.
CHAT_PARALLEL_IDS = ["call_PaRiS01", "call_ToKyO02"]
CHAT_PARALLEL_ARGS = [{"city": "Paris", "unit": "celsius"}, {"city": "Tokyo"}]
CHAT_PARALLEL_ORDERS: dict[str, list[dict[str, Any]]] = {
    # OpenAI streams call 0 completely, then call 1 (§A.5 rule 3).
    "sequential": [
        tool_fragment(0, "", CHAT_PARALLEL_IDS[0], "get_weather"),
        tool_fragment(0, '{"city": "Pa'),
        tool_fragment(0, 'ris", "unit": "celsius"}'),
        tool_fragment(1, "", CHAT_PARALLEL_IDS[1], "get_weather"),
        tool_fragment(1, '{"city":'),
        tool_fragment(1, ' "Tokyo"}'),
    ],
    # Servers that produce whole calls put both in one delta.
    "one-chunk": [
        {
            "tool_calls": [
                {
                    "index": i,
                    "id": CHAT_PARALLEL_IDS[i],
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": json.dumps(CHAT_PARALLEL_ARGS[i]),
                    },
                }
                for i in (0, 1)
            ]
        }
    ],
    # Both calls open, then their fragments alternate: a consumer keys by index (§A.5 rule 3).
    "interleaved": [
        tool_fragment(0, "", CHAT_PARALLEL_IDS[0], "get_weather"),
        tool_fragment(1, "", CHAT_PARALLEL_IDS[1], "get_weather"),
        tool_fragment(0, '{"city": "Pa'),
        tool_fragment(1, '{"city":'),
        tool_fragment(0, 'ris", "unit": "celsius"}'),
        tool_fragment(1, ' "Tokyo"}'),
    ],
}


def chat_parallel_orders() -> list[Any]:
    return [
        pytest.param(order, id=order)
        for order in CHAT_PARALLEL_ORDERS
    ]


def chat_parallel(order: str) -> Callable[[Any], list[bytes]]:
    return chat_transcript(
        "chatcmpl-FakeParallel", CHAT_PARALLEL_ORDERS[order], "tool_calls", CHAT_TOOL_USAGE
    )


# Case 3: an Anthropic reply with a text block and two parallel tool_use blocks (§B.5).
PARALLEL_PREAMBLE = "I'll check both cities."
PARALLEL_IDS = ["toolu_01PaRiS4xq", "toolu_01ToKyO9zz"]
PARALLEL_ARGS = [{"city": "Paris", "unit": "celsius"}, {"city": "Tokyo"}]
MESSAGES_INPUT_TOKENS, MESSAGES_CACHE_READ, MESSAGES_CACHE_WRITE = 412, 100, 20
MESSAGES_OUTPUT_TOKENS = 87


def block_delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse_event({"type": "content_block_delta", "index": index, "delta": delta})


def text_delta(index: int, text: str) -> bytes:
    return block_delta(index, {"type": "text_delta", "text": text})


def json_delta(index: int, partial_json: str) -> bytes:
    return block_delta(index, {"type": "input_json_delta", "partial_json": partial_json})


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse_event({"type": "content_block_start", "index": index, "content_block": block})


def block_stop(index: int) -> bytes:
    return sse_event({"type": "content_block_stop", "index": index})


def tool_use(call_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {}}


def messages_parallel(body: Any) -> list[bytes]:
    start = {
        "id": "msg_01FakeParallel",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": MESSAGES_INPUT_TOKENS,
            "cache_creation_input_tokens": MESSAGES_CACHE_WRITE,
            "cache_read_input_tokens": MESSAGES_CACHE_READ,
            "output_tokens": 1,
        },
    }
    return [
        sse_event({"type": "message_start", "message": start}),
        block_start(0, {"type": "text", "text": ""}),
        sse_event({"type": "ping"}),
        text_delta(0, "I'll check"),
        text_delta(0, " both cities."),
        block_stop(0),
        block_start(1, tool_use(PARALLEL_IDS[0])),
        json_delta(1, ""),
        json_delta(1, '{"city": "Pa'),
        json_delta(1, 'ris", "unit": "cel'),
        json_delta(1, 'sius"}'),
        block_stop(1),
        block_start(2, tool_use(PARALLEL_IDS[1])),
        json_delta(2, '{"city":'),
        json_delta(2, ' "Tokyo"}'),
        block_stop(2),
        sse_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": MESSAGES_OUTPUT_TOKENS},
            }
        ),
        sse_event({"type": "message_stop"}),
    ]


# Frames kept before a break: message_start, the text block, and the first tool_use block's start
# and two argument deltas: the break lands inside the first call's arguments.
MESSAGES_PARALLEL_KEEP = 9


def broken(
    frames: Callable[[Any], list[bytes]], keep: int, failure: str, error_frame: bytes
) -> tuple[Callable[[Any], list[bytes]], str]:
    """The first `keep` frames of a transcript, then the failure; returns (frames, ending)."""

    def cut_frames(body: Any) -> list[bytes]:
        head = frames(body)[:keep]
        return head + [error_frame] if failure == "error" else head

    return cut_frames, "cut" if failure == "cut" else "clean"


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(workdir: Path, mock_upstream: str, fake_upstream: FakeUpstream) -> Iterator[str]:
    """A gateway whose `chat-*` models go to the fake as a chat upstream, `msg-*` models to the
    fake as a messages upstream, and MOCK_MODEL to `modelgate mock`; yields `http://ADDR`."""
    proc, listeners = start_gateway(
        "gateway-translation",
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
models = ["*"]

[[upstreams]]
name = "fake-chat"
kind = "chat"
base_url = "{fake_upstream.base_url}"
api_key_env = "{UPSTREAM_KEY_ENV}"

[[upstreams]]
name = "fake-messages"
kind = "messages"
base_url = "{fake_upstream.base_url}"
api_key_env = "{UPSTREAM_KEY_ENV}"

[[upstreams]]
name = "standalone-mock"
kind = "chat"
base_url = "{mock_upstream}"

[[models]]
name = "chat-*"
upstream = "fake-chat"

[[models]]
name = "msg-*"
upstream = "fake-messages"
default_max_tokens = {DEFAULT_MAX_TOKENS}

[[models]]
name = "{MOCK_MODEL}"
upstream = "standalone-mock"
upstream_model = "echo-1"
""",
        listeners={"base"},
        extra_env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    )
    try:
        yield listeners["base"]
    finally:
        proc.stop()


@pytest.fixture(scope="module", autouse=True)
def sdk_env() -> Iterator[None]:
    """No SDK settings from the environment: the anthropic SDK merges ANTHROPIC_CUSTOM_HEADERS
    into every request and reads credentials and profiles from its variables."""
    with pytest.MonkeyPatch.context() as mp:
        for var in (
            "ANTHROPIC_CUSTOM_HEADERS",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_PROFILE",
            "ANTHROPIC_CONFIG_DIR",
        ):
            mp.delenv(var, raising=False)
        yield


class WireLog:
    """The headers each SDK request really carried (an httpx request hook)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []

    def hook(self, request: Any) -> None:
        self.requests.append({k.lower(): v for k, v in request.headers.items()})


ANTHROPIC_AUTH = [
    # The installed SDK's own way: `api_key=` (checked on the wire below).
    pytest.param("api_key", id="sdk-default-auth"),
    # `x-api-key`, as older SDK releases and many tools send it; Authorization omitted.
    pytest.param("x-api-key", id="x-api-key"),
]


def anthropic_client(base: str, auth: str, wire: WireLog) -> anthropic.Anthropic:
    extra: dict[str, Any] = {}
    if auth == "x-api-key":
        extra["default_headers"] = {"Authorization": anthropic.Omit(), "X-Api-Key": KEY}
    return anthropic.Anthropic(
        base_url=base,
        api_key=KEY,
        max_retries=0,
        timeout=20.0,
        http_client=anthropic.DefaultHttpxClient(
            trust_env=False, event_hooks={"request": [wire.hook], "response": []}
        ),
        **extra,
    )


def check_anthropic_wire_auth(wire: WireLog, auth: str) -> None:
    assert wire.requests, "the SDK sent nothing"
    for headers in wire.requests:
        if auth == "x-api-key":
            assert headers.get("x-api-key") == KEY
            assert "authorization" not in headers
        else:
            # anthropic 2.x sends `api_key=` as a bearer token (1.x and older sent x-api-key).
            assert headers.get("authorization") == f"Bearer {KEY}"
            assert "x-api-key" not in headers


def make_openai_client(base: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{base}/v1",
        api_key=KEY,
        max_retries=0,  # an error must surface as the gateway sent it, not after retries
        timeout=20.0,
        http_client=openai.DefaultHttpxClient(trust_env=False),  # no proxy for loopback
    )


@pytest.fixture
def openai_client(gateway: str) -> Iterator[openai.OpenAI]:
    with make_openai_client(gateway) as c:
        yield c


@pytest.fixture(scope="module")
def warm_sdks(gateway: str, fake_upstream: FakeUpstream) -> None:
    """One stream through each SDK path before any timing is measured: the SDKs build their
    event models on first use, a pause long enough (~0.1 s) to bunch up the first paced frames
    at the client. Nothing is asserted here; the tests check the same paths."""
    chat = "/v1/chat/completions"
    text = fake_upstream.add("chat-warm-text", Script(chat, CHAT_TEXT, frame_delay_s=0))
    tool = fake_upstream.add("chat-warm-tool", Script(chat, CHAT_TOOL_CALL, frame_delay_s=0))
    par = fake_upstream.add(
        "msg-warm-parallel", Script("/v1/messages", messages_parallel, frame_delay_s=0)
    )
    user = [{"role": "user", "content": "warm up"}]
    with anthropic_client(gateway, "api_key", WireLog()) as aclient:
        for model in (text, tool):
            with aclient.messages.stream(model=model, max_tokens=16, messages=user) as stream:
                stream.until_done()
    with make_openai_client(gateway) as client:
        with client.responses.stream(model=tool, input="warm up") as rstream:
            rstream.until_done()
        for _ in client.chat.completions.create(
            model=par, messages=user, stream=True, stream_options={"include_usage": True}
        ):
            pass


_counter = iter(range(1_000_000))


def register(fake: FakeUpstream, prefix: str, script: Script) -> str:
    """A fresh model name (so each test finds exactly its own upstream request)."""
    return fake.add(f"{prefix}-{next(_counter)}", script)


# ---------------------------------------------------------------------------------------------
# Checks on what reached the upstream
# ---------------------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    """Text of a string content or of a list of text parts/blocks."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") in ("text", "input_text"))


def check_no_client_key(req: Recorded) -> None:
    leaked = {k: v for k, v in req.headers.items() if KEY in v}
    assert not leaked, f"the client's key reached the upstream in {sorted(leaked)}"


def check_chat_upstream_request(
    req: Recorded, model: str, prompt: str, max_tokens: int, tools: bool
) -> None:
    """A Chat Completions request, with the upstream's bearer credential (§0, §A.1)."""
    assert req.path == "/v1/chat/completions"
    check_no_client_key(req)
    assert req.headers.get("authorization") == f"Bearer {UPSTREAM_KEY}"
    assert "x-api-key" not in req.headers
    body = req.body
    assert body["model"] == model
    assert body["stream"] is True
    # The client protocol reports usage at the end, so the gateway asks for the usage chunk.
    assert body.get("stream_options", {}).get("include_usage") is True, body
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user"], messages
    assert text_of(messages[0]["content"]) == SYSTEM
    assert text_of(messages[1]["content"]) == prompt
    assert body.get("max_completion_tokens", body.get("max_tokens")) == max_tokens, body
    for foreign in ("max_output_tokens", "input", "instructions", "system", "stop_sequences"):
        assert foreign not in body, f"{foreign!r} is not a chat field: {body}"
    if tools:
        assert len(body["tools"]) == 1
        tool = body["tools"][0]
        assert tool["type"] == "function"
        assert tool["function"]["name"] == "get_weather"
        assert tool["function"]["parameters"] == WEATHER_SCHEMA
    else:
        assert not body.get("tools")


def check_messages_upstream_request(req: Recorded, model: str, prompt: str) -> None:
    """An Anthropic Messages request, with x-api-key and anthropic-version (§0, §B.1)."""
    assert req.path == "/v1/messages"
    check_no_client_key(req)
    assert req.headers.get("x-api-key") == UPSTREAM_KEY
    assert "authorization" not in req.headers
    assert req.headers.get("anthropic-version") == "2023-06-01"
    body = req.body
    assert body["model"] == model
    assert body["stream"] is True
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS  # the client sent none: the model's default
    assert text_of(body["system"]) == SYSTEM
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert text_of(body["messages"][0]["content"]) == prompt
    assert body["tools"] == [ANTHROPIC_TOOL]
    for foreign in ("stream_options", "max_completion_tokens", "n", "parallel_tool_calls"):
        assert foreign not in body, f"{foreign!r} is not a messages field: {body}"


# ---------------------------------------------------------------------------------------------
# 1. anthropic SDK → /v1/messages → chat upstream
# ---------------------------------------------------------------------------------------------

ANTHROPIC_TEXT_PROMPT = "Say hello in pieces."
ANTHROPIC_TOOL_PROMPT = "What is the weather in Paris? Use the get_weather tool."


@pytest.mark.parametrize("auth", ANTHROPIC_AUTH)
def test_anthropic_stream_text_from_chat_upstream(
    gateway: str, fake_upstream: FakeUpstream, warm_sdks: None, auth: str
) -> None:
    model = register(
        fake_upstream,
        "chat-a-text",
        Script("/v1/chat/completions", CHAT_TEXT, frame_delay_s=PACED_S),
    )
    wire = WireLog()
    with anthropic_client(gateway, auth, wire) as client:
        with client.messages.stream(
            model=model,
            max_tokens=256,
            system=SYSTEM,
            messages=[{"role": "user", "content": ANTHROPIC_TEXT_PROMPT}],
        ) as stream:
            kinds = []
            pieces = []
            arrivals = []
            for event in stream:
                kinds.append(event.type)
                if event.type == "text":
                    pieces.append(event.text)
                    arrivals.append(time.monotonic())
            final = stream.get_final_message()
    check_anthropic_wire_auth(wire, auth)

    assert "".join(pieces) == TEXT
    check_paced(arrivals, "text_delta events")
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert final.id.startswith("msg_")
    assert final.model == model
    assert final.role == "assistant"
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == TEXT
    assert final.stop_reason == "end_turn"
    # protocols.md §D.4: input_tokens excludes cache reads; the cached part is reported apart.
    assert final.usage.output_tokens == 12
    assert final.usage.input_tokens == 31 - 8
    assert final.usage.cache_read_input_tokens == 8

    check_chat_upstream_request(
        fake_upstream.only_request_for(model), model, ANTHROPIC_TEXT_PROMPT, 256, tools=False
    )


@pytest.mark.parametrize("auth", ANTHROPIC_AUTH)
def test_anthropic_stream_tool_call_from_chat_upstream(
    gateway: str, fake_upstream: FakeUpstream, warm_sdks: None, auth: str
) -> None:
    model = register(
        fake_upstream,
        "chat-a-tool",
        Script("/v1/chat/completions", CHAT_TOOL_CALL, frame_delay_s=PACED_S),
    )
    wire = WireLog()
    with anthropic_client(gateway, auth, wire) as client:
        with client.messages.stream(
            model=model,
            max_tokens=300,
            system=SYSTEM,
            messages=[{"role": "user", "content": ANTHROPIC_TOOL_PROMPT}],
            tools=[ANTHROPIC_TOOL],
        ) as stream:
            json_pieces = []
            json_arrivals = []
            text = ""
            for event in stream:
                if event.type == "input_json":
                    json_pieces.append(event.partial_json)
                    json_arrivals.append(time.monotonic())
                elif event.type == "text":
                    text += event.text
            final = stream.get_final_message()
    check_anthropic_wire_auth(wire, auth)

    assert text == TOOL_PREAMBLE
    # The arguments were forwarded as they came, not held back until the block ended.
    check_paced(json_arrivals, "input_json_delta events")
    assert "".join(json_pieces) == "".join(ARG_PIECES)
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == TOOL_PREAMBLE
    call = final.content[1]
    assert call.id == CALL_ID  # valid for Anthropic as it is, so kept for the next turn
    assert call.name == "get_weather"
    assert call.input == ARGS  # parsed by the SDK from the streamed partial JSON
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens == 21
    assert final.usage.input_tokens == 88

    check_chat_upstream_request(
        fake_upstream.only_request_for(model), model, ANTHROPIC_TOOL_PROMPT, 300, tools=True
    )


@pytest.mark.parametrize("order", chat_parallel_orders())
def test_anthropic_stream_parallel_tool_calls_from_chat_upstream(
    gateway: str, fake_upstream: FakeUpstream, order: str
) -> None:
    model = register(
        fake_upstream, "chat-a-par", Script("/v1/chat/completions", chat_parallel(order))
    )
    wire = WireLog()
    with anthropic_client(gateway, "api_key", wire) as client:
        with client.messages.stream(
            model=model,
            max_tokens=300,
            system=SYSTEM,
            messages=[{"role": "user", "content": ANTHROPIC_TOOL_PROMPT}],
            tools=[ANTHROPIC_TOOL],
        ) as stream:
            final = stream.get_final_message()
    # One tool_use block per call, each with its own id and complete input.
    assert [b.type for b in final.content] == ["tool_use", "tool_use"]
    assert [b.id for b in final.content] == CHAT_PARALLEL_IDS
    assert [b.name for b in final.content] == ["get_weather", "get_weather"]
    assert [b.input for b in final.content] == CHAT_PARALLEL_ARGS
    assert final.stop_reason == "tool_use"


def test_anthropic_stream_text_from_modelgate_mock(gateway: str) -> None:
    """The same path against `modelgate mock` (kind "chat" over HTTP) rather than the fake."""
    prompt = "Tell me about translated streams"
    wire = WireLog()
    with anthropic_client(gateway, "api_key", wire) as client:
        with client.messages.stream(
            model=MOCK_MODEL,
            max_tokens=128,
            messages=[{"role": "user", "content": prompt}],
        ) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
    assert "".join(pieces) == f"You said: {prompt}"
    assert len(pieces) > 1
    assert final.content[0].text == f"You said: {prompt}"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(f"You said: {prompt}".split())
    assert final.usage.input_tokens > 0


@pytest.mark.parametrize("auth", ANTHROPIC_AUTH)
@pytest.mark.parametrize("failure", FAILURES)
def test_anthropic_stream_from_chat_upstream_breaks_midway(
    gateway: str, fake_upstream: FakeUpstream, failure: str, auth: str
) -> None:
    frames, ending = broken(CHAT_TOOL_CALL, CHAT_TOOL_KEEP, failure, sse_data(CHAT_ERROR))
    model = register(fake_upstream, "chat-a-broken", Script("/v1/chat/completions", frames, ending))
    wire = WireLog()
    text = ""
    json_pieces = []
    kinds = []
    with anthropic_client(gateway, auth, wire) as client:
        # The SDK turns `event: error` into an APIStatusError subclass, raised from the
        # iteration (its status is the stream's 200, so the class is APIStatusError itself).
        with pytest.raises(anthropic.APIStatusError) as caught:
            with client.messages.stream(
                model=model,
                max_tokens=300,
                system=SYSTEM,
                messages=[{"role": "user", "content": ANTHROPIC_TOOL_PROMPT}],
                tools=[ANTHROPIC_TOOL],
            ) as stream:
                for event in stream:
                    kinds.append(event.type)
                    if event.type == "text":
                        text += event.text
                    elif event.type == "input_json":
                        json_pieces.append(event.partial_json)
    check_anthropic_wire_auth(wire, auth)
    # What arrived before the break was delivered; then the error, not a message_stop.
    assert text == TOOL_PREAMBLE
    assert "".join(json_pieces) == ARG_PIECES[0]
    assert "message_stop" not in kinds
    err = caught.value
    assert isinstance(err.body, dict), err.body
    assert err.body.get("type") == "error", err.body
    assert isinstance(err.body["error"].get("type"), str)
    assert err.body["error"].get("message")
    if failure == "error":
        assert CHAT_ERROR["error"]["message"] in err.body["error"]["message"]


def test_anthropic_headers_stay_off_a_chat_upstream(
    gateway: str, fake_upstream: FakeUpstream
) -> None:
    model = register(fake_upstream, "chat-a-headers", Script("/v1/chat/completions", CHAT_TEXT))
    with anthropic_client(gateway, "api_key", WireLog()) as client:
        with client.messages.stream(
            model=model,
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"anthropic-beta": "fine-grained-tool-streaming-2025-05-14"},
        ) as stream:
            assert stream.get_final_text() == TEXT
    req = fake_upstream.only_request_for(model)
    leaked = sorted(k for k in req.headers if k.startswith("anthropic-"))
    assert leaked == [], f"Anthropic headers reached a chat upstream: {leaked}"


# ---------------------------------------------------------------------------------------------
# 2. openai SDK responses.stream → /v1/responses → chat upstream
# ---------------------------------------------------------------------------------------------

RESPONSES_PROMPT = "What's the weather in Paris?"


def test_openai_responses_stream_function_call_from_chat_upstream(
    openai_client: openai.OpenAI, fake_upstream: FakeUpstream, warm_sdks: None
) -> None:
    model = register(
        fake_upstream,
        "chat-r-tool",
        Script("/v1/chat/completions", CHAT_TOOL_CALL, frame_delay_s=PACED_S),
    )
    with openai_client.responses.stream(
        model=model,
        instructions=SYSTEM,
        input=RESPONSES_PROMPT,
        tools=[RESPONSES_TOOL],
        max_output_tokens=400,
    ) as stream:
        kinds = []
        text_deltas = []
        arg_deltas = []
        sequence = []
        arrivals = []
        for event in stream:
            kinds.append(event.type)
            sequence.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                text_deltas.append(event.delta)
                arrivals.append(time.monotonic())
            elif event.type == "response.function_call_arguments.delta":
                arg_deltas.append(event.delta)
                arrivals.append(time.monotonic())
        final = stream.get_final_response()

    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] == "response.completed", kinds
    assert sequence == list(range(sequence[0], sequence[0] + len(sequence))), sequence
    assert "".join(text_deltas) == TOOL_PREAMBLE
    assert "".join(arg_deltas) == "".join(ARG_PIECES)
    check_paced(arrivals, "output_text and function_call_arguments deltas")

    assert final.status == "completed"
    assert final.id.startswith("resp_")
    assert final.model == model
    assert [item.type for item in final.output] == ["message", "function_call"]
    message, call = final.output
    assert message.role == "assistant"
    assert [part.text for part in message.content] == [TOOL_PREAMBLE]
    assert final.output_text == TOOL_PREAMBLE
    assert call.name == "get_weather"
    assert call.call_id == CALL_ID
    assert json.loads(call.arguments) == ARGS
    assert call.status == "completed"
    assert final.usage is not None
    assert final.usage.input_tokens == 88
    assert final.usage.output_tokens == 21
    assert final.usage.total_tokens == 109

    check_chat_upstream_request(
        fake_upstream.only_request_for(model), model, RESPONSES_PROMPT, 400, tools=True
    )


@pytest.mark.parametrize("order", chat_parallel_orders())
def test_openai_responses_stream_parallel_function_calls_from_chat_upstream(
    openai_client: openai.OpenAI, fake_upstream: FakeUpstream, order: str
) -> None:
    model = register(
        fake_upstream, "chat-r-par", Script("/v1/chat/completions", chat_parallel(order))
    )
    with openai_client.responses.stream(
        model=model, instructions=SYSTEM, input=RESPONSES_PROMPT, tools=[RESPONSES_TOOL]
    ) as stream:
        args_done = [
            (e.output_index, json.loads(e.arguments))
            for e in stream
            if e.type == "response.function_call_arguments.done"
        ]
        final = stream.get_final_response()
    assert args_done == list(enumerate(CHAT_PARALLEL_ARGS))
    assert [item.type for item in final.output] == ["function_call", "function_call"]
    assert [item.call_id for item in final.output] == CHAT_PARALLEL_IDS
    assert len({item.id for item in final.output}) == 2
    assert [json.loads(item.arguments) for item in final.output] == CHAT_PARALLEL_ARGS
    assert final.status == "completed"


@pytest.mark.parametrize("failure", FAILURES)
def test_openai_responses_stream_from_chat_upstream_breaks_midway(
    openai_client: openai.OpenAI, fake_upstream: FakeUpstream, failure: str
) -> None:
    frames, ending = broken(CHAT_TOOL_CALL, CHAT_TOOL_KEEP, failure, sse_data(CHAT_ERROR))
    model = register(fake_upstream, "chat-r-broken", Script("/v1/chat/completions", frames, ending))
    # How openai 3.54 surfaces a failed Responses stream depends on the failure event's shape:
    # * its raw stream raises `APIError` (not an APIStatusError: the status was 200) for any
    #   payload with a top-level `error` key, i.e. an `error` event that also nests
    #   `{"error": {...}}` (the gateway's current shape, which exists so the SDK raises);
    # * an `error` event in the bare wire shape of §C.4 (`code`/`message` at top level) and a
    #   `response.failed` (error under `response.error`) are yielded as ResponseErrorEvent /
    #   ResponseFailedEvent, and then `get_final_response()` raises RuntimeError "Didn't receive
    #   a `response.completed` event.".
    # Either way the SDK raises, never handing back a final response; both are accepted here,
    # and whichever happened is checked in full.
    events = []
    raised: openai.APIError | None = None
    with openai_client.responses.stream(
        model=model,
        instructions=SYSTEM,
        input=RESPONSES_PROMPT,
        tools=[RESPONSES_TOOL],
    ) as stream:
        try:
            for event in stream:
                events.append(event)
        except openai.APIError as e:
            raised = e
        if raised is None:
            with pytest.raises(RuntimeError, match="response.completed"):
                stream.get_final_response()

    kinds = [e.type for e in events]
    assert "response.completed" not in kinds and "response.incomplete" not in kinds, kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == TOOL_PREAMBLE
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == ARG_PIECES[0]
    if raised is not None:
        assert not isinstance(raised, openai.APIStatusError)
        assert raised.message
        messages = [raised.message]
    else:
        failed = [e for e in events if e.type == "response.failed"]
        errors = [e for e in events if e.type == "error"]
        assert failed or errors, f"the stream ended without response.failed or error: {kinds}"
        assert kinds[-1] in ("response.failed", "error"), kinds
        for e in failed:
            assert e.response.status == "failed"
            assert e.response.error is not None and e.response.error.message
        for e in errors:
            assert e.message
        messages = [e.response.error.message for e in failed] + [e.message for e in errors]
    if failure == "error":
        assert any(CHAT_ERROR["error"]["message"] in m for m in messages), messages


# ---------------------------------------------------------------------------------------------
# 3. openai SDK chat stream → /v1/chat/completions → messages upstream, parallel tool calls
# ---------------------------------------------------------------------------------------------

PARALLEL_PROMPT = "Weather in Paris and in Tokyo? Use get_weather for each."
CHAT_MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": PARALLEL_PROMPT},
]


def collect_chat_stream(
    stream: Any,
) -> tuple[str, dict[int, dict[str, Any]], list[str], list[Any], list[float]]:
    """Assembles a chat stream the way the SDK documents: tool calls keyed by `index`; also
    returns the arrival times of content and argument deltas."""
    text = ""
    calls: dict[int, dict[str, Any]] = {}
    finish_reasons = []
    usages = []
    arrivals = []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            assert choice.index == 0
            if choice.delta.content:
                text += choice.delta.content
                arrivals.append(time.monotonic())
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    delta.index, {"id": None, "name": "", "arguments": "", "fragments": 0}
                )
                if delta.id:
                    assert call["id"] is None, f"a second id for tool index {delta.index}"
                    call["id"] = delta.id
                if delta.function and delta.function.name:
                    call["name"] += delta.function.name
                if delta.function and delta.function.arguments:
                    call["arguments"] += delta.function.arguments
                    call["fragments"] += 1
                    arrivals.append(time.monotonic())
            if choice.finish_reason is not None:
                finish_reasons.append(choice.finish_reason)
    return text, calls, finish_reasons, usages, arrivals


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage", "no-usage"])
def test_openai_chat_stream_parallel_tool_calls_from_messages_upstream(
    openai_client: openai.OpenAI, fake_upstream: FakeUpstream, warm_sdks: None, include_usage: bool
) -> None:
    model = register(
        fake_upstream,
        "msg-c-parallel",
        Script("/v1/messages", messages_parallel, frame_delay_s=PACED_S),
    )
    stream = openai_client.chat.completions.create(
        model=model,
        messages=CHAT_MESSAGES,
        tools=[CHAT_TOOL],
        stream=True,
        **({"stream_options": {"include_usage": True}} if include_usage else {}),
    )
    text, calls, finish_reasons, usages, arrivals = collect_chat_stream(stream)

    assert text == PARALLEL_PREAMBLE
    # Text and argument deltas, one upstream frame each (the `""` partial_json carries nothing).
    check_paced(arrivals, "content and tool_calls deltas")
    # Chat tool indexes count tool calls from 0 — not the Anthropic block indexes 1 and 2.
    assert sorted(calls) == [0, 1], calls
    assert [calls[i]["id"] for i in (0, 1)] == PARALLEL_IDS
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "get_weather"]
    assert [json.loads(calls[i]["arguments"]) for i in (0, 1)] == PARALLEL_ARGS
    assert calls[0]["fragments"] > 1, "the first call's arguments were not streamed in pieces"
    assert finish_reasons == ["tool_calls"]
    if not include_usage:
        assert usages == [], "usage the client did not ask for"
        check_messages_upstream_request(
            fake_upstream.only_request_for(model), model, PARALLEL_PROMPT
        )
        return
    assert len(usages) == 1, "usage did not arrive (stream_options.include_usage)"
    usage = usages[0]
    # protocols.md §D.4, Chat ← Anthropic: prompt = input + cache writes + cache reads.
    prompt = MESSAGES_INPUT_TOKENS + MESSAGES_CACHE_WRITE + MESSAGES_CACHE_READ
    assert usage.prompt_tokens == prompt
    assert usage.completion_tokens == MESSAGES_OUTPUT_TOKENS
    assert usage.total_tokens == prompt + MESSAGES_OUTPUT_TOKENS
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == MESSAGES_CACHE_READ

    check_messages_upstream_request(fake_upstream.only_request_for(model), model, PARALLEL_PROMPT)


def test_openai_chat_stream_helper_parallel_tool_calls_from_messages_upstream(
    openai_client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    model = register(fake_upstream, "msg-c-helper", Script("/v1/messages", messages_parallel))
    with openai_client.chat.completions.stream(
        model=model, messages=CHAT_MESSAGES, tools=[CHAT_TOOL]
    ) as stream:
        args_done = []
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                args_done.append((event.index, event.name, json.loads(event.arguments)))
        final = stream.get_final_completion()

    assert args_done == [
        (0, "get_weather", PARALLEL_ARGS[0]),
        (1, "get_weather", PARALLEL_ARGS[1]),
    ]
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == PARALLEL_PREAMBLE
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 2
    assert [c.id for c in calls] == PARALLEL_IDS
    assert [c.type for c in calls] == ["function", "function"]
    assert [c.function.name for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.function.arguments) for c in calls] == PARALLEL_ARGS

    check_messages_upstream_request(fake_upstream.only_request_for(model), model, PARALLEL_PROMPT)


@pytest.mark.parametrize("failure", FAILURES)
def test_openai_chat_stream_from_messages_upstream_breaks_midway(
    openai_client: openai.OpenAI, fake_upstream: FakeUpstream, failure: str
) -> None:
    frames, ending = broken(
        messages_parallel, MESSAGES_PARALLEL_KEEP, failure, sse_event(ANTHROPIC_ERROR)
    )
    model = register(fake_upstream, "msg-c-broken", Script("/v1/messages", frames, ending))
    stream = openai_client.chat.completions.create(
        model=model, messages=CHAT_MESSAGES, tools=[CHAT_TOOL], stream=True
    )
    seen: list[Any] = []

    def consume() -> None:
        for chunk in stream:
            seen.append(chunk)

    # The SDK raises APIError for a `data:` payload with an `error` key (§A.5 rule 7); a stream
    # that just stopped (even without `[DONE]`) would end the iteration quietly instead.
    with pytest.raises(openai.APIError) as caught:
        consume()
    err = caught.value
    assert not isinstance(err, openai.APIStatusError)  # raised from the stream, not a status
    assert isinstance(err.body, dict) and err.body.get("message"), err.body
    if failure == "error":
        assert "Overloaded" in err.body["message"]
    text = "".join(c.choices[0].delta.content or "" for c in seen if c.choices)
    assert text == PARALLEL_PREAMBLE
    finish = [c.choices[0].finish_reason for c in seen if c.choices and c.choices[0].finish_reason]
    assert finish == [], "a broken stream must not carry a finish_reason"


def test_openai_chat_stream_helper_from_messages_upstream_breaks_midway(
    openai_client: openai.OpenAI, fake_upstream: FakeUpstream
) -> None:
    frames, ending = broken(
        messages_parallel, MESSAGES_PARALLEL_KEEP, "error", sse_event(ANTHROPIC_ERROR)
    )
    model = register(fake_upstream, "msg-c-helper-broken", Script("/v1/messages", frames, ending))
    content = ""
    with pytest.raises(openai.APIError) as caught:
        with openai_client.chat.completions.stream(
            model=model, messages=CHAT_MESSAGES, tools=[CHAT_TOOL]
        ) as stream:
            for event in stream:
                if event.type == "content.delta":
                    content += event.delta
            stream.get_final_completion()
    assert "Overloaded" in caught.value.message
    assert content == PARALLEL_PREAMBLE
