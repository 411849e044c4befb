//! Several targets, retries, fallback and passive health (gateway.md §10) against fault-injecting loopback upstreams.
//!
//! Most tests run on tokio's paused clock (`start_paused = true`): the gateway, the fake
//! upstreams and the client all live on the test's one-thread runtime, so the clock only jumps
//! ahead when every task is idle. Backoffs, `retry-after` waits, first-byte timeouts and ejection
//! windows then cost no wall time, and loopback IO is never idle-in-flight (a write on loopback
//! is readable at the peer before the writer returns), so the jumps cannot fire a timeout early.
//! A probe before these tests were written confirmed it: 300 loopback round trips took 0 virtual
//! ms, and a silent upstream hit the 2 s first-byte timeout at exactly 2 virtual seconds.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use http::HeaderMap;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// Setup helpers
// ---------------------------------------------------------------------------------------------

/// A gateway config: one base listener, the test key, `upstreams` as (name, kind, url), and
/// `models` verbatim. The idle timeout is long so a stream a test holds open stays open. The
/// gateway serves on the test's runtime (`workers = 0`), whose clock the tests pause.
fn gateway_config(upstreams: &[(&str, &str, &str)], models: &str) -> String {
    let mut ups = String::new();
    for (name, kind, url) in upstreams {
        ups.push_str(&format!(
            "[[upstreams]]\nname = \"{name}\"\nkind = \"{kind}\"\nbase_url = \"{url}/v1\"\napi_key_env = \"UPSTREAM_KEY\"\n\n"
        ));
    }
    format!(
        r#"
[listen]
base = "127.0.0.1:0"

[server]
workers = 0

[limits]
max_request_bytes = 65536
connect_timeout_ms = 1000
first_byte_timeout_ms = 2000
idle_timeout_ms = 60000

[[keys]]
name = "test"
key = "{KEY}"

{ups}
{models}
"#
    )
}

/// A loopback URL with nothing listening, and the socket that keeps its port: bound but never
/// listening, so connections are refused and no other test's listener can be given that port
/// while the guard lives (a port merely freed was taken by a parallel test's gateway once).
fn dead_url() -> (String, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let url = format!("http://{}", socket.local_addr().unwrap());
    (url, socket)
}

/// A handler that is told which call (0, 1, …) it is answering.
fn counted(
    f: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    let n = AtomicUsize::new(0);
    move |seen| f(n.fetch_add(1, Ordering::SeqCst), seen)
}

/// A handler that reports each call on `tx` as it arrives (the test awaits that, never a sleep).
fn notifying(
    tx: mpsc::UnboundedSender<()>,
    f: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    move |seen| {
        let _ = tx.send(());
        f(seen)
    }
}

/// A JSON reply with an optional `retry-after`.
fn reply(status: u16, body: &Value, retry_after: Option<&str>) -> Reply {
    let mut headers = vec![("content-type", "application/json".to_owned())];
    if let Some(ra) = retry_after {
        headers.push(("retry-after", ra.to_owned()));
    }
    Reply::Full {
        status,
        headers,
        body: body.to_string().into(),
    }
}

fn openai_error(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}})
}

fn anthropic_error(message: &str) -> Value {
    json!({"type": "error", "error": {"type": "overloaded_error", "message": message}})
}

fn chat_ok(text: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "real",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
}

fn ok(text: &'static str) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    move |_| Reply::json(200, chat_ok(text))
}

fn messages_body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
}

fn stream_body(model: &str) -> Value {
    let mut b = chat_body(model);
    b["stream"] = json!(true);
    b
}

/// `x-modelgate-attempts` as a number; a response without it fails the test.
fn attempts(h: &HeaderMap) -> u32 {
    h.get("x-modelgate-attempts")
        .unwrap_or_else(|| panic!("no x-modelgate-attempts header in {h:?}"))
        .to_str()
        .unwrap()
        .parse()
        .expect("x-modelgate-attempts is a number")
}

/// `x-modelgate-upstream`; a response without it fails the test.
fn upstream_of(h: &HeaderMap) -> String {
    h.get("x-modelgate-upstream")
        .unwrap_or_else(|| panic!("no x-modelgate-upstream header in {h:?}"))
        .to_str()
        .unwrap()
        .to_owned()
}

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

const FIRST: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n";
const LAST: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

/// Sends a streamed chat request; returns the response (head read, body not yet).
async fn start_stream(url: &str, model: &str) -> reqwest::Response {
    client()
        .post(url)
        .bearer_auth(KEY)
        .json(&stream_body(model))
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
            Err(e) => panic!("transport error instead of an in-stream error: {e}; so far: {out}"),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Which failures are retried
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn rate_limited_then_ok_is_retried_with_the_same_bytes() {
    let up = FakeUpstream::start(counted(|n, _| match n {
        0 => reply(429, &openai_error("slow down"), None),
        _ => Reply::json(200, chat_ok("hello")),
    }))
    .await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &up.url())],
        "[[models]]\nname = \"m\"\nupstream = \"a\"\nupstream_model = \"real-m\"\n",
    ))
    .await;
    let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "hello");
    assert_eq!(attempts(&headers), 2);
    assert_eq!(upstream_of(&headers), "a");
    let seen = up.seen();
    assert_eq!(seen.len(), 2, "one 429, then the retry");
    assert_eq!(
        seen[0].body, seen[1].body,
        "the retry replays the same bytes"
    );
    assert_eq!(seen[1].json()["model"], "real-m");
}

#[tokio::test(start_paused = true)]
async fn every_retryable_status_is_retried() {
    for status in [500, 502, 503, 504, 529] {
        let up = FakeUpstream::start(counted(move |n, _| match n {
            0 => reply(status, &openai_error("hiccup"), None),
            _ => Reply::json(200, chat_ok("fine")),
        }))
        .await;
        let gw = TestGateway::start(&gateway_config(
            &[("a", "chat", &up.url())],
            "[[models]]\nname = \"m\"\nupstream = \"a\"\n",
        ))
        .await;
        let (got, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(got, 200, "after a {status}: {body}");
        assert_eq!(attempts(&headers), 2, "after a {status}");
        assert_eq!(up.seen().len(), 2, "after a {status}");
    }
}

#[tokio::test(start_paused = true)]
async fn other_client_errors_are_answered_at_once() {
    // 401 and 403 are about the gateway's own credential: tests/hardening.rs covers them.
    for status in [400, 404, 422] {
        let a =
            FakeUpstream::start(move |_| reply(status, &openai_error("your fault"), None)).await;
        let b = FakeUpstream::start(ok("fallback")).await;
        // A fallback that would succeed: a retry would be visible as a 200 from "b".
        let gw = TestGateway::start(&gateway_config(
            &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
            r#"
[[models]]
name = "m"
upstream = "a"
fallbacks = ["n"]

[[models]]
name = "n"
upstream = "b"
"#,
        ))
        .await;
        let (got, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(got, status, "{body}");
        assert_eq!(body["error"]["message"], "your fault");
        assert_eq!(attempts(&headers), 1, "a {status} is never retried");
        assert_eq!(upstream_of(&headers), "a");
        assert_eq!(a.seen().len(), 1);
        assert!(b.seen().is_empty(), "a {status} never goes to a fallback");
    }
}

#[tokio::test(start_paused = true)]
async fn retry_on_and_attempts_limit_what_is_retried() {
    let up = FakeUpstream::start(|s: &Seen| match s.json()["model"].as_str() {
        Some("rl") => reply(429, &openai_error("slow down"), None),
        _ => reply(503, &openai_error("down"), None),
    })
    .await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &up.url())],
        r#"
[[models]]
name = "only-429"
upstream = "a"
upstream_model = "srv"
retry = { on = ["429"] }

[[models]]
name = "rate-limited"
upstream = "a"
upstream_model = "rl"
retry = { on = ["429"], attempts = 3 }

[[models]]
name = "one-try"
upstream = "a"
upstream_model = "srv"
retry = { attempts = 1 }
"#,
    ))
    .await;
    // 5xx is not in `on`: answered after one try.
    let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("only-429")).await;
    assert_eq!(status, 503);
    assert_eq!(attempts(&headers), 1);
    assert_eq!(up.seen().len(), 1);
    // 429 is: all three attempts are used.
    let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("rate-limited")).await;
    assert_eq!(status, 429);
    assert_eq!(attempts(&headers), 3);
    assert_eq!(up.seen().len(), 4);
    // attempts = 1: no retry at all.
    let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("one-try")).await;
    assert_eq!(status, 503);
    assert_eq!(attempts(&headers), 1);
    assert_eq!(up.seen().len(), 5);
}

/// Two targets, the failing one weighted 99:1 so nearly every request tries it first; health
/// off so it stays in the rotation. Returns the gateway config.
fn failing_first_config(failing_url: &str, live_url: &str) -> String {
    gateway_config(
        &[("bad", "chat", failing_url), ("live", "chat", live_url)],
        r#"
[[models]]
name = "m"
targets = [{ upstream = "bad", weight = 99 }, { upstream = "live", weight = 1 }]
health = { eject_after = 0 }
"#,
    )
}

#[tokio::test(start_paused = true)]
async fn refused_connection_moves_to_the_next_target() {
    let live = FakeUpstream::start(ok("alive")).await;
    let (dead, _reserved) = dead_url();
    let gw = TestGateway::start(&failing_first_config(&dead, &live.url())).await;
    let mut retried = 0;
    for _ in 0..5 {
        let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(upstream_of(&headers), "live");
        match attempts(&headers) {
            1 => {}
            2 => retried += 1,
            n => panic!("{n} attempts for two targets"),
        }
    }
    // Each request picks the dead target first with p = 0.99: none of five doing so is 1e-10.
    assert!(retried >= 1, "no request ever tried the dead target first");
    assert_eq!(live.seen().len(), 5);
}

/// A loopback server that takes each connection, reads a little and closes it without a word;
/// returns its URL and the number of connections it took.
async fn closing_server() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
            // Dropped here: the request got in, no head ever comes out.
        }
    });
    (url, accepted)
}

#[tokio::test(start_paused = true)]
async fn connection_closed_before_a_head_moves_to_the_next_target() {
    let (closing_url, accepted) = closing_server().await;
    let live = FakeUpstream::start(ok("alive")).await;
    let gw = TestGateway::start(&failing_first_config(&closing_url, &live.url())).await;
    let mut retried = 0;
    for _ in 0..5 {
        let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(upstream_of(&headers), "live");
        if attempts(&headers) == 2 {
            retried += 1;
        }
    }
    assert!(
        retried >= 1,
        "no request ever tried the closing target first"
    );
    assert!(accepted.load(Ordering::SeqCst) >= retried);
}

#[tokio::test(start_paused = true)]
async fn head_that_never_comes_moves_to_the_next_target() {
    let silent = FakeUpstream::start(|_| Reply::Hang).await;
    let live = FakeUpstream::start(ok("alive")).await;
    let gw = TestGateway::start(&failing_first_config(&silent.url(), &live.url())).await;
    let started = Instant::now();
    let mut retried = 0;
    for _ in 0..5 {
        let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(upstream_of(&headers), "live");
        if attempts(&headers) == 2 {
            retried += 1;
        }
    }
    assert!(
        retried >= 1,
        "no request ever tried the silent target first"
    );
    assert_eq!(
        silent.seen().len(),
        retried,
        "every second attempt follows a call to the silent target"
    );
    // Each of those waited out first_byte_timeout_ms (2 s) before moving on.
    assert!(started.elapsed() >= Duration::from_secs(2) * retried as u32);
    assert!(
        silent.wait_cancelled(Duration::from_secs(1)).await,
        "the abandoned attempt's upstream request is closed"
    );
}

// ---------------------------------------------------------------------------------------------
// retry-after
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn retry_after_within_the_limit_is_waited_for() {
    let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let t = times.clone();
    let up = FakeUpstream::start(counted(move |n, _| {
        t.lock().unwrap().push(Instant::now());
        match n {
            0 => reply(503, &openai_error("busy"), Some("1")),
            _ => Reply::json(200, chat_ok("after the wait")),
        }
    }))
    .await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &up.url())],
        "[[models]]\nname = \"m\"\nupstream = \"a\"\n",
    ))
    .await;
    let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(attempts(&headers), 2);
    let times = times.lock().unwrap().clone();
    assert_eq!(times.len(), 2);
    let gap = times[1] - times[0];
    assert!(
        gap >= Duration::from_secs(1),
        "retry-after: 1 honoured; waited {gap:?}"
    );
    // Not much more: at most one backoff (100 ms) on top, never retry_after_max_ms (10 s).
    assert!(gap < Duration::from_secs(2), "waited {gap:?}");
}

#[tokio::test(start_paused = true)]
async fn retry_after_beyond_the_limit_moves_on_at_once() {
    let a =
        FakeUpstream::start(|_| reply(503, &openai_error("gone for an hour"), Some("3600"))).await;
    let b = FakeUpstream::start(ok("fallback")).await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
upstream = "a"
fallbacks = ["n"]

[[models]]
name = "n"
upstream = "b"

[[models]]
name = "solo"
upstream = "a"
"#,
    ))
    .await;
    let started = Instant::now();
    let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(upstream_of(&headers), "b");
    assert_eq!(attempts(&headers), 2);
    assert_eq!(a.seen().len(), 1);
    assert_eq!(
        b.last().json()["model"],
        "n",
        "a fallback is asked for by its own name"
    );
    // At most a backoff (100 ms), not the hour and not retry_after_max_ms.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // The only target is excluded for the rest of the request: nothing is left to try, so the
    // 503 is answered at once though attempts (3) remain.
    let started = Instant::now();
    let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("solo")).await;
    assert_eq!(status, 503);
    assert_eq!(attempts(&headers), 1);
    assert_eq!(a.seen().len(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limited_everywhere_keeps_the_smallest_retry_after() {
    // Seen in order: 7 (a), 2 (b), 9 (b again): the smallest is neither the first nor the last.
    let a = FakeUpstream::start(|_| reply(429, &openai_error("a: slow down"), Some("7"))).await;
    let b = FakeUpstream::start(counted(|n, _| {
        let ra = if n == 0 { "2" } else { "9" };
        reply(429, &openai_error("b: slow down"), Some(ra))
    }))
    .await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
upstream = "a"
fallbacks = ["n"]

[[models]]
name = "n"
upstream = "b"
"#,
    ))
    .await;
    let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(headers["retry-after"], "2");
    assert_eq!(attempts(&headers), 3);
    assert_eq!(upstream_of(&headers), "b");
    assert_eq!(
        body["error"]["message"], "b: slow down",
        "the last failure's body"
    );
    assert_eq!((a.seen().len(), b.seen().len()), (1, 2));
}

// ---------------------------------------------------------------------------------------------
// When everything fails
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn all_attempts_failing_answer_the_last_failure_in_the_clients_shape() {
    // Two chains, each crossing protocols: m1 (chat) → m2 (messages), n1 (messages) → n2 (chat).
    // With attempts = 3 the last model of a chain is tried twice, so it answers last.
    let a = FakeUpstream::start(|_| reply(500, &openai_error("a is down"), None)).await;
    let b = FakeUpstream::start(|_| reply(503, &anthropic_error("b is overloaded"), None)).await;
    let c = FakeUpstream::start(|_| reply(500, &anthropic_error("c is down"), None)).await;
    let d = FakeUpstream::start(|_| reply(503, &openai_error("d is overloaded"), None)).await;
    let gw = TestGateway::start(&gateway_config(
        &[
            ("a", "chat", &a.url()),
            ("b", "messages", &b.url()),
            ("c", "messages", &c.url()),
            ("d", "chat", &d.url()),
        ],
        r#"
[[models]]
name = "m1"
upstream = "a"
fallbacks = ["m2"]
health = { eject_after = 0 }

[[models]]
name = "m2"
upstream = "b"
default_max_tokens = 256
health = { eject_after = 0 }

[[models]]
name = "n1"
upstream = "c"
default_max_tokens = 256
fallbacks = ["n2"]
health = { eject_after = 0 }

[[models]]
name = "n2"
upstream = "d"
health = { eject_after = 0 }
"#,
    ))
    .await;
    for (path, model, last, message) in [
        (CHAT, "m1", "b", "b is overloaded"),
        (CHAT, "n1", "d", "d is overloaded"),
        (MESSAGES, "m1", "b", "b is overloaded"),
        (MESSAGES, "n1", "d", "d is overloaded"),
    ] {
        let body = if path == CHAT {
            chat_body(model)
        } else {
            messages_body(model)
        };
        let (status, headers, body) = post_json(&gw.base(path), body).await;
        let what = format!("{path} {model}");
        assert_eq!(status, 503, "{what}: {body}");
        assert_eq!(
            upstream_of(&headers),
            last,
            "{what}: the upstream tried last"
        );
        assert_eq!(attempts(&headers), 3, "{what}");
        let err = &body["error"];
        assert!(
            err["message"].as_str().is_some_and(|m| m.contains(message)),
            "{what}: the last failure's message: {body}"
        );
        assert!(err["type"].is_string(), "{what}: {body}");
        if path == CHAT {
            assert!(body.get("type").is_none(), "{what}: OpenAI shape: {body}");
        } else {
            assert_eq!(body["type"], "error", "{what}: Anthropic shape: {body}");
        }
    }
    // Each request: the first model once, the last twice.
    assert_eq!((a.seen().len(), b.seen().len()), (2, 4));
    assert_eq!((c.seen().len(), d.seen().len()), (2, 4));
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn stream_failing_before_its_first_byte_is_retried() {
    let up = FakeUpstream::start(counted(|n, _| match n {
        0 => reply(503, &openai_error("busy"), None),
        _ => Reply::sse(vec![
            (Duration::ZERO, FIRST),
            (Duration::ZERO, LAST),
            (Duration::ZERO, DONE),
        ]),
    }))
    .await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &up.url())],
        "[[models]]\nname = \"m\"\nupstream = \"a\"\n",
    ))
    .await;
    let resp = start_stream(&gw.base(CHAT), "m").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(resp.headers()), 2);
    assert_eq!(read_all(resp).await, format!("{FIRST}{LAST}{DONE}"));
    assert_eq!(up.seen().len(), 2);
}

#[tokio::test]
async fn stream_breaking_after_its_first_byte_is_not_retried() {
    let a = FakeUpstream::start(|_| Reply::Stream {
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
    let b =
        FakeUpstream::start(|_| Reply::sse(vec![(Duration::ZERO, FIRST), (Duration::ZERO, DONE)]))
            .await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
upstream = "a"
fallbacks = ["n"]

[[models]]
name = "n"
upstream = "b"
"#,
    ))
    .await;
    let resp = start_stream(&gw.base(CHAT), "m").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(resp.headers()), 1);
    assert_eq!(upstream_of(resp.headers()), "a");
    let text = read_all(resp).await;
    assert!(text.starts_with(FIRST), "{text}");
    // §5: the break becomes a final chunk with an `error` object, then [DONE].
    let events: Vec<&str> = text
        .split("\n\n")
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    let err: Value = serde_json::from_str(
        events[events.len() - 2]
            .strip_prefix("data: ")
            .expect("a data event"),
    )
    .expect("JSON");
    assert!(err["error"]["message"].is_string(), "{text}");
    assert_eq!(a.seen().len(), 1, "nothing is retried after the first byte");
    assert!(b.seen().is_empty(), "nor sent to a fallback");
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn weighted_strategy_follows_the_weights() {
    let a = FakeUpstream::start(ok("a")).await;
    let b = FakeUpstream::start(ok("b")).await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
strategy = "weighted"
targets = [{ upstream = "a", weight = 3 }, { upstream = "b", weight = 1 }]
"#,
    ))
    .await;
    let mut to_a = 0;
    for _ in 0..400 {
        let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(attempts(&headers), 1);
        if upstream_of(&headers) == "a" {
            to_a += 1;
        }
    }
    assert_eq!(
        a.seen().len(),
        to_a,
        "the header names the upstream that answered"
    );
    assert_eq!(b.seen().len(), 400 - to_a);
    // Binomial(400, 3/4): mean 300, sd √75 ≈ 8.7. ±45 is 5.2 sd: a correct gateway fails this
    // with p ≈ 2e-7; an unweighted pick (mean 200) or a fixed one (400 or 0) never passes.
    assert!(
        (255..=345).contains(&to_a),
        "{to_a} of 400 went to the weight-3 target; expected 300 ± 45"
    );
}

#[tokio::test]
async fn least_inflight_prefers_the_idle_target() {
    // Streamed requests get a first chunk and then an open body (60 s, shorter than the
    // gateway's idle timeout); other requests a JSON reply at once. On the real clock: on a
    // paused one the held stream's pause would run out the moment every task idled.
    let handler = |name: &'static str| {
        move |s: &Seen| {
            if s.json()["stream"] == true {
                Reply::sse(vec![
                    (Duration::ZERO, FIRST),
                    (Duration::from_secs(60), DONE),
                ])
            } else {
                Reply::json(200, chat_ok(name))
            }
        }
    };
    let a = FakeUpstream::start(handler("a")).await;
    let b = FakeUpstream::start(handler("b")).await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
strategy = "least_inflight"
targets = [{ upstream = "a" }, { upstream = "b" }]
"#,
    ))
    .await;
    let held = start_stream(&gw.base(CHAT), "m").await;
    assert_eq!(held.status(), 200);
    let busy = upstream_of(held.headers());
    let mut body = held.bytes_stream();
    // The first chunk has reached us: the stream is open and in flight at the gateway.
    assert!(!body.next().await.unwrap().unwrap().is_empty());
    let idle = if busy == "a" { "b" } else { "a" };
    for i in 0..10 {
        let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 200);
        assert_eq!(
            upstream_of(&headers),
            idle,
            "request {i} went to the target holding an open stream"
        );
    }
    let (busy_up, idle_up) = if busy == "a" { (&a, &b) } else { (&b, &a) };
    assert_eq!(busy_up.seen().len(), 1);
    assert_eq!(idle_up.seen().len(), 10);
    drop(body);
}

#[tokio::test(start_paused = true)]
async fn latency_strategy_prefers_the_faster_target() {
    // The slow target's head comes 300 ms late (virtual time: the clock only jumps).
    let slow = FakeUpstream::start(|_| {
        Reply::After(
            Duration::from_millis(300),
            Box::new(Reply::json(200, chat_ok("slow"))),
        )
    })
    .await;
    let fast = FakeUpstream::start(ok("fast")).await;
    let gw = TestGateway::start(&gateway_config(
        &[("slow", "chat", &slow.url()), ("fast", "chat", &fast.url())],
        r#"
[[models]]
name = "m"
strategy = "latency"
targets = [{ upstream = "slow" }, { upstream = "fast" }]
"#,
    ))
    .await;
    let mut order = Vec::new();
    for _ in 0..20 {
        let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 200);
        order.push(upstream_of(&headers));
    }
    // With two targets both choices are always compared: once each has a time to first byte,
    // every pick is the faster one. A couple of early picks may go to measure the slow one.
    assert!(
        order[10..].iter().all(|u| u == "fast"),
        "picks after warm-up: {order:?}"
    );
    assert!(slow.seen().len() <= 2, "picks: {order:?}");
}

// ---------------------------------------------------------------------------------------------
// Passive health
// ---------------------------------------------------------------------------------------------

const FAIL: u8 = 0;
const HANG: u8 = 1;
const OK: u8 = 2;

/// Sends requests until one reaches the target that reports on `calls`; each request that is
/// answered elsewhere must be a 200 from `other`. Returns the request that reached it, still
/// running, or panics after `tries`.
async fn until_it_reaches(
    url: &str,
    calls: &mut mpsc::UnboundedReceiver<()>,
    other: &str,
    tries: usize,
) -> tokio::task::JoinHandle<(u16, HeaderMap, Value)> {
    for _ in 0..tries {
        let mut call = tokio::spawn(post_json_owned(url.to_owned()));
        tokio::select! {
            // Biased: the upstream reports a call before it answers, so when both are ready
            // the request did reach it.
            biased;
            _ = calls.recv() => return call,
            r = &mut call => {
                let (status, headers, body) = r.unwrap();
                assert_eq!(status, 200, "{body}");
                assert_eq!(upstream_of(&headers), other);
            }
        }
    }
    panic!("no request reached the target in {tries} tries");
}

async fn post_json_owned(url: String) -> (u16, HeaderMap, Value) {
    post_json(&url, chat_body("m")).await
}

#[tokio::test(start_paused = true)]
async fn failing_target_is_ejected_probed_once_and_returns() {
    let mode = Arc::new(AtomicU8::new(FAIL));
    let (tx, mut calls) = mpsc::unbounded_channel();
    let m = mode.clone();
    let a = FakeUpstream::start(notifying(tx, move |_| match m.load(Ordering::SeqCst) {
        FAIL => reply(503, &openai_error("a is down"), None),
        HANG => Reply::Hang,
        _ => Reply::json(200, chat_ok("a")),
    }))
    .await;
    let b = FakeUpstream::start(ok("b")).await;
    // "a" is picked first 99 times in 100 whenever it is in the rotation.
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a", weight = 99 }, { upstream = "b", weight = 1 }]
retry = { attempts = 2 }
health = { eject_after = 2, eject_ms = 60000 }
"#,
    ))
    .await;
    let url = gw.base(CHAT);
    let send = || post_json(&url, chat_body("m"));

    // Two failures in a row eject "a"; each of those requests is rescued by "b".
    for _ in 0..40 {
        if a.seen().len() == 2 {
            break;
        }
        let (status, headers, _) = send().await;
        assert_eq!((status, upstream_of(&headers)), (200, "b".to_owned()));
    }
    assert_eq!(a.seen().len(), 2);
    while calls.try_recv().is_ok() {}

    // Ejected: nothing reaches "a" (the clock has not moved: no request needed to wait).
    for _ in 0..20 {
        let (status, headers, _) = send().await;
        assert_eq!(status, 200);
        assert_eq!(upstream_of(&headers), "b");
        assert_eq!(
            attempts(&headers),
            1,
            "an ejected target is not tried first"
        );
    }
    assert_eq!(a.seen().len(), 2, "an ejected target gets no requests");

    // After eject_ms, "a" gets one probe. It hangs: while it is out, nobody else is sent there.
    tokio::time::advance(Duration::from_secs(61)).await;
    mode.store(HANG, Ordering::SeqCst);
    let probe = until_it_reaches(&url, &mut calls, "b", 50).await;
    for _ in 0..10 {
        let (status, headers, _) = send().await;
        assert_eq!((status, upstream_of(&headers)), (200, "b".to_owned()));
    }
    assert_eq!(a.seen().len(), 3, "one probe only while it is under way");
    // The probe times out (first_byte_timeout_ms) and its request is rescued by "b".
    let (status, headers, _) = probe.await.unwrap();
    assert_eq!((status, upstream_of(&headers)), (200, "b".to_owned()));
    assert_eq!(attempts(&headers), 2);

    // A failed probe ejects again, for twice as long (120 s): at 61 s "a" is still out.
    mode.store(OK, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(61)).await;
    for _ in 0..20 {
        let (_, headers, _) = send().await;
        assert_eq!(
            upstream_of(&headers),
            "b",
            "the second ejection lasts 2 × eject_ms"
        );
    }
    assert_eq!(a.seen().len(), 3);

    // Past 120 s: the next probe succeeds and "a" is back in the rotation.
    tokio::time::advance(Duration::from_secs(60)).await;
    while calls.try_recv().is_ok() {}
    let probe = until_it_reaches(&url, &mut calls, "b", 50).await;
    let (status, headers, _) = probe.await.unwrap();
    assert_eq!((status, upstream_of(&headers)), (200, "a".to_owned()));
    let mut to_a = 0;
    for _ in 0..20 {
        let (_, headers, _) = send().await;
        if upstream_of(&headers) == "a" {
            to_a += 1;
        }
    }
    // Expected 19.8 of 20 at 99:1; fewer than 15 has p < 1e-20.
    assert!(to_a >= 15, "only {to_a} of 20 went to the recovered target");
}

/// A minimal Responses API reply with one text output.
fn responses_ok(text: &str) -> Value {
    json!({"id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
        "model": "real", "output": [{"type": "message", "id": "msg_1", "status": "completed",
        "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}})
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_is_never_sent_does_not_keep_the_target_out() {
    // "a" speaks Responses, which has no stop sequences: a chat request with `stop` can only be
    // served by "b". Such a request may pick "a" for its probe and then skip it unsent; "a"
    // must still get its probe from a later request.
    let mode = Arc::new(AtomicU8::new(FAIL));
    let m = mode.clone();
    let a = FakeUpstream::start(move |_| match m.load(Ordering::SeqCst) {
        FAIL => reply(503, &openai_error("a is down"), None),
        _ => Reply::json(200, responses_ok("a")),
    })
    .await;
    let b = FakeUpstream::start(ok("b")).await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "responses", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a", weight = 99 }, { upstream = "b", weight = 1 }]
retry = { attempts = 2 }
health = { eject_after = 1, eject_ms = 10000 }
"#,
    ))
    .await;
    // One failure ejects "a".
    for _ in 0..40 {
        if !a.seen().is_empty() {
            break;
        }
        let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!((status, upstream_of(&headers)), (200, "b".to_owned()));
    }
    assert_eq!(a.seen().len(), 1);
    // The ejection runs out; "a" is fine again.
    tokio::time::advance(Duration::from_secs(11)).await;
    mode.store(OK, Ordering::SeqCst);
    let mut with_stop = chat_body("m");
    with_stop["stop"] = json!(["END"]);
    let (status, headers, body) = post_json(&gw.base(CHAT), with_stop).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(upstream_of(&headers), "b");
    assert_eq!(
        a.seen().len(),
        1,
        "nothing was sent to a target that cannot take it"
    );
    // Weighted 99:1 and owed a probe: twenty requests that all miss "a" would be a stuck target.
    for _ in 0..20 {
        if a.seen().len() > 1 {
            break;
        }
        post_json(&gw.base(CHAT), chat_body("m")).await;
    }
    assert_eq!(
        a.seen().len(),
        2,
        "the target whose ejection ran out never got its probe"
    );
    assert_eq!(a.last().uri, "/v1/responses");
}

#[tokio::test(start_paused = true)]
async fn a_probe_whose_client_leaves_during_the_backoff_does_not_keep_the_target_out() {
    let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let a_mode = Arc::new(AtomicU8::new(FAIL));
    let b_mode = Arc::new(AtomicU8::new(OK));
    let (b_tx, mut b_calls) = mpsc::unbounded_channel();
    let (t, m) = (times.clone(), a_mode.clone());
    let a = FakeUpstream::start(move |_| {
        t.lock().unwrap().push(Instant::now());
        match m.load(Ordering::SeqCst) {
            FAIL => reply(503, &openai_error("a is down"), None),
            _ => Reply::json(200, chat_ok("a")),
        }
    })
    .await;
    let m = b_mode.clone();
    let b = FakeUpstream::start(notifying(b_tx, move |_| match m.load(Ordering::SeqCst) {
        HANG => Reply::Hang,
        _ => Reply::json(200, chat_ok("b")),
    }))
    .await;
    // Backoffs up to 60 s (full jitter), ejections of 100 s: longer than any backoff.
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a", weight = 99 }, { upstream = "b", weight = 1 }]
retry = { attempts = 2, backoff_ms = 60000, max_backoff_ms = 60000 }
health = { eject_after = 1, eject_ms = 100000 }
"#,
    ))
    .await;
    let url = gw.base(CHAT);
    // One failure ejects "a" until 100 s after it.
    for _ in 0..40 {
        if !a.seen().is_empty() {
            break;
        }
        post_json(&url, chat_body("m")).await;
    }
    let failed_at = times.lock().unwrap()[0];
    a_mode.store(OK, Ordering::SeqCst);
    // 1 s before "a" may be probed, a request starts on "b", which stays silent; when its
    // first-byte timeout (2 s) ends, the retry's pick is the probe of "a", after a backoff.
    let one_second_before = failed_at + Duration::from_secs(99);
    tokio::time::advance(one_second_before.saturating_duration_since(Instant::now())).await;
    b_mode.store(HANG, Ordering::SeqCst);
    while b_calls.try_recv().is_ok() {}
    let call = tokio::spawn(post_json_owned(url.clone()));
    b_calls.recv().await.unwrap();
    // Ends once the timeout has fired and the gateway sits in its backoff (unless the jitter
    // drew under 1 ms, p ≈ 2e-5: then the probe is sent and the rest passes without testing).
    tokio::time::sleep(Duration::from_millis(2001)).await;
    call.abort();
    let _ = call.await;
    // Every ejection has run out; "b" is fine again. "a", owed its probe, must get it.
    tokio::time::sleep(Duration::from_secs(300)).await;
    b_mode.store(OK, Ordering::SeqCst);
    for _ in 0..20 {
        if a.seen().len() > 1 {
            break;
        }
        post_json(&url, chat_body("m")).await;
    }
    assert!(
        a.seen().len() > 1,
        "the target whose probe's client left is never tried again"
    );
}

#[tokio::test(start_paused = true)]
async fn with_every_target_ejected_the_least_recently_ejected_is_tried() {
    let a = FakeUpstream::start(|_| reply(503, &openai_error("a"), None)).await;
    let b = FakeUpstream::start(|_| reply(503, &openai_error("b"), None)).await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url()), ("b", "chat", &b.url())],
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a" }, { upstream = "b" }]
retry = { attempts = 1 }
health = { eject_after = 1, eject_ms = 60000 }
"#,
    ))
    .await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 503, "every target ejected is still tried: {body}");
        order.push(upstream_of(&headers));
        // Distinct ejection times; far inside every ejection window.
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_ne!(
        order[0], order[1],
        "the second request avoids the ejected target"
    );
    assert_eq!(
        order[2], order[0],
        "both ejected: the one ejected longest ago"
    );
    assert_eq!(
        order[3], order[1],
        "both ejected: the one ejected longest ago"
    );
    assert_eq!((a.seen().len(), b.seen().len()), (2, 2));
}

// ---------------------------------------------------------------------------------------------
// Retry budget
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn spent_retry_budget_answers_without_retrying() {
    let a = FakeUpstream::start(|_| reply(503, &openai_error("down"), None)).await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url())],
        r#"
[[models]]
name = "m"
upstream = "a"
retry = { attempts = 2, budget_percent = 0 }
health = { eject_after = 0 }
"#,
    ))
    .await;
    // budget_percent = 0 still allows the floor of 10 retries per 10 s. The backoffs add at
    // most 10 × 100 ms of clock, well inside the window.
    for i in 0..10 {
        let (status, headers, _) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 503);
        assert_eq!(attempts(&headers), 2, "request {i} is within the floor");
    }
    let (status, headers, body) = post_json(&gw.base(CHAT), chat_body("m")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["error"]["message"], "down",
        "the upstream's own failure"
    );
    assert_eq!(attempts(&headers), 1, "the 11th retry is over budget");
    assert_eq!(a.seen().len(), 21);
    // The window slides: 10 s later retries are allowed again.
    tokio::time::advance(Duration::from_secs(11)).await;
    let (_, headers, _) = post_json(&gw.base(CHAT), chat_body("m")).await;
    assert_eq!(
        attempts(&headers),
        2,
        "a retry again once the window moved on"
    );
    assert_eq!(a.seen().len(), 23);
}

#[tokio::test(start_paused = true)]
async fn retry_budget_follows_its_percentage_above_the_floor() {
    let a = FakeUpstream::start(|_| reply(503, &openai_error("down"), None)).await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url())],
        r#"
[[models]]
name = "m"
upstream = "a"
retry = { attempts = 2, budget_percent = 50 }
health = { eject_after = 0 }
"#,
    ))
    .await;
    // 40 failing requests, each wanting one retry; the backoffs add at most 2 s of clock, so all
    // fall in one window. Retries may reach 50 % of the 40 requests (the floor of 10 is lower):
    // the first 10 on the floor, then one every other request. One less is allowed for a
    // gateway that weighs a request's retry before counting the request itself.
    for _ in 0..40 {
        let (status, _, _) = post_json(&gw.base(CHAT), chat_body("m")).await;
        assert_eq!(status, 503);
    }
    let retries = a.seen().len() - 40;
    assert!(
        (19..=20).contains(&retries),
        "{retries} retries for 40 requests at budget_percent = 50"
    );
}

// ---------------------------------------------------------------------------------------------
// Fallback across protocols
// ---------------------------------------------------------------------------------------------

const CROSS_MODELS: &str = r#"
[[models]]
name = "claude"
upstream = "anth"
upstream_model = "claude-real"
fallbacks = ["gpt"]

[[models]]
name = "gpt"
upstream = "oai"
upstream_model = "gpt-real"
"#;

#[tokio::test(start_paused = true)]
async fn messages_client_falls_back_to_a_chat_upstream() {
    let anth = FakeUpstream::start(|_| reply(503, &anthropic_error("Overloaded"), None)).await;
    let oai = FakeUpstream::start(ok("from chat")).await;
    let gw = TestGateway::start(&gateway_config(
        &[
            ("anth", "messages", &anth.url()),
            ("oai", "chat", &oai.url()),
        ],
        CROSS_MODELS,
    ))
    .await;
    let (status, headers, body) = post_json(&gw.base(MESSAGES), messages_body("claude")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(upstream_of(&headers), "oai");
    assert_eq!(attempts(&headers), 2);
    // The chat reply, in Anthropic's shape.
    assert_eq!(body["type"], "message", "{body}");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["content"][0]["type"], "text");
    assert_eq!(body["content"][0]["text"], "from chat");
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(
        body["model"], "claude",
        "the reply names the model the client asked for"
    );
    // Each attempt was written for its own target.
    let first = anth.last();
    assert_eq!(first.uri, "/v1/messages");
    assert_eq!(first.json()["model"], "claude-real");
    assert_eq!(first.headers["x-api-key"], "up-secret");
    let second = oai.last();
    assert_eq!(second.uri, "/v1/chat/completions");
    let sent = second.json();
    assert_eq!(sent["model"], "gpt-real");
    assert_eq!(sent["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(second.headers["authorization"], "Bearer up-secret");
}

#[tokio::test(start_paused = true)]
async fn streamed_messages_client_falls_back_to_a_chat_upstream() {
    let anth = FakeUpstream::start(|_| reply(529, &anthropic_error("Overloaded"), None)).await;
    let oai = FakeUpstream::start(|_| {
        Reply::sse(vec![
            (Duration::ZERO, FIRST),
            (Duration::ZERO, LAST),
            (Duration::ZERO, DONE),
        ])
    })
    .await;
    let gw = TestGateway::start(&gateway_config(
        &[
            ("anth", "messages", &anth.url()),
            ("oai", "chat", &oai.url()),
        ],
        CROSS_MODELS,
    ))
    .await;
    let mut body = messages_body("claude");
    body["stream"] = json!(true);
    let resp = client()
        .post(gw.base(MESSAGES))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(upstream_of(resp.headers()), "oai");
    assert_eq!(attempts(resp.headers()), 2);
    let text = read_all(resp).await;
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(text.contains("\"text_delta\""), "{text}");
    assert!(text.contains("Hel"), "{text}");
    assert!(
        text.trim_end().ends_with("\"type\":\"message_stop\"}"),
        "{text}"
    );
    assert_eq!((anth.seen().len(), oai.seen().len()), (1, 1));
    assert_eq!(oai.last().json()["stream"], true);
}

#[tokio::test(start_paused = true)]
async fn the_built_in_mock_is_a_fallback_like_any_other() {
    // The primary refuses connections; the fallback is the in-process mock, spoken to in chat,
    // so a /v1/messages client is translated toward it and back.
    let (dead, _reserved) = dead_url();
    let gw = TestGateway::start(&gateway_config(
        &[("down", "chat", &dead)],
        r#"
[[upstreams]]
name = "mock"
kind = "mock"
protocol = "chat"

[[models]]
name = "m"
upstream = "down"
fallbacks = ["mock-echo"]

[[models]]
name = "mock-echo"
upstream = "mock"
"#,
    ))
    .await;
    for (path, body) in [(CHAT, chat_body("m")), (MESSAGES, messages_body("m"))] {
        let (status, headers, body) = post_json(&gw.base(path), body).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(upstream_of(&headers), "mock", "{path}");
        assert_eq!(attempts(&headers), 2, "{path}");
        if path == CHAT {
            assert_eq!(body["object"], "chat.completion", "{body}");
        } else {
            assert_eq!(body["type"], "message", "{body}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn client_leaving_during_a_backoff_cancels_the_retry() {
    let (tx, mut calls) = mpsc::unbounded_channel();
    // retry-after: 5 is honoured, so the gateway waits at least 5 s before the second call.
    let a = FakeUpstream::start(notifying(tx, |_| {
        reply(429, &openai_error("slow down"), Some("5"))
    }))
    .await;
    let gw = TestGateway::start(&gateway_config(
        &[("a", "chat", &a.url())],
        "[[models]]\nname = \"m\"\nupstream = \"a\"\n",
    ))
    .await;
    let call = tokio::spawn(post_json_owned(gw.base(CHAT)));
    calls.recv().await.unwrap();
    // On the paused clock this sleep ends only when every task is idle: the gateway has read
    // the 429 and sits in its 5 s wait.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!call.is_finished(), "the gateway is waiting to retry");
    call.abort();
    let _ = call.await;
    // Far past the retry-after: a gateway still waiting would have called again by now.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(a.seen().len(), 1, "no attempt after the client left");
    assert!(calls.try_recv().is_err());
}
