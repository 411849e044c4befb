//! Requests observed to their end on the real binary with `--log-format json`: the access log line and the metrics after a JSON reply, a stream, a client that leaves mid-stream and an upstream that breaks mid-stream, with exact token counts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use modelgate::logfmt::HOLD_FOR;
use serde_json::{json, Value};

struct Served {
    child: Child,
    lines: mpsc::Receiver<String>,
    base: String,
    admin: String,
}

/// Runs the binary on `config` (written to a fresh directory) with `flags` and `RUST_LOG`; its
/// stderr lines come on the receiver.
fn spawn_gateway(config: &str, flags: &[&str], rust_log: &str) -> (Child, mpsc::Receiver<String>) {
    let dir = std::env::temp_dir().join(format!(
        "modelgate-observe-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gw.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_modelgate"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .args(flags)
        .env("RUST_LOG", rust_log)
        .env("UPSTREAM_KEY", "up-secret")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, lines)
}

impl Served {
    fn start(config: &str, flag: bool) -> Self {
        let flags: &[&str] = if flag { &["--log-format", "json"] } else { &[] };
        let (child, lines) = spawn_gateway(config, flags, "info");
        let (mut base, mut admin) = (None, None);
        while base.is_none() || admin.is_none() {
            let line = lines
                .recv_timeout(Duration::from_secs(20))
                .expect("the gateway prints its listeners");
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|_| panic!("not a JSON log line: {line}"));
            let msg = v["message"].as_str().unwrap_or("");
            if let Some(url) = msg.strip_prefix("listening on ") {
                match v["listener"].as_str() {
                    Some("base") => base = Some(url.to_owned()),
                    Some("admin") => admin = Some(url.to_owned()),
                    _ => {}
                }
            }
        }
        Self {
            child,
            lines,
            base: base.unwrap(),
            admin: admin.unwrap(),
        }
    }

    /// The next access-log line (as JSON). Polled without blocking the thread: the fake
    /// upstream runs on this test's runtime and must keep sending meanwhile.
    async fn access(&self) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.lines.try_recv() {
                Ok(line) => {
                    let v: Value = serde_json::from_str(&line).unwrap();
                    // Scrapes of /metrics are requests too; these tests follow the others.
                    if v["target"] == "modelgate::access" && v["address"] != "admin" {
                        return v;
                    }
                }
                Err(_) => {
                    assert!(std::time::Instant::now() < deadline, "no access log line");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }

    async fn metrics(&self) -> String {
        client()
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gateway_config(up: &str, json_in_file: bool) -> String {
    let log = if json_in_file {
        "[log]\nformat = \"json\"\n"
    } else {
        ""
    };
    config(
        up,
        &format!(
            r#"
{log}
[[upstreams]]
name = "up"
kind = "chat"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

[[models]]
name = "m*"
upstream = "up"
retry = {{ attempts = 1 }}
"#
        ),
    )
}

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
}

/// A chat stream of `model` at `url`, read to its first chunk and left open.
async fn stream_until_first_chunk(url: &str, model: &str) -> reqwest::Response {
    let mut body = chat_body(model);
    body["stream"] = json!(true);
    let mut resp = post(url, &body).await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    resp
}

#[tokio::test]
async fn every_request_is_logged_and_measured_at_its_end() {
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n";
    let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":21,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n";
    let up = FakeUpstream::start(move |seen| {
        let v = seen.json();
        match v["model"].as_str().unwrap_or("") {
            "m-json" => Reply::json(
                200,
                json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}}),
            ),
            "m-stream" => Reply::sse(vec![
                (Duration::ZERO, chunk),
                (Duration::from_millis(30), chunk),
                (Duration::ZERO, usage),
                (Duration::ZERO, "data: [DONE]\n\n"),
            ]),
            // Keeps sending: the gateway learns the client left at its next write.
            "m-slow" => Reply::sse(
                std::iter::repeat_n((Duration::from_millis(50), chunk), 100).collect(),
            ),
            // A stream whose connection drops after its first chunk.
            _ => Reply::Stream {
                status: 200,
                content_type: "text/event-stream",
                chunks: vec![
                    (Duration::ZERO, bytes::Bytes::from_static(chunk.as_bytes())),
                    (Duration::from_millis(50), bytes::Bytes::from_static(chunk.as_bytes())),
                ],
                abort: true,
            },
        }
    })
    .await;
    let served = Served::start(&gateway_config(&up.url(), false), true);
    let url = format!("{}/v1/chat/completions", served.base);

    let (status, _, _) = post_json(&url, chat_body("m-json")).await;
    assert_eq!(status, 200);
    let log = served.access().await;
    assert_eq!(log["outcome"], "ok");
    assert_eq!(log["status"], 200);
    assert_eq!(log["key"], "test");
    assert_eq!(log["model"], "m-json", "the name the client sent");
    assert_eq!(log["upstream"], "up");
    assert_eq!(log["attempts"], 1);
    assert_eq!(
        (
            &log["input_tokens"],
            &log["output_tokens"],
            &log["cached_tokens"]
        ),
        (&json!(11), &json!(7), &json!(3))
    );
    assert!(log["ttfb_ms"].as_f64().unwrap() > 0.0);
    assert!(log["duration_ms"].as_f64().unwrap() >= log["ttfb_ms"].as_f64().unwrap());
    assert!(log["request_id"].as_str().unwrap().starts_with("req_"));

    let mut body = chat_body("m-stream");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = post_text(&url, &body).await;
    assert!(text.ends_with("data: [DONE]\n\n"));
    let log = served.access().await;
    assert_eq!(log["outcome"], "ok");
    assert_eq!(
        (
            &log["input_tokens"],
            &log["output_tokens"],
            &log["cached_tokens"]
        ),
        (&json!(21), &json!(2), &json!(16))
    );
    // The line is written at the end: its duration covers the 30 ms pause in the stream.
    assert!(log["duration_ms"].as_f64().unwrap() >= 30.0, "{log}");
    assert!(log["ttfb_ms"].as_f64().unwrap() < log["duration_ms"].as_f64().unwrap());

    // A client that leaves mid-stream.
    let resp = stream_until_first_chunk(&url, "m-slow").await;
    // The stream is open: in flight until its last byte, well past its head.
    let during = served.metrics().await;
    assert_eq!(
        metric(&during, "modelgate_in_flight_streams"),
        Some(1.0),
        "{during}"
    );
    assert_eq!(metric(&during, "modelgate_in_flight_requests"), Some(1.0));
    drop(resp);
    let log = served.access().await;
    assert_eq!(log["outcome"], "client_cancelled", "{log}");
    assert_eq!(log["model"], "m-slow");

    // An upstream that breaks after the first byte: the in-stream error, and the outcome.
    let mut body = chat_body("m-broken");
    body["stream"] = json!(true);
    let text = post_text(&url, &body).await;
    assert!(text.contains("\"error\""), "{text}");
    let log = served.access().await;
    assert_eq!(log["outcome"], "upstream_error", "{log}");
    assert_eq!(log["status"], 200);

    // A refusal before any upstream.
    let (status, _, _) = post_json(&url, chat_body("other")).await;
    assert_eq!(status, 404);
    assert_eq!(served.access().await["outcome"], "refused");

    let text = served.metrics().await;
    let ok_json = "modelgate_requests_total{model=\"m*\",upstream=\"up\",protocol=\"chat\",status=\"200\",outcome=\"ok\"}";
    assert_eq!(metric(&text, ok_json), Some(2.0), "{text}");
    for (outcome, n) in [("client_cancelled", 1.0), ("upstream_error", 1.0)] {
        let line = format!("modelgate_requests_total{{model=\"m*\",upstream=\"up\",protocol=\"chat\",status=\"200\",outcome=\"{outcome}\"}}");
        assert_eq!(metric(&text, &line), Some(n), "{line} in {text}");
    }
    assert_eq!(
        metric(
            &text,
            "modelgate_tokens_total{model=\"m*\",key=\"test\",direction=\"input\"}"
        ),
        Some(32.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "modelgate_tokens_total{model=\"m*\",key=\"test\",direction=\"cached\"}"
        ),
        Some(19.0)
    );
    assert_eq!(
        metric(&text, "modelgate_request_duration_seconds_count{model=\"m*\",upstream=\"up\",protocol=\"chat\"}"),
        Some(4.0)
    );
    assert_eq!(
        metric(&text, "modelgate_time_to_first_byte_seconds_count{model=\"m*\",upstream=\"up\",protocol=\"chat\"}"),
        Some(4.0),
        "every one of the four sent a first byte"
    );
    // Inter-chunk gaps: the stream's 30 ms pause lands above the 16 ms bucket.
    let gaps = metric(
        &text,
        "modelgate_inter_chunk_seconds_count{model=\"m*\",upstream=\"up\"}",
    )
    .unwrap();
    assert!(gaps >= 2.0, "{text}");
    assert_eq!(
        metric(
            &text,
            "modelgate_upstream_attempts_total{upstream=\"up\",result=\"ok\"}"
        ),
        Some(4.0)
    );
    // Series are made as they are first counted: no zero lines for what never happened.
    for never in [
        "modelgate_upstream_attempts_total{upstream=\"up\",result=\"5xx\"}",
        "modelgate_request_duration_seconds_count{model=\"m*\",upstream=\"up\",protocol=\"messages\"}",
        "modelgate_requests_total{model=\"m*\",upstream=\"up\",protocol=\"responses\"",
    ] {
        assert!(!text.contains(never), "{never} in {text}");
    }
    // Everything finished (the scrape itself is counted only once its answer is made).
    assert_eq!(metric(&text, "modelgate_in_flight_streams"), Some(0.0));
    assert_eq!(metric(&text, "modelgate_in_flight_requests"), Some(0.0));
}

#[tokio::test]
async fn the_config_file_can_ask_for_json_lines() {
    let served = Served::start(&gateway_config("http://127.0.0.1:9", true), false);
    let (status, _, _) = post_json(
        &format!("{}/v1/chat/completions", served.base),
        chat_body("nope"),
    )
    .await;
    assert_eq!(status, 404);
    let log = served.access().await;
    assert_eq!(log["outcome"], "refused");
    assert_eq!(log["status"], 404);
}

/// Starts the binary with text logs (stderr a pipe, so the plain layout) and `rust_log`; the
/// lines it writes come on the receiver. Returns the child, its lines and the base URL.
fn serve_text(config: &str, rust_log: &str) -> (Child, mpsc::Receiver<String>, String) {
    let (child, lines) = spawn_gateway(config, &[], rust_log);
    let base = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the gateway prints its listeners");
        if let Some(at) = line.find("listening on http://") {
            if line.contains("listener=\"base\"") {
                let url = &line[at + "listening on ".len()..];
                break url.split(' ').next().unwrap().to_owned();
            }
        }
    };
    (child, lines, base)
}

/// The access lines among `lines` received within `wait`.
async fn text_access_lines(lines: &mpsc::Receiver<String>, wait: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + wait;
    let mut out = Vec::new();
    while std::time::Instant::now() < deadline {
        match lines.try_recv() {
            Ok(l) if l.contains(" modelgate::access: ") => out.push(l),
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    out
}

#[tokio::test]
async fn text_access_lines_have_every_field_and_follow_the_filter() {
    let up = FakeUpstream::start(|_| {
        Reply::json(
            200,
            json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}}),
        )
    })
    .await;
    let config = gateway_config(&up.url(), false);

    let (mut child, lines, base) = serve_text(&config, "info");
    let url = format!("{base}/v1/chat/completions");
    // A model name a client chose, with a quote in it: written escaped, never raw.
    let (status, _, _) = post_json(&url, chat_body("m-\"odd\"")).await;
    assert_eq!(status, 200);
    // A loop holds its lines for up to `HOLD_FOR`, then writes them even when idle.
    let found = text_access_lines(&lines, HOLD_FOR + Duration::from_secs(2)).await;
    let _ = child.kill();
    let _ = child.wait();
    let [line] = found.as_slice() else {
        panic!("one access line expected: {found:?}");
    };
    let (time, rest) = line.split_at(27);
    assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{line}");
    let rest = rest
        .strip_prefix("  INFO modelgate::access: request request_id=\"req_")
        .unwrap_or_else(|| panic!("{line}"));
    for field in [
        " address=\"base\" method=POST path=/v1/chat/completions key=\"test\"",
        " model=\"m-\\\"odd\\\"\" upstream=\"up\" attempts=1 tries=\"up 200 ",
        " status=200 outcome=\"ok\" ttfb_ms=",
        " chunks=1 input_tokens=11 output_tokens=7 cached_tokens=3",
    ] {
        assert!(rest.contains(field), "{field:?} not in {line}");
    }
    assert!(rest.ends_with("cached_tokens=3"), "{line}");

    // Turned off by the filter, the line is not written at all.
    let (mut child, lines, base) = serve_text(&config, "info,modelgate::access=off");
    let (status, _, _) = post_json(&format!("{base}/v1/chat/completions"), chat_body("m")).await;
    assert_eq!(status, 200);
    let found = text_access_lines(&lines, HOLD_FOR + Duration::from_secs(1)).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(found.is_empty(), "{found:?}");

    // A gateway told to stop (SIGINT, as Ctrl-C) writes the lines its loops still hold.
    let (mut child, lines, base) = serve_text(&config, "info");
    for model in ["m-first", "m-second"] {
        let (status, _, _) =
            post_json(&format!("{base}/v1/chat/completions"), chat_body(model)).await;
        assert_eq!(status, 200);
    }
    let stopped = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert!(child.wait().unwrap().success());
    // Everything it wrote, up to the pipe's end.
    let mut found = Vec::new();
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(20)) {
        if l.contains(" modelgate::access: ") {
            found.push(l);
        }
    }
    // Each loop writes its own lines, so two requests served by two loops may come in either
    // order (each line has its time).
    assert_eq!(found.len(), 2, "{found:?}");
    for model in ["m-first", "m-second"] {
        let model = format!("model=\"{model}\"");
        assert!(found.iter().any(|l| l.contains(&model)), "{found:?}");
    }
}

#[tokio::test]
async fn a_translated_reply_counts_the_usage_its_upstream_reported() {
    let usage = json!({"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}});
    let up = FakeUpstream::start(move |seen| {
        let v = seen.json();
        let choices = match v["model"].as_str().unwrap_or("") {
            // No choice: the reply cannot be translated, and its usage still counts.
            "m-empty" => json!([]),
            _ => json!([{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]),
        };
        Reply::json(
            200,
            json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": choices, "usage": usage}),
        )
    })
    .await;
    let served = Served::start(&gateway_config(&up.url(), false), true);
    let url = format!("{}/v1/messages", served.base);
    for (model, status) in [("m-json", 200), ("m-empty", 502)] {
        let body = json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
        let (got, _, reply) = post_json(&url, body).await;
        assert_eq!(got, status, "{reply}");
        if status == 200 {
            // What the client reads is the same usage, in its protocol's words.
            assert_eq!(reply["usage"]["input_tokens"], 8, "{reply}");
            assert_eq!(reply["usage"]["cache_read_input_tokens"], 3, "{reply}");
            assert_eq!(reply["usage"]["output_tokens"], 7, "{reply}");
        }
        let log = served.access().await;
        assert_eq!(log["model"], model);
        assert_eq!(
            (
                &log["input_tokens"],
                &log["output_tokens"],
                &log["cached_tokens"]
            ),
            (&json!(11), &json!(7), &json!(3)),
            "{log}"
        );
    }
    let text = served.metrics().await;
    assert_eq!(
        metric(
            &text,
            "modelgate_tokens_total{model=\"m*\",key=\"test\",direction=\"output\"}"
        ),
        Some(14.0),
        "{text}"
    );
}

/// The observe config with a messages upstream beside the chat one: `c*` goes to it.
fn two_kinds_config(up: &str) -> String {
    config(
        up,
        r#"
[[upstreams]]
name = "up"
kind = "chat"
base_url = "{UPSTREAM}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "anth"
kind = "messages"
base_url = "{UPSTREAM}/v1"
api_key_env = "UPSTREAM_KEY"

[[models]]
name = "m*"
upstream = "up"
retry = { attempts = 1 }

[[models]]
name = "c*"
upstream = "anth"
retry = { attempts = 1 }
"#,
    )
}

#[tokio::test]
async fn a_translated_stream_counts_the_usage_its_upstream_reported() {
    let chunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n";
    let stop = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    let usage = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":21,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n";
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":16,\"output_tokens\":1}}}\n\n";
    let block = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n";
    let end = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let up = FakeUpstream::start(move |seen| {
        let v = seen.json();
        let z = Duration::ZERO;
        match v["model"].as_str().unwrap_or("") {
            "m-stream" => Reply::sse(vec![
                (z, chunk),
                (Duration::from_millis(20), stop),
                (z, usage),
                (z, "data: [DONE]\n\n"),
            ]),
            // The stream is over for the client at `[DONE]`; the upstream's body ends later.
            "m-late-end" => Reply::sse(vec![
                (z, chunk),
                (z, stop),
                (z, usage),
                (z, "data: [DONE]\n\n"),
                (Duration::from_millis(400), ": done\n\n"),
            ]),
            "c-stream" => Reply::sse(vec![
                (z, start),
                (z, block),
                (Duration::from_millis(20), delta),
                (z, end),
            ]),
            // Keeps sending: the client leaves after the first event, the prompt's tokens
            // already reported.
            _ => Reply::sse(
                std::iter::once((z, start))
                    .chain(std::iter::once((z, block)))
                    .chain(std::iter::repeat_n((Duration::from_millis(50), delta), 100))
                    .collect(),
            ),
        }
    })
    .await;
    let served = Served::start(&two_kinds_config(&up.url()), true);
    let tokens = |log: &Value| {
        (
            log["input_tokens"].as_u64(),
            log["output_tokens"].as_u64(),
            log["cached_tokens"].as_u64(),
        )
    };

    // A chat upstream's stream to a messages client and to a Responses client.
    for (path, model) in [
        ("/v1/messages", "m-stream"),
        ("/v1/responses", "m-stream"),
        ("/v1/messages", "m-late-end"),
    ] {
        let body = if path == "/v1/messages" {
            json!({"model": model, "max_tokens": 16, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
        } else {
            json!({"model": model, "stream": true, "input": "hi"})
        };
        let text = post_text(&format!("{}{path}", served.base), &body).await;
        let last = if path == "/v1/messages" {
            "event: message_stop"
        } else {
            "event: response.completed"
        };
        assert!(text.contains(last), "{path} {model}: {text}");
        let log = served.access().await;
        assert_eq!(log["model"], model, "{log}");
        assert_eq!(log["outcome"], "ok", "{log}");
        assert_eq!(
            tokens(&log),
            (Some(21), Some(2), Some(16)),
            "{path} {model}: {log}"
        );
    }

    // A messages upstream's stream to a chat client: the prompt's counts from `message_start`,
    // the output's from `message_delta`.
    let url = format!("{}/v1/chat/completions", served.base);
    let mut body = chat_body("c-stream");
    body["stream"] = json!(true);
    let text = post_text(&url, &body).await;
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let log = served.access().await;
    assert_eq!(log["outcome"], "ok", "{log}");
    assert_eq!(tokens(&log), (Some(21), Some(9), Some(16)), "{log}");

    // A client that leaves: charged what the upstream had reported by then.
    drop(stream_until_first_chunk(&url, "c-slow").await);
    let log = served.access().await;
    assert_eq!(log["outcome"], "client_cancelled", "{log}");
    assert_eq!(tokens(&log), (Some(21), Some(1), Some(16)), "{log}");

    let text = served.metrics().await;
    assert_eq!(
        metric(
            &text,
            "modelgate_tokens_total{model=\"m*\",key=\"test\",direction=\"input\"}"
        ),
        Some(63.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "modelgate_tokens_total{model=\"c*\",key=\"test\",direction=\"output\"}"
        ),
        Some(10.0),
        "{text}"
    );
}
