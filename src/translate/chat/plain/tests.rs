//! Tests of the plain chat reply's one pass: for every reply it reads, the messages reply written from it is the IR path's, byte for byte.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
use super::read;
use crate::ir::Usage;
use crate::translate::chat::reply::{fixture_replies, REPLIES};
use crate::translate::chat::{reply_to_ir, Reply};
use crate::translate::hand::{self, check};
use crate::translate::messages;

const MODEL: &str = "client \"model\"";

/// The messages reply and usage the IR path makes of `text`, `None` where it answers an error.
fn ir_path(text: &str) -> Option<(Vec<u8>, Usage)> {
    let reply =
        hand::object::<Reply<'_>>(text).or_else(|| serde_json::from_str::<Reply<'_>>(text).ok())?;
    let r = reply_to_ir(&reply).ok()?;
    Some((messages::response_bytes(&r, MODEL), r.usage))
}

/// The reply with its id's value replaced, for an id the IR path mints afresh each time.
fn id_masked(bytes: &[u8]) -> String {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    // Inside a string a quote is escaped, so the first `],"id":"` is the reply's own.
    let at = text.find(r#"],"id":""#).unwrap() + 8;
    let end = at + text[at..].find('"').unwrap();
    format!("{}…{}", &text[..at], &text[end..])
}

/// Whether `read` answered for `text`; when it did, what is written from it is the IR path's.
fn agrees(text: &[u8]) -> bool {
    let Some(p) = std::str::from_utf8(text).ok().and_then(read) else {
        return false;
    };
    let shown = String::from_utf8_lossy(text);
    let (expected, usage) = ir_path(std::str::from_utf8(text).unwrap())
        .unwrap_or_else(|| panic!("read a reply the IR path refuses: {shown}"));
    let written = messages::plain_response_bytes(&p, MODEL);
    assert_eq!(p.usage, usage, "{shown}");
    let minted = ["", "chatcmpl-", "msg_", "resp_"].contains(&p.id);
    if minted {
        assert_eq!(id_masked(&written), id_masked(&expected), "{shown}");
    } else {
        assert_eq!(
            String::from_utf8(written).unwrap(),
            String::from_utf8(expected).unwrap(),
            "{shown}"
        );
    }
    true
}

/// Replies of the common shape, as providers write them, each read in the one pass.
const PLAIN: [&str; 8] = [
    r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Line one.\nShe said \"hi\" \\ \t tab\r\b\f","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":82,"completion_tokens":17,"total_tokens":99,"prompt_tokens_details":{"cached_tokens":64,"cache_write_tokens":8},"completion_tokens_details":{"reasoning_tokens":3}},"service_tier":"default"}"#,
    r#"{"id":"gen-9","model":"m","choices":[{"message":{"content":"héllo — 日本 😀","tool_calls":null,"reasoning_content":null,"reasoning":null},"finish_reason":"length"}]}"#,
    "{\n  \"id\": \"vllm-7\",\n  \"created\": 0,\n  \"model\": \"qwen3\",\n  \"choices\": [\n    {\"message\": {\"content\": \"x\"}, \"finish_reason\": null, \"stop_reason\": 151645}\n  ],\n  \"usage\": null\n}\n",
    r#"{"id":"msg_already","choices":[{"message":{"content":"a"},"finish_reason":"tool_calls"},{"message":{"content":"second","tool_calls" : null}},7],"usage":[1]}"#,
    r#"{"id":"c","choices":[{"message":{"content":"a"},"finish_reason":"content_filter"}],"usage":{"prompt_tokens":"3","completion_tokens":2}}"#,
    r#"{"id":"c","choices":[{"message":{"content":"a"},"finish_reason":"function_call"}],"usage":{"prompt_tokens":1e400}}"#,
    r#"{"choices":[{"finish_reason":"an unknown reason","message":{"role":"assistant","content":"Paris."}}],"id":"chatcmpl-","x":{"y":[{"\u00e9":"\ud800"}]}}"#,
    r#"{"id":"chatcmpl-mock000000000001","object":"chat.completion","created":18446744073709551616,"model":"mock-gpt","system_fingerprint":"fp_mock","choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":20,"total_tokens":36}}"#,
];

#[test]
fn plain_replies_are_written_as_the_ir_path_writes_them() {
    for text in PLAIN {
        assert!(agrees(text.as_bytes()), "left to the IR path: {text}");
    }
    // The mock's reply, the benchbed's, is one of them.
    assert!(agrees(REPLIES[0].as_bytes()));
    let p = read(PLAIN[0]).unwrap();
    assert_eq!(p.id, "chatcmpl-1");
    assert!(p.text.starts_with(r#""Line one.\nShe"#));
    assert_eq!(p.usage.cache_read, 64);
    assert_eq!(p.usage.cache_write, 8);
    assert_eq!(p.usage.input, 10);
}

/// Every shape with more than one text, or whose text would be written differently, or that
/// the IR path reads otherwise than a plain scalar: left to the IR path, which still answers
/// for each that is a reply.
#[test]
fn other_shapes_are_left_to_the_ir_path() {
    let reply = |message: &str| {
        format!(
            r#"{{"id":"c","model":"m","choices":[{{"message":{message},"finish_reason":"stop"}}]}}"#
        )
    };
    let mut cases: Vec<String> = [
        r#"{"content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        r#"{"content":"a","tool_calls":[]}"#,
        r#"{"content":"a","reasoning_content":"why"}"#,
        r#"{"content":"a","reasoning":""}"#,
        r#"{"content":"a","refusal":"no"}"#,
        r#"{"content":""}"#,
        r#"{"content":null}"#,
        r#"{"content":["a"]}"#,
        r#"{"content":"caf\u00e9"}"#,
        r#"{"content":"a\/b"}"#,
        r#"{"content":"a","content":"b"}"#,
        r#"{"role":"assistant"}"#,
        r#""text""#,
    ]
    .iter()
    .map(|m| reply(m))
    .collect();
    cases.extend(
        [
            r#"{"model":"m","choices":[{"message":{"content":"a"}}]}"#,
            r#"{"id":5,"choices":[{"message":{"content":"a"}}]}"#,
            r#"{"id":"c\u0031","choices":[{"message":{"content":"a"}}]}"#,
            r#"{"id":"c","id":"d","choices":[{"message":{"content":"a"}}]}"#,
            r#"{"id":"c","model":7,"choices":[{"message":{"content":"a"}}]}"#,
            r#"{"id":"c","created":-5,"choices":[{"message":{"content":"a"}}]}"#,
            r#"{"id":"c","created":1.5,"choices":[{"message":{"content":"a"}}]}"#,
            r#"{"id":"c","choices":[7,{"message":{"content":"a"}}]}"#,
            r#"{"id":"c","choices":[{"message":{"content":"a"},"message":{"content":"b"}}]}"#,
            r#"{"id":"c","choices":[{"message":{"content":"a"},"finish_reason":7}]}"#,
            r#"{"id":"c","choices":[{"message":{"content":"a"}}],"usage":{},"usage":{}}"#,
            r#"{"id":"c","choices":[{"message":{"content":"a"}}],"m\u006fdel":"m"}"#,
            // Tools called anywhere: left before the pass.
            r#"{"id":"c","choices":[{"message":{"content":"a"}},{"message":{"tool_calls" :  [{"id":"x"}]}}]}"#,
        ]
        .map(str::to_owned),
    );
    for text in &cases {
        assert!(read(text).is_none(), "read in one pass: {text}");
        assert!(ir_path(text).is_some(), "the IR path refuses {text}");
    }
    // What the IR path answers with an error is not read in one pass either.
    for text in [
        r#"{"id":"c","choices":[]}"#,
        r#"{"id":"c","choices":[{"message":{"content":"a"}}]} x"#,
        r#"{"id":"c","choices":[{"message":{"content":"a\ud800"}}]}"#,
    ] {
        assert!(read(text).is_none(), "read in one pass: {text}");
        assert!(ir_path(text).is_none(), "the IR path reads {text}");
    }
}

/// Every one-byte edit of the plain replies: whatever the one pass reads is written as the IR
/// path writes it.
#[test]
fn no_one_byte_edit_makes_the_one_pass_differ_from_the_ir_path() {
    let read = check::one_byte_edits(&PLAIN, agrees);
    // Most edits inside a text or a skipped member leave a plain reply.
    assert!(read > 5_000, "only {read} edits were read in one pass");
}

/// Replies assembled from members of every kind (odd scalars among them): whatever the one pass
/// reads is written as the IR path writes it.
#[test]
fn assembled_replies_are_written_as_the_ir_path_writes_them() {
    let ids = [
        r#""chatcmpl-7""#,
        r#""msg_1""#,
        r#""""#,
        r#""resp_""#,
        "null",
        "3",
    ];
    let texts = [
        r#""plain""#,
        r#""a\"b\\c\nd""#,
        r#""é日本""#,
        r#""\u00e9""#,
        r#""""#,
        "null",
        "true",
    ];
    let nulls = [
        "",
        r#","refusal":null"#,
        r#","tool_calls":null"#,
        r#","reasoning":"x""#,
    ];
    let finishes = [
        "",
        r#","finish_reason":"stop""#,
        r#","finish_reason":"length""#,
        r#","finish_reason":null"#,
        r#","finish_reason":"tool_calls""#,
    ];
    let usages = [
        "",
        r#","usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}"#,
        r#","usage":null"#,
        r#","usage":{"prompt_tokens":-1}"#,
    ];
    let mut read = 0;
    let mut seed: u64 = 7;
    let mut pick = |n: usize| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) as usize % n
    };
    for _ in 0..3000 {
        let text = format!(
            r#"{{"id":{},"choices":[{{"message":{{"content":{}{}}}{}}}{}]{}}}"#,
            ids[pick(ids.len())],
            texts[pick(texts.len())],
            nulls[pick(nulls.len())],
            finishes[pick(finishes.len())],
            ["", r#",{"message":{"content":"other"}}"#][pick(2)],
            usages[pick(usages.len())],
        );
        read += usize::from(agrees(text.as_bytes()));
    }
    assert!(
        read > 300,
        "only {read} assembled replies were read in one pass"
    );
}

/// The chat replies of the fixture suite: each of the common shape is read in the one pass.
#[test]
fn the_fixture_replies_of_the_common_shape_are_read_in_one_pass() {
    let read = fixture_replies()
        .iter()
        .filter(|text| agrees(text.as_bytes()))
        .count();
    // Text replies, of both suites; the rest carry tool calls, reasoning or a refusal.
    assert!(read >= 10, "{read} fixture replies read in one pass");
}
