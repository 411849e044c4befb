//! Plain-HTTP/1.1 upstream connections driven inside the request's own task, pooled per authority.
//!
//! hyper-util's pooled client runs every connection as a task of its own, so each body frame
//! crosses from that task to the client connection's task through a channel, with a wake-up (often
//! on the other worker thread) per frame. Here the connection is read by whoever polls the response
//! body: the socket read, the de-framing and the client write of one upstream read happen in one
//! task poll, and everything one read brought (often many events) goes on as one frame. The wire
//! format is [`codec`]'s. HTTPS upstreams stay on the shared client, which negotiates HTTP/2.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::uri::{Authority, Uri};
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower_service::Service;

pub mod codec;

pub use codec::Error;
use codec::{Chunked, Framing};

use crate::phases::{self, Phase};

/// Authorities remembered before those with no idle connection are forgotten.
const MAX_ORIGINS: usize = 64;
/// The first read buffer of a connection; a stream's frames are far smaller.
const READ_SIZE: usize = 8 * 1024;
/// The read buffer grows (for large replies and downloads) up to this.
const MAX_READ_SIZE: usize = 256 * 1024;
/// A request body at most this long goes out in the same write as its head.
const INLINE_BODY: usize = 64 * 1024;

/// One HTTP/1.1 connection and the bytes read from it that no response has claimed yet.
struct Conn {
    io: TcpStream,
    buf: BytesMut,
    /// How much the next read asks room for: grows while reads fill it.
    read_size: usize,
}

impl Conn {
    fn new(io: TcpStream) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            read_size: READ_SIZE,
        }
    }

    /// Reads what the socket has into the buffer; `Ok(0)` at the upstream's close.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < self.read_size / 4 {
            self.buf.reserve(self.read_size);
        }
        let room = self.buf.capacity() - self.buf.len();
        // Through `AsyncRead`, not `try_read_buf`: a read that does not fill the room tells tokio
        // the socket is drained, so the idle check before the connection's next request needs no
        // system call of its own unless the upstream has written (or closed) since.
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        if n == room && self.read_size < MAX_READ_SIZE {
            self.read_size *= 2;
        }
        Poll::Ready(Ok(n))
    }

    /// Makes room for a response head before the request goes out. The last response's frames
    /// are usually written and dropped by then, so the buffer takes back its whole allocation
    /// in place; reading the next head into the tail the last response left would cost a second
    /// read whenever the response is larger than that tail.
    fn make_room(&mut self) {
        if self.buf.is_empty() {
            self.buf.reserve(self.read_size);
        }
    }

    /// True when the idle connection can take a request: the upstream has neither closed it nor
    /// sent anything unasked. The probe reads only if the runtime saw the socket become readable
    /// since its last read drained it; otherwise it answers `WouldBlock` without a system call.
    fn usable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// The idle connections to one upstream authority, and the `Host` header its requests carry.
struct Origin {
    authority: Authority,
    host: HeaderValue,
    idle: Vec<Idle>,
}

/// Why a request got no response head.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made.
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// The connection failed, or the answer was not HTTP, before the head was read.
    Request(Error),
    /// The connection ended before the head arrived, with nothing more said.
    Closed,
    /// The request URI names no host.
    NoAuthority,
}

/// Connections to plain-HTTP upstreams, reused in last-in-first-out order.
pub struct H1Pool {
    connector: HttpConnector,
    /// One list per event loop (`server::worker`): a socket is registered with the runtime that
    /// opened it, and read from another loop each of its readiness events would cross threads.
    origins: Box<[Mutex<Vec<Origin>>]>,
    idle_timeout: Duration,
    max_idle: usize,
}

/// A request as it goes on the wire: its head with a body up to [`INLINE_BODY`] after it, and a
/// longer body apart (written next rather than copied).
struct Outgoing {
    method: Method,
    wire: Vec<u8>,
    rest: Bytes,
    keep: codec::Keep,
}

impl H1Pool {
    pub fn new(
        connector: HttpConnector,
        idle_timeout: Duration,
        max_idle: usize,
        workers: usize,
    ) -> Self {
        Self {
            connector,
            origins: (0..workers.max(1)).map(|_| Mutex::default()).collect(),
            idle_timeout,
            max_idle,
        }
    }

    /// Sends `req` (an absolute `http://` URI) and waits for the response head. The returned body
    /// reads the connection; once read to its end the connection goes back to the pool.
    pub async fn send(
        self: &Arc<Self>,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, SendError> {
        let (parts, body) = req.into_parts();
        let body = full_bytes(body);
        self.send_with(
            &parts.method,
            &parts.uri,
            codec::map_headers(&parts.headers),
            body,
            codec::Keep::All,
        )
        .await
    }

    /// [`send`](Self::send) for a request whose headers `headers` hands to an emitter, written
    /// straight onto the wire with no header map between; the response's head has the headers
    /// `keep` asks for.
    pub async fn send_with(
        self: &Arc<Self>,
        method: &Method,
        uri: &Uri,
        headers: impl FnOnce(&mut codec::Emit<'_>),
        body: Bytes,
        keep: codec::Keep,
    ) -> Result<Response<PooledBody>, SendError> {
        let authority = uri.authority().cloned().ok_or(SendError::NoAuthority)?;
        let (idle, host) = self.checkout(&authority)?;
        phases::mark(Phase::Connection);
        let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
        let inline = body.len() <= INLINE_BODY;
        let mut wire = Vec::with_capacity(512 + if inline { body.len() } else { 0 });
        codec::write_head(&mut wire, method, target, &host, headers, body.len());
        let rest = match inline {
            true => {
                wire.extend_from_slice(&body);
                Bytes::new()
            }
            false => body,
        };
        let out = Outgoing {
            method: method.clone(),
            wire,
            rest,
            keep,
        };
        if let Some(conn) = idle {
            match exchange(conn, &out, true).await {
                Ok((head, conn)) => return Ok(self.wrap(head, conn, authority)),
                // An idle connection the upstream closed just as it was taken: the request was
                // not written, so it goes out again on a new connection.
                Err(Failure::NotSent) => {}
                Err(Failure::Failed(e)) => return Err(SendError::Request(e)),
                Err(Failure::Closed) => return Err(SendError::Closed),
            }
        }
        let conn = self.connect(uri.clone()).await?;
        match exchange(conn, &out, false).await {
            Ok((head, conn)) => Ok(self.wrap(head, conn, authority)),
            Err(Failure::NotSent | Failure::Closed) => Err(SendError::Closed),
            Err(Failure::Failed(e)) => Err(SendError::Request(e)),
        }
    }

    fn wrap(
        self: &Arc<Self>,
        head: codec::Head,
        conn: Box<Conn>,
        authority: Authority,
    ) -> Response<PooledBody> {
        let reading = match head.framing {
            Framing::Length(n) => Reading::Length(n),
            Framing::Chunked => Reading::Chunked(Chunked::default()),
            Framing::Close => Reading::Close,
        };
        let mut body = PooledBody {
            reading,
            conn: Some(conn),
            home: Some((Arc::clone(self), authority)),
            keep_alive: head.keep_alive,
        };
        if matches!(body.reading, Reading::Length(0)) {
            body.reading = Reading::Done;
            body.release();
        }
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        resp
    }

    /// A usable idle connection to `authority` if there is one, and the `Host` value for it.
    fn checkout(
        &self,
        authority: &Authority,
    ) -> Result<(Option<Box<Conn>>, HeaderValue), SendError> {
        let mut origins = self.lock();
        // Compared as written: `Authority`'s own `==` folds case byte by byte, several hundred
        // instructions a request, and every request to one upstream spells it the same way.
        let i = match origins
            .iter()
            .position(|o| o.authority.as_str() == authority.as_str())
        {
            Some(i) => i,
            None => {
                // Video files may come from any host: forget the ones with nothing pooled.
                if origins.len() >= MAX_ORIGINS {
                    origins.retain(|o| !o.idle.is_empty());
                }
                origins.push(Origin {
                    authority: authority.clone(),
                    host: host_value(authority)?,
                    idle: Vec::new(),
                });
                origins.len() - 1
            }
        };
        let origin = &mut origins[i];
        let now = Instant::now();
        // Oldest first: the expired ones are a prefix, closed here rather than left open.
        let expired = origin
            .idle
            .partition_point(|i| now.duration_since(i.since) >= self.idle_timeout);
        origin.idle.drain(..expired);
        while let Some(mut idle) = origin.idle.pop() {
            if idle.conn.usable() {
                return Ok((Some(idle.conn), origin.host.clone()));
            }
        }
        Ok((None, origin.host.clone()))
    }

    fn checkin(&self, authority: &Authority, mut conn: Box<Conn>) {
        // A buffer grown for a large reply is not kept for an idle connection.
        if conn.buf.capacity() > READ_SIZE {
            conn.buf = BytesMut::new();
            conn.read_size = READ_SIZE;
        }
        let mut origins = self.lock();
        if let Some(origin) = origins
            .iter_mut()
            .find(|o| o.authority.as_str() == authority.as_str())
        {
            if origin.idle.len() < self.max_idle {
                origin.idle.push(Idle {
                    conn,
                    since: Instant::now(),
                });
            }
        }
    }

    /// The calling event loop's lists.
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Origin>> {
        let shard = &self.origins[crate::server::worker() % self.origins.len()];
        // The lists hold no invariant a panicking holder could break halfway.
        shard
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn connect(&self, uri: Uri) -> Result<Box<Conn>, SendError> {
        let mut connector = self.connector.clone();
        let io: TokioIo<TcpStream> = connector
            .call(uri)
            .await
            .map_err(|e| SendError::Connect(Box::new(e)))?;
        Ok(Box::new(Conn::new(io.into_inner())))
    }
}

/// The bytes of a request body that is all in memory.
fn full_bytes(mut body: Full<Bytes>) -> Bytes {
    // `Full` yields its one frame at once, without waiting.
    match Pin::new(&mut body).poll_frame(&mut quiet()) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

enum Failure {
    /// The connection was found closed before any of the request went out.
    NotSent,
    Failed(Error),
    Closed,
}

/// Writes the request on `conn` and reads the response head, skipping interim (1xx) ones.
async fn exchange(
    mut conn: Box<Conn>,
    out: &Outgoing,
    reused: bool,
) -> Result<(codec::Head, Box<Conn>), Failure> {
    conn.make_room();
    phases::mark(Phase::Encoded);
    let written = match write_all(&mut conn.io, &out.wire).await {
        Ok(()) => write_all(&mut conn.io, &out.rest)
            .await
            .map_err(|(e, n)| (e, out.wire.len() + n)),
        Err(e) => Err(e),
    };
    phases::mark(Phase::Written);
    match written {
        Ok(()) => {}
        // A reused connection the upstream had already closed refuses the first byte.
        Err((_, 0)) if reused => return Err(Failure::NotSent),
        Err((e, _)) => return Err(Failure::Failed(Error::Io(e))),
    }
    loop {
        if let Some(head) =
            codec::parse_head(&mut conn.buf, &out.method, out.keep).map_err(Failure::Failed)?
        {
            if head.status.is_informational() {
                if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
                    return Err(Failure::Failed(Error::Head("an unasked protocol switch")));
                }
                continue;
            }
            phases::mark(Phase::Answered);
            return Ok((head, conn));
        }
        match poll_fn(|cx| conn.poll_fill(cx)).await {
            Ok(0) if conn.buf.is_empty() => return Err(Failure::Closed),
            Ok(0) => return Err(Failure::Failed(Error::Incomplete)),
            Ok(_) => {}
            Err(e) => return Err(Failure::Failed(Error::Io(e))),
        }
    }
}

/// Writes all of `bytes`; on failure, the error and how many bytes had gone out.
async fn write_all(io: &mut TcpStream, mut bytes: &[u8]) -> Result<(), (io::Error, usize)> {
    let mut sent = 0;
    while !bytes.is_empty() {
        match io.write(bytes).await {
            Ok(0) => return Err((io::ErrorKind::WriteZero.into(), sent)),
            Ok(n) => {
                sent += n;
                bytes = &bytes[n..];
            }
            Err(e) => return Err((e, sent)),
        }
    }
    Ok(())
}

/// Where a response body's reading stands.
#[derive(Debug)]
enum Reading {
    Length(u64),
    Chunked(Chunked),
    Close,
    Done,
}

/// A response body whose polling reads its connection; at its end the connection goes back to the
/// pool, and dropped earlier it closes the connection (the upstream sees the cancel).
pub struct PooledBody {
    reading: Reading,
    // Boxed: it stays put while pooled, and the body moves through the pipeline's layers.
    conn: Option<Box<Conn>>,
    home: Option<(Arc<H1Pool>, Authority)>,
    keep_alive: bool,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        loop {
            match this.next_data() {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Some(Err(this.fail(e)))),
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if matches!(this.reading, Reading::Close) => {
                    this.reading = Reading::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => return Poll::Ready(Some(Err(this.fail(Error::Incomplete)))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(this.fail(Error::Io(e))))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.reading, Reading::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.reading {
            Reading::Length(n) => SizeHint::with_exact(n),
            Reading::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl PooledBody {
    /// The body's next data from what is already read; at the body's end the connection is
    /// released.
    fn next_data(&mut self) -> Result<Option<Bytes>, Error> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        let buf = &mut conn.buf;
        let data = match &mut self.reading {
            Reading::Length(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(*left).map_or(buf.len(), |l| l.min(buf.len()));
                *left -= n as u64;
                let data = buf.split_to(n).freeze();
                if *left == 0 {
                    self.reading = Reading::Done;
                    self.release();
                }
                Some(data)
            }
            Reading::Chunked(dec) => {
                let data = dec.decode(buf)?;
                if dec.is_done() {
                    self.reading = Reading::Done;
                    self.release();
                }
                data
            }
            Reading::Close if buf.is_empty() => None,
            Reading::Close => Some(buf.split().freeze()),
            Reading::Done => None,
        };
        Ok(data)
    }

    fn fail(&mut self, e: Error) -> Error {
        self.conn = None;
        self.reading = Reading::Done;
        e
    }

    /// The body was read to its end: the connection returns to the pool if it can take another
    /// request (not when the upstream asked to close it, or sent more than the response).
    fn release(&mut self) {
        let (Some(conn), Some((pool, authority))) = (self.conn.take(), self.home.take()) else {
            return;
        };
        if self.keep_alive && conn.buf.is_empty() {
            pool.checkin(&authority, conn);
        }
    }
}

impl Drop for PooledBody {
    /// A body dropped before its end (a translator stops at the protocol's terminal event, before
    /// the chunked body's last chunk): what has already arrived is read, and a connection whose
    /// response is then complete goes back to the pool. One that is not (the client left
    /// mid-stream) is closed, so the upstream sees the cancel.
    fn drop(&mut self) {
        if matches!(self.reading, Reading::Done | Reading::Close) || self.conn.is_none() {
            return;
        }
        for _ in 0..2 {
            match self.next_data() {
                Ok(_) if matches!(self.reading, Reading::Done) => return,
                Ok(_) => {}
                Err(_) => return,
            }
            let Some(conn) = self.conn.as_mut() else {
                return;
            };
            match conn.poll_fill(&mut quiet()) {
                Poll::Ready(Ok(n)) if n > 0 => {}
                _ => return,
            }
        }
    }
}

/// A context whose waker does nothing, for polls whose wake-up comes another way.
fn quiet() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// `Host` as clients write it: the port only when it is not 80.
fn host_value(authority: &Authority) -> Result<HeaderValue, SendError> {
    let value = match authority.port_u16() {
        Some(port) if port != 80 => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    };
    HeaderValue::try_from(value).map_err(|_| SendError::NoAuthority)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[tokio::test]
    async fn a_connection_takes_back_its_whole_buffer_for_the_next_head_once_the_last_frames_are_gone(
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, _accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let mut conn = Conn::new(client.unwrap());
        conn.make_room();
        let start = conn.buf.as_ptr();
        assert!(conn.buf.capacity() >= READ_SIZE);
        // A response of 5 000 bytes read and handed on as frames, leaving a short tail.
        conn.buf.extend_from_slice(&[b'x'; 5000]);
        let frame = conn.buf.split_to(5000).freeze();
        assert!(conn.buf.capacity() < READ_SIZE);
        drop(frame);
        conn.make_room();
        assert!(conn.buf.capacity() >= READ_SIZE, "{}", conn.buf.capacity());
        assert_eq!(conn.buf.as_ptr(), start, "the buffer was allocated anew");
    }
}
