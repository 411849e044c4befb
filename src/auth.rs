//! Client authentication: a presented key → the principal it belongs to, looked up by SHA-256 digest.

use std::collections::HashMap;
use std::sync::Arc;

use http::{header, HeaderMap};
use sha2::{Digest, Sha256};

use crate::config::{Address, AddressSet, Key, KeyLimits};
use crate::error::{ErrorKind, GatewayError};
use crate::route::NamePattern;

/// Who is calling: the key's name (for logs and task ownership, never the key) and what it may use.
#[derive(Debug)]
pub struct Principal {
    pub name: String,
    pub addresses: AddressSet,
    pub models: Vec<NamePattern>,
    pub limits: KeyLimits,
}

impl Principal {
    pub fn may_use_model(&self, name: &str) -> bool {
        self.models.iter().any(|p| p.matches(name))
    }

    /// A model outside the key's list is answered as if it did not exist (gateway.md §14).
    pub fn check_model(&self, name: &str, address: Address) -> Result<(), GatewayError> {
        if self.may_use_model(name) {
            Ok(())
        } else {
            Err(crate::route::unknown_model(name, address))
        }
    }
}

/// Keys by digest; the file never needs to hold a usable key.
#[derive(Debug, Default)]
pub struct KeyStore {
    by_digest: HashMap<[u8; 32], Arc<Principal>>,
}

impl KeyStore {
    pub fn new(keys: &[Key]) -> Self {
        let by_digest = keys
            .iter()
            .map(|k| {
                (
                    k.digest,
                    Arc::new(Principal {
                        name: k.name.clone(),
                        addresses: k.addresses,
                        models: k.models.clone(),
                        limits: k.limits,
                    }),
                )
            })
            .collect();
        Self { by_digest }
    }

    /// Authenticates a request on `address`; `allow_x_api_key` is true on `/v1/messages`.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        address: Address,
        allow_x_api_key: bool,
    ) -> Result<Arc<Principal>, GatewayError> {
        // An empty bearer is no key at all: fall back to `x-api-key` where it is allowed.
        let presented = bearer(headers).filter(|k| !k.is_empty()).or_else(|| {
            allow_x_api_key
                .then(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
                .flatten()
        });
        let Some(key) = presented.filter(|k| !k.is_empty()) else {
            let how = if allow_x_api_key {
                "send it as `Authorization: Bearer <key>` or `x-api-key: <key>`"
            } else {
                "send it as `Authorization: Bearer <key>`"
            };
            return Err(GatewayError::new(
                ErrorKind::Unauthorized,
                format!("missing API key; {how}"),
            ));
        };
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let principal = self
            .by_digest
            .get(&digest)
            .ok_or_else(|| GatewayError::new(ErrorKind::Unauthorized, "invalid API key"))?;
        if !principal.addresses.contains(address) {
            return Err(GatewayError::new(
                ErrorKind::Forbidden,
                format!(
                    "this API key may not be used on the {} address",
                    address.name()
                ),
            ));
        }
        Ok(principal.clone())
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// `modelgate hash-key`: the SHA-256 hex digest of a key.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}
