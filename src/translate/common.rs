//! Small helpers shared by the three protocol codecs: lenient reads of upstream JSON, refusals that name the field, message merging, strings copied as written and body encoding.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

use crate::error::{ErrorKind, GatewayError};
use crate::ir::{Message, Part, Role};

/// The schema a tool gets when its client gave none: an object with no properties.
pub const EMPTY_SCHEMA: &str = r#"{"type":"object","properties":{}}"#;

/// An upstream request body, serialised straight from its wire struct.
pub fn encoded<T: Serialize>(body: &T) -> Result<Vec<u8>, GatewayError> {
    let mut out = Vec::with_capacity(2048);
    serde_json::to_writer(&mut out, body).map_err(|e| {
        GatewayError::new(
            ErrorKind::Internal,
            format!("encoding the upstream request: {e}"),
        )
    })?;
    Ok(out)
}

/// The string at `at`, quotes included, when its text written again (by
/// [`crate::json::write_json_str`], as serde writes it) is these very bytes: when every escape
/// in it is a short one. `\u` (which serde writes only for the control characters with no short
/// form) and `\/` are not. A one-pass reader copies such a string rather than unescaping it
/// into the IR and escaping it again.
pub fn string_as_written(text: &str, at: usize) -> Option<(usize, &str)> {
    let b = text.as_bytes();
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let (end, escaped) = crate::json::walk::string::<true>(b, at + 1)?;
    if escaped && !short_escapes_only(b.get(at + 1..end - 1)?) {
        return None;
    }
    Some((end, text.get(at..end)?))
}

/// Whether every escape in a string's (checked) text is one serde writes as it is.
fn short_escapes_only(inside: &[u8]) -> bool {
    let mut rest = inside;
    while let Some(k) = memchr::memchr(b'\\', rest) {
        match rest.get(k + 1) {
            Some(b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't') => rest = &rest[k + 2..],
            _ => return false,
        }
    }
    true
}

/// A request's system text as one string for an upstream that takes one: blank lines between
/// its parts, and borrowed when there is a single part (the usual prompt), not copied.
pub fn system_text(parts: &[String]) -> Option<Cow<'_, str>> {
    match parts {
        [] => None,
        [one] => Some(Cow::Borrowed(one)),
        many => Some(Cow::Owned(many.join("\n\n"))),
    }
}

/// Appends parts as a message, merging with the previous message of the same role.
pub fn push(messages: &mut Vec<Message>, role: Role, parts: Vec<Part>) {
    match messages.last_mut() {
        Some(last) if last.role == role => last.content.extend(parts),
        _ => messages.push(Message {
            role,
            content: parts,
        }),
    }
}

/// The text of a tool result's parts, one per line (images cannot go back as text).
pub fn tool_result_text(content: &[Part]) -> String {
    let mut text = String::new();
    for p in content {
        if let Part::Text(t) = p {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(t);
        }
    }
    text
}

/// A string field of an upstream's JSON, or "" when absent or not a string (replies are read
/// leniently: an odd field must not fail the whole answer).
pub fn str_at(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

/// A refusal for a field that cannot cross to another protocol.
pub fn unsupported(param: &str, why: &str) -> GatewayError {
    GatewayError::invalid(
        param,
        format!("`{param}` cannot be translated for this model's upstream: {why}"),
    )
}

/// Re-prefixes an upstream id for the client's protocol (`msg_01A` → `chatcmpl-01A`), so ids
/// stay traceable across the translation and deterministic for the same upstream reply.
pub fn reprefix(id: &str, prefix: &str) -> String {
    if id.starts_with(prefix) {
        return id.to_owned();
    }
    let bare = ["chatcmpl-", "msg_", "resp_"]
        .iter()
        .find_map(|p| id.strip_prefix(p))
        .unwrap_or(id);
    if bare.is_empty() {
        return crate::ir::mint_id(prefix);
    }
    // One allocation of the exact size; `format!` grew its buffer through the formatter.
    [prefix, bare].concat()
}

/// The value at `path` under `v`, one key (or array index) per step. `Value::pointer` does the
/// same from a string but unescapes each step with two `str::replace` calls, which showed up on
/// every request's usage read.
pub fn at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |cur, step| match cur {
        Value::Array(items) => step.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => cur.get(*step),
    })
}

/// `{}`, for a member that is always an empty object.
#[derive(Serialize)]
pub struct EmptyObject {}

/// Texts that test what a hand-written JSON string must do as serde does: nothing to escape,
/// quotes and backslashes, control characters and DEL, text past ASCII.
#[cfg(test)]
pub(crate) const AWKWARD_TEXTS: [&str; 5] = [
    "",
    "plain",
    "quote \" backslash \\ slash / newline \n tab \t",
    "control \u{1} \u{1f} del \u{7f}",
    "é 日本 😀",
];
