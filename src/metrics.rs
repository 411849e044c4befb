//! The `/metrics` families (Prometheus text): requests by model and outcome, durations, time to first byte, gaps between chunks, tokens, upstream attempts, requests in flight, refusals and reloads. Label values come from the config, never from a client.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub model: String,
    pub upstream: String,
    pub protocol: String,
    pub status: u16,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub model: String,
    pub upstream: String,
    pub protocol: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChunkLabels {
    pub model: String,
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub model: String,
    pub key: String,
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub upstream: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabels {
    pub key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// 1 ms to about 131 s, doubling: fine enough for a cached reply, long enough for a long answer.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// Every family, registered once; clones of a family share its values.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Histograms<RouteLabels>,
    pub ttfb: Histograms<RouteLabels>,
    pub inter_chunk: Histograms<ChunkLabels>,
    pub tokens: Family<TokenLabels, Counter>,
    pub attempts: Family<AttemptLabels, Counter>,
    pub in_flight: Gauge,
    pub in_flight_streams: Gauge,
    pub rate_limited: Family<KeyLabels, Counter>,
    pub store_errors: Counter<u64, AtomicU64>,
    /// How long each admission took in the limits' store: what a limited request waits for.
    pub admission: Histogram,
    pub reloads: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("modelgate");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests answered, by model, upstream, client protocol, status and outcome",
            requests.clone(),
        );
        let duration: Histograms<RouteLabels> = Family::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "From the request's arrival to its response's last byte",
            duration.clone(),
        );
        let ttfb: Histograms<RouteLabels> = Family::new_with_constructor(latency_histogram);
        registry.register(
            "time_to_first_byte_seconds",
            "From the request's arrival to the first body byte sent to the client",
            ttfb.clone(),
        );
        let inter_chunk: Histograms<ChunkLabels> = Family::new_with_constructor(latency_histogram);
        registry.register(
            "inter_chunk_seconds",
            "Gaps between body chunks sent to the client",
            inter_chunk.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "tokens",
            "Tokens the upstreams reported, by model, key and direction",
            tokens.clone(),
        );
        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "upstream_attempts",
            "Requests sent to upstreams, by result (ok, 4xx, 429, 5xx, connect, timeout, error)",
            attempts.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "in_flight_requests",
            "Requests not finished yet (streams until their last byte)",
            in_flight.clone(),
        );
        let in_flight_streams = Gauge::default();
        registry.register(
            "in_flight_streams",
            "Event streams not finished yet",
            in_flight_streams.clone(),
        );
        let rate_limited = Family::<KeyLabels, Counter>::default();
        registry.register(
            "rate_limited",
            "Requests refused by a per-key limit",
            rate_limited.clone(),
        );
        let store_errors: Counter<u64, AtomicU64> = Counter::default();
        registry.register(
            "store_errors",
            "Limit checks that could not reach the store and let the request through",
            store_errors.clone(),
        );
        // 25 µs to about 0.4 s, doubling: a local Redis answers in a fraction of a millisecond,
        // which the request histograms' first 1 ms bucket cannot tell apart.
        let admission = Histogram::new(exponential_buckets(0.000_025, 2.0, 15));
        registry.register(
            "store_admission_seconds",
            "Time to admit a limited request in the limits' store (one round trip with Redis)",
            admission.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Config reloads, applied (ok) or refused (error)",
            reloads.clone(),
        );
        // Both results show from the start, so a scraper can alert on the first failure.
        let _ = reloads.get_or_create(&ResultLabels { result: "ok" });
        let _ = reloads.get_or_create(&ResultLabels { result: "error" });
        Self {
            registry,
            requests,
            duration,
            ttfb,
            inter_chunk,
            tokens,
            attempts,
            in_flight,
            in_flight_streams,
            rate_limited,
            store_errors,
            admission,
            reloads,
        }
    }

    pub fn config_reloaded(&self, ok: bool) {
        self.reloads
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    pub fn attempt(&self, upstream: &str, result: &'static str) {
        self.attempts
            .get_or_create(&AttemptLabels {
                upstream: upstream.to_owned(),
                result,
            })
            .inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
            out.push_str("# metrics could not be encoded\n");
        }
        out
    }
}

/// The client protocols, in `Protocol as usize` order: the `protocol` label of LLM requests.
const PROTOCOLS: [&str; 3] = ["chat", "messages", "responses"];

/// Every `result` of `upstream_attempts`.
pub const ATTEMPT_RESULTS: [&str; 7] = ["ok", "4xx", "429", "5xx", "connect", "timeout", "error"];

/// Keys whose token counters one route keeps at hand; others are looked up each time.
const KEPT_KEYS: usize = 64;

/// The series one request of a route updates, each looked up on its first use and kept with
/// the config's model (labels hashed once, not on every request). Clones of a series share its
/// values, so a reloaded config's fresh lookups count on the same series, and a series never
/// used is never created (nor shown).
#[derive(Debug)]
pub struct RouteSeries {
    model: String,
    upstream: String,
    by_protocol: [ProtocolSeries; 3],
    inter_chunk: OnceLock<Histogram>,
    /// Token counters (input, output, cached) by key name.
    tokens: Mutex<Vec<(String, [Counter; 3])>>,
}

#[derive(Debug, Default)]
struct ProtocolSeries {
    /// `requests` with status 200 and outcome ok, by far the most counted.
    ok: OnceLock<Counter>,
    duration: OnceLock<Histogram>,
    ttfb: OnceLock<Histogram>,
}

impl RouteSeries {
    fn new(model: &str, upstream: &str) -> Self {
        Self {
            model: model.to_owned(),
            upstream: upstream.to_owned(),
            by_protocol: Default::default(),
            inter_chunk: OnceLock::new(),
            tokens: Mutex::default(),
        }
    }

    fn labels(&self, protocol: &str) -> RouteLabels {
        RouteLabels {
            model: self.model.clone(),
            upstream: self.upstream.clone(),
            protocol: protocol.to_owned(),
        }
    }

    /// Counts a finished request of `protocol`: the 200-ok count when `status_ok`, its duration
    /// and time to first byte. False when the protocol is not an LLM one; the caller then
    /// counts it by labels.
    pub fn finished(
        &self,
        metrics: &Metrics,
        protocol: &str,
        status_ok: bool,
        duration: f64,
        ttfb: Option<f64>,
    ) -> bool {
        let Some(p) = PROTOCOLS.iter().position(|p| *p == protocol) else {
            return false;
        };
        let s = &self.by_protocol[p];
        if status_ok {
            s.ok.get_or_init(|| {
                metrics
                    .requests
                    .get_or_create(&RequestLabels {
                        model: self.model.clone(),
                        upstream: self.upstream.clone(),
                        protocol: protocol.to_owned(),
                        status: 200,
                        outcome: "ok",
                    })
                    .clone()
            })
            .inc();
        }
        s.duration
            .get_or_init(|| {
                metrics
                    .duration
                    .get_or_create(&self.labels(protocol))
                    .clone()
            })
            .observe(duration);
        if let Some(t) = ttfb {
            s.ttfb
                .get_or_init(|| metrics.ttfb.get_or_create(&self.labels(protocol)).clone())
                .observe(t);
        }
        true
    }

    /// The gaps between this route's chunks.
    pub fn inter_chunk(&self, metrics: &Metrics) -> Histogram {
        self.inter_chunk
            .get_or_init(|| {
                metrics
                    .inter_chunk
                    .get_or_create(&ChunkLabels {
                        model: self.model.clone(),
                        upstream: self.upstream.clone(),
                    })
                    .clone()
            })
            .clone()
    }

    /// Adds tokens to `key`'s counters for this route's model.
    pub fn tokens(&self, metrics: &Metrics, key: &str, counts: [u64; 3]) {
        if counts.iter().all(|n| *n == 0) {
            return;
        }
        let mut kept = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        let at = match kept.iter().position(|(k, _)| k == key) {
            Some(at) => at,
            None => {
                let counters = TOKEN_DIRECTIONS.map(|direction| {
                    metrics
                        .tokens
                        .get_or_create(&TokenLabels {
                            model: self.model.clone(),
                            key: key.to_owned(),
                            direction,
                        })
                        .clone()
                });
                if kept.len() >= KEPT_KEYS {
                    drop(kept);
                    add_tokens(&counters, counts);
                    return;
                }
                kept.push((key.to_owned(), counters));
                kept.len() - 1
            }
        };
        add_tokens(&kept[at].1, counts);
    }
}

/// The `direction` label of each token count, in the order the counts come.
pub const TOKEN_DIRECTIONS: [&str; 3] = ["input", "output", "cached"];

fn add_tokens(counters: &[Counter; 3], counts: [u64; 3]) {
    for (c, n) in counters.iter().zip(counts) {
        if n > 0 {
            c.inc_by(n);
        }
    }
}

/// A model's route series by upstream, filled as its requests are answered; part of the
/// config's `Model`, so a reload starts a new one.
#[derive(Default)]
pub struct RouteCache(Mutex<Vec<Arc<RouteSeries>>>);

impl std::fmt::Debug for RouteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteCache")
    }
}

impl RouteCache {
    /// The series of this model (named `model`) served by `upstream`.
    pub fn get(&self, model: &str, upstream: &str) -> Arc<RouteSeries> {
        let mut routes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = routes.iter().find(|r| r.upstream == upstream) {
            return r.clone();
        }
        let r = Arc::new(RouteSeries::new(model, upstream));
        routes.push(r.clone());
        r
    }
}

/// An upstream's `upstream_attempts` counters, one per result in [`ATTEMPT_RESULTS`] order,
/// each looked up on its first use; part of the config's `Upstream`.
#[derive(Default)]
pub struct AttemptCache([OnceLock<Counter>; 7]);

impl std::fmt::Debug for AttemptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttemptCache")
    }
}

impl AttemptCache {
    /// Counts one attempt on `upstream` that ended in `result`.
    pub fn count(&self, metrics: &Metrics, upstream: &str, result: &'static str) {
        let Some(i) = ATTEMPT_RESULTS.iter().position(|r| *r == result) else {
            metrics.attempt(upstream, result);
            return;
        };
        self.0[i]
            .get_or_init(|| {
                metrics
                    .attempts
                    .get_or_create(&AttemptLabels {
                        upstream: upstream.to_owned(),
                        result,
                    })
                    .clone()
            })
            .inc();
    }
}
