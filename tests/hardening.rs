//! Hostile clients and hostile upstreams (gateway.md §14): each attack reproduced on real sockets against small limits, then shown to fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use modelgate::config::Address;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The usual test config with small client and reply limits, a messages upstream beside the
/// chat one, and a video model on the mock.
fn hostile_config(upstream_url: &str) -> String {
    let limits = "idle_timeout_ms = 2000
client_idle_timeout_ms = 300
client_body_timeout_ms = 300
max_connections = 4
max_reply_bytes = 65536
max_event_bytes = 4096";
    let extra = r#"
[[upstreams]]
name = "anth"
kind = "messages"
base_url = "{UPSTREAM}/v1"
api_key_env = "UPSTREAM_KEY"
forward_headers = ["x-tenant"]

[[models]]
name = "claude"
upstream = "anth"

[[models]]
name = "video-3.1-generate-001"
upstream = "mock"
addresses = ["video"]
"#;
    format!(
        "{}{}",
        chat_config(upstream_url),
        extra.replace("{UPSTREAM}", upstream_url)
    )
    .replace("idle_timeout_ms = 2000", limits)
    .replace("max_request_bytes = 65536", "max_request_bytes = 1048576")
}

/// A chat completion's request head, for a body of `len` bytes the test sends as it pleases.
fn chat_head(len: usize) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    )
}

async fn hostile(up: &FakeUpstream) -> TestGateway {
    TestGateway::start(&hostile_config(&up.url())).await
}

fn messages_body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

/// POSTs raw bytes as JSON with the test key.
async fn post_raw(url: &str, body: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let resp = client()
        .post(url)
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

// ---- a repeated key smuggles past validation ----

#[tokio::test]
async fn a_repeated_key_is_refused_on_every_path_and_never_forwarded() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = hostile(&up).await;
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"model":"premium","messages":[{"role":"user","content":"hi"}],"model":"m"}"#,
            "model",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","temperature":9,"messages":[{"role":"user","content":"hi"}],"temperature":1}"#,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"a","role":"system"}]}"#,
            "messages[0].role",
        ),
        (
            "/v1/messages",
            r#"{"model":"claude","max_tokens":16,"messages":[{"role":"user","content":"hi"}],"max_tokens":99999999}"#,
            "max_tokens",
        ),
    ];
    for (path, body, param) in cases {
        let (status, _, v) = post_raw(&gw.base(path), body).await;
        assert_eq!(status, 400, "{path} {body}: {v}");
        let err = &v["error"];
        let message = err["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(param),
            "{body}: message names `{param}`: {v}"
        );
        if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
            assert_eq!(err["type"], "invalid_request_error", "{v}");
        } else {
            assert_eq!(err["param"], param, "{v}");
        }
    }
    // Video creation: the envelope's 400.
    let resp = client()
        .post(gw.url(Address::Video, "/v1/video/generations"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(r#"{"model":"video-3.1-generate-001","input":{"prompt":"a fox"},"parameters":{"generate_audio":true},"model":"other"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["code"], 100400, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("model"), "{v}");
    assert!(up.seen().is_empty(), "a refused body reached the upstream");
}

#[tokio::test]
async fn deep_nesting_is_refused_on_passthrough_as_on_translation() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = hostile(&up).await;
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let body = format!(
        r#"{{"model":"claude","max_tokens":16,"messages":[{{"role":"user","content":"hi"}}],"metadata":{deep}}}"#
    );
    let (status, _, v) = post_raw(&gw.base("/v1/messages"), &body).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deeper than"),
        "{v}"
    );
    assert!(up.seen().is_empty());
}

// ---- silent and slow clients ----

/// Reads until the server closes the connection; false if it is still open after `within`
/// (a generous bound: the gateway's own limit in these tests is 300 ms).
async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn a_connection_that_never_sends_a_byte_is_closed() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = hostile(&up).await;
    let addr = gw.running.addr(Address::Base).unwrap();
    // Plain: not a byte.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    // h2c: the preface, then nothing.
    let mut h2c = TcpStream::connect(addr).await.unwrap();
    h2c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // HTTP/1.1 keep-alive after one answered request: idle again.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    for (name, s) in [
        ("plain", &mut plain),
        ("h2c", &mut h2c),
        ("keep-alive", &mut kept),
    ] {
        assert!(
            closed_by_server(s, Duration::from_secs(10)).await,
            "{name}: an idle connection stayed open"
        );
    }
}

#[tokio::test]
async fn a_head_that_trickles_in_is_closed_at_the_client_idle_timeout() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = hostile(&up).await;
    let addr = gw.running.addr(Address::Base).unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // One byte of a header every 50 ms, never the end of the head: bytes alone do not keep the
    // connection open, only a request does (the limit here is 300 ms).
    let started = tokio::time::Instant::now();
    let mut closed = false;
    for b in b"x-trickle: ".iter().cycle().take(200) {
        if s.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 256];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await
        {
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "a head sent a byte at a time kept the connection open for 10 s"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed only after {:?}",
        started.elapsed()
    );
}

/// The other side of the client idle timeout: a connection with a response still going out
/// is never idle, however long its stream pauses.
#[tokio::test]
async fn a_stream_pausing_past_the_client_idle_timeout_keeps_its_connection() {
    let chunk = |text: &str| {
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]})
        )
    };
    let (first, second) = (chunk("before"), chunk("after"));
    let up = FakeUpstream::start(move |_| {
        // A pause of 900 ms: three times the client idle timeout (300 ms), under the upstream
        // idle timeout (2 s).
        Reply::sse(vec![
            (Duration::ZERO, &first),
            (Duration::from_millis(900), &second),
            (Duration::ZERO, "data: [DONE]\n\n"),
        ])
    })
    .await;
    let gw = hostile(&up).await;
    let text = raw_stream_chunks(&gw.base("")).await.concat();
    for part in ["\"before\"", "\"after\"", "[DONE]"] {
        assert!(text.contains(part), "{part} missing from {text:?}");
    }
}

#[tokio::test]
async fn an_http2_connection_that_only_pings_is_closed() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = hostile(&up).await;
    let addr = gw.running.addr(Address::Base).unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // A PING every 100 ms, well inside the 300 ms idle limit, and never a request.
    let ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00pingpong";
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if s.write_all(ping).await.is_err() {
                return;
            }
            let read = tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await;
            if let Ok(Ok(0) | Err(_)) = read {
                return;
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "PINGs kept a connection with no request open"
    );
}

#[tokio::test]
async fn a_request_body_dribbled_inside_the_silence_limit_is_still_cut_off() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = hostile(&up).await;
    let addr = gw.running.addr(Address::Base).unwrap();
    let body = serde_json::to_string(&chat_body("m")).unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(chat_head(body.len()).as_bytes()).await.unwrap();
    // One byte every 100 ms: never silent for the 300 ms body timeout, but far below 1 KiB/s.
    let (mut rd, mut wr) = s.into_split();
    let bytes = body.into_bytes();
    let dribble = tokio::spawn(async move {
        for b in bytes {
            if wr.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut answer)).await;
    dribble.abort();
    assert!(read.is_ok(), "the dribbled upload was never cut off");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("slower than 1024 bytes a second"), "{text}");
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn a_tls_session_that_never_sends_a_request_is_closed() {
    use std::sync::Arc;
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = std::env::temp_dir().join(format!("modelgate-hardening-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let toml = hostile_config(&up.url()).replace(
        "[limits]",
        &format!("[tls]\ncert = {cert:?}\nkey = {key:?}\n\n[limits]"),
    );
    let gw = TestGateway::start(&toml).await;
    let addr = gw.running.addr(Address::Base).unwrap();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut session = connector.connect(name, tcp).await.expect("handshake");
    assert!(
        closed_by_server(&mut session, Duration::from_secs(10)).await,
        "a TLS session with no request stayed open"
    );
}

#[tokio::test]
async fn a_request_body_dribbled_byte_by_byte_is_cut_off_with_408() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    let gw = hostile(&up).await;
    let addr = gw.running.addr(Address::Base).unwrap();
    let body = serde_json::to_string(&chat_body("m")).unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(chat_head(body.len()).as_bytes()).await.unwrap();
    s.write_all(&body.as_bytes()[..1]).await.unwrap();
    // Then silence, well past the 300 ms body timeout; the answer must come by itself.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the stalled upload was never cut off");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn past_max_connections_a_listener_waits_and_other_listeners_still_answer() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"ok": true}))).await;
    // Idle connections are not closed during this test, so the limit is what holds them off.
    let toml = hostile_config(&up.url()).replace(
        "client_idle_timeout_ms = 300",
        "client_idle_timeout_ms = 60000",
    );
    let gw = TestGateway::start(&toml).await;
    let base = gw.running.addr(Address::Base).unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(base).await.unwrap();
        // A request answered proves the connection was accepted and is being served.
        s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).await.unwrap();
        held.push(s);
    }
    // The fifth waits in the backlog: its request gets no answer while the four are open.
    let mut fifth = TcpStream::connect(base).await.unwrap();
    fifth
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    let early = tokio::time::timeout(Duration::from_millis(500), fifth.read(&mut buf)).await;
    assert!(
        early.is_err(),
        "a fifth connection was served past max_connections = 4"
    );
    // Another listener has its own accept loop and its own count.
    let health = client()
        .get(gw.url(Address::Admin, "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // One closes: the fifth is accepted and answered.
    drop(held.pop());
    tokio::time::timeout(Duration::from_secs(10), fifth.read_exact(&mut buf))
        .await
        .expect("the waiting connection was never served")
        .unwrap();
    assert_eq!(&buf[..9], b"HTTP/1.1 ");
}

#[tokio::test]
async fn a_client_that_takes_no_bytes_is_dropped_with_its_upstream() {
    // A long stream; the client reads its head and then nothing.
    let chunk = format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x".repeat(2000)}}]})
    );
    let chunk = Bytes::from(chunk);
    let up = FakeUpstream::start(move |_| Reply::Stream {
        status: 200,
        content_type: "text/event-stream",
        chunks: vec![(Duration::ZERO, chunk.clone()); 20_000],
        abort: false,
    })
    .await;
    let gw = hostile(&up).await;
    let addr = gw.running.addr(Address::Base).unwrap();
    let body = serde_json::to_string(
        &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut first = [0u8; 12];
    s.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    // Not another byte read: the socket buffers fill, the gateway's writes stall past
    // idle_timeout_ms (2 s here), and it lets go of the client and the upstream.
    assert!(
        up.wait_cancelled(Duration::from_secs(30)).await,
        "the upstream stream was kept open for a client that reads nothing"
    );
    drop(s);
}

// ---- hostile upstreams ----

/// A JSON reply sent chunked, without a content-length: only counting its bytes can catch it.
fn chunked_json(text: &str) -> Reply {
    Reply::Stream {
        status: 200,
        content_type: "application/json",
        chunks: text
            .as_bytes()
            .chunks(8192)
            .map(|c| (Duration::ZERO, Bytes::copy_from_slice(c)))
            .collect(),
        abort: false,
    }
}

#[tokio::test]
async fn a_reply_over_max_reply_bytes_is_a_502_on_a_translated_pair() {
    let big = "x".repeat(200_000);
    let reply = json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": big}, "finish_reason": "stop"}]});
    let text = reply.to_string();
    let up = FakeUpstream::start(move |_| chunked_json(&text)).await;
    let gw = hostile(&up).await;
    // messages client → chat upstream: the reply is collected to be translated.
    let (status, _, v) = post_json(&gw.base("/v1/messages"), messages_body("m")).await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["type"], "error");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("65536"),
        "{v}"
    );
}

#[tokio::test]
async fn a_declared_length_over_max_reply_bytes_is_a_502_before_any_byte() {
    let big = json!({"filler": "y".repeat(200_000)});
    let up = FakeUpstream::start(move |_| Reply::json(200, big.clone())).await;
    let gw = hostile(&up).await;
    // Content-length declared: refused before the head, on passthrough too.
    let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "upstream_bad_response", "{v}");
}

#[tokio::test]
async fn an_undeclared_passthrough_reply_over_the_limit_is_cut() {
    let text = json!({"filler": "z".repeat(200_000)}).to_string();
    let up = FakeUpstream::start(move |_| chunked_json(&text)).await;
    let gw = hostile(&up).await;
    let sent = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat_body("m"))
        .send()
        .await;
    // The head goes out before the body is read, unless the whole reply arrived before the head
    // could be written: then the connection is closed before it, which is as much a refusal.
    let resp = match sent {
        Err(e) => {
            assert!(e.is_request(), "{e}");
            return;
        }
        Ok(resp) => resp,
    };
    assert_eq!(resp.status(), 200, "the head was already on its way");
    let body = resp.bytes().await;
    match body {
        Err(_) => {}
        Ok(b) => panic!("a {}-byte body passed a 65536-byte limit", b.len()),
    }
}

/// An event stream whose second event is one line of `n` bytes with no line break.
fn runaway_stream(first: &str, n: usize) -> Reply {
    let mut chunks = vec![(Duration::ZERO, Bytes::from(first.to_owned()))];
    chunks.push((Duration::ZERO, Bytes::from_static(b"data: {\"a\":\"")));
    for _ in 0..n / 1024 {
        chunks.push((Duration::ZERO, Bytes::from(vec![b'q'; 1024])));
    }
    Reply::Stream {
        status: 200,
        content_type: "text/event-stream",
        chunks,
        abort: false,
    }
}

#[tokio::test]
async fn an_event_over_max_event_bytes_ends_the_stream_with_the_protocols_error() {
    let first = format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]})
    );
    let up = FakeUpstream::start(move |_| runaway_stream(&first, 1 << 20)).await;
    let gw = hostile(&up).await;
    // Translated: chat upstream → messages client.
    let mut body = messages_body("m");
    body["stream"] = json!(true);
    let text = post_text(&gw.base("/v1/messages"), &body).await;
    assert!(text.contains("event: error"), "{text}");
    assert!(text.contains("4096"), "{text}");
    assert!(
        text.len() < 16_384,
        "the runaway event reached the client: {} bytes",
        text.len()
    );
    // Passthrough: chat → chat; what passed before the limit is at most the limit.
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let text = post_text(&gw.base("/v1/chat/completions"), &body).await;
    assert!(
        text.contains("\"error\""),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
    assert!(
        text.len() < 16_384,
        "{} bytes passed a 4096-byte event limit",
        text.len()
    );
}

#[tokio::test]
async fn an_upstream_s_own_x_request_id_stays_readable_beside_the_gateway_s() {
    let up = FakeUpstream::start(|_| Reply::Full {
        status: 200,
        headers: vec![
            ("content-type", "application/json".into()),
            ("x-request-id", "req_openai_side".into()),
        ],
        body: Bytes::from(
            json!({"id": "c", "object": "chat.completion", "created": 1, "model": "real-m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]})
            .to_string(),
        ),
    })
    .await;
    let gw = hostile(&up).await;
    let (status, headers, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 200, "{v}");
    let ours = headers["x-request-id"].to_str().unwrap();
    assert!(
        ours.starts_with("req_") && ours != "req_openai_side",
        "{ours}"
    );
    assert_eq!(up.last().headers["x-request-id"], ours);
    assert_eq!(
        headers["x-modelgate-upstream-request-id"],
        "req_openai_side"
    );
}

#[tokio::test]
async fn headers_cross_the_proxy_by_allowlist_only() {
    let up = FakeUpstream::start(|_| Reply::Full {
        status: 200,
        headers: vec![
            ("content-type", "application/json".into()),
            ("set-cookie", "session=upstream-secret".into()),
            ("openai-organization", "org-internal".into()),
            ("openai-project", "proj_internal".into()),
            ("x-ratelimit-remaining-requests", "4999".into()),
            ("anthropic-ratelimit-tokens-remaining", "100".into()),
            ("request-id", "req_upstream_1".into()),
            ("x-internal-host", "10.0.0.7".into()),
        ],
        body: Bytes::from(
            json!({"id": "m1", "type": "message", "role": "assistant", "model": "claude",
                "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1}})
            .to_string(),
        ),
    })
    .await;
    let gw = hostile(&up).await;
    let resp = client()
        .post(gw.base("/v1/messages"))
        .bearer_auth(KEY)
        .header("openai-organization", "org-someone-else")
        .header("openai-project", "proj_someone_else")
        .header("cookie", "a=b")
        .header("x-tenant", "t1")
        .header("x-other", "nope")
        .header("anthropic-beta", "tools-2024-04-04")
        .header("idempotency-key", "idem-1")
        .json(&messages_body("claude"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    for name in [
        "set-cookie",
        "openai-organization",
        "openai-project",
        "x-ratelimit-remaining-requests",
        "anthropic-ratelimit-tokens-remaining",
        "x-internal-host",
    ] {
        assert!(
            resp.headers().get(name).is_none(),
            "{name} reached the client"
        );
    }
    assert_eq!(resp.headers()["request-id"], "req_upstream_1");
    let seen = up.last();
    for name in [
        "openai-organization",
        "openai-project",
        "cookie",
        "x-other",
        "authorization",
    ] {
        assert!(
            seen.headers.get(name).is_none(),
            "{name} reached the upstream"
        );
    }
    assert_eq!(
        seen.headers["x-api-key"], "up-secret",
        "the gateway's credential"
    );
    assert_eq!(
        seen.headers["x-tenant"], "t1",
        "the upstream's forward_headers"
    );
    assert_eq!(seen.headers["anthropic-beta"], "tools-2024-04-04");
    assert_eq!(seen.headers["idempotency-key"], "idem-1");
}

#[tokio::test]
async fn an_upstream_401_about_the_gateways_credential_is_a_502_that_quotes_nothing() {
    for status in [401u16, 403] {
        let up = FakeUpstream::start(move |_| {
            Reply::json(
                status,
                json!({"error": {"message": "Incorrect API key provided: up-secret", "type": "invalid_request_error"}}),
            )
        })
        .await;
        let gw = hostile(&up).await;
        let resp = client()
            .post(gw.base("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 502);
        let text = resp.text().await.unwrap();
        assert!(
            !text.contains("up-secret"),
            "the upstream's credential leaked: {text}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], "upstream_auth_failed", "{v}");
        // Anthropic's shape on /v1/messages.
        let (code, _, v) = post_json(&gw.base("/v1/messages"), messages_body("m")).await;
        assert_eq!(code, 502);
        assert_eq!(v["error"]["type"], "api_error", "{v}");
        assert!(!v.to_string().contains("up-secret"));
    }
}

#[tokio::test]
async fn a_redirect_is_a_502_and_its_location_never_reaches_the_client() {
    let up = FakeUpstream::start(|_| Reply::Full {
        status: 302,
        headers: vec![("location", "http://10.0.0.7:8443/internal/admin".into())],
        body: Bytes::new(),
    })
    .await;
    let gw = hostile(&up).await;
    let (status, headers, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 502, "{v}");
    assert!(headers.get("location").is_none());
    assert!(!v.to_string().contains("10.0.0.7"), "{v}");
}

#[tokio::test]
async fn a_stream_request_answered_with_html_is_a_502() {
    let up = FakeUpstream::start(|_| Reply::Full {
        status: 200,
        headers: vec![("content-type", "text/html".into())],
        body: Bytes::from_static(b"<html>captive portal</html>"),
    })
    .await;
    let gw = hostile(&up).await;
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), body).await;
    assert_eq!(status, 502, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("text/html"),
        "{v}"
    );
}

#[tokio::test]
async fn an_http_1_0_upstream_does_not_downgrade_the_clients_response_or_name_its_status() {
    // A raw upstream that answers in HTTP/1.0 and closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                let body =
                    json!({"id": "c", "object": "chat.completion", "choices": []}).to_string();
                let answer = format!(
                    "HTTP/1.0 200 Fine By Upstream\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    let gw = TestGateway::start(&hostile_config(&format!("http://{addr}"))).await;
    let mut s = TcpStream::connect(gw.running.addr(Address::Base).unwrap())
        .await
        .unwrap();
    let body = serde_json::to_string(&chat_body("m")).unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // The status line is the gateway's own: its version and the canonical reason phrase.
    let mut head = [0u8; 17];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 OK\r\n");
}

#[tokio::test]
async fn an_upstream_error_body_that_quotes_the_credential_is_redacted() {
    let up = FakeUpstream::start(|_| {
        Reply::json(
            400,
            json!({"error": {"message": "key up-secret-long-1234 cannot use this model", "type": "invalid_request_error"}}),
        )
    })
    .await;
    let gw = TestGateway::start_with_env(
        &hostile_config(&up.url()),
        &[("UPSTREAM_KEY", "up-secret-long-1234")],
    )
    .await;
    // Passthrough: the body is the upstream's, minus the credential.
    let (status, _, v) = post_json(&gw.base("/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 400);
    assert_eq!(
        v["error"]["message"], "key [redacted] cannot use this model",
        "{v}"
    );
    // Translated: the same through Anthropic's shape.
    let (status, _, v) = post_json(&gw.base("/v1/messages"), messages_body("m")).await;
    assert_eq!(status, 400);
    assert!(!v.to_string().contains("up-secret-long-1234"), "{v}");
    assert!(v.to_string().contains("[redacted]"), "{v}");
}
