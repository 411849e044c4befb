//! Chat Completions streams: upstream chunks → IR events, and IR events → chunks for a chat client.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::*;

// === streams: chat upstream chunks → IR events ===

#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    /// Chat's tool index → the IR's tool index, in order of first appearance.
    tools: Vec<u64>,
}

/// A chat chunk as most upstreams send it, read without building a `Value` tree; anything that
/// does not fit (a number where a string should be, say) falls back to the general reader.
#[derive(Deserialize)]
struct ChunkIn<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    choices: Vec<ChoiceIn<'a>>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceIn<'a> {
    #[serde(borrow, default)]
    delta: Option<DeltaIn<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaIn<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCallIn<'a>>>,
}

#[derive(Deserialize)]
struct ToolCallIn<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<FunctionIn<'a>>,
}

#[derive(Deserialize)]
struct FunctionIn<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

impl StreamDecoder {
    pub fn decode(&mut self, ev: &sse::SseEvent, out: &mut Vec<Event>) {
        let data = ev.data.trim();
        if data.starts_with("[DONE]") {
            out.push(Event::End);
            return;
        }
        match serde_json::from_str::<ChunkIn<'_>>(data) {
            Ok(chunk) => self.decode_typed(chunk, out),
            Err(_) => self.decode_value(data, out),
        }
    }

    fn tool_index(&mut self, chat_index: u64) -> (usize, bool) {
        match self.tools.iter().position(|i| *i == chat_index) {
            Some(i) => (i, false),
            None => {
                self.tools.push(chat_index);
                (self.tools.len() - 1, true)
            }
        }
    }

    fn decode_typed(&mut self, chunk: ChunkIn<'_>, out: &mut Vec<Event>) {
        if let Some(e) = chunk.error.filter(|e| !e.is_null()) {
            out.push(Event::Error(error_from_body(500, &json!({ "error": e }))));
            return;
        }
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: chunk.id.map(Cow::into_owned).unwrap_or_default(),
                model: chunk.model.map(Cow::into_owned).unwrap_or_default(),
                created: chunk.created.unwrap_or_else(ir::now_secs),
            });
        }
        if let Some(choice) = chunk.choices.into_iter().next() {
            if let Some(delta) = choice.delta {
                if let Some(r) = delta
                    .reasoning_content
                    .or(delta.reasoning)
                    .filter(|r| !r.is_empty())
                {
                    out.push(Event::ReasoningDelta(r.into_owned()));
                }
                for t in [delta.content, delta.refusal].into_iter().flatten() {
                    if !t.is_empty() {
                        out.push(Event::TextDelta(t.into_owned()));
                    }
                }
                for call in delta.tool_calls.into_iter().flatten() {
                    let (index, new) = self.tool_index(call.index.unwrap_or(0));
                    let (name, args) = match call.function {
                        Some(f) => (f.name, f.arguments),
                        None => (None, None),
                    };
                    if new {
                        out.push(Event::ToolStart {
                            index,
                            id: call
                                .id
                                .map_or_else(|| ir::mint_id("call_"), Cow::into_owned),
                            name: name.map(Cow::into_owned).unwrap_or_default(),
                        });
                    }
                    if let Some(a) = args.filter(|a| !a.is_empty()) {
                        out.push(Event::ToolArgs {
                            index,
                            fragment: a.into_owned(),
                        });
                    }
                }
            }
            if let Some(reason) = choice.finish_reason {
                out.push(Event::Finish(finish_from(Some(&reason))));
            }
        }
        if let Some(u) = chunk.usage.filter(Value::is_object) {
            out.push(Event::Usage(usage_from(&u)));
        }
    }

    /// The general reader, for chunks the typed one does not accept.
    fn decode_value(&mut self, data: &str, out: &mut Vec<Event>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            out.push(Event::Error(ir::ErrorInfo {
                status: 502,
                message: format!("the upstream sent an unreadable chunk: {data:.200}"),
                code: None,
            }));
            return;
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            out.push(Event::Error(error_from_body(500, &v)));
            return;
        }
        if !self.started {
            self.started = true;
            out.push(Event::Start {
                id: str_at(&v, "id"),
                model: str_at(&v, "model"),
                created: v
                    .get("created")
                    .and_then(Value::as_u64)
                    .unwrap_or_else(ir::now_secs),
            });
        }
        if let Some(choice) = crate::translate::common::at(&v, &["choices", "0"]) {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(r) = delta
                .get("reasoning_content")
                .or_else(|| delta.get("reasoning"))
                .and_then(Value::as_str)
            {
                if !r.is_empty() {
                    out.push(Event::ReasoningDelta(r.to_owned()));
                }
            }
            for key in ["content", "refusal"] {
                if let Some(t) = delta.get(key).and_then(Value::as_str) {
                    if !t.is_empty() {
                        out.push(Event::TextDelta(t.to_owned()));
                    }
                }
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let chat_index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                let index = match self.tools.iter().position(|i| *i == chat_index) {
                    Some(i) => i,
                    None => {
                        self.tools.push(chat_index);
                        let index = self.tools.len() - 1;
                        out.push(Event::ToolStart {
                            index,
                            id: call
                                .get("id")
                                .and_then(Value::as_str)
                                .map_or_else(|| ir::mint_id("call_"), str::to_owned),
                            name: crate::translate::common::at(call, &["function", "name"])
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                        });
                        index
                    }
                };
                if let Some(args) = crate::translate::common::at(call, &["function", "arguments"])
                    .and_then(Value::as_str)
                {
                    if !args.is_empty() {
                        out.push(Event::ToolArgs {
                            index,
                            fragment: args.to_owned(),
                        });
                    }
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                out.push(Event::Finish(finish_from(Some(reason))));
            }
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            out.push(Event::Usage(usage_from(u)));
        }
    }
}

// === streams: IR events → chat client chunks ===

/// A chunk written straight from borrowed parts: the hot path builds no `Value` tree.
#[derive(Serialize)]
struct ChunkOut<'a, D> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [ChoiceOut<'a, D>; 1],
    /// With include_usage, every chunk before the usage chunk carries `usage: null` (A.5 rule 5).
    #[serde(skip_serializing_if = "std::ops::Not::not", serialize_with = "null")]
    usage: bool,
}

#[derive(Serialize)]
struct ChoiceOut<'a, D> {
    index: u32,
    delta: D,
    logprobs: (),
    finish_reason: Option<&'a str>,
}

#[derive(Serialize)]
struct ContentOut<'a> {
    content: &'a str,
}

#[derive(Serialize)]
struct ReasoningOut<'a> {
    reasoning_content: &'a str,
}

#[derive(Serialize)]
struct ToolCallsOut<'a> {
    tool_calls: [ToolArgsOut<'a>; 1],
}

#[derive(Serialize)]
struct ToolArgsOut<'a> {
    index: usize,
    function: ArgsOut<'a>,
}

#[derive(Serialize)]
struct ArgsOut<'a> {
    arguments: &'a str,
}

fn null<S: serde::Serializer>(_: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_unit()
}

#[derive(Debug)]
pub struct StreamEncoder {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    started: bool,
    finish: Option<Finish>,
    usage: Option<Usage>,
    done: bool,
}

impl StreamEncoder {
    pub fn new(client_model: &str, include_usage: bool) -> Self {
        Self {
            id: ir::mint_id("chatcmpl-"),
            model: client_model.to_owned(),
            created: ir::now_secs(),
            include_usage,
            started: false,
            finish: None,
            usage: None,
            done: false,
        }
    }

    fn chunk<D: Serialize>(&self, out: &mut Vec<u8>, delta: D, finish: Option<&str>) {
        let c = ChunkOut {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: [ChoiceOut {
                index: 0,
                delta,
                logprobs: (),
                finish_reason: finish,
            }],
            usage: self.include_usage,
        };
        sse::write_json_event(out, None, &c);
    }

    fn ensure_started(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.started = true;
            self.chunk(out, json!({"role": "assistant", "content": ""}), None);
        }
    }

    pub fn encode(&mut self, ev: Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        match ev {
            Event::Start { id, created, .. } => {
                if !id.is_empty() {
                    self.id = reprefix(&id, "chatcmpl-");
                }
                self.created = created;
                self.ensure_started(out);
            }
            Event::ReasoningDelta(t) => {
                self.ensure_started(out);
                self.chunk(
                    out,
                    ReasoningOut {
                        reasoning_content: &t,
                    },
                    None,
                );
            }
            Event::ReasoningSignature(sig) => {
                self.ensure_started(out);
                self.chunk(out, json!({"thinking_blocks": [{"type": "thinking", "thinking": "", "signature": sig}]}), None);
            }
            Event::RedactedReasoning(data) => {
                self.ensure_started(out);
                self.chunk(
                    out,
                    json!({"thinking_blocks": [{"type": "redacted_thinking", "data": data}]}),
                    None,
                );
            }
            Event::TextDelta(t) => {
                self.ensure_started(out);
                self.chunk(out, ContentOut { content: &t }, None);
            }
            Event::ToolStart { index, id, name } => {
                self.ensure_started(out);
                self.chunk(out, json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}), None);
            }
            Event::ToolArgs { index, fragment } => {
                let call = ToolArgsOut {
                    index,
                    function: ArgsOut {
                        arguments: &fragment,
                    },
                };
                self.chunk(out, ToolCallsOut { tool_calls: [call] }, None);
            }
            Event::Finish(f) => self.finish = Some(f),
            Event::Usage(u) => self.usage = Some(u),
            Event::End => {
                self.ensure_started(out);
                let f = self.finish.take().unwrap_or_default();
                self.chunk(out, json!({}), Some(finish_name(&f)));
                if self.include_usage {
                    let u = self.usage.unwrap_or_default();
                    let c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": usage_json(&u)});
                    sse::write_json_event(out, None, &c);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.done = true;
            }
            Event::Error(e) => {
                sse::write_json_event(out, None, &error_body(&e));
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.done = true;
            }
        }
    }
}
