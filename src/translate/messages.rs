//! Anthropic Messages ⇄ IR: client requests in, upstream requests out, replies and stream events both ways.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{json, Value};

use super::common::*;
use crate::config::Protocol;
use crate::ir::{self, Event, Finish, Part, Reasoning, Usage};
use crate::json::write_json_str;
use crate::sse;
use crate::translate::counts::Counts;
use crate::translate::lax::{lax_struct, Loose, RawText};

/// The tool that carries JSON mode toward a messages upstream (the forced-tool technique).
pub const JSON_TOOL: &str = "json_tool_call";

pub mod plain;
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

/// A `usage` object read from a `Value` tree: the reading [`Counts`] is held to.
#[cfg(test)]
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

lax_struct! {
    /// A messages upstream's non-streamed reply: the members [`reply_to_ir`] reads, each as
    /// `Value`'s accessors would see it, with nothing else kept.
    pub struct UpstreamReply<'a> {
        id: Loose<'a>,
        model: Loose<'a>,
        content: Loose<'a, UpstreamBlock<'a>>,
        stop_reason: Loose<'a>,
        stop_sequence: Loose<'a>,
        usage: RawText<'a>,
    }
}

lax_struct! {
    /// A content block of any type, in a reply or as a stream's `content_block_start` opens
    /// it: the members each type reads.
    struct UpstreamBlock<'a> {
        kind = "type": Loose<'a>,
        text: Loose<'a>,
        thinking: Loose<'a>,
        signature: Loose<'a>,
        data: Loose<'a>,
        id: Loose<'a>,
        name: Loose<'a>,
        input: RawText<'a>,
    }
}

/// Reads a messages upstream's non-streamed reply; `json_mode` turns the JSON tool back into text.
pub fn reply_to_ir(v: &UpstreamReply<'_>, json_mode: bool) -> ir::Response {
    let owned = |l: &Loose<'_>| l.as_str().unwrap_or("").to_owned();
    let mut content = Vec::new();
    let mut finish = finish_from(v.stop_reason.as_str(), v.stop_sequence.as_str());
    for b in v.content.as_array().unwrap_or_default() {
        match b.kind.as_str() {
            Some("text") => content.push(Part::Text(owned(&b.text))),
            Some("thinking") => content.push(Part::Reasoning(Reasoning {
                text: owned(&b.thinking),
                signature: b
                    .signature
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
                redacted: None,
            })),
            Some("redacted_thinking") => content.push(Part::Reasoning(Reasoning {
                redacted: b.data.as_str().map(str::to_owned),
                ..Reasoning::default()
            })),
            Some("tool_use") => {
                let name = b.name.as_str().unwrap_or("");
                let input = request::arguments_of(b.input.0);
                if json_mode && name == JSON_TOOL {
                    content.push(Part::Text(input));
                    finish = Finish::EndTurn;
                } else {
                    content.push(Part::ToolCall {
                        id: owned(&b.id),
                        name: name.to_owned(),
                        arguments: input,
                    });
                }
            }
            _ => {}
        }
    }
    // Read as `usage_from` reads a `Value`: a usage that is no object, or that serde cannot
    // read, counts nothing, and the reply is still served.
    let mut usage = Usage::default();
    if let Some(counts) = v.usage.0.and_then(|t| Counts::object_at(t.as_bytes())) {
        counts.read_into(Protocol::Messages, &mut usage);
    }
    ir::Response {
        id: owned(&v.id),
        model: owned(&v.model),
        created: ir::now_secs(),
        content,
        finish,
        usage,
    }
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

impl From<&Usage> for ReplyUsage {
    fn from(u: &Usage) -> Self {
        Self {
            cache_creation_input_tokens: u.cache_write,
            cache_read_input_tokens: u.cache_read,
            input_tokens: u.input,
            output_tokens: u.output,
        }
    }
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
        usage: ReplyUsage::from(&r.usage),
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

/// The reply for a chat reply of the common shape ([`super::chat::plain`]): its text, already
/// a JSON string as `write_json_str` writes it, in one text block.
pub fn plain_response_bytes(p: &super::chat::plain::Plain<'_>, client_model: &str) -> Vec<u8> {
    let reply = Reply {
        content: Vec::new(),
        id: reprefix(p.id, "msg_"),
        model: client_model,
        role: "assistant",
        stop_reason: finish_name(&p.finish),
        stop_sequence: None,
        kind: "message",
        usage: ReplyUsage::from(&p.usage),
    };
    let mut out = Vec::with_capacity(320 + p.text.len() + reply.id.len() + client_model.len());
    reply.write_with(&mut out, |out| {
        out.extend_from_slice(b"{\"text\":");
        out.extend_from_slice(p.text.as_bytes());
        out.extend_from_slice(b",\"type\":\"text\"}");
    });
    out
}

impl Reply<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        self.write_with(out, |out| {
            for (i, block) in self.content.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                block.write(out);
            }
        });
    }

    /// Writes the reply, `content` writing its blocks between the brackets.
    fn write_with(&self, out: &mut Vec<u8>, content: impl FnOnce(&mut Vec<u8>)) {
        out.extend_from_slice(b"{\"content\":[");
        content(out);
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
    use crate::translate::hand::{self, check};

    /// The reply as the gateway read it from a `Value` tree before [`reply_to_ir`]: the reference
    /// the typed read is held to.
    fn value_reply_to_ir(v: &Value, json_mode: bool) -> ir::Response {
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
        ir::Response {
            id: str_at(v, "id"),
            model: str_at(v, "model"),
            created: 0,
            content,
            finish,
            usage,
        }
    }

    /// Replies as Anthropic writes them (text, thinking, redacted thinking, tool calls, JSON
    /// mode's tool, a stop sequence, cache counts) and odd ones (members of other types, blocks
    /// that are not objects, repeated keys, escapes).
    const REPLIES: [&str; 6] = [
        r#"{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hello there"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":6,"service_tier":"standard"}}"#,
        r#"{"id":"msg_02","type":"message","role":"assistant","model":"claude-opus-4-1","content":[{"type":"thinking","thinking":"Weather \u2014 \"Paris\"?","signature":"EqQBCkYIBRgC"},{"type":"redacted_thinking","data":"EmwKAhgBEgy3"},{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"unit":"c","city":"Paris","deep":{"z":[1,2.50,{"b":null,"a":true}]}}},{"type":"tool_use","id":"toolu_02","name":"get_time","input":{}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":20,"cache_read_input_tokens":30,"output_tokens":40,"output_tokens_details":{"thinking_tokens":25}}}"#,
        r#"{"id":"msg_03","content":[{"type":"tool_use","id":"toolu_j","name":"json_tool_call","input":{"answer":42}}],"stop_reason":"tool_use","usage":{"input_tokens":5,"output_tokens":3}}"#,
        r#"{"id":"msg_04","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"thinking","thinking":"t","signature":""}],"stop_reason":"stop_sequence","stop_sequence":"END","usage":{"output_tokens":2}}"#,
        r#"{"id":7,"model":["x"],"content":[3,"text",null,{"type":"text","text":5},{"type":"tool_use","name":7,"input":null},{"type":"tool_use"},{"type":"image","text":"no"},{"type":"text","text":"first","text":"last"}],"stop_reason":9,"usage":[1]}"#,
        r#"{"content":{"type":"text"},"usage":{"input_tokens":-1,"output_tokens":1.5,"cache_read_input_tokens":"2"},"id":"msg_05","id":"msg_06"}"#,
    ];

    /// The upstream replies of the fixture suite's translations toward a messages upstream.
    fn fixture_replies() -> Vec<String> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut out = Vec::new();
        for dir in std::fs::read_dir(&root).unwrap() {
            let dir = dir.unwrap().path();
            if !dir.to_string_lossy().ends_with("_to_messages") {
                continue;
            }
            for case in std::fs::read_dir(&dir).unwrap() {
                if let Ok(text) =
                    std::fs::read_to_string(case.unwrap().path().join("upstream_reply.json"))
                {
                    out.push(text);
                }
            }
        }
        assert!(out.len() > 10, "{} fixture replies", out.len());
        out
    }

    /// Reads `text` both ways when it is JSON; `false` when the typed read finds anything else
    /// than the tree's read did.
    fn reads_as_the_tree(text: &[u8]) -> bool {
        let Ok(v) = serde_json::from_slice::<Value>(text) else {
            return true;
        };
        let Some(typed) =
            crate::translate::read_reply::<UpstreamReply<'_>>(text, std::str::from_utf8(text).ok())
        else {
            return false;
        };
        [false, true].into_iter().all(|json_mode| {
            let mut got = reply_to_ir(&typed, json_mode);
            got.created = 0;
            got == value_reply_to_ir(&v, json_mode)
        })
    }

    #[test]
    fn a_reply_reads_as_its_value_tree_read() {
        let fixtures = fixture_replies();
        let texts = REPLIES
            .iter()
            .copied()
            .chain(fixtures.iter().map(String::as_str));
        for text in texts {
            assert!(
                check::agrees::<UpstreamReply<'_>>(text.as_bytes()),
                "left to serde: {text}"
            );
            assert!(reads_as_the_tree(text.as_bytes()), "{text}");
        }
        let r = reply_to_ir(
            &hand::object::<UpstreamReply<'_>>(REPLIES[1]).unwrap(),
            false,
        );
        assert_eq!(r.usage.cache_write, 20);
        assert_eq!(r.usage.reasoning, 25);
        assert!(matches!(
            &r.content[3],
            Part::ToolCall { arguments, .. }
                if arguments == r#"{"city":"Paris","deep":{"z":[1,2.5,{"a":true,"b":null}]},"unit":"c"}"#
        ));
        let json = reply_to_ir(
            &hand::object::<UpstreamReply<'_>>(REPLIES[2]).unwrap(),
            true,
        );
        assert_eq!(json.content, vec![Part::Text(r#"{"answer":42}"#.into())]);
        assert_eq!(json.finish, Finish::EndTurn);
    }

    /// Every one-byte edit of the replies: the hand reader answers as serde does, and what
    /// still reads as JSON is read as the tree read it.
    #[test]
    fn no_one_byte_edit_reads_otherwise_than_the_tree() {
        let both = |text: &[u8]| {
            assert!(reads_as_the_tree(text), "{}", String::from_utf8_lossy(text));
            check::agrees::<UpstreamReply<'_>>(text)
        };
        let read = check::one_byte_edits(&REPLIES, both);
        assert!(read > 3_000, "only {read} edits were read by hand");
    }

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
