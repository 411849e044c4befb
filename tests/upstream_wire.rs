//! The gateway's own HTTP/1.1 client toward plain-HTTP upstreams, against upstreams that write raw
//! bytes: every body framing, interim answers, malformed heads, connection reuse and close, and
//! frames relayed as they arrive (together when they arrive together, never waiting for more).
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

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What the raw upstream writes for one request: pieces with a pause before each, and whether it
/// closes the connection afterwards.
struct Script {
    pieces: Vec<(Duration, Vec<u8>)>,
    close: bool,
    /// Waited on before the piece at this index, when set.
    gate: Option<(usize, Arc<Notify>)>,
}

impl Script {
    fn new(pieces: Vec<(Duration, Vec<u8>)>) -> Self {
        Self {
            pieces,
            close: false,
            gate: None,
        }
    }
}

struct RawUpstream {
    url: String,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

/// A keep-alive upstream that answers each request (head plus `content-length` body) with what
/// `script` returns for the request's number (from 0).
async fn raw_upstream(script: impl Fn(usize) -> Script + Send + Sync + 'static) -> RawUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (conns, reqs) = (connections.clone(), requests.clone());
    let script = Arc::new(script);
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            conns.fetch_add(1, Ordering::SeqCst);
            let (reqs, script) = (reqs.clone(), script.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    if !read_request(&mut sock, &mut buf).await {
                        return;
                    }
                    let s = script(reqs.fetch_add(1, Ordering::SeqCst));
                    for (i, (pause, bytes)) in s.pieces.iter().enumerate() {
                        if let Some((at, gate)) = &s.gate {
                            if *at == i {
                                gate.notified().await;
                            }
                        }
                        tokio::time::sleep(*pause).await;
                        if sock.write_all(bytes).await.is_err() {
                            return;
                        }
                    }
                    if s.close {
                        return;
                    }
                }
            });
        }
    });
    RawUpstream {
        url,
        connections,
        requests,
    }
}

/// Reads one request (head and `content-length` body) off `sock`, leaving any excess in `buf`.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                buf.drain(..end + 4 + len);
                return true;
            }
        }
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn reply_json(content: &str) -> String {
    json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "real-m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    .to_string()
}

fn now(bytes: impl Into<Vec<u8>>) -> (Duration, Vec<u8>) {
    (Duration::ZERO, bytes.into())
}

fn after(ms: u64, bytes: impl Into<Vec<u8>>) -> (Duration, Vec<u8>) {
    (Duration::from_millis(ms), bytes.into())
}

fn event(i: usize) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"real-m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}},\"finish_reason\":null}}]}}\n\n"
    )
}

fn chunked(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_reply_with_extensions_trailers_and_odd_splits_arrives_whole() {
    let up = raw_upstream(|_| {
        let body = reply_json("split reply");
        let (a, b) = body.split_at(17);
        // The pieces cut through a size line, a chunk's data, its CRLF and the trailers.
        let wire = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
             {:x};name=\"v\"\r\n{a}\r\n{:X} \r\n{b}\r\n0\r\nx-checksum: 1\r\n\r\n",
            a.len(),
            b.len()
        );
        let cuts = [60, 71, 79, 95, wire.len() - 3, wire.len() - 1];
        let mut pieces = Vec::new();
        let mut at = 0;
        for cut in cuts {
            pieces.push(after(3, &wire.as_bytes()[at..cut]));
            at = cut;
        }
        pieces.push(after(3, &wire.as_bytes()[at..]));
        Script::new(pieces)
    })
    .await;
    let gw = TestGateway::start(&one_loop(&chat_config(&up.url))).await;
    for _ in 0..3 {
        let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], "split reply", "{v}");
    }
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        1,
        "a chunked body read to its trailers leaves the connection reusable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_reply_read_to_the_close_passes_through_on_http_1_1() {
    let up = raw_upstream(|_| {
        let mut s = Script::new(vec![
            now("HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n"),
            after(5, reply_json("until close")),
        ]);
        s.close = true;
        s
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url)).await;
    for _ in 0..2 {
        let resp = client()
            .post(gw.base("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), reqwest::Version::HTTP_11);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "until close", "{v}");
    }
    assert_eq!(up.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_answers_are_skipped_and_connection_close_is_honoured() {
    let up = raw_upstream(|_| {
        let body = reply_json("after continue");
        Script::new(vec![
            now("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"),
            after(
                2,
                format!(
                    "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                ),
            ),
        ])
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url)).await;
    for _ in 0..2 {
        let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], "after continue");
    }
    // The upstream asked to close (and keeps its side open): each request had its own connection.
    assert_eq!(up.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_answer_is_502_in_the_paths_shape_and_its_connection_dropped() {
    // Each phase's answer is the same for every attempt the gateway makes.
    let phase = Arc::new(AtomicUsize::new(0));
    let upstream_phase = phase.clone();
    let up = raw_upstream(move |_| match upstream_phase.load(Ordering::SeqCst) {
        0 => Script::new(vec![now(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
        )]),
        1 => Script::new(vec![now("SSH-2.0-OpenSSH_9.6\r\n\r\n")]),
        2 => Script::new(vec![now(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}",
            reply_json("never")
        ))]),
        _ => {
            let body = reply_json("fine again");
            Script::new(vec![now(format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ))])
        }
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url)).await;
    for want in ["conflicting content-length", "not an HTTP/1.x response"] {
        let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
        assert_openai_error(status, &v, 502, None);
        assert_eq!(v["error"]["code"], "upstream_bad_response", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("\"up\"") && msg.contains(want), "{msg}");
        phase.fetch_add(1, Ordering::SeqCst);
    }
    let attempts = up.requests.load(Ordering::SeqCst);
    assert_eq!(attempts % 2, 0, "both answers were tried as often");
    // A body whose framing breaks after a good head: the client never gets a clean reply (the
    // connection is cut before or after the head, as the first write happened or not).
    let sent = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat_body("m"))
        .send()
        .await;
    if let Ok(resp) = sent {
        assert_eq!(resp.status(), 200);
        assert!(
            resp.bytes().await.is_err(),
            "a broken body is not ended cleanly"
        );
    }
    phase.fetch_add(1, Ordering::SeqCst);
    let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "fine again");
    assert_eq!(up.requests.load(Ordering::SeqCst), attempts + 2);
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        attempts + 2,
        "no connection that carried a malformed answer was used again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_that_arrive_together_leave_together() {
    let up = raw_upstream(|_| {
        // Twenty events and the terminator, each its own chunk, in one write.
        let mut wire = String::from(SSE_HEAD);
        for i in 0..20 {
            wire.push_str(&chunked(&event(i)));
        }
        wire.push_str(&chunked("data: [DONE]\n\n"));
        wire.push_str("0\r\n\r\n");
        Script::new(vec![now(wire)])
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url)).await;
    let chunks = raw_stream_chunks(&gw.base("")).await;
    let all = chunks.concat();
    for i in 0..20 {
        assert!(
            all.contains(&format!("\"w{i} \"")),
            "event {i} missing: {all}"
        );
    }
    assert!(all.ends_with("data: [DONE]\n\n"), "{all}");
    // One upstream read holds them all; a few reads at most if the socket split the write.
    assert!(
        chunks.len() <= 4,
        "21 events that arrived together left in {} chunks",
        chunks.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_relayed_while_the_upstream_still_holds_the_next() {
    let gate = Arc::new(Notify::new());
    let upstream_gate = gate.clone();
    let up = raw_upstream(move |_| {
        let mut s = Script::new(vec![
            now(format!("{SSE_HEAD}{}", chunked(&event(0)))),
            now(format!(
                "{}{}0\r\n\r\n",
                chunked(&event(1)),
                chunked("data: [DONE]\n\n")
            )),
        ]);
        // The rest is written only once the client has the first event.
        s.gate = Some((1, upstream_gate.clone()));
        s
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url)).await;
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let mut resp = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), resp.chunk())
        .await
        .expect("the first event reached the client while the upstream waited")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"w0 \""));
    gate.notify_one();
    let mut rest = Vec::new();
    while let Some(c) = resp.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    let rest = String::from_utf8(rest).unwrap();
    assert!(
        rest.contains("\"w1 \"") && rest.ends_with("data: [DONE]\n\n"),
        "{rest}"
    );
}
