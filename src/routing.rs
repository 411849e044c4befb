//! What a config reload replaces, in one piece: keys, models with their targets' runtime state, and the video upstreams; swapped atomically, read once per request.

use std::sync::Arc;

use crate::attempt::Runtime;
use crate::auth::KeyStore;
use crate::config::Config;
use crate::route::ModelTable;
use crate::video::VideoService;

/// The routing state of one loaded config. A request holds its `Arc` from start to end, so a
/// reload never changes what a running request or stream sees.
pub struct Routing {
    pub keys: KeyStore,
    pub models: ModelTable,
    pub video: VideoService,
    /// Targets' health, load and latency, and each model's retry budget.
    pub runtime: Arc<Runtime>,
}

impl Routing {
    /// Builds the state for `config`; targets and models that `previous` also had keep their
    /// health, load and budget, so a reload does not send traffic back to an ejected target.
    /// `process_secret` signs video ids when the config names no secret.
    pub fn new(config: &Config, previous: Option<&Routing>, process_secret: &[u8; 32]) -> Self {
        Self {
            keys: KeyStore::new(&config.keys),
            models: ModelTable::new(&config.models),
            video: VideoService::new(config, process_secret),
            runtime: Arc::new(Runtime::new(config, previous.map(|p| p.runtime.as_ref()))),
        }
    }
}
