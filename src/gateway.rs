//! What every request shares for the life of the process: the pooled upstream client, the metrics, the limits, the per-key limiter and the response store.

use std::sync::Arc;

use crate::config::{Config, Limits};
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::stateful::ResponseStore;
use crate::upstream::UpstreamClient;

/// Process-wide services, handed to whatever talks to an upstream (the LLM path and video).
pub struct Services {
    pub client: UpstreamClient,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Per-key limits; its counters outlive reloads, so a key that stays keeps its count.
    pub limiter: Arc<Limiter>,
    /// Stored `/v1/responses` answers (gateway.md §13), beside the limits' counters.
    pub responses: Arc<ResponseStore>,
    /// Drawn from the OS's random source at start; signs video ids when no secret is configured.
    pub process_secret: [u8; 32],
    /// The video listener's bound address (the config may say port 0), set once it is bound.
    pub video_addr: std::sync::OnceLock<std::net::SocketAddr>,
}

impl Services {
    /// Fails only when the OS's random source does: the gateway then refuses to start rather
    /// than sign with a guessable secret (gateway.md §14).
    pub fn new(config: &Config) -> std::io::Result<Self> {
        let mut process_secret = [0u8; 32];
        getrandom::getrandom(&mut process_secret).map_err(|e| {
            std::io::Error::other(format!(
                "the OS random source failed ({e}); refusing to start without secure secrets"
            ))
        })?;
        let metrics = Arc::new(Metrics::new());
        let limiter = Arc::new(Limiter::new(&config.store, &metrics));
        Ok(Self {
            client: UpstreamClient::new(&config.limits, config.server.workers),
            responses: Arc::new(ResponseStore::new(&config.store, limiter.redis())),
            limiter,
            metrics,
            limits: config.limits,
            process_secret,
            video_addr: std::sync::OnceLock::new(),
        })
    }
}
