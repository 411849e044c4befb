//! Google access tokens for Vertex AI and Cloud Storage, found as Google's client libraries find them (a service-account key by the signed-JWT flow, else the metadata server), cached, and refreshed in the background before expiry, one fetch at a time.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::instrument::WithSubscriber as _;

use crate::error::{ErrorKind, GatewayError};
use crate::upstream::UpstreamClient;

/// The scope Vertex AI and Cloud Storage accept.
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Where Google's libraries look when nothing else is configured.
pub const DEFAULT_METADATA_ROOT: &str = "http://metadata.google.internal";
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// A token is refreshed this long before it expires: Google's client libraries' figure, and the
/// metadata server hands out the same cached token until about 4 min before its expiry, so an
/// earlier refresh would only get the same token again.
const REFRESH_MARGIN: Duration = Duration::from_secs(225);
/// After a failed background refresh, the next is not tried before this (doubling each time, up to
/// [`MAX_BACKOFF`]): the token still works, and a token endpoint in trouble is not hammered.
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Lifetime asked for in the JWT assertion (Google's maximum).
const ASSERTION_LIFETIME_S: u64 = 3600;
/// The longest a token fetch may take: without a valid token, every request of the upstream waits for it.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// A token answer is a few hundred bytes; anything much larger is not one.
const ANSWER_LIMIT: usize = 64 * 1024;

/// Where the tokens come from.
pub enum Source {
    /// A service-account key file: an RS256 JWT assertion exchanged at `token_uri`.
    ServiceAccount {
        email: String,
        key_id: Option<String>,
        key: EncodingKey,
        token_uri: Uri,
    },
    /// The metadata server of the machine (GKE workload identity, Cloud Run, GCE).
    Metadata { token_url: Uri },
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ServiceAccount {
                email, token_uri, ..
            } => write!(f, "ServiceAccount({email} at {token_uri})"),
            Self::Metadata { token_url } => write!(f, "Metadata({token_url})"),
        }
    }
}

#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

impl Source {
    /// Reads a service-account JSON key file as the Cloud console downloads it.
    pub fn from_key_file(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: KeyFile = serde_json::from_slice(&text)
            .map_err(|e| format!("{} is not a JSON key file: {e}", path.display()))?;
        if let Some(kind) = file.kind.as_deref().filter(|k| *k != "service_account") {
            return Err(format!(
                "{} holds credentials of type {kind:?}; only \"service_account\" keys are supported",
                path.display()
            ));
        }
        let missing = |field: &str| format!("{} has no {field}", path.display());
        let email = file.client_email.ok_or_else(|| missing("client_email"))?;
        let pem = file.private_key.ok_or_else(|| missing("private_key"))?;
        // The key's own error text never quotes the key; the path says which file.
        let key = EncodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| {
            format!(
                "{}: private_key is not a usable RSA key: {e}",
                path.display()
            )
        })?;
        let token_uri_text = file
            .token_uri
            .unwrap_or_else(|| "https://oauth2.googleapis.com/token".to_owned());
        let token_uri =
            http_url(&token_uri_text).map_err(|e| format!("{}: token_uri {e}", path.display()))?;
        Ok(Self::ServiceAccount {
            email,
            key_id: file.private_key_id,
            key,
            token_uri,
        })
    }

    /// The metadata server at `root` (`http://host[:port]`).
    pub fn metadata(root: &str) -> Result<Self, String> {
        let token_url = http_url(&format!(
            "{}{METADATA_TOKEN_PATH}",
            root.trim_end_matches('/')
        ))?;
        Ok(Self::Metadata { token_url })
    }
}

fn http_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(format!("{text:?} must be an http:// or https:// URL")),
    }
}

struct Token {
    /// `Bearer …`, marked sensitive so it is never printed by `http`'s Debug.
    header: HeaderValue,
    refresh_at: Instant,
    expires_at: Instant,
}

/// What a fetch hands to the requests waiting for it: the new `Authorization` value, or why there is none.
type Fetched = Option<Result<HeaderValue, GatewayError>>;

#[derive(Default)]
struct State {
    token: Option<Token>,
    /// The fetch under way: whoever needs its result subscribes, so one fetch runs at a time.
    fetching: Option<watch::Receiver<Fetched>>,
    /// After a failed refresh, no background refresh is started before this.
    quiet_until: Option<Instant>,
    /// The pause after the last failed refresh; zero once one succeeds.
    backoff: Duration,
}

impl State {
    /// The fetch under way, unless its task ended without an answer (a runtime shutting down).
    fn live_fetch(&self) -> Option<&watch::Receiver<Fetched>> {
        self.fetching
            .as_ref()
            .filter(|rx| rx.has_changed().is_ok() || rx.borrow().is_some())
    }
}

/// One upstream's Google credential and its cached token.
///
/// A token still valid is always served at once: past its refresh time the first request starts
/// one refresh in the background and nobody waits for it. Only without a valid token do requests
/// wait, all for the same fetch.
pub struct GoogleAuth {
    /// Shared with the background refresh, which outlives the request that started it.
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    /// The upstream's name, for errors and logs.
    upstream: String,
    /// Held only to read or update, never across a fetch.
    state: std::sync::Mutex<State>,
    /// The current and the previous token, so upstream error text that quotes one can be scrubbed.
    recent: std::sync::Mutex<Vec<String>>,
}

impl fmt::Debug for GoogleAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GoogleAuth({:?})", self.inner.source)
    }
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: String,
    iat: u64,
    exp: u64,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: Option<u64>,
}

impl GoogleAuth {
    /// The credential of the upstream named `upstream`.
    pub fn new(source: Source, upstream: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                upstream: upstream.to_owned(),
                state: std::sync::Mutex::new(State::default()),
                recent: std::sync::Mutex::new(Vec::new()),
            }),
        }
    }

    /// `text` with every recent token replaced by `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        let recent = self
            .inner
            .recent
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default();
        let mut out = text.as_bytes().to_vec();
        for t in recent.iter().filter(|t| !t.is_empty()) {
            out = crate::body::redact(&out, t.as_bytes());
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn source(&self) -> &Source {
        &self.inner.source
    }

    /// The `Authorization` value to send now: the cached token while it is valid (a refresh
    /// started behind it when due), else the result of the one fetch under way.
    pub async fn authorization(
        &self,
        client: &UpstreamClient,
    ) -> Result<HeaderValue, GatewayError> {
        let mut fetch = {
            let mut state = self.inner.lock();
            let now = Instant::now();
            if let Some(t) = state.token.as_ref().filter(|t| now < t.expires_at) {
                let header = t.header.clone();
                let due = now >= t.refresh_at
                    && state.live_fetch().is_none()
                    && state.quiet_until.is_none_or(|q| now >= q);
                if due {
                    state.fetching = Some(self.start(client));
                }
                return Ok(header);
            }
            match state.live_fetch() {
                Some(rx) => rx.clone(),
                None => {
                    let rx = self.start(client);
                    state.fetching = Some(rx.clone());
                    rx
                }
            }
        };
        let fetched = fetch
            .wait_for(Option::is_some)
            .await
            .map(|v| v.clone())
            .ok()
            .flatten();
        fetched.unwrap_or_else(|| {
            Err(failure(
                &self.inner.upstream,
                "the token fetch ended without an answer".to_owned(),
            ))
        })
    }

    /// Forgets the cached token if it is `sent`, which an upstream has just refused (401): the
    /// next request fetches a new one instead of sending the refused one until it expires.
    ///
    /// Compared, not just dropped: a request that went out with an older token must not throw
    /// away the newer one.
    pub fn reject(&self, sent: &HeaderValue) {
        let mut state = self.inner.lock();
        if state.token.as_ref().is_some_and(|t| t.header == *sent) {
            state.token = None;
            state.quiet_until = None;
            tracing::warn!(upstream = %self.inner.upstream, "an upstream refused the cached Google access token; the next request fetches a new one");
        }
    }

    /// Starts one fetch in its own task; its result goes to the cache and to every subscriber.
    fn start(&self, client: &UpstreamClient) -> watch::Receiver<Fetched> {
        let (tx, rx) = watch::channel(None);
        let inner = self.inner.clone();
        let client = client.clone();
        let task = async move {
            let result = inner.refresh(&client).await;
            // Nobody may be waiting (a background refresh): the cache already has the result.
            let _ = tx.send(Some(result));
        };
        #[expect(
            clippy::disallowed_methods,
            reason = "one token fetch at a time, bounded by FETCH_TIMEOUT; it must outlive the request that started it, whose client may leave while others wait for the token"
        )]
        tokio::spawn(task.with_current_subscriber());
        rx
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while the lock is held; a poisoned lock still holds a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One fetch, its result kept in the cache.
    async fn refresh(&self, client: &UpstreamClient) -> Result<HeaderValue, GatewayError> {
        let result = match tokio::time::timeout(FETCH_TIMEOUT, self.fetch(client)).await {
            Ok(r) => r,
            Err(_) => Err(failure(
                &self.upstream,
                format!("no token within {} s", FETCH_TIMEOUT.as_secs()),
            )),
        };
        let mut state = self.lock();
        state.fetching = None;
        let now = Instant::now();
        match result {
            Ok(token) => {
                let header = token.header.clone();
                state.token = Some(token);
                state.quiet_until = None;
                state.backoff = Duration::ZERO;
                Ok(header)
            }
            Err(e) => {
                let backoff = if state.backoff.is_zero() {
                    FIRST_BACKOFF
                } else {
                    (state.backoff * 2).min(MAX_BACKOFF)
                };
                state.backoff = backoff;
                state.quiet_until = Some(now + backoff);
                if state.token.as_ref().is_some_and(|t| now < t.expires_at) {
                    tracing::warn!(upstream = %self.upstream, error = %e, retry_in_s = backoff.as_secs(), "refreshing the Google access token failed; the current one is used until it expires");
                }
                Err(e)
            }
        }
    }

    async fn fetch(&self, client: &UpstreamClient) -> Result<Token, GatewayError> {
        let upstream = self.upstream.as_str();
        let (req, from) = match &self.source {
            Source::ServiceAccount {
                email,
                key_id,
                key,
                token_uri,
            } => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let claims = Claims {
                    iss: email,
                    scope: SCOPE,
                    aud: token_uri.to_string(),
                    iat: now,
                    exp: now + ASSERTION_LIFETIME_S,
                };
                let mut head = Header::new(Algorithm::RS256);
                head.kid = key_id.clone();
                let assertion = jsonwebtoken::encode(&head, &claims, key).map_err(|e| {
                    failure(upstream, format!("signing the token request failed: {e}"))
                })?;
                // The assertion is base64url with dots: nothing in it needs form-encoding.
                let body = format!(
                    "grant_type={}&assertion={assertion}",
                    form_encode(JWT_BEARER)
                );
                let req = Request::builder()
                    .method(Method::POST)
                    .uri(token_uri.clone())
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .header(header::ACCEPT, "application/json")
                    .body(Full::new(Bytes::from(body)));
                (req, token_uri)
            }
            Source::Metadata { token_url } => {
                let req = Request::builder()
                    .method(Method::GET)
                    .uri(token_url.clone())
                    .header("metadata-flavor", "Google")
                    .body(Full::new(Bytes::new()));
                (req, token_url)
            }
        };
        let req = req.map_err(|e| failure(upstream, format!("building the token request: {e}")))?;
        let resp = client
            .send_as(upstream, req)
            .await
            .map_err(|e| failure(upstream, format!("{from} did not answer: {e}")))?;
        let (parts, body) = resp.into_parts();
        let bytes = Limited::new(body, ANSWER_LIMIT)
            .collect()
            .await
            .map_err(|e| failure(upstream, format!("reading the answer of {from}: {e}")))?
            .to_bytes();
        if !parts.status.is_success() {
            // OAuth errors name the problem in `error`/`error_description`; they never echo a token.
            return Err(failure(
                upstream,
                format!(
                    "{from} answered {}: {}",
                    parts.status.as_u16(),
                    oauth_detail(&bytes)
                ),
            ));
        }
        let answer: TokenAnswer = serde_json::from_slice(&bytes)
            .map_err(|_| failure(upstream, format!("{from} answered without an access_token")))?;
        if answer.access_token.is_empty() {
            return Err(failure(
                upstream,
                format!("{from} answered an empty access_token"),
            ));
        }
        let mut header =
            HeaderValue::try_from(format!("Bearer {}", answer.access_token)).map_err(|_| {
                failure(
                    upstream,
                    format!("{from} answered an unusable access_token"),
                )
            })?;
        header.set_sensitive(true);
        if let Ok(mut recent) = self.recent.lock() {
            if recent.len() >= 2 {
                recent.remove(0);
            }
            recent.push(answer.access_token);
        }
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(ASSERTION_LIFETIME_S));
        let now = Instant::now();
        tracing::info!(upstream = %upstream, expires_in_s = lifetime.as_secs(), "fetched a Google access token");
        Ok(Token {
            header,
            refresh_at: now + lifetime.saturating_sub(REFRESH_MARGIN),
            expires_at: now + lifetime,
        })
    }
}

fn failure(upstream: &str, cause: String) -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamAuthFailed,
        format!("could not get an access token for upstream {upstream:?}: {cause}"),
    )
}

/// `error` and `error_description` of an OAuth error answer, or a short piece of the text.
fn oauth_detail(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let error = v.get("error").and_then(serde_json::Value::as_str);
        let description = v
            .get("error_description")
            .and_then(serde_json::Value::as_str);
        match (error, description) {
            (Some(e), Some(d)) => return clip(&format!("{e}: {d}")),
            (Some(e), None) | (None, Some(e)) => return clip(e),
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(body);
    if text.trim().is_empty() {
        "(no body)".to_owned()
    } else {
        clip(text.trim())
    }
}

fn clip(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("modelgate-gauth-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key.json");
        std::fs::write(&path, r#"{"type":"authorized_user"}"#).unwrap();
        assert!(Source::from_key_file(&path)
            .unwrap_err()
            .contains("authorized_user"));
        std::fs::write(
            &path,
            r#"{"type":"service_account","client_email":"a@b","private_key":"nope"}"#,
        )
        .unwrap();
        let e = Source::from_key_file(&path).unwrap_err();
        assert!(e.contains("private_key") && !e.contains("nope"), "{e}");
        assert!(Source::from_key_file(&dir.join("absent.json")).is_err());
        assert!(Source::metadata("ftp://x").is_err());
        assert_eq!(
            form_encode(JWT_BEARER),
            "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"
        );
        assert_eq!(
            oauth_detail(
                br#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#
            ),
            "invalid_grant: Invalid JWT Signature."
        );
    }
}
