//! Translation between client and upstream protocols through the IR: the request on the way in, the reply (JSON or stream, frame by frame) on the way out.

pub mod chat;
pub mod common;
pub mod counts;
pub mod hand;
pub mod lax;
pub mod messages;
pub mod responses;
pub mod tools;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::Value;

use crate::body::BoxError;
use crate::config::{HostedTools, Protocol, Target, ThinkingStyle};
use crate::error::GatewayError;
use crate::ir::{self, Event};
use crate::observe::Usage;
use crate::sse::{EventRef, SseDecoder};

/// How long an Anthropic client may wait without a byte before it gets a `ping`.
pub const PING_INTERVAL: Duration = Duration::from_secs(10);

/// What the reply's translation needs to remember from the request: each side's per-request
/// state lives in its own codec's context.
#[derive(Debug, Clone)]
pub struct Translation {
    pub client: Protocol,
    pub upstream: Protocol,
    pub client_model: String,
    pub stream: bool,
    client_ctx: ClientContext,
    upstream_ctx: UpstreamContext,
    /// Hosted tools the client declared that were left out of the upstream request (their `type`s).
    pub dropped: Vec<String>,
}

/// What a client protocol's replies need from the request they answer.
#[derive(Debug, Clone)]
pub enum ClientContext {
    Chat(chat::ClientContext),
    Messages(messages::ClientContext),
    Responses(responses::ClientContext),
}

/// What reading an upstream protocol's replies needs from the request that was sent.
#[derive(Debug, Clone)]
pub enum UpstreamContext {
    Chat(chat::UpstreamContext),
    Messages(messages::UpstreamContext),
    Responses(responses::UpstreamContext),
}

impl ClientContext {
    /// A client that asked for nothing beyond the protocol's defaults.
    fn default_for(client: Protocol) -> Self {
        match client {
            Protocol::Chat => Self::Chat(chat::ClientContext::default()),
            Protocol::Messages => Self::Messages(messages::ClientContext::default()),
            Protocol::Responses => Self::Responses(responses::ClientContext::default()),
        }
    }

    /// The hosted tools the client declared (chat has none: its tools are functions only).
    fn hosted(&self) -> &[tools::HostedTool] {
        match self {
            Self::Chat(_) => &[],
            Self::Messages(c) => &c.hosted,
            Self::Responses(c) => &c.hosted,
        }
    }
}

impl UpstreamContext {
    fn default_for(upstream: Protocol) -> Self {
        match upstream {
            Protocol::Chat => Self::Chat(chat::UpstreamContext),
            Protocol::Messages => Self::Messages(messages::UpstreamContext::default()),
            Protocol::Responses => Self::Responses(responses::UpstreamContext),
        }
    }
}

/// Reads a client body of protocol `client` into the IR and that client's reply context,
/// refusing what the IR cannot hold.
fn decode(client: Protocol, body: &[u8]) -> Result<(ir::Request, ClientContext), GatewayError> {
    Ok(match client {
        Protocol::Chat => {
            let (r, c) = chat::request_to_ir(body)?;
            (r, ClientContext::Chat(c))
        }
        Protocol::Messages => {
            let (r, c) = messages::request_to_ir(body)?;
            (r, ClientContext::Messages(c))
        }
        Protocol::Responses => {
            let (r, c) = responses::request_to_ir(body)?;
            (r, ClientContext::Responses(c))
        }
    })
}

/// Parses a client body of protocol `client` into the IR, refusing what the IR cannot hold.
pub fn decode_request(client: Protocol, body: &[u8]) -> Result<ir::Request, GatewayError> {
    decode(client, body).map(|(r, _)| r)
}

/// What an upstream protocol can express of the IR, checked once before encoding so decoders
/// never need to know where a request goes.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    pub stop_sequences: bool,
}

impl Capabilities {
    pub fn of(upstream: Protocol) -> Self {
        Self {
            // The Responses API has no stop sequences.
            stop_sequences: upstream != Protocol::Responses,
        }
    }

    /// A 400 naming the client's own field for the first thing `upstream` cannot express.
    pub fn check(
        self,
        r: &ir::Request,
        client: Protocol,
        upstream: Protocol,
    ) -> Result<(), GatewayError> {
        if !self.stop_sequences && !r.stop.is_empty() {
            let field = match client {
                Protocol::Messages => "stop_sequences",
                _ => "stop",
            };
            return Err(GatewayError::invalid(
                field,
                format!(
                    "`{field}` cannot be served by this model's upstream ({}): the Responses API has no stop sequences",
                    upstream.name()
                ),
            ));
        }
        Ok(())
    }
}

/// Writes the IR as a request body of protocol `upstream` for `target`, with what reading the
/// upstream's replies will need.
pub fn encode_request(
    upstream: Protocol,
    r: &ir::Request,
    upstream_model: &str,
    target: &Target,
) -> Result<(Vec<u8>, UpstreamContext), GatewayError> {
    Ok(match upstream {
        Protocol::Chat => {
            let (b, c) = chat::ir_to_request(r, upstream_model, target)?;
            (b, UpstreamContext::Chat(c))
        }
        Protocol::Messages => {
            let (b, c) = messages::ir_to_request(r, upstream_model, target)?;
            (b, UpstreamContext::Messages(c))
        }
        Protocol::Responses => {
            let (b, c) = responses::ir_to_request(r, upstream_model, target)?;
            (b, UpstreamContext::Responses(c))
        }
    })
}

/// A client request decoded once into the IR, with what every reply to it needs to remember;
/// each attempt encodes it for its own target.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub client: Protocol,
    pub ir: ir::Request,
    pub client_model: String,
    context: ClientContext,
}

impl Decoded {
    pub fn new(client: Protocol, body: &[u8], client_model: &str) -> Result<Self, GatewayError> {
        let (ir, context) = decode(client, body)?;
        Ok(Self {
            client,
            ir,
            client_model: client_model.to_owned(),
            context,
        })
    }

    /// Makes a responses client's replies echo the `previous_response_id` the pipeline expanded
    /// out of the body.
    pub fn echo_previous_response_id(&mut self, id: &str) {
        if let ClientContext::Responses(c) = &mut self.context {
            Arc::make_mut(&mut c.echo).previous_response_id = Some(crate::json::to_raw(id));
        }
    }

    /// The upstream body for `target` (speaking `upstream`) and the reply side of the translation.
    pub fn encode(
        &mut self,
        upstream: Protocol,
        target: &Target,
        upstream_model: &str,
    ) -> Result<(Bytes, Translation), GatewayError> {
        Capabilities::of(upstream).check(&self.ir, self.client, upstream)?;
        let hosted = self.context.hosted();
        if let (Some(h), HostedTools::Refuse) = (hosted.first(), target.hosted_tools) {
            return Err(GatewayError::invalid(
                &h.param,
                format!(
                    "`{}` is a hosted tool ({:?}) that only its own provider runs; this model's upstream speaks {} and the model refuses such tools (hosted_tools = \"refuse\"): remove it",
                    h.param,
                    h.kind,
                    upstream.name()
                ),
            ));
        }
        let dropped: Vec<String> = hosted.iter().map(|h| h.kind.clone()).collect();
        // Messages and responses clients (agents) send thinking by default; a model configured
        // without any thinking form gets none of it rather than a parameter it may refuse. A chat
        // client's three switches were already refused there by chat's own rules (gateway.md §6);
        // what is left to drop from a chat client is its `reasoning_effort`.
        let drop_thinking = target.thinking == ThinkingStyle::None;
        let thinking = if drop_thinking {
            self.ir.thinking.take()
        } else {
            None
        };
        let encoded = encode_request(upstream, &self.ir, upstream_model, target);
        if thinking.is_some() {
            self.ir.thinking = thinking;
        }
        let (body, upstream_ctx) = encoded?;
        let t = Translation {
            client: self.client,
            upstream,
            client_model: self.client_model.clone(),
            stream: self.ir.stream,
            client_ctx: self.context.clone(),
            upstream_ctx,
            dropped,
        };
        Ok((Bytes::from(body), t))
    }
}

/// A messages request of the common shape for a chat target, written without the IR
/// ([`messages::plain`]): the body and the reply's translation, as [`Decoded::encode`] makes
/// them for such a request; `None` leaves the request to [`Decoded`].
pub fn plain_messages_for_chat(
    obj: &crate::json::RawObject<'_>,
    upstream_model: &str,
    client_model: &str,
) -> Option<(Bytes, Translation)> {
    let (body, stream) = messages::plain::chat_body(obj, upstream_model)?;
    let t = Translation {
        client: Protocol::Messages,
        upstream: Protocol::Chat,
        client_model: client_model.to_owned(),
        stream,
        client_ctx: ClientContext::Messages(messages::ClientContext::default()),
        upstream_ctx: UpstreamContext::Chat(chat::UpstreamContext),
        dropped: Vec::new(),
    };
    Some((Bytes::from(body), t))
}

/// Translates a client request body for an upstream of another protocol in one step.
pub fn request(
    client: Protocol,
    upstream: Protocol,
    body: &[u8],
    target: &Target,
    client_model: &str,
) -> Result<(Bytes, Translation), GatewayError> {
    Decoded::new(client, body, client_model)?.encode(
        upstream,
        target,
        target.model_name(client_model),
    )
}

/// An upstream's JSON reply read as `T`: by hand, or by serde when the hand reader is unsure;
/// `None` when it is not JSON. `text` is the body when it is UTF-8, checked once by the caller.
fn read_reply<'a, T: hand::Hand<'a> + serde::Deserialize<'a>>(
    body: &'a [u8],
    text: Option<&'a str>,
) -> Option<T> {
    text.and_then(hand::object::<T>)
        .or_else(|| crate::json::from_body::<T>(body).ok())
}

/// The client-protocol error body for an upstream failure.
pub fn error_body(client: Protocol, e: &ir::ErrorInfo) -> Value {
    match client {
        Protocol::Chat => chat::error_body(e),
        Protocol::Messages => messages::error_body(e),
        Protocol::Responses => responses::error_body(e),
    }
}

/// A whole upstream reply in the client's protocol.
pub struct JsonReply {
    pub status: StatusCode,
    pub body: Vec<u8>,
    /// The usage the upstream's reply reported, when it was read as a reply: the usage counter
    /// need not read it a second time.
    pub usage: Option<ir::Usage>,
    /// A Responses client's kept reply: what the store keeps of it.
    pub last: Option<responses::Final>,
}

impl JsonReply {
    fn error(status: StatusCode, client: Protocol, info: &ir::ErrorInfo) -> Self {
        Self {
            status,
            body: crate::json::to_bytes(&error_body(client, info)),
            usage: None,
            last: None,
        }
    }
}

impl Translation {
    /// The reply side of a translation for the mock, which answers `protocol` from the IR
    /// directly; `body` is the request it answers (already decoded once, so known to be valid).
    pub fn for_mock(protocol: Protocol, model: &str, body: &[u8]) -> Self {
        let client_ctx = match decode(protocol, body) {
            Ok((_, c)) => c,
            Err(_) => ClientContext::default_for(protocol),
        };
        Self {
            client: protocol,
            upstream: protocol,
            client_model: model.to_owned(),
            stream: false,
            client_ctx,
            upstream_ctx: UpstreamContext::default_for(protocol),
            dropped: Vec::new(),
        }
    }

    fn client_tools(&self) -> Arc<tools::ToolMap> {
        match &self.client_ctx {
            ClientContext::Responses(c) => Arc::clone(&c.tools),
            _ => Arc::default(),
        }
    }

    fn echo(&self) -> Arc<responses::Echo> {
        match &self.client_ctx {
            ClientContext::Responses(c) => Arc::clone(&c.echo),
            _ => Arc::default(),
        }
    }

    fn json_mode(&self) -> bool {
        matches!(&self.upstream_ctx, UpstreamContext::Messages(c) if c.json_mode)
    }

    /// A responses reply for `r`, echoing the request this translation came from.
    pub fn responses_reply(&self, r: &ir::Response) -> Value {
        responses::ir_to_response(r, &self.client_model, &self.echo(), &self.client_tools())
    }

    /// Translates a whole (non-streamed or error) upstream reply into the client's protocol.
    pub fn json_reply(&self, status: StatusCode, body: &[u8]) -> (StatusCode, Vec<u8>) {
        let reply = self.json_reply_counted(status, body);
        (reply.status, reply.body)
    }

    /// [`Self::json_reply`], with what else reading it found ([`JsonReply`]).
    pub fn json_reply_counted(&self, status: StatusCode, body: &[u8]) -> JsonReply {
        let not_json = || ir::ErrorInfo {
            status: 502,
            message: "the upstream answered with a body that is not JSON".into(),
            code: None,
        };
        let to_info = |e: GatewayError| ir::ErrorInfo {
            status: 502,
            message: e.message,
            code: None,
        };
        if !status.is_success() {
            let parsed: Option<Value> = serde_json::from_slice(body).ok();
            let info = match (&parsed, self.upstream) {
                (Some(v), Protocol::Messages) => messages::error_from_body(status.as_u16(), v),
                (Some(v), _) => chat::error_from_body(status.as_u16(), v),
                (None, _) => ir::ErrorInfo {
                    status: status.as_u16(),
                    message: String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned(),
                    code: None,
                },
            };
            // Anthropic's "overloaded" has no OpenAI status; OpenAI says 503 for the same thing.
            let status = if status.as_u16() == 529 && self.client != Protocol::Messages {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                status
            };
            return JsonReply::error(status, self.client, &info);
        }
        // A chat reply of the common shape is written for a messages client in one pass, with
        // nothing between; `plain::read` answers only where that is what the IR path writes.
        // The body's UTF-8 check is made once, for the one pass and the hand readers both; a
        // Responses reply goes to serde, which makes its own.
        let text = match self.upstream {
            Protocol::Chat | Protocol::Messages => std::str::from_utf8(body).ok(),
            Protocol::Responses => None,
        };
        if let (Protocol::Chat, Protocol::Messages) = (self.upstream, self.client) {
            if let Some(p) = text.and_then(chat::plain::read) {
                return JsonReply {
                    status: StatusCode::OK,
                    body: messages::plain_response_bytes(&p, &self.client_model),
                    usage: Some(p.usage),
                    last: None,
                };
            }
        }
        // Chat and messages replies are read straight into the few members that count: no
        // `Value` tree, and by hand unless the reply is one the hand reader leaves to serde.
        let decoded = match self.upstream {
            Protocol::Chat => read_reply::<chat::Reply<'_>>(body, text)
                .ok_or_else(not_json)
                .and_then(|reply| chat::reply_to_ir(&reply).map_err(to_info)),
            Protocol::Messages => read_reply::<messages::UpstreamReply<'_>>(body, text)
                .ok_or_else(not_json)
                .map(|reply| messages::reply_to_ir(&reply, self.json_mode())),
            Protocol::Responses => crate::json::from_body::<Value>(body)
                .map_err(|_| not_json())
                .and_then(|v| responses::response_to_ir(&v)),
        };
        self.reply_from(decoded)
    }

    /// The client's reply for what the upstream's reply read as, or its error; and the usage
    /// it read.
    fn reply_from(&self, decoded: Result<ir::Response, ir::ErrorInfo>) -> JsonReply {
        let r = match decoded {
            Ok(r) => r,
            Err(info) => return JsonReply::error(StatusCode::BAD_GATEWAY, self.client, &info),
        };
        let (body, last) = match self.client {
            // Every reply is written straight to bytes, with no tree of the whole between.
            Protocol::Messages => (messages::response_bytes(&r, &self.client_model), None),
            Protocol::Chat => (chat::response_bytes(&r, &self.client_model), None),
            Protocol::Responses => {
                responses::response_kept(&r, &self.client_model, &self.echo(), &self.client_tools())
            }
        };
        JsonReply {
            status: StatusCode::OK,
            body,
            usage: Some(r.usage),
            last,
        }
    }

    pub fn stream_decoder(&self) -> StreamDecoder {
        match self.upstream {
            Protocol::Chat => StreamDecoder::Chat(chat::StreamDecoder::default()),
            Protocol::Messages => {
                StreamDecoder::Messages(messages::StreamDecoder::new(self.json_mode()))
            }
            Protocol::Responses => StreamDecoder::Responses(responses::StreamDecoder::default()),
        }
    }

    pub fn stream_encoder(&self) -> StreamEncoder {
        match self.client {
            Protocol::Chat => StreamEncoder::Chat(chat::StreamEncoder::new(
                &self.client_model,
                matches!(&self.client_ctx, ClientContext::Chat(c) if c.include_usage),
            )),
            Protocol::Messages => {
                StreamEncoder::Messages(messages::StreamEncoder::new(&self.client_model))
            }
            Protocol::Responses => StreamEncoder::Responses(Box::new(
                responses::StreamEncoder::new(&self.client_model, self.echo(), self.client_tools()),
            )),
        }
    }
}

/// The upstream side of a stream translation: wire events → IR events.
#[derive(Debug)]
pub enum StreamDecoder {
    Chat(chat::StreamDecoder),
    Messages(messages::StreamDecoder),
    Responses(responses::StreamDecoder),
}

impl StreamDecoder {
    pub fn decode(&mut self, ev: EventRef<'_>, out: &mut Vec<Event>) {
        match self {
            Self::Chat(d) => d.decode(ev, out),
            Self::Messages(d) => d.decode(ev, out),
            Self::Responses(d) => d.decode(ev, out),
        }
    }

    /// The usage the upstream has reported so far, by its protocol's rules, from the events
    /// each protocol puts it in (a chat chunk's `usage`, Anthropic's `message_start` and
    /// `message_delta`, a terminal Responses event): the counts the usage reader
    /// (`observe::UsageReader`) finds in a well-formed stream.
    pub fn usage(&self) -> ir::Usage {
        match self {
            Self::Chat(d) => d.usage(),
            Self::Messages(d) => d.usage(),
            Self::Responses(d) => d.usage(),
        }
    }
}

/// The client side of a stream translation: IR events → wire bytes.
#[derive(Debug)]
pub enum StreamEncoder {
    Chat(chat::StreamEncoder),
    Messages(messages::StreamEncoder),
    /// Boxed: it keeps the items it has written for the terminal event, so it is the largest.
    Responses(Box<responses::StreamEncoder>),
}

impl StreamEncoder {
    pub fn encode(&mut self, ev: Event, out: &mut Vec<u8>) {
        match self {
            Self::Chat(e) => e.encode(ev, out),
            Self::Messages(e) => e.encode(ev, out),
            Self::Responses(e) => e.encode(ev, out),
        }
    }
}

/// The event bound of a translator made without one: `[limits] max_event_bytes`'s default.
pub const DEFAULT_MAX_EVENT: usize = 16 * 1024 * 1024;

/// One stream translation's state: SSE bytes in, client-protocol SSE bytes out, no task and no channel.
#[derive(Debug)]
pub struct StreamTranslator {
    sse: SseDecoder,
    events: Translating,
}

/// What a stream translation does with each upstream event, apart from cutting the bytes into
/// events: decode it, put tool calls in order, encode it for the client.
#[derive(Debug)]
struct Translating {
    decoder: StreamDecoder,
    encoder: StreamEncoder,
    ir: Vec<Event>,
    /// Present when the client protocol needs tool calls one after another (messages, responses).
    sequencer: Option<ToolSequencer>,
    sequenced: Vec<Event>,
    /// The upstream ended cleanly or with an error event; nothing more will be written.
    ended: bool,
}

impl StreamTranslator {
    pub fn new(t: &Translation) -> Self {
        Self {
            sse: SseDecoder::with_limit(DEFAULT_MAX_EVENT),
            events: Translating {
                decoder: t.stream_decoder(),
                encoder: t.stream_encoder(),
                ir: Vec::new(),
                sequencer: (t.client != Protocol::Chat).then(ToolSequencer::default),
                sequenced: Vec::new(),
                ended: false,
            },
        }
    }

    /// Bounds one upstream event to `max` bytes; past it the stream ends with the client
    /// protocol's error (without a bound, `DEFAULT_MAX_EVENT`).
    pub fn with_event_limit(mut self, max: usize) -> Self {
        self.sse = SseDecoder::with_limit(max);
        self
    }

    /// Feeds upstream bytes; returns the client bytes they produce (possibly none).
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        if self.events.ended {
            return;
        }
        let events = &mut self.events;
        let fed = self.sse.feed_with(bytes, |ev| events.translate(ev, out));
        if let Err(e) = fed {
            self.fail(
                ir::ErrorInfo {
                    status: 502,
                    message: e.to_string(),
                    code: None,
                },
                out,
            );
        }
    }

    /// The upstream body ended; a stream that never reached its terminal event is reported as broken.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let events = &mut self.events;
        self.sse.finish_with(|ev| events.translate(ev, out));
        if !self.events.ended {
            self.fail(
                ir::ErrorInfo {
                    status: 502,
                    message: "the upstream stream ended before it was complete".into(),
                    code: None,
                },
                out,
            );
        }
    }

    /// Reports a failure (transport error, idle timeout) in the client's protocol and ends the stream.
    pub fn fail(&mut self, e: ir::ErrorInfo, out: &mut Vec<u8>) {
        if !self.events.ended {
            self.events.ended = true;
            self.events.encoder.encode(Event::Error(e), out);
        }
    }

    pub fn ended(&self) -> bool {
        self.events.ended
    }

    /// The usage the upstream has reported in the events read so far.
    pub fn usage(&self) -> ir::Usage {
        self.events.decoder.usage()
    }

    /// For a Responses client whose reply is kept, where the stream's final response object
    /// will be left ([`responses::FinalSlot`]).
    pub fn final_slot(&mut self) -> Option<responses::FinalSlot> {
        match &mut self.events.encoder {
            StreamEncoder::Responses(e) => e.final_slot(),
            _ => None,
        }
    }
}

impl Translating {
    fn translate(&mut self, ev: EventRef<'_>, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.decoder.decode(ev, &mut self.ir);
        let events = match &mut self.sequencer {
            Some(seq) => {
                for e in self.ir.drain(..) {
                    seq.push(e, &mut self.sequenced);
                }
                &mut self.sequenced
            }
            None => &mut self.ir,
        };
        for e in events.drain(..) {
            if self.ended {
                break;
            }
            let terminal = matches!(e, Event::End | Event::Error(_));
            self.encoder.encode(e, out);
            self.ended |= terminal;
        }
    }
}

/// Puts interleaved tool calls one after another for protocols whose blocks cannot interleave.
///
/// Chat upstreams may send every call's start first and then their argument fragments
/// interleaved. The first call streams as it arrives; a call started while the open one has no
/// arguments yet is held, with its fragments, and written whole at the next non-tool event. A
/// call started after the open one has arguments is the sequential case and streams at once.
#[derive(Debug, Default)]
pub struct ToolSequencer {
    /// The call being streamed, and whether it has had an argument fragment yet.
    open: Option<(usize, bool)>,
    /// Calls held back: start event and their buffered arguments, in start order.
    held: Vec<(Event, usize, String)>,
}

impl ToolSequencer {
    pub fn push(&mut self, e: Event, out: &mut Vec<Event>) {
        match e {
            Event::ToolStart { index, .. } => match self.open {
                Some((_, false)) => self.held.push((e, index, String::new())),
                _ if !self.held.is_empty() => self.held.push((e, index, String::new())),
                _ => {
                    self.open = Some((index, false));
                    out.push(e);
                }
            },
            Event::ToolArgs { index, fragment } => {
                if let Some((_, _, buf)) = self.held.iter_mut().find(|(_, i, _)| *i == index) {
                    buf.push_str(&fragment);
                    return;
                }
                if let Some((open, has)) = &mut self.open {
                    if *open == index {
                        *has = true;
                    }
                }
                out.push(Event::ToolArgs { index, fragment });
            }
            Event::Error(_) => out.push(e),
            other => {
                self.flush(out);
                out.push(other);
            }
        }
    }

    fn flush(&mut self, out: &mut Vec<Event>) {
        for (start, index, args) in self.held.drain(..) {
            out.push(start);
            if !args.is_empty() {
                out.push(Event::ToolArgs {
                    index,
                    fragment: args,
                });
            }
            self.open = Some((index, true));
        }
    }
}

pin_project! {
    /// A streamed reply translated frame by frame as it is polled, with keep-alive pings for
    /// Anthropic clients while the upstream is silent.
    pub struct TranslateBody<B> {
        #[pin]
        inner: B,
        state: StreamTranslator,
        #[pin]
        ping: tokio::time::Sleep,
        pings: bool,
        done: bool,
        // Settled from the decoder's counts when the stream ends or the client leaves: the
        // decoder reads every event already, so the upstream's bytes are not searched for
        // usage a second time.
        usage: Option<Usage>,
    }

    impl<B> PinnedDrop for TranslateBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(usage) = this.usage.as_mut() {
                usage.settle_read(this.state.usage());
            }
        }
    }
}

impl<B> TranslateBody<B> {
    /// `max_event` bounds one upstream event (`[limits] max_event_bytes`).
    pub fn new(inner: B, t: &Translation, max_event: usize) -> Self {
        Self {
            inner,
            state: StreamTranslator::new(t).with_event_limit(max_event),
            ping: tokio::time::sleep(PING_INTERVAL),
            pings: t.client == Protocol::Messages,
            done: false,
            usage: None,
        }
    }

    /// Charges the request what the upstream reported (`usage`), read by the translator.
    pub fn counting(mut self, usage: Option<Usage>) -> Self {
        self.usage = usage;
        self
    }

    /// [`StreamTranslator::final_slot`].
    pub fn final_slot(&mut self) -> Option<responses::FinalSlot> {
        self.state.final_slot()
    }
}

impl<B> HttpBody for TranslateBody<B>
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
            if *this.done {
                return Poll::Ready(None);
            }
            let mut out = Vec::new();
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        // Room for what a frame usually becomes, so that the event's bytes are
                        // not copied over and over as the vector grows.
                        out.reserve((2 * data.len()).max(256));
                        this.state.feed(data, &mut out);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    let e: BoxError = e.into();
                    // The idle timer and transport errors arrive as gateway errors that already
                    // say what broke; anything else is described here.
                    let (status, message) = match e.downcast_ref::<GatewayError>() {
                        Some(g) => (g.status().as_u16(), g.message.clone()),
                        None => (502, format!("the upstream stream broke: {e}")),
                    };
                    this.state.fail(
                        ir::ErrorInfo {
                            status,
                            message,
                            code: None,
                        },
                        &mut out,
                    );
                    *this.done = true;
                }
                Poll::Ready(None) => {
                    this.state.finish(&mut out);
                    *this.done = true;
                }
                Poll::Pending => {
                    if *this.pings && this.ping.as_mut().poll(cx).is_ready() {
                        this.ping
                            .as_mut()
                            .reset(tokio::time::Instant::now() + PING_INTERVAL);
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                            messages::PING,
                        )))));
                    }
                    return Poll::Pending;
                }
            }
            if this.state.ended() {
                *this.done = true;
            }
            if *this.done {
                if let Some(usage) = this.usage.as_mut() {
                    usage.settle_read(this.state.usage());
                }
            }
            if !out.is_empty() {
                this.ping
                    .as_mut()
                    .reset(tokio::time::Instant::now() + PING_INTERVAL);
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests;
