//! Response bodies: the boxed body type, an upstream's answer as the pipeline holds it, and the upstream body wrapper that enforces the idle timeout and never lets a stream end silently.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::error::{ErrorKind, GatewayError};
use crate::observe::Fate;

pub use crate::boxed::{empty, full, json, Body, BoxError};

/// How a passed-through stream reports a failure after its first byte, in the client's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamGuard {
    /// Not a stream (or not ours to police): errors abort the body.
    None,
    /// Chat completions: must reach `data: [DONE]`; a break becomes an error chunk and `[DONE]`.
    Chat,
    /// Anthropic messages: must reach `message_stop`; a break becomes an `error` event.
    Messages,
    /// OpenAI responses: must reach a terminal `response.*` event; a break becomes an `error` event.
    Responses,
}

impl StreamGuard {
    /// Lines whose presence means the stream reached its own end (or its own error). Each counts
    /// only at a line start (after a `\n` or `\r` line end): text inside a JSON payload cannot
    /// contain a raw line break, so a model that writes "[DONE]" or "message_stop" in its answer
    /// is not mistaken for the end.
    fn terminals(self) -> &'static [&'static [u8]] {
        match self {
            Self::None => &[],
            Self::Chat => &[b"data: [DONE]", b"data:[DONE]"],
            Self::Messages => &[b"event: message_stop", b"event: error"],
            Self::Responses => &[
                b"event: response.completed",
                b"event: response.incomplete",
                b"event: response.failed",
                b"event: error",
            ],
        }
    }

    fn error_bytes(self, err: &GatewayError, at_event_boundary: bool) -> Bytes {
        let mut out = Vec::with_capacity(256);
        if !at_event_boundary {
            out.extend_from_slice(b"\n\n");
        }
        match self {
            Self::Chat | Self::None => {
                crate::sse::write_json_event(&mut out, None, &err.openai_error_json());
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Self::Messages => {
                let body = serde_json::json!({"type": "error", "error": {"type": "api_error", "message": err.message}});
                crate::sse::write_json_event(&mut out, Some("error"), &body);
            }
            Self::Responses => {
                let body = serde_json::json!({"type": "error", "code": "upstream_error", "message": err.message, "param": null, "sequence_number": 0,
                    "error": {"type": "upstream_error", "code": "upstream_error", "message": err.message}});
                crate::sse::write_json_event(&mut out, Some("error"), &body);
            }
        }
        Bytes::from(out)
    }
}

/// One pass over a stream's bytes: where its events end (for the event limit, and for an error
/// event written later) and whether a line has started with one of its terminal markers.
#[derive(Debug)]
struct StreamScan {
    ends: crate::sse::EventEnds,
    /// The first bytes of the current line, while it may still turn out to be a marker: a line
    /// that begins at the end of one frame is finished by the next.
    head: [u8; Self::HEAD],
    head_len: usize,
    head_open: bool,
}

impl Default for StreamScan {
    /// Starts as if after a line break, so a marker on the stream's first line is found too.
    fn default() -> Self {
        Self {
            ends: crate::sse::EventEnds::default(),
            head: [0; Self::HEAD],
            head_len: 0,
            head_open: true,
        }
    }
}

impl StreamScan {
    /// Longer than every terminal marker.
    const HEAD: usize = 32;

    /// Feeds the next frame. Returns where the last event that ends in it ends, and whether a
    /// line in it (or one begun before it) starts with one of `markers`. A line starts after a
    /// `\n` or a `\r` (SSE's three line ends: in a CRLF the `\r` is followed by the `\n`, never by
    /// a marker). Text inside a JSON payload holds no raw line break, so a marker written inside
    /// an answer is never at a line start.
    fn feed(&mut self, data: &[u8], markers: &[&[u8]]) -> (Option<usize>, bool) {
        if self.ends.lf_only(data) {
            return self.feed_lf(data, markers);
        }
        let mut found = false;
        let mut first_break = None;
        let mut last_end = None;
        let mut last_line = None;
        self.ends.feed_lines(
            data,
            |end| last_end = Some(end),
            |start| {
                first_break = first_break.or(Some(start - 1));
                found = found || starts_with_any(&data[start..], markers);
                last_line = Some(start);
            },
        );
        found |= self.carry_head(data, markers, first_break, last_line);
        (last_end, found)
    }

    /// [`feed`](Self::feed) for a frame whose lines all end with LF: the markers are searched
    /// for over the whole frame ([`MarkerSearch`]), and the last event end from the frame's end,
    /// instead of visiting every line.
    fn feed_lf(&mut self, data: &[u8], markers: &[&[u8]]) -> (Option<usize>, bool) {
        let last_end = self.ends.feed_lf_whole(data);
        let mut found = !markers.is_empty() && marker_search(markers).found_in(data);
        let first_break = memchr::memchr(b'\n', data);
        let last_line = memchr::memrchr(b'\n', data).map(|i| i + 1);
        found |= self.carry_head(data, markers, first_break, last_line);
        (last_end, found)
    }

    /// Checks the line that was in progress when the frame began (its start may be in an
    /// earlier frame) and keeps the start of the frame's last line for the next frame. True
    /// when the line in progress turned out to be a marker.
    fn carry_head(
        &mut self,
        data: &[u8],
        markers: &[&[u8]],
        first_break: Option<usize>,
        last_line: Option<usize>,
    ) -> bool {
        let mut found = false;
        if self.head_open && !markers.is_empty() {
            // The line in progress at the frame's start began less than HEAD bytes ago.
            let line = &data[..first_break.unwrap_or(data.len())];
            if self.head_len == 0 {
                // It begins here (the usual frame: whole events), so nothing needs copying.
                found = starts_with_any(line, markers);
                if last_line.is_none() {
                    self.head_len = line.len().min(Self::HEAD);
                    self.head[..self.head_len].copy_from_slice(&line[..self.head_len]);
                }
            } else {
                let take = line.len().min(Self::HEAD - self.head_len);
                self.head[self.head_len..self.head_len + take].copy_from_slice(&line[..take]);
                self.head_len += take;
                found = starts_with_any(&self.head[..self.head_len], markers);
            }
        }
        // Whether the last line of this frame may still become a marker with the next frame.
        match last_line {
            Some(start) if data.len() - start < Self::HEAD => {
                self.head_len = data.len() - start;
                self.head[..self.head_len].copy_from_slice(&data[start..]);
                self.head_open = true;
            }
            Some(_) => self.head_open = false,
            None => self.head_open = self.head_open && self.head_len < Self::HEAD,
        }
        found
    }

    /// True when what passed ends at an event's end, whichever of the three line ends close it.
    fn ends_event(&self) -> bool {
        self.ends.at_event_end()
    }
}

/// True when `line` starts with one of `markers`. The marker's last byte is compared first: an
/// ordinary line (`data: {...`) fails there without a full comparison.
fn starts_with_any(line: &[u8], markers: &[&[u8]]) -> bool {
    markers.iter().any(|m| {
        m.last()
            .is_some_and(|b| line.get(m.len() - 1) == Some(b) && line.starts_with(m))
    })
}

type Finder = memchr::memmem::Finder<'static>;

/// How a frame is searched for a guard's terminal markers at line starts after LF: one search
/// for a piece every marker holds (`[DONE]`, or `\nevent: `), each hit then checked against the
/// markers, so a frame is passed over once whatever the number of markers.
#[derive(Clone)]
struct MarkerSearch {
    key: Finder,
    /// Each marker with the LF before it, and where `key` sits in that.
    markers: Vec<(Vec<u8>, usize)>,
}

impl MarkerSearch {
    fn new(key: &[u8], markers: &[&[u8]]) -> Self {
        let needles: Vec<Vec<u8>> = markers
            .iter()
            .map(|m| [b"\n".as_slice(), m].concat())
            .collect();
        // A key some marker lacks would miss it: the line break every needle starts with is
        // searched for instead.
        let key = match needles
            .iter()
            .all(|n| memchr::memmem::find(n, key).is_some())
        {
            true => key,
            false => b"\n",
        };
        let markers = needles
            .into_iter()
            .map(|n| {
                let at = memchr::memmem::find(&n, key).unwrap_or(0);
                (n, at)
            })
            .collect();
        Self {
            key: memchr::memmem::Finder::new(key).into_owned(),
            markers,
        }
    }

    fn found_in(&self, data: &[u8]) -> bool {
        self.key.find_iter(data).any(|hit| {
            self.markers
                .iter()
                .any(|(needle, at)| hit >= *at && data[hit - at..].starts_with(needle))
        })
    }
}

/// The search for `markers`: built once for each guard's terminals; another list (only tests
/// pass one) gets a search keyed on the line break itself.
fn marker_search(markers: &[&[u8]]) -> std::borrow::Cow<'static, MarkerSearch> {
    static BUILT: std::sync::LazyLock<Vec<MarkerSearch>> = std::sync::LazyLock::new(|| {
        vec![
            MarkerSearch::new(b"[DONE]", StreamGuard::Chat.terminals()),
            MarkerSearch::new(b"\nevent: ", StreamGuard::Messages.terminals()),
            MarkerSearch::new(b"\nevent: ", StreamGuard::Responses.terminals()),
        ]
    });
    let guards = [
        StreamGuard::Chat,
        StreamGuard::Messages,
        StreamGuard::Responses,
    ];
    match guards.iter().position(|g| g.terminals() == markers) {
        Some(i) => std::borrow::Cow::Borrowed(&BUILT[i]),
        None => std::borrow::Cow::Owned(MarkerSearch::new(b"\n", markers)),
    }
}

/// The size limit an [`UpstreamBody`] enforces (gateway.md §14).
#[derive(Debug, Clone, Copy)]
pub enum SizeLimit {
    /// A whole reply: at most this many bytes.
    Reply(u64),
    /// A stream: no event longer than this.
    Event(usize),
    /// None here: a translated stream's events are bounded by its translator.
    Unbounded,
}

/// A streamed body was silent for `[limits] idle_timeout_ms`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no body bytes for {} ms", .0.as_millis())]
pub struct IdleTimeout(pub Duration);

impl IdleTimeout {
    /// The 504 a body silent this long ends with, with this timeout as its source.
    fn error(self) -> GatewayError {
        GatewayError {
            source: Some(std::sync::Arc::new(self)),
            ..GatewayError::new(
                ErrorKind::UpstreamTimeout,
                format!("the upstream sent nothing for {} ms", self.0.as_millis()),
            )
        }
    }
}

/// Logs how an upstream body failed and tells the request's fate, when it has one.
fn tell_failure(failure: &GatewayError, fate: Option<&Fate>) {
    tracing::warn!(error = %failure, "upstream body failed");
    match (fate, failure.kind) {
        (Some(fate), ErrorKind::UpstreamTimeout) => fate.timeout(),
        (Some(fate), _) => fate.upstream_error(),
        (None, _) => {}
    }
}

pin_project! {
    /// Wraps an upstream body: resets an idle timer on every frame and, for streams, turns a
    /// break (transport error, idle timeout, end without terminator) into the protocol's error.
    pub struct UpstreamBody<B> {
        #[pin]
        inner: B,
        // Armed when the body is first waited for, and not moved with every frame: when it
        // fires, it is moved to `last_frame` plus the timeout if a frame came since (a reset
        // per frame cost more than the rest of the frame's own checks). A reply whose frames
        // are all ready when asked for (most JSON replies) never sets it.
        #[pin]
        idle: Option<Sleep>,
        idle_timeout: Duration,
        // When the body last went quiet after a frame, `None` once a frame comes: the clock is
        // read once per wait, not once per frame, so a run of ready frames costs no clock
        // reads. It is the last frame's time to within the time those frames took to pass.
        last_frame: Option<Instant>,
        guard: StreamGuard,
        scan: StreamScan,
        // What the client got so far ends at an event's end: an error event needs no blank
        // line before it. A frame refused by a limit is scanned but never sent.
        sent_ends_event: bool,
        terminal_seen: bool,
        done: bool,
        fate: Option<Fate>,
        limits: BodyLimits,
    }
}

/// Size limits on what an upstream sends (gateway.md §14), checked frame by frame.
#[derive(Debug, Default)]
struct BodyLimits {
    /// Bytes a non-streamed reply may still send; `None` for streams and unlimited bodies.
    reply_left: Option<u64>,
    reply_max: u64,
    /// The longest one event of a stream may be; `None` when not a stream.
    event_max: Option<usize>,
    /// Bytes since the last event boundary seen.
    event_len: usize,
}

impl BodyLimits {
    /// `last_end`: where the last event ending in `data` ends, from the stream's scan.
    fn check(&mut self, data: &[u8], last_end: Option<usize>) -> Option<GatewayError> {
        if let Some(left) = self.reply_left.as_mut() {
            match left.checked_sub(data.len() as u64) {
                Some(l) => *left = l,
                None => return Some(reply_too_large(self.reply_max)),
            }
        }
        if let Some(max) = self.event_max {
            self.event_len = match last_end {
                Some(end) => data.len() - end,
                None => self.event_len.saturating_add(data.len()),
            };
            if self.event_len > max {
                return Some(GatewayError::new(
                    ErrorKind::UpstreamBadResponse,
                    format!("an upstream event is larger than the limit of {max} bytes"),
                ));
            }
        }
        None
    }
}

/// An upstream reply passed `[limits] max_reply_bytes`.
fn reply_too_large(max: u64) -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamBadResponse,
        format!("the upstream reply is larger than the limit of {max} bytes"),
    )
}

impl<B> UpstreamBody<B> {
    pub fn new(inner: B, idle_timeout: Duration, guard: StreamGuard) -> Self {
        Self::build(inner, idle_timeout, guard, None, BodyLimits::default())
    }

    /// The body a client receives: `new` with the request's fate and the size limit that
    /// fits it, in one call. Each `with_*` call moves the whole body (about 440 bytes with
    /// its usage reader), and three such moves showed up in every request's copies.
    pub fn for_client(
        inner: B,
        idle_timeout: Duration,
        guard: StreamGuard,
        fate: Fate,
        limit: SizeLimit,
    ) -> Self {
        let (reply_left, event_max) = match limit {
            SizeLimit::Reply(max) => (Some(max), None),
            SizeLimit::Event(max) => (None, Some(max)),
            SizeLimit::Unbounded => (None, None),
        };
        let limits = BodyLimits {
            reply_left,
            reply_max: reply_left.unwrap_or(0),
            event_max,
            event_len: 0,
        };
        Self::build(inner, idle_timeout, guard, Some(fate), limits)
    }

    fn build(
        inner: B,
        idle_timeout: Duration,
        guard: StreamGuard,
        fate: Option<Fate>,
        limits: BodyLimits,
    ) -> Self {
        Self {
            inner,
            idle: None,
            idle_timeout,
            last_frame: None,
            guard,
            scan: StreamScan::default(),
            sent_ends_event: true,
            terminal_seen: false,
            done: false,
            fate,
            limits,
        }
    }

    /// Ends a non-streamed body with an error once it passes `max` bytes.
    pub fn with_reply_limit(mut self, max: u64) -> Self {
        self.limits.reply_left = Some(max);
        self.limits.reply_max = max;
        self
    }

    /// Ends a stream with the protocol's error once one event passes `max` bytes.
    pub fn with_event_limit(mut self, max: usize) -> Self {
        self.limits.event_max = Some(max);
        self
    }

    /// Tells the request's record how the body failed, if it does.
    pub fn with_fate(mut self, fate: Fate) -> Self {
        self.fate = Some(fate);
        self
    }
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
                *this.last_frame = None;
                let Some(data) = frame.data_ref() else {
                    return Poll::Ready(Some(Ok(frame)));
                };
                let mut last_end = None;
                if *this.guard != StreamGuard::None || this.limits.event_max.is_some() {
                    let markers = match *this.terminal_seen {
                        true => &[][..],
                        false => this.guard.terminals(),
                    };
                    let (end, found) = this.scan.feed(data, markers);
                    last_end = end;
                    *this.terminal_seen |= found;
                }
                match this.limits.check(data, last_end) {
                    Some(over) => over,
                    None => {
                        // Kept after the terminator too: an error written later (the event
                        // limit, a break) must know whether an event is open.
                        *this.sent_ends_event = this.scan.ends_event();
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
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
                if *this.guard != StreamGuard::None && !*this.terminal_seen {
                    GatewayError::new(
                        ErrorKind::UpstreamBadResponse,
                        "the upstream stream ended before it was complete",
                    )
                } else {
                    return Poll::Ready(None);
                }
            }
            Poll::Pending => {
                let last_frame = *this.last_frame.get_or_insert_with(Instant::now);
                let deadline = last_frame + *this.idle_timeout;
                if this.idle.is_none() {
                    this.idle.set(Some(tokio::time::sleep_until(deadline)));
                }
                let Some(mut idle) = this.idle.as_mut().as_pin_mut() else {
                    // Set just above; never reached.
                    return Poll::Pending;
                };
                loop {
                    ready!(idle.as_mut().poll(cx));
                    if deadline <= idle.deadline() {
                        break;
                    }
                    idle.as_mut().reset(deadline);
                }
                IdleTimeout(*this.idle_timeout).error()
            }
        };
        *this.done = true;
        tell_failure(&failure, this.fate.as_ref());
        match this.guard {
            StreamGuard::None => Poll::Ready(Some(Err(Box::new(failure)))),
            guard => {
                let bytes = guard.error_bytes(&failure, *this.sent_ends_event);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.guard == StreamGuard::None && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match self.guard {
            StreamGuard::None => self.inner.size_hint(),
            // A guarded stream may grow by an error event, so its length is never exact.
            _ => SizeHint::default(),
        }
    }
}

pin_project! {
    /// A body with a frame already read from it put back in front.
    pub struct Prepend<B> {
        // Boxed: a frame is 96 bytes (it may be trailers), and an upstream's answer carries
        // this slot from its head on, read ahead or not.
        first: Option<Box<Frame<Bytes>>>,
        #[pin]
        inner: B,
    }
}

impl<B> Prepend<B> {
    pub fn new(first: Frame<Bytes>, inner: B) -> Self {
        Self {
            first: Some(Box::new(first)),
            inner,
        }
    }

    /// `inner` with nothing in front yet.
    pub fn nothing_before(inner: B) -> Self {
        Self { first: None, inner }
    }

    /// Puts `frame`, read from the front of this body, back.
    pub fn put_back(&mut self, frame: Frame<Bytes>) {
        self.first = Some(Box::new(frame));
    }
}

/// An upstream's answer body as the pipeline holds it until it answers: the body of whichever
/// client carried it, or that body redacted (an error that may quote the credential), or an
/// answer made here (the mock), with a first frame read ahead put back in front. One type
/// rather than a box: the upstream side costs no allocation and no dynamic call per frame.
pub type Sent = Prepend<SentBody>;

/// The body of a [`Sent`].
pub enum SentBody {
    Upstream(crate::upstream::UpstreamIncoming),
    /// Boxed: only error answers that may quote the credential come this way.
    Redacted(Box<Redacted<crate::upstream::UpstreamIncoming>>),
    Here(Body),
}

impl SentBody {
    /// As a [`Sent`], nothing read ahead.
    pub fn sent(self) -> Sent {
        Prepend::nothing_before(self)
    }
}

impl HttpBody for SentBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Upstream(b) => Pin::new(b).poll_frame(cx).map_err(BoxError::from),
            Self::Redacted(b) => Pin::new(&mut **b).poll_frame(cx),
            Self::Here(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Upstream(b) => b.is_end_stream(),
            Self::Redacted(b) => b.is_end_stream(),
            Self::Here(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Upstream(b) => b.size_hint(),
            Self::Redacted(b) => b.size_hint(),
            Self::Here(b) => b.size_hint(),
        }
    }
}

impl<B> HttpBody for Prepend<B>
where
    B: HttpBody<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(frame) = this.first.take() {
            return Poll::Ready(Some(Ok(*frame)));
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let Some(len) = self
            .first
            .as_deref()
            .and_then(Frame::data_ref)
            .map(|d| d.len() as u64)
        else {
            return inner;
        };
        // Upper before lower: `set_lower` panics on a lower bound above the current upper.
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(len));
        }
        hint.set_lower(inner.lower().saturating_add(len));
        hint
    }
}

pin_project! {
    /// A chat event stream with its usage-only chunk (`"choices":[]` with `usage`) taken out:
    /// the gateway asked the upstream for usage the client did not ask for. Complete events
    /// go on as soon as they are in; a partial one waits for its end.
    pub struct StripUsage<B> {
        #[pin]
        inner: B,
        // The start of an event not yet complete; bounded by the event limit of the body below.
        pending: Vec<u8>,
        // Where events end in `pending`, found as the bytes come.
        ends: Vec<usize>,
        scan: crate::sse::EventEnds,
        done: bool,
    }
}

impl<B> StripUsage<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            pending: Vec::new(),
            ends: Vec::new(),
            scan: crate::sse::EventEnds::default(),
            done: false,
        }
    }
}

/// True for a chat chunk that only carries usage.
fn usage_only(event: &[u8]) -> bool {
    if memchr::memmem::find(event, b"\"usage\"").is_none() {
        return false;
    }
    let text = String::from_utf8_lossy(event);
    let data: String = text
        .split(['\n', '\r'])
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join("\n");
    serde_json::from_str::<serde_json::Value>(&data).is_ok_and(|v| {
        v.get("choices")
            .and_then(|c| c.as_array())
            .is_some_and(Vec::is_empty)
            && v.get("usage").is_some_and(serde_json::Value::is_object)
    })
}

/// The events of `bytes` (ending at `ends`, then the rest) without the usage-only ones.
fn without_usage(bytes: &[u8], ends: &[usize]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut start = 0;
    for &end in ends.iter().chain(std::iter::once(&bytes.len())) {
        let event = &bytes[start..end];
        if !usage_only(event) {
            out.extend_from_slice(event);
        }
        start = end;
    }
    out
}

impl<B> HttpBody for StripUsage<B>
where
    B: HttpBody<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            if *this.done {
                return Poll::Ready(None);
            }
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let Some(data) = frame.data_ref() else {
                        return Poll::Ready(Some(Ok(frame)));
                    };
                    let base = this.pending.len();
                    let ends = &mut *this.ends;
                    this.scan.feed(data, |end| ends.push(base + end));
                    // The common frame: whole events, no usage. It goes on untouched.
                    if base == 0
                        && ends.last() == Some(&data.len())
                        && memchr::memmem::find(data, b"\"usage\"").is_none()
                    {
                        ends.clear();
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.pending.extend_from_slice(data);
                    let Some(&end) = ends.last() else {
                        continue;
                    };
                    let out = without_usage(&this.pending[..end], &ends[..ends.len() - 1]);
                    this.pending.drain(..end);
                    ends.clear();
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    *this.done = true;
                    let out = without_usage(&std::mem::take(this.pending), &[]);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn an_event_stream_is_told_by_its_type_whatever_its_parameters() {
        let with = |v: &[u8]| {
            let mut h = http::HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_bytes(v).unwrap(),
            );
            is_event_stream(&h)
        };
        assert!(with(b"text/event-stream"));
        assert!(with(b"text/event-stream; charset=utf-8"));
        assert!(with(b"text/event-stream; x=\xe9"));
        assert!(!with(b"application/json"));
        assert!(!with(b"text/event"));
        assert!(!is_event_stream(&http::HeaderMap::new()));
    }

    #[tokio::test]
    async fn the_usage_chunk_is_taken_out_whatever_the_frames() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n";
        let want = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\ndata: [DONE]\n\n";
        for size in [1, 7, 40, stream.len()] {
            let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = stream
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            let inner = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
            let got = StripUsage::new(inner).collect().await.map(|c| c.to_bytes());
            assert_eq!(
                got.ok().as_deref(),
                Some(want.as_bytes()),
                "frames of {size}"
            );
        }
    }

    type TestFrames = std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>;

    fn frames_of(
        parts: Vec<Vec<u8>>,
    ) -> http_body_util::StreamBody<futures_util::stream::Iter<TestFrames>> {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = parts
            .into_iter()
            .map(|p| Ok(Frame::data(Bytes::from(p))))
            .collect();
        http_body_util::StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn the_usage_chunk_is_taken_out_under_crlf_and_cr_line_ends() {
        for eol in ["\r\n", "\r"] {
            let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n".replace('\n', eol);
            let want = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
                .replace('\n', eol);
            for size in [1, 7, 40, stream.len()] {
                let parts = stream.as_bytes().chunks(size).map(<[u8]>::to_vec).collect();
                let got = StripUsage::new(frames_of(parts)).collect().await;
                let got = got.map(|c| c.to_bytes());
                assert_eq!(
                    got.ok().as_deref(),
                    Some(want.as_bytes()),
                    "{eol:?} frames of {size}"
                );
            }
        }
    }

    #[tokio::test]
    async fn events_within_the_limit_pass_however_their_ends_are_split() {
        for eol in ["\n", "\r\n", "\r"] {
            let event = format!("data: {}{eol}{eol}", "x".repeat(120));
            // Each frame ends inside an event's blank line, so no frame holds a whole boundary.
            let mut parts = Vec::new();
            for _ in 0..200 {
                let whole = event.as_bytes();
                let cut = whole.len() - eol.len();
                parts.push(whole[..cut].to_vec());
                parts.push(whole[cut..].to_vec());
            }
            let sent: Vec<u8> = parts.concat();
            let body =
                UpstreamBody::new(frames_of(parts), Duration::from_secs(5), StreamGuard::None)
                    .with_event_limit(4096);
            let got = body.collect().await.map(|c| c.to_bytes());
            assert_eq!(got.ok().as_deref(), Some(&sent[..]), "{eol:?}");
        }
        // One event over the limit is still refused.
        let big = format!("data: {}\n\n", "x".repeat(5000)).into_bytes();
        let parts = big.chunks(100).map(<[u8]>::to_vec).collect();
        let body = UpstreamBody::new(frames_of(parts), Duration::from_secs(5), StreamGuard::None)
            .with_event_limit(4096);
        assert!(body.collect().await.is_err());
    }

    #[tokio::test]
    async fn a_prepended_frame_comes_first_and_counts_in_the_length() {
        let inner = http_body_util::Full::new(Bytes::from_static(b" world"));
        let body = Prepend::new(Frame::data(Bytes::from_static(b"hello")), inner);
        assert_eq!(body.size_hint().exact(), Some(11));
        let all = body.collect().await.map(|c| c.to_bytes());
        assert_eq!(all.ok().as_deref(), Some(&b"hello world"[..]));
    }

    /// Whether a marker starts a line, feeding `frames` one after the other.
    fn found(frames: &[&[u8]], markers: &[&[u8]]) -> bool {
        let mut scan = StreamScan::default();
        frames.iter().any(|f| scan.feed(f, markers).1)
    }

    #[test]
    fn a_marker_search_finds_every_marker_at_a_line_start_only() {
        let search = MarkerSearch::new(b"[DONE]", &[b"data: [DONE]", b"event: error"]);
        assert!(
            search.found_in(b"data: {}\n\nevent: error\n"),
            "a marker without the key"
        );
        assert!(search.found_in(b"data: {}\n\ndata: [DONE]\n\n"));
        assert!(!search.found_in(b"data: {\"t\":\"data: [DONE]\"}\n\n"));
        for guard in [
            StreamGuard::Chat,
            StreamGuard::Messages,
            StreamGuard::Responses,
        ] {
            for m in guard.terminals() {
                let frame = [b"data: {}\n\n".as_slice(), m, b"\n\n"].concat();
                assert!(
                    marker_search(guard.terminals()).found_in(&frame),
                    "{guard:?}"
                );
                let inside = [b"data: x".as_slice(), m, b"\n\n"].concat();
                assert!(
                    !marker_search(guard.terminals()).found_in(&inside),
                    "{guard:?}"
                );
            }
        }
    }

    #[test]
    fn a_marker_is_found_inside_a_frame_and_across_the_seam() {
        let markers = StreamGuard::Messages.terminals();
        let marker = b"\nevent: message_stop";
        for cut in 0..=marker.len() {
            let first = [&b"event: x\ndata: {}\n"[..], &marker[..cut]].concat();
            let second = [&marker[cut..], &b"\ndata: {}\n\n"[..]].concat();
            assert!(found(&[&first, &second], markers), "cut at {cut}");
        }
        // Split in three: the middle frame alone holds no line break.
        let done = StreamGuard::Chat.terminals();
        assert!(found(&[b"data: {}\n\nda", b"ta: [DO", b"NE]\n\n"], done));
        // One byte a frame.
        let bytes = b"data: {}\r\n\r\ndata: [DONE]\r\n\r\n";
        let frames: Vec<&[u8]> = bytes.chunks(1).collect();
        assert!(found(&frames, done));
        let frames: Vec<&[u8]> = b"data: {\"x\":1}\n\ndata: [DONE".chunks(1).collect();
        assert!(!found(&frames, done), "a marker cut short is not one");
    }

    #[test]
    fn cr_line_ends_start_lines_and_end_events_too() {
        // Found by the body_wrappers fuzz target's reference (SSE's CR-only line ends): a
        // finished stream got an "ended before it was complete" error event after its end.
        let done = StreamGuard::Chat.terminals();
        assert!(found(&[b"data: {}\r\rdata: [DONE]\r\r"], done));
        assert!(
            found(&[b"data: {}\r\rdata: [D", b"ONE]\r\r"], done),
            "split across frames"
        );
        assert!(
            found(&[b"data: {}\r", b"\ndata: [DONE]\r\n"], done),
            "CRLF split"
        );
        let stop = StreamGuard::Messages.terminals();
        assert!(found(&[b"\revent: message_stop\rdata: {}\r\r"], stop));
        for (bytes, ends) in [
            (&b""[..], true),
            (b"data: x\n\n", true),
            (b"data: x\r\r", true),
            (b"data: x\r\n\r\n", true),
            (b"data: x\n\r\n", true),
            (b"data: x\r\r\n", true),
            (b"data: x\n\r", true),
            (b"data: x\r\n", false),
            (b"data: x\r", false),
            (b"data: x", false),
        ] {
            let mut scan = StreamScan::default();
            scan.feed(bytes, done);
            assert_eq!(
                scan.ends_event(),
                ends,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
            // The same bytes one at a time.
            let mut scan = StreamScan::default();
            for b in bytes.chunks(1) {
                scan.feed(b, done);
            }
            assert_eq!(
                scan.ends_event(),
                ends,
                "{:?} byte by byte",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn every_split_in_three_finds_what_the_whole_stream_has() {
        let done = StreamGuard::Chat.terminals();
        let streams: [&[u8]; 6] = [
            b"data: {\"a\":1}\n\ndata: [DONE]\n\n",
            b"data: {\"a\":1}\r\n\r\ndata:[DONE]\r\n\r\n",
            b"data: {\"a\":1}\r\rdata: [DONE]",
            b"data: {\"a\":\"data: [DONE]\"}\n\n",
            b"data: [DON\ndata: E]\n\n",
            b"xdata: [DONE]\n\n",
        ];
        for stream in streams {
            let whole = std::iter::once(0)
                .chain(memchr::memchr2_iter(b'\n', b'\r', stream).map(|i| i + 1))
                .any(|at| done.iter().any(|m| stream[at..].starts_with(m)));
            for i in 0..=stream.len() {
                for j in i..=stream.len() {
                    let parts = [&stream[..i], &stream[i..j], &stream[j..]];
                    assert_eq!(found(&parts, done), whole, "{parts:?}");
                }
            }
        }
    }

    #[tokio::test]
    async fn a_reply_is_collected_whole_however_it_was_framed() {
        let reply = b"{\"id\":\"chatcmpl-1\",\"choices\":[]}";
        for size in [1, 5, reply.len()] {
            let parts: Vec<Vec<u8>> = reply.chunks(size).map(<[u8]>::to_vec).collect();
            let got = collect_reply(frames_of(parts)).await;
            assert_eq!(got.ok().as_deref(), Some(&reply[..]), "frames of {size}");
        }
        // Empty frames (and none at all) add nothing.
        let got = collect_reply(frames_of(vec![vec![], b"{}".to_vec(), vec![]])).await;
        assert_eq!(got.ok().as_deref(), Some(&b"{}"[..]));
        let got = collect_reply(frames_of(vec![])).await;
        assert_eq!(got.ok().as_deref(), Some(&b""[..]));
    }

    #[tokio::test]
    async fn a_reply_read_within_bounds_keeps_to_its_size_and_silence_limits() {
        let fate = Fate::default();
        let bounds = |max| Bounds {
            idle: Duration::from_millis(20),
            max,
            fate: &fate,
        };
        let parts = || vec![b"{\"a\":".to_vec(), b"12345}".to_vec()];
        // Up to the limit, the frames joined.
        let got = collect_reply_within(frames_of(parts()), bounds(11)).await;
        assert_eq!(got.ok().as_deref(), Some(&b"{\"a\":12345}"[..]));
        // One byte over it, refused.
        let err = collect_reply_within(frames_of(parts()), bounds(10))
            .await
            .err();
        let err = err.as_ref().map(|e| (e.kind, e.message.as_str()));
        assert_eq!(
            err,
            Some((
                ErrorKind::UpstreamBadResponse,
                "the upstream reply is larger than the limit of 10 bytes"
            ))
        );
        // A body that goes quiet after its first frame is a timeout, not a wait forever.
        let first = futures_util::stream::iter(vec![Ok::<_, std::convert::Infallible>(
            Frame::data(Bytes::from_static(b"{")),
        )]);
        let body = http_body_util::StreamBody::new(futures_util::StreamExt::chain(
            first,
            futures_util::stream::pending(),
        ));
        let err = collect_reply_within(body, bounds(100)).await.err();
        let err = err.as_ref().map(|e| (e.kind, e.message.as_str()));
        assert_eq!(
            err,
            Some((
                ErrorKind::UpstreamTimeout,
                "the upstream sent nothing for 20 ms"
            ))
        );
    }

    #[tokio::test]
    async fn a_reply_that_breaks_is_an_upstream_error_saying_so() {
        let frames: Vec<Result<Frame<Bytes>, &str>> = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"id\":"))),
            Err("connection reset"),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let err = collect_reply(body).await.err();
        let err = err.as_ref().map(|e| (e.kind, e.message.as_str()));
        assert_eq!(
            err,
            Some((
                ErrorKind::UpstreamBadResponse,
                "reading the upstream reply: connection reset"
            ))
        );
    }

    #[test]
    fn only_a_marker_at_a_line_start_counts() {
        let done = StreamGuard::Chat.terminals();
        // The stream's start is a line start.
        assert!(found(&[b"data: [DONE]\n\n"], done));
        assert!(found(&[b"data: {}\n\ndata:[DONE]\n\n"], done));
        assert!(!found(
            &[b"data: {\"content\":\"say data: [DONE]\"}\n\n"],
            done
        ));
        assert!(
            !found(&[b"data: {\"content\":\"x", b"data: [DONE]\"}\n\n"], done),
            "mid-line is not a line start"
        );
        // A line longer than the kept head, then the marker glued to it.
        let long = [&b"data: "[..], &[b'x'; 40], b"data: [DONE]"].concat();
        assert!(!found(&[&long[..20], &long[20..]], done));
        assert!(!found(&[b""], done));
    }
}

pin_project! {
    /// An upstream's error body, read whole (error bodies are small, and `max_reply_bytes`
    /// bounds them) and passed on with every occurrence of `secret` replaced, so an upstream
    /// that quotes the gateway's credential back never shows it to a client (gateway.md §14).
    pub struct Redacted<B> {
        #[pin]
        inner: B,
        secret: Bytes,
        buf: Vec<u8>,
        max: u64,
        done: bool,
    }
}

impl<B> Redacted<B> {
    /// `max` bounds what is held (`[limits] max_reply_bytes`).
    pub fn new(inner: B, secret: Bytes, max: u64) -> Self {
        Self {
            inner,
            secret,
            buf: Vec::new(),
            max,
            done: false,
        }
    }
}

/// True when the head says an event stream follows.
pub fn is_event_stream(headers: &http::HeaderMap) -> bool {
    // The bytes, not `to_str`'s checked text: asked several times of every answer, and a
    // parameter past the type (`; charset=…`) may hold any byte without changing the type.
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// An upstream reply read whole; a body that breaks off is the upstream's bad response.
pub async fn collect_reply<B>(body: B) -> Result<Bytes, GatewayError>
where
    B: HttpBody<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    collect(body, None).await
}

/// What a reply read whole keeps to when no [`UpstreamBody`] watches it: no silence longer
/// than `idle`, no more than `max` bytes, and how it failed told to the request's `fate`.
#[derive(Debug, Clone, Copy)]
pub struct Bounds<'a> {
    pub idle: Duration,
    pub max: u64,
    pub fate: &'a Fate,
}

/// [`collect_reply`] within `bounds`: a translated JSON reply, read whole before any of it
/// goes out, is read straight from the upstream's body rather than through the layers that
/// watch a body on its way to the client (they cost a poll each per frame, and a box).
pub async fn collect_reply_within<B>(body: B, bounds: Bounds<'_>) -> Result<Bytes, GatewayError>
where
    B: HttpBody<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    collect(body, Some(bounds)).await
}

async fn collect<B>(body: B, bounds: Option<Bounds<'_>>) -> Result<Bytes, GatewayError>
where
    B: HttpBody<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    enum Next<F> {
        Frame(Option<F>),
        Silent,
    }
    let mut body = std::pin::pin!(body);
    // Armed only when the body makes the reader wait, from then: most replies are all there
    // when asked for, and never read the clock.
    let mut idle = std::pin::pin!(None::<Sleep>);
    // A reply that came in one frame is that frame: `BodyExt::collect` would queue it in a
    // list of its own (an allocation) to hand it back.
    let mut first = Bytes::new();
    let mut joined: Option<Vec<u8>> = None;
    let mut total: u64 = 0;
    loop {
        let next = std::future::poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(frame) => {
                if idle.is_some() {
                    idle.set(None);
                }
                Poll::Ready(Next::Frame(frame))
            }
            Poll::Pending => {
                let Some(b) = &bounds else {
                    return Poll::Pending;
                };
                if idle.is_none() {
                    idle.set(Some(tokio::time::sleep(b.idle)));
                }
                match idle.as_mut().as_pin_mut() {
                    Some(sleep) => sleep.poll(cx).map(|()| Next::Silent),
                    None => Poll::Pending,
                }
            }
        })
        .await;
        let failure = match next {
            Next::Frame(None) => break,
            Next::Frame(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                total = total.saturating_add(data.len() as u64);
                match bounds.as_ref().filter(|b| total > b.max) {
                    Some(b) => reply_too_large(b.max),
                    None => {
                        match &mut joined {
                            Some(all) => all.extend_from_slice(&data),
                            None if first.is_empty() => first = data,
                            None => {
                                let mut all = Vec::with_capacity(first.len() + data.len());
                                all.extend_from_slice(&first);
                                all.extend_from_slice(&data);
                                joined = Some(all);
                            }
                        }
                        continue;
                    }
                }
            }
            Next::Frame(Some(Err(e))) => GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!("reading the upstream reply: {e}"),
            ),
            Next::Silent => IdleTimeout(bounds.map_or(Duration::ZERO, |b| b.idle)).error(),
        };
        if let Some(b) = bounds {
            tell_failure(&failure, Some(b.fate));
        }
        return Err(failure);
    }
    Ok(joined.map_or(first, Bytes::from))
}

/// Replaces each occurrence of `secret` in `text`.
pub fn redact(text: &[u8], secret: &[u8]) -> Vec<u8> {
    const MARK: &[u8] = b"[redacted]";
    if secret.is_empty() {
        return text.to_vec();
    }
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = memchr::memmem::find(rest, secret) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(MARK);
        rest = &rest[at + secret.len()..];
    }
    out.extend_from_slice(rest);
    out
}

impl<B> HttpBody for Redacted<B>
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
        loop {
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        if (this.buf.len() + data.len()) as u64 > *this.max {
                            *this.done = true;
                            return Poll::Ready(Some(Err(Box::new(reply_too_large(*this.max)))));
                        }
                        this.buf.extend_from_slice(data);
                    }
                }
                Some(Err(e)) => {
                    *this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                None => {
                    *this.done = true;
                    let clean = redact(this.buf, this.secret);
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(clean)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
