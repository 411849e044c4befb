//! Each codec half alone: a client request of every protocol decoded into the IR (wire → IR, fields asserted), and hand-built IR requests encoded for every upstream protocol (IR → wire, compared with golden files under tests/fixtures/halves/; `UPDATE_GOLDEN=1` rewrites them).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed setup step should fail the test loudly"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use modelgate::config::{Config, Model, Protocol};
use modelgate::ir::{
    self, Image, ImageSource, Message, Part, RawJson, Reasoning, ResponseFormat, Role, Thinking,
    Tool, ToolChoice,
};
use modelgate::translate::{self, chat, messages, responses};
use serde_json::{json, Value};

// === helpers ===

fn raw(text: &str) -> RawJson {
    RawJson(serde_json::from_str(text).unwrap())
}

fn text(t: &str) -> Part {
    Part::Text(t.into())
}

fn msg(role: Role, content: Vec<Part>) -> Message {
    Message { role, content }
}

/// Models for each upstream protocol and thinking spelling the encoders distinguish.
fn models() -> Vec<Arc<Model>> {
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
name = "chat-plain"
upstream = "c"
[[models]]
name = "chat-anthropic"
upstream = "c"
thinking = "anthropic"
[[models]]
name = "chat-kwargs"
upstream = "c"
thinking = "chat_template_kwargs"
[[models]]
name = "messages"
upstream = "m"
default_max_tokens = 4096
[[models]]
name = "responses"
upstream = "r"
"#;
    Config::parse(text, Path::new("."), &|_| None)
        .unwrap()
        .models
}

fn model(name: &str) -> Arc<Model> {
    models()
        .into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no model {name}"))
}

fn golden_path(protocol: &str, case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/halves")
        .join(protocol)
        .join(format!("{case}.json"))
}

/// Compares an encoded body with its golden file as JSON (key order and spacing aside).
fn check_golden(protocol: &str, case: &str, body: &[u8]) {
    let got: Value = serde_json::from_slice(body).expect("the encoder wrote JSON");
    let path = golden_path(protocol, case);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut text = serde_json::to_string_pretty(&got).unwrap();
        text.push('\n');
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("{} is missing: run with UPDATE_GOLDEN=1", path.display())),
    )
    .unwrap();
    assert_eq!(
        got,
        want,
        "{protocol}/{case} differs from {}:\n{}",
        path.display(),
        serde_json::to_string_pretty(&got).unwrap()
    );
}

// === wire → IR ===

const CHAT_REQUEST: &str = r#"{
  "model": "m", "seed": 7, "metadata": {"a": "b"},
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": [{"type": "text", "text": "Cite tools."}]},
    {"role": "user", "content": [
      {"type": "text", "text": "Weather?"},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}]},
    {"role": "assistant", "content": "Checking.",
      "thinking_blocks": [{"type": "thinking", "thinking": "Need the tool.", "signature": "sig-1"}],
      "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18°C"},
    {"role": "user", "content": "Tomorrow?"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}}],
  "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
  "parallel_tool_calls": false,
  "max_completion_tokens": 300, "max_tokens": 100,
  "temperature": 0.5, "top_p": 1, "top_k": 20,
  "stop": "END", "stream": true, "stream_options": {"include_usage": true},
  "user": "u-1", "reasoning_effort": "high",
  "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": true}}
}"#;

#[test]
fn chat_request_to_ir() {
    let (r, ctx) = chat::request_to_ir(CHAT_REQUEST.as_bytes()).unwrap();
    let want = ir::Request {
        system: vec!["Be brief.".into(), "Cite tools.".into()],
        messages: vec![
            msg(
                Role::User,
                vec![
                    text("Weather?"),
                    Part::Image(Image {
                        source: ImageSource::Base64 {
                            media_type: "image/png".into(),
                            data: "iVBORw0KGgo=".into(),
                        },
                        detail: Some("low".into()),
                    }),
                ],
            ),
            msg(
                Role::Assistant,
                vec![
                    Part::Reasoning(Reasoning {
                        text: "Need the tool.".into(),
                        signature: Some("sig-1".into()),
                        redacted: None,
                    }),
                    text("Checking."),
                    Part::ToolCall {
                        id: "call_1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Paris"}"#.into(),
                    },
                ],
            ),
            // The tool message and the next user message are one user turn in the IR.
            msg(
                Role::User,
                vec![
                    Part::ToolResult {
                        call_id: "call_1".into(),
                        content: vec![text("18°C")],
                        is_error: false,
                    },
                    text("Tomorrow?"),
                ],
            ),
        ],
        tools: vec![Tool {
            name: "get_weather".into(),
            description: Some("Weather by city.".into()),
            // Kept as the client wrote it, spacing included.
            parameters: raw(r#"{"type": "object", "properties": {"city": {"type": "string"}}}"#),
            strict: Some(true),
        }],
        tool_choice: Some(ToolChoice::Named("get_weather".into())),
        parallel_tool_calls: Some(false),
        // max_completion_tokens wins over the legacy max_tokens.
        max_tokens: Some(300),
        temperature: Some(0.5),
        top_p: Some(1.0),
        top_k: Some(20),
        stop: vec!["END".into()],
        stream: true,
        thinking: Some(Thinking {
            enabled: true,
            budget_tokens: None,
            effort: Some("high".into()),
        }),
        response_format: Some(ResponseFormat::JsonSchema {
            name: "answer".into(),
            description: None,
            schema: raw(r#"{"type": "object"}"#),
            strict: Some(true),
        }),
        user: Some("u-1".into()),
    };
    assert_eq!(r, want);
    assert!(ctx.include_usage);
}

#[test]
fn chat_defaults_and_switches() {
    let body = br#"{"messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "required", "chat_template_kwargs": {"enable_thinking": false},
        "response_format": {"type": "json_object"}}"#;
    let (r, ctx) = chat::request_to_ir(body).unwrap();
    assert_eq!(
        r.tools[0].parameters,
        raw(r#"{"type":"object","properties":{}}"#)
    );
    assert_eq!(r.tool_choice, Some(ToolChoice::Required));
    assert_eq!(
        r.thinking,
        Some(Thinking {
            enabled: false,
            budget_tokens: None,
            effort: None
        })
    );
    assert_eq!(r.response_format, Some(ResponseFormat::JsonObject));
    assert!(!r.stream);
    assert!(!ctx.include_usage);
}

const MESSAGES_REQUEST: &str = r#"{
  "model": "m", "max_tokens": 1000, "service_tier": "auto",
  "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Cite tools.", "cache_control": {"type": "ephemeral"}}],
  "messages": [
    {"role": "user", "content": [
      {"type": "text", "text": "Weather?"},
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "Need the tool.", "signature": "sig-1"},
      {"type": "redacted_thinking", "data": "opaque"},
      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": { "unit": "c", "city": "Paris" }}]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true, "content": [{"type": "text", "text": "timeout"}]},
      {"type": "text", "text": "Try again."}]}
  ],
  "tools": [{"name": "get_weather", "description": "Weather by city.", "input_schema": {"type": "object"}}],
  "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
  "temperature": 0.2, "top_k": 5, "stop_sequences": ["END", "STOP"], "stream": false,
  "metadata": {"user_id": "u-2"},
  "thinking": {"type": "enabled", "budget_tokens": 2048},
  "output_format": {"type": "json_schema", "schema": {"type": "object", "properties": {}}}
}"#;

#[test]
fn messages_request_to_ir() {
    let (r, _) = messages::request_to_ir(MESSAGES_REQUEST.as_bytes()).unwrap();
    let want = ir::Request {
        system: vec!["Be brief.".into(), "Cite tools.".into()],
        messages: vec![
            msg(
                Role::User,
                vec![
                    text("Weather?"),
                    Part::Image(Image {
                        source: ImageSource::Base64 {
                            media_type: "image/png".into(),
                            data: "iVBORw0KGgo=".into(),
                        },
                        detail: None,
                    }),
                ],
            ),
            msg(
                Role::Assistant,
                vec![
                    Part::Reasoning(Reasoning {
                        text: "Need the tool.".into(),
                        signature: Some("sig-1".into()),
                        redacted: None,
                    }),
                    Part::Reasoning(Reasoning {
                        redacted: Some("opaque".into()),
                        ..Reasoning::default()
                    }),
                    // The input as compact JSON with sorted keys, however the client spaced it.
                    Part::ToolCall {
                        id: "toolu_1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Paris","unit":"c"}"#.into(),
                    },
                ],
            ),
            msg(
                Role::User,
                vec![
                    Part::ToolResult {
                        call_id: "toolu_1".into(),
                        content: vec![text("timeout")],
                        is_error: true,
                    },
                    text("Try again."),
                ],
            ),
        ],
        tools: vec![Tool {
            name: "get_weather".into(),
            description: Some("Weather by city.".into()),
            parameters: raw(r#"{"type": "object"}"#),
            strict: None,
        }],
        tool_choice: Some(ToolChoice::Named("get_weather".into())),
        parallel_tool_calls: Some(false),
        max_tokens: Some(1000),
        temperature: Some(0.2),
        top_p: None,
        top_k: Some(5),
        stop: vec!["END".into(), "STOP".into()],
        stream: false,
        thinking: Some(Thinking {
            enabled: true,
            budget_tokens: Some(2048),
            effort: None,
        }),
        response_format: Some(ResponseFormat::JsonSchema {
            name: "structured_output".into(),
            description: None,
            schema: raw(r#"{"type": "object", "properties": {}}"#),
            strict: Some(true),
        }),
        user: Some("u-2".into()),
    };
    assert_eq!(r, want);
}

const RESPONSES_REQUEST: &str = r#"{
  "model": "m", "store": true, "instructions": "Be brief.",
  "input": [
    {"role": "developer", "content": "Cite tools."},
    {"type": "message", "role": "user", "content": [
      {"type": "input_text", "text": "Weather?"},
      {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need"}, {"type": "summary_text", "text": "the tool."}],
      "encrypted_content": "mg-anthropic-sig:sig-1"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "18°C"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "18°C.", "annotations": []}]},
    {"role": "user", "content": "Tomorrow?"}
  ],
  "tools": [{"type": "function", "name": "get_weather", "parameters": null, "strict": false}],
  "tool_choice": {"type": "function", "name": "get_weather"},
  "parallel_tool_calls": true, "max_output_tokens": 700, "temperature": 1.2, "top_p": 0.5,
  "stream": true, "user": "u-3",
  "reasoning": {"effort": "low", "summary": "auto"},
  "text": {"format": {"type": "json_object"}}
}"#;

#[test]
fn responses_request_to_ir() {
    let (r, ctx) = responses::request_to_ir(RESPONSES_REQUEST.as_bytes()).unwrap();
    let want = ir::Request {
        system: vec!["Be brief.".into(), "Cite tools.".into()],
        messages: vec![
            msg(
                Role::User,
                vec![
                    text("Weather?"),
                    Part::Image(Image {
                        source: ImageSource::Url("https://example.com/a.png".into()),
                        detail: Some("high".into()),
                    }),
                ],
            ),
            msg(
                Role::Assistant,
                vec![
                    // Only the gateway's own prefix marks a signature as Anthropic's.
                    Part::Reasoning(Reasoning {
                        text: "Need\nthe tool.".into(),
                        signature: Some("sig-1".into()),
                        redacted: None,
                    }),
                    Part::ToolCall {
                        id: "call_1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Paris"}"#.into(),
                    },
                ],
            ),
            msg(
                Role::User,
                vec![Part::ToolResult {
                    call_id: "call_1".into(),
                    content: vec![text("18°C")],
                    is_error: false,
                }],
            ),
            msg(Role::Assistant, vec![text("18°C.")]),
            msg(Role::User, vec![text("Tomorrow?")]),
        ],
        tools: vec![Tool {
            name: "get_weather".into(),
            description: None,
            // `null` parameters take the empty object schema.
            parameters: raw(r#"{"type":"object","properties":{}}"#),
            strict: Some(false),
        }],
        tool_choice: Some(ToolChoice::Named("get_weather".into())),
        parallel_tool_calls: Some(true),
        max_tokens: Some(700),
        temperature: Some(1.2),
        top_p: Some(0.5),
        top_k: None,
        stop: vec![],
        stream: true,
        thinking: Some(Thinking {
            enabled: true,
            budget_tokens: None,
            effort: Some("low".into()),
        }),
        response_format: Some(ResponseFormat::JsonObject),
        user: Some("u-3".into()),
    };
    assert_eq!(r, want);
    // The echo keeps what the client wrote, for the reply.
    let echo = &ctx.echo;
    let as_value = |raw: &Option<Box<serde_json::value::RawValue>>| -> Value {
        serde_json::from_str(raw.as_deref().expect("echoed").get()).unwrap()
    };
    assert_eq!(
        as_value(&echo.tools),
        json!([{"type": "function", "name": "get_weather", "parameters": null, "strict": false}])
    );
    assert_eq!(
        as_value(&echo.tool_choice),
        json!({"type": "function", "name": "get_weather"})
    );
    assert_eq!(as_value(&echo.instructions), json!("Be brief."));
    assert_eq!(as_value(&echo.max_output_tokens), json!(700));
    assert_eq!(as_value(&echo.effort), json!("low"));
    assert_eq!(as_value(&echo.summary), json!("auto"));
    assert!(echo.top_p.is_some() && echo.temperature.is_some());
}

/// Wrong input is refused with the same param and message as before the typed decoders.
#[test]
fn decoders_name_the_wrong_field() {
    let cases: &[(Protocol, &str, &str, &str)] = &[
        (
            Protocol::Chat,
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}"#,
            "messages[0].content[0].text",
            "`messages[0].content[0].text` must be a string",
        ),
        (
            Protocol::Chat,
            r#"{"messages": [{"role": "system", "content": [{"type": "image_url"}]}]}"#,
            "messages[0].content[0]",
            "only text parts are allowed here",
        ),
        (
            Protocol::Chat,
            r#"{"messages": ["hi"]}"#,
            "messages[0].role",
            "unknown role",
        ),
        (
            Protocol::Chat,
            r#"{"messages": [], "tools": [{"function": {"name": "f", "strict": "yes"}}]}"#,
            "tools[0].function.strict",
            "`tools[0].function.strict` must be a boolean",
        ),
        (
            Protocol::Chat,
            r#"{"messages": [], "tool_choice": 3}"#,
            "tool_choice",
            "`tool_choice` cannot be translated for this model's upstream: only none, auto, required or a named function",
        ),
        (
            Protocol::Chat,
            r#"{"messages": [], "temperature": 2.5}"#,
            "temperature",
            "`temperature` must be between 0 and 2; got 2.5",
        ),
        (
            Protocol::Chat,
            r#"{"messages": [], "stop": ["a", 1]}"#,
            "stop[1]",
            "`stop[1]` must be a string",
        ),
        (
            Protocol::Messages,
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            "max_tokens",
            "`max_tokens` is required",
        ),
        (
            Protocol::Messages,
            r#"{"max_tokens": 0, "messages": []}"#,
            "max_tokens",
            "`max_tokens` must be an integer of at least 1; got 0",
        ),
        (
            Protocol::Messages,
            r#"{"max_tokens": 5, "messages": [{"role": "user"}]}"#,
            "messages[0].content",
            "`content` is required",
        ),
        (
            Protocol::Messages,
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": null}]}"#,
            "messages[0].content",
            "`messages[0].content` must be a string or an array of content blocks",
        ),
        (
            Protocol::Messages,
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": "x"}]}]}"#,
            "messages[0].content[0].source.type",
            "image sources must be base64 or url",
        ),
        (
            Protocol::Messages,
            r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "thinking": true}"#,
            "thinking.type",
            "`thinking.type` must be enabled, disabled or adaptive",
        ),
        (
            Protocol::Messages,
            r#"[1, 2]"#,
            "body",
            "`body` must be an object",
        ),
        (
            Protocol::Responses,
            r#"{"model": "m"}"#,
            "input",
            "`input` is required",
        ),
        (
            Protocol::Responses,
            r#"{"input": [{"type": "function_call", "name": "f"}]}"#,
            "input[0].call_id",
            "`input[0].call_id` is required",
        ),
        (
            Protocol::Responses,
            r#"{"input": "hi", "previous_response_id": {}}"#,
            "previous_response_id",
            "`previous_response_id` cannot be translated for this model's upstream: the conversation is kept by the responses upstream that served it; send the whole input",
        ),
        (
            Protocol::Responses,
            r#"{"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}"#,
            "input[0].content[0].file_id",
            "`input[0].content[0].file_id` cannot be translated for this model's upstream: images must be given by image_url",
        ),
        (
            Protocol::Responses,
            r#"{"input": "hi", "tools": [{"name": "x"}]}"#,
            "tools[0].type",
            "unknown tool type \"?\"; allowed: function, custom, namespace, local_shell, or a hosted tool (web_search, file_search, code_interpreter, image_generation, computer_use_preview, tool_search, mcp)",
        ),
    ];
    for (protocol, body, param, message) in cases {
        let e = translate::decode_request(*protocol, body.as_bytes())
            .expect_err(&format!("{body} should be refused"));
        assert_eq!(e.param.as_deref(), Some(*param), "{body}");
        assert_eq!(e.message, *message, "{body}");
    }
}

#[test]
fn broken_json_is_refused_with_the_parser_message() {
    for protocol in [Protocol::Chat, Protocol::Messages, Protocol::Responses] {
        let e = translate::decode_request(protocol, b"{\"input\": ").unwrap_err();
        assert!(
            e.message
                .starts_with("the request body is not valid JSON: EOF while parsing"),
            "{}",
            e.message
        );
        let e = translate::decode_request(protocol, b"{\"input\": \"\xff\"}").unwrap_err();
        assert!(
            e.message
                .starts_with("the request body is not valid JSON: invalid unicode"),
            "{}",
            e.message
        );
    }
}

/// The rules of `serde_json::Value` the decoders keep: the last of repeated keys wins, unknown
/// fields are ignored, and `null` reads as absent.
#[test]
fn lenient_reading_matches_a_value_tree() {
    let body = br#"{"max_tokens": 1, "max_tokens": 9, "unknown": {"deep": [1, 2]},
        "messages": [{"role": "user", "content": "a"}], "system": null, "temperature": null}"#;
    let r = translate::decode_request(Protocol::Messages, body).unwrap();
    assert_eq!(r.max_tokens, Some(9));
    assert!(r.system.is_empty());
    assert_eq!(r.temperature, None);
}

/// A messages client's tool input becomes the arguments text a `Value` would write (compact,
/// keys sorted), whether or not the fast path that skips the tree applies.
#[test]
fn tool_inputs_become_canonical_arguments() {
    let inputs = [
        r#"{}"#,
        r#"{"city":"Paris"}"#,
        r#"{ "city" : "Paris" , "days" : [ 1, 2 ,3 ] }"#,
        r#"{"unit":"c","city":"Paris"}"#,
        r#"{"a":{"z":null,"b":[true,false,{"y":1,"x":-2}]},"b":"é ü"}"#,
        r#"{"a":1,"a":2}"#,
        r#"{"n":1.50,"m":1e3,"k":-0,"j":12345678901234567890,"i":-123456789012345678}"#,
        r#"{"s":"tab\tquote\"slash\/u\u00e9"}"#,
        r#"{"s":"\ud83d\ude00","t":[]}"#,
        "{\n  \"city\": \"Paris\"\n}",
        "[1, \"x\", null]",
    ];
    for input in inputs {
        let body = format!(
            r#"{{"max_tokens": 5, "messages": [{{"role": "assistant", "content": [
                {{"type": "tool_use", "id": "t", "name": "f", "input": {input}}}]}}]}}"#
        );
        let r = translate::decode_request(Protocol::Messages, body.as_bytes()).unwrap();
        let want = serde_json::from_str::<Value>(input).unwrap().to_string();
        match &r.messages[0].content[0] {
            Part::ToolCall { arguments, .. } => assert_eq!(arguments, &want, "{input}"),
            other => panic!("{other:?}"),
        }
    }
}

// === IR → wire ===

/// A conversation with every kind of part, tools and sampling fields.
fn rich_ir() -> ir::Request {
    ir::Request {
        system: vec!["Be brief.".into(), "Cite tools.".into()],
        messages: vec![
            msg(
                Role::User,
                vec![
                    text("Weather in Paris?"),
                    Part::Image(Image {
                        source: ImageSource::Base64 {
                            media_type: "image/png".into(),
                            data: "iVBORw0KGgo=".into(),
                        },
                        detail: Some("low".into()),
                    }),
                ],
            ),
            msg(
                Role::Assistant,
                vec![
                    Part::Reasoning(Reasoning {
                        text: "Need the tool.".into(),
                        signature: Some("sig-1".into()),
                        redacted: None,
                    }),
                    text("Checking."),
                    Part::ToolCall {
                        id: "call.1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Paris"}"#.into(),
                    },
                ],
            ),
            msg(
                Role::User,
                vec![
                    text("And tomorrow?"),
                    Part::ToolResult {
                        call_id: "call.1".into(),
                        content: vec![text("18°C, cloudy")],
                        is_error: false,
                    },
                ],
            ),
        ],
        tools: vec![Tool {
            name: "get_weather".into(),
            description: Some("Weather by city.".into()),
            parameters: raw(
                r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#,
            ),
            strict: Some(true),
        }],
        tool_choice: Some(ToolChoice::Auto),
        parallel_tool_calls: Some(false),
        max_tokens: Some(512),
        temperature: Some(1.5),
        top_p: Some(0.9),
        top_k: Some(40),
        stop: vec!["END".into()],
        stream: true,
        thinking: None,
        response_format: None,
        user: Some("u-1".into()),
    }
}

/// Structured output with thinking on, in one short turn.
fn json_thinking_ir() -> ir::Request {
    ir::Request {
        messages: vec![msg(Role::User, vec![text("List three colours.")])],
        max_tokens: Some(512),
        thinking: Some(Thinking {
            enabled: true,
            budget_tokens: Some(2048),
            effort: None,
        }),
        response_format: Some(ResponseFormat::JsonSchema {
            name: "colours".into(),
            description: Some("Three colours.".into()),
            schema: raw(r#"{"type":"object","properties":{"colours":{"type":"array"}}}"#),
            strict: Some(true),
        }),
        ..ir::Request::default()
    }
}

#[test]
fn ir_to_chat() {
    let m = model("chat-plain");
    let (body, _) = chat::ir_to_request(&rich_ir(), "up-chat", m.primary()).unwrap();
    check_golden("chat", "rich", &body);
    let m = model("chat-anthropic");
    let (body, _) = chat::ir_to_request(&json_thinking_ir(), "up-chat", m.primary()).unwrap();
    check_golden("chat", "json_thinking_anthropic", &body);
    let m = model("chat-kwargs");
    let (body, _) = chat::ir_to_request(&json_thinking_ir(), "up-chat", m.primary()).unwrap();
    check_golden("chat", "json_thinking_kwargs", &body);
}

#[test]
fn ir_to_messages() {
    let m = model("messages");
    let (body, ctx) = messages::ir_to_request(&rich_ir(), "up-messages", m.primary()).unwrap();
    check_golden("messages", "rich", &body);
    assert!(!ctx.json_mode);
    let (body, ctx) =
        messages::ir_to_request(&json_thinking_ir(), "up-messages", m.primary()).unwrap();
    check_golden("messages", "json_thinking", &body);
    assert!(ctx.json_mode, "JSON mode went up as a tool");
}

#[test]
fn ir_to_responses() {
    let m = model("responses");
    // Stop sequences never reach this encoder: the Capabilities check refuses them first.
    let rich = ir::Request {
        stop: vec![],
        ..rich_ir()
    };
    let (body, _) = responses::ir_to_request(&rich, "up-responses", m.primary()).unwrap();
    check_golden("responses", "rich", &body);
    let (body, _) =
        responses::ir_to_request(&json_thinking_ir(), "up-responses", m.primary()).unwrap();
    check_golden("responses", "json_thinking", &body);
}

/// What the encoders write for an empty request: the required fields and nothing else.
#[test]
fn minimal_bodies_hold_only_required_fields() {
    let r = ir::Request {
        messages: vec![msg(Role::User, vec![text("hi")])],
        ..ir::Request::default()
    };
    fn body<C>((b, _): (Vec<u8>, C)) -> Value {
        serde_json::from_slice(&b).unwrap()
    }
    let chat = body(chat::ir_to_request(&r, "c", model("chat-plain").primary()).unwrap());
    assert_eq!(
        chat,
        json!({"model": "c", "messages": [{"role": "user", "content": "hi"}]})
    );
    let messages = body(messages::ir_to_request(&r, "m", model("messages").primary()).unwrap());
    assert_eq!(
        messages,
        json!({"model": "m", "max_tokens": 4096,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    );
    let responses = body(responses::ir_to_request(&r, "r", model("responses").primary()).unwrap());
    assert_eq!(
        responses,
        json!({"model": "r", "store": false, "input": [{"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hi"}]}]})
    );
}
