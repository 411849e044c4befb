//! Listeners: bind each address and run the event loops that accept TCP (and TLS), serve HTTP/1.1 and HTTP/2 on every connection, and shut down gracefully.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;

use crate::config::{Address, Config, Limits};
use crate::phases::Phase;
use crate::pipeline::{self, Gateway};
pub use h1::ClientBody;

/// Connections the kernel completes for a listening socket before one of its loops accepts them
/// (capped by `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 1024;

/// How long a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A gateway that is accepting connections.
pub struct RunningGateway {
    addrs: HashMap<Address, SocketAddr>,
    gateway: Arc<Gateway>,
    shutdown: watch::Sender<bool>,
    stopped: Option<tokio::task::JoinHandle<()>>,
}

impl RunningGateway {
    /// The bound address of a listener (the real port when the config said port 0).
    pub fn addr(&self, a: Address) -> Option<SocketAddr> {
        self.addrs.get(&a).copied()
    }

    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Stops accepting, lets in-flight requests finish for up to `deadline`, then returns.
    pub async fn shutdown(mut self, deadline: Duration) {
        self.gateway.set_not_ready();
        let _ = self.shutdown.send(true);
        if let Some(stopped) = self.stopped.take() {
            if tokio::time::timeout(deadline, stopped).await.is_err() {
                tracing::warn!(
                    deadline_ms = deadline.as_millis() as u64,
                    "in-flight requests did not finish before the shutdown deadline"
                );
            }
        }
        self.gateway.services.limiter.flush().await;
    }
}

impl Drop for RunningGateway {
    /// A gateway dropped without `shutdown` still stops accepting and drains, so its event loop
    /// threads end instead of serving on unowned.
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

thread_local! {
    /// Which event loop this thread runs (`[server] workers`); 0 off them.
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The event loop the calling thread runs, for state kept per loop (idle upstream connections).
pub fn worker() -> usize {
    WORKER.with(std::cell::Cell::get)
}

/// Binds every configured listener and starts serving: on `[server] workers` threads of their
/// own, or on the calling runtime when that is 0.
pub async fn start(config: &Config) -> std::io::Result<RunningGateway> {
    let gateway = Arc::new(Gateway::new(config)?);
    let tls = config.tls.clone().map(TlsAcceptor::from);
    // One listening socket per event loop (one for the shared runtime).
    let copies = config.server.workers.max(1);
    let mut listeners = Vec::new();
    let mut addrs = HashMap::new();
    for a in [
        Address::Base,
        Address::TokenPlan,
        Address::Video,
        Address::Admin,
    ] {
        if let Some(addr) = config.listen.get(a) {
            let sockets = bind(addr, copies).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot listen on {addr} ({}): {e}", a.name()),
                )
            })?;
            let bound = sockets
                .first()
                .ok_or_else(|| std::io::Error::other("no listening socket"))?
                .local_addr()?;
            addrs.insert(a, bound);
            if a == Address::Video {
                let _ = gateway.services.video_addr.set(bound);
            }
            // Admin stays plain HTTP: it is for probes and scrapers inside the network.
            let tls = if a == Address::Admin {
                None
            } else {
                tls.clone()
            };
            let slots = Arc::new(Semaphore::new(config.limits.max_connections));
            listeners.push(
                sockets
                    .into_iter()
                    .map(|socket| Listener {
                        address: a,
                        socket,
                        tls: tls.clone(),
                        slots: slots.clone(),
                    })
                    .collect::<Vec<_>>(),
            );
        }
    }
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new());
    let shared = Arc::new(Shared {
        gw: gateway.clone(),
        h2,
        limits: config.limits,
    });
    // Every connection and accept task holds a sender; when all are dropped, all have ended.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    match config.server.workers {
        0 => {
            for l in listeners.into_iter().flatten() {
                spawn_accept(l, &shared, &shutdown_rx, &alive_tx)?;
            }
        }
        workers => {
            // Loop `w` accepts on the `w`th socket of every address.
            let mut mine: Vec<Vec<Listener>> = (0..workers).map(|_| Vec::new()).collect();
            for group in listeners {
                for (theirs, l) in mine.iter_mut().zip(group) {
                    theirs.push(l);
                }
            }
            // The loops log where the caller does (its scoped subscriber, if it has one).
            let logs = tracing::dispatcher::get_default(Clone::clone);
            for (w, mine) in mine.into_iter().enumerate() {
                let logs = logs.clone();
                // Built here, so a runtime that cannot start fails the start, not one loop.
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let (shared, shutdown_rx, alive) =
                    (shared.clone(), shutdown_rx.clone(), alive_tx.clone());
                std::thread::Builder::new()
                    .name(format!("modelgate-{w}"))
                    .spawn(move || {
                        let _logs = tracing::dispatcher::set_default(&logs);
                        WORKER.with(|cell| cell.set(w));
                        event_loop(rt, mine, &shared, &shutdown_rx, alive);
                    })?;
            }
        }
    }
    drop(alive_tx);
    #[expect(
        clippy::disallowed_methods,
        reason = "waits for the accept loops and connections to end; awaited by `shutdown`"
    )]
    let stopped = tokio::spawn(async move {
        // Resolves once the last accept loop and connection task have dropped their senders.
        let _ = alive_rx.recv().await;
    });
    Ok(RunningGateway {
        addrs,
        gateway,
        shutdown,
        stopped: Some(stopped),
    })
}

/// Binds `copies` listening sockets to `addr`, one per event loop. They share the port with
/// `SO_REUSEPORT`, so the kernel hands each new connection to one loop and wakes only that one.
/// With one descriptor of a single socket in every loop, each connection woke every loop and
/// all but one found nothing to accept (two failed `accept4` calls per connection with two).
fn bind(addr: SocketAddr, copies: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    if copies > 1 && addr.port() != 0 {
        // A port some other process listens on, another gateway included, must fail the start
        // rather than let the two share the traffic: this bind, without `SO_REUSEPORT`, fails on
        // any listening socket. It never listens, so no client lands in its backlog, and it has
        // `SO_REUSEADDR`, so the last run's connections in TIME_WAIT do not refuse a restart.
        // (For port 0 the kernel picks a port nothing is bound to.)
        let probe = new_socket(addr)?;
        probe.set_reuseaddr(true)?;
        probe.bind(addr)?;
    }
    let mut sockets = Vec::with_capacity(copies);
    let mut at = addr;
    for _ in 0..copies {
        let socket = new_socket(at)?;
        socket.set_reuseaddr(true)?;
        // Replies are written whole or frame by frame as they come, never in pieces worth
        // holding back. Set here, once: on Linux accepted sockets inherit it, which saves a
        // system call on every new connection before its request is read.
        socket.set_nodelay(true)?;
        if copies > 1 {
            socket.set_reuseport(true)?;
        }
        socket.bind(at)?;
        // Port 0 asks for any port; the loops' other sockets take the one the first got.
        at = socket.local_addr()?;
        sockets.push(socket.listen(LISTEN_BACKLOG)?.into_std()?);
    }
    Ok(sockets)
}

fn new_socket(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
}

mod h1;

/// A bound listening socket and what the accept loops of its address share.
struct Listener {
    address: Address,
    socket: std::net::TcpListener,
    tls: Option<TlsAcceptor>,
    /// `[limits] max_connections` permits, shared by every loop accepting on this address.
    slots: Arc<Semaphore>,
}

/// One event loop: a single-threaded runtime that accepts on every listener and serves each
/// connection it took, upstream calls included, to its end. Returns once shutdown has been
/// signalled and its last connection has ended; `alive` is held until then.
fn event_loop(
    rt: tokio::runtime::Runtime,
    listeners: Vec<Listener>,
    shared: &Arc<Shared>,
    shutdown: &watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    rt.block_on(async {
        // This loop's access lines are held and written by a task of its own, a second at
        // most after their requests ended (`logfmt::HOLD_FOR`).
        #[expect(
            clippy::disallowed_methods,
            reason = "the loop's log writer: ends with the runtime, which writes what is left"
        )]
        tokio::spawn(crate::logfmt::hold_access_lines());
        let (mine, mut ended) = mpsc::channel::<()>(1);
        for l in listeners {
            if let Err(e) = spawn_accept(l, shared, shutdown, &mine) {
                tracing::error!(worker = worker(), error = %e, "cannot watch a listener");
            }
        }
        drop(mine);
        let _ = ended.recv().await;
    });
    // Dropping the runtime ends what its connections left behind (pooled HTTPS connections'
    // tasks), and the last access lines are written, before this loop counts as stopped.
    drop(rt);
    crate::logfmt::flush_access_lines();
    drop(alive);
}

/// Starts `l`'s accept loop on the current runtime.
fn spawn_accept(
    l: Listener,
    shared: &Arc<Shared>,
    shutdown: &watch::Receiver<bool>,
    alive: &mpsc::Sender<()>,
) -> std::io::Result<()> {
    let accept = Accept {
        shared: shared.clone(),
        address: l.address,
        listener: TcpListener::from_std(l.socket)?,
        tls: l.tls,
        slots: l.slots,
        shutdown: shutdown.clone(),
        alive: alive.clone(),
    };
    // One task per listener: a busy address cannot starve another's accepts (admin probes).
    #[expect(
        clippy::disallowed_methods,
        reason = "an accept loop; it ends when shutdown is signalled and is tracked by `alive`"
    )]
    tokio::spawn(accept.run());
    Ok(())
}

/// What every connection of every listener shares.
struct Shared {
    gw: Arc<Gateway>,
    h2: http2::Builder<TokioExecutor>,
    limits: Limits,
}

/// One listener's accept loop.
struct Accept {
    shared: Arc<Shared>,
    address: Address,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    /// `[limits] max_connections` permits; a connection holds one until it closes.
    slots: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
}

impl Accept {
    async fn run(self) {
        // One wait for shutdown for the loop's life: made afresh for every connection, its
        // registration and removal cost more than the accept.
        let mut shutdown = self.shutdown.clone();
        let stop = stopping(&mut shutdown);
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                () = &mut stop => break,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // At the limit, this loop holds the connection it took and accepts no more: the
            // clients after it wait in the kernel's backlog rather than take descriptors the
            // gateway needs for the connections it serves. The permit comes after the accept
            // because each loop has a socket of its own: a loop that waited for a permit first
            // could take one while the waiting client sat in another loop's backlog.
            let permit = match self.slots.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => tokio::select! {
                    () = &mut stop => break,
                    permit = self.slots.clone().acquire_owned() => match permit {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                },
            };
            #[cfg(not(target_os = "linux"))]
            let _ = stream.set_nodelay(true);
            let conn = Connection {
                shared: self.shared.clone(),
                address: self.address,
                shutdown: self.shutdown.clone(),
                _alive: self.alive.clone(),
                _permit: permit,
            };
            // The task holds only what the connection starts from; its future (3.7 KB, with
            // hyper's connection state) is built in a box on the first poll. Spawned whole, it
            // was copied several times on its way into the task: 4 k instructions of `memcpy`
            // per connection (benches/instructions.sh, new connections).
            let tls = self.tls.clone();
            #[expect(
                clippy::disallowed_methods,
                reason = "one task per connection, tracked by `alive` for graceful shutdown"
            )]
            tokio::spawn(async move {
                crate::inplace::boxed(|| conn.run(stream, tls, peer)).await;
            });
            // The new connection's request is usually there already: let its task read it
            // and send it on before this loop asks the kernel for another connection, which
            // most often answers that there is none (a system call on the request's path).
            tokio::task::yield_now().await;
        }
    }
}

/// Resolves once shutdown has been signalled (including before this call).
async fn stopping(rx: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send; drop it here, not across the caller's awaits.
    let _ = rx.wait_for(|stop| *stop).await.map(|_| ());
}

/// Runs a connection until it ends, has been idle for the limit, or shutdown is signalled; then
/// it finishes what is in flight and accepts nothing new. A macro, not a generic `async fn`:
/// with hyper's connection types as a parameter, the compiler cannot prove the task's future
/// `Send` ("implementation of `Send` is not general enough").
macro_rules! drive {
    ($conn:expr, $idle:expr, $stop:expr) => {{
        let conn = $conn;
        tokio::pin!(conn);
        match Drive::new(conn.as_mut(), $idle, $stop).await {
            Ended::Served(res) => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            }
            Ended::Idle => tracing::debug!("closing an idle client connection"),
            Ended::Stopping => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }};
}

/// How [`Drive`] ended.
enum Ended<T> {
    Served(T),
    Idle,
    Stopping,
}

/// A connection raced against its idle watch and the shutdown wait. Unlike `select!`, which
/// polls every branch whenever the task wakes, the two watches are polled only once their own
/// waker has fired: the connection's task wakes several times a request (each read, each
/// upstream answer, each frame of a stream), and polling both watches every time cost about
/// 330 instructions a wake-up, a thousand a JSON request.
struct Drive<'a, C> {
    conn: Pin<&'a mut C>,
    idle: Pin<&'a mut (dyn Future<Output = ()> + Send + 'a)>,
    stop: Pin<&'a mut (dyn Future<Output = ()> + Send + 'a)>,
    watches: Arc<Watches>,
    /// Wakes the task through `watches`, so a wake-up says a watch may be ready.
    waker: std::task::Waker,
}

impl<'a, C: Future> Drive<'a, C> {
    fn new(
        conn: Pin<&'a mut C>,
        idle: Pin<&'a mut (dyn Future<Output = ()> + Send + 'a)>,
        stop: Pin<&'a mut (dyn Future<Output = ()> + Send + 'a)>,
    ) -> Self {
        let watches = Arc::new(Watches {
            // Polled on the first poll, so both register their wakers.
            woken: AtomicBool::new(true),
            task: std::sync::Mutex::new(None),
        });
        let waker = std::task::Waker::from(watches.clone());
        Self {
            conn,
            idle,
            stop,
            watches,
            waker,
        }
    }
}

impl<C: Future> Future for Drive<'_, C> {
    type Output = Ended<C::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(out) = this.conn.as_mut().poll(cx) {
            return Poll::Ready(Ended::Served(out));
        }
        if this.watches.take(cx.waker()) {
            let mut watch_cx = Context::from_waker(&this.waker);
            if this.stop.as_mut().poll(&mut watch_cx).is_ready() {
                return Poll::Ready(Ended::Stopping);
            }
            if this.idle.as_mut().poll(&mut watch_cx).is_ready() {
                return Poll::Ready(Ended::Idle);
            }
        }
        Poll::Pending
    }
}

/// Whether a connection's idle watch or shutdown wait has been woken since they were last
/// polled, and the task to wake when they are.
struct Watches {
    woken: AtomicBool,
    task: std::sync::Mutex<Option<std::task::Waker>>,
}

impl Watches {
    /// Keeps `task` as the one to wake, and says (clearing it) whether a watch was woken.
    fn take(&self, task: &std::task::Waker) -> bool {
        {
            let mut kept = self
                .task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !kept.as_ref().is_some_and(|k| k.will_wake(task)) {
                *kept = Some(task.clone());
            }
        }
        // After the waker is kept: a watch woken from here on wakes the task again.
        self.woken.swap(false, Ordering::AcqRel)
    }
}

impl std::task::Wake for Watches {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

struct Connection {
    shared: Arc<Shared>,
    address: Address,
    shutdown: watch::Receiver<bool>,
    _alive: mpsc::Sender<()>,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    async fn run(self, stream: TcpStream, tls: Option<TlsAcceptor>, peer: SocketAddr) {
        let activity = Arc::new(Activity::new());
        let limits = self.shared.limits;
        // Watched below TLS, so a handshake that never starts and a TLS session that never
        // sends a request are both silence.
        let mut stream = Watched::new(stream, activity.clone(), limits.idle_timeout);
        // One idle watch and one shutdown wait for the connection's life, from the first read
        // to the last response: each made twice cost a timer and a waiter registered twice.
        let idle = activity.idle_for(limits.client_idle_timeout);
        tokio::pin!(idle);
        let mut shutdown = self.shutdown.clone();
        let stop = stopping(&mut shutdown);
        tokio::pin!(stop);
        match tls {
            None => {
                let protocol = tokio::select! {
                    sniffed = stream.sniff() => match sniffed {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "connection ended before a request");
                            return;
                        }
                    },
                    () = &mut idle => return,
                    () = &mut stop => return,
                };
                // The sniffed bytes are the HTTP/1.1 codec's first read; HTTP/2 reads them again.
                let first = match protocol {
                    Protocol::Http1 => std::mem::take(&mut stream.first),
                    Protocol::Http2 => BytesMut::new(),
                };
                self.serve(stream, first, protocol, &activity, idle, stop)
                    .await
            }
            Some(acceptor) => {
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => {
                        // Over TLS, HTTP/2 is what ALPN chose (RFC 9113 §3.2), never sniffed.
                        let protocol = match s.get_ref().1.alpn_protocol() {
                            Some(b"h2") => Protocol::Http2,
                            _ => Protocol::Http1,
                        };
                        // Boxed: inline, the TLS connection's larger state would size every
                        // plain connection's task too (6.1 KB instead of 3.7 KB).
                        crate::inplace::boxed(|| {
                            self.serve(s, BytesMut::new(), protocol, &activity, idle, stop)
                        })
                        .await
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            }
        }
    }

    async fn serve<I>(
        self,
        io: I,
        first: BytesMut,
        protocol: Protocol,
        activity: &Arc<Activity>,
        idle: Pin<&mut (dyn Future<Output = ()> + Send + '_)>,
        stop: Pin<&mut (dyn Future<Output = ()> + Send + '_)>,
    ) where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let gw = self.shared.gw.clone();
        let address = self.address;
        let busy = activity.clone();
        let keys_seen = Arc::new(crate::auth::KeyMemo::default());
        // One request's answer: built in a box of its own, so that it is freed once the
        // response head is out instead of staying with every open stream and idle keep-alive
        // connection (7 KB less per open stream in benches/memory.sh).
        let answer = move |req: Request<ClientBody>| {
            let gw = gw.clone();
            let keys_seen = keys_seen.clone();
            // Counted from the request head until its response body is dropped, so a stream
            // with long pauses is never taken for an idle connection.
            crate::phases::mark(Phase::Head);
            let request = busy.request();
            crate::inplace::boxed(move || async move {
                crate::phases::mark(Phase::Polled);
                pipeline::handle(&gw, address, req, &keys_seen, request).await
            })
        };
        match protocol {
            Protocol::Http1 => drive!(h1::Conn::new(io, first, answer), idle, stop),
            Protocol::Http2 => {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let resp = answer(req.map(ClientBody::H2));
                    async move { Ok::<_, std::convert::Infallible>(resp.await) }
                });
                drive!(
                    self.shared.h2.serve_connection(TokioIo::new(io), service),
                    idle,
                    stop
                )
            }
        }
    }
}

/// Which HTTP a client connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Http1,
    /// On plain TCP, with prior knowledge: the connection opens with the HTTP/2 preface.
    Http2,
}

/// When a client connection last finished a request, and how many are in progress: only
/// requests keep a connection open, not bytes (HTTP/2 PINGs or a head that never ends do not).
struct Activity {
    opened: Instant,
    /// Milliseconds from `opened` to the end of the last request.
    last_ms: AtomicU64,
    requests: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            requests: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn request(self: &Arc<Self>) -> RequestGuard {
        self.requests.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }

    /// Resolves once the connection has had no request in progress for `idle`, counted from
    /// accept or from the end of its last request.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let quiet = last.elapsed();
            if quiet >= idle && self.requests.load(Ordering::Relaxed) == 0 {
                return;
            }
            tokio::time::sleep(idle.saturating_sub(quiet).max(Duration::from_millis(10))).await;
        }
    }
}

/// Keeps a request of a connection counted until its response body is dropped.
pub struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project! {
    /// A client socket that records its activity and gives up on a client that takes no bytes
    /// of a response for `stall` (`[limits] idle_timeout_ms`): the write fails, hyper drops the
    /// connection, and with it the response body and its upstream.
    struct Watched<S> {
        #[pin]
        inner: S,
        activity: Arc<Activity>,
        stall: Duration,
        // Boxed so the socket stays `Unpin`; only a stalled write allocates it.
        stalled: Option<Pin<Box<Sleep>>>,
        // What `sniff` read, handed to the first reads after it.
        first: BytesMut,
    }
}

impl<S> Watched<S> {
    fn new(inner: S, activity: Arc<Activity>, stall: Duration) -> Self {
        Self {
            inner,
            activity,
            stall,
            stalled: None,
            first: BytesMut::new(),
        }
    }
}

/// How much of a plain connection's first bytes `sniff` reads at once: a request head and a
/// small body.
const FIRST_READ: usize = 4096;

/// What a client speaking HTTP/2 with prior knowledge sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl<S: AsyncRead + Unpin> Watched<S> {
    /// Tells HTTP/2 with prior knowledge from HTTP/1.1 by the connection's first bytes, which
    /// the connection's codec then reads again from here. One read takes a whole request head,
    /// where hyper-util's sniffing read exactly 24 bytes and left the rest to a second read and
    /// a second parse of a partial head.
    async fn sniff(&mut self) -> std::io::Result<Protocol> {
        self.first.reserve(FIRST_READ);
        loop {
            let read = tokio::io::AsyncReadExt::read_buf(&mut self.inner, &mut self.first).await?;
            crate::phases::begin(true);
            if read == 0 {
                // Closed before a request: the HTTP/1.1 codec ends the connection quietly.
                return Ok(Protocol::Http1);
            }
            let n = self.first.len().min(H2_PREFACE.len());
            if self.first.get(..n) != H2_PREFACE.get(..n) {
                return Ok(Protocol::Http1);
            }
            if n == H2_PREFACE.len() {
                return Ok(Protocol::Http2);
            }
        }
    }
}

impl<S: AsyncRead> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        if this.first.is_empty() {
            if !crate::phases::ON {
                return this.inner.poll_read(cx, buf);
            }
            let before = buf.filled().len();
            let read = this.inner.poll_read(cx, buf);
            // A request's first bytes: read with none in progress.
            if buf.filled().len() > before && this.activity.requests.load(Ordering::Relaxed) == 0 {
                crate::phases::begin(false);
            }
            return read;
        }
        let n = this.first.len().min(buf.remaining());
        buf.put_slice(this.first.get(..n).unwrap_or_default());
        bytes::Buf::advance(this.first, n);
        if this.first.is_empty() {
            // Free the sniffed bytes' buffer rather than keep it for the connection's life.
            *this.first = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite> Watched<S> {
    /// A write that stays pending arms the stall timer; any progress disarms it.
    fn track(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        res: Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        match res {
            Poll::Pending => {
                let stall = *this.stall;
                let sleep = this
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                {
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the client took no response bytes for the idle timeout",
                        )));
                    }
                }
                Poll::Pending
            }
            Poll::Ready(Ok(n)) => {
                *this.stalled = None;
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        crate::phases::end();
        let res = self.as_mut().project().inner.poll_write(cx, buf);
        self.track(cx, res)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let res = self.as_mut().project().inner.poll_write_vectored(cx, bufs);
        self.track(cx, res)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::{Drive, Ended};

    /// A future that counts its polls.
    struct Counted<F> {
        inner: F,
        polls: Arc<AtomicUsize>,
    }

    impl<F: Future + Unpin> Future for Counted<F> {
        type Output = F::Output;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            Pin::new(&mut self.inner).poll(cx)
        }
    }

    /// The connection is polled on every wake-up of the task; the watches only on the first
    /// poll and when their own wakers fire.
    #[tokio::test(start_paused = true)]
    async fn the_watches_are_polled_only_when_woken() {
        let (conn_tx, mut conn_rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let conn = async move {
            let mut sum = 0;
            while let Some(n) = conn_rx.recv().await {
                sum += n;
            }
            sum
        };
        tokio::pin!(conn);
        let (idle_polls, stop_polls) = (Arc::default(), Arc::default());
        let mut idle = Counted {
            inner: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
            polls: Arc::clone(&idle_polls),
        };
        let mut stop = Counted {
            inner: Box::pin(std::future::pending::<()>()),
            polls: Arc::clone(&stop_polls),
        };
        let idle: Pin<&mut (dyn Future<Output = ()> + Send)> =
            Pin::new(&mut idle) as Pin<&mut Counted<_>>;
        let stop: Pin<&mut (dyn Future<Output = ()> + Send)> =
            Pin::new(&mut stop) as Pin<&mut Counted<_>>;
        let drive = Drive::new(conn.as_mut(), idle, stop);
        let feeder = async move {
            for n in 1..=10 {
                conn_tx.send(n).unwrap();
                tokio::task::yield_now().await;
            }
        };
        let (ended, ()) = tokio::join!(drive, feeder);
        assert!(matches!(ended, Ended::Served(55)));
        assert_eq!(idle_polls.load(Ordering::Relaxed), 1);
        assert_eq!(stop_polls.load(Ordering::Relaxed), 1);
    }

    /// A watch that fires ends the race, whichever it is; the connection's own end wins
    /// while neither has.
    #[tokio::test(start_paused = true)]
    async fn a_fired_watch_ends_the_race() {
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let conn = std::future::pending::<()>();
        tokio::pin!(conn);
        let idle = tokio::time::sleep(Duration::from_secs(60));
        tokio::pin!(idle);
        let stop = super::stopping(&mut rx);
        tokio::pin!(stop);
        let signal = async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send(true).unwrap();
            tx
        };
        let (ended, _tx) = tokio::join!(Drive::new(conn.as_mut(), idle, stop), signal);
        assert!(matches!(ended, Ended::Stopping));

        let (_tx, mut rx) = tokio::sync::watch::channel(false);
        let started = tokio::time::Instant::now();
        let idle = tokio::time::sleep(Duration::from_secs(60));
        tokio::pin!(idle);
        let stop = super::stopping(&mut rx);
        tokio::pin!(stop);
        assert!(matches!(
            Drive::new(conn.as_mut(), idle, stop).await,
            Ended::Idle
        ));
        assert_eq!(started.elapsed(), Duration::from_secs(60));

        let (_tx, mut rx) = tokio::sync::watch::channel(false);
        let done = tokio::time::sleep(Duration::from_secs(2));
        tokio::pin!(done);
        let idle = tokio::time::sleep(Duration::from_secs(60));
        tokio::pin!(idle);
        let stop = super::stopping(&mut rx);
        tokio::pin!(stop);
        assert!(matches!(
            Drive::new(done.as_mut(), idle, stop).await,
            Ended::Served(())
        ));
    }

    /// Every loop's socket hands out connections that send small writes at once: the option
    /// set on the listening socket, which accepted sockets inherit.
    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let listeners = super::bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = listeners[0].local_addr().unwrap();
        for listener in &listeners {
            assert_eq!(listener.local_addr().unwrap(), addr);
            listener.set_nonblocking(true).unwrap();
        }
        // With SO_REUSEPORT the kernel picks a socket per connection: connect until each
        // socket has accepted one.
        let mut clients = Vec::new();
        for listener in &listeners {
            let accepted = loop {
                clients.push(std::net::TcpStream::connect(addr).unwrap());
                match listener.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Err(e) => panic!("{e}"),
                }
                assert!(clients.len() < 200, "the kernel never chose this socket");
            };
            assert!(accepted.nodelay().unwrap());
        }
    }
}
