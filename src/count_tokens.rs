//! `POST /v1/messages/count_tokens` (gateway.md §13): the body checked as a messages request, the URL a messages upstream counts at, and an o200k BPE estimate over what would be sent to any other upstream.

use bytes::Bytes;
use http::Uri;

use crate::config::Protocol;
use crate::error::{ErrorKind, GatewayError};
use crate::ir::{self, Part};
use crate::json::{self, RawObject};
use crate::translate::Decoded;

/// Tokens an image is counted as: Anthropic's figure for its largest unresized image
/// (about 1.15 megapixels at 750 pixels a token), since the estimate cannot see its size.
const IMAGE_TOKENS: u64 = 1600;
/// What each message adds around its content (OpenAI's published chat overhead).
const PER_MESSAGE: u64 = 3;

/// The client's body as a messages request for checking: count_tokens takes no `max_tokens`,
/// which the messages decoder otherwise requires, so a placeholder is written in.
pub fn checkable(body: &Bytes) -> Result<Vec<u8>, GatewayError> {
    let mut obj = RawObject::parse(body).map_err(|e| {
        GatewayError::new(
            ErrorKind::InvalidRequest,
            format!("the request body is not a JSON object: {e}"),
        )
    })?;
    if obj.get_present("max_tokens").is_none() {
        obj.set("max_tokens", json::to_raw(&1));
    }
    Ok(obj.to_vec())
}

/// The messages request read into a decoded request, refusing what a messages request may not hold.
pub fn decode(body: &Bytes, client_model: &str) -> Result<Decoded, GatewayError> {
    Decoded::new(Protocol::Messages, &checkable(body)?, client_model)
}

/// Where a messages upstream counts tokens: its messages URL with `/count_tokens` appended.
pub fn upstream_uri(messages: &Uri) -> Option<Uri> {
    let mut parts = messages.clone().into_parts();
    let pq = parts.path_and_query.as_ref()?;
    let joined = match pq.query() {
        Some(q) => format!("{}/count_tokens?{q}", pq.path().trim_end_matches('/')),
        None => format!("{}/count_tokens", pq.path().trim_end_matches('/')),
    };
    parts.path_and_query = Some(joined.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// Tokens of the IR's text: system, every part, every tool's name, description and schema. The
/// IR is what every upstream is sent: hosted tools are already out of it, and thinking costs no input.
pub fn count(r: &ir::Request) -> u64 {
    let bpe = tiktoken_rs::o200k_base_singleton();
    let n = |s: &str| bpe.count_ordinary(s) as u64;
    let mut total = PER_MESSAGE;
    for s in &r.system {
        total += PER_MESSAGE + n(s);
    }
    fn parts(content: &[Part], n: &dyn Fn(&str) -> u64) -> u64 {
        content
            .iter()
            .map(|p| match p {
                Part::Text(t) => n(t),
                Part::Image(_) => IMAGE_TOKENS,
                Part::ToolCall {
                    name, arguments, ..
                } => n(name) + n(arguments),
                Part::ToolResult { content, .. } => parts(content, n),
                Part::Reasoning(rs) => n(&rs.text),
            })
            .sum()
    }
    for m in &r.messages {
        total += PER_MESSAGE + parts(&m.content, &n);
    }
    for t in &r.tools {
        total += n(&t.name) + t.description.as_deref().map_or(0, n) + n(t.parameters.get());
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_url_follows_the_messages_url() {
        let u: Uri = "https://api.anthropic.com/v1/messages?beta=true"
            .parse()
            .unwrap_or_default();
        assert_eq!(
            upstream_uri(&u).map(|u| u.to_string()),
            Some("https://api.anthropic.com/v1/messages/count_tokens?beta=true".to_owned())
        );
    }

    #[test]
    fn more_text_counts_more() {
        let body = Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hello there"}]}"#,
        );
        let short = decode(&body, "m").map(|d| count(&d.ir)).unwrap_or(0);
        let body = Bytes::from_static(
            br#"{"model":"m","system":"You are terse.","messages":[{"role":"user","content":"hello there, how are you doing today?"}]}"#,
        );
        let long = decode(&body, "m").map(|d| count(&d.ir)).unwrap_or(0);
        assert!(short > PER_MESSAGE && long > short, "{short} {long}");
    }

    #[test]
    fn text_is_counted_in_o200k_tokens() {
        // o200k splits these into known pieces: "hello", " world" (2), and the 40 repetitions of
        // " the" (40), where a count of characters or words would give other figures.
        let count_of = |text: &str| {
            let body =
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]});
            let body = Bytes::from(body.to_string());
            decode(&body, "m").map(|d| count(&d.ir)).unwrap_or(0)
        };
        let frame = 2 * PER_MESSAGE;
        assert_eq!(count_of("hello world"), frame + 2);
        assert_eq!(count_of(&" the".repeat(40)), frame + 40);
    }
}
