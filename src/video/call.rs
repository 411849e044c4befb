//! Calls to video upstreams: send (counted in metrics), read a bounded answer under the idle timeout, and turn an upstream's error status into the client's error.

use crate::upstream::UpstreamIncoming;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use crate::body::{StreamGuard, UpstreamBody};
use crate::config::Upstream;
use crate::error::{ErrorKind, GatewayError};
use crate::gateway::Services;

/// The most the gateway reads of a JSON answer (a task, an operation without its inline video).
pub const JSON_LIMIT: usize = 4 << 20;

/// A failed video request: the error, and `retry-after` when an upstream's rate limit said when to come back.
#[derive(Debug, Clone)]
pub struct Failure {
    pub error: GatewayError,
    /// Boxed: a rare field, and the error type is returned by value on every video call.
    pub retry_after: Option<Box<HeaderValue>>,
}

impl From<GatewayError> for Failure {
    fn from(error: GatewayError) -> Self {
        Self {
            error,
            retry_after: None,
        }
    }
}

/// Puts the upstream's Google access token on `req`, for an upstream that gets its credential that way.
///
/// A token that cannot be had is a 502 `upstream_auth_failed`: the client learns whose setup
/// failed, the log learns why.
pub async fn authorize(
    gw: &Services,
    upstream: &Upstream,
    req: &mut Request<Full<Bytes>>,
) -> Result<(), Failure> {
    let Some(auth) = &upstream.google else {
        return Ok(());
    };
    match auth.authorization(&gw.client).await {
        Ok(value) => {
            req.headers_mut().insert(header::AUTHORIZATION, value);
            Ok(())
        }
        Err(e) => {
            tracing::warn!(upstream = %upstream.name, error = %e, "no Google access token");
            Err(GatewayError::new(
                ErrorKind::UpstreamAuthFailed,
                format!(
                    "the gateway could not get an access token for upstream {:?}; the cause is in the gateway's log",
                    upstream.name
                ),
            )
            .into())
        }
    }
}

/// `text` without the upstream's credential in it (`[redacted]`), wherever an upstream echoed it back.
pub fn scrub(upstream: &Upstream, text: &str) -> String {
    let mut out = match &upstream.google {
        Some(auth) => auth.scrub(text),
        None => text.to_owned(),
    };
    if let Some(secret) = upstream.quotable_credential() {
        out = String::from_utf8_lossy(&crate::body::redact(out.as_bytes(), secret)).into_owned();
    }
    out
}

/// [`detail`] of an upstream's error body, scrubbed of its credential before anything is cut.
pub fn safe_detail(upstream: &Upstream, body: &[u8]) -> String {
    // A token is base64url and dots: replacing it inside a JSON string keeps the JSON valid.
    detail(scrub(upstream, &String::from_utf8_lossy(body)).as_bytes())
}

/// Sends one request to `upstream` and waits for its head (first-byte timeout).
pub async fn send(
    gw: &Services,
    upstream: &Upstream,
    req: Request<Full<Bytes>>,
) -> Result<Response<UpstreamIncoming>, Failure> {
    // The Google token this request carries, if any: a 401 means that token is no good.
    let token = upstream
        .google
        .as_ref()
        .and_then(|auth| Some((auth, req.headers().get(header::AUTHORIZATION)?.clone())));
    let result = gw.client.send(upstream, req).await;
    gw.metrics
        .attempt(&upstream.name, if result.is_ok() { "ok" } else { "error" });
    let resp = result?;
    if let (StatusCode::UNAUTHORIZED, Some((auth, sent))) = (resp.status(), token) {
        auth.reject(&sent);
    }
    Ok(resp)
}

/// The upstream's body with the idle timeout between frames.
pub fn guarded(gw: &Services, body: UpstreamIncoming) -> UpstreamBody<UpstreamIncoming> {
    UpstreamBody::new(body, gw.limits.idle_timeout, StreamGuard::None)
}

/// Reads a whole answer of at most [`JSON_LIMIT`] bytes.
pub async fn read(
    gw: &Services,
    upstream: &Upstream,
    body: UpstreamIncoming,
) -> Result<Bytes, Failure> {
    match Limited::new(guarded(gw, body), JSON_LIMIT).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            let kind = match e.downcast_ref::<GatewayError>() {
                Some(g) => g.kind,
                None => ErrorKind::UpstreamBadResponse,
            };
            Err(GatewayError::new(
                kind,
                format!("reading the answer of upstream {:?}: {e}", upstream.name),
            )
            .into())
        }
    }
}

/// The client's error for an upstream's 4xx/5xx: its status kept where the envelope has a code
/// for it, its own message quoted (any credential in it scrubbed), `retry-after` kept.
///
/// A 401 or 403 is about the gateway's own credential (the client's never reaches an upstream):
/// a 502 `upstream_auth_failed` whose body quotes nothing of the upstream's, the cause logged.
pub fn upstream_error(
    upstream: &Upstream,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Failure {
    if matches!(status.as_u16(), 401 | 403) {
        tracing::warn!(
            upstream = %upstream.name,
            status = status.as_u16(),
            detail = %safe_detail(upstream, body),
            "the upstream refused the gateway's credential"
        );
        return GatewayError::new(
            ErrorKind::UpstreamAuthFailed,
            format!(
                "upstream {:?} refused the gateway's credential for it (HTTP {}); the cause is in the gateway's log",
                upstream.name,
                status.as_u16()
            ),
        )
        .into();
    }
    let kind = match status.as_u16() {
        404 => ErrorKind::NotFound,
        405 => ErrorKind::MethodNotAllowed,
        413 => ErrorKind::TooLarge,
        429 => ErrorKind::RateLimited,
        504 => ErrorKind::UpstreamTimeout,
        400..=499 => ErrorKind::InvalidRequest,
        // An upstream's 500 is not a gateway bug: 502 says whose failure it is.
        _ => ErrorKind::UpstreamBadResponse,
    };
    Failure {
        error: GatewayError::new(
            kind,
            format!(
                "upstream {:?} answered {}: {}",
                upstream.name,
                status.as_u16(),
                safe_detail(upstream, body)
            ),
        ),
        retry_after: headers.get(header::RETRY_AFTER).cloned().map(Box::new),
    }
}

/// The human part of an error body: Google's `error.message`, the envelope's `msg`, or the text itself.
pub fn detail(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("msg"))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(serde_json::Value::as_str);
        if let Some(s) = found {
            return clip(s);
        }
    }
    let text = String::from_utf8_lossy(body);
    if text.trim().is_empty() {
        "(no body)".to_owned()
    } else {
        clip(text.trim())
    }
}

fn clip(s: &str) -> String {
    const MAX: usize = 300;
    match s.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (a path segment, a GCS object name).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An internal error for a URL that could not be built from config and upstream data.
pub fn bad_url(upstream: &Upstream, e: impl std::fmt::Display) -> Failure {
    GatewayError::new(
        ErrorKind::UpstreamBadResponse,
        format!("cannot build a URL for upstream {:?}: {e}", upstream.name),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_and_encoding() {
        assert_eq!(
            detail(br#"{"error":{"code":400,"message":"bad prompt"}}"#),
            "bad prompt"
        );
        assert_eq!(
            detail(br#"{"code":100400,"msg":"INVALID_PARAMETER: x"}"#),
            "INVALID_PARAMETER: x"
        );
        assert_eq!(detail(b"  "), "(no body)");
        assert_eq!(detail("é".repeat(400).as_bytes()).chars().count(), 301);
        assert_eq!(encode_component("a b/c~d.mp4"), "a%20b%2Fc~d.mp4");
    }
}
