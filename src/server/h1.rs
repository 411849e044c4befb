//! The server side of HTTP/1.1: each request head parsed from the connection's own buffer, its body handed to the pipeline whole or as it arrives, and each response written with every frame already available in one write.
//!
//! hyper's server did the same job through a dispatcher, a body channel and an encoder queue:
//! about a fifth of the code lines a kept-alive request ran through (benches/segments.sh). Here
//! one state machine, polled by the connection's task, owns the socket; a body that came with
//! its head (most requests) is a slice of the read buffer, and only a body still on its way
//! is fed to the pipeline through [`FedBody`], on the same task.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body as _, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::boxed::{Body, BoxError};
use crate::http1::{header_line as line, parse_length, Chunked, FramingHeaders};

/// The largest request head accepted; a longer one is answered 431.
pub const MAX_HEAD: usize = 64 * 1024;
/// Headers in one request head (hyper's default).
const MAX_HEADERS: usize = 100;
/// What one read asks the socket for at least.
const READ_SIZE: usize = 8 * 1024;
/// The most a read of a request body with a known length asks for at once.
const MAX_BODY_READ: usize = 256 * 1024;
/// Response bytes gathered before they are written even if more frames are ready.
const WRITE_BATCH: usize = 64 * 1024;
/// A write buffer kept between requests up to this size; a larger one is let go.
const KEEP_OUT: usize = 16 * 1024;
/// How much of a refused body's rest is read and dropped after the refusal, and for how long.
const LINGER_BYTES: u64 = 16 * 1024 * 1024;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// A request body as the pipeline reads it.
pub enum ClientBody {
    /// All of it, read with the head (`None`: the request has none).
    Full(Option<Bytes>),
    /// The rest still on its way over an HTTP/1.1 connection.
    Fed(FedBody),
    /// An HTTP/2 stream's body.
    H2(hyper::body::Incoming),
}

impl ClientBody {
    /// The body is refused and will not be read: what is left of it is read and dropped while
    /// the refusal goes out, so that a client still sending reads the answer rather than a
    /// reset (a lingering close, as nginx does).
    pub fn linger(self) {
        match self {
            ClientBody::Full(_) => {}
            ClientBody::Fed(fed) => fed.feed.lock().linger = true,
            ClientBody::H2(body) => linger_h2(body),
        }
    }
}

/// An HTTP/2 stream's body is read by its connection's own task: drained from a task of its own.
fn linger_h2(mut body: hyper::body::Incoming) {
    use http_body_util::BodyExt;
    let drain = async move {
        let mut read: u64 = 0;
        let _ = tokio::time::timeout(LINGER_TIME, async {
            while let Some(Ok(frame)) = body.frame().await {
                read += frame.data_ref().map_or(0, |d| d.len() as u64);
                if read > LINGER_BYTES {
                    break;
                }
            }
        })
        .await;
    };
    #[expect(
        clippy::disallowed_methods,
        reason = "bounded by LINGER_TIME and LINGER_BYTES; it must outlive the request, whose response is the refusal"
    )]
    tokio::spawn(drain);
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ClientBody::Fed(fed) => fed.poll(cx),
            ClientBody::H2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Full(bytes) => bytes.is_none(),
            ClientBody::Fed(fed) => {
                let fed = fed.feed.lock();
                fed.end && fed.data.is_none()
            }
            ClientBody::H2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            ClientBody::Fed(_) => SizeHint::default(),
            ClientBody::H2(body) => body.size_hint(),
        }
    }
}

/// The part of a request body still to come, fed by the connection as the pipeline asks for it.
pub struct FedBody {
    feed: Arc<Feed>,
}

impl FedBody {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut fed = self.feed.lock();
        if let Some(data) = fed.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(e) = fed.error {
            return Poll::Ready(Some(Err(e.into())));
        }
        if fed.end {
            return Poll::Ready(None);
        }
        fed.wanted = true;
        if !fed.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            fed.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for FedBody {
    fn drop(&mut self) {
        self.feed.lock().dropped = true;
    }
}

/// What the connection and a [`FedBody`] share. Both are polled by the connection's task, so
/// the lock is never contended; it is there because the pipeline's future must be `Send`.
#[derive(Default)]
struct Feed(Mutex<Fed>);

impl Feed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Fed> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct Fed {
    /// Bytes de-framed and not yet taken: one run at a time, so a body that is not read is not
    /// read from the socket either.
    data: Option<Bytes>,
    /// The body's last byte has been fed.
    end: bool,
    error: Option<&'static str>,
    /// The body was asked for a frame and had none.
    wanted: bool,
    waker: Option<Waker>,
    /// The pipeline refused the body ([`ClientBody::linger`]).
    linger: bool,
    /// The pipeline let go of the body.
    dropped: bool,
}

impl Fed {
    /// What one read of the body got; `end`: it was the body's last.
    fn put(&mut self, got: Result<Option<Bytes>, &'static str>, end: bool) {
        match got {
            Ok(data) => {
                self.data = data;
                self.end = end;
            }
            Err(e) => self.error = Some(e),
        }
    }
}

/// How the rest of a request body is delimited on the wire.
enum Framing {
    Length(u64),
    Chunked(Chunked),
}

/// A request body being read from the connection.
struct Reading {
    framing: Framing,
    feed: Arc<Feed>,
    /// `Expect: 100-continue`, and no `100 Continue` sent yet.
    expects: bool,
}

impl Reading {
    fn done(&self) -> bool {
        match &self.framing {
            Framing::Length(left) => *left == 0,
            Framing::Chunked(c) => c.is_done(),
        }
    }

    /// Takes what `buf` holds of the body (and leaves what follows it); `Err` says why the
    /// body cannot be read on.
    fn take(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, &'static str> {
        match &mut self.framing {
            Framing::Length(left) => {
                let n = usize::try_from(*left).map_or(buf.len(), |l| l.min(buf.len()));
                *left -= n as u64;
                Ok((n > 0).then(|| buf.split_to(n).freeze()))
            }
            Framing::Chunked(c) => c.decode(buf).map_err(|e| e.0),
        }
    }
}

/// What the connection knows of the request being answered.
#[derive(Clone, Copy)]
struct Asked {
    head: bool,
    http10: bool,
    /// The client lets the connection carry another request after this one.
    keep_alive: bool,
}

/// How a response's body goes on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// No body (HEAD, 204, 304), whatever the response's body holds.
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes: an HTTP/1.0 client and a body of unknown length.
    Close,
}

enum State<F> {
    /// Waiting for, or parsing, the next request head.
    Head,
    /// The pipeline is answering; the request's body is fed to it as it asks.
    Serving {
        answer: F,
        asked: Asked,
    },
    /// The response is going out.
    Writing {
        body: Body,
        out: Out,
        asked: Asked,
        /// The body has ended (and its framing's end is in the write buffer).
        ended: bool,
    },
    /// A refused body's rest read and dropped before the connection closes.
    Draining {
        left: u64,
        until: Pin<Box<tokio::time::Sleep>>,
    },
    /// What is in the write buffer goes out, then the connection is shut.
    Closing,
    Done,
}

/// One HTTP/1.1 client connection: requests served in turn, each answered by `service`.
pub struct Conn<I, S, F> {
    io: I,
    /// Read and not yet parsed: the next head, or the rest of a body.
    buf: BytesMut,
    /// To be written, from `written` on.
    wbuf: Vec<u8>,
    written: usize,
    service: S,
    state: State<F>,
    reading: Option<Reading>,
    stopping: bool,
}

impl<I, S, F> Conn<I, S, F>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: FnMut(Request<ClientBody>) -> F,
    F: Future<Output = Response<Body>> + Unpin,
{
    /// `first`: bytes already read from `io` (the sniffed start of the connection).
    pub fn new(io: I, first: BytesMut, service: S) -> Self {
        Self {
            io,
            buf: first,
            wbuf: Vec::new(),
            written: 0,
            service,
            state: State::Head,
            reading: None,
            stopping: false,
        }
    }

    /// Takes no new request: an idle connection closes at once, a busy one after its response.
    pub fn graceful_shutdown(self: Pin<&mut Self>)
    where
        S: Unpin,
    {
        self.get_mut().stopping = true;
    }

    /// Reads more of the connection into `buf`: the count read, 0 at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        fill(&mut self.io, &mut self.buf, cx)
    }

    /// Writes the write buffer out and flushes it.
    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        flush(&mut self.io, &mut self.wbuf, &mut self.written, cx)
    }

    /// A request head is parsed: the pipeline is handed the request.
    fn start(&mut self, parsed: Parsed) {
        let Parsed {
            mut request,
            framing,
            asked,
            expects,
        } = parsed;
        let body = match framing {
            Framing::Length(0) => ClientBody::Full(None),
            Framing::Length(n) if n <= self.buf.len() as u64 => {
                ClientBody::Full(Some(self.buf.split_to(n as usize).freeze()))
            }
            framing => {
                let mut reading = Reading {
                    framing,
                    feed: Arc::default(),
                    expects,
                };
                let body = match reading.take(&mut self.buf) {
                    Ok(data) if reading.done() => ClientBody::Full(data),
                    got => {
                        // `100 Continue` is for a client still waiting to send its body.
                        reading.expects &= matches!(got, Ok(None));
                        reading.feed.lock().put(got, false);
                        ClientBody::Fed(FedBody {
                            feed: reading.feed.clone(),
                        })
                    }
                };
                self.reading = Some(reading);
                body
            }
        };
        *request.body_mut() = body;
        let answer = (self.service)(request);
        self.state = State::Serving { answer, asked };
    }

    /// While the pipeline answers: feeds its body, and notices a client that has left.
    /// `Ready(false)`: something changed, poll the answer again; `Ready(true)`: the client left.
    fn poll_feed(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let Self {
            io,
            buf,
            wbuf,
            written,
            reading,
            ..
        } = self;
        // A `100 Continue` still going out.
        ready!(flush(io, wbuf, written, cx))?;
        let Some(reading) = reading.as_mut().filter(|r| !r.done()) else {
            // The body is read: a read now only tells a client that has gone (a pipelined next
            // request is kept for later, up to a head's size).
            if buf.len() >= MAX_HEAD {
                return Poll::Pending;
            }
            return Poll::Ready(Ok(ready!(fill(io, buf, cx))? == 0));
        };
        {
            let fed = reading.feed.lock();
            if fed.dropped || !fed.wanted || fed.data.is_some() || fed.error.is_some() {
                // Not read, or not asked for yet: the socket is left alone until it is.
                return Poll::Pending;
            }
        }
        if reading.expects {
            reading.expects = false;
            wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            ready!(flush(io, wbuf, written, cx))?;
        }
        if let Framing::Length(left) = reading.framing {
            // A large upload is read in reads its own size, not the head's.
            let want = usize::try_from(left).map_or(MAX_BODY_READ, |l| l.min(MAX_BODY_READ));
            buf.reserve(want);
        }
        let closed = buf.is_empty() && ready!(fill(io, buf, cx))? == 0;
        let got = if closed {
            Err("the client closed the connection before the end of its request body")
        } else {
            reading.take(buf)
        };
        let done = reading.done();
        let mut fed = reading.feed.lock();
        fed.put(got, done);
        if fed.data.is_some() || fed.end || fed.error.is_some() {
            fed.wanted = false;
            wake(&mut fed, cx);
        }
        Poll::Ready(Ok(false))
    }

    /// The pipeline's answer: its head into the write buffer, and how its body goes out.
    fn respond(&mut self, resp: Response<Body>, asked: Asked) {
        let (parts, body) = resp.into_parts();
        let closing = !asked.keep_alive || self.stopping;
        let out = write_head(
            &mut self.wbuf,
            &parts.status,
            &parts.headers,
            &body,
            asked,
            closing,
        );
        self.state = State::Writing {
            body,
            out,
            asked,
            ended: out == Out::None,
        };
    }

    /// Gathers the frames the body has ready into the write buffer; true once it has ended.
    fn gather(
        wbuf: &mut Vec<u8>,
        body: &mut Body,
        out: &mut Out,
        cx: &mut Context<'_>,
    ) -> io::Result<bool> {
        while wbuf.len() < WRITE_BATCH {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => return Ok(false),
                Poll::Ready(None) => {
                    return match *out {
                        Out::Chunked => {
                            wbuf.extend_from_slice(b"0\r\n\r\n");
                            Ok(true)
                        }
                        // Shorter than it said: the client must not take it for whole.
                        Out::Length(left) if left > 0 => Err(io::Error::other(
                            "the response body ended before its content-length",
                        )),
                        _ => Ok(true),
                    };
                }
                Poll::Ready(Some(Err(e))) => {
                    return Err(io::Error::other(format!("the response body failed: {e}")))
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers have no place in an HTTP/1.1 response the gateway writes.
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    match out {
                        Out::Chunked => {
                            let mut hex = [0u8; 16];
                            wbuf.extend_from_slice(hex_len(data.len(), &mut hex));
                            wbuf.extend_from_slice(b"\r\n");
                            wbuf.extend_from_slice(&data);
                            wbuf.extend_from_slice(b"\r\n");
                        }
                        Out::Length(left) => {
                            let n =
                                usize::try_from(*left).map_or(data.len(), |l| l.min(data.len()));
                            wbuf.extend_from_slice(&data[..n]);
                            *left -= n as u64;
                            if n < data.len() {
                                return Err(io::Error::other(
                                    "the response body is longer than its content-length",
                                ));
                            }
                        }
                        Out::Close => wbuf.extend_from_slice(&data),
                        Out::None => {}
                    }
                }
            }
        }
        Ok(false)
    }

    /// The response is out: the next request, or the connection's end.
    fn finish(&mut self, out: Out, asked: Asked) {
        let body_read = self.reading.as_ref().is_none_or(Reading::done);
        let again = body_read && asked.keep_alive && !self.stopping && out != Out::Close;
        let reading = self.reading.take();
        self.state = if again {
            State::Head
        } else {
            match reading {
                Some(r) if !r.done() && r.feed.lock().linger => {
                    self.reading = Some(r);
                    State::Draining {
                        left: LINGER_BYTES,
                        until: Box::pin(tokio::time::sleep(LINGER_TIME)),
                    }
                }
                _ => State::Closing,
            }
        };
    }
}

impl<I, S, F> Future for Conn<I, S, F>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: FnMut(Request<ClientBody>) -> F + Unpin,
    F: Future<Output = Response<Body>> + Unpin,
{
    type Output = io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Head => {
                    if this.stopping {
                        this.state = State::Closing;
                        continue;
                    }
                    if !this.buf.is_empty() {
                        match parse(&mut this.buf) {
                            Ok(Some(parsed)) => {
                                this.start(parsed);
                                continue;
                            }
                            Ok(None) => {}
                            Err(status) => {
                                refuse(&mut this.wbuf, status);
                                this.state = State::Closing;
                                continue;
                            }
                        }
                    }
                    match ready!(this.poll_fill(cx)) {
                        Ok(0) => {
                            // Closed between requests, or in the middle of a head: either way
                            // there is nothing to answer.
                            this.state = State::Done;
                            return Poll::Ready(Ok(()));
                        }
                        Ok(_) => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                State::Serving { answer, asked } => {
                    if let Poll::Ready(resp) = Pin::new(answer).poll(cx) {
                        let asked = *asked;
                        this.respond(resp, asked);
                        continue;
                    }
                    match this.poll_feed(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(false)) => {}
                        Poll::Ready(Ok(true)) => {
                            // The client has gone: its answer is dropped, and with it the
                            // upstream call.
                            this.state = State::Done;
                            return Poll::Ready(Ok(()));
                        }
                        Poll::Ready(Err(e)) => {
                            this.state = State::Done;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                State::Writing {
                    body,
                    out,
                    asked,
                    ended,
                } => {
                    if !*ended {
                        match Self::gather(&mut this.wbuf, body, out, cx) {
                            Ok(e) => *ended = e,
                            Err(e) => {
                                // Written so far, then closed: a client cannot take a cut
                                // response for a whole one.
                                tracing::debug!(error = %e, "response cut off");
                                this.state = State::Closing;
                                continue;
                            }
                        }
                    }
                    let (ended, out, asked) = (*ended, *out, *asked);
                    if let Err(e) = ready!(this.poll_flush_out(cx)) {
                        this.state = State::Done;
                        return Poll::Ready(Err(e));
                    }
                    if ended {
                        // The body is dropped here: its record and the connection's request
                        // count end with the response's last byte.
                        this.finish(out, asked);
                    } else if this.wbuf.is_empty() {
                        // All written and the body has nothing more yet: it wakes the task.
                        return Poll::Pending;
                    }
                }
                State::Draining { left, until } => {
                    if until.as_mut().poll(cx).is_ready() {
                        this.state = State::Closing;
                        continue;
                    }
                    let Some(reading) = this.reading.as_mut() else {
                        this.state = State::Closing;
                        continue;
                    };
                    if !this.buf.is_empty() {
                        let before = this.buf.len();
                        let failed = reading.take(&mut this.buf).is_err();
                        let used = (before - this.buf.len()) as u64;
                        if failed || reading.done() || used >= *left {
                            this.state = State::Closing;
                            continue;
                        }
                        *left -= used;
                        this.buf.clear();
                    }
                    match ready!(this.poll_fill(cx)) {
                        Ok(0) | Err(_) => this.state = State::Closing,
                        Ok(_) => {}
                    }
                }
                State::Closing => {
                    this.reading = None;
                    if let Err(e) = ready!(this.poll_flush_out(cx)) {
                        this.state = State::Done;
                        return Poll::Ready(Err(e));
                    }
                    let shut = ready!(Pin::new(&mut this.io).poll_shutdown(cx));
                    this.state = State::Done;
                    return Poll::Ready(shut);
                }
                State::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// Reads more of `io` into `buf`: the count read, 0 at its end.
fn fill<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_SIZE / 2 {
        buf.reserve(READ_SIZE);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// Writes `wbuf` from `written` on, then flushes `io`; `wbuf` is emptied once it is all out.
fn flush<I: AsyncWrite + Unpin>(
    io: &mut I,
    wbuf: &mut Vec<u8>,
    written: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while *written < wbuf.len() {
        let n = ready!(Pin::new(&mut *io).poll_write(cx, &wbuf[*written..]))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *written += n;
    }
    if !wbuf.is_empty() {
        wbuf.clear();
        *written = 0;
        if wbuf.capacity() > KEEP_OUT {
            *wbuf = Vec::new();
        }
    }
    // Every time, not only after a write: a TLS session's flush that was pending last time
    // still has records to send.
    Pin::new(io).poll_flush(cx)
}

/// Wakes the body's task if it is not the one polling now (it always is, but for a body
/// someone moved elsewhere).
fn wake(fed: &mut Fed, cx: &Context<'_>) {
    if let Some(w) = fed.waker.take() {
        if !w.will_wake(cx.waker()) {
            w.wake();
        }
    }
}

/// A parsed request head.
struct Parsed {
    request: Request<ClientBody>,
    framing: Framing,
    asked: Asked,
    expects: bool,
}

/// Parses the request head at the start of `buf` and removes it. `Ok(None)`: not complete yet;
/// `Err`: the status to refuse it with.
fn parse(buf: &mut BytesMut) -> Result<Option<Parsed>, StatusCode> {
    // Uninitialised slots: zeroing a hundred of them costs more than parsing a usual head.
    let mut slots =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, &mut slots)
    {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        }
        Err(_) => return Err(StatusCode::BAD_REQUEST),
    };
    if len > MAX_HEAD {
        return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }
    let bad = StatusCode::BAD_REQUEST;
    // A complete parse has both; `bad` only keeps this free of a panic.
    let method = Method::from_bytes(req.method.ok_or(bad)?.as_bytes()).map_err(|_| bad)?;
    let http10 = req.version == Some(0);
    let base = buf.as_ptr() as usize;
    let path = req.path.ok_or(bad)?;
    let path_at = path.as_ptr() as usize - base;
    let path_span = (path_at, path_at + path.len());
    // What framing and persistence need is read on the way.
    let mut seen = FramingHeaders::default();
    let mut expects = false;
    // Offsets, so the values can be cut from the head once it is frozen.
    let mut spans: smallvec::SmallVec<[(HeaderName, usize, usize); 16]> = smallvec::SmallVec::new();
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| bad)?;
        if !seen.note(&name, h.value) && name == header::EXPECT {
            expects = h.value.eq_ignore_ascii_case(b"100-continue");
        }
        let start = h.value.as_ptr() as usize - base;
        spans.push((name, start, start + h.value.len()));
    }
    let length = seen.length.transpose().map_err(|_| bad)?;
    // RFC 9112 §6.3: a transfer coding wins over a length, and a request whose last coding is
    // not chunked cannot be delimited at all (nor can an HTTP/1.0 one, which has no codings).
    let framing = match (seen.coded, length) {
        (true, _) if http10 || !seen.chunked => return Err(bad),
        (true, _) => Framing::Chunked(Chunked::default()),
        (false, n) => Framing::Length(n.unwrap_or(0)),
    };
    // Both: a smuggling attempt or a broken client. Read as chunked, then closed; the length
    // is left out so that nothing after this trusts it.
    let smuggled = seen.coded && length.is_some();
    let keep_alive = (seen.keep_alive || !http10) && !seen.close && !smuggled;
    let raw = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(raw.slice(path_span.0..path_span.1)).map_err(|_| bad)?;
    let mut headers = HeaderMap::with_capacity(spans.len());
    for (name, start, end) in spans.drain(..) {
        if smuggled && name == header::CONTENT_LENGTH {
            continue;
        }
        let value = HeaderValue::from_maybe_shared(raw.slice(start..end)).map_err(|_| bad)?;
        headers.append(name, value);
    }
    let asked = Asked {
        head: method == Method::HEAD,
        http10,
        keep_alive,
    };
    let mut request = Request::new(ClientBody::Full(None));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = if http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    *request.headers_mut() = headers;
    Ok(Some(Parsed {
        request,
        framing,
        asked,
        expects,
    }))
}

/// Writes a response head and says how its body goes out.
fn write_head(
    wbuf: &mut Vec<u8>,
    status: &StatusCode,
    headers: &HeaderMap,
    body: &Body,
    asked: Asked,
    mut closing: bool,
) -> Out {
    status_line(wbuf, *status);
    let mut length = None;
    let mut dated = false;
    for (name, value) in headers {
        // The connection's own framing and persistence are decided here.
        if name == header::TRANSFER_ENCODING || name == header::CONNECTION || name == "keep-alive" {
            continue;
        }
        if name == header::CONTENT_LENGTH {
            match parse_length(value.as_bytes()) {
                Some(n) if length.is_none() => length = Some(n),
                _ => continue,
            }
        }
        dated |= name == header::DATE;
        line(wbuf, name.as_str().as_bytes(), value.as_bytes());
    }
    if !dated {
        date::with(|d| line(wbuf, b"date", d));
    }
    let bodiless = status.is_informational()
        || *status == StatusCode::NO_CONTENT
        || *status == StatusCode::NOT_MODIFIED;
    let out = if bodiless {
        Out::None
    } else {
        let exact = body.size_hint().exact();
        if length.is_none() {
            if let Some(n) = exact {
                let mut digits = itoa::Buffer::new();
                line(wbuf, b"content-length", digits.format(n).as_bytes());
                length = Some(n);
            }
        }
        match length {
            _ if asked.head => Out::None,
            Some(n) => Out::Length(n),
            None if asked.http10 => Out::Close,
            None => {
                wbuf.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Out::Chunked
            }
        }
    };
    closing |= out == Out::Close;
    if closing {
        wbuf.extend_from_slice(b"connection: close\r\n");
    } else if asked.http10 {
        wbuf.extend_from_slice(b"connection: keep-alive\r\n");
    }
    wbuf.extend_from_slice(b"\r\n");
    out
}

/// The answer to a head that cannot be served; the connection closes after it.
fn refuse(wbuf: &mut Vec<u8>, status: StatusCode) {
    status_line(wbuf, status);
    wbuf.extend_from_slice(b"content-length: 0\r\nconnection: close\r\n");
    date::with(|d| line(wbuf, b"date", d));
    wbuf.extend_from_slice(b"\r\n");
}

fn status_line(wbuf: &mut Vec<u8>, status: StatusCode) {
    // Nearly every answer: one copy of a constant rather than four pieces.
    if status == StatusCode::OK {
        wbuf.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        return;
    }
    wbuf.extend_from_slice(b"HTTP/1.1 ");
    wbuf.extend_from_slice(status.as_str().as_bytes());
    wbuf.push(b' ');
    wbuf.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    wbuf.extend_from_slice(b"\r\n");
}

/// `n` in lower-case hex, in `out`'s tail.
fn hex_len(mut n: usize, out: &mut [u8; 16]) -> &[u8] {
    let mut at = out.len();
    loop {
        at -= 1;
        out[at] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            return &out[at..];
        }
    }
}

/// The `Date` header's value, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::io::Write;
    use std::time::{SystemTime, UNIX_EPOCH};

    /// An IMF-fixdate is 29 bytes.
    const LEN: usize = 29;

    thread_local! {
        static NOW: RefCell<(u64, [u8; LEN])> = const { RefCell::new((u64::MAX, [0; LEN])) };
    }

    pub fn with(f: impl FnOnce(&[u8])) {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        NOW.with(|cell| {
            let mut kept = cell.borrow_mut();
            if kept.0 != secs {
                let mut text = [0u8; LEN];
                let mut cursor = std::io::Cursor::new(&mut text[..]);
                if write!(cursor, "{}", httpdate::HttpDate::from(now)).is_ok() {
                    *kept = (secs, text);
                }
            }
            f(&kept.1);
        });
    }
}

#[cfg(test)]
mod tests;
