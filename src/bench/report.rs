//! The run's results as a person or a program reads them: the printed table, `--json` (gateway.md §12's shape, times in ms) and `--csv` (one row per request).

use std::fmt::Write as _;

use serde::Serialize;

use super::load::{Outcome, Plan};
use super::ms;
use super::stats::{self, round, Diff, EndpointStats, Summary};

/// Every figure of a run, and every request.
pub struct Report {
    pub describe: String,
    pub endpoints: Vec<EndpointStats>,
    pub diff: Option<Diff>,
    pub requests: Vec<RequestRow>,
    pub interrupted: bool,
    pub elapsed_s: f64,
}

/// One request as `--json` and `--csv` write it. `schedule_lag_ms` and `tpot_ms` are beyond
/// §12's list (which they only extend): the lag is the client's own error, worth seeing per request.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub endpoint: usize,
    pub scheduled_ms: f64,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub output_tokens: u64,
    pub itl_ms: Vec<f64>,
    pub error: Option<String>,
    pub schedule_lag_ms: f64,
    pub tpot_ms: Option<f64>,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    endpoints: &'a [EndpointStats],
    diff: Option<&'a Diff>,
    requests: &'a [RequestRow],
}

impl Report {
    pub fn build(plan: &Plan, outcome: &Outcome) -> Self {
        let endpoints: Vec<EndpointStats> = plan
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                stats::endpoint_stats(&outcome.records, i, url, plan.protocol.name(), &plan.model)
            })
            .collect();
        let diff = match endpoints.as_slice() {
            [a, b] => Some(stats::diff(a, b)),
            _ => None,
        };
        let mut records: Vec<_> = outcome.records.iter().collect();
        records.sort_by_key(|r| (r.scheduled, r.endpoint));
        let requests = records
            .iter()
            .map(|r| RequestRow {
                endpoint: r.endpoint,
                scheduled_ms: round(ms(r.scheduled)),
                ttft_ms: r.m.ttft.map(|t| round(ms(t))),
                e2e_ms: round(ms(r.m.e2e)),
                output_tokens: r.m.output_tokens,
                itl_ms: r.m.itl.iter().map(|d| round(ms(*d))).collect(),
                error: r.m.error.clone(),
                schedule_lag_ms: round(ms(r.m.lag)),
                tpot_ms: r
                    .m
                    .ttft
                    .and_then(|t| stats::tpot_of(r.m.e2e, t, r.m.output_tokens))
                    .map(|d| round(ms(d))),
            })
            .collect();
        Self {
            describe: plan.describe(),
            endpoints,
            diff,
            requests,
            interrupted: outcome.interrupted,
            elapsed_s: outcome.elapsed.as_secs_f64(),
        }
    }

    pub fn json(&self) -> String {
        let out = JsonOut {
            endpoints: &self.endpoints,
            diff: self.diff.as_ref(),
            requests: &self.requests,
        };
        // Plain data with string keys always serialises.
        serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"
    }

    pub fn csv(&self) -> String {
        let mut s = String::from(
            "endpoint,url,scheduled_ms,schedule_lag_ms,ttft_ms,tpot_ms,e2e_ms,output_tokens,deltas,itl_mean_ms,itl_max_ms,error\n",
        );
        for r in &self.requests {
            let url = self
                .endpoints
                .get(r.endpoint)
                .map_or("", |e| e.url.as_str());
            let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
            let itl_mean = (!r.itl_ms.is_empty())
                .then(|| round(r.itl_ms.iter().sum::<f64>() / r.itl_ms.len() as f64));
            let itl_max = r.itl_ms.iter().copied().reduce(f64::max);
            let deltas = if r.ttft_ms.is_some() {
                r.itl_ms.len() + 1
            } else {
                0
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{}",
                r.endpoint,
                csv_field(url),
                r.scheduled_ms,
                r.schedule_lag_ms,
                opt(r.ttft_ms),
                opt(r.tpot_ms),
                r.e2e_ms,
                r.output_tokens,
                deltas,
                opt(itl_mean),
                opt(itl_max),
                r.error.as_deref().unwrap_or(""),
            );
        }
        s
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "modelgate bench: {}", self.describe);
        if self.interrupted {
            let _ = writeln!(
                s,
                "(interrupted after {:.1} s: partial results)",
                self.elapsed_s
            );
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            let _ = writeln!(s, "\n[{i}] {}", e.url);
            let errors = if e.errors.is_empty() {
                "none".to_owned()
            } else {
                e.errors
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                s,
                "    requests {}  ok {}  errors: {errors}",
                e.requests, e.ok
            );
            let _ = writeln!(
                s,
                "    throughput {:.2} req/s  {:.1} output tokens/s",
                e.requests_per_s, e.output_tokens_per_s
            );
            stat_header(&mut s);
            for (name, v) in rows(
                &e.ttft_ms,
                &e.itl_ms,
                &e.tpot_ms,
                &e.e2e_ms,
                &e.schedule_lag_ms,
            ) {
                stat_row(&mut s, name, v, false);
            }
        }
        if let Some(d) = &self.diff {
            let _ = writeln!(s, "\ndiff [1] - [0] (positive: the second is slower)");
            let _ = writeln!(
                s,
                "    throughput {:+.2} req/s  {:+.1} output tokens/s",
                d.requests_per_s, d.output_tokens_per_s
            );
            stat_header(&mut s);
            for (name, v) in rows(
                &d.ttft_ms,
                &d.itl_ms,
                &d.tpot_ms,
                &d.e2e_ms,
                &d.schedule_lag_ms,
            ) {
                stat_row(&mut s, name, v, true);
            }
        }
        s
    }
}

fn rows<'a>(
    ttft: &'a Option<Summary>,
    itl: &'a Option<Summary>,
    tpot: &'a Option<Summary>,
    e2e: &'a Option<Summary>,
    lag: &'a Option<Summary>,
) -> [(&'static str, &'a Option<Summary>); 5] {
    [
        ("ttft ms", ttft),
        ("itl ms", itl),
        ("tpot ms", tpot),
        ("e2e ms", e2e),
        ("sched lag ms", lag),
    ]
}

fn stat_header(s: &mut String) {
    let _ = write!(s, "    {:<14}", "");
    for f in Summary::FIELDS {
        let _ = write!(s, "{f:>10}");
    }
    s.push('\n');
}

fn stat_row(s: &mut String, name: &str, v: &Option<Summary>, signed: bool) {
    let _ = write!(s, "    {name:<14}");
    match v {
        Some(v) => {
            for x in v.values() {
                // A difference that rounds to zero prints as +0.00, not -0.00.
                let x = if x.abs() < 0.005 { 0.0 } else { x };
                if signed {
                    let _ = write!(s, "{x:>+10.2}");
                } else {
                    let _ = write!(s, "{x:>10.2}");
                }
            }
        }
        None => {
            for _ in Summary::FIELDS {
                let _ = write!(s, "{:>10}", "-");
            }
        }
    }
    s.push('\n');
}

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_owned()
    }
}
