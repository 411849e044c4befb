//! The same-protocol fast path: targeted edits of a client body (model name, thinking switch) that leave every other byte alone.

use std::borrow::Cow;

use bytes::Bytes;

use crate::config::{Target, ThinkingStyle};
use crate::json::{self, raw_literal, RawObject};
use crate::validate::ChatChecked;

/// The chat body to send upstream: the client's bytes when nothing needs editing. `rename` is
/// the model name to write when the target knows the model by another name; `edited` says
/// `obj` was already changed.
pub fn chat_body(
    original: &Bytes,
    mut obj: RawObject<'_>,
    edited: bool,
    rename: Option<&str>,
    target: &Target,
    checked: &ChatChecked,
) -> Bytes {
    if rename.is_none() && checked.thinking.is_none() && !edited {
        return original.clone();
    }
    if let Some(name) = rename {
        obj.set("model", json::to_raw(name));
    }
    if let Some(on) = checked.thinking {
        write_thinking(&mut obj, target, on, checked.max_tokens);
    }
    Bytes::from(obj.to_vec())
}

/// Sets `stream_options.include_usage` to true, keeping the client's other stream options.
pub fn ask_for_usage(obj: &mut RawObject<'_>) {
    let text = obj
        .remove("stream_options")
        .map(Cow::into_owned)
        .unwrap_or_else(|| "{}".to_owned());
    let mut opts = RawObject::parse(text.as_bytes()).unwrap_or_default();
    opts.set("include_usage", raw_literal("true"));
    obj.set("stream_options", opts.to_raw());
}

/// Removes the client's thinking switches and writes the one the model's upstream understands.
fn write_thinking(obj: &mut RawObject<'_>, target: &Target, on: bool, max_tokens: Option<i64>) {
    obj.remove("enable_thinking");
    // A budget the client chose (Anthropic's spelling inside `thinking`) is kept where it can be.
    let client_budget = obj
        .remove("thinking")
        .and_then(|raw| {
            RawObject::parse(raw.as_bytes())
                .ok()
                .and_then(|t| t.get("budget_tokens").and_then(|b| json::as_i64(b).ok()))
        })
        .filter(|b| *b > 0);
    // Other template kwargs the client sent are the upstream's business; keep them.
    let mut kwargs: Option<String> = obj.remove("chat_template_kwargs").map(Cow::into_owned);
    let flag = raw_literal(if on { "true" } else { "false" });
    match target.thinking {
        ThinkingStyle::ChatTemplateKwargs => {
            let text = kwargs.take().unwrap_or_else(|| "{}".to_owned());
            let mut o = RawObject::parse(text.as_bytes()).unwrap_or_default();
            o.set("enable_thinking", flag);
            obj.set("chat_template_kwargs", o.to_raw());
        }
        ThinkingStyle::EnableThinking => obj.set("enable_thinking", flag),
        ThinkingStyle::ThinkingType => obj.set(
            "thinking",
            raw_literal(if on {
                r#"{"type":"enabled"}"#
            } else {
                r#"{"type":"disabled"}"#
            }),
        ),
        ThinkingStyle::Anthropic => {
            let value = if on {
                let b = crate::thinking::anthropic_budget(
                    client_budget.and_then(|b| u64::try_from(b).ok()),
                    None,
                    max_tokens.and_then(|m| u64::try_from(m).ok()),
                    target.default_max_tokens.map(u64::from),
                );
                if let Some(raised) = b.raised_max_tokens {
                    let key = if obj.contains("max_completion_tokens") {
                        "max_completion_tokens"
                    } else {
                        "max_tokens"
                    };
                    obj.set(key, json::to_raw(&raised));
                }
                json::to_raw(
                    &serde_json::json!({"type": "enabled", "budget_tokens": b.budget_tokens}),
                )
            } else {
                raw_literal(r#"{"type":"disabled"}"#)
            };
            obj.set("thinking", value);
        }
        ThinkingStyle::OpenAi => {
            if on && !obj.contains("reasoning_effort") {
                obj.set("reasoning_effort", raw_literal(r#""medium""#));
            }
        }
        ThinkingStyle::None => {}
    }
    if let Some(text) = kwargs {
        let mut o = RawObject::parse(text.as_bytes()).unwrap_or_default();
        o.remove("enable_thinking");
        if !o.is_empty() {
            obj.set("chat_template_kwargs", o.to_raw());
        }
    }
}

/// A messages or responses body with only `model` renamed (or the client's bytes when it is not).
pub fn rename_model(original: &Bytes, mut obj: RawObject<'_>, rename: Option<&str>) -> Bytes {
    match rename {
        None => original.clone(),
        Some(name) => {
            obj.set("model", json::to_raw(name));
            Bytes::from(obj.to_vec())
        }
    }
}
