//! OpenAI Responses ⇄ IR: client requests in, upstream requests out, replies and stream events both ways.

use serde_json::{json, Map, Value};

use super::common::*;
use crate::config::Target;
use crate::error::GatewayError;
use crate::ir::{
    self, Event, Finish, Image, ImageSource, Part, Reasoning, Role, Tool, ToolChoice, Usage,
};
use crate::sse;

/// Marks an Anthropic thinking signature carried in a reasoning item's `encrypted_content`, so it
/// is recognised (and only it is trusted) when the client sends the item back.
const SIG_PREFIX: &str = "mg-anthropic-sig:";

mod stream;

pub use stream::{StreamDecoder, StreamEncoder};

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

// === requests: responses client → IR ===

fn parts_of(content: &Value, path: &str) -> Result<Vec<Part>, GatewayError> {
    match content {
        Value::String(s) => Ok(vec![Part::Text(s.clone())]),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ppath = format!("{path}[{i}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => Ok(Part::Text(
                        req_str(p, "text", &format!("{ppath}.text"))?.to_owned(),
                    )),
                    Some("refusal") => Ok(Part::Text(
                        req_str(p, "refusal", &format!("{ppath}.refusal"))?.to_owned(),
                    )),
                    Some("input_image") => {
                        let url = get_str(p, "image_url", &format!("{ppath}.image_url"))?
                            .ok_or_else(|| {
                                unsupported(
                                    &format!("{ppath}.file_id"),
                                    "images must be given by image_url",
                                )
                            })?;
                        Ok(Part::Image(Image {
                            source: ImageSource::from_url(url),
                            detail: get_str(p, "detail", &format!("{ppath}.detail"))?
                                .map(str::to_owned),
                        }))
                    }
                    Some(other) => Err(unsupported(
                        &format!("{ppath}.type"),
                        &format!("{other:?} parts have no equivalent there"),
                    )),
                    None => Err(GatewayError::invalid(
                        format!("{ppath}.type"),
                        "`type` is required",
                    )),
                }
            })
            .collect(),
        _ => Err(GatewayError::invalid(
            path,
            format!("`{path}` must be a string or an array of parts"),
        )),
    }
}

/// Reads and checks a responses request into the IR, refusing what the IR cannot hold.
pub fn request_to_ir(v: &Value) -> Result<ir::Request, GatewayError> {
    as_object(v, "body")?;
    if v.get("previous_response_id").is_some_and(|p| !p.is_null()) {
        return Err(unsupported(
            "previous_response_id",
            "the gateway keeps no conversation store; send the whole input",
        ));
    }
    if v.get("conversation").is_some_and(|p| !p.is_null()) {
        return Err(unsupported(
            "conversation",
            "the gateway keeps no conversation store; send the whole input",
        ));
    }
    let mut r = ir::Request::default();
    if let Some(i) = get_str(v, "instructions", "instructions")? {
        r.system.push(i.to_owned());
    }
    match v.get("input") {
        None | Some(Value::Null) => {
            return Err(GatewayError::invalid("input", "`input` is required"))
        }
        Some(Value::String(s)) => {
            super::chat::push(&mut r.messages, Role::User, vec![Part::Text(s.clone())])
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("input[{i}]");
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                match kind {
                    "message" => {
                        let content = item.get("content").unwrap_or(&Value::Null);
                        match item.get("role").and_then(Value::as_str) {
                            Some("system" | "developer") => {
                                let text: Vec<String> =
                                    parts_of(content, &format!("{path}.content"))?
                                        .into_iter()
                                        .filter_map(|p| {
                                            if let Part::Text(t) = p {
                                                Some(t)
                                            } else {
                                                None
                                            }
                                        })
                                        .collect();
                                r.system.push(text.join("\n"));
                            }
                            Some("user") => super::chat::push(
                                &mut r.messages,
                                Role::User,
                                parts_of(content, &format!("{path}.content"))?,
                            ),
                            Some("assistant") => super::chat::push(
                                &mut r.messages,
                                Role::Assistant,
                                parts_of(content, &format!("{path}.content"))?,
                            ),
                            _ => {
                                return Err(GatewayError::invalid(
                                    format!("{path}.role"),
                                    "`role` must be user, assistant, system or developer",
                                ))
                            }
                        }
                    }
                    "function_call" => super::chat::push(
                        &mut r.messages,
                        Role::Assistant,
                        vec![Part::ToolCall {
                            id: req_str(item, "call_id", &format!("{path}.call_id"))?.to_owned(),
                            name: req_str(item, "name", &format!("{path}.name"))?.to_owned(),
                            arguments: get_str(item, "arguments", &format!("{path}.arguments"))?
                                .unwrap_or("{}")
                                .to_owned(),
                        }],
                    ),
                    "function_call_output" => {
                        let content = match item.get("output") {
                            Some(Value::String(s)) => vec![Part::Text(s.clone())],
                            Some(o @ Value::Array(_)) => parts_of(o, &format!("{path}.output"))?,
                            _ => {
                                return Err(GatewayError::invalid(
                                    format!("{path}.output"),
                                    "`output` is required",
                                ))
                            }
                        };
                        super::chat::push(
                            &mut r.messages,
                            Role::User,
                            vec![Part::ToolResult {
                                call_id: req_str(item, "call_id", &format!("{path}.call_id"))?
                                    .to_owned(),
                                content,
                                is_error: false,
                            }],
                        );
                    }
                    "reasoning" => {
                        let text: Vec<&str> = texts_of(item, "summary");
                        let signature = signature_of(item);
                        super::chat::push(
                            &mut r.messages,
                            Role::Assistant,
                            vec![Part::Reasoning(Reasoning {
                                text: text.join("\n"),
                                signature,
                                redacted: None,
                            })],
                        );
                    }
                    other => {
                        return Err(unsupported(
                            &format!("{path}.type"),
                            &format!("{other:?} items have no equivalent there"),
                        ))
                    }
                }
            }
        }
        Some(_) => {
            return Err(GatewayError::invalid(
                "input",
                "`input` must be a string or an array of items",
            ))
        }
    }
    for (i, tool) in get_array(v, "tools", "tools")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => r.tools.push(Tool {
                name: req_str(tool, "name", &format!("tools[{i}].name"))?.to_owned(),
                description: get_str(tool, "description", &format!("tools[{i}].description"))?
                    .map(str::to_owned),
                parameters: tool
                    .get("parameters")
                    .filter(|p| !p.is_null())
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                strict: get_bool(tool, "strict", &format!("tools[{i}].strict"))?,
            }),
            other => {
                return Err(unsupported(
                    &format!("tools[{i}].type"),
                    &format!("{:?} tools exist only on OpenAI", other.unwrap_or("?")),
                ))
            }
        }
    }
    r.tool_choice = match v.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => ToolChoice::Auto,
        }),
        Some(o) => match (
            o.get("type").and_then(Value::as_str),
            o.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(n)) => Some(ToolChoice::Named(n.to_owned())),
            _ => {
                return Err(unsupported(
                    "tool_choice",
                    "only none, auto, required or a named function",
                ))
            }
        },
    };
    r.parallel_tool_calls = get_bool(v, "parallel_tool_calls", "parallel_tool_calls")?;
    r.max_tokens = get_u64(v, "max_output_tokens", 1)?;
    r.temperature = get_f64_in(v, "temperature", 0.0, 2.0)?;
    r.top_p = get_f64_in(v, "top_p", 0.0, 1.0)?;
    r.stream = get_bool(v, "stream", "stream")?.unwrap_or(false);
    r.user = get_str(v, "user", "user")?.map(str::to_owned);
    if let Some(effort) = v.pointer("/reasoning/effort").and_then(Value::as_str) {
        r.thinking = Some(ir::Thinking {
            enabled: effort != "none",
            budget_tokens: None,
            effort: Some(effort.to_owned()),
        });
    }
    r.response_format = match v.pointer("/text/format") {
        None | Some(Value::Null) => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("json_object") => Some(ir::ResponseFormat::JsonObject),
            Some("json_schema") => Some(ir::ResponseFormat::JsonSchema {
                name: f
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("response")
                    .to_owned(),
                description: f
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                schema: f
                    .get("schema")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"})),
                strict: f.get("strict").and_then(Value::as_bool),
            }),
            _ => Some(ir::ResponseFormat::Text),
        },
    };
    Ok(r)
}

// === requests: IR → responses upstream ===

pub fn ir_to_request(
    r: &ir::Request,
    upstream_model: &str,
    _target: &Target,
) -> Result<Value, GatewayError> {
    // Stop sequences were refused by the Capabilities check before this runs.
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    if !r.system.is_empty() {
        out.insert("instructions".into(), json!(r.system.join("\n\n")));
    }
    let mut input = Vec::new();
    for m in &r.messages {
        let mut parts = Vec::new();
        let flush = |parts: &mut Vec<Value>, input: &mut Vec<Value>| {
            if !parts.is_empty() {
                let role = if m.role == Role::User {
                    "user"
                } else {
                    "assistant"
                };
                input.push(
                    json!({"type": "message", "role": role, "content": std::mem::take(parts)}),
                );
            }
        };
        for p in &m.content {
            match p {
                Part::Text(t) => parts.push(if m.role == Role::User {
                    json!({"type": "input_text", "text": t})
                } else {
                    json!({"type": "output_text", "text": t, "annotations": []})
                }),
                Part::Image(img) => parts.push(
                    json!({"type": "input_image", "image_url": img.source.to_url(),
                    "detail": img.detail.clone().unwrap_or_else(|| "auto".into())}),
                ),
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    flush(&mut parts, &mut input);
                    input.push(json!({"type": "function_call", "call_id": id, "name": name, "arguments": arguments}));
                }
                Part::ToolResult {
                    call_id,
                    content,
                    is_error,
                } => {
                    flush(&mut parts, &mut input);
                    let mut text = super::chat::tool_result_text(content);
                    if *is_error {
                        text = format!("Error: {text}");
                    }
                    input.push(
                        json!({"type": "function_call_output", "call_id": call_id, "output": text}),
                    );
                }
                // A reasoning item needs OpenAI's own id and encrypted content to mean anything there.
                Part::Reasoning(_) => {}
            }
        }
        flush(&mut parts, &mut input);
    }
    out.insert("input".into(), Value::Array(input));
    if !r.tools.is_empty() {
        let tools: Vec<Value> = r
            .tools
            .iter()
            .map(|t| json!({"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters, "strict": t.strict.unwrap_or(false)}))
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(tc) = &r.tool_choice {
        out.insert(
            "tool_choice".into(),
            match tc {
                ToolChoice::None => json!("none"),
                ToolChoice::Auto => json!("auto"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Named(n) => json!({"type": "function", "name": n}),
            },
        );
    }
    if let Some(p) = r.parallel_tool_calls {
        out.insert("parallel_tool_calls".into(), json!(p));
    }
    if let Some(m) = r.max_tokens {
        out.insert("max_output_tokens".into(), json!(m));
    }
    if let Some(t) = r.temperature {
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = r.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if let Some(th) = &r.thinking {
        if th.enabled {
            let effort = th.effort.clone().unwrap_or_else(|| {
                th.budget_tokens
                    .map_or("medium", crate::thinking::budget_to_effort)
                    .to_owned()
            });
            out.insert(
                "reasoning".into(),
                json!({"effort": effort, "summary": "auto"}),
            );
        } else if th.effort.is_some() {
            out.insert("reasoning".into(), json!({"effort": th.effort}));
        }
    }
    match &r.response_format {
        None | Some(ir::ResponseFormat::Text) => {}
        Some(ir::ResponseFormat::JsonObject) => {
            out.insert("text".into(), json!({"format": {"type": "json_object"}}));
        }
        Some(ir::ResponseFormat::JsonSchema {
            name,
            description,
            schema,
            strict,
        }) => {
            let mut f = json!({"type": "json_schema", "name": name, "schema": schema});
            if let Some(d) = description {
                f["description"] = json!(d);
            }
            if let Some(s) = strict {
                f["strict"] = json!(s);
            }
            out.insert("text".into(), json!({"format": f}));
        }
    }
    if let Some(u) = &r.user {
        out.insert("user".into(), json!(u));
    }
    // The gateway never refers back to stored responses, so do not ask the upstream to keep them.
    out.insert("store".into(), json!(false));
    if r.stream {
        out.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(out))
}

// === replies ===

fn usage_from(u: &Value) -> Usage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let cache_read = n("/input_tokens_details/cached_tokens");
    let cache_write = n("/input_tokens_details/cache_write_tokens");
    Usage {
        input: n("/input_tokens").saturating_sub(cache_read + cache_write),
        cache_read,
        cache_write,
        output: n("/output_tokens"),
        reasoning: n("/output_tokens_details/reasoning_tokens"),
    }
}

fn usage_json(u: &Usage) -> Value {
    let mut details = json!({"cached_tokens": u.cache_read});
    // Cache writes are counted in `input_tokens`; the newest SDK also names them (C.3), as chat does.
    if u.cache_write > 0 {
        details["cache_write_tokens"] = json!(u.cache_write);
    }
    json!({"input_tokens": u.prompt_total(), "input_tokens_details": details,
        "output_tokens": u.output, "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.prompt_total() + u.output})
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

/// What a Responses reply echoes back from the client's request.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    pub tools: Value,
    pub tool_choice: Value,
    pub parallel_tool_calls: Value,
    pub instructions: Value,
    pub max_output_tokens: Value,
    pub temperature: Value,
    pub top_p: Value,
    /// `{effort, summary}` as the client asked (C.3 echoes the request's `reasoning`).
    pub reasoning: Value,
}

impl Echo {
    pub fn from_request(v: &Value) -> Self {
        let g = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
        Self {
            tools: v.get("tools").cloned().unwrap_or_else(|| json!([])),
            tool_choice: v
                .get("tool_choice")
                .cloned()
                .unwrap_or_else(|| json!("auto")),
            parallel_tool_calls: v.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
            instructions: g("instructions"),
            max_output_tokens: g("max_output_tokens"),
            temperature: g("temperature"),
            top_p: g("top_p"),
            reasoning: json!({
                "effort": v.pointer("/reasoning/effort").cloned().unwrap_or(Value::Null),
                "summary": v.pointer("/reasoning/summary").cloned().unwrap_or(Value::Null),
            }),
        }
    }
}

/// The identity of a response object: id, creation time, model.
struct Head<'a>(&'a str, u64, &'a str);

fn response_object(
    Head(id, created, model): Head<'_>,
    status: &str,
    output: Vec<Value>,
    finish: Option<&Finish>,
    usage: Option<&Usage>,
    echo: &Echo,
) -> Value {
    let incomplete = match (status, finish) {
        ("incomplete", Some(Finish::ContentFilter)) => json!({"reason": "content_filter"}),
        ("incomplete", _) => json!({"reason": "max_output_tokens"}),
        _ => Value::Null,
    };
    json!({
        "id": id, "object": "response", "created_at": created, "status": status, "error": null,
        "incomplete_details": incomplete, "instructions": echo.instructions, "max_output_tokens": echo.max_output_tokens,
        "model": model, "output": output, "parallel_tool_calls": echo.parallel_tool_calls, "previous_response_id": null,
        "reasoning": echo.reasoning, "store": false, "temperature": echo.temperature,
        "text": {"format": {"type": "text"}}, "tool_choice": echo.tool_choice, "tools": echo.tools, "top_p": echo.top_p,
        "truncation": "disabled", "usage": usage.map(usage_json), "metadata": {},
    })
}

fn status_of(f: &Finish) -> &'static str {
    match f {
        Finish::MaxTokens | Finish::ContentFilter => "incomplete",
        _ => "completed",
    }
}

fn reasoning_item(id: &str, text: &str, signature: Option<&str>) -> Value {
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

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

/// Writes the reply a responses client expects.
pub fn ir_to_response(r: &ir::Response, client_model: &str, echo: &Echo) -> Value {
    let mut output = Vec::new();
    let mut text = String::new();
    let flush = |text: &mut String, output: &mut Vec<Value>| {
        if !text.is_empty() {
            output.push(message_item(&ir::mint_id("msg_"), text, "completed"));
            text.clear();
        }
    };
    for p in &r.content {
        match p {
            Part::Text(t) => text.push_str(t),
            Part::Reasoning(rs) => {
                flush(&mut text, &mut output);
                output.push(reasoning_item(
                    &ir::mint_id("rs_"),
                    &rs.text,
                    rs.signature.as_deref(),
                ));
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                flush(&mut text, &mut output);
                output.push(call_item(
                    &ir::mint_id("fc_"),
                    id,
                    name,
                    arguments,
                    "completed",
                ));
            }
            _ => {}
        }
    }
    flush(&mut text, &mut output);
    let status = status_of(&r.finish);
    // The item the model was writing when it was cut off is itself incomplete.
    if status == "incomplete" {
        if let Some(last) = output.last_mut().filter(|i| i.get("status").is_some()) {
            last["status"] = json!("incomplete");
        }
    }
    response_object(
        Head(&reprefix(&r.id, "resp_"), r.created, client_model),
        status,
        output,
        Some(&r.finish),
        Some(&r.usage),
        echo,
    )
}

// === errors ===

pub fn error_body(e: &ir::ErrorInfo) -> Value {
    super::chat::error_body(e)
}

pub fn error_from_body(status: u16, v: &Value) -> ir::ErrorInfo {
    super::chat::error_from_body(status, v)
}
