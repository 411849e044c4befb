//! The canonical representation every translation goes through: requests, replies, stream events and errors, with nothing protocol-specific.

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// A conversation request, as all three protocols understand it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// System prompt pieces in order (system/developer messages, `system`, `instructions`).
    pub system: Vec<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub thinking: Option<Thinking>,
    pub response_format: Option<ResponseFormat>,
    pub user: Option<String>,
}

/// JSON text carried through untouched (a schema), compared by its text: the gateway never
/// looks inside, so it never pays for a tree.
#[derive(Debug, Clone)]
pub struct RawJson(pub Box<RawValue>);

impl RawJson {
    pub fn get(&self) -> &str {
        self.0.get()
    }

    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }

    /// Raw JSON text has no leading whitespace, so its first byte says what it is.
    pub fn is_object(&self) -> bool {
        self.get().starts_with('{')
    }
}

impl From<&RawValue> for RawJson {
    fn from(raw: &RawValue) -> Self {
        Self(raw.to_owned())
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Image(Image),
    /// A tool call; `arguments` is JSON text, possibly invalid (the model wrote it).
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    ToolResult {
        call_id: String,
        content: Vec<Part>,
        is_error: bool,
    },
    /// Reasoning text with its provenance: an Anthropic signature, or opaque redacted data.
    Reasoning(Reasoning),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reasoning {
    pub text: String,
    /// The upstream's signature, carried through untouched; never invented.
    pub signature: Option<String>,
    /// Anthropic `redacted_thinking.data`.
    pub redacted: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub source: ImageSource,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    Url(String),
    Base64 { media_type: String, data: String },
}

impl ImageSource {
    /// Splits a `data:<mime>;base64,<data>` URL; any other URL stays a URL.
    pub fn from_url(url: &str) -> Self {
        if let Some(rest) = url.strip_prefix("data:") {
            if let Some((mime, data)) = rest.split_once(";base64,") {
                return Self::Base64 {
                    media_type: mime.to_owned(),
                    data: data.to_owned(),
                };
            }
        }
        Self::Url(url.to_owned())
    }

    pub fn to_url(&self) -> String {
        match self {
            Self::Url(u) => u.clone(),
            Self::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: RawJson,
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thinking {
    pub enabled: bool,
    pub budget_tokens: Option<u64>,
    /// `minimal`, `low`, `medium`, `high`, … as the client said it.
    pub effort: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        description: Option<String>,
        schema: RawJson,
        strict: Option<bool>,
    },
}

/// Why generation stopped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Finish {
    #[default]
    EndTurn,
    StopSequence(Option<String>),
    MaxTokens,
    ToolUse,
    ContentFilter,
}

/// Token counts; `input` excludes cache reads and writes, so the whole prompt is their sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub output: u64,
    pub reasoning: u64,
}

impl Usage {
    /// Saturates: the counts are the upstream's word, and an upstream may send any u64.
    pub fn prompt_total(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }

    /// The whole prompt and the output, saturating like `prompt_total`.
    pub fn total(&self) -> u64 {
        self.prompt_total().saturating_add(self.output)
    }
}

/// A complete, non-streamed reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Response {
    pub id: String,
    pub model: String,
    pub created: u64,
    /// Reasoning, text and tool calls in the order the model produced them.
    pub content: Vec<Part>,
    pub finish: Finish,
    pub usage: Usage,
}

/// An upstream failure in protocol-neutral terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorInfo {
    pub status: u16,
    pub message: String,
    /// The upstream's own type or code, when it said one.
    pub code: Option<String>,
}

/// One step of a streamed reply. Decoders turn wire events into these; encoders the reverse.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Start {
        id: String,
        model: String,
        created: u64,
    },
    ReasoningDelta(String),
    ReasoningSignature(String),
    RedactedReasoning(String),
    TextDelta(String),
    /// A new tool call; `index` counts tool calls in this reply from 0.
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArgs {
        index: usize,
        fragment: String,
    },
    Finish(Finish),
    /// Cumulative usage so far (replaces, never adds).
    Usage(Usage),
    Error(ErrorInfo),
    /// The upstream finished cleanly.
    End,
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The last `out.len()` hex digits of `n`, lowercase.
pub fn hex_digits(out: &mut [u8], mut n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for d in out.iter_mut().rev() {
        *d = HEX[(n & 15) as usize];
        n >>= 4;
    }
}

/// 24 random lowercase hex digits, those of a random u64 then a random u32: the body of every
/// id the gateway makes up (request ids, and the ids [`mint_id`] gives answers and items).
pub fn random_hex() -> [u8; 24] {
    let mut digits = [0u8; 24];
    let (high, low) = digits.split_at_mut(16);
    hex_digits(high, fastrand::u64(..));
    hex_digits(low, u64::from(fastrand::u32(..)));
    digits
}

/// A fresh id with a protocol's prefix (`msg_`, `resp_`, `chatcmpl-`, `toolu_`, `fc_`, …).
pub fn mint_id(prefix: &str) -> String {
    // Written without the formatter, the digits pushed at once rather than as 24 `char`s:
    // every translated answer mints one or more, a history of 40 items 40.
    let digits = random_hex();
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    // Hex digits are ASCII.
    id.push_str(std::str::from_utf8(&digits).unwrap_or_default());
    id
}

/// The prefixes of the item ids that can name their answer ([`ItemIds`]): a message's,
/// any other input item's, and an answer's reasoning, function call, custom tool call and
/// local shell call.
const NAMING_PREFIXES: [&str; 6] = ["msg_", "item_", "rs_", "fc_", "ctc_", "lsh_"];

/// Where an answer's output items are numbered from in the ids that name it: input items are
/// numbered from 0, so the two never share an id.
const OUTPUT_PLACE: u32 = 0x8000_0000;

/// Ids for the items of one answer. When the gateway minted the answer's id (`resp_` and 24 hex
/// digits) and keeps the answer, each item's id names it: the item's prefix, those 24 digits and
/// its place as 8 more (input items from 0, output items from `80000000`). A reference to the
/// item then finds the answer that holds it from the id alone ([`answer_named_by`]), with no
/// entry in the store's item index: an index entry for each item would cost a store write per
/// item per turn. Otherwise random ids ([`mint_id`]).
#[derive(Debug, Clone, Copy)]
pub struct ItemIds(Option<[u8; 24]>);

impl ItemIds {
    /// Ids naming the answer `answer_id` when it is one the gateway minted.
    pub fn of(answer_id: &str) -> Self {
        let hex = answer_id
            .strip_prefix("resp_")
            .filter(|h| is_lower_hex(h, 24));
        Self(hex.and_then(|h| h.as_bytes().try_into().ok()))
    }

    /// Random ids, for an answer that is not kept.
    pub fn random() -> Self {
        Self(None)
    }

    /// True when the ids name their answer, so they need no index entry.
    pub fn names_answer(&self) -> bool {
        self.0.is_some()
    }

    /// The id of the input item with `prefix` at `place` in the answer's input.
    pub fn input(&self, prefix: &str, place: usize) -> String {
        // An input of 2^31 items is far beyond any body the gateway reads.
        self.at(prefix, place as u32 & !OUTPUT_PLACE)
    }

    /// The id of the output item with `prefix` at `index` in the answer's output.
    pub fn output(&self, prefix: &str, index: usize) -> String {
        self.at(prefix, OUTPUT_PLACE | (index as u32 & !OUTPUT_PLACE))
    }

    fn at(&self, prefix: &str, place: u32) -> String {
        let Some(answer) = &self.0 else {
            return mint_id(prefix);
        };
        let mut digits = [0u8; 32];
        digits[..24].copy_from_slice(answer);
        hex_digits(&mut digits[24..], u64::from(place));
        // Hex digits are ASCII.
        [prefix, std::str::from_utf8(&digits).unwrap_or_default()].concat()
    }
}

/// The answer an item id made by [`ItemIds`] names, if it is one.
pub fn answer_named_by(id: &str) -> Option<String> {
    let hex = named_digits(id)?;
    Some(["resp_", &hex[..24]].concat())
}

/// Whether `id` has the form of an id made by [`ItemIds`] to name an answer.
pub fn names_an_answer(id: &str) -> bool {
    named_digits(id).is_some()
}

fn named_digits(id: &str) -> Option<&str> {
    // The digits end the id: its length rules out most other ids before any byte is read.
    let at = id.len().checked_sub(32)?;
    let (prefix, hex) = (id.get(..at)?, id.get(at..)?);
    (NAMING_PREFIXES.contains(&prefix) && is_lower_hex(hex, 32)).then_some(hex)
}

fn is_lower_hex(text: &str, len: usize) -> bool {
    // Every byte checked, without stopping at the first bad one: the loop is then done a
    // vector at a time. A continued request checks an id like this for each of its items.
    text.len() == len
        && (text.bytes()).fold(true, |ok, b| ok & matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same ids, from the same random numbers, as the formatter wrote them.
    #[test]
    fn minted_ids_are_the_prefix_and_24_hex_digits() {
        for seed in [0, 1, 7, 0xdead_beef, u64::MAX] {
            fastrand::seed(seed);
            let minted = mint_id("msg_");
            fastrand::seed(seed);
            let formatted = format!("msg_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..));
            assert_eq!(minted, formatted);
            assert_eq!(minted.len(), 28);
        }
        assert!(mint_id("").bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
