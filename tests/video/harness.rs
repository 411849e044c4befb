//! Video test harness: a gateway config with every video upstream kind, fake native/Vertex/Gemini upstreams with a settable task state, and client helpers.
#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed setup step should fail the test loudly"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{json, Value};

use crate::common::*;
use modelgate::config::Address;

pub const OTHER_KEY: &str = "sk-other";
pub const SECRETS_ENV: &str = "VIDEO_SECRETS";
pub const MODEL: &str = "video-3.1-generate-001";
pub const FAST: &str = "video-3.1-fast-generate-001";
pub const VERTEX_OP: &str = "projects/p/locations/us-central1/publishers/google/models/veo-3.1-generate-001/operations/op-1";
pub const GEMINI_OP: &str = "models/veo-3.1-generate-001/operations/g-1";

/// Which upstream the two video model names are routed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mock,
    Native,
    Vertex,
    Gemini,
}

impl Kind {
    fn upstream(self) -> &'static str {
        match self {
            Kind::Mock => "mock",
            Kind::Native => "native",
            Kind::Vertex => "vertex",
            Kind::Gemini => "gemini",
        }
    }
}

/// A config with every video upstream kind, both model names on `kind`, and a second key.
pub fn video_config(kind: Kind, fake: &str, status_cache_ms: u64) -> String {
    config(
        fake,
        &format!(
            r#"
[video]
task_secrets_env = "{SECRETS_ENV}"
gcs_api_url = "{{UPSTREAM}}/gcs"
status_cache_ms = {status_cache_ms}

[[keys]]
name = "other"
key = "{OTHER_KEY}"

[[keys]]
name = "fast-only"
key = "sk-fast"
models = ["{FAST}"]

[[keys]]
name = "chat-only"
key = "sk-chat"
addresses = ["base"]

[[upstreams]]
name = "mock"
kind = "mock"

[[upstreams]]
name = "native"
kind = "video"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "vertex"
kind = "veo-vertex"
base_url = "{{UPSTREAM}}/v1/projects/p/locations/us-central1/publishers/google/models"
api_key_env = "VERTEX_TOKEN"

[[upstreams]]
name = "gemini"
kind = "veo-gemini"
base_url = "{{UPSTREAM}}/v1beta"
api_key_env = "GEMINI_KEY"

[[models]]
name = "{MODEL}"
upstream = "{up}"

[[models]]
name = "{FAST}"
upstream = "{up}"
"#,
            up = kind.upstream()
        ),
    )
}

pub fn env(secrets: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("UPSTREAM_KEY", "up-secret"),
        ("VERTEX_TOKEN", "vertex-token"),
        ("GEMINI_KEY", "gemini-key"),
        (SECRETS_ENV, secrets),
    ]
}

pub async fn gateway(kind: Kind, fake: &str) -> TestGateway {
    TestGateway::start_with_env(&video_config(kind, fake, 1), &env("secret-1")).await
}

/// What the fake upstreams answer to task polls; tests change it between lookups.
#[derive(Clone)]
pub struct Script {
    /// The native service's lookup envelope `data`.
    pub native: Arc<Mutex<Value>>,
    /// The Veo operation JSON (Vertex and Gemini).
    pub operation: Arc<Mutex<Value>>,
    /// A status and body to answer every request with instead, when set (429 comes with `retry-after: 7`).
    pub error: Arc<Mutex<Option<(u16, Value)>>>,
    /// The bytes of every downloadable file.
    pub file: Bytes,
    /// Delay before a poll answer (to make lookups overlap).
    pub poll_delay: Arc<Mutex<Duration>>,
}

impl Script {
    pub fn new() -> Self {
        Self {
            native: Arc::new(Mutex::new(json!({"taskStatus": "PENDING"}))),
            operation: Arc::new(Mutex::new(json!({"name": VERTEX_OP}))),
            error: Arc::new(Mutex::new(None)),
            file: Bytes::from((0..70_000u32).map(|i| (i % 253) as u8).collect::<Vec<u8>>()),
            poll_delay: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }

    pub fn native(&self, data: Value) {
        *self.native.lock().unwrap() = data;
    }

    pub fn operation(&self, op: Value) {
        *self.operation.lock().unwrap() = op;
    }

    pub fn fail_with(&self, error: Option<(u16, Value)>) {
        *self.error.lock().unwrap() = error;
    }
}

fn delayed_json(delay: Duration, status: u16, v: &Value) -> Reply {
    if delay.is_zero() {
        return Reply::json(status, v.clone());
    }
    Reply::Stream {
        status,
        content_type: "application/json",
        chunks: vec![(delay, Bytes::from(v.to_string()))],
        abort: false,
    }
}

/// One fake server that plays a native video service, Vertex, Gemini and Cloud Storage by path.
pub async fn fake(script: &Script) -> FakeUpstream {
    let s = script.clone();
    FakeUpstream::start(move |seen| {
        let path = seen.uri.split('?').next().unwrap_or("").to_owned();
        let delay = *s.poll_delay.lock().unwrap();
        if let Some((status, body)) = s.error.lock().unwrap().clone() {
            let mut headers = vec![("content-type", "application/json".to_owned())];
            if status == 429 {
                headers.push(("retry-after", "7".to_owned()));
            }
            return Reply::Full {
                status,
                headers,
                body: Bytes::from(body.to_string()),
            };
        }
        match (seen.method.as_str(), path.as_str()) {
            ("POST", "/v1/video/generations") => Reply::json(
                200,
                json!({"code": 100000, "msg": "SUCCESS", "data": {"taskId": "up-1", "taskStatus": "PENDING"}}),
            ),
            ("GET", "/v1/tasks/up-1") => {
                let data = s.native.lock().unwrap().clone();
                delayed_json(delay, 200, &json!({"code": 100000, "msg": "SUCCESS", "data": data}))
            }
            ("POST", p) if p.ends_with(":predictLongRunning") && p.starts_with("/v1/projects/") => {
                Reply::json(200, json!({"name": VERTEX_OP}))
            }
            ("POST", p) if p.ends_with(":predictLongRunning") => Reply::json(200, json!({"name": GEMINI_OP})),
            ("POST", p) if p.ends_with(":fetchPredictOperation") => {
                delayed_json(delay, 200, &s.operation.lock().unwrap().clone())
            }
            ("GET", p) if p.starts_with("/v1beta/models/") => {
                delayed_json(delay, 200, &s.operation.lock().unwrap().clone())
            }
            ("GET", "/gcs/storage/v1/b/bucket/o/out%2F1%2Fsample_0.mp4") => file_reply(&s.file, "video/mp4"),
            // Gemini's file download redirects to a signed address elsewhere.
            ("GET", "/v1beta/files/abc:download") => Reply::Full {
                status: 302,
                headers: vec![("location", "/signed/abc?sig=1".into())],
                body: Bytes::new(),
            },
            ("GET", "/signed/abc") => file_reply(&s.file, "video/mp4"),
            _ => Reply::json(404, json!({"error": {"code": 404, "message": format!("no route {path}")}})),
        }
    })
    .await
}

fn file_reply(file: &Bytes, content_type: &'static str) -> Reply {
    // In several chunks, so the gateway has frames to relay.
    let chunks = file
        .chunks(16 * 1024)
        .map(|c| (Duration::ZERO, file.slice_ref(c)))
        .collect();
    Reply::Stream {
        status: 200,
        content_type,
        chunks,
        abort: false,
    }
}

/// A valid create body for `model`.
pub fn body(model: &str) -> Value {
    json!({"model": model, "input": {"prompt": "a red fox running through snow"},
           "parameters": {"generate_audio": true}})
}

pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub json: Value,
}

impl Answer {
    pub fn task_id(&self) -> String {
        self.json["data"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no taskId in {}", self.json))
            .to_owned()
    }

    pub fn task_status(&self) -> &str {
        self.json["data"]["taskStatus"].as_str().unwrap_or("")
    }

    /// Asserts a video error envelope with `status` and its code, and returns `msg`.
    pub fn error(&self, status: u16) -> String {
        assert_eq!(self.status, status, "body: {}", self.json);
        assert_eq!(
            self.json["code"],
            100_000 + u64::from(status),
            "body: {}",
            self.json
        );
        assert!(self.json["data"].is_null(), "body: {}", self.json);
        self.json["msg"].as_str().unwrap().to_owned()
    }
}

async fn answer(resp: reqwest::Response) -> Answer {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON ({status}): {}", String::from_utf8_lossy(&bytes)));
    Answer {
        status,
        headers,
        json,
    }
}

pub async fn create_with(gw: &TestGateway, key: Option<&str>, body: &Value) -> Answer {
    let mut req = client()
        .post(gw.url(Address::Video, "/v1/video/generations"))
        .json(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    answer(req.send().await.unwrap()).await
}

pub async fn create(gw: &TestGateway, body: &Value) -> Answer {
    create_with(gw, Some(KEY), body).await
}

pub async fn lookup_with(gw: &TestGateway, id: &str, key: Option<&str>, post: bool) -> Answer {
    let url = gw.url(Address::Video, &format!("/v1/tasks/{id}"));
    let mut req = if post {
        client().post(url)
    } else {
        client().get(url)
    };
    req = req.header("content-type", "application/json");
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    answer(req.send().await.unwrap()).await
}

pub async fn lookup(gw: &TestGateway, id: &str) -> Answer {
    lookup_with(gw, id, Some(KEY), false).await
}

/// Downloads without any header, as a browser or `curl -O` would.
pub async fn download(url: &str) -> (u16, HeaderMap, Bytes) {
    let resp = client().get(url).send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.unwrap())
}

/// How many requests the fake saw whose path ends with `suffix` (or starts with it, for `prefix:`).
pub fn count(up: &FakeUpstream, pred: impl Fn(&str) -> bool) -> usize {
    up.seen()
        .iter()
        .filter(|s| pred(s.uri.split('?').next().unwrap_or("")))
        .count()
}
