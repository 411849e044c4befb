//! Chat Completions ⇄ IR: client requests in, upstream requests out, replies and stream chunks both ways.

use serde_json::{json, Map, Value};

use super::common::*;
use crate::config::{Target, ThinkingStyle};
use crate::error::GatewayError;
use crate::ir::{
    self, Event, Finish, Image, ImageSource, Message, Part, Reasoning, Role, Tool, ToolChoice,
    Usage,
};
use crate::sse;

mod stream;

pub use stream::{StreamDecoder, StreamEncoder};

// === requests: chat client → IR ===

fn text_of_parts(content: &Value, path: &str) -> Result<String, GatewayError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                if let Some(t) = p
                    .get("text")
                    .and_then(Value::as_str)
                    .or_else(|| p.get("refusal").and_then(Value::as_str))
                {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(t);
                } else {
                    return Err(GatewayError::invalid(
                        format!("{path}[{i}]"),
                        "only text parts are allowed here",
                    ));
                }
            }
            Ok(out)
        }
        _ => Err(GatewayError::invalid(
            path,
            "must be a string or an array of parts",
        )),
    }
}

fn user_parts(content: &Value, path: &str) -> Result<Vec<Part>, GatewayError> {
    match content {
        Value::String(s) => Ok(vec![Part::Text(s.clone())]),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ppath = format!("{path}[{i}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => Ok(Part::Text(
                        req_str(p, "text", &format!("{ppath}.text"))?.to_owned(),
                    )),
                    Some("image_url") => {
                        let img = p.get("image_url").unwrap_or(&Value::Null);
                        let url = req_str(img, "url", &format!("{ppath}.image_url.url"))?;
                        Ok(Part::Image(Image {
                            source: ImageSource::from_url(url),
                            detail: get_str(img, "detail", &format!("{ppath}.image_url.detail"))?
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
            "must be a string or an array of parts",
        )),
    }
}

/// Reads a chat request (already checked by `validate::chat`) into the IR, refusing what the IR cannot hold.
pub fn request_to_ir(v: &Value) -> Result<ir::Request, GatewayError> {
    if get_u64(v, "n", 1)?.is_some_and(|n| n > 1) {
        return Err(unsupported("n", "only one choice per request"));
    }
    if get_bool(v, "logprobs", "logprobs")? == Some(true) {
        return Err(unsupported(
            "logprobs",
            "log probabilities are not available",
        ));
    }
    let mut r = ir::Request::default();
    let messages = get_array(v, "messages", "messages")?;
    for (i, m) in messages.into_iter().flatten().enumerate() {
        let path = format!("messages[{i}]");
        let content = m.get("content").unwrap_or(&Value::Null);
        match m.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => r
                .system
                .push(text_of_parts(content, &format!("{path}.content"))?),
            Some("user") => push(
                &mut r.messages,
                Role::User,
                user_parts(content, &format!("{path}.content"))?,
            ),
            Some("tool") => {
                let call_id =
                    req_str(m, "tool_call_id", &format!("{path}.tool_call_id"))?.to_owned();
                let text = text_of_parts(content, &format!("{path}.content"))?;
                push(
                    &mut r.messages,
                    Role::User,
                    vec![Part::ToolResult {
                        call_id,
                        content: vec![Part::Text(text)],
                        is_error: false,
                    }],
                );
            }
            Some("assistant") => {
                let mut parts = Vec::new();
                // Signed thinking round-trips through `thinking_blocks` (the convention LiteLLM uses).
                if let Some(blocks) = m.get("thinking_blocks").and_then(Value::as_array) {
                    for b in blocks {
                        let sig = b
                            .get("signature")
                            .and_then(Value::as_str)
                            .filter(|s| !s.is_empty());
                        match b.get("type").and_then(Value::as_str) {
                            Some("thinking") => parts.push(Part::Reasoning(Reasoning {
                                text: str_at(b, "thinking"),
                                signature: sig.map(str::to_owned),
                                redacted: None,
                            })),
                            Some("redacted_thinking") => parts.push(Part::Reasoning(Reasoning {
                                redacted: b.get("data").and_then(Value::as_str).map(str::to_owned),
                                ..Reasoning::default()
                            })),
                            _ => {}
                        }
                    }
                } else if let Some(rc) = m
                    .get("reasoning_content")
                    .or_else(|| m.get("reasoning"))
                    .and_then(Value::as_str)
                {
                    parts.push(Part::Reasoning(Reasoning {
                        text: rc.to_owned(),
                        ..Reasoning::default()
                    }));
                }
                let text = text_of_parts(content, &format!("{path}.content"))?;
                if !text.is_empty() {
                    parts.push(Part::Text(text));
                }
                for (j, c) in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let cpath = format!("{path}.tool_calls[{j}]");
                    let f = c.get("function").unwrap_or(&Value::Null);
                    parts.push(Part::ToolCall {
                        id: req_str(c, "id", &format!("{cpath}.id"))?.to_owned(),
                        name: req_str(f, "name", &format!("{cpath}.function.name"))?.to_owned(),
                        arguments: get_str(f, "arguments", &format!("{cpath}.function.arguments"))?
                            .unwrap_or("{}")
                            .to_owned(),
                    });
                }
                push(&mut r.messages, Role::Assistant, parts);
            }
            _ => {
                return Err(GatewayError::invalid(
                    format!("{path}.role"),
                    "unknown role",
                ))
            }
        }
    }
    for (i, tool) in get_array(v, "tools", "tools")?
        .into_iter()
        .flatten()
        .enumerate()
    {
        let f = tool.get("function").unwrap_or(&Value::Null);
        r.tools.push(Tool {
            name: req_str(f, "name", &format!("tools[{i}].function.name"))?.to_owned(),
            description: get_str(
                f,
                "description",
                &format!("tools[{i}].function.description"),
            )?
            .map(str::to_owned),
            parameters: f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            strict: get_bool(f, "strict", &format!("tools[{i}].function.strict"))?,
        });
    }
    r.tool_choice = match v.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => ToolChoice::Auto,
        }),
        Some(o) => match o.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => Some(ToolChoice::Named(name.to_owned())),
            None => {
                return Err(unsupported(
                    "tool_choice",
                    "only none, auto, required or a named function",
                ))
            }
        },
    };
    r.parallel_tool_calls = get_bool(v, "parallel_tool_calls", "parallel_tool_calls")?;
    r.max_tokens = get_u64(v, "max_completion_tokens", 1)?.or(get_u64(v, "max_tokens", 1)?);
    r.temperature = get_f64_in(v, "temperature", 0.0, 2.0)?;
    r.top_p = get_f64_in(v, "top_p", 0.0, 1.0)?;
    r.top_k = get_u64(v, "top_k", 0)?;
    r.stop = string_list(v, "stop")?;
    r.stream = get_bool(v, "stream", "stream")?.unwrap_or(false);
    r.include_usage = v.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
    r.user = get_str(v, "user", "user")?.map(str::to_owned);
    let effort = get_str(v, "reasoning_effort", "reasoning_effort")?.map(str::to_owned);
    let switch = v
        .pointer("/chat_template_kwargs/enable_thinking")
        .and_then(Value::as_bool)
        .or_else(|| v.get("enable_thinking").and_then(Value::as_bool))
        .or_else(|| {
            v.pointer("/thinking/type")
                .and_then(Value::as_str)
                .map(|t| t == "enabled")
        });
    // Anthropic's spelling of a budget inside the chat `thinking` switch is kept.
    let budget = v.pointer("/thinking/budget_tokens").and_then(Value::as_u64);
    r.thinking = match (switch, effort) {
        (None, None) => None,
        (Some(on), effort) => Some(ir::Thinking {
            enabled: on,
            budget_tokens: budget,
            effort,
        }),
        (None, Some(e)) => Some(ir::Thinking {
            enabled: e != "none",
            budget_tokens: None,
            effort: Some(e),
        }),
    };
    r.response_format = match v.get("response_format") {
        None | Some(Value::Null) => None,
        Some(rf) => match rf.get("type").and_then(Value::as_str) {
            Some("json_object") => Some(ir::ResponseFormat::JsonObject),
            Some("json_schema") => {
                let js = rf.get("json_schema").unwrap_or(&Value::Null);
                Some(ir::ResponseFormat::JsonSchema {
                    name: js
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("response")
                        .to_owned(),
                    description: js
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    schema: js
                        .get("schema")
                        .cloned()
                        .unwrap_or_else(|| json!({"type": "object"})),
                    strict: js.get("strict").and_then(Value::as_bool),
                })
            }
            _ => Some(ir::ResponseFormat::Text),
        },
    };
    Ok(r)
}

/// Appends parts as a message, merging with the previous message of the same role.
pub fn push(messages: &mut Vec<Message>, role: Role, parts: Vec<Part>) {
    match messages.last_mut() {
        Some(last) if last.role == role => last.content.extend(parts),
        _ => messages.push(Message {
            role,
            content: parts,
        }),
    }
}

// === requests: IR → chat upstream ===

/// Builds the chat request for an upstream from the IR.
pub fn ir_to_request(
    r: &ir::Request,
    upstream_model: &str,
    target: &Target,
) -> Result<Value, GatewayError> {
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    let mut messages = Vec::new();
    if !r.system.is_empty() {
        messages.push(json!({"role": "system", "content": r.system.join("\n\n")}));
    }
    for m in &r.messages {
        match m.role {
            Role::User => {
                // Tool results become `tool` messages, placed first so they follow the assistant's calls.
                let mut rest = Vec::new();
                for p in &m.content {
                    match p {
                        Part::ToolResult {
                            call_id,
                            content,
                            is_error,
                        } => {
                            let mut text = tool_result_text(content);
                            if *is_error {
                                text = format!("Error: {text}");
                            }
                            messages.push(
                                json!({"role": "tool", "tool_call_id": call_id, "content": text}),
                            );
                        }
                        Part::Text(t) => rest.push(json!({"type": "text", "text": t})),
                        Part::Image(img) => {
                            let mut iu = json!({"url": img.source.to_url()});
                            if let Some(d) = &img.detail {
                                iu["detail"] = json!(d);
                            }
                            rest.push(json!({"type": "image_url", "image_url": iu}));
                        }
                        Part::ToolCall { .. } | Part::Reasoning(_) => {}
                    }
                }
                if !rest.is_empty() {
                    let content = match rest.as_slice() {
                        [one] if one["type"] == "text" => one["text"].clone(),
                        _ => Value::Array(rest),
                    };
                    messages.push(json!({"role": "user", "content": content}));
                }
            }
            Role::Assistant => {
                let mut text = String::new();
                let mut calls = Vec::new();
                for p in &m.content {
                    match p {
                        Part::Text(t) => text.push_str(t),
                        Part::ToolCall { id, name, arguments } => calls.push(json!({
                            "id": id, "type": "function", "function": {"name": name, "arguments": arguments}})),
                        // Reasoning is not sent back: OpenAI-compatible servers reject or ignore it.
                        _ => {}
                    }
                }
                let mut msg = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }});
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                messages.push(msg);
            }
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    if !r.tools.is_empty() {
        let tools: Vec<Value> = r
            .tools
            .iter()
            .map(|t| {
                let mut f = json!({"name": t.name, "parameters": t.parameters});
                if let Some(d) = &t.description {
                    f["description"] = json!(d);
                }
                if let Some(s) = t.strict {
                    f["strict"] = json!(s);
                }
                json!({"type": "function", "function": f})
            })
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
                ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
            },
        );
    }
    if let Some(p) = r.parallel_tool_calls {
        if !r.tools.is_empty() {
            out.insert("parallel_tool_calls".into(), json!(p));
        }
    }
    if let Some(m) = r.max_tokens {
        out.insert("max_tokens".into(), json!(m));
    }
    if let Some(t) = r.temperature {
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = r.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if !r.stop.is_empty() {
        out.insert("stop".into(), json!(r.stop));
    }
    if r.stream {
        out.insert("stream".into(), json!(true));
        // The client protocols on the other side report usage at the end, so always ask for it.
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(u) = &r.user {
        out.insert("user".into(), json!(u));
    }
    match &r.response_format {
        None | Some(ir::ResponseFormat::Text) => {}
        Some(ir::ResponseFormat::JsonObject) => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(ir::ResponseFormat::JsonSchema {
            name,
            description,
            schema,
            strict,
        }) => {
            let mut js = json!({"name": name, "schema": schema});
            if let Some(d) = description {
                js["description"] = json!(d);
            }
            if let Some(s) = strict {
                js["strict"] = json!(s);
            }
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": js}),
            );
        }
    }
    if let Some(th) = &r.thinking {
        write_thinking(&mut out, th, target, r.max_tokens)?;
    }
    Ok(Value::Object(out))
}

fn write_thinking(
    out: &mut Map<String, Value>,
    th: &ir::Thinking,
    target: &Target,
    max_tokens: Option<u64>,
) -> Result<(), GatewayError> {
    let on = th.enabled;
    match target.thinking {
        ThinkingStyle::ChatTemplateKwargs => {
            out.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": on}),
            );
        }
        ThinkingStyle::EnableThinking => {
            out.insert("enable_thinking".into(), json!(on));
        }
        ThinkingStyle::ThinkingType => {
            out.insert(
                "thinking".into(),
                json!({"type": if on { "enabled" } else { "disabled" }}),
            );
        }
        ThinkingStyle::Anthropic => {
            let v = if on {
                let b = crate::thinking::anthropic_budget(
                    th.budget_tokens,
                    th.effort.as_deref(),
                    max_tokens,
                    target.default_max_tokens.map(u64::from),
                );
                if let Some(raised) = b.raised_max_tokens {
                    // Written where the IR's limit went: chat's `max_tokens`.
                    out.insert("max_tokens".into(), json!(raised));
                }
                json!({"type": "enabled", "budget_tokens": b.budget_tokens})
            } else {
                json!({"type": "disabled"})
            };
            out.insert("thinking".into(), v);
        }
        // No vendor switch configured: OpenAI's own spelling, when the client gave an effort.
        ThinkingStyle::None => match (&th.effort, th.enabled) {
            (Some(e), _) => {
                out.insert("reasoning_effort".into(), json!(e));
            }
            (None, false) => {}
            (None, true) => {
                let effort = th
                    .budget_tokens
                    .map_or("medium", crate::thinking::budget_to_effort);
                out.insert("reasoning_effort".into(), json!(effort));
            }
        },
    }
    Ok(())
}

pub fn tool_result_text(content: &[Part]) -> String {
    let mut text = String::new();
    for p in content {
        if let Part::Text(t) = p {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(t);
        }
    }
    text
}

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
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("/prompt_tokens");
    let cache_read = n("/prompt_tokens_details/cached_tokens");
    let cache_write = n("/prompt_tokens_details/cache_write_tokens");
    Usage {
        input: prompt.saturating_sub(cache_read + cache_write),
        cache_read,
        cache_write,
        output: n("/completion_tokens"),
        reasoning: n("/completion_tokens_details/reasoning_tokens"),
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
        "total_tokens": u.prompt_total() + u.output,
        "prompt_tokens_details": details,
        "completion_tokens_details": {"reasoning_tokens": u.reasoning},
    })
}

/// Reads a chat upstream's non-streamed reply.
pub fn response_to_ir(v: &Value) -> Result<ir::Response, GatewayError> {
    let choice = v.pointer("/choices/0").ok_or_else(|| {
        GatewayError::new(
            crate::error::ErrorKind::UpstreamBadResponse,
            "the upstream reply has no choices",
        )
    })?;
    let msg = choice.get("message").unwrap_or(&Value::Null);
    let mut content = Vec::new();
    if let Some(r) = msg
        .get("reasoning_content")
        .or_else(|| msg.get("reasoning"))
        .and_then(Value::as_str)
    {
        if !r.is_empty() {
            content.push(Part::Reasoning(Reasoning {
                text: r.to_owned(),
                ..Reasoning::default()
            }));
        }
    }
    if let Some(t) = msg.get("content").and_then(Value::as_str) {
        if !t.is_empty() {
            content.push(Part::Text(t.to_owned()));
        }
    }
    if let Some(t) = msg.get("refusal").and_then(Value::as_str) {
        content.push(Part::Text(t.to_owned()));
    }
    for c in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        content.push(Part::ToolCall {
            id: c
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| ir::mint_id("call_"), str::to_owned),
            name: c
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            arguments: c
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        });
    }
    Ok(ir::Response {
        id: str_at(v, "id"),
        model: str_at(v, "model"),
        created: v
            .get("created")
            .and_then(Value::as_u64)
            .unwrap_or_else(ir::now_secs),
        content,
        finish: finish_from(choice.get("finish_reason").and_then(Value::as_str)),
        usage: v.get("usage").map(usage_from).unwrap_or_default(),
    })
}

/// Writes the chat reply a chat client expects.
pub fn ir_to_response(r: &ir::Response, client_model: &str) -> Value {
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
