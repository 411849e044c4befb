//! A chat reply of the common shape (one choice whose message is a text and nothing else the IR keeps) read in one pass, its text left as the JSON string it came in.
//!
//! Most replies are this shape, and a messages client's reply for one is that text in a text
//! block: read this way, the reply needs no IR between, no string unescaped and escaped again,
//! no allocation but the id's and the written reply's. Anything else (tool calls, reasoning, a
//! refusal, an empty or absent text, a repeated member, a `\u` or `\/` escape, a `created` that
//! is not a plain integer) answers `None`, and the reply takes the IR's path, which reads every
//! shape. So this reader is held to one rule: for what it answers, the reply written from it is
//! byte for byte the IR path's, and the usage the same.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use super::finish_from;
use crate::ir::{Finish, Usage};
use crate::json::walk;
use crate::translate::common::string_as_written;
use crate::translate::counts::Counts;

/// What [`read`] found in a plain reply.
#[derive(Debug)]
pub struct Plain<'a> {
    pub id: &'a str,
    /// The message's text as the JSON string it came as, quotes included. Its only escapes are
    /// the short ones serde writes (`\"`, `\\`, `\n`, …), so it is the text as
    /// [`crate::json::write_json_str`] writes it and is copied as it is.
    pub text: &'a str,
    pub finish: Finish,
    pub usage: Usage,
}

/// Reads `text`, a whole reply, when it is plain; `None` leaves it to the IR's path.
pub fn read(text: &str) -> Option<Plain<'_>> {
    let b = text.as_bytes();
    if calls_tools(b) {
        return None;
    }
    let mut id = None;
    let mut choice = None;
    let mut usage = None;
    let end = walk::object::<true>(b, walk::space(b, 0), |key, at| match key {
        b"id" if id.is_none() => {
            let (end, s) = bare_string(text, at)?;
            id = Some(s);
            Some(end)
        }
        // Neither reaches a messages reply, but the IR path reads both, and refuses what
        // serde cannot read of them: taken only as the plain scalars they are.
        b"model" => bare_string(text, at).map(|(end, _)| end),
        b"created" => {
            let end = walk::number(b, at)?;
            b[at..end].iter().all(u8::is_ascii_digit).then_some(end)
        }
        b"choices" if choice.is_none() => {
            let (end, c) = first_choice(text, at)?;
            choice = Some(c);
            Some(end)
        }
        b"usage" if usage.is_none() => {
            let end = walk::skip::<true>(b, at, 1)?;
            usage = Some(&b[at..end]);
            Some(end)
        }
        b"id" | b"choices" | b"usage" => None,
        _ => walk::skip::<true>(b, at, 1),
    })?;
    if walk::space(b, end) != b.len() {
        return None;
    }
    let (text, finish) = choice?;
    // Read as the IR path reads it: a usage that is no object, or unreadable, counts nothing.
    let mut counted = Usage::default();
    if let Some(counts) = usage.and_then(Counts::object_at) {
        counts.read_into(crate::config::Protocol::Chat, &mut counted);
    }
    Some(Plain {
        id: id?,
        text,
        finish,
        usage: counted,
    })
}

/// The commonest reply that is not plain calls tools, and its `tool_calls` comes after the text
/// the pass would have read: looked for first, so such a reply is not read twice.
static TOOL_CALLS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"tool_calls\""));

/// Whether the reply has a `tool_calls` member holding an array, anywhere. Inside a string the
/// quotes would be escaped, so each match is a key or the string `"tool_calls"` (a finish
/// reason), told apart by what follows it.
fn calls_tools(b: &[u8]) -> bool {
    TOOL_CALLS.find_iter(b).any(|at| {
        let colon = walk::space(b, at + b"\"tool_calls\"".len());
        b.get(colon) == Some(&b':') && b.get(walk::space(b, colon + 1)) == Some(&b'[')
    })
}

/// The string at `at` when it has no escape: its end, and its text.
fn bare_string(text: &str, at: usize) -> Option<(usize, &str)> {
    let b = text.as_bytes();
    if b.get(at) != Some(&b'"') {
        return None;
    }
    match walk::string::<true>(b, at + 1)? {
        (end, false) => Some((end, text.get(at + 1..end - 1)?)),
        (_, true) => None,
    }
}

/// The first choice of the array at `at`, when it is plain: its text and finish. The other
/// choices are checked and skipped, as the IR path skips them.
fn first_choice(text: &str, at: usize) -> Option<(usize, (&str, Finish))> {
    let b = text.as_bytes();
    if b.get(at) != Some(&b'[') {
        return None;
    }
    let mut message = None;
    let mut finish = None;
    let mut i = walk::object::<true>(b, walk::space(b, at + 1), |key, at| match key {
        b"message" if message.is_none() => {
            let (end, t) = message_text(text, at)?;
            message = Some(t);
            Some(end)
        }
        b"finish_reason" if finish.is_none() => {
            if let Some(end) = walk::literal(b, at, b"null") {
                finish = Some(None);
                return Some(end);
            }
            let (end, s) = bare_string(text, at)?;
            finish = Some(Some(s));
            Some(end)
        }
        b"message" | b"finish_reason" => None,
        _ => walk::skip::<true>(b, at, 3),
    })?;
    loop {
        i = walk::space(b, i);
        match b.get(i)? {
            b']' => break,
            b',' => i = walk::skip::<true>(b, walk::space(b, i + 1), 2)?,
            _ => return None,
        }
    }
    Some((i + 1, (message?, finish_from(finish.flatten()))))
}

/// The text of the message object at `at`, when it is its only part.
fn message_text(text: &str, at: usize) -> Option<(usize, &str)> {
    let b = text.as_bytes();
    let mut content = None;
    let end = walk::object::<true>(b, at, |key, at| match key {
        b"content" if content.is_none() => {
            // An empty text is no part of the IR's reply.
            let (end, t) = string_as_written(text, at).filter(|(_, t)| t.len() > 2)?;
            content = Some(t);
            Some(end)
        }
        b"content" => None,
        // Each would add a part to the IR's reply unless null.
        b"refusal" | b"reasoning_content" | b"reasoning" | b"tool_calls" => {
            walk::literal(b, at, b"null")
        }
        _ => walk::skip::<true>(b, at, 4),
    })?;
    Some((end, content?))
}

#[cfg(test)]
mod tests;
