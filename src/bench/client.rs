//! The benchmark's HTTP side: one pooled hyper-util client (HTTP/1.1 and h2, rustls, TCP_NODELAY) and one request measured from its scheduled send time to its last byte.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::events::{self, Seen};
use super::Protocol;
use crate::sse::{SseDecoder, SseEvent};

/// The longest a request may take, head to last byte, before it counts as `timeout`. Long
/// enough for a long generation from a slow model; the CLI of §12 has no flag for it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One endpoint as requests are sent to it.
#[derive(Debug, Clone)]
pub struct Target {
    pub uri: Uri,
    pub protocol: Protocol,
    pub headers: HeaderMap,
}

impl Target {
    /// `base` is `--url` (with its version prefix); `key` the API key, if any.
    pub fn new(base: &str, protocol: Protocol, key: Option<&str>) -> Result<Self, String> {
        let joined = format!("{}{}", base.trim_end_matches('/'), protocol.path());
        let uri: Uri = joined
            .parse()
            .map_err(|e| format!("not a URL: {base:?}: {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(format!("not an http(s) URL: {base:?}"));
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if protocol == Protocol::Messages {
            headers.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static("2023-06-01"),
            );
        }
        if let Some(key) = key {
            let (name, value) = match protocol {
                Protocol::Messages => (HeaderName::from_static("x-api-key"), key.to_owned()),
                Protocol::Chat | Protocol::Responses => (AUTHORIZATION, format!("Bearer {key}")),
            };
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| "the API key is not a valid header value".to_owned())?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(Self {
            uri,
            protocol,
            headers,
        })
    }
}

/// The pooled client all requests of a run share (connections are reused, as a real client's).
#[derive(Clone)]
pub struct BenchClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl BenchClient {
    pub fn new() -> Self {
        let https = crate::upstream::https_connector(CONNECT_TIMEOUT);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(https);
        Self { client }
    }
}

impl Default for BenchClient {
    fn default() -> Self {
        Self::new()
    }
}

/// One request's measurements. Every duration is from the scheduled send time.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Actual send minus scheduled send: the client's own delay.
    pub lag: Duration,
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    /// Gaps between consecutive content deltas.
    pub itl: Vec<Duration>,
    pub output_tokens: u64,
    pub error: Option<String>,
}

/// Sends one request scheduled for `scheduled` and measures it to its last byte.
pub async fn measure(
    client: &BenchClient,
    target: &Target,
    body: Bytes,
    scheduled: Instant,
    stream: bool,
) -> Measured {
    let sent = Instant::now();
    let mut m = Measured {
        lag: sent.saturating_duration_since(scheduled),
        ..Measured::default()
    };
    let mut end = None;
    let fut = exchange(client, target, body, scheduled, stream, &mut m, &mut end);
    let result = tokio::time::timeout(REQUEST_TIMEOUT, fut).await;
    // The end is when the last byte arrived, not when it was parsed; a request that failed
    // before its end ends now.
    m.e2e = end
        .unwrap_or_else(Instant::now)
        .saturating_duration_since(scheduled);
    match result {
        Ok(Ok(())) => {}
        Ok(Err(kind)) => m.error = Some(kind),
        Err(_) => m.error = Some("timeout".into()),
    }
    m
}

async fn exchange(
    client: &BenchClient,
    target: &Target,
    body: Bytes,
    scheduled: Instant,
    stream: bool,
    m: &mut Measured,
    end: &mut Option<Instant>,
) -> Result<(), String> {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = target.uri.clone();
    *req.headers_mut() = target.headers.clone();
    let resp = client
        .client
        .request(req)
        .await
        .map_err(|e| request_error(&e))?;
    let status = resp.status();
    let is_sse = crate::body::is_event_stream(resp.headers());
    let mut body = resp.into_body();
    if !status.is_success() {
        // Read the error body to its end so the connection goes back to the pool.
        let _ = body.collect().await;
        return Err(format!("http_{}", status.as_u16()));
    }
    if stream && is_sse {
        read_stream(&mut body, target.protocol, scheduled, m, end).await
    } else {
        let bytes = body
            .collect()
            .await
            .map_err(|_| "stream_error".to_owned())?
            .to_bytes();
        let now = Instant::now();
        *end = Some(now);
        // A whole reply's first token reaches the client with its last byte.
        m.ttft = Some(now.saturating_duration_since(scheduled));
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|_| "bad_response".to_owned())?;
        let (usage, error) = events::whole_reply(target.protocol, &v);
        if error {
            return Err("bad_response".into());
        }
        m.output_tokens = usage.unwrap_or(0);
        Ok(())
    }
}

/// Reads an event stream frame by frame; every event of one frame shares that frame's arrival time.
async fn read_stream(
    body: &mut hyper::body::Incoming,
    protocol: Protocol,
    scheduled: Instant,
    m: &mut Measured,
    end: &mut Option<Instant>,
) -> Result<(), String> {
    let mut decoder = SseDecoder::with_limit(crate::translate::DEFAULT_MAX_EVENT);
    let mut events: Vec<SseEvent> = Vec::new();
    let mut state = StreamState::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "stream_error".to_owned())?;
        let now = Instant::now();
        if let Some(data) = frame.data_ref() {
            decoder
                .feed(data, &mut events)
                .map_err(|_| "event_too_large".to_owned())?;
            state.take(protocol, &mut events, now, scheduled, m)?;
        }
    }
    let now = Instant::now();
    *end = Some(now);
    decoder.finish(&mut events);
    state.take(protocol, &mut events, now, scheduled, m)?;
    m.output_tokens = state.usage.unwrap_or(state.deltas);
    if !state.terminal {
        return Err("incomplete".into());
    }
    Ok(())
}

#[derive(Default)]
struct StreamState {
    last_delta: Option<Instant>,
    deltas: u64,
    usage: Option<u64>,
    terminal: bool,
}

impl StreamState {
    fn take(
        &mut self,
        protocol: Protocol,
        events: &mut Vec<SseEvent>,
        now: Instant,
        scheduled: Instant,
        m: &mut Measured,
    ) -> Result<(), String> {
        for ev in events.drain(..) {
            let seen: Seen = events::stream_event(protocol, &ev);
            if seen.error {
                return Err("stream_error".into());
            }
            if seen.content {
                match self.last_delta {
                    None => m.ttft = Some(now.saturating_duration_since(scheduled)),
                    Some(prev) => m.itl.push(now.saturating_duration_since(prev)),
                }
                self.last_delta = Some(now);
                self.deltas += 1;
            }
            if let Some(u) = seen.usage {
                self.usage = Some(u);
            }
            self.terminal |= seen.terminal;
        }
        Ok(())
    }
}

/// The error kind of a request that got no response head.
fn request_error(e: &hyper_util::client::legacy::Error) -> String {
    if e.is_connect() {
        "connect".into()
    } else {
        // The connection broke before a response head (reset, closed, protocol error).
        "connection".into()
    }
}
