//! Anthropic Messages requests: a messages client's body read into the IR through borrowing wire structs, and the IR written as a messages upstream's body.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::JSON_TOOL;
use crate::config::Target;
use crate::error::GatewayError;
use crate::ir::{self, Image, ImageSource, Part, Reasoning, Role, Tool, ToolChoice};
use crate::translate::common::{encoded, push, system_text, unsupported, EMPTY_SCHEMA};
use crate::translate::lax::{self, lax_struct, Loose, Raw};
use crate::translate::tools::{self, HostedTool};

/// Anthropic's default when neither the client nor the model config gives `max_tokens`.
const FALLBACK_MAX_TOKENS: u64 = 4096;

// === the client's body, as far as the decoder reads it ===

lax_struct! {
    /// A messages client's request; fields the gateway does not translate are skipped.
    pub struct MessagesRequest<'a> {
        pub max_tokens: Loose<'a>,
        pub system: Loose<'a, SystemBlock<'a>>,
        pub messages: Loose<'a, MessageIn<'a>>,
        pub tools: Loose<'a, ToolIn<'a>>,
        pub tool_choice: Loose<'a, IgnoredAny, ToolChoiceIn<'a>>,
        pub temperature: Loose<'a>,
        pub top_p: Loose<'a>,
        pub top_k: Loose<'a>,
        pub stop_sequences: Loose<'a, Loose<'a>>,
        pub stream: Loose<'a>,
        pub metadata: Metadata<'a>,
        pub thinking: Loose<'a, IgnoredAny, ThinkingIn<'a>>,
        pub output_config: OutputConfig<'a>,
        pub output_format: OutputFormat<'a>,
    }
}

lax_struct! {
    pub struct SystemBlock<'a> {
        pub text: Loose<'a>,
    }
}

lax_struct! {
    pub struct MessageIn<'a> {
        pub role: Loose<'a>,
        pub content: Loose<'a, Block<'a>>,
    }
}

lax_struct! {
    /// Any content block; each kind reads its own fields.
    pub struct Block<'a> {
        pub kind = "type": Loose<'a>,
        pub text: Loose<'a>,
        pub source: Loose<'a, IgnoredAny, Box<ImageSourceIn<'a>>>,
        pub id: Loose<'a>,
        pub name: Loose<'a>,
        pub input: Raw<'a>,
        pub content: Loose<'a, Block<'a>>,
        pub tool_use_id: Loose<'a>,
        pub is_error: Loose<'a>,
        pub thinking: Loose<'a>,
        pub signature: Loose<'a>,
        pub data: Loose<'a>,
    }
}

lax_struct! {
    pub struct ImageSourceIn<'a> {
        pub kind = "type": Loose<'a>,
        pub media_type: Loose<'a>,
        pub data: Loose<'a>,
        pub url: Loose<'a>,
    }
}

lax_struct! {
    pub struct ToolIn<'a> {
        pub kind = "type": Loose<'a>,
        pub name: Loose<'a>,
        pub description: Loose<'a>,
        pub input_schema: Raw<'a>,
        pub strict: Loose<'a>,
    }
}

lax_struct! {
    pub struct ToolChoiceIn<'a> {
        pub kind = "type": Loose<'a>,
        pub name: Loose<'a>,
        pub disable_parallel_tool_use: Loose<'a>,
    }
}

lax_struct! {
    pub struct Metadata<'a> {
        pub user_id: Loose<'a>,
    }
}

lax_struct! {
    pub struct ThinkingIn<'a> {
        pub kind = "type": Loose<'a>,
        pub budget_tokens: Loose<'a>,
    }
}

lax_struct! {
    pub struct OutputConfig<'a> {
        pub format: OutputFormat<'a>,
    }
}

lax_struct! {
    pub struct OutputFormat<'a> {
        pub schema: Raw<'a>,
    }
}

/// A messages client's replies need nothing from its request but which of its server tools a
/// translated request leaves out.
#[derive(Debug, Clone, Default)]
pub struct ClientContext {
    pub hosted: Vec<HostedTool>,
}

/// What reading a messages upstream's replies needs to remember from the request.
#[derive(Debug, Clone, Default)]
pub struct UpstreamContext {
    /// JSON mode went up as a forced tool; its input comes back as the reply's text.
    pub json_mode: bool,
}

// === messages client → IR ===

fn image_from(
    source: &ImageSourceIn<'_>,
    path: &dyn Fn() -> String,
) -> Result<Image, GatewayError> {
    let at = |field: &str| format!("{}{field}", path());
    let source = match source.kind.as_str() {
        Some("base64") => ImageSource::Base64 {
            media_type: source.media_type.req_str(|| at(".media_type"))?.to_owned(),
            data: source.data.req_str(|| at(".data"))?.to_owned(),
        },
        Some("url") => ImageSource::Url(source.url.req_str(|| at(".url"))?.to_owned()),
        _ => {
            return Err(GatewayError::invalid(
                at(".type"),
                "image sources must be base64 or url",
            ))
        }
    };
    Ok(Image {
        source,
        detail: None,
    })
}

/// A tool call's input as the compact JSON text `Value` writes (keys sorted), so the arguments
/// another protocol receives do not depend on how the client spaced its JSON. `input` is its
/// raw text, absent when the block has none (read as `{}`).
pub(super) fn arguments_of(input: Option<&str>) -> String {
    match input {
        None => "{}".to_owned(),
        Some(raw) => Canonical::of(raw).unwrap_or_else(|| {
            serde_json::from_str::<Value>(raw).map_or_else(|_| raw.to_owned(), |v| v.to_string())
        }),
    }
}

/// The text `Value::to_string` would write for valid JSON, found without building the tree when
/// that is only a matter of dropping whitespace: keys already sorted and unique, no escapes, no
/// numbers but small integers. Anything else answers `None` and goes through a `Value`.
struct Canonical<'a> {
    s: &'a [u8],
    at: usize,
    out: Vec<u8>,
}

impl<'a> Canonical<'a> {
    fn of(text: &'a str) -> Option<String> {
        let mut c = Self {
            s: text.as_bytes(),
            at: 0,
            out: Vec::with_capacity(text.len()),
        };
        c.value()?;
        c.space();
        if c.at != c.s.len() {
            return None;
        }
        String::from_utf8(c.out).ok()
    }

    fn space(&mut self) {
        while self
            .s
            .get(self.at)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    /// Copies the next byte if it is `b`.
    fn expect(&mut self, b: u8) -> Option<()> {
        self.space();
        (self.s.get(self.at) == Some(&b)).then(|| {
            self.out.push(b);
            self.at += 1;
        })
    }

    fn peek(&mut self) -> Option<u8> {
        self.space();
        self.s.get(self.at).copied()
    }

    /// A string without escapes, copied; its contents are returned for key ordering.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.at;
        let len = self.s[start..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\')?;
        let body = &self.s[start..start + len];
        if self.s[start + len] == b'\\' {
            return None;
        }
        self.out.extend_from_slice(body);
        self.out.push(b'"');
        self.at = start + len + 1;
        Some(body)
    }

    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'{' => {
                self.expect(b'{')?;
                if self.expect(b'}').is_some() {
                    return Some(());
                }
                let mut previous: Option<&[u8]> = None;
                loop {
                    let key = self.string()?;
                    // `Value` keeps keys sorted and one of each: any other order is rewritten.
                    if previous.is_some_and(|p| p >= key) {
                        return None;
                    }
                    previous = Some(key);
                    self.expect(b':')?;
                    self.value()?;
                    if self.expect(b',').is_none() {
                        return self.expect(b'}');
                    }
                }
            }
            b'[' => {
                self.expect(b'[')?;
                if self.expect(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.value()?;
                    if self.expect(b',').is_none() {
                        return self.expect(b']');
                    }
                }
            }
            b'"' => self.string().map(|_| ()),
            b't' | b'f' | b'n' => {
                let len = self.s[self.at..]
                    .iter()
                    .position(|b| !b.is_ascii_alphabetic())
                    .unwrap_or(self.s.len() - self.at);
                let word = &self.s[self.at..self.at + len];
                if !matches!(word, b"true" | b"false" | b"null") {
                    return None;
                }
                self.out.extend_from_slice(word);
                self.at += len;
                Some(())
            }
            _ => {
                let len = self.s[self.at..]
                    .iter()
                    .position(|b| !(b.is_ascii_digit() || *b == b'-'))
                    .unwrap_or(self.s.len() - self.at);
                let number = &self.s[self.at..self.at + len];
                let digits = number.strip_prefix(b"-").unwrap_or(number);
                // Fractions, exponents, `-0` and integers that may not fit 64 bits are rewritten.
                let next = self.s.get(self.at + len);
                if digits.is_empty()
                    || digits.len() > 18
                    || (digits[0] == b'0' && (digits.len() > 1 || number.len() > digits.len()))
                    || !digits.iter().all(u8::is_ascii_digit)
                    || matches!(next, Some(b'.' | b'e' | b'E'))
                {
                    return None;
                }
                self.out.extend_from_slice(number);
                self.at += len;
                Some(())
            }
        }
    }
}

fn blocks(
    content: &Loose<'_, Block<'_>>,
    path: &dyn Fn() -> String,
) -> Result<Vec<Part>, GatewayError> {
    let list = match content {
        Loose::Str(s) => return Ok(vec![Part::Text(s.clone().into_owned())]),
        Loose::Arr(a) => a,
        _ => {
            let p = path();
            return Err(GatewayError::invalid(
                &p,
                format!("`{p}` must be a string or an array of content blocks"),
            ));
        }
    };
    let mut parts = Vec::with_capacity(list.len());
    for (i, b) in list.iter().enumerate() {
        let bpath = || format!("{}[{i}]", path());
        let at = |field: &str| format!("{}{field}", bpath());
        match b.kind.as_str() {
            Some("text") => parts.push(Part::Text(b.text.req_str(|| at(".text"))?.to_owned())),
            Some("image") => {
                // A source that is not an object reads as one with no fields.
                let fallback = ImageSourceIn::default();
                let source = b.source.as_object().map_or(&fallback, |s| &**s);
                parts.push(Part::Image(image_from(source, &|| at(".source"))?));
            }
            Some("tool_use") => parts.push(Part::ToolCall {
                id: b.id.req_str(|| at(".id"))?.to_owned(),
                name: b.name.req_str(|| at(".name"))?.to_owned(),
                arguments: arguments_of(b.input.0.map(RawValue::get)),
            }),
            Some("tool_result") => {
                let content = if b.content.is_none() {
                    Vec::new()
                } else {
                    blocks(&b.content, &|| at(".content"))?
                };
                parts.push(Part::ToolResult {
                    call_id: b.tool_use_id.req_str(|| at(".tool_use_id"))?.to_owned(),
                    content,
                    is_error: b.is_error.as_bool().unwrap_or(false),
                });
            }
            Some("thinking") => parts.push(Part::Reasoning(Reasoning {
                text: b.thinking.as_str().unwrap_or("").to_owned(),
                signature: b
                    .signature
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
                redacted: None,
            })),
            Some("redacted_thinking") => parts.push(Part::Reasoning(Reasoning {
                redacted: b.data.as_str().map(str::to_owned),
                ..Reasoning::default()
            })),
            Some(other) => {
                return Err(unsupported(
                    &at(".type"),
                    &format!("{other:?} blocks have no equivalent there"),
                ))
            }
            None => return Err(GatewayError::invalid(at(".type"), "`type` is required")),
        }
    }
    Ok(parts)
}

/// Reads and checks a messages request into the IR, refusing what the IR cannot hold.
pub fn request_to_ir(body: &[u8]) -> Result<(ir::Request, ClientContext), GatewayError> {
    let v: MessagesRequest = lax::parse_object(body)?;
    let mut r = ir::Request {
        max_tokens: Some(
            v.max_tokens
                .get_u64("max_tokens", 1)?
                .ok_or_else(|| GatewayError::invalid("max_tokens", "`max_tokens` is required"))?,
        ),
        ..ir::Request::default()
    };
    match &v.system {
        Loose::Absent | Loose::Null => {}
        Loose::Str(s) => r.system.push(s.clone().into_owned()),
        Loose::Arr(a) => {
            for (i, b) in a.iter().enumerate() {
                r.system
                    .push(b.text.req_str(|| format!("system[{i}].text"))?.to_owned());
            }
        }
        _ => {
            return Err(GatewayError::invalid(
                "system",
                "`system` must be a string or an array of text blocks",
            ))
        }
    }
    let messages = v
        .messages
        .get_array(|| "messages".into())?
        .ok_or_else(|| GatewayError::invalid("messages", "`messages` is required"))?;
    if messages.is_empty() {
        return Err(GatewayError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            _ => {
                return Err(GatewayError::invalid(
                    format!("messages[{i}].role"),
                    "`role` must be user or assistant",
                ))
            }
        };
        if matches!(m.content, Loose::Absent) {
            return Err(GatewayError::invalid(
                format!("messages[{i}].content"),
                "`content` is required",
            ));
        }
        let parts = blocks(&m.content, &|| format!("messages[{i}].content"))?;
        push(&mut r.messages, role, parts);
    }
    let tools = v.tools.get_array(|| "tools".into())?;
    let mut ctx = ClientContext::default();
    let mut server_tools: Vec<&str> = Vec::new();
    for (i, t) in tools.unwrap_or(&[]).iter().enumerate() {
        let at = |field: &str| format!("tools[{i}].{field}");
        if let Some(kind) = t.kind.as_str().filter(|k| *k != "custom") {
            match tools::anthropic_kind(kind) {
                // Client-run tools whose schema Anthropic fixes: the model elsewhere needs it spelt out.
                tools::AnthropicKind::Fixed {
                    schema,
                    description,
                } => r.tools.push(Tool {
                    name: t.name.req_str(|| at("name"))?.to_owned(),
                    description: Some(description.to_owned()),
                    parameters: ir::RawJson(lax::raw_const(schema)?),
                    strict: None,
                }),
                tools::AnthropicKind::Server => {
                    server_tools.extend(t.name.as_str());
                    ctx.hosted.push(HostedTool {
                        param: format!("tools[{i}]"),
                        kind: kind.to_owned(),
                    })
                }
            }
            continue;
        }
        r.tools.push(Tool {
            name: t.name.req_str(|| at("name"))?.to_owned(),
            description: t
                .description
                .get_str(|| at("description"))?
                .map(str::to_owned),
            parameters: match t.input_schema.0 {
                Some(s) => s.into(),
                None => ir::RawJson(lax::raw_const(EMPTY_SCHEMA)?),
            },
            strict: t.strict.get_bool(|| at("strict"))?,
        });
    }
    if !v.tool_choice.is_none() {
        // Anything but an object reads as one with no fields: `auto`.
        let fallback = ToolChoiceIn::default();
        let tc = v.tool_choice.as_object().unwrap_or(&fallback);
        r.tool_choice = Some(match tc.kind.as_str() {
            Some("none") => ToolChoice::None,
            Some("any") => ToolChoice::Required,
            Some("tool") => match tc.name.req_str(|| "tool_choice.name".into())? {
                // A server tool forced: the upstream cannot run it, so the model just may use tools.
                name if server_tools.contains(&name) => ToolChoice::Auto,
                name => ToolChoice::Named(name.to_owned()),
            },
            _ => ToolChoice::Auto,
        });
        if let Some(d) = tc.disable_parallel_tool_use.as_bool() {
            r.parallel_tool_calls = Some(!d);
        }
    }
    r.temperature = v.temperature.get_f64_in("temperature", 0.0, 1.0)?;
    r.top_p = v.top_p.get_f64_in("top_p", 0.0, 1.0)?;
    r.top_k = v.top_k.get_u64("top_k", 0)?;
    r.stop = v.stop_sequences.string_list("stop_sequences")?;
    r.stream = v.stream.get_bool(|| "stream".into())?.unwrap_or(false);
    r.user = v.metadata.user_id.as_str().map(str::to_owned);
    if !v.thinking.is_none() {
        let fallback = ThinkingIn::default();
        let th = v.thinking.as_object().unwrap_or(&fallback);
        r.thinking = Some(match th.kind.as_str() {
            Some("enabled") => ir::Thinking {
                enabled: true,
                budget_tokens: th.budget_tokens.get_u64("budget_tokens", 1)?,
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
    if let Some(schema) = v.output_config.format.schema.0.or(v.output_format.schema.0) {
        r.response_format = Some(ir::ResponseFormat::JsonSchema {
            name: "structured_output".into(),
            description: None,
            schema: schema.into(),
            strict: Some(true),
        });
    }
    Ok((r, ctx))
}

// === the upstream's body ===

#[derive(Serialize)]
struct MessagesRequestOut<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<Cow<'a, str>>,
    messages: Vec<MessageOut<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ToolOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoiceOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<AnthropicThinking>,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<MetadataOut<'a>>,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    role: &'static str,
    content: Vec<BlockOut<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockOut<'a> {
    Text {
        text: &'a str,
    },
    Image {
        source: ImageSourceOut<'a>,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        input: ObjectOut<'a>,
    },
    ToolResult {
        tool_use_id: Cow<'a, str>,
        content: ToolResultOut<'a>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ImageSourceOut<'a> {
    Base64 { media_type: &'a str, data: &'a str },
    Url { url: &'a str },
}

#[derive(Serialize)]
#[serde(untagged)]
enum ToolResultOut<'a> {
    Text(&'a str),
    Blocks(Vec<BlockOut<'a>>),
}

/// A JSON object given as text, or the gateway's own stand-in for one.
#[derive(Serialize)]
#[serde(untagged)]
enum ObjectOut<'a> {
    Given(&'a RawValue),
    Schema(ObjectSchema),
    Empty(Empty),
}

/// `{"type": "object", "properties": {}}`, open to any property when `additional` is set.
#[derive(Serialize)]
struct ObjectSchema {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(
        rename = "additionalProperties",
        skip_serializing_if = "Option::is_none"
    )]
    additional: Option<bool>,
    properties: Empty,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct ToolOut<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    input_schema: ObjectOut<'a>,
}

#[derive(Serialize)]
struct ToolChoiceOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    disable_parallel_tool_use: Option<bool>,
}

impl ToolChoiceOut<'_> {
    fn mode(kind: &'static str) -> Self {
        Self {
            kind,
            name: None,
            disable_parallel_tool_use: None,
        }
    }
}

#[derive(Serialize)]
struct MetadataOut<'a> {
    user_id: &'a str,
}

/// Anthropic's thinking switch, also spoken by chat servers configured for it.
#[derive(Debug, Serialize)]
pub struct AnthropicThinking {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget_tokens: Option<u64>,
}

impl AnthropicThinking {
    /// Writes it as serde writes it.
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut o = crate::json::write::Object::open(out);
        o.str("type", self.kind);
        o.some_u64("budget_tokens", self.budget_tokens);
        o.close();
    }

    /// `{"type": "enabled"}` or `{"type": "disabled"}`, no budget.
    pub fn switch(on: bool) -> Self {
        Self {
            kind: if on { "enabled" } else { "disabled" },
            budget_tokens: None,
        }
    }

    pub fn enabled(budget_tokens: u64) -> Self {
        Self {
            kind: "enabled",
            budget_tokens: Some(budget_tokens),
        }
    }
}

// === IR → messages upstream ===

/// Anthropic accepts tool ids of `[a-zA-Z0-9_-]` only; other characters become `_`, the same way
/// for a call and its result so they still pair up.
fn sanitize_id(id: &str) -> Cow<'_, str> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if id.chars().all(ok) {
        return Cow::Borrowed(id);
    }
    Cow::Owned(id.chars().map(|c| if ok(c) { c } else { '_' }).collect())
}

fn block_of(p: &Part) -> Option<BlockOut<'_>> {
    Some(match p {
        Part::Text(t) if t.is_empty() => return None,
        Part::Text(t) => BlockOut::Text { text: t },
        Part::Image(img) => BlockOut::Image {
            source: match &img.source {
                ImageSource::Base64 { media_type, data } => {
                    ImageSourceOut::Base64 { media_type, data }
                }
                ImageSource::Url(url) => ImageSourceOut::Url { url },
            },
        },
        Part::ToolCall {
            id,
            name,
            arguments,
        } => {
            // The model wrote the arguments; unparsable text becomes {} rather than a refused request.
            let input = serde_json::from_str::<&RawValue>(arguments)
                .ok()
                .filter(|raw| raw.get().starts_with('{'))
                .map_or(ObjectOut::Empty(Empty {}), ObjectOut::Given);
            BlockOut::ToolUse {
                id: sanitize_id(id),
                name,
                input,
            }
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => {
            let inner: Vec<BlockOut> = content.iter().filter_map(block_of).collect();
            let content = match inner.as_slice() {
                [BlockOut::Text { text }] => ToolResultOut::Text(text),
                _ => ToolResultOut::Blocks(inner),
            };
            BlockOut::ToolResult {
                tool_use_id: sanitize_id(call_id),
                content,
                is_error: *is_error,
            }
        }
        // Only genuine signed thinking goes back to Anthropic; unsigned reasoning would be refused.
        Part::Reasoning(r) => match (&r.signature, &r.redacted) {
            (Some(signature), _) => BlockOut::Thinking {
                thinking: &r.text,
                signature,
            },
            (None, Some(data)) => BlockOut::RedactedThinking { data },
            (None, None) => return None,
        },
    })
}

fn empty_schema(additional: Option<bool>) -> ObjectOut<'static> {
    ObjectOut::Schema(ObjectSchema {
        kind: "object",
        additional,
        properties: Empty {},
    })
}

/// Builds the messages request body for an upstream from the IR.
pub fn ir_to_request(
    r: &ir::Request,
    upstream_model: &str,
    target: &Target,
) -> Result<(Vec<u8>, UpstreamContext), GatewayError> {
    let mut max_tokens = r
        .max_tokens
        .or(target.default_max_tokens.map(u64::from))
        .unwrap_or(FALLBACK_MAX_TOKENS);
    let mut messages: Vec<MessageOut> = Vec::with_capacity(r.messages.len());
    for m in &r.messages {
        let mut content = Vec::with_capacity(m.content.len());
        // Tool results first in a user turn, as Anthropic requires after tool_use.
        if m.role == Role::User {
            let is_result = |p: &&Part| matches!(p, Part::ToolResult { .. });
            content.extend(m.content.iter().filter(is_result).filter_map(block_of));
            content.extend(
                m.content
                    .iter()
                    .filter(|p| !is_result(p))
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
            Some(last) if last.role == role => last.content.extend(content),
            _ => messages.push(MessageOut { role, content }),
        }
    }
    let mut tools: Vec<ToolOut> = r
        .tools
        .iter()
        .map(|t| ToolOut {
            name: &t.name,
            description: t.description.as_deref(),
            input_schema: if t.parameters.is_object() {
                ObjectOut::Given(t.parameters.as_raw())
            } else {
                empty_schema(None)
            },
        })
        .collect();
    let mut tool_choice = r.tool_choice.as_ref().map(|tc| match tc {
        ToolChoice::None => ToolChoiceOut::mode("none"),
        ToolChoice::Auto => ToolChoiceOut::mode("auto"),
        ToolChoice::Required => ToolChoiceOut::mode("any"),
        ToolChoice::Named(n) => ToolChoiceOut {
            name: Some(n),
            ..ToolChoiceOut::mode("tool")
        },
    });
    let thinking_on = r.thinking.as_ref().is_some_and(|t| t.enabled);
    // JSON mode: a forced tool whose input schema is the wanted schema; its input comes back as text.
    let json_schema = match &r.response_format {
        Some(ir::ResponseFormat::JsonObject) => Some(empty_schema(Some(true))),
        Some(ir::ResponseFormat::JsonSchema { schema, .. }) => {
            Some(ObjectOut::Given(schema.as_raw()))
        }
        _ => None,
    };
    let json_mode = json_schema.is_some();
    if let Some(schema) = json_schema {
        tools.push(ToolOut {
            name: JSON_TOOL,
            description: Some("Respond with a JSON object matching the input schema."),
            input_schema: schema,
        });
        // Anthropic refuses forced tool use together with thinking; then the tool is only offered.
        tool_choice = Some(if thinking_on {
            ToolChoiceOut::mode("auto")
        } else {
            ToolChoiceOut {
                name: Some(JSON_TOOL),
                ..ToolChoiceOut::mode("tool")
            }
        });
    }
    if r.parallel_tool_calls == Some(false) && !tools.is_empty() {
        let tc = tool_choice.get_or_insert_with(|| ToolChoiceOut::mode("auto"));
        if tc.kind != "none" {
            tc.disable_parallel_tool_use = Some(true);
        }
    }
    let thinking = r.thinking.as_ref().map(|th| {
        if th.enabled {
            let b = crate::thinking::anthropic_budget(
                th.budget_tokens,
                th.effort.as_deref(),
                Some(max_tokens),
                None,
            );
            if let Some(raised) = b.raised_max_tokens {
                max_tokens = raised;
            }
            AnthropicThinking::enabled(b.budget_tokens)
        } else {
            AnthropicThinking::switch(false)
        }
    });
    let out = MessagesRequestOut {
        model: upstream_model,
        system: system_text(&r.system),
        messages,
        tools,
        tool_choice,
        thinking,
        max_tokens,
        // Anthropic's range is [0, 1]; clients of the other protocols may send up to 2.
        temperature: r.temperature.map(|t| t.clamp(0.0, 1.0)),
        top_p: r.top_p,
        top_k: r.top_k,
        stop_sequences: &r.stop,
        stream: r.stream.then_some(true),
        metadata: r.user.as_deref().map(|user_id| MetadataOut { user_id }),
    };
    Ok((encoded(&out)?, UpstreamContext { json_mode }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::{Canonical, MessagesRequest};
    use crate::translate::hand::check;

    fn agrees(text: &[u8]) -> bool {
        check::agrees::<MessagesRequest<'_>>(text)
    }

    /// Requests as agents write them: Claude Code's (system blocks with cache control, tools,
    /// thinking, a tool round trip), an image, and odd but accepted shapes.
    const REQUESTS: [&str; 4] = [
        r#"{"model":"claude-sonnet-4-5","max_tokens":32000,"system":[{"type":"text","text":"You are Claude Code, Anthropic's official CLI.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"List the files.\n"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"I should run ls.","signature":"EqQBCkYIBRgCKkB"},{"type":"tool_use","id":"toolu_01","name":"Bash","input":{"command":"ls -la","description":"List files"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":"a.txt\nb.txt","is_error":false}]}],"tools":[{"name":"Bash","description":"Runs a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}},{"type":"web_search_20250305","name":"web_search","max_uses":5}],"tool_choice":{"type":"auto","disable_parallel_tool_use":true},"temperature":1,"metadata":{"user_id":"user_abc_account__session_1"},"thinking":{"type":"enabled","budget_tokens":31999},"stream":true}"#,
        r#"{"model":"mock-gpt","max_tokens":64,"system":"You are terse.","messages":[{"role":"user","content":"Say hello in five words."}]}"#,
        r#"{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}},{"type":"text","text":"caf\u00e9 — 日本"}]}],"stop_sequences":["\n\nHuman:","END"],"top_p":0.9,"top_k":5,"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}}"#,
        " {\n \"model\" : \"m\" , \"max_tokens\" : 1.5e1 , \"system\" : null , \"messages\" : [ { \"role\" : \"assistant\" , \"content\" : [ { \"type\" : \"redacted_thinking\" , \"data\" : \"abc\" } ] } ] , \"tool_choice\" : \"any\" , \"thinking\" : [ 1 ] , \"metadata\" : 7 , \"extra\" : { \"deep\" : [ [ [ { } ] ] ] } }\n",
    ];

    #[test]
    fn requests_as_agents_write_them_are_read_by_hand_as_serde_reads_them() {
        check::all_read(REQUESTS, agrees);
        let (ir, ctx) = super::request_to_ir(REQUESTS[0].as_bytes()).unwrap();
        assert_eq!(ir.max_tokens, Some(32000));
        assert_eq!(ir.messages.len(), 3);
        assert_eq!(ir.tools.len(), 1);
        assert_eq!(ctx.hosted.len(), 1);
        assert!(ir.stream);
    }

    #[test]
    fn the_fixture_requests_are_read_by_hand_as_serde_reads_them() {
        check::all_read(check::fixture_requests("messages"), agrees);
    }

    /// Values serde's read refuses, where a member is read: the hand reader leaves them to
    /// serde, which names them. Where a member is skipped, both accept them.
    #[test]
    fn what_serde_refuses_is_refused_where_serde_reads_it() {
        check::refused_where_read(
            &[
                (r#"{"max_tokens":{bad}}"#, false),
                (r#"{"messages":[{"content":{bad}}]}"#, false),
                (r#"{"tool_choice":{"name":{bad}}}"#, false),
                (
                    r#"{"messages":[{"content":[{"type":"image","source":{"data":{bad}}}]}]}"#,
                    false,
                ),
                (r#"{"metadata":{bad}}"#, false),
                // A schema is kept as its text, which serde's raw reader checks no further.
                (r#"{"tools":[{"input_schema":{"a":{bad}}}]}"#, true),
                (r#"{"model":{bad}}"#, true),
                (r#"{"messages":[{"cache_control":[{bad}]}]}"#, true),
            ],
            agrees,
            |text| serde_json::from_str::<MessagesRequest<'_>>(text).is_ok(),
        );
    }

    /// serde reads the keys of an object it visits as a map (an object where a scalar is
    /// read), so a lone surrogate fails there; in a skipped value (an unknown member, an
    /// array's element) it passes.
    #[test]
    fn keys_are_read_where_serde_reads_them() {
        for (text, read) in [
            (r#"{"model":{"\ud800":1}}"#, true),
            (r#"{"max_tokens":{"\ud800":1}}"#, false),
            (r#"{"messages":[{"content":{"\ud800":1}}]}"#, false),
            (r#"{"tool_choice":[{"\ud800":1}]}"#, true),
            (r#"{"max_tokens":[{"\ud800":1}]}"#, true),
        ] {
            assert_eq!(agrees(text.as_bytes()), read, "{text}");
            assert_eq!(
                serde_json::from_str::<MessagesRequest<'_>>(text).is_ok(),
                read,
                "{text}"
            );
        }
        assert!(agrees(
            br#"{"model":[{"\ud800":1}],"max_tokens":{"a":{"\ud800":1}}}"#
        ));
    }

    #[test]
    fn no_one_byte_edit_makes_the_reader_differ_from_serde() {
        let read = check::one_byte_edits(&REQUESTS, agrees);
        // Most edits leave valid JSON the reader is sure of: the reader, not serde, was tested.
        assert!(read > 15_000, "only {read} edits were read by hand");
    }

    const KEYS: [&str; 24] = [
        "max_tokens",
        "system",
        "messages",
        "tools",
        "tool_choice",
        "stop_sequences",
        "stream",
        "metadata",
        "thinking",
        "output_config",
        "output_format",
        "text",
        "role",
        "content",
        "type",
        "source",
        "input",
        "is_error",
        "signature",
        "data",
        "input_schema",
        "user_id",
        "format",
        "schema",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

        /// Objects made of the request's keys at every level, with values of every kind: the
        /// reader never answers otherwise than serde.
        #[test]
        fn made_up_requests_are_read_as_serde_reads_them(seed: u64) {
            agrees(check::made_up(seed, 5, &KEYS, &check::SCALARS).as_bytes());
        }
    }

    #[test]
    fn the_fast_path_takes_only_what_it_can_write_exactly() {
        assert_eq!(
            Canonical::of(r#" { "a" : [1, -2, "x"], "b" : {"c": null} } "#).as_deref(),
            Some(r#"{"a":[1,-2,"x"],"b":{"c":null}}"#)
        );
        for other in [
            r#"{"b":1,"a":2}"#,
            r#"{"a":1,"a":1}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1e2}"#,
            r#"{"a":-0}"#,
            r#"{"a":12345678901234567890}"#,
            r#"{"a":"\n"}"#,
        ] {
            assert_eq!(Canonical::of(other), None, "{other}");
        }
    }
}
