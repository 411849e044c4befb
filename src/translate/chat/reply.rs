//! A chat upstream's reply read without serde from a body the body scan was sure of: the same [`Reply`] serde's read makes, for a fraction of its work and of its code.
//!
//! [`json::scan`] has checked the whole body (valid JSON, an object at the top, no key repeated
//! or escaped in any object), so the members are walked by brackets and quotes alone and match
//! their keys as written. Each value is read as serde's lenient readers read it (`Loose`,
//! `lax_struct!`); where serde's read would fail, the reader answers `None` and the caller asks
//! serde, which names the failure.

use super::{Call, Choice, Function, Message, Reply};
use crate::json::{self, Raw, RawObject};
use crate::translate::counts::Counts;
use crate::translate::lax::{struct_known, Loose};

impl<'a> Reply<'a> {
    /// The reply whose top-level members `top` holds, read from a body [`json::scan`] was sure
    /// of; `None` where serde's read would fail.
    pub fn from_scanned(top: &'a RawObject<'_>) -> Option<Self> {
        let member = |key| top.get(key).map_or(Some(Loose::Absent), scalar);
        Some(Reply {
            id: member("id")?,
            model: member("model")?,
            created: member("created")?,
            choices: match top.get("choices") {
                Some(raw) => Loose::from_known(raw, choice, |_| Some(Default::default()))?,
                None => Loose::Absent,
            },
            usage: match top.get("usage") {
                Some(raw) => Loose::from_known(
                    raw,
                    |_| Some(Default::default()),
                    |raw| Counts::object_at(raw.get().as_bytes()),
                )?,
                None => Loose::Absent,
            },
            ..Reply::default()
        })
    }
}

/// A scalar member's value; `None` where serde's read would fail.
fn scalar(raw: Raw<'_>) -> Option<Loose<'_>> {
    Loose::scalar_known(raw)
}

fn choice(raw: Raw<'_>) -> Option<Choice<'_>> {
    struct_known(raw, |raw| {
        let mut out = Choice::default();
        for (key, value) in json::members(raw) {
            match key {
                "message" => out.message = message(value)?,
                "finish_reason" => out.finish_reason = scalar(value)?,
                _ => {}
            }
        }
        Some(out)
    })
}

fn message(raw: Raw<'_>) -> Option<Message<'_>> {
    struct_known(raw, |raw| {
        let mut out = Message::default();
        for (key, value) in json::members(raw) {
            match key {
                "reasoning_content" => out.reasoning_content = scalar(value)?,
                "reasoning" => out.reasoning = scalar(value)?,
                "content" => out.content = scalar(value)?,
                "refusal" => out.refusal = scalar(value)?,
                "tool_calls" => {
                    out.tool_calls = Loose::from_known(value, call, |_| Some(Default::default()))?;
                }
                _ => {}
            }
        }
        Some(out)
    })
}

fn call(raw: Raw<'_>) -> Option<Call<'_>> {
    struct_known(raw, |raw| {
        let mut out = Call::default();
        for (key, value) in json::members(raw) {
            match key {
                "id" => out.id = scalar(value)?,
                "function" => out.function = function(value)?,
                _ => {}
            }
        }
        Some(out)
    })
}

fn function(raw: Raw<'_>) -> Option<Function<'_>> {
    struct_known(raw, |raw| {
        let mut out = Function::default();
        for (key, value) in json::members(raw) {
            match key {
                "name" => out.name = scalar(value)?,
                "arguments" => out.arguments = scalar(value)?,
                _ => {}
            }
        }
        Some(out)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;
    use crate::json::scan;

    /// Whether the scan was sure of `text`; when it was, the reader answers as serde's read
    /// does: the same `Reply`, member for member, or `None` exactly where serde fails.
    fn agrees(text: &[u8]) -> bool {
        let shown = String::from_utf8_lossy(text);
        let serde = json::from_body::<Reply<'_>>(text);
        let Some(top) = std::str::from_utf8(text).ok().and_then(scan::object_in) else {
            return false;
        };
        match (Reply::from_scanned(&top), serde) {
            (Some(quick), Ok(serde)) => {
                assert_eq!(format!("{quick:?}"), format!("{serde:?}"), "{shown}");
            }
            (None, Err(_)) => {}
            (quick, serde) => panic!(
                "read: {}, serde: {}: {shown}",
                quick.is_some(),
                serde.map_or_else(|e| e.to_string(), |_| "read".into())
            ),
        }
        true
    }

    /// Replies as providers write them: OpenAI's text and tool calls, DeepSeek's and vLLM's
    /// reasoning, a refusal, and the benchbed mock's.
    const REPLIES: [&str; 6] = [
        r#"{"id":"chatcmpl-mock000000000001","object":"chat.completion","created":1795747898,"model":"mock-gpt","system_fingerprint":"fp_mock","choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum dolor sit amet","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":20,"total_tokens":36}}"#,
        r#"{"id":"chatcmpl-9","object":"chat.completion","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}},{"id":"call_def","type":"function","function":{"name":"get_time","arguments":"{}"}}],"refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":82,"completion_tokens":17,"total_tokens":99,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default"}"#,
        r#"{"id":"ds-1","object":"chat.completion","created":1738000000,"model":"deepseek-reasoner","choices":[{"index":0,"message":{"role":"assistant","content":"Paris.\n\n**Answer:** Paris","reasoning_content":"The user asks \u2014 \"capital?\" \ud83d\ude00 Think\tstep\\by\/step."},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":300,"total_tokens":310,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":250},"prompt_cache_hit_tokens":0,"prompt_cache_miss_tokens":10}}"#,
        "{\n  \"id\": \"vllm-7\",\n  \"created\": 1.5,\n  \"model\": \"qwen3\",\n  \"choices\": [\n    {\"message\": {\"reasoning\": \"héllo — 日本 😀\", \"content\": \"\", \"tool_calls\": []}, \"finish_reason\": null, \"stop_reason\": 151645}\n  ],\n  \"usage\": null\n}\n",
        r#"{"id":"chatcmpl-r","created":-5,"model":"gpt-4o","choices":[{"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"content_filter"},{"message":{"content":"second"}}]}"#,
        r#"{"choices":[7,{"message":"x"}],"created":18446744073709551616,"id":5,"model":["a",{"b":[]}],"usage":{"prompt_tokens":"3","completion_tokens":2.0}}"#,
    ];

    #[test]
    fn replies_as_providers_write_them_are_read_as_serde_reads_them() {
        for text in REPLIES {
            assert!(agrees(text.as_bytes()), "left to serde: {text}");
        }
        let top = scan::object_in(REPLIES[1]).unwrap();
        let reply = Reply::from_scanned(&top).unwrap();
        let ir = super::super::reply_to_ir(&reply).unwrap();
        assert_eq!(ir.id, "chatcmpl-9");
        assert_eq!(ir.usage.cache_read, 64);
        assert_eq!(ir.usage.input, 18);
        assert!(matches!(
            &ir.content[1],
            crate::ir::Part::ToolCall { id, name, arguments }
                if id == "call_def" && name == "get_time" && arguments == "{}"
        ));
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
                (format!(r#"{{"usage":{{"prompt_tokens":{bad}}}}}"#), false),
                (format!(r#"{{"system_fingerprint":{bad}}}"#), true),
                (format!(r#"{{"choices":[{{"logprobs":[{bad}]}}]}}"#), true),
                (
                    format!(r#"{{"model":[{bad}],"usage":{{"x":{bad}}}}}"#),
                    true,
                ),
            ] {
                assert!(agrees(text.as_bytes()), "left to serde: {text}");
                let top = scan::object_in(&text).unwrap();
                assert_eq!(Reply::from_scanned(&top).is_some(), read, "{text}");
            }
        }
    }

    /// Every one-byte edit of the providers' replies (a byte deleted, or replaced by one that
    /// matters to JSON): the reader never answers otherwise than serde.
    #[test]
    fn no_one_byte_edit_makes_the_reader_differ_from_serde() {
        let mut read = 0;
        for text in REPLIES {
            let text = text.as_bytes();
            for at in 0..text.len() {
                let mut deleted = text.to_vec();
                deleted.remove(at);
                read += usize::from(agrees(&deleted));
                for b in *br#"{}[]",:\0e-9ntu "# {
                    let mut edited = text.to_vec();
                    edited[at] = b;
                    read += usize::from(agrees(&edited));
                }
            }
        }
        // Most edits leave valid JSON the scan is sure of: the reader, not serde, was tested.
        assert!(read > 10_000, "only {read} edits were read by the scan");
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
    const SCALARS: [&str; 12] = [
        "null",
        "true",
        "false",
        "0",
        "-0",
        "17",
        "2.5e3",
        "18446744073709551616",
        r#""""#,
        r#""text""#,
        r#""a\"b\\c\nd\u00e9\ud83d\ude00""#,
        r#""é日本""#,
    ];

    /// A JSON value from `seed` (each choice taken from its low bits), nesting to `depth`.
    fn value(seed: &mut u64, depth: u32) -> String {
        let mut pick = |n: u64| {
            let v = *seed % n;
            *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            v
        };
        match if depth == 0 { 0 } else { pick(3) } {
            0 => SCALARS[pick(SCALARS.len() as u64) as usize].to_owned(),
            1 => {
                let n = pick(4);
                let items: Vec<String> = (0..n).map(|_| value(seed, depth - 1)).collect();
                format!("[{}]", items.join(","))
            }
            _ => {
                let mut keys: Vec<&str> = (0..pick(6))
                    .map(|_| KEYS[pick(KEYS.len() as u64) as usize])
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                let members: Vec<String> = keys
                    .iter()
                    .map(|k| format!("\"{k}\":{}", value(seed, depth - 1)))
                    .collect();
                format!("{{{}}}", members.join(","))
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

        /// Objects made of the reply's keys at every level, with values of every kind: the
        /// reader never answers otherwise than serde.
        #[test]
        fn made_up_replies_are_read_as_serde_reads_them(seed: u64) {
            let mut seed = seed;
            let text = loop {
                let v = value(&mut seed, 5);
                if v.starts_with('{') {
                    break v;
                }
            };
            proptest::prop_assert!(agrees(text.as_bytes()), "left to serde: {}", text);
        }
    }
}
