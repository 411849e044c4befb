//! Gateway errors: one typed value per failure, rendered once, in the client protocol's own shape.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::boxed::{self, Body};

/// The error body a path answers with (gateway.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error":{"message","type","param","code"}}`: chat, responses, models, unknown base paths.
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`: `/v1/messages`.
    Anthropic,
    /// `{"code","msg","data":null}`: the video address.
    Video,
    /// Plain text: the admin address.
    Text,
}

/// Which side of the proxy failed; decides logging level and whether a retry could help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Upstream,
    Internal,
}

/// The failures before the first byte that another attempt could mend (gateway.md §10 `on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryClass {
    /// No connection could be made (refused, unreachable, TLS failed, connect timeout).
    Connect,
    /// The connection was made but no response head came within the first-byte timeout.
    Timeout,
    /// The upstream answered 429.
    RateLimited,
    /// The upstream answered 500, 502, 503, 504 or 529, or dropped the connection before a head.
    ServerError,
}

impl RetryClass {
    /// The class of an upstream status, if that status is worth another attempt.
    pub fn of_status(status: u16) -> Option<Self> {
        match status {
            429 => Some(Self::RateLimited),
            500 | 502 | 503 | 504 | 529 => Some(Self::ServerError),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::RateLimited => "429",
            Self::ServerError => "5xx",
        }
    }
}

/// What went wrong, closed list; each kind has one status and one name per error shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    ModelNotFound,
    /// A `previous_response_id` the key has no stored response for (OpenAI's own code).
    PreviousResponseNotFound,
    MethodNotAllowed,
    TooLarge,
    /// The client went silent while sending its request body.
    RequestTimeout,
    RateLimited,
    UpstreamUnreachable,
    UpstreamBadResponse,
    UpstreamTimeout,
    /// An upstream refused the gateway's own credential (its 401 or 403), or no token could be
    /// got for it: the gateway's fault to fix, never the client's key, so a 502.
    UpstreamAuthFailed,
    /// The shared store is unreachable and `[store] on_error = "deny"`.
    StoreUnavailable,
    Internal,
}

impl ErrorKind {
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NotFound | Self::ModelNotFound | Self::PreviousResponseNotFound => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Self::UpstreamUnreachable | Self::UpstreamBadResponse | Self::UpstreamAuthFailed => {
                StatusCode::BAD_GATEWAY
            }
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn side(self) -> Side {
        match self {
            Self::UpstreamUnreachable
            | Self::UpstreamBadResponse
            | Self::UpstreamTimeout
            | Self::UpstreamAuthFailed => Side::Upstream,
            Self::Internal | Self::StoreUnavailable => Side::Internal,
            _ => Side::Client,
        }
    }

    /// OpenAI's `error.type`.
    fn openai_type(self) -> &'static str {
        match self {
            Self::InvalidRequest
            | Self::NotFound
            | Self::ModelNotFound
            | Self::PreviousResponseNotFound
            | Self::MethodNotAllowed
            | Self::TooLarge
            | Self::RequestTimeout => "invalid_request_error",
            Self::Unauthorized => "authentication_error",
            Self::Forbidden => "permission_error",
            Self::RateLimited => "rate_limit_error",
            Self::UpstreamUnreachable
            | Self::UpstreamBadResponse
            | Self::UpstreamTimeout
            | Self::UpstreamAuthFailed => "upstream_error",
            Self::Internal | Self::StoreUnavailable => "server_error",
        }
    }

    /// OpenAI's `error.code`, a stable machine-readable name.
    fn openai_code(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_value",
            Self::Unauthorized => "invalid_api_key",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::ModelNotFound => "model_not_found",
            Self::PreviousResponseNotFound => "previous_response_not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::TooLarge => "request_too_large",
            Self::RequestTimeout => "request_timeout",
            Self::RateLimited => "rate_limit_exceeded",
            Self::UpstreamUnreachable => "upstream_unreachable",
            Self::UpstreamBadResponse => "upstream_bad_response",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::UpstreamAuthFailed => "upstream_auth_failed",
            Self::StoreUnavailable => "store_unavailable",
            Self::Internal => "internal_error",
        }
    }

    /// Anthropic's `error.type` (B.6 of the protocol reference).
    fn anthropic_type(self) -> &'static str {
        match self {
            Self::InvalidRequest | Self::MethodNotAllowed | Self::RequestTimeout => {
                "invalid_request_error"
            }
            Self::Unauthorized => "authentication_error",
            Self::Forbidden => "permission_error",
            Self::NotFound | Self::ModelNotFound | Self::PreviousResponseNotFound => {
                "not_found_error"
            }
            Self::TooLarge => "request_too_large",
            Self::RateLimited => "rate_limit_error",
            Self::UpstreamTimeout => "timeout_error",
            Self::StoreUnavailable => "overloaded_error",
            Self::UpstreamUnreachable
            | Self::UpstreamBadResponse
            | Self::UpstreamAuthFailed
            | Self::Internal => "api_error",
        }
    }

    /// The video envelope's code and short name (gateway.md §5).
    fn video_code(self) -> (u32, &'static str) {
        match self {
            Self::InvalidRequest => (100400, "INVALID_PARAMETER"),
            Self::Unauthorized => (100401, "UNAUTHORIZED"),
            Self::Forbidden => (100403, "FORBIDDEN"),
            Self::NotFound | Self::ModelNotFound | Self::PreviousResponseNotFound => {
                (100404, "NOT_FOUND")
            }
            Self::MethodNotAllowed => (100405, "METHOD_NOT_ALLOWED"),
            Self::TooLarge => (100413, "TOO_LARGE"),
            Self::RequestTimeout => (100408, "REQUEST_TIMEOUT"),
            Self::RateLimited => (100429, "RATE_LIMITED"),
            Self::Internal => (100500, "INTERNAL_ERROR"),
            Self::StoreUnavailable => (100503, "SERVICE_UNAVAILABLE"),
            Self::UpstreamUnreachable | Self::UpstreamBadResponse => (100502, "UPSTREAM_ERROR"),
            Self::UpstreamTimeout => (100504, "UPSTREAM_TIMEOUT"),
            Self::UpstreamAuthFailed => (100502, "UPSTREAM_AUTH_FAILED"),
        }
    }
}

/// A failure on the request path, made where it happens and rendered by the pipeline.
#[derive(Debug, Clone)]
pub struct GatewayError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault, as a path (`messages[2].content[0].type`).
    pub param: Option<String>,
    /// Headers that must survive into the answer (`allow` on 405).
    pub allow: Option<&'static str>,
    /// Set on upstream failures another attempt could mend.
    pub retry: Option<RetryClass>,
    /// The underlying cause (a transport error, a typed timeout), for logs and `Error::source`.
    pub source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl GatewayError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            param: None,
            allow: None,
            retry: None,
            source: None,
        }
    }

    /// A failure on the upstream side before its response head, with its cause.
    pub fn upstream(
        kind: ErrorKind,
        retry: RetryClass,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            retry: Some(retry),
            source: Some(Arc::new(source)),
            ..Self::new(kind, message)
        }
    }

    /// A 400 naming the field and what it allows.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message).with_param(param)
    }

    /// Marks the failure as one another attempt could mend.
    pub fn retryable(mut self, class: RetryClass) -> Self {
        self.retry = Some(class);
        self
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn method_not_allowed(allow: &'static str) -> Self {
        Self {
            allow: Some(allow),
            ..Self::new(
                ErrorKind::MethodNotAllowed,
                format!("method not allowed on this path; allowed: {allow}"),
            )
        }
    }

    pub fn side(&self) -> Side {
        self.kind.side()
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// Renders the error as a complete response in `shape`.
    pub fn into_response(self, shape: ErrorShape) -> Response<Body> {
        let (content_type, bytes) = self.render(shape);
        let mut resp = Response::new(boxed::full(bytes));
        *resp.status_mut() = self.status();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        if self.kind == ErrorKind::Unauthorized {
            // RFC 9110 §11.6.1: a 401 names the scheme the client should use.
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(allow) = self.allow {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }

    /// The body bytes and their content type for `shape`.
    pub fn render(&self, shape: ErrorShape) -> (&'static str, Bytes) {
        let value = match shape {
            ErrorShape::OpenAi => serde_json::json!({
                "error": {
                    "message": self.message,
                    "type": self.kind.openai_type(),
                    "param": self.param,
                    "code": self.kind.openai_code(),
                }
            }),
            ErrorShape::Anthropic => serde_json::json!({
                "type": "error",
                "error": {"type": self.kind.anthropic_type(), "message": self.message},
            }),
            ErrorShape::Video => {
                // Written by hand so the fields come in the envelope's own order: code, msg, data.
                let (code, name) = self.kind.video_code();
                let msg = serde_json::Value::String(format!("{name}: {}", self.message));
                let body = format!("{{\"code\":{code},\"msg\":{msg},\"data\":null}}");
                return ("application/json", Bytes::from(body));
            }
            ErrorShape::Text => {
                return (
                    "text/plain; charset=utf-8",
                    Bytes::from(format!("{}\n", self.message)),
                )
            }
        };
        ("application/json", Bytes::from(value.to_string()))
    }

    /// The in-stream error object of a chat stream (`data: {"error":{…}}`).
    pub fn openai_error_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind.openai_type(),
                "param": self.param,
                "code": self.kind.openai_code(),
            }
        })
    }
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{}: {}", p, self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for GatewayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
