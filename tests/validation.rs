//! Chat-completions validation (interface §2.1, §8; gateway.md §6): every rule from both sides of
//! its boundary, refused requests never reaching the upstream, and thinking-switch normalisation.
//!
//! Each rule is a table, one case per line: `name | JSON | outcome`. The JSON is turned into a
//! request body by the rule's builder; the outcome is `ok` (200, and the upstream got the request
//! with every field as sent) or the `error.param` of the expected 400 (and the upstream got nothing).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed setup step should fail the test loudly"
)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// Top-level fields set on `chat_body(model)`; a `"model"` among them overrides `model`.
/// In `chat_config`, "plain" has no vision and no thinking; "m" has vision and
/// `thinking = "chat_template_kwargs"` and is renamed to "real-m" upstream.
fn top(model: &'static str) -> impl Fn(Value) -> Value {
    move |fields| {
        let mut body = chat_body(model);
        for (k, v) in fields.as_object().expect("the row's JSON is an object") {
            body[k] = v.clone();
        }
        body
    }
}

/// The row is the value of `name` on `chat_body("plain")`; the string "(absent)" removes it.
fn field(name: &'static str) -> impl Fn(Value) -> Value {
    move |value| {
        let mut body = chat_body("plain");
        let obj = body.as_object_mut().expect("object");
        match value.as_str() {
            Some("(absent)") => obj.remove(name),
            _ => obj.insert(name.to_owned(), value),
        };
        body
    }
}

/// Fields the gateway rewrites on purpose (checked by the normalisation tests below).
const REWRITTEN: [&str; 4] = [
    "model",
    "thinking",
    "enable_thinking",
    "chat_template_kwargs",
];

/// A 400 in OpenAI's shape whose `param` is `param` and whose message names it.
fn assert_refused(name: &str, status: u16, v: &Value, param: Option<&str>) {
    assert_eq!(status, 400, "{name}: expected 400, got {status}: {v}");
    let err = &v["error"];
    let message = err["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{name}: no error.message in {v}");
    assert_eq!(err["type"], "invalid_request_error", "{name}: {v}");
    assert_eq!(err["code"], "invalid_value", "{name}: {v}");
    match param {
        Some(p) => {
            assert_eq!(err["param"], p, "{name}: wrong error.param in {v}");
            assert!(
                message.contains(p),
                "{name}: the message must name `{p}`: {message}"
            );
        }
        None => assert!(err["param"].is_null(), "{name}: no field to name: {v}"),
    }
    for kind in ["a string", "a number", "a boolean", "an object", "an array"] {
        let nonsense = format!("must be {kind}; got {kind}");
        assert!(!message.contains(&nonsense), "{name}: {message}");
    }
}

/// Parses a `name | JSON | outcome` table into (name, body, expected param or None for ok).
fn parse_table(
    table: &'static str,
    build: impl Fn(Value) -> Value,
) -> Vec<(&'static str, Value, Option<&'static str>)> {
    let rows: Vec<_> = table
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|line| {
            let cols: Vec<&str> = line.split('|').map(str::trim).collect();
            let [name, fields, outcome] = cols[..] else {
                panic!("a row needs three columns: {line}")
            };
            let fields = serde_json::from_str(fields)
                .unwrap_or_else(|e| panic!("{name}: bad JSON in the table: {e}"));
            let want = (outcome != "ok").then_some(outcome);
            (name, build(fields), want)
        })
        .collect();
    let refused = rows.iter().filter(|r| r.2.is_some()).count();
    assert!(
        refused > 0 && refused < rows.len(),
        "a rule's table needs both sides of its boundary"
    );
    rows
}

/// Runs a table against a fresh gateway and upstream: every refused case first (the upstream
/// must still have received nothing after each), then every accepted one.
async fn run(table: &'static str, build: impl Fn(Value) -> Value) {
    // A stream request is answered with a stream: anything else is the upstream's 502 (§14).
    let up = FakeUpstream::start(|seen| {
        if seen.json()["stream"] == true {
            Reply::sse(vec![(
                Duration::ZERO,
                "data: {\"object\":\"chat.completion.chunk\",\"choices\":[]}\n\ndata: [DONE]\n\n",
            )])
        } else {
            Reply::json(200, json!({"object": "chat.completion"}))
        }
    })
    .await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let url = gw.base("/v1/chat/completions");
    let (refused, accepted): (Vec<_>, Vec<_>) = parse_table(table, build)
        .into_iter()
        .partition(|r| r.2.is_some());
    for (name, body, param) in refused {
        let (status, _, v) = post_json(&url, body).await;
        assert_refused(name, status, &v, param);
        assert!(up.seen().is_empty(), "{name}: reached the upstream");
    }
    for (n, (name, body, _)) in accepted.into_iter().enumerate() {
        let (status, _, v) = post_json(&url, body.clone()).await;
        assert_eq!(status, 200, "{name}: expected 200, got {status}: {v}");
        let seen = up.seen();
        assert_eq!(seen.len(), n + 1, "{name}: not forwarded");
        let sent = seen[n].json();
        let renamed = body["model"] == "m";
        let want_model = if renamed {
            json!("real-m")
        } else {
            body["model"].clone()
        };
        assert_eq!(sent["model"], want_model, "{name}");
        for (k, v) in body.as_object().expect("object body") {
            if !REWRITTEN.contains(&k.as_str()) {
                assert_eq!(&sent[k], v, "{name}: `{k}` must reach the upstream as sent");
            }
        }
    }
}

#[tokio::test]
async fn temperature_is_0_to_2() {
    let table = r#"
        0                | {"temperature": 0}     | ok
        2                | {"temperature": 2}     | ok
        2.0              | {"temperature": 2.0}   | ok
        null is absent   | {"temperature": null}  | ok
        -0.01            | {"temperature": -0.01} | temperature
        2.01             | {"temperature": 2.01}  | temperature
        a string         | {"temperature": "1"}   | temperature
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn top_p_is_0_to_1() {
    let table = r#"
        0      | {"top_p": 0}     | ok
        1      | {"top_p": 1}     | ok
        -0.01  | {"top_p": -0.01} | top_p
        1.01   | {"top_p": 1.01}  | top_p
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn penalties_are_minus_2_to_2() {
    let table = r#"
        presence -2      | {"presence_penalty": -2}     | ok
        presence 2       | {"presence_penalty": 2}      | ok
        presence -2.01   | {"presence_penalty": -2.01}  | presence_penalty
        presence 2.01    | {"presence_penalty": 2.01}   | presence_penalty
        frequency -2     | {"frequency_penalty": -2}    | ok
        frequency 2      | {"frequency_penalty": 2}     | ok
        frequency -2.01  | {"frequency_penalty": -2.01} | frequency_penalty
        frequency 2.01   | {"frequency_penalty": 2.01}  | frequency_penalty
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn max_tokens_is_a_positive_integer() {
    let table = r#"
        max_tokens 1               | {"max_tokens": 1}                  | ok
        max_tokens 1000000         | {"max_tokens": 1000000}            | ok
        max_tokens 0               | {"max_tokens": 0}                  | max_tokens
        max_tokens -1              | {"max_tokens": -1}                 | max_tokens
        max_tokens 1.5             | {"max_tokens": 1.5}                | max_tokens
        max_tokens 2.0             | {"max_tokens": 2.0}                | max_tokens
        max_tokens a string        | {"max_tokens": "10"}               | max_tokens
        max_completion_tokens 1    | {"max_completion_tokens": 1}       | ok
        max_completion_tokens 0    | {"max_completion_tokens": 0}       | max_completion_tokens
        max_completion_tokens 1.5  | {"max_completion_tokens": 1.5}     | max_completion_tokens
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn n_is_1_to_128() {
    let table = r#"
        1    | {"n": 1}   | ok
        128  | {"n": 128} | ok
        0    | {"n": 0}   | n
        129  | {"n": 129} | n
        1.5  | {"n": 1.5} | n
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn stop_is_a_string_or_at_most_4_strings() {
    let table = r#"
        bare string       | {"stop": "END"}                     | ok
        1 string          | {"stop": ["a"]}                     | ok
        4 strings         | {"stop": ["a", "b", "c", "d"]}      | ok
        5 strings         | {"stop": ["a", "b", "c", "d", "e"]} | stop
        a number          | {"stop": 5}                         | stop
        a bool            | {"stop": true}                      | stop
        an object         | {"stop": {"a": "b"}}                | stop
        a number inside   | {"stop": ["a", 1]}                  | stop[1]
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn top_logprobs_is_0_to_20_and_only_with_logprobs() {
    let table = r#"
        0 with logprobs        | {"logprobs": true, "top_logprobs": 0}   | ok
        20 with logprobs       | {"logprobs": true, "top_logprobs": 20}  | ok
        logprobs alone         | {"logprobs": true}                      | ok
        logprobs false alone   | {"logprobs": false}                     | ok
        21                     | {"logprobs": true, "top_logprobs": 21}  | top_logprobs
        -1                     | {"logprobs": true, "top_logprobs": -1}  | top_logprobs
        1.5                    | {"logprobs": true, "top_logprobs": 1.5} | top_logprobs
        0 without logprobs     | {"top_logprobs": 0}                     | top_logprobs
        5 with logprobs false  | {"logprobs": false, "top_logprobs": 5}  | top_logprobs
        logprobs a string      | {"logprobs": "true", "top_logprobs": 1} | logprobs
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn stream_options_only_with_stream() {
    let table = r#"
        stream true          | {"stream": true}                                             | ok
        stream false         | {"stream": false}                                            | ok
        with stream          | {"stream": true, "stream_options": {"include_usage": true}}  | ok
        without stream       | {"stream_options": {"include_usage": true}}                  | stream_options
        with stream false    | {"stream": false, "stream_options": {}}                      | stream_options
        not an object        | {"stream": true, "stream_options": true}                     | stream_options
        include_usage "yes"  | {"stream": true, "stream_options": {"include_usage": "yes"}} | stream_options.include_usage
        stream a string      | {"stream": "true"}                                           | stream
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn response_format_is_text_json_object_or_named_json_schema() {
    // The row is the `response_format` value.
    let table = r#"
        text                  | {"type": "text"}                                          | ok
        json_object           | {"type": "json_object"}                                   | ok
        json_schema           | {"type": "json_schema", "json_schema": {"name": "a_b-1"}} | ok
        with a schema         | {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}} | ok
        xml                   | {"type": "xml"}                                           | response_format.type
        no type               | {}                                                        | response_format.type
        type a number         | {"type": 1}                                               | response_format.type
        a bare string         | "json_object"                                             | response_format
        no json_schema        | {"type": "json_schema"}                                   | response_format.json_schema
        schema without name   | {"type": "json_schema", "json_schema": {"schema": {}}}    | response_format.json_schema.name
        name with a space     | {"type": "json_schema", "json_schema": {"name": "a b"}}   | response_format.json_schema.name
        empty name            | {"type": "json_schema", "json_schema": {"name": ""}}      | response_format.json_schema.name
        schema a string       | {"type": "json_schema", "json_schema": {"name": "a", "schema": "x"}} | response_format.json_schema.schema
    "#;
    run(table, field("response_format")).await;
}

#[tokio::test]
async fn tools_are_functions_only() {
    // The row is the `tools` value.
    let table = r#"
        one function        | [{"type": "function", "function": {"name": "get_weather"}}]                  | ok
        with parameters     | [{"type": "function", "function": {"name": "f", "parameters": {}}}]          | ok
        two functions       | [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}] | ok
        another kind        | [{"type": "retrieval", "function": {"name": "f"}}]                           | tools[0].type
        another kind second | [{"type": "function", "function": {"name": "a"}}, {"type": "code_interpreter"}] | tools[1].type
        no type             | [{"function": {"name": "f"}}]                                                | tools[0].type
        no function         | [{"type": "function"}]                                                       | tools[0].function
        no function name    | [{"type": "function", "function": {}}]                                       | tools[0].function.name
        bad function name   | [{"type": "function", "function": {"name": "get weather"}}]                  | tools[0].function.name
        parameters a string | [{"type": "function", "function": {"name": "f", "parameters": "x"}}]         | tools[0].function.parameters
        an object           | {"type": "function", "function": {"name": "f"}}                              | tools
        a tool a string     | ["f"]                                                                        | tools[0]
    "#;
    run(table, field("tools")).await;
}

#[tokio::test]
async fn tool_choice_and_parallel_tool_calls() {
    // Sent with one tool offered, a function named "a".
    let table = r#"
        auto              | {"tool_choice": "auto"}                                          | ok
        none              | {"tool_choice": "none"}                                          | ok
        required          | {"tool_choice": "required"}                                      | ok
        a named function  | {"tool_choice": {"type": "function", "function": {"name": "a"}}} | ok
        parallel true     | {"parallel_tool_calls": true}                                    | ok
        sometimes         | {"tool_choice": "sometimes"}                                     | tool_choice
        a number          | {"tool_choice": 5}                                               | tool_choice
        no type           | {"tool_choice": {}}                                              | tool_choice.type
        another kind      | {"tool_choice": {"type": "retrieval"}}                           | tool_choice.type
        function no name  | {"tool_choice": {"type": "function"}}                            | tool_choice.function.name
        parallel "yes"    | {"parallel_tool_calls": "yes"}                                   | parallel_tool_calls
    "#;
    run(table, |fields| {
        let mut body = top("plain")(fields);
        body["tools"] = json!([{"type": "function", "function": {"name": "a"}}]);
        body
    })
    .await;
}

#[tokio::test]
async fn messages_are_a_non_empty_array_of_objects() {
    // The row is the `messages` value; "(absent)" leaves the field out.
    let table = r#"
        one message     | [{"role": "user", "content": "hi"}]                                  | ok
        three messages  | [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "?"}] | ok
        missing         | "(absent)"                                                           | messages
        null            | null                                                                 | messages
        empty           | []                                                                   | messages
        an object       | {"role": "user", "content": "hi"}                                    | messages
        a string        | "hi"                                                                 | messages
        item a string   | [{"role": "user", "content": "hi"}, "hi"]                            | messages[1]
    "#;
    run(table, field("messages")).await;
}

#[tokio::test]
async fn roles_are_the_known_five() {
    // The row is a second message, after a user message.
    let table = r#"
        system         | {"role": "system", "content": "x"}                       | ok
        developer      | {"role": "developer", "content": "x"}                    | ok
        user           | {"role": "user", "content": "x"}                         | ok
        assistant      | {"role": "assistant", "content": "x"}                    | ok
        tool           | {"role": "tool", "content": "42", "tool_call_id": "c1"}  | ok
        unknown role   | {"role": "robot", "content": "x"}                        | messages[1].role
        function role  | {"role": "function", "content": "x", "name": "f"}        | messages[1].role
        upper case     | {"role": "User", "content": "x"}                         | messages[1].role
        missing role   | {"content": "x"}                                         | messages[1].role
        role a number  | {"role": 1, "content": "x"}                              | messages[1].role
    "#;
    run(table, |msg| {
        top("plain")(json!({"messages": [{"role": "user", "content": "a"}, msg]}))
    })
    .await;
}

#[tokio::test]
async fn content_is_a_string_or_parts_allowed_for_the_role() {
    // The row is the one message sent.
    let table = r#"
        string                   | {"role": "user", "content": "hi"}                                                 | ok
        empty string             | {"role": "user", "content": ""}                                                   | ok
        text parts               | {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]} | ok
        system text part         | {"role": "system", "content": [{"type": "text", "text": "be brief"}]}             | ok
        assistant refusal part   | {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}          | ok
        assistant tool_calls     | {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]} | ok
        missing on user          | {"role": "user"}                                                                  | messages[0].content
        null on user             | {"role": "user", "content": null}                                                 | messages[0].content
        a number                 | {"role": "user", "content": 5}                                                    | messages[0].content
        an object                | {"role": "user", "content": {"type": "text", "text": "a"}}                        | messages[0].content
        assistant with nothing   | {"role": "assistant"}                                                             | messages[0].content
        part a string            | {"role": "user", "content": ["hi"]}                                               | messages[0].content[0]
        part without type        | {"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}       | messages[0].content[1].type
        unknown part type        | {"role": "user", "content": [{"type": "video", "video": {}}]}                     | messages[0].content[0].type
        text part without text   | {"role": "user", "content": [{"type": "text"}]}                                   | messages[0].content[0].text
        text a number            | {"role": "user", "content": [{"type": "text", "text": 1}]}                        | messages[0].content[0].text
        refusal part on user     | {"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}               | messages[0].content[0].type
        image part on system     | {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]} | messages[0].content[0].type
    "#;
    // Model "m" takes images, so the system-role image is refused for its role alone.
    run(table, |msg| top("m")(json!({ "messages": [msg] }))).await;
}

#[tokio::test]
async fn tool_messages_and_tool_calls() {
    // A user question, an assistant tool call (`call`, default a valid one), and a tool reply
    // (`reply`, default a valid one); `user_calls` puts tool_calls on the user message instead.
    let table = r#"
        a full tool round          | {}                                                           | ok
        no tool_call_id            | {"reply": {"role": "tool", "content": "sunny"}}              | messages[2].tool_call_id
        tool_call_id a number      | {"reply": {"role": "tool", "content": "s", "tool_call_id": 1}} | messages[2].tool_call_id
        tool_calls on user         | {"user_calls": true}                                         | messages[0].tool_calls
        call without name          | {"call": {"id": "c1", "function": {"arguments": "{}"}}}      | messages[1].tool_calls[0].function.name
        arguments an object        | {"call": {"id": "c1", "function": {"name": "w", "arguments": {}}}} | messages[1].tool_calls[0].function.arguments
        call without function      | {"call": {"id": "c1"}}                                       | messages[1].tool_calls[0].function
    "#;
    run(table, |row| {
        let call =
            json!({"id": "c1", "type": "function", "function": {"name": "w", "arguments": ""}});
        let call = row.get("call").cloned().unwrap_or(call);
        let reply = json!({"role": "tool", "content": "sunny", "tool_call_id": "c1"});
        let reply = row.get("reply").cloned().unwrap_or(reply);
        let mut user = json!({"role": "user", "content": "weather?"});
        if row.get("user_calls").is_some() {
            user["tool_calls"] = json!([call.clone()]);
        }
        let assistant = json!({"role": "assistant", "content": null, "tool_calls": [call]});
        top("plain")(json!({ "messages": [user, assistant, reply] }))
    })
    .await;
}

#[tokio::test]
async fn image_parts_only_for_vision_models() {
    // The row is the image part's `image_url` ("(absent)" leaves it out), sent to "m" (vision)
    // unless the row names "plain" as `model`.
    let table = r#"
        https                | {"url": "https://x/a.png", "detail": "high"}                | ok
        http                 | {"url": "http://x/a.png"}                                   | ok
        data URL             | {"url": "data:image/png;base64,iVBO", "detail": "low"}      | ok
        detail auto          | {"url": "https://x/a.png", "detail": "auto"}                | ok
        no vision            | {"url": "https://x/a.png", "model": "plain"}                | messages[0].content[1]
        no vision, data URL  | {"url": "data:image/png;base64,iVBO", "model": "plain"}     | messages[0].content[1]
        ftp URL              | {"url": "ftp://x/a.png"}                                    | messages[0].content[1].image_url.url
        data URL not image   | {"url": "data:text/plain;base64,aGk="}                      | messages[0].content[1].image_url.url
        no url               | {"detail": "high"}                                          | messages[0].content[1].image_url.url
        url a number         | {"url": 7}                                                  | messages[0].content[1].image_url.url
        detail ultra         | {"url": "https://x/a.png", "detail": "ultra"}               | messages[0].content[1].image_url.detail
        image_url a string   | "https://x/a.png"                                           | messages[0].content[1].image_url
        no image_url         | "(absent)"                                                  | messages[0].content[1].image_url
    "#;
    run(table, |mut image| {
        let model = image.get("model").cloned().unwrap_or(json!("m"));
        if let Some(o) = image.as_object_mut() {
            o.remove("model");
        }
        let mut part = json!({"type": "image_url", "image_url": image});
        if part["image_url"] == "(absent)" {
            part.as_object_mut().expect("object").remove("image_url");
        }
        let text = json!({"type": "text", "text": "what is this?"});
        json!({"model": model, "messages": [{"role": "user", "content": [text, part]}]})
    })
    .await;
}

#[tokio::test]
async fn thinking_type_is_enabled_or_disabled() {
    let table = r#"
        enabled             | {"thinking": {"type": "enabled"}}                   | ok
        disabled            | {"thinking": {"type": "disabled"}}                  | ok
        with a budget       | {"thinking": {"type": "enabled", "budget_tokens": 2048}} | ok
        auto                | {"thinking": {"type": "auto"}}                      | thinking.type
        Enabled             | {"thinking": {"type": "Enabled"}}                   | thinking.type
        no type             | {"thinking": {}}                                    | thinking.type
        type a bool         | {"thinking": {"type": true}}                        | thinking.type
        a bare string       | {"thinking": "enabled"}                             | thinking
        enable_thinking "1" | {"enable_thinking": "true"}                         | enable_thinking
        kwargs switch "yes" | {"chat_template_kwargs": {"enable_thinking": "yes"}} | chat_template_kwargs.enable_thinking
        kwargs a string     | {"chat_template_kwargs": "x"}                       | chat_template_kwargs
    "#;
    run(table, top("m")).await;
}

#[tokio::test]
async fn thinking_switches_must_agree() {
    let table = r#"
        all three on           | {"chat_template_kwargs": {"enable_thinking": true}, "thinking": {"type": "enabled"}, "enable_thinking": true}    | ok
        all three off          | {"chat_template_kwargs": {"enable_thinking": false}, "thinking": {"type": "disabled"}, "enable_thinking": false} | ok
        two agree              | {"thinking": {"type": "enabled"}, "enable_thinking": true}                                                      | ok
        kwargs on, type off    | {"chat_template_kwargs": {"enable_thinking": true}, "thinking": {"type": "disabled"}}                           | thinking.type
        kwargs off, enable on  | {"chat_template_kwargs": {"enable_thinking": false}, "enable_thinking": true}                                   | enable_thinking
        type on, enable off    | {"thinking": {"type": "enabled"}, "enable_thinking": false}                                                     | enable_thinking
        two on, one off        | {"chat_template_kwargs": {"enable_thinking": true}, "thinking": {"type": "enabled"}, "enable_thinking": false}   | enable_thinking
    "#;
    run(table, top("m")).await;
}

#[tokio::test]
async fn thinking_switch_on_a_model_without_thinking() {
    // "plain" has `thinking = "none"`: any switch, on or off, is refused.
    let table = r#"
        other kwargs only     | {"chat_template_kwargs": {"foo": 1}}                   | ok
        on a thinking model   | {"model": "m", "enable_thinking": false}               | ok
        kwargs on             | {"chat_template_kwargs": {"enable_thinking": true}}    | chat_template_kwargs.enable_thinking
        kwargs off            | {"chat_template_kwargs": {"enable_thinking": false}}   | chat_template_kwargs.enable_thinking
        thinking enabled      | {"thinking": {"type": "enabled"}}                      | thinking.type
        thinking disabled     | {"thinking": {"type": "disabled"}}                     | thinking.type
        enable_thinking true  | {"enable_thinking": true}                              | enable_thinking
        enable_thinking false | {"enable_thinking": false}                             | enable_thinking
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn wrong_json_types_are_refused() {
    let table = r#"
        right types                | {"temperature": 0.5, "top_p": 0.5, "stream": false, "max_tokens": 5} | ok
        temperature a string       | {"temperature": "1"}            | temperature
        temperature a bool         | {"temperature": true}           | temperature
        top_p a string             | {"top_p": "0.5"}                | top_p
        presence_penalty an array  | {"presence_penalty": [1]}       | presence_penalty
        frequency_penalty object   | {"frequency_penalty": {}}       | frequency_penalty
        max_tokens a string        | {"max_tokens": "10"}            | max_tokens
        n a string                 | {"n": "1"}                      | n
        stream a number            | {"stream": 1}                   | stream
        logprobs a number          | {"logprobs": 1}                 | logprobs
        parallel_tool_calls string | {"parallel_tool_calls": "true"} | parallel_tool_calls
        tools a string             | {"tools": "get_weather"}        | tools
        response_format an array   | {"response_format": ["text"]}   | response_format
    "#;
    run(table, top("plain")).await;
}

#[tokio::test]
async fn model_is_a_required_non_empty_string() {
    // The row is the `model` value; "(absent)" leaves the field out.
    let table = r#"
        a known model  | "plain"             | ok
        missing        | "(absent)"          | model
        null           | null                | model
        a number       | 5                   | model
        an object      | {"name": "plain"}   | model
        empty          | ""                  | model
    "#;
    run(table, field("model")).await;
}

async fn post_raw(url: &str, raw: String) -> (u16, Value) {
    let req = client().post(url).bearer_auth(KEY).body(raw);
    let resp = req
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
}

#[tokio::test]
async fn body_must_be_one_json_object() {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let url = gw.base("/v1/chat/completions");
    let ok = r#"{"model":"plain","messages":[{"role":"user","content":"hi"}]}"#;
    for (name, raw) in [
        ("truncated", ok[..ok.len() - 1].to_owned()),
        ("trailing garbage", format!("{ok} x")),
        ("two objects", format!("{ok}{ok}")),
        ("single quotes", ok.replace('"', "'")),
        ("empty", String::new()),
        ("an array", format!("[{ok}]")),
        ("a string", r#""hello""#.to_owned()),
        ("null", "null".to_owned()),
    ] {
        let (status, v) = post_raw(&url, raw).await;
        // No field to name: the body as a whole is wrong.
        assert_refused(name, status, &v, None);
        assert!(up.seen().is_empty(), "{name}: reached the upstream");
    }
    let (status, v) = post_raw(&url, ok.to_owned()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(up.last().body, ok.as_bytes(), "forwarded byte for byte");
}

#[tokio::test]
async fn unreadable_values_are_refused_by_what_they_are() {
    // Valid JSON that serde_json's `Value` cannot hold, sent as raw text: `name | body (or a
    // field added to a minimal body) | outcome | what the message must say`. "must be a number;
    // got a number" would say nothing.
    let table = r#"
        temperature 1e999      | "temperature": 1e999               | temperature | 1e999
        max_tokens beyond i64  | "max_tokens": 99999999999999999999 | max_tokens  | 99999999999999999999
        n below i64            | "n": -99999999999999999999         | n           | 99999999999999999999
        stop a lone surrogate  | "stop": "\ud800"                   | stop        | escape
        model lone surrogate   | {"model": "\ud800", "messages": []} | model      | escape
        content lone surrogate | {"model": "plain", "messages": [{"role": "user", "content": "\ud800"}]} | messages[0].content | escape
        a surrogate pair       | {"model": "plain", "messages": [{"role": "user", "content": "\ud83d\ude00"}]} | ok |
    "#;
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&chat_config(&up.url())).await;
    let url = gw.base("/v1/chat/completions");
    for line in table.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        let [name, raw, outcome, says] = cols[..] else {
            panic!("bad row: {line}")
        };
        let raw = match raw.starts_with('{') {
            true => raw.to_owned(),
            false => format!(
                r#"{{"model":"plain","messages":[{{"role":"user","content":"hi"}}],{raw}}}"#
            ),
        };
        let (status, v) = post_raw(&url, raw.clone()).await;
        if outcome == "ok" {
            assert_eq!(status, 200, "{name}: {v}");
            assert_eq!(up.last().body, raw.as_bytes(), "{name}");
            continue;
        }
        assert_refused(name, status, &v, Some(outcome));
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{name}: {message}");
        assert!(up.seen().is_empty(), "{name}: reached the upstream");
    }
    assert_eq!(up.seen().len(), 1, "the accepted row was forwarded");
}

/// One model per thinking style, all on the fake upstream.
fn thinking_config(upstream: &str) -> String {
    let mut extra = String::from(
        "[[upstreams]]\nname = \"up\"\nkind = \"chat\"\nbase_url = \"{UPSTREAM}/v1\"\n",
    );
    for (name, style, more) in [
        ("t-kwargs", "chat_template_kwargs", ""),
        ("t-enable", "enable_thinking", ""),
        ("t-type", "thinking_type", ""),
        (
            "t-anthropic",
            "anthropic",
            "upstream_model = \"claude-up\"\ndefault_max_tokens = 8192",
        ),
        ("t-anthropic-bare", "anthropic", ""),
    ] {
        extra.push_str(&format!(
            "\n[[models]]\nname = \"{name}\"\nupstream = \"up\"\nthinking = \"{style}\"\n{more}\n"
        ));
    }
    common::config(upstream, &extra)
}

#[tokio::test]
async fn thinking_is_rewritten_into_the_models_form() {
    // `model | the client's fields | everything the upstream gets besides the messages`: the
    // client's switches removed, the model's one form written, other template kwargs kept.
    let table = r#"
        t-kwargs    | {"chat_template_kwargs": {"enable_thinking": true, "keep": 1}}   | {"model": "t-kwargs", "chat_template_kwargs": {"keep": 1, "enable_thinking": true}}
        t-kwargs    | {"chat_template_kwargs": {"enable_thinking": false, "keep": 1}}  | {"model": "t-kwargs", "chat_template_kwargs": {"keep": 1, "enable_thinking": false}}
        t-kwargs    | {"thinking": {"type": "enabled"}, "chat_template_kwargs": {"keep": 1}}  | {"model": "t-kwargs", "chat_template_kwargs": {"keep": 1, "enable_thinking": true}}
        t-kwargs    | {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}} | {"model": "t-kwargs", "chat_template_kwargs": {"keep": 1, "enable_thinking": false}}
        t-kwargs    | {"enable_thinking": true, "chat_template_kwargs": {"keep": 1}}   | {"model": "t-kwargs", "chat_template_kwargs": {"keep": 1, "enable_thinking": true}}
        t-kwargs    | {"enable_thinking": false, "chat_template_kwargs": {"keep": 1}}  | {"model": "t-kwargs", "chat_template_kwargs": {"keep": 1, "enable_thinking": false}}
        t-enable    | {"chat_template_kwargs": {"enable_thinking": true, "keep": 1}}   | {"model": "t-enable", "enable_thinking": true, "chat_template_kwargs": {"keep": 1}}
        t-enable    | {"chat_template_kwargs": {"enable_thinking": false, "keep": 1}}  | {"model": "t-enable", "enable_thinking": false, "chat_template_kwargs": {"keep": 1}}
        t-enable    | {"thinking": {"type": "enabled"}, "chat_template_kwargs": {"keep": 1}}  | {"model": "t-enable", "enable_thinking": true, "chat_template_kwargs": {"keep": 1}}
        t-enable    | {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}} | {"model": "t-enable", "enable_thinking": false, "chat_template_kwargs": {"keep": 1}}
        t-enable    | {"enable_thinking": true, "chat_template_kwargs": {"keep": 1}}   | {"model": "t-enable", "enable_thinking": true, "chat_template_kwargs": {"keep": 1}}
        t-enable    | {"enable_thinking": false, "chat_template_kwargs": {"keep": 1}}  | {"model": "t-enable", "enable_thinking": false, "chat_template_kwargs": {"keep": 1}}
        t-type      | {"chat_template_kwargs": {"enable_thinking": true, "keep": 1}}   | {"model": "t-type", "thinking": {"type": "enabled"}, "chat_template_kwargs": {"keep": 1}}
        t-type      | {"chat_template_kwargs": {"enable_thinking": false, "keep": 1}}  | {"model": "t-type", "thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}}
        t-type      | {"thinking": {"type": "enabled"}, "chat_template_kwargs": {"keep": 1}}  | {"model": "t-type", "thinking": {"type": "enabled"}, "chat_template_kwargs": {"keep": 1}}
        t-type      | {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}} | {"model": "t-type", "thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}}
        t-type      | {"enable_thinking": true, "chat_template_kwargs": {"keep": 1}}   | {"model": "t-type", "thinking": {"type": "enabled"}, "chat_template_kwargs": {"keep": 1}}
        t-type      | {"enable_thinking": false, "chat_template_kwargs": {"keep": 1}}  | {"model": "t-type", "thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}}
        t-anthropic | {"chat_template_kwargs": {"enable_thinking": true, "keep": 1}}   | {"model": "claude-up", "thinking": {"type": "enabled", "budget_tokens": 4096}, "chat_template_kwargs": {"keep": 1}}
        t-anthropic | {"chat_template_kwargs": {"enable_thinking": false, "keep": 1}}  | {"model": "claude-up", "thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}}
        t-anthropic | {"thinking": {"type": "enabled"}, "chat_template_kwargs": {"keep": 1}}  | {"model": "claude-up", "thinking": {"type": "enabled", "budget_tokens": 4096}, "chat_template_kwargs": {"keep": 1}}
        t-anthropic | {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}} | {"model": "claude-up", "thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}}
        t-anthropic | {"enable_thinking": true, "chat_template_kwargs": {"keep": 1}}   | {"model": "claude-up", "thinking": {"type": "enabled", "budget_tokens": 4096}, "chat_template_kwargs": {"keep": 1}}
        t-anthropic | {"enable_thinking": false, "chat_template_kwargs": {"keep": 1}}  | {"model": "claude-up", "thinking": {"type": "disabled"}, "chat_template_kwargs": {"keep": 1}}
    "#;
    check_rewrites(table).await;
}

#[tokio::test]
async fn thinking_rewrite_edge_cases() {
    let table = r#"
        t-enable         | {"chat_template_kwargs": {"enable_thinking": true}} | {"model": "t-enable", "enable_thinking": true}
        t-type           | {"chat_template_kwargs": {"enable_thinking": false}, "thinking": {"type": "disabled"}, "enable_thinking": false} | {"model": "t-type", "thinking": {"type": "disabled"}}
        t-kwargs         | {"chat_template_kwargs": {"enable_thinking": false}, "thinking": {"type": "disabled"}, "enable_thinking": false} | {"model": "t-kwargs", "chat_template_kwargs": {"enable_thinking": false}}
        t-anthropic      | {"thinking": {"type": "enabled", "budget_tokens": 50}, "max_tokens": 10000} | {"model": "claude-up", "max_tokens": 10000, "thinking": {"type": "enabled", "budget_tokens": 1024}}
        t-anthropic      | {"thinking": {"type": "enabled", "budget_tokens": 2000}, "max_tokens": 10000} | {"model": "claude-up", "max_tokens": 10000, "thinking": {"type": "enabled", "budget_tokens": 2000}}
        t-anthropic      | {"enable_thinking": true, "max_tokens": 1000} | {"model": "claude-up", "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024}}
        t-anthropic      | {"enable_thinking": true, "max_completion_tokens": 3000} | {"model": "claude-up", "max_completion_tokens": 3000, "thinking": {"type": "enabled", "budget_tokens": 1500}}
        t-anthropic      | {"enable_thinking": true, "max_tokens": 1500} | {"model": "claude-up", "max_tokens": 1500, "thinking": {"type": "enabled", "budget_tokens": 1024}}
        t-anthropic-bare | {"enable_thinking": true}             | {"model": "t-anthropic-bare", "thinking": {"type": "enabled", "budget_tokens": 1024}}
        t-kwargs         | {"chat_template_kwargs": {"keep": 1}} | {"model": "t-kwargs", "chat_template_kwargs": {"keep": 1}}
        t-enable         | {"chat_template_kwargs": {"keep": 1}} | {"model": "t-enable", "chat_template_kwargs": {"keep": 1}}
        t-type           | {"chat_template_kwargs": {"keep": 1}} | {"model": "t-type", "chat_template_kwargs": {"keep": 1}}
        t-anthropic      | {"chat_template_kwargs": {"keep": 1}} | {"model": "claude-up", "chat_template_kwargs": {"keep": 1}}
    "#;
    // In order: only the switch was in chat_template_kwargs, so the object goes; three agreeing
    // switches collapse into one form; the Anthropic budget is the client's own, else half of
    // max_tokens (or max_completion_tokens, or default_max_tokens), at least 1024, and a reply
    // limit at or under it grows so Anthropic accepts it; no switch, no form invented.
    check_rewrites(table).await;
}

/// Sends each `model | client fields | upstream fields` row and compares what the upstream got.
async fn check_rewrites(table: &'static str) {
    let up = FakeUpstream::start(|_| Reply::json(200, json!({}))).await;
    let gw = TestGateway::start(&thinking_config(&up.url())).await;
    let url = gw.base("/v1/chat/completions");
    let rows = table.lines().map(str::trim).filter(|l| !l.is_empty());
    for (n, line) in rows.enumerate() {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        let [model, client, want] = cols[..] else {
            panic!("bad row: {line}")
        };
        let parse = |text| serde_json::from_str::<Value>(text).expect("the row's JSON");
        let body = top(model)(parse(client));
        let (status, _, v) = post_json(&url, body.clone()).await;
        assert_eq!(status, 200, "{line}: {v}");
        let seen = up.seen();
        assert_eq!(seen.len(), n + 1, "{line}: not forwarded");
        let mut sent = seen[n].json();
        let messages = sent.as_object_mut().unwrap().remove("messages");
        assert_eq!(messages.as_ref(), Some(&body["messages"]), "{line}");
        assert_eq!(sent, parse(want), "{line}");
    }
}
