//! End-to-end proxy overhead: the same chat request sent straight to an in-process fake upstream
//! and through the gateway, interleaved, non-streaming and streaming (20 chunks); reports the
//! latency the gateway adds (p50, p99), the time it adds to the first chunk, the CPU time the
//! gateway spends per request, and the process RSS.
//!
//! The fake upstream, the gateway and the client each get their own runtime and threads, as if
//! they were three processes; on a 2-core machine they still share the cores, so the figures
//! include some scheduling contention a remote client would not cause.
//!
//! `cargo bench --bench proxy` measures `BENCH_N` pairs (default 5000) after `BENCH_WARMUP`
//! warm-up pairs (default 500). Without `--bench` in the arguments (`cargo test --benches`) it
//! runs a 20-request smoke pass so CI stays fast. `BENCH_THREADS` sets the gateway's tokio worker
//! count (default: the number of cores, as `modelgate serve` does). No tracing subscriber is
//! installed, so logging costs nothing.

// A benchmark is not a request path: a failed setup step should stop it loudly, like a test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The fake upstream's accept loop and connections are plain tasks that live as long as the bench.
#![allow(clippy::disallowed_methods)]

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
use tokio::net::TcpListener;

use modelgate::config::{Address, Config};

const KEY: &str = "sk-bench";
const MODEL: &str = "bench-model";
const STREAM_CHUNKS: usize = 20;
/// The names of the gateway's and the fake upstream's threads, to find their CPU time in /proc.
const GATEWAY_THREAD: &str = "gateway-worker";
const UPSTREAM_THREAD: &str = "fake-upstream";

// ---------------------------------------------------------------------------------------------
// Fake upstream
// ---------------------------------------------------------------------------------------------

type UpBody = BoxBody<Bytes, Infallible>;

fn completion_json() -> Bytes {
    Bytes::from_static(
        br#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}"#,
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

fn wants_stream(body: &[u8]) -> bool {
    let find = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    find(br#""stream":true"#) || find(br#""stream": true"#)
}

async fn upstream_reply(req: Request<Incoming>, chunks: &[Bytes]) -> Response<UpBody> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
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
            .body(Full::new(completion_json()).boxed())
            .unwrap()
    }
}

/// A minimal HTTP/1.1 server on loopback port 0, TCP_NODELAY on every connection, on its own
/// thread and single-threaded runtime (as if it were another process); lives until the bench exits.
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
                let chunks: &'static [Bytes] = Vec::leak(stream_chunks());
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    stream.set_nodelay(true).unwrap();
                    tokio::spawn(async move {
                        let svc =
                            hyper::service::service_fn(move |req: Request<Incoming>| async move {
                                Ok::<_, Infallible>(upstream_reply(req, chunks).await)
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

/// One non-streaming call: time until the whole body is read.
async fn call_full(client: &BenchClient, uri: &Uri, body: &Bytes) -> Duration {
    let started = Instant::now();
    let resp = client.request(request(uri, body)).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let elapsed = started.elapsed();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(
        bytes.len() > 100,
        "short reply: {}",
        String::from_utf8_lossy(&bytes)
    );
    elapsed
}

/// Timings of one streaming call.
struct StreamTimes {
    head: Duration,
    first: Duration,
    total: Duration,
}

/// One streaming call: time to the response head, to the first body chunk, to the end of the stream.
async fn call_stream(client: &BenchClient, uri: &Uri, body: &Bytes) -> StreamTimes {
    let started = Instant::now();
    let resp = client.request(request(uri, body)).await.unwrap();
    let head = started.elapsed();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut first = None;
    let mut len = 0usize;
    let mut last = Bytes::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        if let Ok(data) = frame.unwrap().into_data() {
            if data.is_empty() {
                continue;
            }
            first.get_or_insert_with(|| started.elapsed());
            len += data.len();
            last = data;
        }
    }
    let total = started.elapsed();
    assert!(
        last.ends_with(b"data: [DONE]\n\n"),
        "stream did not end with [DONE]"
    );
    assert!(len > STREAM_CHUNKS * 100, "short stream: {len} bytes");
    StreamTimes {
        head,
        first: first.unwrap(),
        total,
    }
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

/// CPU time (user + system) spent so far by the threads named `thread`, in clock ticks.
/// Scheduling delays do not inflate it, unlike wall-clock latency.
fn cpu_ticks(thread: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for task in tasks.flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != thread {
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
        total += tick(11) + tick(12);
    }
    total
}

/// Clock ticks per second for /proc times (USER_HZ; 100 on Linux).
const USER_HZ: f64 = 100.0;

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
    let toml = format!(
        r#"
[listen]
base = "127.0.0.1:0"

[[keys]]
name = "bench"
key = "{KEY}"

[[upstreams]]
name = "up"
kind = "chat"
base_url = "http://{up}/v1"

[[models]]
name = "{MODEL}"
upstream = "up"
"#
    );
    let config = Config::parse(&toml, Path::new("."), &|_| None)
        .unwrap_or_else(|e| panic!("bench config invalid:\n{e}"));
    let gateway = gw_rt.block_on(modelgate::server::start(&config)).unwrap();
    let gw_addr = gateway.addr(Address::Base).unwrap();

    println!(
        "modelgate proxy bench: {} mode, gateway on {threads} tokio worker threads, {cores} cores, warm-up {warmup} pairs, {n} measured pairs",
        if full { "full" } else { "smoke (no --bench flag)" },
    );
    println!("upstream {up} (own thread), gateway {gw_addr}; client on its own thread: sequential requests (concurrency 1), one keep-alive client, direct/proxied interleaved");

    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client_rt.block_on(measure(full, warmup, n, up, gw_addr, rss_start));
    gw_rt.block_on(gateway.shutdown(Duration::from_secs(1)));
}

async fn measure(
    full: bool,
    warmup: usize,
    n: usize,
    up: SocketAddr,
    gw_addr: SocketAddr,
    rss_start: (u64, u64),
) {
    let direct: Uri = format!("http://{up}/v1/chat/completions").parse().unwrap();
    let proxied: Uri = format!("http://{gw_addr}/v1/chat/completions")
        .parse()
        .unwrap();
    let plain = Bytes::from(format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Say hello in one short sentence."}}],"max_tokens":32}}"#
    ));
    let streamed = Bytes::from(format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Say hello in one short sentence."}}],"max_tokens":32,"stream":true}}"#
    ));
    let client = client();
    let load_start = load_avg();

    // Warm-up: connections, pools, allocator, branch predictors.
    for _ in 0..warmup {
        call_full(&client, &direct, &plain).await;
        call_full(&client, &proxied, &plain).await;
        call_stream(&client, &direct, &streamed).await;
        call_stream(&client, &proxied, &streamed).await;
    }
    let rss_before = rss_kib();
    let cpu_before = (cpu_ticks(GATEWAY_THREAD), cpu_ticks(UPSTREAM_THREAD));

    // Non-streaming, interleaved; the order within a pair alternates.
    let (mut d_full, mut p_full) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            d_full.push(call_full(&client, &direct, &plain).await);
            p_full.push(call_full(&client, &proxied, &plain).await);
        } else {
            p_full.push(call_full(&client, &proxied, &plain).await);
            d_full.push(call_full(&client, &direct, &plain).await);
        }
    }
    let rss_mid = rss_kib();
    let cpu_mid = (cpu_ticks(GATEWAY_THREAD), cpu_ticks(UPSTREAM_THREAD));

    // Streaming, interleaved the same way.
    let (mut d_stream, mut p_stream) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            d_stream.push(call_stream(&client, &direct, &streamed).await);
            p_stream.push(call_stream(&client, &proxied, &streamed).await);
        } else {
            p_stream.push(call_stream(&client, &proxied, &streamed).await);
            d_stream.push(call_stream(&client, &direct, &streamed).await);
        }
    }
    let rss_after = rss_kib();
    let cpu_after = (cpu_ticks(GATEWAY_THREAD), cpu_ticks(UPSTREAM_THREAD));

    let (full_p50, full_p99) = report(
        "non-streaming chat request, total latency",
        &d_full,
        &p_full,
    );
    let times =
        |v: &[StreamTimes], f: fn(&StreamTimes) -> Duration| v.iter().map(f).collect::<Vec<_>>();
    let stream_title = format!("streaming chat request ({STREAM_CHUNKS} chunks + [DONE])");
    report(
        &format!("{stream_title}, time to response head"),
        &times(&d_stream, |t| t.head),
        &times(&p_stream, |t| t.head),
    );
    let (first_p50, first_p99) = report(
        &format!("{stream_title}, time to first body chunk"),
        &times(&d_stream, |t| t.first),
        &times(&p_stream, |t| t.first),
    );
    report(
        &format!("{stream_title}, time to end of stream"),
        &times(&d_stream, |t| t.total),
        &times(&p_stream, |t| t.total),
    );

    // Only proxied requests make the gateway work, so its CPU time per proxied request is what it
    // costs whatever the scheduler does. The fake upstream (a bare hyper server, one thread)
    // serves every request, direct and proxied: its CPU time per request is the yardstick.
    let per_request = |ticks: u64, requests: usize| ticks as f64 / USER_HZ * 1e6 / requests as f64;
    println!("\nCPU time per request (user + system, from /proc; 10 ms ticks; in a VM it may include steal)");
    println!("  {:<44} {:>14} {:>14}", "", "non-streaming", "streaming");
    println!(
        "  {:<44} {:>11.1} µs {:>11.1} µs",
        "gateway, per proxied request",
        per_request(cpu_mid.0 - cpu_before.0, n),
        per_request(cpu_after.0 - cpu_mid.0, n)
    );
    println!(
        "  {:<44} {:>11.1} µs {:>11.1} µs",
        "fake upstream (bare hyper), per request",
        per_request(cpu_mid.1 - cpu_before.1, 2 * n),
        per_request(cpu_after.1 - cpu_mid.1, 2 * n)
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
        4 * n
    );

    println!("\nload average (1 min) at start {load_start}, at end {}: other work on this machine shows up in the tails", load_avg());
    if !full {
        println!("\n(smoke pass of {n} requests in whatever profile this was built: not judged; run `cargo bench --bench proxy`)");
        return;
    }
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
}
