//! Agents' tools, thinking and token counting across protocols (gateway.md §13): what Codex and Claude Code send, through the gateway to loopback upstreams of each protocol.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// One loopback upstream serving every protocol, and models routed to it per protocol.
fn agents_config(upstream: &str, extra_model_keys: &str) -> String {
    config(
        upstream,
        &format!(
            r#"
[[upstreams]]
name = "chat"
kind = "chat"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "messages"
kind = "messages"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "responses"
kind = "responses"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

[[models]]
name = "on-chat"
upstream = "chat"
upstream_model = "up-chat"
{extra_model_keys}

[[models]]
name = "on-messages"
upstream = "messages"
upstream_model = "up-messages"
{extra_model_keys}

[[models]]
name = "on-responses"
upstream = "responses"
upstream_model = "up-responses"
{extra_model_keys}
"#
        ),
    )
}

/// What Codex sends: plain, namespaced, custom (with a grammar) and shell tools, two hosted tools, reasoning.
fn codex_tools() -> Value {
    json!([
        {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
            {"type": "function", "name": "spawn", "description": "Start one.", "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}
        ]},
        {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}},
        {"type": "local_shell"},
        {"type": "web_search", "external_web_access": false},
        {"type": "tool_search", "execution": "client", "parameters": {"type": "object"}}
    ])
}

fn chat_tool_calls_reply() -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "up-chat",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [
                {"id": "call_ns", "type": "function", "function": {"name": "agents__spawn", "arguments": "{\"task\":\"t\"}"}},
                {"id": "call_patch", "type": "function", "function": {"name": "apply_patch", "arguments": "{\"input\":\"*** Begin Patch\\n*** End Patch\\n\"}"}},
                {"id": "call_sh", "type": "function", "function": {"name": "local_shell", "arguments": "{\"command\":[\"ls\",\"-l\"]}"}}
            ]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
}

fn tool_names(tools: &Value) -> Vec<String> {
    tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.pointer("/function/name")
                .or_else(|| t.get("name"))
                .and_then(Value::as_str)
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn codex_tools_reach_a_chat_upstream_as_functions_and_come_back_as_its_own_items() {
    let up = FakeUpstream::start(|_| Reply::json(200, chat_tool_calls_reply())).await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let body = json!({"model": "on-chat", "input": "fix it", "tools": codex_tools(),
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": false,
        "include": ["reasoning.encrypted_content"]});
    let (status, headers, reply) = post_json(&gw.base("/v1/responses"), body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(headers["x-modelgate-dropped"], "web_search, tool_search");

    let sent = up.last().json();
    assert_eq!(
        tool_names(&sent["tools"]),
        [
            "exec_command",
            "agents__spawn",
            "apply_patch",
            "local_shell"
        ]
    );
    let patch = &sent["tools"][2]["function"]["parameters"];
    assert_eq!(patch["required"], json!(["input"]));
    assert!(patch["properties"]["input"]["description"]
        .as_str()
        .unwrap()
        .contains("start: begin_patch hunk+ end_patch"));
    assert_eq!(
        sent["tools"][3]["function"]["parameters"]["required"],
        json!(["command"])
    );
    // The model has no thinking form configured: nothing of the client's reasoning goes up.
    for key in [
        "reasoning_effort",
        "reasoning",
        "thinking",
        "chat_template_kwargs",
        "enable_thinking",
    ] {
        assert!(sent.get(key).is_none(), "{key} sent: {sent}");
    }

    let out = reply["output"].as_array().unwrap();
    assert_eq!(out.len(), 3, "{reply}");
    assert_eq!(out[0]["type"], "function_call");
    assert_eq!(out[0]["name"], "spawn");
    assert_eq!(out[0]["namespace"], "agents");
    assert_eq!(out[0]["call_id"], "call_ns");
    assert_eq!(out[1]["type"], "custom_tool_call");
    assert_eq!(out[1]["name"], "apply_patch");
    assert_eq!(out[1]["input"], "*** Begin Patch\n*** End Patch\n");
    assert_eq!(out[1]["call_id"], "call_patch");
    assert_eq!(out[2]["type"], "local_shell_call");
    assert_eq!(out[2]["call_id"], "call_sh");
    assert_eq!(
        out[2]["action"],
        json!({"type": "exec", "command": ["ls", "-l"]})
    );
}

#[tokio::test]
async fn the_same_calls_stream_as_openai_streams_each_item_type() {
    let chunks = [
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-chat","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_ns","type":"function","function":{"name":"agents__spawn","arguments":""}}]}}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-chat","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"task\":\"t\"}"}}]}}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-chat","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_patch","type":"function","function":{"name":"apply_patch","arguments":"{\"input\":\"*** Begin"}}]}}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-chat","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":" Patch\\n\"}"}}]}}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-chat","choices":[{"index":0,"delta":{"tool_calls":[{"index":2,"id":"call_sh","type":"function","function":{"name":"local_shell","arguments":"{\"command\":[\"pwd\"]}"}}]}}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-chat","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
    ];
    let mut sse: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    sse.push("data: [DONE]\n\n".into());
    let up = FakeUpstream::start(move |_| {
        Reply::sse(sse.iter().map(|s| (Duration::ZERO, s.as_str())).collect())
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let body =
        json!({"model": "on-chat", "input": "fix it", "tools": codex_tools(), "stream": true});
    let text = post_text(&gw.base("/v1/responses"), &body).await;
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let done: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| &e["item"])
        .collect();
    assert_eq!(done.len(), 3, "{text}");
    assert_eq!(
        (&done[0]["type"], &done[0]["name"], &done[0]["namespace"]),
        (&json!("function_call"), &json!("spawn"), &json!("agents"))
    );
    assert_eq!(done[0]["arguments"], "{\"task\":\"t\"}");
    assert_eq!(done[1]["type"], "custom_tool_call");
    assert_eq!(done[1]["input"], "*** Begin Patch\n");
    assert_eq!(done[2]["type"], "local_shell_call");
    assert_eq!(done[2]["action"]["command"], json!(["pwd"]));
    let input_done = events
        .iter()
        .find(|e| e["type"] == "response.custom_tool_call_input.done")
        .expect("custom_tool_call_input.done");
    assert_eq!(input_done["input"], "*** Begin Patch\n");
    let args_done = events
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(args_done["name"], "spawn");
    // Each item is added before it is done, and the terminal event carries all three.
    let added = kinds
        .iter()
        .filter(|k| **k == "response.output_item.added")
        .count();
    assert_eq!(added, 3, "{kinds:?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    let types: Vec<&str> = last["response"]["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["function_call", "custom_tool_call", "local_shell_call"]
    );
}

#[tokio::test]
async fn the_client_s_own_call_items_and_outputs_go_back_up_as_chat_history() {
    let up = FakeUpstream::start(|_| {
        Reply::json(200, json!({"id": "c", "object": "chat.completion", "created": 1, "model": "up-chat",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}]}))
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let body = json!({"model": "on-chat", "tools": codex_tools(), "input": [
        {"role": "user", "content": "fix it"},
        {"type": "function_call", "call_id": "call_ns", "name": "spawn", "namespace": "agents", "arguments": "{\"task\":\"t\"}"},
        {"type": "function_call_output", "call_id": "call_ns", "output": "spawned"},
        {"type": "custom_tool_call", "call_id": "call_patch", "name": "apply_patch", "input": "*** Begin Patch\n"},
        {"type": "custom_tool_call_output", "call_id": "call_patch", "output": "patched"},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_sh", "status": "completed", "action": {"type": "exec", "command": ["pwd"]}},
        {"type": "local_shell_call_output", "id": "call_sh", "output": "/tmp"}
    ]});
    let (status, _, reply) = post_json(&gw.base("/v1/responses"), body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = up.last().json();
    let msgs = sent["messages"].as_array().unwrap();
    let calls: Vec<(&str, &str)> = msgs
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .map(|c| {
            (
                c["function"]["name"].as_str().unwrap(),
                c["function"]["arguments"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("agents__spawn", "{\"task\":\"t\"}"),
            ("apply_patch", "{\"input\":\"*** Begin Patch\\n\"}"),
            ("local_shell", "{\"command\":[\"pwd\"]}")
        ]
    );
    let results: Vec<(&str, &str)> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap(),
                m["content"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("call_ns", "spawned"),
            ("call_patch", "patched"),
            ("call_sh", "/tmp")
        ]
    );
}

#[tokio::test]
async fn hosted_tools_are_refused_where_the_model_says_so_and_collisions_always() {
    let up = FakeUpstream::start(|_| Reply::json(200, chat_tool_calls_reply())).await;
    let gw = TestGateway::start(&agents_config(&up.url(), "hosted_tools = \"refuse\"")).await;
    let body = json!({"model": "on-chat", "input": "hi", "tools": codex_tools()});
    let (status, _, reply) = post_json(&gw.base("/v1/responses"), body).await;
    assert_openai_error(status, &reply, 400, Some("tools[4]"));
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("web_search"),
        "{reply}"
    );

    let body = json!({"model": "on-messages", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    let (status, _, reply) = post_json(&gw.base("/v1/messages"), body).await;
    // A messages client on a messages upstream is passthrough: the upstream runs its own tools.
    assert_ne!(status, 400, "{reply}");

    let body = json!({"model": "on-chat", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    let (status, _, reply) = post_json(&gw.base("/v1/messages"), body).await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["type"], "error");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tools[0]"),
        "{reply}"
    );

    let body = json!({"model": "on-chat", "input": "hi", "tools": [
        {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b"}]},
        {"type": "function", "name": "a__b"}
    ]});
    let (status, _, reply) = post_json(&gw.base("/v1/responses"), body).await;
    assert_openai_error(status, &reply, 400, Some("tools[1]"));
    let msg = reply["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("tools[0].tools[0]") && msg.contains("tools[1]") && msg.contains("a__b"),
        "{msg}"
    );
    // Only the passthrough request reached the upstream.
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn claude_code_s_tools_and_thinking_reach_chat_and_responses_upstreams() {
    let up = FakeUpstream::start(|seen| {
        if seen.uri.ends_with("/responses") {
            Reply::json(200, json!({"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "up-responses",
                "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "bash", "arguments": "{\"command\":\"ls\"}", "status": "completed"}],
                "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}))
        } else {
            Reply::json(200, json!({"id": "c", "object": "chat.completion", "created": 1, "model": "up-chat",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]}}]}))
        }
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    for model in ["on-chat", "on-responses"] {
        let body = json!({"model": model, "max_tokens": 2048, "messages": [{"role": "user", "content": "list files"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [
            {"type": "bash_20250124", "name": "bash"},
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"name": "Read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
        ]});
        let (status, headers, reply) = post_json(&gw.base("/v1/messages"), body).await;
        assert_eq!(status, 200, "{model}: {reply}");
        assert_eq!(headers["x-modelgate-dropped"], "web_search_20250305");
        assert_eq!(reply["content"][0]["type"], "tool_use");
        assert_eq!(reply["content"][0]["name"], "bash");
        assert_eq!(reply["content"][0]["input"], json!({"command": "ls"}));
        let sent = up.last().json();
        assert_eq!(
            tool_names(&sent["tools"]),
            ["bash", "str_replace_based_edit_tool", "Read"],
            "{model}"
        );
        let params = |i: usize| {
            let t = &sent["tools"][i];
            t.pointer("/function/parameters")
                .or_else(|| t.get("parameters"))
                .unwrap()
                .clone()
        };
        assert_eq!(params(0)["properties"]["command"]["type"], "string");
        assert_eq!(params(1)["required"], json!(["command", "path"]));
        for key in [
            "reasoning_effort",
            "reasoning",
            "thinking",
            "chat_template_kwargs",
            "enable_thinking",
        ] {
            assert!(sent.get(key).is_none(), "{model}: {key} sent: {sent}");
        }
    }
}

#[tokio::test]
async fn a_responses_client_s_reasoning_is_dropped_toward_a_messages_model_without_thinking() {
    let up = FakeUpstream::start(|_| {
        Reply::json(200, json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "up-messages",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 3, "output_tokens": 1}}))
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let body = json!({"model": "on-messages", "input": "hi", "reasoning": {"effort": "high", "summary": "auto"}});
    let (status, _, reply) = post_json(&gw.base("/v1/responses"), body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = up.last().json();
    assert!(sent.get("thinking").is_none(), "{sent}");
    assert_eq!(reply["output"][0]["content"][0]["text"], "ok");
}

#[tokio::test]
async fn thinking_goes_up_in_the_configured_form_only() {
    let up = FakeUpstream::start(|_| {
        Reply::json(200, json!({"id": "c", "object": "chat.completion", "created": 1, "model": "up-chat",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]}))
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "thinking = \"enable_thinking\"")).await;
    let body = json!({"model": "on-chat", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024}});
    let (status, _, reply) = post_json(&gw.base("/v1/messages"), body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = up.last().json();
    assert_eq!(sent["enable_thinking"], true);
    assert!(sent.get("reasoning_effort").is_none(), "{sent}");
}

#[tokio::test]
async fn count_tokens_is_forwarded_to_messages_upstreams_and_estimated_elsewhere() {
    let up = FakeUpstream::start(|seen| {
        if seen.uri.ends_with("/count_tokens") {
            Reply::json(200, json!({"input_tokens": 4242}))
        } else {
            Reply::json(500, json!({"error": {"message": "unexpected"}}))
        }
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let url = gw.base("/v1/messages/count_tokens");
    let body = json!({"model": "on-messages", "messages": [{"role": "user", "content": "hello"}]});
    let resp = client()
        .post(&url)
        .header("x-api-key", KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-modelgate-estimate").is_none());
    assert_eq!(resp.json::<Value>().await.unwrap()["input_tokens"], 4242);
    let seen = up.last();
    assert_eq!(seen.uri, "/v1/messages/count_tokens");
    assert_eq!(seen.json()["model"], "up-messages");
    assert_eq!(seen.headers["x-api-key"], "up-secret");

    let short = json!({"model": "on-chat", "messages": [{"role": "user", "content": "hello"}]});
    let long = json!({"model": "on-chat", "system": "You are a careful assistant.",
        "messages": [{"role": "user", "content": "hello, please count every one of these words for me"}],
        "tools": [{"name": "Read", "description": "Reads a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
                  {"type": "web_search_20250305", "name": "web_search"}]});
    let mut counts = Vec::new();
    for body in [short, long] {
        let resp = client()
            .post(&url)
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-modelgate-estimate"], "true");
        counts.push(
            resp.json::<Value>().await.unwrap()["input_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert!(counts[0] > 0 && counts[1] > counts[0] + 20, "{counts:?}");
    assert_eq!(up.seen().len(), 1, "estimates never reach the upstream");

    // Bad input is refused in Anthropic's shape before any upstream.
    let bad = json!({"model": "on-messages", "messages": "hello"});
    let (status, _, reply) = post_json(&url, bad).await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["type"], "error");
    assert_eq!(reply["error"]["type"], "invalid_request_error");
    assert_eq!(up.seen().len(), 1);

    let (status, _, reply) = post_json(&gw.base("/v1/messages/batches"), json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(reply["type"], "error");
    assert_eq!(reply["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn a_custom_tool_inside_a_namespace_comes_back_with_its_namespace() {
    let up = FakeUpstream::start(|_| {
        Reply::json(200, json!({"id": "c", "object": "chat.completion", "created": 1, "model": "up-chat",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_c", "type": "function", "function": {"name": "files__patch", "arguments": "{\"input\":\"diff\"}"}}]}}]}))
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let tools = json!([{"type": "namespace", "name": "files", "description": "Files.", "tools": [
        {"type": "custom", "name": "patch", "description": "Patch a file."}
    ]}]);
    let body = json!({"model": "on-chat", "input": "edit", "tools": tools, "store": false});
    let (status, _, reply) = post_json(&gw.base("/v1/responses"), body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(tool_names(&up.last().json()["tools"]), ["files__patch"]);
    let call = &reply["output"][0];
    assert_eq!(call["type"], "custom_tool_call", "{reply}");
    assert_eq!(call["name"], "patch", "{reply}");
    assert_eq!(call["namespace"], "files", "{reply}");
    assert_eq!(call["input"], "diff", "{reply}");

    // The call and its output, sent back as history, go up under the flattened name.
    let input = json!([
        {"role": "user", "content": "edit"},
        {"type": "custom_tool_call", "call_id": "call_c", "name": "patch", "namespace": "files", "input": "diff"},
        {"type": "custom_tool_call_output", "call_id": "call_c", "output": "done"}
    ]);
    let body = json!({"model": "on-chat", "input": input, "tools": tools, "store": false});
    let (status, _, reply) = post_json(&gw.base("/v1/responses"), body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = up.last().json();
    let call = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|m| m.get("tool_calls"))
        .unwrap();
    assert_eq!(call[0]["function"]["name"], "files__patch", "{sent}");
    assert_eq!(
        call[0]["function"]["arguments"], "{\"input\":\"diff\"}",
        "{sent}"
    );
}

#[tokio::test]
async fn a_messages_client_forcing_a_dropped_server_tool_lets_the_model_choose() {
    let up = FakeUpstream::start(|_| {
        Reply::json(200, json!({"id": "c", "object": "chat.completion", "created": 1, "model": "up-chat",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]}))
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let body = json!({"model": "on-chat", "max_tokens": 64, "messages": [{"role": "user", "content": "search"}],
        "tools": [
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"name": "Read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
        ],
        "tool_choice": {"type": "tool", "name": "web_search"}});
    let (status, headers, reply) = post_json(&gw.base("/v1/messages"), body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(headers["x-modelgate-dropped"], "web_search_20250305");
    let sent = up.last().json();
    assert_eq!(tool_names(&sent["tools"]), ["Read"]);
    assert_eq!(sent["tool_choice"], "auto", "{sent}");

    // A client tool forced by name is still forced.
    let body = json!({"model": "on-chat", "max_tokens": 64, "messages": [{"role": "user", "content": "read"}],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "Read"}});
    let (status, _, reply) = post_json(&gw.base("/v1/messages"), body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        up.last().json()["tool_choice"],
        json!({"type": "function", "function": {"name": "Read"}})
    );
}

#[tokio::test]
async fn a_chat_client_s_reasoning_effort_is_dropped_toward_a_model_without_thinking() {
    let up = FakeUpstream::start(|_| {
        Reply::json(200, json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "up-messages",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 3, "output_tokens": 1}}))
    })
    .await;
    let gw = TestGateway::start(&agents_config(&up.url(), "")).await;
    let body = json!({"model": "on-messages", "reasoning_effort": "high",
        "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, reply) = post_json(&gw.base("/v1/chat/completions"), body).await;
    assert_eq!(status, 200, "{reply}");
    let sent = up.last().json();
    assert!(sent.get("thinking").is_none(), "{sent}");
    assert_eq!(reply["choices"][0]["message"]["content"], "ok");
}
