//! What every request shares for the life of the process: the pooled upstream client, the metrics, the limits and the per-key limiter.

use std::sync::Arc;

use crate::config::{Config, Limits};
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::upstream::UpstreamClient;

/// Process-wide services, handed to whatever talks to an upstream (the LLM path and video).
pub struct Services {
    pub client: UpstreamClient,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Per-key limits; its counters outlive reloads, so a key that stays keeps its count.
    pub limiter: Arc<Limiter>,
    /// The video listener's bound address (the config may say port 0), set once it is bound.
    pub video_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

impl Services {
    pub fn new(config: &Config) -> Self {
        let metrics = Arc::new(Metrics::new());
        Self {
            client: UpstreamClient::new(&config.limits),
            limiter: Arc::new(Limiter::new(&config.store, &metrics)),
            metrics,
            limits: config.limits,
            video_addr: std::sync::OnceLock::new(),
        }
    }
}
