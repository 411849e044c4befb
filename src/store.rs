//! Shared state for per-key limits: one admission check and one token charge per request, kept in this process or in Redis, with the same arithmetic either way.
//!
//! The algorithms, per key:
//! - `rpm`: GCRA. Each request moves a theoretical arrival time (TAT) on by `T = 60 s / rpm`; a
//!   request is admitted while `max(TAT, now) + T - now <= burst × T`, `burst = max(1, rpm / 10)`.
//! - `tpm`: tokens charged into one-minute buckets; the window's use is the current minute's
//!   tokens plus the previous minute's, weighted by how much of it is still inside the last 60 s.
//!   A request is admitted while that is under `tpm` (its own tokens are only known at its end).
//! - `daily_tokens`: tokens charged per UTC day; admitted while under the budget.
//! - `max_concurrent`: requests holding a slot; a slot is released when the response ends. In
//!   Redis each slot carries an expiry, so an instance that dies does not leak its slots.
//!
//! Nothing is counted for a refused request.

pub mod contract;
mod local;
pub mod redis;

use std::time::Duration;

use crate::config::KeyLimits;

pub use local::LocalStore;
pub use redis::RedisStore;

pub const MINUTE_MS: u64 = 60_000;
pub const DAY_MS: u64 = 86_400_000;
/// A concurrency slot no instance released (it died) is reclaimed after this long.
pub const SLOT_TTL_MS: u64 = 15 * 60_000;

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Rpm,
    Tpm,
    MaxConcurrent,
    DailyTokens,
}

/// The state of one rate window after an admission check, for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub limit: u64,
    pub remaining: u64,
    /// Until the window is back to its full limit.
    pub reset_ms: u64,
}

/// The answer of an admission check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// `None`: admitted (and counted); else the first limit that refused, and how long until
    /// a retry could pass it.
    pub refused: Option<(Limit, u64)>,
    pub requests: Option<Window>,
    pub tokens: Option<Window>,
    /// Tokens used today and the day's budget, when the key has one.
    pub daily: Option<(u64, u64)>,
}

/// The store could not be reached or answered garbage.
#[derive(Debug, thiserror::Error)]
#[error("the shared store failed: {0}")]
pub struct StoreError(pub String);

/// Where the counters live.
pub enum Store {
    Local(LocalStore),
    /// Shared with the background tasks that charge tokens and release slots.
    Redis(std::sync::Arc<RedisStore>),
}

impl Store {
    /// Checks every limit `limits` sets for `key` and, when all pass, counts the request and
    /// takes a concurrency slot named `slot` (when `max_concurrent` is set).
    pub async fn admit(
        &self,
        key: &str,
        limits: &KeyLimits,
        slot: &str,
        now_ms: u64,
    ) -> Result<Verdict, StoreError> {
        match self {
            Self::Local(s) => Ok(s.admit(key, limits, slot, now_ms)),
            Self::Redis(s) => s.admit(key, limits, slot, now_ms).await,
        }
    }

    /// Adds a reply's tokens to the key's minute and day.
    pub async fn charge(&self, key: &str, tokens: u64, now_ms: u64) -> Result<(), StoreError> {
        match self {
            Self::Local(s) => {
                s.charge(key, tokens, now_ms);
                Ok(())
            }
            Self::Redis(s) => s.charge(key, tokens, now_ms).await,
        }
    }

    /// Gives back a concurrency slot.
    pub async fn release(&self, key: &str, slot: &str) -> Result<(), StoreError> {
        match self {
            Self::Local(s) => {
                s.release(key, slot);
                Ok(())
            }
            Self::Redis(s) => s.release(key, slot).await,
        }
    }
}

/// GCRA for one request at `now`: the new TAT when admitted, else how long to wait.
pub fn gcra(tat_ms: u64, rpm: u32, now_ms: u64) -> Result<u64, u64> {
    let t = emission_ms(rpm);
    let burst = u64::from((rpm / 10).max(1));
    let next = tat_ms.max(now_ms) + t;
    let ahead = next - now_ms;
    if ahead <= burst * t {
        Ok(next)
    } else {
        Err(ahead - burst * t)
    }
}

/// The spacing GCRA keeps between requests: 60 s / rpm.
pub fn emission_ms(rpm: u32) -> u64 {
    (MINUTE_MS / u64::from(rpm.max(1))).max(1)
}

/// The requests window as the headers tell it: how many of `rpm` the next minute still holds
/// once the TAT has run down, and when it will have.
pub fn requests_window(tat_ms: u64, rpm: u32, now_ms: u64) -> Window {
    let t = emission_ms(rpm);
    let backlog = tat_ms.saturating_sub(now_ms);
    let used = backlog.div_ceil(t);
    Window {
        limit: u64::from(rpm),
        remaining: u64::from(rpm).saturating_sub(used),
        reset_ms: backlog,
    }
}

/// Tokens used in the last minute: this minute's bucket, and the previous one weighted by the
/// share of it still inside the window.
pub fn tokens_in_window(current: u64, previous: u64, now_ms: u64) -> u64 {
    let into = now_ms % MINUTE_MS;
    // In u128: an upstream can report any u64 of usage, and the product must not wrap.
    let weighted = u128::from(previous) * u128::from(MINUTE_MS - into) / u128::from(MINUTE_MS);
    current.saturating_add(u64::try_from(weighted).unwrap_or(u64::MAX))
}

/// The tokens window for the headers: until the previous minute has slid out entirely.
pub fn tokens_window(used: u64, tpm: u64, now_ms: u64) -> Window {
    Window {
        limit: tpm,
        remaining: tpm.saturating_sub(used),
        reset_ms: if used == 0 {
            0
        } else {
            MINUTE_MS - now_ms % MINUTE_MS
        },
    }
}

/// Milliseconds until the next UTC midnight.
pub fn until_midnight_ms(now_ms: u64) -> u64 {
    DAY_MS - now_ms % DAY_MS
}

/// The `retry-after` of a refusal, in whole seconds (at least 1).
pub fn retry_after_secs(wait_ms: u64) -> u64 {
    wait_ms.div_ceil(1000).max(1)
}

/// A duration as OpenAI writes its `x-ratelimit-reset-*` headers: `20ms`, `1.5s`, `6m0s`.
pub fn reset_text(ms: u64) -> String {
    let d = Duration::from_millis(ms);
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < MINUTE_MS {
        let s = d.as_secs_f64();
        let text = format!("{s:.3}");
        format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
    } else {
        format!("{}m{}s", ms / MINUTE_MS, (ms % MINUTE_MS) / 1000)
    }
}

#[cfg(test)]
mod tests;
