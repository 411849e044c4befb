//! The cost of one limit check: `admit` (all four limits set) on the in-process store and on a local Redis, next to a bare Redis PING (the round trip the script cannot avoid), and `charge`; then a whole passthrough request through the gateway with limits off, on in process, and on in Redis.
//!
//! Starts its own `redis-server` on a free port (no persistence), as tests/store_redis.rs does;
//! without one it stops with a message. Client and Redis share this machine's cores, so the Redis
//! figures are a loopback round trip plus both sides' CPU, the best case of a Redis next door.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "bench setup: a failure should stop the bench loudly; the fake upstream's tasks live as long as the bench"
)]

// The tests' harness: the gateway in-process and a fake upstream on loopback.
#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};
use modelgate::config::KeyLimits;
use modelgate::store::{LocalStore, RedisStore, Store};

/// A `redis-server` of the bench's own, killed when dropped.
struct RedisServer {
    port: u16,
    child: Child,
}

impl RedisServer {
    fn start() -> Self {
        // Redis has no `--port 0`: borrow a free port from the kernel, then hand it over.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): install it"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let mut buf = [0_u8; 7];
                if s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { port, child }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// Every limit set, none ever reached: each call runs the whole check and counts.
const ALL: KeyLimits = KeyLimits {
    rpm: Some(1_000_000_000),
    tpm: Some(u64::MAX / 2),
    max_concurrent: Some(1_000_000),
    daily_tokens: Some(u64::MAX / 2),
};

fn benches(c: &mut Criterion) {
    let redis = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    // One thread, as one gateway worker would await the call.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = Store::Local(LocalStore::default());
    let remote = Store::Redis(Arc::new(RedisStore::new(&url)));
    // Connect and load the script before timing.
    rt.block_on(remote.admit("bench", &ALL, "s", now_ms()))
        .unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = rt
        .block_on(redis::aio::ConnectionManager::new(client))
        .unwrap();

    let mut group = c.benchmark_group("store");
    group.bench_function("admit/local", |b| {
        b.iter(|| {
            let v = rt.block_on(local.admit("bench", &ALL, "s", now_ms()));
            black_box(v.unwrap())
        });
    });
    group.bench_function("admit/redis", |b| {
        b.iter(|| {
            let v = rt.block_on(remote.admit("bench", &ALL, "s", now_ms()));
            black_box(v.unwrap())
        });
    });
    group.bench_function("charge/redis", |b| {
        b.iter(|| rt.block_on(remote.charge("bench", 1, now_ms())).unwrap());
    });
    group.bench_function("ping/redis", |b| {
        b.iter(|| {
            let pong: String = rt
                .block_on(redis::cmd("PING").query_async(&mut conn))
                .unwrap();
            black_box(pong)
        });
    });
    group.finish();

    // What Redis itself spent per call, to tell the script's cost from the round trip's.
    let stats: String = rt
        .block_on(
            redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn),
        )
        .unwrap();
    for line in stats.lines() {
        if ["evalsha", "ping", "incrby", "exec"]
            .iter()
            .any(|c| line.starts_with(&format!("cmdstat_{c}:")))
        {
            println!("redis {line}");
        }
    }
}

/// A key per case: `sk-test` unlimited (in `common::config`), `sk-rpm` with only rpm, `sk-all`
/// with every limit; none is ever reached.
fn gateway_config(upstream: &str, store: &str) -> String {
    common::config(
        upstream,
        &format!(
            r#"
{store}

[[keys]]
name = "rpm"
key = "sk-rpm"
rpm = 4000000000

[[keys]]
name = "all"
key = "sk-all"
rpm = 4000000000
tpm = 1000000000000000
max_concurrent = 1000000
daily_tokens = 1000000000000000

[[upstreams]]
name = "up"
kind = "chat"
base_url = "{{UPSTREAM}}/v1"

[[models]]
name = "m"
upstream = "up"
"#
        ),
    )
}

/// One non-streaming chat request through the gateway, per limit setting. The client, the
/// gateway and the fake upstream share one thread here, so the differences between the cases
/// are what each adds on that thread plus its wait for Redis.
fn gateway_benches(c: &mut Criterion) {
    let redis = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_up, local_gw, redis_gw, client) = rt.block_on(async {
        let up = common::FakeUpstream::start(|_| {
            common::Reply::json(
                200,
                serde_json::json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
            )
        })
        .await;
        let local = common::TestGateway::start(&gateway_config(&up.url(), "")).await;
        let remote = common::TestGateway::start_with_env(
            &gateway_config(
                &up.url(),
                "[store]\nredis_url_env = \"MODELGATE_REDIS_URL\"\non_error = \"deny\"",
            ),
            &[("MODELGATE_REDIS_URL", &url)],
        )
        .await;
        (up, local, remote, common::client())
    });
    let body = serde_json::to_vec(&common::chat_body("m")).unwrap();
    let mut group = c.benchmark_group("gateway");
    for (name, gw, key) in [
        ("limits-off", &redis_gw, "sk-test"),
        ("rpm-local", &local_gw, "sk-rpm"),
        ("rpm-redis", &redis_gw, "sk-rpm"),
        ("all-redis", &redis_gw, "sk-all"),
    ] {
        let target = gw.base("/v1/chat/completions");
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let resp = client
                        .post(&target)
                        .bearer_auth(key)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(resp.status(), 200, "{name}");
                    black_box(resp.bytes().await.unwrap())
                })
            });
        });
    }
    group.finish();

    // Every command Redis saw from the gateways: one EVALSHA per limited request, nothing else
    // on the request's path (charges and releases run after the response).
    let stats: String = rt
        .block_on(async {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
        })
        .unwrap();
    for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
        println!("gateway redis {line}");
    }
}

criterion_group!(store_benches, benches, gateway_benches);
criterion_main!(store_benches);
