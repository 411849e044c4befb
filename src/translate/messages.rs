//! Anthropic Messages ⇄ IR: client requests in, upstream requests out, replies and stream events both ways.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{json, Value};

use super::common::*;
use crate::error::GatewayError;
use crate::ir::{self, Event, Finish, Part, Reasoning, Usage};
use crate::json::write_json_str;
use crate::sse;

/// The tool that carries JSON mode toward a messages upstream (the forced-tool technique).
pub const JSON_TOOL: &str = "json_tool_call";

mod request;
mod stream;

pub use request::{
    ir_to_request, request_to_ir, AnthropicThinking, ClientContext, UpstreamContext,
};
pub use stream::{StreamDecoder, StreamEncoder};

// === replies ===

fn finish_from(reason: Option<&str>, stop_sequence: Option<&str>) -> Finish {
    match reason {
        Some("max_tokens" | "model_context_window_exceeded") => Finish::MaxTokens,
        Some("tool_use") => Finish::ToolUse,
        Some("refusal") => Finish::ContentFilter,
        Some("stop_sequence") => Finish::StopSequence(stop_sequence.map(str::to_owned)),
        _ => Finish::EndTurn,
    }
}

fn finish_name(f: &Finish) -> &'static str {
    match f {
        Finish::EndTurn => "end_turn",
        Finish::StopSequence(_) => "stop_sequence",
        Finish::MaxTokens => "max_tokens",
        Finish::ToolUse => "tool_use",
        Finish::ContentFilter => "refusal",
    }
}

pub(crate) fn usage_from(u: &Value, into: &mut Usage) {
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(x) = n("input_tokens") {
        into.input = x;
    }
    if let Some(x) = n("cache_read_input_tokens") {
        into.cache_read = x;
    }
    if let Some(x) = n("cache_creation_input_tokens") {
        into.cache_write = x;
    }
    if let Some(x) = n("output_tokens") {
        into.output = x;
    }
    if let Some(x) =
        super::common::at(u, &["output_tokens_details", "thinking_tokens"]).and_then(Value::as_u64)
    {
        into.reasoning = x;
    }
}

/// Reads a messages upstream's non-streamed reply; `json_mode` turns the JSON tool back into text.
pub fn response_to_ir(v: &Value, json_mode: bool) -> Result<ir::Response, GatewayError> {
    let mut content = Vec::new();
    let mut finish = finish_from(
        v.get("stop_reason").and_then(Value::as_str),
        v.get("stop_sequence").and_then(Value::as_str),
    );
    for b in v
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => content.push(Part::Text(str_at(b, "text"))),
            Some("thinking") => content.push(Part::Reasoning(Reasoning {
                text: str_at(b, "thinking"),
                signature: b
                    .get("signature")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
                redacted: None,
            })),
            Some("redacted_thinking") => content.push(Part::Reasoning(Reasoning {
                redacted: b.get("data").and_then(Value::as_str).map(str::to_owned),
                ..Reasoning::default()
            })),
            Some("tool_use") => {
                let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                let input = b
                    .get("input")
                    .map_or_else(|| "{}".to_owned(), Value::to_string);
                if json_mode && name == JSON_TOOL {
                    content.push(Part::Text(input));
                    finish = Finish::EndTurn;
                } else {
                    content.push(Part::ToolCall {
                        id: str_at(b, "id"),
                        name: name.to_owned(),
                        arguments: input,
                    });
                }
            }
            _ => {}
        }
    }
    let mut usage = Usage::default();
    if let Some(u) = v.get("usage") {
        usage_from(u, &mut usage);
    }
    Ok(ir::Response {
        id: str_at(v, "id"),
        model: str_at(v, "model"),
        created: ir::now_secs(),
        content,
        finish,
        usage,
    })
}

/// The reply a messages client expects. Its members are declared in alphabetical order, the
/// order `Value`'s map writes them in, so the bytes are the same whichever way it is written.
#[derive(Serialize)]
struct Reply<'a> {
    content: Vec<Block<'a>>,
    id: String,
    model: &'a str,
    role: &'static str,
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
    usage: ReplyUsage,
}

/// A content block, its members in alphabetical order with `type` among them.
#[derive(Serialize)]
#[serde(untagged)]
enum Block<'a> {
    Text {
        text: Cow<'a, str>,
        #[serde(rename = "type")]
        kind: &'static str,
    },
    Thinking {
        signature: &'a str,
        thinking: &'a str,
        #[serde(rename = "type")]
        kind: &'static str,
    },
    Redacted {
        data: &'a str,
        #[serde(rename = "type")]
        kind: &'static str,
    },
    ToolUse {
        id: &'a str,
        input: Value,
        name: &'a str,
        #[serde(rename = "type")]
        kind: &'static str,
    },
}

#[derive(Serialize)]
struct ReplyUsage {
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    input_tokens: u64,
    output_tokens: u64,
}

fn reply<'a>(r: &'a ir::Response, client_model: &'a str) -> Reply<'a> {
    let mut content = Vec::new();
    for p in &r.content {
        match p {
            Part::Text(t) => match content.last_mut() {
                Some(Block::Text { text, .. }) => text.to_mut().push_str(t),
                _ => content.push(Block::Text {
                    // Borrowed unless a second text part joins it.
                    text: Cow::Borrowed(t),
                    kind: "text",
                }),
            },
            // Reasoning from a non-Anthropic upstream has no signature; "" says so without inventing one.
            Part::Reasoning(rs) => match &rs.redacted {
                Some(data) => content.push(Block::Redacted {
                    data,
                    kind: "redacted_thinking",
                }),
                None => content.push(Block::Thinking {
                    signature: rs.signature.as_deref().unwrap_or_default(),
                    thinking: &rs.text,
                    kind: "thinking",
                }),
            },
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                let input = serde_json::from_str::<Value>(arguments)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                content.push(Block::ToolUse {
                    id,
                    input,
                    name,
                    kind: "tool_use",
                });
            }
            _ => {}
        }
    }
    Reply {
        content,
        id: reprefix(&r.id, "msg_"),
        model: client_model,
        role: "assistant",
        stop_reason: finish_name(&r.finish),
        stop_sequence: match &r.finish {
            Finish::StopSequence(s) => s.as_deref(),
            _ => None,
        },
        kind: "message",
        usage: ReplyUsage {
            cache_creation_input_tokens: r.usage.cache_write,
            cache_read_input_tokens: r.usage.cache_read,
            input_tokens: r.usage.input,
            output_tokens: r.usage.output,
        },
    }
}

/// Writes the reply a messages client expects.
pub fn ir_to_response(r: &ir::Response, client_model: &str) -> Value {
    // Plain structs and a `Value` always serialise; the fallbacks are never taken.
    serde_json::to_value(reply(r, client_model)).unwrap_or(Value::Null)
}

/// The same reply as [`ir_to_response`], written straight to bytes with no `Value` between,
/// member by member in the order `Value` writes them (serde's writer cost three times as much).
pub fn response_bytes(r: &ir::Response, client_model: &str) -> Vec<u8> {
    let reply = reply(r, client_model);
    let text: usize = r
        .content
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.len(),
            Part::Reasoning(rs) => rs.text.len(),
            _ => 64,
        })
        .sum();
    let mut out = Vec::with_capacity(320 + text + reply.id.len() + client_model.len());
    reply.write(&mut out);
    out
}

impl Reply<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"content\":[");
        for (i, block) in self.content.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            block.write(out);
        }
        out.extend_from_slice(b"],\"id\":");
        write_json_str(out, &self.id);
        out.extend_from_slice(b",\"model\":");
        write_json_str(out, self.model);
        out.extend_from_slice(b",\"role\":");
        write_json_str(out, self.role);
        out.extend_from_slice(b",\"stop_reason\":");
        write_json_str(out, self.stop_reason);
        out.extend_from_slice(b",\"stop_sequence\":");
        match self.stop_sequence {
            Some(s) => write_json_str(out, s),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"type\":");
        write_json_str(out, self.kind);
        let u = &self.usage;
        let mut n = itoa::Buffer::new();
        out.extend_from_slice(b",\"usage\":{\"cache_creation_input_tokens\":");
        out.extend_from_slice(n.format(u.cache_creation_input_tokens).as_bytes());
        out.extend_from_slice(b",\"cache_read_input_tokens\":");
        out.extend_from_slice(n.format(u.cache_read_input_tokens).as_bytes());
        out.extend_from_slice(b",\"input_tokens\":");
        out.extend_from_slice(n.format(u.input_tokens).as_bytes());
        out.extend_from_slice(b",\"output_tokens\":");
        out.extend_from_slice(n.format(u.output_tokens).as_bytes());
        out.extend_from_slice(b"}}");
    }
}

impl Block<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Self::Text { text, kind } => {
                out.extend_from_slice(b"{\"text\":");
                write_json_str(out, text);
                out.extend_from_slice(b",\"type\":");
                write_json_str(out, kind);
            }
            Self::Thinking {
                signature,
                thinking,
                kind,
            } => {
                out.extend_from_slice(b"{\"signature\":");
                write_json_str(out, signature);
                out.extend_from_slice(b",\"thinking\":");
                write_json_str(out, thinking);
                out.extend_from_slice(b",\"type\":");
                write_json_str(out, kind);
            }
            Self::Redacted { data, kind } => {
                out.extend_from_slice(b"{\"data\":");
                write_json_str(out, data);
                out.extend_from_slice(b",\"type\":");
                write_json_str(out, kind);
            }
            Self::ToolUse {
                id,
                input,
                name,
                kind,
            } => {
                out.extend_from_slice(b"{\"id\":");
                write_json_str(out, id);
                out.extend_from_slice(b",\"input\":");
                // A `Value` always serialises into a Vec; its keys are already in order.
                let _ = serde_json::to_writer(&mut *out, input);
                out.extend_from_slice(b",\"name\":");
                write_json_str(out, name);
                out.extend_from_slice(b",\"type\":");
                write_json_str(out, kind);
            }
        }
        out.push(b'}');
    }
}

// === errors ===

fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 | 503 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

pub fn error_body(e: &ir::ErrorInfo) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

pub fn error_from_body(status: u16, v: &Value) -> ir::ErrorInfo {
    ir::ErrorInfo {
        status,
        message: v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map_or_else(|| v.to_string(), str::to_owned),
        code: v
            .pointer("/error/type")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

fn status_of_error_type(t: Option<&str>) -> u16 {
    match t {
        Some("overloaded_error") => 529,
        Some("rate_limit_error") => 429,
        Some("invalid_request_error") => 400,
        Some("timeout_error") => 504,
        _ => 500,
    }
}

/// A keep-alive for Anthropic clients while the upstream is silent.
pub const PING: &[u8] = b"event: ping\ndata: {\"type\": \"ping\"}\n\n";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    /// Written straight from the structs, a reply has the bytes `Value` writes for it: the same
    /// members, in its (alphabetical) order, at every level.
    #[test]
    fn reply_bytes_are_the_values_bytes() {
        let reasoning = |text: &str, signature: Option<&str>, redacted: Option<&str>| {
            Part::Reasoning(Reasoning {
                text: text.to_owned(),
                signature: signature.map(str::to_owned),
                redacted: redacted.map(str::to_owned),
            })
        };
        let call = |arguments: &str| Part::ToolCall {
            id: "toolu_1".to_owned(),
            name: "get \"weather\"".to_owned(),
            arguments: arguments.to_owned(),
        };
        let cases = [
            (
                vec![Part::Text("a".into()), Part::Text("b\n".into())],
                Finish::EndTurn,
            ),
            (
                vec![
                    reasoning("why", None, None),
                    reasoning("", Some("sig"), None),
                    reasoning("", None, Some("opaque")),
                    Part::Text("é".into()),
                ],
                Finish::StopSequence(Some("END".into())),
            ),
            (
                vec![
                    call(r#"{"z":1,"a":[true,null]}"#),
                    call("not json"),
                    call("[1]"),
                ],
                Finish::ToolUse,
            ),
            (vec![], Finish::StopSequence(None)),
            (vec![Part::Text(String::new())], Finish::MaxTokens),
            (vec![], Finish::ContentFilter),
        ];
        for (content, finish) in cases {
            let r = ir::Response {
                id: "chatcmpl-7".into(),
                model: "m".into(),
                created: 1,
                content,
                finish,
                usage: Usage {
                    input: 3,
                    cache_read: 2,
                    cache_write: 1,
                    output: 9,
                    reasoning: 4,
                },
            };
            let bytes = response_bytes(&r, "client-model");
            let value = ir_to_response(&r, "client-model");
            assert_eq!(
                String::from_utf8(bytes).unwrap(),
                serde_json::to_string(&value).unwrap()
            );
            assert_eq!(value["id"], "msg_7");
            assert_eq!(value["type"], "message");
        }
    }
}
