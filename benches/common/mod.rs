//! Shared inputs of the translation benches: one model per upstream protocol, and a 2 KB request, a reply and a 200-event stream in each protocol.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use http::StatusCode;
use modelgate::config::{Config, Model, Protocol};
use modelgate::translate::{self, StreamTranslator, Translation};
use serde_json::json;

pub const PAIRS: [(Protocol, Protocol); 6] = [
    (Protocol::Chat, Protocol::Messages),
    (Protocol::Chat, Protocol::Responses),
    (Protocol::Messages, Protocol::Chat),
    (Protocol::Messages, Protocol::Responses),
    (Protocol::Responses, Protocol::Chat),
    (Protocol::Responses, Protocol::Messages),
];

pub fn name(p: (Protocol, Protocol)) -> String {
    format!("{}_to_{}", p.0.name(), p.1.name())
}

/// One model per upstream protocol, from a real config.
pub fn models() -> Vec<Arc<Model>> {
    let text = r#"
[listen]
base = "127.0.0.1:0"
[[upstreams]]
name = "c"
kind = "chat"
base_url = "http://127.0.0.1:1/v1"
[[upstreams]]
name = "m"
kind = "messages"
base_url = "http://127.0.0.1:1/v1"
[[upstreams]]
name = "r"
kind = "responses"
base_url = "http://127.0.0.1:1/v1"
[[models]]
name = "to-chat"
upstream = "c"
thinking = "chat_template_kwargs"
[[models]]
name = "to-messages"
upstream = "m"
default_max_tokens = 4096
[[models]]
name = "to-responses"
upstream = "r"
"#;
    Config::parse(text, Path::new("."), &|_| None)
        .unwrap()
        .models
}

pub fn model_for(models: &[Arc<Model>], p: Protocol) -> &Model {
    &models[p as usize]
}

/// A realistic ~2 KB chat request: system prompt, three turns with a tool call and its result, two tools.
pub fn chat_request(stream: bool) -> serde_json::Value {
    json!({
        "model": "bench", "stream": stream, "max_tokens": 1024, "temperature": 0.7,
        "messages": [
            {"role": "system", "content": "You are a careful assistant for a travel company. Answer briefly, cite the tool results you used, and never invent prices or schedules that a tool did not return."},
            {"role": "user", "content": "I want to go from Paris to Berlin next Friday morning. What trains are there, and what will the weather be like when I arrive?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a1", "type": "function", "function": {"name": "search_trains", "arguments": "{\"from\":\"Paris\",\"to\":\"Berlin\",\"date\":\"2026-11-27\",\"after\":\"06:00\"}"}},
                {"id": "call_a2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Berlin\",\"date\":\"2026-11-27\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a1", "content": "[{\"dep\":\"07:55\",\"arr\":\"16:02\",\"changes\":1,\"price_eur\":89},{\"dep\":\"09:12\",\"arr\":\"17:40\",\"changes\":2,\"price_eur\":64}]"},
            {"role": "tool", "tool_call_id": "call_a2", "content": "{\"city\":\"Berlin\",\"high_c\":6,\"low_c\":1,\"summary\":\"cloudy, light rain after 15:00\"}"},
            {"role": "user", "content": "Great. Book the earlier one if it is under 100 euros, and tell me what to pack."}
        ],
        "tools": [
            {"type": "function", "function": {"name": "search_trains", "description": "Search train connections between two cities on a date, departing after a time.",
                "parameters": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}, "date": {"type": "string", "description": "ISO date"}, "after": {"type": "string", "description": "HH:MM"}}, "required": ["from", "to", "date"]}}},
            {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city on a date.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "date": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "book_train", "description": "Book a train connection by departure time.",
                "parameters": {"type": "object", "properties": {"dep": {"type": "string"}, "max_price_eur": {"type": "number"}}, "required": ["dep"]}}}
        ],
        "tool_choice": "auto"
    })
}

/// The 2 KB request in each client protocol (the chat one, translated by the gateway itself).
pub fn request_in(models: &[Arc<Model>], client: Protocol, stream: bool) -> Vec<u8> {
    let chat = serde_json::to_vec(&chat_request(stream)).unwrap();
    if client == Protocol::Chat {
        return chat;
    }
    let (bytes, _) = translate::request(
        Protocol::Chat,
        client,
        &chat,
        model_for(models, client).primary(),
        "bench",
    )
    .unwrap();
    bytes.to_vec()
}

pub fn chat_reply() -> serde_json::Value {
    json!({"id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": "The 07:55 train costs 89 euros, under your limit, so I am booking it. Pack a warm coat, an umbrella for the afternoon rain, and layers: it will be between 1 and 6 degrees.",
            "tool_calls": [{"id": "call_b1", "type": "function", "function": {"name": "book_train", "arguments": "{\"dep\":\"07:55\",\"max_price_eur\":100}"}}]}}],
        "usage": {"prompt_tokens": 612, "completion_tokens": 71, "total_tokens": 683, "prompt_tokens_details": {"cached_tokens": 512}}})
}

/// A 200-event chat stream: role, 190 text pieces, a tool call in 5 pieces, finish, usage, [DONE].
pub fn chat_stream() -> Vec<Vec<u8>> {
    // Members in the order providers write them (`json!` would sort them, `choices` first),
    // a choice's `logprobs` as OpenAI writes it, `null`, in every chunk.
    const HEAD: &str = r#"{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp_s","#;
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        format!(
            "data: {HEAD}\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
        )
        .into_bytes()
    };
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        json!(null),
    )];
    for i in 0..190 {
        out.push(chunk(json!({"content": format!("word{i} ")}), json!(null)));
    }
    out.push(chunk(json!({"tool_calls": [{"index": 0, "id": "call_s1", "type": "function", "function": {"name": "book_train", "arguments": ""}}]}), json!(null)));
    for piece in ["{\"dep\"", ":\"07", ":55\",", "\"max_price_eur\":", "100}"] {
        out.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            json!(null),
        ));
    }
    out.push(chunk(json!({}), json!("tool_calls")));
    out.push(
        format!("data: {HEAD}\"choices\":[],\"usage\":{{\"prompt_tokens\":612,\"completion_tokens\":197,\"total_tokens\":809}}}}\n\n")
            .into_bytes(),
    );
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

/// Splits an SSE byte stream into its events (each with its blank line).
pub fn split_events(bytes: &[u8]) -> Vec<Vec<u8>> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.split_inclusive("\n\n")
        .map(|e| e.as_bytes().to_vec())
        .collect()
}

pub fn translation(models: &[Arc<Model>], pair: (Protocol, Protocol), stream: bool) -> Translation {
    let body = request_in(models, pair.0, stream);
    translate::request(
        pair.0,
        pair.1,
        &body,
        model_for(models, pair.1).primary(),
        "bench",
    )
    .unwrap()
    .1
}

/// The 200-event stream as `upstream` sends it (the chat one, translated by the gateway itself).
pub fn stream_in(models: &[Arc<Model>], upstream: Protocol) -> Vec<Vec<u8>> {
    let chat = chat_stream();
    if upstream == Protocol::Chat {
        return chat;
    }
    let t = translation(models, (upstream, Protocol::Chat), true);
    let mut st = StreamTranslator::new(&t);
    let mut out = Vec::new();
    for e in &chat {
        st.feed(e, &mut out);
    }
    split_events(&out)
}

/// A reply as `upstream` sends it.
pub fn reply_in(models: &[Arc<Model>], upstream: Protocol) -> Vec<u8> {
    let chat = serde_json::to_vec(&chat_reply()).unwrap();
    if upstream == Protocol::Chat {
        return chat;
    }
    let t = translation(models, (upstream, Protocol::Chat), false);
    t.json_reply(StatusCode::OK, &chat).1
}
