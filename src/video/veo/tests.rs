//! Veo mapping tests: the request field map, operation names and state mapping.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::config::Config;

/// The two Veo upstreams, built by the real config parser.
fn upstreams() -> (Arc<Upstream>, Arc<Upstream>) {
    let text = r#"
[listen]
base = "127.0.0.1:0"
video = "127.0.0.1:0"

[[upstreams]]
name = "vertex"
kind = "veo-vertex"
base_url = "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/publishers/google/models"
api_key_env = "TOKEN"

[[upstreams]]
name = "gemini"
kind = "veo-gemini"
base_url = "https://generativelanguage.googleapis.com/v1beta"
api_key_env = "TOKEN"
"#;
    let c = Config::parse(text, Path::new("."), &|_| Some("t".to_owned())).unwrap();
    (c.upstreams[0].clone(), c.upstreams[1].clone())
}

fn request(audio: bool) -> VideoRequest {
    VideoRequest {
        prompt: "a fox".into(),
        negative_prompt: Some("blur".into()),
        image: Some(Image {
            base64: "iVBORw0KGgo=".into(),
            mime_type: "image/png",
        }),
        last_frame: None,
        resolution: "1080p",
        duration: 6,
        aspect_ratio: "9:16",
        generate_audio: audio,
        person_generation: "dont_allow",
    }
}

#[test]
fn vertex_body_maps_every_field() {
    let b: Value =
        serde_json::from_slice(&body(UpstreamKind::VeoVertex, &request(false), None).unwrap())
            .unwrap();
    assert_eq!(
        b,
        json!({"instances": [{"prompt": "a fox", "image": {"bytesBase64Encoded": "iVBORw0KGgo=", "mimeType": "image/png"}}],
               "parameters": {"aspectRatio": "9:16", "durationSeconds": 6, "resolution": "1080p", "generateAudio": false,
                              "personGeneration": "dont_allow", "negativePrompt": "blur", "sampleCount": 1}})
    );
    let b: Value = serde_json::from_slice(
        &body(
            UpstreamKind::VeoVertex,
            &request(false),
            Some("gs://bucket/out/"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(b["parameters"]["storageUri"], "gs://bucket/out/");
}

#[test]
fn gemini_body_leaves_out_generate_audio_and_refuses_false() {
    let b: Value = serde_json::from_slice(
        &body(UpstreamKind::VeoGemini, &request(true), Some("gs://b/")).unwrap(),
    )
    .unwrap();
    assert!(b["parameters"].get("generateAudio").is_none());
    assert!(
        b["parameters"].get("storageUri").is_none(),
        "refused by the Gemini API"
    );
    assert_eq!(b["parameters"]["sampleCount"], 1);
    let e = body(UpstreamKind::VeoGemini, &request(false), None).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("parameters.generate_audio"));
}

#[test]
fn operation_prefixes() {
    let (vertex, gemini) = upstreams();
    assert_eq!(
        op_prefix(&vertex, "veo-3.1-generate-001").unwrap(),
        "projects/p/locations/us-central1/publishers/google/models/veo-3.1-generate-001/operations/"
    );
    assert_eq!(
        op_prefix(&gemini, "veo-x").unwrap(),
        "models/veo-x/operations/"
    );
}

#[test]
fn states_follow_e5() {
    let (vertex, gemini) = upstreams();
    let o = |u: &Upstream, v: Value| outcome(u, "m", "op", &v);
    assert_eq!(
        o(&vertex, json!({"name": "op"})).status,
        TaskStatus::Running
    );
    assert_eq!(
        o(&vertex, json!({"done": false, "metadata": {}})).status,
        TaskStatus::Running
    );
    assert_eq!(
        o(
            &vertex,
            json!({"done": true, "error": {"code": 1, "message": "cancelled by user"}})
        ),
        Outcome::ended(TaskStatus::Canceled, "cancelled by user")
    );
    assert_eq!(
        o(
            &vertex,
            json!({"done": true, "error": {"code": 3, "message": "bad image"}})
        ),
        Outcome::failed("bad image")
    );
    let filtered = o(
        &vertex,
        json!({"done": true, "response": {"raiMediaFilteredCount": 1, "raiMediaFilteredReasons": ["person"]}}),
    );
    assert_eq!(filtered.status, TaskStatus::Failed);
    assert!(filtered.error.unwrap().contains("person"));
    assert_eq!(
        o(&vertex, json!({"done": true, "response": {}})).status,
        TaskStatus::Failed
    );
    assert_eq!(
        o(
            &vertex,
            json!({"done": true, "response": {"videos": [{"gcsUri": "gs://b/p/q.mp4", "mimeType": "video/mp4"}]}})
        ),
        Outcome::succeeded(Video::Gateway(FileSource::Gcs {
            upstream: "vertex".into(),
            bucket: "b".into(),
            object: "p/q.mp4".into()
        }))
    );
    assert_eq!(
        o(
            &vertex,
            json!({"done": true, "response": {"videos": [{"bytesBase64Encoded": "", "mimeType": "video/webm"}]}})
        ),
        Outcome::succeeded(Video::Gateway(FileSource::Inline {
            upstream: "vertex".into(),
            model: "m".into(),
            reference: "op".into(),
            mime: "video/webm".into()
        }))
    );
    assert_eq!(
        o(
            &vertex,
            json!({"done": true, "response": {"videos": [{"gcsUri": "https://cdn/v.mp4"}]}})
        ),
        Outcome::succeeded(Video::Public("https://cdn/v.mp4".into()))
    );
    let g = json!({"done": true, "response": {"generateVideoResponse": {"generatedSamples": [{"video": {"uri": "https://g/files/a:download?alt=media"}}]}}});
    assert_eq!(
        o(&gemini, g),
        Outcome::succeeded(Video::Gateway(FileSource::Remote {
            upstream: "gemini".into(),
            uri: "https://g/files/a:download?alt=media".into()
        }))
    );
    let gf = json!({"done": true, "response": {"generateVideoResponse": {"raiMediaFilteredCount": 1, "raiMediaFilteredReasons": ["celebrity"]}}});
    assert!(o(&gemini, gf).error.unwrap().contains("celebrity"));
}
