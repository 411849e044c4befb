//! Hostile-input harness shared by `tests/properties.rs` and the fuzz targets (`fuzz/`, which include this file): the models requests are checked against, the golden fixtures as seeds and dictionary, a reference SSE decoder, and the invariants every run asserts.
//!
//! A broken invariant panics: in a property that fails the test with the input, under libFuzzer
//! it is recorded as a crash with its input.
#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test harness: a broken invariant must fail loudly, with the input"
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use modelgate::config::{Config, Model, Protocol};
use modelgate::error::ErrorKind;
use modelgate::json::RawObject;
use modelgate::plan::{Plan, Reply};
use modelgate::sse::{SseDecoder, SseEvent};
use modelgate::translate::{self, StreamTranslator, Translation};
use modelgate::validate;
use serde_json::Value;

pub const PROTOCOLS: [Protocol; 3] = [Protocol::Chat, Protocol::Messages, Protocol::Responses];

// ---------------------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------------------

/// Models as the golden fixtures configure them, one per upstream protocol (in `PROTOCOLS`
/// order), plus one with no thinking mode, so the validators' refusals are reached too.
pub fn models() -> &'static [Arc<Model>] {
    static MODELS: OnceLock<Vec<Arc<Model>>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let text = r#"
[listen]
base = "127.0.0.1:0"
[[upstreams]]
name = "c"
kind = "chat"
base_url = "http://127.0.0.1:1/v1"
[[upstreams]]
name = "m"
kind = "messages"
base_url = "http://127.0.0.1:1/v1"
[[upstreams]]
name = "r"
kind = "responses"
base_url = "http://127.0.0.1:1/v1"
[[models]]
name = "to-chat"
upstream = "c"
upstream_model = "upstream-model"
vision = true
thinking = "chat_template_kwargs"
[[models]]
name = "to-messages"
upstream = "m"
vision = true
default_max_tokens = 1024
thinking = "anthropic"
[[models]]
name = "to-responses"
upstream = "r"
vision = true
[[models]]
name = "plain"
upstream = "c"
"#;
        Config::parse(text, Path::new("."), &|_| Some("k".into()))
            .expect("the fuzz config parses")
            .models
    })
}

pub fn model_for(upstream: Protocol) -> &'static Model {
    &models()[upstream as usize]
}

// ---------------------------------------------------------------------------------------------
// Fixtures: seeds and dictionary
// ---------------------------------------------------------------------------------------------

/// An event stream as its events: (event name, data).
pub type Events = Vec<(Option<String>, String)>;

/// The golden fixtures, read once.
pub struct Fixtures {
    /// Client request bodies, by client protocol.
    pub requests: Vec<(Protocol, Value)>,
    /// Upstream event streams, by upstream protocol, as (event name, data) pairs.
    pub streams: Vec<(Protocol, Events)>,
    /// Every object key and every short string value the fixtures use.
    pub words: Vec<String>,
    /// Every event name of the upstream streams.
    pub event_names: Vec<String>,
}

/// The golden fixtures, from the gateway's tests or from `fuzz/` beside them.
pub fn fixture_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let own = here.join("tests/fixtures");
    if own.is_dir() {
        own
    } else {
        here.join("../tests/fixtures")
    }
}

fn protocol_named(name: &str) -> Option<Protocol> {
    PROTOCOLS.into_iter().find(|p| p.name() == name)
}

fn collect_words(v: &Value, words: &mut BTreeSet<String>) {
    match v {
        Value::String(s) if s.len() <= 40 => {
            words.insert(s.clone());
        }
        Value::Array(a) => a.iter().for_each(|x| collect_words(x, words)),
        Value::Object(o) => {
            for (k, x) in o {
                words.insert(k.clone());
                collect_words(x, words);
            }
        }
        _ => {}
    }
}

pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let mut requests = Vec::new();
        let mut streams = Vec::new();
        let mut words = BTreeSet::new();
        let mut event_names = BTreeSet::new();
        let mut pairs: Vec<PathBuf> = std::fs::read_dir(fixture_root())
            .expect("tests/fixtures exists")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        pairs.sort();
        for pair in pairs {
            let name = pair.file_name().unwrap().to_string_lossy().into_owned();
            let Some((client, upstream)) = name.split_once("_to_") else {
                continue;
            };
            let (Some(client), Some(upstream)) = (protocol_named(client), protocol_named(upstream))
            else {
                continue;
            };
            let mut cases: Vec<PathBuf> = std::fs::read_dir(&pair)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            cases.sort();
            for case in cases {
                for file in [
                    "upstream_request.json",
                    "upstream_reply.json",
                    "client_reply.json",
                ] {
                    if let Ok(text) = std::fs::read_to_string(case.join(file)) {
                        if let Ok(v) = serde_json::from_str::<Value>(&text) {
                            collect_words(&v, &mut words);
                        }
                    }
                }
                if let Ok(text) = std::fs::read_to_string(case.join("client_request.json")) {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    collect_words(&v, &mut words);
                    requests.push((client, v));
                }
                if let Ok(text) = std::fs::read(case.join("upstream_reply.sse")) {
                    let mut events = Vec::new();
                    let mut d = SseDecoder::new();
                    d.feed(&text, &mut events)
                        .expect("a decoder without a limit never refuses");
                    d.finish(&mut events);
                    let mut parsed = Vec::new();
                    for ev in events {
                        if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                            collect_words(&v, &mut words);
                        }
                        if let Some(name) = &ev.event {
                            event_names.insert(name.clone());
                        }
                        parsed.push((ev.event, ev.data));
                    }
                    streams.push((upstream, parsed));
                }
            }
        }
        Fixtures {
            requests,
            streams,
            words: words.into_iter().collect(),
            event_names: event_names.into_iter().collect(),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// SSE: a reference decoder
// ---------------------------------------------------------------------------------------------

/// The WHATWG event-stream rules written as plainly as possible (whole input at once), to
/// compare the incremental decoder against.
pub fn reference_decode(bytes: &[u8]) -> Vec<SseEvent> {
    let mut lines: Vec<&[u8]> = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => {
                lines.push(&bytes[start..i]);
                i += 1;
                start = i;
            }
            b'\r' => {
                lines.push(&bytes[start..i]);
                i += 1;
                if bytes.get(i) == Some(&b'\n') {
                    i += 1;
                }
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < bytes.len() {
        lines.push(&bytes[start..]);
    }
    let mut out = Vec::new();
    let (mut event, mut data, mut has_data) = (None::<String>, String::new(), false);
    let mut dispatch = |event: &mut Option<String>, data: &mut String, has_data: &mut bool| {
        if *has_data {
            out.push(SseEvent {
                event: event.take(),
                data: std::mem::take(data),
            });
        }
        *event = None;
        *has_data = false;
    };
    for line in lines {
        if line.is_empty() {
            dispatch(&mut event, &mut data, &mut has_data);
            continue;
        }
        if line[0] == b':' {
            continue;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                if has_data {
                    data.push('\n');
                }
                data.push_str(&value);
                has_data = true;
            }
            b"event" => event = Some(value.into_owned()),
            _ => {}
        }
    }
    dispatch(&mut event, &mut data, &mut has_data);
    out
}

/// Feeds `bytes` to a fresh decoder in pieces whose lengths cycle through `cuts` (a 0 feeds an
/// empty piece), then finishes it.
pub fn decode_in_pieces(bytes: &[u8], cuts: &[u8]) -> Vec<SseEvent> {
    let mut d = SseDecoder::new();
    let mut out = Vec::new();
    let mut rest = bytes;
    let mut i = 0;
    while !rest.is_empty() {
        let n = if cuts.is_empty() {
            rest.len()
        } else {
            usize::from(cuts[i % cuts.len()]).min(rest.len())
        };
        i += 1;
        d.feed(&rest[..n], &mut out)
            .expect("a decoder without a limit never refuses");
        rest = &rest[n..];
        if i > 4 * bytes.len() + 16 {
            // Only zero-length pieces are left in the cycle: feed the rest at once.
            d.feed(rest, &mut out)
                .expect("a decoder without a limit never refuses");
            break;
        }
    }
    d.finish(&mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// A refusal must be the client's fault (4xx), never an internal error: the request decoders
/// and encoders have no failure of their own.
fn check_refusal(what: &str, e: &modelgate::error::GatewayError) {
    assert!(
        e.kind != ErrorKind::Internal && e.status().is_client_error(),
        "{what}: not a clean refusal: {:?} {} ({:?})",
        e.kind,
        e.message,
        e.param
    );
}

/// A written upstream body must be one JSON object. Read as raw values, not a `Value` tree: a
/// number beyond f64 (`1E400`) is valid JSON that `Value` refuses, and passthrough forwards it
/// as the client sent it.
fn check_body(what: &str, body: &[u8]) {
    if let Err(e) = RawObject::parse(body) {
        panic!(
            "{what}: the upstream body is not one JSON object ({e}): {}",
            String::from_utf8_lossy(body)
        );
    }
}

/// Runs a client body through what the pipeline does with it: the object parse, the model
/// name, validation against every model, then the body written for a target of every protocol
/// (passthrough edits for the same protocol, the IR for another). Also decodes it straight to
/// the IR, whatever validation said, since the decoders must stand on their own.
pub fn run_request(client: Protocol, body: &[u8]) {
    let direct = translate::decode_request(client, body);
    if let Err(e) = &direct {
        check_refusal("decode_request", e);
    }
    let bytes = Bytes::copy_from_slice(body);
    let Ok(obj) = RawObject::parse(&bytes) else {
        // Chat's decoder reads a non-object as an empty request on purpose: `validate::chat`
        // refuses it first. The other two refuse it themselves.
        assert!(
            client == Protocol::Chat || direct.is_err(),
            "decode_request accepted a body that is not one JSON object"
        );
        return;
    };
    if let Err(e) = validate::model_name(&obj) {
        check_refusal("model_name", &e);
    }
    for model in models() {
        let mut plan = match Plan::new(client, &bytes, obj.clone(), model, "fx") {
            Ok(plan) => plan,
            Err(e) => {
                check_refusal("validate", &e);
                continue;
            }
        };
        for (i, target) in model.targets.iter().enumerate() {
            match plan.encode(target, "fx") {
                Ok(encoded) => {
                    check_body("encode", &encoded.body);
                    if let Reply::Translated(t) = &encoded.reply {
                        // The reply side must be usable for whatever comes back.
                        let _ = StreamTranslator::new(t);
                    }
                }
                Err(e) => check_refusal(&format!("encode for target {i}"), &e),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

/// Every (client, upstream) pair of protocols, the same-protocol ones included.
pub fn pairs() -> Vec<(Protocol, Protocol)> {
    PROTOCOLS
        .into_iter()
        .flat_map(|c| PROTOCOLS.into_iter().map(move |u| (c, u)))
        .collect()
}

/// For each pair of `pairs()`, the translations the fixture requests of its client make for
/// an upstream of its protocol (their contexts differ: usage asked for, JSON mode, echo).
pub fn translations() -> &'static [Vec<Translation>] {
    static T: OnceLock<Vec<Vec<Translation>>> = OnceLock::new();
    T.get_or_init(|| {
        pairs()
            .into_iter()
            .map(|(client, upstream)| {
                let model = model_for(upstream);
                fixtures()
                    .requests
                    .iter()
                    .filter(|(p, _)| *p == client)
                    .filter_map(|(_, v)| {
                        let body = serde_json::to_vec(v).ok()?;
                        translate::request(client, upstream, &body, model.primary(), "fx")
                            .ok()
                            .map(|(_, t)| t)
                    })
                    .collect()
            })
            .collect()
    })
}

/// Runs upstream bytes through a translator in pieces, ends it (cleanly or with a transport
/// failure) and checks what the client would receive.
pub fn run_stream(t: &Translation, input: &[u8], cuts: &[u8], broken: bool) {
    let mut st = StreamTranslator::new(t);
    let mut out = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        let n = match cuts.get(i % cuts.len().max(1)) {
            Some(&c) if c > 0 => usize::from(c).min(rest.len()),
            _ => rest.len(),
        };
        i += 1;
        st.feed(&rest[..n], &mut out);
        rest = &rest[n..];
    }
    if broken {
        st.fail(
            modelgate::ir::ErrorInfo {
                status: 502,
                message: "the upstream stream broke".into(),
                code: None,
            },
            &mut out,
        );
    } else {
        st.finish(&mut out);
    }
    assert!(st.ended(), "the translator did not end after finish/fail");
    check_client_stream(t.client, &out, input.len());
}

/// What a client may receive: UTF-8 SSE text made of whole events, each `event:`/`data:` lines
/// only, every data JSON (or chat's `[DONE]`, last), named events named as their `type`, and the
/// protocol's terminal event last. Its size stays proportional to the input.
pub fn check_client_stream(client: Protocol, out: &[u8], input_len: usize) {
    let show = || String::from_utf8_lossy(out).into_owned();
    assert!(
        out.len() <= 16 * input_len + 64 * 1024,
        "{} bytes out of {input_len} in",
        out.len()
    );
    let text = std::str::from_utf8(out).unwrap_or_else(|e| panic!("not UTF-8 ({e}): {}", show()));
    assert!(
        text.ends_with("\n\n"),
        "does not end with a whole event: {text}"
    );
    for line in text.split('\n') {
        assert!(
            line.is_empty() || line.starts_with("event: ") || line.starts_with("data: "),
            "unexpected line {line:?} in:\n{text}"
        );
    }
    let mut events = Vec::new();
    let mut d = SseDecoder::new();
    d.feed(out, &mut events)
        .expect("a decoder without a limit never refuses");
    d.finish(&mut events);
    assert!(!events.is_empty(), "no event at all");
    let last = events.len() - 1;
    for (i, ev) in events.iter().enumerate() {
        if ev.data == "[DONE]" {
            assert!(
                client == Protocol::Chat && i == last,
                "[DONE] at {i} of {last}:\n{text}"
            );
            continue;
        }
        let v: Value = serde_json::from_str(&ev.data)
            .unwrap_or_else(|e| panic!("event {i}: data is not JSON ({e}):\n{text}"));
        assert!(v.is_object(), "event {i}: data is not an object:\n{text}");
        match (client, &ev.event) {
            (Protocol::Chat, None) => {}
            (Protocol::Chat, Some(name)) => panic!("a chat stream with an event name {name}"),
            (_, None) => panic!("event {i} has no name:\n{text}"),
            (_, Some(name)) => assert_eq!(
                v.get("type").and_then(Value::as_str),
                Some(name.as_str()),
                "event {i}: name and type differ:\n{text}"
            ),
        }
    }
    let end = &events[last];
    let terminal = match client {
        Protocol::Chat => end.data == "[DONE]",
        Protocol::Messages => matches!(end.event.as_deref(), Some("message_stop" | "error")),
        Protocol::Responses => matches!(
            end.event.as_deref(),
            Some("response.completed" | "response.incomplete" | "response.failed" | "error")
        ),
    };
    assert!(
        terminal,
        "the stream does not end with its terminal event:\n{text}"
    );
}
