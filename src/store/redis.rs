//! The Redis (or Valkey) store: the same counters in Redis, one atomic script per admission, so every instance pointed at it enforces one limit.

use super::*;

/// Not built yet: every call fails, so `[store] on_error` decides.
pub struct RedisStore {
    _url: String,
}

impl RedisStore {
    pub fn new(url: &str) -> Self {
        Self {
            _url: url.to_owned(),
        }
    }

    pub async fn admit(
        &self,
        _key: &str,
        _limits: &KeyLimits,
        _slot: &str,
        _now_ms: u64,
    ) -> Result<Verdict, StoreError> {
        Err(StoreError("redis is not supported yet".into()))
    }

    pub async fn charge(&self, _key: &str, _tokens: u64, _now_ms: u64) -> Result<(), StoreError> {
        Err(StoreError("redis is not supported yet".into()))
    }

    pub async fn release(&self, _key: &str, _slot: &str) -> Result<(), StoreError> {
        Err(StoreError("redis is not supported yet".into()))
    }
}
