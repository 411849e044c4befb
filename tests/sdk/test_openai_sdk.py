"""The official OpenAI Python SDK driving the real `modelgate` binary.

Two processes are started once per session:

* `modelgate mock --listen 127.0.0.1:0`: the mock upstream on its own port, so the gateway's
  real HTTP client path (pooling, streaming, re-framing) is exercised;
* `modelgate serve --config <tmp>/gateway.toml`: the gateway, with one model on the built-in
  in-process mock (`kind = "mock"`) and one on the standalone mock over HTTP (`kind = "chat"`).

Every chat case runs against both models. Bound ports are read from each process's log on
stderr. The binary is $MODELGATE_BIN, else target/debug/modelgate (built by `cargo build`).
Process helpers are in harness.py, shared fixtures in conftest.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import openai
import pytest

from harness import HTTP_MOCK_CHUNK_DELAY_MS, start_gateway

KEY = "sk-sdk-test"
LIMITED_KEY = "sk-sdk-limited"

INPROC_MODEL = "inproc-chat"  # upstream kind "mock": inside the gateway
HTTP_MODEL = "http-chat"  # upstream kind "chat": the standalone mock over loopback HTTP
UPSTREAM_MODEL = "echo-1"
CHAT_MODELS = [
    pytest.param(INPROC_MODEL, id="inprocess-mock"),
    pytest.param(HTTP_MODEL, id="http-mock"),
]


@pytest.fixture(scope="session")
def gateway(workdir: Path, mock_upstream: str) -> Iterator[str]:
    """The gateway; yields the base address's OpenAI base URL (`http://127.0.0.1:PORT/v1`)."""
    proc, listeners = start_gateway(
        "gateway",
        workdir,
        f"""\
[listen]
base = "127.0.0.1:0"
admin = "127.0.0.1:0"

[[keys]]
name = "sdk"
key = "{KEY}"
models = ["*"]

[[keys]]
name = "limited"
key = "{LIMITED_KEY}"
models = ["{INPROC_MODEL}"]

[[upstreams]]
name = "inproc"
kind = "mock"

[[upstreams]]
name = "standalone"
kind = "chat"
base_url = "{mock_upstream}"

[[models]]
name = "{INPROC_MODEL}"
upstream = "inproc"
upstream_model = "{UPSTREAM_MODEL}"

[[models]]
name = "{HTTP_MODEL}"
upstream = "standalone"
upstream_model = "{UPSTREAM_MODEL}"
""",
        listeners={"base", "admin"},
    )
    try:
        yield f"{listeners['base']}/v1"
    finally:
        proc.stop()


def make_client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base_url,
        api_key=key,
        max_retries=0,  # an error must surface as the gateway sent it, not after retries
        timeout=20.0,
        http_client=openai.DefaultHttpxClient(trust_env=False),  # no proxy for loopback
    )


@pytest.fixture
def client(gateway: str) -> Iterator[openai.OpenAI]:
    with make_client(gateway, KEY) as c:
        yield c


# ---------------------------------------------------------------------------------------------
# Chat completions, each against both upstream setups
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_chat_completion_json(client: openai.OpenAI, model: str) -> None:
    prompt = "Hello there, gateway"
    completion = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": prompt},
        ],
    )
    assert completion.object == "chat.completion"
    assert completion.id
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == f"You said: {prompt}"
    assert not choice.message.tool_calls
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == len(f"You said: {prompt}".split())
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_chat_completion_max_tokens_cuts_the_reply(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "one two three four five six"}],
        max_tokens=3,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content == "You said: one "


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_chat_completion_stream(client: openai.OpenAI, model: str) -> None:
    prompt = "Tell me about streams in small pieces"
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    content_chunks = 0
    finish_reasons = []
    usages = []
    ids = set()
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        ids.add(chunk.id)
        if chunk.usage is not None:
            # With include_usage, usage comes in one last chunk whose choices are empty.
            assert chunk.choices == []
            usages.append(chunk.usage)
        for choice in chunk.choices:
            assert choice.index == 0
            if choice.delta.content:
                text += choice.delta.content
                content_chunks += 1
            if choice.finish_reason is not None:
                finish_reasons.append(choice.finish_reason)
    expected = f"You said: {prompt}"
    assert text == expected
    assert content_chunks > 1, "the reply arrived in one piece, not streamed"
    assert finish_reasons == ["stop"]
    assert len(ids) == 1
    assert len(usages) == 1, "usage did not arrive (stream_options.include_usage)"
    usage = usages[0]
    assert usage.completion_tokens == len(expected.split())
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TOOL_PROMPT = "What is the weather in Paris? Use the get_weather tool."


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_tool_call(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": TOOL_PROMPT}],
        tools=[WEATHER_TOOL],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.id
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, str)
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict)
    assert isinstance(args.get("city"), str)
    assert args.get("unit") in ("celsius", "fahrenheit")


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_tool_call_stream(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": TOOL_PROMPT}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish_reasons = []
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                if delta.id:
                    call["id"] = delta.id
                if delta.function and delta.function.name:
                    call["name"] += delta.function.name
                if delta.function and delta.function.arguments:
                    call["arguments"] += delta.function.arguments
            if choice.finish_reason is not None:
                finish_reasons.append(choice.finish_reason)
    assert finish_reasons == ["tool_calls"]
    assert list(calls) == [0]
    assert calls[0]["id"]
    assert calls[0]["name"] == "get_weather"
    assert isinstance(json.loads(calls[0]["arguments"])["city"], str)


def test_stream_over_http_arrives_as_it_is_produced(client: openai.OpenAI) -> None:
    """The standalone mock pauses between chunks; the gateway must forward each one at once."""
    prompt = "one two three four five six seven eight"
    stream = client.chat.completions.create(
        model=HTTP_MODEL,
        messages=[{"role": "user", "content": prompt}],
        stream=True,
    )
    arrivals = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
    assert len(arrivals) == len(f"You said: {prompt}".split())
    spread = arrivals[-1] - arrivals[0]
    minimum = (len(arrivals) - 1) * HTTP_MOCK_CHUNK_DELAY_MS / 1000
    # A lower bound only: the upstream cannot produce faster, and a gateway that buffered the
    # body would hand all chunks over at once (spread near zero). Half, for timer slack.
    assert spread >= minimum / 2, f"chunks spread over {spread:.3f}s, expected about {minimum:.3f}s"


# ---------------------------------------------------------------------------------------------
# Errors, as the SDK's exception classes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_invalid_temperature_is_bad_request(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            temperature=5,
        )
    err = caught.value
    assert err.status_code == 400
    assert err.param == "temperature"
    assert isinstance(err.body, dict)  # the SDK unwraps {"error": {...}}
    assert err.body["param"] == "temperature"
    assert err.body["type"] == "invalid_request_error"
    assert "temperature" in err.body["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_unknown_model_is_not_found(client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(
            model="no-such-model",
            messages=[{"role": "user", "content": "hi"}],
            stream=stream,
        )
    err = caught.value
    assert err.status_code == 404
    assert err.code == "model_not_found"


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_bad_key_is_authentication_error(gateway: str, model: str) -> None:
    with make_client(gateway, "sk-wrong") as bad:
        with pytest.raises(openai.AuthenticationError) as caught:
            bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


def test_model_not_allowed_for_key_is_not_found(gateway: str) -> None:
    # A model the key may not use reads exactly like one that does not exist (gateway.md §14),
    # so a limited key cannot list what the gateway serves.
    with make_client(gateway, LIMITED_KEY) as limited:
        with pytest.raises(openai.NotFoundError) as caught:
            limited.chat.completions.create(
                model=HTTP_MODEL, messages=[{"role": "user", "content": "hi"}]
            )
        assert caught.value.status_code == 404
        with pytest.raises(openai.NotFoundError) as unknown:
            limited.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
        assert caught.value.body["code"] == unknown.value.body["code"] == "model_not_found"
        # The model it may use still works.
        ok = limited.chat.completions.create(
            model=INPROC_MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert ok.choices[0].message.content == "You said: hi"


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def test_models_list(client: openai.OpenAI) -> None:
    models = list(client.models.list())
    assert sorted(m.id for m in models) == sorted([INPROC_MODEL, HTTP_MODEL])
    for m in models:
        assert m.object == "model"
        assert isinstance(m.created, int)
        assert m.owned_by


def test_models_list_shows_only_the_keys_models(gateway: str) -> None:
    with make_client(gateway, LIMITED_KEY) as limited:
        assert [m.id for m in limited.models.list()] == [INPROC_MODEL]


# ---------------------------------------------------------------------------------------------
# Stateful Responses (gateway.md §13): the SDK's own calls for stored responses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_responses_are_stored_continued_listed_and_deleted(
    client: openai.OpenAI, model: str
) -> None:
    first = client.responses.create(model=model, input="My name is Ada.")
    assert first.store is True
    second = client.responses.create(
        model=model, previous_response_id=first.id, input="What is my name?"
    )
    assert second.previous_response_id == first.id
    assert second.id != first.id

    got = client.responses.retrieve(first.id)
    assert got.id == first.id
    assert got.output_text == first.output_text

    # The second turn's input: the first turn's input and output, then its own; newest first.
    items = client.responses.input_items.list(second.id)
    assert len(items.data) == 3
    assert items.data[0].type == "message" and items.data[0].role == "user"
    assert items.data[0].content[0].text == "What is my name?"
    assert items.data[1].role == "assistant"
    assert items.data[2].content[0].text == "My name is Ada."
    asc = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert [i.id for i in asc.data] == [items.data[2].id]
    assert asc.has_more is True

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model=model, previous_response_id=first.id, input="again")
    assert refused.value.code == "previous_response_not_found"
    assert refused.value.param == "previous_response_id"
    # The second response does not depend on its parent's record.
    assert client.responses.retrieve(second.id).id == second.id


def test_responses_store_false_is_not_kept(client: openai.OpenAI) -> None:
    r = client.responses.create(model=INPROC_MODEL, input="hi", store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_responses_of_another_key_are_not_found(gateway: str, client: openai.OpenAI) -> None:
    r = client.responses.create(model=INPROC_MODEL, input="mine")
    with make_client(gateway, LIMITED_KEY) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.input_items.list(r.id)
    assert client.responses.retrieve(r.id).id == r.id
