//! Failure paths: upstream unreachable, silent, erroring, breaking mid-stream; client going away; oversized and malformed input.
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

fn stream_body(model: &str) -> serde_json::Value {
    let mut b = chat_body(model);
    b["stream"] = json!(true);
    b
}

#[tokio::test]
async fn connection_refused_is_502() {
    // Bound but never listening: refused, and no parallel test's listener can get the port.
    let reserved = tokio::net::TcpSocket::new_v4().unwrap();
    reserved.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = reserved.local_addr().unwrap().port();
    let gw = TestGateway::start(&chat_config(&format!("http://127.0.0.1:{port}"))).await;
    let (status, _, body) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_openai_error(status, &body, 502, None);
    assert_eq!(body["error"]["code"], "upstream_unreachable");
}

#[tokio::test]
async fn silent_upstream_is_504_and_is_dropped() {
    let up = FakeUpstream::start(|_| Reply::Hang).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let (status, _, body) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_openai_error(status, &body, 504, None);
    assert_eq!(body["error"]["code"], "upstream_timeout");
    assert!(
        up.wait_cancelled(Duration::from_secs(2)).await,
        "the upstream request is abandoned after the timeout"
    );
}

#[tokio::test]
async fn upstream_429_passes_through_with_retry_after() {
    let err = json!({"error": {"message": "slow down", "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}});
    let err2 = err.clone();
    let up = FakeUpstream::start(move |_| Reply::Full {
        status: 429,
        headers: vec![
            ("content-type", "application/json".into()),
            ("retry-after", "7".into()),
        ],
        body: err2.to_string().into(),
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let (status, headers, body) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(body, err, "the upstream's error body is passed on");
}

#[tokio::test]
async fn upstream_500_passes_through_on_a_stream_request() {
    let up = FakeUpstream::start(|_| Reply::json(503, json!({"error": {"message": "overloaded", "type": "server_error", "param": null, "code": null}}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let (status, _, body) = post_json(&gw.base("/v1/chat/completions"), stream_body("m")).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["message"], "overloaded");
}

const FIRST: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n";

/// Starts the usual streamed chat request through `gw`.
async fn start_stream(gw: &TestGateway) -> reqwest::Response {
    client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&stream_body("m"))
        .send()
        .await
        .unwrap()
}

async fn read_all(resp: reqwest::Response) -> String {
    let mut out = String::new();
    let mut s = resp.bytes_stream();
    while let Some(piece) = s.next().await {
        match piece {
            Ok(b) => out.push_str(&String::from_utf8_lossy(&b)),
            Err(e) => panic!("the client saw a transport error instead of an in-stream error: {e}; got so far: {out}"),
        }
    }
    out
}

fn assert_ends_with_error_and_done(text: &str) {
    let events: Vec<&str> = text
        .split("\n\n")
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "stream: {text}");
    let err = events[events.len() - 2]
        .strip_prefix("data: ")
        .expect("a data event");
    let v: serde_json::Value = serde_json::from_str(err).expect("the error chunk is JSON");
    assert!(v["error"]["message"].is_string(), "error chunk: {v}");
}

#[tokio::test]
async fn stream_broken_midway_ends_with_error_chunk_and_done() {
    let up = FakeUpstream::start(|_| Reply::Stream {
        status: 200,
        content_type: "text/event-stream",
        // The pause lets the head and first frame reach the client before the break.
        chunks: vec![
            (Duration::ZERO, FIRST.into()),
            (Duration::from_millis(100), FIRST.into()),
        ],
        abort: true,
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let resp = start_stream(&gw).await;
    assert_eq!(resp.status(), 200);
    let text = read_all(resp).await;
    assert!(
        text.starts_with(FIRST),
        "the frames before the break arrive: {text}"
    );
    assert_ends_with_error_and_done(&text);
}

#[tokio::test]
async fn stream_ending_without_done_is_not_a_clean_end() {
    let up = FakeUpstream::start(|_| Reply::sse(vec![(Duration::ZERO, FIRST)])).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let resp = start_stream(&gw).await;
    let text = read_all(resp).await;
    assert!(text.starts_with(FIRST));
    assert_ends_with_error_and_done(&text);
}

#[tokio::test]
async fn stream_idle_past_timeout_ends_with_error() {
    // The test config's idle timeout is 2 s; the upstream pauses 5 s after the first chunk.
    let up = FakeUpstream::start(|_| {
        Reply::sse(vec![
            (Duration::ZERO, FIRST),
            (Duration::from_secs(5), "data: [DONE]\n\n"),
        ])
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let resp = start_stream(&gw).await;
    let text = read_all(resp).await;
    assert_ends_with_error_and_done(&text);
    assert!(text.contains("sent nothing for"), "{text}");
    assert!(
        up.wait_cancelled(Duration::from_secs(2)).await,
        "the idle upstream is dropped"
    );
}

#[tokio::test]
async fn a_stream_longer_than_the_idle_timeout_with_frames_inside_it_is_not_cut() {
    // 2 s of idle timeout; frames 0.8 s apart for 3.2 s: the timer counts from the last frame.
    let gap = Duration::from_millis(800);
    let up = FakeUpstream::start(move |_| {
        Reply::sse(vec![
            (Duration::ZERO, FIRST),
            (gap, FIRST),
            (gap, FIRST),
            (gap, FIRST),
            (gap, "data: [DONE]\n\n"),
        ])
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let resp = start_stream(&gw).await;
    let text = read_all(resp).await;
    assert_eq!(
        text,
        format!("{FIRST}{FIRST}{FIRST}{FIRST}data: [DONE]\n\n")
    );
}

#[tokio::test]
async fn clean_stream_gets_no_extra_bytes() {
    let up = FakeUpstream::start(|_| {
        Reply::sse(vec![
            (Duration::ZERO, FIRST),
            (Duration::ZERO, "data: [DONE]\n\n"),
        ])
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let resp = start_stream(&gw).await;
    assert_eq!(read_all(resp).await, format!("{FIRST}data: [DONE]\n\n"));
}

#[tokio::test]
async fn client_disconnect_mid_stream_closes_the_upstream_request() {
    let chunks: Vec<(Duration, &str)> = std::iter::once((Duration::ZERO, FIRST))
        .chain((0..50).map(|_| (Duration::from_millis(100), FIRST)))
        .collect();
    let chunks: Vec<(Duration, String)> =
        chunks.into_iter().map(|(d, s)| (d, s.to_owned())).collect();
    let up = FakeUpstream::start(move |_| {
        Reply::sse(chunks.iter().map(|(d, s)| (*d, s.as_str())).collect())
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let resp = start_stream(&gw).await;
    let mut s = resp.bytes_stream();
    let first = s.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(s); // the client goes away mid-stream
    assert!(
        up.wait_cancelled(Duration::from_secs(2)).await,
        "the upstream sees its response abandoned within 2 s, long before the 5 s stream ends"
    );
}

#[tokio::test]
async fn client_disconnect_before_the_answer_closes_the_upstream_request() {
    let up = FakeUpstream::start(|_| Reply::Hang).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let url = gw.base("/v1/chat/completions");
    let call = tokio::spawn(async move {
        client()
            .post(url)
            .bearer_auth(KEY)
            .json(&chat_body("m"))
            .send()
            .await
    });
    // Wait until the upstream has the request, then abandon the client side.
    for _ in 0..100 {
        if !up.seen().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.seen().len(), 1);
    call.abort();
    assert!(
        up.wait_cancelled(Duration::from_millis(1500)).await,
        "the upstream request is dropped when the client leaves (before the 2 s first-byte timeout)"
    );
}

#[tokio::test]
async fn oversized_body_is_413_and_never_forwarded() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    // The test config allows 65536 bytes.
    let mut body = chat_body("m");
    body["messages"][0]["content"] = json!("x".repeat(70_000));
    let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
    assert_openai_error(status, &v, 413, None);
    // Exactly at the limit is fine.
    let mut body = chat_body("m");
    let base_len = serde_json::to_vec(&body).unwrap().len();
    body["messages"][0]["content"] = json!("x".repeat(65_536 - base_len + 2));
    assert_eq!(serde_json::to_vec(&body).unwrap().len(), 65_536);
    let (status, _, _) = post_json(&gw.base("/v1/chat/completions"), body).await;
    assert_eq!(status, 200);
    assert_eq!(
        up.seen().len(),
        1,
        "only the body within the limit was forwarded"
    );
}

#[tokio::test]
async fn oversized_chunked_body_is_413() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    // No content-length: the limit must hold while reading a chunked body too.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = (0..20)
        .map(|_| Ok(bytes::Bytes::from(vec![b' '; 8192])))
        .collect();
    let resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn malformed_json_is_400_and_the_gateway_keeps_serving() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": 1}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    for bad in ["{", "not json", "[1,2]", "{\"model\": }", "", "\u{0}"] {
        let resp = client()
            .post(gw.base("/v1/chat/completions"))
            .bearer_auth(KEY)
            .body(bad)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_openai_error(status, &v, 400, None);
    }
    assert!(up.seen().is_empty());
    let (status, _, _) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 200, "still serving");
}

#[tokio::test]
async fn unknown_path_404_and_wrong_method_405() {
    let gw = TestGateway::start(&chat_config("http://127.0.0.1:9")).await;
    let resp = client().get(gw.base("/v1/nope")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].is_string());
    let resp = client()
        .get(gw.base("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "POST");
}

#[tokio::test]
async fn a_translated_reply_that_stalls_past_the_idle_timeout_is_504() {
    // The test config's idle timeout is 2 s; the reply's second half comes 5 s after its first.
    let up = FakeUpstream::start(|_| Reply::Stream {
        status: 200,
        content_type: "application/json",
        chunks: vec![
            (Duration::ZERO, bytes::Bytes::from_static(b"{\"id\":\"c\",")),
            (
                Duration::from_secs(5),
                bytes::Bytes::from_static(b"\"choices\":[]}"),
            ),
        ],
        abort: false,
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    // messages client → chat upstream: the reply is read whole to be translated.
    let body =
        json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, v) = post_json(&gw.base("/v1/messages"), body).await;
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "timeout_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sent nothing for 2000 ms"),
        "{v}"
    );
    assert!(
        up.wait_cancelled(Duration::from_secs(2)).await,
        "the stalled upstream is dropped"
    );
}
