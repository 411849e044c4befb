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
    by_digest: HashMap<[u8; 32], Arc<Principal>, DigestHash>,
}

/// Hashes a SHA-256 digest by its first eight bytes: they are already uniformly spread, and the
/// map's entries come from the config, never from clients, so SipHash's flooding defence buys
/// nothing here and costs every request.
#[derive(Debug, Default, Clone, Copy)]
struct DigestHash;

impl std::hash::BuildHasher for DigestHash {
    type Hasher = DigestHasher;

    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(0)
    }
}

#[derive(Debug)]
struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // An array hashes as its bytes in one write; take the first eight of them.
        let mut first = [0u8; 8];
        let n = bytes.len().min(8);
        first[..n].copy_from_slice(&bytes[..n]);
        self.0 ^= u64::from_le_bytes(first);
    }
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
            .collect::<HashMap<_, _, DigestHash>>();
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
        // ring's SHA-256 (assembly, the CPU's SHA extensions where it has them): the same digest
        // as `sha2`'s at about 60% of its instructions where those extensions are absent.
        let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
        let principal = self
            .by_digest
            .get(digest.as_ref())
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
