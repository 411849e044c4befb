//! Chat Completions streams: upstream chunks → IR events, and IR events → chunks for a chat client.

use super::*;

// === streams: chat upstream chunks → IR events ===

#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    /// Chat's tool index → the IR's tool index, in order of first appearance.
    tools: Vec<u64>,
}

impl StreamDecoder {
    pub fn decode(&mut self, ev: &sse::SseEvent, out: &mut Vec<Event>) {
        let data = ev.data.trim();
        if data.starts_with("[DONE]") {
            out.push(Event::End);
            return;
        }
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
                id: v.get("id").and_then(Value::as_str).unwrap_or("").to_owned(),
                model: v
                    .get("model")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                created: v
                    .get("created")
                    .and_then(Value::as_u64)
                    .unwrap_or_else(ir::now_secs),
            });
        }
        if let Some(choice) = v.pointer("/choices/0") {
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
                            name: call
                                .pointer("/function/name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                        });
                        index
                    }
                };
                if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
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

    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&str>) {
        let mut c = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
        // With include_usage, every chunk before the usage chunk carries `usage: null` (A.5 rule 5).
        if self.include_usage {
            c["usage"] = Value::Null;
        }
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
                self.chunk(out, json!({"reasoning_content": t}), None);
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
                self.chunk(out, json!({"content": t}), None);
            }
            Event::ToolStart { index, id, name } => {
                self.ensure_started(out);
                self.chunk(out, json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}), None);
            }
            Event::ToolArgs { index, fragment } => {
                self.chunk(
                    out,
                    json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
                    None,
                );
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
