//! Video tasks against fake native, Vertex and Gemini upstreams: every state, downloads, statelessness, id checks, the lookup cache.
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

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use common::*;
use harness::*;
use modelgate::config::Address;
use serde_json::{json, Value};

/// Lets a 1 ms status cache entry lapse before the next lookup.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

fn is_poll(path: &str) -> bool {
    path.starts_with("/v1/tasks/")
        || path.ends_with(":fetchPredictOperation")
        || path.contains("/operations/")
}

#[tokio::test]
async fn native_task_passes_through_every_state_with_its_url() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Native, &up.url()).await;
    let mut b = body(MODEL);
    b["vendor_extra"] = json!({"kept": true});
    let created = create(&gw, &b).await;
    assert_eq!(created.task_status(), "PENDING");
    let id = created.task_id();
    let sent = up.last();
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.uri, "/v1/video/generations");
    assert_eq!(sent.headers["authorization"], "Bearer up-secret");
    assert_eq!(sent.json(), b, "the body passes through untouched");
    assert!(
        !id.contains("up-1"),
        "the upstream's id is wrapped, not shown"
    );

    for status in ["PENDING", "RUNNING", "SUSPENDED", "RUNNING"] {
        script.native(json!({"taskId": "up-1", "taskStatus": status}));
        tick().await;
        let a = lookup(&gw, &id).await;
        assert_eq!(a.status, 200, "{}", a.json);
        assert_eq!(a.json["data"], json!({"taskId": id, "taskStatus": status}));
        assert_eq!(a.headers["taskstatus"], status);
    }
    script.native(
        json!({"taskId": "up-1", "taskStatus": "SUCCEEDED", "url": "https://cdn.example/v.mp4"}),
    );
    tick().await;
    let a = lookup(&gw, &id).await;
    assert_eq!(
        a.json,
        json!({"code": 100000, "msg": "SUCCESS",
               "data": {"taskId": id, "taskStatus": "SUCCEEDED", "url": "https://cdn.example/v.mp4"}})
    );
    let poll = up.last();
    assert_eq!(
        (poll.method.as_str(), poll.uri.as_str()),
        ("GET", "/v1/tasks/up-1")
    );
    assert_eq!(poll.headers["authorization"], "Bearer up-secret");
    assert!(poll.headers.get("x-request-id").is_some());
}

#[tokio::test]
async fn native_failed_canceled_and_forgotten_tasks() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Native, &up.url()).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    script.native(json!({"taskStatus": "FAILED", "error": {"message": "quota exhausted"}}));
    let a = lookup(&gw, &id).await;
    assert_eq!(
        a.json["data"],
        json!({"taskId": id, "taskStatus": "FAILED", "error": {"message": "quota exhausted"}})
    );

    let id = create(&gw, &body(FAST)).await.task_id();
    script.native(json!({"taskStatus": "CANCELED"}));
    assert_eq!(lookup(&gw, &id).await.task_status(), "CANCELED");

    let id = create(&gw, &body(FAST)).await.task_id();
    script.fail_with(Some((
        404,
        json!({"code": 100404, "msg": "NOT_FOUND: no such task", "data": null}),
    )));
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "FAILED");
    assert!(a.json["data"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no longer knows"));
}

fn done_with(video: Value) -> Value {
    json!({"name": VERTEX_OP, "done": true,
           "response": {"@type": "type.googleapis.com/cloud.ai.large_models.vision.GenerateVideoResponse",
                        "raiMediaFilteredCount": 0, "videos": [video]}})
}

#[tokio::test]
async fn vertex_task_runs_to_a_gcs_video_streamed_through_the_gateway() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Vertex, &up.url()).await;
    let mut b = body(MODEL);
    b["input"]["negative_prompt"] = json!("blurry");
    b["input"]["image"] = json!({"bytesBase64Encoded": STANDARD.encode(b"\x89PNG\r\n\x1a\n0000"), "mimeType": "image/png"});
    b["input"]["last_frame"] = json!({"bytesBase64Encoded": STANDARD.encode(b"\xff\xd8\xff\xe0"), "mimeType": "image/jpeg"});
    b["parameters"] = json!({"resolution": "1080p", "duration": 4, "aspect_ratio": "9:16",
                             "generate_audio": false, "person_generation": "dont_allow"});
    let id = create(&gw, &b).await.task_id();
    let start = up.last();
    assert_eq!(
        start.uri,
        "/v1/projects/p/locations/us-central1/publishers/google/models/veo-3.1-generate-001:predictLongRunning"
    );
    assert_eq!(start.headers["authorization"], "Bearer vertex-token");
    assert_eq!(
        start.json(),
        json!({"instances": [{"prompt": "a red fox running through snow",
                              "image": b["input"]["image"], "lastFrame": b["input"]["last_frame"]}],
               "parameters": {"aspectRatio": "9:16", "durationSeconds": 4, "resolution": "1080p",
                              "generateAudio": false, "personGeneration": "dont_allow",
                              "negativePrompt": "blurry", "sampleCount": 1}})
    );
    assert!(
        id.len() < 100,
        "the operation name is not spelled out in the id: {id}"
    );

    script.operation(json!({"name": VERTEX_OP, "done": false, "metadata": {"progress": 10}}));
    assert_eq!(lookup(&gw, &id).await.task_status(), "RUNNING");
    let poll = up.last();
    assert_eq!(
        poll.uri,
        "/v1/projects/p/locations/us-central1/publishers/google/models/veo-3.1-generate-001:fetchPredictOperation"
    );
    assert_eq!(poll.json(), json!({"operationName": VERTEX_OP}));
    assert_eq!(poll.headers["authorization"], "Bearer vertex-token");

    script.operation(done_with(
        json!({"gcsUri": "gs://bucket/out/1/sample_0.mp4", "mimeType": "video/mp4"}),
    ));
    tick().await;
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "SUCCEEDED", "{}", a.json);
    let url = a.json["data"]["url"].as_str().unwrap();
    let host = gw.running.addr(Address::Video).unwrap();
    assert!(
        url.starts_with(&format!("http://{host}/v1/files/")),
        "{url}"
    );
    assert!(!url.contains("bucket"), "the bucket is not exposed: {url}");
    let (status, headers, bytes) = download(url).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "video/mp4");
    assert!(bytes == script.file, "the file arrives intact");
    let fetch = up.last();
    assert_eq!(
        fetch.uri,
        "/gcs/storage/v1/b/bucket/o/out%2F1%2Fsample_0.mp4?alt=media"
    );
    assert_eq!(fetch.headers["authorization"], "Bearer vertex-token");
}

#[tokio::test]
async fn vertex_inline_video_is_decoded_for_the_download() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Vertex, &up.url()).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    script.operation(done_with(
        json!({"bytesBase64Encoded": STANDARD.encode(&script.file), "mimeType": "video/mp4"}),
    ));
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "SUCCEEDED");
    let (status, headers, bytes) = download(a.json["data"]["url"].as_str().unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "video/mp4");
    assert!(bytes == script.file);
    // The operation went away upstream: the link answers 404, not a broken body.
    script.fail_with(Some((
        404,
        json!({"error": {"code": 404, "message": "operation not found"}}),
    )));
    let (status, _, body) = download(a.json["data"]["url"].as_str().unwrap()).await;
    assert_eq!(status, 404);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["code"], 100404);
}

#[tokio::test]
async fn vertex_failed_filtered_and_canceled() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Vertex, &up.url()).await;
    let cases = [
        (
            json!({"done": true, "error": {"code": 3, "message": "The image is not supported"}}),
            "FAILED",
            "The image is not supported",
        ),
        (
            json!({"done": true, "error": {"code": 1, "message": "Operation cancelled"}}),
            "CANCELED",
            "Operation cancelled",
        ),
        (
            json!({"done": true, "response": {"raiMediaFilteredCount": 1,
                   "raiMediaFilteredReasons": ["Unable to show generated videos that contain children."]}}),
            "FAILED",
            "contain children",
        ),
        (
            json!({"done": true, "response": {"videos": []}}),
            "FAILED",
            "without a video",
        ),
    ];
    for (op, status, message) in cases {
        let id = create(&gw, &body(MODEL)).await.task_id();
        script.operation(op);
        tick().await;
        let a = lookup(&gw, &id).await;
        assert_eq!(a.task_status(), status, "{}", a.json);
        let got = a.json["data"]["error"]["message"].as_str().unwrap();
        assert!(got.contains(message), "{got}");
        assert!(a.json["data"].get("url").is_none());
    }
    let id = create(&gw, &body(MODEL)).await.task_id();
    script.fail_with(Some((
        404,
        json!({"error": {"code": 404, "message": "Operation not found"}}),
    )));
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "FAILED");
}

#[tokio::test]
async fn gemini_task_uses_the_api_key_and_proxies_the_file_uri() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Gemini, &up.url()).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    let start = up.last();
    assert_eq!(
        start.uri,
        "/v1beta/models/veo-3.1-generate-001:predictLongRunning"
    );
    assert_eq!(start.headers["x-goog-api-key"], "gemini-key");
    assert!(start.headers.get("authorization").is_none());
    let sent = start.json();
    assert!(
        sent["parameters"].get("generateAudio").is_none(),
        "refused by the Gemini API: {sent}"
    );
    assert_eq!(sent["parameters"]["sampleCount"], 1);

    script.operation(json!({"name": GEMINI_OP}));
    assert_eq!(lookup(&gw, &id).await.task_status(), "RUNNING");
    let poll = up.last();
    assert_eq!(
        (poll.method.as_str(), poll.uri.as_str()),
        ("GET", "/v1beta/models/veo-3.1-generate-001/operations/g-1")
    );
    assert_eq!(poll.headers["x-goog-api-key"], "gemini-key");

    let file_uri = format!("{}/v1beta/files/abc:download?alt=media", up.url());
    script.operation(
        json!({"name": GEMINI_OP, "done": true, "response": {"@type": "x",
        "generateVideoResponse": {"generatedSamples": [{"video": {"uri": file_uri}}]}}}),
    );
    tick().await;
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "SUCCEEDED");
    let url = a.json["data"]["url"].as_str().unwrap();
    assert!(!url.contains("abc") && !url.contains("gemini-key"), "{url}");
    let (status, _, bytes) = download(url).await;
    assert_eq!(status, 200);
    assert!(bytes == script.file);
    let hops: Vec<Seen> = up.seen().into_iter().rev().take(2).collect();
    assert_eq!(hops[1].uri, "/v1beta/files/abc:download?alt=media");
    assert_eq!(hops[1].headers["x-goog-api-key"], "gemini-key");
    assert_eq!(
        hops[0].uri, "/signed/abc?sig=1",
        "the redirect was followed"
    );

    // Filtered on Gemini: the reasons sit inside generateVideoResponse.
    let id = create(&gw, &body(FAST)).await.task_id();
    script.operation(json!({"done": true, "response": {"generateVideoResponse":
        {"raiMediaFilteredCount": 1, "raiMediaFilteredReasons": ["celebrity likeness"]}}}));
    tick().await;
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "FAILED");
    assert!(a.json["data"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("celebrity likeness"));
}

#[tokio::test]
async fn gemini_cannot_turn_audio_off() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Gemini, &up.url()).await;
    let mut b = body(MODEL);
    b["parameters"]["generate_audio"] = json!(false);
    let msg = create(&gw, &b).await.error(400);
    assert!(msg.contains("parameters.generate_audio"), "{msg}");
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn upstream_errors_keep_their_status_and_retry_after() {
    let script = Script::new();
    let up = fake(&script).await;
    for kind in [Kind::Native, Kind::Vertex, Kind::Gemini] {
        let gw = gateway(kind, &up.url()).await;
        script.fail_with(Some((
            429,
            json!({"error": {"code": 429, "message": "Quota exceeded"}}),
        )));
        let a = create(&gw, &body(MODEL)).await;
        let msg = a.error(429);
        assert!(
            msg.starts_with("RATE_LIMITED: ") && msg.contains("Quota exceeded"),
            "{msg}"
        );
        assert_eq!(a.headers["retry-after"], "7");
        script.fail_with(Some((
            400,
            json!({"error": {"code": 400, "message": "prompt rejected"}}),
        )));
        assert!(create(&gw, &body(MODEL))
            .await
            .error(400)
            .contains("prompt rejected"));
        script.fail_with(Some((
            500,
            json!({"error": {"code": 500, "message": "internal"}}),
        )));
        create(&gw, &body(MODEL)).await.error(502);
        script.fail_with(None);
        let id = create(&gw, &body(MODEL)).await.task_id();
        script.fail_with(Some((
            503,
            json!({"error": {"code": 503, "message": "unavailable"}}),
        )));
        tick().await;
        lookup(&gw, &id).await.error(502);
        script.fail_with(None);
    }
    // An upstream that cannot be reached: 502.
    let gw = gateway(Kind::Vertex, "http://127.0.0.1:9").await;
    let msg = create(&gw, &body(MODEL)).await.error(502);
    assert!(msg.starts_with("UPSTREAM_ERROR: "), "{msg}");
}

#[tokio::test]
async fn a_restarted_gateway_still_answers() {
    let script = Script::new();
    let up = fake(&script).await;
    let toml = video_config(Kind::Native, &up.url(), 1);
    let first = TestGateway::start_with_env(&toml, &env("s1")).await;
    let id = create(&first, &body(MODEL)).await.task_id();
    first.running.shutdown(Duration::from_secs(1)).await;
    script.native(json!({"taskStatus": "SUCCEEDED", "url": "https://cdn.example/v.mp4"}));
    let second = TestGateway::start_with_env(&toml, &env("s1")).await;
    let a = lookup(&second, &id).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["data"]["url"], "https://cdn.example/v.mp4");
}

#[tokio::test]
async fn a_rotated_secret_still_verifies_old_ids() {
    let script = Script::new();
    let up = fake(&script).await;
    let toml = video_config(Kind::Native, &up.url(), 1);
    let old = TestGateway::start_with_env(&toml, &env("old-secret")).await;
    let id = create(&old, &body(MODEL)).await.task_id();
    let rotated = TestGateway::start_with_env(&toml, &env("new-secret, old-secret")).await;
    assert_eq!(lookup(&rotated, &id).await.status, 200);
    let fresh = create(&rotated, &body(MODEL)).await.task_id();
    // The first secret signs: the new id verifies without the old secret, the old one does not.
    let new_only = TestGateway::start_with_env(&toml, &env("new-secret")).await;
    assert_eq!(lookup(&new_only, &fresh).await.status, 200);
    new_only_404(&new_only, &id).await;
}

async fn new_only_404(gw: &TestGateway, id: &str) {
    let msg = lookup(gw, id).await.error(404);
    assert_eq!(
        msg,
        "NOT_FOUND: no such task (or it belongs to another API key)"
    );
}

#[tokio::test]
async fn foreign_forged_and_mangled_ids_get_the_same_404() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Native, &up.url()).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    let polls_before = count(&up, is_poll);
    let expected = lookup_with(&gw, "AAAA", Some(KEY), false).await;
    assert_eq!(expected.status, 404);
    let mut mangled = vec![
        id[..id.len() - 1].to_owned(),
        id[1..].to_owned(),
        format!("{id}A"),
        id.chars().rev().collect(),
        "x".repeat(40),
        "not+base64/=".to_owned(),
    ];
    for i in [0, id.len() / 2, id.len() - 1] {
        let mut b = id.clone().into_bytes();
        b[i] = if b[i] == b'A' { b'B' } else { b'A' };
        mangled.push(String::from_utf8(b).unwrap());
    }
    for bad in &mangled {
        let a = lookup_with(&gw, bad, Some(KEY), false).await;
        assert_eq!(a.status, 404, "{bad}");
        assert_eq!(a.json, expected.json, "{bad}");
    }
    // Another key's lookup of a real task: the same answer, by GET and by POST.
    for post in [false, true] {
        let a = lookup_with(&gw, &id, Some(OTHER_KEY), post).await;
        assert_eq!((a.status, &a.json), (404, &expected.json));
    }
    assert_eq!(
        count(&up, is_poll),
        polls_before,
        "no probe reached the upstream"
    );
    assert_eq!(lookup(&gw, &id).await.status, 200, "the owner still can");
}

#[tokio::test]
async fn get_and_post_lookups_agree() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw = gateway(Kind::Vertex, &up.url()).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    script.operation(json!({"name": VERTEX_OP, "done": false}));
    let get = lookup_with(&gw, &id, Some(KEY), false).await;
    let post = lookup_with(&gw, &id, Some(KEY), true).await;
    assert_eq!((get.status, &get.json), (post.status, &post.json));
    script.operation(done_with(
        json!({"gcsUri": "gs://bucket/out/1/sample_0.mp4"}),
    ));
    tick().await;
    let get = lookup_with(&gw, &id, Some(KEY), false).await;
    let post = lookup_with(&gw, &id, Some(KEY), true).await;
    assert_eq!(get.task_status(), "SUCCEEDED");
    assert_eq!(get.json["data"]["taskId"], post.json["data"]["taskId"]);
    assert_eq!(
        get.json["data"]["taskStatus"],
        post.json["data"]["taskStatus"]
    );
    for a in [get, post] {
        let (status, _, bytes) = download(a.json["data"]["url"].as_str().unwrap()).await;
        assert_eq!(status, 200);
        assert!(bytes == script.file);
    }
}

#[tokio::test]
async fn fifty_concurrent_lookups_make_one_upstream_call() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw =
        TestGateway::start_with_env(&video_config(Kind::Vertex, &up.url(), 1000), &env("s")).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    script.operation(json!({"name": VERTEX_OP, "done": false}));
    *script.poll_delay.lock().unwrap() = Duration::from_millis(500);
    let lookups = (0..50).map(|i| lookup_with(&gw, &id, Some(KEY), i % 2 == 0));
    let answers = futures_util::future::join_all(lookups).await;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.json);
        assert_eq!(a.task_status(), "RUNNING");
    }
    assert_eq!(count(&up, |p| p.ends_with(":fetchPredictOperation")), 1);
}

#[tokio::test]
async fn unfinished_status_is_reused_briefly_and_a_finished_answer_kept() {
    let script = Script::new();
    let up = fake(&script).await;
    let gw =
        TestGateway::start_with_env(&video_config(Kind::Native, &up.url(), 300), &env("s")).await;
    let polls = || count(&up, |p| p.starts_with("/v1/tasks/"));
    let id = create(&gw, &body(MODEL)).await.task_id();
    script.native(json!({"taskStatus": "RUNNING"}));
    lookup(&gw, &id).await;
    lookup(&gw, &id).await;
    assert_eq!(polls(), 1, "reused within status_cache_ms");
    script.native(json!({"taskStatus": "SUCCEEDED", "url": "https://cdn.example/v.mp4"}));
    assert_eq!(
        lookup(&gw, &id).await.task_status(),
        "RUNNING",
        "still the cached status"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(lookup(&gw, &id).await.task_status(), "SUCCEEDED");
    assert_eq!(polls(), 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..3 {
        assert_eq!(lookup(&gw, &id).await.task_status(), "SUCCEEDED");
    }
    assert_eq!(polls(), 2, "a finished task is not polled again");
}

#[tokio::test]
async fn download_ids_are_signed_and_expire() {
    let script = Script::new();
    let up = fake(&script).await;
    let toml = video_config(Kind::Vertex, &up.url(), 1)
        .replace("[video]\n", "[video]\nfile_url_ttl_s = 1\n");
    let gw = TestGateway::start_with_env(&toml, &env("s")).await;
    let id = create(&gw, &body(MODEL)).await.task_id();
    script.operation(done_with(
        json!({"gcsUri": "gs://bucket/out/1/sample_0.mp4"}),
    ));
    let url = lookup(&gw, &id).await.json["data"]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _, _) = download(&url).await;
    assert_eq!(status, 200);
    let (base, file_id) = url.rsplit_once('/').unwrap();
    let mut altered = file_id.to_owned().into_bytes();
    altered[3] = if altered[3] == b'A' { b'B' } else { b'A' };
    let (status, _, body) =
        download(&format!("{base}/{}", String::from_utf8(altered).unwrap())).await;
    assert_eq!(status, 404);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["msg"], "NOT_FOUND: no such file");
    // A task id is not a download id.
    assert_eq!(download(&format!("{base}/{id}")).await.0, 404);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, _, body) = download(&url).await;
    assert_eq!(status, 404);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(v["msg"].as_str().unwrap().contains("expired"), "{v}");
}

#[tokio::test]
async fn public_url_setting_shapes_file_urls() {
    let script = Script::new();
    let up = fake(&script).await;
    let toml = video_config(Kind::Mock, &up.url(), 1).replace(
        "[video]\n",
        "[video]\npublic_url = \"https://video.example.com/gw/\"\n",
    );
    let gw = TestGateway::start_with_env(&toml, &env("s")).await;
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
    assert!(
        url.starts_with("https://video.example.com/gw/v1/files/"),
        "{url}"
    );
}
