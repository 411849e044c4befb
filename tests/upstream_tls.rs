//! HTTPS upstreams go through hyper's client, HTTP/2 by ALPN: events that arrive together leave
//! the gateway together (the DATA frames hyper hands over one at a time are joined), and the
//! stream still reaches the client whole and in order.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "tests fail loudly; they spawn their fake servers directly"
)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

fn event(i: usize) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"real-m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}},\"finish_reason\":null}}]}}\n\n"
    )
}

/// An HTTPS upstream speaking HTTP/2 only, answering every request with twenty events and the
/// terminator, all ready at once (one DATA frame each). Returns its base URL.
async fn h2_upstream(cert: &rcgen::CertifiedKey) -> String {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der()).unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..20)
                        .map(|i| Ok(Frame::data(Bytes::from(event(i)))))
                        .collect();
                    frames.push(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))));
                    let body = StreamBody::new(futures_util::stream::iter(frames));
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(body)
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    format!("https://localhost:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_burst_of_events_leaves_together_and_whole() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    // The upstream client trusts the platform's roots, which rustls-native-certs reads from
    // SSL_CERT_FILE when it is set: this test binary's only test, so no other test sees it.
    let dir = std::env::temp_dir().join(format!("modelgate-upstream-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pem = dir.join("ca.pem");
    std::fs::write(&pem, cert.cert.pem()).unwrap();
    std::env::set_var("SSL_CERT_FILE", &pem);
    let url = h2_upstream(&cert).await;
    let gw = TestGateway::start(&chat_config(&url)).await;
    for _ in 0..3 {
        let chunks = raw_stream_chunks(&gw.base("")).await;
        let all = chunks.concat();
        let mut at = 0;
        for i in 0..20 {
            let found = all[at..]
                .find(&format!("\"w{i} \""))
                .unwrap_or_else(|| panic!("event {i} missing or out of order: {all}"));
            at += found;
        }
        assert!(all.ends_with("data: [DONE]\n\n"), "{all}");
        // Twenty-one DATA frames written at once: a few reads at most on the gateway's side.
        assert!(
            chunks.len() <= 6,
            "21 events that arrived together left in {} chunks",
            chunks.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
