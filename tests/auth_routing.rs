//! Keys (gateway.md §3), routing (§4), paths, methods and error shapes per address (§2, §5).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed setup step should fail the test loudly"
)]

mod common;

use common::*;
use modelgate::config::Address;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const BASE_ONLY: &str = "sk-base-only";
const LIMITED: &str = "sk-limited";
const ONE_NAME: &str = "sk-one-name";
const HASHED: &str = "sk-hashed-secret";
const FROM_ENV: &str = "sk-from-env";

/// Two chat upstreams ("a" and "b") and one messages upstream, so a test can tell which one a
/// request was routed to; keys restricted by address and by model; a sha256 and a key_env key.
fn routing_config(a: &str, b: &str) -> String {
    let digest = hex::encode(Sha256::digest(HASHED.as_bytes()));
    let extra = format!(
        r#"
[[keys]]
name = "base-only"
key = "{BASE_ONLY}"
addresses = ["base"]

[[keys]]
name = "limited"
key = "{LIMITED}"
models = ["plain", "gpt-4*"]

[[keys]]
name = "one-name"
key = "{ONE_NAME}"
models = ["gpt-3.5"]

[[keys]]
name = "hashed"
sha256 = "{digest}"

[[keys]]
name = "from-env"
key_env = "CLIENT_KEY"

[[upstreams]]
name = "a"
kind = "chat"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "b"
kind = "chat"
base_url = "{b}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "anthropic"
kind = "messages"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

# Deliberately shortest prefix first and the exact name last: config order must not decide.
[[models]]
name = "gpt-*"
upstream = "a"
upstream_model = "short-prefix"
addresses = ["base", "token_plan"]

[[models]]
name = "gpt-4*"
upstream = "a"
upstream_model = "long-prefix"
addresses = ["base", "token_plan"]

[[models]]
name = "gpt-4o"
upstream = "b"
upstream_model = "exact"

[[models]]
name = "plain"
upstream = "a"

[[models]]
name = "tp-only"
upstream = "b"
addresses = ["token_plan"]

[[models]]
name = "claude-x"
upstream = "anthropic"
endpoints = ["messages"]
"#
    );
    common::config(a, &extra)
}

struct Setup {
    a: FakeUpstream,
    b: FakeUpstream,
    gw: TestGateway,
}

impl Setup {
    async fn new() -> Self {
        let a = FakeUpstream::start(|_| Reply::json(200, json!({"from": "a"}))).await;
        let b = FakeUpstream::start(|_| Reply::json(200, json!({"from": "b"}))).await;
        let env = [("UPSTREAM_KEY", "up-secret"), ("CLIENT_KEY", FROM_ENV)];
        let gw = TestGateway::start_with_env(&routing_config(&a.url(), &b.url()), &env).await;
        Self { a, b, gw }
    }

    fn chat_url(&self, address: Address) -> String {
        self.gw.url(address, "/v1/chat/completions")
    }

    fn assert_nothing_forwarded(&self, what: &str) {
        assert!(
            self.a.seen().is_empty(),
            "{what}: upstream a got {:?}",
            self.a.seen()
        );
        assert!(
            self.b.seen().is_empty(),
            "{what}: upstream b got {:?}",
            self.b.seen()
        );
    }
}

/// POSTs `body` with the given headers (no key unless one is among them).
async fn post_with(
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = client().post(url).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, headers, v)
}

async fn chat_as(url: &str, key: &str, model: &str) -> (u16, Value) {
    let auth = format!("Bearer {key}");
    let (status, _, v) = post_with(url, &[("authorization", &auth)], &chat_body(model)).await;
    (status, v)
}

async fn get_as(url: &str, key: Option<&str>) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = client().get(url);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Asserts an OpenAI-shaped error with the given status, type and code.
fn assert_error(what: &str, status: u16, v: &Value, want: (u16, &str, &str)) {
    assert_eq!(status, want.0, "{what}: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: {v}"
    );
    assert_eq!(v["error"]["type"], want.1, "{what}: {v}");
    assert_eq!(v["error"]["code"], want.2, "{what}: {v}");
}

const UNAUTHORIZED: (u16, &str, &str) = (401, "authentication_error", "invalid_api_key");
const FORBIDDEN: (u16, &str, &str) = (403, "permission_error", "forbidden");
const NOT_FOUND_MODEL: (u16, &str, &str) = (404, "invalid_request_error", "model_not_found");

#[tokio::test]
async fn missing_or_wrong_key_is_401() {
    let s = Setup::new().await;
    let url = s.chat_url(Address::Base);
    let body = chat_body("plain");
    for (what, headers) in [
        ("no authorization header", vec![]),
        ("wrong key", vec![("authorization", "Bearer sk-wrong")]),
        (
            "key with a suffix",
            vec![("authorization", "Bearer sk-test2")],
        ),
        ("no scheme", vec![("authorization", KEY)]),
        ("basic scheme", vec![("authorization", "Basic sk-test")]),
        ("scheme only", vec![("authorization", "Bearer")]),
        ("key in x-api-key on chat", vec![("x-api-key", KEY)]),
    ] {
        let (status, _, v) = post_with(&url, &headers, &body).await;
        assert_error(what, status, &v, UNAUTHORIZED);
    }
    // The key is checked before the body is even parsed.
    let resp = client().post(&url).body("{not json").send().await.unwrap();
    assert_eq!(resp.status(), 401);
    s.assert_nothing_forwarded("unauthenticated requests");
    let (status, v) = chat_as(&url, KEY, "plain").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        s.a.last().headers["authorization"],
        "Bearer up-secret",
        "the upstream's own key is sent"
    );
}

#[tokio::test]
async fn bearer_scheme_is_case_insensitive() {
    let s = Setup::new().await;
    let url = s.chat_url(Address::Base);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let auth = format!("{scheme} {KEY}");
        let (status, _, v) =
            post_with(&url, &[("authorization", &auth)], &chat_body("plain")).await;
        assert_eq!(status, 200, "{scheme}: {v}");
    }
    assert_eq!(s.a.seen().len(), 4);
}

#[tokio::test]
async fn x_api_key_only_on_messages() {
    let s = Setup::new().await;
    let (status, _, v) = post_with(
        &s.chat_url(Address::Base),
        &[("x-api-key", KEY)],
        &chat_body("plain"),
    )
    .await;
    assert_error("x-api-key on chat", status, &v, UNAUTHORIZED);
    let resp = client()
        .get(s.gw.base("/v1/models"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401, "x-api-key on /v1/models");
    s.assert_nothing_forwarded("x-api-key outside /v1/messages");

    let messages = json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, v) =
        post_with(&s.gw.base("/v1/messages"), &[("x-api-key", KEY)], &messages).await;
    assert_eq!(status, 200, "x-api-key on /v1/messages: {v}");
    let seen = s.a.last();
    assert_eq!(seen.uri, "/v1/messages");
    assert_eq!(
        seen.headers["x-api-key"], "up-secret",
        "the client's key is replaced by the upstream's"
    );
    // A wrong x-api-key is still a 401, in Anthropic's shape.
    let (status, _, v) = post_with(
        &s.gw.base("/v1/messages"),
        &[("x-api-key", "sk-wrong")],
        &messages,
    )
    .await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
}

#[tokio::test]
async fn empty_bearer_falls_back_to_x_api_key_on_messages() {
    let s = Setup::new().await;
    // HTTP/2 keeps the trailing space of "Bearer " (HTTP/1.1 parsers trim it).
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let messages = json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let send = |key: &'static str| {
        h2.post(s.gw.base("/v1/messages"))
            .header("authorization", "Bearer ")
            .header("x-api-key", key)
            .json(&messages)
            .send()
    };
    let resp = send("sk-wrong").await.unwrap();
    assert_eq!(resp.status(), 401);
    assert!(s.a.seen().is_empty());
    let resp = send(KEY).await.unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    assert_eq!(s.a.seen().len(), 1);
}

#[tokio::test]
async fn key_limited_to_an_address_is_403_elsewhere() {
    let s = Setup::new().await;
    let (status, v) = chat_as(&s.chat_url(Address::TokenPlan), BASE_ONLY, "gpt-3.5").await;
    assert_error("base-only key on token_plan", status, &v, FORBIDDEN);
    let (status, _, v) = get_as(&s.gw.url(Address::TokenPlan, "/v1/models"), Some(BASE_ONLY)).await;
    assert_error("base-only key listing token_plan", status, &v, FORBIDDEN);
    s.assert_nothing_forwarded("key on a foreign address");
    let (status, v) = chat_as(&s.chat_url(Address::Base), BASE_ONLY, "gpt-3.5").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.a.seen().len(), 1);
}

#[tokio::test]
async fn key_limited_to_models_gets_the_unknown_model_404_for_others() {
    let s = Setup::new().await;
    let url = s.chat_url(Address::Base);
    // `limited` may use "plain" (exact) and "gpt-4*" (prefix). A model it may not use and one
    // that does not exist get the same answer, so the key cannot list what exists (§14).
    for model in ["gpt-3.5", "gpt-", "claude-x"] {
        let (status, v) = chat_as(&url, LIMITED, model).await;
        assert_error(model, status, &v, NOT_FOUND_MODEL);
        assert_eq!(v["error"]["param"], "model", "{model}: {v}");
        let (_, unknown) = chat_as(&url, LIMITED, "no-such-model-anywhere").await;
        assert_eq!(
            v["error"]["message"]
                .as_str()
                .map(|m| m.replace(model, "X")),
            unknown["error"]["message"]
                .as_str()
                .map(|m| m.replace("no-such-model-anywhere", "X")),
            "{model}: the forbidden and the unknown model must read the same"
        );
    }
    // Exact means exact: a name that only starts with an allowed one is refused too.
    let (status, v) = chat_as(&s.chat_url(Address::TokenPlan), ONE_NAME, "gpt-3.5-turbo").await;
    assert_error(
        "gpt-3.5-turbo with only gpt-3.5 allowed",
        status,
        &v,
        NOT_FOUND_MODEL,
    );
    s.assert_nothing_forwarded("models outside the key's list");
    let mut n = 0;
    for (key, model) in [
        (LIMITED, "plain"),
        (LIMITED, "gpt-4"),
        (LIMITED, "gpt-4o"),
        (LIMITED, "gpt-4-turbo"),
        (ONE_NAME, "gpt-3.5"),
    ] {
        let (status, v) = chat_as(&url, key, model).await;
        assert_eq!(status, 200, "{key} {model}: {v}");
        n += 1;
        assert_eq!(
            s.a.seen().len() + s.b.seen().len(),
            n,
            "{key} {model} forwarded"
        );
    }
}

#[tokio::test]
async fn unknown_model_is_404_model_not_found() {
    let s = Setup::new().await;
    // Even a key limited to other models learns only that the name does not exist.
    for (key, model) in [
        (KEY, "nope"),
        (KEY, "gpt"),
        (LIMITED, "nope"),
        (KEY, "GPT-4"),
    ] {
        let (status, v) = chat_as(&s.chat_url(Address::Base), key, model).await;
        assert_error(model, status, &v, NOT_FOUND_MODEL);
        assert_eq!(v["error"]["param"], "model");
    }
    s.assert_nothing_forwarded("unknown models");
}

#[tokio::test]
async fn model_served_on_another_path_is_400_naming_it() {
    let s = Setup::new().await;
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let (status, v) = chat_as(&s.gw.base(path), KEY, "claude-x").await;
        assert_error(
            path,
            status,
            &v,
            (400, "invalid_request_error", "invalid_value"),
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("/v1/messages"),
            "{path}: the message names the path to use: {msg}"
        );
        assert_eq!(v["error"]["param"], "model");
    }
    s.assert_nothing_forwarded("model on the wrong path");
}

#[tokio::test]
async fn model_not_served_on_an_address_is_404_there() {
    let s = Setup::new().await;
    let (status, v) = chat_as(&s.chat_url(Address::TokenPlan), KEY, "plain").await;
    assert_error("plain on token_plan", status, &v, NOT_FOUND_MODEL);
    let (status, v) = chat_as(&s.chat_url(Address::Base), KEY, "tp-only").await;
    assert_error("tp-only on base", status, &v, NOT_FOUND_MODEL);
    s.assert_nothing_forwarded("models on foreign addresses");
    let (status, v) = chat_as(&s.chat_url(Address::Base), KEY, "plain").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.a.seen().len(), 1);
    let (status, v) = chat_as(&s.chat_url(Address::TokenPlan), KEY, "tp-only").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.b.last().json()["model"], "tp-only");
}

#[tokio::test]
async fn exact_name_wins_then_the_longest_prefix() {
    let s = Setup::new().await;
    for (address, model, upstream, sent_as) in [
        (Address::Base, "gpt-4o", "b", "exact"),
        (Address::Base, "gpt-4o-mini", "a", "long-prefix"),
        (Address::Base, "gpt-4", "a", "long-prefix"),
        (Address::Base, "gpt-3.5", "a", "short-prefix"),
        (Address::Base, "gpt-", "a", "short-prefix"),
        // The exact entry serves base only; on token_plan the pattern that serves it answers.
        (Address::TokenPlan, "gpt-4o", "a", "long-prefix"),
    ] {
        let (a_before, b_before) = (s.a.seen().len(), s.b.seen().len());
        let (status, v) = chat_as(&s.chat_url(address), KEY, model).await;
        assert_eq!(status, 200, "{model}: {v}");
        assert_eq!(
            v["from"], upstream,
            "{model} on {address:?} went to the wrong upstream"
        );
        let (up, other) = if upstream == "a" {
            (&s.a, &s.b)
        } else {
            (&s.b, &s.a)
        };
        assert_eq!(
            up.seen().len() + other.seen().len(),
            a_before + b_before + 1
        );
        assert_eq!(up.last().json()["model"], sent_as, "{model} on {address:?}");
    }
}

async fn list(s: &Setup, address: Address, key: &str) -> Vec<String> {
    let (status, headers, v) = get_as(&s.gw.url(address, "/v1/models"), Some(key)).await;
    assert_eq!(status, 200, "{key} on {address:?}: {v}");
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    assert_eq!(v["object"], "list", "{v}");
    let data = v["data"].as_array().expect("data is an array");
    data.iter()
        .map(|m| {
            assert_eq!(m["object"], "model", "{m}");
            assert!(m["created"].is_i64(), "{m}");
            assert!(m["owned_by"].is_string(), "{m}");
            m["id"].as_str().expect("id is a string").to_owned()
        })
        .collect()
}

#[tokio::test]
async fn models_list_is_what_the_key_may_use_on_the_address() {
    let s = Setup::new().await;
    let cases: [(Address, &str, &[&str]); 7] = [
        (
            Address::Base,
            KEY,
            &["claude-x", "gpt-*", "gpt-4*", "gpt-4o", "plain"],
        ),
        (Address::TokenPlan, KEY, &["gpt-*", "gpt-4*", "tp-only"]),
        (Address::Base, LIMITED, &["gpt-4*", "gpt-4o", "plain"]),
        (Address::TokenPlan, LIMITED, &["gpt-4*"]),
        // An exact permission inside a pattern lists that name.
        (Address::Base, ONE_NAME, &["gpt-3.5"]),
        (
            Address::Base,
            BASE_ONLY,
            &["claude-x", "gpt-*", "gpt-4*", "gpt-4o", "plain"],
        ),
        (
            Address::Base,
            HASHED,
            &["claude-x", "gpt-*", "gpt-4*", "gpt-4o", "plain"],
        ),
    ];
    for (address, key, want) in cases {
        assert_eq!(list(&s, address, key).await, want, "{key} on {address:?}");
    }
    let (status, _, v) = get_as(&s.gw.base("/v1/models"), None).await;
    assert_error("no key", status, &v, UNAUTHORIZED);
    let (status, _, v) = get_as(&s.gw.base("/v1/models"), Some("sk-wrong")).await;
    assert_error("wrong key", status, &v, UNAUTHORIZED);
}

#[tokio::test]
async fn sha256_key_authenticates_and_its_digest_does_not() {
    let s = Setup::new().await;
    let (status, v) = chat_as(&s.chat_url(Address::Base), HASHED, "plain").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.a.seen().len(), 1);
    let digest = hex::encode(Sha256::digest(HASHED.as_bytes()));
    let (status, v) = chat_as(&s.chat_url(Address::Base), &digest, "plain").await;
    assert_error("the digest itself", status, &v, UNAUTHORIZED);
    assert_eq!(s.a.seen().len(), 1, "the refused request was not forwarded");
}

#[tokio::test]
async fn key_env_key_authenticates() {
    let s = Setup::new().await;
    let (status, v) = chat_as(&s.chat_url(Address::TokenPlan), FROM_ENV, "gpt-3.5").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.a.seen().len(), 1);
    let (status, v) = chat_as(&s.chat_url(Address::Base), "CLIENT_KEY", "plain").await;
    assert_error("the variable's name", status, &v, UNAUTHORIZED);
    assert_eq!(s.a.seen().len(), 1);
}

#[tokio::test]
async fn unknown_path_is_404_in_the_address_shape() {
    let s = Setup::new().await;
    for (address, path) in [
        (Address::Base, "/v1/nope"),
        (Address::Base, "/v2/chat/completions"),
        (Address::Base, "/v1/chat/completions/"),
        (Address::TokenPlan, "/v1/messages"),
        (Address::TokenPlan, "/v1/responses"),
    ] {
        let (status, _, v) = post_with(
            &s.gw.url(address, path),
            &[("authorization", "Bearer sk-test")],
            &chat_body("plain"),
        )
        .await;
        assert_error(
            path,
            status,
            &v,
            (404, "invalid_request_error", "not_found"),
        );
    }
    // Without a key too: the path is decided first.
    let (status, _, v) = get_as(&s.gw.base("/nope"), None).await;
    assert_error(
        "/nope without a key",
        status,
        &v,
        (404, "invalid_request_error", "not_found"),
    );
    s.assert_nothing_forwarded("unknown paths");
}

#[tokio::test]
async fn wrong_method_is_405_with_allow() {
    let s = Setup::new().await;
    let c = client();
    for (method, address, path, allow) in [
        (
            reqwest::Method::GET,
            Address::Base,
            "/v1/chat/completions",
            "POST",
        ),
        (
            reqwest::Method::PUT,
            Address::TokenPlan,
            "/v1/chat/completions",
            "POST",
        ),
        (reqwest::Method::POST, Address::Base, "/v1/models", "GET"),
        (
            reqwest::Method::DELETE,
            Address::Base,
            "/v1/responses",
            "POST",
        ),
        (reqwest::Method::POST, Address::Admin, "/healthz", "GET"),
    ] {
        let resp = c
            .request(method.clone(), s.gw.url(address, path))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method} {path}");
        assert_eq!(resp.headers()["allow"], allow, "{method} {path}");
        if address != Address::Admin {
            let v: Value = resp.json().await.unwrap();
            assert_error(
                path,
                405,
                &v,
                (405, "invalid_request_error", "method_not_allowed"),
            );
        }
    }
    // /v1/messages answers in Anthropic's shape.
    let resp = c.get(s.gw.base("/v1/messages")).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "POST");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    s.assert_nothing_forwarded("wrong methods");
}

#[tokio::test]
async fn video_address_answers_in_its_envelope() {
    let s = Setup::new().await;
    for path in ["/v1/nope", "/v1/chat/completions"] {
        let resp = client()
            .post(s.gw.url(Address::Video, path))
            .bearer_auth(KEY)
            .json(&chat_body("plain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["code"], 100404, "{path}: {v}");
        assert!(
            v["msg"].as_str().unwrap().starts_with("NOT_FOUND: "),
            "{path}: {v}"
        );
        assert!(v.get("data").is_some_and(Value::is_null), "{path}: {v}");
        assert!(
            v.get("error").is_none(),
            "{path}: not the OpenAI shape: {v}"
        );
    }
    s.assert_nothing_forwarded("video address");
}

#[tokio::test]
async fn admin_health_and_readiness() {
    let s = Setup::new().await;
    for path in ["/healthz", "/readyz"] {
        // No key needed: probes carry none.
        let resp = client()
            .get(s.gw.url(Address::Admin, path))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(!resp.text().await.unwrap().is_empty(), "{path}");
    }
    let resp = client()
        .get(s.gw.url(Address::Admin, "/v1/models"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "client paths are not served on admin");
}

/// One keep-alive connection carrying several clients' keys in turn (a proxy's pool): each
/// request is authenticated as its own key, whatever the connection presented before, though
/// the gateway remembers the last key's digest per connection.
#[tokio::test]
async fn each_request_on_one_connection_is_its_own_keys() {
    use http_body_util::{BodyExt, Full};
    let s = Setup::new().await;
    let url: hyper::Uri = s.chat_url(Address::Base).parse().unwrap();
    let authority = url.authority().unwrap().as_str().to_owned();
    let sock = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
            .await
            .unwrap();
    #[expect(
        clippy::disallowed_methods,
        reason = "the test's client connection, driven beside its requests and ended with the test"
    )]
    let conn = tokio::spawn(conn);
    let body = chat_body("gpt-3.5").to_string();
    let prefix = &KEY[..KEY.len() - 1];
    let longer = format!("{KEY}x");
    let same_length = format!("{prefix}#");
    // (key, status): LIMITED may not use gpt-3.5, ONE_NAME and KEY may.
    let cases = [
        (KEY, 200),
        ("sk-wrong", 401),
        (KEY, 200),
        (LIMITED, 404),
        (ONE_NAME, 200),
        (prefix, 401),
        (KEY, 200),
        (&same_length, 401),
        (&longer, 401),
        (BASE_ONLY, 200),
        (LIMITED, 404),
        (HASHED, 200),
    ];
    for (i, (key, want)) in cases.into_iter().enumerate() {
        send.ready().await.unwrap();
        let req = hyper::Request::post(url.clone())
            .header("host", &authority)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            status,
            want,
            "request {i} ({key}): {}",
            String::from_utf8_lossy(&text)
        );
    }
    assert!(!conn.is_finished(), "all on one connection");
    assert_eq!(
        s.a.seen().len() + s.b.seen().len(),
        6,
        "only the accepted requests went upstream"
    );
}
