//! The one body type every response has, and whole-body constructors: a leaf that errors and streaming bodies both build on.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response the gateway sends.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A JSON value's compact text as a whole body.
pub fn json(value: &serde_json::Value) -> Body {
    full(crate::json::to_bytes(value))
}

pub fn empty() -> Body {
    full(Bytes::new())
}
