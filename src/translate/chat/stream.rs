//! Chat Completions streams: upstream chunks → IR events, and IR events → chunks for a chat client.

use std::borrow::Cow;

use serde::Deserialize;
#[cfg(test)]
use serde::Serialize;

use super::*;
use crate::json::{walk, write_json_str};
use crate::translate::hand::{self, Hand};

// === streams: chat upstream chunks → IR events ===

#[derive(Debug, Default)]
pub struct StreamDecoder {
    started: bool,
    /// Chat's tool index → the IR's tool index, in order of first appearance.
    tools: Vec<u64>,
    /// The last usage chunk's counts: what the request is charged.
    usage: Usage,
    /// The text the last chunk read by hand began with, up to its `choices`: the id, object,
    /// time, model and fingerprint a provider repeats in every chunk. A chunk that begins with
    /// the same bytes is read from its `choices` on, those members already checked.
    head: Vec<u8>,
}

lax_struct! {
    /// A chat chunk after the stream's first: the members the decoder reads, each as `Value`'s
    /// accessors would see it, read by hand without building a `Value` tree. Its id, model and
    /// time are the first chunk's to give: here they are checked as skipped, not read.
    struct Chunk<'a> {
        choices: First<ChunkChoice<'a>>,
        usage: RawText<'a>,
        error: RawText<'a>,
    }
}

lax_struct! {
    /// The stream's first chunk, whose id, model and time start the stream.
    struct FirstChunk<'a> {
        id: Loose<'a>,
        model: Loose<'a>,
        created: Loose<'a>,
        choices: First<ChunkChoice<'a>>,
        usage: RawText<'a>,
        error: RawText<'a>,
    }
}

lax_struct! {
    struct ChunkChoice<'a> {
        delta: Delta<'a>,
        finish_reason: Loose<'a>,
    }
}

lax_struct! {
    struct Delta<'a> {
        content: Loose<'a>,
        refusal: Loose<'a>,
        reasoning_content: Loose<'a>,
        reasoning: Loose<'a>,
        tool_calls: Loose<'a, CallDelta<'a>>,
    }
}

lax_struct! {
    struct CallDelta<'a> {
        index: Loose<'a>,
        id: Loose<'a>,
        // A reply's call's function: a chunk's names the same members.
        function: Function<'a>,
    }
}

impl StreamDecoder {
    pub fn decode(&mut self, ev: sse::EventRef<'_>, out: &mut Vec<Event>) {
        let data = ev.data.trim();
        if data.starts_with("[DONE]") {
            out.push(Event::End);
            return;
        }
        if self.started {
            let mut chunk = Chunk::default();
            if self.read_next(&mut chunk, data) && no_error(chunk.error) {
                return self.decode_chunk(chunk.choices.0.as_ref(), chunk.usage, out);
            }
        } else {
            let mut chunk = FirstChunk::default();
            if read_chunk(&mut chunk, data) && no_error(chunk.error) {
                self.started = true;
                out.push(Event::Start {
                    id: chunk.id.as_str().unwrap_or("").to_owned(),
                    model: chunk.model.as_str().unwrap_or("").to_owned(),
                    created: chunk.created.as_u64().unwrap_or_else(ir::now_secs),
                });
                return self.decode_chunk(chunk.choices.0.as_ref(), chunk.usage, out);
            }
        }
        // An error chunk is rare, and read whole for everything it says.
        self.decode_value(data, out);
    }

    /// Reads a chunk after the first into `slot`, which holds the default: past the head it
    /// repeats when it does ([`Self::head`]), else whole, by hand or by serde. False when
    /// neither reads it.
    fn read_next<'a>(&mut self, slot: &mut Chunk<'a>, data: &'a str) -> bool {
        let b = data.as_bytes();
        if !self.head.is_empty() && b.starts_with(&self.head) {
            // The members the head holds were checked as skipped when it was recorded, and
            // the walk past the same bytes ends where it ended then, at the `choices` key.
            let end = walk::members::<true>(b, self.head.len(), |key, at| {
                chunk_member(slot, data, key, at)
            });
            if end.is_some_and(|end| walk::space(b, end) == b.len()) {
                return true;
            }
            *slot = Chunk::default();
        }
        // `data` is trimmed: the object starts at 0. The head is recorded when `choices` is
        // the first of the chunk's members the decoder reads.
        let mut choices_at = None;
        let mut read_before = false;
        let whole = b.first() == Some(&b'{')
            && walk::object::<true>(b, 0, |key, at| {
                if choices_at.is_none() && !read_before {
                    match key {
                        // `key` lies in `b`, past its opening quote.
                        b"choices" => {
                            choices_at = Some(key.as_ptr().addr() - b.as_ptr().addr() - 1)
                        }
                        b"usage" | b"error" => read_before = true,
                        _ => {}
                    }
                }
                chunk_member(slot, data, key, at)
            })
            .is_some_and(|end| walk::space(b, end) == b.len());
        if whole {
            self.head.clear();
            if let Some(head) = choices_at.and_then(|at| b.get(..at)) {
                self.head.extend_from_slice(head);
            }
            return true;
        }
        // What the hand reader is unsure of, serde reads.
        serde_json::from_str::<Chunk<'a>>(data).is_ok_and(|c| {
            *slot = c;
            true
        })
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

    fn decode_chunk(
        &mut self,
        choice: Option<&ChunkChoice<'_>>,
        usage: RawText<'_>,
        out: &mut Vec<Event>,
    ) {
        if let Some(choice) = choice {
            let delta = &choice.delta;
            // `reasoning_content` (DeepSeek, vLLM) when it is text, `reasoning` (OpenRouter,
            // newer vLLM) otherwise.
            let reasoning = delta
                .reasoning_content
                .as_str()
                .or_else(|| delta.reasoning.as_str());
            if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
                out.push(Event::ReasoningDelta(r.to_owned()));
            }
            for t in [&delta.content, &delta.refusal] {
                if let Some(t) = t.as_str().filter(|t| !t.is_empty()) {
                    out.push(Event::TextDelta(t.to_owned()));
                }
            }
            for call in delta.tool_calls.as_array().unwrap_or_default() {
                let (index, new) = self.tool_index(call.index.as_u64().unwrap_or(0));
                if new {
                    out.push(Event::ToolStart {
                        index,
                        id: call
                            .id
                            .as_str()
                            .map_or_else(|| ir::mint_id("call_"), str::to_owned),
                        name: call.function.name.as_str().unwrap_or("").to_owned(),
                    });
                }
                if let Some(a) = call.function.arguments.as_str().filter(|a| !a.is_empty()) {
                    out.push(Event::ToolArgs {
                        index,
                        fragment: a.to_owned(),
                    });
                }
            }
            if let Some(reason) = choice.finish_reason.as_str() {
                out.push(Event::Finish(finish_from(Some(reason))));
            }
        }
        if let Some(counts) = usage.0.and_then(|text| Counts::object_at(text.as_bytes())) {
            counts.read_into(Protocol::Chat, &mut self.usage);
            out.push(Event::Usage(self.usage));
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
        let usage = v.get("usage").filter(|u| u.is_object());
        if let Some(u) = usage {
            self.usage = usage_from(u);
        }
        if v.get("error").is_some_and(|e| !e.is_null()) {
            // The stream ends here; the tokens an error chunk reports are still charged.
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
        if usage.is_some() {
            out.push(Event::Usage(self.usage));
        }
    }

    /// The usage the stream has reported so far (none yet: zeros).
    pub fn usage(&self) -> Usage {
        self.usage
    }
}

/// Reads member `key` of a chunk after the first, at `at`, into `slot`: `choices` carrying
/// only text as providers write it ([`plain_choices`]) matched by its bytes, anything else read
/// by hand. Where it ends, or `None` when the reader is unsure.
fn chunk_member<'a>(slot: &mut Chunk<'a>, data: &'a str, key: &[u8], at: usize) -> Option<usize> {
    if key == b"choices" {
        if let Some((text, end)) = plain_choices(data, at) {
            // What reading them finds: a later `choices` replaces an earlier one whole.
            slot.choices = First(Some(ChunkChoice {
                delta: Delta {
                    content: Loose::Str(text),
                    ..Delta::default()
                },
                finish_reason: Loose::Null,
                ..ChunkChoice::default()
            }));
            return Some(end);
        }
    }
    Chunk::member(slot, data, key, at, 0)
}

/// The text of `choices` at `at` written as OpenAI (and DeepSeek, Groq, vLLM, …) write a chunk
/// that only carries text, byte for byte, and where the array ends. Most of a stream's chunks
/// are these; matched by their fixed bytes, they are not read member by member. Any other
/// text is `None`, for the reader, which finds the same.
fn plain_choices(data: &str, at: usize) -> Option<(Cow<'_, str>, usize)> {
    const OPEN: &[u8] = br#"[{"index":0,"delta":{"content":""#;
    const CLOSE: &[u8] = br#"},"logprobs":null,"finish_reason":null}]"#;
    let b = data.as_bytes();
    if !b.get(at..)?.starts_with(OPEN) {
        return None;
    }
    let (text, end) = hand::string(data, at + OPEN.len() - 1)?;
    b.get(end..)?
        .starts_with(CLOSE)
        .then_some((text, end + CLOSE.len()))
}

/// Reads a chunk into `slot`, which holds the default, where it lies (a chunk is some 200
/// bytes, moved at each step of an `Option` chain): by hand, or by serde when the hand reader is
/// unsure. False when neither reads it.
fn read_chunk<'a, C: Hand<'a> + Deserialize<'a>>(slot: &mut C, data: &'a str) -> bool {
    hand::object_into(slot, data)
        || serde_json::from_str::<C>(data).is_ok_and(|c| {
            *slot = c;
            true
        })
}

/// Whether a chunk's `error` member is absent or `null`.
fn no_error(error: RawText<'_>) -> bool {
    error.0.is_none_or(|e| e == "null")
}

// === streams: IR events → chat client chunks ===

/// A chunk as serde writes it: what [`StreamEncoder::chunk_with`] writes by hand.
#[cfg(test)]
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

#[cfg(test)]
#[derive(Serialize)]
struct ChoiceOut<'a, D> {
    index: u32,
    delta: D,
    logprobs: (),
    finish_reason: Option<&'a str>,
}

#[cfg(test)]
#[derive(Serialize)]
struct ContentOut<'a> {
    content: &'a str,
}

#[cfg(test)]
#[derive(Serialize)]
struct ReasoningOut<'a> {
    reasoning_content: &'a str,
}

#[cfg(test)]
#[derive(Serialize)]
struct ToolCallsOut<'a> {
    tool_calls: [ToolArgsOut<'a>; 1],
}

#[cfg(test)]
#[derive(Serialize)]
struct ToolArgsOut<'a> {
    index: usize,
    function: ArgsOut<'a>,
}

#[cfg(test)]
#[derive(Serialize)]
struct ArgsOut<'a> {
    arguments: &'a str,
}

#[cfg(test)]
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
    /// Every chunk's bytes up to its delta (`data: {"id":…,"choices":[{"index":0,"delta":`),
    /// the same for the whole stream: written once, copied into each chunk.
    head: Vec<u8>,
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
            head: Vec::new(),
        }
    }

    /// A chunk whose delta serde writes: the rare ones.
    fn chunk(&mut self, out: &mut Vec<u8>, delta: &Value, finish: Option<&str>) {
        self.chunk_with(
            out,
            |o| {
                // Writing into a Vec cannot fail.
                let _ = serde_json::to_writer(o, delta);
            },
            finish,
        );
    }

    /// A chunk with the delta `delta` writes, byte for byte as serde writes [`ChunkOut`]: one
    /// per token, the stream's hot path.
    fn chunk_with(
        &mut self,
        out: &mut Vec<u8>,
        delta: impl FnOnce(&mut Vec<u8>),
        finish: Option<&str>,
    ) {
        if self.head.is_empty() {
            let head = &mut self.head;
            head.extend_from_slice(b"data: {\"id\":");
            write_json_str(head, &self.id);
            head.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
            head.extend_from_slice(itoa::Buffer::new().format(self.created).as_bytes());
            head.extend_from_slice(b",\"model\":");
            write_json_str(head, &self.model);
            head.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":");
        }
        out.extend_from_slice(&self.head);
        delta(out);
        out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":");
        match finish {
            Some(f) => write_json_str(out, f),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"}]");
        if self.include_usage {
            // With include_usage, every chunk before the usage chunk carries `usage: null`
            // (A.5 rule 5).
            out.extend_from_slice(b",\"usage\":null");
        }
        out.extend_from_slice(b"}\n\n");
    }

    /// A one-member delta object, `{"<key>":<text>}`: `key` ends with its quote and colon.
    fn text_chunk(&mut self, out: &mut Vec<u8>, key: &[u8], text: &str) {
        self.chunk_with(
            out,
            |o| {
                o.extend_from_slice(key);
                write_json_str(o, text);
                o.push(b'}');
            },
            None,
        );
    }

    fn ensure_started(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.started = true;
            self.chunk(out, &json!({"role": "assistant", "content": ""}), None);
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
                self.head.clear();
                self.ensure_started(out);
            }
            Event::ReasoningDelta(t) => {
                self.ensure_started(out);
                self.text_chunk(out, b"{\"reasoning_content\":", &t);
            }
            Event::ReasoningSignature(sig) => {
                self.ensure_started(out);
                self.chunk(out, &json!({"thinking_blocks": [{"type": "thinking", "thinking": "", "signature": sig}]}), None);
            }
            Event::RedactedReasoning(data) => {
                self.ensure_started(out);
                self.chunk(
                    out,
                    &json!({"thinking_blocks": [{"type": "redacted_thinking", "data": data}]}),
                    None,
                );
            }
            Event::TextDelta(t) => {
                self.ensure_started(out);
                self.text_chunk(out, b"{\"content\":", &t);
            }
            Event::ToolStart { index, id, name } => {
                self.ensure_started(out);
                self.chunk(out, &json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}), None);
            }
            Event::ToolArgs { index, fragment } => {
                self.chunk_with(
                    out,
                    |o| {
                        o.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
                        o.extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
                        o.extend_from_slice(b",\"function\":{\"arguments\":");
                        write_json_str(o, &fragment);
                        o.extend_from_slice(b"}}]}");
                    },
                    None,
                );
            }
            Event::Finish(f) => self.finish = Some(f),
            Event::Usage(u) => self.usage = Some(u),
            Event::End => {
                self.ensure_started(out);
                let f = self.finish.take().unwrap_or_default();
                self.chunk(out, &json!({}), Some(finish_name(&f)));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use super::*;
    use crate::translate::hand::check;

    const TEXTS: [&str; 5] = AWKWARD_TEXTS;

    /// The chunk serde writes for `delta`, as the encoder's `chunk_with` must write it.
    fn serde_chunk<D: Serialize>(e: &StreamEncoder, delta: D, finish: Option<&str>) -> String {
        let mut out = Vec::new();
        sse::write_json_event(
            &mut out,
            None,
            &ChunkOut {
                id: &e.id,
                object: "chat.completion.chunk",
                created: e.created,
                model: &e.model,
                choices: [ChoiceOut {
                    index: 0,
                    delta,
                    logprobs: (),
                    finish_reason: finish,
                }],
                usage: e.include_usage,
            },
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn chunks_written_by_hand_are_serdes_bytes() {
        for include_usage in [false, true] {
            for model in TEXTS {
                let mut e = StreamEncoder::new(model, include_usage);
                for (n, (id, created)) in [("", 0), ("chatcmpl-\"x\"", 1_700_000_000)]
                    .into_iter()
                    .enumerate()
                {
                    // A start sets the id and time every later chunk repeats.
                    let mut out = Vec::new();
                    e.encode(
                        Event::Start {
                            id: id.into(),
                            model: String::new(),
                            created,
                        },
                        &mut out,
                    );
                    // Only the first start opens the stream with the role chunk.
                    let first = serde_chunk(&e, json!({"role": "assistant", "content": ""}), None);
                    let want = if n == 0 { first } else { String::new() };
                    assert_eq!(String::from_utf8(out).unwrap(), want);
                    for text in TEXTS {
                        let mut out = Vec::new();
                        e.encode(Event::TextDelta(text.into()), &mut out);
                        let want = serde_chunk(&e, ContentOut { content: text }, None);
                        assert_eq!(String::from_utf8(out).unwrap(), want);

                        let mut out = Vec::new();
                        e.encode(Event::ReasoningDelta(text.into()), &mut out);
                        let want = serde_chunk(
                            &e,
                            ReasoningOut {
                                reasoning_content: text,
                            },
                            None,
                        );
                        assert_eq!(String::from_utf8(out).unwrap(), want);

                        for index in [0, 3, 12345] {
                            let mut out = Vec::new();
                            e.encode(
                                Event::ToolArgs {
                                    index,
                                    fragment: text.into(),
                                },
                                &mut out,
                            );
                            let call = ToolArgsOut {
                                index,
                                function: ArgsOut { arguments: text },
                            };
                            let want = serde_chunk(&e, ToolCallsOut { tool_calls: [call] }, None);
                            assert_eq!(String::from_utf8(out).unwrap(), want);
                        }
                    }
                }
                let mut out = Vec::new();
                e.encode(Event::Finish(Finish::MaxTokens), &mut out);
                e.encode(Event::End, &mut out);
                let text = String::from_utf8(out).unwrap();
                let want = serde_chunk(&e, json!({}), Some("length"));
                assert!(text.starts_with(&want), "{text}");
                assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            }
        }
    }

    /// Both chunk types: each is read by hand as serde reads it.
    fn agrees(text: &[u8]) -> bool {
        check::agrees::<FirstChunk<'_>>(text) & check::agrees::<Chunk<'_>>(text)
    }

    /// Chunks as upstreams write them, and oddities (types `Value`'s accessors would not
    /// take, repeated keys, a second choice, space, escapes).
    const CHUNKS: [&str; 9] = [
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1795793584,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]},"finish_reason":null}]}"#,
        r#"{"id":"c","choices":[{"delta":{"reasoning_content":null,"reasoning":"why \u00e9"},"finish_reason":"stop"}]}"#,
        r#"{"id":"c","choices":[],"usage":{"prompt_tokens":27,"completion_tokens":3,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":2}}}"#,
        r#"{"id":5,"model":["x"],"created":1.5,"choices":{"delta":1},"usage":"none"}"#,
        r#"{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b","x":[{"y":"\ud800"}]}}],"choices":[{"delta":{"content":"last"}},7,"z"]}"#,
        r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
        r#"{ "id" : "spaced" , "choices" : [ { "delta" : { "content" : "x" } } ] }"#,
        "{\"choices\":[{\"delta\":{\"content\":\"tab\\t and \\\"quote\\\"\"}}]}",
    ];

    #[test]
    fn chunks_are_read_by_hand_as_serde_reads_them() {
        check::all_read(CHUNKS, agrees);
        // The last of a repeated key counts, and the first of the choices (the others checked,
        // not kept).
        let chunk: Chunk<'_> = hand::object(CHUNKS[5]).unwrap();
        let first = chunk.choices.0.unwrap();
        assert_eq!(first.delta.content.as_str(), Some("last"));
        for not_an_array in [CHUNKS[3], CHUNKS[4]] {
            let chunk: Chunk<'_> = hand::object(not_an_array).unwrap();
            assert!(chunk.choices.0.is_none(), "{not_an_array}");
        }
        // Past the first choice the elements are skipped, checked as serde checks what it
        // ignores: a control character in a string is refused, a number past f64's range and a
        // lone surrogate pass, by both readers.
        let later = |bad: &str| format!(r#"{{"choices":[{{"delta":{{}}}},{bad}]}}"#);
        let text = later("\"\u{1}\"");
        assert!(!agrees(text.as_bytes()), "{text}");
        assert!(serde_json::from_str::<Chunk<'_>>(&text).is_err(), "{text}");
        for bad in ["1e400", r#""\ud800""#] {
            assert!(agrees(later(bad).as_bytes()), "{bad}");
        }
    }

    /// The chat streams of the fixture suite (`tests/fixtures/*_to_chat`): every chunk is read
    /// by hand.
    #[test]
    fn the_fixture_chunks_are_read_by_hand() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut read = 0;
        for dir in ["messages_to_chat", "responses_to_chat"] {
            for case in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = case.unwrap().path().join("upstream_reply.sse");
                let Ok(text) = std::fs::read_to_string(path) else {
                    continue;
                };
                let mut events = Vec::new();
                let mut d = sse::SseDecoder::new();
                d.feed(text.as_bytes(), &mut events).unwrap();
                d.finish(&mut events);
                for e in events.iter().filter(|e| e.data.starts_with('{')) {
                    assert!(agrees(e.data.as_bytes()), "left to serde: {}", e.data);
                    read += 1;
                }
            }
        }
        assert!(read > 50, "{read} chunks");
    }

    /// A chunk after the first read member by member, each by `member`: what it holds, or
    /// `None` when the walk is unsure.
    fn read_by(
        data: &str,
        mut member: impl for<'a> FnMut(&mut Chunk<'a>, &'a str, &[u8], usize) -> Option<usize>,
    ) -> Option<String> {
        let b = data.as_bytes();
        let mut slot = Chunk::default();
        let end = (b.first() == Some(&b'{'))
            .then(|| walk::object::<true>(b, 0, |key, at| member(&mut slot, data, key, at)))??;
        (walk::space(b, end) == b.len()).then(|| format!("{slot:?}"))
    }

    /// Choices matched by their bytes hold what reading them holds: every one-byte edit of
    /// chunks that carry them, first or after other choices, against the reader alone.
    #[test]
    fn plain_choices_hold_what_reading_them_holds() {
        let chunks = [
            r#"{"id":"c","choices":[{"index":0,"delta":{"content":"Hi \u00e9 \"q\""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null}],"choices":[{"delta":{"content":"b"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"delta":{"refusal":"no"},"finish_reason":"stop"}],"choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}],"obfuscation":"x"}"#,
        ];
        let matched = std::cell::Cell::new(0);
        let compared = check::one_byte_edits(&chunks, |edited| {
            let Ok(edited) = std::str::from_utf8(edited) else {
                return false;
            };
            let general = read_by(edited, |slot, data, key, at| {
                Chunk::member(slot, data, key, at, 0)
            });
            assert_eq!(read_by(edited, chunk_member), general, "{edited}");
            let b = edited.as_bytes();
            let found = (0..b.len())
                .filter(|&at| {
                    b[at..].starts_with(b"[{\"index\"") && plain_choices(edited, at).is_some()
                })
                .count();
            matched.set(matched.get() + found);
            general.is_some()
        });
        assert!(compared > 3_000, "only {compared} edits read");
        let matched = matched.get();
        assert!(
            matched > 2_000,
            "only {matched} choices matched by their bytes"
        );
    }

    /// Every one-byte edit of the chunks: the reader never answers otherwise than serde.
    #[test]
    fn no_one_byte_edit_makes_the_reader_differ_from_serde() {
        let read = check::one_byte_edits(&CHUNKS, agrees);
        assert!(read > 5_000, "only {read} edits were read by hand");
    }

    const KEYS: [&str; 17] = [
        "id",
        "model",
        "created",
        "choices",
        "usage",
        "error",
        "delta",
        "finish_reason",
        "content",
        "reasoning",
        "reasoning_content",
        "refusal",
        "tool_calls",
        "index",
        "function",
        "arguments",
        "x",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

        /// Objects made of the chunk's keys at every level, with values of every kind: the
        /// reader never answers otherwise than serde.
        #[test]
        fn made_up_chunks_are_read_as_serde_reads_them(seed: u64) {
            agrees(check::made_up(seed, 5, &KEYS, &check::SCALARS).as_bytes());
        }
    }

    #[test]
    fn a_chunk_read_either_way_gives_the_same_events() {
        let text = r#"{"id":"chatcmpl-1","created":7,"model":"m","choices":[{"delta":{"reasoning":"r","content":"c","refusal":"no","tool_calls":[{"index":2,"id":"call_9","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        let mut d = StreamDecoder::default();
        let mut events = Vec::new();
        d.decode(
            sse::EventRef {
                event: None,
                data: text,
            },
            &mut events,
        );
        let want = vec![
            Event::Start {
                id: "chatcmpl-1".into(),
                model: "m".into(),
                created: 7,
            },
            Event::ReasoningDelta("r".into()),
            Event::TextDelta("c".into()),
            Event::TextDelta("no".into()),
            Event::ToolStart {
                index: 0,
                id: "call_9".into(),
                name: "f".into(),
            },
            Event::ToolArgs {
                index: 0,
                fragment: "{}".into(),
            },
            Event::Finish(Finish::ToolUse),
            Event::Usage(Usage {
                input: 5,
                output: 2,
                ..Usage::default()
            }),
        ];
        assert_eq!(events, want);
        // The general reader, which error chunks and text that is not JSON take, agrees.
        let mut d = StreamDecoder::default();
        let mut general = Vec::new();
        d.decode_value(text, &mut general);
        assert_eq!(general, want);
    }

    /// The events `decoder` reads from `data`, a minted tool call id (one `data` does not hold)
    /// written as `minted`.
    fn events_of(decoder: &mut StreamDecoder, data: &str) -> Vec<Event> {
        let mut out = Vec::new();
        decoder.decode(sse::EventRef { event: None, data }, &mut out);
        for e in &mut out {
            if let Event::ToolStart { id, .. } = e {
                if !data.contains(id.as_str()) {
                    *id = "minted".into();
                }
            }
        }
        out
    }

    /// A stream's first chunk (read for its id) and a second, whose head is recorded.
    fn decoder_after(first: &str, second: &str) -> StreamDecoder {
        let mut d = StreamDecoder::default();
        events_of(&mut d, first);
        events_of(&mut d, second);
        d
    }

    const HEAD: &str = r#"{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1795793584,"model":"gpt-4o-mini","system_fingerprint":"fp_1","#;

    /// Chunks that begin with `HEAD`, as a stream's later chunks do.
    fn after_head() -> Vec<String> {
        [
            r#""choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}"#,
            r#""choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":null}"#,
            r#""choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#,
            r#""choices":[{"delta":{"reasoning":"why"}}],"error":{"message":"overloaded"}}"#,
        ]
        .iter()
        .map(|rest| format!("{HEAD}{rest}"))
        .collect()
    }

    #[test]
    fn a_repeated_head_is_recorded_up_to_the_choices() {
        let chunks = after_head();
        let d = decoder_after(&chunks[0], &chunks[0]);
        assert_eq!(d.head, HEAD.as_bytes());
        // Not when a member the decoder reads comes before the choices: it would have to be
        // read again.
        let usage_first = r#"{"id":"c","usage":null,"choices":[]}"#;
        assert!(decoder_after(&chunks[0], usage_first).head.is_empty());
        // A chunk with another head (a provider whose ids change) records its own.
        let other = r#"{"id":"chatcmpl-8", "choices":[]}"#;
        assert_eq!(
            decoder_after(&chunks[0], other).head,
            br#"{"id":"chatcmpl-8", "#
        );
        // Past a recorded head the bytes are compared, not read again: a head the decoder
        // was made to hold, which no reader would take, is passed over.
        let mut d = decoder_after(&chunks[0], &chunks[0]);
        d.head = br#"{"id":nul,"#.to_vec();
        let events = events_of(
            &mut d,
            r#"{"id":nul,"choices":[{"delta":{"content":"x"}}]}"#,
        );
        assert_eq!(events, vec![Event::TextDelta("x".into())]);
    }

    /// A chunk read past the head its stream repeats gives the events a whole read gives:
    /// every one-byte edit of chunks after it (some in the head, some past it), against a
    /// decoder that forgot the head.
    #[test]
    fn a_chunk_read_past_its_head_gives_what_a_whole_read_gives() {
        let chunks = after_head();
        let texts: Vec<&str> = chunks.iter().map(String::as_str).collect();
        let past_head = check::one_byte_edits(&texts, |edited| {
            let Ok(edited) = std::str::from_utf8(edited) else {
                return false;
            };
            let mut fast = decoder_after(texts[0], texts[0]);
            let mut whole = decoder_after(texts[0], texts[0]);
            whole.head.clear();
            let read = events_of(&mut fast, edited);
            assert_eq!(read, events_of(&mut whole, edited), "{edited}");
            edited.starts_with(HEAD)
        });
        assert!(past_head > 5_000, "{past_head} edits past the head");
    }
}
