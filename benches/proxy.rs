//! End-to-end proxy overhead: the same request sent straight to an in-process fake upstream and
//! through the gateway, interleaved, non-streaming and streaming; reports the latency the gateway
//! adds (p50, p99), the time it adds to the first chunk, the CPU time the gateway spends per
//! request, and the process RSS.
//!
//! Four cases, each measured the same way (direct call to the fake endpoint the gateway uses,
//! paired with the call through the gateway):
//! - passthrough: a chat client → a chat upstream (`/v1/chat/completions`, 20 chunks + `[DONE]`);
//! - chat client → messages upstream: the fake answers `/v1/messages` in Anthropic's shape (a
//!   message, or an event stream of 23 events with 18 text deltas);
//! - messages client → chat upstream and responses client → chat upstream: the gateway translates
//!   to the chat fake and the reply (or stream) back.
//!
//! The translated cases' added latency is compared with the passthrough's, measured in the same
//! run (aim: a translated request adds at most twice the passthrough overhead). The cases take
//! turns in blocks of a few dozen pairs, so a change in the machine's load hits them all alike.
//! Every reply is checked after its timing is taken (status, shape, the full text, the stream's
//! terminal event), so a broken translation cannot produce a fast-looking figure.
//!
//! The fake upstream, the gateway and the client each get their own runtime and threads, as if
//! they were three processes; on a 2-core machine they still share the cores, so the figures
//! include some scheduling contention a remote client would not cause.
//!
//! `cargo bench --bench proxy` measures `BENCH_N` pairs per case and mode (default 5000) after
//! `BENCH_WARMUP` warm-up pairs (default 500). Without `--bench` in the arguments
//! (`cargo test --benches`) it runs a 20-pair smoke pass per case so CI stays fast.
//! `BENCH_THREADS` sets the gateway's event loops, `[server] workers` (default: the number of
//! cores, as `modelgate serve` does). No tracing subscriber is installed, so logging costs nothing.

// A benchmark is not a request path: a failed setup step should stop it loudly, like a test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The fake upstream's accept loop and connections are plain tasks that live as long as the bench.
#![allow(clippy::disallowed_methods)]

// The binary's allocator (mimalloc linked as `malloc`, src/main.rs),
// so the gateway here runs as `modelgate serve` does.
use mimalloc as _;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request, Response, StatusCode, Uri};
use http_body::{Body as _, Frame};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpListener;

use modelgate::config::{Address, Config, Protocol};

const KEY: &str = "sk-bench";
/// Routed to the fake's chat endpoint (kind "chat").
const MODEL: &str = "bench-model";
/// Routed to the fake's messages endpoint (kind "messages").
const MESSAGES_MODEL: &str = "bench-messages";
const STREAM_CHUNKS: usize = 20;
/// Text deltas in the fake's streams: every chat chunk but the first (role) and last (finish).
const TEXT_DELTAS: usize = STREAM_CHUNKS - 2;
/// The fake's non-streamed answer, in either protocol.
const REPLY_TEXT: &str = "Hello! How can I help you today?";
/// Pairs a case runs before the next case takes its turn.
const BLOCK: usize = 25;
/// The names of the gateway's and the fake upstream's threads, to find their CPU time in /proc.
const GATEWAY_THREAD: &str = "gateway-worker";
/// The gateway's event loops (`[server] workers`) are threads named `modelgate-N`.
const EVENT_LOOP_THREAD: &str = "modelgate-";
const UPSTREAM_THREAD: &str = "fake-upstream";

/// The text of a stream, in either protocol: `tok1 tok2 … tok18 `.
fn stream_text() -> String {
    (1..=TEXT_DELTAS).map(|i| format!("tok{i} ")).collect()
}

// ---------------------------------------------------------------------------------------------
// Fake upstream
// ---------------------------------------------------------------------------------------------

type UpBody = BoxBody<Bytes, Infallible>;

fn completion_json() -> Bytes {
    Bytes::from_static(
        br#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}"#,
    )
}

/// Anthropic's non-streamed message (protocols.md §B.4), the same text as the chat reply.
fn message_json() -> Bytes {
    Bytes::from_static(
        br#"{"id":"msg_bench","type":"message","role":"assistant","model":"bench-messages","content":[{"type":"text","text":"Hello! How can I help you today?"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":9}}"#,
    )
}

fn stream_chunks() -> Vec<Bytes> {
    let mut out = Vec::with_capacity(STREAM_CHUNKS + 1);
    for i in 0..STREAM_CHUNKS {
        let (delta, finish) = match i {
            0 => (r#"{"role":"assistant","content":""}"#.to_owned(), "null"),
            i if i == STREAM_CHUNKS - 1 => ("{}".to_owned(), r#""stop""#),
            i => (format!(r#"{{"content":"tok{i} "}}"#), "null"),
        };
        out.push(Bytes::from(format!(
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench-model\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )));
    }
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

/// Anthropic's event stream (protocols.md §B.5) with the same text as the chat stream:
/// message_start, content_block_start, 18 text deltas, content_block_stop, message_delta,
/// message_stop; each event its own frame.
fn message_events() -> Vec<Bytes> {
    let event = |name: &str, data: &str| Bytes::from(format!("event: {name}\ndata: {data}\n\n"));
    let mut out = Vec::with_capacity(TEXT_DELTAS + 5);
    out.push(event(
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_bench","type":"message","role":"assistant","model":"bench-messages","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":1}}}"#,
    ));
    out.push(event(
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    ));
    for i in 1..=TEXT_DELTAS {
        out.push(event(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"tok{i} "}}}}"#
            ),
        ));
    }
    out.push(event(
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#,
    ));
    out.push(event(
        "message_delta",
        &format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn","stop_sequence":null}},"usage":{{"output_tokens":{TEXT_DELTAS}}}}}"#
        ),
    ));
    out.push(event("message_stop", r#"{"type":"message_stop"}"#));
    out
}

fn contains(body: &[u8], needle: &[u8]) -> bool {
    body.windows(needle.len()).any(|w| w == needle)
}

fn wants_stream(body: &[u8]) -> bool {
    contains(body, br#""stream":true"#) || contains(body, br#""stream": true"#)
}

/// What the fake answers, per endpoint: a JSON body and a stream's frames.
struct Replies {
    chat_chunks: Vec<Bytes>,
    message_events: Vec<Bytes>,
}

fn fake_error(status: StatusCode, message: &str) -> Response<UpBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(format!(
                r#"{{"error":{{"type":"invalid_request_error","message":"{message}"}}}}"#
            )))
            .boxed(),
        )
        .unwrap()
}

async fn upstream_reply(req: Request<Incoming>, replies: &Replies) -> Response<UpBody> {
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    // A cheap look at the request, so a translation that loses the conversation (or, toward
    // Anthropic, the required max_tokens) gets a 400 rather than a fast reply.
    let (json, chunks) = match path.as_str() {
        "/v1/chat/completions" if contains(&body, br#""messages""#) => {
            (completion_json(), &replies.chat_chunks)
        }
        "/v1/messages"
            if contains(&body, br#""messages""#) && contains(&body, br#""max_tokens""#) =>
        {
            (message_json(), &replies.message_events)
        }
        "/v1/chat/completions" | "/v1/messages" => {
            return fake_error(
                StatusCode::BAD_REQUEST,
                "the fake upstream refused the body",
            )
        }
        _ => return fake_error(StatusCode::NOT_FOUND, "no such path on the fake upstream"),
    };
    if wants_stream(&body) {
        // Each chunk its own body frame, all ready at once.
        let frames = chunks
            .iter()
            .cloned()
            .map(|b| Ok::<_, Infallible>(Frame::data(b)))
            .collect::<Vec<_>>();
        let body = StreamBody::new(futures_util::stream::iter(frames));
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(body.boxed())
            .unwrap()
    } else {
        Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(json).boxed())
            .unwrap()
    }
}

/// A minimal HTTP/1.1 server on loopback port 0, TCP_NODELAY on every connection, on its own
/// thread and single-threaded runtime (as if it were another process); lives until the bench exits.
/// `POST /v1/chat/completions` answers in OpenAI's chat shape, `POST /v1/messages` in Anthropic's.
fn start_upstream() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(UPSTREAM_THREAD.into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let replies: &'static Replies = Box::leak(Box::new(Replies {
                    chat_chunks: stream_chunks(),
                    message_events: message_events(),
                }));
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    stream.set_nodelay(true).unwrap();
                    tokio::spawn(async move {
                        let svc =
                            hyper::service::service_fn(move |req: Request<Incoming>| async move {
                                Ok::<_, Infallible>(upstream_reply(req, replies).await)
                            });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
        })
        .unwrap();
    rx.recv().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------

type BenchClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> BenchClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4)
        .build(http)
}

fn request(uri: &Uri, body: &Bytes) -> Request<Full<Bytes>> {
    Request::post(uri.clone())
        .header(header::AUTHORIZATION, "Bearer sk-bench")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))
        .unwrap()
}

/// One side of a pair: where the request goes, its bodies, and the protocol of the reply.
struct Target {
    uri: Uri,
    plain: Bytes,
    streamed: Bytes,
    /// The protocol the reply must be in (the client's).
    protocol: Protocol,
    /// For failure messages.
    what: String,
}

/// One case: the call through the gateway and the direct call to the fake endpoint it reaches.
struct Case {
    /// `client → upstream`, e.g. `chat → messages`.
    name: String,
    direct: Target,
    proxied: Target,
}

/// Timings of one call; for a non-streaming call `first` and `total` are both the time until
/// the whole body is read.
struct Times {
    head: Duration,
    first: Duration,
    total: Duration,
}

/// One non-streaming call: time until the whole body is read; the reply is checked afterwards.
async fn call_full(client: &BenchClient, t: &Target) -> Times {
    let started = Instant::now();
    let resp = client.request(request(&t.uri, &t.plain)).await.unwrap();
    let head = started.elapsed();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let total = started.elapsed();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}: {}",
        t.what,
        String::from_utf8_lossy(&bytes)
    );
    check_json(&t.what, t.protocol, &bytes);
    Times {
        head,
        first: total,
        total,
    }
}

/// One streaming call: time to the response head, to the first body chunk, to the end of the
/// stream; the stream is checked afterwards.
async fn call_stream(client: &BenchClient, t: &Target) -> Times {
    let started = Instant::now();
    let resp = client.request(request(&t.uri, &t.streamed)).await.unwrap();
    let head = started.elapsed();
    let status = resp.status();
    let mut body = resp.into_body();
    let mut first = None;
    let mut frames = Vec::with_capacity(32);
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        if let Ok(data) = frame.unwrap().into_data() {
            if data.is_empty() {
                continue;
            }
            first.get_or_insert_with(|| started.elapsed());
            frames.push(data);
        }
    }
    let total = started.elapsed();
    let bytes = frames.concat();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}: {}",
        t.what,
        String::from_utf8_lossy(&bytes)
    );
    check_stream(&t.what, t.protocol, &bytes);
    Times {
        head,
        first: first.unwrap(),
        total,
    }
}

async fn call(client: &BenchClient, t: &Target, stream: bool) -> Times {
    if stream {
        call_stream(client, t).await
    } else {
        call_full(client, t).await
    }
}

// ---------------------------------------------------------------------------------------------
// Reply checks (after the timing: they cost the measured figures nothing)
// ---------------------------------------------------------------------------------------------

/// The text of a responses object's output messages.
fn responses_text(v: &Value) -> String {
    let mut text = String::new();
    for item in v["output"].as_array().into_iter().flatten() {
        if item["type"] != "message" {
            continue;
        }
        for part in item["content"].as_array().into_iter().flatten() {
            if part["type"] == "output_text" {
                text.push_str(part["text"].as_str().unwrap_or_default());
            }
        }
    }
    text
}

/// A whole reply in `protocol`'s shape, carrying the fake's text and a clean stop.
fn check_json(what: &str, protocol: Protocol, body: &[u8]) {
    let v: Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "{what}: the reply is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    let ok = match protocol {
        Protocol::Chat => {
            v["object"] == "chat.completion"
                && v["choices"][0]["message"]["role"] == "assistant"
                && v["choices"][0]["message"]["content"] == REPLY_TEXT
                && v["choices"][0]["finish_reason"] == "stop"
        }
        Protocol::Messages => {
            v["type"] == "message"
                && v["role"] == "assistant"
                && v["content"][0]["type"] == "text"
                && v["content"][0]["text"] == REPLY_TEXT
                && v["stop_reason"] == "end_turn"
        }
        Protocol::Responses => {
            v["object"] == "response"
                && v["status"] == "completed"
                && responses_text(&v) == REPLY_TEXT
        }
    };
    assert!(
        ok,
        "{what}: not the expected {} reply: {v}",
        protocol.name()
    );
}

/// The (event name, data) of each event of an SSE body as the bench's peers write it: `\n` line
/// ends, one `data:` line per event. Anything else fails the check.
fn sse_events<'a>(what: &str, text: &'a str) -> Vec<(Option<&'a str>, &'a str)> {
    assert!(
        text.ends_with("\n\n"),
        "{what}: the stream does not end with a complete event: {text}"
    );
    text.split("\n\n")
        .filter(|block| !block.is_empty())
        .map(|block| {
            let (mut name, mut data) = (None, None);
            for line in block.split('\n') {
                if let Some(v) = line.strip_prefix("event: ") {
                    name = Some(v);
                } else if let Some(v) = line.strip_prefix("data: ") {
                    assert!(data.is_none(), "{what}: multi-line data: {block}");
                    data = Some(v);
                } else {
                    panic!("{what}: unexpected SSE line {line:?} in {text}");
                }
            }
            (
                name,
                data.unwrap_or_else(|| panic!("{what}: event without data: {block}")),
            )
        })
        .collect()
}

fn parse(what: &str, data: &str) -> Value {
    serde_json::from_str(data)
        .unwrap_or_else(|e| panic!("{what}: event data is not JSON ({e}): {data}"))
}

/// A whole stream in `protocol`'s shape: every event well-formed, the full text in order, a clean
/// stop, and the protocol's terminal event last (`[DONE]`, `message_stop`, `response.completed`).
fn check_stream(what: &str, protocol: Protocol, bytes: &[u8]) {
    let text = std::str::from_utf8(bytes).expect("the stream is not UTF-8");
    let events = sse_events(what, text);
    let expected = stream_text();
    let mut got = String::new();
    match protocol {
        Protocol::Chat => {
            let ((name, last), chunks) = events.split_last().expect("empty stream");
            assert!(
                name.is_none() && *last == "[DONE]",
                "{what}: the stream did not end with [DONE]: {text}"
            );
            let mut finish = None;
            for (name, data) in chunks {
                let v = parse(what, data);
                assert!(
                    name.is_none()
                        && v["object"] == "chat.completion.chunk"
                        && v.get("error").is_none(),
                    "{what}: not a chat chunk: {data}"
                );
                if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                    got.push_str(c);
                }
                if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                    finish = Some(f.to_owned());
                }
            }
            assert_eq!(finish.as_deref(), Some("stop"), "{what}: no finish: {text}");
        }
        Protocol::Messages => {
            let names: Vec<&str> = events
                .iter()
                .map(|(n, _)| n.unwrap_or_else(|| panic!("{what}: unnamed event: {text}")))
                .filter(|n| *n != "ping")
                .collect();
            let starts = names
                .iter()
                .filter(|n| **n == "content_block_start")
                .count();
            let stops = names.iter().filter(|n| **n == "content_block_stop").count();
            assert!(
                names.first() == Some(&"message_start")
                    && names.ends_with(&["message_delta", "message_stop"])
                    && starts >= 1
                    && starts == stops
                    && !names.contains(&"error"),
                "{what}: not an Anthropic event stream in order: {names:?}"
            );
            for (name, data) in &events {
                let v = parse(what, data);
                assert!(
                    v["type"] == name.unwrap(),
                    "{what}: event {name:?} with {data}"
                );
                match name.unwrap() {
                    "content_block_delta" if v["delta"]["type"] == "text_delta" => {
                        got.push_str(v["delta"]["text"].as_str().unwrap_or_default());
                    }
                    "message_delta" => assert!(
                        v["delta"]["stop_reason"] == "end_turn",
                        "{what}: not a clean stop: {data}"
                    ),
                    _ => {}
                }
            }
        }
        Protocol::Responses => {
            let mut completed = None;
            for (i, (name, data)) in events.iter().enumerate() {
                let v = parse(what, data);
                assert!(
                    name.is_some() && v["type"] == name.unwrap() && v["sequence_number"] == i,
                    "{what}: event {i} out of shape or sequence: {name:?} {data}"
                );
                match name.unwrap() {
                    "response.output_text.delta" => {
                        got.push_str(v["delta"].as_str().unwrap_or_default());
                    }
                    "response.completed" => completed = Some(v),
                    _ => {}
                }
            }
            assert!(
                events.first().and_then(|e| e.0) == Some("response.created")
                    && events.last().and_then(|e| e.0) == Some("response.completed"),
                "{what}: not a responses stream from created to completed: {text}"
            );
            let done = &completed.unwrap()["response"];
            assert!(
                done["status"] == "completed" && responses_text(done) == expected,
                "{what}: the terminal event lacks the full text: {done}"
            );
        }
    }
    assert_eq!(got, expected, "{what}: the stream's text differs: {text}");
}

// ---------------------------------------------------------------------------------------------
// Statistics and report
// ---------------------------------------------------------------------------------------------

struct Samples(Vec<u64>);

impl Samples {
    fn new(d: &[Duration]) -> Self {
        let mut v: Vec<u64> = d.iter().map(|d| d.as_nanos() as u64).collect();
        v.sort_unstable();
        Self(v)
    }

    /// Nearest-rank percentile, in microseconds.
    fn pct(&self, p: f64) -> f64 {
        let n = self.0.len();
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        self.0[rank.clamp(1, n) - 1] as f64 / 1000.0
    }

    fn mean(&self) -> f64 {
        self.0.iter().sum::<u64>() as f64 / self.0.len() as f64 / 1000.0
    }
}

const PCTS: [(f64, &str); 4] = [(50.0, "p50"), (90.0, "p90"), (99.0, "p99"), (99.9, "p99.9")];

/// Prints direct vs proxied at each percentile; returns the added (p50, p99) in µs.
fn report(title: &str, direct: &[Duration], proxied: &[Duration]) -> (f64, f64) {
    let d = Samples::new(direct);
    let p = Samples::new(proxied);
    println!("\n{title}  (n = {} each)", d.0.len());
    println!(
        "  {:<6} {:>12} {:>12} {:>12} {:>8}",
        "", "direct µs", "proxied µs", "added µs", "ratio"
    );
    let row = |name: &str, a: f64, b: f64| {
        println!(
            "  {name:<6} {a:>12.1} {b:>12.1} {:>12.1} {:>7.2}x",
            b - a,
            b / a
        );
    };
    for (q, name) in PCTS {
        row(name, d.pct(q), p.pct(q));
    }
    row("mean", d.mean(), p.mean());
    (p.pct(50.0) - d.pct(50.0), p.pct(99.0) - d.pct(99.0))
}

/// (VmRSS, VmHWM) of this process in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// On-CPU time of the gateway: its event loops, and the runtime that started it.
fn gateway_cpu_ns() -> u64 {
    cpu_ns(GATEWAY_THREAD) + cpu_ns(EVENT_LOOP_THREAD)
}

/// On-CPU time spent so far by the threads whose name starts with `thread`, in nanoseconds: from
/// `/proc/self/task/*/schedstat` (nanosecond resolution, so the short blocks each case runs in
/// can be told apart), else user + system from `stat` (10 ms ticks). Scheduling delays do not
/// inflate it, unlike wall-clock latency.
fn cpu_ns(thread: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for task in tasks.flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(thread) {
            continue;
        }
        let schedstat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        if let Some(ns) = schedstat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
        {
            total += ns;
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // USER_HZ is 100 on Linux: a tick is 10 ms.
        total += (tick(11) + tick(12)) * 10_000_000;
    }
    total
}

/// The 1-minute load average, as /proc/loadavg shows it.
fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISSED"
    }
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then only a smoke pass.
    let full = std::env::args().any(|a| a == "--bench");
    let (warmup, n) = if full {
        (
            env_usize("BENCH_WARMUP", 500),
            env_usize("BENCH_N", 5000).max(1),
        )
    } else {
        (5, 20)
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    // The gateway binary's runtime has one worker per core; so does this one by default.
    let threads = env_usize("BENCH_THREADS", cores).max(1);
    let rss_start = rss_kib();

    // Three runtimes, as if three processes: the fake upstream (its own thread), the gateway
    // (multi-thread, like `modelgate serve`), and the client (this thread). Sharing one runtime
    // would let the gateway's busy workers delay the client's socket readiness and skew the
    // figures.
    let up = start_upstream();
    let gw_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(GATEWAY_THREAD)
        .enable_all()
        .build()
        .unwrap();
    // Routing by model name: `bench-model` reaches the fake's chat endpoint, `bench-messages`
    // its messages endpoint (the same server, as an upstream of kind "messages").
    let toml = format!(
        r#"
[listen]
base = "127.0.0.1:0"

[server]
workers = {threads}

[[keys]]
name = "bench"
key = "{KEY}"

[[upstreams]]
name = "up"
kind = "chat"
base_url = "http://{up}/v1"

[[upstreams]]
name = "up-messages"
kind = "messages"
base_url = "http://{up}/v1"

[[models]]
name = "{MODEL}"
upstream = "up"

[[models]]
name = "{MESSAGES_MODEL}"
upstream = "up-messages"
"#
    );
    let config = Config::parse(&toml, Path::new("."), &|_| None)
        .unwrap_or_else(|e| panic!("bench config invalid:\n{e}"));
    let gateway = gw_rt.block_on(modelgate::server::start(&config)).unwrap();
    let gw_addr = gateway.addr(Address::Base).unwrap();

    println!(
        "modelgate proxy bench: {} mode, gateway on {threads} event loops, {cores} cores, warm-up {warmup} pairs, {n} measured pairs per case and mode",
        if full { "full" } else { "smoke (no --bench flag)" },
    );
    println!("upstream {up} (own thread), gateway {gw_addr}; client on its own thread: sequential requests (concurrency 1), one keep-alive client, direct/proxied interleaved; the cases take turns in blocks of {BLOCK} pairs");

    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client_rt.block_on(measure(full, warmup, n, up, gw_addr, rss_start));
    gw_rt.block_on(gateway.shutdown(Duration::from_secs(1)));
}

const PROMPT: &str = "Say hello in one short sentence.";

/// A chat body, a messages body and a responses body for `model`, plain and streamed.
fn bodies(protocol: Protocol, model: &str) -> (Bytes, Bytes) {
    let plain = match protocol {
        Protocol::Chat => format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"{PROMPT}"}}],"max_tokens":32"#
        ),
        Protocol::Messages => format!(
            r#"{{"model":"{model}","max_tokens":32,"messages":[{{"role":"user","content":"{PROMPT}"}}]"#
        ),
        Protocol::Responses => {
            format!(r#"{{"model":"{model}","input":"{PROMPT}","max_output_tokens":32"#)
        }
    };
    (
        Bytes::from(format!("{plain}}}")),
        Bytes::from(format!(r#"{plain},"stream":true}}"#)),
    )
}

fn target(base: SocketAddr, protocol: Protocol, model: &str, what: String) -> Target {
    let (plain, streamed) = bodies(protocol, model);
    Target {
        uri: format!("http://{base}{}", protocol.client_path())
            .parse()
            .unwrap(),
        plain,
        streamed,
        protocol,
        what,
    }
}

/// The passthrough case first (the reference), then the translated pairs.
fn cases(up: SocketAddr, gw: SocketAddr) -> Vec<Case> {
    [
        (Protocol::Chat, Protocol::Chat, MODEL),
        (Protocol::Chat, Protocol::Messages, MESSAGES_MODEL),
        (Protocol::Messages, Protocol::Chat, MODEL),
        (Protocol::Responses, Protocol::Chat, MODEL),
    ]
    .into_iter()
    .map(|(client, upstream, model)| {
        let name = format!("{} → {}", client.name(), upstream.name());
        Case {
            direct: target(up, upstream, model, format!("{name}, direct")),
            proxied: target(gw, client, model, format!("{name}, through the gateway")),
            name,
        }
    })
    .collect()
}

/// One case's samples in one mode, and the CPU time its blocks cost.
#[derive(Default)]
struct Measured {
    direct: Vec<Times>,
    proxied: Vec<Times>,
    gateway_ns: u64,
    upstream_ns: u64,
}

/// `n` interleaved pairs per case (the order within a pair alternates); the cases take turns in
/// blocks of `BLOCK` pairs, so slow drifts in the machine's load reach every case alike, and the
/// CPU time of each block is charged to its case.
async fn phase(client: &BenchClient, cases: &[Case], n: usize, stream: bool) -> Vec<Measured> {
    let mut out: Vec<Measured> = cases
        .iter()
        .map(|_| Measured {
            direct: Vec::with_capacity(n),
            proxied: Vec::with_capacity(n),
            ..Measured::default()
        })
        .collect();
    let mut done = 0;
    while done < n {
        let len = BLOCK.min(n - done);
        for (case, m) in cases.iter().zip(&mut out) {
            let cpu = (gateway_cpu_ns(), cpu_ns(UPSTREAM_THREAD));
            for i in done..done + len {
                if i % 2 == 0 {
                    m.direct.push(call(client, &case.direct, stream).await);
                    m.proxied.push(call(client, &case.proxied, stream).await);
                } else {
                    m.proxied.push(call(client, &case.proxied, stream).await);
                    m.direct.push(call(client, &case.direct, stream).await);
                }
            }
            m.gateway_ns += gateway_cpu_ns().saturating_sub(cpu.0);
            m.upstream_ns += cpu_ns(UPSTREAM_THREAD).saturating_sub(cpu.1);
        }
        done += len;
    }
    out
}

fn times(v: &[Times], f: fn(&Times) -> Duration) -> Vec<Duration> {
    v.iter().map(f).collect()
}

/// Added (p50, p99) in µs of one case: non-streaming total; streaming first chunk and end.
struct Added {
    full: (f64, f64),
    first: (f64, f64),
    end: (f64, f64),
}

async fn measure(
    full: bool,
    warmup: usize,
    n: usize,
    up: SocketAddr,
    gw_addr: SocketAddr,
    rss_start: (u64, u64),
) {
    let cases = cases(up, gw_addr);
    let client = client();
    let load_start = load_avg();

    // Warm-up: connections, pools, allocator, branch predictors.
    for _ in 0..warmup {
        for case in &cases {
            for stream in [false, true] {
                call(&client, &case.direct, stream).await;
                call(&client, &case.proxied, stream).await;
            }
        }
    }
    let rss_before = rss_kib();
    let full_phase = phase(&client, &cases, n, false).await;
    let rss_mid = rss_kib();
    let stream_phase = phase(&client, &cases, n, true).await;
    let rss_after = rss_kib();

    let mut added = Vec::with_capacity(cases.len());
    for (i, ((case, f), s)) in cases.iter().zip(&full_phase).zip(&stream_phase).enumerate() {
        // The passthrough keeps the titles it always had.
        let (full_title, stream_title) = if i == 0 {
            (
                "non-streaming chat request, total latency".to_owned(),
                format!("streaming chat request ({STREAM_CHUNKS} chunks + [DONE])"),
            )
        } else {
            let upstream_stream = match case.direct.protocol {
                Protocol::Messages => format!("{} events", TEXT_DELTAS + 5),
                _ => format!("{STREAM_CHUNKS} chunks + [DONE]"),
            };
            (
                format!(
                    "translated {} (direct: {} upstream), non-streaming, total latency",
                    case.name,
                    case.direct.protocol.name()
                ),
                format!(
                    "translated {} (direct: {} upstream, {upstream_stream}), streaming",
                    case.name,
                    case.direct.protocol.name()
                ),
            )
        };
        let full = report(
            &full_title,
            &times(&f.direct, |t| t.total),
            &times(&f.proxied, |t| t.total),
        );
        report(
            &format!("{stream_title}, time to response head"),
            &times(&s.direct, |t| t.head),
            &times(&s.proxied, |t| t.head),
        );
        let first = report(
            &format!("{stream_title}, time to first body chunk"),
            &times(&s.direct, |t| t.first),
            &times(&s.proxied, |t| t.first),
        );
        let end = report(
            &format!("{stream_title}, time to end of stream"),
            &times(&s.direct, |t| t.total),
            &times(&s.proxied, |t| t.total),
        );
        added.push(Added { full, first, end });
    }

    // Each translated pair's added p50 over the passthrough's, same run, same measure.
    let base = &added[0];
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    println!("\nadded latency per case (proxied − direct to the same fake endpoint), and each translated pair's added p50 over the passthrough's in this run (aim ≤ 2x)");
    println!(
        "  {:<26} {:<26} {:>11} {:>11} {:>13}",
        "case", "measure", "p50 µs", "p99 µs", "p50 vs pass."
    );
    for (i, (case, a)) in cases.iter().zip(&added).enumerate() {
        let name = if i == 0 {
            format!("{} (passthrough)", case.name)
        } else {
            case.name.clone()
        };
        for (j, (measure, (p50, p99), base_p50)) in [
            ("non-streaming total", a.full, base.full.0),
            ("stream, first chunk", a.first, base.first.0),
            ("stream, end of stream", a.end, base.end.0),
        ]
        .into_iter()
        .enumerate()
        {
            let r = ratio(p50, base_p50);
            let judged = if i == 0 || !full {
                String::new()
            } else {
                format!("  {}", verdict(r <= 2.0))
            };
            println!(
                "  {:<26} {measure:<26} {p50:>11.1} {p99:>11.1} {r:>12.2}x{judged}",
                if j == 0 { name.as_str() } else { "" },
            );
        }
    }

    // Only proxied requests make the gateway work, so its CPU time per proxied request is what it
    // costs whatever the scheduler does. The fake upstream (a bare hyper server, one thread)
    // serves every request, direct and proxied: its CPU time per request is the yardstick.
    let per_request = |ns: u64, requests: usize| ns as f64 / 1000.0 / requests as f64;
    println!("\nCPU time per request (on-CPU time of the named threads, from /proc/self/task/*/schedstat; in a VM it may include steal)");
    println!("  {:<50} {:>14} {:>14}", "", "non-streaming", "streaming");
    for (i, (case, (f, s))) in cases
        .iter()
        .zip(full_phase.iter().zip(&stream_phase))
        .enumerate()
    {
        let label = if i == 0 {
            "gateway, per proxied request".to_owned()
        } else {
            format!("gateway, per translated request: {}", case.name)
        };
        println!(
            "  {label:<50} {:>11.1} µs {:>11.1} µs",
            per_request(f.gateway_ns, n),
            per_request(s.gateway_ns, n)
        );
    }
    println!(
        "  {:<50} {:>11.1} µs {:>11.1} µs",
        "fake upstream (bare hyper), per request",
        per_request(full_phase[0].upstream_ns, 2 * n),
        per_request(stream_phase[0].upstream_ns, 2 * n)
    );

    println!("\nprocess memory (gateway, fake upstream and client share this process)");
    println!("  {:<44} {:>10} {:>10}", "", "VmRSS MiB", "VmHWM MiB");
    for (name, (rss, hwm)) in [
        ("at start (before any runtime)", rss_start),
        ("after start-up and warm-up", rss_before),
        ("after the non-streaming phase", rss_mid),
        ("after the streaming phase", rss_after),
    ] {
        println!("  {name:<44} {:>10.1} {:>10.1}", mib(rss), mib(hwm));
    }
    println!(
        "  growth across the measured phases: {:+.1} MiB RSS ({} requests)",
        mib(rss_after.0) - mib(rss_before.0),
        4 * n * cases.len()
    );

    println!("\nload average (1 min) at start {load_start}, at end {}: other work on this machine shows up in the tails", load_avg());
    if !full {
        println!("\n(smoke pass of {n} pairs per case in whatever profile this was built: not judged; run `cargo bench --bench proxy`)");
        return;
    }
    let (full_p50, full_p99) = base.full;
    let (first_p50, first_p99) = base.first;
    println!("\naims (small request, concurrency 1):");
    println!(
        "  non-streaming added p50 {full_p50:>8.1} µs  (aim ≤ 50)   {}",
        verdict(full_p50 <= 50.0)
    );
    println!(
        "  non-streaming added p99 {full_p99:>8.1} µs  (aim ≤ 250)  {}",
        verdict(full_p99 <= 250.0)
    );
    println!(
        "  first chunk added p50   {first_p50:>8.1} µs  (aim ≤ 50)   {}   (p99 {first_p99:.1} µs)",
        verdict(first_p50 <= 50.0)
    );
    for (case, a) in cases.iter().zip(&added).skip(1) {
        let worst = [
            ratio(a.full.0, base.full.0),
            ratio(a.first.0, base.first.0),
            ratio(a.end.0, base.end.0),
        ];
        println!(
            "  translated {:<19} added p50 ≤ 2x passthrough: non-streaming {:.2}x, first chunk {:.2}x, end of stream {:.2}x   {}",
            case.name,
            worst[0],
            worst[1],
            worst[2],
            verdict(worst.iter().all(|r| *r <= 2.0))
        );
    }
}
