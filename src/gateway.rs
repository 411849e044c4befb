//! What every request shares for the life of the process: the pooled upstream client, the metrics and the limits.

use crate::config::{Config, Limits};
use crate::metrics::Metrics;
use crate::upstream::UpstreamClient;

/// Process-wide services, handed to whatever talks to an upstream (the LLM path and video).
pub struct Services {
    pub client: UpstreamClient,
    pub metrics: Metrics,
    pub limits: Limits,
}

impl Services {
    pub fn new(config: &Config) -> Self {
        Self {
            client: UpstreamClient::new(&config.limits),
            metrics: Metrics::default(),
            limits: config.limits,
        }
    }
}
