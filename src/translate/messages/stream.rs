//! Anthropic Messages streams: upstream events → IR events, and IR events → events for a messages client.

use serde::Serialize;

use super::*;
use crate::json::write::Object;
use crate::translate::hand;

// === streams: messages upstream events → IR ===

#[derive(Debug, Default)]
pub struct StreamDecoder {
    json_mode: bool,
    /// Anthropic block index → IR tool index (None for non-tool blocks); JSON-mode tool blocks map to text.
    blocks: Vec<(u64, BlockKind)>,
    tools: usize,
    usage: Usage,
}

lax_struct! {
    /// Any event of a messages stream: the members the decoder reads of each type, each as
    /// `Value`'s accessors would see it, read by hand without building a tree.
    struct EventIn<'a> {
        kind = "type": Loose<'a>,
        index: Loose<'a>,
        message: MessageIn<'a>,
        content_block: UpstreamBlock<'a>,
        delta: DeltaIn<'a>,
        usage: RawText<'a>,
        error: ErrorIn<'a>,
    }
}

lax_struct! {
    /// `message_start`'s message.
    struct MessageIn<'a> {
        id: Loose<'a>,
        model: Loose<'a>,
        usage: RawText<'a>,
    }
}

lax_struct! {
    /// `content_block_delta`'s and `message_delta`'s delta.
    struct DeltaIn<'a> {
        kind = "type": Loose<'a>,
        text: Loose<'a>,
        thinking: Loose<'a>,
        signature: Loose<'a>,
        partial_json: Loose<'a>,
        stop_reason: Loose<'a>,
        stop_sequence: Loose<'a>,
    }
}

lax_struct! {
    struct ErrorIn<'a> {
        kind = "type": Loose<'a>,
        message: Loose<'a>,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Tool(usize),
    JsonText,
}

impl StreamDecoder {
    pub fn new(json_mode: bool) -> Self {
        Self {
            json_mode,
            ..Self::default()
        }
    }

    /// A delta inside a block.
    fn block_delta(&mut self, index: u64, kind: &str, value: String, out: &mut Vec<Event>) {
        match kind {
            "text_delta" => out.push(Event::TextDelta(value)),
            "thinking_delta" => out.push(Event::ReasoningDelta(value)),
            "signature_delta" => out.push(Event::ReasoningSignature(value)),
            "input_json_delta" if !value.is_empty() => {
                match self
                    .blocks
                    .iter()
                    .find(|(i, _)| *i == index)
                    .map(|(_, k)| *k)
                {
                    Some(BlockKind::Tool(k)) => out.push(Event::ToolArgs {
                        index: k,
                        fragment: value,
                    }),
                    Some(BlockKind::JsonText) => out.push(Event::TextDelta(value)),
                    None => {}
                }
            }
            _ => {}
        }
    }

    pub fn decode(&mut self, ev: sse::EventRef<'_>, out: &mut Vec<Event>) {
        if let Some((kind, text)) = plain_delta(ev.data) {
            out.push(match kind {
                PlainDelta::Text => Event::TextDelta(text.into_owned()),
                PlainDelta::Thinking => Event::ReasoningDelta(text.into_owned()),
            });
            return;
        }
        // Read where it lies (it is large, one reader for every event type, and was moved at
        // each step of a `Result` chain), from text the event decoder has checked as UTF-8.
        let mut e = EventIn::default();
        let read = hand::object_into(&mut e, ev.data)
            || serde_json::from_str::<EventIn<'_>>(ev.data).is_ok_and(|v| {
                e = v;
                true
            });
        if !read {
            out.push(Event::Error(ir::ErrorInfo {
                status: 502,
                message: format!("the upstream sent an unreadable event: {:.200}", ev.data),
                code: None,
            }));
            return;
        }
        let text = |l: &Loose<'_>| l.as_str().unwrap_or("").to_owned();
        match e.kind.as_str().or(ev.event).unwrap_or("") {
            "content_block_delta" => {
                let d = &e.delta;
                let value = [&d.text, &d.thinking, &d.signature, &d.partial_json]
                    .into_iter()
                    .find_map(Loose::as_str)
                    .unwrap_or("");
                let kind = d.kind.as_str().unwrap_or("");
                self.block_delta(e.index.as_u64().unwrap_or(0), kind, value.to_owned(), out);
            }
            "message_start" => {
                let m = &e.message;
                self.add_usage(m.usage);
                out.push(Event::Start {
                    id: text(&m.id),
                    model: text(&m.model),
                    created: ir::now_secs(),
                });
            }
            "content_block_start" => {
                let index = e.index.as_u64().unwrap_or(0);
                let b = &e.content_block;
                match b.kind.as_str() {
                    Some("tool_use") => {
                        let name = text(&b.name);
                        if self.json_mode && name == JSON_TOOL {
                            self.blocks.push((index, BlockKind::JsonText));
                        } else {
                            let k = self.tools;
                            self.tools += 1;
                            self.blocks.push((index, BlockKind::Tool(k)));
                            out.push(Event::ToolStart {
                                index: k,
                                id: text(&b.id),
                                name,
                            });
                        }
                    }
                    Some("text") => {
                        if let Some(t) = b.text.as_str().filter(|t| !t.is_empty()) {
                            out.push(Event::TextDelta(t.to_owned()));
                        }
                    }
                    Some("redacted_thinking") => {
                        out.push(Event::RedactedReasoning(text(&b.data)));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                self.add_usage(e.usage);
                let d = &e.delta;
                if let Some(reason) = d.stop_reason.as_str() {
                    let mut f = finish_from(Some(reason), d.stop_sequence.as_str());
                    if f == Finish::ToolUse
                        && self.tools == 0
                        && self.blocks.iter().any(|(_, k)| *k == BlockKind::JsonText)
                    {
                        f = Finish::EndTurn;
                    }
                    out.push(Event::Finish(f));
                }
                out.push(Event::Usage(self.usage));
            }
            "message_stop" => out.push(Event::End),
            "error" => {
                let kind = e.error.kind.as_str();
                out.push(Event::Error(ir::ErrorInfo {
                    status: status_of_error_type(kind),
                    message: e
                        .error
                        .message
                        .as_str()
                        .unwrap_or("upstream error")
                        .to_owned(),
                    code: kind.map(str::to_owned),
                }));
            }
            _ => {}
        }
    }

    /// Merges the counts of a `usage` member, as `usage_from` merges a `Value`'s: one that is
    /// no object, or that serde cannot read, counts nothing.
    fn add_usage(&mut self, usage: RawText<'_>) {
        if let Some(counts) = usage.0.and_then(|t| Counts::object_at(t.as_bytes())) {
            counts.read_into(Protocol::Messages, &mut self.usage);
        }
    }

    /// The usage the stream has reported so far (none yet: zeros).
    pub fn usage(&self) -> Usage {
        self.usage
    }
}

/// What a [`plain_delta`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlainDelta {
    Text,
    Thinking,
}

/// A text or thinking delta written as Anthropic writes it, byte for byte: its kind and its
/// text. Most of a stream's events are these; matched by their fixed bytes, they are not read
/// member by member. Any other text (members reordered or spaced, more of them, an index that
/// is no plain count) is `None`, and the general reader, which finds the same, reads it: a
/// text delta's index names no block the decoder keeps.
fn plain_delta(data: &str) -> Option<(PlainDelta, Cow<'_, str>)> {
    const HEAD: &[u8] = br#"{"type":"content_block_delta","index":"#;
    const TEXT: &[u8] = br#","delta":{"type":"text_delta","text":""#;
    const THINKING: &[u8] = br#","delta":{"type":"thinking_delta","thinking":""#;
    let b = data.as_bytes();
    let index = b.get(HEAD.len()..)?;
    let digits = index.iter().take_while(|c| c.is_ascii_digit()).count();
    // A count as JSON writes it: no leading zero, and within 64 bits as the reader keeps it.
    if !b.starts_with(HEAD) || !(1..=19).contains(&digits) || (digits > 1 && index[0] == b'0') {
        return None;
    }
    let delta = &index[digits..];
    let (kind, key) = if delta.starts_with(TEXT) {
        (PlainDelta::Text, TEXT)
    } else if delta.starts_with(THINKING) {
        (PlainDelta::Thinking, THINKING)
    } else {
        return None;
    };
    let (text, end) = hand::string(data, HEAD.len() + digits + key.len() - 1)?;
    let closed = b.get(end..end + 2) == Some(b"}}");
    (closed && crate::json::walk::space(b, end + 2) == b.len()).then_some((kind, text))
}

// === streams: IR events → messages client events ===

/// `content_block_delta` as serde writes it: what [`StreamEncoder::delta_at`] writes by hand.
#[cfg(test)]
#[derive(Serialize)]
struct BlockDeltaOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u64,
    delta: DeltaOut<'a>,
}

#[derive(Clone, Copy, Serialize)]
#[serde(tag = "type")]
enum DeltaOut<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// `content_block_start`'s block: empty, its content following in deltas (or whole, when
/// redacted).
#[cfg_attr(test, derive(Serialize))]
#[cfg_attr(test, serde(tag = "type", rename_all = "snake_case"))]
enum BlockOut<'a> {
    Thinking {
        thinking: &'static str,
        signature: &'static str,
    },
    RedactedThinking {
        data: &'a str,
    },
    Text {
        text: &'static str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        #[cfg_attr(
            not(test),
            expect(
                dead_code,
                reason = "a constant the writer writes; serde's reference reads it"
            )
        )]
        input: EmptyObject,
    },
}

/// A stream's events other than the deltas: few per stream, written without a `Value` tree.
#[cfg_attr(test, derive(Serialize))]
#[cfg_attr(test, serde(tag = "type", rename_all = "snake_case"))]
enum FrameOut<'a> {
    MessageStart {
        message: StartOut<'a>,
    },
    ContentBlockStart {
        index: u64,
        content_block: BlockOut<'a>,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        delta: StopOut<'a>,
        usage: UsageOut,
    },
    MessageStop,
}

impl FrameOut<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }

    /// Written by hand, byte for byte as serde writes the enum (its tag first) into an event
    /// named by it: serde's writer escaped each of the ten strings of a `message_start`
    /// through its own table.
    fn write(&self, out: &mut Vec<u8>) {
        let name = self.name();
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        let mut o = Object::open(out);
        o.str("type", name);
        match self {
            Self::MessageStart { message } => message.write(o.key("message")),
            Self::ContentBlockStart {
                index,
                content_block,
            } => {
                o.some_u64("index", Some(*index));
                content_block.write(o.key("content_block"));
            }
            Self::ContentBlockStop { index } => o.some_u64("index", Some(*index)),
            Self::MessageDelta { delta, usage } => {
                let mut d = Object::open(o.key("delta"));
                d.str("stop_reason", delta.stop_reason);
                d.str_or_null("stop_sequence", delta.stop_sequence);
                d.close();
                usage.write(o.key("usage"));
            }
            Self::MessageStop => {}
        }
        o.close();
        out.extend_from_slice(b"\n\n");
    }
}

impl BlockOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        match self {
            Self::Thinking {
                thinking,
                signature,
            } => {
                o.str("type", "thinking");
                o.str("thinking", thinking);
                o.str("signature", signature);
            }
            Self::RedactedThinking { data } => {
                o.str("type", "redacted_thinking");
                o.str("data", data);
            }
            Self::Text { text } => {
                o.str("type", "text");
                o.str("text", text);
            }
            Self::ToolUse { id, name, input: _ } => {
                o.str("type", "tool_use");
                o.str("id", id);
                o.str("name", name);
                o.key("input").extend_from_slice(b"{}");
            }
        }
        o.close();
    }
}

impl StartOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.str("id", self.id);
        o.str("type", self.kind);
        o.str("role", self.role);
        o.str("model", self.model);
        o.key("content").extend_from_slice(b"[]");
        o.key("stop_reason").extend_from_slice(b"null");
        o.key("stop_sequence").extend_from_slice(b"null");
        let mut u = Object::open(o.key("usage"));
        u.some_u64("input_tokens", Some(self.usage.input_tokens));
        u.some_u64("output_tokens", Some(self.usage.output_tokens));
        u.close();
        o.close();
    }
}

impl UsageOut {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.some_u64("input_tokens", Some(self.input_tokens));
        o.some_u64("output_tokens", Some(self.output_tokens));
        o.some_u64(
            "cache_creation_input_tokens",
            Some(self.cache_creation_input_tokens),
        );
        o.some_u64(
            "cache_read_input_tokens",
            Some(self.cache_read_input_tokens),
        );
        o.close();
    }
}

/// `message_start`'s message: nothing generated yet.
#[cfg_attr(test, derive(Serialize))]
struct StartOut<'a> {
    id: &'a str,
    #[cfg_attr(test, serde(rename = "type"))]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "a constant the writer writes; serde's reference reads it"
        )
    )]
    content: [(); 0],
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "a constant the writer writes; serde's reference reads it"
        )
    )]
    stop_reason: Option<()>,
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "a constant the writer writes; serde's reference reads it"
        )
    )]
    stop_sequence: Option<()>,
    usage: StartUsageOut,
}

#[cfg_attr(test, derive(Serialize))]
struct StartUsageOut {
    input_tokens: u64,
    output_tokens: u64,
}

#[cfg_attr(test, derive(Serialize))]
struct StopOut<'a> {
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
}

#[cfg_attr(test, derive(Serialize))]
struct UsageOut {
    input_tokens: u64,
    output_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
}

impl From<&Usage> for UsageOut {
    fn from(u: &Usage) -> Self {
        Self {
            input_tokens: u.input,
            output_tokens: u.output,
            cache_creation_input_tokens: u.cache_write,
            cache_read_input_tokens: u.cache_read,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Text,
    Thinking,
    Tool(usize),
}

#[derive(Debug)]
pub struct StreamEncoder {
    model: String,
    started: bool,
    next_block: u64,
    open: Open,
    /// IR tool index → its block index, so a late fragment still reaches its own block.
    tool_blocks: Vec<(usize, u64)>,
    finish: Option<Finish>,
    usage: Usage,
    done: bool,
}

impl StreamEncoder {
    pub fn new(client_model: &str) -> Self {
        Self {
            model: client_model.to_owned(),
            started: false,
            next_block: 0,
            open: Open::None,
            tool_blocks: Vec::new(),
            finish: None,
            usage: Usage::default(),
            done: false,
        }
    }

    fn start(&mut self, id: &str, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let id = if id.is_empty() {
            ir::mint_id("msg_")
        } else {
            reprefix(id, "msg_")
        };
        FrameOut::MessageStart {
            message: StartOut {
                id: &id,
                kind: "message",
                role: "assistant",
                model: &self.model,
                content: [],
                stop_reason: None,
                stop_sequence: None,
                usage: StartUsageOut {
                    input_tokens: self.usage.input,
                    output_tokens: 0,
                },
            },
        }
        .write(out);
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if self.open != Open::None {
            FrameOut::ContentBlockStop {
                index: self.next_block - 1,
            }
            .write(out);
            self.open = Open::None;
        }
    }

    fn open(&mut self, kind: Open, block: BlockOut<'_>, out: &mut Vec<u8>) {
        self.close(out);
        FrameOut::ContentBlockStart {
            index: self.next_block,
            content_block: block,
        }
        .write(out);
        self.next_block += 1;
        self.open = kind;
    }

    fn delta(&self, delta: DeltaOut<'_>, out: &mut Vec<u8>) {
        self.delta_at(self.next_block - 1, delta, out);
    }

    /// Written by hand, as serde writes [`BlockDeltaOut`]: one per token, the stream's hot path.
    fn delta_at(&self, block: u64, delta: DeltaOut<'_>, out: &mut Vec<u8>) {
        let (kind, text): (&[u8], &str) = match delta {
            DeltaOut::Text { text } => (b"text_delta\",\"text\":", text),
            DeltaOut::Thinking { thinking } => (b"thinking_delta\",\"thinking\":", thinking),
            DeltaOut::Signature { signature } => (b"signature_delta\",\"signature\":", signature),
            DeltaOut::InputJson { partial_json } => {
                (b"input_json_delta\",\"partial_json\":", partial_json)
            }
        };
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        out.extend_from_slice(itoa::Buffer::new().format(block).as_bytes());
        out.extend_from_slice(b",\"delta\":{\"type\":\"");
        out.extend_from_slice(kind);
        crate::json::write_json_str(out, text);
        out.extend_from_slice(b"}}\n\n");
    }

    pub fn encode(&mut self, ev: Event, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if !matches!(ev, Event::Start { .. } | Event::Error(_) | Event::Usage(_)) {
            self.start("", out);
        }
        match ev {
            Event::Start { id, .. } => self.start(&id, out),
            Event::ReasoningDelta(t) => {
                if self.open != Open::Thinking {
                    self.open(
                        Open::Thinking,
                        BlockOut::Thinking {
                            thinking: "",
                            signature: "",
                        },
                        out,
                    );
                }
                self.delta(DeltaOut::Thinking { thinking: &t }, out);
            }
            Event::ReasoningSignature(sig) => {
                if self.open != Open::Thinking {
                    self.open(
                        Open::Thinking,
                        BlockOut::Thinking {
                            thinking: "",
                            signature: "",
                        },
                        out,
                    );
                }
                self.delta(DeltaOut::Signature { signature: &sig }, out);
            }
            Event::RedactedReasoning(data) => {
                self.open(
                    Open::Thinking,
                    BlockOut::RedactedThinking { data: &data },
                    out,
                );
                self.close(out);
            }
            Event::TextDelta(t) => {
                if self.open != Open::Text {
                    self.open(Open::Text, BlockOut::Text { text: "" }, out);
                }
                self.delta(DeltaOut::Text { text: &t }, out);
            }
            Event::ToolStart { index, id, name } => {
                self.tool_blocks.push((index, self.next_block));
                self.open(
                    Open::Tool(index),
                    BlockOut::ToolUse {
                        id: &id,
                        name: &name,
                        input: EmptyObject {},
                    },
                    out,
                );
            }
            Event::ToolArgs { index, fragment } => {
                let delta = DeltaOut::InputJson {
                    partial_json: &fragment,
                };
                if self.open == Open::Tool(index) {
                    self.delta(delta, out);
                } else if let Some(&(_, block)) = self.tool_blocks.iter().find(|(t, _)| *t == index)
                {
                    // Rare: more arguments for a call whose block already closed (the sequencer
                    // holds back the usual interleaving). Its own index keeps it lossless for
                    // clients that key deltas by index, as Anthropic's SDKs do.
                    tracing::debug!(index, "argument fragment after its block closed");
                    self.delta_at(block, delta, out);
                }
            }
            Event::Finish(f) => {
                self.close(out);
                self.finish = Some(f);
            }
            Event::Usage(u) => self.usage = u,
            Event::End => {
                self.close(out);
                let f = self.finish.take().unwrap_or_default();
                let stop_sequence = match &f {
                    Finish::StopSequence(s) => s.as_deref(),
                    _ => None,
                };
                FrameOut::MessageDelta {
                    delta: StopOut {
                        stop_reason: finish_name(&f),
                        stop_sequence,
                    },
                    usage: UsageOut::from(&self.usage),
                }
                .write(out);
                FrameOut::MessageStop.write(out);
                self.done = true;
            }
            Event::Error(e) => {
                sse::write_json_event(out, Some("error"), &error_body(&e));
                self.done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use super::*;
    use crate::translate::hand;

    impl StreamDecoder {
        /// The decoder as it read each event through a `Value` tree before [`EventIn`]: the
        /// reference the typed read is held to.
        fn decode_by_tree(&mut self, ev: sse::EventRef<'_>, out: &mut Vec<Event>) {
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
            match kind {
                "message_start" => {
                    let m = v.get("message").unwrap_or(&Value::Null);
                    if let Some(u) = m.get("usage") {
                        usage_from(u, &mut self.usage);
                    }
                    out.push(Event::Start {
                        id: str_at(m, "id"),
                        model: str_at(m, "model"),
                        created: ir::now_secs(),
                    });
                }
                "content_block_start" => {
                    let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                    let b = v.get("content_block").unwrap_or(&Value::Null);
                    match b.get("type").and_then(Value::as_str) {
                        Some("tool_use") => {
                            let name = str_at(b, "name");
                            if self.json_mode && name == JSON_TOOL {
                                self.blocks.push((index, BlockKind::JsonText));
                            } else {
                                let k = self.tools;
                                self.tools += 1;
                                self.blocks.push((index, BlockKind::Tool(k)));
                                out.push(Event::ToolStart {
                                    index: k,
                                    id: str_at(b, "id"),
                                    name,
                                });
                            }
                        }
                        Some("text") => {
                            if let Some(t) = b
                                .get("text")
                                .and_then(Value::as_str)
                                .filter(|t| !t.is_empty())
                            {
                                out.push(Event::TextDelta(t.to_owned()));
                            }
                        }
                        Some("redacted_thinking") => {
                            out.push(Event::RedactedReasoning(str_at(b, "data")));
                        }
                        _ => {}
                    }
                }
                "content_block_delta" => {
                    let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                    let d = v.get("delta").unwrap_or(&Value::Null);
                    let kind = d.get("type").and_then(Value::as_str).unwrap_or("");
                    let text = ["text", "thinking", "signature", "partial_json"]
                        .iter()
                        .find_map(|k| d.get(*k).and_then(Value::as_str))
                        .unwrap_or("");
                    self.block_delta(index, kind, text.to_owned(), out);
                }
                "message_delta" => {
                    if let Some(u) = v.get("usage") {
                        usage_from(u, &mut self.usage);
                    }
                    let d = v.get("delta").unwrap_or(&Value::Null);
                    if let Some(reason) = d.get("stop_reason").and_then(Value::as_str) {
                        let mut f = finish_from(
                            Some(reason),
                            d.get("stop_sequence").and_then(Value::as_str),
                        );
                        if f == Finish::ToolUse
                            && self.tools == 0
                            && self.blocks.iter().any(|(_, k)| *k == BlockKind::JsonText)
                        {
                            f = Finish::EndTurn;
                        }
                        out.push(Event::Finish(f));
                    }
                    out.push(Event::Usage(self.usage));
                }
                "message_stop" => out.push(Event::End),
                "error" => {
                    let e = v.get("error").unwrap_or(&Value::Null);
                    out.push(Event::Error(ir::ErrorInfo {
                        status: status_of_error_type(e.get("type").and_then(Value::as_str)),
                        message: e
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("upstream error")
                            .to_owned(),
                        code: e.get("type").and_then(Value::as_str).map(str::to_owned),
                    }));
                }
                _ => {}
            }
        }
    }

    /// Both decoders over the same events, from a fresh start: what each made of them.
    fn both(events: &[(Option<&str>, &str)], json_mode: bool) -> (Vec<Event>, Vec<Event>) {
        let (mut typed, mut tree) = (StreamDecoder::new(json_mode), StreamDecoder::new(json_mode));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for &(event, data) in events {
            typed.decode(sse::EventRef { event, data }, &mut a);
            tree.decode_by_tree(sse::EventRef { event, data }, &mut b);
        }
        for e in a.iter_mut().chain(b.iter_mut()) {
            if let Event::Start { created, .. } = e {
                *created = 0;
            }
        }
        (a, b)
    }

    /// The upstream streams of the fixture suite's translations toward a messages upstream.
    fn fixture_streams() -> Vec<String> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut out = Vec::new();
        for dir in std::fs::read_dir(&root).unwrap() {
            let dir = dir.unwrap().path();
            if !dir.to_string_lossy().ends_with("_to_messages") {
                continue;
            }
            for case in std::fs::read_dir(&dir).unwrap() {
                let path = case.unwrap().path().join("upstream_reply.sse");
                if let Ok(text) = std::fs::read_to_string(path) {
                    out.push(text);
                }
            }
        }
        assert!(out.len() > 5, "{} fixture streams", out.len());
        out
    }

    #[test]
    fn every_event_reads_as_its_tree_read() {
        for stream in fixture_streams() {
            let mut events: Vec<(Option<String>, String)> = Vec::new();
            sse::SseDecoder::new()
                .feed_with(stream.as_bytes(), |ev| {
                    events.push((ev.event.map(str::to_owned), ev.data.to_owned()));
                })
                .unwrap();
            assert!(events.len() > 3, "{stream}");
            let events: Vec<(Option<&str>, &str)> = events
                .iter()
                .map(|(e, d)| (e.as_deref(), d.as_str()))
                .collect();
            for json_mode in [false, true] {
                let (typed, tree) = both(&events, json_mode);
                assert_eq!(typed, tree, "{stream}");
            }
        }
    }

    /// Every one-byte edit of each kind of event, after a tool block began and before a closing
    /// delta that shows the usage merged: whatever the tree still reads is read the same.
    #[test]
    fn no_one_byte_edit_reads_otherwise_than_the_tree() {
        let tool = r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"json_tool_call","input":{}}}"#;
        let events = [
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","model":"claude","usage":{"input_tokens":12,"cache_read_input_tokens":3,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"Hi"}}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"redacted_thinking","data":"EmwK"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello \u00e9"}}"#,
            r#"{"type":"content_block_delta","index":10,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"thinking_delta","thinking":"so \"x\""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}"#,
            r#"{"type":"content_block_delta","index":3,"delta":{"type":"signature_delta","signature":"Eq"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9,"output_tokens_details":{"thinking_tokens":4}}}"#,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ];
        let mut compared = 0;
        for json_mode in [false, true] {
            let check = |data: &[u8]| {
                let Ok(data) = std::str::from_utf8(data) else {
                    return false;
                };
                // The closing delta shows the usage every event before it merged.
                let named = [
                    (None, tool),
                    (Some("content_block_delta"), data),
                    (
                        None,
                        r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":1}}"#,
                    ),
                ];
                let (typed, tree) = both(&named, json_mode);
                if serde_json::from_str::<Value>(data).is_ok() {
                    assert_eq!(typed, tree, "{data}");
                    return true;
                }
                false
            };
            compared += hand::check::one_byte_edits(&events, check);
        }
        assert!(compared > 5_000, "only {compared} edits compared");
    }

    /// Deltas as Anthropic writes them are matched whole; anything else is left to the reader.
    #[test]
    fn plain_deltas_are_matched_by_their_bytes() {
        let text = |t: &str| Some((PlainDelta::Text, t.to_owned()));
        let cases = [
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
                text("Hi"),
            ),
            (
                r#"{"type":"content_block_delta","index":17,"delta":{"type":"text_delta","text":"a\nb \u00e9"}}"#,
                text("a\nb é"),
            ),
            (
                r#"{"type":"content_block_delta","index":3,"delta":{"type":"thinking_delta","thinking":""}} "#,
                Some((PlainDelta::Thinking, String::new())),
            ),
            (
                r#"{"type":"content_block_delta","index":01,"delta":{"type":"text_delta","text":"Hi"}}"#,
                None,
            ),
            (
                r#"{"type":"content_block_delta","index":-1,"delta":{"type":"text_delta","text":"Hi"}}"#,
                None,
            ),
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"},"x":1}"#,
                None,
            ),
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi","text":"Ho"}}"#,
                None,
            ),
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\ud800"}}"#,
                None,
            ),
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"s"}}"#,
                None,
            ),
            (
                r#" {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
                None,
            ),
        ];
        for (data, want) in cases {
            let got = plain_delta(data).map(|(k, t)| (k, t.into_owned()));
            assert_eq!(got, want, "{data}");
        }
    }

    #[test]
    fn frames_written_by_hand_are_serdes_bytes() {
        let counts = [0, 7, 12_345, u64::MAX];
        for text in AWKWARD_TEXTS {
            let mut frames = vec![
                FrameOut::MessageStart {
                    message: StartOut {
                        id: text,
                        kind: "message",
                        role: "assistant",
                        model: text,
                        content: [],
                        stop_reason: None,
                        stop_sequence: None,
                        usage: StartUsageOut {
                            input_tokens: 3,
                            output_tokens: u64::MAX,
                        },
                    },
                },
                FrameOut::ContentBlockStart {
                    index: 2,
                    content_block: BlockOut::RedactedThinking { data: text },
                },
                FrameOut::ContentBlockStart {
                    index: 0,
                    content_block: BlockOut::ToolUse {
                        id: text,
                        name: text,
                        input: EmptyObject {},
                    },
                },
                FrameOut::ContentBlockStart {
                    index: 1,
                    content_block: BlockOut::Thinking {
                        thinking: "",
                        signature: "",
                    },
                },
                FrameOut::ContentBlockStart {
                    index: 9,
                    content_block: BlockOut::Text { text: "" },
                },
                FrameOut::ContentBlockStop { index: 12_345 },
                FrameOut::MessageStop,
            ];
            for (i, n) in counts.into_iter().enumerate() {
                frames.push(FrameOut::MessageDelta {
                    delta: StopOut {
                        stop_reason: "end_turn",
                        stop_sequence: (i % 2 == 0).then_some(text),
                    },
                    usage: UsageOut {
                        input_tokens: n,
                        output_tokens: counts[(i + 1) % 4],
                        cache_creation_input_tokens: counts[(i + 2) % 4],
                        cache_read_input_tokens: counts[(i + 3) % 4],
                    },
                });
            }
            for frame in &frames {
                let mut want = Vec::new();
                sse::write_json_event(&mut want, Some(frame.name()), frame);
                let mut got = Vec::new();
                frame.write(&mut got);
                assert_eq!(
                    String::from_utf8(got).unwrap(),
                    String::from_utf8(want).unwrap()
                );
            }
        }
    }

    #[test]
    fn deltas_written_by_hand_are_serdes_bytes() {
        let enc = StreamEncoder::new("m");
        for text in AWKWARD_TEXTS {
            for block in [0, 7, 12345] {
                let deltas = [
                    DeltaOut::Text { text },
                    DeltaOut::Thinking { thinking: text },
                    DeltaOut::Signature { signature: text },
                    DeltaOut::InputJson { partial_json: text },
                ];
                for delta in deltas {
                    let mut want = Vec::new();
                    sse::write_json_event(
                        &mut want,
                        Some("content_block_delta"),
                        &BlockDeltaOut {
                            kind: "content_block_delta",
                            index: block,
                            delta,
                        },
                    );
                    let mut got = Vec::new();
                    enc.delta_at(block, delta, &mut got);
                    assert_eq!(
                        String::from_utf8(got).unwrap(),
                        String::from_utf8(want).unwrap()
                    );
                }
            }
        }
    }
}
