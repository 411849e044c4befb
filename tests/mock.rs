//! The built-in mock upstream: deterministic replies honouring max_tokens, stop and tools, in-process and over real HTTP.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::json;

/// A gateway whose "mock-*" models use the in-process mock and "http-*" models a standalone
/// mock served over loopback HTTP, so both paths face the same assertions.
async fn setup() -> TestGateway {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(modelgate::mock::serve_standalone(listener, Duration::ZERO));
    let toml = chat_config("http://127.0.0.1:9").replace(
        "[[upstreams]]\nname = \"mock\"",
        &format!(
            "[[upstreams]]\nname = \"remote\"\nkind = \"chat\"\nbase_url = \"http://{addr}/v1\"\n\n[[models]]\nname = \"http-think\"\nupstream = \"remote\"\nthinking = \"chat_template_kwargs\"\n\n[[models]]\nname = \"http-*\"\nupstream = \"remote\"\n\n[[models]]\nname = \"think\"\nupstream = \"mock\"\nthinking = \"enable_thinking\"\n\n[[upstreams]]\nname = \"mock\""
        ),
    );
    TestGateway::start(&toml).await
}

const MODELS: [&str; 2] = ["mock-1", "http-1"];

#[tokio::test]
async fn reply_is_derived_from_the_last_user_message_with_usage() {
    let gw = setup().await;
    for model in MODELS {
        let body = json!({"model": model, "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "tell me a story"}]}]});
        let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), body.clone()).await;
        assert_eq!(status, 200, "{model}: {v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], model);
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "You said: tell me a story"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let u = &v["usage"];
        assert_eq!(u["completion_tokens"], 6);
        assert_eq!(
            u["total_tokens"].as_u64().unwrap(),
            u["prompt_tokens"].as_u64().unwrap() + 6
        );
        // Deterministic: the same request gets the same answer and id.
        let (_, _, again) = post_json(&gw.base("/v1/chat/completions"), body).await;
        assert_eq!(again["id"], v["id"]);
    }
}

#[tokio::test]
async fn max_tokens_cuts_with_length_and_stop_cuts_with_stop() {
    let gw = setup().await;
    for model in MODELS {
        let body = json!({"model": model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "one two three four"}]});
        let (_, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
        assert_eq!(
            v["choices"][0]["message"]["content"], "You said: ",
            "{model}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "length");

        let body = json!({"model": model, "stop": ["three"],
            "messages": [{"role": "user", "content": "one two three four"}]});
        let (_, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
        assert_eq!(
            v["choices"][0]["message"]["content"], "You said: one two ",
            "{model}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}

fn weather_tools() -> serde_json::Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}])
}

#[tokio::test]
async fn tool_call_when_offered_and_asked_for() {
    let gw = setup().await;
    for model in MODELS {
        let body = json!({"model": model, "tools": weather_tools(),
            "messages": [{"role": "user", "content": "use get_weather for Paris"}]});
        let (_, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{model}: {v}");
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather");
        let args: serde_json::Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "mock", "days": 1}));

        // Tools offered but not asked for: plain text. tool_choice "none": never a call.
        let body = json!({"model": model, "tools": weather_tools(),
            "messages": [{"role": "user", "content": "hello"}]});
        let (_, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let body = json!({"model": model, "tools": weather_tools(), "tool_choice": "none",
            "messages": [{"role": "user", "content": "use get_weather"}]});
        let (_, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}

#[tokio::test]
async fn stream_comes_in_small_chunks_with_usage_and_done() {
    let gw = setup().await;
    for model in MODELS {
        let body = json!({"model": model, "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "a b c d"}]});
        let resp = client()
            .post(gw.base("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let mut text = String::new();
        let mut s = resp.bytes_stream();
        while let Some(b) = s.next().await {
            text.push_str(std::str::from_utf8(&b.unwrap()).unwrap());
        }
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(*events.last().unwrap(), "data: [DONE]");
        let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "You said: a b c d", "{model}");
        assert!(chunks.len() >= 7, "one chunk per word: {}", chunks.len());
        let usage_chunk = chunks.last().unwrap();
        assert_eq!(usage_chunk["choices"], json!([]));
        assert_eq!(usage_chunk["usage"]["completion_tokens"], 6);
        assert_eq!(
            chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
            "stop"
        );
    }
}

#[tokio::test]
async fn thinking_switch_makes_the_mock_reason() {
    let gw = setup().await;
    for model in ["think", "http-think"] {
        let body = json!({"model": model, "thinking": {"type": "enabled"},
            "messages": [{"role": "user", "content": "hi there"}]});
        let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
        assert_eq!(status, 200, "{model}: {v}");
        let msg = &v["choices"][0]["message"];
        assert_eq!(
            msg["reasoning_content"],
            "The user wrote 2 words. I will answer by echoing them."
        );
        assert_eq!(msg["content"], "You said: hi there");
    }
    for model in MODELS {
        let body = json!({"model": model, "enable_thinking": true,
            "messages": [{"role": "user", "content": "hi"}]});
        let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
        // mock-* and http-* are configured without thinking: the gateway refuses the switch.
        assert_eq!(status, 400, "{model}: {v}");
        assert_eq!(v["error"]["param"], "enable_thinking");
    }
}
