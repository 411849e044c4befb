//! Reads the token usage out of an upstream reply as it passes, JSON or event stream, in any of the three protocols, without changing a byte, and hands it to the key's meter when the reply ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::Value;

use crate::config::Protocol;
use crate::limits::Meter;
use crate::sse::{SseDecoder, SseEvent};

/// Tokens a reply reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// The whole prompt, cache reads and writes included.
    pub input: u64,
    pub output: u64,
    /// The part of `input` read from a prompt cache.
    pub cached: u64,
}

impl Tokens {
    pub fn total(&self) -> u64 {
        self.input + self.output
    }
}

/// How much of a JSON reply's end is kept to find its top-level `usage`, which all three
/// protocols write after the content.
const JSON_TAIL: usize = 64 * 1024;

/// Follows one reply's bytes and keeps the usage it reports.
#[derive(Debug)]
pub struct UsageReader {
    protocol: Protocol,
    kind: Kind,
    tokens: Tokens,
}

#[derive(Debug)]
enum Kind {
    /// The last `JSON_TAIL` bytes of a JSON body.
    Json(Vec<u8>),
    /// Events decoded as they come; only those mentioning usage are parsed.
    Sse(SseDecoder, Vec<SseEvent>),
}

impl UsageReader {
    pub fn new(protocol: Protocol, stream: bool) -> Self {
        let kind = if stream {
            Kind::Sse(SseDecoder::new(), Vec::new())
        } else {
            Kind::Json(Vec::new())
        };
        Self {
            protocol,
            kind,
            tokens: Tokens::default(),
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        match &mut self.kind {
            Kind::Json(tail) => {
                tail.extend_from_slice(bytes);
                if tail.len() > 2 * JSON_TAIL {
                    let cut = tail.len() - JSON_TAIL;
                    tail.drain(..cut);
                }
            }
            Kind::Sse(decoder, events) => {
                decoder.feed(bytes, events);
                for ev in events.drain(..) {
                    if ev.data.contains("\"usage\"") {
                        if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                            read_event(self.protocol, &v, &mut self.tokens);
                        }
                    }
                }
            }
        }
    }

    /// The usage seen, once the reply has ended (or been cut).
    pub fn finish(&mut self) -> Tokens {
        if let Kind::Json(tail) = &self.kind {
            if let Some(u) = last_usage(tail) {
                read_usage(self.protocol, &u, &mut self.tokens);
            }
        }
        self.tokens
    }
}

/// The value of the last `"usage":` key in `tail` that is not inside a string.
fn last_usage(tail: &[u8]) -> Option<Value> {
    let needle = b"\"usage\"";
    let mut end = tail.len();
    while let Some(at) = memchr::memmem::rfind(&tail[..end], needle) {
        // An escaped quote (`\"usage\"`) is text a model wrote, not a key.
        if at == 0 || tail[at - 1] != b'\\' {
            let rest = &tail[at + needle.len()..];
            let rest = rest.trim_ascii_start();
            if let Some(value) = rest.strip_prefix(b":") {
                let mut de = serde_json::Deserializer::from_slice(value).into_iter::<Value>();
                if let Some(Ok(v @ Value::Object(_))) = de.next() {
                    return Some(v);
                }
            }
        }
        end = at;
    }
    None
}

fn n(v: &Value, pointer: &str) -> Option<u64> {
    v.pointer(pointer).and_then(Value::as_u64)
}

/// One stream event's usage, by protocol: a chat chunk's `usage`; Anthropic's input in
/// `message_start` and output in `message_delta`; a terminal Responses event's `response.usage`.
fn read_event(protocol: Protocol, v: &Value, t: &mut Tokens) {
    let usage = match protocol {
        Protocol::Chat => v.get("usage"),
        Protocol::Messages => v.pointer("/message/usage").or_else(|| v.get("usage")),
        Protocol::Responses => v.pointer("/response/usage"),
    };
    if let Some(u) = usage.filter(|u| u.is_object()) {
        read_usage(protocol, u, t);
    }
}

/// A `usage` object in `protocol`'s words. Values replace what was seen (streams repeat them
/// cumulatively); a field not given keeps its value.
fn read_usage(protocol: Protocol, u: &Value, t: &mut Tokens) {
    match protocol {
        Protocol::Chat => {
            if let Some(x) = n(u, "/prompt_tokens") {
                t.input = x;
            }
            if let Some(x) = n(u, "/completion_tokens") {
                t.output = x;
            }
            if let Some(x) = n(u, "/prompt_tokens_details/cached_tokens") {
                t.cached = x;
            }
        }
        Protocol::Messages => {
            // Anthropic's input_tokens excludes the cache: the prompt is the sum of the three.
            let plain = n(u, "/input_tokens");
            let read = n(u, "/cache_read_input_tokens");
            let write = n(u, "/cache_creation_input_tokens");
            if plain.is_some() || read.is_some() || write.is_some() {
                t.input = plain.unwrap_or(0) + read.unwrap_or(0) + write.unwrap_or(0);
            }
            if let Some(x) = read {
                t.cached = x;
            }
            if let Some(x) = n(u, "/output_tokens") {
                t.output = x;
            }
        }
        Protocol::Responses => {
            if let Some(x) = n(u, "/input_tokens") {
                t.input = x;
            }
            if let Some(x) = n(u, "/output_tokens") {
                t.output = x;
            }
            if let Some(x) = n(u, "/input_tokens_details/cached_tokens") {
                t.cached = x;
            }
        }
    }
}

pin_project! {
    /// An upstream body passed on untouched while its usage is read; the key's meter is
    /// charged when the body ends or is dropped (a client that leaves still pays for what
    /// the upstream reported).
    pub struct Metered<B> {
        #[pin]
        inner: B,
        reader: UsageReader,
        meter: Option<Meter>,
    }

    impl<B> PinnedDrop for Metered<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(meter) = this.meter.take() {
                meter.charge(this.reader.finish().total());
            }
        }
    }
}

impl<B> Metered<B> {
    pub fn new(inner: B, reader: UsageReader, meter: Meter) -> Self {
        Self {
            inner,
            reader,
            meter: Some(meter),
        }
    }
}

impl<B> HttpBody for Metered<B>
where
    B: HttpBody<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.reader.feed(data);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(protocol: Protocol, stream: bool, body: &str) -> Tokens {
        let mut r = UsageReader::new(protocol, stream);
        // Byte by byte: no frame boundary may matter.
        for b in body.as_bytes() {
            r.feed(std::slice::from_ref(b));
        }
        r.finish()
    }

    #[test]
    fn usage_from_every_protocol_json_and_stream() {
        let chat = r#"{"id":"c","choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\": 999}"}}],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(
            read(Protocol::Chat, false, chat),
            Tokens {
                input: 12,
                output: 5,
                cached: 4
            }
        );
        let chat_sse = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
        assert_eq!(read(Protocol::Chat, true, chat_sse).total(), 10);
        let messages = r#"{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_read_input_tokens":20,"cache_creation_input_tokens":5,"output_tokens":8}}"#;
        assert_eq!(
            read(Protocol::Messages, false, messages),
            Tokens {
                input: 35,
                output: 8,
                cached: 20
            }
        );
        let messages_sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(
            read(Protocol::Messages, true, messages_sse),
            Tokens {
                input: 9,
                output: 30,
                cached: 0
            }
        );
        let responses_sse = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":11,\"output_tokens\":6,\"input_tokens_details\":{\"cached_tokens\":2}}}}\n\n";
        assert_eq!(
            read(Protocol::Responses, true, responses_sse),
            Tokens {
                input: 11,
                output: 6,
                cached: 2
            }
        );
        let responses = r#"{"output":[],"usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(read(Protocol::Responses, false, responses).total(), 7);
        assert_eq!(read(Protocol::Chat, false, "not json").total(), 0);
    }
}
