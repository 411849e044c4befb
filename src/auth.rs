//! Client authentication: a presented key → the principal it belongs to, looked up by SHA-256 digest.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

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

/// The last key presented on one client connection and its digest. A client sends the same key
/// with every request of a keep-alive connection, and hashing it was about 5% of a JSON
/// request's instructions. The key is compared in constant time: one connection may carry
/// several clients' requests (a proxy's pool). It lives as long as the connection, in memory
/// only, as the request heads that carried it do. Behind it, each thread remembers the last
/// few keys that authenticated on it ([`RECENT_KEYS`]), so that a client's new connection is
/// not hashed again either.
#[derive(Default)]
pub struct KeyMemo(Mutex<Option<Remembered>>);

/// How many keys each thread remembers beyond its connections' own: the clients of one event
/// loop that open connections afresh (an SDK's pool, a load client) present few keys. A key
/// found here costs a few compares; one not found, SHA-256 (about 2.4 k instructions and 90
/// distinct code lines: several µs of a new connection at a low rate, when they are cold).
const RECENT_KEYS: usize = 8;

thread_local! {
    /// Keys that authenticated on this thread lately, the latest first. Only keys the store
    /// knew are kept, so that clients presenting wrong keys cannot push the good ones out; a
    /// key a reload removed is still refused, by the store, which only ever sees its digest.
    static RECENT: RefCell<Vec<Remembered>> = const { RefCell::new(Vec::new()) };
}

struct Remembered {
    key: Box<[u8]>,
    digest: [u8; 32],
}

impl KeyMemo {
    /// `key`'s SHA-256 digest, remembered from the connection's last request when it presented
    /// the same key, or from the thread's recent keys; `false` when it had to be made.
    fn digest(&self, key: &[u8]) -> ([u8; 32], bool) {
        // A poisoned lock only loses the memo: the digest is made again.
        if let Ok(last) = self.0.lock() {
            if let Some(r) = last.as_ref() {
                if same_key(&r.key, key) {
                    return (r.digest, true);
                }
            }
        }
        let recent = RECENT.with_borrow(|recent| {
            recent
                .iter()
                .find(|r| same_key(&r.key, key))
                .map(|r| r.digest)
        });
        if let Some(digest) = recent {
            return (digest, true);
        }
        // ring's SHA-256 (assembly, the CPU's SHA extensions where it has them): the same digest
        // as `sha2`'s at about 60% of its instructions where those extensions are absent.
        let mut digest = [0u8; 32];
        digest.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, key).as_ref());
        if let Ok(mut last) = self.0.lock() {
            *last = Some(Remembered {
                key: key.into(),
                digest,
            });
        }
        (digest, false)
    }
}

/// Puts a key that authenticated first among the thread's recent keys.
fn remember(key: &[u8], digest: [u8; 32]) {
    RECENT.with_borrow_mut(|recent| {
        recent.truncate(RECENT_KEYS - 1);
        recent.insert(
            0,
            Remembered {
                key: key.into(),
                digest,
            },
        );
    });
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
    /// `seen` is the connection's memo of its last key.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        address: Address,
        allow_x_api_key: bool,
        seen: &KeyMemo,
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
        let (digest, remembered) = seen.digest(key.as_bytes());
        let principal = self
            .by_digest
            .get(&digest)
            .ok_or_else(|| GatewayError::new(ErrorKind::Unauthorized, "invalid API key"))?;
        if !remembered {
            remember(key.as_bytes(), digest);
        }
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

/// True when `a` and `b` are the same bytes, in a time that depends only on their lengths:
/// compared eight bytes at a time by `subtle`, since its byte-by-byte comparison of a slice
/// was 0.8% of a JSON request's instructions.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    fn word(bytes: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        let n = bytes.len().min(8);
        w[..n].copy_from_slice(&bytes[..n]);
        u64::from_le_bytes(w)
    }
    let (a_words, b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let mut same = word(a_words.remainder()).ct_eq(&word(b_words.remainder()));
    for (x, y) in a_words.zip(b_words) {
        same &= word(x).ct_eq(&word(y));
    }
    bool::from(same)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    fn key(name: &str, secret: &str) -> Key {
        Key {
            name: name.to_owned(),
            digest: Sha256::digest(secret.as_bytes()).into(),
            plaintext: None,
            addresses: AddressSet::all_client(),
            models: Vec::new(),
            limits: KeyLimits::default(),
        }
    }

    fn headers(secret: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {secret}").parse().unwrap(),
        );
        h
    }

    /// Who `secret` authenticates as on the connection whose memo is `seen`.
    fn who(store: &KeyStore, secret: &str, seen: &KeyMemo) -> Option<String> {
        store
            .authenticate(&headers(secret), Address::Base, false, seen)
            .ok()
            .map(|p| p.name.clone())
    }

    /// Every length around the word size, and a difference in every position.
    #[test]
    fn keys_compare_as_their_bytes() {
        let base: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for len in 0..base.len() {
            let a = &base[..len];
            assert!(same_key(a, a), "{len}");
            assert!(!same_key(a, &base[..len + 1]), "{len}");
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 0x80;
                assert!(!same_key(a, &b), "{len} {at}");
                b[at] ^= 0x81;
                assert!(!same_key(a, &b), "{len} {at}");
            }
        }
    }

    /// The memo never answers for another key than the one it remembers, nor lets a key the
    /// store no longer holds (a reload removed it) through.
    #[test]
    fn a_connection_remembers_only_its_last_key_and_the_store_decides() {
        let store = KeyStore::new(&[key("a", "sk-aaaa"), key("b", "sk-bbbb")]);
        let seen = KeyMemo::default();
        for (secret, want) in [
            ("sk-aaaa", Some("a")),
            ("sk-aaaa", Some("a")),
            ("sk-bbbb", Some("b")),
            ("sk-aaa", None),
            ("sk-aaaa", Some("a")),
            ("sk-aaaaa", None),
            ("sk-aaab", None),
            ("sk-bbbb", Some("b")),
        ] {
            assert_eq!(who(&store, secret, &seen).as_deref(), want, "{secret}");
        }
        // The memo remembers b; after a reload without b, b is refused and a still answers.
        let reloaded = KeyStore::new(&[key("a", "sk-aaaa")]);
        assert_eq!(who(&reloaded, "sk-bbbb", &seen), None);
        assert_eq!(who(&reloaded, "sk-aaaa", &seen).as_deref(), Some("a"));
        // a and b came from the thread's recent keys: the connection still remembers the last
        // key it had to hash itself.
        let remembered = seen.0.lock().unwrap();
        let r = remembered.as_ref().unwrap();
        assert_eq!(&*r.key, b"sk-aaab");
        assert_eq!(r.digest, <[u8; 32]>::from(Sha256::digest(b"sk-aaab")));
    }

    /// A new connection finds the keys that authenticated lately on its thread without hashing
    /// them; wrong keys never enter that memo, and it keeps only the latest `RECENT_KEYS`.
    #[test]
    fn a_thread_remembers_its_latest_good_keys_for_new_connections() {
        let secrets: Vec<String> = (0..=RECENT_KEYS).map(|i| format!("sk-key-{i}")).collect();
        let keys: Vec<Key> = secrets.iter().map(|s| key(s, s)).collect();
        let store = KeyStore::new(&keys);
        let hashed = |secret: &str| !KeyMemo::default().digest(secret.as_bytes()).1;
        assert!(hashed("sk-key-0"));
        assert_eq!(
            who(&store, "sk-key-0", &KeyMemo::default()).as_deref(),
            Some("sk-key-0")
        );
        assert!(!hashed("sk-key-0"), "a good key is remembered");
        let digest = KeyMemo::default().digest(b"sk-key-0").0;
        assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(b"sk-key-0")));
        // Wrong keys, however many, are hashed every time and push no good key out.
        for i in 0..2 * RECENT_KEYS {
            let wrong = format!("sk-wrong-{i}");
            assert_eq!(who(&store, &wrong, &KeyMemo::default()), None);
            assert!(hashed(&wrong), "{wrong}");
        }
        assert!(!hashed("sk-key-0"));
        // A longer or shorter key is another key.
        assert!(hashed("sk-key-"));
        assert!(hashed("sk-key-00"));
        // RECENT_KEYS more good keys push the first out; the latest are all found.
        for s in &secrets[1..] {
            assert_eq!(
                who(&store, s, &KeyMemo::default()).as_deref(),
                Some(s.as_str())
            );
        }
        assert!(hashed("sk-key-0"));
        for s in &secrets[1..] {
            assert!(!hashed(s), "{s}");
        }
    }
}
