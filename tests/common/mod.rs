//! Shared test harness: the gateway in-process on port 0, fake upstreams that are real HTTP servers on loopback, and a client.
#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use modelgate::config::{Address, Config};
use modelgate::server::{self, RunningGateway};

pub const KEY: &str = "sk-test";

/// A running gateway and the addresses its listeners got.
pub struct TestGateway {
    pub running: RunningGateway,
}

impl TestGateway {
    /// Starts a gateway from config text; `env` holds the environment variables it may read.
    pub async fn start_with_env(toml: &str, env: &[(&str, &str)]) -> Self {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config = Config::parse(toml, Path::new("."), &|name| env.get(name).cloned())
            .unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
        let running = server::start(&config).await.expect("gateway starts");
        Self { running }
    }

    pub async fn start(toml: &str) -> Self {
        Self::start_with_env(toml, &[("UPSTREAM_KEY", "up-secret")]).await
    }

    pub fn url(&self, address: Address, path: &str) -> String {
        format!(
            "http://{}{}",
            self.running.addr(address).expect("listener"),
            path
        )
    }

    pub fn base(&self, path: &str) -> String {
        self.url(Address::Base, path)
    }

    /// The admin address's `/metrics` text.
    pub async fn metrics(&self) -> String {
        client()
            .get(self.url(Address::Admin, "/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// A config with all four listeners on port 0, a test key, and `extra` appended
/// (upstreams and models). `{UPSTREAM}` in `extra` is replaced by `upstream_url`.
pub fn config(upstream_url: &str, extra: &str) -> String {
    format!(
        r#"
[listen]
base = "127.0.0.1:0"
token_plan = "127.0.0.1:0"
video = "127.0.0.1:0"
admin = "127.0.0.1:0"

[limits]
max_request_bytes = 65536
connect_timeout_ms = 1000
first_byte_timeout_ms = 2000
idle_timeout_ms = 2000

[[keys]]
name = "test"
key = "{KEY}"

{}
"#,
        extra.replace("{UPSTREAM}", upstream_url)
    )
}

/// `toml` served by one event loop: idle upstream connections are kept per loop, so a test
/// that counts upstream connections across client connections needs them all on one.
pub fn one_loop(toml: &str) -> String {
    format!("{toml}\n[server]\nworkers = 1\n")
}

/// The usual test setup: one chat upstream named "up" at `upstream_url`, models routed to it.
pub fn chat_config(upstream_url: &str) -> String {
    config(
        upstream_url,
        r#"
[[upstreams]]
name = "up"
kind = "chat"
base_url = "{UPSTREAM}/v1"
api_key_env = "UPSTREAM_KEY"

[[models]]
name = "m"
upstream = "up"
upstream_model = "real-m"
addresses = ["base", "token_plan"]
vision = true
thinking = "chat_template_kwargs"

[[models]]
name = "plain"
upstream = "up"

[[upstreams]]
name = "mock"
kind = "mock"

[[models]]
name = "mock-*"
upstream = "mock"
addresses = ["base", "token_plan"]
"#,
    )
}

/// One request as the fake upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Seen {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("upstream got JSON")
    }
}

/// How the fake upstream answers.
pub enum Reply {
    /// A whole body at once.
    Full {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Bytes,
    },
    /// A streamed body: each chunk after its pause; `abort` drops the connection at the end
    /// instead of finishing the body cleanly.
    Stream {
        status: u16,
        content_type: &'static str,
        chunks: Vec<(Duration, Bytes)>,
        abort: bool,
    },
    /// Never answer (until the client goes away).
    Hang,
    /// The inner reply after a pause: a head that comes late.
    After(Duration, Box<Reply>),
    /// The inner reply once the gate reads `true`: a head that comes when the test says so.
    Gated(tokio::sync::watch::Receiver<bool>, Box<Reply>),
}

impl Reply {
    pub fn json(status: u16, body: serde_json::Value) -> Self {
        Reply::Full {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: Bytes::from(body.to_string()),
        }
    }

    pub fn sse(chunks: Vec<(Duration, &str)>) -> Self {
        Reply::Stream {
            status: 200,
            content_type: "text/event-stream",
            chunks: chunks
                .into_iter()
                .map(|(d, s)| (d, Bytes::from(s.to_owned())))
                .collect(),
            abort: false,
        }
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A real HTTP/1.1 server on loopback port 0 that records what it receives.
pub struct FakeUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Connections accepted so far.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    /// Receives one message each time a response body is dropped before its end
    /// (the gateway went away) or a hanging request is abandoned.
    pub cancelled: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
}

impl FakeUpstream {
    pub async fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (cancel_tx, cancel_rx) = mpsc::unbounded_channel();
        let handler: Handler = Arc::new(handler);
        let seen2 = seen.clone();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted2 = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                accepted2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                stream.set_nodelay(true).unwrap();
                let handler = handler.clone();
                let seen = seen2.clone();
                let cancel_tx = cancel_tx.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let handler = handler.clone();
                        let seen = seen.clone();
                        let cancel_tx = cancel_tx.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|c| c.to_bytes())
                                .unwrap_or_default();
                            let s = Seen {
                                method: parts.method.to_string(),
                                uri: parts.uri.to_string(),
                                headers: parts.headers,
                                body,
                            };
                            seen.lock().unwrap().push(s.clone());
                            Ok::<_, Infallible>(respond(handler(&s), cancel_tx).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            seen,
            accepted,
            cancelled: tokio::sync::Mutex::new(cancel_rx),
        }
    }

    /// How many connections the upstream has accepted.
    pub fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn last(&self) -> Seen {
        self.seen().pop().expect("the upstream received a request")
    }

    /// Waits until the upstream has noticed a client going away.
    pub async fn wait_cancelled(&self, within: Duration) -> bool {
        let mut rx = self.cancelled.lock().await;
        let fut = rx.recv();
        matches!(tokio::time::timeout(within, fut).await, Ok(Some(())))
    }
}

type TestBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

async fn respond(reply: Reply, cancel_tx: mpsc::UnboundedSender<()>) -> Response<TestBody> {
    match reply {
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut resp = Response::new(Full::new(body).map_err(|e| match e {}).boxed());
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            for (k, v) in headers {
                resp.headers_mut().insert(k, v.parse().unwrap());
            }
            resp
        }
        Reply::Stream {
            status,
            content_type,
            chunks,
            abort,
        } => {
            let body = ScriptedBody {
                chunks: chunks.into(),
                sleep: None,
                abort,
                finished: false,
                cancel_tx,
            };
            let mut resp = Response::new(body.boxed());
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            resp.headers_mut()
                .insert("content-type", content_type.parse().unwrap());
            resp
        }
        Reply::After(pause, inner) => {
            tokio::time::sleep(pause).await;
            Box::pin(respond(*inner, cancel_tx)).await
        }
        Reply::Gated(mut gate, inner) => {
            let _ = gate.wait_for(|open| *open).await;
            Box::pin(respond(*inner, cancel_tx)).await
        }
        Reply::Hang => {
            // Dropped when hyper sees the connection close: the sender fires then.
            let guard = DropSignal(Some(cancel_tx));
            std::future::pending::<()>().await;
            drop(guard);
            unreachable!()
        }
    }
}

struct DropSignal(Option<mpsc::UnboundedSender<()>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Plays chunks with pauses; reports when dropped before the end (the peer went away).
struct ScriptedBody {
    chunks: std::collections::VecDeque<(Duration, Bytes)>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    abort: bool,
    finished: bool,
    cancel_tx: mpsc::UnboundedSender<()>,
}

impl http_body::Body for ScriptedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        loop {
            if let Some(s) = self.sleep.as_mut() {
                if s.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
                let (_, bytes) = self.chunks.pop_front().unwrap();
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            match self.chunks.front() {
                Some((d, _)) if !d.is_zero() => {
                    let d = *d;
                    self.sleep = Some(Box::pin(tokio::time::sleep(d)));
                }
                Some(_) => {
                    let (_, bytes) = self.chunks.pop_front().unwrap();
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                None => {
                    self.finished = true;
                    if self.abort {
                        return Poll::Ready(Some(Err(std::io::Error::other("scripted abort"))));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

impl Drop for ScriptedBody {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.cancel_tx.send(());
        }
    }
}

/// A plain reqwest client (HTTP/1.1, no proxy from the environment).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// POSTs JSON with the test key; the response's body is not read yet.
pub async fn post(url: &str, body: &serde_json::Value) -> reqwest::Response {
    client()
        .post(url)
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// POSTs JSON with the test key and returns status, headers and parsed body.
pub async fn post_json(url: &str, body: serde_json::Value) -> (u16, HeaderMap, serde_json::Value) {
    let resp = post(url, &body).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, headers, v)
}

/// POSTs JSON with the test key and returns the whole body as text (streams read to the end).
pub async fn post_text(url: &str, body: &serde_json::Value) -> String {
    post(url, body).await.text().await.unwrap()
}

/// A minimal valid chat body for `model`.
pub fn chat_body(model: &str) -> serde_json::Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

/// Asserts an OpenAI-shaped error with `status` and `param`.
pub fn assert_openai_error(
    status: u16,
    body: &serde_json::Value,
    want_status: u16,
    want_param: Option<&str>,
) {
    assert_eq!(status, want_status, "body: {body}");
    let err = &body["error"];
    assert!(err["message"].is_string(), "no error.message in {body}");
    assert!(err["type"].is_string(), "no error.type in {body}");
    if let Some(p) = want_param {
        assert_eq!(err["param"], p, "body: {body}");
    }
}

/// Sends a streaming chat request for model "m" over a raw socket to the gateway at `base` and
/// returns the response's chunk payloads, one per HTTP/1.1 chunk the gateway wrote.
pub async fn raw_stream_chunks(base: &str) -> Vec<String> {
    let addr = base.trim_start_matches("http://");
    let body =
        serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, mut rest) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let mut chunks = Vec::new();
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        if size == 0 {
            return chunks;
        }
        chunks.push(after[..size].to_owned());
        rest = &after[size + 2..];
    }
}
