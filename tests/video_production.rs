//! Video for production against loopback fakes: Google credentials (key file, metadata server), storageUri and GCS downloads, byte ranges and HEAD, upstream_auth_failed, the access log, and the hostile-input rules for file URLs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;
#[path = "video/harness.rs"]
mod harness;

use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::Bytes;
use common::*;
use harness::{body, create, lookup, Answer, MODEL, VERTEX_OP};
use modelgate::config::Address;
use serde_json::{json, Value};

const PRIVATE_KEY: &str = include_str!("fixtures/video/test-sa-key.pem");
const PUBLIC_KEY: &str = include_str!("fixtures/video/test-sa-pub.pem");
const EMAIL: &str = "veo@test-project.iam.gserviceaccount.com";
const GCS_OBJECT: &str = "/gcs/storage/v1/b/bucket/o/out%2F1%2Fsample_0.mp4";

// --- captured logs -------------------------------------------------------------------------

/// Every log line written on this test's thread (a `#[tokio::test]` runs the gateway there too).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(logs.clone())
            .finish();
        (logs.clone(), tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The access-log lines (their `fields`) whose path starts with `prefix`.
    fn access(&self, prefix: &str) -> Vec<Value> {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"] == "modelgate::access")
            .map(|v| v["fields"].clone())
            .filter(|f| f["path"].as_str().unwrap_or("").starts_with(prefix))
            .collect()
    }
}

// --- a fake Google: token endpoint, metadata server, Vertex, Cloud Storage -----------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ranges {
    /// Cloud Storage honours `Range` (206) and `If-Range` (200 when it does not match).
    Honoured,
    /// The file server honours `Range` but ignores `If-Range`.
    RangeOnly,
    /// The file server ignores `Range` (200 with the whole file and its length).
    Ignored,
}

const GCS_ETAG: &str = "\"CKih16GjycICEAE=\"";
const GCS_LAST_MODIFIED: &str = "Tue, 01 Jul 2025 10:00:00 GMT";

#[derive(Clone)]
struct Google {
    /// Tokens handed out so far, by the token endpoint and the metadata server together.
    fetches: Arc<AtomicUsize>,
    /// `expires_in` of the next token.
    expires_in: Arc<Mutex<u64>>,
    /// An error answer for the token endpoint instead of a token.
    token_error: Arc<Mutex<Option<(u16, Value)>>>,
    /// Pause before a token answer (to make callers overlap).
    token_delay: Arc<Mutex<Duration>>,
    /// While set, token answers wait until it reads `true` (a token endpoint that hangs).
    token_gate: Arc<Mutex<Option<tokio::sync::watch::Receiver<bool>>>>,
    /// A JWT that did not verify, if any (the reason).
    bad_assertion: Arc<Mutex<Option<String>>>,
    operation: Arc<Mutex<Value>>,
    /// A status and body Vertex answers with instead, when set.
    vertex_error: Arc<Mutex<Option<(u16, Value)>>>,
    ranges: Arc<Mutex<Ranges>>,
    /// Whether the file server sends `ETag` and `Last-Modified` (Cloud Storage does).
    validators: Arc<Mutex<bool>>,
    file: Bytes,
}

impl Google {
    fn new() -> Self {
        Self {
            fetches: Arc::default(),
            expires_in: Arc::new(Mutex::new(3600)),
            token_error: Arc::default(),
            token_delay: Arc::default(),
            token_gate: Arc::default(),
            bad_assertion: Arc::default(),
            operation: Arc::new(Mutex::new(json!({"name": VERTEX_OP}))),
            vertex_error: Arc::default(),
            ranges: Arc::new(Mutex::new(Ranges::Honoured)),
            validators: Arc::new(Mutex::new(true)),
            file: Bytes::from((0..50_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
        }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    fn token(&self) -> Reply {
        let n = self.fetches.fetch_add(1, Ordering::SeqCst) + 1;
        let reply = Reply::json(
            200,
            json!({"access_token": format!("ya29.tok-{n}"), "expires_in": *self.expires_in.lock().unwrap(), "token_type": "Bearer"}),
        );
        self.held(reply)
    }

    /// `reply` after the configured delay, and after the gate opens when one is set.
    fn held(&self, reply: Reply) -> Reply {
        let delay = *self.token_delay.lock().unwrap();
        let reply = if delay.is_zero() {
            reply
        } else {
            Reply::After(delay, Box::new(reply))
        };
        match self.token_gate.lock().unwrap().clone() {
            Some(gate) => Reply::Gated(gate, Box::new(reply)),
            None => reply,
        }
    }

    /// Closes the token endpoint: answers wait until the returned sender sends `true`.
    fn close_token_gate(&self) -> tokio::sync::watch::Sender<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        *self.token_gate.lock().unwrap() = Some(rx);
        tx
    }

    /// Checks the signed-JWT grant as Google's token endpoint would.
    fn verify_grant(&self, seen: &Seen, token_uri: &str) -> Result<(), String> {
        if seen.headers["content-type"] != "application/x-www-form-urlencoded" {
            return Err("not a form".into());
        }
        let form = String::from_utf8(seen.body.to_vec()).unwrap();
        let mut grant = None;
        let mut assertion = None;
        for pair in form.split('&') {
            match pair.split_once('=') {
                Some(("grant_type", v)) => grant = Some(v.to_owned()),
                Some(("assertion", v)) => assertion = Some(v.to_owned()),
                _ => return Err(format!("unexpected form field {pair}")),
            }
        }
        if grant.as_deref() != Some("urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer") {
            return Err(format!("grant_type {grant:?}"));
        }
        let assertion = assertion.ok_or("no assertion")?;
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(PUBLIC_KEY.as_bytes()).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        v.set_audience(&[token_uri]);
        v.set_issuer(&[EMAIL]);
        let data =
            jsonwebtoken::decode::<Value>(&assertion, &key, &v).map_err(|e| e.to_string())?;
        if data.header.kid.as_deref() != Some("test-key-id") {
            return Err(format!("kid {:?}", data.header.kid));
        }
        let c = data.claims;
        if c["scope"] != "https://www.googleapis.com/auth/cloud-platform" {
            return Err(format!("scope {}", c["scope"]));
        }
        let (iat, exp) = (c["iat"].as_u64().unwrap(), c["exp"].as_u64().unwrap());
        if exp <= iat || exp - iat > 3600 {
            return Err(format!("lifetime {iat}..{exp}"));
        }
        Ok(())
    }

    async fn start(&self) -> FakeUpstream {
        let g = self.clone();
        let addr_cell: Arc<Mutex<String>> = Arc::default();
        let addr2 = addr_cell.clone();
        let up = FakeUpstream::start(move |seen| {
            let path = seen.uri.split('?').next().unwrap_or("").to_owned();
            match (seen.method.as_str(), path.as_str()) {
                ("POST", "/token") => {
                    if let Some((status, body)) = g.token_error.lock().unwrap().clone() {
                        return g.held(Reply::json(status, body));
                    }
                    let token_uri = format!("{}/token", addr2.lock().unwrap());
                    if let Err(why) = g.verify_grant(seen, &token_uri) {
                        *g.bad_assertion.lock().unwrap() = Some(why);
                        return Reply::json(400, json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}));
                    }
                    g.token()
                }
                ("GET", "/computeMetadata/v1/instance/service-accounts/default/token") => {
                    if seen.headers.get("metadata-flavor").map(|v| v.as_bytes()) != Some(b"Google") {
                        return Reply::json(403, json!({"error": "missing Metadata-Flavor"}));
                    }
                    g.token()
                }
                ("POST", p) if p.starts_with("/v1/projects/") => {
                    if let Some((status, body)) = g.vertex_error.lock().unwrap().clone() {
                        return Reply::json(status, body);
                    }
                    if p.ends_with(":predictLongRunning") {
                        Reply::json(200, json!({"name": VERTEX_OP}))
                    } else {
                        Reply::json(200, g.operation.lock().unwrap().clone())
                    }
                }
                ("GET", GCS_OBJECT) => {
                    if let Some((status, body)) = g.vertex_error.lock().unwrap().clone() {
                        return Reply::json(status, body);
                    }
                    file_reply(
                        &g.file,
                        seen,
                        *g.ranges.lock().unwrap(),
                        *g.validators.lock().unwrap(),
                    )
                }
                _ => Reply::json(404, json!({"error": {"code": 404, "message": format!("no route {path}")}})),
            }
        })
        .await;
        *addr_cell.lock().unwrap() = up.url();
        up
    }
}

/// A file server: with `Honoured`, one `bytes=a-b`/`a-`/`-n` range answers 206 unless an
/// `If-Range` does not match; with `validators`, answers carry `ETag` and `Last-Modified`.
fn file_reply(file: &Bytes, seen: &Seen, ranges: Ranges, validators: bool) -> Reply {
    let len = file.len() as u64;
    let range = seen
        .headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .map(|(a, b)| (a.to_owned(), b.to_owned()));
    let if_range_matches = match seen.headers.get("if-range").map(|v| v.to_str().unwrap()) {
        None => true,
        Some(v) => validators && (v == GCS_ETAG || v == GCS_LAST_MODIFIED),
    };
    let headers = |extra: Vec<(&'static str, String)>| {
        let mut h = vec![("content-type", "video/mp4".to_owned())];
        if validators {
            h.push(("etag", GCS_ETAG.to_owned()));
            h.push(("last-modified", GCS_LAST_MODIFIED.to_owned()));
        }
        h.extend(extra);
        h
    };
    let cut = match ranges {
        Ranges::Honoured => if_range_matches,
        Ranges::RangeOnly => true,
        Ranges::Ignored => false,
    };
    match range.filter(|_| cut) {
        Some((a, b)) => {
            let (first, last) = match (a.parse::<u64>().ok(), b.parse::<u64>().ok()) {
                (Some(a), Some(b)) => (a, b.min(len - 1)),
                (Some(a), None) => (a, len - 1),
                (None, Some(n)) => (len.saturating_sub(n), len - 1),
                (None, None) => panic!("bad range"),
            };
            if first >= len {
                return Reply::Full {
                    status: 416,
                    headers: vec![("content-range", format!("bytes */{len}"))],
                    body: Bytes::new(),
                };
            }
            Reply::Full {
                status: 206,
                headers: headers(vec![(
                    "content-range",
                    format!("bytes {first}-{last}/{len}"),
                )]),
                body: file.slice(first as usize..=last as usize),
            }
        }
        None => Reply::Full {
            status: 200,
            headers: headers(vec![]),
            body: file.clone(),
        },
    }
}

fn key_file(token_uri: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("modelgate-sa-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sa.json");
    let json = json!({"type": "service_account", "project_id": "test-project",
                      "private_key_id": "test-key-id", "private_key": PRIVATE_KEY,
                      "client_email": EMAIL, "client_id": "1", "token_uri": token_uri});
    std::fs::File::create(&path)
        .unwrap()
        .write_all(json.to_string().as_bytes())
        .unwrap();
    path
}

/// A gateway whose `vertex` upstream is configured by `credential` (TOML lines) and `extra_model` lines.
async fn vertex_gateway(
    fake: &str,
    credential: &str,
    model_extra: &str,
    env: &[(&str, &str)],
) -> TestGateway {
    let toml = config(
        fake,
        &format!(
            r#"
[video]
task_secrets_env = "SECRETS"
gcs_api_url = "{{UPSTREAM}}/gcs"
status_cache_ms = 1

[[upstreams]]
name = "vertex"
kind = "veo-vertex"
base_url = "{{UPSTREAM}}/v1/projects/p/locations/us-central1/publishers/google/models"
{credential}

[[models]]
name = "{MODEL}"
upstream = "vertex"
{model_extra}
"#
        ),
    );
    let mut all = vec![("SECRETS", "s1")];
    all.extend_from_slice(env);
    TestGateway::start_with_env(&toml, &all).await
}

fn authorization(up: &FakeUpstream, pred: impl Fn(&str) -> bool) -> Vec<String> {
    up.seen()
        .iter()
        .filter(|s| pred(&s.uri))
        .map(|s| {
            s.headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        })
        .collect()
}

fn is_vertex(uri: &str) -> bool {
    uri.starts_with("/v1/projects/")
}

fn done_gcs() -> Value {
    json!({"name": VERTEX_OP, "done": true,
           "response": {"videos": [{"gcsUri": "gs://bucket/out/1/sample_0.mp4", "mimeType": "video/mp4"}]}})
}

// --- 1. Google credentials -----------------------------------------------------------------

/// Waits up to 5 s for `done`, which something in the background makes true.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    for _ in 0..250 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within 5 s: {what}");
}

/// Requests to the token endpoint so far (answered or not).
fn token_calls(up: &FakeUpstream) -> usize {
    up.seen().iter().filter(|s| s.uri == "/token").count()
}

async fn key_file_gateway(up: &FakeUpstream) -> TestGateway {
    let path = key_file(&format!("{}/token", up.url()));
    vertex_gateway(
        &up.url(),
        &format!("credentials_file = {:?}", path.to_str().unwrap()),
        "",
        &[],
    )
    .await
}

#[tokio::test]
async fn a_service_account_key_is_exchanged_for_cached_tokens_refreshed_before_expiry() {
    let g = Google::new();
    let up = g.start().await;
    let gw = key_file_gateway(&up).await;
    // The first token expires within the refresh margin: the next call starts its refresh.
    *g.expires_in.lock().unwrap() = 200;
    let id = create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(*g.bad_assertion.lock().unwrap(), None);
    assert_eq!(g.fetches(), 1);
    *g.expires_in.lock().unwrap() = 3600;
    g.operation
        .lock()
        .unwrap()
        .clone_from(&json!({"name": VERTEX_OP, "done": false}));
    assert_eq!(lookup(&gw, &id).await.task_status(), "RUNNING");
    eventually("refreshed before it expired", || g.fetches() == 2).await;
    uses_new_token(&gw, &up, "Bearer ya29.tok-2").await;
    for _ in 0..3 {
        create(&gw, &body(MODEL)).await.task_id();
    }
    assert_eq!(g.fetches(), 2, "a fresh token is reused");
    let sent = authorization(&up, is_vertex);
    assert_eq!(
        sent[..2],
        ["Bearer ya29.tok-1", "Bearer ya29.tok-1"],
        "the lookup that started the refresh did not wait for it"
    );
    let first_new = sent.iter().position(|a| a == "Bearer ya29.tok-2").unwrap();
    assert!(
        sent[..first_new].iter().all(|a| a == "Bearer ya29.tok-1")
            && sent[first_new..].iter().all(|a| a == "Bearer ya29.tok-2"),
        "{sent:?}"
    );
}

/// Creates tasks until one goes out with `token` (a refresh lands in the cache just after the
/// token endpoint answers; meanwhile requests are served the old token at once).
async fn uses_new_token(gw: &TestGateway, up: &FakeUpstream, token: &str) {
    for _ in 0..100 {
        let n = authorization(up, is_vertex).len();
        create(gw, &body(MODEL)).await.task_id();
        if authorization(up, is_vertex)[n] == token {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{token} is never used");
}

#[tokio::test]
async fn the_refresh_margin_is_three_minutes_45_seconds() {
    let g = Google::new();
    let up = g.start().await;
    // 230 s left: outside the margin, so the token is simply reused.
    *g.expires_in.lock().unwrap() = 230;
    let gw = key_file_gateway(&up).await;
    create(&gw, &body(MODEL)).await.task_id();
    create(&gw, &body(MODEL)).await.task_id();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(g.fetches(), 1, "no refresh with 230 s left");
    // 220 s left: inside it, so the next request starts a refresh.
    *g.expires_in.lock().unwrap() = 220;
    let gw = key_file_gateway(&up).await;
    create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(g.fetches(), 2);
    create(&gw, &body(MODEL)).await.task_id();
    eventually("a refresh with 220 s left", || g.fetches() == 3).await;
}

#[tokio::test]
async fn a_due_refresh_runs_in_the_background_while_the_valid_token_is_served() {
    let g = Google::new();
    let up = g.start().await;
    let gw = key_file_gateway(&up).await;
    *g.expires_in.lock().unwrap() = 200;
    create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(token_calls(&up), 1);
    // From now on the token endpoint hangs until released.
    let release = g.close_token_gate();
    *g.expires_in.lock().unwrap() = 3600;
    let within = Duration::from_secs(2);
    for _ in 0..3 {
        let a = tokio::time::timeout(within, create(&gw, &body(MODEL)))
            .await
            .expect("a request with a valid token does not wait for its refresh");
        assert_eq!(a.status, 200, "{}", a.json);
    }
    let b = body(MODEL);
    let together = futures_util::future::join_all((0..10).map(|_| create(&gw, &b)));
    for a in tokio::time::timeout(within, together)
        .await
        .expect("concurrent requests do not wait either")
    {
        assert_eq!(a.status, 200, "{}", a.json);
    }
    eventually("the refresh reached the token endpoint", || {
        token_calls(&up) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(token_calls(&up), 2, "fourteen requests, one refresh");
    let sent = authorization(&up, is_vertex);
    assert_eq!(sent.len(), 14);
    assert!(sent.iter().all(|a| a == "Bearer ya29.tok-1"), "{sent:?}");

    release.send(true).unwrap();
    uses_new_token(&gw, &up, "Bearer ya29.tok-2").await;
    assert_eq!(token_calls(&up), 2);
}

#[tokio::test]
async fn a_failed_background_refresh_backs_off_while_the_token_is_valid() {
    let (logs, _guard) = Logs::capture();
    let g = Google::new();
    let up = g.start().await;
    let gw = key_file_gateway(&up).await;
    // Inside the refresh margin, but valid for 200 s more.
    *g.expires_in.lock().unwrap() = 200;
    create(&gw, &body(MODEL)).await.task_id();
    *g.token_error.lock().unwrap() = Some((503, json!({"error": "backend_error"})));
    let a = create(&gw, &body(MODEL)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    eventually("the refresh failed", || {
        logs.text()
            .contains("refreshing the Google access token failed")
    })
    .await;
    assert_eq!(token_calls(&up), 2);
    for _ in 0..5 {
        let a = create(&gw, &body(MODEL)).await;
        assert_eq!(a.status, 200, "{}", a.json);
    }
    assert_eq!(
        token_calls(&up),
        2,
        "no new refresh during the backoff after a failed one"
    );
    *g.token_error.lock().unwrap() = None;
    *g.expires_in.lock().unwrap() = 3600;
    // The first backoff is 5 s.
    tokio::time::sleep(Duration::from_millis(5100)).await;
    create(&gw, &body(MODEL)).await.task_id();
    eventually("retried after the backoff", || token_calls(&up) == 3).await;
    uses_new_token(&gw, &up, "Bearer ya29.tok-2").await;
    let sent = authorization(&up, is_vertex);
    assert!(
        sent[..sent.len() - 1]
            .iter()
            .all(|a| a == "Bearer ya29.tok-1"),
        "{sent:?}"
    );
    assert_eq!(token_calls(&up), 3);

    // An expired token is not: the failed fetch is the request's failure.
    let gw = key_file_gateway(&up).await;
    *g.expires_in.lock().unwrap() = 0;
    assert_eq!(create(&gw, &body(MODEL)).await.status, 200);
    *g.token_error.lock().unwrap() = Some((503, json!({"error": "backend_error"})));
    let msg = create(&gw, &body(MODEL)).await.error(502);
    assert!(msg.starts_with("UPSTREAM_AUTH_FAILED: "), "{msg}");
    // And with no valid token there is no backoff: the next request tries again.
    let before = token_calls(&up);
    create(&gw, &body(MODEL)).await.error(502);
    assert_eq!(token_calls(&up), before + 1);
}

#[tokio::test]
async fn an_upstream_401_drops_the_cached_token() {
    let g = Google::new();
    let up = g.start().await;
    let gw = key_file_gateway(&up).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(g.fetches(), 1);
    // Vertex refuses the token (revoked, say): the client gets the 502 as before…
    *g.vertex_error.lock().unwrap() = Some((
        401,
        json!({"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "Request had invalid authentication credentials."}}),
    ));
    let msg = create(&gw, &body(MODEL)).await.error(502);
    assert!(msg.starts_with("UPSTREAM_AUTH_FAILED: "), "{msg}");
    *g.vertex_error.lock().unwrap() = None;
    // …and the next request fetches a new token instead of sending the refused one again.
    create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(g.fetches(), 2);
    assert_eq!(
        authorization(&up, is_vertex).last().unwrap(),
        "Bearer ya29.tok-2"
    );
    // A 403 is about permissions, which a new token does not change: the token stays.
    *g.vertex_error.lock().unwrap() = Some((
        403,
        json!({"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "denied"}}),
    ));
    create(&gw, &body(MODEL)).await.error(502);
    *g.vertex_error.lock().unwrap() = None;
    create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(g.fetches(), 2);
    // Cloud Storage's 401 on a download does the same.
    *g.operation.lock().unwrap() = done_gcs();
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    *g.vertex_error.lock().unwrap() = Some((
        401,
        json!({"error": {"code": 401, "message": "Invalid Credentials"}}),
    ));
    let (status, _, _) = range_get(&url, None, false).await;
    assert_eq!(status, 502);
    *g.vertex_error.lock().unwrap() = None;
    let (status, _, bytes) = range_get(&url, None, false).await;
    assert_eq!(status, 200);
    assert!(bytes == g.file);
    assert_eq!(g.fetches(), 3);
    assert_eq!(
        authorization(&up, |u| u.starts_with("/gcs/")),
        ["Bearer ya29.tok-2", "Bearer ya29.tok-3"]
    );
}

#[tokio::test]
async fn google_application_credentials_names_the_key_file() {
    let g = Google::new();
    let up = g.start().await;
    let path = key_file(&format!("{}/token", up.url()));
    let gw = vertex_gateway(
        &up.url(),
        "",
        "",
        &[("GOOGLE_APPLICATION_CREDENTIALS", path.to_str().unwrap())],
    )
    .await;
    create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(g.fetches(), 1);
    assert_eq!(authorization(&up, is_vertex), ["Bearer ya29.tok-1"]);
}

#[tokio::test]
async fn a_failing_refresh_is_a_clear_502_and_a_later_request_retries() {
    let (logs, _guard) = Logs::capture();
    let g = Google::new();
    let up = g.start().await;
    let path = key_file(&format!("{}/token", up.url()));
    let gw = vertex_gateway(
        &up.url(),
        &format!("credentials_file = {:?}", path.to_str().unwrap()),
        "",
        &[],
    )
    .await;
    *g.token_error.lock().unwrap() = Some((
        400,
        json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
    ));
    let a = create(&gw, &body(MODEL)).await;
    let msg = a.error(502);
    assert!(msg.starts_with("UPSTREAM_AUTH_FAILED: "), "{msg}");
    assert!(
        msg.contains("access token") && msg.contains("vertex"),
        "{msg}"
    );
    assert!(
        authorization(&up, is_vertex).is_empty(),
        "nothing reached Vertex"
    );
    assert!(
        logs.text()
            .contains("invalid_grant: Invalid JWT Signature."),
        "the cause is in the log"
    );
    assert!(!logs.text().contains("BEGIN PRIVATE KEY"));

    *g.token_error.lock().unwrap() = None;
    let a = create(&gw, &body(MODEL)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(authorization(&up, is_vertex), ["Bearer ya29.tok-1"]);
}

#[tokio::test]
async fn concurrent_requests_wait_for_one_token_fetch() {
    let g = Google::new();
    let up = g.start().await;
    let path = key_file(&format!("{}/token", up.url()));
    let gw = vertex_gateway(
        &up.url(),
        &format!("credentials_file = {:?}", path.to_str().unwrap()),
        "",
        &[],
    )
    .await;
    *g.token_delay.lock().unwrap() = Duration::from_millis(300);
    let b = body(MODEL);
    let creates = (0..20).map(|_| create(&gw, &b));
    let answers = futures_util::future::join_all(creates).await;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.json);
    }
    assert_eq!(g.fetches(), 1, "twenty callers, one token fetch");
    assert_eq!(authorization(&up, is_vertex).len(), 20);

    // A failure is shared the same way: the waiters get it, not a fetch each.
    let fresh = vertex_gateway(
        &up.url(),
        &format!("credentials_file = {:?}", path.to_str().unwrap()),
        "",
        &[],
    )
    .await;
    *g.token_error.lock().unwrap() = Some((500, json!({"error": "backend_error"})));
    let token_calls = || up.seen().iter().filter(|s| s.uri == "/token").count();
    let before = token_calls();
    let answers = futures_util::future::join_all((0..10).map(|_| create(&fresh, &b))).await;
    for a in &answers {
        a.error(502);
    }
    assert!(token_calls() - before < 10, "waiters shared a failed fetch");
}

#[tokio::test]
async fn the_metadata_server_supplies_tokens_on_google_cloud() {
    let g = Google::new();
    let up = g.start().await;
    let gw = vertex_gateway(
        &up.url(),
        &format!("metadata_url = \"{}\"", up.url()),
        "",
        &[],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    lookup(&gw, &id).await;
    assert_eq!(g.fetches(), 1);
    assert_eq!(
        authorization(&up, is_vertex),
        ["Bearer ya29.tok-1", "Bearer ya29.tok-1"]
    );
    // Refreshed like any token: one within the margin is replaced behind the next request.
    *g.expires_in.lock().unwrap() = 100;
    let gw = vertex_gateway(
        &up.url(),
        &format!("metadata_url = \"{}\"", up.url()),
        "",
        &[],
    )
    .await;
    create(&gw, &body(MODEL)).await.task_id();
    create(&gw, &body(MODEL)).await.task_id();
    eventually("the second request started a refresh", || g.fetches() == 3).await;
    *g.expires_in.lock().unwrap() = 3600;
    // GCE_METADATA_HOST, as Google's libraries read it: a bare host:port.
    let host = up.addr.to_string();
    let gw = vertex_gateway(&up.url(), "", "", &[("GCE_METADATA_HOST", &host)]).await;
    create(&gw, &body(MODEL)).await.task_id();
    assert_eq!(g.fetches(), 4);
}

#[tokio::test]
async fn credential_config_errors_name_their_key() {
    let toml = |cred: &str| {
        config(
            "http://127.0.0.1:1",
            &format!(
                r#"
[[upstreams]]
name = "vertex"
kind = "veo-vertex"
base_url = "{{UPSTREAM}}/v1/projects/p/locations/l/publishers/google/models"
{cred}
"#
            ),
        )
    };
    let parse = |text: String| {
        modelgate::config::Config::parse(&text, std::path::Path::new("."), &|n| {
            (n == "T").then(|| "t".to_owned())
        })
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let e = parse(toml("credentials_file = \"/nonexistent/sa.json\""));
    assert!(
        e.contains("upstreams[0].credentials_file: cannot read"),
        "{e}"
    );
    let e = parse(toml("api_key_env = \"T\"\nmetadata_url = \"http://x\""));
    assert!(e.contains("upstreams[0]: give either"), "{e}");
    let e = parse(toml("metadata_url = \"ftp://x\""));
    assert!(e.contains("upstreams[0].metadata_url"), "{e}");
    let e = parse(toml("api_key_env = \"T\"\nstorage_uri = \"s3://b/\""));
    assert!(e.contains("upstreams[0].storage_uri"), "{e}");
    let e = parse(toml("api_key_env = \"T\"").replace(
        "[[upstreams]]",
        "[video]\ntrusted_hosts = [\"ok.example\", \"evil.example/path\"]\n\n[[upstreams]]",
    ));
    assert!(e.contains("video.trusted_hosts[1]"), "{e}");
    assert!(!e.contains("trusted_hosts[0]"), "{e}");
    let e = parse(toml("api_key_env = \"T\"") + "\n[[upstreams]]\nname = \"m\"\nkind = \"mock\"\n\n[[models]]\nname = \"video-3.1-generate-001\"\nupstream = \"m\"\nstorage_uri = \"gs://b/\"\n");
    assert!(
        e.contains("models[0].storage_uri: only a veo-vertex upstream"),
        "{e}"
    );
}

// --- 2. storage_uri ------------------------------------------------------------------------

#[tokio::test]
async fn storage_uri_results_are_downloaded_from_gcs_with_the_token() {
    let g = Google::new();
    let up = g.start().await;
    let path = key_file(&format!("{}/token", up.url()));
    let gw = vertex_gateway(
        &up.url(),
        &format!(
            "credentials_file = {:?}\nstorage_uri = \"gs://upstream-default/\"",
            path.to_str().unwrap()
        ),
        "storage_uri = \"gs://bucket/out/\"",
        &[],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    let start = up
        .seen()
        .into_iter()
        .find(|s| s.uri.ends_with(":predictLongRunning"))
        .unwrap();
    assert_eq!(
        start.json()["parameters"]["storageUri"],
        "gs://bucket/out/",
        "the model's storage_uri wins over the upstream's"
    );
    *g.operation.lock().unwrap() = done_gcs();
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "SUCCEEDED", "{}", a.json);
    let url = a.json["data"]["url"].as_str().unwrap();
    let resp = client().get(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["accept-ranges"], "bytes");
    assert!(resp.bytes().await.unwrap() == g.file);
    assert_eq!(
        authorization(&up, |u| u.starts_with("/gcs/")),
        ["Bearer ya29.tok-1"],
        "Cloud Storage got the same token"
    );
    assert_eq!(g.fetches(), 1);
}

// --- 3. ranges -----------------------------------------------------------------------------

async fn range_get(url: &str, range: Option<&str>, head: bool) -> (u16, http::HeaderMap, Bytes) {
    let mut req = if head {
        client().head(url)
    } else {
        client().get(url)
    };
    if let Some(r) = range {
        req = req.header("range", r);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.unwrap())
}

/// Every range form against one file URL whose bytes are `file`; `whole_len_known`: a plain GET
/// of it carries its length (not so for an inline video, decoded as it streams).
async fn check_ranges(url: &str, file: &Bytes, whole_len_known: bool) {
    let len = file.len();
    let cases: [(&str, usize, usize); 4] = [
        ("bytes=0-99", 0, 99),
        ("bytes=1000-", 1000, len - 1),
        ("bytes=-500", len - 500, len - 1),
        ("bytes=40000-999999", 40000, len - 1),
    ];
    for (range, first, last) in cases {
        let (status, h, bytes) = range_get(url, Some(range), false).await;
        assert_eq!(status, 206, "{range}");
        assert_eq!(
            h["content-range"],
            format!("bytes {first}-{last}/{len}").as_str(),
            "{range}"
        );
        assert_eq!(
            h["content-length"],
            (last - first + 1).to_string().as_str(),
            "{range}"
        );
        assert_eq!(h["accept-ranges"], "bytes");
        assert!(
            bytes == file.slice(first..=last),
            "{range}: the right bytes"
        );
    }
    let (status, h, body) = range_get(url, Some(&format!("bytes={len}-")), false).await;
    assert_eq!(status, 416);
    assert_eq!(h["content-range"], format!("bytes */{len}").as_str());
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["code"], 100416);
    // Several ranges: the whole file, 200.
    let (status, h, bytes) = range_get(url, Some("bytes=0-1,5-6"), false).await;
    assert_eq!(status, 200);
    if whole_len_known {
        assert_eq!(h["content-length"], len.to_string().as_str());
    } else {
        assert!(h.get("content-length").is_none());
    }
    assert!(bytes == *file);
    // HEAD: the headers and length, no body.
    let (status, h, bytes) = range_get(url, None, true).await;
    assert_eq!(status, 200);
    assert_eq!(h["content-length"], len.to_string().as_str());
    assert_eq!(h["accept-ranges"], "bytes");
    assert!(bytes.is_empty());
    let (status, h, bytes) = range_get(url, Some("bytes=10-19"), true).await;
    assert_eq!(status, 206);
    assert_eq!(h["content-range"], format!("bytes 10-19/{len}").as_str());
    assert_eq!(h["content-length"], "10");
    assert!(bytes.is_empty());
}

#[tokio::test]
async fn ranges_are_forwarded_to_gcs_or_cut_when_it_ignores_them() {
    let g = Google::new();
    let up = g.start().await;
    let gw = vertex_gateway(
        &up.url(),
        "api_key_env = \"VT\"",
        "",
        &[("VT", "vertex-token")],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    *g.operation.lock().unwrap() = done_gcs();
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    check_ranges(&url, &g.file, true).await;
    let forwarded: Vec<String> = up
        .seen()
        .iter()
        .filter(|s| s.uri.starts_with("/gcs/"))
        .filter_map(|s| {
            s.headers
                .get("range")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert!(
        forwarded.contains(&"bytes=0-99".to_owned()),
        "{forwarded:?}"
    );
    assert!(
        forwarded.contains(&"bytes=-500".to_owned()),
        "{forwarded:?}"
    );
    assert!(
        !forwarded.iter().any(|r| r.contains(',')),
        "several ranges are not forwarded"
    );
    *g.ranges.lock().unwrap() = Ranges::Ignored;
    check_ranges(&url, &g.file, true).await;
}

#[tokio::test]
async fn ranges_of_an_inline_video_are_cut_from_the_decoded_stream() {
    let g = Google::new();
    let up = g.start().await;
    let gw = vertex_gateway(
        &up.url(),
        "api_key_env = \"VT\"",
        "",
        &[("VT", "vertex-token")],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    *g.operation.lock().unwrap() = json!({"name": VERTEX_OP, "done": true,
        "response": {"videos": [{"bytesBase64Encoded": STANDARD.encode(&g.file), "mimeType": "video/mp4"}]}});
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    check_ranges(&url, &g.file, false).await;
}

#[tokio::test]
async fn a_range_follows_a_gemini_download_and_an_unknown_length_is_served_whole() {
    let script = harness::Script::new();
    let up = harness::fake(&script).await;
    let gw = harness::gateway(harness::Kind::Gemini, &up.url()).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    let file_uri = format!("{}/v1beta/files/abc:download?alt=media", up.url());
    script.operation(
        json!({"name": harness::GEMINI_OP, "done": true, "response": {
        "generateVideoResponse": {"generatedSamples": [{"video": {"uri": file_uri}}]}}}),
    );
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    // The fake's file server streams without a length and ignores ranges: the whole file, 200.
    let (status, h, bytes) = range_get(&url, Some("bytes=0-9"), false).await;
    assert_eq!(status, 200);
    assert!(h.get("content-range").is_none());
    assert!(
        h.get("accept-ranges").is_none(),
        "no promise of ranges on an answer that could not honour one: {h:?}"
    );
    assert!(bytes == script.file);
    let hops: Vec<Seen> = up.seen().into_iter().rev().take(2).collect();
    for hop in &hops {
        assert_eq!(hop.headers["range"], "bytes=0-9", "{}", hop.uri);
    }
    assert_eq!(hops[1].headers["x-goog-api-key"], "gemini-key");
}

#[tokio::test]
async fn the_mock_file_serves_ranges_too() {
    let gw = TestGateway::start_with_env(
        &harness::video_config(harness::Kind::Mock, "http://127.0.0.1:1", 1),
        &harness::env("s"),
    )
    .await;
    let mut b = body(MODEL);
    b["input"]["prompt"] = json!("anything");
    let id = create(&gw, &b).await.task_id();
    let url = loop {
        let a = lookup(&gw, &id).await;
        if a.task_status() == "SUCCEEDED" {
            break a.json["data"]["url"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let file = client()
        .get(&url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(file.len() > 1000);
    let (status, h, bytes) = range_get(&url, Some("bytes=-100"), false).await;
    assert_eq!(status, 206);
    assert_eq!(
        h["content-range"],
        format!(
            "bytes {}-{}/{}",
            file.len() - 100,
            file.len() - 1,
            file.len()
        )
        .as_str()
    );
    assert!(bytes == file.slice(file.len() - 100..));
}

// --- validators and If-Range -----------------------------------------------------------------

async fn get_with(
    url: &str,
    headers: &[(&str, &str)],
    head: bool,
) -> (u16, http::HeaderMap, Bytes) {
    let mut req = if head {
        client().head(url)
    } else {
        client().get(url)
    };
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.unwrap())
}

/// A gateway whose Vertex upstream's next task finishes with `operation`, and that task's file URL.
async fn finished_file(g: &Google, up: &FakeUpstream, operation: Value) -> (TestGateway, String) {
    let gw = vertex_gateway(
        &up.url(),
        "api_key_env = \"VT\"",
        "",
        &[("VT", "vertex-token")],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    *g.operation.lock().unwrap() = operation;
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    (gw, url)
}

fn done_inline(file: &Bytes) -> Value {
    json!({"name": VERTEX_OP, "done": true,
           "response": {"videos": [{"bytesBase64Encoded": STANDARD.encode(file), "mimeType": "video/mp4"}]}})
}

/// The mock's finished file URL, once its task has succeeded.
async fn mock_file() -> (TestGateway, String) {
    let gw = TestGateway::start_with_env(
        &harness::video_config(harness::Kind::Mock, "http://127.0.0.1:1", 1),
        &harness::env("s"),
    )
    .await;
    let mut b = body(MODEL);
    b["input"]["prompt"] = json!("anything");
    let id = create(&gw, &b).await.task_id();
    loop {
        let a = lookup(&gw, &id).await;
        if a.task_status() == "SUCCEEDED" {
            let url = a.json["data"]["url"].as_str().unwrap().to_owned();
            return (gw, url);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `ETag` of every answer for `url` (GET, HEAD, whole, range): one strong tag, the same each time.
async fn one_strong_tag(url: &str) -> String {
    let mut tags = Vec::new();
    for (range, head) in [
        (None, false),
        (None, true),
        (Some("bytes=0-99"), false),
        (Some("bytes=0-99"), true),
    ] {
        let (status, h, _) = range_get(url, range, head).await;
        assert!(status == 200 || status == 206, "{status}");
        let tag = h
            .get("etag")
            .unwrap_or_else(|| panic!("no ETag for {range:?} head={head}: {h:?}"));
        tags.push(tag.to_str().unwrap().to_owned());
    }
    assert!(tags.iter().all(|t| *t == tags[0]), "{tags:?}");
    assert!(
        tags[0].starts_with('"') && tags[0].ends_with('"') && tags[0].len() > 2,
        "a strong tag: {}",
        tags[0]
    );
    tags[0].clone()
}

#[tokio::test]
async fn downloads_carry_the_files_validators() {
    let g = Google::new();
    let up = g.start().await;
    let (_gw, url) = finished_file(&g, &up, done_gcs()).await;
    // Cloud Storage's validators pass through, on GET and HEAD, 200 and 206.
    for (range, head) in [
        (None, false),
        (None, true),
        (Some("bytes=0-99"), false),
        (Some("bytes=0-99"), true),
    ] {
        let (status, h, _) = range_get(&url, range, head).await;
        assert!(status == 200 || status == 206, "{status}");
        assert_eq!(h["etag"], GCS_ETAG, "{range:?} head={head}");
        assert_eq!(
            h["last-modified"], GCS_LAST_MODIFIED,
            "{range:?} head={head}"
        );
    }
    // A source with none: the file id's own strong tag, and no made-up date.
    *g.validators.lock().unwrap() = false;
    let own = one_strong_tag(&url).await;
    assert_ne!(own, GCS_ETAG);
    assert!(range_get(&url, None, false)
        .await
        .1
        .get("last-modified")
        .is_none());
    // Inline results and the mock have no validators either.
    let (_gw, inline) = finished_file(&g, &up, done_inline(&g.file)).await;
    let inline_tag = one_strong_tag(&inline).await;
    assert_ne!(inline_tag, own, "another file id, another tag");
    let (_gw, mock) = mock_file().await;
    one_strong_tag(&mock).await;
}

/// `Range: bytes=10-19` with `If-Range: if_range` on `url` (GET and HEAD): the range when
/// `partial`, else the whole file as 200.
async fn check_if_range(url: &str, file: &Bytes, if_range: &str, partial: bool) {
    let len = file.len();
    for head in [false, true] {
        let (status, h, bytes) = get_with(
            url,
            &[("range", "bytes=10-19"), ("if-range", if_range)],
            head,
        )
        .await;
        let what = format!("If-Range {if_range} head={head}");
        if partial {
            assert_eq!(status, 206, "{what}");
            assert_eq!(
                h["content-range"],
                format!("bytes 10-19/{len}").as_str(),
                "{what}"
            );
            assert_eq!(h["content-length"], "10", "{what}");
            if !head {
                assert!(bytes == file.slice(10..=19), "{what}");
            }
        } else {
            assert_eq!(status, 200, "{what}");
            assert!(h.get("content-range").is_none(), "{what}");
            if head {
                if let Some(n) = h.get("content-length") {
                    assert_eq!(n, len.to_string().as_str(), "{what}");
                }
            } else {
                assert!(bytes == *file, "{what}: the whole file");
            }
        }
    }
}

#[tokio::test]
async fn if_range_gets_the_range_only_while_the_file_is_the_same() {
    let g = Google::new();
    let up = g.start().await;
    let (_gw, url) = finished_file(&g, &up, done_gcs()).await;
    let weak = format!("W/{GCS_ETAG}");
    let cases: [(&str, bool); 5] = [
        (GCS_ETAG, true),
        (GCS_LAST_MODIFIED, true),
        ("\"CKih16GjycICEAI=\"", false),
        ("Tue, 01 Jul 2025 10:00:01 GMT", false),
        (&weak, false),
    ];
    // Whether Cloud Storage weighs If-Range itself, ignores it, or ignores ranges altogether,
    // the client gets the range only when its copy is of the same file.
    for ranges in [Ranges::Honoured, Ranges::RangeOnly, Ranges::Ignored] {
        *g.ranges.lock().unwrap() = ranges;
        for (if_range, partial) in cases {
            check_if_range(&url, &g.file, if_range, partial).await;
        }
    }
    let forwarded = up
        .seen()
        .into_iter()
        .filter(|s| s.uri.starts_with("/gcs/"))
        .any(|s| {
            s.headers.get("if-range").map(|v| v.as_bytes()) == Some(GCS_ETAG.as_bytes())
                && s.headers["range"] == "bytes=10-19"
        });
    assert!(forwarded, "If-Range goes upstream with the range");

    // Without validators of its own, the file id's tag is the one that matches; it is weighed
    // by the gateway, not sent to the upstream (to which it means nothing).
    *g.validators.lock().unwrap() = false;
    *g.ranges.lock().unwrap() = Ranges::Honoured;
    let own = range_get(&url, None, true).await.1["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let before = up.seen().len();
    check_if_range(&url, &g.file, &own, true).await;
    for s in &up.seen()[before..] {
        assert!(s.headers.get("if-range").is_none(), "{:?}", s.headers);
    }
    check_if_range(&url, &g.file, GCS_ETAG, false).await;
    check_if_range(&url, &g.file, GCS_LAST_MODIFIED, false).await;

    // An inline result and the mock: the same, weighed by the gateway alone.
    let (_gw, inline) = finished_file(&g, &up, done_inline(&g.file)).await;
    let own = range_get(&inline, None, true).await.1["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    check_if_range(&inline, &g.file, &own, true).await;
    check_if_range(&inline, &g.file, "\"other\"", false).await;
    check_if_range(&inline, &g.file, GCS_LAST_MODIFIED, false).await;
    let (_gw, mock) = mock_file().await;
    let file = client()
        .get(&mock)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let own = range_get(&mock, None, true).await.1["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    check_if_range(&mock, &file, &own, true).await;
    check_if_range(&mock, &file, "\"other\"", false).await;
    // Without a Range, If-Range is ignored.
    let (status, _, bytes) = get_with(&mock, &[("if-range", "\"other\"")], false).await;
    assert_eq!(status, 200);
    assert!(bytes == file);
}

// --- 4. the access log ---------------------------------------------------------------------

#[tokio::test]
async fn video_access_log_lines_name_the_key_and_the_model() {
    let (logs, _guard) = Logs::capture();
    let g = Google::new();
    let up = g.start().await;
    let gw = vertex_gateway(
        &up.url(),
        "api_key_env = \"VT\"",
        "",
        &[("VT", "vertex-token")],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    *g.operation.lock().unwrap() = done_gcs();
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _, _) = range_get(&url, None, false).await;
    assert_eq!(status, 200);
    // A refused create still names its key and model.
    let mut bad = body(MODEL);
    bad["parameters"]["duration"] = json!(5);
    create(&gw, &bad).await.error(400);
    // The line is written when the body ends; give the server's task a turn to finish it.
    for _ in 0..50 {
        if logs.access("/v1/").len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for prefix in ["/v1/video/generations", "/v1/tasks/", "/v1/files/"] {
        let lines = logs.access(prefix);
        assert!(
            !lines.is_empty(),
            "no access line for {prefix}: {}",
            logs.text()
        );
        for l in lines {
            assert_eq!(l["key"], "test", "{prefix}: {l}");
            assert_eq!(l["model"], MODEL, "{prefix}: {l}");
        }
    }
    assert_eq!(logs.access("/v1/video/generations").len(), 2);
}

/// Waits until `n` access lines under `prefix` are written (each when its body ends).
async fn access_lines(logs: &Logs, prefix: &str, n: usize) -> Vec<Value> {
    for _ in 0..100 {
        let lines = logs.access(prefix);
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fewer than {n} access lines for {prefix}: {}", logs.text());
}

#[tokio::test]
async fn video_access_lines_name_the_upstream_and_tell_its_failures_from_refusals() {
    let (logs, _guard) = Logs::capture();
    let g = Google::new();
    let up = g.start().await;
    let gw = key_file_gateway(&up).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    // Refused by the gateway: nothing went upstream.
    let mut bad = body(MODEL);
    bad["parameters"]["duration"] = json!(5);
    create(&gw, &bad).await.error(400);
    // Vertex refuses the gateway's token: the upstream's failure.
    *g.vertex_error.lock().unwrap() = Some((
        401,
        json!({"error": {"code": 401, "message": "Request had invalid authentication credentials."}}),
    ));
    create(&gw, &body(MODEL)).await.error(502);
    *g.vertex_error.lock().unwrap() = None;
    // No token to be had (the last one was dropped on the 401): the same.
    *g.token_error.lock().unwrap() = Some((400, json!({"error": "invalid_grant"})));
    create(&gw, &body(MODEL)).await.error(502);
    *g.token_error.lock().unwrap() = None;
    let lines = access_lines(&logs, "/v1/video/generations", 4).await;
    let fields = |l: &Value| {
        (
            l["status"].as_u64().unwrap(),
            l["upstream"].as_str().map(str::to_owned),
            l["attempts"].as_u64().unwrap(),
            l["outcome"].as_str().unwrap().to_owned(),
        )
    };
    let vertex = Some("vertex".to_owned());
    assert_eq!(fields(&lines[0]), (200, vertex.clone(), 1, "ok".into()));
    assert_eq!(fields(&lines[1]).2, 0, "{}", lines[1]);
    assert_eq!(fields(&lines[1]).3, "refused", "{}", lines[1]);
    for l in &lines[2..] {
        assert_eq!(
            fields(l),
            (502, vertex.clone(), 1, "upstream_error".into()),
            "{l}"
        );
    }
    // A lookup polls Vertex; the next, answered from the cache of a finished task, does not.
    *g.operation.lock().unwrap() = done_gcs();
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    lookup(&gw, &id).await.task_id();
    let lines = access_lines(&logs, "/v1/tasks/", 2).await;
    assert_eq!(fields(&lines[0]), (200, vertex.clone(), 1, "ok".into()));
    assert_eq!(fields(&lines[1]), (200, vertex.clone(), 0, "ok".into()));
    let (status, _, _) = range_get(&url, None, false).await;
    assert_eq!(status, 200);
    let lines = access_lines(&logs, "/v1/files/", 1).await;
    assert_eq!(fields(&lines[0]), (200, vertex.clone(), 1, "ok".into()));
}

#[tokio::test]
async fn a_head_on_a_download_is_observed_as_ok() {
    let (logs, _guard) = Logs::capture();
    let g = Google::new();
    let up = g.start().await;
    let (gw, url) = finished_file(&g, &up, done_gcs()).await;
    let (status, _, _) = range_get(&url, None, true).await;
    assert_eq!(status, 200);
    let (status, _, _) = range_get(&url, Some("bytes=0-9"), true).await;
    assert_eq!(status, 206);
    let lines = access_lines(&logs, "/v1/files/", 2).await;
    for (l, status) in lines.iter().zip([200, 206]) {
        assert_eq!(l["method"], "HEAD", "{l}");
        assert_eq!(l["status"], status, "{l}");
        assert_eq!(l["outcome"], "ok", "{l}");
    }
    let metrics = gw.metrics().await;
    // 200: the create, the lookup and the HEAD.
    for (status, n) in [(200, 3), (206, 1)] {
        let line = format!("modelgate_requests_total{{model=\"{MODEL}\",upstream=\"vertex\",protocol=\"video\",status=\"{status}\",outcome=\"ok\"}} {n}");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
    assert!(!metrics.contains("client_cancelled"), "{metrics}");
}

#[tokio::test]
async fn video_metrics_carry_the_model_and_upstream() {
    let g = Google::new();
    let up = g.start().await;
    let (gw, url) = finished_file(&g, &up, done_gcs()).await;
    let (status, _, _) = range_get(&url, None, false).await;
    assert_eq!(status, 200);
    *g.vertex_error.lock().unwrap() = Some((401, json!({"error": {"code": 401}})));
    create(&gw, &body(MODEL)).await.error(502);
    // A prefix entry: the label is the config's name for it, not what the client sent.
    let toml = config(
        &up.url(),
        r#"
[video]
task_secrets_env = "SECRETS"

[[upstreams]]
name = "videomock"
kind = "mock"

[[models]]
name = "video-*"
upstream = "videomock"
addresses = ["video"]
"#,
    );
    let mock_gw = TestGateway::start_with_env(&toml, &[("SECRETS", "s1")]).await;
    let mut b = body(MODEL);
    b["input"]["prompt"] = json!("anything");
    let id = create(&mock_gw, &b).await.task_id();
    lookup(&mock_gw, &id).await.task_id();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let metrics = gw.metrics().await;
    let count = |m: &str, model: &str, upstream: &str, status: u16, outcome: &str| {
        let line = format!("modelgate_requests_total{{model=\"{model}\",upstream=\"{upstream}\",protocol=\"video\",status=\"{status}\",outcome=\"{outcome}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map(|n| n.trim().parse::<u64>().unwrap())
            .unwrap_or_else(|| panic!("no {line} in:\n{m}"))
    };
    // The create, the lookup and the download.
    assert_eq!(count(&metrics, MODEL, "vertex", 200, "ok"), 3);
    assert_eq!(count(&metrics, MODEL, "vertex", 502, "upstream_error"), 1);
    let route = format!("model=\"{MODEL}\",upstream=\"vertex\",protocol=\"video\"");
    assert!(
        metrics.contains(&format!(
            "modelgate_request_duration_seconds_count{{{route}}} 4"
        )),
        "{metrics}"
    );
    let metrics = mock_gw.metrics().await;
    assert_eq!(count(&metrics, "video-*", "videomock", 200, "ok"), 2);
}

// --- 5. upstream_auth_failed ---------------------------------------------------------------

#[tokio::test]
async fn an_upstream_refusing_the_gateways_credential_is_a_502_that_quotes_nothing() {
    let (logs, _guard) = Logs::capture();
    let g = Google::new();
    let up = g.start().await;
    let gw = vertex_gateway(
        &up.url(),
        "api_key_env = \"VT\"",
        "",
        &[("VT", "vertex-token-SECRET")],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    for status in [401, 403] {
        *g.vertex_error.lock().unwrap() = Some((
            status,
            json!({"error": {"code": status, "status": "UNAUTHENTICATED",
                             "message": "Request had invalid authentication credentials: Bearer vertex-token-SECRET"}}),
        ));
        let answers: [Answer; 2] = [create(&gw, &body(MODEL)).await, {
            tokio::time::sleep(Duration::from_millis(5)).await;
            lookup(&gw, &id).await
        }];
        for a in answers {
            let msg = a.error(502);
            assert!(msg.starts_with("UPSTREAM_AUTH_FAILED: "), "{msg}");
            assert!(msg.contains(&status.to_string()), "{msg}");
            assert!(!a.json.to_string().contains("vertex-token-SECRET"));
            assert!(
                !msg.contains("invalid authentication"),
                "the upstream's body is not quoted: {msg}"
            );
        }
    }
    // Another status whose body echoes the credential: quoted, but scrubbed.
    *g.vertex_error.lock().unwrap() = Some((
        400,
        json!({"error": {"code": 400, "message": "bad header Bearer vertex-token-SECRET"}}),
    ));
    let msg = create(&gw, &body(MODEL)).await.error(400);
    assert!(msg.contains("bad header Bearer [redacted]"), "{msg}");
    let text = logs.text();
    assert!(
        text.contains("refused the gateway's credential"),
        "the cause is logged"
    );
    assert!(
        text.contains("invalid authentication credentials"),
        "with the upstream's words"
    );
    assert!(
        !text.contains("vertex-token-SECRET"),
        "but never the credential"
    );
}

#[tokio::test]
async fn a_gcs_401_on_download_is_upstream_auth_failed_and_the_token_is_not_quoted() {
    let (logs, _guard) = Logs::capture();
    let g = Google::new();
    let up = g.start().await;
    let path = key_file(&format!("{}/token", up.url()));
    let gw = vertex_gateway(
        &up.url(),
        &format!("credentials_file = {:?}", path.to_str().unwrap()),
        "",
        &[],
    )
    .await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    *g.operation.lock().unwrap() = done_gcs();
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    *g.vertex_error.lock().unwrap() = Some((
        401,
        json!({"error": {"code": 401, "message": "token ya29.tok-1 has expired"}}),
    ));
    let (status, _, bytes) = range_get(&url, None, false).await;
    assert_eq!(status, 502);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .starts_with("UPSTREAM_AUTH_FAILED: "),
        "{v}"
    );
    assert!(!v.to_string().contains("ya29"), "{v}");
    let text = logs.text();
    assert!(
        text.contains("token [redacted] has expired"),
        "the cause, scrubbed, is logged"
    );
    assert!(!text.contains("ya29.tok-1"), "the token is never logged");
}

// --- 6. hostile input: file URLs ------------------------------------------------------------

async fn lookup_with_host(gw: &TestGateway, id: &str, host: &str) -> Value {
    let resp = client()
        .get(gw.url(Address::Video, &format!("/v1/tasks/{id}")))
        .header("host", host)
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    resp.json().await.unwrap()
}

#[tokio::test]
async fn a_hostile_host_header_does_not_choose_the_download_domain() {
    let g = Google::new();
    let up = g.start().await;
    let gw = vertex_gateway(&up.url(), "api_key_env = \"VT\"", "", &[("VT", "t")]).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    *g.operation.lock().unwrap() = done_gcs();
    let v = lookup_with_host(&gw, &id, "evil.example").await;
    let url = v["data"]["url"].as_str().unwrap();
    let listen = gw.running.addr(Address::Video).unwrap();
    assert!(
        url.starts_with(&format!("http://{listen}/v1/files/")),
        "built from the listen address, not the Host: {url}"
    );

    // A listed host is used.
    let toml_gw = {
        let toml = config(
            &up.url(),
            r#"
[video]
task_secrets_env = "SECRETS"
gcs_api_url = "{UPSTREAM}/gcs"
status_cache_ms = 1
trusted_hosts = ["video.example.com", "Localhost:8443"]

[[upstreams]]
name = "vertex"
kind = "veo-vertex"
base_url = "{UPSTREAM}/v1/projects/p/locations/us-central1/publishers/google/models"
api_key_env = "VT"

[[models]]
name = "video-3.1-generate-001"
upstream = "vertex"
"#,
        );
        TestGateway::start_with_env(&toml, &[("SECRETS", "s1"), ("VT", "t")]).await
    };
    let id = create(&toml_gw, &body(MODEL)).await.task_id();
    for (host, expect) in [
        ("video.example.com", "http://video.example.com/"),
        ("VIDEO.example.com:8082", "http://video.example.com:8082/"),
        ("localhost:8443", "http://localhost:8443/"),
    ] {
        let v = lookup_with_host(&toml_gw, &id, host).await;
        let url = v["data"]["url"].as_str().unwrap();
        assert!(url.starts_with(expect), "{host}: {url}");
    }
    for host in [
        "evil.example",
        "localhost:9999",
        "video.example.com.evil.example",
    ] {
        let v = lookup_with_host(&toml_gw, &id, host).await;
        let url = v["data"]["url"].as_str().unwrap();
        let listen = toml_gw.running.addr(Address::Video).unwrap();
        assert!(
            url.starts_with(&format!("http://{listen}/")),
            "{host}: {url}"
        );
    }
}

#[tokio::test]
async fn a_javascript_url_from_a_video_upstream_is_not_handed_out() {
    let script = harness::Script::new();
    let up = harness::fake(&script).await;
    let gw = harness::gateway(harness::Kind::Native, &up.url()).await;
    for url in [
        "javascript:alert(document.cookie)",
        "data:text/html,<script>alert(1)</script>",
        "JAVASCRIPT:alert(1)",
    ] {
        // A finished task's answer is kept: one task per URL.
        let id = create(&gw, &body(MODEL)).await.task_id();
        script.native(json!({"taskId": "up-1", "taskStatus": "SUCCEEDED", "url": url}));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let a = lookup(&gw, &id).await;
        assert_eq!(a.status, 200);
        assert!(a.json["data"].get("url").is_none(), "{url}: {}", a.json);
        assert_eq!(a.task_status(), "FAILED", "{}", a.json);
        assert!(!a.json.to_string().contains("alert"), "{}", a.json);
    }
}
