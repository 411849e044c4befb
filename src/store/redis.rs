//! The Redis (or Valkey) store: the same counters in Redis, one atomic script per admission, so every instance pointed at it enforces one limit.
//!
//! One round trip per request: the token charges and slot releases of finished requests wait in
//! a queue and go out in the same pipeline as the next admission, ahead of it (so a slot this
//! instance released is free for the admission that follows it). When no admission comes, a
//! flush sends them after `FLUSH_AFTER`.
//!
//! Keys, per gateway key `k` (the `{k}` hash tag keeps one key's counters in one cluster slot):
//! - `modelgate:{k}:tat`: the GCRA theoretical arrival time, expiring once it is in the past
//!   (an absent TAT and a past one mean the same).
//! - `modelgate:{k}:m:<minute>`: tokens charged in that minute, kept ~2 minutes (read as the
//!   current minute, then as the previous one).
//! - `modelgate:{k}:d:<day>`: tokens charged in that UTC day, kept 2 days.
//! - `modelgate:{k}:slots`: a sorted set of concurrency slots scored by their expiry, so the
//!   slots of an instance that died fall out after `SLOT_TTL_MS`.
//!
//! The script decides with the caller's clock (`now_ms`), not Redis's, so tests are
//! deterministic and every instance uses one arithmetic; the verdict's windows are then worked
//! out here with the same helpers the in-process store uses.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, ErrorKind, Pipeline, Script};
use tokio::sync::OnceCell;

use super::*;

/// The longest any store call may take, connecting included. A local or same-zone Redis answers
/// in well under a millisecond, so this only bites when it is down or stuck; it bounds what an
/// unreachable store adds to a request before `[store] on_error` decides.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a minute bucket lives: it is read as the current minute and then as the previous
/// one, so two minutes from its last charge, plus a little for clocks that disagree.
const MINUTE_BUCKET_TTL_MS: u64 = 2 * MINUTE_MS + 10_000;
/// How long a day bucket lives: the day itself, and a day of slack for skewed clocks.
const DAY_BUCKET_TTL_MS: u64 = 2 * DAY_MS;
/// Kept past a TAT, so clocks a little behind still see it.
const TAT_SLACK_MS: u64 = 1_000;
/// How long a finished request's updates wait for an admission to carry them before going out
/// on their own: what another instance may lag behind this one's charges and releases.
pub const FLUSH_AFTER: Duration = Duration::from_millis(10);

/// The admission check, atomically. Mirrors `LocalStore::admit`: checks rpm, tpm, daily tokens
/// and concurrency in that order, counts the request only when all pass.
///
/// KEYS: tat, this minute, the previous minute, today, slots.
/// ARGV: now, slot id, then per limit a value or -1 when unset: emission interval T, burst,
/// tpm, daily tokens, max concurrent; then the previous minute's weight (ms of it still in the
/// window), the minute bucket TTL, the slot TTL, the TAT slack.
/// Returns: refused (0 none, 1 rpm, 2 tpm, 3 daily, 4 concurrency), the TAT after, this
/// minute's tokens, the previous minute's, today's.
///
/// Lua numbers are doubles: exact for every integer below 2^53 (milliseconds since 1970 and
/// token counts are far below), and the weighted division is exact for fewer than ~10^11
/// tokens a minute.
const ADMIT_LUA: &str = r"
local now = tonumber(ARGV[1])
local slot = ARGV[2]
local t = tonumber(ARGV[3])
local burst = tonumber(ARGV[4])
local tpm = tonumber(ARGV[5])
local daily = tonumber(ARGV[6])
local maxc = tonumber(ARGV[7])
local weight = tonumber(ARGV[8])
local slot_ttl = tonumber(ARGV[9])
local tat_slack = tonumber(ARGV[10])
local minute_ms = 60000

local got = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local tat = tonumber(got[1] or '0')
local current = tonumber(got[2] or '0')
local previous = tonumber(got[3] or '0')
local today = tonumber(got[4] or '0')
local used = current + math.floor(previous * weight / minute_ms)

local refused = 0
local next_tat = tat
if t >= 0 then
  next_tat = math.max(tat, now) + t
  if next_tat - now > burst * t then
    refused = 1
  end
end
if refused == 0 and tpm >= 0 and used >= tpm then
  refused = 2
end
if refused == 0 and daily >= 0 and today >= daily then
  refused = 3
end
if refused == 0 and maxc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[1])
  if redis.call('ZCARD', KEYS[5]) >= maxc then
    refused = 4
  end
end
if refused == 0 then
  if t >= 0 then
    tat = next_tat
    redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', string.format('%d', tat - now + tat_slack))
  end
  if maxc >= 0 then
    redis.call('ZADD', KEYS[5], string.format('%d', now + slot_ttl), slot)
    redis.call('PEXPIRE', KEYS[5], string.format('%d', slot_ttl))
  end
end
return {refused, tat, current, previous, today}
";

fn admit_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(ADMIT_LUA))
}

/// Counters in one Redis, shared by every instance pointed at it. Connects on first use and
/// reconnects by itself (the crate's `ConnectionManager`); every call gives up after
/// `CALL_TIMEOUT`.
pub struct RedisStore {
    /// `Err` when the URL did not parse: every call then fails, so `on_error` decides.
    client: Result<Client, String>,
    /// Set on the first successful connection; until then each call tries to connect.
    conn: OnceCell<ConnectionManager>,
    /// The URL's password, scrubbed from any error text before it leaves this module.
    password: Option<String>,
    /// Charges and releases not yet sent, oldest first.
    pending: Mutex<Vec<Update>>,
    /// A flush is scheduled; the next update need not schedule another.
    flush_armed: AtomicBool,
    /// The runtime the store was made on (the process's main one), which outlives the event
    /// loops: the connection's task and scheduled flushes run there, so the last flush at
    /// shutdown, after the loops have ended, still has a connection.
    home: Option<tokio::runtime::Handle>,
}

/// A finished request's change to its key's counters.
#[derive(Debug)]
enum Update {
    Charge {
        key: String,
        tokens: u64,
        now_ms: u64,
    },
    Release {
        key: String,
        slot: String,
    },
}

impl Update {
    /// Appends the update's commands to `pipe`, their replies ignored. Plain commands, not a
    /// script: each is atomic on its own, and Redis runs them for a fraction of a script's cost.
    fn add_to(&self, pipe: &mut Pipeline) {
        match self {
            Self::Charge {
                key,
                tokens,
                now_ms,
            } => {
                let minute = keys::minute(key, now_ms / MINUTE_MS);
                let day = keys::day(key, now_ms / DAY_MS);
                pipe.incr(&minute, *tokens)
                    .ignore()
                    .pexpire(&minute, ttl(MINUTE_BUCKET_TTL_MS))
                    .ignore()
                    .incr(&day, *tokens)
                    .ignore()
                    .pexpire(&day, ttl(DAY_BUCKET_TTL_MS))
                    .ignore();
            }
            Self::Release { key, slot } => {
                pipe.zrem(keys::slots(key), slot).ignore();
            }
        }
    }
}

impl RedisStore {
    /// A store for `url` (`redis://[user:password@]host[:port][/db]`, or `rediss://`). Does not
    /// connect: startup never waits for Redis. A URL that does not parse makes every call fail;
    /// `open` reports it at once instead.
    pub fn new(url: &str) -> Self {
        match Client::open(url) {
            Ok(client) => {
                let password = client.get_connection_info().redis.password.clone();
                Self {
                    client: Ok(client),
                    conn: OnceCell::new(),
                    password,
                    pending: Mutex::default(),
                    flush_armed: AtomicBool::new(false),
                    home: tokio::runtime::Handle::try_current().ok(),
                }
            }
            // The parser's message is kept, the URL (which may hold a password) is not.
            Err(e) => Self {
                client: Err(format!("the Redis URL is invalid ({})", e.category())),
                conn: OnceCell::new(),
                password: None,
                pending: Mutex::default(),
                flush_armed: AtomicBool::new(false),
                home: None,
            },
        }
    }

    /// Like `new`, but an unparsable URL is an error now rather than on every call.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let store = Self::new(url);
        match &store.client {
            Ok(_) => Ok(store),
            Err(e) => Err(StoreError(e.clone())),
        }
    }

    pub async fn admit(
        &self,
        key: &str,
        limits: &KeyLimits,
        slot: &str,
        now_ms: u64,
    ) -> Result<Verdict, StoreError> {
        let minute = now_ms / MINUTE_MS;
        let day = now_ms / DAY_MS;
        let unset = -1_i64;
        let signed = |v: Option<u64>| v.map_or(unset, |v| i64::try_from(v).unwrap_or(i64::MAX));
        let (t, burst) = match limits.rpm {
            Some(rpm) => (signed(Some(emission_ms(rpm))), i64::from((rpm / 10).max(1))),
            None => (unset, unset),
        };
        let mut call = admit_script().prepare_invoke();
        call.key(keys::tat(key))
            .key(keys::minute(key, minute))
            // Minute 0 has no previous one: `wrapping_sub` names a bucket never charged.
            .key(keys::minute(key, minute.wrapping_sub(1)))
            .key(keys::day(key, day))
            .key(keys::slots(key))
            .arg(now_ms)
            .arg(slot)
            .arg(t)
            .arg(burst)
            .arg(signed(limits.tpm))
            .arg(signed(limits.daily_tokens))
            .arg(signed(limits.max_concurrent.map(u64::from)))
            .arg(MINUTE_MS - now_ms % MINUTE_MS)
            .arg(SLOT_TTL_MS)
            .arg(TAT_SLACK_MS);
        let updates = self.take_pending();
        let mut pipe = pipeline_of(&updates);
        pipe.invoke_script(&call);
        let reply: Result<Vec<i64>, StoreError> = self
            .bounded(|mut conn| async move {
                match pipe.query_async::<(Vec<i64>,)>(&mut conn).await {
                    // A Redis that restarted has forgotten the script. The updates ahead of it
                    // ran (a pipeline is not a transaction), so only the admission is retried;
                    // `invoke_async` loads the script first.
                    Err(e) if e.kind() == ErrorKind::NoScriptError => {
                        call.invoke_async(&mut conn).await
                    }
                    other => other.map(|(reply,)| reply),
                }
            })
            .await;
        if reply.is_err() {
            lost(&updates);
        }
        let reply = reply?;
        let &[refused, tat, current, previous, today] = reply.as_slice() else {
            return Err(StoreError(format!(
                "the admission script answered {} values, not 5",
                reply.len()
            )));
        };
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        verdict(
            limits,
            refused,
            count(tat),
            count(current),
            count(previous),
            count(today),
            now_ms,
        )
    }

    /// Adds `tokens` to the key's minute and day now, with whatever else is queued.
    pub async fn charge(&self, key: &str, tokens: u64, now_ms: u64) -> Result<(), StoreError> {
        if tokens > 0 {
            self.queue(Update::Charge {
                key: key.to_owned(),
                tokens,
                now_ms,
            });
        }
        self.send(self.take_pending()).await
    }

    /// Gives back a concurrency slot now, with whatever else is queued; one that already
    /// expired is no error.
    pub async fn release(&self, key: &str, slot: &str) -> Result<(), StoreError> {
        self.queue(Update::Release {
            key: key.to_owned(),
            slot: slot.to_owned(),
        });
        self.send(self.take_pending()).await
    }

    /// Queues a charge for the next admission to carry, or the flush after `FLUSH_AFTER`.
    pub fn charge_later(self: &Arc<Self>, key: &str, tokens: u64, now_ms: u64) {
        if tokens > 0 {
            self.queue(Update::Charge {
                key: key.to_owned(),
                tokens,
                now_ms,
            });
            self.arm_flush();
        }
    }

    /// Queues a slot's release like `charge_later`.
    pub fn release_later(self: &Arc<Self>, key: &str, slot: String) {
        self.queue(Update::Release {
            key: key.to_owned(),
            slot,
        });
        self.arm_flush();
    }

    /// Sends every queued update now (at shutdown, so none is left behind).
    pub async fn flush(&self) {
        // A failure is logged by `send`; nobody waits on a flush's result.
        let _ = self.send(self.take_pending()).await;
    }

    fn queue(&self, update: Update) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(update);
    }

    fn take_pending(&self) -> Vec<Update> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Schedules one flush `FLUSH_AFTER` from now unless one is already scheduled. Under load
    /// admissions empty the queue first and the flush finds nothing to send.
    fn arm_flush(self: &Arc<Self>) {
        if self.flush_armed.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(runtime) = self
            .home
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
        else {
            // No runtime (a drop outside one): the next admission carries the update.
            self.flush_armed.store(false, Ordering::Release);
            return;
        };
        let store = self.clone();
        // Detached on purpose: it ends after one sleep and one bounded call.
        runtime.spawn(async move {
            tokio::time::sleep(FLUSH_AFTER).await;
            store.flush_armed.store(false, Ordering::Release);
            store.flush().await;
        });
    }

    /// Sends `updates` in one pipeline; nothing when there are none.
    async fn send(&self, updates: Vec<Update>) -> Result<(), StoreError> {
        if updates.is_empty() {
            return Ok(());
        }
        let pipe = pipeline_of(&updates);
        let sent = self
            .bounded(|mut conn| async move { pipe.query_async::<()>(&mut conn).await })
            .await;
        if sent.is_err() {
            lost(&updates);
        }
        sent
    }

    /// Writes every `(key, value)` with one expiry, all or none (MULTI/EXEC): a stored response
    /// and its item index appear together.
    pub async fn set_all(
        &self,
        entries: &[(String, String)],
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        let mut pipe = ::redis::pipe();
        pipe.atomic();
        for (k, v) in entries {
            pipe.cmd("SET")
                .arg(k)
                .arg(v)
                .arg("PX")
                .arg(ttl(ttl_ms.max(1)))
                .ignore();
        }
        self.bounded(|mut conn| async move { pipe.query_async::<()>(&mut conn).await })
            .await
    }

    /// Several string values in one round trip (MGET), in the order of `keys`. The keys must
    /// share a hash tag, as one gateway key's entries do, for a cluster to answer them at once.
    pub async fn get_all(&self, keys: &[String]) -> Result<Vec<Option<String>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut cmd = ::redis::cmd("MGET");
        cmd.arg(keys);
        self.bounded(
            |mut conn| async move { cmd.query_async::<Vec<Option<String>>>(&mut conn).await },
        )
        .await
    }

    /// Removes `keys` in one round trip; true when the first was there (the others, kept beside
    /// it, are gone with it).
    pub async fn delete(&self, keys: &[String]) -> Result<bool, StoreError> {
        let mut pipe = ::redis::pipe();
        pipe.atomic();
        for key in keys {
            pipe.cmd("DEL").arg(key);
        }
        self.bounded(|mut conn| async move { pipe.query_async::<Vec<i64>>(&mut conn).await })
            .await
            .map(|removed| removed.first().is_some_and(|&n| n > 0))
    }

    /// Runs one request on the connection (connecting first if need be) within `CALL_TIMEOUT`.
    async fn bounded<T, F, Fut>(&self, request: F) -> Result<T, StoreError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = ::redis::RedisResult<T>>,
    {
        let work = async {
            let conn = self.connection().await?;
            request(conn).await.map_err(|e| self.error(&e))
        };
        match tokio::time::timeout(CALL_TIMEOUT, work).await {
            Ok(result) => result,
            Err(_) => Err(StoreError(format!(
                "Redis did not answer within {} ms",
                CALL_TIMEOUT.as_millis()
            ))),
        }
    }

    /// The shared connection, made on first use. A failed first connection is tried again by
    /// the next call; after that the manager reconnects by itself.
    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let client = self.client.as_ref().map_err(|e| StoreError(e.clone()))?;
        let conn = self
            .conn
            .get_or_try_init(|| async {
                // One connection attempt, no backoff: while Redis is down a refused connection
                // then fails a call at once (rather than after a backoff of sleeps, which every
                // request would wait out), and the next call's attempt finds a Redis that came
                // back. Calls share the attempt in flight, so a burst of them is one attempt.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(CALL_TIMEOUT)
                    .set_response_timeout(CALL_TIMEOUT)
                    .set_number_of_retries(0);
                let make = ConnectionManager::new_with_config(client.clone(), config);
                let made = match &self.home {
                    Some(home) => home.spawn(make).await.map_err(|e| {
                        StoreError(format!("Redis: the connection attempt ended early ({e})"))
                    })?,
                    None => make.await,
                };
                made.map_err(|e| self.error(&e))
            })
            .await?;
        Ok(conn.clone())
    }

    /// A Redis error as a `StoreError`, with the password (should the server or the crate
    /// ever echo it) scrubbed.
    fn error(&self, e: &::redis::RedisError) -> StoreError {
        let mut text = format!("Redis: {e}");
        if let Some(password) = self.password.as_deref().filter(|p| !p.is_empty()) {
            text = text.replace(password, "***");
        }
        StoreError(text)
    }
}

/// A pipeline that applies `updates` in order, their replies ignored.
fn pipeline_of(updates: &[Update]) -> Pipeline {
    let mut pipe = ::redis::pipe();
    for u in updates {
        u.add_to(&mut pipe);
    }
    pipe
}

/// Says what a failed call took with it: one line per call, not per update, so an outage
/// under load does not flood the log.
fn lost(updates: &[Update]) {
    if let Some(Update::Charge { key, .. } | Update::Release { key, .. }) = updates.first() {
        tracing::warn!(key = %key, updates = updates.len(), "limit updates were lost: the store is unreachable");
    }
}

/// The verdict from the script's reply, with the same helpers and waits as the local store.
fn verdict(
    limits: &KeyLimits,
    refused: i64,
    tat_ms: u64,
    current: u64,
    previous: u64,
    today: u64,
    now_ms: u64,
) -> Result<Verdict, StoreError> {
    let refused = match refused {
        0 => None,
        1 => {
            // The TAT is unchanged by a refusal, so GCRA at it says again how long to wait.
            let rpm = limits.rpm.unwrap_or(1);
            let wait = gcra(tat_ms, rpm, now_ms).err().unwrap_or(0);
            Some((Limit::Rpm, wait))
        }
        2 => Some((Limit::Tpm, MINUTE_MS - now_ms % MINUTE_MS)),
        3 => Some((Limit::DailyTokens, until_midnight_ms(now_ms))),
        4 => Some((Limit::MaxConcurrent, 1000)),
        other => {
            return Err(StoreError(format!(
                "the admission script answered refusal code {other}"
            )))
        }
    };
    let used = tokens_in_window(current, previous, now_ms);
    Ok(Verdict {
        refused,
        requests: limits.rpm.map(|rpm| requests_window(tat_ms, rpm, now_ms)),
        tokens: limits.tpm.map(|tpm| tokens_window(used, tpm, now_ms)),
        daily: limits.daily_tokens.map(|d| (today, d)),
    })
}

/// A TTL in milliseconds as Redis takes it.
fn ttl(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Key names. The gateway key between braces is the cluster hash tag.
mod keys {
    pub fn tat(key: &str) -> String {
        format!("modelgate:{{{key}}}:tat")
    }

    pub fn minute(key: &str, minute: u64) -> String {
        format!("modelgate:{{{key}}}:m:{minute}")
    }

    pub fn day(key: &str, day: u64) -> String {
        format!("modelgate:{{{key}}}:d:{day}")
    }

    pub fn slots(key: &str) -> String {
        format!("modelgate:{{{key}}}:slots")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        assert_eq!(keys::tat("team-a"), "modelgate:{team-a}:tat");
        assert_eq!(keys::minute("team-a", 7), "modelgate:{team-a}:m:7");
        assert_eq!(keys::day("team-a", 3), "modelgate:{team-a}:d:3");
        assert_eq!(keys::slots("team-a"), "modelgate:{team-a}:slots");
    }

    #[test]
    fn a_bad_url_fails_without_echoing_it() {
        let url = "redis://user:hunter2@[not a host";
        let Err(e) = RedisStore::open(url) else {
            unreachable!("the URL is invalid");
        };
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn every_url_form_the_config_accepts_opens() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "redis://user:pw@redis.internal:6380/",
            "rediss://redis.example.com:6380/",
            "unix:///run/redis.sock",
        ] {
            assert!(RedisStore::open(url).is_ok(), "{url}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_redis_fails_within_the_timeout() {
        // Port 1 on localhost: nothing listens, the connection is refused at once.
        let store = RedisStore::new("redis://:hunter2@127.0.0.1:1/");
        let start = std::time::Instant::now();
        let e = store
            .admit("k", &KeyLimits::default(), "s", 0)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.is_empty(), "the call failed");
        assert!(!e.contains("hunter2"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
