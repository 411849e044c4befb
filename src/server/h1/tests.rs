#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: the listener's tasks end with the test's runtime"
)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::*;

type Answer = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// A body whose frames come from a channel: ready when sent, ended when the sender drops.
struct Rx(mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for Rx {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// What the test service does for a request, by its path.
fn answer(
    req: Request<ClientBody>,
    streams: Arc<std::sync::Mutex<Vec<mpsc::UnboundedSender<Bytes>>>>,
    dropped: Arc<AtomicUsize>,
) -> Answer {
    Box::pin(async move {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        match path.as_str() {
            // Answers without reading the body.
            "/refuse" => Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .body(crate::boxed::full("no"))
                .unwrap(),
            // Answers once the client has gone, if ever.
            "/hang" => {
                struct Guard(Arc<AtomicUsize>);
                impl Drop for Guard {
                    fn drop(&mut self) {
                        self.0.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let _guard = Guard(dropped);
                std::future::pending::<()>().await;
                unreachable!()
            }
            // A body of unknown length, its frames sent by the test.
            "/stream" => {
                let (tx, rx) = mpsc::unbounded_channel();
                streams.lock().unwrap().push(tx);
                Response::new(Rx(rx).boxed())
            }
            _ => {
                let body = req.into_body().collect().await;
                let text = match body {
                    Ok(b) => format!("{method} {path} {}", String::from_utf8_lossy(&b.to_bytes())),
                    Err(e) => format!("error: {e}"),
                };
                Response::new(crate::boxed::full(text))
            }
        }
    })
}

struct Server {
    addr: std::net::SocketAddr,
    streams: Arc<std::sync::Mutex<Vec<mpsc::UnboundedSender<Bytes>>>>,
    dropped: Arc<AtomicUsize>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Server {
    /// The sender of the `/stream` answer the service made next.
    async fn next_stream(&self) -> mpsc::UnboundedSender<Bytes> {
        loop {
            if let Some(tx) = self.streams.lock().unwrap().pop() {
                return tx;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// A loopback listener serving every connection with [`Conn`] and [`answer`].
async fn server() -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(std::sync::Mutex::new(Vec::new()));
    let dropped = Arc::new(AtomicUsize::new(0));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (s, d) = (streams.clone(), dropped.clone());
    tokio::spawn(async move {
        loop {
            let (sock, _) = listener.accept().await.unwrap();
            let (s, d) = (s.clone(), d.clone());
            let mut stop_rx = stop_rx.clone();
            tokio::spawn(async move {
                let conn = Conn::new(sock, BytesMut::new(), move |req| {
                    answer(req, s.clone(), d.clone())
                });
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = stop_rx.wait_for(|s| *s) => {}
                }
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            });
        }
    });
    Server {
        addr,
        streams,
        dropped,
        stop,
    }
}

/// Reads one response: its head, and its body by its framing.
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>) -> (String, String) {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        read_more(s, buf).await;
    };
    let head = String::from_utf8(buf.drain(..head_end).collect()).unwrap();
    let lower = head.to_ascii_lowercase();
    let body = if let Some(len) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
    {
        let len: usize = len.trim().parse().unwrap();
        while buf.len() < len {
            read_more(s, buf).await;
        }
        buf.drain(..len).collect()
    } else if lower.contains("transfer-encoding: chunked") {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                read_more(s, buf).await;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                read_more(s, buf).await;
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break body;
            }
        }
    } else if lower.starts_with("http/1.1 100") || lower.starts_with("http/1.1 204") {
        Vec::new()
    } else {
        s.read_to_end(buf).await.unwrap();
        std::mem::take(buf)
    };
    (head, String::from_utf8(body).unwrap())
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
        .await
        .expect("no answer within 10 s")
        .unwrap();
    assert!(
        n > 0,
        "closed early; had {:?}",
        String::from_utf8_lossy(buf)
    );
    buf.extend_from_slice(&chunk[..n]);
}

/// True when the server closes the connection (rather than leaving it open) within 10 s.
async fn closed(s: &mut TcpStream) -> bool {
    let mut chunk = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(
        b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let (head, body) = response(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("\r\ndate: "), "{head}");
    assert_eq!(body, "POST /a hello");
    assert_eq!(response(&mut s, &mut buf).await.1, "GET /b ");
    // Still open for a third.
    s.write_all(b"GET /c HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut s, &mut buf).await.1, "GET /c ");
}

#[tokio::test]
async fn a_chunked_body_trickling_in_reaches_the_service_whole() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for b in b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\n\r\n" {
        s.write_all(&[*b]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut buf = Vec::new();
    assert_eq!(response(&mut s, &mut buf).await.1, "POST /echo hello world");
    // The connection carries the next request: the body's end was found exactly.
    s.write_all(b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut s, &mut buf).await.1, "GET /next ");
}

#[tokio::test]
async fn a_length_delimited_body_in_pieces_reaches_the_service_whole() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.write_all(b"defghij").await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(response(&mut s, &mut buf).await.1, "POST /echo abcdefghij");
}

#[tokio::test]
async fn expect_100_continue_is_answered_when_the_body_is_asked_for() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let (interim, _) = response(&mut s, &mut buf).await;
    assert!(
        interim.starts_with("HTTP/1.1 100 Continue\r\n"),
        "{interim}"
    );
    s.write_all(b"body").await.unwrap();
    assert_eq!(response(&mut s, &mut buf).await.1, "POST /echo body");
}

#[tokio::test]
async fn an_unread_body_is_never_taken_for_the_next_request() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    // The body, not yet sent whole, is a request line itself: if the connection stayed open and
    // parsed on after the refusal, it would be answered as a second request.
    s.write_all(
        b"POST /refuse HTTP/1.1\r\nhost: x\r\ncontent-length: 40\r\n\r\nGET /smuggled HTTP/1.1\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let (head, body) = response(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{head}");
    assert_eq!(body, "no");
    s.write_all(b"host: x\r\n\r\n").await.unwrap_or(());
    assert!(
        closed(&mut s).await,
        "the connection stayed open after an unread body"
    );
}

#[test]
fn framing_follows_rfc_9112_for_requests() {
    let p = |raw: &str| parse(&mut BytesMut::from(raw.as_bytes()));
    let ok = |raw: &str| p(raw).unwrap().unwrap();
    let r = ok("POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\n");
    assert!(matches!(r.framing, Framing::Length(3)) && r.asked.keep_alive);
    let r = ok("POST / HTTP/1.1\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n");
    assert!(matches!(r.framing, Framing::Length(3)));
    let r = ok("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
    assert!(matches!(r.framing, Framing::Chunked(_)) && r.asked.keep_alive);
    // Both: read as chunked, the length dropped so nothing downstream trusts it, then closed.
    let r = ok("POST / HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n");
    assert!(matches!(r.framing, Framing::Chunked(_)) && !r.asked.keep_alive);
    assert!(!r.request.headers().contains_key("content-length"));
    let r = ok("GET / HTTP/1.1\r\nconnection: Close\r\n\r\n");
    assert!(matches!(r.framing, Framing::Length(0)) && !r.asked.keep_alive);
    let r = ok("GET / HTTP/1.0\r\n\r\n");
    assert!(r.asked.http10 && !r.asked.keep_alive);
    let r = ok("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n");
    assert!(r.asked.http10 && r.asked.keep_alive);
    let r = ok("HEAD /x?y=1 HTTP/1.1\r\nX-Mixed-Case: v\r\n\r\n");
    assert!(r.asked.head);
    assert_eq!(r.request.uri(), "/x?y=1");
    assert_eq!(r.request.headers()["x-mixed-case"], "v");
    assert!(p("GET / HTTP/1.1\r\nhost: x\r\n").unwrap().is_none());
    for (bad, status) in [
        ("POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n", 400),
        ("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n", 400),
        (
            "POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            400,
        ),
        ("POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n", 400),
        (
            "POST / HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
            400,
        ),
        ("GET / HTTP/2.0\r\n\r\n", 400),
        ("\x16\x03\x01\x02\x00\x01\x00\x01\x03\x03", 400),
        ("G@T / HTTP/1.1\r\n\r\n", 400),
    ] {
        assert_eq!(p(bad).err().map(|s| s.as_u16()), Some(status), "{bad:?}");
    }
    let huge = format!("GET / HTTP/1.1\r\nx: {}", "y".repeat(MAX_HEAD));
    assert_eq!(
        p(&huge).err(),
        Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
    );
    let many: String = (0..MAX_HEADERS + 1)
        .map(|i| format!("x-{i}: v\r\n"))
        .collect();
    assert_eq!(
        p(&format!("GET / HTTP/1.1\r\n{many}\r\n")).err(),
        Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
    );
}

#[tokio::test]
async fn a_malformed_head_is_refused_with_400_and_closed() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: identity\r\n\r\n",
    )
    .await
    .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(all).unwrap();
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
}

#[tokio::test]
async fn a_body_of_unknown_length_is_chunked_for_http_1_1_and_close_delimited_for_1_0() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    // Each frame goes out as it is sent, before the body ends.
    let tx = srv.next_stream().await;
    tx.send(Bytes::from_static(b"data: one\n\n")).unwrap();
    while !String::from_utf8_lossy(&buf).contains("data: one") {
        read_more(&mut s, &mut buf).await;
    }
    tx.send(Bytes::from_static(b"data: two\n\n")).unwrap();
    drop(tx);
    let (head, body) = response(&mut s, &mut buf).await;
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    assert_eq!(body, "data: one\n\ndata: two\n\n");

    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /stream HTTP/1.0\r\n\r\n").await.unwrap();
    let tx = srv.next_stream().await;
    tx.send(Bytes::from_static(b"all")).unwrap();
    drop(tx);
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(all).unwrap();
    assert!(!text.contains("transfer-encoding"), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nall"), "{text}");
}

#[tokio::test]
async fn head_requests_get_the_length_and_no_body() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"HEAD /x HTTP/1.1\r\nhost: x\r\n\r\nGET /y HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        read_more(&mut s, &mut buf).await;
    };
    let head = String::from_utf8(buf.drain(..head_end).collect()).unwrap();
    assert!(head.contains("content-length: 8\r\n"), "{head}");
    // What follows at once is the second response, not a body.
    let (second, body) = response(&mut s, &mut buf).await;
    assert!(second.starts_with("HTTP/1.1 200 OK"), "{second}");
    assert_eq!(body, "GET /y ");
}

#[tokio::test]
async fn a_client_that_leaves_drops_its_answer() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(srv.dropped.load(Ordering::SeqCst), 0);
    drop(s);
    for _ in 0..500 {
        if srv.dropped.load(Ordering::SeqCst) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the answer of a client that left was never dropped");
}

#[tokio::test]
async fn graceful_shutdown_closes_idle_connections_and_lets_a_busy_one_finish() {
    let srv = server().await;
    let mut idle = TcpStream::connect(srv.addr).await.unwrap();
    idle.write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    response(&mut idle, &mut buf).await;
    let mut busy = TcpStream::connect(srv.addr).await.unwrap();
    busy.write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let tx = srv.next_stream().await;
    srv.stop.send(true).unwrap();
    assert!(closed(&mut idle).await, "an idle connection stayed open");
    tx.send(Bytes::from_static(b"last")).unwrap();
    drop(tx);
    let mut buf = Vec::new();
    let (head, body) = response(&mut busy, &mut buf).await;
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert_eq!(body, "last");
    assert!(
        closed(&mut busy).await,
        "the busy connection stayed open after its response"
    );
}

#[test]
fn frames_ready_together_are_gathered_into_one_write() {
    let (tx, rx) = mpsc::unbounded_channel();
    for part in ["data: a\n\n", "data: b\n\n", "data: [DONE]\n\n"] {
        tx.send(Bytes::from(part)).unwrap();
    }
    let mut body: Body = Rx(rx).boxed();
    let mut wbuf = Vec::new();
    let mut out = Out::Chunked;
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    type C = Conn<TcpStream, fn(Request<ClientBody>) -> Answer, Answer>;
    assert!(!C::gather(&mut wbuf, &mut body, &mut out, &mut cx).unwrap());
    assert_eq!(
        String::from_utf8(wbuf.clone()).unwrap(),
        "9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\ne\r\ndata: [DONE]\n\n\r\n"
    );
    drop(tx);
    wbuf.clear();
    assert!(C::gather(&mut wbuf, &mut body, &mut out, &mut cx).unwrap());
    assert_eq!(wbuf, b"0\r\n\r\n");
    // A body longer or shorter than its declared length is an error, never sent as whole.
    let mut out = Out::Length(3);
    let mut long: Body = crate::boxed::full("four");
    assert!(C::gather(&mut Vec::new(), &mut long, &mut out, &mut cx).is_err());
    let mut out = Out::Length(5);
    let mut short: Body = crate::boxed::full("four");
    assert!(C::gather(&mut Vec::new(), &mut short, &mut out, &mut cx).is_err());
}
