//! The upstream HTTP clients (our own HTTP/1.1 pool for `http://`, hyper-util's over rustls for `https://`), outbound request building (URL, credential, header hygiene) and the first-byte timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::coalesce::Coalesce;
use crate::config::{Limits, Protocol, Upstream, UpstreamKind};
use crate::error::{ErrorKind, GatewayError, RetryClass};

pub mod h1;

/// How long an idle upstream connection is kept for reuse.
const POOL_IDLE: Duration = Duration::from_secs(90);
/// Idle connections kept per upstream authority.
const POOL_MAX_IDLE: usize = 64;

/// The pooled clients every upstream call goes through: plain-HTTP upstreams on connections
/// driven by the request's own task, HTTPS ones on hyper-util's client (HTTP/2 by ALPN).
#[derive(Clone)]
pub struct UpstreamClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    plain: Arc<h1::H1Pool>,
    first_byte_timeout: Duration,
}

/// An upstream response body, from whichever client carried the request.
pub enum UpstreamIncoming {
    Plain(h1::PooledBody),
    Shared(Coalesce<Incoming>),
}

/// Why an upstream response body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Plain(#[from] h1::Error),
    #[error(transparent)]
    Shared(#[from] hyper::Error),
}

impl http_body::Body for UpstreamIncoming {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Self::Plain(b) => Pin::new(b).poll_frame(cx).map_err(BodyError::Plain),
            Self::Shared(b) => Pin::new(b).poll_frame(cx).map_err(BodyError::Shared),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Plain(b) => b.is_end_stream(),
            Self::Shared(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Self::Plain(b) => b.size_hint(),
            Self::Shared(b) => b.size_hint(),
        }
    }
}

/// An HTTP(S) connector for HTTP/1.1 and HTTP/2 (by ALPN), with TCP_NODELAY and keep-alive,
/// trusting the platform's roots when the machine has them (corporate CAs), Mozilla's otherwise.
/// The gateway's upstream client and `modelgate bench` both use it.
pub fn https_connector(connect_timeout: Duration) -> HttpsConnector<HttpConnector> {
    let mut http = tcp_connector(connect_timeout);
    http.enforce_http(false);
    match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
        Ok(b) => b
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http),
        Err(_) => hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http),
    }
}

/// TCP connections as every upstream call makes them.
fn tcp_connector(connect_timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    // Small SSE frames must leave at once; Nagle plus delayed ACKs costs ~40 ms per frame.
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    http
}

impl UpstreamClient {
    /// `workers`: the event loops that will call it (`[server] workers`); each keeps its own
    /// idle plain-HTTP connections.
    pub fn new(limits: &Limits, workers: usize) -> Self {
        let https = https_connector(limits.connect_timeout);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .build(https);
        let plain = h1::H1Pool::new(
            tcp_connector(limits.connect_timeout),
            POOL_IDLE,
            POOL_MAX_IDLE,
            workers,
        );
        Self {
            client,
            plain: Arc::new(plain),
            first_byte_timeout: limits.first_byte_timeout,
        }
    }

    /// Sends `req` and waits for the response head, at most the first-byte timeout.
    pub async fn send(
        &self,
        upstream: &Upstream,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamIncoming>, GatewayError> {
        self.send_as(&upstream.name, req).await
    }

    /// [`send`](Self::send) on behalf of the upstream named `upstream` (a token fetch, which runs
    /// in its own task and holds only the name).
    pub async fn send_as(
        &self,
        upstream: &str,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamIncoming>, GatewayError> {
        let plain = req.uri().scheme() == Some(&http::uri::Scheme::HTTP);
        let fut = async {
            if plain {
                match self.plain.send(req).await {
                    Ok(resp) => Ok(resp.map(UpstreamIncoming::Plain)),
                    Err(e) => Err(classify_plain(upstream, e)),
                }
            } else {
                match self.client.request(req).await {
                    Ok(resp) => Ok(resp.map(|b| UpstreamIncoming::Shared(Coalesce::new(b)))),
                    Err(e) => Err(classify(upstream, e)),
                }
            }
        };
        match tokio::time::timeout(self.first_byte_timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(GatewayError::upstream(
                ErrorKind::UpstreamTimeout,
                RetryClass::Timeout,
                format!(
                    "upstream {upstream:?} did not answer within {} ms",
                    self.first_byte_timeout.as_millis()
                ),
                FirstByteTimeout(self.first_byte_timeout),
            )),
        }
    }
}

/// No response head came within `[limits] first_byte_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("no response head within {} ms", .0.as_millis())]
pub struct FirstByteTimeout(pub Duration);

/// True when a cause in `e`'s chain is an I/O timeout (the connector's connect timeout).
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

fn classify(upstream: &str, e: hyper_util::client::legacy::Error) -> GatewayError {
    let connect = e.is_connect();
    failed(upstream, connect, e)
}

fn classify_plain(upstream: &str, e: h1::SendError) -> GatewayError {
    match e {
        h1::SendError::Connect(e) => failed(upstream, true, ConnectFailed(e)),
        // An answer that is not HTTP/1.1 is the upstream's fault, as a malformed reply is.
        h1::SendError::Request(e @ (h1::Error::Head(_) | h1::Error::HeadTooLarge)) => {
            GatewayError::upstream(
                ErrorKind::UpstreamBadResponse,
                RetryClass::ServerError,
                format!("upstream {upstream:?} sent a malformed answer: {e}"),
                e,
            )
        }
        h1::SendError::Request(e) => failed(upstream, false, e),
        h1::SendError::Closed => failed(upstream, false, ClosedEarly),
        h1::SendError::NoAuthority => GatewayError::new(
            ErrorKind::Internal,
            format!("upstream {upstream:?} has no host in its URL"),
        ),
    }
}

/// The connection to an upstream could not be made.
#[derive(Debug, thiserror::Error)]
#[error("connect failed")]
struct ConnectFailed(#[source] Box<dyn std::error::Error + Send + Sync>);

/// The upstream closed the connection before its response head.
#[derive(Debug, thiserror::Error)]
#[error("connection closed before the response head")]
struct ClosedEarly;

/// An upstream call that got no response head: unreachable (`connect`) or failed on the way.
fn failed<E>(upstream: &str, connect: bool, e: E) -> GatewayError
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut cause = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    if connect {
        let (kind, class) = if timed_out(&e) {
            (ErrorKind::UpstreamTimeout, RetryClass::Connect)
        } else {
            (ErrorKind::UpstreamUnreachable, RetryClass::Connect)
        };
        GatewayError::upstream(
            kind,
            class,
            format!("cannot connect to upstream {upstream:?}: {cause}"),
            e,
        )
    } else {
        // The request may have reached the upstream, but no answer came back: like a 502.
        GatewayError::upstream(
            ErrorKind::UpstreamUnreachable,
            RetryClass::ServerError,
            format!("upstream {upstream:?} failed before answering: {cause}"),
            e,
        )
    }
}

/// The Messages API version sent when neither the client nor the config names one.
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Headers that describe one connection, never forwarded (RFC 9110 §7.6.1), plus the ones the
/// gateway sets itself.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Client headers that never reach an upstream, whatever an upstream's `forward_headers` says:
/// credentials, and what the gateway rewrites.
const CLIENT_ONLY: [&str; 6] = [
    "authorization",
    "x-api-key",
    "host",
    "content-length",
    "cookie",
    // Streams are inspected (and later translated), so bodies must arrive uncompressed.
    "accept-encoding",
];

/// Client headers every upstream receives (gateway.md §14): content negotiation, tracing and
/// idempotency. Anything else — a client's choice of the upstream account's organisation or
/// project among them — stays at the gateway unless the upstream's `forward_headers` lists it.
const TO_UPSTREAM: [&str; 7] = [
    "content-type",
    "accept",
    "user-agent",
    "x-request-id",
    "traceparent",
    "tracestate",
    "idempotency-key",
];

/// Upstream headers a client receives, on passthrough and translated replies alike; never
/// cookies, nor the upstream account's organisation, project or rate-limit headers.
/// `content-encoding` stays with the body it describes; `request-id` is Anthropic's request id.
const TO_CLIENT: [&str; 5] = [
    "content-type",
    "content-encoding",
    "retry-after",
    "x-request-id",
    "request-id",
];

/// True for a header no `forward_headers` entry may name.
pub fn never_forwarded(name: &HeaderName) -> bool {
    let n = name.as_str();
    CLIENT_ONLY.contains(&n) || HOP_BY_HOP.contains(&n)
}

fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Whether the client header `name` may go on to `upstream`.
fn forwarded_to(upstream: &Upstream, name: &HeaderName) -> bool {
    let n = name.as_str();
    if TO_UPSTREAM.contains(&n) || upstream.forward_headers.contains(name) {
        return true;
    }
    match upstream.protocol() {
        Some(Protocol::Messages) => n == "anthropic-version" || n == "anthropic-beta",
        Some(Protocol::Responses) => n == "openai-beta",
        _ => false,
    }
}

/// Builds the upstream request: the allowed client headers, the upstream's credential and headers.
pub fn build_request(
    upstream: &Upstream,
    uri: Uri,
    client_headers: &HeaderMap,
    request_id: &HeaderValue,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, GatewayError> {
    let listed = connection_listed(client_headers);
    let mut req = build_call(upstream, Method::POST, uri, request_id, Some(body), true)?;
    // The client's headers go under the gateway's own; a client's Anthropic version and betas
    // win over the config's, which are defaults. A repeated client header keeps every value.
    let mut taken: Vec<&HeaderName> = Vec::new();
    for (name, value) in client_headers {
        if never_forwarded(name)
            || !forwarded_to(upstream, name)
            || listed.iter().any(|l| l == name.as_str())
        {
            continue;
        }
        if taken.contains(&name) {
            req.headers_mut().append(name.clone(), value.clone());
            continue;
        }
        let ours = req.headers().contains_key(name);
        if !ours || (name.as_str().starts_with("anthropic-") && upstream_default(upstream, name)) {
            req.headers_mut().insert(name.clone(), value.clone());
            taken.push(name);
        }
    }
    Ok(req)
}

/// True when `name` was set only as a configured default (or the built-in Anthropic version).
fn upstream_default(upstream: &Upstream, name: &HeaderName) -> bool {
    upstream.headers.iter().any(|(n, _)| n == name) || name.as_str() == "anthropic-version"
}

/// The upstream's credential, in the header its kind expects, and its configured headers.
fn add_credential(upstream: &Upstream, headers: &mut HeaderMap) {
    if let Some(cred) = &upstream.credential {
        let name = match upstream.kind {
            UpstreamKind::Messages => HeaderName::from_static("x-api-key"),
            UpstreamKind::VeoGemini => HeaderName::from_static("x-goog-api-key"),
            _ => header::AUTHORIZATION,
        };
        headers.insert(name, cred.header_value().clone());
    }
    for (name, value) in &upstream.headers {
        headers.insert(name.clone(), value.clone());
    }
    if upstream.kind == UpstreamKind::Messages && !headers.contains_key("anthropic-version") {
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
    }
}

/// Response headers from an upstream that may go on to the client (gateway.md §14).
pub fn response_headers(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in from {
        if TO_CLIENT.contains(&name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// Builds a request the gateway makes on its own (a video task poll, a file download): no client
/// headers; a JSON body when given; the upstream's credential and extra headers unless
/// `credential` is false (a redirect that leaves the upstream's origin must not carry them).
pub fn build_call(
    upstream: &Upstream,
    method: Method,
    uri: Uri,
    request_id: &HeaderValue,
    body: Option<Bytes>,
    credential: bool,
) -> Result<Request<Full<Bytes>>, GatewayError> {
    // Room for what the gateway and a typical client set, so no insert grows the map.
    let mut headers = HeaderMap::with_capacity(12);
    if body.is_some() {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    headers.insert(HeaderName::from_static("x-request-id"), request_id.clone());
    if credential {
        add_credential(upstream, &mut headers);
    }
    // Set in place: the builder's parts go through a `Result` at every step.
    let mut req = Request::new(Full::new(body.unwrap_or_default()));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Ok(req)
}

/// Refuses an upstream answer that must not reach the client as it is (gateway.md §14): a
/// redirect (its `Location` is the upstream's business), a 401 or 403 (about the gateway's own
/// credential, not the client's key; the body may quote that credential, so it is not read), a
/// stream request answered with something other than an event stream, and a reply declared
/// larger than `max_reply`. The head is rewritten to HTTP/1.1, with the canonical reason phrase, so
/// an HTTP/1.0 upstream does not downgrade the client's response.
pub fn check_answer(
    upstream: &Upstream,
    mut resp: Response<UpstreamIncoming>,
    stream: bool,
    max_reply: u64,
) -> Result<Response<UpstreamIncoming>, GatewayError> {
    let status = resp.status();
    let bad = |kind: ErrorKind, msg: String| {
        Err(GatewayError::new(kind, msg).retryable(RetryClass::ServerError))
    };
    if status.is_redirection() {
        return bad(
            ErrorKind::UpstreamBadResponse,
            format!(
                "upstream {:?} answered with a redirect ({}); redirects are not followed",
                upstream.name,
                status.as_u16()
            ),
        );
    }
    if status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN {
        tracing::error!(upstream = %upstream.name, status = status.as_u16(), "the upstream refused the gateway's credential for it; check its api_key_env");
        return bad(
            ErrorKind::UpstreamAuthFailed,
            format!(
                "upstream {:?} refused the gateway's credential ({})",
                upstream.name,
                status.as_u16()
            ),
        );
    }
    let event_stream = crate::body::is_event_stream(resp.headers());
    if stream && status.is_success() && !event_stream {
        let got = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no content type")
            .chars()
            .take(64)
            .collect::<String>();
        return bad(
            ErrorKind::UpstreamBadResponse,
            format!(
                "upstream {:?} answered a stream request with {got:?}, not an event stream",
                upstream.name
            ),
        );
    }
    let declared = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if !event_stream && declared.is_some_and(|len| len > max_reply) {
        return Err(GatewayError::new(
            ErrorKind::UpstreamBadResponse,
            format!(
                "upstream {:?} sent a reply larger than the limit of {max_reply} bytes",
                upstream.name
            ),
        ));
    }
    *resp.version_mut() = http::Version::HTTP_11;
    // hyper would write an upstream's own reason phrase ("400 Bad") into the client's status line.
    resp.extensions_mut().remove::<hyper::ext::ReasonPhrase>();
    Ok(resp)
}
