//! Tests of the plain messages request's one pass: for every request it writes, the chat body and the reply's translation are the IR path's, byte for byte, for every target.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
use crate::config::Protocol;
use crate::translate::hand::check;
use crate::translate::{self, plain_messages_for_chat};
use crate::validate;

const MODEL: &str = "client \"model\"";

/// Whether the one pass answered for `text` (a body that passed the request's validation);
/// when it did, what it wrote is what the IR path writes for each target.
fn agrees(text: &[u8]) -> bool {
    let Ok(obj) = validate::request_object(text) else {
        return false;
    };
    if validate::passthrough(&obj, Protocol::Messages).is_err() {
        return false;
    }
    let shown = String::from_utf8_lossy(text);
    let mut answered = None;
    for target in check::targets() {
        let upstream_model = target.model_name(MODEL);
        let written = plain_messages_for_chat(&obj, upstream_model, MODEL);
        let here = written.is_some();
        assert!(
            *answered.get_or_insert(here) == here,
            "answered for some targets only: {shown}"
        );
        let Some((body, t)) = written else {
            continue;
        };
        let (expected, et) =
            translate::request(Protocol::Messages, Protocol::Chat, text, &target, MODEL)
                .unwrap_or_else(|e| panic!("wrote a request the IR path refuses ({e}): {shown}"));
        assert_eq!(
            String::from_utf8(body.to_vec()).unwrap(),
            String::from_utf8(expected.to_vec()).unwrap(),
            "{:?} {shown}",
            target.thinking
        );
        assert_eq!(format!("{t:?}"), format!("{et:?}"), "{shown}");
    }
    answered.unwrap()
}

/// Whether the IR path writes `text` for a chat target, rather than refusing it.
fn ir_writes(text: &str) -> bool {
    let target = &check::targets()[0];
    translate::request(
        Protocol::Messages,
        Protocol::Chat,
        text.as_bytes(),
        target,
        MODEL,
    )
    .is_ok()
}

/// Requests of the common shape, as SDKs send them, each written in the one pass.
const PLAIN: [&str; 7] = [
    r#"{"model":"mock-gpt","max_tokens":64,"system":"You are terse.","messages":[{"role":"user","content":"Say hello in five words."}]}"#,
    r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Line one.\nShe said \"hi\" \\ \t tab\r\b\f"},{"role":"assistant","content":"héllo — 日本 😀"},{"role":"user","content":""}],"stream":true,"temperature":0.7}"#,
    r#"{"messages":[{"content":"a","role":"assistant"}],"stream":false,"top_p":1e-3,"max_tokens":1,"temperature":1,"model":"m"}"#,
    "{\n  \"model\": \"m\",\n  \"max_tokens\": 20,\n  \"system\": \"\",\n  \"messages\": [ { \"role\": \"user\", \"content\": \"x\" } ,\n {\"role\":\"assistant\" , \"content\":\"y\"}],\n  \"top_p\": 0.25, \"temperature\": 0\n}\n",
    r#"{"model":"m","max_tokens":9223372036854775807,"messages":[{"role":"user","content":"x"}],"temperature":0.0,"top_p":1.0}"#,
    r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"},{"role":"assistant","content":"d"},{"role":"user","content":"e"}],"stream":true}"#,
    r#"{"model":"m","max_tokens":5,"system":"tab\tand \"quote\"","messages":[{"role":"user","content":"x"}],"temperature":5e-1}"#,
];

#[test]
fn plain_requests_are_written_as_the_ir_path_writes_them() {
    for text in PLAIN {
        assert!(agrees(text.as_bytes()), "left to the IR path: {text}");
    }
    let obj = validate::request_object(PLAIN[1].as_bytes()).unwrap();
    let (body, t) = plain_messages_for_chat(&obj, "up", MODEL).unwrap();
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        r#"{"model":"up","messages":[{"role":"user","content":"Line one.\nShe said \"hi\" \\ \t tab\r\b\f"},{"role":"assistant","content":"héllo — 日本 😀"},{"role":"user","content":""}],"max_tokens":1024,"temperature":0.7,"stream":true,"stream_options":{"include_usage":true}}"#
    );
    assert!(t.stream);
}

/// Every shape the one pass does not write as it came (blocks, tools, thinking, a `null`, two
/// turns of one role, an escape serde would write otherwise, any other member): left to the IR
/// path, which still writes each of them.
#[test]
fn other_shapes_are_left_to_the_ir_path() {
    let request = |members: &str| {
        format!(
            r#"{{"model":"m","max_tokens":8,"messages":[{{"role":"user","content":"x"}}]{members}}}"#
        )
    };
    let turns = |messages: &str| format!(r#"{{"model":"m","max_tokens":8,"messages":{messages}}}"#);
    let mut cases: Vec<String> = [
        r#","system":[{"type":"text","text":"s"}]"#,
        r#","system":"caf\u00e9""#,
        r#","system":"a\/b""#,
        r#","system":null"#,
        r#","temperature":null"#,
        r#","stream":null"#,
        r#","top_k":3"#,
        r#","stop_sequences":["x"]"#,
        r#","metadata":{"user_id":"u"}"#,
        r#","thinking":{"type":"enabled","budget_tokens":1024}"#,
        r#","tools":[{"name":"f","input_schema":{"type":"object"}}]"#,
        r#","tool_choice":{"type":"auto"}"#,
        r#","service_tier":"auto""#,
    ]
    .iter()
    .map(|m| request(m))
    .collect();
    cases.extend(
        [
            r#"[{"role":"user","content":[{"type":"text","text":"x"}]}]"#,
            r#"[{"role":"user","content":"a"},{"role":"user","content":"b"}]"#,
            r#"[{"role":"user","content":"a","cache_control":{"type":"ephemeral"}}]"#,
            r#"[{"role":"user","content":"caf\u00e9"}]"#,
            r#"[{"r\u006fle":"user","content":"a"}]"#,
        ]
        .map(turns),
    );
    for text in &cases {
        assert!(!agrees(text.as_bytes()), "written in one pass: {text}");
        assert!(ir_writes(text), "the IR path refuses {text}");
    }
    // What the IR path refuses is left to it, to be refused with the field named.
    for text in [
        request(r#","temperature":1.5"#),
        request(r#","top_p":-0.5"#),
        turns("[]"),
        turns(r#"[{"role":"system","content":"x"}]"#),
        turns(r#"[{"role":"user"}]"#),
        turns(r#"[{"role":"user","content":"a\ud800"}]"#),
        turns(r#""hi""#),
        r#"{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"x"}]}"#.to_owned(),
    ] {
        assert!(!ir_writes(&text), "the IR path writes {text}");
        let obj = validate::request_object(text.as_bytes()).unwrap();
        assert!(
            plain_messages_for_chat(&obj, "up", MODEL).is_none(),
            "written in one pass: {text}"
        );
    }
}

/// Every one-byte edit of the plain requests: whatever the one pass writes is what the IR path
/// writes.
#[test]
fn no_one_byte_edit_makes_the_one_pass_differ_from_the_ir_path() {
    let written = check::one_byte_edits(&PLAIN, agrees);
    // Most edits inside a text leave a plain request.
    assert!(
        written > 2_000,
        "only {written} edits were written in one pass"
    );
}
