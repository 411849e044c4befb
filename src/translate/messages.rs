//! Anthropic Messages ⇄ IR: client requests in, upstream requests out, replies and stream events both ways.

use serde_json::{json, Map, Value};

use super::common::*;
use crate::config::Target;
use crate::error::GatewayError;
use crate::ir::{
    self, Event, Finish, Image, ImageSource, Part, Reasoning, Role, Tool, ToolChoice, Usage,
};
use crate::sse;

/// The tool that carries JSON mode toward a messages upstream (the forced-tool technique).
pub const JSON_TOOL: &str = "json_tool_call";

/// Anthropic's default when neither the client nor the model config gives `max_tokens`.
const FALLBACK_MAX_TOKENS: u64 = 4096;

mod stream;

pub use stream::{StreamDecoder, StreamEncoder};

// === requests: messages client → IR ===

fn image_from(source: &Value, path: &str) -> Result<Image, GatewayError> {
    let source = match source.get("type").and_then(Value::as_str) {
        Some("base64") => ImageSource::Base64 {
            media_type: req_str(source, "media_type", &format!("{path}.media_type"))?.to_owned(),
            data: req_str(source, "data", &format!("{path}.data"))?.to_owned(),
        },
        Some("url") => ImageSource::Url(req_str(source, "url", &format!("{path}.url"))?.to_owned()),
        _ => {
            return Err(GatewayError::invalid(
                format!("{path}.type"),
                "image sources must be base64 or url",
            ))
        }
    };
    Ok(Image {
        source,
        detail: None,
    })
}

fn blocks(content: &Value, path: &str) -> Result<Vec<Part>, GatewayError> {
    let list = match content {
        Value::String(s) => return Ok(vec![Part::Text(s.clone())]),
        Value::Array(a) => a,
        _ => {
            return Err(GatewayError::invalid(
                path,
                format!("`{path}` must be a string or an array of content blocks"),
            ))
        }
    };
    let mut parts = Vec::with_capacity(list.len());
    for (i, b) in list.iter().enumerate() {
        let bpath = format!("{path}[{i}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(Part::Text(
                req_str(b, "text", &format!("{bpath}.text"))?.to_owned(),
            )),
            Some("image") => parts.push(Part::Image(image_from(
                b.get("source").unwrap_or(&Value::Null),
                &format!("{bpath}.source"),
            )?)),
            Some("tool_use") => parts.push(Part::ToolCall {
                id: req_str(b, "id", &format!("{bpath}.id"))?.to_owned(),
                name: req_str(b, "name", &format!("{bpath}.name"))?.to_owned(),
                arguments: b
                    .get("input")
                    .map_or_else(|| "{}".to_owned(), Value::to_string),
            }),
            Some("tool_result") => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(c) => blocks(c, &format!("{bpath}.content"))?,
                };
                parts.push(Part::ToolResult {
                    call_id: req_str(b, "tool_use_id", &format!("{bpath}.tool_use_id"))?.to_owned(),
                    content,
                    is_error: b.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                });
            }
            Some("thinking") => parts.push(Part::Reasoning(Reasoning {
                text: str_at(b, "thinking"),
                signature: b
                    .get("signature")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
                redacted: None,
            })),
            Some("redacted_thinking") => parts.push(Part::Reasoning(Reasoning {
                redacted: b.get("data").and_then(Value::as_str).map(str::to_owned),
                ..Reasoning::default()
            })),
            Some(other) => {
                return Err(unsupported(
                    &format!("{bpath}.type"),
                    &format!("{other:?} blocks have no equivalent there"),
                ))
            }
            None => {
                return Err(GatewayError::invalid(
                    format!("{bpath}.type"),
                    "`type` is required",
                ))
            }
        }
    }
    Ok(parts)
}

/// Reads and checks a messages request into the IR, refusing what the IR cannot hold.
pub fn request_to_ir(v: &Value) -> Result<ir::Request, GatewayError> {
    as_object(v, "body")?;
    let mut r = ir::Request {
        max_tokens: Some(
            get_u64(v, "max_tokens", 1)?
                .ok_or_else(|| GatewayError::invalid("max_tokens", "`max_tokens` is required"))?,
        ),
        ..ir::Request::default()
    };
    match v.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => r.system.push(s.clone()),
        Some(Value::Array(a)) => {
            for (i, b) in a.iter().enumerate() {
                r.system
                    .push(req_str(b, "text", &format!("system[{i}].text"))?.to_owned());
            }
        }
        Some(_) => {
            return Err(GatewayError::invalid(
                "system",
                "`system` must be a string or an array of text blocks",
            ))
        }
    }
    let messages = get_array(v, "messages", "messages")?
        .ok_or_else(|| GatewayError::invalid("messages", "`messages` is required"))?;
    if messages.is_empty() {
        return Err(GatewayError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        let role = match m.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            _ => {
                return Err(GatewayError::invalid(
                    format!("{path}.role"),
                    "`role` must be user or assistant",
                ))
            }
        };
        let content = m.get("content").ok_or_else(|| {
            GatewayError::invalid(format!("{path}.content"), "`content` is required")
        })?;
        super::chat::push(
            &mut r.messages,
            role,
            blocks(content, &format!("{path}.content"))?,
        );
    }
    for (i, t) in get_array(v, "tools", "tools")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(kind) = t
            .get("type")
            .and_then(Value::as_str)
            .filter(|k| *k != "custom")
        {
            return Err(unsupported(
                &format!("tools[{i}].type"),
                &format!("server tool {kind:?} exists only on Anthropic"),
            ));
        }
        r.tools.push(Tool {
            name: req_str(t, "name", &format!("tools[{i}].name"))?.to_owned(),
            description: get_str(t, "description", &format!("tools[{i}].description"))?
                .map(str::to_owned),
            parameters: t
                .get("input_schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            strict: get_bool(t, "strict", &format!("tools[{i}].strict"))?,
        });
    }
    if let Some(tc) = v.get("tool_choice").filter(|t| !t.is_null()) {
        r.tool_choice = Some(match tc.get("type").and_then(Value::as_str) {
            Some("none") => ToolChoice::None,
            Some("any") => ToolChoice::Required,
            Some("tool") => ToolChoice::Named(req_str(tc, "name", "tool_choice.name")?.to_owned()),
            _ => ToolChoice::Auto,
        });
        if let Some(d) = tc.get("disable_parallel_tool_use").and_then(Value::as_bool) {
            r.parallel_tool_calls = Some(!d);
        }
    }
    r.temperature = get_f64_in(v, "temperature", 0.0, 1.0)?;
    r.top_p = get_f64_in(v, "top_p", 0.0, 1.0)?;
    r.top_k = get_u64(v, "top_k", 0)?;
    r.stop = string_list(v, "stop_sequences")?;
    r.stream = get_bool(v, "stream", "stream")?.unwrap_or(false);
    r.user = v
        .pointer("/metadata/user_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(th) = v.get("thinking").filter(|t| !t.is_null()) {
        r.thinking = Some(match th.get("type").and_then(Value::as_str) {
            Some("enabled") => ir::Thinking {
                enabled: true,
                budget_tokens: get_u64(th, "budget_tokens", 1)?,
                effort: None,
            },
            Some("adaptive") => ir::Thinking {
                enabled: true,
                budget_tokens: None,
                effort: None,
            },
            Some("disabled") => ir::Thinking {
                enabled: false,
                budget_tokens: None,
                effort: None,
            },
            _ => {
                return Err(GatewayError::invalid(
                    "thinking.type",
                    "`thinking.type` must be enabled, disabled or adaptive",
                ))
            }
        });
    }
    if let Some(schema) = v
        .pointer("/output_config/format/schema")
        .or_else(|| v.pointer("/output_format/schema"))
    {
        r.response_format = Some(ir::ResponseFormat::JsonSchema {
            name: "structured_output".into(),
            description: None,
            schema: schema.clone(),
            strict: Some(true),
        });
    }
    Ok(r)
}

// === requests: IR → messages upstream ===

/// Anthropic accepts tool ids of `[a-zA-Z0-9_-]` only; other characters become `_`, the same way
/// for a call and its result so they still pair up.
fn sanitize_id(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn image_block(img: &Image) -> Value {
    match &img.source {
        ImageSource::Base64 { media_type, data } => {
            json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
        }
        ImageSource::Url(u) => json!({"type": "image", "source": {"type": "url", "url": u}}),
    }
}

fn block_of(p: &Part) -> Option<Value> {
    Some(match p {
        Part::Text(t) if t.is_empty() => return None,
        Part::Text(t) => json!({"type": "text", "text": t}),
        Part::Image(img) => image_block(img),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => {
            // The model wrote the arguments; unparsable text becomes {} rather than a refused request.
            let input = serde_json::from_str::<Value>(arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            json!({"type": "tool_use", "id": sanitize_id(id), "name": name, "input": input})
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => {
            let inner: Vec<Value> = content.iter().filter_map(block_of).collect();
            let content = match inner.as_slice() {
                [one] if one["type"] == "text" => one["text"].clone(),
                _ => Value::Array(inner),
            };
            let mut b = json!({"type": "tool_result", "tool_use_id": sanitize_id(call_id), "content": content});
            if *is_error {
                b["is_error"] = json!(true);
            }
            b
        }
        // Only genuine signed thinking goes back to Anthropic; unsigned reasoning would be refused.
        Part::Reasoning(r) => match (&r.signature, &r.redacted) {
            (Some(sig), _) => json!({"type": "thinking", "thinking": r.text, "signature": sig}),
            (None, Some(data)) => json!({"type": "redacted_thinking", "data": data}),
            (None, None) => return None,
        },
    })
}

/// Builds the messages request for an upstream from the IR.
pub fn ir_to_request(
    r: &ir::Request,
    upstream_model: &str,
    target: &Target,
) -> Result<Value, GatewayError> {
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    let mut max_tokens = r
        .max_tokens
        .or(target.default_max_tokens.map(u64::from))
        .unwrap_or(FALLBACK_MAX_TOKENS);
    let mut messages: Vec<Value> = Vec::new();
    for m in &r.messages {
        let mut content: Vec<Value> = Vec::new();
        // Tool results first in a user turn, as Anthropic requires after tool_use.
        if m.role == Role::User {
            content.extend(
                m.content
                    .iter()
                    .filter(|p| matches!(p, Part::ToolResult { .. }))
                    .filter_map(block_of),
            );
            content.extend(
                m.content
                    .iter()
                    .filter(|p| !matches!(p, Part::ToolResult { .. }))
                    .filter_map(block_of),
            );
        } else {
            content.extend(m.content.iter().filter_map(block_of));
        }
        if content.is_empty() {
            continue;
        }
        let role = if m.role == Role::User {
            "user"
        } else {
            "assistant"
        };
        match messages.last_mut() {
            Some(last) if last["role"] == role => {
                if let Some(arr) = last["content"].as_array_mut() {
                    arr.extend(content);
                }
            }
            _ => messages.push(json!({"role": role, "content": content})),
        }
    }
    let mut tools: Vec<Value> = r
        .tools
        .iter()
        .map(|t| {
            let mut schema = t.parameters.clone();
            if !schema.is_object() {
                schema = json!({"type": "object", "properties": {}});
            }
            let mut v = json!({"name": t.name, "input_schema": schema});
            if let Some(d) = &t.description {
                v["description"] = json!(d);
            }
            v
        })
        .collect();
    let mut tool_choice = r.tool_choice.as_ref().map(|tc| match tc {
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::Named(n) => json!({"type": "tool", "name": n}),
    });
    let thinking_on = r.thinking.as_ref().is_some_and(|t| t.enabled);
    // JSON mode: a forced tool whose input schema is the wanted schema; its input comes back as text.
    let json_schema = match &r.response_format {
        Some(ir::ResponseFormat::JsonObject) => {
            Some(json!({"type": "object", "additionalProperties": true, "properties": {}}))
        }
        Some(ir::ResponseFormat::JsonSchema { schema, .. }) => Some(schema.clone()),
        _ => None,
    };
    if let Some(schema) = json_schema {
        tools.push(json!({"name": JSON_TOOL, "description": "Respond with a JSON object matching the input schema.", "input_schema": schema}));
        // Anthropic refuses forced tool use together with thinking; then the tool is only offered.
        tool_choice = Some(if thinking_on {
            json!({"type": "auto"})
        } else {
            json!({"type": "tool", "name": JSON_TOOL})
        });
    }
    if r.parallel_tool_calls == Some(false) && !tools.is_empty() {
        let tc = tool_choice.get_or_insert_with(|| json!({"type": "auto"}));
        if tc["type"] != "none" {
            tc["disable_parallel_tool_use"] = json!(true);
        }
    }
    if !r.system.is_empty() {
        out.insert("system".into(), json!(r.system.join("\n\n")));
    }
    out.insert("messages".into(), Value::Array(messages));
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(tc) = tool_choice {
        out.insert("tool_choice".into(), tc);
    }
    if let Some(th) = &r.thinking {
        let v = if th.enabled {
            let b = crate::thinking::anthropic_budget(
                th.budget_tokens,
                th.effort.as_deref(),
                Some(max_tokens),
                None,
            );
            if let Some(raised) = b.raised_max_tokens {
                max_tokens = raised;
            }
            json!({"type": "enabled", "budget_tokens": b.budget_tokens})
        } else {
            json!({"type": "disabled"})
        };
        out.insert("thinking".into(), v);
    }
    out.insert("max_tokens".into(), json!(max_tokens));
    // Anthropic's range is [0, 1]; clients of the other protocols may send up to 2.
    if let Some(t) = r.temperature {
        out.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(p) = r.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if let Some(k) = r.top_k {
        out.insert("top_k".into(), json!(k));
    }
    if !r.stop.is_empty() {
        out.insert("stop_sequences".into(), json!(r.stop));
    }
    if r.stream {
        out.insert("stream".into(), json!(true));
    }
    if let Some(u) = &r.user {
        out.insert("metadata".into(), json!({"user_id": u}));
    }
    Ok(Value::Object(out))
}

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

fn usage_from(u: &Value, into: &mut Usage) {
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
    if let Some(x) = u
        .pointer("/output_tokens_details/thinking_tokens")
        .and_then(Value::as_u64)
    {
        into.reasoning = x;
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({"input_tokens": u.input, "output_tokens": u.output,
        "cache_creation_input_tokens": u.cache_write, "cache_read_input_tokens": u.cache_read})
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

/// Writes the reply a messages client expects.
pub fn ir_to_response(r: &ir::Response, client_model: &str) -> Value {
    let mut content = Vec::new();
    for p in &r.content {
        match p {
            Part::Text(t) => match content.last_mut() {
                Some(Value::Object(last)) if last.get("type") == Some(&json!("text")) => {
                    let joined = format!("{}{t}", last.get("text").and_then(Value::as_str).unwrap_or(""));
                    last.insert("text".into(), json!(joined));
                }
                _ => content.push(json!({"type": "text", "text": t})),
            },
            // Reasoning from a non-Anthropic upstream has no signature; "" says so without inventing one.
            Part::Reasoning(rs) => match &rs.redacted {
                Some(data) => content.push(json!({"type": "redacted_thinking", "data": data})),
                None => content.push(json!({"type": "thinking", "thinking": rs.text, "signature": rs.signature.clone().unwrap_or_default()})),
            },
            Part::ToolCall { id, name, arguments } => {
                let input = serde_json::from_str::<Value>(arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            }
            _ => {}
        }
    }
    let stop_sequence = match &r.finish {
        Finish::StopSequence(s) => json!(s),
        _ => Value::Null,
    };
    json!({
        "id": reprefix(&r.id, "msg_"),
        "type": "message",
        "role": "assistant",
        "model": client_model,
        "content": content,
        "stop_reason": finish_name(&r.finish),
        "stop_sequence": stop_sequence,
        "usage": usage_json(&r.usage),
    })
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
