//! Chat-completions request rules (interface §2.1, §8; gateway.md §6), checked before anything goes upstream.

use crate::config::{Model, ThinkingStyle};
use crate::error::GatewayError;
use crate::json::{self, Expected, Raw, RawObject};

/// What the rest of the pipeline needs to know about a valid chat request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatChecked {
    pub stream: bool,
    /// The one thinking switch the client's fields agree on, if any was given.
    pub thinking: Option<bool>,
    pub include_usage: bool,
    pub max_tokens: Option<i64>,
}

const ROLES: &str = "system, developer, user, assistant, tool";

/// A field's path inside the body (`messages[0].content[1].type`), written out only when an
/// error names it: a valid request builds no path strings.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'static str),
    Field(&'a Path<'a>, &'static str),
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    fn field(&'a self, name: &'static str) -> Path<'a> {
        Path::Field(self, name)
    }

    fn index(&'a self, i: usize) -> Path<'a> {
        Path::Index(self, i)
    }
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root(name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// An error about the field at `param`: `message` gets the path as its text.
fn invalid_at<P: std::fmt::Display + ?Sized>(
    param: &P,
    message: impl FnOnce(&str) -> String,
) -> GatewayError {
    let param = param.to_string();
    let message = message(&param);
    GatewayError::invalid(param, message)
}

fn wrong_type<P: std::fmt::Display + ?Sized>(
    param: &P,
    expected: Expected,
    raw: Raw<'_>,
) -> GatewayError {
    invalid_at(param, |p| {
        format!("`{p}` must be {expected}; got {}", describe(raw))
    })
}

/// A wrong value for a message: its JSON type, or for the values that are of the right type
/// but still unreadable, what is wrong with them ("must be a number; got a number" helps no one).
fn describe(raw: Raw<'_>) -> String {
    match json::type_name(raw) {
        "a string" if json::as_str(raw).is_err() => {
            "a lone surrogate escape (not valid Unicode)".to_owned()
        }
        "a number" => {
            let text = raw.get();
            if text.len() <= 40 {
                text.to_owned()
            } else {
                format!("{}…", &text[..40])
            }
        }
        other => other.to_owned(),
    }
}

fn typed<'r, T, P: std::fmt::Display + ?Sized>(
    param: &P,
    raw: Raw<'r>,
    f: impl Fn(Raw<'r>) -> Result<T, Expected>,
) -> Result<T, GatewayError> {
    f(raw).map_err(|e| wrong_type(param, e, raw))
}

/// A number in [lo, hi]; a number too large for a float (`1e999`) is out of range, not a wrong type.
fn number_in(obj: &RawObject, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, GatewayError> {
    let Some(raw) = obj.get_present(key) else {
        return Ok(None);
    };
    let out_of_range = |got: &str| {
        GatewayError::invalid(
            key,
            format!("`{key}` must be between {lo} and {hi}; got {got}"),
        )
    };
    let v = match json::as_f64(raw) {
        Ok(v) => v,
        Err(_) if json::type_name(raw) == "a number" => return Err(out_of_range(&describe(raw))),
        Err(e) => return Err(wrong_type(key, e, raw)),
    };
    if !(lo..=hi).contains(&v) {
        return Err(out_of_range(&v.to_string()));
    }
    Ok(Some(v))
}

/// An integer in [lo, hi]; `1.5`, `2.0` and integers beyond i64 are refused with the range named.
fn int_in(obj: &RawObject, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, GatewayError> {
    let Some(raw) = obj.get_present(key) else {
        return Ok(None);
    };
    let refuse = |got: &str| {
        let range = if hi == i64::MAX {
            format!("at least {lo}")
        } else {
            format!("between {lo} and {hi}")
        };
        GatewayError::invalid(
            key,
            format!("`{key}` must be an integer {range}; got {got}"),
        )
    };
    let v = match json::as_i64(raw) {
        Ok(v) => v,
        Err(_) if json::type_name(raw) == "a number" => return Err(refuse(&describe(raw))),
        Err(e) => return Err(wrong_type(key, e, raw)),
    };
    if !(lo..=hi).contains(&v) {
        return Err(refuse(&v.to_string()));
    }
    Ok(Some(v))
}

fn bool_field(obj: &RawObject, key: &str) -> Result<Option<bool>, GatewayError> {
    obj.get_present(key)
        .map(|raw| typed(key, raw, json::as_bool))
        .transpose()
}

/// The client's model name: required, a non-empty string.
pub fn model_name<'o>(obj: &'o RawObject) -> Result<std::borrow::Cow<'o, str>, GatewayError> {
    let raw = obj
        .get_present("model")
        .ok_or_else(|| GatewayError::invalid("model", "`model` is required"))?;
    let name = typed("model", raw, json::as_str)?;
    if name.is_empty() {
        return Err(GatewayError::invalid("model", "`model` must not be empty"));
    }
    Ok(name)
}

/// Checks a chat-completions body for `model` (the routed entry).
pub fn chat(
    obj: &RawObject,
    model: &Model,
    client_model: &str,
) -> Result<ChatChecked, GatewayError> {
    messages(obj, model, client_model)?;

    let stream = bool_field(obj, "stream")?.unwrap_or(false);
    let mut include_usage = false;
    if let Some(raw) = obj.get_present("stream_options") {
        let opts = typed("stream_options", raw, json::as_object)?;
        if !stream {
            return Err(GatewayError::invalid(
                "stream_options",
                "`stream_options` is allowed only when `stream` is true",
            ));
        }
        include_usage = opts
            .get_present("include_usage")
            .map(|r| typed("stream_options.include_usage", r, json::as_bool))
            .transpose()?
            .unwrap_or(false);
    }

    let max_tokens = int_in(obj, "max_tokens", 1, i64::MAX)?;
    let max_completion = int_in(obj, "max_completion_tokens", 1, i64::MAX)?;
    number_in(obj, "temperature", 0.0, 2.0)?;
    number_in(obj, "top_p", 0.0, 1.0)?;
    number_in(obj, "presence_penalty", -2.0, 2.0)?;
    number_in(obj, "frequency_penalty", -2.0, 2.0)?;
    int_in(obj, "n", 1, 128)?;
    stop(obj)?;

    let logprobs = bool_field(obj, "logprobs")?.unwrap_or(false);
    if int_in(obj, "top_logprobs", 0, 20)?.is_some() && !logprobs {
        return Err(GatewayError::invalid(
            "top_logprobs",
            "`top_logprobs` may be set only when `logprobs` is true",
        ));
    }

    response_format(obj)?;
    tools(obj)?;
    tool_choice(obj)?;
    bool_field(obj, "parallel_tool_calls")?;
    let thinking = thinking(obj, model, client_model)?;

    Ok(ChatChecked {
        stream,
        thinking,
        include_usage,
        max_tokens: max_completion.or(max_tokens),
    })
}

fn stop(obj: &RawObject) -> Result<(), GatewayError> {
    let Some(raw) = obj.get_present("stop") else {
        return Ok(());
    };
    if json::as_str(raw).is_ok() {
        return Ok(());
    }
    let items = json::as_array(raw).map_err(|_| {
        GatewayError::invalid(
            "stop",
            format!(
                "`stop` must be a string or an array of at most 4 strings; got {}",
                describe(raw)
            ),
        )
    })?;
    if items.len() > 4 {
        return Err(GatewayError::invalid(
            "stop",
            format!("`stop` allows at most 4 strings; got {}", items.len()),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        typed(&Path::Root("stop").index(i), *item, json::as_str)?;
    }
    Ok(())
}

fn response_format(obj: &RawObject) -> Result<(), GatewayError> {
    let Some(raw) = obj.get_present("response_format") else {
        return Ok(());
    };
    let rf = typed("response_format", raw, json::as_object)?;
    let kind = rf
        .get_present("type")
        .ok_or_else(|| {
            GatewayError::invalid(
                "response_format.type",
                "`response_format.type` is required: text, json_object or json_schema",
            )
        })
        .and_then(|r| typed("response_format.type", r, json::as_str))?;
    match kind.as_ref() {
        "text" | "json_object" => Ok(()),
        "json_schema" => {
            let schema = rf
                .get_present("json_schema")
                .ok_or_else(|| {
                    GatewayError::invalid(
                        "response_format.json_schema",
                        "`response_format.json_schema` is required when type is json_schema",
                    )
                })
                .and_then(|r| typed("response_format.json_schema", r, json::as_object))?;
            let name = schema
                .get_present("name")
                .ok_or_else(|| {
                    GatewayError::invalid(
                        "response_format.json_schema.name",
                        "`response_format.json_schema.name` is required",
                    )
                })
                .and_then(|r| typed("response_format.json_schema.name", r, json::as_str))?;
            if !valid_name(&name) {
                return Err(GatewayError::invalid(
                    "response_format.json_schema.name",
                    "`response_format.json_schema.name` must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -",
                ));
            }
            if let Some(s) = schema.get_present("schema") {
                typed("response_format.json_schema.schema", s, json::as_object)?;
            }
            Ok(())
        }
        other => Err(GatewayError::invalid(
            "response_format.type",
            format!(
                "`response_format.type` must be text, json_object or json_schema; got {other:?}"
            ),
        )),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn tools(obj: &RawObject) -> Result<(), GatewayError> {
    let Some(raw) = obj.get_present("tools") else {
        return Ok(());
    };
    let items = typed("tools", raw, json::as_array)?;
    let root = Path::Root("tools");
    for (i, item) in items.iter().enumerate() {
        let path = root.index(i);
        let tool = typed(&path, *item, json::as_object)?;
        let kind_path = path.field("type");
        let kind = tool
            .get_present("type")
            .ok_or_else(|| {
                invalid_at(&kind_path, |p| {
                    format!("`{p}` is required; only \"function\" is supported")
                })
            })
            .and_then(|r| typed(&kind_path, r, json::as_str))?;
        if kind != "function" {
            return Err(invalid_at(&kind_path, |p| {
                format!("`{p}` must be \"function\" (the only supported tool kind); got {kind:?}")
            }));
        }
        let fpath = path.field("function");
        let function = tool
            .get_present("function")
            .ok_or_else(|| required(&fpath))
            .and_then(|r| typed(&fpath, r, json::as_object))?;
        let npath = fpath.field("name");
        let name = function
            .get_present("name")
            .ok_or_else(|| required(&npath))
            .and_then(|r| typed(&npath, r, json::as_str))?;
        if !valid_name(&name) {
            return Err(invalid_at(&npath, |p| {
                format!("`{p}` must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -; got {name:?}")
            }));
        }
        if let Some(p) = function.get_present("parameters") {
            typed(&fpath.field("parameters"), p, json::as_object)?;
        }
    }
    Ok(())
}

fn tool_choice(obj: &RawObject) -> Result<(), GatewayError> {
    let Some(raw) = obj.get_present("tool_choice") else {
        return Ok(());
    };
    if let Ok(s) = json::as_str(raw) {
        return match s.as_ref() {
            "none" | "auto" | "required" => Ok(()),
            other => Err(GatewayError::invalid(
                "tool_choice",
                format!("`tool_choice` must be \"none\", \"auto\", \"required\" or an object naming a function; got {other:?}"),
            )),
        };
    }
    let choice = json::as_object(raw).map_err(|_| {
        GatewayError::invalid(
            "tool_choice",
            format!(
                "`tool_choice` must be a string or an object; got {}",
                describe(raw)
            ),
        )
    })?;
    let kind = choice
        .get_present("type")
        .ok_or_else(|| GatewayError::invalid("tool_choice.type", "`tool_choice.type` is required"))
        .and_then(|r| typed("tool_choice.type", r, json::as_str))?;
    // Tools are functions only, so a choice of any other kind names nothing the model was offered.
    if kind != "function" {
        return Err(GatewayError::invalid(
            "tool_choice.type",
            format!("`tool_choice.type` must be \"function\" (the only supported tool kind); got {kind:?}"),
        ));
    }
    let name = choice
        .get_present("function")
        .and_then(|f| json::as_object(f).ok())
        .and_then(|f| {
            f.get_present("name")
                .and_then(|n| json::as_str(n).ok().map(|n| n.into_owned()))
        });
    if name.is_none() {
        return Err(GatewayError::invalid(
            "tool_choice.function.name",
            "`tool_choice.function.name` is required when `tool_choice.type` is \"function\"",
        ));
    }
    Ok(())
}

fn messages(obj: &RawObject, model: &Model, client_model: &str) -> Result<(), GatewayError> {
    let raw = obj
        .get_present("messages")
        .ok_or_else(|| GatewayError::invalid("messages", "`messages` is required"))?;
    if plain_messages(raw) {
        return Ok(());
    }
    all_messages(raw, model, client_model)
}

/// Every rule on `messages`, for any shape of it.
fn all_messages(raw: Raw<'_>, model: &Model, client_model: &str) -> Result<(), GatewayError> {
    let items = typed("messages", raw, json::as_array)?;
    if items.is_empty() {
        return Err(GatewayError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    let root = Path::Root("messages");
    for (i, item) in items.iter().enumerate() {
        let path = root.index(i);
        let msg = typed(&path, *item, json::as_object)?;
        let rpath = path.field("role");
        let role = msg
            .get_present("role")
            .ok_or_else(|| invalid_at(&rpath, |p| format!("`{p}` is required; allowed: {ROLES}")))
            .and_then(|r| typed(&rpath, r, json::as_str))?;
        let allowed_parts: &[&str] = match role.as_ref() {
            "system" | "developer" | "tool" => &["text"],
            "user" => &["text", "image_url", "input_audio", "file"],
            "assistant" => &["text", "refusal"],
            other => {
                return Err(invalid_at(&rpath, |p| {
                    format!("`{p}` must be one of {ROLES}; got {other:?}")
                }))
            }
        };
        let cpath = path.field("content");
        match msg.get_present("content") {
            None => {
                let has_calls = msg.get_present("tool_calls").is_some()
                    || msg.get_present("function_call").is_some();
                if !(role == "assistant" && has_calls) {
                    return Err(invalid_at(&cpath, |p| {
                        format!("`{p}` is required (it may be null only on an assistant message with tool_calls)")
                    }));
                }
            }
            Some(content) => {
                if json::as_str(content).is_err() {
                    let parts = json::as_array(content).map_err(|_| {
                        invalid_at(&cpath, |p| {
                            format!(
                                "`{p}` must be a string or an array of parts; got {}",
                                describe(content)
                            )
                        })
                    })?;
                    for (j, part) in parts.iter().enumerate() {
                        content_part(&cpath.index(j), *part, allowed_parts, model, client_model)?;
                    }
                }
            }
        }
        if role == "tool" {
            let tpath = path.field("tool_call_id");
            msg.get_present("tool_call_id")
                .ok_or_else(|| {
                    invalid_at(&tpath, |p| format!("`{p}` is required on a tool message"))
                })
                .and_then(|r| typed(&tpath, r, json::as_str))?;
        }
        if let Some(calls) = msg.get_present("tool_calls") {
            let tpath = path.field("tool_calls");
            if role != "assistant" {
                return Err(invalid_at(&tpath, |p| {
                    format!("`{p}` is allowed only on assistant messages")
                }));
            }
            let calls = typed(&tpath, calls, json::as_array)?;
            for (j, call) in calls.iter().enumerate() {
                let cp = tpath.index(j);
                let call = typed(&cp, *call, json::as_object)?;
                let fpath = cp.field("function");
                let f = call
                    .get_present("function")
                    .ok_or_else(|| required(&fpath))
                    .and_then(|r| typed(&fpath, r, json::as_object))?;
                let npath = fpath.field("name");
                f.get_present("name")
                    .ok_or_else(|| required(&npath))
                    .and_then(|r| typed(&npath, r, json::as_str))?;
                if let Some(a) = f.get_present("arguments") {
                    typed(&fpath.field("arguments"), a, json::as_str)?;
                }
            }
        }
    }
    Ok(())
}

/// The common shape of `messages`, accepted in one walk over text already parsed whole: every
/// message an object with a plain role and string content. Whatever else it meets (content
/// parts, tool calls, null content, escapes in keys, `\u` escapes in the strings it reads) it
/// leaves to the full check, which also says what is wrong; so it accepts only what that check
/// accepts.
fn plain_messages(raw: Raw<'_>) -> bool {
    // A string without `\u` escapes reads as text: no lone surrogate in it. A `\\u` (an escaped
    // backslash, then a `u`) is taken for one too, and left to the full check.
    let plain = |v: &str| {
        v.starts_with('"')
            && memchr::memchr_iter(b'\\', v.as_bytes())
                .all(|i| v.as_bytes().get(i + 1) != Some(&b'u'))
    };
    let count = json::known_objects(raw.get(), |members| {
        let (mut role, mut content, mut tool_call_id) = (None, None, None);
        for (key, value) in members {
            match key {
                "role" => role = Some(value),
                "content" => content = Some(value),
                "tool_call_id" => tool_call_id = Some(value),
                "tool_calls" | "function_call" if value != "null" => return false,
                _ if key.contains('\\') => return false,
                _ => {}
            }
        }
        let role_ok = match role {
            Some("\"system\"" | "\"developer\"" | "\"user\"" | "\"assistant\"") => true,
            Some("\"tool\"") => tool_call_id.is_some_and(plain),
            _ => false,
        };
        role_ok && content.is_some_and(plain)
    });
    count.is_some_and(|n| n > 0)
}

fn required(path: &Path<'_>) -> GatewayError {
    invalid_at(path, |p| format!("`{p}` is required"))
}

fn content_part(
    path: &Path<'_>,
    raw: Raw<'_>,
    allowed: &[&str],
    model: &Model,
    client_model: &str,
) -> Result<(), GatewayError> {
    let part = typed(path, raw, json::as_object)?;
    let tpath = path.field("type");
    let kind = part
        .get_present("type")
        .ok_or_else(|| {
            invalid_at(&tpath, |p| {
                format!("`{p}` is required; allowed here: {}", allowed.join(", "))
            })
        })
        .and_then(|r| typed(&tpath, r, json::as_str))?;
    if !allowed.contains(&kind.as_ref()) {
        return Err(invalid_at(&tpath, |p| {
            format!(
                "`{p}` must be one of {} for this role; got {kind:?}",
                allowed.join(", ")
            )
        }));
    }
    match kind.as_ref() {
        "text" => {
            let p = path.field("text");
            part.get_present("text")
                .ok_or_else(|| required(&p))
                .and_then(|r| typed(&p, r, json::as_str))?;
        }
        "image_url" => {
            if !model.vision {
                return Err(invalid_at(path, |p| {
                    format!("`{p}`: the model {client_model:?} does not accept image input; send text parts only")
                }));
            }
            let ipath = path.field("image_url");
            let image = part
                .get_present("image_url")
                .ok_or_else(|| required(&ipath))
                .and_then(|r| typed(&ipath, r, json::as_object))?;
            let upath = ipath.field("url");
            let url = image
                .get_present("url")
                .ok_or_else(|| required(&upath))
                .and_then(|r| typed(&upath, r, json::as_str))?;
            if !(url.starts_with("http://")
                || url.starts_with("https://")
                || url.starts_with("data:image/"))
            {
                return Err(invalid_at(&upath, |p| {
                    format!("`{p}` must be an http(s) URL or a data:image/...;base64 URL")
                }));
            }
            if let Some(d) = image.get_present("detail") {
                let dpath = ipath.field("detail");
                let detail = typed(&dpath, d, json::as_str)?;
                if !matches!(detail.as_ref(), "auto" | "low" | "high") {
                    return Err(invalid_at(&dpath, |p| {
                        format!("`{p}` must be auto, low or high; got {detail:?}")
                    }));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// The three thinking switches, which must agree, and must only reach a model that thinks.
fn thinking(
    obj: &RawObject,
    model: &Model,
    client_model: &str,
) -> Result<Option<bool>, GatewayError> {
    let mut votes: Vec<(&'static str, bool)> = Vec::new();
    if let Some(raw) = obj.get_present("chat_template_kwargs") {
        let kwargs = typed("chat_template_kwargs", raw, json::as_object)?;
        if let Some(v) = kwargs.get_present("enable_thinking") {
            votes.push((
                "chat_template_kwargs.enable_thinking",
                typed("chat_template_kwargs.enable_thinking", v, json::as_bool)?,
            ));
        }
    }
    if let Some(raw) = obj.get_present("thinking") {
        let t = typed("thinking", raw, json::as_object)?;
        let kind = t
            .get_present("type")
            .ok_or_else(|| {
                GatewayError::invalid(
                    "thinking.type",
                    "`thinking.type` is required: enabled or disabled",
                )
            })
            .and_then(|r| typed("thinking.type", r, json::as_str))?;
        let on = match kind.as_ref() {
            "enabled" => true,
            "disabled" => false,
            other => {
                return Err(GatewayError::invalid(
                    "thinking.type",
                    format!("`thinking.type` must be enabled or disabled; got {other:?}"),
                ))
            }
        };
        votes.push(("thinking.type", on));
    }
    if let Some(raw) = obj.get_present("enable_thinking") {
        votes.push((
            "enable_thinking",
            typed("enable_thinking", raw, json::as_bool)?,
        ));
    }
    let Some(&(first, on)) = votes.first() else {
        return Ok(None);
    };
    if model.thinking == ThinkingStyle::None {
        return Err(GatewayError::invalid(
            first,
            format!("the model {client_model:?} has no thinking mode; remove `{first}`"),
        ));
    }
    if let Some(&(other, _)) = votes.iter().find(|(_, v)| *v != on) {
        return Err(GatewayError::invalid(
            other,
            format!(
                "`{first}` and `{other}` disagree; send one thinking switch, or make them agree"
            ),
        ));
    }
    Ok(Some(on))
}

/// Parses a request body into its top-level object after checking the whole of it: a repeated
/// key or runaway nesting is refused here, on every path, passthrough included, before any field
/// is read. The common body takes one pass ([`json::scan::object`]); any other is parsed by serde
/// and checked by [`json::check_structure`], which name what is wrong.
pub fn request_object(bytes: &[u8]) -> Result<RawObject<'_>, GatewayError> {
    use crate::error::ErrorKind;
    use json::BodyProblem;
    // The common body in one pass; anything that pass is unsure of is judged below.
    if let Some(obj) = json::scan::object(bytes) {
        return Ok(obj);
    }
    let obj = RawObject::parse(bytes).map_err(|e| {
        let msg = if e.is_syntax() || e.is_eof() {
            format!("the request body is not valid JSON: {e}")
        } else {
            "the request body must be a JSON object".to_owned()
        };
        GatewayError::new(ErrorKind::InvalidRequest, msg)
    })?;
    match json::check_structure(bytes) {
        Ok(()) => Ok(obj),
        Err(BodyProblem::RepeatedKey { path }) => Err(GatewayError::invalid(
            &path,
            format!("`{path}` appears more than once; send each key once"),
        )),
        Err(BodyProblem::TooDeep { path }) => Err(GatewayError::invalid(
            &path,
            format!(
                "the request body nests deeper than {} levels at `{path}`",
                json::MAX_DEPTH
            ),
        )),
    }
}

/// The little a passed-through messages or responses body must satisfy before it goes upstream;
/// the upstream checks the rest in its own protocol. Returns whether a stream was asked for.
pub fn passthrough(
    obj: &RawObject,
    protocol: crate::config::Protocol,
) -> Result<bool, GatewayError> {
    use crate::config::Protocol;
    match protocol {
        Protocol::Messages => {
            if obj.get_present("max_tokens").is_none() {
                return Err(GatewayError::invalid(
                    "max_tokens",
                    "`max_tokens` is required",
                ));
            }
            int_in(obj, "max_tokens", 1, i64::MAX)?;
            let raw = obj
                .get_present("messages")
                .ok_or_else(|| GatewayError::invalid("messages", "`messages` is required"))?;
            // Only its type: the elements are read where the request is served or translated.
            typed("messages", raw, json::is_array)?;
        }
        Protocol::Responses => {
            if obj.get_present("input").is_none()
                && obj.get_present("previous_response_id").is_none()
            {
                return Err(GatewayError::invalid("input", "`input` is required"));
            }
        }
        Protocol::Chat => {}
    }
    Ok(bool_field(obj, "stream")?.unwrap_or(false))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    fn model() -> std::sync::Arc<Model> {
        let text =
            "[listen]\nbase = \"127.0.0.1:8080\"\n[[upstreams]]\nname = \"u\"\nkind = \"mock\"\n\
                    [[models]]\nname = \"m\"\nupstream = \"u\"\n";
        let config =
            crate::config::Config::parse(text, std::path::Path::new("."), &|_| None).unwrap();
        config.models[0].clone()
    }

    #[test]
    fn a_messages_body_needs_an_array_of_messages_however_long() {
        use crate::config::Protocol;
        let check = |body: &str| {
            let obj = request_object(body.as_bytes()).unwrap();
            passthrough(&obj, Protocol::Messages).map_err(|e| e.message)
        };
        assert_eq!(check(r#"{"max_tokens":8,"messages":[]}"#), Ok(false));
        assert_eq!(
            check(r#"{"max_tokens":8,"messages":[{"role":"user","content":"hi"}],"stream":true}"#),
            Ok(true)
        );
        for wrong in [r#""hi""#, "{}", "7", "true"] {
            let err = check(&format!(r#"{{"max_tokens":8,"messages":{wrong}}}"#)).unwrap_err();
            assert!(
                err.contains("messages") && err.contains("an array"),
                "{wrong}: {err}"
            );
        }
        // Null is as good as absent.
        for absent in [r#"{"max_tokens":8}"#, r#"{"max_tokens":8,"messages":null}"#] {
            let err = check(absent).unwrap_err();
            assert!(err.contains("`messages` is required"), "{absent}: {err}");
        }
    }

    /// The walk accepts the common shapes, and whatever it accepts the full check accepts too;
    /// the odd shapes are left to the full check, which refuses or accepts them itself.
    #[test]
    fn the_plain_walk_accepts_only_what_the_full_check_accepts() {
        let model = model();
        let plain = [
            r#"[{"role":"user","content":"hi"}]"#,
            r#"[ {"role" : "system", "content":"be \"terse\"\n"} , {"name":"x","role":"user","content":"[{]}"} ]"#,
            r#"[{"role":"assistant","content":"ok","tool_calls":null},{"role":"tool","tool_call_id":"c1","content":""}]"#,
            r#"[{"role":"developer","content":"\\","extra":{"a":[1,{"b":"}"}],"n":-1.5e3,"t":true}}]"#,
        ];
        for text in plain {
            let raw: Box<serde_json::value::RawValue> = serde_json::from_str(text).unwrap();
            assert!(plain_messages((&*raw).into()), "{text}");
            all_messages((&*raw).into(), &model, "m").unwrap();
        }
        let left = [
            "[]",
            "{}",
            r#"[{"role":"user","content":["x"]}]"#,
            r#"[{"role":"user","content":[{"type":"text","text":"hi"}]}]"#,
            r#"[{"role":"user","content":null}]"#,
            r#"[{"role":"user"}]"#,
            r#"[{"role":"robot","content":"hi"}]"#,
            r#"[{"role":"tool","content":"hi"}]"#,
            r#"[{"role":"tool","content":"hi","tool_call_id":7}]"#,
            r#"[{"role":"user","content":"\ud800"}]"#,
            r#"[{"role":"user","content":"\u00e9"}]"#,
            r#"[{"role":"user","content":"hi","tool_calls":[]}]"#,
            r#"[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f"}}]}]"#,
            r#"[{"\u0072ole":"user","content":"hi"}]"#,
            r#"[{"role":"\u0075ser","content":"hi"}]"#,
            r#"[{"role":"user","content":7}]"#,
            r#"[{"role":"user","content":"hi"},"x"]"#,
            r#"[{"role":"user","content":"hi"},null]"#,
        ];
        for text in left {
            let raw: Box<serde_json::value::RawValue> = serde_json::from_str(text).unwrap();
            assert!(!plain_messages((&*raw).into()), "{text}");
        }
        // Left to the full check, some are still fine and some are refused, each as before.
        let full = |t: &str| {
            let raw: Box<serde_json::value::RawValue> = serde_json::from_str(t).unwrap();
            all_messages((&*raw).into(), &model, "m")
        };
        assert!(full(r#"[{"role":"user","content":"\u00e9"}]"#).is_ok());
        assert!(full(r#"[{"\u0072ole":"user","content":"hi"}]"#).is_ok());
        let e = full(r#"[{"role":"user","content":"\ud800"}]"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        let e = full(r#"[{"role":"tool","content":"hi"}]"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_call_id"));
    }

    proptest::proptest! {
        /// Messages put together from the pieces the two checks tell apart: whatever the walk
        /// accepts, the full check accepts.
        #[test]
        fn the_walk_never_accepts_what_the_full_check_refuses(
            messages in proptest::collection::vec(
                (
                    // Mostly a role, mostly a string content: the shape the walk takes.
                    proptest::option::weighted(0.9, 0usize..8),
                    proptest::option::weighted(0.9, 0usize..14),
                    proptest::collection::vec((0usize..KEYS.len(), 0usize..VALUES.len()), 0..3),
                ),
                0..4,
            ),
            spaced in proptest::bool::ANY,
        ) {
            let sep = if spaced { " , " } else { "," };
            let items: Vec<String> = messages
                .iter()
                .map(|(role, content, extra)| {
                    // One value per key, as the body check leaves it.
                    let mut seen = std::collections::HashSet::new();
                    let fields = role
                        .map(|v| (0, v))
                        .into_iter()
                        .chain(content.map(|v| (1, v)))
                        .chain(extra.iter().copied());
                    let members: Vec<String> = fields
                        .filter(|(k, _)| seen.insert(*k))
                        .map(|(k, v)| format!("{}:{}", KEYS[k], VALUES[v]))
                        .collect();
                    format!("{{{}}}", members.join(sep))
                })
                .collect();
            let text = format!("[{}]", items.join(sep));
            let raw: Box<serde_json::value::RawValue> = serde_json::from_str(&text).unwrap();
            if plain_messages((&*raw).into()) {
                proptest::prop_assert!(all_messages((&*raw).into(), &model(), "m").is_ok(), "{}", text);
            }
        }
    }

    const KEYS: &[&str] = &[
        r#""role""#,
        r#""content""#,
        r#""tool_call_id""#,
        r#""tool_calls""#,
        r#""function_call""#,
        r#""name""#,
        r#""\u0072ole""#,
    ];

    /// The first eight are roles, good and bad; the first fourteen, contents.
    const VALUES: &[&str] = &[
        r#""user""#,
        r#""assistant""#,
        r#""system""#,
        r#""tool""#,
        r#""developer""#,
        r#""robot""#,
        r#""\u0075ser""#,
        "null",
        r#""hi""#,
        r#""text with \"quotes\" and ] }""#,
        r#""\ud800""#,
        r#""\\u0041""#,
        r#""\n\t\\""#,
        "[]",
        "7",
        r#"[{"type":"text","text":"hi"}]"#,
        r#"[{"type":"image_url","image_url":{"url":"http://x"}}]"#,
        r#"[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]"#,
        r#"{"name":"f","arguments":"{}"}"#,
        "{}",
    ];
}
