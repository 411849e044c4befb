//! The same-protocol fast path: targeted edits of a client body (model name, thinking switch) that leave every other byte alone.

use bytes::Bytes;

use crate::config::{Model, ThinkingStyle};
use crate::json::{self, raw_literal, RawObject};
use crate::validate::ChatChecked;

/// The chat body to send upstream: the client's bytes when nothing needs editing.
pub fn chat_body(
    original: &Bytes,
    mut obj: RawObject<'_>,
    model: &Model,
    checked: &ChatChecked,
) -> Bytes {
    if model.upstream_model.is_none() && checked.thinking.is_none() {
        return original.clone();
    }
    if let Some(name) = &model.upstream_model {
        obj.set("model", json::to_raw(name.as_str()));
    }
    if let Some(on) = checked.thinking {
        write_thinking(&mut obj, model, on, checked.max_tokens);
    }
    Bytes::from(obj.to_vec())
}

/// Removes the client's thinking switches and writes the one the model's upstream understands.
fn write_thinking(obj: &mut RawObject<'_>, model: &Model, on: bool, max_tokens: Option<i64>) {
    obj.remove("enable_thinking");
    // A budget the client chose (Anthropic's spelling inside `thinking`) is kept where it can be.
    let client_budget = obj
        .remove("thinking")
        .and_then(|raw| {
            RawObject::from_raw(&raw)
                .and_then(|t| t.get("budget_tokens").and_then(|b| json::as_i64(b).ok()))
        })
        .filter(|b| *b > 0);
    // Other template kwargs the client sent are the upstream's business; keep them.
    let mut kwargs: Option<String> = obj
        .remove("chat_template_kwargs")
        .map(|raw| raw.get().to_owned());
    let flag = raw_literal(if on { "true" } else { "false" });
    match model.thinking {
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
                // Anthropic wants 1024 ≤ budget < max_tokens; half the reply budget leaves room for the answer.
                let budget = client_budget.unwrap_or_else(|| {
                    max_tokens
                        .or(model.default_max_tokens.map(i64::from))
                        .map_or(1024, |m| m / 2)
                });
                let budget = budget.max(1024);
                // A reply limit at or under the budget would be refused; grow it, as the
                // translation toward Anthropic does, rather than shrink the thinking.
                if max_tokens.is_some_and(|m| m <= budget) {
                    let grown = json::to_raw(&(budget + budget.min(4096)));
                    let key = if obj.contains("max_completion_tokens") {
                        "max_completion_tokens"
                    } else {
                        "max_tokens"
                    };
                    obj.set(key, grown);
                }
                json::to_raw(&serde_json::json!({"type": "enabled", "budget_tokens": budget}))
            } else {
                raw_literal(r#"{"type":"disabled"}"#)
            };
            obj.set("thinking", value);
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
pub fn rename_model(original: &Bytes, mut obj: RawObject<'_>, model: &Model) -> Bytes {
    match &model.upstream_model {
        None => original.clone(),
        Some(name) => {
            obj.set("model", json::to_raw(name.as_str()));
            Bytes::from(obj.to_vec())
        }
    }
}
