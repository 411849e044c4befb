//! Listeners: bind each address, accept TCP (and TLS), serve HTTP/1.1 and HTTP/2 on every connection, and shut down gracefully.

use std::collections::HashMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use crate::config::{Address, Config};
use crate::pipeline::{self, Gateway};

/// How long a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A gateway that is accepting connections.
pub struct RunningGateway {
    addrs: HashMap<Address, SocketAddr>,
    gateway: Arc<Gateway>,
    shutdown: watch::Sender<bool>,
    stopped: tokio::task::JoinHandle<()>,
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
    pub async fn shutdown(self, deadline: Duration) {
        self.gateway.set_not_ready();
        let _ = self.shutdown.send(true);
        if tokio::time::timeout(deadline, self.stopped).await.is_err() {
            tracing::warn!(
                deadline_ms = deadline.as_millis() as u64,
                "in-flight requests did not finish before the shutdown deadline"
            );
        }
    }
}

/// Binds every configured listener and starts serving.
pub async fn start(config: &Config) -> std::io::Result<RunningGateway> {
    let gateway = Arc::new(Gateway::new(config));
    let tls = config.tls.clone().map(TlsAcceptor::from);
    let mut listeners = Vec::new();
    let mut addrs = HashMap::new();
    for a in [
        Address::Base,
        Address::TokenPlan,
        Address::Video,
        Address::Admin,
    ] {
        if let Some(addr) = config.listen.get(a) {
            let l = TcpListener::bind(addr).await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot listen on {addr} ({}): {e}", a.name()),
                )
            })?;
            let bound = l.local_addr()?;
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
            listeners.push((a, l, tls));
        }
    }
    let (shutdown, shutdown_rx) = watch::channel(false);
    let gw = gateway.clone();
    #[expect(
        clippy::disallowed_methods,
        reason = "the accept loop; it ends when shutdown is signalled"
    )]
    let stopped = tokio::spawn(accept_loop(gw, listeners, shutdown_rx));
    Ok(RunningGateway {
        addrs,
        gateway,
        shutdown,
        stopped,
    })
}

async fn accept_loop(
    gw: Arc<Gateway>,
    listeners: Vec<(Address, TcpListener, Option<TlsAcceptor>)>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Every connection task holds a sender; when all are dropped, every connection has ended.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    loop {
        let accepted = tokio::select! {
            () = stopping(&mut shutdown) => break,
            accepted = accept_any(&listeners) => accepted,
        };
        let (address, tls, (stream, peer)) = match accepted {
            (_, _, Err(e)) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            (a, tls, Ok(s)) => (a, tls.clone(), s),
        };
        let _ = stream.set_nodelay(true);
        let conn = Connection {
            gw: gw.clone(),
            builder: builder.clone(),
            address,
            shutdown: shutdown.clone(),
            _alive: alive_tx.clone(),
        };
        #[expect(
            clippy::disallowed_methods,
            reason = "one task per connection, tracked by `alive` for graceful shutdown"
        )]
        tokio::spawn(conn.run(stream, tls, peer));
    }
    drop(listeners);
    drop(alive_tx);
    // Resolves once the last connection task has dropped its sender.
    let _ = alive_rx.recv().await;
}

/// Resolves once shutdown has been signalled (including before this call).
async fn stopping(rx: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send; drop it here, not across the caller's awaits.
    let _ = rx.wait_for(|stop| *stop).await.map(|_| ());
}

async fn accept_any(
    listeners: &[(Address, TcpListener, Option<TlsAcceptor>)],
) -> (
    Address,
    &Option<TlsAcceptor>,
    std::io::Result<(TcpStream, SocketAddr)>,
) {
    poll_fn(|cx| {
        for (a, l, tls) in listeners {
            if let Poll::Ready(r) = l.poll_accept(cx) {
                return Poll::Ready((*a, tls, r));
            }
        }
        Poll::Pending
    })
    .await
}

struct Connection {
    gw: Arc<Gateway>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    address: Address,
    shutdown: watch::Receiver<bool>,
    _alive: mpsc::Sender<()>,
}

impl Connection {
    async fn run(self, stream: TcpStream, tls: Option<TlsAcceptor>, peer: SocketAddr) {
        match tls {
            None => self.serve(TokioIo::new(stream)).await,
            Some(acceptor) => {
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => self.serve(TokioIo::new(s)).await,
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            }
        }
    }

    async fn serve<I>(mut self, io: TokioIo<I>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let gw = self.gw.clone();
        let address = self.address;
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let gw = gw.clone();
            async move { Ok::<_, std::convert::Infallible>(pipeline::handle(&gw, address, req).await) }
        });
        let conn = self.builder.serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            }
            () = stopping(&mut self.shutdown) => {
                // Finish what is in flight, accept nothing new on this connection.
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}
