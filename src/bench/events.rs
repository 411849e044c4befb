//! What a benchmark reads from a reply, per protocol: which stream event is a content delta (the TTFT and inter-token clock), where usage is, which event ends the reply or reports an error.
//!
//! A "content delta" is anything the model generated: text, reasoning, refusal or tool-call
//! arguments. Role-only chunks, empty strings, pings, signatures and bookkeeping events are not,
//! so TTFT is the time to the first generated token, not to the first byte.

use serde_json::Value;

use super::Protocol;
use crate::sse::SseEvent;

/// What one stream event means to the benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    pub content: bool,
    /// Output tokens as the server reports them (cumulative where the protocol says so).
    pub usage: Option<u64>,
    /// The protocol's last event (`[DONE]`, `message_stop`, `response.completed`…).
    pub terminal: bool,
    pub error: bool,
}

fn non_empty(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| !s.is_empty())
}

/// Classifies one SSE event of a `protocol` stream.
pub fn stream_event(protocol: Protocol, ev: &SseEvent) -> Seen {
    let data = ev.data.trim();
    if data.starts_with("[DONE]") {
        // Chat's terminator; some proxies append it to responses streams too (already ended).
        return Seen {
            terminal: protocol == Protocol::Chat,
            ..Seen::default()
        };
    }
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return Seen::default();
    };
    match protocol {
        Protocol::Chat => chat_chunk(&v),
        Protocol::Messages => messages_event(ev.event.as_deref(), &v),
        Protocol::Responses => responses_event(ev.event.as_deref(), &v),
    }
}

fn chat_chunk(v: &Value) -> Seen {
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return Seen {
            error: true,
            ..Seen::default()
        };
    }
    let content = v
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|choices| {
            choices.iter().any(|c| {
                let Some(d) = c.get("delta") else {
                    return false;
                };
                non_empty(d.get("content"))
                    || non_empty(d.get("reasoning_content"))
                    || non_empty(d.get("reasoning"))
                    || non_empty(d.get("refusal"))
                    || d.get("tool_calls")
                        .and_then(Value::as_array)
                        .is_some_and(|calls| {
                            calls.iter().any(|t| {
                                non_empty(t.pointer("/function/arguments"))
                                    || non_empty(t.pointer("/function/name"))
                            })
                        })
            })
        });
    Seen {
        content,
        usage: v
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64),
        ..Seen::default()
    }
}

fn event_type<'a>(name: Option<&'a str>, v: &'a Value) -> &'a str {
    v.get("type").and_then(Value::as_str).or(name).unwrap_or("")
}

fn messages_event(name: Option<&str>, v: &Value) -> Seen {
    match event_type(name, v) {
        "content_block_delta" => {
            let d = v.get("delta");
            let content = d.is_some_and(|d| {
                non_empty(d.get("text"))
                    || non_empty(d.get("thinking"))
                    || non_empty(d.get("partial_json"))
            });
            Seen {
                content,
                ..Seen::default()
            }
        }
        // message_start's usage.output_tokens is a placeholder; message_delta's is cumulative.
        "message_delta" => Seen {
            usage: v.pointer("/usage/output_tokens").and_then(Value::as_u64),
            ..Seen::default()
        },
        "message_stop" => Seen {
            terminal: true,
            ..Seen::default()
        },
        "error" => Seen {
            error: true,
            ..Seen::default()
        },
        _ => Seen::default(),
    }
}

fn responses_event(name: Option<&str>, v: &Value) -> Seen {
    match event_type(name, v) {
        "response.output_text.delta"
        | "response.refusal.delta"
        | "response.reasoning_summary_text.delta"
        | "response.reasoning_text.delta"
        | "response.function_call_arguments.delta" => Seen {
            content: non_empty(v.get("delta")),
            ..Seen::default()
        },
        "response.completed" | "response.incomplete" => Seen {
            terminal: true,
            usage: v
                .pointer("/response/usage/output_tokens")
                .and_then(Value::as_u64),
            ..Seen::default()
        },
        "response.failed" | "error" => Seen {
            error: true,
            ..Seen::default()
        },
        _ => Seen::default(),
    }
}

/// What a whole (non-stream) reply says: output tokens from usage, and whether it is an error
/// in a 2xx body.
pub fn whole_reply(protocol: Protocol, v: &Value) -> (Option<u64>, bool) {
    let error = v.get("error").is_some_and(|e| !e.is_null())
        || v.get("type").and_then(Value::as_str) == Some("error")
        || v.get("status").and_then(Value::as_str) == Some("failed");
    let usage = match protocol {
        Protocol::Chat => v.pointer("/usage/completion_tokens"),
        Protocol::Messages | Protocol::Responses => v.pointer("/usage/output_tokens"),
    }
    .and_then(Value::as_u64);
    (usage, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: name.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn chat_role_chunk_is_not_content_but_text_reasoning_and_tool_args_are() {
        let c = |d: &str| stream_event(Protocol::Chat, &ev(None, d));
        assert!(!c(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#).content);
        assert!(c(r#"{"choices":[{"delta":{"content":"Hi"}}]}"#).content);
        assert!(c(r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#).content);
        assert!(c(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#).content);
        assert_eq!(
            c(r#"{"choices":[],"usage":{"completion_tokens":7}}"#).usage,
            Some(7)
        );
        assert!(c("[DONE]").terminal);
        assert!(c(r#"{"error":{"message":"x"}}"#).error);
    }

    #[test]
    fn messages_and_responses_events() {
        let m = |n: &str, d: &str| stream_event(Protocol::Messages, &ev(Some(n), d));
        assert!(m("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#).content);
        assert!(!m("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"s"}}"#).content);
        assert_eq!(
            m(
                "message_delta",
                r#"{"type":"message_delta","usage":{"output_tokens":12}}"#
            )
            .usage,
            Some(12)
        );
        assert!(m("message_stop", r#"{"type":"message_stop"}"#).terminal);
        assert!(m("error", r#"{"type":"error","error":{}}"#).error);
        let r = |n: &str, d: &str| stream_event(Protocol::Responses, &ev(Some(n), d));
        assert!(
            r(
                "response.output_text.delta",
                r#"{"type":"response.output_text.delta","delta":"x"}"#
            )
            .content
        );
        let done = r(
            "response.completed",
            r#"{"type":"response.completed","response":{"usage":{"output_tokens":3}}}"#,
        );
        assert!(done.terminal);
        assert_eq!(done.usage, Some(3));
        assert!(!r("x", "[DONE]").terminal);
    }
}
