//! A messages request of the common shape (a text system prompt, turns of text, the sampling numbers) written as a chat upstream's body in one pass, its strings copied as the JSON they came in.
//!
//! An SDK's plain call is this shape, and its chat body is the same texts in chat's messages:
//! written this way, the request needs no IR between, no string unescaped and escaped again, and
//! no allocation but the body's. Anything else (content blocks, tools, thinking, stop sequences,
//! metadata, a `null`, two turns of one role in a row, a `\u` or `\/` escape, any other member)
//! answers `None`, and the request takes the IR's path, which reads every shape. So this writer
//! is held to one rule: for what it answers, the body is byte for byte the IR path's for every
//! target, and the reply is read as for the IR path's request. It refuses nothing itself: what
//! the IR path would refuse it leaves to that path, which names the field.

use crate::json::write::Object;
use crate::json::{walk, RawObject};
use crate::translate::common::string_as_written;
use crate::translate::hand::number_at;

/// The chat body of a plain request for `upstream_model`, and whether it streams; `None` leaves
/// the request to the IR's path.
pub fn chat_body(obj: &RawObject<'_>, upstream_model: &str) -> Option<(Vec<u8>, bool)> {
    let mut max_tokens = None;
    let mut system = None;
    let mut messages = None;
    let mut temperature = None;
    let mut top_p = None;
    let mut stream = None;
    let mut size = upstream_model.len() + 128;
    for (key, value) in obj.members() {
        let text = value.get();
        size += text.len();
        let repeated = match key {
            // Checked by the request's validation; the body names the upstream's model instead.
            "model" => false,
            "max_tokens" => max_tokens.replace(count(text)?).is_some(),
            "system" => system.replace(whole_string(text)?).is_some(),
            "messages" => messages.replace(value).is_some(),
            "temperature" => temperature.replace(unit(text)?).is_some(),
            "top_p" => top_p.replace(unit(text)?).is_some(),
            "stream" => stream.replace(boolean(text)?).is_some(),
            _ => return None,
        };
        // A validated body repeats no key; only the IR's read would tell which one counts.
        if repeated {
            return None;
        }
    }
    let stream = stream.unwrap_or(false);
    let mut body = Vec::with_capacity(size);
    let mut o = Object::open(&mut body);
    o.str("model", upstream_model);
    let out = o.key("messages");
    out.push(b'[');
    if let Some(s) = system {
        out.extend_from_slice(b"{\"role\":\"system\",\"content\":");
        out.extend_from_slice(s.as_bytes());
        out.push(b'}');
    }
    turns(messages?.get(), out, system.is_some())?;
    out.push(b']');
    o.some_u64("max_tokens", Some(max_tokens?));
    o.some_f64("temperature", temperature);
    o.some_f64("top_p", top_p);
    if stream {
        o.some_bool("stream", Some(true));
        // As the IR's path asks: the client protocols on the other side report usage at the end.
        let mut so = Object::open(o.key("stream_options"));
        so.bool("include_usage", true);
        so.close();
    }
    o.close();
    Some((body, stream))
}

/// Writes the turns of the `messages` array `text` after what `out` holds (`more`: a message
/// before them), when each is a user or assistant turn whose content is a string and no two
/// in a row share a role (the IR's path would merge them).
fn turns(text: &str, out: &mut Vec<u8>, mut more: bool) -> Option<()> {
    let b = text.as_bytes();
    if b.first() != Some(&b'[') {
        return None;
    }
    let mut last: Option<bool> = None;
    let end = walk::array(b, 0, |at| {
        let mut user = None;
        let mut content = None;
        let end = walk::object::<true>(b, at, |key, at| match key {
            b"role" if user.is_none() => {
                let (end, role) = string_as_written(text, at)?;
                user = Some(match role {
                    "\"user\"" => true,
                    "\"assistant\"" => false,
                    _ => return None,
                });
                Some(end)
            }
            b"content" if content.is_none() => {
                let (end, c) = string_as_written(text, at)?;
                content = Some(c);
                Some(end)
            }
            _ => None,
        })?;
        let (user, content) = (user?, content?);
        if last == Some(user) {
            return None;
        }
        last = Some(user);
        if more {
            out.push(b',');
        }
        more = true;
        out.extend_from_slice(if user {
            b"{\"role\":\"user\",\"content\":"
        } else {
            b"{\"role\":\"assistant\",\"content\":"
        });
        out.extend_from_slice(content.as_bytes());
        out.push(b'}');
        Some(end)
    })?;
    // An empty list is the IR's path's to refuse.
    (end == b.len() && last.is_some()).then_some(())
}

/// The whole of `text` when it is a string copied as written.
fn whole_string(text: &str) -> Option<&str> {
    string_as_written(text, 0).and_then(|(end, s)| (end == text.len()).then_some(s))
}

/// A count of at least one, as the IR's path reads `max_tokens`.
fn count(text: &str) -> Option<u64> {
    let (n, end) = number_at(text, 0)?;
    n.as_u64().filter(|&n| n >= 1 && end == text.len())
}

/// A number in `[0, 1]`, as the IR's path reads `temperature` and `top_p`.
fn unit(text: &str) -> Option<f64> {
    let (n, end) = number_at(text, 0)?;
    n.as_f64()
        .filter(|x| (0.0..=1.0).contains(x) && end == text.len())
}

fn boolean(text: &str) -> Option<bool> {
    match text {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
