//! Base64 video bytes inside an upstream's JSON operation: found by key while the JSON streams, then left out (lookup) or decoded chunk by chunk (download).
//!
//! Veo answers a job without `storageUri` with the whole video as one base64 string inside the
//! operation JSON. A lookup must read that JSON to learn the state, but never needs the video, so
//! [`read_elided`] copies everything except the string's contents. A download fetches the
//! operation again and [`DecodeBody`] turns the string into video bytes as the JSON arrives, so
//! neither path ever holds the whole video.

use std::pin::Pin;
use std::task::{Context, Poll};

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

use crate::body::BoxError;
use crate::error::{ErrorKind, GatewayError};

/// Keys whose string value is video bytes: Vertex `videos[].bytesBase64Encoded`, Gemini `video.encodedVideo`.
const KEYS: [&[u8]; 2] = [b"bytesBase64Encoded", b"encodedVideo"];
const KEY_MAX: usize = 18;

/// Proto3 JSON writes bytes as standard base64 with padding but accepts URL-safe too; so do we.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Which part of the JSON a run of bytes belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Everything outside the video string, quotes included.
    Json,
    /// The video string's characters (unescaped).
    Video,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Outside,
    /// Inside a string that is not a video value (maybe a key).
    Str {
        escape: bool,
    },
    /// Inside a video value.
    Value {
        escape: bool,
    },
    /// Past the first video value, when only the first is wanted.
    Done,
}

/// A minimal JSON tokenizer: enough to tell keys, strings and the video values apart in any split of the bytes.
pub struct Scanner {
    state: State,
    key: [u8; KEY_MAX],
    key_len: usize,
    /// The current string can no longer be one of `KEYS` (too long, or escaped).
    key_spoiled: bool,
    /// The last string closed was one of `KEYS` (so a `:` next makes the following string a video value).
    after_key: bool,
    awaiting_value: bool,
    first_only: bool,
    /// Video values started so far.
    pub found: usize,
}

impl Scanner {
    /// `first_only`: stop at the end of the first video value (downloads want sample 0).
    pub fn new(first_only: bool) -> Self {
        Self {
            state: State::Outside,
            key: [0; KEY_MAX],
            key_len: 0,
            key_spoiled: false,
            after_key: false,
            awaiting_value: false,
            first_only,
            found: 0,
        }
    }

    /// True once the first video value has closed (with `first_only`).
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// True while inside a video value (the input must not end here).
    pub fn in_value(&self) -> bool {
        matches!(self.state, State::Value { .. })
    }

    /// Splits `chunk` into runs of `Part`s and hands each to `out`.
    pub fn feed(&mut self, chunk: &[u8], mut out: impl FnMut(Part, &[u8])) {
        let mut i = 0;
        let mut run_start = 0;
        while i < chunk.len() {
            match self.state {
                State::Done => return,
                State::Value { escape } => {
                    if escape {
                        // Base64 never needs escaping, but `\/` is legal JSON for `/`.
                        if chunk[i] == b'/' {
                            out(Part::Video, b"/");
                        }
                        self.state = State::Value { escape: false };
                        i += 1;
                        run_start = i;
                        continue;
                    }
                    let rest = &chunk[i..];
                    let stop = rest.iter().position(|b| *b == b'"' || *b == b'\\');
                    match stop {
                        None => {
                            out(Part::Video, rest);
                            return;
                        }
                        Some(n) => {
                            if n > 0 {
                                out(Part::Video, &rest[..n]);
                            }
                            i += n;
                            if chunk[i] == b'\\' {
                                self.state = State::Value { escape: true };
                                i += 1;
                                run_start = i;
                            } else {
                                // The closing quote belongs to the JSON.
                                run_start = i;
                                i += 1;
                                self.state = if self.first_only {
                                    out(Part::Json, &chunk[run_start..i]);
                                    State::Done
                                } else {
                                    State::Outside
                                };
                                if self.state == State::Done {
                                    return;
                                }
                            }
                        }
                    }
                }
                State::Str { escape } => {
                    let b = chunk[i];
                    i += 1;
                    if escape {
                        self.state = State::Str { escape: false };
                    } else if b == b'\\' {
                        self.key_spoiled = true;
                        self.state = State::Str { escape: true };
                    } else if b == b'"' {
                        let text = &self.key[..self.key_len];
                        self.after_key = !self.key_spoiled && KEYS.contains(&text);
                        self.state = State::Outside;
                    } else if self.key_len < KEY_MAX {
                        self.key[self.key_len] = b;
                        self.key_len += 1;
                    } else {
                        self.key_spoiled = true;
                    }
                }
                State::Outside => {
                    let b = chunk[i];
                    i += 1;
                    match b {
                        b'"' if self.awaiting_value => {
                            self.awaiting_value = false;
                            self.found += 1;
                            self.state = State::Value { escape: false };
                            out(Part::Json, &chunk[run_start..i]);
                            run_start = i;
                        }
                        b'"' => {
                            self.key_len = 0;
                            self.key_spoiled = false;
                            self.state = State::Str { escape: false };
                        }
                        b':' => {
                            self.awaiting_value = self.after_key;
                            self.after_key = false;
                        }
                        b' ' | b'\t' | b'\r' | b'\n' => {}
                        _ => {
                            self.after_key = false;
                            self.awaiting_value = false;
                        }
                    }
                }
            }
        }
        if run_start < chunk.len() && !self.in_value() && self.state != State::Done {
            out(Part::Json, &chunk[run_start..]);
        }
    }
}

/// Reads an operation JSON with every video value emptied; returns it and whether a video value was seen.
///
/// `limit` bounds what is kept (the JSON without the video), not what is read.
pub async fn read_elided<B>(mut body: B, limit: usize) -> Result<(Vec<u8>, bool), GatewayError>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut scanner = Scanner::new(false);
    let mut kept = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            let e: BoxError = e.into();
            GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!("reading the upstream's answer: {e}"),
            )
        })?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        scanner.feed(data, |part, bytes| {
            if part == Part::Json {
                kept.extend_from_slice(bytes);
            }
        });
        if kept.len() > limit {
            return Err(GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!("the upstream's answer is larger than {limit} bytes"),
            ));
        }
    }
    Ok((kept, scanner.found > 0))
}

/// Decodes base64 text that arrives in pieces of any length.
#[derive(Default)]
pub struct Base64Stream {
    /// Fewer than four characters left over from the previous piece.
    carry: Vec<u8>,
}

impl Base64Stream {
    /// Decodes every whole quantum of `carry + text`; keeps the rest for the next call.
    pub fn push(&mut self, text: &[u8]) -> Result<Vec<u8>, base64::DecodeSliceError> {
        self.carry.extend(text.iter().map(|b| match b {
            b'-' => b'+',
            b'_' => b'/',
            other => *other,
        }));
        let whole = self.carry.len() / 4 * 4;
        let mut out = vec![0u8; whole / 4 * 3];
        let n = LENIENT.decode_slice(&self.carry[..whole], &mut out)?;
        out.truncate(n);
        self.carry.drain(..whole);
        Ok(out)
    }

    /// Decodes the final, unpadded quantum.
    pub fn finish(&mut self) -> Result<Vec<u8>, base64::DecodeSliceError> {
        let mut out = vec![0u8; 3];
        let n = LENIENT.decode_slice(&self.carry, &mut out)?;
        out.truncate(n);
        self.carry.clear();
        Ok(out)
    }
}

pin_project! {
    /// The video bytes of the first video value in an upstream's operation JSON, decoded as they stream.
    pub struct DecodeBody<B> {
        #[pin]
        inner: B,
        scanner: Scanner,
        decoder: Base64Stream,
        finished: bool,
    }
}

impl<B> DecodeBody<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            scanner: Scanner::new(true),
            decoder: Base64Stream::default(),
            finished: false,
        }
    }
}

fn broken(msg: impl Into<String>) -> BoxError {
    Box::new(GatewayError::new(ErrorKind::UpstreamBadResponse, msg))
}

impl<B> HttpBody for DecodeBody<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.finished {
                return Poll::Ready(None);
            }
            if this.scanner.done() {
                // The rest of the operation JSON is not needed; dropping it ends our read.
                *this.finished = true;
                return match this.decoder.finish() {
                    Ok(tail) if tail.is_empty() => Poll::Ready(None),
                    Ok(tail) => Poll::Ready(Some(Ok(Frame::data(Bytes::from(tail))))),
                    Err(e) => Poll::Ready(Some(Err(broken(format!(
                        "the inline video is not valid base64: {e}"
                    ))))),
                };
            }
            let frame = match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    *this.finished = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                None => {
                    *this.finished = true;
                    let why = if this.scanner.in_value() {
                        "the upstream's answer ended inside the inline video"
                    } else {
                        "the upstream's answer holds no inline video"
                    };
                    return Poll::Ready(Some(Err(broken(why))));
                }
            };
            let Some(data) = frame.data_ref() else {
                continue;
            };
            let mut decoded: Vec<u8> = Vec::new();
            let mut failure = None;
            let decoder = &mut *this.decoder;
            this.scanner.feed(data, |part, text| {
                if part == Part::Video && failure.is_none() {
                    match decoder.push(text) {
                        Ok(bytes) if decoded.is_empty() => decoded = bytes,
                        Ok(bytes) => decoded.extend_from_slice(&bytes),
                        Err(e) => failure = Some(e),
                    }
                }
            });
            if let Some(e) = failure {
                *this.finished = true;
                return Poll::Ready(Some(Err(broken(format!(
                    "the inline video is not valid base64: {e}"
                )))));
            }
            if !decoded.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(decoded)))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests;
