//! Counters for `/metrics` in Prometheus text format: requests by address and status class, upstream calls, in-flight requests, config reloads.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::config::Address;

#[derive(Debug, Default)]
pub struct Metrics {
    /// `[address][status class 1..=5]`.
    requests: [[AtomicU64; 5]; 4],
    upstream_requests: AtomicU64,
    upstream_failures: AtomicU64,
    in_flight: AtomicI64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
}

impl Metrics {
    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub fn request_finished(&self, address: Address, status: u16) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let class = usize::from((status / 100).clamp(1, 5)) - 1;
        self.requests[address as usize][class].fetch_add(1, Ordering::Relaxed);
    }

    pub fn upstream_call(&self, failed: bool) {
        self.upstream_requests.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.upstream_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn config_reloaded(&self, ok: bool) {
        let c = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::with_capacity(1024);
        out.push_str(
            "# HELP modelgate_requests_total Requests answered, by address and status class.\n",
        );
        out.push_str("# TYPE modelgate_requests_total counter\n");
        for a in [
            Address::Base,
            Address::TokenPlan,
            Address::Video,
            Address::Admin,
        ] {
            for (i, c) in self.requests[a as usize].iter().enumerate() {
                let _ = writeln!(
                    out,
                    "modelgate_requests_total{{address=\"{}\",status=\"{}xx\"}} {}",
                    a.name(),
                    i + 1,
                    c.load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(out, "# TYPE modelgate_upstream_requests_total counter");
        let _ = writeln!(
            out,
            "modelgate_upstream_requests_total {}",
            self.upstream_requests.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# TYPE modelgate_upstream_failures_total counter");
        let _ = writeln!(
            out,
            "modelgate_upstream_failures_total {}",
            self.upstream_failures.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP modelgate_config_reloads_total Config reloads, applied (ok) or refused (error)."
        );
        let _ = writeln!(out, "# TYPE modelgate_config_reloads_total counter");
        for (result, c) in [("ok", &self.reloads_ok), ("error", &self.reloads_failed)] {
            let _ = writeln!(
                out,
                "modelgate_config_reloads_total{{result=\"{result}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(out, "# TYPE modelgate_in_flight_requests gauge");
        let _ = writeln!(
            out,
            "modelgate_in_flight_requests {}",
            self.in_flight.load(Ordering::Relaxed)
        );
        out
    }
}

/// A counter per label value; values come from the config (key or model names), so the set
/// stays bounded whatever clients send.
#[derive(Debug, Default)]
pub struct Counters {
    by_label: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Counters {
    pub fn add(&self, label: &str, n: u64) {
        let mut map = self
            .by_label
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match map.get_mut(label) {
            Some(v) => *v += n,
            None => {
                map.insert(label.to_owned(), n);
            }
        }
    }

    pub fn get(&self, label: &str) -> u64 {
        self.by_label
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(label)
            .copied()
            .unwrap_or(0)
    }

    /// Appends `name{label="…"} n` lines, with HELP and TYPE.
    pub fn render(&self, out: &mut String, name: &str, label: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        let map = self
            .by_label
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (value, n) in map.iter() {
            let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "{name}{{{label}=\"{escaped}\"}} {n}");
        }
    }
}
