//! Chat passthrough end to end: bodies and streams forwarded untouched, credentials swapped, frames not buffered.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::json;

#[tokio::test]
async fn json_passthrough_keeps_unknown_fields_and_swaps_credentials() {
    let reply = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "real-m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hey"}, "finish_reason": "stop",
        "refs": [{"index": 1, "title": "t", "content": "c", "type": "web", "url": "https://x"}]}],
        "vendor_extra": {"a": [1, 2, 3]}});
    let reply2 = reply.clone();
    let up = FakeUpstream::start(move |_| Reply::json(200, reply2.clone())).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;

    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "custom_field": {"nested": [1, {"x": null}]}, "seed": 7});
    let resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-api-key", "client-secret-2")
        .header("x-custom", "dropped")
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let rid = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(rid.starts_with("req_"), "generated request id: {rid}");
    let got: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        got, reply,
        "the reply passes through untouched, refs included"
    );

    let seen = up.last();
    assert_eq!(seen.uri, "/v1/chat/completions");
    assert_eq!(seen.headers["authorization"], "Bearer up-secret");
    assert!(
        seen.headers.get("x-api-key").is_none(),
        "client x-api-key never forwarded"
    );
    // Headers are forwarded by allowlist (§14): tracing goes on, an unknown header does not.
    assert!(seen.headers.get("x-custom").is_none(), "x-custom forwarded");
    assert_eq!(
        seen.headers["traceparent"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    assert_eq!(seen.headers["x-request-id"].to_str().unwrap(), rid);
    let sent = seen.json();
    assert_eq!(sent["model"], "real-m", "model renamed");
    assert_eq!(sent["custom_field"], body["custom_field"]);
    assert_eq!(sent["seed"], 7);
    assert_eq!(sent["messages"], body["messages"]);
}

#[tokio::test]
async fn client_request_id_is_forwarded_and_returned() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-request-id", "my-trace-42")
        .json(&chat_body("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "my-trace-42");
    assert_eq!(up.last().headers["x-request-id"], "my-trace-42");
}

#[tokio::test]
async fn body_without_rename_is_forwarded_byte_for_byte() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let raw = r#"{"model":"plain",  "messages":[{"role":"user","content":"hi"}], "z": 1.50, "a":"\u00e9"}"#;
    let resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(up.last().body, raw.as_bytes());
}

fn chunk(text: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "real-m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    )
}

#[tokio::test]
async fn stream_frames_arrive_before_the_next_is_sent() {
    let pause = Duration::from_millis(300);
    let c0 = chunk("one");
    let c1 = chunk("two");
    let c2 = chunk("three");
    let (a, b, c) = (c0.clone(), c1.clone(), c2.clone());
    let up = FakeUpstream::start(move |_| {
        Reply::sse(vec![
            (Duration::ZERO, a.as_str()),
            (pause, b.as_str()),
            (pause, c.as_str()),
            (pause, "data: [DONE]\n\n"),
        ])
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let started = Instant::now();
    let resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let mut received = String::new();
    let mut arrival = Vec::new();
    while let Some(piece) = stream.next().await {
        received.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
        arrival.push((started.elapsed(), received.clone()));
    }
    assert_eq!(
        received,
        format!("{c0}{c1}{c2}data: [DONE]\n\n"),
        "stream forwarded untouched"
    );
    // Each chunk must be in the client's hands before the upstream sends the next one:
    // the first chunk by the time the second is due (one pause), and so on.
    for (i, expected) in [&c0, &c1, &c2].iter().enumerate() {
        let (when, _) = arrival
            .iter()
            .find(|(_, text)| text.contains(expected.as_str()))
            .expect("chunk arrived");
        let next_sent_at = pause * (i as u32 + 1);
        assert!(
            *when < next_sent_at,
            "chunk {i} arrived at {when:?}, not before chunk {} was sent at {next_sent_at:?}",
            i + 1
        );
    }
}

#[tokio::test]
async fn http2_client_gets_the_same_answer() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"h2": "ok"}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = h2
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat_body("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"h2": "ok"})
    );
}

/// A config whose model "am" goes to a messages upstream and "ar" to a responses upstream.
fn same_protocol_config(url: &str) -> String {
    config(
        url,
        r#"
[[upstreams]]
name = "anthropic"
kind = "messages"
base_url = "{UPSTREAM}/v1"
api_key_env = "UPSTREAM_KEY"
headers = { "anthropic-version" = "2023-06-01", "anthropic-beta" = "config-beta" }

[[upstreams]]
name = "openai"
kind = "responses"
base_url = "{UPSTREAM}/v1"
api_key_env = "UPSTREAM_KEY"

[[models]]
name = "am"
upstream = "anthropic"
upstream_model = "claude-real"

[[models]]
name = "ar"
upstream = "openai"
"#,
    )
}

#[tokio::test]
async fn messages_passthrough_renames_model_and_keeps_anthropic_headers() {
    let reply = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-real",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 3, "output_tokens": 1}, "vendor": {"x": 1}});
    let r2 = reply.clone();
    let up = FakeUpstream::start(move |_| Reply::json(200, r2.clone())).await;
    let gw = TestGateway::start(&same_protocol_config(&up.url())).await;
    let body = json!({"model": "am", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
        "cache_me": {"type": "ephemeral"}});
    // An older-SDK style client: x-api-key, its own version and beta headers.
    let resp = client()
        .post(gw.base("/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-01-01")
        .header("anthropic-beta", "client-beta")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap(), reply);
    let seen = up.last();
    assert_eq!(seen.uri, "/v1/messages");
    assert_eq!(
        seen.headers["x-api-key"], "up-secret",
        "the upstream's own key, not the client's"
    );
    assert!(seen.headers.get("authorization").is_none());
    assert_eq!(
        seen.headers["anthropic-version"], "2023-01-01",
        "the client's version wins"
    );
    assert_eq!(seen.headers["anthropic-beta"], "client-beta");
    let sent = seen.json();
    assert_eq!(sent["model"], "claude-real");
    assert_eq!(sent["cache_me"], body["cache_me"]);

    // Without client headers, the config's defaults are sent.
    let resp = client()
        .post(gw.base("/v1/messages"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = up.last();
    assert_eq!(seen.headers["anthropic-version"], "2023-06-01");
    assert_eq!(seen.headers["anthropic-beta"], "config-beta");
}

#[tokio::test]
async fn messages_passthrough_refuses_missing_max_tokens_in_anthropic_shape() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&same_protocol_config(&up.url())).await;
    let (status, _, v) = post_json(
        &gw.base("/v1/messages"),
        json!({"model": "am", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn messages_stream_passthrough_is_untouched_and_a_break_becomes_an_error_event() {
    let events = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-real\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n";
    let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let clean = format!("{events}{stop}");
    let clean2 = clean.clone();
    let up = FakeUpstream::start(move |seen| {
        if seen.json()["max_tokens"] == 1 {
            Reply::sse(vec![(Duration::ZERO, events)])
        } else {
            Reply::sse(vec![(Duration::ZERO, clean2.as_str())])
        }
    })
    .await;
    let gw = TestGateway::start(&same_protocol_config(&up.url())).await;
    let body = |max: u32| json!({"model": "am", "max_tokens": max, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let text = post_text(&gw.base("/v1/messages"), &body(5)).await;
    assert_eq!(text, clean, "a clean stream passes byte for byte");
    let text = post_text(&gw.base("/v1/messages"), &body(1)).await;
    assert!(text.starts_with(events));
    let tail = &text[events.len()..];
    assert!(tail.starts_with("event: error\ndata: "), "{tail}");
    assert!(tail.contains("\"type\":\"api_error\""), "{tail}");
}

#[tokio::test]
async fn responses_passthrough_and_stream_break() {
    let created = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"output\":[]}}\n\n";
    let completed = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[]}}\n\n";
    let clean = format!("{created}{completed}");
    let clean2 = clean.clone();
    let up = FakeUpstream::start(move |seen| match seen.json()["stream"].as_bool() {
        Some(true) if seen.json()["input"] == "break" => {
            Reply::sse(vec![(Duration::ZERO, created)])
        }
        Some(true) => Reply::sse(vec![(Duration::ZERO, clean2.as_str())]),
        _ => Reply::json(
            200,
            json!({"id": "resp_1", "object": "response", "status": "completed", "output": []}),
        ),
    })
    .await;
    let gw = TestGateway::start(&same_protocol_config(&up.url())).await;
    let (status, _, v) = post_json(
        &gw.base("/v1/responses"),
        json!({"model": "ar", "input": "hi", "unknown": [1]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["id"], "resp_1");
    let seen = up.last();
    assert_eq!(seen.uri, "/v1/responses");
    assert_eq!(seen.headers["authorization"], "Bearer up-secret");
    assert_eq!(seen.json()["unknown"], json!([1]));

    let stream = |input: &str| json!({"model": "ar", "input": input, "stream": true});
    let text = post_text(&gw.base("/v1/responses"), &stream("ok")).await;
    assert_eq!(text, clean);
    let text = post_text(&gw.base("/v1/responses"), &stream("break")).await;
    assert!(text.starts_with(created));
    assert!(
        text[created.len()..].starts_with("event: error\ndata: "),
        "{text}"
    );

    let (status, _, v) = post_json(&gw.base("/v1/responses"), json!({"model": "ar"})).await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "input");
}
