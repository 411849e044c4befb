//! Per-key limits at the gateway: admit or refuse each request (429 with `retry-after` and the `x-ratelimit-*` headers), hold its concurrency slot until its response ends, and charge its tokens once its usage is known.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::sync::atomic::AtomicU64;

use http::{HeaderName, HeaderValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::auth::Principal;
use crate::config::{KeyLimits, OnStoreError, StoreSettings};
use crate::error::{ErrorKind, GatewayError};
use crate::metrics::{KeyLabels, Metrics};
use crate::store::{self, Limit, LocalStore, RedisStore, Store, Verdict, Window};

/// The gateway's side of the limits: the store and what to do when it fails.
pub struct Limiter {
    store: Store,
    on_error: OnStoreError,
    /// Refusals by key name, for `/metrics` (a family shared with the registry).
    refused: Family<KeyLabels, Counter>,
    /// Store failures that let a request through (`on_error = "allow"`).
    store_errors: Counter<u64, AtomicU64>,
    /// Admission times, for `/metrics`.
    admission: Histogram,
}

impl Limiter {
    pub fn new(settings: &StoreSettings, metrics: &Metrics) -> Self {
        let store = match &settings.redis_url {
            Some(url) => match url.header_value().to_str() {
                Ok(u) => Store::Redis(Arc::new(RedisStore::new(u))),
                Err(_) => Store::Local(LocalStore::default()),
            },
            None => Store::Local(LocalStore::default()),
        };
        Self {
            store,
            on_error: settings.on_error,
            refused: metrics.rate_limited.clone(),
            store_errors: metrics.store_errors.clone(),
            admission: metrics.admission.clone(),
        }
    }

    /// The Redis store the limits use, when `[store]` names one: stored responses share its
    /// connection.
    pub fn redis(&self) -> Option<Arc<RedisStore>> {
        match &self.store {
            Store::Redis(r) => Some(r.clone()),
            Store::Local(_) => None,
        }
    }

    /// Admits one request of `key`, or refuses it in the caller's error shape (429, or 503
    /// when the store is down and `on_error = "deny"`). `slot` names the request's
    /// concurrency slot (its request id).
    pub async fn admit(
        self: &Arc<Self>,
        key: &Principal,
        limits: KeyLimits,
        slot: &str,
    ) -> Result<Admission, Refusal> {
        if limits.is_unlimited() {
            return Ok(Admission::default());
        }
        let started = Instant::now();
        let admitted = self.store.admit(&key.name, &limits, slot, now_ms()).await;
        self.admission.observe(started.elapsed().as_secs_f64());
        let verdict = match admitted {
            Ok(v) => v,
            Err(e) => {
                return match self.on_error {
                    OnStoreError::Allow => {
                        self.store_errors.inc();
                        tracing::warn!(key = %key.name, error = %e, "limits not enforced: the store is unreachable (on_error = allow)");
                        Ok(Admission::default())
                    }
                    OnStoreError::Deny => Err(Refusal {
                        error: GatewayError {
                            source: Some(Arc::new(e)),
                            ..GatewayError::new(
                                ErrorKind::StoreUnavailable,
                                "the rate-limit store is unreachable; try again shortly",
                            )
                        },
                        headers: Vec::new(),
                    }),
                };
            }
        };
        let mut headers = window_headers(&verdict);
        if let Some((limit, wait_ms)) = verdict.refused {
            self.refused
                .get_or_create(&KeyLabels {
                    key: key.name.clone(),
                })
                .inc();
            let secs = store::retry_after_secs(wait_ms);
            headers.push((http::header::RETRY_AFTER, HeaderValue::from(secs)));
            return Err(Refusal {
                error: GatewayError::new(
                    ErrorKind::RateLimited,
                    refusal_message(limit, &limits, &verdict, secs),
                ),
                headers,
            });
        }
        let key_name: Arc<str> = Arc::from(key.name.as_str());
        Ok(Admission {
            headers,
            slot: limits.max_concurrent.map(|_| Slot {
                limiter: self.clone(),
                key: key_name.clone(),
                slot: slot.to_owned(),
            }),
            meter: limits.counts_tokens().then(|| Meter {
                limiter: self.clone(),
                key: key_name,
            }),
        })
    }

    fn charge(&self, key: &str, tokens: u64) {
        match &self.store {
            Store::Local(s) => s.charge(key, tokens, now_ms()),
            // Queued for the next admission's round trip: the response never waits for it.
            Store::Redis(r) => r.charge_later(key, tokens, now_ms()),
        }
    }

    fn release(&self, key: &str, slot: String) {
        match &self.store {
            Store::Local(s) => s.release(key, &slot),
            Store::Redis(r) => r.release_later(key, slot),
        }
    }

    /// Sends the charges and releases still queued for the shared store (at shutdown).
    pub async fn flush(&self) {
        if let Store::Redis(r) = &self.store {
            r.flush().await;
        }
    }
}

/// A refused request: the error, and the headers that go with it.
#[derive(Debug)]
pub struct Refusal {
    pub error: GatewayError,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// An admitted request: the headers its response carries, its concurrency slot (released when
/// dropped: with the response body, for a stream at its last byte) and its token meter.
#[derive(Default)]
pub struct Admission {
    pub headers: Vec<(HeaderName, HeaderValue)>,
    slot: Option<Slot>,
    meter: Option<Meter>,
}

impl Admission {
    /// Splits off the slot and meter, to travel with the response body.
    pub fn take_hold(&mut self) -> Hold {
        Hold {
            _slot: self.slot.take(),
            meter: self.meter.take(),
        }
    }
}

/// What an admitted request holds until its response ends.
#[derive(Default)]
pub struct Hold {
    _slot: Option<Slot>,
    pub meter: Option<Meter>,
}

impl Hold {
    /// Whether the response's usage must be read.
    pub fn wants_usage(&self) -> bool {
        self.meter.is_some()
    }
}

struct Slot {
    limiter: Arc<Limiter>,
    key: Arc<str>,
    slot: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limiter
            .release(&self.key, std::mem::take(&mut self.slot));
    }
}

/// Charges a reply's tokens to its key.
pub struct Meter {
    limiter: Arc<Limiter>,
    key: Arc<str>,
}

impl Meter {
    pub fn charge(&self, tokens: u64) {
        if tokens > 0 {
            self.limiter.charge(&self.key, tokens);
        }
    }
}

static LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
static REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
static RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
static LIMIT_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-limit-tokens");
static REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");
static RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");

/// OpenAI's `x-ratelimit-*` trios for the windows the key has.
fn window_headers(v: &Verdict) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(6);
    let mut trio = |w: &Window, names: [&HeaderName; 3]| {
        out.push((names[0].clone(), HeaderValue::from(w.limit)));
        out.push((names[1].clone(), HeaderValue::from(w.remaining)));
        if let Ok(v) = HeaderValue::try_from(store::reset_text(w.reset_ms)) {
            out.push((names[2].clone(), v));
        }
    };
    if let Some(w) = &v.requests {
        trio(w, [&LIMIT_REQUESTS, &REMAINING_REQUESTS, &RESET_REQUESTS]);
    }
    if let Some(w) = &v.tokens {
        trio(w, [&LIMIT_TOKENS, &REMAINING_TOKENS, &RESET_TOKENS]);
    }
    out
}

fn refusal_message(limit: Limit, limits: &KeyLimits, v: &Verdict, secs: u64) -> String {
    match limit {
        Limit::Rpm => format!(
            "rate limit reached for this API key: {} requests per minute; retry after {secs} s",
            limits.rpm.unwrap_or_default()
        ),
        Limit::Tpm => format!(
            "rate limit reached for this API key: {} tokens per minute; retry after {secs} s",
            limits.tpm.unwrap_or_default()
        ),
        Limit::MaxConcurrent => format!(
            "this API key already has {} requests in progress, its limit; retry when one ends",
            limits.max_concurrent.unwrap_or_default()
        ),
        Limit::DailyTokens => {
            let (used, budget) = v.daily.unwrap_or_default();
            format!(
                "the daily token budget of this API key is spent ({used} of {budget} tokens); it renews at 00:00 UTC, in {}",
                store::reset_text(Duration::from_secs(secs).as_millis() as u64)
            )
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
