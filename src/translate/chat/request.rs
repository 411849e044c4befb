//! Chat Completions requests: a chat client's body read into the IR through borrowing wire structs, and the IR written as a chat upstream's body.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::config::{Target, ThinkingStyle};
use crate::error::GatewayError;
use crate::ir::{self, Image, ImageSource, Part, Reasoning, Role, Tool, ToolChoice};
use crate::json::write::{array, Object};
use crate::json::write_json_str;
use crate::translate::common::{push, system_text, tool_result_text, unsupported, EMPTY_SCHEMA};
use crate::translate::lax::{self, lax_struct, Loose, Raw};
use crate::translate::messages::AnthropicThinking;

// === the client's body, as far as the decoder reads it ===

lax_struct! {
    /// A chat client's request; fields the gateway does not translate are skipped.
    pub struct ChatRequest<'a> {
        pub n: Loose<'a>,
        pub logprobs: Loose<'a>,
        pub messages: Loose<'a, ChatMessage<'a>>,
        pub tools: Loose<'a, ChatTool<'a>>,
        pub tool_choice: Loose<'a, IgnoredAny, NamedChoice<'a>>,
        pub parallel_tool_calls: Loose<'a>,
        pub max_completion_tokens: Loose<'a>,
        pub max_tokens: Loose<'a>,
        pub temperature: Loose<'a>,
        pub top_p: Loose<'a>,
        pub top_k: Loose<'a>,
        pub stop: Loose<'a, Loose<'a>>,
        pub stream: Loose<'a>,
        pub stream_options: StreamOptions<'a>,
        pub user: Loose<'a>,
        pub reasoning_effort: Loose<'a>,
        pub chat_template_kwargs: TemplateKwargs<'a>,
        pub enable_thinking: Loose<'a>,
        pub thinking: ThinkingSwitch<'a>,
        pub response_format: Loose<'a, IgnoredAny, ResponseFormat<'a>>,
    }
}

lax_struct! {
    pub struct ChatMessage<'a> {
        pub role: Loose<'a>,
        pub content: Content<'a>,
        pub tool_call_id: Loose<'a>,
        pub thinking_blocks: Loose<'a, ThinkingBlock<'a>>,
        pub reasoning_content: Loose<'a>,
        pub reasoning: Loose<'a>,
        pub tool_calls: Loose<'a, ToolCall<'a>>,
    }
}

/// A message's `content`: a string or an array of parts.
pub type Content<'a> = Loose<'a, ContentPart<'a>>;

lax_struct! {
    pub struct ContentPart<'a> {
        pub kind = "type": Loose<'a>,
        pub text: Loose<'a>,
        pub refusal: Loose<'a>,
        pub image_url: ImageUrl<'a>,
    }
}

lax_struct! {
    pub struct ImageUrl<'a> {
        pub url: Loose<'a>,
        pub detail: Loose<'a>,
    }
}

lax_struct! {
    /// LiteLLM's round trip of Anthropic thinking through a chat conversation.
    pub struct ThinkingBlock<'a> {
        pub kind = "type": Loose<'a>,
        pub thinking: Loose<'a>,
        pub signature: Loose<'a>,
        pub data: Loose<'a>,
    }
}

lax_struct! {
    pub struct ToolCall<'a> {
        pub id: Loose<'a>,
        pub function: FunctionCall<'a>,
    }
}

lax_struct! {
    pub struct FunctionCall<'a> {
        pub name: Loose<'a>,
        pub arguments: Loose<'a>,
    }
}

lax_struct! {
    pub struct ChatTool<'a> {
        pub function: FunctionDef<'a>,
    }
}

lax_struct! {
    pub struct FunctionDef<'a> {
        pub name: Loose<'a>,
        pub description: Loose<'a>,
        pub parameters: Raw<'a>,
        pub strict: Loose<'a>,
    }
}

lax_struct! {
    /// `{"type": "function", "function": {"name": …}}`; only the name is read.
    pub struct NamedChoice<'a> {
        pub function: FunctionCall<'a>,
    }
}

lax_struct! {
    pub struct StreamOptions<'a> {
        pub include_usage: Loose<'a>,
    }
}

lax_struct! {
    pub struct TemplateKwargs<'a> {
        pub enable_thinking: Loose<'a>,
    }
}

lax_struct! {
    pub struct ThinkingSwitch<'a> {
        pub kind = "type": Loose<'a>,
        pub budget_tokens: Loose<'a>,
    }
}

lax_struct! {
    pub struct ResponseFormat<'a> {
        pub kind = "type": Loose<'a>,
        pub json_schema: JsonSchemaSpec<'a>,
    }
}

lax_struct! {
    pub struct JsonSchemaSpec<'a> {
        pub name: Loose<'a>,
        pub description: Loose<'a>,
        pub schema: Raw<'a>,
        pub strict: Loose<'a>,
    }
}

/// What a chat client's replies need to remember from its request.
#[derive(Debug, Clone, Default)]
pub struct ClientContext {
    /// `stream_options.include_usage`: the stream ends with a usage chunk.
    pub include_usage: bool,
}

/// A chat upstream needs nothing from the request to read its replies.
#[derive(Debug, Clone, Default)]
pub struct UpstreamContext;

// === chat client → IR ===

fn text_of_parts(content: &Content<'_>, path: impl Fn() -> String) -> Result<String, GatewayError> {
    match content {
        Loose::Absent | Loose::Null => Ok(String::new()),
        Loose::Str(s) => Ok(s.clone().into_owned()),
        Loose::Arr(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                let Some(t) = p.text.as_str().or_else(|| p.refusal.as_str()) else {
                    return Err(GatewayError::invalid(
                        format!("{}[{i}]", path()),
                        "only text parts are allowed here",
                    ));
                };
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(t);
            }
            Ok(out)
        }
        _ => Err(GatewayError::invalid(
            path(),
            "must be a string or an array of parts",
        )),
    }
}

fn user_parts(content: &Content<'_>, path: impl Fn() -> String) -> Result<Vec<Part>, GatewayError> {
    match content {
        Loose::Str(s) => Ok(vec![Part::Text(s.clone().into_owned())]),
        Loose::Arr(parts) => parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let at = |field: &str| format!("{}[{i}]{field}", path());
                match p.kind.as_str() {
                    Some("text") => Ok(Part::Text(p.text.req_str(|| at(".text"))?.to_owned())),
                    Some("image_url") => {
                        let url = p.image_url.url.req_str(|| at(".image_url.url"))?;
                        Ok(Part::Image(Image {
                            source: ImageSource::from_url(url),
                            detail: p
                                .image_url
                                .detail
                                .get_str(|| at(".image_url.detail"))?
                                .map(str::to_owned),
                        }))
                    }
                    Some(other) => Err(unsupported(
                        &at(".type"),
                        &format!("{other:?} parts have no equivalent there"),
                    )),
                    None => Err(GatewayError::invalid(at(".type"), "`type` is required")),
                }
            })
            .collect(),
        _ => Err(GatewayError::invalid(
            path(),
            "must be a string or an array of parts",
        )),
    }
}

fn assistant_parts(m: &ChatMessage<'_>, i: usize) -> Result<Vec<Part>, GatewayError> {
    let mut parts = Vec::new();
    // Signed thinking round-trips through `thinking_blocks` (the convention LiteLLM uses).
    if let Some(blocks) = m.thinking_blocks.as_array() {
        for b in blocks {
            let sig = b.signature.as_str().filter(|s| !s.is_empty());
            match b.kind.as_str() {
                Some("thinking") => parts.push(Part::Reasoning(Reasoning {
                    text: b.thinking.as_str().unwrap_or("").to_owned(),
                    signature: sig.map(str::to_owned),
                    redacted: None,
                })),
                Some("redacted_thinking") => parts.push(Part::Reasoning(Reasoning {
                    redacted: b.data.as_str().map(str::to_owned),
                    ..Reasoning::default()
                })),
                _ => {}
            }
        }
    } else {
        // `reasoning_content` wins whenever it is present, even as null.
        let rc = match m.reasoning_content {
            Loose::Absent => m.reasoning.as_str(),
            ref rc => rc.as_str(),
        };
        if let Some(rc) = rc {
            parts.push(Part::Reasoning(Reasoning {
                text: rc.to_owned(),
                ..Reasoning::default()
            }));
        }
    }
    let text = text_of_parts(&m.content, || format!("messages[{i}].content"))?;
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    for (j, c) in m.tool_calls.as_array().unwrap_or(&[]).iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].tool_calls[{j}]{field}");
        parts.push(Part::ToolCall {
            id: c.id.req_str(|| at(".id"))?.to_owned(),
            name: c.function.name.req_str(|| at(".function.name"))?.to_owned(),
            arguments: c
                .function
                .arguments
                .get_str(|| at(".function.arguments"))?
                .unwrap_or("{}")
                .to_owned(),
        });
    }
    Ok(parts)
}

/// Reads a chat request (already checked by `validate::chat`) into the IR, refusing what the IR cannot hold.
pub fn request_to_ir(body: &[u8]) -> Result<(ir::Request, ClientContext), GatewayError> {
    // A body that is not an object reads as an empty one: `validate::chat` refused it before.
    let v: ChatRequest = lax::parse(body)?;
    if v.n.get_u64("n", 1)?.is_some_and(|n| n > 1) {
        return Err(unsupported("n", "only one choice per request"));
    }
    if v.logprobs.get_bool(|| "logprobs".into())? == Some(true) {
        return Err(unsupported(
            "logprobs",
            "log probabilities are not available",
        ));
    }
    let mut r = ir::Request::default();
    let messages = v.messages.get_array(|| "messages".into())?;
    for (i, m) in messages.unwrap_or(&[]).iter().enumerate() {
        let content = || format!("messages[{i}].content");
        match m.role.as_str() {
            Some("system" | "developer") => r.system.push(text_of_parts(&m.content, content)?),
            Some("user") => push(
                &mut r.messages,
                Role::User,
                user_parts(&m.content, content)?,
            ),
            Some("tool") => {
                let call_id = m
                    .tool_call_id
                    .req_str(|| format!("messages[{i}].tool_call_id"))?
                    .to_owned();
                let text = text_of_parts(&m.content, content)?;
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
            Some("assistant") => push(&mut r.messages, Role::Assistant, assistant_parts(m, i)?),
            _ => {
                return Err(GatewayError::invalid(
                    format!("messages[{i}].role"),
                    "unknown role",
                ))
            }
        }
    }
    let tools = v.tools.get_array(|| "tools".into())?;
    for (i, tool) in tools.unwrap_or(&[]).iter().enumerate() {
        let f = &tool.function;
        let at = |field: &str| format!("tools[{i}].function.{field}");
        r.tools.push(Tool {
            name: f.name.req_str(|| at("name"))?.to_owned(),
            description: f
                .description
                .get_str(|| at("description"))?
                .map(str::to_owned),
            parameters: match f.parameters.0 {
                Some(p) => p.into(),
                None => ir::RawJson(lax::raw_const(EMPTY_SCHEMA)?),
            },
            strict: f.strict.get_bool(|| at("strict"))?,
        });
    }
    r.tool_choice = match &v.tool_choice {
        Loose::Absent | Loose::Null => None,
        Loose::Str(s) => Some(match &**s {
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => ToolChoice::Auto,
        }),
        other => match other.as_object().and_then(|o| o.function.name.as_str()) {
            Some(name) => Some(ToolChoice::Named(name.to_owned())),
            None => {
                return Err(unsupported(
                    "tool_choice",
                    "only none, auto, required or a named function",
                ))
            }
        },
    };
    r.parallel_tool_calls = v
        .parallel_tool_calls
        .get_bool(|| "parallel_tool_calls".into())?;
    // Both are checked, whichever is used.
    let max_completion_tokens = v
        .max_completion_tokens
        .get_u64("max_completion_tokens", 1)?;
    r.max_tokens = max_completion_tokens.or(v.max_tokens.get_u64("max_tokens", 1)?);
    r.temperature = v.temperature.get_f64_in("temperature", 0.0, 2.0)?;
    r.top_p = v.top_p.get_f64_in("top_p", 0.0, 1.0)?;
    r.top_k = v.top_k.get_u64("top_k", 0)?;
    r.stop = v.stop.string_list("stop")?;
    r.stream = v.stream.get_bool(|| "stream".into())?.unwrap_or(false);
    r.user = v.user.get_str(|| "user".into())?.map(str::to_owned);
    let effort = v
        .reasoning_effort
        .get_str(|| "reasoning_effort".into())?
        .map(str::to_owned);
    let switch = v
        .chat_template_kwargs
        .enable_thinking
        .as_bool()
        .or_else(|| v.enable_thinking.as_bool())
        .or_else(|| v.thinking.kind.as_str().map(|t| t == "enabled"));
    // Anthropic's spelling of a budget inside the chat `thinking` switch is kept.
    let budget = v.thinking.budget_tokens.as_u64();
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
    r.response_format = match &v.response_format {
        Loose::Absent | Loose::Null => None,
        Loose::Obj(rf) => Some(match rf.kind.as_str() {
            Some("json_object") => ir::ResponseFormat::JsonObject,
            Some("json_schema") => {
                let js = &rf.json_schema;
                ir::ResponseFormat::JsonSchema {
                    name: js.name.as_str().unwrap_or("response").to_owned(),
                    description: js.description.as_str().map(str::to_owned),
                    schema: match js.schema.0 {
                        Some(s) => s.into(),
                        None => ir::RawJson(lax::raw_const(r#"{"type":"object"}"#)?),
                    },
                    strict: js.strict.as_bool(),
                }
            }
            _ => ir::ResponseFormat::Text,
        }),
        _ => Some(ir::ResponseFormat::Text),
    };
    let ctx = ClientContext {
        include_usage: v.stream_options.include_usage.as_bool() == Some(true),
    };
    Ok((r, ctx))
}

// === the upstream's body ===

#[derive(Serialize)]
struct ChatRequestOut<'a> {
    model: &'a str,
    messages: Vec<MessageOut<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ToolOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoiceOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptionsOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormatOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chat_template_kwargs: Option<TemplateKwargsOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    enable_thinking: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<AnthropicThinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum MessageOut<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: UserContentOut<'a>,
    },
    Assistant {
        /// `null` when the turn is only tool calls.
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<CallOut<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: String,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum UserContentOut<'a> {
    Text(&'a str),
    Parts(Vec<PartOut<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PartOut<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: ImageUrlOut<'a> },
}

#[derive(Serialize)]
struct ImageUrlOut<'a> {
    url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

#[derive(Serialize)]
struct CallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunctionOut<'a>,
}

#[derive(Serialize)]
struct CallFunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct ToolOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ToolFunctionOut<'a>,
}

#[derive(Serialize)]
struct ToolFunctionOut<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parameters: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ToolChoiceOut<'a> {
    Mode(&'static str),
    Named {
        #[serde(rename = "type")]
        kind: &'static str,
        function: NameOut<'a>,
    },
}

#[derive(Serialize)]
struct NameOut<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct StreamOptionsOut {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponseFormatOut<'a> {
    JsonObject,
    JsonSchema { json_schema: JsonSchemaOut<'a> },
}

#[derive(Serialize)]
struct JsonSchemaOut<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    schema: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

#[derive(Serialize)]
struct TemplateKwargsOut {
    enable_thinking: bool,
}

impl ChatRequestOut<'_> {
    /// The body serde's writer writes for this struct (its derive is the reference the tests
    /// hold this to), written member by member: serde's generic writer cost about a thousand
    /// instructions for the smallest request.
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.str("model", self.model);
        array(o.key("messages"), &self.messages, MessageOut::write);
        if !self.tools.is_empty() {
            array(o.key("tools"), &self.tools, ToolOut::write);
        }
        if let Some(tc) = &self.tool_choice {
            tc.write(o.key("tool_choice"));
        }
        o.some_bool("parallel_tool_calls", self.parallel_tool_calls);
        o.some_u64("max_tokens", self.max_tokens);
        o.some_f64("temperature", self.temperature);
        o.some_f64("top_p", self.top_p);
        if !self.stop.is_empty() {
            array(o.key("stop"), self.stop, |s, out| write_json_str(out, s));
        }
        o.some_bool("stream", self.stream);
        if let Some(so) = &self.stream_options {
            let mut so_out = Object::open(o.key("stream_options"));
            so_out.bool("include_usage", so.include_usage);
            so_out.close();
        }
        o.some_str("user", self.user);
        if let Some(rf) = &self.response_format {
            rf.write(o.key("response_format"));
        }
        if let Some(kw) = &self.chat_template_kwargs {
            let mut kw_out = Object::open(o.key("chat_template_kwargs"));
            kw_out.bool("enable_thinking", kw.enable_thinking);
            kw_out.close();
        }
        o.some_bool("enable_thinking", self.enable_thinking);
        if let Some(th) = &self.thinking {
            th.write(o.key("thinking"));
        }
        o.some_str("reasoning_effort", self.reasoning_effort);
        o.close();
    }
}

impl MessageOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        match self {
            Self::System { content } => {
                o.str("role", "system");
                o.str("content", content);
            }
            Self::User { content } => {
                o.str("role", "user");
                match content {
                    UserContentOut::Text(t) => o.str("content", t),
                    UserContentOut::Parts(parts) => array(o.key("content"), parts, PartOut::write),
                }
            }
            Self::Assistant {
                content,
                tool_calls,
            } => {
                o.str("role", "assistant");
                o.str_or_null("content", content.as_deref());
                if !tool_calls.is_empty() {
                    array(o.key("tool_calls"), tool_calls, CallOut::write);
                }
            }
            Self::Tool {
                tool_call_id,
                content,
            } => {
                o.str("role", "tool");
                o.str("tool_call_id", tool_call_id);
                o.str("content", content);
            }
        }
        o.close();
    }
}

impl PartOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        match self {
            Self::Text { text } => {
                o.str("type", "text");
                o.str("text", text);
            }
            Self::ImageUrl { image_url } => {
                o.str("type", "image_url");
                let mut url = Object::open(o.key("image_url"));
                url.str("url", &image_url.url);
                url.some_str("detail", image_url.detail);
                url.close();
            }
        }
        o.close();
    }
}

impl CallOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.str("id", self.id);
        o.str("type", self.kind);
        let mut f = Object::open(o.key("function"));
        f.str("name", self.function.name);
        f.str("arguments", self.function.arguments);
        f.close();
        o.close();
    }
}

impl ToolOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.str("type", self.kind);
        let f = &self.function;
        let mut f_out = Object::open(o.key("function"));
        f_out.str("name", f.name);
        f_out.some_str("description", f.description);
        f_out.raw("parameters", f.parameters);
        f_out.some_bool("strict", f.strict);
        f_out.close();
        o.close();
    }
}

impl ToolChoiceOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Self::Mode(mode) => write_json_str(out, mode),
            Self::Named { kind, function } => {
                let mut o = Object::open(out);
                o.str("type", kind);
                let mut f = Object::open(o.key("function"));
                f.str("name", function.name);
                f.close();
                o.close();
            }
        }
    }
}

impl ResponseFormatOut<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        match self {
            Self::JsonObject => o.str("type", "json_object"),
            Self::JsonSchema { json_schema: js } => {
                o.str("type", "json_schema");
                let mut js_out = Object::open(o.key("json_schema"));
                js_out.str("name", js.name);
                js_out.some_str("description", js.description);
                js_out.raw("schema", js.schema);
                js_out.some_bool("strict", js.strict);
                js_out.close();
            }
        }
        o.close();
    }
}

// === IR → chat upstream ===

fn user_message<'a>(m: &'a ir::Message, messages: &mut Vec<MessageOut<'a>>) {
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
                messages.push(MessageOut::Tool {
                    tool_call_id: call_id,
                    content: text,
                });
            }
            Part::Text(t) => rest.push(PartOut::Text { text: t }),
            Part::Image(img) => rest.push(PartOut::ImageUrl {
                image_url: ImageUrlOut {
                    url: img.source.to_url(),
                    detail: img.detail.as_deref(),
                },
            }),
            Part::ToolCall { .. } | Part::Reasoning(_) => {}
        }
    }
    let content = match rest.as_slice() {
        [] => return,
        [PartOut::Text { text }] => UserContentOut::Text(text),
        _ => UserContentOut::Parts(rest),
    };
    messages.push(MessageOut::User { content });
}

fn assistant_message(m: &ir::Message) -> MessageOut<'_> {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for p in &m.content {
        match p {
            Part::Text(t) => text.push_str(t),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => tool_calls.push(CallOut {
                id,
                kind: "function",
                function: CallFunctionOut { name, arguments },
            }),
            // Reasoning is not sent back: OpenAI-compatible servers reject or ignore it.
            _ => {}
        }
    }
    MessageOut::Assistant {
        content: (!text.is_empty() || tool_calls.is_empty()).then_some(text),
        tool_calls,
    }
}

/// The chat request for an upstream, as the structs its body is written from.
fn request_out<'a>(
    r: &'a ir::Request,
    upstream_model: &'a str,
    target: &Target,
) -> ChatRequestOut<'a> {
    let mut messages = Vec::with_capacity(r.messages.len() + 1);
    if let Some(content) = system_text(&r.system) {
        messages.push(MessageOut::System { content });
    }
    for m in &r.messages {
        match m.role {
            Role::User => user_message(m, &mut messages),
            Role::Assistant => messages.push(assistant_message(m)),
        }
    }
    let tools = r
        .tools
        .iter()
        .map(|t| ToolOut {
            kind: "function",
            function: ToolFunctionOut {
                name: &t.name,
                description: t.description.as_deref(),
                parameters: t.parameters.as_raw(),
                strict: t.strict,
            },
        })
        .collect();
    let tool_choice = r.tool_choice.as_ref().map(|tc| match tc {
        ToolChoice::None => ToolChoiceOut::Mode("none"),
        ToolChoice::Auto => ToolChoiceOut::Mode("auto"),
        ToolChoice::Required => ToolChoiceOut::Mode("required"),
        ToolChoice::Named(n) => ToolChoiceOut::Named {
            kind: "function",
            function: NameOut { name: n },
        },
    });
    let response_format = match &r.response_format {
        None | Some(ir::ResponseFormat::Text) => None,
        Some(ir::ResponseFormat::JsonObject) => Some(ResponseFormatOut::JsonObject),
        Some(ir::ResponseFormat::JsonSchema {
            name,
            description,
            schema,
            strict,
        }) => Some(ResponseFormatOut::JsonSchema {
            json_schema: JsonSchemaOut {
                name,
                description: description.as_deref(),
                schema: schema.as_raw(),
                strict: *strict,
            },
        }),
    };
    let mut out = ChatRequestOut {
        model: upstream_model,
        messages,
        tools,
        tool_choice,
        parallel_tool_calls: r.parallel_tool_calls.filter(|_| !r.tools.is_empty()),
        max_tokens: r.max_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        stop: &r.stop,
        stream: r.stream.then_some(true),
        // The client protocols on the other side report usage at the end, so always ask for it.
        stream_options: r.stream.then_some(StreamOptionsOut {
            include_usage: true,
        }),
        user: r.user.as_deref(),
        response_format,
        chat_template_kwargs: None,
        enable_thinking: None,
        thinking: None,
        reasoning_effort: None,
    };
    if let Some(th) = &r.thinking {
        write_thinking(&mut out, th, target, r.max_tokens);
    }
    out
}

/// Builds the chat request body for an upstream from the IR.
pub fn ir_to_request(
    r: &ir::Request,
    upstream_model: &str,
    target: &Target,
) -> Result<(Vec<u8>, UpstreamContext), GatewayError> {
    let out = request_out(r, upstream_model, target);
    let mut body = Vec::with_capacity(2048);
    out.write(&mut body);
    Ok((body, UpstreamContext))
}

/// The thinking switch in the spelling the target's server understands.
fn write_thinking<'a>(
    out: &mut ChatRequestOut<'a>,
    th: &'a ir::Thinking,
    target: &Target,
    max_tokens: Option<u64>,
) {
    let on = th.enabled;
    match target.thinking {
        ThinkingStyle::ChatTemplateKwargs => {
            out.chat_template_kwargs = Some(TemplateKwargsOut {
                enable_thinking: on,
            });
        }
        ThinkingStyle::EnableThinking => out.enable_thinking = Some(on),
        ThinkingStyle::ThinkingType => out.thinking = Some(AnthropicThinking::switch(on)),
        ThinkingStyle::Anthropic => {
            out.thinking = Some(if on {
                let b = crate::thinking::anthropic_budget(
                    th.budget_tokens,
                    th.effort.as_deref(),
                    max_tokens,
                    target.default_max_tokens.map(u64::from),
                );
                if let Some(raised) = b.raised_max_tokens {
                    // Written where the IR's limit went: chat's `max_tokens`.
                    out.max_tokens = Some(raised);
                }
                AnthropicThinking::enabled(b.budget_tokens)
            } else {
                AnthropicThinking::switch(false)
            });
        }
        // OpenAI's own spelling; with no form configured only a chat client gets here (its
        // explicit effort, which chat's rules let through), the agents' thinking was dropped.
        ThinkingStyle::None | ThinkingStyle::OpenAi => {
            out.reasoning_effort = match (&th.effort, on) {
                (Some(e), _) => Some(e),
                (None, false) => None,
                (None, true) => Some(
                    th.budget_tokens
                        .map_or("medium", crate::thinking::budget_to_effort),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::ChatRequest;
    use crate::config::Protocol;
    use crate::translate::hand::check;

    /// The body written by hand is the bytes serde writes for the same structs: every fixture
    /// request of every protocol, read into the IR and written for every thinking style, and
    /// requests with what the fixtures lack (escapes, fractions, an empty assistant turn).
    #[test]
    fn the_chat_body_is_written_as_serde_writes_it() {
        let mut bodies: Vec<(Protocol, String)> = Vec::new();
        for (protocol, name) in [
            (Protocol::Chat, "chat"),
            (Protocol::Messages, "messages"),
            (Protocol::Responses, "responses"),
        ] {
            for body in check::fixture_requests(name) {
                bodies.push((protocol, body));
            }
        }
        bodies.push((
            Protocol::Chat,
            r#"{"model":"m","messages":[{"role":"system","content":"a\"b\\c\n\u0001 é 😀"},{"role":"user","content":"x"},{"role":"assistant","content":""},{"role":"user","content":[{"type":"text","text":"t"},{"type":"image_url","image_url":{"url":"https://e/x.png"}}]}],"temperature":0.1,"top_p":1e-7,"max_tokens":1,"stop":["\n","</s>"],"user":"u\u2028","stream":true,"reasoning_effort":"high","tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":[true,null]}}}],"tool_choice":"required","parallel_tool_calls":true,"response_format":{"type":"json_object"}}"#.to_owned(),
        ));
        bodies.push((
            Protocol::Messages,
            r#"{"model":"m","max_tokens":4000,"thinking":{"type":"enabled","budget_tokens":2000},"temperature":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"tool","name":"f"},"tools":[{"name":"f","description":"d","input_schema":{"type":"object"}}]}"#.to_owned(),
        ));
        let targets = check::targets();
        let mut written = 0;
        for (protocol, body) in &bodies {
            // Bodies the IR refuses (fixtures of refusals) have no upstream body.
            let Ok(ir) = crate::translate::decode_request(*protocol, body.as_bytes()) else {
                continue;
            };
            for target in &targets {
                let out = super::request_out(&ir, "up-model", target);
                let mut hand = Vec::new();
                out.write(&mut hand);
                let serde = serde_json::to_vec(&out).unwrap();
                assert_eq!(
                    String::from_utf8(hand).unwrap(),
                    String::from_utf8(serde).unwrap(),
                    "{:?} {body}",
                    target.thinking
                );
                written += 1;
            }
        }
        assert!(written > 300, "{written} bodies written");
    }

    fn agrees(text: &[u8]) -> bool {
        check::agrees::<ChatRequest<'_>>(text)
    }

    /// Requests as clients write them: the OpenAI SDK's (tools, an image, a JSON schema, usage
    /// asked for), vLLM's and LiteLLM's thinking switches, and odd but accepted shapes.
    const REQUESTS: [&str; 4] = [
        r#"{"model":"gpt-4o","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":[{"type":"text","text":"What is in this image? caf\u00e9"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object"},"strict":true}},"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":256,"temperature":0.2,"top_p":1,"stop":["\n\n","END"],"user":"u-1","reasoning_effort":"low","n":1,"logprobs":false}"#,
        r#"{"model":"mock-gpt","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in five words."}],"max_tokens":64,"temperature":0}"#,
        r#"{"model":"qwen3","messages":[{"role":"user","content":"日本 — 😀"},{"role":"assistant","content":"ok","reasoning_content":"thought","thinking_blocks":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"}]}],"chat_template_kwargs":{"enable_thinking":true},"enable_thinking":false,"thinking":{"type":"enabled","budget_tokens":1024},"top_k":20,"stop":"x"}"#,
        " {\n \"model\" : \"m\" , \"messages\" : [ { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"refusal\" , \"refusal\" : \"no\" } ] } ] , \"tool_choice\" : \"auto\" , \"stream_options\" : null , \"response_format\" : [ 1 ] , \"extra\" : { \"deep\" : [ [ [ { } ] ] ] } }\n",
    ];

    #[test]
    fn requests_as_clients_write_them_are_read_by_hand_as_serde_reads_them() {
        check::all_read(REQUESTS, agrees);
    }

    #[test]
    fn the_fixture_requests_are_read_by_hand_as_serde_reads_them() {
        check::all_read(check::fixture_requests("chat"), agrees);
    }

    /// Values serde's read refuses, where a member is read: the hand reader leaves them to
    /// serde, which names them. Where a member is skipped, both accept them.
    #[test]
    fn what_serde_refuses_is_refused_where_serde_reads_it() {
        check::refused_where_read(
            &[
                (r#"{"max_tokens":{bad}}"#, false),
                (r#"{"messages":[{"content":{bad}}]}"#, false),
                (
                    r#"{"messages":[{"content":[{"image_url":{"url":{bad}}}]}]}"#,
                    false,
                ),
                (r#"{"tool_choice":{"function":{"name":{bad}}}}"#, false),
                (r#"{"stream_options":{bad}}"#, false),
                (
                    r#"{"tools":[{"function":{"parameters":{"a":{bad}}}}]}"#,
                    true,
                ),
                (r#"{"model":{bad}}"#, true),
                (r#"{"messages":[{"name":[{bad}]}]}"#, true),
            ],
            agrees,
            |text| serde_json::from_str::<ChatRequest<'_>>(text).is_ok(),
        );
    }

    #[test]
    fn no_one_byte_edit_makes_the_reader_differ_from_serde() {
        let read = check::one_byte_edits(&REQUESTS, agrees);
        // Most edits leave valid JSON the reader is sure of: the reader, not serde, was tested.
        assert!(read > 15_000, "only {read} edits were read by hand");
    }

    const KEYS: [&str; 31] = [
        "arguments",
        "budget_tokens",
        "chat_template_kwargs",
        "content",
        "data",
        "enable_thinking",
        "function",
        "id",
        "image_url",
        "include_usage",
        "json_schema",
        "max_tokens",
        "messages",
        "name",
        "parameters",
        "reasoning_content",
        "response_format",
        "role",
        "schema",
        "stop",
        "stream",
        "stream_options",
        "text",
        "thinking",
        "thinking_blocks",
        "tool_call_id",
        "tool_calls",
        "tool_choice",
        "tools",
        "type",
        "url",
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
}
