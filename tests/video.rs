//! Video create: the envelope, keys, every validation rule on both sides of its boundary, and the mock flow on the shipped config.
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

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use common::*;
use harness::*;
use modelgate::config::Address;
use serde_json::{json, Value};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
const JPEG: &[u8] = b"\xff\xd8\xff\xe0\0\x10JFIF\0";
const WEBP: &[u8] = b"RIFF\x24\0\0\0WEBPVP8 ";

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// `body(MODEL)` with `edit` applied at a JSON pointer (`None` removes the field).
fn with(pointer: &str, value: Option<Value>) -> Value {
    let mut b = body(MODEL);
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let slot = if parent.is_empty() {
        &mut b
    } else {
        if b.pointer(parent).is_none() {
            let (pp, pk) = parent.rsplit_once('/').unwrap();
            let holder = if pp.is_empty() {
                &mut b
            } else {
                b.pointer_mut(pp).unwrap()
            };
            holder[pk] = json!({});
        }
        b.pointer_mut(parent).unwrap()
    };
    match value {
        Some(v) => slot[key] = v,
        None => {
            slot.as_object_mut().unwrap().remove(key);
        }
    }
    b
}

async fn accepted(gw: &TestGateway, b: &Value) {
    let a = create(gw, b).await;
    assert_eq!(a.status, 200, "should be accepted: {b}\n→ {}", a.json);
    assert_eq!(a.json["code"], 100000);
    assert_eq!(a.json["msg"], "SUCCESS");
    assert_eq!(a.task_status(), "PENDING");
}

/// Asserts a 400 whose msg names `field` and mentions each of `allowed`.
async fn refused(gw: &TestGateway, b: &Value, field: &str, allowed: &[&str]) {
    let a = create(gw, b).await;
    let msg = a.error(400);
    assert!(msg.starts_with("INVALID_PARAMETER: "), "{msg}");
    assert!(
        msg.contains(field),
        "msg should name {field}: {msg}\nbody: {b}"
    );
    for want in allowed {
        assert!(msg.contains(want), "msg should mention {want}: {msg}");
    }
}

#[tokio::test]
async fn create_answers_pending_at_once_with_headers() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    let a = create(&gw, &body(MODEL)).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json["code"], 100000);
    assert_eq!(a.json["msg"], "SUCCESS");
    assert_eq!(a.task_status(), "PENDING");
    let id = a.task_id();
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{id}"
    );
    assert_eq!(a.headers["taskid"], id.as_str());
    assert_eq!(a.headers["taskstatus"], "PENDING");
    assert_eq!(a.headers["content-type"], "application/json");
    assert!(a.headers.contains_key("x-request-id"));
}

#[tokio::test]
async fn keys_are_required_and_scoped() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    let msg = create_with(&gw, None, &body(MODEL)).await.error(401);
    assert!(msg.starts_with("UNAUTHORIZED: "), "{msg}");
    create_with(&gw, Some("sk-wrong"), &body(MODEL))
        .await
        .error(401);
    // A key limited to the base address; a key limited to the other model, to which a model
    // it may not use does not exist (§14).
    create_with(&gw, Some("sk-chat"), &body(MODEL))
        .await
        .error(403);
    let msg = create_with(&gw, Some("sk-fast"), &body(MODEL))
        .await
        .error(404);
    assert!(msg.starts_with("NOT_FOUND: "), "{msg}");
    assert_eq!(
        create_with(&gw, Some("sk-fast"), &body(FAST)).await.status,
        200
    );
    // Lookups need a key too.
    let id = create(&gw, &body(MODEL)).await.task_id();
    lookup_with(&gw, &id, None, false).await.error(401);
    lookup_with(&gw, &id, None, true).await.error(401);
}

#[tokio::test]
async fn paths_and_methods() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    let url = |p: &str| gw.url(Address::Video, p);
    let r = client()
        .get(url("/v1/video/generations"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], 100405);
    let r = client()
        .delete(url("/v1/tasks/x"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, POST");
    let r = client().post(url("/v1/files/x")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    for p in ["/v1/nothing", "/v1/chat/completions", "/"] {
        let r = client().post(url(p)).bearer_auth(KEY).send().await.unwrap();
        assert_eq!(r.status(), 404, "{p}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], 100404);
        assert!(v["msg"].as_str().unwrap().starts_with("NOT_FOUND: "));
    }
}

#[tokio::test]
async fn body_must_be_a_json_object_within_the_limit() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    let send = |body: Vec<u8>| {
        client()
            .post(gw.url(Address::Video, "/v1/video/generations"))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for bad in [&b"{not json"[..], b"[1]", b"\"x\"", b""] {
        let r = send(bad.to_vec()).await.unwrap();
        assert_eq!(r.status(), 400, "{}", String::from_utf8_lossy(bad));
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], 100400);
    }
    // The test config's limit is 64 KiB.
    let mut big = body(MODEL);
    big["input"]["prompt"] = json!("x".repeat(70_000));
    let r = send(big.to_string().into_bytes()).await.unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], 100413);
}

#[tokio::test]
async fn model_is_one_of_the_two_names() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    accepted(&gw, &body(MODEL)).await;
    accepted(&gw, &body(FAST)).await;
    let names = [MODEL, FAST];
    refused(&gw, &with("/model", None), "model", &names).await;
    refused(
        &gw,
        &with("/model", Some(json!("video-3.1-generate-002"))),
        "model",
        &names,
    )
    .await;
    refused(
        &gw,
        &with("/model", Some(json!("VIDEO-3.1-GENERATE-001"))),
        "model",
        &names,
    )
    .await;
    refused(&gw, &with("/model", Some(json!(5))), "model", &[]).await;
}

#[tokio::test]
async fn a_listed_model_without_a_route_is_404() {
    let toml = video_config(Kind::Mock, "http://127.0.0.1:9", 1).replace(
        &format!("[[models]]\nname = \"{FAST}\"\nupstream = \"mock\"\n"),
        "",
    );
    let gw = TestGateway::start_with_env(&toml, &env("s")).await;
    accepted(&gw, &body(MODEL)).await;
    let msg = create(&gw, &body(FAST)).await.error(404);
    assert!(msg.contains(FAST), "{msg}");
}

#[tokio::test]
async fn prompt_is_required_and_negative_prompt_a_string() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    accepted(&gw, &with("/input/prompt", Some(json!("x")))).await;
    accepted(&gw, &with("/input/negative_prompt", Some(json!("blurry")))).await;
    accepted(&gw, &with("/input/negative_prompt", Some(Value::Null))).await;
    refused(
        &gw,
        &with("/input/prompt", None),
        "input.prompt",
        &["required"],
    )
    .await;
    refused(&gw, &with("/input", None), "input.prompt", &["required"]).await;
    refused(
        &gw,
        &with("/input/prompt", Some(json!(""))),
        "input.prompt",
        &[],
    )
    .await;
    refused(
        &gw,
        &with("/input/prompt", Some(json!("  "))),
        "input.prompt",
        &[],
    )
    .await;
    refused(
        &gw,
        &with("/input/prompt", Some(json!(["a"]))),
        "input.prompt",
        &["a string"],
    )
    .await;
    refused(
        &gw,
        &with("/input", Some(json!("a fox"))),
        "input",
        &["an object"],
    )
    .await;
    refused(
        &gw,
        &with("/input/negative_prompt", Some(json!(1))),
        "input.negative_prompt",
        &["a string"],
    )
    .await;
}

#[tokio::test]
async fn resolution_duration_aspect_ratio_person_generation_sets() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    for ok in ["720p", "1080p"] {
        accepted(&gw, &with("/parameters/resolution", Some(json!(ok)))).await;
    }
    for bad in [json!("480p"), json!("1080P"), json!("4k"), json!(720)] {
        refused(
            &gw,
            &with("/parameters/resolution", Some(bad)),
            "parameters.resolution",
            &["\"720p\"", "\"1080p\""],
        )
        .await;
    }
    for ok in [4, 6, 8] {
        accepted(&gw, &with("/parameters/duration", Some(json!(ok)))).await;
    }
    for bad in [
        json!(3),
        json!(5),
        json!(7),
        json!(9),
        json!(0),
        json!(-8),
        json!(8.5),
        json!("8"),
        json!(true),
    ] {
        refused(
            &gw,
            &with("/parameters/duration", Some(bad)),
            "parameters.duration",
            &["4, 6, 8"],
        )
        .await;
    }
    for ok in ["16:9", "9:16"] {
        accepted(&gw, &with("/parameters/aspect_ratio", Some(json!(ok)))).await;
    }
    for bad in [json!("4:3"), json!("16/9"), json!(16), json!(169)] {
        refused(
            &gw,
            &with("/parameters/aspect_ratio", Some(bad)),
            "parameters.aspect_ratio",
            &["\"16:9\"", "\"9:16\""],
        )
        .await;
    }
    for ok in ["allow_adult", "dont_allow"] {
        accepted(&gw, &with("/parameters/person_generation", Some(json!(ok)))).await;
    }
    for bad in [json!("allow_all"), json!("ALLOW_ADULT"), json!(false)] {
        refused(
            &gw,
            &with("/parameters/person_generation", Some(bad)),
            "parameters.person_generation",
            &["\"allow_adult\"", "\"dont_allow\""],
        )
        .await;
    }
    // null means "not given": the default applies.
    accepted(&gw, &with("/parameters/resolution", Some(Value::Null))).await;
    refused(
        &gw,
        &with("/parameters", Some(json!([1]))),
        "parameters",
        &["an object"],
    )
    .await;
}

#[tokio::test]
async fn generate_audio_is_a_required_boolean() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    accepted(&gw, &with("/parameters/generate_audio", Some(json!(true)))).await;
    accepted(&gw, &with("/parameters/generate_audio", Some(json!(false)))).await;
    let f = "parameters.generate_audio";
    refused(
        &gw,
        &with("/parameters/generate_audio", None),
        f,
        &["required", "true or false"],
    )
    .await;
    refused(&gw, &with("/parameters", None), f, &["required"]).await;
    refused(
        &gw,
        &with("/parameters/generate_audio", Some(Value::Null)),
        f,
        &["required"],
    )
    .await;
    for bad in [json!("true"), json!(1), json!(0)] {
        refused(
            &gw,
            &with("/parameters/generate_audio", Some(bad)),
            f,
            &["true or false"],
        )
        .await;
    }
}

fn image(bytes: &[u8], mime: Option<&str>) -> Value {
    let mut v = json!({"bytesBase64Encoded": b64(bytes)});
    if let Some(m) = mime {
        v["mimeType"] = json!(m);
    }
    v
}

#[tokio::test]
async fn images_are_plain_base64_of_an_allowed_type() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    let f = "input.image.bytesBase64Encoded";
    let m = "input.image.mimeType";
    for (bytes, mime) in [
        (PNG, "image/png"),
        (JPEG, "image/jpeg"),
        (WEBP, "image/webp"),
    ] {
        accepted(&gw, &with("/input/image", Some(image(bytes, Some(mime))))).await;
        // Without a mimeType the bytes tell.
        accepted(&gw, &with("/input/image", Some(image(bytes, None)))).await;
    }
    // Unpadded base64 decodes the same.
    let unpadded =
        json!({"bytesBase64Encoded": b64(PNG).trim_end_matches('='), "mimeType": "image/png"});
    accepted(&gw, &with("/input/image", Some(unpadded))).await;

    let data_uri = json!({"bytesBase64Encoded": format!("data:image/png;base64,{}", b64(PNG)), "mimeType": "image/png"});
    refused(&gw, &with("/input/image", Some(data_uri)), f, &["data"]).await;
    let garbage = json!({"bytesBase64Encoded": "not*base64!", "mimeType": "image/png"});
    refused(&gw, &with("/input/image", Some(garbage)), f, &["base64"]).await;
    let wrapped = json!({"bytesBase64Encoded": format!("{}\n{}", &b64(PNG)[..8], &b64(PNG)[8..]), "mimeType": "image/png"});
    refused(
        &gw,
        &with("/input/image", Some(wrapped)),
        f,
        &["whitespace"],
    )
    .await;
    let urlsafe = json!({"bytesBase64Encoded": b64(JPEG).replace('/', "_").replace('+', "-"), "mimeType": "image/jpeg"});
    refused(&gw, &with("/input/image", Some(urlsafe)), f, &["base64"]).await;
    refused(
        &gw,
        &with("/input/image", Some(json!({"bytesBase64Encoded": ""}))),
        f,
        &[],
    )
    .await;
    refused(
        &gw,
        &with("/input/image", Some(json!({"mimeType": "image/png"}))),
        f,
        &["required"],
    )
    .await;
    refused(
        &gw,
        &with("/input/image", Some(json!({"bytesBase64Encoded": 5}))),
        f,
        &["a string"],
    )
    .await;
    refused(
        &gw,
        &with("/input/image", Some(json!("abc"))),
        "input.image",
        &["an object"],
    )
    .await;
    for bad in [
        "image/gif",
        "image/jpg",
        "IMAGE/PNG",
        "application/octet-stream",
    ] {
        refused(
            &gw,
            &with("/input/image", Some(image(PNG, Some(bad)))),
            m,
            &["image/jpeg", "image/png", "image/webp"],
        )
        .await;
    }
    // Declared one type, the bytes are another.
    refused(
        &gw,
        &with("/input/image", Some(image(PNG, Some("image/jpeg")))),
        m,
        &["image/png"],
    )
    .await;
    // Bytes that are no image at all.
    refused(
        &gw,
        &with(
            "/input/image",
            Some(image(b"GIF89a......", Some("image/png"))),
        ),
        f,
        &["JPEG, PNG or WebP"],
    )
    .await;
}

#[tokio::test]
async fn last_frame_only_with_image_and_checked_the_same_way() {
    let gw = gateway(Kind::Mock, "http://127.0.0.1:9").await;
    let mut both = body(MODEL);
    both["input"]["image"] = image(PNG, Some("image/png"));
    both["input"]["last_frame"] = image(JPEG, Some("image/jpeg"));
    accepted(&gw, &both).await;
    let mut alone = body(MODEL);
    alone["input"]["last_frame"] = image(PNG, Some("image/png"));
    refused(&gw, &alone, "input.last_frame", &["input.image"]).await;
    let mut bad = both.clone();
    bad["input"]["last_frame"] = image(PNG, Some("image/gif"));
    refused(&gw, &bad, "input.last_frame.mimeType", &["image/webp"]).await;
    let mut bad = both.clone();
    bad["input"]["last_frame"]["bytesBase64Encoded"] = json!("data:image/png;base64,AAAA");
    refused(&gw, &bad, "input.last_frame.bytesBase64Encoded", &["data"]).await;
}

#[tokio::test]
async fn bad_input_never_reaches_the_upstream() {
    let script = Script::new();
    let up = fake(&script).await;
    for kind in [Kind::Native, Kind::Vertex, Kind::Gemini] {
        let gw = gateway(kind, &up.url()).await;
        for b in [
            with("/parameters/duration", Some(json!(5))),
            with("/input/prompt", None),
            with("/model", Some(json!("veo-3"))),
        ] {
            create(&gw, &b).await.error(400);
        }
    }
    assert!(up.seen().is_empty(), "the upstream saw {:?}", up.seen());
}

/// The shipped config with its listeners moved to free ports.
fn shipped_config() -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/modelgate.toml"
    ))
    .unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let moved = ["base", "token_plan", "video", "admin"]
            .iter()
            .find(|k| line.starts_with(&format!("{k} = \"127.0.0.1:")));
        match moved {
            Some(k) => out.push_str(&format!("{k} = \"127.0.0.1:0\"\n")),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

const MOCK_MP4: &[u8] = include_bytes!("fixtures/video/mock.mp4");

#[tokio::test]
async fn mock_flow_on_the_shipped_config() {
    // No secret in the environment: a random per-process one, which is fine within one process.
    let gw = TestGateway::start_with_env(&shipped_config(), &[]).await;
    let post = |b: Value| {
        client()
            .post(gw.url(Address::Video, "/v1/video/generations"))
            .bearer_auth("sk-demo")
            .json(&b)
            .send()
    };
    let b = json!({"model": MODEL, "input": {"prompt": "a lighthouse at dusk"},
                   "parameters": {"resolution": "720p", "duration": 8, "aspect_ratio": "16:9", "generate_audio": true}});
    let started = Instant::now();
    let v: Value = post(b).await.unwrap().json().await.unwrap();
    assert_eq!(v["data"]["taskStatus"], "PENDING");
    let id = v["data"]["taskId"].as_str().unwrap().to_owned();
    let mut seen = Vec::new();
    let url = loop {
        let r = client()
            .get(gw.url(Address::Video, &format!("/v1/tasks/{id}")))
            .bearer_auth("sk-demo")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], 100000);
        assert_eq!(v["data"]["taskId"], id.as_str());
        let status = v["data"]["taskStatus"].as_str().unwrap().to_owned();
        if seen.last() != Some(&status) {
            seen.push(status.clone());
        }
        if status == "SUCCEEDED" {
            break v["data"]["url"].as_str().unwrap().to_owned();
        }
        assert!(
            v["data"].get("url").is_none(),
            "no url before SUCCEEDED: {v}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the mock never finished: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(seen, ["PENDING", "RUNNING", "SUCCEEDED"]);
    let host = gw.running.addr(Address::Video).unwrap();
    assert!(
        url.starts_with(&format!("http://{host}/v1/files/")),
        "{url}"
    );
    let (status, headers, bytes) = download(&url).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "video/mp4");
    assert_eq!(bytes.as_ref(), MOCK_MP4);

    // The prompt can ask the mock to fail.
    let b = json!({"model": FAST, "input": {"prompt": "please FAIL this one"}, "parameters": {"generate_audio": false}});
    let v: Value = post(b).await.unwrap().json().await.unwrap();
    let id = v["data"]["taskId"].as_str().unwrap().to_owned();
    let v = loop {
        let v: Value = client()
            .post(gw.url(Address::Video, &format!("/v1/tasks/{id}")))
            .bearer_auth("sk-demo")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["data"]["taskStatus"] == "FAILED" {
            break v;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        v["data"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("asked"),
        "{v}"
    );
    assert!(v["data"].get("url").is_none());
}

#[tokio::test]
async fn native_kind_against_the_standalone_mock_over_http() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(modelgate::mock::serve_standalone(listener, Duration::ZERO));
    let gw = gateway(Kind::Native, &format!("http://{addr}")).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    let started = Instant::now();
    let url = loop {
        let a = lookup(&gw, &id).await;
        assert_eq!(a.status, 200, "{}", a.json);
        if a.task_status() == "SUCCEEDED" {
            break a.json["data"]["url"].as_str().unwrap().to_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{}", a.json);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The mock's own file address is public: handed out as it is.
    assert_eq!(url, format!("http://{addr}/v1/files/mock.mp4"));
    let (status, _, bytes) = download(&url).await;
    assert_eq!(status, 200);
    assert_eq!(bytes.as_ref(), MOCK_MP4);
    // Its validation is the gateway's own.
    let r = client()
        .post(format!("http://{addr}/v1/video/generations"))
        .json(&json!({"model": MODEL, "input": {"prompt": "x"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}
