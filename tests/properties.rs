//! Property tests over the hostile-input surfaces (gateway.md §14): the SSE decoder, every request decoder with the validation the pipeline runs, every stream translator; a CI-sized sibling of the fuzz targets in `fuzz/`, with the same invariants (`hostile/`).
//!
//! `PROPTEST_CASES=10000 cargo test --release --test properties` runs them longer.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a broken property should fail the test loudly"
)]

mod hostile;

use hostile::*;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// A few hundred cases each, unless PROPTEST_CASES says otherwise: the file stays well under a
/// minute in a debug build.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

// === strategies ===

/// Pieces of event-stream text, with every kind of line end and field the decoder tells apart.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"event: ".to_vec()),
        Just(b"event".to_vec()),
        Just(b"id: 1".to_vec()),
        Just(b":".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"{\"type\":\"x\"}".to_vec()),
        Just("é".as_bytes().to_vec()),
        Just(vec![0xff]),
        any::<u8>().prop_map(|b| vec![b]),
        "[a-z]{0,6}".prop_map(String::into_bytes),
    ];
    prop::collection::vec(token, 0..64).prop_map(|t| t.concat())
}

/// A protocol word from the fixtures (keys, values, event names), or now and then any string.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(fixtures().words.clone()),
        1 => any::<String>(),
    ]
}

/// JSON trees whose keys and strings are mostly protocol words.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-3i64..130).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        word().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((word(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One edit of a JSON tree: the node reached by following `path` (each step an index into the
/// current node's children, modulo their number), then `op` applied there with `key`/`value`.
#[derive(Debug, Clone)]
struct Edit {
    path: Vec<usize>,
    op: u8,
    key: String,
    value: Value,
}

fn edit() -> impl Strategy<Value = Edit> {
    (
        prop::collection::vec(any::<usize>(), 0..5),
        0u8..4,
        word(),
        json(),
    )
        .prop_map(|(path, op, key, value)| Edit {
            path,
            op,
            key,
            value,
        })
}

fn apply(v: &mut Value, e: &Edit) {
    apply_at(v, &e.path, e);
}

fn apply_at(node: &mut Value, path: &[usize], e: &Edit) {
    if let Some((&step, rest)) = path.split_first() {
        let child = match node {
            Value::Object(o) if !o.is_empty() => {
                let i = step % o.len();
                o.values_mut().nth(i)
            }
            Value::Array(a) if !a.is_empty() => {
                let i = step % a.len();
                a.get_mut(i)
            }
            _ => None,
        };
        if let Some(child) = child {
            return apply_at(child, rest, e);
        }
    }
    let at = e.path.last().copied().unwrap_or(0);
    match (e.op, &mut *node) {
        (1, Value::Object(o)) => {
            o.insert(e.key.clone(), e.value.clone());
        }
        (2, Value::Object(o)) if !o.is_empty() => {
            let k = o.keys().nth(at % o.len()).cloned().unwrap();
            o.remove(&k);
        }
        (1, Value::Array(a)) => a.insert(at % (a.len() + 1), e.value.clone()),
        (2, Value::Array(a)) if !a.is_empty() => {
            a.remove(at % a.len());
        }
        (3, Value::Array(a)) if !a.is_empty() => {
            let i = at % a.len();
            let copy = a[i].clone();
            a.insert(i, copy);
        }
        _ => *node = e.value.clone(),
    }
}

/// What is done to one event of a fixture stream.
#[derive(Debug, Clone)]
enum EventEdit {
    Drop(usize),
    Repeat(usize),
    Swap(usize, usize),
    Rename(usize, Option<String>),
    Data(usize, Value),
    Json(usize, Edit),
}

fn event_edit() -> impl Strategy<Value = EventEdit> {
    let names = fixtures().event_names.clone();
    prop_oneof![
        1 => any::<usize>().prop_map(EventEdit::Drop),
        1 => any::<usize>().prop_map(EventEdit::Repeat),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(i, j)| EventEdit::Swap(i, j)),
        1 => (any::<usize>(), prop::option::of(prop::sample::select(names)))
            .prop_map(|(i, n)| EventEdit::Rename(i, n)),
        1 => (any::<usize>(), json()).prop_map(|(i, v)| EventEdit::Data(i, v)),
        3 => (any::<usize>(), edit()).prop_map(|(i, e)| EventEdit::Json(i, e)),
    ]
}

fn edited_stream(events: &[(Option<String>, String)], edits: &[EventEdit]) -> Vec<u8> {
    let mut events = events.to_vec();
    for e in edits {
        if events.is_empty() {
            break;
        }
        let n = events.len();
        match e {
            EventEdit::Drop(i) => {
                events.remove(i % n);
            }
            EventEdit::Repeat(i) => {
                let ev = events[i % n].clone();
                events.insert(i % n, ev);
            }
            EventEdit::Swap(i, j) => events.swap(i % n, j % n),
            EventEdit::Rename(i, name) => events[i % n].0 = name.clone(),
            EventEdit::Data(i, v) => events[i % n].1 = v.to_string(),
            EventEdit::Json(i, edit) => {
                if let Ok(mut v) = serde_json::from_str::<Value>(&events[i % n].1) {
                    apply(&mut v, edit);
                    events[i % n].1 = v.to_string();
                }
            }
        }
    }
    let mut out = Vec::new();
    for (name, data) in &events {
        if let Some(name) = name {
            out.extend_from_slice(format!("event: {name}\n").as_bytes());
        }
        for line in data.split('\n') {
            out.extend_from_slice(format!("data: {line}\n").as_bytes());
        }
        out.push(b'\n');
    }
    out
}

/// Event-stream text from chat, messages and responses streams: events, usage-only chunks,
/// terminators, with every kind of line end.
fn passthrough_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}".to_vec()),
        Just(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}".to_vec()),
        Just(b"data: [DONE]".to_vec()),
        Just(b"event: message_stop".to_vec()),
        Just(b"event: response.completed".to_vec()),
        Just(b"data: {}".to_vec()),
        Just(b": ping".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"\r\r".to_vec()),
        Just(b"\r\n\r\n".to_vec()),
        "[a-z]{0,40}".prop_map(String::into_bytes),
    ];
    prop::collection::vec(token, 0..40).prop_map(|t| t.concat())
}

const GUARDS: [modelgate::body::StreamGuard; 4] = [
    modelgate::body::StreamGuard::None,
    modelgate::body::StreamGuard::Chat,
    modelgate::body::StreamGuard::Messages,
    modelgate::body::StreamGuard::Responses,
];

// === properties ===

proptest! {
    #![proptest_config(config())]

    /// Any split of any bytes decodes to the events a plain whole-input decoder finds.
    #[test]
    fn sse_decoder_matches_reference_under_any_split(
        stream in sse_bytes(),
        cuts in prop::collection::vec(0u8..24, 0..6),
    ) {
        let expected = reference_decode(&stream);
        prop_assert_eq!(&decode_in_pieces(&stream, &[]), &expected);
        prop_assert_eq!(&decode_in_pieces(&stream, &cuts), &expected);
    }

    /// Arbitrary bytes as a request of each kind (the three protocols, count_tokens, video):
    /// a clean refusal or well-formed bodies.
    #[test]
    fn request_decoders_take_any_bytes(
        which in 0usize..REQUEST_KINDS.len(),
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        run_request_kind(REQUEST_KINDS[which], &body);
    }

    /// Arbitrary JSON as a request of each kind.
    #[test]
    fn request_decoders_take_any_json(which in 0usize..REQUEST_KINDS.len(), v in json()) {
        run_request_kind(REQUEST_KINDS[which], v.to_string().as_bytes());
    }

    /// Golden fixture requests with a few edits anywhere in them: reaches the deep fields.
    #[test]
    fn request_decoders_take_edited_fixtures(
        which in 0usize..REQUEST_KINDS.len(),
        pick in any::<usize>(),
        edits in prop::collection::vec(edit(), 0..4),
        repeat in prop::option::weighted(0.2, any::<usize>()),
    ) {
        let kind = REQUEST_KINDS[which];
        let seeds = request_seeds(kind);
        let mut v = seeds[pick % seeds.len()].clone();
        for e in &edits {
            apply(&mut v, e);
        }
        let mut body = v.to_string();
        if let Some(at) = repeat {
            body = repeat_a_key(&body, at);
        }
        run_request_kind(kind, body.as_bytes());
    }

    /// The SSE decoder with a small event limit, fed in any pieces: it refuses exactly when
    /// what it holds for one event passes the limit, and gives the exact events until then.
    #[test]
    fn sse_decoder_limit_is_exact_under_any_split(
        stream in sse_bytes(),
        cuts in prop::collection::vec(0u8..24, 0..6),
        max in 0usize..48,
    ) {
        check_limited_decoder(&stream, &cuts, max);
    }

    /// A passthrough stream through the body wrappers (guard, event limit, usage reader,
    /// StripUsage) in any frames: the bytes as they came less what is documented to go.
    #[test]
    fn passthrough_stream_bodies_pass_bytes_through(
        stream in passthrough_bytes(),
        cuts in prop::collection::vec(0u8..24, 0..6),
        guard in 0usize..4,
        strip in any::<bool>(),
        max_event in 8usize..256,
        broken in prop::bool::weighted(0.1),
    ) {
        let guard = GUARDS[guard];
        run_passthrough_stream(&StreamCase {
            input: &stream,
            cuts: &cuts,
            guard,
            strip: strip && guard == modelgate::body::StreamGuard::Chat,
            max_event,
            broken,
        });
    }

    /// A JSON reply (or an error reply with the credential quoted) in any frames, against the
    /// reply limit.
    #[test]
    fn json_reply_bodies_pass_bytes_through(
        body in prop::collection::vec(prop_oneof![
            Just(b"sk-upstream-0123456789".to_vec()),
            Just(b"{\"usage\":{\"prompt_tokens\":3}}".to_vec()),
            prop::collection::vec(any::<u8>(), 0..16),
        ], 0..12).prop_map(|p| p.concat()),
        cuts in prop::collection::vec(0u8..24, 0..6),
        max in 0u64..256,
        broken in prop::bool::weighted(0.1),
        error_reply in any::<bool>(),
    ) {
        run_json_reply(&body, &cuts, max, broken, error_reply);
    }

    /// Every pair's translator on a golden stream of its upstream's protocol with events
    /// dropped, repeated, swapped, renamed or rewritten, fed in pieces, ended cleanly or broken.
    #[test]
    fn stream_translators_take_edited_fixture_streams(
        pair in any::<usize>(),
        which in any::<usize>(),
        stream in any::<usize>(),
        edits in prop::collection::vec(event_edit(), 0..6),
        cuts in prop::collection::vec(0u8..64, 0..4),
        broken in prop::bool::weighted(0.1),
    ) {
        let pair = pair % pairs().len();
        let upstream = pairs()[pair].1;
        let ts = &translations()[pair];
        prop_assume!(!ts.is_empty());
        let streams: Vec<_> = fixtures().streams.iter().filter(|(p, _)| *p == upstream).collect();
        prop_assume!(!streams.is_empty());
        let bytes = edited_stream(&streams[stream % streams.len()].1, &edits);
        run_stream(&ts[which % ts.len()], &bytes, &cuts, broken);
    }

    /// Every pair's translator on arbitrary bytes.
    #[test]
    fn stream_translators_take_any_bytes(
        pair in any::<usize>(),
        which in any::<usize>(),
        stream in sse_bytes(),
        cuts in prop::collection::vec(0u8..16, 0..4),
        broken in any::<bool>(),
    ) {
        let ts = &translations()[pair % pairs().len()];
        prop_assume!(!ts.is_empty());
        run_stream(&ts[which % ts.len()], &stream, &cuts, broken);
    }
}

/// The harness itself: every pair has translations to fuzz and every upstream protocol has
/// streams, so no property above is vacuous.
#[test]
fn harness_covers_every_pair() {
    for (i, (client, upstream)) in pairs().into_iter().enumerate() {
        assert!(
            !translations()[i].is_empty(),
            "no translation for {} → {}",
            client.name(),
            upstream.name()
        );
    }
    assert!(!fixtures().video_requests.is_empty(), "no video request");
    for p in PROTOCOLS {
        assert!(
            fixtures().streams.iter().any(|(u, _)| *u == p),
            "no {} stream",
            p.name()
        );
        assert!(
            fixtures().requests.iter().any(|(c, _)| *c == p),
            "no {} request",
            p.name()
        );
    }
}

/// Regression (stream_json crash-9dc43552): an upstream reporting usage near u64::MAX made
/// `Usage::prompt_total` overflow (a panic in debug builds, a wrapped total in release) while a
/// responses client's stream was written; every sum of upstream token counts now saturates, the
/// limiter's included.
#[test]
fn usage_near_u64_max_saturates() {
    let max = u64::MAX;
    let streams = [
        (
            modelgate::config::Protocol::Chat,
            format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":{max},\"completion_tokens\":{max},\"prompt_tokens_details\":{{\"cached_tokens\":{max},\"cache_write_tokens\":{max}}}}}}}\n\ndata: [DONE]\n\n"
            ),
        ),
        (
            modelgate::config::Protocol::Messages,
            format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"usage\":{{\"input_tokens\":{max},\"cache_read_input_tokens\":{max},\"cache_creation_input_tokens\":{max},\"output_tokens\":1}}}}}}\n\nevent: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{max}}}}}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
            ),
        ),
        (
            modelgate::config::Protocol::Responses,
            format!(
                "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"model\":\"m\",\"output\":[],\"usage\":{{\"input_tokens\":{max},\"input_tokens_details\":{{\"cached_tokens\":{max},\"cache_write_tokens\":{max}}},\"output_tokens\":{max},\"total_tokens\":{max}}}}}}}\n\n"
            ),
        ),
    ];
    let mut checked = 0;
    for (i, (client, upstream)) in pairs().into_iter().enumerate() {
        let Some((_, stream)) = streams.iter().find(|(p, _)| *p == upstream) else {
            continue;
        };
        for t in &translations()[i] {
            let mut st = modelgate::translate::StreamTranslator::new(t);
            let mut out = Vec::new();
            st.feed(stream.as_bytes(), &mut out);
            st.finish(&mut out);
            check_client_stream(client, &out, stream.len());
            // Messages and responses clients always get usage (chat ones only when they ask).
            let text = String::from_utf8(out).unwrap();
            if client != modelgate::config::Protocol::Chat {
                assert!(
                    text.contains(&max.to_string()),
                    "{} → {}: no saturated count in\n{text}",
                    client.name(),
                    upstream.name()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} translations checked");
    assert_eq!(modelgate::store::tokens_in_window(max, max, 1), max);
    let tokens = modelgate::observe::Tokens {
        input: max,
        output: max,
        cached: 0,
    };
    assert_eq!(tokens.total(), max);
}

/// Regression: `json::check_structure` compared a key with a lone surrogate by its escaped
/// spelling, so `"\ud800"` and `"\uD800"` (one key to JavaScript and Python parsers, which
/// keep the last) passed as two. Found by this harness's own reading of keys.
#[test]
fn a_lone_surrogate_key_spelled_twice_is_refused() {
    let body = br#"{"model":"to-chat","messages":[{"role":"user","content":"hi"}],"metadata":{"\ud800":"1","\uD800":"2"}}"#;
    for kind in REQUEST_KINDS {
        run_request_kind(kind, body);
    }
    let bytes = bytes::Bytes::from_static(body);
    let e = modelgate::validate::request_object(&bytes).err();
    assert!(
        e.as_ref()
            .and_then(|e| e.param.as_deref())
            .is_some_and(|p| p.starts_with("metadata.")),
        "{e:?}"
    );
}

/// Regressions of the passthrough body wrappers, found by `passthrough_stream_bodies_pass_bytes_through`
/// (and the body_wrappers fuzz target) against their SSE reference.
#[test]
fn passthrough_streams_with_cr_line_ends_and_late_errors() {
    use modelgate::body::StreamGuard;
    // Events ended by CR line ends, fed a byte at a time, each within the limit: the event-size
    // counter missed their ends and cut the stream (fixed on main: sse::EventEnds).
    let small = [&b"data: {\"a\":1}\r\r"[..]; 20].concat();
    let stream = [small.as_slice(), b"data: [DONE]\r\r"].concat();
    for strip in [false, true] {
        run_passthrough_stream(&StreamCase {
            input: &stream,
            cuts: &[1],
            guard: StreamGuard::Chat,
            strip,
            max_event: 16,
            broken: false,
        });
    }
    // A stream whose terminator line follows a CR line end reached its end: no "ended before it
    // was complete" error event may follow it (Tail::has_line looked only after LF).
    for (guard, stream) in [
        (StreamGuard::Chat, &b"data: {}\r\rdata: [DONE]\r\r"[..]),
        (
            StreamGuard::Messages,
            b"event: message_delta\rdata: {}\r\revent: message_stop\rdata: {}\r\r",
        ),
        (
            StreamGuard::Responses,
            b"event: response.completed\rdata: {}\r\r",
        ),
    ] {
        for cuts in [&[][..], &[1], &[5, 3]] {
            run_passthrough_stream(&StreamCase {
                input: stream,
                cuts,
                guard,
                strip: false,
                max_event: 1024,
                broken: false,
            });
        }
    }
    // An error after the terminator (here the event limit, on an event left open) must still
    // start on an event boundary: the tail stopped following the stream at the terminator, so
    // the error event was glued to the open line.
    let stream = [
        &b"event: message_stop\ndata: {}\n\ndata: "[..],
        &[b'x'; 40],
        b"\n\n",
    ]
    .concat();
    run_passthrough_stream(&StreamCase {
        input: &stream,
        cuts: &[8],
        guard: StreamGuard::Messages,
        strip: false,
        max_event: 24,
        broken: false,
    });
}
