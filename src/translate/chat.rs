//! Chat Completions ⇄ IR: client requests in, upstream requests out, replies and stream chunks both ways.

use serde_json::{json, Value};

use super::common::*;
use crate::error::GatewayError;
use crate::ir::{self, Event, Finish, Part, Reasoning, Usage};
use crate::sse;

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
