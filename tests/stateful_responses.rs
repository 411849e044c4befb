//! Stateful Responses (gateway.md §13): conversations continued by `previous_response_id` and `item_reference` over chat and messages upstreams, the stored-response endpoints, ownership, `store: false`, expiry, the memory cap, passthrough responses routed back to their upstream, streams, and the same in a real Redis.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods,
    reason = "test code: a failed setup step should fail the test loudly, and test tasks end with the test"
)]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "sk-other";

/// Two keys, one loopback upstream serving every protocol, a model per protocol, and `store`
/// (the `[store]` table's lines).
fn stateful_config(upstream: &str, store: &str) -> String {
    format!(
        r#"
[listen]
base = "127.0.0.1:0"
token_plan = "127.0.0.1:0"
video = "127.0.0.1:0"
admin = "127.0.0.1:0"

[limits]
max_request_bytes = 4194304
connect_timeout_ms = 1000
first_byte_timeout_ms = 2000
idle_timeout_ms = 2000

[store]
{store}

[[keys]]
name = "test"
key = "{KEY}"

[[keys]]
name = "other"
key = "{OTHER_KEY}"

[[upstreams]]
name = "chat"
kind = "chat"
base_url = "{upstream}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "messages"
kind = "messages"
base_url = "{upstream}/v1"
api_key_env = "UPSTREAM_KEY"

[[upstreams]]
name = "responses"
kind = "responses"
base_url = "{upstream}/v1"
api_key_env = "UPSTREAM_KEY"

[[models]]
name = "on-chat"
upstream = "chat"
upstream_model = "up-chat"

[[models]]
name = "on-messages"
upstream = "messages"
upstream_model = "up-messages"

[[models]]
name = "on-responses"
upstream = "responses"
upstream_model = "up-responses"
"#
    )
}

/// The user turns an upstream request carries (chat and messages shapes alike), as text.
fn user_turns(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "user").count())
}

/// Answers by protocol: chat and messages say `reply-<user turns>` (or `big` text of `size`
/// bytes when the last user turn asks for it; a chat stream asked to `break me` ends after its
/// first chunk); a responses upstream keeps `resp_up_1`.
fn upstream(seen: &Seen) -> Reply {
    let path = seen.uri.split('?').next().unwrap_or_default().to_owned();
    if seen.method == "GET" && path == "/v1/responses/resp_up_1" {
        return Reply::json(
            200,
            json!({"id": "resp_up_1", "object": "response", "from": "upstream"}),
        );
    }
    if seen.method == "GET" && path == "/v1/responses/resp_up_1/input_items" {
        return Reply::json(
            200,
            json!({"object": "list", "data": [], "from": "upstream", "query": seen.uri}),
        );
    }
    if seen.method == "DELETE" && path == "/v1/responses/resp_up_1" {
        return Reply::json(
            200,
            json!({"id": "resp_up_1", "object": "response.deleted", "deleted": true}),
        );
    }
    if seen.method != "POST" {
        return Reply::json(404, json!({"error": {"message": "nope"}}));
    }
    let body = seen.json();
    let text = match body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .map(|m| m["content"].to_string())
    {
        Some(c) if c.contains("big:") => {
            let n: usize = c
                .split("big:")
                .nth(1)
                .unwrap()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap();
            "x".repeat(n)
        }
        Some(c) if c.contains("break me") => format!("break-{}", user_turns(&body)),
        _ => format!("reply-{}", user_turns(&body)),
    };
    match path.as_str() {
        "/v1/chat/completions" if body["stream"] == true => {
            let first = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up-chat",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": null}]});
            if text.contains("break") {
                // Ends after its first chunk: no finish, no `[DONE]`.
                return Reply::sse(vec![(
                    Duration::ZERO,
                    format!("data: {first}\n\n").as_str(),
                )]);
            }
            let last = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up-chat",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
            let events = format!("data: {first}\n\ndata: {last}\n\ndata: [DONE]\n\n");
            Reply::sse(vec![(Duration::ZERO, events.as_str())])
        }
        "/v1/chat/completions" => Reply::json(
            200,
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "up-chat",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
        ),
        "/v1/messages" => Reply::json(
            200,
            json!({"id": "msg_up", "type": "message", "role": "assistant", "model": "up-messages",
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 3, "output_tokens": 2}}),
        ),
        "/v1/responses" if body["stream"] == true => {
            let created = json!({"type": "response.created", "sequence_number": 0,
                "response": {"id": "resp_up_1", "object": "response", "status": "in_progress", "output": []}});
            let done = json!({"type": "response.completed", "sequence_number": 1,
                "response": {"id": "resp_up_1", "object": "response", "status": "completed", "output": []}});
            let events = format!(
                "event: response.created\ndata: {created}\n\nevent: response.completed\ndata: {done}\n\n"
            );
            Reply::sse(vec![(Duration::ZERO, events.as_str())])
        }
        "/v1/responses" => Reply::json(
            200,
            json!({"id": "resp_up_1", "object": "response", "status": "completed", "model": "up-responses",
                "output": [{"id": "msg_up_1", "type": "message", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "from upstream", "annotations": []}]}]}),
        ),
        _ => Reply::json(404, json!({"error": {"message": "no such path"}})),
    }
}

async fn start(store: &str) -> (FakeUpstream, TestGateway) {
    let up = FakeUpstream::start(upstream).await;
    let gw = TestGateway::start(&stateful_config(&up.url(), store)).await;
    (up, gw)
}

async fn post_as(key: &str, url: &str, body: &Value) -> (u16, Value) {
    let resp = client()
        .post(url)
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

async fn call(method: reqwest::Method, key: &str, url: &str) -> (u16, Value) {
    let resp = client()
        .request(method, url)
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

async fn get(key: &str, url: &str) -> (u16, Value) {
    call(reqwest::Method::GET, key, url).await
}

/// The text of every output_text part in a response's output.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect()
}

/// The upstream's last request's conversation, as (role, text) pairs in order.
fn conversation(seen: &Seen) -> Vec<(String, String)> {
    seen.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = match &m["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                _ => String::new(),
            };
            (m["role"].as_str().unwrap().to_owned(), text)
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(r, t)| ((*r).to_owned(), (*t).to_owned()))
        .collect()
}

/// The conversation continues over both translated protocols: the second and third requests
/// reach the upstream with every earlier turn, in order, and the reply echoes its parent.
async fn two_turns_over(gw: &TestGateway, up: &FakeUpstream, model: &str) {
    let url = gw.base("/v1/responses");
    let (s, first) = post_as(
        KEY,
        &url,
        &json!({"model": model, "input": "My name is Ada."}),
    )
    .await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(output_text(&first), "reply-1");
    assert_eq!(first["store"], true, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    let (s, second) = post_as(
        KEY,
        &url,
        &json!({"model": model, "previous_response_id": id, "input": "What is my name?", "instructions": "Be brief."}),
    )
    .await;
    assert_eq!(s, 200, "{second}");
    assert_eq!(
        output_text(&second),
        "reply-2",
        "the upstream saw both user turns"
    );
    assert_eq!(second["previous_response_id"], id.as_str());
    let sent = up.last();
    let mut turns = conversation(&sent);
    // Chat carries the instructions as a system message; messages as `system`.
    turns.retain(|(role, _)| role != "system");
    assert_eq!(
        turns,
        pairs(&[
            ("user", "My name is Ada."),
            ("assistant", "reply-1"),
            ("user", "What is my name?")
        ]),
        "{}",
        sent.json()
    );
    assert!(
        sent.json().get("previous_response_id").is_none(),
        "expanded, not forwarded"
    );
    // The chain goes on: the third turn carries the first two.
    let (s, third) = post_as(
        KEY,
        &url,
        &json!({"model": model, "previous_response_id": second["id"], "input": [{"role": "user", "content": "Again?"}]}),
    )
    .await;
    assert_eq!(s, 200, "{third}");
    assert_eq!(output_text(&third), "reply-3");
    let mut turns = conversation(&up.last());
    turns.retain(|(role, _)| role != "system");
    assert_eq!(turns.len(), 5, "{turns:?}");
    assert_eq!(turns[4], ("user".to_owned(), "Again?".to_owned()));
}

#[tokio::test]
async fn previous_response_id_continues_over_chat_and_messages() {
    let (up, gw) = start("").await;
    two_turns_over(&gw, &up, "on-chat").await;
    two_turns_over(&gw, &up, "on-messages").await;
}

#[tokio::test]
async fn item_reference_is_replaced_by_the_stored_item() {
    let (up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let (_, first) = post_as(KEY, &url, &json!({"model": "on-chat", "input": "q1"})).await;
    let item = first["output"][0]["id"].as_str().unwrap().to_owned();
    assert!(item.starts_with("msg_"), "{first}");
    // Across protocols too: the item made over chat is referenced toward messages.
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-messages", "input": [
            {"role": "user", "content": "q1"},
            {"type": "item_reference", "id": item},
            {"role": "user", "content": "q2"}
        ]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        conversation(&up.last()),
        pairs(&[("user", "q1"), ("assistant", "reply-1"), ("user", "q2")])
    );
    // An unknown reference is a 404 naming the item, and reaches no upstream.
    let before = up.seen().len();
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": [{"role": "user", "content": "q"}, {"type": "item_reference", "id": "msg_nope"}]}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("input[1].id"));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("msg_nope"),
        "{v}"
    );
    // Another key's item is unknown to this key.
    let (s, v) = post_as(
        OTHER_KEY,
        &url,
        &json!({"model": "on-chat", "input": [{"role": "user", "content": "q"}, {"type": "item_reference", "id": item}]}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("input[1].id"));
    assert_eq!(up.seen().len(), before);
}

/// Every item id the gateway gives a kept answer, streamed or not, names that answer (so a
/// reference finds it with no index entry); an answer not kept gets random ones. An item
/// copied into a later answer's input is that answer's too: once the answer that made it is
/// deleted, a reference to it alone is unknown, and one beside a reference to the later
/// answer is found there.
#[tokio::test]
async fn item_ids_name_their_answer_and_later_answers_hold_copies() {
    let (up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let named = |answer: &Value| format!("msg_{}80000000", &answer["id"].as_str().unwrap()[5..]);
    let (_, first) = post_as(KEY, &url, &json!({"model": "on-chat", "input": "q1"})).await;
    let item = first["output"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(item, named(&first), "{first}");
    let text = post_text(
        &url,
        &json!({"model": "on-chat", "input": "s", "stream": true}),
    )
    .await;
    let streamed = completed(&text);
    assert_eq!(streamed["output"][0]["id"], named(&streamed), "{streamed}");
    let (_, unkept) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": "q", "store": false}),
    )
    .await;
    assert_ne!(unkept["output"][0]["id"], named(&unkept), "{unkept}");

    let (s, second) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": [
            {"role": "user", "content": "q1"},
            {"type": "item_reference", "id": item},
            {"role": "user", "content": "q2"}
        ]}),
    )
    .await;
    assert_eq!(s, 200, "{second}");
    let answer = first["id"].as_str().unwrap();
    let (s, _) = call(
        reqwest::Method::DELETE,
        KEY,
        &gw.base(&format!("/v1/responses/{answer}")),
    )
    .await;
    assert_eq!(s, 200);
    let before = up.seen().len();
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": [
            {"role": "user", "content": "q"},
            {"type": "item_reference", "id": item}
        ]}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("input[1].id"));
    assert_eq!(up.seen().len(), before);
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": [
            {"role": "user", "content": "q1"},
            {"type": "item_reference", "id": item},
            {"role": "user", "content": "q2"},
            {"type": "item_reference", "id": second["output"][0]["id"]},
            {"role": "user", "content": "q3"}
        ]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        conversation(&up.last()),
        pairs(&[
            ("user", "q1"),
            ("assistant", "reply-1"),
            ("user", "q2"),
            ("assistant", "reply-2"),
            ("user", "q3")
        ])
    );
}

/// The AI SDK's way with `store` left on: every turn sends the whole history, its earlier
/// answers as `item_reference`s, and no `previous_response_id`. Each turn reaches the upstream
/// with every earlier turn in order; so does a request referring into two conversations. The
/// turns go one to `gw` and the next to `other`, which share their store when it is Redis.
async fn whole_histories_of_references(gw: &TestGateway, other: &TestGateway, up: &FakeUpstream) {
    let mut input = Vec::new();
    let mut want = Vec::new();
    let mut third_answer = Value::Null;
    let mut last_answer = String::new();
    for turn in 1..=12 {
        let question = format!("q{turn}");
        input.push(json!({"role": "user", "content": question}));
        want.push(("user".to_owned(), question));
        let url = [gw, other][turn % 2].base("/v1/responses");
        let (s, v) = post_as(KEY, &url, &json!({"model": "on-chat", "input": input})).await;
        assert_eq!(s, 200, "turn {turn}: {v}");
        assert_eq!(conversation(&up.last()), want, "turn {turn}");
        assert_eq!(output_text(&v), format!("reply-{turn}"));
        let id = v["output"][0]["id"].clone();
        third_answer = if turn == 3 { id.clone() } else { third_answer };
        last_answer = v["id"].as_str().unwrap().to_owned();
        input.push(json!({"type": "item_reference", "id": id}));
        want.push(("assistant".to_owned(), format!("reply-{turn}")));
    }
    let url = gw.base("/v1/responses");
    let (_, b) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": [
            {"role": "user", "content": "b"},
        ]}),
    )
    .await;
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": [
            {"role": "user", "content": "x"},
            {"type": "item_reference", "id": b["output"][0]["id"]},
            {"role": "user", "content": "y"},
            {"type": "item_reference", "id": third_answer},
            {"role": "user", "content": "z"},
            {"type": "item_reference", "id": b["output"][0]["id"]},
        ]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        conversation(&up.last()),
        pairs(&[
            ("user", "x"),
            ("assistant", "reply-1"),
            ("user", "y"),
            ("assistant", "reply-3"),
            ("user", "z"),
            ("assistant", "reply-1")
        ])
    );
    // An input item the gateway gave an id (its easy-form question), as `input_items` lists
    // it, is found by that id too.
    let (s, items) = get(
        KEY,
        &other.base(&format!(
            "/v1/responses/{last_answer}/input_items?order=asc"
        )),
    )
    .await;
    assert_eq!(s, 200, "{items}");
    let first_question = &items["data"][0];
    assert_eq!(first_question["content"], "q1", "{items}");
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": [
            {"type": "item_reference", "id": first_question["id"]},
            {"type": "item_reference", "id": third_answer},
            {"role": "user", "content": "w"},
        ]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        conversation(&up.last()),
        pairs(&[("user", "q1"), ("assistant", "reply-3"), ("user", "w")])
    );
}

#[tokio::test]
async fn whole_histories_of_references_continue_turn_after_turn() {
    let (up, gw) = start("").await;
    whole_histories_of_references(&gw, &gw, &up).await;
}

#[tokio::test]
async fn get_input_items_and_delete_answer_from_the_store() {
    let (up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let (_, first) = post_as(KEY, &url, &json!({"model": "on-chat", "input": "one"})).await;
    let (_, second) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "previous_response_id": first["id"], "input": "two"}),
    )
    .await;
    let id = second["id"].as_str().unwrap().to_owned();
    let (s, got) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got, second, "the response as it was served");

    // Input items: turn one's input and output, then turn two's input; newest first.
    let items_url = gw.base(&format!("/v1/responses/{id}/input_items"));
    let (s, list) = get(KEY, &items_url).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 3, "{list}");
    assert_eq!(data[0]["content"][0]["text"], "two", "{list}");
    assert_eq!(data[1]["id"], first["output"][0]["id"], "{list}");
    assert_eq!(data[2]["content"][0]["text"], "one", "{list}");
    assert_eq!(list["first_id"], data[0]["id"]);
    assert_eq!(list["last_id"], data[2]["id"]);
    assert_eq!(list["has_more"], false);
    assert!(
        data.iter()
            .all(|i| i["id"].is_string() && i["type"].is_string()),
        "{list}"
    );

    let (_, asc) = get(KEY, &format!("{items_url}?order=asc&limit=2")).await;
    assert_eq!(asc["data"].as_array().unwrap().len(), 2, "{asc}");
    assert_eq!(asc["data"][0]["content"][0]["text"], "one");
    assert_eq!(asc["has_more"], true);
    let (_, rest) = get(
        KEY,
        &format!(
            "{items_url}?order=asc&after={}",
            asc["last_id"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1, "{rest}");
    assert_eq!(rest["data"][0]["content"][0]["text"], "two");
    assert_eq!(rest["has_more"], false);
    for bad in ["limit=0", "limit=101", "limit=x", "order=up"] {
        let (s, v) = get(KEY, &format!("{items_url}?{bad}")).await;
        let param = bad.split('=').next().unwrap();
        assert_openai_error(s, &v, 400, Some(param));
    }

    // Not found, in OpenAI's shape, for GET, input_items and DELETE alike.
    for path in [
        "/v1/responses/resp_nope",
        "/v1/responses/resp_nope/input_items",
    ] {
        let (s, v) = get(KEY, &gw.base(path)).await;
        assert_openai_error(s, &v, 404, None);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("resp_nope"),
            "{v}"
        );
    }
    let (s, v) = call(
        reqwest::Method::DELETE,
        KEY,
        &gw.base("/v1/responses/resp_nope"),
    )
    .await;
    assert_openai_error(s, &v, 404, None);
    let (s, v) = call(reqwest::Method::POST, KEY, &items_url).await;
    assert_openai_error(s, &v, 405, None);

    // Delete: then it is gone everywhere, and a continuation is refused before any upstream.
    let (s, v) = call(
        reqwest::Method::DELETE,
        KEY,
        &gw.base(&format!("/v1/responses/{id}")),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v,
        json!({"id": id, "object": "response.deleted", "deleted": true})
    );
    let (s, _) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 404);
    let before = up.seen().len();
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "previous_response_id": id, "input": "three"}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("previous_response_id"));
    assert_eq!(v["error"]["code"], "previous_response_not_found");
    assert!(v["error"]["message"].as_str().unwrap().contains(&id), "{v}");
    assert_eq!(up.seen().len(), before, "refused before the upstream");
    // The first response is still there: deleting one does not delete its parent.
    let (s, _) = get(
        KEY,
        &gw.base(&format!("/v1/responses/{}", first["id"].as_str().unwrap())),
    )
    .await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn bad_previous_response_ids_are_refused_naming_the_field() {
    let (up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    for (prev, status) in [
        (json!("resp_unknown"), 404),
        (json!(7), 400),
        (json!({"id": "x"}), 400),
    ] {
        let (s, v) = post_as(
            KEY,
            &url,
            &json!({"model": "on-chat", "previous_response_id": prev, "input": "hi"}),
        )
        .await;
        assert_openai_error(s, &v, status, Some("previous_response_id"));
    }
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "store": "yes", "input": "hi"}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("store"));
    assert!(up.seen().is_empty(), "none reached the upstream");
}

#[tokio::test]
async fn another_keys_response_is_not_found() {
    let (_up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let (_, mine) = post_as(KEY, &url, &json!({"model": "on-chat", "input": "secret"})).await;
    let id = mine["id"].as_str().unwrap().to_owned();
    let path = gw.base(&format!("/v1/responses/{id}"));
    let (s, v) = get(OTHER_KEY, &path).await;
    assert_openai_error(s, &v, 404, None);
    let (s, v) = get(OTHER_KEY, &format!("{path}/input_items")).await;
    assert_openai_error(s, &v, 404, None);
    let (s, v) = call(reqwest::Method::DELETE, OTHER_KEY, &path).await;
    assert_openai_error(s, &v, 404, None);
    let (s, v) = post_as(
        OTHER_KEY,
        &url,
        &json!({"model": "on-chat", "previous_response_id": id, "input": "tell me"}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("previous_response_id"));
    assert_eq!(v["error"]["code"], "previous_response_not_found");
    // The owner still has it.
    let (s, _) = get(KEY, &path).await;
    assert_eq!(s, 200);
    // No key at all: 401 before any lookup.
    let resp = client().get(&path).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test]
async fn store_false_is_not_stored() {
    let (_up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "input": "hi", "store": false}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["store"], false);
    let id = v["id"].as_str().unwrap();
    let (s, _) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 404);
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "previous_response_id": id, "input": "again"}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("previous_response_id"));
}

/// Polls until `id` is gone (it must be within a few TTLs); the TTL is the config's smallest.
async fn wait_expired(gw: &TestGateway, id: &str) {
    let url = gw.base(&format!("/v1/responses/{id}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, _) = get(KEY, &url).await;
        if s == 404 {
            return;
        }
        assert_eq!(s, 200);
        assert!(Instant::now() < deadline, "{id} never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn stored_responses_expire_after_the_ttl() {
    let (_up, gw) = start("responses_ttl_s = 1").await;
    let url = gw.base("/v1/responses");
    let (_, v) = post_as(KEY, &url, &json!({"model": "on-chat", "input": "hi"})).await;
    let id = v["id"].as_str().unwrap().to_owned();
    let (s, _) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 200, "kept until the TTL passes");
    wait_expired(&gw, &id).await;
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "previous_response_id": id, "input": "again"}),
    )
    .await;
    assert_openai_error(s, &v, 404, Some("previous_response_id"));
}

#[tokio::test]
async fn the_memory_cap_evicts_the_oldest_responses() {
    let (_up, gw) = start("responses_max_mb = 1").await;
    let url = gw.base("/v1/responses");
    let mut ids = Vec::new();
    // Six answers of 300 kB each: three fit in 1 MB (each stored with its input), six do not.
    for i in 0..6 {
        let (s, v) = post_as(
            KEY,
            &url,
            &json!({"model": "on-chat", "input": format!("big:300000 #{i}")}),
        )
        .await;
        assert_eq!(s, 200);
        assert_eq!(output_text(&v).len(), 300_000);
        ids.push(v["id"].as_str().unwrap().to_owned());
    }
    let (s, _) = get(KEY, &gw.base(&format!("/v1/responses/{}", ids[0]))).await;
    assert_eq!(s, 404, "the oldest was evicted");
    let (s, _) = get(KEY, &gw.base(&format!("/v1/responses/{}", ids[5]))).await;
    assert_eq!(s, 200, "the newest is kept");
}

#[tokio::test]
async fn passthrough_responses_are_read_and_deleted_at_their_upstream() {
    let (up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let (s, v) = post_as(KEY, &url, &json!({"model": "on-responses", "input": "hi"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["id"], "resp_up_1");
    let path = gw.base("/v1/responses/resp_up_1");

    let (s, got) = get(KEY, &path).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["from"], "upstream");
    let seen = up.last();
    assert_eq!(
        (seen.method.as_str(), seen.uri.as_str()),
        ("GET", "/v1/responses/resp_up_1")
    );
    assert_eq!(
        seen.headers["authorization"], "Bearer up-secret",
        "the upstream's credential"
    );

    let (s, list) = get(KEY, &format!("{path}/input_items?limit=2&order=asc")).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["from"], "upstream");
    assert_eq!(
        up.last().uri,
        "/v1/responses/resp_up_1/input_items?limit=2&order=asc"
    );

    // A continuation goes to the same upstream, which keeps the conversation itself.
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-responses", "previous_response_id": "resp_up_1", "input": "more"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let sent = up.last().json();
    assert_eq!(sent["previous_response_id"], "resp_up_1", "{sent}");
    assert_eq!(sent["input"], "more", "not expanded: {sent}");
    // A model whose upstream cannot know it refuses, naming the field.
    let before = up.seen().len();
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "previous_response_id": "resp_up_1", "input": "more"}),
    )
    .await;
    assert_openai_error(s, &v, 400, Some("previous_response_id"));
    // Another key reaches nothing.
    let (s, v) = get(OTHER_KEY, &path).await;
    assert_openai_error(s, &v, 404, None);
    assert_eq!(up.seen().len(), before);

    let (s, v) = call(reqwest::Method::DELETE, KEY, &path).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["deleted"], true);
    let seen = up.last();
    assert_eq!(
        (seen.method.as_str(), seen.uri.as_str()),
        ("DELETE", "/v1/responses/resp_up_1")
    );
    let count = up.seen().len();
    let (s, _) = get(KEY, &path).await;
    assert_eq!(s, 404, "forgotten once deleted");
    assert_eq!(up.seen().len(), count);

    // store: false is not remembered either.
    let (_, _) = post_as(
        KEY,
        &url,
        &json!({"model": "on-responses", "input": "hi", "store": false}),
    )
    .await;
    let (s, _) = get(KEY, &path).await;
    assert_eq!(s, 404);
    // A streamed passthrough is remembered at its terminal event.
    let text = post_text(
        &url,
        &json!({"model": "on-responses", "input": "hi", "stream": true}),
    )
    .await;
    assert!(text.contains("response.completed"), "{text}");
    let (s, got) = get(KEY, &path).await;
    assert_eq!(s, 200, "{got}");
}

/// The `response` of a stream's `response.completed` event.
fn completed(text: &str) -> Value {
    terminal_response(text, "response.completed")
}

/// The `response` of a stream's `response.failed` event.
fn failed(text: &str) -> Value {
    terminal_response(text, "response.failed")
}

/// The `response` of a stream's event of type `kind`.
fn terminal_response(text: &str, kind: &str) -> Value {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {text}"))["response"]
        .clone()
}

#[tokio::test]
async fn a_streamed_response_is_stored_from_its_events() {
    let (up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let text = post_text(
        &url,
        &json!({"model": "on-chat", "input": "Stream me.", "stream": true}),
    )
    .await;
    let done = completed(&text);
    assert_eq!(output_text(&done), "reply-1");
    let id = done["id"].as_str().unwrap().to_owned();
    // Sent at once on `response.completed`, as agents do: the store already has it.
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-messages", "previous_response_id": id, "input": "And now?", "stream": false}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        conversation(&up.last()),
        pairs(&[
            ("user", "Stream me."),
            ("assistant", "reply-1"),
            ("user", "And now?")
        ])
    );
    let (s, got) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 200);
    assert_eq!(got, done, "stored as the stream's final object");
    // A streamed continuation is stored too, and echoes its parent.
    let text = post_text(
        &url,
        &json!({"model": "on-chat", "previous_response_id": v["id"], "input": "Last.", "stream": true}),
    )
    .await;
    let last = completed(&text);
    assert_eq!(last["previous_response_id"], v["id"]);
    assert_eq!(output_text(&last), "reply-3");
    let (_, items) = get(
        KEY,
        &gw.base(&format!(
            "/v1/responses/{}/input_items?order=asc",
            last["id"].as_str().unwrap()
        )),
    )
    .await;
    assert_eq!(items["data"].as_array().unwrap().len(), 5, "{items}");
    // The first stream's output item is kept under its id too.
    let item = done["output"][0]["id"].as_str().unwrap();
    let text = post_text(
        &url,
        &json!({"model": "on-chat", "stream": true, "input": [
            {"role": "user", "content": "Stream me."},
            {"type": "item_reference", "id": item},
            {"role": "user", "content": "Again."}]}),
    )
    .await;
    assert_eq!(output_text(&completed(&text)), "reply-2");
    assert_eq!(
        conversation(&up.last()),
        pairs(&[
            ("user", "Stream me."),
            ("assistant", "reply-1"),
            ("user", "Again.")
        ])
    );
}

#[tokio::test]
async fn a_stream_that_breaks_is_stored_as_failed() {
    let (_up, gw) = start("").await;
    let url = gw.base("/v1/responses");
    let text = post_text(
        &url,
        &json!({"model": "on-chat", "input": "break me", "stream": true}),
    )
    .await;
    let broken = failed(&text);
    assert_eq!(broken["status"], "failed", "{text}");
    let id = broken["id"].as_str().unwrap();
    let (s, got) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got, broken, "stored as its terminal event's object");
    // Not kept when the client said so.
    let text = post_text(
        &url,
        &json!({"model": "on-chat", "input": "break me", "stream": true, "store": false}),
    )
    .await;
    let id = failed(&text)["id"].as_str().unwrap().to_owned();
    let (s, _) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 404);
}

// === the same in a real Redis ===

/// A `redis-server` of the test's own on a free port, killed when dropped.
struct RedisServer {
    port: u16,
    child: Child,
}

impl RedisServer {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): install it (apt-get install -y redis-server)"
                )
            });
        let server = Self { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !server.pings() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn pings(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0_u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The text of a bulk-string reply to the inline command `command`.
    fn bulk(&self, command: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.write_all(format!("{command}\r\n").as_bytes()).unwrap();
        let mut reply = Vec::new();
        let mut buf = [0_u8; 4096];
        loop {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "redis closed before its reply to {command}");
            reply.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&reply);
            let (head, body) = text.split_once("\r\n").unwrap_or((&text, ""));
            let len: usize = head.trim_start_matches('$').parse().unwrap();
            if body.len() >= len + 2 {
                return body[..len].to_owned();
            }
        }
    }

    /// Runs the command of `args` (sent as Redis's arrays of bulk strings, so any bytes go);
    /// the first line of its reply.
    fn command(&self, args: &[&str]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let mut sent = format!("*{}\r\n", args.len());
        for a in args {
            sent.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(sent.as_bytes()).unwrap();
        let mut reply = Vec::new();
        let mut buf = [0_u8; 256];
        while !reply.ends_with(b"\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "redis closed before its reply to {args:?}");
            reply.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&reply).trim_end().to_owned()
    }

    /// How many times Redis has run `command` (lowercase) since it started.
    fn calls(&self, command: &str) -> u64 {
        let stats = self.bulk("INFO commandstats");
        let line = format!("cmdstat_{command}:calls=");
        (stats.lines())
            .find_map(|l| l.strip_prefix(&line))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    }

    /// How many keys match `pattern`.
    fn count_keys(&self, pattern: &str) -> u64 {
        let script = format!("EVAL \"return tostring(#redis.call('KEYS', ARGV[1]))\" 0 {pattern}");
        self.bulk(&script).parse().unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_redis(up: &FakeUpstream, redis: &RedisServer, ttl: &str) -> TestGateway {
    let store = format!("redis_url_env = \"MODELGATE_REDIS_URL\"\n{ttl}");
    TestGateway::start_with_env(
        &stateful_config(&up.url(), &store),
        &[
            ("UPSTREAM_KEY", "up-secret"),
            ("MODELGATE_REDIS_URL", &redis.url()),
        ],
    )
    .await
}

/// A Redis of the test's own, the upstream, and a gateway keeping its responses in that Redis
/// (`store` adds to its `[store]`).
async fn gateway_on_redis(store: &str) -> (RedisServer, FakeUpstream, TestGateway) {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let up = FakeUpstream::start(upstream).await;
    let gw = start_redis(&up, &redis, store).await;
    (redis, up, gw)
}

/// A Redis of the test's own, the upstream, and two gateways sharing that Redis.
async fn two_gateways_on_redis() -> (RedisServer, FakeUpstream, TestGateway, TestGateway) {
    let (redis, up, one) = gateway_on_redis("").await;
    let two = start_redis(&up, &redis, "").await;
    (redis, up, one, two)
}

#[tokio::test]
async fn in_redis_two_gateways_share_stored_responses() {
    let (_redis, up, one, two) = two_gateways_on_redis().await;
    // Made on one instance, continued on the other, with an item reference resolved there.
    let (s, first) = post_as(
        KEY,
        &one.base("/v1/responses"),
        &json!({"model": "on-chat", "input": "hello"}),
    )
    .await;
    assert_eq!(s, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    let (s, second) = post_as(
        KEY,
        &two.base("/v1/responses"),
        &json!({"model": "on-messages", "previous_response_id": id, "input": "again"}),
    )
    .await;
    assert_eq!(s, 200, "{second}");
    assert_eq!(
        conversation(&up.last()),
        pairs(&[
            ("user", "hello"),
            ("assistant", "reply-1"),
            ("user", "again")
        ])
    );
    let (s, v) = post_as(
        KEY,
        &two.base("/v1/responses"),
        &json!({"model": "on-chat", "input": [{"role": "user", "content": "hello"}, {"type": "item_reference", "id": first["output"][0]["id"]}, {"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(output_text(&v), "reply-2");
    let (s, got) = get(KEY, &two.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 200);
    assert_eq!(got, first);
    let (s, _) = get(OTHER_KEY, &two.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 404, "another key's");
    // A streamed one, and a passthrough one, are in Redis too.
    let text = post_text(
        &one.base("/v1/responses"),
        &json!({"model": "on-chat", "input": "s", "stream": true}),
    )
    .await;
    let streamed = completed(&text)["id"].as_str().unwrap().to_owned();
    let (s, _) = get(KEY, &two.base(&format!("/v1/responses/{streamed}"))).await;
    assert_eq!(s, 200);
    let (_, _) = post_as(
        KEY,
        &one.base("/v1/responses"),
        &json!({"model": "on-responses", "input": "p"}),
    )
    .await;
    let (s, got) = get(KEY, &two.base("/v1/responses/resp_up_1")).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["from"], "upstream");
    // Deleted on one, gone on both.
    let (s, _) = call(
        reqwest::Method::DELETE,
        KEY,
        &two.base(&format!("/v1/responses/{id}")),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = get(KEY, &one.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn in_redis_whole_histories_of_references_continue_on_either_instance() {
    let (_redis, up, one, two) = two_gateways_on_redis().await;
    whole_histories_of_references(&one, &two, &up).await;
}

/// An AI SDK turn costs the store one write (its record and the record's index, together) and
/// one read however long its conversation: the gateway's item ids name the answers holding
/// them, so no item goes into the item index, and the last answer a turn refers to holds every
/// earlier item. (Indexing each item, every turn wrote an entry for each earlier answer and read
/// the item index before the record.)
#[tokio::test]
async fn in_redis_a_turn_of_references_is_one_write_and_one_read() {
    let (redis, up, gw) = gateway_on_redis("").await;
    let url = gw.base("/v1/responses");
    let mut input = Vec::new();
    let mut want = Vec::new();
    for turn in 1..=10 {
        let question = format!("q{turn}");
        input.push(json!({"role": "user", "content": question}));
        want.push(("user".to_owned(), question));
        let counts = || {
            let (sets, gets) = (redis.calls("set"), redis.calls("get"));
            (redis.calls("exec"), sets, gets + redis.calls("mget"))
        };
        let before = counts();
        let (s, v) = post_as(KEY, &url, &json!({"model": "on-chat", "input": input})).await;
        let after = counts();
        assert_eq!(s, 200, "turn {turn}: {v}");
        assert_eq!(conversation(&up.last()), want, "turn {turn}");
        let reads = if turn == 1 { 0 } else { 1 };
        assert_eq!(
            (after.0 - before.0, after.1 - before.1, after.2 - before.2),
            (1, 2, reads),
            "turn {turn}: writes (transactions, keys) and reads"
        );
        input.push(json!({"type": "item_reference", "id": v["output"][0]["id"]}));
        want.push(("assistant".to_owned(), format!("reply-{turn}")));
    }
    assert_eq!(redis.count_keys("modelgate:{test}:item:*"), 0);
    assert_eq!(redis.count_keys("modelgate:{test}:resp:*"), 10);
    assert_eq!(redis.count_keys("modelgate:{test}:resp-index:*"), 10);
}

/// A record in Redis is continued from through the index kept beside it (where each item lies,
/// so a turn does not read the whole conversation the record holds); it is read whole when its
/// index is missing, as for a record an earlier version wrote, or is not one. Deleting the
/// answer deletes its index too.
#[tokio::test]
async fn in_redis_a_record_is_continued_from_through_its_index() {
    let (redis, up, gw) = gateway_on_redis("").await;
    let url = gw.base("/v1/responses");
    let mut input = Vec::new();
    let mut latest = String::new();
    for turn in 1..=3 {
        input.push(json!({"role": "user", "content": format!("q{turn}")}));
        let (s, v) = post_as(KEY, &url, &json!({"model": "on-chat", "input": input})).await;
        assert_eq!(s, 200, "turn {turn}: {v}");
        input.push(json!({"type": "item_reference", "id": v["output"][0]["id"]}));
        latest = v["id"].as_str().unwrap().to_owned();
    }
    input.push(json!({"role": "user", "content": "q4"}));
    let whole = pairs(&[
        ("user", "q1"),
        ("assistant", "reply-1"),
        ("user", "q2"),
        ("assistant", "reply-2"),
        ("user", "q3"),
        ("assistant", "reply-3"),
        ("user", "q4"),
    ]);
    let key = format!("modelgate:{{test}}:resp-index:{latest}");
    let kept = redis.bulk(&format!("GET {key}"));
    let turn = || async {
        let (s, v) = post_as(KEY, &url, &json!({"model": "on-chat", "input": input})).await;
        assert_eq!(s, 200, "{v}");
        conversation(&up.last())
    };
    assert_eq!(turn().await, whole);

    // The index's place for the first answer's item (the record's second input item) pointed
    // at the first question's: the next turn sends that question in the answer's place, so
    // the items were found where the index says, not by reading the record.
    let mut fields: Vec<&str> = kept.split(' ').collect();
    assert_eq!(fields[0], "i1", "{kept}");
    let (first, second) = (4, 8);
    fields[second] = fields[first];
    fields[second + 1] = fields[first + 1];
    let pointed = fields.join(" ");
    assert_eq!(redis.command(&["SET", &key, &pointed, "KEEPTTL"]), "+OK");
    // (Three user messages in a row reach a chat upstream as one.)
    let misled = pairs(&[
        ("user", "q1q1q2"),
        ("assistant", "reply-2"),
        ("user", "q3"),
        ("assistant", "reply-3"),
        ("user", "q4"),
    ]);
    assert_eq!(turn().await, misled, "{pointed}");

    // Not an index for this record, or none at all: the record is read whole.
    for damaged in ["i1 12 0 3", "i9 nothing", ""] {
        assert_eq!(redis.command(&["SET", &key, damaged, "KEEPTTL"]), "+OK");
        assert_eq!(turn().await, whole, "{damaged:?}");
    }
    assert_eq!(redis.command(&["DEL", &key]), ":1");
    assert_eq!(turn().await, whole, "no index");

    assert_eq!(redis.command(&["SET", &key, &kept, "KEEPTTL"]), "+OK");
    let (s, _) = call(
        reqwest::Method::DELETE,
        KEY,
        &gw.base(&format!("/v1/responses/{latest}")),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        redis.command(&["EXISTS", &key]),
        ":0",
        "the index deleted with its answer"
    );
}

#[tokio::test]
async fn in_redis_stored_responses_expire_after_the_ttl() {
    let (_redis, _up, gw) = gateway_on_redis("responses_ttl_s = 1").await;
    let (_, v) = post_as(
        KEY,
        &gw.base("/v1/responses"),
        &json!({"model": "on-chat", "input": "hi"}),
    )
    .await;
    let id = v["id"].as_str().unwrap().to_owned();
    let (s, _) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_eq!(s, 200);
    wait_expired(&gw, &id).await;
}

#[tokio::test]
async fn store_settings_are_checked() {
    for (line, path) in [
        ("responses_ttl_s = 0", "store.responses_ttl_s"),
        ("responses_max_mb = -1", "store.responses_max_mb"),
        ("responses_ttl_s = \"x\"", "store"),
    ] {
        let text = stateful_config("http://127.0.0.1:9", line);
        let err = modelgate::config::Config::parse(&text, std::path::Path::new("."), &|n| {
            (n == "UPSTREAM_KEY").then(|| "k".to_owned())
        })
        .expect_err(line)
        .to_string();
        assert!(err.contains(path), "{line}: {err}");
    }
}

#[tokio::test]
async fn in_redis_an_unreachable_store_is_a_503_and_serving_goes_on() {
    let (redis, up, gw) = gateway_on_redis("").await;
    let url = gw.base("/v1/responses");
    let (_, v) = post_as(KEY, &url, &json!({"model": "on-chat", "input": "hi"})).await;
    let id = v["id"].as_str().unwrap().to_owned();
    tokio::task::spawn_blocking(move || drop(redis))
        .await
        .unwrap();
    let (s, v) = get(KEY, &gw.base(&format!("/v1/responses/{id}"))).await;
    assert_openai_error(s, &v, 503, None);
    assert_eq!(v["error"]["code"], "store_unavailable");
    let before = up.seen().len();
    let (s, v) = post_as(
        KEY,
        &url,
        &json!({"model": "on-chat", "previous_response_id": id, "input": "again"}),
    )
    .await;
    assert_openai_error(s, &v, 503, None);
    assert_eq!(up.seen().len(), before, "not sent without its history");
    // A new conversation is still served; only its storing is lost (and logged).
    let (s, v) = post_as(KEY, &url, &json!({"model": "on-chat", "input": "fresh"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(output_text(&v), "reply-1");
}
