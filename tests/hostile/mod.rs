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
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use modelgate::body::StreamGuard;
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
    /// Video creation bodies (`tests/fixtures/video/requests/`).
    pub video_requests: Vec<Value>,
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
        let mut video_requests = Vec::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_root().join("video/requests"))
            .expect("tests/fixtures/video/requests exists")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        for file in files {
            let v: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
            collect_words(&v, &mut words);
            video_requests.push(v);
        }
        Fixtures {
            requests,
            video_requests,
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

/// The lengths of the pieces `decode_in_pieces` and `decode_limited` feed: `cuts` cycled, a 0
/// an empty piece; when only zeros are left the rest goes at once.
pub fn piece_ends(len: usize, cuts: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < len {
        let n = if cuts.is_empty() {
            len - at
        } else {
            usize::from(cuts[i % cuts.len()]).min(len - at)
        };
        i += 1;
        at += n;
        if i > 4 * len + 16 {
            at = len;
        }
        ends.push(at);
    }
    ends
}

/// Feeds `bytes` in pieces (as `piece_ends` cuts them) to a decoder limited to `max` bytes an
/// event; stops at its first refusal. Returns the events it gave and, if it refused, how many
/// bytes it had been fed by then.
pub fn decode_limited(bytes: &[u8], cuts: &[u8], max: usize) -> (Vec<SseEvent>, Option<usize>) {
    let mut d = SseDecoder::with_limit(max);
    let mut out = Vec::new();
    let mut from = 0;
    for end in piece_ends(bytes.len(), cuts) {
        if d.feed(&bytes[from..end], &mut out).is_err() {
            return (out, Some(end));
        }
        from = end;
    }
    d.finish(&mut out);
    (out, None)
}

/// The reference decoder's state at each of `ends` (ascending offsets into `bytes`): how many
/// events it has dispatched, and what it holds for the event in progress: its data so far
/// (joined, as the decoder keeps it) plus the line still arriving. That is what the limit of a
/// limited decoder bounds.
pub fn reference_held(bytes: &[u8], ends: &[usize]) -> Vec<(usize, usize)> {
    let (mut dispatched, mut data, mut has_data) = (0usize, 0usize, false);
    let mut line_start = 0;
    let mut after_cr = false;
    let mut out = Vec::with_capacity(ends.len());
    let mut ends = ends.iter().peekable();
    for p in 0..=bytes.len() {
        while ends.next_if(|e| **e == p).is_some() {
            out.push((dispatched, data + (p - line_start)));
        }
        if p == bytes.len() {
            break;
        }
        let b = bytes[p];
        if after_cr && b == b'\n' {
            // The second half of a CRLF: its line was done at the CR.
            after_cr = false;
            line_start = p + 1;
            continue;
        }
        after_cr = b == b'\r';
        if b != b'\n' && b != b'\r' {
            continue;
        }
        let line = &bytes[line_start..p];
        line_start = p + 1;
        if line.is_empty() {
            if has_data {
                dispatched += 1;
            }
            data = 0;
            has_data = false;
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
        if field == b"data" {
            // Counted as sent: the decoder keeps an event's data as the upstream's bytes and
            // replaces invalid UTF-8 only when it hands the event over.
            data += usize::from(has_data) + value.len();
            has_data = true;
        }
    }
    out
}

/// A decoder limited to `max` bytes an event, fed in pieces: it refuses exactly at the first
/// piece after which the reference holds more than `max` for one event, and until then (or to
/// the end) gives exactly the reference's events.
pub fn check_limited_decoder(stream: &[u8], cuts: &[u8], max: usize) {
    let (events, refused) = decode_limited(stream, cuts, max);
    let all = reference_decode(stream);
    let ends = piece_ends(stream.len(), cuts);
    let held = reference_held(stream, &ends);
    let over = ends.iter().zip(&held).find(|(_, (_, h))| *h > max);
    match (refused, over) {
        (None, None) => assert_eq!(events, all, "within the limit of {max}"),
        (Some(at), Some((&end, &(dispatched, h)))) => {
            assert_eq!(
                at, end,
                "refused after {at} bytes; the reference holds {h} > {max} after {end}"
            );
            assert_eq!(
                events,
                all[..dispatched],
                "the events before the refusal at {at}"
            );
        }
        (Some(at), None) => panic!("refused after {at} bytes, never over the limit of {max}"),
        (None, Some((end, (_, h)))) => {
            panic!("not refused, but the reference holds {h} > {max} after {end} bytes")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// A refusal must be the client's fault (4xx) and name what is wrong, never an internal error:
/// the request decoders and encoders have no failure of their own.
fn check_refusal(what: &str, e: &modelgate::error::GatewayError) {
    assert!(
        e.kind != ErrorKind::Internal && e.status().is_client_error(),
        "{what}: not a clean refusal: {:?} {} ({:?})",
        e.kind,
        e.message,
        e.param
    );
    assert!(
        !e.message.trim().is_empty() && e.param.as_deref().is_none_or(|p| !p.is_empty()),
        "{what}: a refusal that names nothing: {:?} {:?} ({:?})",
        e.kind,
        e.message,
        e.param
    );
}

/// What an independent reading of a JSON text finds: the first key repeated in one object
/// (keys compared as the UTF-16 text JavaScript and Python parsers read, so `"a"`, `"\u0061"`
/// and two spellings of one lone surrogate are one key) and the deepest nesting.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub repeated: Option<String>,
    pub depth: usize,
}

/// The UTF-16 text of the string whose contents start at `at`, and the index of its closing
/// quote. The text is valid JSON (it was parsed before), so this reads it plainly.
fn read_string(b: &[u8], mut at: usize) -> (Vec<u16>, usize) {
    let mut units = Vec::new();
    let mut run = at;
    let flush = |units: &mut Vec<u16>, seg: &[u8]| {
        units.extend(String::from_utf8_lossy(seg).encode_utf16());
    };
    while at < b.len() {
        match b[at] {
            b'"' => {
                flush(&mut units, &b[run..at]);
                return (units, at);
            }
            b'\\' if at + 1 < b.len() => {
                flush(&mut units, &b[run..at]);
                let esc = b[at + 1];
                at += 2;
                match esc {
                    b'u' => {
                        let hex = std::str::from_utf8(&b[at..(at + 4).min(b.len())]).unwrap_or("");
                        units.push(u16::from_str_radix(hex, 16).unwrap_or(0xFFFD));
                        at += 4;
                    }
                    b'n' => units.push(u16::from(b'\n')),
                    b't' => units.push(u16::from(b'\t')),
                    b'r' => units.push(u16::from(b'\r')),
                    b'b' => units.push(8),
                    b'f' => units.push(12),
                    other => units.push(u16::from(other)),
                }
                run = at;
                continue;
            }
            _ => at += 1,
        }
    }
    flush(&mut units, &b[run..b.len().min(at)]);
    (units, b.len())
}

/// Reads a JSON text (already known to be valid) for its repeated keys and nesting depth.
pub fn reference_shape(b: &[u8]) -> Shape {
    let mut shape = Shape::default();
    // One entry per open container: the keys seen so far for an object, `None` for an array.
    let mut stack: Vec<Option<BTreeSet<Vec<u16>>>> = Vec::new();
    let mut expect_key = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let (text, end) = read_string(b, i + 1);
                if expect_key {
                    if let Some(Some(keys)) = stack.last_mut() {
                        let shown = String::from_utf16_lossy(&text);
                        if !keys.insert(text) && shape.repeated.is_none() {
                            shape.repeated = Some(shown);
                        }
                    }
                    expect_key = false;
                }
                i = end + 1;
                continue;
            }
            b'{' => {
                stack.push(Some(BTreeSet::new()));
                expect_key = true;
            }
            b'[' => {
                stack.push(None);
                expect_key = false;
            }
            b'}' | b']' => {
                stack.pop();
                expect_key = false;
            }
            b',' => expect_key = matches!(stack.last(), Some(Some(_))),
            _ => {}
        }
        shape.depth = shape.depth.max(stack.len());
        i += 1;
    }
    shape
}

/// A written upstream body must be one JSON object, with no key repeated at any depth (what the
/// gateway checked is what the upstream reads, whichever of a repeated key's values its parser
/// keeps). Read as raw values, not a `Value` tree: a number beyond f64 (`1E400`) is valid JSON
/// that `Value` refuses, and passthrough forwards it as the client sent it.
fn check_body(what: &str, body: &[u8]) {
    if let Err(e) = RawObject::parse(body) {
        panic!(
            "{what}: the upstream body is not one JSON object ({e}): {}",
            String::from_utf8_lossy(body)
        );
    }
    let shape = reference_shape(body);
    assert!(
        shape.repeated.is_none(),
        "{what}: the upstream body repeats the key {:?}: {}",
        shape.repeated,
        String::from_utf8_lossy(body)
    );
}

/// What the pipeline runs first on every request body, whatever its address
/// (`validate::request_object`: the object parse, then `json::check_structure`), with its
/// invariants: a refusal is a 4xx naming the problem, and only for a body that really has one;
/// an accepted body has no repeated key at any depth and nests within `json::MAX_DEPTH`.
pub fn request_object(bytes: &Bytes) -> Option<RawObject<'_>> {
    let max = modelgate::json::MAX_DEPTH;
    match validate::request_object(bytes) {
        Ok(obj) => {
            let shape = reference_shape(bytes);
            assert!(
                shape.repeated.is_none() && shape.depth <= max,
                "request_object accepted a body with {shape:?}: {}",
                String::from_utf8_lossy(bytes)
            );
            Some(obj)
        }
        Err(e) => {
            check_refusal("request_object", &e);
            if RawObject::parse(bytes).is_ok() {
                // Refused for its structure: the problem must be real and named.
                let shape = reference_shape(bytes);
                assert!(
                    e.param.is_some(),
                    "a structure refusal names no field: {}",
                    e.message
                );
                match modelgate::json::check_structure(bytes) {
                    Err(modelgate::json::BodyProblem::RepeatedKey { .. }) => assert!(
                        shape.repeated.is_some(),
                        "refused for a repeated key none repeats ({}): {}",
                        e.message,
                        String::from_utf8_lossy(bytes)
                    ),
                    Err(modelgate::json::BodyProblem::TooDeep { .. }) => assert!(
                        shape.depth > max,
                        "refused as deeper than {max} at depth {} ({})",
                        shape.depth,
                        e.message
                    ),
                    Ok(()) => panic!("request_object refused what both checks pass: {e:?}"),
                }
            }
            None
        }
    }
}

/// What is sent is what was validated: `sent` is a well-formed body naming `model`, and (for a
/// passthrough) every top-level field of the validated object outside `editable` goes out byte
/// for byte, with no field added beside them.
fn check_sent(
    what: &str,
    sent: &[u8],
    model: &str,
    validated: Option<&RawObject>,
    editable: &[&str],
) {
    check_body(what, sent);
    let out = RawObject::parse(sent).unwrap();
    let named = out.get("model").map(modelgate::json::as_str);
    assert!(
        matches!(&named, Some(Ok(n)) if n == model),
        "{what}: the body names the model {named:?}, not {model:?}: {}",
        String::from_utf8_lossy(sent)
    );
    let Some(validated) = validated else {
        return;
    };
    for key in validated.keys() {
        if editable.contains(&key) {
            continue;
        }
        assert_eq!(
            out.get(key).map(|v| v.get()),
            validated.get(key).map(|v| v.get()),
            "{what}: `{key}` was validated as one value and sent as another"
        );
    }
    for key in out.keys() {
        assert!(
            editable.contains(&key) || validated.contains(key),
            "{what}: `{key}` was added to the body"
        );
    }
}

/// The fields a chat passthrough may rewrite: the model's name and the thinking and usage
/// switches the target's upstream understands (`passthrough::chat_body`).
const CHAT_EDITS: &[&str] = &[
    "model",
    "stream_options",
    "enable_thinking",
    "thinking",
    "chat_template_kwargs",
    "max_tokens",
    "max_completion_tokens",
    "reasoning_effort",
];

/// Runs a client body through what the pipeline does with it, in its order (`pipeline::llm`):
/// `validate::request_object`, `validate::model_name`, then for every model the endpoint check,
/// `Plan::new` (validation) and `Plan::encode` for a target of every protocol (passthrough edits
/// for the same protocol, the IR for another), asked for usage or not. A responses request's
/// `previous_response_id` expansion needs the response store and is left out. Also decodes the
/// body straight to the IR, whatever the checks said, since the decoders must stand on their own.
pub fn run_request(client: Protocol, body: &[u8]) {
    let direct = translate::decode_request(client, body);
    if let Err(e) = &direct {
        check_refusal("decode_request", e);
    }
    let bytes = Bytes::copy_from_slice(body);
    if RawObject::parse(&bytes).is_err() {
        // Chat's decoder reads a non-object as an empty request on purpose: the pipeline's
        // `request_object` refuses it first. The other two refuse it themselves.
        assert!(
            client == Protocol::Chat || direct.is_err(),
            "decode_request accepted a body that is not one JSON object"
        );
    }
    let Some(obj) = request_object(&bytes) else {
        return;
    };
    let client_model = match validate::model_name(&obj) {
        Ok(name) => name.into_owned(),
        Err(e) => return check_refusal("model_name", &e),
    };
    for model in models() {
        if let Err(e) = modelgate::route::check_endpoint(model, &client_model, client) {
            check_refusal("check_endpoint", &e);
            continue;
        }
        for needs_usage in [false, true] {
            let mut plan = match Plan::new(client, &bytes, obj.clone(), model, &client_model) {
                Ok(plan) => plan,
                Err(e) => {
                    check_refusal("validate", &e);
                    break;
                }
            };
            plan.needs_usage = needs_usage;
            for (i, target) in model.targets.iter().enumerate() {
                let what = format!("encode for target {i}");
                let name = target.model_name(&client_model);
                match plan.encode(target, &client_model) {
                    Ok(encoded) => match &encoded.reply {
                        Reply::Translated(t) => {
                            check_sent(&what, &encoded.body, name, None, &[]);
                            // The reply side must be usable for whatever comes back.
                            let _ = StreamTranslator::new(t);
                        }
                        Reply::Passthrough { .. } => {
                            let edits = if client == Protocol::Chat {
                                CHAT_EDITS
                            } else {
                                &["model"]
                            };
                            check_sent(&what, &encoded.body, name, Some(&obj), edits);
                        }
                    },
                    Err(e) => check_refusal(&what, &e),
                }
            }
        }
    }
}

/// `POST /v1/messages/count_tokens` as `pipeline::count_tokens` runs it: `request_object`,
/// `model_name`, the endpoint check, `count_tokens::decode` (a messages request without
/// `max_tokens`), then either the body forwarded to a messages upstream (only `model` renamed)
/// or the estimate counted here.
pub fn run_count_tokens(body: &[u8]) {
    let bytes = Bytes::copy_from_slice(body);
    let Some(obj) = request_object(&bytes) else {
        return;
    };
    let client_model = match validate::model_name(&obj) {
        Ok(name) => name.into_owned(),
        Err(e) => return check_refusal("model_name", &e),
    };
    let decoded = match modelgate::count_tokens::decode(&bytes, &client_model) {
        Ok(d) => d,
        Err(e) => return check_refusal("count_tokens::decode", &e),
    };
    let tokens = modelgate::count_tokens::count(&decoded.ir);
    assert!(tokens >= 3, "an estimate below the request's own overhead");
    for model in models() {
        if let Err(e) = modelgate::route::check_endpoint(model, &client_model, Protocol::Messages) {
            check_refusal("check_endpoint", &e);
            continue;
        }
        let name = model.primary().model_name(&client_model);
        let sent = modelgate::passthrough::rename_model(
            &bytes,
            obj.clone(),
            (name != client_model).then_some(name),
        );
        check_sent(
            "count_tokens forwarded",
            &sent,
            name,
            Some(&obj),
            &["model"],
        );
    }
}

/// The upstream kinds a video model may be routed to, for `run_video`'s bodies.
const VEO_KINDS: [modelgate::config::UpstreamKind; 2] = [
    modelgate::config::UpstreamKind::VeoVertex,
    modelgate::config::UpstreamKind::VeoGemini,
];

/// `POST /v1/video/generations` as `video::create` runs it: `request_object`, the model name
/// (`video::request::model`), `video::request::validate`, then the body each kind of upstream
/// is sent: the client's own (only `model` renamed) to an upstream of the interface, the
/// `predictLongRunning` body built from the checked request to Veo; the mock's reference too.
pub fn run_video(body: &[u8]) {
    use modelgate::video::request;
    let bytes = Bytes::copy_from_slice(body);
    let Some(obj) = request_object(&bytes) else {
        return;
    };
    let client_model = match request::model(&obj) {
        Ok(name) => name.into_owned(),
        Err(e) => return check_refusal("video model", &e),
    };
    let checked = match request::validate(&obj) {
        Ok(c) => c,
        Err(e) => return check_refusal("video validate", &e),
    };
    // What was checked is what the request says.
    let input = obj
        .get("input")
        .and_then(RawObject::from_raw)
        .expect("a validated video request has an input object");
    let prompt = input.get("prompt").map(modelgate::json::as_str);
    assert!(
        matches!(&prompt, Some(Ok(p)) if *p == checked.prompt),
        "the checked prompt {:?} is not the request's {prompt:?}",
        checked.prompt
    );
    for rename in [None, Some("upstream-video")] {
        let sent = modelgate::passthrough::rename_model(&bytes, obj.clone(), rename);
        let name = rename.unwrap_or(&client_model);
        check_sent("video forwarded", &sent, name, Some(&obj), &["model"]);
    }
    for kind in VEO_KINDS {
        match modelgate::video::veo_body(kind, &checked, Some("gs://bucket/videos")) {
            Ok(sent) => {
                check_body("veo body", &sent);
                let v: Value = serde_json::from_slice(&sent).unwrap();
                assert_eq!(
                    v.pointer("/instances/0/prompt").and_then(Value::as_str),
                    Some(checked.prompt.as_str()),
                    "the Veo body's prompt is not the checked one"
                );
                assert_eq!(
                    v.pointer("/parameters/durationSeconds")
                        .and_then(Value::as_u64),
                    Some(u64::from(checked.duration))
                );
            }
            Err(e) => check_refusal("veo body", &e),
        }
    }
    let _ = modelgate::video::mock::reference(&checked);
}

/// `body` with one of its `"key":value` members written a second time, with another value, right
/// after the first: the smuggling shape (`{"model":"a",…,"model":"b"}`) at any depth.
pub fn repeat_a_key(body: &str, at: usize) -> String {
    let starts: Vec<usize> = body.match_indices("\":").map(|(i, _)| i).collect();
    let Some(&colon_quote) = starts.get(at % starts.len().max(1)) else {
        return body.to_owned();
    };
    let Some(open) = body[..colon_quote].rfind('"') else {
        return body.to_owned();
    };
    let key = &body[open..=colon_quote];
    format!("{}{key}:null,{}", &body[..open], &body[open..])
}

/// Every request decoder the gateway has, by what a fuzz input's first byte picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    Llm(Protocol),
    CountTokens,
    Video,
}

pub const REQUEST_KINDS: [RequestKind; 5] = [
    RequestKind::Llm(Protocol::Chat),
    RequestKind::Llm(Protocol::Messages),
    RequestKind::Llm(Protocol::Responses),
    RequestKind::CountTokens,
    RequestKind::Video,
];

/// The fixture bodies a request of `kind` starts from: count_tokens takes messages requests.
pub fn request_seeds(kind: RequestKind) -> Vec<&'static Value> {
    let f = fixtures();
    let protocol = match kind {
        RequestKind::Video => return f.video_requests.iter().collect(),
        RequestKind::CountTokens => Protocol::Messages,
        RequestKind::Llm(p) => p,
    };
    f.requests
        .iter()
        .filter(|(p, _)| *p == protocol)
        .map(|(_, v)| v)
        .collect()
}

pub fn run_request_kind(kind: RequestKind, body: &[u8]) {
    match kind {
        RequestKind::Llm(p) => run_request(p, body),
        RequestKind::CountTokens => run_count_tokens(body),
        RequestKind::Video => run_video(body),
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

// ---------------------------------------------------------------------------------------------
// Passthrough bodies
// ---------------------------------------------------------------------------------------------

/// A current-thread runtime with a timer: `UpstreamBody` arms its idle timer when made.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

/// An upstream body over the network: the frames given, always ready, then its end or (when
/// `broken`) a transport error. Counts the bytes it has handed out in `fed`.
pub struct FakeUpstream {
    frames: std::collections::VecDeque<Bytes>,
    broken: bool,
    fed: Arc<AtomicUsize>,
}

impl http_body::Body for FakeUpstream {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        if let Some(f) = this.frames.pop_front() {
            this.fed.fetch_add(f.len(), Ordering::Relaxed);
            return Poll::Ready(Some(Ok(http_body::Frame::data(f))));
        }
        if std::mem::take(&mut this.broken) {
            return Poll::Ready(Some(Err(std::io::Error::other("connection reset"))));
        }
        Poll::Ready(None)
    }
}

/// `input` cut into frames whose sizes cycle through `cuts` (a 0 takes the rest).
pub fn frames_of(input: &[u8], cuts: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        let n = match cuts.get(i % cuts.len().max(1)) {
            Some(&c) if c > 0 => usize::from(c).min(rest.len()),
            _ => rest.len(),
        };
        i += 1;
        out.push(Bytes::copy_from_slice(&rest[..n]));
        rest = &rest[n..];
    }
    out
}

/// What a client receives from a body: its data frames, and the error that ended it, if one did.
type Drained = (Vec<Bytes>, Option<String>);

/// Polls `body` to its end (it must never be pending: its upstream is always ready), calling
/// `each` with every data frame; a body polled again after its end must stay ended.
fn drain<B>(body: B, mut each: impl FnMut(&[u8])) -> Drained
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut out = Vec::new();
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    each(&data);
                    out.push(data);
                }
            }
            Poll::Ready(Some(Err(e))) => return (out, Some(e.to_string())),
            Poll::Ready(None) => {
                assert!(
                    matches!(body.as_mut().poll_frame(&mut cx), Poll::Ready(None)),
                    "a body gave more after its end"
                );
                return (out, None);
            }
            Poll::Pending => panic!("a body over an always-ready upstream was pending"),
        }
    }
}

/// The SSE line structure of `bytes`: for every blank line (the end of an event), where its
/// terminator starts and ends. A CRLF is one terminator, so a blank line ended by CRLF may be
/// said to end after its CR or after its LF; both are kept to allow either reading.
fn blank_lines(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut line_start, mut i) = (0, 0);
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'\n' && b != b'\r' {
            i += 1;
            continue;
        }
        let crlf = b == b'\r' && bytes.get(i + 1) == Some(&b'\n');
        let end = i + 1 + usize::from(crlf);
        if i == line_start {
            out.push((i + 1, end));
        }
        line_start = end;
        i = end;
    }
    out
}

/// Event boundaries of `bytes` under one reading of a CRLF blank line (`early`: after its CR).
fn boundaries(blanks: &[(usize, usize)], early: bool) -> Vec<usize> {
    blanks
        .iter()
        .map(|&(cr, end)| if early { cr } else { end })
        .collect()
}

/// Bytes since the last event boundary at `c`.
fn since_boundary(bounds: &[usize], c: usize) -> usize {
    let i = bounds.partition_point(|b| *b <= c);
    c - if i == 0 { 0 } else { bounds[i - 1] }
}

/// The events of `bytes` as byte ranges, each ending after its blank line (the last may have
/// none), under one reading of CRLF blank lines.
fn event_spans(bytes: &[u8], bounds: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &b in bounds {
        out.push(start..b);
        start = b;
    }
    if start < bytes.len() {
        out.push(start..bytes.len());
    }
    out
}

/// A chat chunk that only carries usage (`"choices":[]` and a `usage` object), by SSE rules.
/// As `StripUsage` documents, only an event whose bytes say `"usage"` is looked at.
fn usage_only_event(span: &[u8]) -> bool {
    if memchr::memmem::find(span, b"\"usage\"").is_none() {
        return false;
    }
    let events = reference_decode(span);
    let [ev] = events.as_slice() else {
        return false;
    };
    serde_json::from_str::<Value>(&ev.data).is_ok_and(|v| {
        v.get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
            && v.get("usage").is_some_and(Value::is_object)
    })
}

/// `bytes` without its usage-only events (what `StripUsage` is documented to remove), under one
/// reading of CRLF blank lines.
fn strip_usage_ref(bytes: &[u8], early: bool) -> Vec<u8> {
    let bounds = boundaries(&blank_lines(bytes), early);
    let mut out = Vec::with_capacity(bytes.len());
    for span in event_spans(bytes, &bounds) {
        if !usage_only_event(&bytes[span.clone()]) {
            out.extend_from_slice(&bytes[span]);
        }
    }
    out
}

/// Lines whose presence ends a stream of `guard`'s protocol (`StreamGuard`'s terminators).
fn terminal_lines(guard: StreamGuard) -> &'static [&'static [u8]] {
    match guard {
        StreamGuard::None => &[],
        StreamGuard::Chat => &[b"data: [DONE]", b"data:[DONE]"],
        StreamGuard::Messages => &[b"event: message_stop", b"event: error"],
        StreamGuard::Responses => &[
            b"event: response.completed",
            b"event: response.incomplete",
            b"event: response.failed",
            b"event: error",
        ],
    }
}

/// True when some line of `bytes` (LF, CRLF or CR line ends) starts with a terminator.
fn has_terminal(bytes: &[u8], guard: StreamGuard) -> bool {
    let marks = terminal_lines(guard);
    let mut start = 0;
    let mut i = 0;
    loop {
        let at_end = i == bytes.len();
        if at_end || bytes[i] == b'\n' || bytes[i] == b'\r' {
            let line = &bytes[start..i];
            if marks.iter().any(|m| line.starts_with(m)) {
                return true;
            }
            if at_end {
                return false;
            }
            start = i + 1;
        }
        i += 1;
    }
}

/// The error a guarded stream ends with: the protocol's error event(s) saying `why`, whole
/// events of their own after what was passed (a blank line first if the cut left an event open).
fn check_error_suffix(passed: &[u8], suffix: &[u8], guard: StreamGuard, why: &str) {
    let show = || String::from_utf8_lossy(suffix).into_owned();
    assert!(
        memchr::memmem::find(suffix, why.as_bytes()).is_some(),
        "the stream's error does not say {why:?}: {}",
        show()
    );
    let own = reference_decode(suffix);
    let good = match (guard, own.as_slice()) {
        (StreamGuard::Chat | StreamGuard::None, [.., err, done]) => {
            done.data == "[DONE]"
                && serde_json::from_str::<Value>(&err.data).is_ok_and(|v| v.get("error").is_some())
        }
        (StreamGuard::Messages | StreamGuard::Responses, [.., err]) => {
            err.event.as_deref() == Some("error")
                && serde_json::from_str::<Value>(&err.data)
                    .is_ok_and(|v| v.get("type").and_then(Value::as_str) == Some("error"))
        }
        _ => false,
    };
    assert!(good, "not the protocol's error event: {}", show());
    let whole = reference_decode(&[passed, suffix].concat());
    assert!(
        whole.ends_with(&own),
        "the error event merged with what came before it: {}",
        show()
    );
}

/// One passthrough case: the upstream's bytes and how they are framed, what the pipeline wraps
/// them in (`pipeline::wrap_response` and `respond`).
#[derive(Debug, Clone, Copy)]
pub struct StreamCase<'a> {
    pub input: &'a [u8],
    pub cuts: &'a [u8],
    /// The stream's guard (`StreamGuard::None`: an event stream for a request that did not ask
    /// for one; errors end the body instead of an error event).
    pub guard: StreamGuard,
    /// `StripUsage` after the guard (a chat stream the gateway asked for usage on its account).
    pub strip: bool,
    pub max_event: usize,
    /// The upstream's connection breaks after the last frame.
    pub broken: bool,
}

/// Builds the passthrough chain over `frames` as the pipeline does for a successful event
/// stream: the first frame read ahead and put back (`first_frame`), usage read as it passes
/// (`Metered`), the guard with its event limit (`wrap_response`), `StripUsage` if asked.
fn passthrough_chain(
    frames: &[Bytes],
    case: &StreamCase,
    strip: bool,
    fed: &Arc<AtomicUsize>,
    each: impl FnMut(&[u8]),
) -> Drained {
    use modelgate::body::{Prepend, StripUsage, UpstreamBody};
    use modelgate::observe::{Fate, Metered, Usage, UsageReader};
    type Boxed = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;
    let _rt = runtime().enter();
    let mut frames: std::collections::VecDeque<Bytes> = frames.iter().cloned().collect();
    let first = frames.pop_front();
    if let Some(f) = &first {
        fed.store(f.len(), Ordering::Relaxed);
    }
    let upstream = FakeUpstream {
        frames,
        broken: case.broken,
        fed: fed.clone(),
    };
    let inner: Boxed = match first {
        Some(f) => {
            http_body_util::BodyExt::boxed_unsync(Prepend::new(http_body::Frame::data(f), upstream))
        }
        None => http_body_util::BodyExt::boxed_unsync(upstream),
    };
    let protocol = match case.guard {
        StreamGuard::Messages => Protocol::Messages,
        StreamGuard::Responses => Protocol::Responses,
        _ => Protocol::Chat,
    };
    let usage = Usage::new(UsageReader::new(protocol, true), Fate::default(), None);
    let metered = Metered::new(inner, Some(usage));
    let guarded = UpstreamBody::new(metered, std::time::Duration::from_secs(60), case.guard)
        .with_event_limit(case.max_event);
    if strip {
        drain(StripUsage::new(guarded), each)
    } else {
        drain(guarded, each)
    }
}

/// A passthrough stream: the client gets the upstream's bytes as they came (without the
/// usage-only chunk under `StripUsage`), cut by an event-size error only when an event by SSE
/// rules (LF, CRLF or CR line ends, a blank line ending it, wherever the frames split it) has
/// more bytes than the limit at the end of a frame, and ended by the protocol's error event
/// when it is cut, breaks or ends without its terminator. `StripUsage` holds back no more than
/// the event in progress.
pub fn run_passthrough_stream(case: &StreamCase) {
    let frames = frames_of(case.input, case.cuts);
    let mut ends = Vec::with_capacity(frames.len());
    let mut at = 0;
    for f in &frames {
        at += f.len();
        ends.push(at);
    }
    let blanks = blank_lines(case.input);
    let (late, early) = (boundaries(&blanks, false), boundaries(&blanks, true));
    let over: Vec<(bool, bool)> = ends
        .iter()
        .map(|&c| {
            let (a, b) = (since_boundary(&late, c), since_boundary(&early, c));
            (a.min(b) > case.max_event, a.max(b) > case.max_event)
        })
        .collect();
    let fed = Arc::new(AtomicUsize::new(0));
    let (out, err) = passthrough_chain(&frames, case, false, &fed, |_| {});
    // Frames pass one for one until the guard stops; what follows is its error.
    let same = out.iter().zip(&frames).take_while(|(o, f)| o == f).count();
    let cut_at = over.iter().position(|(surely, _)| *surely);
    let may_cut = |i: usize| over[i].1 && over[..i].iter().all(|(surely, _)| !surely);
    let why_cut = "larger than the limit";
    let show = || {
        format!(
            "{case:?}\nout: {:?}\nerr: {err:?}",
            out.iter()
                .map(|b| String::from_utf8_lossy(b))
                .collect::<Vec<_>>()
        )
    };
    // (frames passed, the error event or message that followed, what it says)
    let mut outcome: Option<(usize, Option<Vec<u8>>, &str)> = None;
    for k in [same, same.saturating_sub(1)] {
        let passed = &case.input[..if k == 0 { 0 } else { ends[k - 1] }];
        let suffix: Option<Vec<u8>> = if case.guard == StreamGuard::None {
            err.as_ref().map(|e| e.clone().into_bytes())
        } else {
            out.get(k).map(|b| b.to_vec())
        };
        let frames_ok =
            out.len() == k + usize::from(case.guard != StreamGuard::None && suffix.is_some());
        if !frames_ok || out[..k] != frames[..k] {
            continue;
        }
        let why = if k < frames.len() {
            if !may_cut(k) {
                continue;
            }
            why_cut
        } else if cut_at.is_some() {
            continue;
        } else if case.broken {
            "stream broke"
        } else if case.guard != StreamGuard::None && !has_terminal(passed, case.guard) {
            "ended before it was complete"
        } else {
            ""
        };
        if why.is_empty() != suffix.is_none() {
            continue;
        }
        outcome = Some((k, suffix, why));
        break;
    }
    let Some((k, suffix, why)) = outcome else {
        panic!(
            "unexpected output (cut at frame {cut_at:?} of {}, ends {ends:?}): {}",
            frames.len(),
            show()
        );
    };
    let passed = &case.input[..if k == 0 { 0 } else { ends[k - 1] }];
    if let Some(suffix) = &suffix {
        if case.guard == StreamGuard::None {
            let e = String::from_utf8_lossy(suffix);
            assert!(
                e.contains(why),
                "the body's error does not say {why:?}: {e}"
            );
        } else {
            check_error_suffix(passed, suffix, case.guard, why);
        }
    }
    if !case.strip {
        return;
    }
    // Under StripUsage: the same bytes less the usage-only events, each complete event let
    // through as soon as it is in (under either reading of a CRLF blank line).
    let input = case.input;
    let kept_before = |bounds: &[usize]| {
        let mut kept = vec![0];
        for s in event_spans(input, bounds) {
            let last = kept[kept.len() - 1];
            let own = if usage_only_event(&input[s.clone()]) {
                0
            } else {
                s.len()
            };
            kept.push(last + own);
        }
        kept
    };
    let readings = [(&late, kept_before(&late)), (&early, kept_before(&early))];
    let fed = Arc::new(AtomicUsize::new(0));
    let mut emitted = 0;
    let (out_b, err_b) = passthrough_chain(&frames, case, true, &fed, |data| {
        emitted += data.len();
        let seen = fed.load(Ordering::Relaxed).min(passed.len());
        // Owed: the events complete in what has passed (one ended by a CR at the very end may
        // still be waiting for its LF).
        let owed = readings
            .iter()
            .map(|(bounds, kept)| {
                let mut complete = bounds.partition_point(|b| *b < seen);
                if bounds.get(complete) == Some(&seen) && input[seen - 1] == b'\n' {
                    complete += 1;
                }
                kept[complete]
            })
            .min()
            .unwrap_or(0);
        assert!(
            emitted >= owed,
            "StripUsage holds back complete events: {emitted} bytes out, {owed} owed after {seen} in"
        );
    });
    if case.guard == StreamGuard::None {
        assert_eq!(err_b, err, "StripUsage changed the body's error");
    }
    let got = out_b.concat();
    let all = [
        passed,
        suffix
            .as_deref()
            .filter(|_| case.guard != StreamGuard::None)
            .unwrap_or(&[]),
    ]
    .concat();
    let want = [strip_usage_ref(&all, false), strip_usage_ref(&all, true)];
    assert!(
        want.contains(&got),
        "StripUsage output differs from the stream without its usage-only events\n got: {:?}\nwant: {:?}\n{}",
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want[0]),
        show()
    );
}

/// A JSON reply (`respond` for a successful non-stream answer: `Metered`, then the guard with
/// the reply limit), or an error reply that may quote the gateway's credential (`Redacted`
/// first): the bytes pass as they came (the credential replaced), ended by a size error exactly
/// when the running total passes the limit, or by the transport's break.
pub fn run_json_reply(input: &[u8], cuts: &[u8], max_reply: u64, broken: bool, error_reply: bool) {
    use modelgate::body::{Redacted, UpstreamBody};
    use modelgate::observe::{Fate, Metered, Usage, UsageReader};
    const SECRET: &[u8] = b"sk-upstream-0123456789";
    let _rt = runtime().enter();
    let frames = frames_of(input, cuts);
    let upstream = FakeUpstream {
        frames: frames.iter().cloned().collect(),
        broken,
        fed: Arc::new(AtomicUsize::new(0)),
    };
    let (out, err) = if error_reply {
        let inner = Redacted::new(upstream, Bytes::from_static(SECRET), max_reply);
        let body = UpstreamBody::new(inner, std::time::Duration::from_secs(60), StreamGuard::None)
            .with_reply_limit(max_reply);
        drain(body, |_| {})
    } else {
        let usage = Usage::new(
            UsageReader::new(Protocol::Chat, false),
            Fate::default(),
            None,
        );
        let inner = Metered::new(upstream, Some(usage));
        let body = UpstreamBody::new(inner, std::time::Duration::from_secs(60), StreamGuard::None)
            .with_reply_limit(max_reply);
        drain(body, |_| {})
    };
    let over = input.len() as u64 > max_reply;
    let says = |want: &str| {
        assert!(
            err.as_deref().is_some_and(|e| e.contains(want)),
            "the reply's error {err:?} does not say {want:?}"
        );
    };
    if error_reply {
        if over {
            says("larger than the limit");
            assert!(out.is_empty(), "a redacted reply over the limit gave bytes");
        } else if broken {
            says("broke");
        } else {
            assert_eq!(err, None);
            let got = out.concat();
            assert_eq!(got, redact(input, SECRET), "redacted");
            assert!(
                memchr::memmem::find(&got, SECRET).is_none(),
                "the credential got out"
            );
        }
        return;
    }
    let mut total = 0u64;
    let mut passed = 0;
    for f in &frames {
        if total + f.len() as u64 > max_reply {
            break;
        }
        total += f.len() as u64;
        passed += 1;
    }
    assert_eq!(out, frames[..passed], "the reply's bytes");
    if over {
        says("larger than the limit");
    } else if broken {
        says("broke");
    } else {
        assert_eq!(err, None);
    }
}

/// Each occurrence of `secret` replaced, left to right.
fn redact(text: &[u8], secret: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(secret) {
            out.extend_from_slice(b"[redacted]");
            i += secret.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}
