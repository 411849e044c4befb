//! The built-in mock upstream: deterministic replies (text, thinking, tool calls, usage) derived from the last user message, in chat, messages and responses, in-process or on its own port.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::body::{self, Body, BoxError};
use crate::config::Protocol;
use crate::error::{ErrorKind, ErrorShape, GatewayError};
use crate::{ir, translate};

/// Answers one request for `protocol` with the mock model.
pub fn handle(protocol: Protocol, body: &[u8], chunk_delay: Duration) -> Response<Body> {
    match protocol {
        Protocol::Chat => chat(body, chunk_delay),
        Protocol::Messages | Protocol::Responses => other_protocol(protocol, body, chunk_delay),
    }
}

/// A messages or responses request, answered in that protocol by running the same decision as
/// chat and writing it out with the gateway's own encoders for that protocol.
fn other_protocol(protocol: Protocol, body: &[u8], chunk_delay: Duration) -> Response<Body> {
    let shape = if protocol == Protocol::Messages {
        ErrorShape::Anthropic
    } else {
        ErrorShape::OpenAi
    };
    let v: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return GatewayError::new(ErrorKind::InvalidRequest, "the body is not a JSON object")
                .into_response(shape)
        }
    };
    let r = match translate::decode_request(protocol, body) {
        Ok(r) => r,
        Err(e) => return e.into_response(shape),
    };
    let model = v.get("model").and_then(Value::as_str).unwrap_or("mock");
    let reply = decide(&chat_view(&r, model));
    let sign = protocol == Protocol::Messages;
    let translation = translate::Translation::for_mock(protocol, model, body);
    if r.stream {
        let mut encoder = translation.stream_encoder();
        let mut chunks = VecDeque::new();
        for ev in reply_events(&reply, sign) {
            let mut out = Vec::new();
            encoder.encode(ev, &mut out);
            if !out.is_empty() {
                chunks.push_back(Bytes::from(out));
            }
        }
        sse_response(ChunksBody::new(chunks, chunk_delay))
    } else {
        let ir = reply_ir(&reply, sign);
        let value = match protocol {
            Protocol::Messages => translate::messages::ir_to_response(&ir, model),
            _ => translation.responses_reply(&ir),
        };
        json_response(&value)
    }
}

/// The IR request as the chat-shaped value `decide` reads.
fn chat_view(r: &ir::Request, model: &str) -> Value {
    let messages: Vec<Value> = r
        .messages
        .iter()
        .map(|m| {
            let text: Vec<&str> = m
                .content
                .iter()
                .filter_map(|p| match p {
                    ir::Part::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            let role = if m.role == ir::Role::User {
                "user"
            } else {
                "assistant"
            };
            json!({"role": role, "content": text.join(" ")})
        })
        .collect();
    let tools: Vec<Value> = r
        .tools
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t.name, "parameters": t.parameters}}))
        .collect();
    let tool_choice = match &r.tool_choice {
        None | Some(ir::ToolChoice::Auto) => Value::Null,
        Some(ir::ToolChoice::None) => json!("none"),
        Some(ir::ToolChoice::Required) => json!("required"),
        Some(ir::ToolChoice::Named(n)) => json!({"type": "function", "function": {"name": n}}),
    };
    json!({
        "model": model, "messages": messages, "tools": tools, "tool_choice": tool_choice,
        "stop": r.stop, "max_tokens": r.max_tokens,
        "enable_thinking": r.thinking.as_ref().is_some_and(|t| t.enabled),
    })
}

fn mock_signature(reasoning: &str) -> String {
    format!("mock-signature-{:016x}", fingerprint(reasoning))
}

fn reply_usage(reply: &Reply) -> ir::Usage {
    ir::Usage {
        input: reply.prompt_tokens,
        output: reply.completion_tokens(),
        ..ir::Usage::default()
    }
}

fn reply_finish(reply: &Reply) -> ir::Finish {
    match reply.finish {
        Finish::Stop => ir::Finish::EndTurn,
        Finish::Length => ir::Finish::MaxTokens,
        Finish::ToolCalls => ir::Finish::ToolUse,
    }
}

/// The reply as an IR response; `sign` gives thinking a (mock) signature, as Anthropic does.
pub fn reply_ir(reply: &Reply, sign: bool) -> ir::Response {
    let mut content = Vec::new();
    if let Some(r) = &reply.reasoning {
        content.push(ir::Part::Reasoning(ir::Reasoning {
            text: r.clone(),
            signature: sign.then(|| mock_signature(r)),
            redacted: None,
        }));
    }
    if !reply.tokens.is_empty() {
        content.push(ir::Part::Text(reply.tokens.concat()));
    }
    if let Some(c) = &reply.tool_call {
        content.push(ir::Part::ToolCall {
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        });
    }
    ir::Response {
        id: format!("mock{:016x}", fingerprint(&reply.tokens.concat())),
        model: reply.model.clone(),
        created: now_secs(),
        content,
        finish: reply_finish(reply),
        usage: reply_usage(reply),
    }
}

/// The reply as IR stream events, one small piece per event.
pub fn reply_events(reply: &Reply, sign: bool) -> Vec<ir::Event> {
    use ir::Event;
    let mut out = vec![Event::Start {
        id: format!("mock{:016x}", fingerprint(&reply.tokens.concat())),
        model: reply.model.clone(),
        created: now_secs(),
    }];
    if let Some(r) = &reply.reasoning {
        out.extend(
            r.split_inclusive(' ')
                .map(|p| Event::ReasoningDelta(p.to_owned())),
        );
        if sign {
            out.push(Event::ReasoningSignature(mock_signature(r)));
        }
    }
    out.extend(reply.tokens.iter().map(|t| Event::TextDelta(t.clone())));
    if let Some(c) = &reply.tool_call {
        out.push(Event::ToolStart {
            index: 0,
            id: c.id.clone(),
            name: c.name.clone(),
        });
        let mid = c
            .arguments
            .char_indices()
            .map(|(i, _)| i)
            .nth(c.arguments.chars().count() / 2)
            .unwrap_or(0);
        for piece in [&c.arguments[..mid], &c.arguments[mid..]] {
            if !piece.is_empty() {
                out.push(Event::ToolArgs {
                    index: 0,
                    fragment: piece.to_owned(),
                });
            }
        }
    }
    out.push(Event::Finish(reply_finish(reply)));
    out.push(Event::Usage(reply_usage(reply)));
    out.push(Event::End);
    out
}

/// What the mock decided to answer, before it is put in any protocol's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub model: String,
    pub reasoning: Option<String>,
    /// Text tokens, each a word with its trailing space.
    pub tokens: Vec<String>,
    pub tool_call: Option<ToolCall>,
    pub finish: Finish,
    pub prompt_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
}

impl Reply {
    pub fn completion_tokens(&self) -> u64 {
        let reasoning = self
            .reasoning
            .as_deref()
            .map_or(0, |r| r.split_whitespace().count());
        let tool = self.tool_call.as_ref().map_or(0, |_| 8);
        (self.tokens.len() + reasoning + tool) as u64
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

fn thinking_requested(req: &Value) -> bool {
    req.pointer("/chat_template_kwargs/enable_thinking") == Some(&Value::Bool(true))
        || req.get("enable_thinking") == Some(&Value::Bool(true))
        || req.pointer("/thinking/type").and_then(Value::as_str) == Some("enabled")
}

/// FNV-1a, so ids are stable for the same prompt across runs and machines.
fn fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn example_value(schema: &Value) -> Value {
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => match schema.get("enum").and_then(|e| e.get(0)) {
            Some(first) => first.clone(),
            None => json!("mock"),
        },
        Some("integer" | "number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => {
            let mut obj = serde_json::Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    obj.insert(k.clone(), example_value(v));
                }
            }
            Value::Object(obj)
        }
        _ => Value::Null,
    }
}

/// Decides the reply to a chat-shaped request (`messages`, `tools`, `max_tokens`, `stop`).
pub fn decide(req: &Value) -> Reply {
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock")
        .to_owned();
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let prompt_tokens: u64 = messages
        .iter()
        .map(|m| {
            m.get("content")
                .map_or(0, |c| text_of(c).split_whitespace().count()) as u64
                + 3
        })
        .sum();
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content"))
        .map(text_of)
        .unwrap_or_default();
    let id = format!("call_mock{:016x}", fingerprint(&last_user));

    let tools = req
        .get("tools")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let choice = req.get("tool_choice");
    let lower = last_user.to_lowercase();
    let tool_name = |t: &Value| {
        t.pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let forced = match choice {
        Some(Value::String(s)) if s == "required" => tools.first().map(tool_name),
        Some(Value::Object(o)) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    };
    let allowed = !matches!(choice, Some(Value::String(s)) if s == "none");
    let asked = tools
        .iter()
        .map(tool_name)
        .find(|n| !n.is_empty() && lower.contains(&n.to_lowercase()))
        .or_else(|| {
            (lower.contains("tool") || lower.contains("call ") || lower.contains("weather"))
                .then(|| tools.first().map(tool_name))
                .flatten()
        });
    let call = if allowed { forced.or(asked) } else { None };
    if let Some(name) = call.filter(|n| !n.is_empty()) {
        let schema = tools
            .iter()
            .find(|t| tool_name(t) == name)
            .and_then(|t| t.pointer("/function/parameters"))
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        let mut args = example_value(&schema);
        if !args.is_object() {
            args = json!({});
        }
        return Reply {
            model,
            reasoning: None,
            tokens: Vec::new(),
            tool_call: Some(ToolCall {
                id,
                name,
                arguments: args.to_string(),
            }),
            finish: Finish::ToolCalls,
            prompt_tokens,
        };
    }

    let reasoning = thinking_requested(req).then(|| {
        format!(
            "The user wrote {} words. I will answer by echoing them.",
            last_user.split_whitespace().count()
        )
    });
    let mut text = if last_user.trim().is_empty() {
        "Hello from the modelgate mock.".to_owned()
    } else {
        format!("You said: {}", last_user.trim())
    };
    let mut finish = Finish::Stop;
    let stops: Vec<String> = match req.get("stop").or_else(|| req.get("stop_sequences")) {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    if let Some(cut) = stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
    {
        text.truncate(cut);
    }
    let mut tokens: Vec<String> = text.split_inclusive(' ').map(str::to_owned).collect();
    let limit = req
        .get("max_completion_tokens")
        .or_else(|| req.get("max_tokens"))
        .or_else(|| req.get("max_output_tokens"))
        .and_then(Value::as_u64);
    if let Some(limit) = limit {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if tokens.len() > limit {
            tokens.truncate(limit);
            finish = Finish::Length;
        }
    }
    Reply {
        model,
        reasoning,
        tokens,
        tool_call: None,
        finish,
        prompt_tokens,
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn chat(body: &[u8], chunk_delay: Duration) -> Response<Body> {
    let req: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return GatewayError::new(ErrorKind::InvalidRequest, "the body is not a JSON object")
                .into_response(ErrorShape::OpenAi)
        }
    };
    let reply = decide(&req);
    let stream = req.get("stream") == Some(&Value::Bool(true));
    let include_usage = req.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
    let id = format!("chatcmpl-mock{:016x}", fingerprint(&req.to_string()));
    if stream {
        let chunks = chat_chunks(&reply, &id, now_secs(), include_usage);
        sse_response(ChunksBody::new(chunks, chunk_delay))
    } else {
        json_response(&chat_json(&reply, &id, now_secs()))
    }
}

fn finish_name(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

fn usage_json(reply: &Reply) -> Value {
    let completion = reply.completion_tokens();
    json!({
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": reply.prompt_tokens + completion,
    })
}

pub fn chat_json(reply: &Reply, id: &str, created: u64) -> Value {
    let mut message = json!({"role": "assistant", "content": null});
    if !reply.tokens.is_empty() || reply.tool_call.is_none() {
        message["content"] = json!(reply.tokens.concat());
    }
    if let Some(r) = &reply.reasoning {
        message["reasoning_content"] = json!(r);
    }
    if let Some(call) = &reply.tool_call {
        message["tool_calls"] = json!([{
            "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }]);
    }
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": reply.model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_name(reply.finish)}],
        "usage": usage_json(reply),
    })
}

pub fn chat_chunks(reply: &Reply, id: &str, created: u64, include_usage: bool) -> VecDeque<Bytes> {
    let chunk = |delta: Value, finish: Option<&str>| -> Bytes {
        let mut c = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": reply.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        Bytes::from(format!("data: {c}\n\n"))
    };
    let mut out = VecDeque::new();
    let first_content = if reply.tool_call.is_some() {
        Value::Null
    } else {
        json!("")
    };
    out.push_back(chunk(
        json!({"role": "assistant", "content": first_content}),
        None,
    ));
    if let Some(r) = &reply.reasoning {
        for piece in r.split_inclusive(' ') {
            out.push_back(chunk(json!({"reasoning_content": piece}), None));
        }
    }
    for t in &reply.tokens {
        out.push_back(chunk(json!({"content": t}), None));
    }
    if let Some(call) = &reply.tool_call {
        out.push_back(chunk(
            json!({"tool_calls": [{"index": 0, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}]}),
            None,
        ));
        let args = call.arguments.as_str();
        let mid = args
            .char_indices()
            .map(|(i, _)| i)
            .nth(args.chars().count() / 2)
            .unwrap_or(0);
        for piece in [&args[..mid], &args[mid..]] {
            if !piece.is_empty() {
                out.push_back(chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
    }
    out.push_back(chunk(json!({}), Some(finish_name(reply.finish))));
    if include_usage {
        let c = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": reply.model,
            "choices": [], "usage": usage_json(reply),
        });
        out.push_back(Bytes::from(format!("data: {c}\n\n")));
    }
    out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

fn json_response(value: &Value) -> Response<Body> {
    let mut resp = Response::new(body::full(value.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn sse_response(b: ChunksBody) -> Response<Body> {
    let mut resp = Response::new(b.boxed());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// A body that yields prepared chunks one frame at a time, optionally pausing between them.
pub struct ChunksBody {
    chunks: VecDeque<Bytes>,
    delay: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ChunksBody {
    pub fn new(chunks: VecDeque<Bytes>, delay: Duration) -> Self {
        Self {
            chunks,
            delay,
            sleep: None,
        }
    }
}

impl HttpBody for ChunksBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(sleep) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        let Some(next) = self.chunks.pop_front() else {
            return Poll::Ready(None);
        };
        if !self.delay.is_zero() && !self.chunks.is_empty() {
            self.sleep = Some(Box::pin(tokio::time::sleep(self.delay)));
        }
        Poll::Ready(Some(Ok(Frame::data(next))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// `modelgate mock`: the mock on its own port, for tests and benchmarks of the real HTTP path.
pub async fn serve_standalone(
    listener: tokio::net::TcpListener,
    chunk_delay: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    loop {
        let (stream, _peer): (tokio::net::TcpStream, SocketAddr) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let service =
            hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| async move {
                Ok::<_, std::convert::Infallible>(standalone_request(req, chunk_delay).await)
            });
        #[expect(
            clippy::disallowed_methods,
            reason = "one task per mock connection; the mock has no shutdown to honour"
        )]
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn standalone_request(
    req: Request<hyper::body::Incoming>,
    chunk_delay: Duration,
) -> Response<Body> {
    // The video interface (create, lookup, file) is the video module's; it serves the mock's side too.
    if crate::video::mock::is_video_path(req.uri().path()) {
        return crate::video::mock::standalone(req).await;
    }
    let protocol = match req.uri().path() {
        "/v1/chat/completions" => Protocol::Chat,
        "/v1/messages" => Protocol::Messages,
        "/v1/responses" => Protocol::Responses,
        _ => {
            return GatewayError::new(ErrorKind::NotFound, "no such path on the mock")
                .into_response(ErrorShape::OpenAi)
        }
    };
    if req.method() != Method::POST {
        return GatewayError::method_not_allowed("POST").into_response(ErrorShape::OpenAi);
    }
    let request_id = req.headers().get("x-request-id").cloned();
    let bytes = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            let mut r = Response::new(body::empty());
            *r.status_mut() = StatusCode::BAD_REQUEST;
            return r;
        }
    };
    let mut resp = handle(protocol, &bytes, chunk_delay);
    if let Some(id) = request_id {
        resp.headers_mut().insert("x-request-id", id);
    }
    resp
}
