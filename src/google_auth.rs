//! Google access tokens for Vertex AI and Cloud Storage, found as Google's client libraries find them (a service-account key by the signed-JWT flow, else the metadata server), cached and refreshed one fetch at a time.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::config::Upstream;
use crate::error::{ErrorKind, GatewayError};
use crate::upstream::UpstreamClient;

/// The scope Vertex AI and Cloud Storage accept.
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Where Google's libraries look when nothing else is configured.
pub const DEFAULT_METADATA_ROOT: &str = "http://metadata.google.internal";
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
/// A token is replaced this long before it expires, so no request goes out with one about to lapse.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// Lifetime asked for in the JWT assertion (Google's maximum).
const ASSERTION_LIFETIME_S: u64 = 3600;
/// The longest a token fetch may take: every request of the upstream waits for it.
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

#[derive(Default)]
struct State {
    token: Option<Token>,
    /// The last fetch's failure, shared with the requests that waited for that fetch.
    failure: Option<GatewayError>,
}

/// One upstream's Google credential and its cached token.
pub struct GoogleAuth {
    source: Source,
    /// Held across a fetch: whoever waits for it gets that fetch's result, so one fetch runs at a time.
    state: tokio::sync::Mutex<State>,
    /// Fetches finished so far: a waiter that sees it move knows a fetch ran while it waited.
    fetches: AtomicU64,
    /// The current and the previous token, so upstream error text that quotes one can be scrubbed.
    recent: std::sync::Mutex<Vec<String>>,
}

impl fmt::Debug for GoogleAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GoogleAuth({:?})", self.source)
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
    pub fn new(source: Source) -> Self {
        Self {
            source,
            state: tokio::sync::Mutex::new(State::default()),
            fetches: AtomicU64::new(0),
            recent: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// `text` with every recent token replaced by `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        let recent = self.recent.lock().map(|r| r.clone()).unwrap_or_default();
        let mut out = text.as_bytes().to_vec();
        for t in recent.iter().filter(|t| !t.is_empty()) {
            out = crate::body::redact(&out, t.as_bytes());
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The `Authorization` value to send now: the cached token, or a fresh one.
    pub async fn authorization(
        &self,
        client: &UpstreamClient,
        upstream: &Upstream,
    ) -> Result<HeaderValue, GatewayError> {
        let seen = self.fetches.load(Ordering::Acquire);
        let mut state = self.state.lock().await;
        let now = Instant::now();
        if let Some(t) = state.token.as_ref().filter(|t| now < t.refresh_at) {
            return Ok(t.header.clone());
        }
        if self.fetches.load(Ordering::Acquire) != seen {
            // A fetch ran while this request waited: its result is this request's too (a token
            // short of the margin still works; a failure is shared, not repeated per waiter).
            // The next request to come starts a new fetch.
            if let Some(t) = state.token.as_ref().filter(|t| now < t.expires_at) {
                return Ok(t.header.clone());
            }
            if let Some(e) = &state.failure {
                return Err(e.clone());
            }
        }
        let result = match tokio::time::timeout(FETCH_TIMEOUT, self.fetch(client, upstream)).await {
            Ok(r) => r,
            Err(_) => Err(failure(
                upstream,
                format!("no token within {} s", FETCH_TIMEOUT.as_secs()),
            )),
        };
        self.fetches.fetch_add(1, Ordering::Release);
        match result {
            Ok(token) => {
                let header = token.header.clone();
                state.token = Some(token);
                state.failure = None;
                Ok(header)
            }
            Err(e) => {
                state.failure = Some(e.clone());
                // A token that has not yet expired still works while the refresh is retried.
                match state.token.as_ref().filter(|t| now < t.expires_at) {
                    Some(t) => {
                        tracing::warn!(upstream = %upstream.name, error = %e, "refreshing the Google access token failed; the current one is used until it expires");
                        Ok(t.header.clone())
                    }
                    None => Err(e),
                }
            }
        }
    }

    async fn fetch(
        &self,
        client: &UpstreamClient,
        upstream: &Upstream,
    ) -> Result<Token, GatewayError> {
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
            .send(upstream, req)
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
        tracing::info!(upstream = %upstream.name, expires_in_s = lifetime.as_secs(), "fetched a Google access token");
        Ok(Token {
            header,
            refresh_at: now + lifetime.saturating_sub(REFRESH_MARGIN),
            expires_at: now + lifetime,
        })
    }
}

fn failure(upstream: &Upstream, cause: String) -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamAuthFailed,
        format!(
            "could not get an access token for upstream {:?}: {cause}",
            upstream.name
        ),
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
