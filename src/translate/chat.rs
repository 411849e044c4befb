//! Chat Completions ⇄ IR: client requests in, upstream requests out, replies and stream chunks both ways.

use serde_json::{json, Value};

use super::common::*;
use crate::config::Protocol;
use crate::error::GatewayError;
use crate::ir::{self, Event, Finish, Part, Reasoning, Usage};
use crate::json::write_json_str;
use crate::sse;
use crate::translate::counts::Counts;
use crate::translate::lax::{lax_struct, First, Loose, RawText};

pub mod plain;
#[cfg(test)]
mod reply;
mod request;
mod stream;

pub use request::{ir_to_request, request_to_ir, ClientContext, UpstreamContext};
pub use stream::{StreamDecoder, StreamEncoder};

// === replies ===

fn finish_from(reason: Option<&str>) -> Finish {
    match reason {
        Some("length") => Finish::MaxTokens,
        Some("tool_calls" | "function_call") => Finish::ToolUse,
        Some("content_filter") => Finish::ContentFilter,
        _ => Finish::EndTurn,
    }
}

fn finish_name(f: &Finish) -> &'static str {
    match f {
        Finish::EndTurn | Finish::StopSequence(_) => "stop",
        Finish::MaxTokens => "length",
        Finish::ToolUse => "tool_calls",
        Finish::ContentFilter => "content_filter",
    }
}

pub fn usage_from(u: &Value) -> Usage {
    let n = |p: &[&str]| super::common::at(u, p).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n(&["prompt_tokens"]);
    let cache_read = n(&["prompt_tokens_details", "cached_tokens"]);
    let cache_write = n(&["prompt_tokens_details", "cache_write_tokens"]);
    Usage {
        input: prompt.saturating_sub(cache_read.saturating_add(cache_write)),
        cache_read,
        cache_write,
        output: n(&["completion_tokens"]),
        reasoning: n(&["completion_tokens_details", "reasoning_tokens"]),
    }
}

pub fn usage_json(u: &Usage) -> Value {
    let mut details = json!({"cached_tokens": u.cache_read});
    if u.cache_write > 0 {
        details["cache_write_tokens"] = json!(u.cache_write);
    }
    json!({
        "prompt_tokens": u.prompt_total(),
        "completion_tokens": u.output,
        "total_tokens": u.total(),
        "prompt_tokens_details": details,
        "completion_tokens_details": {"reasoning_tokens": u.reasoning},
    })
}

lax_struct! {
    /// A chat upstream's non-streamed reply: the members [`reply_to_ir`] reads, each as `Value`'s
    /// accessors would see it, with nothing else kept.
    pub struct Reply<'a> {
        id: Loose<'a>,
        model: Loose<'a>,
        created: Loose<'a>,
        choices: First<Choice<'a>>,
        usage: RawText<'a>,
    }
}

lax_struct! {
    struct Choice<'a> {
        message: Message<'a>,
        finish_reason: Loose<'a>,
    }
}

lax_struct! {
    struct Message<'a> {
        reasoning_content: Loose<'a>,
        reasoning: Loose<'a>,
        content: Loose<'a>,
        refusal: Loose<'a>,
        tool_calls: Loose<'a, Call<'a>>,
    }
}

lax_struct! {
    struct Call<'a> {
        id: Loose<'a>,
        function: Function<'a>,
    }
}

lax_struct! {
    struct Function<'a> {
        name: Loose<'a>,
        arguments: Loose<'a>,
    }
}

/// Reads a chat upstream's non-streamed reply: the first choice's message, its finish reason,
/// and the usage.
pub fn reply_to_ir(v: &Reply<'_>) -> Result<ir::Response, GatewayError> {
    let choice = v.choices.0.as_ref().ok_or_else(|| {
        GatewayError::new(
            crate::error::ErrorKind::UpstreamBadResponse,
            "the upstream reply has no choices",
        )
    })?;
    let msg = &choice.message;
    let mut content = Vec::new();
    // `reasoning_content` when the key is there at all, even as null; `reasoning` otherwise.
    let reasoning = match msg.reasoning_content {
        Loose::Absent => &msg.reasoning,
        _ => &msg.reasoning_content,
    };
    if let Some(r) = reasoning.as_str().filter(|r| !r.is_empty()) {
        content.push(Part::Reasoning(Reasoning {
            text: r.to_owned(),
            ..Reasoning::default()
        }));
    }
    if let Some(t) = msg.content.as_str().filter(|t| !t.is_empty()) {
        content.push(Part::Text(t.to_owned()));
    }
    if let Some(t) = msg.refusal.as_str() {
        content.push(Part::Text(t.to_owned()));
    }
    for c in msg.tool_calls.as_array().unwrap_or_default() {
        content.push(Part::ToolCall {
            id: c
                .id
                .as_str()
                .map_or_else(|| ir::mint_id("call_"), str::to_owned),
            name: c.function.name.as_str().unwrap_or("").to_owned(),
            arguments: c.function.arguments.as_str().unwrap_or("").to_owned(),
        });
    }
    // Read by the hand reader every reply's usage goes through for the access log, which reads
    // it as `usage_from` reads a `Value`: a usage that is no object, or that serde cannot read,
    // counts nothing, and the reply is still served.
    let mut usage = Usage::default();
    if let Some(counts) = v
        .usage
        .0
        .and_then(|text| Counts::object_at(text.as_bytes()))
    {
        counts.read_into(Protocol::Chat, &mut usage);
    }
    Ok(ir::Response {
        id: v.id.as_str().unwrap_or("").to_owned(),
        model: v.model.as_str().unwrap_or("").to_owned(),
        created: v.created.as_u64().unwrap_or_else(ir::now_secs),
        content,
        finish: finish_from(choice.finish_reason.as_str()),
        usage,
    })
}

/// Writes the chat reply a chat client expects, straight to bytes: the members `Value` would
/// hold, in its (alphabetical) order at every level, so the bytes are those a tree wrote.
pub fn response_bytes(r: &ir::Response, client_model: &str) -> Vec<u8> {
    let mut text_len = 0;
    let mut reasoning_len = 0;
    let mut blocks = false;
    let mut calls = false;
    for p in &r.content {
        match p {
            Part::Text(t) => text_len += t.len(),
            Part::Reasoning(rs) => {
                reasoning_len += rs.text.len();
                blocks |= rs.signature.is_some() || rs.redacted.is_some();
            }
            Part::ToolCall { .. } => calls = true,
            _ => {}
        }
    }
    let mut out =
        Vec::with_capacity(400 + text_len + 2 * reasoning_len + r.id.len() + client_model.len());
    out.extend_from_slice(b"{\"choices\":[{\"finish_reason\":");
    write_json_str(&mut out, finish_name(&r.finish));
    out.extend_from_slice(b",\"index\":0,\"logprobs\":null,\"message\":{\"content\":");
    if text_len == 0 && calls {
        out.extend_from_slice(b"null");
    } else {
        write_joined(
            &mut out,
            r.content.iter().filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                _ => None,
            }),
        );
    }
    let reasoning = r.content.iter().filter_map(|p| match p {
        Part::Reasoning(rs) => Some(rs),
        _ => None,
    });
    if reasoning_len > 0 {
        out.extend_from_slice(b",\"reasoning_content\":");
        write_joined(&mut out, reasoning.clone().map(|rs| rs.text.as_str()));
    }
    out.extend_from_slice(b",\"refusal\":null,\"role\":\"assistant\"");
    if blocks {
        out.extend_from_slice(b",\"thinking_blocks\":[");
        let mut first = true;
        for rs in reasoning {
            let comma = if first { "" } else { "," };
            if let Some(sig) = &rs.signature {
                out.extend_from_slice(comma.as_bytes());
                out.extend_from_slice(b"{\"signature\":");
                write_json_str(&mut out, sig);
                out.extend_from_slice(b",\"thinking\":");
                write_json_str(&mut out, &rs.text);
                out.extend_from_slice(b",\"type\":\"thinking\"}");
            } else if let Some(data) = &rs.redacted {
                out.extend_from_slice(comma.as_bytes());
                out.extend_from_slice(b"{\"data\":");
                write_json_str(&mut out, data);
                out.extend_from_slice(b",\"type\":\"redacted_thinking\"}");
            } else {
                continue;
            }
            first = false;
        }
        out.push(b']');
    }
    if calls {
        out.extend_from_slice(b",\"tool_calls\":[");
        let mut first = true;
        for p in &r.content {
            let Part::ToolCall {
                id,
                name,
                arguments,
            } = p
            else {
                continue;
            };
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(b"{\"function\":{\"arguments\":");
            write_json_str(&mut out, arguments);
            out.extend_from_slice(b",\"name\":");
            write_json_str(&mut out, name);
            out.extend_from_slice(b"},\"id\":");
            write_json_str(&mut out, id);
            out.extend_from_slice(b",\"type\":\"function\"}");
        }
        out.push(b']');
    }
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"}}],\"created\":");
    out.extend_from_slice(n.format(r.created).as_bytes());
    out.extend_from_slice(b",\"id\":");
    write_json_str(&mut out, &reprefix(&r.id, "chatcmpl-"));
    out.extend_from_slice(b",\"model\":");
    write_json_str(&mut out, client_model);
    out.extend_from_slice(b",\"object\":\"chat.completion\",\"usage\":");
    write_usage(&mut out, &r.usage);
    out.push(b'}');
    out
}

/// Writes the strings one after the other as one JSON string.
fn write_joined<'s>(out: &mut Vec<u8>, parts: impl Iterator<Item = &'s str> + Clone) {
    let mut rest = parts.clone();
    match (rest.next(), rest.next()) {
        (Some(only), None) => write_json_str(out, only),
        // Rare: no part, or several to join.
        _ => write_json_str(out, &parts.collect::<String>()),
    }
}

/// The usage as [`usage_json`]'s tree writes it.
fn write_usage(out: &mut Vec<u8>, u: &Usage) {
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"{\"completion_tokens\":");
    out.extend_from_slice(n.format(u.output).as_bytes());
    out.extend_from_slice(b",\"completion_tokens_details\":{\"reasoning_tokens\":");
    out.extend_from_slice(n.format(u.reasoning).as_bytes());
    out.extend_from_slice(b"},\"prompt_tokens\":");
    out.extend_from_slice(n.format(u.prompt_total()).as_bytes());
    out.extend_from_slice(b",\"prompt_tokens_details\":{");
    if u.cache_write > 0 {
        out.extend_from_slice(b"\"cache_write_tokens\":");
        out.extend_from_slice(n.format(u.cache_write).as_bytes());
        out.push(b',');
    }
    out.extend_from_slice(b"\"cached_tokens\":");
    out.extend_from_slice(n.format(u.cache_read).as_bytes());
    out.extend_from_slice(b"},\"total_tokens\":");
    out.extend_from_slice(n.format(u.total()).as_bytes());
    out.push(b'}');
}

// === errors ===

pub fn error_body(e: &ir::ErrorInfo) -> Value {
    let kind = match e.status {
        400 | 404 | 405 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        _ => "server_error",
    };
    json!({"error": {"message": e.message, "type": kind, "param": null, "code": e.code}})
}

pub fn error_from_body(status: u16, v: &Value) -> ir::ErrorInfo {
    ir::ErrorInfo {
        status,
        message: v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map_or_else(|| v.to_string(), str::to_owned),
        code: v
            .pointer("/error/code")
            .and_then(Value::as_str)
            .or_else(|| v.pointer("/error/type").and_then(Value::as_str))
            .map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    /// The reply as the gateway wrote it through a `Value` tree before [`response_bytes`]: the
    /// reference its bytes are held to.
    fn value_response(r: &ir::Response, client_model: &str) -> Value {
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut blocks = Vec::new();
        let mut calls = Vec::new();
        for p in &r.content {
            match p {
                Part::Text(t) => text.push_str(t),
                Part::Reasoning(rs) => {
                    reasoning.push_str(&rs.text);
                    if let Some(sig) = &rs.signature {
                        blocks.push(json!({"type": "thinking", "thinking": rs.text, "signature": sig}));
                    } else if let Some(data) = &rs.redacted {
                        blocks.push(json!({"type": "redacted_thinking", "data": data}));
                    }
                }
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => calls.push(json!({
                    "id": id, "type": "function", "function": {"name": name, "arguments": arguments}})),
                _ => {}
            }
        }
        let mut msg = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }, "refusal": null});
        if !reasoning.is_empty() {
            msg["reasoning_content"] = json!(reasoning);
        }
        if !blocks.is_empty() {
            msg["thinking_blocks"] = Value::Array(blocks);
        }
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        json!({
            "id": reprefix(&r.id, "chatcmpl-"),
            "object": "chat.completion",
            "created": r.created,
            "model": client_model,
            "choices": [{"index": 0, "message": msg, "logprobs": null, "finish_reason": finish_name(&r.finish)}],
            "usage": usage_json(&r.usage),
        })
    }

    /// Written straight to bytes, a reply has the bytes its tree had: the same members, in
    /// `Value`'s (alphabetical) order, at every level.
    #[test]
    fn reply_bytes_are_the_trees_bytes() {
        let reasoning = |text: &str, signature: Option<&str>, redacted: Option<&str>| {
            Part::Reasoning(Reasoning {
                text: text.to_owned(),
                signature: signature.map(str::to_owned),
                redacted: redacted.map(str::to_owned),
            })
        };
        let call = |id: &str, arguments: &str| Part::ToolCall {
            id: id.to_owned(),
            name: "get \"weather\"".to_owned(),
            arguments: arguments.to_owned(),
        };
        let cases = [
            (vec![Part::Text("Hello".into())], Finish::EndTurn, 0),
            (
                vec![Part::Text("a".into()), Part::Text("b\n\u{1}é".into())],
                Finish::MaxTokens,
                5,
            ),
            (
                vec![
                    reasoning("why ", Some("sig"), None),
                    reasoning("", None, Some("opaque")),
                    reasoning("because", None, None),
                    Part::Text("42".into()),
                ],
                Finish::StopSequence(Some("END".into())),
                0,
            ),
            (
                vec![call("toolu_1", r#"{"city":"Paris"}"#), call("call_2", "{}")],
                Finish::ToolUse,
                7,
            ),
            (
                vec![Part::Text(String::new()), call("c", "")],
                Finish::ToolUse,
                0,
            ),
            (vec![reasoning("", None, None)], Finish::ContentFilter, 0),
            (vec![], Finish::EndTurn, 1),
        ];
        for (content, finish, cache_write) in cases {
            let r = ir::Response {
                id: "msg_01XYZ".into(),
                model: "m".into(),
                created: 1_700_000_000,
                content,
                finish,
                usage: Usage {
                    input: 3,
                    cache_read: 2,
                    cache_write,
                    output: 9,
                    reasoning: 4,
                },
            };
            let bytes = response_bytes(&r, "client \"model\"");
            let value = value_response(&r, "client \"model\"");
            assert_eq!(
                String::from_utf8(bytes).unwrap(),
                serde_json::to_string(&value).unwrap()
            );
            assert_eq!(value["id"], "chatcmpl-01XYZ");
        }
    }

    fn read(text: &str) -> Result<ir::Response, GatewayError> {
        reply_to_ir(&serde_json::from_str::<Reply<'_>>(text).unwrap())
    }

    /// The members are read as `Value`'s accessors read them: what is there but of another type
    /// counts as absent, the last of a repeated key wins, and a `reasoning_content` key that is
    /// there at all (even as null) hides `reasoning`.
    #[test]
    fn a_reply_reads_as_its_value_would() {
        let r = read(
            r#"{"id":"c1","id":"c2","model":7,"created":12,
                "choices":[{"message":{"content":"hi","reasoning":"why","refusal":"",
                    "tool_calls":[5,{"id":"t","function":{"name":"f","arguments":"{}"}},
                                  {"function":[1]}]},
                  "finish_reason":"tool_calls"},{"message":{"content":"second"}}],
                "usage":{"prompt_tokens":10,"completion_tokens":3,
                         "prompt_tokens_details":{"cached_tokens":4}},"extra":[{"a":"\ud800"}]}"#,
        )
        .unwrap();
        assert_eq!((r.id.as_str(), r.model.as_str(), r.created), ("c2", "", 12));
        assert_eq!(r.finish, Finish::ToolUse);
        assert_eq!(
            (r.usage.input, r.usage.cache_read, r.usage.output),
            (6, 4, 3)
        );
        let parts: Vec<String> = r
            .content
            .iter()
            .map(|p| match p {
                Part::Reasoning(x) => format!("reasoning {}", x.text),
                Part::Text(t) => format!("text {t}"),
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    format!(
                        "call {} {name} {arguments}",
                        id.starts_with("call_") || id == "t"
                    )
                }
                _ => "other".to_owned(),
            })
            .collect();
        assert_eq!(
            parts,
            [
                "reasoning why",
                "text hi",
                "text ",
                "call true  ",
                "call true f {}",
                "call true  "
            ]
        );
        let r = read(r#"{"choices":[{"message":{"reasoning_content":null,"reasoning":"x"}}]}"#)
            .unwrap();
        assert!(r.content.is_empty());
        assert_eq!(r.finish, Finish::EndTurn);
        assert!(r.created > 0);
    }

    #[test]
    fn a_reply_without_a_first_choice_is_refused() {
        for text in [
            "{}",
            "[]",
            "null",
            r#"{"choices":[]}"#,
            r#"{"choices":{"0":{}}}"#,
            r#"{"choices":"x"}"#,
        ] {
            let e = read(text).unwrap_err();
            assert!(e.message.contains("no choices"), "{text}: {e:?}");
        }
        // Any value as the first choice is read, as having nothing.
        assert!(read(r#"{"choices":[3]}"#).unwrap().content.is_empty());
    }
}
