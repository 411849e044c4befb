//! A request read once: validated for the client's protocol, then encoded for each target it is tried on (a targeted edit for the same protocol, the IR for another).

use bytes::Bytes;

use crate::body::StreamGuard;
use crate::config::{Model, Protocol, Target};
use crate::error::{ErrorKind, GatewayError};
use crate::json::RawObject;
use crate::passthrough;
use crate::translate::{self, Decoded, Translation};
use crate::validate::{self, ChatChecked};

/// The client's request, checked, ready to be written for any target.
pub struct Plan<'b> {
    pub client: Protocol,
    pub client_model: &'b str,
    pub stream: bool,
    bytes: &'b Bytes,
    obj: RawObject<'b>,
    /// Chat's own rules hold whatever the upstream speaks; their result drives the edits.
    chat: Option<ChatChecked>,
    /// The IR, made the first time a target of another protocol is tried.
    decoded: Option<Result<Decoded, GatewayError>>,
    /// The key's limits count tokens, so every reply must report its usage.
    pub needs_usage: bool,
    /// A responses client's `previous_response_id` that was expanded out of the body, for the
    /// translated reply to echo.
    pub echo_previous: Option<String>,
    /// Only this upstream may serve the request: it keeps the conversation it continues.
    pub pinned: Option<String>,
    /// The protocol of the target that answered, and whether that upstream keeps responses
    /// itself (a real upstream, not the built-in mock); set when an answer is returned.
    pub served: Option<(Protocol, bool)>,
}

/// How the reply to an encoded request comes back to the client.
pub enum Reply {
    /// Same protocol: bytes forwarded, a stream guarded so a break still ends it properly.
    /// `strip_usage`: the gateway asked a chat stream for its usage on its own account, so
    /// the usage-only chunk the client did not ask for is taken out.
    Passthrough {
        guard: StreamGuard,
        strip_usage: bool,
    },
    /// Another protocol: translated back, JSON at once or a stream frame by frame.
    Translated(Box<Translation>),
}

/// A request written for one target.
pub struct Encoded {
    pub protocol: Protocol,
    pub body: Bytes,
    pub reply: Reply,
}

impl<'b> Plan<'b> {
    /// Validates the request against the rules of its own protocol and the requested model.
    pub fn new(
        client: Protocol,
        bytes: &'b Bytes,
        obj: RawObject<'b>,
        model: &Model,
        client_model: &'b str,
    ) -> Result<Self, GatewayError> {
        let (stream, chat) = match client {
            Protocol::Chat => {
                let checked = validate::chat(&obj, model, client_model)?;
                (checked.stream, Some(checked))
            }
            Protocol::Messages | Protocol::Responses => {
                (validate::passthrough(&obj, client)?, None)
            }
        };
        Ok(Self {
            client,
            client_model,
            stream,
            bytes,
            obj,
            chat,
            decoded: None,
            needs_usage: false,
            echo_previous: None,
            pinned: None,
            served: None,
        })
    }

    /// The request as `target` takes it. `model_name` is the name the target's model entry
    /// was asked for (the client's, or a fallback's); the target's `upstream_model` renames it.
    /// A refusal here is about this target only: another may still express the request.
    pub fn encode(&mut self, target: &Target, model_name: &str) -> Result<Encoded, GatewayError> {
        let protocol = target.protocol().ok_or_else(|| {
            GatewayError::new(
                ErrorKind::Internal,
                format!("upstream {:?} speaks no LLM protocol", target.upstream.name),
            )
        })?;
        let name = target.model_name(model_name);
        if protocol == self.client {
            let rename = (name != self.client_model).then_some(name);
            let mut strip_usage = false;
            let body = match (&self.chat, self.client) {
                (Some(checked), Protocol::Chat) => {
                    // A chat stream reports usage only when asked; limits need it.
                    strip_usage = self.needs_usage && checked.stream && !checked.include_usage;
                    if rename.is_none() && !strip_usage && checked.thinking.is_none() {
                        // Nothing to edit: the client's bytes as they came, no copy.
                        self.bytes.clone()
                    } else {
                        let mut obj = self.obj.clone();
                        if strip_usage {
                            passthrough::ask_for_usage(&mut obj);
                        }
                        let checked = ChatChecked {
                            include_usage: checked.include_usage || strip_usage,
                            ..*checked
                        };
                        passthrough::chat_body(
                            self.bytes,
                            obj,
                            strip_usage,
                            rename,
                            target,
                            &checked,
                        )
                    }
                }
                _ if rename.is_none() => self.bytes.clone(),
                _ => passthrough::rename_model(self.bytes, self.obj.clone(), rename),
            };
            let guard = match (self.stream, protocol) {
                (false, _) => StreamGuard::None,
                (true, Protocol::Chat) => StreamGuard::Chat,
                (true, Protocol::Messages) => StreamGuard::Messages,
                (true, Protocol::Responses) => StreamGuard::Responses,
            };
            return Ok(Encoded {
                protocol,
                body,
                reply: Reply::Passthrough { guard, strip_usage },
            });
        }
        if (self.client, protocol) == (Protocol::Messages, Protocol::Chat) {
            if let Some((body, translation)) =
                translate::plain_messages_for_chat(&self.obj, name, self.client_model)
            {
                return Ok(Encoded {
                    protocol,
                    body,
                    reply: Reply::Translated(Box::new(translation)),
                });
            }
        }
        let decoded = match self.decoded {
            Some(ref mut decoded) => decoded,
            None => {
                // Put in its slot and changed there: built apart and passed through `map` and
                // `get_or_insert_with`, the decoded request (240 bytes) was copied eight times.
                let decoded =
                    self.decoded
                        .insert(Decoded::new(self.client, self.bytes, self.client_model));
                if let (Ok(d), Some(id)) = (decoded.as_mut(), self.echo_previous.as_deref()) {
                    d.echo_previous_response_id(id);
                }
                decoded
            }
        };
        let decoded = decoded.as_mut().map_err(|e| e.clone())?;
        let (body, translation) = decoded.encode(protocol, target, name)?;
        Ok(Encoded {
            protocol,
            body,
            reply: Reply::Translated(Box::new(translation)),
        })
    }
}
