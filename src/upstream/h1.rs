//! Plain-HTTP/1.1 upstream connections driven inside the request's own task, pooled per authority.
//!
//! hyper-util's pooled client runs every connection as a task of its own, so each body frame
//! crosses from that task to the client connection's task through a channel, with a wake-up (often
//! on the other worker thread) per frame. Here the connection is polled by whoever polls the
//! response body: the socket read, the chunk decode and the client write of one upstream frame
//! happen in one task poll. HTTPS upstreams stay on the shared client, which negotiates HTTP/2.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{Authority, Parts, Uri};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

type Io = TokioIo<TcpStream>;

/// Authorities remembered before those with no idle connection are forgotten.
const MAX_ORIGINS: usize = 64;

/// One HTTP/1.1 connection: the handle that sends requests and the state machine that drives I/O.
struct Conn {
    tx: http1::SendRequest<Full<Bytes>>,
    driver: http1::Connection<Io, Full<Bytes>>,
}

impl Conn {
    /// Polls the connection's I/O; false once it has ended (closed by either side, or failed).
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        Pin::new(&mut self.driver).poll(cx).is_pending()
    }

    /// True when the connection can take a request now. Polling without a waker lets hyper notice
    /// a close the upstream sent while the connection sat idle.
    fn usable(&mut self) -> bool {
        !self.tx.is_closed() && self.drive(&mut quiet()) && self.tx.is_ready()
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
    /// The connection failed or closed before the head arrived.
    Request(hyper::Error),
    /// The connection ended before the head arrived, with nothing more said.
    Closed,
    /// The request URI names no host.
    NoAuthority,
}

/// Connections to plain-HTTP upstreams, reused in last-in-first-out order.
pub struct H1Pool {
    connector: HttpConnector,
    origins: Mutex<Vec<Origin>>,
    idle_timeout: Duration,
    max_idle: usize,
}

impl H1Pool {
    pub fn new(connector: HttpConnector, idle_timeout: Duration, max_idle: usize) -> Self {
        Self {
            connector,
            origins: Mutex::new(Vec::new()),
            idle_timeout,
            max_idle,
        }
    }

    /// Sends `req` (an absolute `http://` URI) and waits for the response head. The returned body
    /// drives the connection; once read to its end the connection goes back to the pool.
    pub async fn send(
        self: &Arc<Self>,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, SendError> {
        let authority = req
            .uri()
            .authority()
            .cloned()
            .ok_or(SendError::NoAuthority)?;
        let (idle, host) = self.checkout(&authority)?;
        let connect_uri = std::mem::take(req.uri_mut());
        *req.uri_mut() = origin_form(&connect_uri);
        req.headers_mut().entry(header::HOST).or_insert(host);
        if let Some(conn) = idle {
            match exchange(conn, req).await {
                Ok((resp, conn)) => return Ok(self.wrap(resp, conn, authority)),
                // An idle connection the upstream closed just as it was taken: the request was
                // not written, so it goes out again on a new connection.
                Err(Failure::NotSent(back)) => req = *back,
                Err(Failure::Failed(e)) => return Err(SendError::Request(e)),
                Err(Failure::Closed) => return Err(SendError::Closed),
            }
        }
        let conn = self.connect(connect_uri).await?;
        match exchange(conn, req).await {
            Ok((resp, conn)) => Ok(self.wrap(resp, conn, authority)),
            Err(Failure::NotSent(_) | Failure::Closed) => Err(SendError::Closed),
            Err(Failure::Failed(e)) => Err(SendError::Request(e)),
        }
    }

    fn wrap(
        self: &Arc<Self>,
        resp: Response<Incoming>,
        conn: Box<Conn>,
        authority: Authority,
    ) -> Response<PooledBody> {
        resp.map(|inner| PooledBody {
            inner,
            conn: Some(conn),
            home: Some((Arc::clone(self), authority)),
        })
    }

    /// A usable idle connection to `authority` if there is one, and the `Host` value for it.
    fn checkout(
        &self,
        authority: &Authority,
    ) -> Result<(Option<Box<Conn>>, HeaderValue), SendError> {
        let mut origins = self.lock();
        let i = match origins.iter().position(|o| &o.authority == authority) {
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

    fn checkin(&self, authority: &Authority, conn: Box<Conn>) {
        let mut origins = self.lock();
        if let Some(origin) = origins.iter_mut().find(|o| &o.authority == authority) {
            if origin.idle.len() < self.max_idle {
                origin.idle.push(Idle {
                    conn,
                    since: Instant::now(),
                });
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Origin>> {
        // The lists hold no invariant a panicking holder could break halfway.
        self.origins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn connect(&self, uri: Uri) -> Result<Box<Conn>, SendError> {
        let mut connector = self.connector.clone();
        let io = connector
            .call(uri)
            .await
            .map_err(|e| SendError::Connect(Box::new(e)))?;
        let (tx, driver) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(SendError::Request)?;
        Ok(Box::new(Conn { tx, driver }))
    }
}

enum Failure {
    /// The connection was not ready; the request was not written and comes back.
    NotSent(Box<Request<Full<Bytes>>>),
    Failed(hyper::Error),
    Closed,
}

/// Writes `req` on `conn` and reads the response head, driving the connection meanwhile.
async fn exchange(
    mut conn: Box<Conn>,
    req: Request<Full<Bytes>>,
) -> Result<(Response<Incoming>, Box<Conn>), Failure> {
    let mut answer = std::pin::pin!(conn.tx.try_send_request(req));
    let mut ended = false;
    let result = poll_fn(|cx| {
        if !ended {
            ended = !conn.drive(cx);
        }
        // Only the connection, polled just above in this task, can complete the answer: it needs
        // no waker of its own, and giving it this task's would wake the task while it runs.
        match answer.as_mut().poll(&mut quiet()) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            // hyper answers every queued request before its connection ends; this is a guard.
            Poll::Pending if ended => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    match result {
        Some(Ok(resp)) => Ok((resp, conn)),
        Some(Err(mut e)) => match e.take_message() {
            Some(req) => Err(Failure::NotSent(Box::new(req))),
            None => Err(Failure::Failed(e.into_error())),
        },
        None => Err(Failure::Closed),
    }
}

/// A response body whose polling also drives its connection; at its end the connection goes back
/// to the pool, and dropped earlier it closes the connection (the upstream sees the cancel).
pub struct PooledBody {
    inner: Incoming,
    // Boxed: hyper's connection state is most of a kilobyte, and stays put while pooled.
    conn: Option<Box<Conn>>,
    home: Option<(Arc<H1Pool>, Authority)>,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(conn) = &mut this.conn else {
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(frame) => this.finish(frame),
                Poll::Pending => Poll::Pending,
            };
        };
        // The body's channel is filled only by the connection, which this task drives: the body
        // is polled without a waker, so a frame the read below hands over does not wake the task
        // that is running it. The connection registers this task for the socket.
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(&mut quiet()) {
            return this.finish(frame);
        }
        if !conn.drive(cx) {
            // Ended: the channel now holds the rest of the body, or its error, and needs no waker.
            this.conn = None;
        }
        match Pin::new(&mut this.inner).poll_frame(&mut quiet()) {
            Poll::Ready(frame) => this.finish(frame),
            // Dropping the connection closed the channel, so this poll is ready.
            Poll::Pending if this.conn.is_none() => {
                match Pin::new(&mut this.inner).poll_frame(cx) {
                    Poll::Ready(frame) => this.finish(frame),
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl PooledBody {
    fn finish(
        &mut self,
        frame: Option<Result<Frame<Bytes>, hyper::Error>>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &frame {
            None => self.release(),
            Some(Err(_)) => self.conn = None,
            // A body of known length may never be polled for its end (hyper's server stops at
            // the last byte of a `content-length` body), so its connection is released here.
            Some(Ok(_)) if self.inner.is_end_stream() => self.release(),
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    /// The body was read to its end: the connection returns to the pool if it can take another
    /// request (not when the upstream asked to close it).
    fn release(&mut self) {
        let (Some(mut conn), Some((pool, authority))) = (self.conn.take(), self.home.take()) else {
            return;
        };
        if conn.usable() {
            pool.checkin(&authority, conn);
        }
    }
}

/// A context whose waker does nothing, for polls whose wake-up comes another way.
fn quiet() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(pq) if pq.as_str() != "/" => {
            let mut parts = Parts::default();
            parts.path_and_query = Some(pq.clone());
            Uri::from_parts(parts).unwrap_or_default()
        }
        _ => Uri::default(),
    }
}

/// `Host` as hyper-util's client writes it: the port only when it is not 80.
fn host_value(authority: &Authority) -> Result<HeaderValue, SendError> {
    let value = match authority.port_u16() {
        Some(port) if port != 80 => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    };
    HeaderValue::try_from(value).map_err(|_| SendError::NoAuthority)
}
