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
use smallvec::SmallVec;

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

/// An upstream response body, from whichever client carried the request. The shared client's
/// body is boxed: it is larger than the plain one (136 bytes against 80), and every answer is
/// moved several times on its way to the client.
pub enum UpstreamIncoming {
    Plain(h1::PooledBody),
    Shared(Box<Coalesce<Incoming>>),
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
            Self::Shared(b) => Pin::new(&mut **b).poll_frame(cx).map_err(BodyError::Shared),
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
        let fut = std::pin::pin!(async {
            if plain {
                match self.plain.send(req).await {
                    Ok(resp) => Ok(resp.map(UpstreamIncoming::Plain)),
                    Err(e) => Err(classify_plain(upstream, e)),
                }
            } else {
                self.shared(upstream, req).await
            }
        });
        self.timed(upstream, fut).await
    }

    /// Sends a client's request, `body` with `headers`, as a POST to `uri`; to a plain-HTTP
    /// upstream its head is written straight from `headers`, with no request built first.
    pub async fn send_forward(
        &self,
        upstream: &Upstream,
        uri: Uri,
        headers: Headers<'_>,
        body: Bytes,
    ) -> Result<Response<UpstreamIncoming>, GatewayError> {
        let name = &*upstream.name;
        let plain = uri.scheme() == Some(&http::uri::Scheme::HTTP);
        // One future for both ways, so the request's future is sized for the larger, not both;
        // pinned where it is made, so that it is not moved again into the timeout's.
        let fut = std::pin::pin!(async move {
            if plain {
                let emit = |e: &mut h1::codec::Emit<'_>| headers.each(e);
                // Only what may reach the client is read of the answer's head: nothing the
                // pipeline reads of a forwarded answer is outside `TO_CLIENT`.
                let keep = h1::codec::Keep::Only(&TO_CLIENT);
                match self
                    .plain
                    .send_with(&Method::POST, &uri, emit, body, keep)
                    .await
                {
                    Ok(resp) => Ok(resp.map(UpstreamIncoming::Plain)),
                    Err(e) => Err(classify_plain(name, e)),
                }
            } else {
                let req = request(Method::POST, uri, headers.to_map(), body);
                self.shared(name, req).await
            }
        });
        self.timed(name, fut).await
    }

    async fn shared(
        &self,
        upstream: &str,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamIncoming>, GatewayError> {
        match self.client.request(req).await {
            Ok(resp) => Ok(resp.map(|b| UpstreamIncoming::Shared(Box::new(Coalesce::new(b))))),
            Err(e) => Err(classify(upstream, e)),
        }
    }

    /// `fut`, given up once the first-byte timeout passes. It is taken pinned, by reference:
    /// an upstream call's future is large, and moved into this one it would be copied whole.
    async fn timed(
        &self,
        upstream: &str,
        fut: std::pin::Pin<
            &mut impl std::future::Future<Output = Result<Response<UpstreamIncoming>, GatewayError>>,
        >,
    ) -> Result<Response<UpstreamIncoming>, GatewayError> {
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

/// The headers of a request to an upstream, handed out one by one with no map between, so the
/// plain-HTTP client writes them straight onto the wire: the gateway's own (the body's type, the
/// request id, and unless leaving the upstream's origin its credential, its configured headers
/// and Anthropic's version), then the client's that may go on.
///
/// Where both set a header, the gateway's wins; except a client's Anthropic version and betas,
/// which win over the config's (defaults). A repeated client header keeps every value. Of the
/// gateway's own, a configured header wins over a built-in one of the same name.
pub struct Headers<'a> {
    upstream: &'a Upstream,
    request_id: &'a HeaderValue,
    json_body: bool,
    credential: bool,
    client: Option<&'a HeaderMap>,
}

impl<'a> Headers<'a> {
    /// The headers of a call the gateway makes on its own (no client headers).
    pub fn call(
        upstream: &'a Upstream,
        request_id: &'a HeaderValue,
        json_body: bool,
        credential: bool,
    ) -> Self {
        Self {
            upstream,
            request_id,
            json_body,
            credential,
            client: None,
        }
    }

    /// The headers of a client's request (a JSON body) on its way to `upstream`.
    pub fn forward(
        upstream: &'a Upstream,
        request_id: &'a HeaderValue,
        client: &'a HeaderMap,
    ) -> Self {
        Self {
            upstream,
            request_id,
            json_body: true,
            credential: true,
            client: Some(client),
        }
    }

    /// The header the upstream's credential goes in, when it has one and it is sent.
    fn credential_name(&self) -> Option<HeaderName> {
        self.upstream
            .credential
            .as_ref()
            .filter(|_| self.credential)?;
        Some(match self.upstream.kind {
            UpstreamKind::Messages => HeaderName::from_static("x-api-key"),
            UpstreamKind::VeoGemini => HeaderName::from_static("x-goog-api-key"),
            _ => header::AUTHORIZATION,
        })
    }

    fn configured(&self, name: &HeaderName) -> bool {
        self.credential && self.upstream.headers.iter().any(|(n, _)| n == name)
    }

    fn anthropic_default(&self) -> bool {
        self.credential && self.upstream.kind == UpstreamKind::Messages
    }

    /// True when the gateway sets `name` itself.
    fn ours(&self, name: &HeaderName, credential: Option<&HeaderName>) -> bool {
        (self.json_body && name == header::CONTENT_TYPE)
            || name.as_str() == "x-request-id"
            || credential == Some(name)
            || self.configured(name)
            || (self.anthropic_default() && name.as_str() == "anthropic-version")
    }

    /// Hands every header to `emit`, in the order they go out.
    pub fn each(&self, emit: &mut h1::codec::Emit<'_>) {
        let up = self.upstream;
        let listed = self.client.map(connection_listed).unwrap_or_default();
        let forwarded = |name: &HeaderName| {
            !never_forwarded(name)
                && forwarded_to(up, name)
                && !listed.iter().any(|l| l == name.as_str())
        };
        // A client's Anthropic version or beta replaces a default of the gateway's.
        let client_wins = |name: &HeaderName| {
            name.as_str().starts_with("anthropic-")
                && (self.configured(name) || name.as_str() == "anthropic-version")
                && self.client.is_some_and(|c| c.contains_key(name))
                && forwarded(name)
        };
        let credential = self.credential_name();
        let mut own = |name: &HeaderName, value: &HeaderValue| {
            if !client_wins(name) {
                emit(name, value);
            }
        };
        if self.json_body && !self.configured(&header::CONTENT_TYPE) {
            own(
                &header::CONTENT_TYPE,
                &HeaderValue::from_static("application/json"),
            );
        }
        let request_id = HeaderName::from_static("x-request-id");
        if !self.configured(&request_id) {
            own(&request_id, self.request_id);
        }
        if let (Some(name), Some(cred)) = (&credential, &up.credential) {
            if !self.configured(name) {
                own(name, cred.header_value());
            }
        }
        if self.credential {
            for (i, (name, value)) in up.headers.iter().enumerate() {
                // Two spellings of one name in the config: the last is the one set.
                if !up.headers[i + 1..].iter().any(|(n, _)| n == name) {
                    own(name, value);
                }
            }
        }
        let version = HeaderName::from_static("anthropic-version");
        if self.anthropic_default() && !self.configured(&version) {
            own(&version, &HeaderValue::from_static(ANTHROPIC_VERSION));
        }
        let Some(client) = self.client else {
            return;
        };
        for (name, value) in client {
            if forwarded(name) && (!self.ours(name, credential.as_ref()) || client_wins(name)) {
                emit(name, value);
            }
        }
    }

    /// The headers in a map, for a client that takes one.
    pub fn to_map(&self) -> HeaderMap {
        // Room for what the gateway and a typical client set, so no insert grows the map.
        let mut map = HeaderMap::with_capacity(12);
        self.each(&mut |name, value| {
            map.append(name.clone(), value.clone());
        });
        map
    }
}

/// Builds the upstream request: the allowed client headers, the upstream's credential and headers.
pub fn build_request(
    upstream: &Upstream,
    uri: Uri,
    client_headers: &HeaderMap,
    request_id: &HeaderValue,
    body: Bytes,
) -> Request<Full<Bytes>> {
    let headers = Headers::forward(upstream, request_id, client_headers);
    request(Method::POST, uri, headers.to_map(), body)
}

fn request(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Request<Full<Bytes>> {
    // Set in place: the builder's parts go through a `Result` at every step.
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req
}

/// [`TO_CLIENT`] as header names, made once.
const TO_CLIENT_NAMES: [HeaderName; TO_CLIENT.len()] = [
    HeaderName::from_static(TO_CLIENT[0]),
    HeaderName::from_static(TO_CLIENT[1]),
    HeaderName::from_static(TO_CLIENT[2]),
    HeaderName::from_static(TO_CLIENT[3]),
    HeaderName::from_static(TO_CLIENT[4]),
];

const FRAMING_LEN: usize = 3;

/// The headers that frame an answer's body on the upstream's connection: never a client's.
const FRAMING: [HeaderName; FRAMING_LEN] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
];

/// Keeps of an upstream's response headers only those that may go on to the client
/// (gateway.md §14), in the map they came in: a new map would be two allocations per request.
/// One pass over the head; only the kept values are hashed again.
pub fn keep_response_headers(headers: &mut HeaderMap) {
    // The usual head, all the gateway's own client keeps of an answer: allowed names and the
    // framing headers, which are taken out by name (a lookup each) rather than the map drained
    // and filled again (about 500 instructions a reply). A plain upstream's head comes without
    // framing headers: its codec reads them and leaves them out.
    let mut framing = [false; FRAMING_LEN];
    let usual = headers
        .keys()
        .all(|name| match FRAMING.iter().position(|f| f == name) {
            Some(i) => {
                framing[i] = true;
                true
            }
            None => TO_CLIENT.contains(&name.as_str()),
        });
    if usual {
        for (name, present) in FRAMING.iter().zip(framing) {
            if present {
                headers.remove(name);
            }
        }
        return;
    }
    let mut kept: SmallVec<[(usize, HeaderValue); 4]> = SmallVec::new();
    let mut allowed = None;
    // `drain` names a header once, before the first of its values.
    for (name, value) in headers.drain() {
        if let Some(name) = name {
            allowed = TO_CLIENT.iter().position(|t| *t == name.as_str());
        }
        if let Some(i) = allowed {
            kept.push((i, value));
        }
    }
    for (i, value) in kept {
        headers.append(TO_CLIENT_NAMES[i].clone(), value);
    }
}

/// Response headers from an upstream that may go on to the client, in a map of their own: the
/// reference the in-place filter is tested against.
#[cfg(test)]
fn response_headers(from: &HeaderMap) -> HeaderMap {
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
) -> Request<Full<Bytes>> {
    let headers = Headers::call(upstream, request_id, body.is_some(), credential);
    request(method, uri, headers.to_map(), body.unwrap_or_default())
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
    // The body's length as its framing gives it: a plain upstream's head keeps no framing
    // headers in its map.
    let declared = http_body::Body::size_hint(resp.body()).exact();
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    /// The in-place filter keeps what a new map of the allowed headers would hold: each name
    /// with all its values in order (the order between names is not HTTP's business).
    #[test]
    fn response_headers_are_kept_in_place_as_a_new_map_would_hold_them() {
        let by_name = |m: &HeaderMap| {
            let mut names: Vec<(String, Vec<Vec<u8>>)> = m
                .keys()
                .map(|n| {
                    let values = m.get_all(n).iter().map(|v| v.as_bytes().to_vec());
                    (n.as_str().to_owned(), values.collect())
                })
                .collect();
            names.sort();
            names
        };
        let cases: &[&[(&str, &str)]] = &[
            &[],
            &[("date", "x"), ("server", "y"), ("content-length", "5")],
            &[("content-type", "application/json"), ("date", "x")],
            &[
                ("x-request-id", "up-1"),
                ("connection", "keep-alive"),
                ("content-type", "text/event-stream"),
                ("retry-after", "3"),
                ("request-id", "r"),
                ("content-encoding", "gzip"),
                ("set-cookie", "a=b"),
            ],
            // Repeated: every value, in order.
            &[
                ("content-encoding", "gzip"),
                ("x-a", "1"),
                ("content-encoding", "br"),
                ("content-type", "a/b"),
            ],
            &[("retry-after", "1"), ("retry-after", "2")],
            // The usual head: allowed names and the framing headers only.
            &[("content-type", "a/b"), ("content-length", "12")],
            &[
                ("transfer-encoding", "chunked"),
                ("content-type", "text/event-stream"),
                ("connection", "keep-alive"),
                ("x-request-id", "r"),
                ("connection", "x-a"),
            ],
            &[("content-length", "0")],
            &[],
        ];
        for case in cases {
            let mut map = HeaderMap::new();
            for (n, v) in *case {
                map.append(HeaderName::from_static(n), HeaderValue::from_static(v));
            }
            let want = response_headers(&map);
            keep_response_headers(&mut map);
            assert_eq!(by_name(&map), by_name(&want), "{case:?}");
            assert!(
                map.keys().all(|n| TO_CLIENT.contains(&n.as_str())),
                "{case:?}"
            );
        }
    }

    fn upstream(kind: &str, extra: &str) -> Arc<Upstream> {
        let text = format!(
            "[listen]\nbase = \"127.0.0.1:8080\"\n[[upstreams]]\nname = \"u\"\nkind = \"{kind}\"\n\
             base_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"K\"\n{extra}\n\
             [[models]]\nname = \"m\"\nupstream = \"u\"\n"
        );
        let env = |name: &str| (name == "K").then(|| "sk-up".to_owned());
        let config = crate::config::Config::parse(&text, std::path::Path::new("."), &env).unwrap();
        config.upstreams[0].clone()
    }

    fn emitted(h: &Headers<'_>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        h.each(&mut |n, v| out.push((n.to_string(), v.to_str().unwrap().to_owned())));
        out
    }

    /// The headers an upstream gets, as the wire writer and the map both see them: the
    /// gateway's own first, a client's Anthropic version and betas over the config's defaults,
    /// the gateway's other headers over the client's, every value of a repeated client header,
    /// and nothing hop-by-hop, listed in `connection`, or not meant for upstreams.
    #[test]
    fn the_gateway_and_client_headers_merge_by_their_rules() {
        let up = upstream(
            "messages",
            "headers = { \"anthropic-beta\" = \"config-beta\", \"x-team\" = \"t1\" }",
        );
        let mut client = HeaderMap::new();
        for (n, v) in [
            ("anthropic-beta", "b1"),
            ("anthropic-beta", "b2"),
            ("x-request-id", "client-id"),
            ("content-type", "text/plain"),
            ("user-agent", "ua"),
            ("connection", "keep-alive, accept"),
            ("accept", "*/*"),
            ("cookie", "c=1"),
            ("authorization", "Bearer client-key"),
        ] {
            client.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let id = HeaderValue::from_static("gw-id");
        let headers = Headers::forward(&up, &id, &client);
        let got = emitted(&headers);
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            got,
            pairs(&[
                ("content-type", "application/json"),
                ("x-request-id", "gw-id"),
                ("x-api-key", "sk-up"),
                ("x-team", "t1"),
                ("anthropic-version", ANTHROPIC_VERSION),
                ("anthropic-beta", "b1"),
                ("anthropic-beta", "b2"),
                ("user-agent", "ua"),
            ])
        );
        let map = headers.to_map();
        let from_map: Vec<(String, String)> = map
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let (mut a, mut b) = (got.clone(), from_map);
        a.sort();
        b.sort();
        assert_eq!(a, b);

        // A call that leaves the upstream's origin carries nothing of the upstream's.
        let call = Headers::call(&up, &id, false, false);
        assert_eq!(emitted(&call), pairs(&[("x-request-id", "gw-id")]));
    }
}
