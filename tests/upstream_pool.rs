//! Plain-HTTP upstream connections are reused across requests of every kind, never reused once
//! the upstream has closed them, and closed when the client leaves mid-body.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "tests fail loudly; they spawn their fake servers directly"
)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn chat_reply() -> serde_json::Value {
    json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "real-m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
}

fn sse_reply() -> Reply {
    Reply::sse(vec![
        (
            Duration::ZERO,
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"real-m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n",
        ),
        (Duration::from_millis(5), "data: [DONE]\n\n"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upstream_connection_carries_json_chunked_and_stream_replies_in_turn() {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let up = FakeUpstream::start(move |seen| {
        let i = n2.fetch_add(1, Ordering::SeqCst);
        if seen.json()["stream"] == true {
            return sse_reply();
        }
        if i.is_multiple_of(2) {
            Reply::json(200, chat_reply())
        } else {
            // No content-length: the body ends with the last chunk.
            Reply::Stream {
                status: 200,
                content_type: "application/json",
                chunks: vec![(Duration::ZERO, Bytes::from(chat_reply().to_string()))],
                abort: false,
            }
        }
    })
    .await;
    let gw = TestGateway::start(&one_loop(&chat_config(&up.url()))).await;
    for i in 0..9 {
        let mut body = chat_body("m");
        if i % 3 == 2 {
            body["stream"] = json!(true);
            let text = post_text(&gw.base("/v1/chat/completions"), &body).await;
            assert!(text.contains("data: [DONE]"), "{text}");
        } else {
            let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["choices"][0]["message"]["content"], "hi", "{v}");
        }
    }
    assert_eq!(up.seen().len(), 9);
    assert_eq!(
        up.connections(),
        1,
        "every request after the first reused its connection"
    );
}

/// A keep-alive server that closes each connection a moment after its one reply, as an upstream
/// whose idle timeout is shorter than the gateway's does.
async fn closing_upstream() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head, then as many body bytes as it declares.
                loop {
                    let n = sock.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len: usize = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse().unwrap())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let body = chat_reply().to_string();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                sock.write_all(head.as_bytes()).await.unwrap();
                sock.write_all(body.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(30)).await;
                // Closed without `connection: close`: the gateway learns it only from the socket.
                drop(sock);
            });
        }
    });
    (url, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
    let (url, accepted) = closing_upstream().await;
    let gw = TestGateway::start(&chat_config(&url)).await;
    for _ in 0..3 {
        let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], "hi", "{v}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_closes_the_upstream_connection() {
    let up = FakeUpstream::start(|seen| {
        if seen.json()["stream"] != true {
            return Reply::json(200, chat_reply());
        }
        Reply::sse(vec![
            (
                Duration::ZERO,
                "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"real-m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n",
            ),
            (Duration::from_secs(30), "data: [DONE]\n\n"),
        ])
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let mut resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"hi\""));
    drop(resp);
    assert!(
        up.wait_cancelled(Duration::from_secs(5)).await,
        "the upstream saw its connection closed"
    );
    // The next request cannot have been given the abandoned connection.
    let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(up.connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translated_stream_that_stops_at_its_terminal_event_leaves_its_connection_reusable() {
    // The translator is done at `[DONE]` and drops the upstream body before the chunked body's
    // last chunk is read; hyper drains what is already there and the connection serves again.
    let up = FakeUpstream::start(|_| sse_reply()).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    for _ in 0..6 {
        let body = json!({"model": "m", "max_tokens": 64, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]});
        let text = post_text(&gw.base("/v1/messages"), &body).await;
        assert!(text.contains("event: message_stop"), "{text}");
    }
    assert_eq!(up.seen().len(), 6);
    // The last chunk could in principle arrive after the drop; it practically comes with `[DONE]`.
    assert!(
        up.connections() <= 2,
        "{} connections for 6 streams",
        up.connections()
    );
}
