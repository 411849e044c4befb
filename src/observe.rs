//! Every request observed to its end: the usage read out of the upstream's reply as it passes (JSON or stream, any protocol, no byte changed), and the record of what the client got (time to first byte, duration, gaps, outcome) written to the access log and the metrics when the body ends, fails or the client leaves.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use memchr::memmem::Finder;
use pin_project_lite::pin_project;
use smallvec::SmallVec;

use crate::config::Protocol;
use crate::limits::Meter;
use crate::metrics::{
    ChunkLabels, Metrics, RequestLabels, RouteLabels, RouteSeries, TokenLabels, TOKEN_DIRECTIONS,
};
use crate::translate::lax::{lax_struct, RawText};
use crate::{ir, translate};
use prometheus_client::metrics::histogram::Histogram;

/// Tokens a reply reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// The whole prompt, cache reads and writes included.
    pub input: u64,
    pub output: u64,
    /// The part of `input` read from a prompt cache.
    pub cached: u64,
}

impl Tokens {
    pub fn total(&self) -> u64 {
        // Upstream-reported counts: any u64 may come, and a wrapped sum would charge almost nothing.
        self.input.saturating_add(self.output)
    }
}

/// How much of a JSON reply's end is kept to find its top-level `usage`, which all three
/// protocols write after the content.
const JSON_TAIL: usize = 64 * 1024;

/// Follows one reply's bytes and keeps the usage it reports.
#[derive(Debug)]
pub struct UsageReader {
    protocol: Protocol,
    kind: Kind,
    usage: ir::Usage,
}

#[derive(Debug)]
enum Kind {
    /// The body's last frames, at least `JSON_TAIL` bytes of them when it is that long; kept
    /// by reference count, so a reply is not copied as it passes.
    /// Inline: most replies come in one or two frames.
    Json(SmallVec<[Bytes; 2]>),
    /// The bytes of an event not complete yet, and where events end (`sse::EventEnds`: every
    /// line end, each byte looked at once however the frames split it); only events mentioning
    /// usage are parsed, so a stream costs a scan per byte and no allocation per event.
    Sse(Vec<u8>, crate::sse::EventEnds),
}

impl UsageReader {
    pub fn new(protocol: Protocol, stream: bool) -> Self {
        let kind = if stream {
            Kind::Sse(Vec::new(), crate::sse::EventEnds::default())
        } else {
            Kind::Json(SmallVec::new())
        };
        Self {
            protocol,
            kind,
            usage: ir::Usage::default(),
        }
    }

    pub fn feed(&mut self, bytes: &Bytes) {
        match &mut self.kind {
            Kind::Json(frames) => {
                frames.push(bytes.clone());
                let mut kept: usize = frames.iter().map(Bytes::len).sum();
                let mut drop = 0;
                while frames.len() - drop > 1 && kept - frames[drop].len() >= JSON_TAIL {
                    kept -= frames[drop].len();
                    drop += 1;
                }
                frames.drain(..drop);
            }
            Kind::Sse(partial, ends) => {
                // Only the new bytes are searched for event ends: a long event in many small
                // frames is not rescanned with each (it cost up to 64 KiB of search a frame).
                // The usual frame is whole events: whatever came before, a frame ending in
                // "\n\n" ends at an event's end, leaving the scanner as at the stream's start.
                if partial.is_empty() && bytes.ends_with(b"\n\n") {
                    *ends = crate::sse::EventEnds::default();
                    scan_events(self.protocol, bytes, &mut self.usage);
                    return;
                }
                match ends.last_end(bytes) {
                    Some(end) if partial.is_empty() => {
                        scan_events(self.protocol, &bytes[..end], &mut self.usage);
                        partial.extend_from_slice(&bytes[end..]);
                    }
                    Some(end) => {
                        let end = partial.len() + end;
                        partial.extend_from_slice(bytes);
                        scan_events(self.protocol, &partial[..end], &mut self.usage);
                        partial.drain(..end);
                    }
                    None => partial.extend_from_slice(bytes),
                }
                // A runaway event is an upstream's fault; usage is never that far into one.
                if partial.len() > JSON_TAIL {
                    partial.clear();
                }
            }
        }
    }

    /// The usage seen, once the reply has ended (or been cut).
    pub fn finish(&mut self) -> Tokens {
        match &mut self.kind {
            Kind::Json(frames) => {
                // Most replies are one frame: read it in place; join only a split tail.
                let joined;
                let tail: &[u8] = match frames.len() {
                    0 => &[],
                    1 => &frames[0],
                    _ => {
                        joined = frames
                            .iter()
                            .flat_map(|f| f.iter().copied())
                            .collect::<Vec<u8>>();
                        &joined
                    }
                };
                if let Some(c) = last_usage(tail) {
                    c.read_into(self.protocol, &mut self.usage);
                }
                frames.clear();
            }
            Kind::Sse(partial, _) => {
                // A last event without its blank line still counts.
                scan_events(self.protocol, partial, &mut self.usage);
                partial.clear();
            }
        }
        Tokens {
            input: self.usage.prompt_total(),
            output: self.usage.output,
            cached: self.usage.cache_read,
        }
    }
}

/// The key every usage report has, searched for before anything is parsed.
static USAGE_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"usage\""));

/// Reads the usage of every event in `events` (complete events, the last one possibly without
/// its blank line) that mentions it. Events are told apart by SSE rules (`\n`, `\r\n` or `\r`
/// line ends), so a stream with CR line ends has its usage read too.
fn scan_events(protocol: Protocol, events: &[u8], usage: &mut ir::Usage) {
    if USAGE_KEY.find(events).is_none() {
        return;
    }
    let mut bounds = Vec::new();
    crate::sse::EventEnds::default().feed(events, |end| bounds.push(end));
    let mut start = 0;
    for end in bounds.into_iter().chain(std::iter::once(events.len())) {
        let event = &events[start..end];
        start = end;
        read_event_bytes(protocol, event, usage);
    }
}

/// Reads the usage of one event (its lines by SSE rules) when it may hold a usage object.
fn read_event_bytes(protocol: Protocol, event: &[u8], usage: &mut ir::Usage) {
    if !usage_object_in(event) {
        return;
    }
    let mut data = String::new();
    for line in String::from_utf8_lossy(event).split(['\n', '\r']) {
        if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    if let Ok(event) = translate::lax::parse::<UsageEvent<'_>>(data.as_bytes()) {
        event.read_into(protocol, usage);
    }
}

/// False when no `"usage"` key in `event` can hold an object: none at all, or each followed by
/// `null` (every chunk of a chat stream that asked for usage but the last, Responses' early
/// events), so such events are not parsed. Anything less plain is parsed.
fn usage_object_in(event: &[u8]) -> bool {
    USAGE_KEY.find_iter(event).any(|at| {
        let rest = event[at + USAGE_KEY.needle().len()..].trim_ascii_start();
        match rest.strip_prefix(b":") {
            Some(value) => !value.trim_ascii_start().starts_with(b"null"),
            None => true,
        }
    })
}

/// The counts of the last `"usage":` key in `tail` that is not inside a string and holds an
/// object.
fn last_usage(tail: &[u8]) -> Option<translate::counts::Counts<'_>> {
    const KEY: &[u8] = b"\"usage\"";
    // Backwards to the key's `g`, which usage objects and what follows them seldom hold: one
    // vector search over the object's bytes, some 70 instructions where a two-way search for
    // the whole key took 440.
    memchr::memrchr_iter(b'g', tail).find_map(|g| {
        let at = g.checked_sub(4)?;
        let rest = tail.get(at..)?.strip_prefix(KEY)?;
        // An escaped quote (`\"usage\"`) is text a model wrote, not a key.
        if at.checked_sub(1).and_then(|p| tail.get(p)) == Some(&b'\\') {
            return None;
        }
        let value = rest.trim_ascii_start().strip_prefix(b":")?;
        translate::counts::Counts::object_at(value.trim_ascii_start())
    })
}

lax_struct! {
    /// Where a stream event of any protocol holds its usage, read by hand without a tree.
    struct UsageEvent<'a> {
        usage: RawText<'a>,
        message: UsageHolder<'a>,
        response: UsageHolder<'a>,
    }
}

lax_struct! {
    struct UsageHolder<'a> {
        usage: RawText<'a>,
    }
}

impl UsageEvent<'_> {
    /// One stream event's usage, by protocol: a chat chunk's `usage`; Anthropic's input in
    /// `message_start` and output in `message_delta` (the two merge); a terminal Responses
    /// event's `response.usage`. A usage that is no object, or that serde cannot read, counts
    /// nothing.
    fn read_into(&self, protocol: Protocol, usage: &mut ir::Usage) {
        let text = match protocol {
            Protocol::Chat => self.usage.0,
            Protocol::Messages => self.message.usage.0.or(self.usage.0),
            Protocol::Responses => self.response.usage.0,
        };
        if let Some(counts) = text.and_then(|t| translate::counts::Counts::object_at(t.as_bytes()))
        {
            counts.read_into(protocol, usage);
        }
    }
}

/// The usage an upstream reported, published by the upstream side for the record.
#[derive(Debug, Default)]
struct TokenCell {
    input: AtomicU64,
    output: AtomicU64,
    cached: AtomicU64,
}

impl TokenCell {
    fn set(&self, t: Tokens) {
        self.input.store(t.input, Ordering::Relaxed);
        self.output.store(t.output, Ordering::Relaxed);
        self.cached.store(t.cached, Ordering::Relaxed);
    }

    fn get(&self) -> Tokens {
        Tokens {
            input: self.input.load(Ordering::Relaxed),
            output: self.output.load(Ordering::Relaxed),
            cached: self.cached.load(Ordering::Relaxed),
        }
    }
}

/// A reply's usage, read from its body as it passes: at the body's end (or when it is dropped:
/// a client that leaves still pays for what the upstream reported) the usage goes to the
/// record and, for a key with token limits, to its meter.
pub struct Usage {
    reader: UsageReader,
    fate: Fate,
    meter: Option<Meter>,
    done: bool,
}

impl Usage {
    pub fn new(reader: UsageReader, fate: Fate, meter: Option<Meter>) -> Self {
        Self {
            reader,
            fate,
            meter,
            done: false,
        }
    }

    /// Settles for a JSON reply read whole here rather than as it passed: with the usage its
    /// translation read, or what the counter finds in `body` when it read as no reply.
    pub fn settle_reply(mut self, body: &Bytes, read: Option<ir::Usage>) {
        match read {
            Some(usage) => self.reader.usage = usage,
            None => self.reader.feed(body),
        }
        self.settle();
    }

    /// Settles for a stream a translator read: with the usage its decoder kept (the same
    /// counts this reader would find, read once rather than twice). Later calls do nothing.
    pub fn settle_read(&mut self, read: ir::Usage) {
        if !self.done {
            self.reader.usage = read;
            self.settle();
        }
    }

    fn settle(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let tokens = self.reader.finish();
        self.fate.0.tokens.set(tokens);
        if let Some(meter) = self.meter.take() {
            meter.charge(tokens.total());
        }
    }
}

pin_project! {
    /// A body passed on untouched, its usage read when there is a [`Usage`] to read it into.
    /// A layer of the upstream body rather than a box of its own, so a reply not read for
    /// usage (an error) passes through it at the cost of one check per frame.
    pub struct Metered<B> {
        #[pin]
        inner: B,
        usage: Option<Usage>,
    }

    impl<B> PinnedDrop for Metered<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(usage) = this.project().usage.as_mut() {
                usage.settle();
            }
        }
    }
}

impl<B> Metered<B> {
    pub fn new(inner: B, usage: Option<Usage>) -> Self {
        Self { inner, usage }
    }
}

impl<B> HttpBody for Metered<B>
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
        let polled = this.inner.as_mut().poll_frame(cx);
        let Some(usage) = this.usage.as_mut() else {
            return polled;
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    usage.reader.feed(data);
                }
                // The last frame of a body that knows its length: the reader is done now, and
                // the record may be written before another poll comes.
                if this.inner.is_end_stream() {
                    usage.settle();
                }
            }
            Poll::Ready(None) => usage.settle(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What became of a response after its head, told by the bodies that saw it: how it failed,
/// if it did, and the usage its upstream reported. One shared cell for both, so a request
/// allocates it once.
#[derive(Debug, Clone, Default)]
pub struct Fate(Arc<FateCell>);

#[derive(Debug, Default)]
struct FateCell {
    failure: AtomicU8,
    tokens: TokenCell,
}

impl Fate {
    const UPSTREAM_ERROR: u8 = 1;
    const TIMEOUT: u8 = 2;

    pub fn upstream_error(&self) {
        let _ = self.0.failure.compare_exchange(
            0,
            Self::UPSTREAM_ERROR,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub fn timeout(&self) {
        let _ =
            self.0
                .failure
                .compare_exchange(0, Self::TIMEOUT, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn get(&self) -> u8 {
        self.0.failure.load(Ordering::Relaxed)
    }

    /// The usage the upstream reported, zero until its reply was read.
    pub fn tokens(&self) -> Tokens {
        self.0.tokens.get()
    }
}

/// How one attempt ended: the upstream's status, or why there was none.
#[derive(Debug, Clone, Copy)]
pub enum Tried {
    Status(u16),
    Failed(&'static str),
}

/// A request's attempts, for its access line's `tries` (`upstream 200 12ms, ...`): noted as
/// they happen and put into words only with the line, so a request allocates nothing for them.
#[derive(Debug, Default)]
pub struct Tries(SmallVec<[(Arc<str>, Tried, Duration); 2]>);

impl Tries {
    pub fn push(&mut self, upstream: Arc<str>, tried: Tried, took: Duration) {
        self.0.push((upstream, tried, took));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Runs `f` with the text, written into this thread's scratch buffer.
    fn with_text<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        thread_local! {
            static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        TEXT.with(|cell| match cell.try_borrow_mut() {
            Ok(mut text) => {
                text.clear();
                // Writing into a `String` cannot fail.
                let _ = self.write(&mut *text);
                f(&text)
            }
            Err(_) => f(&self.to_string()),
        })
    }

    /// `upstream 200 12ms, ...`, without the formatting machinery: every request has one.
    fn write(&self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        let mut n = itoa::Buffer::new();
        for (i, (upstream, tried, took)) in self.0.iter().enumerate() {
            if i > 0 {
                out.write_str(", ")?;
            }
            out.write_str(upstream)?;
            out.write_char(' ')?;
            out.write_str(match *tried {
                Tried::Status(s) => n.format(s),
                Tried::Failed(f) => f,
            })?;
            out.write_char(' ')?;
            out.write_str(n.format(took.as_millis()))?;
            out.write_str("ms")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Tries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write(f)
    }
}

/// What one request was and did, completed when its response ends.
#[derive(Debug)]
pub struct Record {
    pub request_id: http::HeaderValue,
    pub address: &'static str,
    pub method: http::Method,
    /// A copy, or the served path it equals: the head's own bytes share hyper's read buffer,
    /// which a record held for the access log must not keep.
    pub path: std::borrow::Cow<'static, str>,
    /// The key, when one was authenticated (shared with the config, not copied).
    pub principal: Option<Arc<crate::auth::Principal>>,
    /// The key's name where no authenticated key gives it (a video download's signed id).
    pub key_name: Option<String>,
    /// The model name the client sent.
    pub model: Option<Arc<str>>,
    /// The config entry that served it: the metrics' label, never a client's string.
    pub model_entry: Option<Arc<crate::config::Model>>,
    pub upstream: Option<Arc<str>>,
    /// The series of `model_entry` served by `upstream`, when an upstream was tried.
    pub series: Option<Arc<RouteSeries>>,
    /// The client's protocol, for LLM requests.
    pub protocol: &'static str,
    pub attempts: u32,
    pub tries: Tries,
    pub status: u16,
    pub started: Instant,
    /// How the response ended and what it used.
    pub fate: Fate,
}

impl Record {
    /// The key's name, for the access log and the token counts.
    fn key(&self) -> Option<&str> {
        match &self.principal {
            Some(p) => Some(&p.name),
            None => self.key_name.as_deref(),
        }
    }

    /// The config entry's name, as the metrics' label (empty without one).
    fn model_label(&self) -> String {
        self.model_entry
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default()
    }

    /// `ok | upstream_error | client_cancelled | timeout | refused` (gateway.md §12).
    fn outcome(&self, ended: bool) -> &'static str {
        match self.fate.get() {
            Fate::TIMEOUT => return "timeout",
            Fate::UPSTREAM_ERROR => return "upstream_error",
            _ => {}
        }
        if !ended {
            return "client_cancelled";
        }
        match self.status {
            504 => "timeout",
            s if s >= 400 && self.attempts == 0 => "refused",
            s if s >= 400 => "upstream_error",
            _ => "ok",
        }
    }
}

/// The access log's target.
const ACCESS: &str = "modelgate::access";

/// Writes the record to the access log and the metrics once the response is over.
struct Finisher {
    record: Record,
    metrics: Arc<Metrics>,
    stream: bool,
    first_byte: Option<Instant>,
    last_chunk: Option<Instant>,
    chunks: u64,
    gaps: Option<Histogram>,
    /// An answer to HEAD (whose body hyper drops unread) or an empty body: dropped unpolled, it
    /// was still sent whole.
    nothing_to_send: bool,
    /// What the access line says beyond the record, once the request is over.
    ended: Option<Ended>,
}

/// The figures of a finished request that its access line gives.
struct Ended {
    outcome: &'static str,
    ttfb_ms: Option<f64>,
    duration_ms: f64,
    tokens: Tokens,
}

impl Finisher {
    /// Counts the request in the families by its labels: `requests`, and unless `timed` the
    /// duration and time to first byte.
    fn count_by_labels(
        &self,
        outcome: &'static str,
        timed: bool,
        duration: Duration,
        ttfb: Option<Duration>,
    ) {
        let (r, m) = (&self.record, &self.metrics);
        let model = r.model_label();
        let upstream = r.upstream.as_deref().unwrap_or_default().to_owned();
        let protocol = r.protocol.to_owned();
        m.requests
            .get_or_create(&RequestLabels {
                model: model.clone(),
                upstream: upstream.clone(),
                protocol: protocol.clone(),
                status: r.status,
                outcome,
            })
            .inc();
        if timed {
            return;
        }
        let route = RouteLabels {
            model,
            upstream,
            protocol,
        };
        m.duration
            .get_or_create(&route)
            .observe(duration.as_secs_f64());
        if let Some(t) = ttfb {
            m.ttfb.get_or_create(&route).observe(t.as_secs_f64());
        }
    }

    fn chunk(&mut self, now: Instant) {
        self.chunks += 1;
        match self.last_chunk {
            None => self.first_byte = Some(now),
            Some(last) if self.stream => {
                let r = &self.record;
                let gaps = self.gaps.get_or_insert_with(|| match &r.series {
                    Some(s) => s.inter_chunk(&self.metrics),
                    None => self
                        .metrics
                        .inter_chunk
                        .get_or_create(&ChunkLabels {
                            model: r.model_label(),
                            upstream: r.upstream.as_deref().unwrap_or_default().to_owned(),
                        })
                        .clone(),
                });
                gaps.observe(now.saturating_duration_since(last).as_secs_f64());
            }
            Some(_) => {}
        }
        self.last_chunk = Some(now);
    }

    fn finish(mut self: Box<Self>, ended: bool) {
        let r = &self.record;
        let outcome = r.outcome(ended);
        let duration = r.started.elapsed();
        let ttfb = self
            .first_byte
            .map(|t| t.saturating_duration_since(r.started));
        let tokens = r.fate.tokens();
        let m = &self.metrics;
        m.in_flight.dec();
        if self.stream {
            m.in_flight_streams.dec();
        }
        let ok = r.status == 200 && outcome == "ok";
        let counted = r.series.as_ref().is_some_and(|s| {
            s.finished(
                m,
                r.protocol,
                ok,
                duration.as_secs_f64(),
                ttfb.map(|t| t.as_secs_f64()),
            )
        });
        // The request's series are at hand for an answered LLM request; anything else (a
        // refusal, a failure, video) is counted by its labels.
        if !counted || !ok {
            self.count_by_labels(outcome, counted, duration, ttfb);
        }
        if let Some(key) = r.key() {
            let counts = [tokens.input, tokens.output, tokens.cached];
            match &r.series {
                Some(s) => s.tokens(m, key, counts),
                _ if counts.iter().any(|n| *n > 0) => {
                    let model = r.model_label();
                    for (direction, n) in TOKEN_DIRECTIONS.into_iter().zip(counts) {
                        if n > 0 {
                            m.tokens
                                .get_or_create(&TokenLabels {
                                    model: model.clone(),
                                    key: key.to_owned(),
                                    direction,
                                })
                                .inc_by(n);
                        }
                    }
                }
                _ => {}
            }
        }
        let ttfb_ms = ttfb.map(|t| t.as_secs_f64() * 1000.0);
        let duration_ms = duration.as_secs_f64() * 1000.0;
        if !crate::logfmt::access_lines_direct() {
            // Put into words here only: the held line writes them itself, later.
            let tries = (!r.tries.is_empty()).then(|| r.tries.to_string());
            tracing::info!(
                target: ACCESS,
                request_id = r.request_id.to_str().unwrap_or("-"),
                address = r.address,
                method = %r.method,
                path = %r.path,
                key = r.key(),
                model = r.model.as_deref(),
                upstream = r.upstream.as_deref(),
                attempts = r.attempts,
                tries = tries.as_deref(),
                status = r.status,
                outcome,
                ttfb_ms,
                duration_ms,
                chunks = self.chunks,
                input_tokens = tokens.input,
                output_tokens = tokens.output,
                cached_tokens = tokens.cached,
                "request"
            );
        } else if tracing::enabled!(target: ACCESS, tracing::Level::INFO) {
            // The same line, without tracing's dispatch: every request writes one. Put together
            // after the response is out, with the record it describes.
            self.ended = Some(Ended {
                outcome,
                ttfb_ms,
                duration_ms,
                tokens,
            });
            crate::logfmt::access_line_later(ACCESS, "request", self);
        }
    }
}

impl crate::logfmt::Deferred for Finisher {
    fn fill(&self, l: &mut crate::logfmt::Line<'_>) {
        let (r, Some(e)) = (&self.record, &self.ended) else {
            return;
        };
        l.str("request_id", r.request_id.to_str().unwrap_or("-"));
        l.str("address", r.address);
        l.bare("method", r.method.as_str());
        l.bare("path", &r.path);
        l.opt_str("key", r.key());
        l.opt_str("model", r.model.as_deref());
        l.opt_str("upstream", r.upstream.as_deref());
        l.u64("attempts", u64::from(r.attempts));
        if !r.tries.is_empty() {
            r.tries.with_text(|text| l.str("tries", text));
        }
        l.u64("status", u64::from(r.status));
        l.str("outcome", e.outcome);
        if let Some(t) = e.ttfb_ms {
            l.ms("ttfb_ms", t);
        }
        l.ms("duration_ms", e.duration_ms);
        l.u64("chunks", self.chunks);
        l.u64("input_tokens", e.tokens.input);
        l.u64("output_tokens", e.tokens.output);
        l.u64("cached_tokens", e.tokens.cached);
    }
}

/// What a response holds until the client's body is dropped, let go in this order once the
/// body it wraps is: the target's count of attempts in flight, the key's concurrency slot, the
/// connection's count of requests. Fields of the body the client receives rather than a body
/// layer each: a layer is an allocation and a dynamic call per frame.
#[derive(Default)]
pub struct Holds {
    pub in_flight: Option<crate::attempt::InFlight>,
    pub slot: Option<crate::limits::Hold>,
    pub request: Option<crate::server::RequestGuard>,
}

pin_project! {
    /// The body the client receives, watched to its end: the first byte, the gaps between
    /// chunks, and how it ended. No task and no channel: it is polled by hyper like any body.
    pub struct Observed<B> {
        // Taken out and dropped before a body left unfinished is recorded: the layers under it
        // settle the usage the upstream had reported when they are dropped, and the record
        // gives it.
        inner: Option<B>,
        finisher: Option<Box<Finisher>>,
        // Declared after `inner`, so dropped after it.
        holds: Holds,
    }

    impl<B> PinnedDrop for Observed<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(f) = this.finisher.take() {
                drop(this.inner.take());
                // Dropped before its end: the client left (or the connection broke), unless
                // there was nothing to send.
                let ended = f.nothing_to_send;
                f.finish(ended);
            }
        }
    }
}

impl<B: HttpBody> Observed<B> {
    /// Counts the request in flight until the body is over; `stream` for an event stream.
    /// `holds` are kept until the body is dropped.
    pub fn new(
        inner: B,
        record: Record,
        metrics: Arc<Metrics>,
        stream: bool,
        holds: Holds,
    ) -> Self {
        let nothing_to_send = record.method == http::Method::HEAD || inner.is_end_stream();
        metrics.in_flight.inc();
        if stream {
            metrics.in_flight_streams.inc();
        }
        Self {
            inner: Some(inner),
            // Written into its box rather than built apart and copied in (384 bytes).
            finisher: Some(Box::write(
                Box::new_uninit(),
                Finisher {
                    record,
                    metrics,
                    stream,
                    first_byte: None,
                    last_chunk: None,
                    chunks: 0,
                    gaps: None,
                    nothing_to_send,
                    ended: None,
                },
            )),
            holds,
        }
    }
}

impl<B> HttpBody for Observed<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(&mut *inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                crate::phases::mark(crate::phases::Phase::Frame);
                if let Some(f) = this.finisher.as_mut() {
                    if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                        f.chunk(Instant::now());
                    }
                }
                // A body that knows it is over may never be polled again: finish now, before
                // the client can see its last byte.
                if inner.is_end_stream() {
                    if let Some(f) = this.finisher.take() {
                        f.finish(true);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(f) = this.finisher.take() {
                    f.record.fate.upstream_error();
                    f.finish(true);
                }
            }
            Poll::Ready(None) => {
                if let Some(f) = this.finisher.take() {
                    f.finish(true);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(B::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The access line's `tries`, each attempt in the order it was made, past the two kept
    /// inline too; the scratch buffer's text and `Display` agree, and a nested use (the buffer
    /// already borrowed) still gives the text.
    #[test]
    fn tries_read_as_they_happened() {
        let mut tries = Tries::default();
        assert!(tries.is_empty());
        tries.push(
            Arc::from("a"),
            Tried::Failed("connect"),
            Duration::from_millis(3),
        );
        tries.push(
            Arc::from("b"),
            Tried::Status(503),
            Duration::from_micros(12_900),
        );
        tries.push(
            Arc::from("c"),
            Tried::Status(200),
            Duration::from_millis(1234),
        );
        let want = "a connect 3ms, b 503 12ms, c 200 1234ms";
        assert_eq!(tries.to_string(), want);
        let nested = tries.with_text(|outer| (outer.to_owned(), tries.with_text(str::to_owned)));
        assert_eq!(nested, (want.to_owned(), want.to_owned()));
    }

    fn read(protocol: Protocol, stream: bool, body: &str) -> Tokens {
        let mut r = UsageReader::new(protocol, stream);
        // Byte by byte: no frame boundary may matter.
        for b in body.as_bytes() {
            r.feed(&Bytes::copy_from_slice(std::slice::from_ref(b)));
        }
        r.finish()
    }

    /// A long JSON reply in many frames: only a tail of at least `JSON_TAIL` bytes is kept,
    /// and the usage at its end is read from it.
    #[test]
    fn a_long_reply_keeps_only_its_tail_and_reads_its_usage() {
        let reply = format!(
            r#"{{"choices":[{{"message":{{"content":"{}"}}}}],"usage":{{"prompt_tokens":3,"completion_tokens":200000}}}}"#,
            "x".repeat(200_000)
        );
        let mut r = UsageReader::new(Protocol::Chat, false);
        for frame in reply.as_bytes().chunks(1000) {
            r.feed(&Bytes::copy_from_slice(frame));
            let Kind::Json(frames) = &r.kind else {
                panic!("a JSON reader");
            };
            let kept: usize = frames.iter().map(Bytes::len).sum();
            let without_first = kept - frames.first().map_or(0, Bytes::len);
            assert!(without_first < JSON_TAIL, "{kept} bytes kept");
        }
        let Kind::Json(frames) = &r.kind else {
            panic!("a JSON reader");
        };
        assert!(frames.iter().map(Bytes::len).sum::<usize>() >= JSON_TAIL);
        assert_eq!(r.finish().total(), 200_003);
    }

    #[test]
    fn usage_from_every_protocol_json_and_stream() {
        let chat = r#"{"id":"c","choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\": 999}"}}],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(
            read(Protocol::Chat, false, chat),
            Tokens {
                input: 12,
                output: 5,
                cached: 4
            }
        );
        let chat_sse = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
        assert_eq!(read(Protocol::Chat, true, chat_sse).total(), 10);
        let messages = r#"{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_read_input_tokens":20,"cache_creation_input_tokens":5,"output_tokens":8}}"#;
        assert_eq!(
            read(Protocol::Messages, false, messages),
            Tokens {
                input: 35,
                output: 8,
                cached: 20
            }
        );
        let messages_sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(
            read(Protocol::Messages, true, messages_sse),
            Tokens {
                input: 9,
                output: 30,
                cached: 0
            }
        );
        let responses_sse = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":11,\"output_tokens\":6,\"input_tokens_details\":{\"cached_tokens\":2}}}}\n\n";
        assert_eq!(
            read(Protocol::Responses, true, responses_sse),
            Tokens {
                input: 11,
                output: 6,
                cached: 2
            }
        );
        let responses = r#"{"output":[],"usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(read(Protocol::Responses, false, responses).total(), 7);
        assert_eq!(read(Protocol::Chat, false, "not json").total(), 0);
    }

    /// A stream event's usage as it was read from a `Value` tree before [`UsageEvent`]: the
    /// reference the typed read is held to.
    fn usage_by_tree(protocol: Protocol, data: &str, usage: &mut ir::Usage) {
        use serde_json::Value;
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let u = match protocol {
            Protocol::Chat => v.get("usage"),
            Protocol::Messages => {
                translate::common::at(&v, &["message", "usage"]).or_else(|| v.get("usage"))
            }
            Protocol::Responses => translate::common::at(&v, &["response", "usage"]),
        };
        if let Some(u) = u.filter(|u| u.is_object()) {
            match protocol {
                Protocol::Chat => *usage = translate::chat::usage_from(u),
                Protocol::Messages => translate::messages::usage_from(u, usage),
                Protocol::Responses => *usage = translate::responses::usage_from(u),
            }
        }
    }

    #[test]
    fn an_events_usage_reads_as_its_tree_read() {
        let events = [
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":1}}}"#,
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":9,"cache_read_input_tokens":4,"output_tokens":1}}}"#,
            r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":30,"output_tokens_details":{"thinking_tokens":5}}}"#,
            r#"{"type":"message_start","message":{"usage":null},"usage":{"input_tokens":5}}"#,
            r#"{"type":"message_start","message":7,"usage":{"input_tokens":5}}"#,
            r#"{"type":"response.completed","response":{"usage":{"input_tokens":11,"output_tokens":6,"input_tokens_details":{"cached_tokens":2}}}}"#,
            r#"{"usage":[1],"message":{"usage":"x"},"response":{"usage":{"input_tokens":-1,"output_tokens":2.5}}}"#,
            r#"{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2}}"#,
            "not json",
        ];
        for protocol in [Protocol::Chat, Protocol::Messages, Protocol::Responses] {
            for data in events {
                let start = ir::Usage {
                    input: 100,
                    output: 100,
                    ..ir::Usage::default()
                };
                let (mut typed, mut tree) = (start, start);
                if let Ok(e) = translate::lax::parse::<UsageEvent<'_>>(data.as_bytes()) {
                    e.read_into(protocol, &mut typed);
                }
                usage_by_tree(protocol, data, &mut tree);
                assert_eq!(typed, tree, "{protocol:?} {data}");
            }
        }
    }

    /// The search `last_usage` made with a two-way searcher, kept as the reference it keeps to.
    fn last_usage_by_finder(tail: &[u8]) -> Option<translate::counts::Counts<'_>> {
        let finder = memchr::memmem::FinderRev::new(b"\"usage\"");
        let mut end = tail.len();
        while let Some(at) = finder.rfind(&tail[..end]) {
            if at == 0 || tail[at - 1] != b'\\' {
                let rest = tail[at + finder.needle().len()..].trim_ascii_start();
                if let Some(value) = rest.strip_prefix(b":") {
                    if let Some(c) = translate::counts::Counts::object_at(value.trim_ascii_start())
                    {
                        return Some(c);
                    }
                }
            }
            end = at;
        }
        None
    }

    /// `last_usage` of `tail`, checked to be the reference's.
    fn checked_last_usage(tail: &[u8]) -> Option<u64> {
        let found = last_usage(tail);
        assert_eq!(
            format!("{found:?}"),
            format!("{:?}", last_usage_by_finder(tail)),
            "{}",
            String::from_utf8_lossy(tail)
        );
        found.map(|c| {
            let mut usage = ir::Usage::default();
            c.read_into(Protocol::Chat, &mut usage);
            usage.input
        })
    }

    #[test]
    fn the_last_usage_key_holding_an_object_is_the_one_read() {
        let cases: &[(&str, Option<u64>)] = &[
            (
                r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"mock-gpt","system_fingerprint":"fp_mock","choices":[{"index":0,"message":{"role":"assistant","content":"long enough","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":20,"total_tokens":60}}"#,
                Some(40),
            ),
            (
                r#"{"content":"say \"usage\": {\"prompt_tokens\": 999}","usage":{"prompt_tokens":1}}"#,
                Some(1),
            ),
            (
                r#"{"usage":{"prompt_tokens":1},"content":"say \"usage\": {\"prompt_tokens\": 999}"}"#,
                Some(1),
            ),
            (
                r#"{"usage":{"prompt_tokens":1},"x":1,"usage":{"prompt_tokens":2}}"#,
                Some(2),
            ),
            (
                r#"{"a":{"usage":{"prompt_tokens":1}},"usage":{"prompt_tokens":2}}"#,
                Some(2),
            ),
            (
                r#"{"usage":{"prompt_tokens":1},"b":{"usage":null},"c":{"usage":{"x":}}}"#,
                Some(1),
            ),
            ("{\"usage\" \n:\t\r {\n\"prompt_tokens\" : 3 } }", Some(3)),
            (r#""usage":{"prompt_tokens":4}"#, Some(4)),
            (r#"x"usage"usage":{"prompt_tokens":5}"#, Some(5)),
            (r#"{"xusage":{"prompt_tokens":6}}"#, None),
            (r#"{"usagex":{"prompt_tokens":6}}"#, None),
            (r#"\"usage":{"prompt_tokens":7}"#, None),
            (r#"{"usage":"{\"prompt_tokens\":8}"}"#, None),
            (r#"{"usage":{"prompt_tokens":9"#, None),
            ("", None),
            ("g", None),
            ("usage\"", None),
            ("\"usage\"", None),
            ("\"usage\":", None),
        ];
        for (tail, want) in cases {
            assert_eq!(checked_last_usage(tail.as_bytes()), *want, "{tail}");
        }
    }

    /// Every one-piece edit of a reply's end: the search finds what the two-way search found.
    #[test]
    fn one_edit_from_a_reply_the_search_finds_what_it_found() {
        let reply = r#"{"c":"a \"usage\":{\"prompt_tokens\":9}","usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":1}},"g":"usage"}"#;
        let pieces = [
            "\"usage\":",
            "\"usage\"",
            "\\",
            "\"",
            "{",
            "}",
            " ",
            ":",
            "g",
            "1",
            "{\"prompt_tokens\":2}",
        ];
        let mut found = 0;
        for at in 0..=reply.len() {
            for piece in pieces {
                let mut edited = reply.as_bytes().to_vec();
                edited.splice(at..at, piece.bytes());
                found += usize::from(checked_last_usage(&edited).is_some());
                if at < reply.len() {
                    let mut replaced = reply.as_bytes().to_vec();
                    replaced.splice(at..=at, piece.bytes());
                    found += usize::from(checked_last_usage(&replaced).is_some());
                }
            }
            if at < reply.len() {
                let mut dropped = reply.as_bytes().to_vec();
                dropped.remove(at);
                found += usize::from(checked_last_usage(&dropped).is_some());
            }
        }
        assert!(found > 1000, "usage found in only {found} edited replies");
    }

    #[test]
    fn a_frame_of_whole_events_is_read_as_byte_by_byte_under_every_line_end() {
        let messages_sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\ndata: \"usage\":{\"output_tokens\":30}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for end in ["\n", "\r\n", "\r"] {
            let body = messages_sse.replace('\n', end);
            let mut whole = UsageReader::new(Protocol::Messages, true);
            whole.feed(&Bytes::from(body.clone()));
            let want = Tokens {
                input: 9,
                output: 30,
                cached: 0,
            };
            assert_eq!(whole.finish(), want, "{end:?}");
            assert_eq!(read(Protocol::Messages, true, &body), want, "{end:?}");
        }
    }

    #[test]
    fn null_usage_chunks_are_skipped_and_the_object_still_read() {
        let chunk = |content: &str, usage: &str| {
            format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{content}\"}}}}],\"usage\" : {usage}}}\n\n")
        };
        let mut body = String::new();
        for i in 0..5 {
            body.push_str(&chunk(&format!("w{i}"), "null"));
        }
        body.push_str(&chunk("", "{\"prompt_tokens\":7,\"completion_tokens\":3}"));
        body.push_str(&chunk("late", "null"));
        body.push_str("data: [DONE]\n\n");
        assert_eq!(read(Protocol::Chat, true, &body).total(), 10);
        assert!(!usage_object_in(chunk("x", "null").as_bytes()));
        assert!(!usage_object_in(b"data: {\"choices\":[]}"));
        assert!(usage_object_in(chunk("x", "{}").as_bytes()));
        // A key followed by something unexpected is parsed rather than guessed about.
        assert!(usage_object_in(b"data: {\"usage\"}"));
    }

    #[test]
    fn stream_usage_is_read_under_every_line_end() {
        // The reader looked for blank lines as LF LF or CRLF CRLF only (a CR-only stream's
        // usage was lost) and searched its whole pending event again with every frame (up to
        // 64 KiB a frame: found by the body_wrappers fuzz target's linear-time check).
        let messages_sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for end in ["\n", "\r\n", "\r"] {
            let body = messages_sse.replace('\n', end);
            assert_eq!(read(Protocol::Messages, true, &body).total(), 39, "{end:?}");
        }
        let chat =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\r\r";
        assert_eq!(read(Protocol::Chat, true, chat).total(), 10);
    }

    /// A translated stream is charged from its decoder's counts (`Usage::settle_read`): for
    /// every upstream protocol and line end, the tokens the reader finds in the same bytes.
    #[test]
    fn a_translators_counts_are_the_readers() {
        use crate::translate::{chat, messages, responses, StreamDecoder};
        let chunk = |json: &str| format!("data: {json}\n\n");
        let chat_sse = [
            chunk(r#"{"id":"c","choices":[{"index":0,"delta":{"content":"the \"usage\": 5"}}]}"#),
            chunk(r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#),
            chunk(r#"{"id":"c","choices":[],"usage":{"prompt_tokens":21,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":16,"cache_write_tokens":1},"completion_tokens_details":{"reasoning_tokens":1}}}"#),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        // Read by the decoder's general reader: an error chunk that reports usage.
        let chat_error = chunk(
            r#"{"error":{"message":"overloaded"},"usage":{"prompt_tokens":4,"completion_tokens":0}}"#,
        );
        let messages_sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":20,\"cache_creation_input_tokens\":5,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":30}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let responses_sse = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"delta\":\"hi\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":11,\"output_tokens\":6,\"input_tokens_details\":{\"cached_tokens\":2}}}}\n\n";
        let responses_failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"error\":{\"message\":\"no\"},\"usage\":{\"input_tokens\":8,\"output_tokens\":3}}}\n\n";
        let cases: [(Protocol, &str); 5] = [
            (Protocol::Chat, &chat_sse),
            (Protocol::Chat, &chat_error),
            (Protocol::Messages, messages_sse),
            (Protocol::Responses, responses_sse),
            (Protocol::Responses, responses_failed),
        ];
        for (protocol, body) in cases {
            for end in ["\n", "\r\n"] {
                let body = body.replace('\n', end);
                let want = read(protocol, true, &body);
                assert!(want.total() > 0, "{body}");
                let mut decoder = match protocol {
                    Protocol::Chat => StreamDecoder::Chat(chat::StreamDecoder::default()),
                    Protocol::Messages => {
                        StreamDecoder::Messages(messages::StreamDecoder::new(false))
                    }
                    Protocol::Responses => {
                        StreamDecoder::Responses(responses::StreamDecoder::default())
                    }
                };
                let mut sse = crate::sse::SseDecoder::with_limit(1 << 20);
                let mut events = Vec::new();
                sse.feed_with(body.as_bytes(), |ev| decoder.decode(ev, &mut events))
                    .unwrap();
                let mut counted = UsageReader::new(protocol, true);
                counted.usage = decoder.usage();
                assert_eq!(counted.finish(), want, "{protocol:?} {body}");
            }
        }
    }
}
