//! Listeners: TLS with ALPN (HTTP/2 and HTTP/1.1), graceful shutdown, and the CLI's check and hash-key.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::time::Duration;

use common::*;
use modelgate::config::Address;
use serde_json::json;

/// A config serving one model on the built-in mock, written into `dir`.
fn mock_only_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        "[listen]\nbase = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"mock\"\nkind = \"mock\"\n[[models]]\nname = \"m\"\nupstream = \"mock\"\n",
    )
    .unwrap();
    path
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("modelgate-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn tls_listener_speaks_h2_and_http1_by_alpn() {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = temp_dir("tls");
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, ck.cert.pem()).unwrap();
    std::fs::write(&key_path, ck.key_pair.serialize_pem()).unwrap();

    let up = FakeUpstream::start(|_| Reply::json(200, json!({"tls": true}))).await;
    let toml = chat_config(&up.url()).replace(
        "[limits]",
        &format!(
            "[tls]\ncert = {:?}\nkey = {:?}\n\n[limits]",
            cert_path.display().to_string(),
            key_path.display().to_string()
        ),
    );
    let gw = TestGateway::start(&toml).await;
    let addr = gw.running.addr(Address::Base).unwrap();
    let root = reqwest::Certificate::from_pem(ck.cert.pem().as_bytes()).unwrap();

    for (http1_only, want) in [
        (false, reqwest::Version::HTTP_2),
        (true, reqwest::Version::HTTP_11),
    ] {
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(root.clone())
            .resolve("localhost", addr);
        if http1_only {
            b = b.http1_only();
        }
        let c = b.build().unwrap();
        let resp = c
            .post(format!(
                "https://localhost:{}/v1/chat/completions",
                addr.port()
            ))
            .bearer_auth(KEY)
            .json(&chat_body("m"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.version(), want);
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.json::<serde_json::Value>().await.unwrap(),
            json!({"tls": true})
        );
    }
    // Plain HTTP on a TLS listener gets no answer.
    let plain = client()
        .get(format!("http://{addr}/v1/models"))
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_plain_listener_tells_http2_from_http1_by_the_first_bytes_however_they_come() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = FakeUpstream::start(|_| Reply::json(200, json!({"plain": true}))).await;
    let toml = format!("{}\n[server]\nworkers = 2\n", chat_config(&up.url()));
    let gw = TestGateway::start(&toml).await;
    let addr = gw.running.addr(Address::Base).unwrap();

    // (A real HTTP/2 client with prior knowledge: `http2_client_gets_the_same_answer` in
    // tests/passthrough.rs.)
    // An HTTP/1.1 request a byte at a time: "P" is also how the HTTP/2 preface begins.
    let body = serde_json::to_string(&chat_body("m")).unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    for (i, byte) in request.as_bytes().iter().enumerate() {
        s.write_all(&[*byte]).await.unwrap();
        if i < 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("{\"plain\":true}") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("no answer to a request sent a byte at a time")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(
        answer.starts_with(b"HTTP/1.1 200 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // The HTTP/2 preface in two pieces: the server's own SETTINGS frame (type 4) comes back.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.write_all(b"\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut head))
        .await
        .expect("no HTTP/2 frame after a split preface")
        .unwrap();
    assert_eq!(head[3], 4, "first frame {head:?} is not SETTINGS");
}

/// An upstream whose every answer is a chat stream of two chunks and `[DONE]`, `pause` apart;
/// and the chunk, for the expected text.
async fn paced_stream(pause: Duration) -> (FakeUpstream, &'static str) {
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    let up = FakeUpstream::start(move |_| {
        Reply::sse(vec![
            (Duration::ZERO, chunk),
            (pause, chunk),
            (pause, "data: [DONE]\n\n"),
        ])
    })
    .await;
    (up, chunk)
}

#[tokio::test]
async fn shutdown_lets_in_flight_streams_finish_and_refuses_new_connections() {
    let (up, chunk) = paced_stream(Duration::from_millis(300)).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let url = gw.base("/v1/chat/completions");
    let admin = gw.url(Address::Admin, "/readyz");
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let resp = client()
        .post(&url)
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let shutdown = tokio::spawn(gw.running.shutdown(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // New connections are refused once shutdown has begun.
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    assert!(fresh
        .post(&url)
        .bearer_auth(KEY)
        .json(&chat_body("m"))
        .send()
        .await
        .is_err());
    assert!(fresh.get(&admin).send().await.is_err());

    let text = resp.text().await.unwrap();
    assert_eq!(
        text,
        format!("{chunk}{chunk}data: [DONE]\n\n"),
        "the in-flight stream completes"
    );
    tokio::time::timeout(Duration::from_secs(3), shutdown)
        .await
        .expect("shutdown returns once in-flight work is done")
        .unwrap();
}

/// The names of this process's threads that run the gateway's event loops.
fn event_loop_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| n.starts_with("modelgate-"))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn event_loops_serve_concurrent_streams_drain_and_end_after_shutdown() {
    let (up, chunk) = paced_stream(Duration::from_millis(200)).await;
    // Other tests in this binary run gateways with a loop per core: two more loops than cores
    // make a last loop's name only this gateway has.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = cores + 2;
    let last = format!("modelgate-{}", workers - 1);
    let toml = format!(
        "{}\n[server]\nworkers = {workers}\n",
        chat_config(&up.url())
    );
    let gw = TestGateway::start(&toml).await;
    let url = gw.base("/v1/chat/completions");
    let mut body = chat_body("m");
    body["stream"] = json!(true);
    let mut streams = tokio::task::JoinSet::new();
    for _ in 0..12 {
        // A client each, so each stream is a connection of its own for any loop to take.
        let (url, body) = (url.clone(), body.clone());
        streams.spawn(async move {
            let resp = client()
                .post(&url)
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp
        });
    }
    let mut open = Vec::new();
    while let Some(resp) = streams.join_next().await {
        open.push(resp.unwrap());
    }
    let names = event_loop_threads();
    for w in 0..workers {
        let n = format!("modelgate-{w}");
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }

    // Shutdown begins with every stream still open; each one still ends whole.
    let shutdown = tokio::spawn(gw.running.shutdown(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    assert!(fresh.post(&url).json(&chat_body("m")).send().await.is_err());
    for resp in open {
        assert_eq!(
            resp.text().await.unwrap(),
            format!("{chunk}{chunk}data: [DONE]\n\n")
        );
    }
    tokio::time::timeout(Duration::from_secs(3), shutdown)
        .await
        .expect("shutdown returns once every loop's streams have ended")
        .unwrap();
    // The loops' threads end with their last connection.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while event_loop_threads().contains(&last) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "event loop threads outlive the shutdown: {:?}",
            event_loop_threads()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `toml`'s config with its base address on `addr` instead of any port.
fn listening_on(toml: &str, addr: std::net::SocketAddr) -> modelgate::config::Config {
    let toml = toml.replacen("base = \"127.0.0.1:0\"", &format!("base = \"{addr}\""), 1);
    modelgate::config::Config::parse(&toml, std::path::Path::new("."), &|_| {
        Some("up-secret".to_owned())
    })
    .unwrap()
}

#[tokio::test]
async fn a_second_gateway_on_a_port_in_use_fails_to_start() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let toml = format!("{}\n[server]\nworkers = 2\n", chat_config(&up.url()));
    let first = TestGateway::start(&toml).await;
    let taken = first.running.addr(Address::Base).unwrap();
    let err = match modelgate::server::start(&listening_on(&toml, taken)).await {
        Ok(_) => panic!("a second gateway took {taken} beside the first"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!("cannot listen on {taken} (base)")),
        "{err}"
    );
}

#[tokio::test]
async fn a_gateway_restarts_on_its_port_while_the_last_runs_connections_are_in_time_wait() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let toml = format!("{}\n[server]\nworkers = 2\n", chat_config(&up.url()));
    let first = TestGateway::start(&toml).await;
    let port = first.running.addr(Address::Base).unwrap();
    // The gateway closes these first, so their ends on its port wait in TIME_WAIT.
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(port).await.unwrap();
        let request = format!(
            "GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\nconnection: close\r\n\r\n"
        );
        s.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 200 "),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    first.running.shutdown(Duration::from_secs(5)).await;
    let second = match modelgate::server::start(&listening_on(&toml, port)).await {
        Ok(g) => g,
        Err(e) => panic!("the restart on {port} was refused: {e}"),
    };
    let resp = client()
        .get(format!("http://{port}/v1/models"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    second.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn readyz_and_metrics_on_admin() {
    let gw = TestGateway::start(&chat_config("http://127.0.0.1:9")).await;
    let resp = client()
        .get(gw.url(Address::Admin, "/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let _ = post_json(&gw.base("/v1/chat/completions"), chat_body("nope")).await;
    let text = gw.metrics().await;
    assert!(
        text.contains(
            "modelgate_requests_total{model=\"\",upstream=\"\",protocol=\"chat\",status=\"404\",outcome=\"refused\"} 1"
        ),
        "{text}"
    );
}

fn bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_modelgate"))
}

#[test]
fn hash_key_prints_the_sha256_of_stdin_without_the_newline() {
    use std::io::Write;
    let mut child = bin()
        .arg("hash-key")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"sk-demo\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    // sha256("sk-demo")
    let expected = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"sk-demo"))
    };
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), expected);
}

#[test]
fn check_reports_every_error_with_its_key_path_and_exits_1() {
    let dir = temp_dir("check");
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        r#"
[listen]
base = "127.0.0.1:99999"
bogus = 1

[[keys]]
name = "a"
key_env = "MODELGATE_TEST_SURELY_UNSET_VAR"

[[upstreams]]
name = "u"
kind = "chat"
base_url = "http://127.0.0.1:1/v1"

[[upstreams]]
name = "u"
kind = "chat"
base_url = "ftp://x"

[[models]]
name = "m"
upstream = "opneai"
"#,
    )
    .unwrap();
    let out = bin()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    for needle in [
        "listen: unknown field `bogus`",
        "upstreams[1].name: duplicate upstream name \"u\"",
        "upstreams[1].base_url",
        "models[0].upstream: no upstream named \"opneai\"",
        "keys[0].key_env: environment variable MODELGATE_TEST_SURELY_UNSET_VAR is not set",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_accepts_the_shipped_config_and_every_example() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![std::path::PathBuf::from(root).join("config/modelgate.toml")];
    for entry in std::fs::read_dir(std::path::Path::new(root).join("config/examples")).unwrap() {
        files.push(entry.unwrap().path());
    }
    assert!(
        files.len() >= 6,
        "the shipped config and at least five examples"
    );
    for f in files {
        let out = bin()
            .arg("check")
            .arg("--config")
            .arg(&f)
            // Examples name their secrets by variable; give each one a value.
            .envs([
                ("OPENAI_API_KEY", "x"),
                ("VLLM_API_KEY", "x"),
                ("GLM_API_KEY", "x"),
                ("DASHSCOPE_API_KEY", "x"),
                ("TOKEN_PLAN_API_KEY", "x"),
                ("MODELGATE_CLIENT_KEY", "x"),
                ("VERTEX_ACCESS_TOKEN", "x"),
                ("GEMINI_API_KEY", "x"),
                ("AZURE_OPENAI_KEY", "x"),
                ("ANTHROPIC_API_KEY", "x"),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} failed check:\n{}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let table = String::from_utf8(out.stdout).unwrap();
        assert!(table.starts_with("MODEL"), "{table}");
    }
}

#[test]
fn serve_exits_0_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = temp_dir("sigterm");
    let path = mock_only_config(&dir);
    let mut child = bin()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("listening on http://127.0.0.1:"));
    assert!(listening.is_some(), "the gateway logs its listener address");
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let exit = child.wait().unwrap();
    assert_eq!(exit.code(), Some(0), "log after SIGTERM: {rest:?}");
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A preloadable library whose `syscall()` fails the getrandom system call (the `getrandom`
/// crate's path to the OS random source) and passes every other call on.
const NO_RANDOM_SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

long syscall(long number, ...) {
    va_list args;
    va_start(args, number);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(args, long);
    va_end(args);
    if (number == SYS_getrandom) {
        errno = EIO;
        return -1;
    }
    long (*next)(long, ...) = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return next(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
"#;

#[test]
fn serve_refuses_to_start_when_the_os_random_source_fails() {
    let dir = temp_dir("norandom");
    let src = dir.join("shim.c");
    let lib = dir.join("shim.so");
    std::fs::write(&src, NO_RANDOM_SHIM).unwrap();
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("a C compiler (cc) builds the test's shim");
    assert!(built.success());
    let path = mock_only_config(&dir);
    let mut child = bin()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env("LD_PRELOAD", &lib)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It must end by itself; a gateway that started anyway is killed after 15 s and fails below.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
    assert!(log.contains("refusing to start"), "{log}");
    assert!(!log.contains("listening on"), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}
