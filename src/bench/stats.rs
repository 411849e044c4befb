//! From records to figures: HDR histograms (microsecond resolution, 3 significant digits) summarised as p50/p90/p95/p99/max/mean in ms, throughput per endpoint, and the compare diff.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::load::Record;
use super::ms;

/// Percentiles, max and mean of one measure, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    pub const FIELDS: [&'static str; 6] = ["p50", "p90", "p95", "p99", "max", "mean"];

    pub fn values(&self) -> [f64; 6] {
        [self.p50, self.p90, self.p95, self.p99, self.max, self.mean]
    }

    fn minus(&self, o: &Summary) -> Summary {
        Summary {
            p50: round(self.p50 - o.p50),
            p90: round(self.p90 - o.p90),
            p95: round(self.p95 - o.p95),
            p99: round(self.p99 - o.p99),
            max: round(self.max - o.max),
            mean: round(self.mean - o.mean),
        }
    }
}

/// Microseconds to an hour: any latency a benchmark can see, at 3 significant digits
/// (a 20 ms gap is resolved to 0.01 ms).
fn histogram() -> Option<Histogram<u64>> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).ok()
}

/// Milliseconds with microsecond precision: what the histograms resolve, and no false digits.
pub fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A measure being accumulated: the histogram for the figures, the raw values for the charts.
struct Acc {
    hist: Option<Histogram<u64>>,
    values: Vec<f64>,
}

impl Acc {
    fn new() -> Self {
        Self {
            hist: histogram(),
            values: Vec::new(),
        }
    }

    fn add(&mut self, d: Duration) {
        if let Some(h) = &mut self.hist {
            h.saturating_record(micros(d));
        }
        self.values.push(ms(d));
    }

    fn summary(&self) -> Option<Summary> {
        let h = self.hist.as_ref().filter(|h| !h.is_empty())?;
        let q = |p: f64| round(h.value_at_quantile(p) as f64 / 1000.0);
        Some(Summary {
            p50: q(0.50),
            p90: q(0.90),
            p95: q(0.95),
            p99: q(0.99),
            max: round(h.max() as f64 / 1000.0),
            mean: round(h.mean() / 1000.0),
        })
    }

    fn sorted(mut self) -> Vec<f64> {
        self.values.sort_by(f64::total_cmp);
        self.values
    }
}

/// The figures of one endpoint, in the shape of §12's `endpoints[]`.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointStats {
    pub url: String,
    pub protocol: &'static str,
    pub model: String,
    pub requests: u64,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub ttft_ms: Option<Summary>,
    pub itl_ms: Option<Summary>,
    pub tpot_ms: Option<Summary>,
    pub e2e_ms: Option<Summary>,
    pub schedule_lag_ms: Option<Summary>,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Sorted raw values (ms) of successful requests, for the charts.
    #[serde(skip)]
    pub raw: Raw,
}

#[derive(Debug, Clone, Default)]
pub struct Raw {
    pub ttft: Vec<f64>,
    pub itl: Vec<f64>,
    pub e2e: Vec<f64>,
}

/// Figures of `endpoint` from all records. Latencies count successful requests only (a refused
/// request's 2 ms would flatter the p50); schedule lag counts every request.
pub fn endpoint_stats(
    records: &[Record],
    endpoint: usize,
    url: &str,
    protocol: &'static str,
    model: &str,
) -> EndpointStats {
    let mut ttft = Acc::new();
    let mut itl = Acc::new();
    let mut tpot = Acc::new();
    let mut e2e = Acc::new();
    let mut lag = Acc::new();
    let mut errors = BTreeMap::new();
    let (mut requests, mut ok, mut tokens) = (0u64, 0u64, 0u64);
    let mut elapsed = Duration::ZERO;
    for r in records.iter().filter(|r| r.endpoint == endpoint) {
        requests += 1;
        lag.add(r.m.lag);
        elapsed = elapsed.max(r.end());
        if let Some(kind) = &r.m.error {
            *errors.entry(kind.clone()).or_insert(0) += 1;
            continue;
        }
        ok += 1;
        tokens += r.m.output_tokens;
        e2e.add(r.m.e2e);
        if let Some(t) = r.m.ttft {
            ttft.add(t);
            if let Some(per) = tpot_of(r.m.e2e, t, r.m.output_tokens) {
                tpot.add(per);
            }
        }
        for gap in &r.m.itl {
            itl.add(*gap);
        }
    }
    let secs = elapsed.as_secs_f64();
    let per_s = |n: u64| {
        if secs > 0.0 {
            round(n as f64 / secs)
        } else {
            0.0
        }
    };
    EndpointStats {
        url: url.to_owned(),
        protocol,
        model: model.to_owned(),
        requests,
        ok,
        errors,
        ttft_ms: ttft.summary(),
        itl_ms: itl.summary(),
        tpot_ms: tpot.summary(),
        e2e_ms: e2e.summary(),
        schedule_lag_ms: lag.summary(),
        requests_per_s: per_s(ok),
        output_tokens_per_s: per_s(tokens),
        raw: Raw {
            ttft: ttft.sorted(),
            itl: itl.sorted(),
            e2e: e2e.sorted(),
        },
    }
}

/// Time per output token after the first: (e2e − ttft) / (tokens − 1). None for fewer than two
/// tokens, and for whole replies (ttft = e2e), where it would read as a false 0.
pub fn tpot_of(e2e: Duration, ttft: Duration, tokens: u64) -> Option<Duration> {
    if tokens < 2 || e2e <= ttft {
        return None;
    }
    let n = u32::try_from(tokens - 1).unwrap_or(u32::MAX);
    Some((e2e - ttft) / n)
}

/// Second endpoint minus first, per statistic (§12 `diff`).
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub ttft_ms: Option<Summary>,
    pub itl_ms: Option<Summary>,
    pub tpot_ms: Option<Summary>,
    pub e2e_ms: Option<Summary>,
    pub schedule_lag_ms: Option<Summary>,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
}

pub fn diff(first: &EndpointStats, second: &EndpointStats) -> Diff {
    let d = |a: &Option<Summary>, b: &Option<Summary>| match (a, b) {
        (Some(a), Some(b)) => Some(b.minus(a)),
        _ => None,
    };
    Diff {
        ttft_ms: d(&first.ttft_ms, &second.ttft_ms),
        itl_ms: d(&first.itl_ms, &second.itl_ms),
        tpot_ms: d(&first.tpot_ms, &second.tpot_ms),
        e2e_ms: d(&first.e2e_ms, &second.e2e_ms),
        schedule_lag_ms: d(&first.schedule_lag_ms, &second.schedule_lag_ms),
        requests_per_s: round(second.requests_per_s - first.requests_per_s),
        output_tokens_per_s: round(second.output_tokens_per_s - first.output_tokens_per_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::client::Measured;

    fn rec(endpoint: usize, ttft_ms: u64, e2e_ms: u64, tokens: u64, err: Option<&str>) -> Record {
        Record {
            endpoint,
            scheduled: Duration::ZERO,
            m: Measured {
                lag: Duration::from_micros(50),
                ttft: Some(Duration::from_millis(ttft_ms)),
                e2e: Duration::from_millis(e2e_ms),
                itl: vec![Duration::from_millis(20); tokens.saturating_sub(1) as usize],
                output_tokens: tokens,
                error: err.map(str::to_owned),
            },
        }
    }

    #[test]
    fn figures_and_tpot() {
        let rs = vec![
            rec(0, 20, 220, 11, None),
            rec(0, 20, 220, 11, None),
            rec(0, 0, 2, 0, Some("http_401")),
        ];
        let s = endpoint_stats(&rs, 0, "u", "chat", "m");
        assert_eq!((s.requests, s.ok), (3, 2));
        assert_eq!(s.errors.get("http_401"), Some(&1));
        let itl = s.itl_ms.unwrap();
        assert!((itl.p50 - 20.0).abs() < 0.02, "{itl:?}");
        assert!((s.tpot_ms.unwrap().p50 - 20.0).abs() < 0.02);
        assert!((s.requests_per_s - 2.0 / 0.22).abs() < 0.01);
        assert_eq!(s.raw.itl.len(), 20);
        let other = endpoint_stats(&[rec(1, 25, 250, 11, None)], 1, "v", "chat", "m");
        let d = diff(&s, &other);
        assert!((d.ttft_ms.unwrap().p50 - 5.0).abs() < 0.02);
    }

    #[test]
    fn no_tpot_for_whole_replies_or_one_token() {
        let d = Duration::from_millis(10);
        assert_eq!(tpot_of(d, d, 10), None);
        assert_eq!(tpot_of(d * 2, d, 1), None);
        assert_eq!(tpot_of(d * 3, d, 3), Some(d));
    }
}
