//! Per-key limits through the gateway with the in-process store: rpm, max_concurrent (streams until their last byte), tpm and daily tokens charged from replies' usage, video creation, the headers and the metric.
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
use modelgate::config::Address;
use serde_json::json;

/// A chat upstream and a messages upstream at `url`, models on each, and two keys: `sk-test`
/// with `limits`, and `sk-free` with none.
fn limited(url: &str, limits: &str) -> String {
    config(
        url,
        &format!(
            r#"
[[keys]]
name = "limited"
key = "sk-limited"
{limits}

[[upstreams]]
name = "up"
kind = "chat"
base_url = "{{UPSTREAM}}/v1"

[[upstreams]]
name = "anthropic"
kind = "messages"
base_url = "{{UPSTREAM}}/v1"

[[upstreams]]
name = "mock"
kind = "mock"

[[models]]
name = "m"
upstream = "up"
retry = {{ attempts = 1 }}

[[models]]
name = "claude"
upstream = "anthropic"

[[models]]
name = "video-3.1-generate-001"
upstream = "mock"
"#
        ),
    )
}

fn chat_reply(prompt: u64, completion: u64) -> Reply {
    Reply::json(
        200,
        json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}),
    )
}

async fn post(url: &str, key: &str, body: serde_json::Value) -> reqwest::Response {
    client()
        .post(url)
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn rpm_admits_its_burst_then_refuses_with_headers_in_each_shape() {
    let up = FakeUpstream::start(|_| chat_reply(1, 1)).await;
    let gw = TestGateway::start(&limited(&up.url(), "rpm = 60")).await;
    let url = gw.base("/v1/chat/completions");
    // rpm 60: a burst of 6 at once.
    for i in 0..6 {
        let resp = post(&url, "sk-limited", chat_body("m")).await;
        assert_eq!(resp.status(), 200, "request {i}");
        assert_eq!(header(&resp, "x-ratelimit-limit-requests"), Some("60"));
        let remaining: u64 = header(&resp, "x-ratelimit-remaining-requests")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(remaining, 59 - i, "request {i}");
        assert!(header(&resp, "x-ratelimit-reset-requests").is_some());
    }
    let resp = post(&url, "sk-limited", chat_body("m")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "retry-after"), Some("1"));
    assert_eq!(header(&resp, "x-ratelimit-remaining-requests"), Some("54"));
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("60 requests per minute"),
        "{body}"
    );
    assert_eq!(
        up.seen().len(),
        6,
        "a refused request never reaches the upstream"
    );

    // The same key on /v1/messages: refused in Anthropic's shape.
    let resp = client()
        .post(gw.base("/v1/messages"))
        .header("x-api-key", "sk-limited")
        .json(&json!({"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");

    // Another key is not affected, and an unlimited key gets no rate-limit headers.
    let resp = post(&url, KEY, chat_body("m")).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "x-ratelimit-limit-requests").is_none());

    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("modelgate_rate_limited_total{key=\"limited\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn max_concurrent_holds_a_slot_until_the_stream_ends() {
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    let up = FakeUpstream::start(move |seen| {
        if seen.json()["stream"] == true {
            Reply::sse(vec![
                (Duration::ZERO, chunk),
                (Duration::from_millis(400), "data: [DONE]\n\n"),
            ])
        } else {
            chat_reply(1, 1)
        }
    })
    .await;
    let gw = TestGateway::start(&limited(&up.url(), "max_concurrent = 1")).await;
    let url = gw.base("/v1/chat/completions");
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let stream = post(&url, "sk-limited", body).await;
    assert_eq!(stream.status(), 200);
    // The stream's head is out but its body is not: the slot is still held.
    let refused = post(&url, "sk-limited", chat_body("m")).await;
    assert_eq!(refused.status(), 429);
    let msg: serde_json::Value = refused.json().await.unwrap();
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 requests in progress"),
        "{msg}"
    );
    assert_eq!(
        stream.text().await.unwrap(),
        format!("{chunk}data: [DONE]\n\n")
    );
    // The stream's last byte released the slot; the release is immediate in-process.
    let resp = post(&url, "sk-limited", chat_body("m")).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn tpm_and_daily_tokens_are_charged_from_usage_json_and_streams() {
    // 80 + 40 = 120 tokens per chat reply; the messages stream reports 30 + 70 = 100.
    let up = FakeUpstream::start(|seen| {
        if seen.uri.ends_with("/messages") {
            Reply::sse(vec![
                (Duration::ZERO, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":30,\"output_tokens\":1}}}\n\n"),
                (Duration::from_millis(20), "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":70}}\n\n"),
                (Duration::ZERO, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
            ])
        } else {
            chat_reply(80, 40)
        }
    })
    .await;
    let gw = TestGateway::start(&limited(&up.url(), "tpm = 100\ndaily_tokens = 1000")).await;
    let url = gw.base("/v1/chat/completions");
    let first = post(&url, "sk-limited", chat_body("m")).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), Some("100"));
    assert_eq!(header(&first, "x-ratelimit-remaining-tokens"), Some("100"));
    let _ = first.bytes().await.unwrap();
    // 120 tokens charged when that reply ended: the minute is over its 100.
    let second = post(&url, "sk-limited", chat_body("m")).await;
    assert_eq!(second.status(), 429);
    assert_eq!(header(&second, "x-ratelimit-remaining-tokens"), Some("0"));
    let msg: serde_json::Value = second.json().await.unwrap();
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap()
            .contains("100 tokens per minute"),
        "{msg}"
    );

    // A daily budget, charged by a passed-through Anthropic stream.
    let gw = TestGateway::start(&limited(&up.url(), "daily_tokens = 100")).await;
    let messages = |gw: &TestGateway| {
        client()
            .post(gw.base("/v1/messages"))
            .header("x-api-key", "sk-limited")
            .json(
                &json!({"model": "claude", "max_tokens": 100, "stream": true,
                "messages": [{"role": "user", "content": "hi"}]}),
            )
            .send()
    };
    let resp = messages(&gw).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("message_stop"));
    let resp = messages(&gw).await.unwrap();
    assert_eq!(resp.status(), 429);
    let retry: u64 = header(&resp, "retry-after").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "until midnight UTC: {retry}");
    let body: serde_json::Value = resp.json().await.unwrap();
    let text = body["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("daily token budget") && text.contains("100 of 100"),
        "{text}"
    );
}

#[tokio::test]
async fn video_creation_counts_against_rpm() {
    let gw = TestGateway::start(&limited("http://127.0.0.1:9", "rpm = 10")).await;
    let url = gw.url(Address::Video, "/v1/video/generations");
    let body = json!({"model": "video-3.1-generate-001", "input": {"prompt": "a fox"},
        "parameters": {"generate_audio": false}});
    // rpm 10: a burst of one.
    let first = post(&url, "sk-limited", body.clone()).await;
    assert_eq!(first.status(), 200);
    let second = post(&url, "sk-limited", body).await;
    assert_eq!(second.status(), 429);
    assert_eq!(header(&second, "retry-after"), Some("6"));
    let env: serde_json::Value = second.json().await.unwrap();
    assert_eq!(env["code"], 100429);
}

#[tokio::test]
async fn a_chat_stream_is_asked_for_usage_the_client_does_not_see() {
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    let usage =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":90,\"completion_tokens\":30}}\n\n";
    let up = FakeUpstream::start(move |_| {
        Reply::sse(vec![
            (Duration::ZERO, chunk),
            (Duration::from_millis(10), usage),
            (Duration::ZERO, "data: [DONE]\n\n"),
        ])
    })
    .await;
    let gw = TestGateway::start(&limited(&up.url(), "tpm = 100")).await;
    let url = gw.base("/v1/chat/completions");
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"other": 1});
    let resp = post(&url, "sk-limited", body.clone()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.text().await.unwrap(),
        format!("{chunk}data: [DONE]\n\n"),
        "the usage chunk the client did not ask for is not forwarded"
    );
    assert_eq!(
        up.last().json()["stream_options"],
        json!({"other": 1, "include_usage": true})
    );
    // Its 120 tokens were charged all the same.
    let resp = post(&url, "sk-limited", body.clone()).await;
    assert_eq!(resp.status(), 429);

    // A client that asks for usage gets it, untouched.
    let gw = TestGateway::start(&limited(&up.url(), "tpm = 100")).await;
    body["stream_options"] = json!({"include_usage": true});
    let resp = post(&gw.base("/v1/chat/completions"), "sk-limited", body).await;
    assert_eq!(
        resp.text().await.unwrap(),
        format!("{chunk}{usage}data: [DONE]\n\n")
    );
}
