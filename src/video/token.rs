//! Stateless task ids and download ids: a compact binary payload, HMAC-SHA256 signed, sent as URL-safe base64 without padding.
//!
//! A task id carries what a lookup needs to find the task again (creation time, upstream name,
//! upstream model, the upstream's task reference); the key name of its creator is bound into the
//! MAC but not sent, so the id is shorter, does not name the key, and verifies only when the
//! creator presents it. A download id carries its expiry and where the bytes come from.
//! Any failure to verify is one `None`: forged, truncated, altered and foreign ids look the same.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the HMAC-SHA256 tag kept: 128 bits leave forgery at 2^-128 and save 22 characters.
const TAG_LEN: usize = 16;
/// Version 1 ids (no client model, no key in file ids) still verify; version 2 is signed.
const VERSION_1: u8 = 1;
const VERSION: u8 = 2;
/// Domain separation, so a task id is never accepted as a download id or the other way round.
const TASK_DOMAIN: &[u8] = b"modelgate/task/1\0";
const FILE_DOMAIN: &[u8] = b"modelgate/file/1\0";

/// How a task id spells the client's model name: the upstream model's, the interface's
/// `video-` for Veo's `veo-`, or spelled out. The first two cost one byte.
const CLIENT_SAME: u8 = 0;
const CLIENT_VIDEO_FOR_VEO: u8 = 1;
const CLIENT_SPELLED: u8 = 2;

/// Reference encodings: spelled out, or the text after a prefix both sides can recompute.
const REF_FULL: u8 = 0;
const REF_AFTER_PREFIX: u8 = 1;

/// What a task id says about its task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskToken {
    /// Milliseconds since the Unix epoch when the gateway accepted the task.
    pub created_ms: u64,
    pub upstream: String,
    /// The model name as the upstream knows it.
    pub model: String,
    /// The model name the client sent (for the access log); `None` in a version 1 id.
    pub client_model: Option<String>,
    /// The upstream's own handle: an operation name, a task id, the mock's instructions.
    pub reference: String,
}

/// Where a download's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// The built-in mock's fixture.
    Mock,
    /// A Cloud Storage object, read with the upstream's bearer token.
    Gcs {
        upstream: String,
        bucket: String,
        object: String,
    },
    /// An HTTP(S) address that needs the upstream's credential (a Gemini file URI).
    Remote { upstream: String, uri: String },
    /// Base64 bytes inside the upstream's operation: the operation is fetched again and decoded as it streams.
    Inline {
        upstream: String,
        model: String,
        reference: String,
        mime: String,
    },
}

/// What a download id says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileToken {
    /// Seconds since the Unix epoch after which the id is refused.
    pub expires_s: u64,
    /// The key that looked the task up and the model the client named, for the access log of
    /// the download (which carries no key); empty in a version 1 id.
    pub key: String,
    pub model: String,
    pub source: FileSource,
}

/// Signs with the first secret and verifies with any, so secrets rotate without breaking live ids.
pub struct Signer {
    secrets: Vec<Vec<u8>>,
}

impl Signer {
    /// `secrets` from `[video] task_secrets_env`; none configured means `process_secret`, the
    /// random secret this process drew at start (so ids survive reloads, not restarts).
    pub fn new(secrets: &[Vec<u8>], process_secret: &[u8; 32]) -> Self {
        let mut secrets: Vec<Vec<u8>> = secrets.iter().filter(|s| !s.is_empty()).cloned().collect();
        if secrets.is_empty() {
            secrets.push(process_secret.to_vec());
        }
        Self { secrets }
    }

    /// A task id for `task`, bound to the key named `key_name`; `prefix` shortens the reference when it starts with it.
    pub fn sign_task(&self, key_name: &str, task: &TaskToken, prefix: Option<&str>) -> String {
        let mut w = Writer::default();
        w.byte(VERSION);
        w.uint(task.created_ms);
        w.str(&task.upstream);
        w.str(&task.model);
        match task.client_model.as_deref() {
            None => w.byte(CLIENT_SAME),
            Some(c) if c == task.model => w.byte(CLIENT_SAME),
            Some(c)
                if task
                    .model
                    .strip_prefix("veo-")
                    .is_some_and(|rest| c.strip_prefix("video-") == Some(rest)) =>
            {
                w.byte(CLIENT_VIDEO_FOR_VEO);
            }
            Some(c) => {
                w.byte(CLIENT_SPELLED);
                w.str(c);
            }
        }
        w.reference(&task.reference, prefix);
        self.seal(TASK_DOMAIN, key_name.as_bytes(), w.0)
    }

    /// The task behind `id` when it was signed by one of our secrets for `key_name`.
    ///
    /// `prefix_of(upstream, model)` must give the same prefix `sign_task` was given.
    pub fn verify_task(
        &self,
        key_name: &str,
        id: &str,
        prefix_of: impl Fn(&str, &str) -> Option<String>,
    ) -> Option<TaskToken> {
        let payload = self.open(TASK_DOMAIN, key_name.as_bytes(), id)?;
        let mut r = Reader::new(&payload);
        let version = r.byte()?;
        if version != VERSION && version != VERSION_1 {
            return None;
        }
        let created_ms = r.uint()?;
        let upstream = r.str()?.to_owned();
        let model = r.str()?.to_owned();
        let client_model = if version == VERSION_1 {
            None
        } else {
            Some(match r.byte()? {
                CLIENT_SAME => model.clone(),
                CLIENT_VIDEO_FOR_VEO => format!("video-{}", model.strip_prefix("veo-")?),
                CLIENT_SPELLED => r.str()?.to_owned(),
                _ => return None,
            })
        };
        let reference = r.reference(prefix_of(&upstream, &model).as_deref())?;
        Some(TaskToken {
            created_ms,
            upstream,
            model,
            client_model,
            reference,
        })
    }

    /// A download id; not bound to a key, since downloads carry no `Authorization` header.
    pub fn sign_file(&self, file: &FileToken, prefix: Option<&str>) -> String {
        let mut w = Writer::default();
        w.byte(VERSION);
        w.uint(file.expires_s);
        w.str(&file.key);
        w.str(&file.model);
        match &file.source {
            FileSource::Mock => w.byte(0),
            FileSource::Gcs {
                upstream,
                bucket,
                object,
            } => {
                w.byte(1);
                w.str(upstream);
                w.str(bucket);
                w.str(object);
            }
            FileSource::Remote { upstream, uri } => {
                w.byte(2);
                w.str(upstream);
                w.str(uri);
            }
            FileSource::Inline {
                upstream,
                model,
                reference,
                mime,
            } => {
                w.byte(3);
                w.str(upstream);
                w.str(model);
                w.str(mime);
                w.reference(reference, prefix);
            }
        }
        self.seal(FILE_DOMAIN, b"", w.0)
    }

    /// The download behind `id`, expired or not (the caller decides what an expired id means).
    pub fn verify_file(
        &self,
        id: &str,
        prefix_of: impl Fn(&str, &str) -> Option<String>,
    ) -> Option<FileToken> {
        let payload = self.open(FILE_DOMAIN, b"", id)?;
        let mut r = Reader::new(&payload);
        let version = r.byte()?;
        if version != VERSION && version != VERSION_1 {
            return None;
        }
        let expires_s = r.uint()?;
        let (key, model) = if version == VERSION_1 {
            (String::new(), String::new())
        } else {
            (r.str()?.to_owned(), r.str()?.to_owned())
        };
        let source = match r.byte()? {
            0 => FileSource::Mock,
            1 => FileSource::Gcs {
                upstream: r.str()?.to_owned(),
                bucket: r.str()?.to_owned(),
                object: r.str()?.to_owned(),
            },
            2 => FileSource::Remote {
                upstream: r.str()?.to_owned(),
                uri: r.str()?.to_owned(),
            },
            3 => {
                let upstream = r.str()?.to_owned();
                let model = r.str()?.to_owned();
                let mime = r.str()?.to_owned();
                let reference = r.reference(prefix_of(&upstream, &model).as_deref())?;
                FileSource::Inline {
                    upstream,
                    model,
                    reference,
                    mime,
                }
            }
            _ => return None,
        };
        r.end()?;
        Some(FileToken {
            expires_s,
            key,
            model,
            source,
        })
    }

    fn mac(secret: &[u8], domain: &[u8], bound: &[u8], payload: &[u8]) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(secret).ok()?;
        mac.update(domain);
        // The bound value's length goes first so ("ab","c…") and ("a","bc…") never collide.
        mac.update(&(bound.len() as u64).to_be_bytes());
        mac.update(bound);
        mac.update(payload);
        Some(mac)
    }

    fn seal(&self, domain: &[u8], bound: &[u8], mut payload: Vec<u8>) -> String {
        let secret = self.secrets.first().map_or(&[][..], Vec::as_slice);
        if let Some(mac) = Self::mac(secret, domain, bound, &payload) {
            let tag = mac.finalize().into_bytes();
            payload.extend_from_slice(&tag[..TAG_LEN]);
        }
        URL_SAFE_NO_PAD.encode(payload)
    }

    fn open(&self, domain: &[u8], bound: &[u8], text: &str) -> Option<Vec<u8>> {
        // A 2 KB id is far beyond any real one; refusing early keeps probing cheap.
        if text.is_empty() || text.len() > 2048 {
            return None;
        }
        let mut raw = URL_SAFE_NO_PAD.decode(text).ok()?;
        let split = raw.len().checked_sub(TAG_LEN)?;
        let (payload, tag) = raw.split_at(split);
        let ok = self.secrets.iter().any(|secret| {
            Self::mac(secret, domain, bound, payload)
                // Constant-time comparison of the truncated tag.
                .is_some_and(|mac| mac.verify_truncated_left(tag).is_ok())
        });
        if !ok {
            return None;
        }
        raw.truncate(split);
        Some(raw)
    }
}

/// Builds a payload: LEB128 integers and length-prefixed strings.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn byte(&mut self, b: u8) {
        self.0.push(b);
    }

    fn uint(&mut self, mut v: u64) {
        loop {
            let low = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(low);
                return;
            }
            self.0.push(low | 0x80);
        }
    }

    fn str(&mut self, s: &str) {
        self.uint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    fn reference(&mut self, reference: &str, prefix: Option<&str>) {
        match prefix.and_then(|p| reference.strip_prefix(p)) {
            Some(rest) => {
                self.byte(REF_AFTER_PREFIX);
                self.str(rest);
            }
            None => {
                self.byte(REF_FULL);
                self.str(reference);
            }
        }
    }
}

/// Reads a payload; every step fails softly on short or malformed input.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn uint(&mut self) -> Option<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.uint()?).ok()?;
        let end = self.pos.checked_add(len)?;
        let bytes = self.buf.get(self.pos..end)?;
        self.pos = end;
        std::str::from_utf8(bytes).ok()
    }

    /// The last field of a task payload; nothing may follow it.
    fn reference(&mut self, prefix: Option<&str>) -> Option<String> {
        let tag = self.byte()?;
        let text = self.str()?;
        self.end()?;
        match tag {
            REF_FULL => Some(text.to_owned()),
            REF_AFTER_PREFIX => Some(format!("{}{text}", prefix?)),
            _ => None,
        }
    }

    fn end(&self) -> Option<()> {
        (self.pos == self.buf.len()).then_some(())
    }
}

#[cfg(test)]
mod tests;
