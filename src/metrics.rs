//! The `/metrics` families (Prometheus text): requests by model and outcome, durations, time to first byte, gaps between chunks, tokens, upstream attempts, requests in flight, refusals and reloads. Label values come from the config, never from a client.

use std::sync::atomic::AtomicU64;

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
