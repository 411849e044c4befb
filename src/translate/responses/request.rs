//! OpenAI Responses requests: a responses client's body read into the IR (and the fields its replies echo) through borrowing wire structs, and the IR written as a responses upstream's body.

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::IgnoredAny;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{Echo, SIG_PREFIX};
use crate::config::Target;
use crate::error::GatewayError;
use crate::ir::{self, Image, ImageSource, Part, Reasoning, Role, Tool, ToolChoice};
use crate::translate::common::{
    encoded, push, system_text, tool_result_text, unsupported, EMPTY_SCHEMA,
};
use crate::translate::lax::{self, lax_struct, Both, Loose, Raw};
use crate::translate::tools::{self, ClientTool, HostedTool, ToolMap};

// === the client's body, as far as the decoder reads it ===

lax_struct! {
    /// A responses client's request; the fields its reply echoes are also kept as raw text.
    pub struct ResponsesRequest<'a> {
        pub previous_response_id: Loose<'a>,
        pub conversation: Loose<'a>,
        pub store: Raw<'a>,
        pub instructions: Both<'a, Loose<'a>>,
        pub input: Loose<'a, Item<'a>>,
        pub tools: Both<'a, Loose<'a, ToolIn<'a>>>,
        pub tool_choice: Both<'a, Loose<'a, IgnoredAny, ToolChoiceIn<'a>>>,
        pub parallel_tool_calls: Both<'a, Loose<'a>>,
        pub max_output_tokens: Both<'a, Loose<'a>>,
        pub temperature: Both<'a, Loose<'a>>,
        pub top_p: Both<'a, Loose<'a>>,
        pub stream: Loose<'a>,
        pub user: Loose<'a>,
        pub reasoning: ReasoningIn<'a>,
        pub text: TextIn<'a>,
    }
}

lax_struct! {
    /// Any input item; each kind reads its own fields.
    pub struct Item<'a> {
        pub kind = "type": Loose<'a>,
        pub role: Loose<'a>,
        pub content: Loose<'a, PartIn<'a>>,
        pub call_id: Loose<'a>,
        pub name: Loose<'a>,
        pub arguments: Loose<'a>,
        pub output: Loose<'a, PartIn<'a>>,
        pub summary: Loose<'a, SummaryIn<'a>>,
        pub encrypted_content: Loose<'a>,
        pub namespace: Loose<'a>,
        pub input: Loose<'a>,
        pub action: Raw<'a>,
        pub id: Loose<'a>,
    }
}

lax_struct! {
    pub struct PartIn<'a> {
        pub kind = "type": Loose<'a>,
        pub text: Loose<'a>,
        pub refusal: Loose<'a>,
        pub image_url: Loose<'a>,
        pub detail: Loose<'a>,
    }
}

lax_struct! {
    pub struct SummaryIn<'a> {
        pub text: Loose<'a>,
    }
}

lax_struct! {
    pub struct ToolIn<'a> {
        pub kind = "type": Loose<'a>,
        pub name: Loose<'a>,
        pub description: Loose<'a>,
        pub parameters: Raw<'a>,
        pub strict: Loose<'a>,
        pub tools: Loose<'a, ToolIn<'a>>,
        pub format: Raw<'a>,
    }
}

lax_struct! {
    pub struct ToolChoiceIn<'a> {
        pub kind = "type": Loose<'a>,
        pub name: Loose<'a>,
    }
}

lax_struct! {
    pub struct ReasoningIn<'a> {
        pub effort: Both<'a, Loose<'a>>,
        pub summary: Raw<'a>,
    }
}

lax_struct! {
    pub struct TextIn<'a> {
        pub format: Loose<'a, IgnoredAny, FormatIn<'a>>,
    }
}

lax_struct! {
    pub struct FormatIn<'a> {
        pub kind = "type": Loose<'a>,
        pub name: Loose<'a>,
        pub description: Loose<'a>,
        pub schema: Raw<'a>,
        pub strict: Loose<'a>,
    }
}

/// What a responses client's replies need from its request: the fields they echo, and how the
/// tools it declared map back from the function names the upstream saw.
#[derive(Debug, Clone, Default)]
pub struct ClientContext {
    pub echo: Arc<Echo>,
    pub tools: Arc<ToolMap>,
    /// Hosted tools it declared, which a translated request leaves out or refuses.
    pub hosted: Vec<HostedTool>,
}

/// A responses upstream needs nothing from the request to read its replies.
#[derive(Debug, Clone, Default)]
pub struct UpstreamContext;

// === responses client → IR ===

/// An echoed field, kept on one line: a streamed reply writes it into an event's data line.
fn owned(raw: Option<&RawValue>) -> Option<Box<RawValue>> {
    raw.map(crate::json::one_line)
}

impl Echo {
    fn from_request(v: &ResponsesRequest<'_>) -> Self {
        Self {
            tools: owned(v.tools.raw),
            tool_choice: owned(v.tool_choice.raw),
            parallel_tool_calls: owned(v.parallel_tool_calls.raw),
            instructions: owned(v.instructions.raw),
            max_output_tokens: owned(v.max_output_tokens.raw),
            temperature: owned(v.temperature.raw),
            top_p: owned(v.top_p.raw),
            effort: owned(v.reasoning.effort.raw),
            summary: owned(v.reasoning.summary.0),
            store: owned(v.store.0),
            fresh_id: v.store.0.is_none_or(|s| s.get() != "false"),
            // Set by the pipeline, which expands it out of the body before translating.
            previous_response_id: None,
        }
    }
}

fn parts_of(
    content: &Loose<'_, PartIn<'_>>,
    path: &dyn Fn() -> String,
) -> Result<Vec<Part>, GatewayError> {
    match content {
        Loose::Str(s) => Ok(vec![Part::Text(s.clone().into_owned())]),
        Loose::Arr(a) => a
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let at = |field: &str| format!("{}[{i}]{field}", path());
                match p.kind.as_str() {
                    Some("input_text" | "output_text" | "text") => {
                        Ok(Part::Text(p.text.req_str(|| at(".text"))?.to_owned()))
                    }
                    Some("refusal") => {
                        Ok(Part::Text(p.refusal.req_str(|| at(".refusal"))?.to_owned()))
                    }
                    Some("input_image") => {
                        let url = p.image_url.get_str(|| at(".image_url"))?.ok_or_else(|| {
                            unsupported(&at(".file_id"), "images must be given by image_url")
                        })?;
                        Ok(Part::Image(Image {
                            source: ImageSource::from_url(url),
                            detail: p.detail.get_str(|| at(".detail"))?.map(str::to_owned),
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
        _ => {
            let p = path();
            Err(GatewayError::invalid(
                &p,
                format!("`{p}` must be a string or an array of parts"),
            ))
        }
    }
}

fn item_to_ir(r: &mut ir::Request, item: &Item<'_>, i: usize) -> Result<(), GatewayError> {
    let at = |field: &str| format!("input[{i}].{field}");
    let kind = item.kind.as_str().unwrap_or("message");
    match kind {
        "message" => {
            let content = || at("content");
            match item.role.as_str() {
                Some("system" | "developer") => {
                    let text: Vec<String> = parts_of(&item.content, &content)?
                        .into_iter()
                        .filter_map(|p| match p {
                            Part::Text(t) => Some(t),
                            _ => None,
                        })
                        .collect();
                    r.system.push(text.join("\n"));
                }
                Some("user") => push(
                    &mut r.messages,
                    Role::User,
                    parts_of(&item.content, &content)?,
                ),
                Some("assistant") => push(
                    &mut r.messages,
                    Role::Assistant,
                    parts_of(&item.content, &content)?,
                ),
                _ => {
                    return Err(GatewayError::invalid(
                        at("role"),
                        "`role` must be user, assistant, system or developer",
                    ))
                }
            }
        }
        "function_call" => {
            let name = item.name.req_str(|| at("name"))?;
            let name = match item.namespace.get_str(|| at("namespace"))? {
                Some(ns) => tools::flatten(ns, name),
                None => name.to_owned(),
            };
            push(
                &mut r.messages,
                Role::Assistant,
                vec![Part::ToolCall {
                    id: item.call_id.req_str(|| at("call_id"))?.to_owned(),
                    name,
                    arguments: item
                        .arguments
                        .get_str(|| at("arguments"))?
                        .unwrap_or("{}")
                        .to_owned(),
                }],
            )
        }
        "custom_tool_call" => push(
            &mut r.messages,
            Role::Assistant,
            vec![Part::ToolCall {
                id: item.call_id.req_str(|| at("call_id"))?.to_owned(),
                name: {
                    let name = item.name.req_str(|| at("name"))?;
                    match item.namespace.get_str(|| at("namespace"))? {
                        Some(ns) => tools::flatten(ns, name),
                        None => name.to_owned(),
                    }
                },
                arguments:
                    serde_json::json!({"input": item.input.get_str(|| at("input"))?.unwrap_or("")})
                        .to_string(),
            }],
        ),
        "local_shell_call" => push(
            &mut r.messages,
            Role::Assistant,
            vec![Part::ToolCall {
                // The call id is what its output names; older items carry only `id`.
                id: match item.call_id.get_str(|| at("call_id"))? {
                    Some(c) => c.to_owned(),
                    None => item.id.req_str(|| at("call_id"))?.to_owned(),
                },
                name: tools::LOCAL_SHELL.to_owned(),
                arguments: tools::local_shell_arguments(item.action.0.map(RawValue::get)),
            }],
        ),
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => {
            let content = match &item.output {
                Loose::Str(s) => vec![Part::Text(s.clone().into_owned())],
                o @ Loose::Arr(_) => parts_of(o, &|| at("output"))?,
                _ => return Err(GatewayError::invalid(at("output"), "`output` is required")),
            };
            let call_id = match item.call_id.get_str(|| at("call_id"))? {
                Some(c) => c,
                // `local_shell_call_output` names its call by `id`.
                None if kind == "local_shell_call_output" => item.id.req_str(|| at("id"))?,
                None => item.call_id.req_str(|| at("call_id"))?,
            };
            push(
                &mut r.messages,
                Role::User,
                vec![Part::ToolResult {
                    call_id: call_id.to_owned(),
                    content,
                    is_error: false,
                }],
            );
        }
        "reasoning" => {
            let text: Vec<&str> = item
                .summary
                .as_array()
                .unwrap_or(&[])
                .iter()
                .filter_map(|s| s.text.as_str())
                .collect();
            // Only a signature the gateway itself put there is trusted as Anthropic's.
            let signature = item
                .encrypted_content
                .as_str()
                .and_then(|e| e.strip_prefix(SIG_PREFIX))
                .map(str::to_owned);
            push(
                &mut r.messages,
                Role::Assistant,
                vec![Part::Reasoning(Reasoning {
                    text: text.join("\n"),
                    signature,
                    redacted: None,
                })],
            );
        }
        // The pipeline replaced every reference the key's store knows; this one it does not.
        "item_reference" => {
            let id = item.id.get_str(|| at("id"))?.unwrap_or("");
            let shown: String = id.chars().filter(|c| !c.is_control()).take(256).collect();
            return Err(GatewayError::new(
                crate::error::ErrorKind::NotFound,
                format!("Item with id '{shown}' not found."),
            )
            .with_param(at("id")));
        }
        other => {
            return Err(unsupported(
                &at("type"),
                &format!("{other:?} items have no equivalent there"),
            ))
        }
    }
    Ok(())
}

/// A `function` or `custom` tool as the function the upstream sees, under `name`.
fn client_tool(tool: &ToolIn<'_>, path: &str, name: String) -> Result<Tool, GatewayError> {
    let at = |field: &str| format!("{path}.{field}");
    let description = tool
        .description
        .get_str(|| at("description"))?
        .map(str::to_owned);
    Ok(match tool.kind.as_str() {
        Some("custom") => {
            let format: Option<serde_json::Value> = tool
                .format
                .0
                .and_then(|f| serde_json::from_str(f.get()).ok());
            Tool {
                name,
                description,
                parameters: ir::RawJson(
                    RawValue::from_string(tools::custom_schema(format.as_ref())).map_err(|e| {
                        GatewayError::invalid(at("format"), format!("`{}`: {e}", at("format")))
                    })?,
                ),
                strict: None,
            }
        }
        Some("function") => Tool {
            name,
            description,
            parameters: match tool.parameters.0.filter(|p| p.get() != "null") {
                Some(p) => p.into(),
                None => ir::RawJson(lax::raw_const(EMPTY_SCHEMA)?),
            },
            strict: tool.strict.get_bool(|| at("strict"))?,
        },
        other => {
            return Err(GatewayError::invalid(
                at("type"),
                format!(
                    "a namespace holds function or custom tools; got {:?}",
                    other.unwrap_or("?")
                ),
            ))
        }
    })
}

/// A namespaced function's description, prefixed with its namespace so the model sees the grouping.
fn tool_description(own: Option<String>, namespace: &str) -> Option<String> {
    Some(match own {
        Some(d) => format!("[{namespace}] {d}"),
        None => format!("[{namespace}]"),
    })
}

/// Reads and checks a responses request into the IR, refusing what the IR cannot hold.
pub fn request_to_ir(body: &[u8]) -> Result<(ir::Request, ClientContext), GatewayError> {
    let v: ResponsesRequest = lax::parse_object(body)?;
    // The pipeline expands a stored conversation before translating; one that is still here
    // lives on a responses upstream, which this target is not.
    if !v.previous_response_id.is_none() {
        return Err(unsupported(
            "previous_response_id",
            "the conversation is kept by the responses upstream that served it; send the whole input",
        ));
    }
    if !v.conversation.is_none() {
        return Err(unsupported(
            "conversation",
            "the gateway keeps no conversation store; send the whole input",
        ));
    }
    let mut r = ir::Request::default();
    if let Some(i) = v.instructions.typed.get_str(|| "instructions".into())? {
        r.system.push(i.to_owned());
    }
    match &v.input {
        Loose::Absent | Loose::Null => {
            return Err(GatewayError::invalid("input", "`input` is required"))
        }
        Loose::Str(s) => push(
            &mut r.messages,
            Role::User,
            vec![Part::Text(s.clone().into_owned())],
        ),
        Loose::Arr(items) => {
            for (i, item) in items.iter().enumerate() {
                item_to_ir(&mut r, item, i)?;
            }
        }
        _ => {
            return Err(GatewayError::invalid(
                "input",
                "`input` must be a string or an array of items",
            ))
        }
    }
    let mut map = ToolMap::default();
    let mut hosted = Vec::new();
    // Each upstream name with where it was declared, to refuse a collision naming both.
    let mut names: Vec<(String, String)> = Vec::new();
    let tools = v.tools.typed.get_array(|| "tools".into())?;
    for (i, tool) in tools.unwrap_or(&[]).iter().enumerate() {
        let path = format!("tools[{i}]");
        match tool.kind.as_str() {
            Some("namespace") => {
                let ns = tool.name.req_str(|| format!("{path}.name"))?;
                let inner = tool.tools.get_array(|| format!("{path}.tools"))?;
                for (j, t) in inner.unwrap_or(&[]).iter().enumerate() {
                    let path = format!("{path}.tools[{j}]");
                    let name = t.name.req_str(|| format!("{path}.name"))?;
                    let flat = tools::flatten(ns, name);
                    let mut tool = client_tool(t, &path, flat.clone())?;
                    if let Some(d) = tool_description(tool.description.take(), ns) {
                        tool.description = Some(d);
                    }
                    let back = if t.kind.as_str() == Some("custom") {
                        ClientTool::Custom {
                            scope: Some((ns.to_owned(), name.to_owned())),
                        }
                    } else {
                        ClientTool::Namespaced {
                            namespace: ns.to_owned(),
                            name: name.to_owned(),
                        }
                    };
                    map.insert(flat.clone(), back);
                    names.push((flat, path));
                    r.tools.push(tool);
                }
            }
            Some("function" | "custom") => {
                let name = tool.name.req_str(|| format!("{path}.name"))?.to_owned();
                if tool.kind.as_str() == Some("custom") {
                    map.insert(name.clone(), ClientTool::Custom { scope: None });
                }
                names.push((name.clone(), path.clone()));
                r.tools.push(client_tool(tool, &path, name)?);
            }
            Some("local_shell") => {
                map.insert(tools::LOCAL_SHELL.to_owned(), ClientTool::LocalShell);
                names.push((tools::LOCAL_SHELL.to_owned(), path));
                r.tools.push(Tool {
                    name: tools::LOCAL_SHELL.to_owned(),
                    description: Some(tools::LOCAL_SHELL_DESCRIPTION.to_owned()),
                    parameters: ir::RawJson(lax::raw_const(tools::LOCAL_SHELL_SCHEMA)?),
                    strict: None,
                });
            }
            Some(kind) if tools::is_responses_hosted(kind) => hosted.push(HostedTool {
                param: path,
                kind: kind.to_owned(),
            }),
            other => {
                return Err(GatewayError::invalid(
                    format!("{path}.type"),
                    format!(
                        "unknown tool type {:?}; allowed: function, custom, namespace, local_shell, or a hosted tool (web_search, file_search, code_interpreter, image_generation, computer_use_preview, tool_search, mcp)",
                        other.unwrap_or("?")
                    ),
                ))
            }
        }
    }
    tools::check_unique(&names)?;
    r.tool_choice = match &v.tool_choice.typed {
        Loose::Absent | Loose::Null => None,
        Loose::Str(s) => Some(match &**s {
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => ToolChoice::Auto,
        }),
        other => match other
            .as_object()
            .map(|o| (o.kind.as_str(), o.name.as_str()))
        {
            Some((Some("function" | "custom"), Some(n))) => Some(ToolChoice::Named(n.to_owned())),
            // A hosted tool forced: the upstream cannot run it, so the model just may use tools.
            Some((Some(kind), _)) if tools::is_responses_hosted(kind) => Some(ToolChoice::Auto),
            _ => {
                return Err(unsupported(
                    "tool_choice",
                    "only none, auto, required or a named function",
                ))
            }
        },
    };
    r.parallel_tool_calls = v
        .parallel_tool_calls
        .typed
        .get_bool(|| "parallel_tool_calls".into())?;
    r.max_tokens = v.max_output_tokens.typed.get_u64("max_output_tokens", 1)?;
    r.temperature = v.temperature.typed.get_f64_in("temperature", 0.0, 2.0)?;
    r.top_p = v.top_p.typed.get_f64_in("top_p", 0.0, 1.0)?;
    r.stream = v.stream.get_bool(|| "stream".into())?.unwrap_or(false);
    r.user = v.user.get_str(|| "user".into())?.map(str::to_owned);
    if let Some(effort) = v.reasoning.effort.typed.as_str() {
        r.thinking = Some(ir::Thinking {
            enabled: effort != "none",
            budget_tokens: None,
            effort: Some(effort.to_owned()),
        });
    }
    r.response_format = match &v.text.format {
        Loose::Absent | Loose::Null => None,
        Loose::Obj(f) => Some(match f.kind.as_str() {
            Some("json_object") => ir::ResponseFormat::JsonObject,
            Some("json_schema") => ir::ResponseFormat::JsonSchema {
                name: f.name.as_str().unwrap_or("response").to_owned(),
                description: f.description.as_str().map(str::to_owned),
                schema: match f.schema.0 {
                    Some(s) => s.into(),
                    None => ir::RawJson(lax::raw_const(r#"{"type":"object"}"#)?),
                },
                strict: f.strict.as_bool(),
            },
            _ => ir::ResponseFormat::Text,
        }),
        _ => Some(ir::ResponseFormat::Text),
    };
    let ctx = ClientContext {
        echo: Arc::new(Echo::from_request(&v)),
        tools: Arc::new(map),
        hosted,
    };
    Ok((r, ctx))
}

// === the upstream's body ===

#[derive(Serialize)]
struct ResponsesRequestOut<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<Cow<'a, str>>,
    input: Vec<ItemOut<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ToolOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoiceOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<ReasoningOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    store: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ItemOut<'a> {
    Message {
        role: &'static str,
        content: Vec<ContentOut<'a>>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: String,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentOut<'a> {
    InputText {
        text: &'a str,
    },
    OutputText {
        text: &'a str,
        annotations: &'static [u8],
    },
    InputImage {
        image_url: String,
        detail: &'a str,
    },
}

#[derive(Serialize)]
struct ToolOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    /// Written as `null` when absent, as the upstream has always received it.
    description: Option<&'a str>,
    parameters: &'a RawValue,
    strict: bool,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ToolChoiceOut<'a> {
    Mode(&'static str),
    Named {
        #[serde(rename = "type")]
        kind: &'static str,
        name: &'a str,
    },
}

#[derive(Serialize)]
struct ReasoningOut<'a> {
    effort: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<&'static str>,
}

#[derive(Serialize)]
struct TextOut<'a> {
    format: FormatOut<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum FormatOut<'a> {
    JsonObject,
    JsonSchema {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<&'a str>,
        schema: &'a RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

// === IR → responses upstream ===

fn message_items<'a>(m: &'a ir::Message, input: &mut Vec<ItemOut<'a>>) {
    let role = if m.role == Role::User {
        "user"
    } else {
        "assistant"
    };
    let mut parts = Vec::new();
    let flush = |parts: &mut Vec<ContentOut<'a>>, input: &mut Vec<ItemOut<'a>>| {
        if !parts.is_empty() {
            input.push(ItemOut::Message {
                role,
                content: std::mem::take(parts),
            });
        }
    };
    for p in &m.content {
        match p {
            Part::Text(text) => parts.push(if m.role == Role::User {
                ContentOut::InputText { text }
            } else {
                ContentOut::OutputText {
                    text,
                    annotations: &[],
                }
            }),
            Part::Image(img) => parts.push(ContentOut::InputImage {
                image_url: img.source.to_url(),
                detail: img.detail.as_deref().unwrap_or("auto"),
            }),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                flush(&mut parts, input);
                input.push(ItemOut::FunctionCall {
                    call_id: id,
                    name,
                    arguments,
                });
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                flush(&mut parts, input);
                let mut output = tool_result_text(content);
                if *is_error {
                    output = format!("Error: {output}");
                }
                input.push(ItemOut::FunctionCallOutput { call_id, output });
            }
            // A reasoning item needs OpenAI's own id and encrypted content to mean anything there.
            Part::Reasoning(_) => {}
        }
    }
    flush(&mut parts, input);
}

/// Builds the responses request body for an upstream from the IR.
pub fn ir_to_request(
    r: &ir::Request,
    upstream_model: &str,
    _target: &Target,
) -> Result<(Vec<u8>, UpstreamContext), GatewayError> {
    // Stop sequences were refused by the Capabilities check before this runs.
    let mut input = Vec::with_capacity(r.messages.len());
    for m in &r.messages {
        message_items(m, &mut input);
    }
    let tools = r
        .tools
        .iter()
        .map(|t| ToolOut {
            kind: "function",
            name: &t.name,
            description: t.description.as_deref(),
            parameters: t.parameters.as_raw(),
            strict: t.strict.unwrap_or(false),
        })
        .collect();
    let tool_choice = r.tool_choice.as_ref().map(|tc| match tc {
        ToolChoice::None => ToolChoiceOut::Mode("none"),
        ToolChoice::Auto => ToolChoiceOut::Mode("auto"),
        ToolChoice::Required => ToolChoiceOut::Mode("required"),
        ToolChoice::Named(name) => ToolChoiceOut::Named {
            kind: "function",
            name,
        },
    });
    let reasoning = r.thinking.as_ref().and_then(|th| {
        if th.enabled {
            let effort = th.effort.as_deref().unwrap_or_else(|| {
                th.budget_tokens
                    .map_or("medium", crate::thinking::budget_to_effort)
            });
            Some(ReasoningOut {
                effort,
                summary: Some("auto"),
            })
        } else {
            th.effort.as_deref().map(|effort| ReasoningOut {
                effort,
                summary: None,
            })
        }
    });
    let format = match &r.response_format {
        None | Some(ir::ResponseFormat::Text) => None,
        Some(ir::ResponseFormat::JsonObject) => Some(FormatOut::JsonObject),
        Some(ir::ResponseFormat::JsonSchema {
            name,
            description,
            schema,
            strict,
        }) => Some(FormatOut::JsonSchema {
            name,
            description: description.as_deref(),
            schema: schema.as_raw(),
            strict: *strict,
        }),
    };
    let out = ResponsesRequestOut {
        model: upstream_model,
        instructions: system_text(&r.system),
        input,
        tools,
        tool_choice,
        parallel_tool_calls: r.parallel_tool_calls,
        max_output_tokens: r.max_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        reasoning,
        text: format.map(|format| TextOut { format }),
        user: r.user.as_deref(),
        // The gateway never refers back to stored responses, so do not ask the upstream to keep them.
        store: false,
        stream: r.stream.then_some(true),
    };
    Ok((encoded(&out)?, UpstreamContext))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::ResponsesRequest;
    use crate::translate::hand::check;

    fn agrees(text: &[u8]) -> bool {
        check::agrees::<ResponsesRequest<'_>>(text)
    }

    /// Requests as clients write them: Codex CLI's (instructions, a function call round trip,
    /// encrypted reasoning, hosted tools), the OpenAI SDK's, and odd but accepted shapes.
    const REQUESTS: [&str; 4] = [
        r#"{"model":"gpt-5-codex","instructions":"You are Codex.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"run ls"}]},{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Listing."}],"encrypted_content":"gAAAAB"},{"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\"command\":[\"ls\"]}"},{"type":"function_call_output","call_id":"call_1","output":"a.txt\nb.txt"},{"type":"local_shell_call","call_id":"c2","action":{"type":"exec","command":["pwd"]}}],"tools":[{"type":"function","name":"shell","description":"Runs a command","strict":false,"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}},{"type":"web_search"}],"tool_choice":"auto","parallel_tool_calls":false,"reasoning":{"effort":"medium","summary":"auto"},"store":false,"stream":true,"include":["reasoning.encrypted_content"],"prompt_cache_key":"k"}"#,
        r#"{"model":"gpt-4o","input":"Say hello.","max_output_tokens":64,"temperature":0.5,"top_p":0.9,"user":"u","previous_response_id":"resp_1","text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"},"strict":true}}}"#,
        r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://example.com/a.png","detail":"low"},{"type":"input_text","text":"caf\u00e9 — 日本"}]},{"role":"assistant","content":[{"type":"output_text","text":"hi"},{"type":"refusal","refusal":"no"}]}],"tool_choice":{"type":"function","name":"f"},"conversation":"conv_1"}"#,
        " {\n \"model\" : \"m\" , \"instructions\" : null , \"input\" : [ { \"type\" : \"message\" , \"role\" : \"developer\" , \"content\" : \"be brief\" } ] , \"reasoning\" : [ 1 ] , \"text\" : 7 , \"store\" : true , \"extra\" : { \"deep\" : [ [ [ { } ] ] ] } }\n",
    ];

    #[test]
    fn requests_as_clients_write_them_are_read_by_hand_as_serde_reads_them() {
        check::all_read(REQUESTS, agrees);
    }

    #[test]
    fn the_fixture_requests_are_read_by_hand_as_serde_reads_them() {
        check::all_read(check::fixture_requests("responses"), agrees);
    }

    /// Values serde's read refuses, where a member is read: the hand reader leaves them to
    /// serde, which names them. Where a member is skipped, both accept them.
    #[test]
    fn what_serde_refuses_is_refused_where_serde_reads_it() {
        check::refused_where_read(
            &[
                (r#"{"max_output_tokens":{bad}}"#, false),
                (r#"{"instructions":{bad}}"#, false),
                (r#"{"input":[{"content":{bad}}]}"#, false),
                (r#"{"input":[{"summary":[{"text":{bad}}]}]}"#, false),
                (r#"{"tool_choice":{"name":{bad}}}"#, false),
                (r#"{"store":{"a":{bad}}}"#, true),
                (r#"{"model":{bad}}"#, true),
                (r#"{"input":[{"status":[{bad}]}]}"#, true),
            ],
            agrees,
            |text| serde_json::from_str::<ResponsesRequest<'_>>(text).is_ok(),
        );
    }

    #[test]
    fn no_one_byte_edit_makes_the_reader_differ_from_serde() {
        let read = check::one_byte_edits(&REQUESTS, agrees);
        // Most edits leave valid JSON the reader is sure of: the reader, not serde, was tested.
        assert!(read > 15_000, "only {read} edits were read by hand");
    }

    const KEYS: [&str; 23] = [
        "action",
        "arguments",
        "call_id",
        "content",
        "effort",
        "encrypted_content",
        "format",
        "input",
        "instructions",
        "max_output_tokens",
        "name",
        "output",
        "parameters",
        "reasoning",
        "role",
        "schema",
        "store",
        "stream",
        "summary",
        "text",
        "tool_choice",
        "tools",
        "type",
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
