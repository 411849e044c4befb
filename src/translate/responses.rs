//! OpenAI Responses ⇄ IR: client requests in, upstream requests out, replies and stream events both ways.

use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::common::*;
use crate::ir::{self, Event, Finish, Part, Reasoning, Usage};
use crate::json::write::Object;
use crate::json::write_json_str;
use crate::sse;
use crate::translate::tools::{self, ClientTool, ToolMap};

/// Marks an Anthropic thinking signature carried in a reasoning item's `encrypted_content`, so it
/// is recognised (and only it is trusted) when the client sends the item back.
const SIG_PREFIX: &str = "mg-anthropic-sig:";

mod request;
mod stream;

pub use request::{ir_to_request, request_to_ir, ClientContext, UpstreamContext};
pub use stream::{Final, FinalSlot, StreamDecoder, StreamEncoder};

/// The `text` of every part in a reasoning item's `summary` or `content` list.
fn texts_of<'v>(item: &'v Value, key: &str) -> Vec<&'v str> {
    item.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("text").and_then(Value::as_str))
        .collect()
}

/// An Anthropic signature the gateway put in `encrypted_content`; anything else is OpenAI's own.
fn signature_of(item: &Value) -> Option<String> {
    item.get("encrypted_content")
        .and_then(Value::as_str)
        .and_then(|e| e.strip_prefix(SIG_PREFIX))
        .map(str::to_owned)
}

// === replies ===

pub(crate) fn usage_from(u: &Value) -> Usage {
    let n = |p: &[&str]| super::common::at(u, p).and_then(Value::as_u64).unwrap_or(0);
    let cache_read = n(&["input_tokens_details", "cached_tokens"]);
    let cache_write = n(&["input_tokens_details", "cache_write_tokens"]);
    Usage {
        input: n(&["input_tokens"]).saturating_sub(cache_read.saturating_add(cache_write)),
        cache_read,
        cache_write,
        output: n(&["output_tokens"]),
        reasoning: n(&["output_tokens_details", "reasoning_tokens"]),
    }
}

/// A response's `usage`, written from the counts without a `Value` tree: its members in
/// alphabetical order, as the tree it replaced wrote them.
#[derive(Serialize)]
struct UsageOut {
    input_tokens: u64,
    input_tokens_details: InputDetailsOut,
    output_tokens: u64,
    output_tokens_details: OutputDetailsOut,
    total_tokens: u64,
}

#[derive(Serialize)]
struct InputDetailsOut {
    /// Cache writes are counted in `input_tokens`; the newest SDK also names them (C.3), as
    /// chat does.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_write_tokens: Option<u64>,
    cached_tokens: u64,
}

#[derive(Serialize)]
struct OutputDetailsOut {
    reasoning_tokens: u64,
}

impl UsageOut {
    fn new(u: &Usage) -> Self {
        Self {
            input_tokens: u.prompt_total(),
            input_tokens_details: InputDetailsOut {
                cache_write_tokens: (u.cache_write > 0).then_some(u.cache_write),
                cached_tokens: u.cache_read,
            },
            output_tokens: u.output,
            output_tokens_details: OutputDetailsOut {
                reasoning_tokens: u.reasoning,
            },
            total_tokens: u.total(),
        }
    }
}

fn finish_from(resp: &Value) -> Finish {
    let has_call = resp
        .get("output")
        .and_then(Value::as_array)
        .is_some_and(|o| {
            o.iter()
                .any(|i| i.get("type").and_then(Value::as_str) == Some("function_call"))
        });
    match (
        resp.get("status").and_then(Value::as_str),
        resp.pointer("/incomplete_details/reason")
            .and_then(Value::as_str),
    ) {
        (Some("incomplete"), Some("content_filter")) => Finish::ContentFilter,
        (Some("incomplete"), _) => Finish::MaxTokens,
        _ if has_call => Finish::ToolUse,
        _ => Finish::EndTurn,
    }
}

/// Reads a responses upstream's reply (non-streamed, or the object of a terminal event).
pub fn response_to_ir(v: &Value) -> Result<ir::Response, ir::ErrorInfo> {
    if v.get("status").and_then(Value::as_str) == Some("failed") {
        return Err(ir::ErrorInfo {
            status: 502,
            message: v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("the upstream response failed")
                .to_owned(),
            code: v
                .pointer("/error/code")
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
    }
    let mut content = Vec::new();
    for item in v
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match item.get("type").and_then(Value::as_str) {
            Some("reasoning") => {
                let mut text: Vec<&str> = texts_of(item, "summary");
                if text.is_empty() {
                    text = texts_of(item, "content");
                }
                let signature = signature_of(item);
                content.push(Part::Reasoning(Reasoning {
                    text: text.join("\n"),
                    signature,
                    redacted: None,
                }));
            }
            Some("message") => {
                for c in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(t) = c
                        .get("text")
                        .or_else(|| c.get("refusal"))
                        .and_then(Value::as_str)
                    {
                        content.push(Part::Text(t.to_owned()));
                    }
                }
            }
            Some("function_call") => content.push(Part::ToolCall {
                id: str_at(item, "call_id"),
                name: str_at(item, "name"),
                arguments: str_at(item, "arguments"),
            }),
            _ => {}
        }
    }
    Ok(ir::Response {
        id: str_at(v, "id"),
        model: str_at(v, "model"),
        created: v
            .get("created_at")
            .and_then(Value::as_u64)
            .unwrap_or_else(ir::now_secs),
        finish: finish_from(v),
        usage: v.get("usage").map(usage_from).unwrap_or_default(),
        content,
    })
}

/// What a Responses reply echoes back from the client's request, as the client wrote it (absent
/// fields take the API's defaults when the reply is written).
#[derive(Debug, Clone, Default)]
pub struct Echo {
    pub tools: Option<Box<RawValue>>,
    pub tool_choice: Option<Box<RawValue>>,
    pub parallel_tool_calls: Option<Box<RawValue>>,
    pub instructions: Option<Box<RawValue>>,
    pub max_output_tokens: Option<Box<RawValue>>,
    pub temperature: Option<Box<RawValue>>,
    pub top_p: Option<Box<RawValue>>,
    /// `reasoning.effort` and `reasoning.summary` (C.3 echoes the request's `reasoning`).
    pub effort: Option<Box<RawValue>>,
    pub summary: Option<Box<RawValue>>,
    pub store: Option<Box<RawValue>>,
    pub previous_response_id: Option<Box<RawValue>>,
    /// The reply is stored under its id (the client did not say `store: false`), so the id is
    /// the gateway's own: an upstream's ids need not be unique across upstreams or restarts.
    pub fresh_id: bool,
}

/// An echoed field as the client wrote it, or what the API answers when the client did not
/// send it.
struct Echoed<'a>(Option<&'a RawValue>, Absent);

/// What an echoed field the client did not send is.
#[derive(Clone, Copy)]
enum Absent {
    Null,
    True,
    Auto,
    NoTools,
}

impl Serialize for Echoed<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self.0, self.1) {
            (Some(raw), _) => raw.serialize(s),
            (None, Absent::Null) => s.serialize_unit(),
            (None, Absent::True) => s.serialize_bool(true),
            (None, Absent::Auto) => s.serialize_str("auto"),
            (None, Absent::NoTools) => s.serialize_seq(Some(0))?.end(),
        }
    }
}

/// The identity of a response object: id, creation time, model.
struct Head<'a>(&'a str, u64, &'a str);

/// A response object: the reply's own members, then what the request said, echoed, in
/// OpenAI's order, streamed or not.
#[derive(Serialize)]
struct ResponseOut<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'a str,
    error: Option<()>,
    incomplete_details: Option<IncompleteOut>,
    instructions: Echoed<'a>,
    max_output_tokens: Echoed<'a>,
    model: &'a str,
    output: &'a [Item],
    parallel_tool_calls: Echoed<'a>,
    previous_response_id: Echoed<'a>,
    reasoning: ReasoningOut<'a>,
    /// Stored unless the client said otherwise (gateway.md §13).
    store: Echoed<'a>,
    temperature: Echoed<'a>,
    text: TextOut,
    tool_choice: Echoed<'a>,
    tools: Echoed<'a>,
    top_p: Echoed<'a>,
    truncation: &'static str,
    usage: Option<UsageOut>,
    metadata: EmptyObject,
}

#[derive(Serialize)]
struct IncompleteOut {
    reason: &'static str,
}

#[derive(Serialize)]
struct ReasoningOut<'a> {
    effort: Echoed<'a>,
    summary: Echoed<'a>,
}

/// `{"format":{"type":"text"}}`.
#[derive(Serialize)]
struct TextOut {
    format: FormatOut,
}

#[derive(Serialize)]
struct FormatOut {
    #[serde(rename = "type")]
    kind: &'static str,
}

impl Echoed<'_> {
    /// Its bytes as [`Serialize`] writes them.
    fn write(&self, out: &mut Vec<u8>) {
        let text: &[u8] = match (self.0, self.1) {
            (Some(raw), _) => raw.get().as_bytes(),
            (None, Absent::Null) => b"null",
            (None, Absent::True) => b"true",
            (None, Absent::Auto) => b"\"auto\"",
            (None, Absent::NoTools) => b"[]",
        };
        out.extend_from_slice(text);
    }
}

impl ResponseOut<'_> {
    /// The object's bytes, as serde writes it: written by hand, the output items as they
    /// were written when they were made.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1024);
        let mut o = Object::open(&mut out);
        o.str("id", self.id);
        o.str("object", self.object);
        o.some_u64("created_at", Some(self.created_at));
        o.str("status", self.status);
        o.key("error").extend_from_slice(b"null");
        match &self.incomplete_details {
            Some(d) => {
                let mut i = Object::open(o.key("incomplete_details"));
                i.str("reason", d.reason);
                i.close();
            }
            None => o.key("incomplete_details").extend_from_slice(b"null"),
        }
        self.instructions.write(o.key("instructions"));
        self.max_output_tokens.write(o.key("max_output_tokens"));
        o.str("model", self.model);
        crate::json::write::array(o.key("output"), self.output, |x, out| {
            out.extend_from_slice(&x.json);
        });
        self.parallel_tool_calls.write(o.key("parallel_tool_calls"));
        self.previous_response_id
            .write(o.key("previous_response_id"));
        let mut r = Object::open(o.key("reasoning"));
        self.reasoning.effort.write(r.key("effort"));
        self.reasoning.summary.write(r.key("summary"));
        r.close();
        self.store.write(o.key("store"));
        self.temperature.write(o.key("temperature"));
        o.key("text")
            .extend_from_slice(b"{\"format\":{\"type\":\"text\"}}");
        self.tool_choice.write(o.key("tool_choice"));
        self.tools.write(o.key("tools"));
        self.top_p.write(o.key("top_p"));
        o.str("truncation", self.truncation);
        match &self.usage {
            // Counts only: serde's writer has no string of it to look up.
            Some(u) => {
                let _ = serde_json::to_writer(&mut *o.key("usage"), u);
            }
            None => o.key("usage").extend_from_slice(b"null"),
        }
        o.key("metadata").extend_from_slice(b"{}");
        o.close();
        out
    }
}

impl<'a> ResponseOut<'a> {
    fn new(
        Head(id, created, model): Head<'a>,
        status: &'a str,
        output: &'a [Item],
        finish: Option<&Finish>,
        usage: Option<&Usage>,
        echo: &'a Echo,
    ) -> Self {
        let incomplete_details = (status == "incomplete").then(|| IncompleteOut {
            reason: if finish == Some(&Finish::ContentFilter) {
                "content_filter"
            } else {
                "max_output_tokens"
            },
        });
        let echoed = |raw: &'a Option<Box<RawValue>>, default| Echoed(raw.as_deref(), default);
        Self {
            id,
            object: "response",
            created_at: created,
            status,
            error: None,
            incomplete_details,
            instructions: echoed(&echo.instructions, Absent::Null),
            max_output_tokens: echoed(&echo.max_output_tokens, Absent::Null),
            model,
            output,
            parallel_tool_calls: echoed(&echo.parallel_tool_calls, Absent::True),
            previous_response_id: echoed(&echo.previous_response_id, Absent::Null),
            reasoning: ReasoningOut {
                effort: echoed(&echo.effort, Absent::Null),
                summary: echoed(&echo.summary, Absent::Null),
            },
            store: echoed(&echo.store, Absent::True),
            temperature: echoed(&echo.temperature, Absent::Null),
            text: TextOut {
                format: FormatOut { kind: "text" },
            },
            tool_choice: echoed(&echo.tool_choice, Absent::Auto),
            tools: echoed(&echo.tools, Absent::NoTools),
            top_p: echoed(&echo.top_p, Absent::Null),
            truncation: "disabled",
            usage: usage.map(UsageOut::new),
            metadata: EmptyObject {},
        }
    }
}

fn status_of(f: &Finish) -> &'static str {
    match f {
        Finish::MaxTokens | Finish::ContentFilter => "incomplete",
        _ => "completed",
    }
}

/// The item id prefix OpenAI gives each kind of call item.
fn call_id_prefix(tool: Option<&ClientTool>) -> &'static str {
    match tool {
        Some(ClientTool::Custom { .. }) => "ctc_",
        Some(ClientTool::LocalShell) => "lsh_",
        _ => "fc_",
    }
}

/// An output item as a responses client gets it, written once (its members in alphabetical
/// order, the order of the `Value` trees it replaced), and its id, which the store keeps.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Item {
    pub(super) id: String,
    pub(super) json: Vec<u8>,
}

impl Serialize for Item {
    /// The item's text, as it was written. Only the slow paths serialise an item (the mock's
    /// reply, a failed stream's response); they check its text again.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue =
            serde_json::from_slice(&self.json).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl Item {
    /// The item whose id is `id` and whose other members `write` writes, `text` bytes of
    /// them its text.
    fn written(id: String, text: usize, write: impl FnOnce(&mut Object<'_>, &str)) -> Self {
        let mut json = Vec::with_capacity(160 + text);
        let mut o = Object::open(&mut json);
        write(&mut o, &id);
        o.close();
        Self { id, json }
    }

    fn reasoning(id: String, text: &str, signature: Option<&str>) -> Self {
        Self::written(id, text.len(), |o, id| {
            if let Some(sig) = signature {
                o.str("encrypted_content", &format!("{SIG_PREFIX}{sig}"));
            }
            o.str("id", id);
            let summary = o.key("summary");
            if text.is_empty() {
                summary.extend_from_slice(b"[]");
            } else {
                summary.extend_from_slice(b"[{\"text\":");
                write_json_str(summary, text);
                summary.extend_from_slice(b",\"type\":\"summary_text\"}]");
            }
            o.str("type", "reasoning");
        })
    }

    fn message(id: String, text: &str, status: &str) -> Self {
        Self::written(id, text.len(), |o, id| {
            let content = o.key("content");
            content.extend_from_slice(b"[{\"annotations\":[],\"logprobs\":[],\"text\":");
            write_json_str(content, text);
            content.extend_from_slice(b",\"type\":\"output_text\"}]");
            o.str("id", id);
            o.str("role", "assistant");
            o.str("status", status);
            o.str("type", "message");
        })
    }

    /// A finished (or opening) call as the item type the client declared its tool with: a
    /// `function_call` (with its `namespace` when it was declared in one), a
    /// `custom_tool_call` or a `local_shell_call`.
    fn call(tool: Option<&ClientTool>, id: String, call: &CallParts<'_>, status: &str) -> Self {
        let CallParts {
            call_id,
            name,
            arguments,
        } = *call;
        Self::written(id, arguments.len(), |o, id| match tool {
            None | Some(ClientTool::Namespaced { .. }) => {
                o.str("arguments", arguments);
                o.str("call_id", call_id);
                o.str("id", id);
                match tool {
                    Some(ClientTool::Namespaced { namespace, name }) => {
                        o.str("name", name);
                        o.str("namespace", namespace);
                    }
                    _ => o.str("name", name),
                }
                o.str("status", status);
                o.str("type", "function_call");
            }
            Some(ClientTool::Custom { scope }) => {
                o.str("call_id", call_id);
                o.str("id", id);
                o.str("input", &tools::custom_input(arguments));
                match scope {
                    Some((namespace, own)) => {
                        o.str("name", own);
                        o.str("namespace", namespace);
                    }
                    None => o.str("name", name),
                }
                o.str("status", status);
                o.str("type", "custom_tool_call");
            }
            Some(ClientTool::LocalShell) => {
                crate::json::write_value(o.key("action"), &tools::local_shell_action(arguments));
                o.str("call_id", call_id);
                o.str("id", id);
                o.str("status", status);
                o.str("type", "local_shell_call");
            }
        })
    }
}

/// What a call item says of its call: the model's id for it, the tool's name, the arguments.
#[derive(Clone, Copy)]
struct CallParts<'a> {
    call_id: &'a str,
    name: &'a str,
    arguments: &'a str,
}

/// A reply's output items, status and id, as a responses client gets them.
struct ReplyParts {
    id: String,
    status: &'static str,
    output: Vec<Item>,
}

impl ReplyParts {
    /// The response object of reply `r` made of these parts.
    fn response<'a>(
        &'a self,
        r: &'a ir::Response,
        model: &'a str,
        echo: &'a Echo,
    ) -> ResponseOut<'a> {
        ResponseOut::new(
            Head(&self.id, r.created, model),
            self.status,
            &self.output,
            Some(&r.finish),
            Some(&r.usage),
            echo,
        )
    }
}

fn reply_parts(r: &ir::Response, echo: &Echo, client_tools: &ToolMap) -> ReplyParts {
    let status = status_of(&r.finish);
    // The item the model was writing when it was cut off is itself incomplete: the message
    // of the text after the last other item, or that item when no text follows it.
    let last = r
        .content
        .iter()
        .rposition(|p| matches!(p, Part::Reasoning(_) | Part::ToolCall { .. }));
    let text_last = (r.content.iter().skip(last.map_or(0, |i| i + 1)))
        .any(|p| matches!(p, Part::Text(t) if !t.is_empty()));
    let status_at = |i: usize| {
        if Some(i) == last && !text_last {
            status
        } else {
            "completed"
        }
    };
    let id = if echo.fresh_id {
        ir::mint_id("resp_")
    } else {
        reprefix(&r.id, "resp_")
    };
    let ids = output_ids(&id, echo);
    let mut output = Vec::new();
    let mut text = String::new();
    let flush = |text: &mut String, output: &mut Vec<Item>, status: &str| {
        if !text.is_empty() {
            output.push(Item::message(
                ids.output("msg_", output.len()),
                text,
                status,
            ));
            text.clear();
        }
    };
    for (i, p) in r.content.iter().enumerate() {
        match p {
            Part::Text(t) => text.push_str(t),
            Part::Reasoning(rs) => {
                flush(&mut text, &mut output, "completed");
                output.push(Item::reasoning(
                    ids.output("rs_", output.len()),
                    &rs.text,
                    rs.signature.as_deref(),
                ));
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                flush(&mut text, &mut output, "completed");
                let tool = client_tools.get(name);
                let call = CallParts {
                    call_id: id,
                    name,
                    arguments,
                };
                let item_id = ids.output(call_id_prefix(tool), output.len());
                output.push(Item::call(tool, item_id, &call, status_at(i)));
            }
            _ => {}
        }
    }
    flush(&mut text, &mut output, status);
    ReplyParts { id, status, output }
}

/// Ids for the output items of the answer `answer_id`: naming it when it is kept.
pub(crate) fn output_ids(answer_id: &str, echo: &Echo) -> ir::ItemIds {
    match echo.fresh_id {
        true => ir::ItemIds::of(answer_id),
        false => ir::ItemIds::random(),
    }
}

/// Writes the reply a responses client expects, as a `Value`.
pub fn ir_to_response(
    r: &ir::Response,
    client_model: &str,
    echo: &Echo,
    client_tools: &ToolMap,
) -> Value {
    let p = reply_parts(r, echo, client_tools);
    // Plain data, `Value`s and raw JSON always serialise; the fallback is never taken.
    serde_json::to_value(p.response(r, client_model, echo)).unwrap_or_default()
}

/// The same reply as [`ir_to_response`], written straight to bytes with no tree of the whole
/// between; the echoed members are written as the client wrote them.
pub fn response_bytes(
    r: &ir::Response,
    client_model: &str,
    echo: &Echo,
    client_tools: &ToolMap,
) -> Vec<u8> {
    let p = reply_parts(r, echo, client_tools);
    p.response(r, client_model, echo).to_bytes()
}

/// [`response_bytes`], and for a reply the client has not asked not to keep (`store`), what
/// the store keeps of it ([`Final`]), known here without reading the bytes again.
pub fn response_kept(
    r: &ir::Response,
    client_model: &str,
    echo: &Echo,
    client_tools: &ToolMap,
) -> (Vec<u8>, Option<Final>) {
    let p = reply_parts(r, echo, client_tools);
    let bytes = p.response(r, client_model, echo).to_bytes();
    let last = match std::str::from_utf8(&bytes) {
        Ok(text) if echo.fresh_id => Some(Final {
            text: text.into(),
            output: p.output.into_iter().map(|item| item.id).collect(),
            id: p.id,
        }),
        _ => None,
    };
    (bytes, last)
}

// === errors ===

pub fn error_body(e: &ir::ErrorInfo) -> Value {
    super::chat::error_body(e)
}

pub fn error_from_body(status: u16, v: &Value) -> ir::ErrorInfo {
    super::chat::error_from_body(status, v)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    fn raw(text: &str) -> Option<Box<RawValue>> {
        Some(RawValue::from_string(text.to_owned()).unwrap())
    }

    /// The tree `UsageOut` replaced, as the reference for its bytes.
    fn usage_json(u: &Usage) -> Value {
        let mut details = json!({"cached_tokens": u.cache_read});
        if u.cache_write > 0 {
            details["cache_write_tokens"] = json!(u.cache_write);
        }
        json!({"input_tokens": u.prompt_total(), "input_tokens_details": details,
            "output_tokens": u.output, "output_tokens_details": {"reasoning_tokens": u.reasoning},
            "total_tokens": u.total()})
    }

    /// The usage written from the counts has the tree's bytes, cache writes or not.
    #[test]
    fn usage_bytes_are_the_trees() {
        for (cache_read, cache_write, reasoning) in [(0, 0, 0), (5, 0, 2), (5, 7, 0), (0, 3, 9)] {
            let u = Usage {
                input: 11,
                output: 13,
                cache_read,
                cache_write,
                reasoning,
            };
            assert_eq!(
                serde_json::to_string(&UsageOut::new(&u)).unwrap(),
                serde_json::to_string(&usage_json(&u)).unwrap(),
                "{u:?}"
            );
        }
    }

    /// Written straight from the struct, a reply holds what its tree holds, its members in
    /// OpenAI's order; echoed members as the client wrote them.
    #[test]
    fn reply_bytes_hold_the_trees_members_in_openais_order() {
        let echo = Echo {
            tools: raw(r#"[{"name":"f","parameters":{},"type":"function"}]"#),
            temperature: raw("0.5"),
            effort: raw(r#""low""#),
            store: raw("false"),
            previous_response_id: raw(r#""resp_1""#),
            ..Echo::default()
        };
        let call = Part::ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: r#"{"a":1}"#.into(),
        };
        let reasoning = Part::Reasoning(Reasoning {
            text: "why".into(),
            signature: Some("sig".into()),
            redacted: None,
        });
        let cases = [
            (vec![Part::Text("Hello".into())], Finish::EndTurn),
            (
                vec![reasoning, Part::Text("a\n".into()), call],
                Finish::ToolUse,
            ),
            (vec![Part::Text("cut".into())], Finish::MaxTokens),
            (vec![], Finish::ContentFilter),
        ];
        for echo in [&echo, &Echo::default()] {
            for (content, finish) in cases.clone() {
                let r = ir::Response {
                    id: "chatcmpl-7".into(),
                    model: "m".into(),
                    created: 1_700_000_000,
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
                let p = reply_parts(&r, echo, &ToolMap::default());
                let out = p.response(&r, "client-model", echo);
                let bytes = String::from_utf8(serde_json::to_vec(&out).unwrap()).unwrap();
                // Written by hand, serde's bytes; and so for a stream's objects, before the
                // answer (no output, no usage) and after it in each status.
                assert_eq!(String::from_utf8(out.to_bytes()).unwrap(), bytes);
                for status in ["in_progress", "completed", "incomplete", "failed"] {
                    let done = status != "in_progress";
                    let streamed = ResponseOut::new(
                        Head("resp_\"x\"", 7, "client \u{1}model"),
                        status,
                        if done { &p.output } else { &[] },
                        done.then_some(&r.finish),
                        done.then_some(&r.usage),
                        echo,
                    );
                    assert_eq!(
                        String::from_utf8(streamed.to_bytes()).unwrap(),
                        serde_json::to_string(&streamed).unwrap()
                    );
                }
                let tree = serde_json::to_value(&out).unwrap();
                assert_eq!(serde_json::from_str::<Value>(&bytes).unwrap(), tree);
                let first = ["\"id\":", "\"object\":", "\"created_at\":", "\"status\":"];
                let at: Vec<usize> = first.iter().map(|k| bytes.find(k).unwrap()).collect();
                assert!(at.windows(2).all(|w| w[0] < w[1]), "{bytes}");
                assert!(bytes.starts_with("{\"id\":"), "{bytes}");
                let written: Value = serde_json::from_slice(&response_bytes(
                    &r,
                    "client-model",
                    echo,
                    &ToolMap::default(),
                ))
                .unwrap();
                assert_eq!(written["id"], "resp_7");
                assert_eq!(written["status"], status_of(&r.finish));
            }
        }
        let spaced = Echo {
            tools: raw(r#"[ {"type": "function", "name": "f"} ]"#),
            ..Echo::default()
        };
        let r = ir::Response {
            content: vec![Part::Text("hi".into())],
            ..ir::Response::default()
        };
        let bytes = response_bytes(&r, "m", &spaced, &ToolMap::default());
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.contains(r#""tools":[ {"type": "function", "name": "f"} ]"#),
            "{text}"
        );
    }

    // The `Value` trees the typed items replaced, the reference for their bytes.
    fn reasoning_tree(id: &str, text: &str, signature: Option<&str>) -> Value {
        let summary = if text.is_empty() {
            json!([])
        } else {
            json!([{"type": "summary_text", "text": text}])
        };
        let mut item = json!({"type": "reasoning", "id": id, "summary": summary});
        if let Some(sig) = signature {
            item["encrypted_content"] = json!(format!("{SIG_PREFIX}{sig}"));
        }
        item
    }

    fn message_tree(id: &str, text: &str, status: &str) -> Value {
        json!({"type": "message", "id": id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
    }

    fn call_tree(tool: Option<&ClientTool>, id: &str, c: &CallParts<'_>, status: &str) -> Value {
        let (call_id, name, arguments) = (c.call_id, c.name, c.arguments);
        let function = |name: &str| {
            json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
                "arguments": arguments, "status": status})
        };
        match tool {
            None => function(name),
            Some(ClientTool::Namespaced { namespace, name }) => {
                let mut item = function(name);
                item["namespace"] = json!(namespace);
                item
            }
            Some(ClientTool::Custom { scope }) => {
                let mut item = json!({"type": "custom_tool_call", "id": id, "call_id": call_id,
                    "name": name, "input": tools::custom_input(arguments), "status": status});
                if let Some((namespace, own)) = scope {
                    item["namespace"] = json!(namespace);
                    item["name"] = json!(own);
                }
                item
            }
            Some(ClientTool::LocalShell) => {
                json!({"type": "local_shell_call", "id": id, "call_id": call_id,
                    "action": tools::local_shell_action(arguments), "status": status})
            }
        }
    }

    fn same(item: &Item, tree: &Value) {
        let text = String::from_utf8(item.json.clone()).unwrap();
        assert_eq!(text, serde_json::to_string(tree).unwrap());
        assert_eq!(tree["id"], item.id.as_str());
        // Serialised, an item is its text.
        assert_eq!(serde_json::to_string(item).unwrap(), text);
        assert_eq!(&serde_json::to_value(item).unwrap(), tree);
    }

    /// Every kind of item, written by hand, has the bytes of the tree it replaced, for
    /// awkward ids and texts.
    #[test]
    fn items_are_written_as_their_trees() {
        let texts = ["", "Hello", "a \"quoted\"\n\u{1}line \\ é 🦀"];
        let ids = ["msg_1", "id \"with\" \\ and \u{7f}"];
        let tools = [
            None,
            Some(ClientTool::Namespaced {
                namespace: "ns \"x\"".into(),
                name: "own".into(),
            }),
            Some(ClientTool::Custom { scope: None }),
            Some(ClientTool::Custom {
                scope: Some(("ns".into(), "own \n".into())),
            }),
            Some(ClientTool::LocalShell),
        ];
        let arguments = [
            "",
            r#"{"a":1,"b":"x\"y"}"#,
            r#"{"input":"free \"form\"\n"}"#,
            r#"{"command":["ls","-l"],"timeout_ms":5}"#,
            "not json",
        ];
        for id in ids {
            for text in texts {
                for status in ["completed", "incomplete", "in_progress"] {
                    same(
                        &Item::message(id.into(), text, status),
                        &message_tree(id, text, status),
                    );
                }
                for sig in [None, Some("sig\"1"), Some("")] {
                    same(
                        &Item::reasoning(id.into(), text, sig),
                        &reasoning_tree(id, text, sig),
                    );
                }
                for tool in &tools {
                    for arguments in arguments {
                        let call = CallParts {
                            call_id: text,
                            name: "na\"me",
                            arguments,
                        };
                        for status in ["completed", "incomplete"] {
                            same(
                                &Item::call(tool.as_ref(), id.into(), &call, status),
                                &call_tree(tool.as_ref(), id, &call, status),
                            );
                        }
                    }
                }
            }
        }
    }

    /// A kept reply's items have ids naming it and their place among its output, as a
    /// stream's do; a reply not kept gets random ones.
    #[test]
    fn a_kept_replys_item_ids_name_it() {
        let r = ir::Response {
            content: vec![
                Part::Reasoning(Reasoning {
                    text: "why".into(),
                    signature: None,
                    redacted: None,
                }),
                Part::Text("so".into()),
                Part::ToolCall {
                    id: "call_1".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                },
            ],
            ..ir::Response::default()
        };
        for fresh_id in [true, false] {
            let echo = Echo {
                fresh_id,
                ..Echo::default()
            };
            let p = reply_parts(&r, &echo, &ToolMap::default());
            assert_eq!(p.output.len(), 3);
            for (place, (item, prefix)) in p.output.iter().zip(["rs_", "msg_", "fc_"]).enumerate() {
                assert!(item.id.starts_with(prefix), "{}", item.id);
                let named = ir::answer_named_by(&item.id);
                if fresh_id {
                    assert_eq!(named.as_deref(), Some(&*p.id));
                    assert!(item.id.ends_with(&format!("{:08x}", 0x8000_0000 + place)));
                } else {
                    assert_eq!(named, None, "{}", item.id);
                }
            }
        }
    }

    /// A cut-off reply's last item is incomplete: its last message, or its last call when no
    /// text follows it; reasoning has no status and stays as it is.
    #[test]
    fn the_last_item_of_a_cut_off_reply_is_incomplete() {
        let text = |t: &str| Part::Text(t.into());
        let call = || Part::ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let reasoning = || {
            Part::Reasoning(Reasoning {
                text: "why".into(),
                signature: None,
                redacted: None,
            })
        };
        let cases: [(Vec<Part>, &[&str]); 7] = [
            (vec![text("a")], &["incomplete"]),
            (vec![text("a"), call()], &["completed", "incomplete"]),
            (vec![call(), text("")], &["incomplete"]),
            (
                vec![call(), text(""), text("b")],
                &["completed", "incomplete"],
            ),
            (vec![call(), call()], &["completed", "incomplete"]),
            (vec![call(), reasoning()], &["completed", "-"]),
            (
                vec![reasoning(), text("a"), text("b")],
                &["-", "incomplete"],
            ),
        ];
        for (content, statuses) in cases {
            for finish in [Finish::MaxTokens, Finish::ContentFilter, Finish::EndTurn] {
                let r = ir::Response {
                    content: content.clone(),
                    finish: finish.clone(),
                    ..ir::Response::default()
                };
                let p = reply_parts(&r, &Echo::default(), &ToolMap::default());
                let got: Vec<String> = (p.output.iter())
                    .map(|i| {
                        let tree: Value = serde_json::from_slice(&i.json).unwrap();
                        tree["status"].as_str().unwrap_or("-").to_owned()
                    })
                    .collect();
                let want: Vec<&str> = (statuses.iter())
                    .map(|s| match (*s, &finish) {
                        ("incomplete", Finish::EndTurn) => "completed",
                        (s, _) => s,
                    })
                    .collect();
                assert_eq!(got, want, "{content:?} {finish:?}");
            }
        }
    }
}
