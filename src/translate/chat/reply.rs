//! A chat upstream's reply read by hand in one pass: the same [`Reply`] serde's read makes, when the reader is sure of the text, for a fraction of serde's work and code.
//!
//! The walk is [`json::walk`]'s, over text checked as UTF-8 whole: every value is checked as
//! serde checks it, and the members [`Reply`] keeps are read as serde's lenient readers read
//! them (`Loose`, `lax_struct!`; the usage is kept as text, as serde keeps it). Anything the
//! reader is unsure of (an escaped key, deep nesting) answers `None`, and the caller asks
//! serde, which also names every failure.

use std::borrow::Cow;

use serde::de::IgnoredAny;

use super::{Call, Choice, Function, Message, Reply};
use crate::json::walk::{self, literal, number, object, space};
use crate::translate::lax::{Loose, RawText};

impl<'a> Reply<'a> {
    /// The reply `text` holds, when the hand reader is sure of it.
    pub fn by_hand(text: &'a str) -> Option<Self> {
        let b = text.as_bytes();
        let mut out = Reply::default();
        // Assigning each member as it comes leaves the last of a repeated key, as serde does.
        let end = object::<true>(b, space(b, 0), |key, at| match key {
            k if k == b"id" => scalar(text, at, 1, &mut out.id),
            k if k == b"model" => scalar(text, at, 1, &mut out.model),
            k if k == b"created" => scalar(text, at, 1, &mut out.created),
            k if k == b"choices" => loose(text, at, 1, &mut out.choices, choice),
            k if k == b"usage" => {
                // Kept as text: the counts reader reads it when the reply is translated.
                let end = walk::skip::<true>(b, at, 1)?;
                out.usage = RawText(Some(text.get(at..end)?));
                Some(end)
            }
            _ => walk::skip::<true>(b, at, 1),
        })?;
        (space(b, end) == b.len()).then_some(out)
    }
}

/// Reads the value at `at` (inside `open` containers) into `into` as a `Loose` reads it: an
/// array's elements by `element`, which answers what it read and where it ends; an object
/// skipped, as no member the reply keeps is read as one. Answers where the value ends.
fn loose<'a, A>(
    text: &'a str,
    at: usize,
    open: usize,
    into: &mut Loose<'a, A>,
    mut element: impl FnMut(&'a str, usize, usize) -> Option<(A, usize)>,
) -> Option<usize> {
    let b = text.as_bytes();
    let (value, end) = match *b.get(at)? {
        b'"' => {
            let (end, escaped) = walk::string::<true>(b, at + 1)?;
            let s = if escaped {
                // Unescaped by serde, which also refuses a lone surrogate as its read would.
                Cow::Owned(serde_json::from_str::<String>(text.get(at..end)?).ok()?)
            } else {
                Cow::Borrowed(text.get(at + 1..end - 1)?)
            };
            (Loose::Str(s), end)
        }
        b'{' => (Loose::Obj(IgnoredAny), walk::skip::<true>(b, at, open)?),
        b'[' => {
            let mut items = Vec::new();
            let end = array(b, at, |at| {
                let (item, end) = element(text, at, open + 1)?;
                items.push(item);
                Some(end)
            })?;
            (Loose::Arr(items), end)
        }
        b't' => (Loose::Bool(true), literal(b, at, b"true")?),
        b'f' => (Loose::Bool(false), literal(b, at, b"false")?),
        b'n' => (Loose::Null, literal(b, at, b"null")?),
        _ => {
            let end = number(b, at)?;
            // Parsed as serde parses it: an f64 out of range fails, as its read would.
            (Loose::Num(text.get(at..end)?.parse().ok()?), end)
        }
    };
    *into = value;
    Some(end)
}

/// Reads the array whose `[` is at `at`: `element` reads each element and answers where it
/// ends. Answers where the array ends.
fn array(b: &[u8], at: usize, mut element: impl FnMut(usize) -> Option<usize>) -> Option<usize> {
    let mut i = space(b, at + 1);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        i = space(b, element(i)?);
        match b.get(i)? {
            b',' => i = space(b, i + 1),
            b']' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// An element a `Loose` keeps nothing of, skipped as serde skips it.
fn skipped(text: &str, at: usize, open: usize) -> Option<(IgnoredAny, usize)> {
    Some((IgnoredAny, walk::skip::<true>(text.as_bytes(), at, open)?))
}

/// A member read as a scalar `Loose`.
fn scalar<'a>(text: &'a str, at: usize, open: usize, into: &mut Loose<'a>) -> Option<usize> {
    loose(text, at, open, into, skipped)
}

/// Reads the value at `at` as a `lax_struct!` reads it: an object by `member`, given each key
/// and where its value starts; any other value as the default, once checked as serde reads it.
fn lax<T: Default>(
    text: &str,
    at: usize,
    open: usize,
    mut member: impl FnMut(&mut T, &[u8], usize) -> Option<usize>,
) -> Option<(T, usize)> {
    let b = text.as_bytes();
    let mut out = T::default();
    let end = if b.get(at) == Some(&b'{') {
        if open >= walk::DEEPEST {
            return None;
        }
        object::<true>(b, at, |key, at| member(&mut out, key, at))?
    } else {
        // A scalar is read whole (and fails where a `Loose` would); an array's elements are
        // skipped.
        scalar(text, at, open, &mut Loose::default())?
    };
    Some((out, end))
}

fn choice(text: &str, at: usize, open: usize) -> Option<(Choice<'_>, usize)> {
    let b = text.as_bytes();
    lax::<Choice<'_>>(text, at, open, |out, key, at| match key {
        k if k == b"message" => {
            let (message, end) = message(text, at, open + 1)?;
            out.message = message;
            Some(end)
        }
        k if k == b"finish_reason" => scalar(text, at, open + 1, &mut out.finish_reason),
        _ => walk::skip::<true>(b, at, open + 1),
    })
}

fn message(text: &str, at: usize, open: usize) -> Option<(Message<'_>, usize)> {
    let b = text.as_bytes();
    lax::<Message<'_>>(text, at, open, |out, key, at| match key {
        k if k == b"content" => scalar(text, at, open + 1, &mut out.content),
        k if k == b"reasoning_content" => scalar(text, at, open + 1, &mut out.reasoning_content),
        k if k == b"reasoning" => scalar(text, at, open + 1, &mut out.reasoning),
        k if k == b"refusal" => scalar(text, at, open + 1, &mut out.refusal),
        k if k == b"tool_calls" => loose(text, at, open + 1, &mut out.tool_calls, call),
        _ => walk::skip::<true>(b, at, open + 1),
    })
}

fn call(text: &str, at: usize, open: usize) -> Option<(Call<'_>, usize)> {
    let b = text.as_bytes();
    lax::<Call<'_>>(text, at, open, |out, key, at| match key {
        k if k == b"id" => scalar(text, at, open + 1, &mut out.id),
        k if k == b"function" => {
            let (function, end) = function(text, at, open + 1)?;
            out.function = function;
            Some(end)
        }
        _ => walk::skip::<true>(b, at, open + 1),
    })
}

fn function(text: &str, at: usize, open: usize) -> Option<(Function<'_>, usize)> {
    let b = text.as_bytes();
    lax::<Function<'_>>(text, at, open, |out, key, at| match key {
        k if k == b"name" => scalar(text, at, open + 1, &mut out.name),
        k if k == b"arguments" => scalar(text, at, open + 1, &mut out.arguments),
        _ => walk::skip::<true>(b, at, open + 1),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;
    use crate::json;

    /// Whether the hand reader answered for `text`; when it did, it read what serde's read
    /// finds, member for member. Whatever it did, the reply is read as serde reads it.
    fn agrees(text: &[u8]) -> bool {
        let shown = String::from_utf8_lossy(text);
        let serde = json::from_body::<Reply<'_>>(text);
        let Some(quick) = std::str::from_utf8(text).ok().and_then(Reply::by_hand) else {
            return false;
        };
        match serde {
            Ok(serde) => assert_eq!(format!("{quick:?}"), format!("{serde:?}"), "{shown}"),
            Err(e) => panic!("the hand reader read what serde refuses ({e}): {shown}"),
        }
        true
    }

    /// Replies as providers write them: OpenAI's text and tool calls, DeepSeek's and vLLM's
    /// reasoning, a refusal, and the benchbed mock's.
    const REPLIES: [&str; 6] = [
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
        let reply = Reply::by_hand(REPLIES[1]).unwrap();
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
            let text =
                format!(r#"{{"choices":[{{"message":{{"content":"hi"}}}}],"usage":{usage}}}"#);
            let quick = Reply::by_hand(&text).unwrap();
            let serde = json::from_body::<Reply<'_>>(text.as_bytes()).unwrap();
            for reply in [quick, serde] {
                let ir = super::super::reply_to_ir(&reply).unwrap();
                assert_eq!(ir.usage, crate::ir::Usage::default(), "{text}");
                assert_eq!(
                    ir.content,
                    vec![crate::ir::Part::Text("hi".into())],
                    "{text}"
                );
            }
        }
        let text = r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}"#;
        let reply = Reply::by_hand(text).unwrap();
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
        let mut read = 0;
        for text in REPLIES {
            let text = text.as_bytes();
            for at in 0..text.len() {
                let mut deleted = text.to_vec();
                deleted.remove(at);
                read += usize::from(agrees(&deleted));
                for b in *b"{}[]\",:\\\x00\x1f\x7fe-9ntu \xc3" {
                    let mut edited = text.to_vec();
                    edited[at] = b;
                    read += usize::from(agrees(&edited));
                }
            }
        }
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
            // Read by hand or left to serde; what is read is read as serde reads it.
            agrees(text.as_bytes());
        }
    }
}
