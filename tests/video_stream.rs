//! A 50 MB video streams through the gateway, from Cloud Storage and from inline base64, with the process's memory far below the file's size.
//!
//! Alone in its test binary, so the process's peak memory (VmHWM) is this test's.
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
use bytes::Bytes;
use common::*;
use futures_util::StreamExt;
use harness::*;
use serde_json::json;

/// Raw bytes per chunk: a multiple of 3, so each chunk's base64 stands alone.
const CHUNK: usize = 48 * 1024;
const CHUNKS: usize = 1100; // 1100 × 48 KiB ≈ 51.9 MiB
const TOTAL: usize = CHUNK * CHUNKS;
/// Distinct chunk contents, cycled; the fake holds only these.
const DISTINCT: usize = 16;
/// The pause before the last chunk: a gateway that buffers delivers nothing before it ends.
const PAUSE: Duration = Duration::from_millis(1500);

fn byte_at(pos: usize) -> u8 {
    let k = (pos / CHUNK) % DISTINCT;
    ((pos % CHUNK) * 7 + k * 13) as u8
}

fn chunk(k: usize) -> Bytes {
    Bytes::from(
        (0..CHUNK)
            .map(|i| byte_at(k * CHUNK + i))
            .collect::<Vec<u8>>(),
    )
}

fn vm_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Downloads `url` and checks every byte against the pattern as it arrives, keeping none.
/// Returns how long the last 20% took to arrive after the first 80%.
async fn stream_and_check(url: &str) -> Duration {
    let resp = client().get(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "video/mp4");
    let mut stream = resp.bytes_stream();
    let mut pos = 0usize;
    let mut at_80 = None;
    while let Some(piece) = stream.next().await {
        let piece = piece.unwrap();
        // A sample of every piece (and its last byte): cheap enough that checking cannot hide a burst.
        for i in (0..piece.len())
            .step_by(61)
            .chain(piece.len().checked_sub(1))
        {
            assert_eq!(piece[i], byte_at(pos + i), "byte {}", pos + i);
        }
        pos += piece.len();
        if at_80.is_none() && pos >= TOTAL / 10 * 8 {
            at_80 = Some(Instant::now());
        }
    }
    assert_eq!(pos, TOTAL, "every byte arrived");
    at_80.unwrap().elapsed()
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_stream_through_with_memory_far_below_the_file() {
    let chunks: Vec<Bytes> = (0..DISTINCT).map(chunk).collect();
    let encoded: Vec<Bytes> = chunks
        .iter()
        .map(|c| Bytes::from(STANDARD.encode(c)))
        .collect();
    let op_head = Bytes::from(format!(
        r#"{{"name":"{VERTEX_OP}","done":true,"response":{{"videos":[{{"mimeType":"video/mp4","bytesBase64Encoded":""#
    ));
    let op_tail = Bytes::from_static(br#""}],"raiMediaFilteredCount":0}}"#);
    let up = FakeUpstream::start(move |seen| {
        let path = seen.uri.split('?').next().unwrap_or("");
        let schedule = |k: usize| {
            if k + 1 == CHUNKS {
                PAUSE
            } else {
                Duration::ZERO
            }
        };
        let asks_gcs = String::from_utf8_lossy(&seen.body).contains("gcs");
        if path.ends_with(":predictLongRunning") {
            let name = if asks_gcs {
                format!("{VERTEX_OP}-gcs")
            } else {
                VERTEX_OP.to_owned()
            };
            return Reply::json(200, json!({"name": name}));
        }
        if path.ends_with(":fetchPredictOperation") && asks_gcs {
            return Reply::json(
                200,
                json!({"name": "x", "done": true, "response": {"videos": [
                {"gcsUri": "gs://bucket/out/1/sample_0.mp4", "mimeType": "video/mp4"}]}}),
            );
        }
        if path.ends_with(":fetchPredictOperation") {
            // ~69 MB of JSON: the inline video, base64, between the operation's other fields.
            let mut out = vec![(Duration::ZERO, op_head.clone())];
            out.extend((0..CHUNKS).map(|k| (schedule(k), encoded[k % DISTINCT].clone())));
            out.push((Duration::ZERO, op_tail.clone()));
            return Reply::Stream {
                status: 200,
                content_type: "application/json",
                chunks: out,
                abort: false,
            };
        }
        if path.starts_with("/gcs/storage/v1/b/bucket/o/") {
            let out = (0..CHUNKS)
                .map(|k| (schedule(k), chunks[k % DISTINCT].clone()))
                .collect();
            return Reply::Stream {
                status: 200,
                content_type: "video/mp4",
                chunks: out,
                abort: false,
            };
        }
        Reply::json(404, json!({}))
    })
    .await;
    let toml = video_config(Kind::Vertex, &up.url(), 1)
        .replace("idle_timeout_ms = 2000", "idle_timeout_ms = 10000");
    let gw = TestGateway::start_with_env(&toml, &env("s")).await;

    // Warm up every code path once with a small task, so the measurement sees only the big files.
    let id = create(&gw, &body(MODEL)).await.task_id();
    let rss_before = vm_kib("VmRSS:");

    // 1. Inline base64: the lookup reads ~69 MB of operation JSON, the download decodes it as it streams.
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "SUCCEEDED", "{}", a.json);
    let inline_url = a.json["data"]["url"].as_str().unwrap().to_owned();
    let tail = stream_and_check(&inline_url).await;
    assert!(
        tail >= PAUSE / 2,
        "inline: the first 80% arrived only {tail:?} before the end: buffered"
    );

    // 2. A gs:// object, relayed from the storage API.
    let mut b = body(MODEL);
    b["input"]["prompt"] = json!("from gcs");
    let id = create(&gw, &b).await.task_id();
    let a = lookup(&gw, &id).await;
    assert_eq!(a.task_status(), "SUCCEEDED", "{}", a.json);
    let gcs_url = a.json["data"]["url"].as_str().unwrap().to_owned();
    let tail = stream_and_check(&gcs_url).await;
    assert!(
        tail >= PAUSE / 2,
        "gcs: the first 80% arrived only {tail:?} before the end: buffered"
    );

    let peak = vm_kib("VmHWM:");
    let grew_mib = peak.saturating_sub(rss_before) / 1024;
    let file_mib = (TOTAL / (1024 * 1024)) as u64;
    eprintln!(
        "RSS before {} MiB, peak {} MiB, grew {grew_mib} MiB for a {file_mib} MiB file",
        rss_before / 1024,
        peak / 1024
    );
    assert!(
        grew_mib < file_mib / 3,
        "peak memory grew by {grew_mib} MiB while a {file_mib} MiB file went through: something held it"
    );
}
