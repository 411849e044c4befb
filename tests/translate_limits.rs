//! What one protocol cannot say to another: each refused field is a 400 naming it (and nothing goes upstream); each dropped field is absent upstream; temperature is clamped toward messages.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use common::*;
use serde_json::{json, Value};

/// Models "to-chat", "to-messages", "to-responses" on one recording fake upstream.
fn limits_config(url: &str) -> String {
    config(
        url,
        r#"
[[upstreams]]
name = "c"
kind = "chat"
base_url = "{UPSTREAM}/v1"

[[upstreams]]
name = "m"
kind = "messages"
base_url = "{UPSTREAM}/v1"

[[upstreams]]
name = "r"
kind = "responses"
base_url = "{UPSTREAM}/v1"

[[models]]
name = "to-chat"
upstream = "c"
vision = true
# Hosted tools are dropped by default (tests/agent_tools.rs); here they are refused.
hosted_tools = "refuse"

[[models]]
name = "to-messages"
upstream = "m"
vision = true
# Hosted tools are dropped by default (tests/agent_tools.rs); here they are refused.
hosted_tools = "refuse"

[[models]]
name = "to-responses"
upstream = "r"
vision = true
"#,
    )
}

fn chat(model: &str, extra: Value) -> Value {
    let mut b = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// (case, path, body, param the 400 must name)
fn refusals() -> Vec<(&'static str, &'static str, Value, &'static str)> {
    vec![
        (
            "chat n>1 to messages",
            "/v1/chat/completions",
            chat("to-messages", json!({"n": 2})),
            "n",
        ),
        (
            "chat n>1 to responses",
            "/v1/chat/completions",
            chat("to-responses", json!({"n": 3})),
            "n",
        ),
        (
            "chat logprobs to messages",
            "/v1/chat/completions",
            chat("to-messages", json!({"logprobs": true})),
            "logprobs",
        ),
        (
            "chat logprobs to responses",
            "/v1/chat/completions",
            chat("to-responses", json!({"logprobs": true, "top_logprobs": 2})),
            "logprobs",
        ),
        (
            "chat stop to responses",
            "/v1/chat/completions",
            chat("to-responses", json!({"stop": ["x"]})),
            "stop",
        ),
        (
            "chat audio part to messages",
            "/v1/chat/completions",
            chat(
                "to-messages",
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]}),
            ),
            "messages[0].content[0].type",
        ),
        (
            "messages server tool to chat",
            "/v1/messages",
            json!({"model": "to-chat", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools[0]",
        ),
        (
            "messages document block to chat",
            "/v1/messages",
            json!({"model": "to-chat", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            "messages stop_sequences to responses",
            "/v1/messages",
            json!({"model": "to-responses", "max_tokens": 5, "stop_sequences": ["x"], "messages": [{"role": "user", "content": "hi"}]}),
            "stop_sequences",
        ),
        (
            "responses built-in tool to messages",
            "/v1/responses",
            json!({"model": "to-messages", "input": "hi", "tools": [{"type": "web_search"}]}),
            "tools[0]",
        ),
        (
            "responses image by file_id to chat",
            "/v1/responses",
            json!({"model": "to-chat", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1", "detail": "auto"}]}]}),
            "input[0].content[0].file_id",
        ),
    ]
}

#[tokio::test]
async fn fields_a_target_cannot_express_are_refused_naming_the_field() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&limits_config(&up.url())).await;
    for (case, path, body, param) in refusals() {
        let (status, _, v) = post_json(&gw.base(path), body).await;
        assert_eq!(status, 400, "{case}: {v}");
        let (got_param, message) = if path == "/v1/messages" {
            // Anthropic's error shape has no param; the message names the field.
            (None, v["error"]["message"].as_str().unwrap_or(""))
        } else {
            (
                v["error"]["param"].as_str(),
                v["error"]["message"].as_str().unwrap_or(""),
            )
        };
        if let Some(p) = got_param {
            assert_eq!(p, param, "{case}: {v}");
        }
        assert!(
            message.contains(param),
            "{case}: message should name {param}: {v}"
        );
        assert!(
            up.seen().is_empty(),
            "{case}: nothing may reach the upstream"
        );
    }
}

fn chat_reply() -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
}

fn messages_reply() -> Value {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 1, "output_tokens": 1}})
}

#[tokio::test]
async fn documented_drops_do_not_reach_the_upstream_and_temperature_is_clamped_for_messages() {
    let up = FakeUpstream::start(|seen| {
        if seen.uri.ends_with("/messages") {
            Reply::json(200, messages_reply())
        } else {
            Reply::json(200, chat_reply())
        }
    })
    .await;
    let gw = TestGateway::start(&limits_config(&up.url())).await;

    // Chat → messages: penalties, seed, logit_bias, metadata dropped; temperature clamped to 1.
    let body = chat(
        "to-messages",
        json!({"temperature": 1.7, "presence_penalty": 1, "frequency_penalty": 1, "seed": 7,
            "logit_bias": {"50256": -100}, "metadata": {"k": "v"}, "user": "u-1"}),
    );
    let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
    assert_eq!(status, 200, "{v}");
    let sent = up.last().json();
    assert_eq!(sent["temperature"], 1.0);
    for dropped in [
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "logit_bias",
    ] {
        assert!(
            sent.get(dropped).is_none(),
            "{dropped} must not reach messages: {sent}"
        );
    }
    assert_eq!(
        sent["metadata"],
        json!({"user_id": "u-1"}),
        "only user_id goes to Anthropic metadata"
    );
    assert_eq!(
        sent["max_tokens"], 4096,
        "messages needs max_tokens; the fallback applies"
    );

    // Messages → chat: top_k dropped (OpenAI refuses unknown fields), temperature kept as sent.
    let body = json!({"model": "to-chat", "max_tokens": 5, "temperature": 0.3, "top_k": 40,
        "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, v) = post_json(&gw.base("/v1/messages"), body).await;
    assert_eq!(status, 200, "{v}");
    let sent = up.last().json();
    assert!(sent.get("top_k").is_none(), "{sent}");
    assert_eq!(sent["temperature"], 0.3);
    assert_eq!(sent["max_tokens"], 5);

    // Responses → chat: store is not a chat concept and is not forwarded.
    let body = json!({"model": "to-chat", "input": "hi", "store": true, "max_output_tokens": 9});
    let (status, _, v) = post_json(&gw.base("/v1/responses"), body).await;
    assert_eq!(status, 200, "{v}");
    let sent = up.last().json();
    assert!(sent.get("store").is_none(), "{sent}");
    assert_eq!(sent["max_tokens"], 9);
    assert_eq!(v["object"], "response");
}
