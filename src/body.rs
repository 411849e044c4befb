//! Response bodies: the boxed body type, and the upstream body wrapper that enforces the idle timeout and never lets a stream end silently.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::error::{ErrorKind, GatewayError};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response the gateway sends.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn empty() -> Body {
    full(Bytes::new())
}

/// How a stream reports a failure after its first byte, in the client's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamGuard {
    /// Not a stream (or not ours to police): errors abort the body.
    None,
    /// Chat completions: must end with `data: [DONE]`; a break becomes an error chunk and `[DONE]`.
    Chat,
}

/// Holds the last bytes of a stream, enough to see whether it ended with its terminator.
#[derive(Default)]
struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    const KEEP: usize = 32;

    fn push(&mut self, data: &[u8]) {
        let take = data.len().min(Self::KEEP);
        self.buf.extend_from_slice(&data[data.len() - take..]);
        if self.buf.len() > Self::KEEP {
            let cut = self.buf.len() - Self::KEEP;
            self.buf.drain(..cut);
        }
    }

    fn trimmed(&self) -> &[u8] {
        let end = self
            .buf
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |p| p + 1);
        &self.buf[..end]
    }

    fn ends_event(&self) -> bool {
        self.buf.is_empty() || self.buf.ends_with(b"\n\n") || self.buf.ends_with(b"\r\n\r\n")
    }
}

pin_project! {
    /// Wraps an upstream body: resets an idle timer on every frame and, for streams, turns a
    /// break (transport error, idle timeout, end without terminator) into the protocol's error.
    pub struct UpstreamBody<B> {
        #[pin]
        inner: B,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        guard: StreamGuard,
        tail: Tail,
        done: bool,
    }
}

impl<B> UpstreamBody<B> {
    pub fn new(inner: B, idle_timeout: Duration, guard: StreamGuard) -> Self {
        Self {
            inner,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            guard,
            tail: Tail::default(),
            done: false,
        }
    }
}

/// The closing bytes of a broken chat stream: an error chunk the SDKs raise on, then `[DONE]`.
pub fn chat_stream_error(err: &GatewayError, at_event_boundary: bool) -> Bytes {
    let mut out = Vec::with_capacity(256);
    if !at_event_boundary {
        out.extend_from_slice(b"\n\n");
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(err.openai_error_json().to_string().as_bytes());
    out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    Bytes::from(out)
}

impl<B> HttpBody for UpstreamBody<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        let failure = match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.idle
                    .as_mut()
                    .reset(Instant::now() + *this.idle_timeout);
                if *this.guard == StreamGuard::Chat {
                    if let Some(data) = frame.data_ref() {
                        this.tail.push(data);
                    }
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                GatewayError::new(
                    ErrorKind::UpstreamBadResponse,
                    format!("the upstream stream broke: {e}"),
                )
            }
            Poll::Ready(None) => {
                *this.done = true;
                if *this.guard == StreamGuard::Chat && !this.tail.trimmed().ends_with(b"[DONE]") {
                    GatewayError::new(
                        ErrorKind::UpstreamBadResponse,
                        "the upstream stream ended before it was complete",
                    )
                } else {
                    return Poll::Ready(None);
                }
            }
            Poll::Pending => {
                ready!(this.idle.as_mut().poll(cx));
                GatewayError::new(
                    ErrorKind::UpstreamTimeout,
                    format!(
                        "the upstream sent nothing for {} ms",
                        this.idle_timeout.as_millis()
                    ),
                )
            }
        };
        *this.done = true;
        tracing::warn!(error = %failure, "upstream body failed");
        match this.guard {
            StreamGuard::Chat => {
                let bytes = chat_stream_error(&failure, this.tail.ends_event());
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            StreamGuard::None => Poll::Ready(Some(Err(Box::new(failure)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.guard == StreamGuard::None && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match self.guard {
            // A guarded stream may grow by an error chunk, so its length is never exact.
            StreamGuard::Chat => SizeHint::default(),
            StreamGuard::None => self.inner.size_hint(),
        }
    }
}
