//! Tests of a chat upstream's reply read by hand (`translate::hand`): what it reads of the replies providers write is what serde's read of the same [`Reply`] finds.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
use super::{reply_to_ir, Reply};
use crate::json;
use crate::translate::hand::{self, check};

fn agrees(text: &[u8]) -> bool {
    check::agrees::<Reply<'_>>(text)
}

/// Replies as providers write them: OpenAI's text and tool calls, DeepSeek's and vLLM's
/// reasoning, a refusal, and the benchbed mock's.
pub(super) const REPLIES: [&str; 6] = [
    r#"{"id":"chatcmpl-mock000000000001","object":"chat.completion","created":1795747898,"model":"mock-gpt","system_fingerprint":"fp_mock","choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum dolor sit amet","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":20,"total_tokens":36}}"#,
    r#"{"id":"chatcmpl-9","object":"chat.completion","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}},{"id":"call_def","type":"function","function":{"name":"get_time","arguments":"{}"}}],"refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":82,"completion_tokens":17,"total_tokens":99,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default"}"#,
    r#"{"id":"ds-1","object":"chat.completion","system_fingerprint":"fp_\u00e9\n","created":1738000000,"model":"deepseek-reasoner","choices":[{"index":0,"message":{"role":"assistant","content":"Paris.\n\n**Answer:** Paris","reasoning_content":"The user asks \u2014 \"capital?\" \ud83d\ude00 Think\tstep\\by\/step."},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":300,"total_tokens":310,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":250},"prompt_cache_hit_tokens":0,"prompt_cache_miss_tokens":10}}"#,
    "{\n  \"id\": \"vllm-7\",\n  \"created\": 1.5,\n  \"model\": \"qwen3\",\n  \"choices\": [\n    {\"message\": {\"reasoning\": \"héllo — 日本 😀\", \"content\": \"\", \"tool_calls\": []}, \"finish_reason\": null, \"stop_reason\": 151645}\n  ],\n  \"usage\": null\n}\n",
    r#"{"id":"chatcmpl-r","created":-5,"model":"gpt-4o","choices":[{"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"content_filter"},{"message":{"content":"second"}}]}"#,
    r#"{"choices":[7,{"message":"x"}],"created":18446744073709551616,"id":5,"model":["a",{"b":[]}],"usage":{"prompt_tokens":"3","completion_tokens":true,"x":[2.0]}}"#,
];

#[test]
fn replies_as_providers_write_them_are_read_as_serde_reads_them() {
    for text in REPLIES {
        assert!(agrees(text.as_bytes()), "left to serde: {text}");
    }
    let reply = hand::object::<Reply<'_>>(REPLIES[1]).unwrap();
    let ir = reply_to_ir(&reply).unwrap();
    assert_eq!(ir.id, "chatcmpl-9");
    assert_eq!(ir.usage.cache_read, 64);
    assert_eq!(ir.usage.input, 18);
    assert!(matches!(
        &ir.content[1],
        crate::ir::Part::ToolCall { id, name, arguments }
            if id == "call_def" && name == "get_time" && arguments == "{}"
    ));
}

/// A usage serde cannot read counts nothing and the reply is still translated, as when
/// the usage was read into a `Value`.
#[test]
fn an_unreadable_usage_counts_nothing() {
    for usage in [
        r#"{"prompt_tokens":1e400}"#,
        r#"{"x":"\ud800"}"#,
        "[1]",
        "7",
    ] {
        let text = format!(r#"{{"choices":[{{"message":{{"content":"hi"}}}}],"usage":{usage}}}"#);
        let quick = hand::object::<Reply<'_>>(&text).unwrap();
        let serde = json::from_body::<Reply<'_>>(text.as_bytes()).unwrap();
        for reply in [quick, serde] {
            let ir = reply_to_ir(&reply).unwrap();
            assert_eq!(ir.usage, crate::ir::Usage::default(), "{text}");
            assert_eq!(
                ir.content,
                vec![crate::ir::Part::Text("hi".into())],
                "{text}"
            );
        }
    }
    let text = r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}"#;
    let reply = hand::object::<Reply<'_>>(text).unwrap();
    assert_eq!(
        reply.usage.0,
        Some(r#"{"prompt_tokens":9,"completion_tokens":2}"#)
    );
}

/// Values serde's read refuses where a member is read, and accepts where it is skipped.
#[test]
fn what_serde_refuses_is_refused_where_serde_reads_it() {
    for bad in ["1e400", "-1e999", r#""\ud800""#, r#""a\udc00b""#] {
        for (text, read) in [
            (format!(r#"{{"id":{bad}}}"#), false),
            (format!(r#"{{"created":{bad}}}"#), false),
            (format!(r#"{{"choices":[{bad}]}}"#), false),
            (
                format!(r#"{{"choices":[{{"finish_reason":{bad}}}]}}"#),
                false,
            ),
            (format!(r#"{{"choices":[{{"message":{bad}}}]}}"#), false),
            (
                format!(r#"{{"choices":[{{"message":{{"content":{bad}}}}}]}}"#),
                false,
            ),
            (
                format!(
                    r#"{{"choices":[{{"message":{{"tool_calls":[{{"function":{{"arguments":{bad}}}}}]}}}}]}}"#
                ),
                false,
            ),
            // The usage is kept as text, as serde keeps it: read by the counts reader later.
            (format!(r#"{{"usage":{{"prompt_tokens":{bad}}}}}"#), true),
            (format!(r#"{{"system_fingerprint":{bad}}}"#), true),
            (format!(r#"{{"choices":[{{"logprobs":[{bad}]}}]}}"#), true),
            (format!(r#"{{"model":[{bad}],"x":{{"y":{bad}}}}}"#), true),
        ] {
            assert_eq!(agrees(text.as_bytes()), read, "{text}");
            assert_eq!(
                json::from_body::<Reply<'_>>(text.as_bytes()).is_ok(),
                read,
                "{text}"
            );
        }
    }
}

#[test]
fn what_follows_the_reply_is_space_or_nothing() {
    let reply = REPLIES[0];
    for after in ["", " \n\t\r ", " x", "{}", ",", "\u{0}"] {
        let text = format!("  {reply}{after}");
        let space = after.trim_start_matches([' ', '\n', '\t', '\r']).is_empty();
        assert_eq!(agrees(text.as_bytes()), space, "{text:?}");
    }
}

/// Every one-byte edit of the providers' replies (a byte deleted, or replaced by one that
/// matters to JSON): the reader never answers otherwise than serde.
#[test]
fn no_one_byte_edit_makes_the_reader_differ_from_serde() {
    let read = check::one_byte_edits(&REPLIES, agrees);
    // Most edits leave valid JSON the reader is sure of: the reader, not serde, was tested.
    assert!(read > 10_000, "only {read} edits were read by hand");
}

const KEYS: [&str; 16] = [
    "id",
    "model",
    "created",
    "choices",
    "usage",
    "message",
    "finish_reason",
    "content",
    "reasoning",
    "reasoning_content",
    "refusal",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "x",
];
proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

    /// Objects made of the reply's keys at every level, with values of every kind: the
    /// reader never answers otherwise than serde.
    #[test]
    fn made_up_replies_are_read_as_serde_reads_them(seed: u64) {
        let text = check::made_up(seed, 5, &KEYS, &check::SCALARS);
        // Read by hand or left to serde; what is read is read as serde reads it.
        agrees(text.as_bytes());
    }
}

/// The chat upstreams' whole replies of the fixture suite (`tests/fixtures/*_to_chat`).
pub(super) fn fixture_replies() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for dir in ["messages_to_chat", "responses_to_chat"] {
        for case in std::fs::read_dir(root.join(dir)).unwrap() {
            if let Ok(text) =
                std::fs::read_to_string(case.unwrap().path().join("upstream_reply.json"))
            {
                out.push(text);
            }
        }
    }
    out
}

/// The chat replies of the fixture suite are all read by hand.
#[test]
fn the_fixture_replies_are_read_by_hand() {
    let replies = fixture_replies();
    for text in &replies {
        assert!(agrees(text.as_bytes()), "left to serde: {text}");
    }
    assert!(replies.len() > 10, "{} replies", replies.len());
}
