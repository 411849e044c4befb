//! The Redis store against a real `redis-server` started by each test on a free port: the store contract, one limit shared by two instances, and a Redis killed and restarted.
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

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use modelgate::config::KeyLimits;
use modelgate::store::{contract, Limit, RedisStore, Store};

/// A `redis-server` of the test's own, killed when dropped.
struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING.
    fn start() -> Self {
        // Redis has no `--port 0`: borrow a free port from the kernel, then hand it over.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self { port, child: None };
        server.restart();
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// (Re)starts the server on the same port, with no persistence, and waits for PING.
    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
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

    fn pings(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
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
    let all = KeyLimits {
        rpm: Some(60),
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
