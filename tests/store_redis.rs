//! The Redis store against a real `redis-server` started by each test on a free port: the store contract, one limit shared by two store instances and by two gateways, and a Redis killed and restarted under each.
//!
//! `redis-server` must be installed (`.ci/run` installs Debian's when it is missing); without
//! it these tests fail rather than pass untested.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{chat_body, client, config, FakeUpstream, Reply, TestGateway};
use modelgate::config::KeyLimits;
use modelgate::store::{contract, Limit, RedisStore, Store};

/// A `redis-server` of the test's own, killed when dropped.
struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// Certificate and key files: the server then speaks TLS only.
    tls: Option<(String, String)>,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING.
    fn start() -> Self {
        Self::start_with(None)
    }

    fn start_with(tls: Option<(String, String)>) -> Self {
        // Redis has no `--port 0` (it means "no plain port"): borrow a free port from the
        // kernel, then hand it over.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self {
            port,
            child: None,
            tls,
        };
        server.restart();
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// (Re)starts the server on the same port, with no persistence, and waits for PING.
    fn restart(&mut self) {
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            None => cmd.args(["--port", &self.port.to_string()]),
            Some((cert, key)) => cmd
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args(["--tls-cert-file", cert, "--tls-key-file", key])
                .args(["--tls-auth-clients", "no"]),
        };
        let child = cmd
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): install it (Debian: apt-get install -y \
                     redis-server; .ci/run does this when it is missing)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pings() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "redis-server on port {} exited at start: {status}",
                    self.port
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Answers PING; over TLS, only that the port accepts (the store's own calls check more).
    fn pings(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        if self.tls.is_some() {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0_u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// Kills it (SIGKILL: a crash, not a clean shutdown) and waits until it is gone.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .try_into()
        .unwrap()
}

fn rpm(n: u32) -> KeyLimits {
    KeyLimits {
        rpm: Some(n),
        ..KeyLimits::default()
    }
}

#[tokio::test]
async fn the_redis_store_keeps_the_contract() {
    let redis = RedisServer::start();
    let store = Store::Redis(Arc::new(RedisStore::new(&redis.url())));
    contract::run(&store, "contract:").await.unwrap();
    // Twice on the same keys would fail (the counters are shared); a second prefix passes.
    contract::run(&store, "again:").await.unwrap();
}

#[tokio::test]
async fn two_instances_enforce_one_limit() {
    let redis = RedisServer::start();
    // Two stores, two connections: what two gateway instances have.
    let a = Store::Redis(Arc::new(RedisStore::new(&redis.url())));
    let b = Store::Redis(Arc::new(RedisStore::new(&redis.url())));
    let now = now_ms();
    let limits = rpm(60); // a burst of 6
    let mut admitted = 0;
    for i in 0..6 {
        let store = if i % 2 == 0 { &a } else { &b };
        let v = store.admit("shared", &limits, "s", now).await.unwrap();
        assert_eq!(v.refused, None, "request {i}: {v:?}");
        admitted += 1;
    }
    assert_eq!(admitted, 6);
    for store in [&a, &b] {
        let v = store.admit("shared", &limits, "s", now).await.unwrap();
        assert_eq!(v.refused, Some((Limit::Rpm, 1000)), "{v:?}");
        assert_eq!(v.requests.unwrap().remaining, 54);
    }

    // Concurrency slots and token charges are shared the same way.
    let conc = KeyLimits {
        max_concurrent: Some(1),
        tpm: Some(100),
        ..KeyLimits::default()
    };
    assert_eq!(
        a.admit("c", &conc, "from-a", now).await.unwrap().refused,
        None
    );
    let v = b.admit("c", &conc, "from-b", now).await.unwrap();
    assert!(
        matches!(v.refused, Some((Limit::MaxConcurrent, _))),
        "{v:?}"
    );
    a.release("c", "from-a").await.unwrap();
    assert_eq!(
        b.admit("c", &conc, "from-b", now).await.unwrap().refused,
        None
    );
    b.release("c", "from-b").await.unwrap();
    a.charge("c", 100, now).await.unwrap();
    let v = b.admit("c", &conc, "from-b", now).await.unwrap();
    assert!(matches!(v.refused, Some((Limit::Tpm, _))), "{v:?}");
}

#[tokio::test]
async fn slots_of_a_dead_instance_expire() {
    let redis = RedisServer::start();
    let store = Store::Redis(Arc::new(RedisStore::new(&redis.url())));
    let conc = KeyLimits {
        max_concurrent: Some(1),
        ..KeyLimits::default()
    };
    let now = now_ms();
    assert_eq!(
        store
            .admit("k", &conc, "never-released", now)
            .await
            .unwrap()
            .refused,
        None
    );
    let v = store.admit("k", &conc, "next", now + 1000).await.unwrap();
    assert!(matches!(v.refused, Some((Limit::MaxConcurrent, _))));
    let later = now + modelgate::store::SLOT_TTL_MS;
    assert_eq!(
        store
            .admit("k", &conc, "next", later)
            .await
            .unwrap()
            .refused,
        None
    );
}

#[tokio::test]
async fn every_key_gets_a_ttl() {
    let redis = RedisServer::start();
    let store = Store::Redis(Arc::new(RedisStore::new(&redis.url())));
    // rpm 1: the rate key lives a minute, so a loaded machine's pause before `KEYS` cannot
    // let it expire first (at rpm 60 it lived one second, and a CI run once lost it).
    let all = KeyLimits {
        rpm: Some(1),
        tpm: Some(1000),
        max_concurrent: Some(2),
        daily_tokens: Some(10_000),
    };
    let now = now_ms();
    store.admit("ttl", &all, "s", now).await.unwrap();
    store.charge("ttl", 10, now).await.unwrap();
    let keys = redis_cli(redis.port, &["--raw", "KEYS", "modelgate:*"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 4, "tat, minute, day, slots: {keys:?}");
    for key in keys {
        assert!(key.starts_with("modelgate:{ttl}:"), "{key}");
        let ttl: i64 = redis_cli(redis.port, &["PTTL", key])
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (installed with redis-server)");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_killed_redis_fails_fast_and_a_restarted_one_is_used_again() {
    let mut redis = RedisServer::start();
    let store = Store::Redis(Arc::new(RedisStore::new(&redis.url())));
    let limits = rpm(600);
    let now = now_ms();
    assert_eq!(
        store.admit("k", &limits, "s", now).await.unwrap().refused,
        None
    );

    redis.kill();
    for _ in 0..5 {
        let start = Instant::now();
        let result = store.admit("k", &limits, "s", now).await;
        eprintln!(
            "admit while down: {:?} {:?}",
            start.elapsed(),
            result.as_ref().err()
        );
        // Liveness, not performance: a call must give up, not hang.
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "took {:?}",
            start.elapsed()
        );
        assert!(result.is_err(), "Redis is down: {result:?}");
        let start = Instant::now();
        assert!(store.charge("k", 1, now).await.is_err());
        assert!(store.release("k", "s").await.is_err());
        assert!(start.elapsed() < Duration::from_secs(4));
    }

    redis.restart();
    // The manager reconnects in the background: a call or two may still see the old failure.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.admit("k", &limits, "s", now).await {
            Ok(v) => {
                assert_eq!(v.refused, None);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "not back after 5 s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.charge("k", 1, now).await.unwrap();
    store.release("k", "s").await.unwrap();
}

#[tokio::test]
async fn a_store_made_while_redis_is_down_connects_when_it_comes_up() {
    // Startup must not wait for Redis: the store is made, calls fail, then work once it is up.
    let mut redis = RedisServer::start();
    redis.kill();
    let store = Store::Redis(Arc::new(RedisStore::new(&redis.url())));
    let start = Instant::now();
    assert!(store.admit("k", &rpm(60), "s", now_ms()).await.is_err());
    assert!(start.elapsed() < Duration::from_secs(2));
    redis.restart();
    let v = store.admit("k", &rpm(60), "s", now_ms()).await.unwrap();
    assert_eq!(v.refused, None);
}

#[tokio::test]
async fn a_rediss_url_speaks_tls() {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = std::env::temp_dir().join(format!("modelgate-redis-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let redis = RedisServer::start_with(Some((
        cert.display().to_string(),
        key.display().to_string(),
    )));
    // A self-signed certificate: `#insecure` skips the check of its issuer (the crate's URL
    // flag); what is tested is the TLS path itself (rustls with this build's crypto provider).
    let url = format!("rediss://localhost:{}/#insecure", redis.port);
    let store = Store::Redis(Arc::new(RedisStore::new(&url)));
    let deadline = Instant::now() + Duration::from_secs(5);
    let v = loop {
        match store.admit("tls", &rpm(60), "s", now_ms()).await {
            Ok(v) => break v,
            Err(e) => assert!(Instant::now() < deadline, "no TLS answer in 5 s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(v.refused, None);
    // A plain connection to the TLS port is refused (it speaks TLS only).
    let plain = RedisStore::new(&format!("redis://localhost:{}/", redis.port));
    assert!(plain.admit("tls", &rpm(60), "s", now_ms()).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Through the gateway: two in-process gateways on one Redis. ----

/// A gateway config with one chat upstream at `upstream`, a key `sk-limited` with rpm 60 (a
/// burst of 6), and the store in the Redis that `MODELGATE_REDIS_URL` names.
fn gateway_config(upstream: &str, on_error: &str) -> String {
    config(
        upstream,
        &format!(
            r#"
[store]
redis_url_env = "MODELGATE_REDIS_URL"
on_error = "{on_error}"

[[keys]]
name = "limited"
key = "sk-limited"
rpm = 60

[[upstreams]]
name = "up"
kind = "chat"
base_url = "{{UPSTREAM}}/v1"

[[models]]
name = "m"
upstream = "up"
retry = {{ attempts = 1 }}
"#
        ),
    )
}

async fn gateway(upstream: &str, on_error: &str, redis: &RedisServer) -> TestGateway {
    TestGateway::start_with_env(
        &gateway_config(upstream, on_error),
        &[("MODELGATE_REDIS_URL", &redis.url())],
    )
    .await
}

fn ok_reply() -> Reply {
    Reply::json(
        200,
        serde_json::json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    )
}

async fn chat(gw: &TestGateway) -> reqwest::Response {
    client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth("sk-limited")
        .json(&chat_body("m"))
        .send()
        .await
        .unwrap()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Sends requests alternately to `gws` until the shared burst of 6 is spent, checking the
/// 429s that follow from every instance.
async fn spend_the_burst_across(gws: &[&TestGateway], already: usize) {
    for i in already..6 {
        let resp = chat(gws[i % gws.len()]).await;
        assert_eq!(resp.status(), 200, "request {i} of the burst");
        assert_eq!(header(&resp, "x-ratelimit-limit-requests"), Some("60"));
    }
    for gw in gws {
        let resp = chat(gw).await;
        assert_eq!(resp.status(), 429, "the burst is spent on every instance");
        assert_eq!(header(&resp, "retry-after"), Some("1"));
        assert_eq!(header(&resp, "x-ratelimit-limit-requests"), Some("60"));
        assert_eq!(header(&resp, "x-ratelimit-remaining-requests"), Some("54"));
        assert!(header(&resp, "x-ratelimit-reset-requests").is_some());
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    }
}

#[tokio::test]
async fn two_gateways_on_one_redis_enforce_one_rpm_limit() {
    let redis = RedisServer::start();
    let up = FakeUpstream::start(|_| ok_reply()).await;
    let a = gateway(&up.url(), "deny", &redis).await;
    let b = gateway(&up.url(), "deny", &redis).await;
    spend_the_burst_across(&[&a, &b], 0).await;
    assert_eq!(
        up.seen().len(),
        6,
        "refused requests never reach the upstream"
    );
}

/// Each admission's time is in `/metrics`, so an operator can compare what Redis costs a
/// request with the latency the gateway adds; unlimited keys make none.
#[tokio::test]
async fn admissions_are_timed_in_metrics() {
    let redis = RedisServer::start();
    let up = FakeUpstream::start(|_| ok_reply()).await;
    let gw = gateway(&up.url(), "deny", &redis).await;
    for _ in 0..3 {
        assert_eq!(chat(&gw).await.status(), 200);
    }
    let unlimited = client()
        .post(gw.base("/v1/chat/completions"))
        .bearer_auth("sk-test")
        .json(&chat_body("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(unlimited.status(), 200);
    let metrics = gw.metrics().await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    assert_eq!(value("modelgate_store_admission_seconds_count"), 3.0);
    let sum = value("modelgate_store_admission_seconds_sum");
    assert!(
        sum > 0.0 && sum < 3.0,
        "three loopback round trips took {sum} s"
    );
}

/// Tokens charged and slots released on one instance reach the other with no request of its
/// own to carry them: the queued updates go out by themselves shortly after.
#[tokio::test]
async fn two_gateways_on_one_redis_share_tokens_and_concurrency() {
    let redis = RedisServer::start();
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    let up = FakeUpstream::start(move |seen| {
        if seen.json()["stream"] == true {
            Reply::sse(vec![
                (Duration::ZERO, chunk),
                (Duration::from_millis(400), chunk),
                (Duration::ZERO, "data: [DONE]\n\n"),
            ])
        } else {
            Reply::json(
                200,
                serde_json::json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}}),
            )
        }
    })
    .await;
    let toml = gateway_config(&up.url(), "deny").replace(
        "[[upstreams]]",
        "[[keys]]\nname = \"conc\"\nkey = \"sk-conc\"\nmax_concurrent = 1\n\n\
         [[keys]]\nname = \"tokens\"\nkey = \"sk-tokens\"\ntpm = 10\n\n[[upstreams]]",
    );
    let env = [("MODELGATE_REDIS_URL", redis.url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = TestGateway::start_with_env(&toml, &env).await;
    let b = TestGateway::start_with_env(&toml, &env).await;
    let send = |gw: &TestGateway, key: &'static str, stream: bool| {
        let mut body = chat_body("m");
        body["stream"] = stream.into();
        client()
            .post(gw.base("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body)
            .send()
    };

    // A stream on A holds the key's one slot: B refuses until it ends, then admits.
    let mut open = send(&a, "sk-conc", true).await.unwrap();
    assert_eq!(open.status(), 200);
    assert!(open.chunk().await.unwrap().is_some(), "the stream started");
    let refused = send(&b, "sk-conc", false).await.unwrap();
    assert_eq!(refused.status(), 429, "one slot across both instances");
    while open.chunk().await.unwrap().is_some() {}
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let resp = send(&b, "sk-conc", false).await.unwrap();
        if resp.status() == 200 {
            break;
        }
        assert_eq!(resp.status(), 429);
        assert!(Instant::now() < deadline, "A's release never reached B");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // 10 tokens through A spend the key's minute on B too.
    assert_eq!(send(&a, "sk-tokens", false).await.unwrap().status(), 200);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let resp = send(&b, "sk-tokens", false).await.unwrap();
        if resp.status() == 429 {
            assert_eq!(header(&resp, "x-ratelimit-remaining-tokens"), Some("0"));
            break;
        }
        assert_eq!(
            resp.status(),
            200,
            "B admits only while A's charge is on its way"
        );
        assert!(Instant::now() < deadline, "A's charge never reached B");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_killed_redis_lets_on_error_decide_and_limits_resume_when_it_is_back() {
    let mut redis = RedisServer::start();
    let up = FakeUpstream::start(|_| ok_reply()).await;
    let allow = gateway(&up.url(), "allow", &redis).await;
    let deny = gateway(&up.url(), "deny", &redis).await;
    // Connected, and counting.
    assert_eq!(chat(&allow).await.status(), 200);

    redis.kill();
    for _ in 0..8 {
        // More than the burst: nothing is counted while the store is away.
        let start = Instant::now();
        let resp = chat(&allow).await;
        assert_eq!(resp.status(), 200, "on_error = allow serves");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "took {:?}",
            start.elapsed()
        );
    }
    let start = Instant::now();
    let resp = chat(&deny).await;
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(resp.status(), 503, "on_error = deny refuses");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    let served = up.seen().len();
    let metrics = allow.metrics().await;
    assert!(
        metrics.contains("modelgate_store_errors_total 8"),
        "each request let through is counted:\n{metrics}"
    );

    // Back (empty: it keeps nothing on disk). The first call may still see the old failure
    // while the connection is remade; the deny instance says when it is through.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = chat(&deny).await;
        if resp.status() == 200 {
            break;
        }
        assert_eq!(resp.status(), 503);
        assert!(Instant::now() < deadline, "limits not back 5 s after Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One of the fresh burst is spent; the allow instance's connection comes back too.
    spend_the_burst_across_after_reconnect(&allow, &deny).await;
    assert!(up.seen().len() > served);
}

/// After a restart the allow instance may need a call to notice its old connection is gone,
/// and such a call is let through uncounted; then both share the burst again.
async fn spend_the_burst_across_after_reconnect(allow: &TestGateway, deny: &TestGateway) {
    // Requests through `allow` until it is counted again: the deny instance sees its count.
    let mut spent = 1; // the deny instance's request that got through
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = chat(allow).await;
        assert_eq!(resp.status(), 200);
        if resp.headers().contains_key("x-ratelimit-limit-requests") {
            spent += 1;
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the allow instance never reconnected"
        );
    }
    spend_the_burst_across(&[deny, allow], spent).await;
}
