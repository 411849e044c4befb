//! OpenAI Responses streams: upstream events → IR events, and IR events → events for a responses client.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::*;
use crate::json::write::Object;
use crate::json::write_json_str;
use crate::translate::lax::{lax_struct, Loose};

#[derive(Deserialize)]
struct DeltaIn<'a> {
    #[serde(borrow)]
    delta: Cow<'a, str>,
    #[serde(borrow, default)]
    item_id: Option<Cow<'a, str>>,
}

// The payloads of the events every output item sends, written without a `Value` tree: their
// members in alphabetical order, the order `Value`'s map wrote them in, so the bytes are the same.

/// `response.output_item.added` and `.done`.
#[derive(Serialize)]
struct ItemEvent<I> {
    item: I,
    output_index: usize,
}

/// A message item as it opens.
#[derive(Serialize)]
struct MessageOpen<'a> {
    content: [(); 0],
    id: &'a str,
    role: &'static str,
    status: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// A reasoning item as it opens.
#[derive(Serialize)]
struct ReasoningOpen<'a> {
    id: &'a str,
    summary: [(); 0],
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `response.content_part.added` and `.done`.
#[derive(Serialize)]
struct ContentPartEvent<'a> {
    content_index: u32,
    item_id: &'a str,
    output_index: usize,
    part: OutputTextPart<'a>,
}

impl<'a> ContentPartEvent<'a> {
    /// The event of item `item_id`'s text part, holding `text` so far.
    fn output_text(item_id: &'a str, output_index: usize, text: &'a str) -> Self {
        Self {
            content_index: 0,
            item_id,
            output_index,
            part: OutputTextPart {
                annotations: [],
                text,
                kind: "output_text",
            },
        }
    }
}

#[derive(Serialize)]
struct OutputTextPart<'a> {
    annotations: [(); 0],
    text: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `response.output_text.done`.
#[derive(Serialize)]
struct OutputTextDone<'a> {
    content_index: u32,
    item_id: &'a str,
    logprobs: [(); 0],
    output_index: usize,
    text: &'a str,
}

/// `response.reasoning_summary_part.added` and `.done`.
#[derive(Serialize)]
struct SummaryPartEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    part: SummaryTextPart<'a>,
    summary_index: u32,
}

impl<'a> SummaryPartEvent<'a> {
    /// The event of item `item_id`'s summary part, holding `text` so far.
    fn summary_text(item_id: &'a str, output_index: usize, text: &'a str) -> Self {
        Self {
            item_id,
            output_index,
            part: SummaryTextPart {
                text,
                kind: "summary_text",
            },
            summary_index: 0,
        }
    }
}

#[derive(Serialize)]
struct SummaryTextPart<'a> {
    text: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `response.reasoning_summary_text.done`.
#[derive(Serialize)]
struct SummaryTextDone<'a> {
    item_id: &'a str,
    output_index: usize,
    summary_index: u32,
    text: &'a str,
}

/// The payloads that hold an item's text, written by hand: a `.done` event holds the whole
/// answer, whose every byte serde's writer looks up; [`write_json_str`] passes eight at a time.
/// Each writes the bytes its `Serialize` writes.
trait Payload {
    fn write(&self, out: &mut Vec<u8>);
}

impl Payload for ContentPartEvent<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.int("content_index", self.content_index);
        o.str("item_id", self.item_id);
        o.int("output_index", self.output_index);
        let part = &self.part;
        let mut p = Object::open(o.key("part"));
        let _: [(); 0] = part.annotations;
        p.key("annotations").extend_from_slice(b"[]");
        p.str("text", part.text);
        p.str("type", part.kind);
        p.close();
        o.close();
    }
}

impl Payload for OutputTextDone<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.int("content_index", self.content_index);
        o.str("item_id", self.item_id);
        let _: [(); 0] = self.logprobs;
        o.key("logprobs").extend_from_slice(b"[]");
        o.int("output_index", self.output_index);
        o.str("text", self.text);
        o.close();
    }
}

impl Payload for SummaryPartEvent<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.str("item_id", self.item_id);
        o.int("output_index", self.output_index);
        let mut p = Object::open(o.key("part"));
        p.str("text", self.part.text);
        p.str("type", self.part.kind);
        p.close();
        o.int("summary_index", self.summary_index);
        o.close();
    }
}

impl Payload for SummaryTextDone<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.str("item_id", self.item_id);
        o.int("output_index", self.output_index);
        o.int("summary_index", self.summary_index);
        o.str("text", self.text);
        o.close();
    }
}

/// `response.function_call_arguments.done`.
#[derive(Serialize)]
struct ArgumentsDone<'a> {
    arguments: &'a str,
    item_id: &'a str,
    name: &'a str,
    output_index: usize,
}

/// A `*.delta` event as serde writes it: what [`write_delta`] writes.
#[cfg(test)]
#[derive(Clone, Copy, Serialize)]
struct DeltaOut<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    item_id: &'a str,
    output_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary_index: Option<u32>,
    delta: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

/// The events that carry an open item's text piece by piece: one per token, the stream's hot
/// path. Each is written as [`DeltaOut`] is by serde, from parts that do not change while its
/// item is open.
#[derive(Clone, Copy)]
enum DeltaKind {
    OutputText,
    ReasoningSummary,
    Arguments,
}

impl DeltaKind {
    /// The event's name and its data up to the sequence number's value.
    fn prefix(self) -> &'static [u8] {
        match self {
            Self::OutputText => b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":",
            Self::ReasoningSummary => b"event: response.reasoning_summary_text.delta\ndata: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":",
            Self::Arguments => b"event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":",
        }
    }

    /// What follows the delta's text.
    fn suffix(self) -> &'static [u8] {
        match self {
            Self::OutputText => b",\"logprobs\":[]}\n\n",
            Self::ReasoningSummary | Self::Arguments => b"}\n\n",
        }
    }

    /// The members of item `item_id`'s deltas between their sequence number and their text,
    /// up to `"delta":`, written over `out`: the same in every delta of the item, so written
    /// once when it opens.
    fn middle(self, item_id: &str, output_index: usize, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(b",\"item_id\":");
        write_json_str(out, item_id);
        out.extend_from_slice(b",\"output_index\":");
        out.extend_from_slice(itoa::Buffer::new().format(output_index).as_bytes());
        out.extend_from_slice(match self {
            Self::OutputText => b",\"content_index\":0,\"delta\":",
            Self::ReasoningSummary => b",\"summary_index\":0,\"delta\":",
            Self::Arguments => b",\"delta\":",
        });
    }
}

/// Writes the delta event of `kind` numbered `seq`, carrying `delta`, with its item's `middle`
/// ([`DeltaKind::middle`]).
fn write_delta(out: &mut Vec<u8>, kind: DeltaKind, seq: u64, middle: &[u8], delta: &str) {
    out.extend_from_slice(kind.prefix());
    out.extend_from_slice(itoa::Buffer::new().format(seq).as_bytes());
    out.extend_from_slice(middle);
    write_json_str(out, delta);
    out.extend_from_slice(kind.suffix());
}

// === streams: responses upstream events → IR ===

lax_struct! {
    /// An event's `type`, as `Value`'s accessors would see it; the rest is checked and skipped.
    struct EventType<'a> {
        kind = "type": Loose<'a>,
    }
}

/// The event types the general reader below acts on; it ignores every other.
const DECODED: [&str; 13] = [
    "response.created",
    "response.output_item.added",
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// item id → (IR tool index, whether any argument delta was seen).
    calls: Vec<(String, usize, bool)>,
    /// The usage of the terminal event: what the request is charged.
    usage: Usage,
}

impl StreamDecoder {
    /// The usage the stream has reported so far (none yet: zeros).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    fn call_started(&mut self, item: &Value, out: &mut Vec<Event>) -> usize {
        let item_id = str_at(item, "id");
        if let Some((_, k, _)) = self.calls.iter().find(|(id, _, _)| *id == item_id) {
            return *k;
        }
        let k = self.calls.len();
        self.calls.push((item_id, k, false));
        out.push(Event::ToolStart {
            index: k,
            id: str_at(item, "call_id"),
            name: str_at(item, "name"),
        });
        k
    }

    pub fn decode(&mut self, ev: sse::EventRef<'_>, out: &mut Vec<Event>) {
        if ev.data.trim_start().starts_with("[DONE]") {
            return; // some proxies append it; the terminal event already ended the stream
        }
        // Deltas come by the hundred: read them typed, without a `Value` tree.
        if let Some(
            kind @ ("response.output_text.delta"
            | "response.refusal.delta"
            | "response.reasoning_summary_text.delta"
            | "response.reasoning_text.delta"
            | "response.function_call_arguments.delta"),
        ) = ev.event
        {
            if let Ok(d) = serde_json::from_str::<DeltaIn<'_>>(ev.data) {
                let delta = d.delta.into_owned();
                match kind {
                    "response.function_call_arguments.delta" => {
                        let item_id = d.item_id.unwrap_or_default();
                        if let Some(c) = self.calls.iter_mut().find(|(id, _, _)| *id == item_id) {
                            c.2 = true;
                            out.push(Event::ToolArgs {
                                index: c.1,
                                fragment: delta,
                            });
                        }
                    }
                    "response.output_text.delta" | "response.refusal.delta" => {
                        out.push(Event::TextDelta(delta))
                    }
                    _ => out.push(Event::ReasoningDelta(delta)),
                }
                return;
            }
        }
        // Most other events (`response.in_progress`, the `.added` and `.done` of parts and text)
        // say nothing the stream needs, and some carry the whole reply or the echoed request:
        // their type is read, and their JSON checked, without building a tree.
        if let Ok(t) = serde_json::from_str::<EventType<'_>>(ev.data) {
            let kind = t.kind.as_str().or(ev.event).unwrap_or("");
            if !DECODED.contains(&kind) {
                return;
            }
        }
        let Ok(v) = serde_json::from_str::<Value>(ev.data) else {
            out.push(Event::Error(ir::ErrorInfo {
                status: 502,
                message: format!("the upstream sent an unreadable event: {:.200}", ev.data),
                code: None,
            }));
            return;
        };
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event)
            .unwrap_or("");
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        match kind {
            "response.created" => {
                let r = v.get("response").unwrap_or(&Value::Null);
                out.push(Event::Start {
                    id: str_at(r, "id"),
                    model: str_at(r, "model"),
                    created: r
                        .get("created_at")
                        .and_then(Value::as_u64)
                        .unwrap_or_else(ir::now_secs),
                });
            }
            "response.output_item.added" => {
                let item = v.get("item").unwrap_or(&Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    self.call_started(item, out);
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                out.push(Event::TextDelta(s("delta")))
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                out.push(Event::ReasoningDelta(s("delta")))
            }
            "response.function_call_arguments.delta" => {
                let item_id = s("item_id");
                if let Some(c) = self.calls.iter_mut().find(|(id, _, _)| *id == item_id) {
                    c.2 = true;
                    let index = c.1;
                    out.push(Event::ToolArgs {
                        index,
                        fragment: s("delta"),
                    });
                }
            }
            "response.function_call_arguments.done" | "response.output_item.done" => {
                // Some upstreams send only the done event with the whole arguments.
                let item = v.get("item").cloned().unwrap_or_else(|| json!({"id": s("item_id"), "type": "function_call", "arguments": s("arguments"), "name": s("name")}));
                if item.get("type").and_then(Value::as_str) != Some("function_call") {
                    return;
                }
                let k = self.call_started(&item, out);
                if let Some(c) = self.calls.iter_mut().find(|(_, idx, _)| *idx == k) {
                    let args = item.get("arguments").and_then(Value::as_str).unwrap_or("");
                    if !c.2 && !args.is_empty() {
                        c.2 = true;
                        out.push(Event::ToolArgs {
                            index: k,
                            fragment: args.to_owned(),
                        });
                    }
                }
            }
            "response.completed" | "response.incomplete" => {
                let r = v.get("response").unwrap_or(&Value::Null);
                if let Some(u) = r.get("usage").filter(|u| u.is_object()) {
                    self.usage = usage_from(u);
                    out.push(Event::Usage(self.usage));
                }
                out.push(Event::Finish(finish_from(r)));
                out.push(Event::End);
            }
            "response.failed" => {
                let r = v.get("response").unwrap_or(&Value::Null);
                // A failed response may still have used tokens, and they are charged.
                if let Some(u) = r.get("usage").filter(|u| u.is_object()) {
                    self.usage = usage_from(u);
                }
                out.push(Event::Error(ir::ErrorInfo {
                    status: 502,
                    message: r
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("the upstream response failed")
                        .to_owned(),
                    code: r
                        .pointer("/error/code")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                }));
            }
            "error" => out.push(Event::Error(ir::ErrorInfo {
                status: 502,
                message: v
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("upstream error")
                    .to_owned(),
                code: v.get("code").and_then(Value::as_str).map(str::to_owned),
            })),
            _ => {}
        }
    }
}

// === streams: IR events → responses client events ===

#[derive(Debug)]
enum OpenItem {
    Reasoning {
        id: String,
        text: String,
        signature: Option<String>,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        args: String,
        tool: usize,
        /// What the client declared the tool as, when not a plain function.
        kind: Option<ClientTool>,
    },
}

/// A Responses answer's response object as it was served (a JSON reply, or what a stream's
/// terminal event carries), and the ids keeping it needs.
#[derive(Debug)]
pub struct Final {
    pub text: Box<str>,
    pub id: String,
    /// Its output items' ids.
    pub output: Vec<String>,
}

/// Where a stream's encoder leaves its [`Final`] for the store (`stateful`), which would
/// otherwise search every frame of the stream it has just written for its terminal event.
#[derive(Debug, Clone, Default)]
pub struct FinalSlot(Arc<Mutex<Option<Final>>>);

impl FinalSlot {
    /// A slot holding `last` already (a JSON reply's).
    pub fn holding(last: Final) -> Self {
        let slot = Self::default();
        slot.put(last);
        slot
    }

    fn put(&self, last: Final) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(last);
        }
    }

    /// The stream's final response, once its terminal event has been written.
    pub fn take(&self) -> Option<Final> {
        self.0.lock().ok()?.take()
    }
}

#[derive(Debug)]
pub struct StreamEncoder {
    id: String,
    /// The output items' ids, which name `id` when the answer is kept.
    ids: ir::ItemIds,
    model: String,
    created: u64,
    echo: Arc<Echo>,
    client_tools: Arc<ToolMap>,
    seq: u64,
    started: bool,
    open: Option<OpenItem>,
    output: Vec<Item>,
    /// IR tool index → (item id, output index) of every call item written so far.
    calls: Vec<(usize, String, usize)>,
    finish: Option<Finish>,
    usage: Option<Usage>,
    done: bool,
    /// Set when the reply is kept ([`Self::final_slot`]).
    last: Option<FinalSlot>,
    /// What the open item's deltas hold between their number and their text
    /// ([`DeltaKind::middle`]).
    delta_middle: Vec<u8>,
}

impl StreamEncoder {
    pub fn new(client_model: &str, echo: Arc<Echo>, client_tools: Arc<ToolMap>) -> Self {
        let id = ir::mint_id("resp_");
        Self {
            ids: output_ids(&id, &echo),
            id,
            model: client_model.to_owned(),
            created: ir::now_secs(),
            echo,
            client_tools,
            seq: 0,
            started: false,
            open: None,
            output: Vec::new(),
            calls: Vec::new(),
            finish: None,
            usage: None,
            done: false,
            last: None,
            delta_middle: Vec::new(),
        }
    }

    /// For a reply the client has not asked not to keep (`store`), the slot the terminal
    /// event's response object will be left in.
    pub fn final_slot(&mut self) -> Option<FinalSlot> {
        if !self.echo.fresh_id {
            return None;
        }
        Some(self.last.get_or_insert_with(FinalSlot::default).clone())
    }

    /// Leaves the terminal event's response object, written as `text`, in the final slot.
    fn leave_final(&mut self, text: &[u8]) {
        let (Some(slot), Ok(text)) = (&self.last, std::str::from_utf8(text)) else {
            return;
        };
        slot.put(Final {
            text: text.into(),
            id: self.id.clone(),
            output: self.output.iter().map(|item| item.id.clone()).collect(),
        });
    }

    /// Writes the event `kind` with the members of the object `payload` after its `type` and
    /// `sequence_number`.
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, payload: &impl Serialize) {
        self.emit_with(out, kind, |o| {
            // Writing into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *o, payload);
        });
    }

    /// [`emit`](Self::emit) for a payload written by hand.
    fn emit_payload(&mut self, out: &mut Vec<u8>, kind: &str, payload: &impl Payload) {
        self.emit_with(out, kind, |o| payload.write(o));
    }

    /// [`emit`](Self::emit) for the payload `{"response": <bytes>}`, the response object
    /// already written.
    fn emit_response(&mut self, out: &mut Vec<u8>, kind: &str, response: &[u8]) {
        self.emit_with(out, kind, |o| {
            o.extend_from_slice(b"{\"response\":");
            o.extend_from_slice(response);
            o.push(b'}');
        });
    }

    /// `response.output_item.added` or `.done` (`kind`) for `item`: [`ItemEvent`]'s bytes, the
    /// item as it was written.
    fn emit_item(&mut self, out: &mut Vec<u8>, kind: &str, item: &Item, output_index: usize) {
        self.emit_with(out, kind, |o| {
            o.extend_from_slice(b"{\"item\":");
            o.extend_from_slice(&item.json);
            o.extend_from_slice(b",\"output_index\":");
            o.extend_from_slice(itoa::Buffer::new().format(output_index).as_bytes());
            o.push(b'}');
        });
    }

    /// The event `kind`: `payload` writes a JSON object, whose members follow `type` and
    /// `sequence_number`.
    fn emit_with(&mut self, out: &mut Vec<u8>, kind: &str, payload: impl FnOnce(&mut Vec<u8>)) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":");
        write_json_str(out, kind);
        out.extend_from_slice(b",\"sequence_number\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.seq).as_bytes());
        self.seq += 1;
        let at = out.len();
        payload(out);
        // The payload's own braces go: its `{` joins its members to the two above (an empty
        // object leaves only its `}`).
        if out.get(at..) == Some(b"{}") {
            out.truncate(at);
        } else if out.get(at) == Some(&b'{') {
            out[at] = b',';
            out.truncate(out.len() - 1);
        }
        out.extend_from_slice(b"}\n\n");
    }

    /// The response object with `status`: a finished one has the output items and the usage.
    fn response<'s>(&'s self, status: &'s str) -> ResponseOut<'s> {
        let done = status != "in_progress";
        ResponseOut::new(
            Head(&self.id, self.created, &self.model),
            status,
            if done { &self.output } else { &[] },
            self.finish.as_ref(),
            if done { self.usage.as_ref() } else { None },
            &self.echo,
        )
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.started = true;
            // The same object twice: written once.
            let r = self.response("in_progress").to_bytes();
            self.emit_response(out, "response.created", &r);
            self.emit_response(out, "response.in_progress", &r);
        }
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        self.close_as(out, "completed");
    }

    /// Closes the open item with `status` (`incomplete` for the item a truncated reply ends in).
    fn close_as(&mut self, out: &mut Vec<u8>, status: &str) {
        let Some(item) = self.open.take() else { return };
        let output_index = self.output.len();
        let done = match item {
            OpenItem::Reasoning {
                id,
                text,
                signature,
            } => {
                self.emit_payload(
                    out,
                    "response.reasoning_summary_text.done",
                    &SummaryTextDone {
                        item_id: &id,
                        output_index,
                        summary_index: 0,
                        text: &text,
                    },
                );
                self.emit_payload(
                    out,
                    "response.reasoning_summary_part.done",
                    &SummaryPartEvent::summary_text(&id, output_index, &text),
                );
                Item::reasoning(id, &text, signature.as_deref())
            }
            OpenItem::Message { id, text } => {
                self.emit_payload(
                    out,
                    "response.output_text.done",
                    &OutputTextDone {
                        content_index: 0,
                        item_id: &id,
                        logprobs: [],
                        output_index,
                        text: &text,
                    },
                );
                self.emit_payload(
                    out,
                    "response.content_part.done",
                    &ContentPartEvent::output_text(&id, output_index, &text),
                );
                Item::message(id, &text, status)
            }
            OpenItem::Call {
                id,
                call_id,
                name,
                args,
                kind,
                ..
            } => {
                let call = CallParts {
                    call_id: &call_id,
                    name: &name,
                    arguments: &args,
                };
                let item = Item::call(kind.as_ref(), id, &call, status);
                let id = &item.id;
                match &kind {
                    // The input is known whole only now: the model wrote it as a JSON string.
                    Some(ClientTool::Custom { .. }) => {
                        let input = tools::custom_input(&args);
                        self.emit(
                            out,
                            "response.custom_tool_call_input.delta",
                            &json!({"item_id": id, "output_index": output_index, "delta": input}),
                        );
                        self.emit(
                            out,
                            "response.custom_tool_call_input.done",
                            &json!({"item_id": id, "output_index": output_index, "input": input}),
                        );
                    }
                    // OpenAI streams no argument events for a shell call: the item is added
                    // whole, now that its action is known.
                    Some(ClientTool::LocalShell) => {
                        self.emit_item(out, "response.output_item.added", &item, output_index);
                    }
                    // A namespaced call is named as its namespace declared it.
                    Some(ClientTool::Namespaced { .. }) | None => {
                        let name = match &kind {
                            Some(ClientTool::Namespaced { name: own, .. }) => own,
                            _ => &name,
                        };
                        self.emit(
                            out,
                            "response.function_call_arguments.done",
                            &ArgumentsDone {
                                arguments: &args,
                                item_id: id,
                                name,
                                output_index,
                            },
                        );
                    }
                }
                item
            }
        };
        self.emit_item(out, "response.output_item.done", &done, output_index);
        self.output.push(done);
    }

    /// More arguments for a call item already written out (rare: the sequencer holds back the
    /// usual interleaving). The delta names the item, and the final output carries them too.
    fn late_args(&mut self, tool: usize, fragment: &str, out: &mut Vec<u8>) {
        let Some(&(_, ref item_id, output_index)) = self.calls.iter().find(|(t, _, _)| *t == tool)
        else {
            return;
        };
        let item_id = item_id.clone();
        let Some(item) = self.output.get_mut(output_index) else {
            return;
        };
        // Rare enough to read the item written already and write it again.
        let mut tree: Value = serde_json::from_slice(&item.json).unwrap_or_default();
        if tree["type"] != "function_call" {
            // A custom or shell call was written whole; it has no argument events to extend.
            tracing::debug!(
                tool,
                "argument fragment after a custom or shell call closed; dropped"
            );
            return;
        }
        let joined = format!("{}{fragment}", tree["arguments"].as_str().unwrap_or(""));
        tree["arguments"] = json!(joined);
        item.json.clear();
        crate::json::write_value(&mut item.json, &tree);
        tracing::debug!(tool, "argument fragment after its item closed");
        self.emit(
            out,
            "response.function_call_arguments.delta",
            &json!({"item_id": item_id, "output_index": output_index, "delta": fragment}),
        );
    }

    pub fn encode(&mut self, ev: Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if !matches!(ev, Event::Start { .. } | Event::Error(_)) {
            self.start(out);
        }
        match ev {
            Event::Start { id, created, .. } => {
                if !id.is_empty() && !self.echo.fresh_id {
                    self.id = reprefix(&id, "resp_");
                }
                self.created = created;
                self.start(out);
            }
            Event::ReasoningDelta(t) => {
                if !matches!(self.open, Some(OpenItem::Reasoning { .. })) {
                    self.close(out);
                    let output_index = self.output.len();
                    let id = self.ids.output("rs_", output_index);
                    self.emit(
                        out,
                        "response.output_item.added",
                        &ItemEvent {
                            item: ReasoningOpen {
                                id: &id,
                                summary: [],
                                kind: "reasoning",
                            },
                            output_index,
                        },
                    );
                    self.emit_payload(
                        out,
                        "response.reasoning_summary_part.added",
                        &SummaryPartEvent::summary_text(&id, output_index, ""),
                    );
                    DeltaKind::ReasoningSummary.middle(&id, output_index, &mut self.delta_middle);
                    self.open = Some(OpenItem::Reasoning {
                        id,
                        text: String::new(),
                        signature: None,
                    });
                }
                if let Some(OpenItem::Reasoning { text, .. }) = &mut self.open {
                    text.push_str(&t);
                    let kind = DeltaKind::ReasoningSummary;
                    write_delta(out, kind, self.seq, &self.delta_middle, &t);
                    self.seq += 1;
                }
            }
            Event::ReasoningSignature(sig) => {
                if let Some(OpenItem::Reasoning { signature, .. }) = &mut self.open {
                    signature.get_or_insert_with(String::new).push_str(&sig);
                }
            }
            Event::RedactedReasoning(_) => {}
            Event::TextDelta(t) => {
                if !matches!(self.open, Some(OpenItem::Message { .. })) {
                    self.close(out);
                    let output_index = self.output.len();
                    let id = self.ids.output("msg_", output_index);
                    self.emit(
                        out,
                        "response.output_item.added",
                        &ItemEvent {
                            item: MessageOpen {
                                content: [],
                                id: &id,
                                role: "assistant",
                                status: "in_progress",
                                kind: "message",
                            },
                            output_index,
                        },
                    );
                    self.emit_payload(
                        out,
                        "response.content_part.added",
                        &ContentPartEvent::output_text(&id, output_index, ""),
                    );
                    DeltaKind::OutputText.middle(&id, output_index, &mut self.delta_middle);
                    self.open = Some(OpenItem::Message {
                        id,
                        text: String::new(),
                    });
                }
                if let Some(OpenItem::Message { text, .. }) = &mut self.open {
                    text.push_str(&t);
                    let kind = DeltaKind::OutputText;
                    write_delta(out, kind, self.seq, &self.delta_middle, &t);
                    self.seq += 1;
                }
            }
            Event::ToolStart {
                index,
                id: call_id,
                name,
            } => {
                self.close(out);
                let kind = self.client_tools.get(&name).cloned();
                let output_index = self.output.len();
                let id = self.ids.output(call_id_prefix(kind.as_ref()), output_index);
                self.calls.push((index, id.clone(), output_index));
                if kind != Some(ClientTool::LocalShell) {
                    let call = CallParts {
                        call_id: &call_id,
                        name: &name,
                        arguments: "",
                    };
                    let item = Item::call(kind.as_ref(), id.clone(), &call, "in_progress");
                    self.emit_item(out, "response.output_item.added", &item, output_index);
                }
                DeltaKind::Arguments.middle(&id, output_index, &mut self.delta_middle);
                self.open = Some(OpenItem::Call {
                    id,
                    call_id,
                    name,
                    args: String::new(),
                    tool: index,
                    kind,
                });
            }
            Event::ToolArgs { index, fragment } => match &mut self.open {
                // Custom and shell calls are written whole when they close.
                Some(OpenItem::Call {
                    args,
                    tool,
                    kind: Some(ClientTool::Custom { .. } | ClientTool::LocalShell),
                    ..
                }) if *tool == index => args.push_str(&fragment),
                Some(OpenItem::Call { args, tool, .. }) if *tool == index => {
                    args.push_str(&fragment);
                    let kind = DeltaKind::Arguments;
                    write_delta(out, kind, self.seq, &self.delta_middle, &fragment);
                    self.seq += 1;
                }
                _ => self.late_args(index, &fragment, out),
            },
            Event::Finish(f) => self.finish = Some(f),
            Event::Usage(u) => self.usage = Some(u),
            Event::End => {
                let f = self.finish.clone().unwrap_or_default();
                let status = status_of(&f);
                self.close_as(out, status);
                let r = self.response(status).to_bytes();
                let kind = if status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                self.emit_response(out, kind, &r);
                self.leave_final(&r);
                self.done = true;
            }
            Event::Error(e) => {
                self.start(out);
                let mut r = serde_json::to_value(self.response("failed")).unwrap_or_default();
                r["error"] = json!({"code": e.code.clone().unwrap_or_else(|| "server_error".into()), "message": e.message});
                // `response.failed` is terminal, so nothing may follow it (protocols.md §0).
                let code = e.code.clone().unwrap_or_else(|| "server_error".into());
                // The nested `error` object is what the OpenAI SDKs raise on mid-stream; the flat
                // fields are the Responses `error` event's own shape.
                self.emit(
                    out,
                    "error",
                    &json!({"code": code, "message": e.message, "param": null,
                        "error": {"type": "server_error", "code": code, "message": e.message}}),
                );
                self.emit(out, "response.failed", &json!({"response": r}));
                if self.last.is_some() {
                    self.leave_final(&serde_json::to_vec(&r).unwrap_or_default());
                }
                self.done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use super::*;

    /// Each typed payload has the bytes of the `Value` it replaced.
    #[test]
    fn typed_payloads_are_their_trees_bytes() {
        fn same(typed: &impl Serialize, tree: &Value) {
            assert_eq!(
                serde_json::to_string(typed).unwrap(),
                serde_json::to_string(tree).unwrap()
            );
        }
        let (id, text, i) = ("msg_1", "a \"b\"\n", 3);
        same(
            &ItemEvent {
                item: MessageOpen {
                    content: [],
                    id,
                    role: "assistant",
                    status: "in_progress",
                    kind: "message",
                },
                output_index: i,
            },
            &json!({"output_index": i, "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}),
        );
        same(
            &ItemEvent {
                item: ReasoningOpen {
                    id,
                    summary: [],
                    kind: "reasoning",
                },
                output_index: i,
            },
            &json!({"output_index": i, "item": {"type": "reasoning", "id": id, "summary": []}}),
        );
        let item = json!({"type": "message", "id": id});
        same(
            &ItemEvent {
                item: &item,
                output_index: i,
            },
            &json!({"output_index": i, "item": item}),
        );
        same(
            &ContentPartEvent {
                content_index: 0,
                item_id: id,
                output_index: i,
                part: OutputTextPart {
                    annotations: [],
                    text,
                    kind: "output_text",
                },
            },
            &json!({"item_id": id, "output_index": i, "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}),
        );
        same(
            &OutputTextDone {
                content_index: 0,
                item_id: id,
                logprobs: [],
                output_index: i,
                text,
            },
            &json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
        );
        same(
            &SummaryPartEvent {
                item_id: id,
                output_index: i,
                part: SummaryTextPart {
                    text,
                    kind: "summary_text",
                },
                summary_index: 0,
            },
            &json!({"item_id": id, "output_index": i, "summary_index": 0, "part": {"type": "summary_text", "text": text}}),
        );
        same(
            &SummaryTextDone {
                item_id: id,
                output_index: i,
                summary_index: 0,
                text,
            },
            &json!({"item_id": id, "output_index": i, "summary_index": 0, "text": text}),
        );
        same(
            &ArgumentsDone {
                arguments: "{\"a\":1}",
                item_id: id,
                name: "f",
                output_index: i,
            },
            &json!({"item_id": id, "output_index": i, "name": "f", "arguments": "{\"a\":1}"}),
        );
    }

    #[test]
    fn events_carry_their_type_and_number_first_then_the_payloads_members() {
        let mut e = StreamEncoder::new("m", Arc::default(), Arc::default());
        let mut out = Vec::new();
        e.emit(&mut out, "a", &json!({}));
        e.emit(&mut out, "b", &json!({"x": [1, {"y": "}"}], "z": null}));
        e.emit_response(&mut out, "c", br#"{"id":"r"}"#);
        let text = String::from_utf8(out).unwrap();
        let mut events = Vec::new();
        for block in text.split_terminator("\n\n") {
            let (name, data) = block.split_once("\ndata: ").unwrap();
            events.push((
                name.to_owned(),
                serde_json::from_str::<Value>(data).unwrap(),
            ));
            assert!(data.starts_with(r#"{"type":"#), "{data}");
        }
        assert_eq!(
            events,
            [
                (
                    "event: a".into(),
                    json!({"type": "a", "sequence_number": 0})
                ),
                (
                    "event: b".into(),
                    json!({"type": "b", "sequence_number": 1, "x": [1, {"y": "}"}], "z": null})
                ),
                (
                    "event: c".into(),
                    json!({"type": "c", "sequence_number": 2, "response": {"id": "r"}})
                ),
            ]
        );
    }

    #[test]
    fn a_done_item_is_written_as_serde_writes_its_event() {
        for text in AWKWARD_TEXTS {
            for (i, item) in [
                Item::message("msg_1".into(), text, "completed"),
                Item::reasoning("rs_\"2\"".into(), text, Some(text)),
                Item::call(
                    None,
                    "fc_3".into(),
                    &CallParts {
                        call_id: text,
                        name: "f",
                        arguments: text,
                    },
                    "incomplete",
                ),
            ]
            .iter()
            .enumerate()
            {
                let (mut by_hand, mut by_serde) = (Vec::new(), Vec::new());
                let mut e = StreamEncoder::new("m", Arc::default(), Arc::default());
                e.emit_item(&mut by_hand, "response.output_item.done", item, i * 1000);
                let mut e = StreamEncoder::new("m", Arc::default(), Arc::default());
                e.emit(
                    &mut by_serde,
                    "response.output_item.done",
                    &ItemEvent {
                        item,
                        output_index: i * 1000,
                    },
                );
                assert_eq!(
                    String::from_utf8(by_hand).unwrap(),
                    String::from_utf8(by_serde).unwrap()
                );
            }
        }
    }

    /// The text-bearing payloads written by hand hold serde's bytes, whatever the text.
    #[test]
    fn text_payloads_are_written_as_serde_writes_them() {
        fn same(p: &(impl Payload + Serialize)) {
            let mut by_hand = Vec::new();
            p.write(&mut by_hand);
            assert_eq!(
                String::from_utf8(by_hand).unwrap(),
                serde_json::to_string(p).unwrap()
            );
        }
        for text in AWKWARD_TEXTS {
            for (id, i) in [("msg_1", 0), ("m\"\u{1}", usize::MAX)] {
                same(&ContentPartEvent::output_text(id, i, text));
                same(&SummaryPartEvent::summary_text(id, i, text));
                same(&OutputTextDone {
                    content_index: 0,
                    item_id: id,
                    logprobs: [],
                    output_index: i,
                    text,
                });
                same(&SummaryTextDone {
                    item_id: id,
                    output_index: i,
                    summary_index: 0,
                    text,
                });
            }
        }
    }

    /// The data of each event named `kind` in `out`, read.
    fn events_named(out: &[u8], kind: &str) -> Vec<Value> {
        let text = std::str::from_utf8(out).unwrap();
        (text.split("\n\n"))
            .filter(|e| e.starts_with(&format!("event: {kind}\n")))
            .map(|e| serde_json::from_str(e.split_once("data: ").unwrap().1).unwrap())
            .collect()
    }

    /// An argument fragment for a call item already closed goes out as a delta naming it, and
    /// the item in the final response is written again with it; a custom call's is dropped.
    #[test]
    fn a_late_argument_fragment_extends_its_closed_call_item() {
        let mut tools = ToolMap::default();
        tools.insert("free".into(), ClientTool::Custom { scope: None });
        let mut e = StreamEncoder::new("m", Arc::default(), Arc::new(tools));
        let mut out = Vec::new();
        let call = |index: usize, name: &str| Event::ToolStart {
            index,
            id: format!("call_{index}"),
            name: name.into(),
        };
        let args = |index: usize, fragment: &str| Event::ToolArgs {
            index,
            fragment: fragment.into(),
        };
        for ev in [
            call(0, "f"),
            args(0, r#"{"a""#),
            call(1, "free"),
            args(1, r#"{"input":"x"}"#),
            Event::TextDelta("then".into()),
            args(0, r#":"é\"}"#),
            args(1, "ignored"),
            Event::Finish(Finish::ToolUse),
            Event::End,
        ] {
            e.encode(ev, &mut out);
        }
        let late = events_named(&out, "response.function_call_arguments.delta");
        let late = late.last().unwrap();
        assert_eq!(late["delta"], r#":"é\"}"#);
        assert_eq!(late["output_index"], 0);
        let done = events_named(&out, "response.completed");
        let output = &done[0]["response"]["output"];
        assert_eq!(output[0]["arguments"], r#"{"a":"é\"}"#);
        assert_eq!(output[0]["type"], "function_call");
        assert_eq!(output[1]["type"], "custom_tool_call");
        assert_eq!(output[1]["input"], "x");
        assert_eq!(output[2]["content"][0]["text"], "then");
        // Written again as it was first written: members in order, as a tree writes them.
        let text = String::from_utf8(out).unwrap();
        let item = serde_json::to_string(&output[0]).unwrap();
        assert!(text.contains(&item), "{item}");
    }

    /// A kept answer's items have ids naming it and their place among its output (the store
    /// finds them from that alone); an answer not kept gets random ones.
    #[test]
    fn a_kept_answers_item_ids_name_it() {
        for fresh_id in [true, false] {
            let echo = Arc::new(Echo {
                fresh_id,
                ..Echo::default()
            });
            let mut e = StreamEncoder::new("m", echo, Arc::default());
            let mut out = Vec::new();
            for ev in [
                Event::ReasoningDelta("why".into()),
                Event::TextDelta("so".into()),
                Event::ToolStart {
                    index: 0,
                    id: "call_0".into(),
                    name: "f".into(),
                },
                Event::Finish(Finish::ToolUse),
                Event::End,
            ] {
                e.encode(ev, &mut out);
            }
            let done = &events_named(&out, "response.completed")[0]["response"];
            let answer = done["id"].as_str().unwrap();
            let ids: Vec<&str> = (done["output"].as_array().unwrap().iter())
                .map(|i| i["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids.len(), 3, "{done}");
            for (place, (id, prefix)) in ids.iter().zip(["rs_", "msg_", "fc_"]).enumerate() {
                assert!(id.starts_with(prefix), "{id}");
                let named = ir::answer_named_by(id);
                if fresh_id {
                    assert_eq!(named.as_deref(), Some(answer), "{id}");
                    assert_eq!(&id[id.len() - 8..], format!("{:08x}", 0x8000_0000 + place));
                } else {
                    assert_eq!(named, None, "{id}");
                }
            }
        }
    }

    fn decoded(event: Option<&str>, data: &str) -> Vec<Event> {
        let mut out = Vec::new();
        StreamDecoder::default().decode(sse::EventRef { event, data }, &mut out);
        out
    }

    #[test]
    fn events_the_decoder_ignores_are_checked_but_not_read() {
        // Ignored: nothing comes of them, whatever they carry.
        let big = r#"{"type":"response.in_progress","response":{"id":"r","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}}"#;
        assert_eq!(decoded(Some("response.in_progress"), big), []);
        let done =
            r#"{"type":"response.output_text.done","item_id":"m","text":"the whole \"reply\""}"#;
        assert_eq!(decoded(Some("response.output_text.done"), done), []);
        // Still refused when they are not JSON, as before.
        let broken = decoded(
            Some("response.in_progress"),
            r#"{"type":"response.in_progress","#,
        );
        assert!(matches!(broken.as_slice(), [Event::Error(_)]), "{broken:?}");
        // The type member decides over the event's name, as the general reader reads it.
        let completed = r#"{"type":"response.completed","response":{"status":"completed"}}"#;
        let got = decoded(Some("response.in_progress"), completed);
        assert!(matches!(got.last(), Some(Event::End)), "{got:?}");
        let unnamed = decoded(None, completed);
        assert!(matches!(unnamed.last(), Some(Event::End)), "{unnamed:?}");
        // A type that is no string leaves the name to say it.
        let created = r#"{"type":7,"response":{"id":"resp_1","model":"m","created_at":5}}"#;
        assert_eq!(
            decoded(Some("response.created"), created),
            [Event::Start {
                id: "resp_1".into(),
                model: "m".into(),
                created: 5
            }]
        );
    }

    #[test]
    fn deltas_written_by_hand_are_serdes_bytes() {
        let kinds = [
            (
                DeltaKind::OutputText,
                "response.output_text.delta",
                Some(0),
                None,
                Some([]),
            ),
            (
                DeltaKind::ReasoningSummary,
                "response.reasoning_summary_text.delta",
                None,
                Some(0),
                None,
            ),
            (
                DeltaKind::Arguments,
                "response.function_call_arguments.delta",
                None,
                None,
                None,
            ),
        ];
        for (kind, name, content_index, summary_index, logprobs) in kinds {
            for text in AWKWARD_TEXTS {
                let d = DeltaOut {
                    kind: name,
                    sequence_number: 12345,
                    item_id: text,
                    output_index: 7,
                    content_index,
                    summary_index,
                    delta: text,
                    logprobs,
                };
                let mut want = Vec::new();
                sse::write_json_event(&mut want, Some(d.kind), &d);
                let mut middle = b"left from an earlier item".to_vec();
                kind.middle(text, 7, &mut middle);
                let mut got = b"before".to_vec();
                write_delta(&mut got, kind, 12345, &middle, text);
                assert_eq!(
                    String::from_utf8(got).unwrap(),
                    format!("before{}", String::from_utf8(want).unwrap())
                );
            }
        }
    }
}
