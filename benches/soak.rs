//! Soak: the real gateway binary under steady mixed traffic for minutes, watched for growth: its RSS and open descriptors over time, every error the clients saw, and whether RSS comes back after the load stops.
//!
//! Traffic, at `SOAK_RATE` requests per second (default 40): the three client protocols against
//! models on a chat, a messages and a responses upstream (so three passthrough pairs and six
//! translated ones), half of them streamed; a tenth of the streams dropped by their client after a
//! few events. The loopback upstream answers from the golden fixtures (streams paced a few ms per
//! event) and now and then fails: a 500, a connection closed before any answer, a stream cut
//! halfway.
//!
//! Phases: a warm-up (`SOAK_WARMUP_SECS`, default 150) fills the pools, allocator pages, the
//! response store (capped at 1 MB here) and metric series that are meant to stay (at 40 req/s the
//! RSS levels off after about 2.5 minutes of this traffic, then stays flat); the client is dropped and the gateway idles
//! `SOAK_SETTLE_SECS` (default 15): that RSS is the baseline. Then the soak proper
//! (`SOAK_SECS`, default 600), drain, the same idle, and the end RSS must be within 10% of the
//! baseline; an unexpected error (a transport failure the upstream did not cause, a malformed
//! reply) fails the run too. `SOAK_SAMPLE_SECS` (default 10) paces the report lines.
//!
//! `cargo bench --bench soak` runs it; without `--bench` (as `cargo test --all-targets` runs
//! bench targets) it prints how to run it and exits at once.

// A benchmark is not a request path: a failed setup step should stop it loudly, like a test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The fake upstream's connections and the client's requests are plain tasks that end with the run.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request, Response, StatusCode, Uri};
use http_body::Frame;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use modelgate::sse::SseDecoder;
use serde_json::Value;
use tokio::net::TcpListener;

const KEY: &str = "sk-soak";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Loopback upstream
// ---------------------------------------------------------------------------------------------

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// One upstream protocol's answers: a JSON reply and a stream's events.
struct Answers {
    json: Bytes,
    events: Vec<Bytes>,
}

fn answers(pair: &str) -> Answers {
    let json = std::fs::read(format!("{FIXTURES}/{pair}/text/upstream_reply.json")).unwrap();
    let sse = std::fs::read_to_string(format!("{FIXTURES}/{pair}/text_stream/upstream_reply.sse"))
        .unwrap();
    let events = sse
        .split_inclusive("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| Bytes::from(e.to_owned()))
        .collect();
    Answers {
        json: Bytes::from(json),
        events,
    }
}

struct Upstream {
    chat: Answers,
    messages: Answers,
    responses: Answers,
}

type UpBody = BoxBody<Bytes, std::io::Error>;

fn full(b: Bytes) -> UpBody {
    Full::new(b)
        .map_err(|never: Infallible| -> std::io::Error { match never {} })
        .boxed()
}

fn contains(body: &[u8], needle: &[u8]) -> bool {
    body.windows(needle.len()).any(|w| w == needle)
}

/// The fake's answer; `Err` makes hyper drop the connection with no answer at all.
async fn upstream_reply(
    req: Request<Incoming>,
    up: &Upstream,
) -> Result<Response<UpBody>, std::io::Error> {
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await.map(|c| c.to_bytes());
    let body = body.map_err(std::io::Error::other)?;
    let answers = match path.as_str() {
        "/v1/chat/completions" => &up.chat,
        "/v1/messages" => &up.messages,
        "/v1/responses" => &up.responses,
        _ => {
            return Ok(Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(full(Bytes::new()))
                .unwrap())
        }
    };
    let roll = fastrand::u32(0..100);
    if roll < 4 {
        let err = r#"{"error":{"type":"server_error","message":"soak: injected failure"}}"#;
        return Ok(Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .header(header::CONTENT_TYPE, "application/json")
            .body(full(Bytes::from_static(err.as_bytes())))
            .unwrap());
    }
    if roll < 6 {
        return Err(std::io::Error::other("soak: injected connection drop"));
    }
    let stream = contains(&body, br#""stream":true"#);
    if !stream {
        return Ok(Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(full(answers.json.clone()))
            .unwrap());
    }
    // A cut stream stops halfway with an error, which hyper turns into a broken connection.
    let cut = (roll < 10).then_some(answers.events.len() / 2);
    let events = answers.events.clone();
    let frames = futures_util::stream::unfold(0usize, move |i| {
        let events = events.clone();
        async move {
            if cut == Some(i) {
                return Some((Err(std::io::Error::other("soak: injected cut")), usize::MAX));
            }
            let e = events.get(i)?.clone();
            tokio::time::sleep(Duration::from_millis(fastrand::u64(2..8))).await;
            Some((Ok(Frame::data(e)), i + 1))
        }
    });
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(StreamBody::new(frames).boxed())
        .unwrap())
}

/// The fake upstream on its own thread and runtime, as if it were another process.
fn start_upstream() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("soak-upstream".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let up: &'static Upstream = Box::leak(Box::new(Upstream {
                    chat: answers("messages_to_chat"),
                    messages: answers("chat_to_messages"),
                    responses: answers("chat_to_responses"),
                }));
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| upstream_reply(req, up));
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
// The gateway process
// ---------------------------------------------------------------------------------------------

struct Gateway {
    child: Child,
    base: String,
    /// Warnings and errors the gateway logged.
    logged: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    fn start(upstream: SocketAddr) -> Self {
        let dir = std::env::temp_dir().join(format!("modelgate-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("soak.toml");
        let url = format!("http://{upstream}/v1");
        std::fs::write(
            &path,
            format!(
                r#"
[listen]
base = "127.0.0.1:0"
admin = "127.0.0.1:0"

[[keys]]
name = "soak"
key = "{KEY}"

[[upstreams]]
name = "up-chat"
kind = "chat"
base_url = "{url}"
api_key_env = "SOAK_UPSTREAM_KEY"

[[upstreams]]
name = "up-messages"
kind = "messages"
base_url = "{url}"
api_key_env = "SOAK_UPSTREAM_KEY"

[[upstreams]]
name = "up-responses"
kind = "responses"
base_url = "{url}"
api_key_env = "SOAK_UPSTREAM_KEY"

[[models]]
name = "soak-chat"
upstream = "up-chat"

[[models]]
name = "soak-messages"
upstream = "up-messages"
default_max_tokens = 256

[[models]]
name = "soak-responses"
upstream = "up-responses"

# Stored /v1/responses answers are kept for a day by design (gateway.md §13), so with the default
# 256 MB cap the store alone would grow all through the run. A 1 MB cap fills during the warm-up:
# what grows after the baseline is then the gateway's own, which is what this bench looks for.
[store]
responses_max_mb = 1
"#
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_modelgate"))
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info,modelgate::access=off")
            .env("SOAK_UPSTREAM_KEY", "up-secret")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let logged = Arc::new(Mutex::new(Vec::new()));
        let sink = logged.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    sink.lock().unwrap().push(line);
                    continue;
                };
                let message = v["message"].as_str().unwrap_or("");
                if let Some(url) = message.strip_prefix("listening on ") {
                    if v["listener"] == "base" {
                        let _ = tx.send(url.to_owned());
                    }
                } else if matches!(v["level"].as_str(), Some("WARN" | "ERROR")) {
                    sink.lock().unwrap().push(line);
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the gateway prints its base listener");
        Self {
            child,
            base,
            logged,
        }
    }

    /// (RSS in kB, open descriptors) of the gateway process.
    fn sample(&self) -> (u64, usize) {
        let pid = self.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count();
        (rss, fds)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Client traffic
// ---------------------------------------------------------------------------------------------

type SoakClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> SoakClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(http)
}

/// What became of one request.
#[derive(Default)]
struct Tally {
    sent: u64,
    ok: u64,
    cancelled: u64,
    /// Errors the injected upstream failures explain: 5xx answers, in-stream error events.
    expected: BTreeMap<String, u64>,
    /// Anything else: transport failures, malformed replies, other statuses.
    unexpected: BTreeMap<String, u64>,
}

#[derive(Clone, Copy)]
enum Proto {
    Chat,
    Messages,
    Responses,
}

impl Proto {
    fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Messages => "/v1/messages",
            Self::Responses => "/v1/responses",
        }
    }

    fn body(self, model: &str, stream: bool) -> Bytes {
        Bytes::from(match self {
            Self::Chat => format!(
                r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"Say hello to Paris."}}]}}"#
            ),
            Self::Messages => format!(
                r#"{{"model":"{model}","stream":{stream},"max_tokens":64,"messages":[{{"role":"user","content":"Say hello to Paris."}}]}}"#
            ),
            Self::Responses => {
                format!(r#"{{"model":"{model}","stream":{stream},"input":"Say hello to Paris."}}"#)
            }
        })
    }

    /// Whether a stream ended the way this protocol ends one, and the error it reported if any.
    fn check_stream(self, bytes: &[u8]) -> Result<Option<String>, String> {
        let mut events = Vec::new();
        let mut d = SseDecoder::new();
        d.feed(bytes, &mut events).map_err(|e| e.to_string())?;
        d.finish(&mut events);
        let mut error = None;
        for ev in &events {
            if ev.data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(&ev.data)
                .map_err(|e| format!("stream event data is not JSON: {e}"))?;
            let is_error = ev.event.as_deref() == Some("error")
                || ev.event.as_deref() == Some("response.failed")
                || (matches!(self, Self::Chat) && v.get("error").is_some());
            if is_error {
                let msg = v
                    .pointer("/error/message")
                    .or_else(|| v.pointer("/response/error/message"))
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                error = Some(msg.to_owned());
            }
        }
        let last = events.last().ok_or("an empty stream")?;
        let terminal = match self {
            Self::Chat => last.data == "[DONE]",
            Self::Messages => matches!(last.event.as_deref(), Some("message_stop" | "error")),
            Self::Responses => matches!(
                last.event.as_deref(),
                Some("response.completed" | "response.incomplete" | "response.failed" | "error")
            ),
        };
        if !terminal {
            return Err(format!("stream ends with {:?}", last.event));
        }
        Ok(error)
    }
}

/// The message of a gateway error body, in any of the three shapes.
fn error_message(bytes: &[u8]) -> String {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| format!("non-JSON body: {}", String::from_utf8_lossy(bytes)))
}

enum Outcome {
    Ok,
    Cancelled,
    Expected(String),
    Unexpected(String),
}

async fn one_request(client: &SoakClient, base: &str) -> Outcome {
    let proto = *fastrand::choice(&[Proto::Chat, Proto::Messages, Proto::Responses]).unwrap();
    let model = *fastrand::choice(&["soak-chat", "soak-messages", "soak-responses"]).unwrap();
    let stream = fastrand::bool();
    let cancel_after = (stream && fastrand::u32(0..10) == 0).then(|| fastrand::usize(1..4));
    let uri: Uri = format!("{base}{}", proto.path()).parse().unwrap();
    let req = Request::post(uri)
        .header(header::AUTHORIZATION, format!("Bearer {KEY}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(proto.body(model, stream)))
        .unwrap();
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => return Outcome::Unexpected(format!("request failed: {e}")),
    };
    let status = resp.status();
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    let mut frames = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    bytes.extend_from_slice(&d);
                    frames += 1;
                }
            }
            Err(e) => return Outcome::Unexpected(format!("reading the body: {e}")),
        }
        if cancel_after.is_some_and(|n| frames >= n) && status == StatusCode::OK {
            // Dropping the body mid-stream is the client going away.
            return Outcome::Cancelled;
        }
    }
    let what = format!("{} {}", proto.path(), model);
    if status.is_server_error() {
        return Outcome::Expected(format!("{what}: {status}: {}", error_message(&bytes)));
    }
    if status != StatusCode::OK {
        return Outcome::Unexpected(format!("{what}: {status}: {}", error_message(&bytes)));
    }
    if stream {
        match proto.check_stream(&bytes) {
            Ok(None) => Outcome::Ok,
            Ok(Some(e)) => Outcome::Expected(format!("{what}: in-stream error: {e}")),
            Err(e) => Outcome::Unexpected(format!("{what}: {e}")),
        }
    } else if serde_json::from_slice::<Value>(&bytes).is_ok() {
        Outcome::Ok
    } else {
        Outcome::Unexpected(format!("{what}: the reply is not JSON"))
    }
}

/// Sends requests at a steady rate for `secs`, sampling the gateway every `sample` seconds;
/// waits for the requests in flight before returning.
async fn load(
    gw: &Gateway,
    secs: u64,
    rate: u64,
    sample: u64,
    tally: &Arc<Mutex<Tally>>,
    peak: &mut (u64, usize),
    started: Instant,
) {
    let client = client();
    let base: Arc<str> = Arc::from(gw.base.as_str());
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_sample = Instant::now() + Duration::from_secs(sample);
    let until = Instant::now() + Duration::from_secs(secs);
    let mut tasks = tokio::task::JoinSet::new();
    while Instant::now() < until {
        tick.tick().await;
        let (client, base, shared) = (client.clone(), base.clone(), tally.clone());
        tasks.spawn(async move {
            let outcome = one_request(&client, &base).await;
            let mut t = shared.lock().unwrap();
            match outcome {
                Outcome::Ok => t.ok += 1,
                Outcome::Cancelled => t.cancelled += 1,
                Outcome::Expected(e) => *t.expected.entry(e).or_default() += 1,
                Outcome::Unexpected(e) => *t.unexpected.entry(e).or_default() += 1,
            }
        });
        tally.lock().unwrap().sent += 1;
        while tasks.try_join_next().is_some() {}
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(sample);
            report(gw, tally, peak, started, tasks.len());
        }
    }
    while tasks.join_next().await.is_some() {}
}

fn report(
    gw: &Gateway,
    tally: &Arc<Mutex<Tally>>,
    peak: &mut (u64, usize),
    started: Instant,
    inflight: usize,
) -> (u64, usize) {
    let (rss, fds) = gw.sample();
    peak.0 = peak.0.max(rss);
    peak.1 = peak.1.max(fds);
    let t = tally.lock().unwrap();
    let expected: u64 = t.expected.values().sum();
    let unexpected: u64 = t.unexpected.values().sum();
    println!(
        "{:>6.0}s  rss {:>7.1} MB  fds {:>4}  sent {:>7}  ok {:>7}  cancelled {:>5}  expected-errors {:>5}  unexpected {:>3}  in flight {:>3}",
        started.elapsed().as_secs_f64(),
        rss as f64 / 1024.0,
        fds,
        t.sent,
        t.ok,
        t.cancelled,
        expected,
        unexpected,
        inflight
    );
    (rss, fds)
}

/// Idles `secs`, sampling; returns the last sample.
async fn settle(
    gw: &Gateway,
    secs: u64,
    sample: u64,
    tally: &Arc<Mutex<Tally>>,
    peak: &mut (u64, usize),
    started: Instant,
) -> (u64, usize) {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return report(gw, tally, peak, started, 0);
        }
        tokio::time::sleep(left.min(Duration::from_secs(sample))).await;
        report(gw, tally, peak, started, 0);
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("soak: run with `cargo bench --bench soak` (SOAK_SECS, SOAK_RATE, SOAK_WARMUP_SECS, SOAK_SETTLE_SECS, SOAK_SAMPLE_SECS)");
        return;
    }
    let secs = env_u64("SOAK_SECS", 600);
    let rate = env_u64("SOAK_RATE", 40);
    let warmup = env_u64("SOAK_WARMUP_SECS", 150);
    let settle_secs = env_u64("SOAK_SETTLE_SECS", 15);
    let sample = env_u64("SOAK_SAMPLE_SECS", 10).max(1);

    let upstream = start_upstream();
    let gw = Gateway::start(upstream);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut peak = (0, 0);
    println!(
        "soak: gateway pid {} at {}; {rate} req/s, warm-up {warmup}s, soak {secs}s, settle {settle_secs}s",
        gw.child.id(),
        gw.base
    );
    let (idle_rss, idle_fds) = report(&gw, &tally, &mut peak, started, 0);
    let (base_rss, base_fds, end_rss, end_fds, soak_time) = rt.block_on(async {
        println!("-- warm-up");
        load(&gw, warmup, rate, sample, &tally, &mut peak, started).await;
        let (base_rss, base_fds) =
            settle(&gw, settle_secs, sample, &tally, &mut peak, started).await;
        println!(
            "-- soak (baseline: rss {:.1} MB, fds {base_fds})",
            base_rss as f64 / 1024.0
        );
        peak = (0, 0);
        let soak_started = Instant::now();
        load(&gw, secs, rate, sample, &tally, &mut peak, started).await;
        let soak_time = soak_started.elapsed();
        println!("-- load stopped; idle");
        let (end_rss, end_fds) = settle(&gw, settle_secs, sample, &tally, &mut peak, started).await;
        (base_rss, base_fds, end_rss, end_fds, soak_time)
    });

    let t = tally.lock().unwrap();
    println!(
        "\n== soak summary ({:.0} s of load at {rate} req/s)",
        soak_time.as_secs_f64()
    );
    println!(
        "requests {}  ok {}  cancelled by client {}",
        t.sent, t.ok, t.cancelled
    );
    println!("expected errors (injected upstream failures):");
    for (e, n) in &t.expected {
        println!("  {n:>6}  {e}");
    }
    println!("unexpected errors:");
    for (e, n) in &t.unexpected {
        println!("  {n:>6}  {e}");
    }
    let logged = gw.logged.lock().unwrap();
    println!("gateway warnings/errors logged: {}", logged.len());
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    for line in logged.iter() {
        let key = serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| line.clone());
        *kinds.entry(key).or_default() += 1;
    }
    for (k, n) in &kinds {
        println!("  {n:>6}  {k}");
    }
    let mb = |kb: u64| kb as f64 / 1024.0;
    println!(
        "rss: before traffic {:.1} MB, baseline after warm-up {:.1} MB, soak peak {:.1} MB, end {:.1} MB ({:+.1}%)",
        mb(idle_rss),
        mb(base_rss),
        mb(peak.0),
        mb(end_rss),
        (end_rss as f64 / base_rss as f64 - 1.0) * 100.0
    );
    println!(
        "fds: before traffic {idle_fds}, baseline {base_fds}, soak peak {}, end {end_fds}",
        peak.1
    );
    let rss_ok = end_rss as f64 <= base_rss as f64 * 1.10;
    let errors_ok = t.unexpected.is_empty();
    if rss_ok && errors_ok {
        println!("PASS");
    } else {
        if !rss_ok {
            println!("FAIL: the end RSS is more than 10% above the baseline");
        }
        if !errors_ok {
            println!("FAIL: unexpected errors");
        }
        drop(t);
        drop(logged);
        drop(gw);
        std::process::exit(1);
    }
}
