//! Translation glue tests: the tool-call sequencer and Anthropic keep-alive pings.

use super::*;

fn start(index: usize) -> Event {
    Event::ToolStart {
        index,
        id: format!("call_{index}"),
        name: "f".into(),
    }
}

fn args(index: usize, fragment: &str) -> Event {
    Event::ToolArgs {
        index,
        fragment: fragment.into(),
    }
}

fn run(events: Vec<Event>) -> Vec<Vec<Event>> {
    let mut seq = ToolSequencer::default();
    events
        .into_iter()
        .map(|e| {
            let mut out = Vec::new();
            seq.push(e, &mut out);
            out
        })
        .collect()
}

#[test]
fn sequential_calls_stream_as_they_arrive() {
    let outs = run(vec![
        start(0),
        args(0, "{\"a\":"),
        args(0, "1}"),
        start(1),
        args(1, "{}"),
        Event::Finish(ir::Finish::ToolUse),
    ]);
    // Every event goes out at once, unchanged.
    assert!(outs.iter().all(|o| o.len() == 1), "{outs:?}");
}

#[test]
fn interleaved_calls_come_out_one_after_another_and_whole() {
    let outs = run(vec![
        start(0),
        start(1),
        args(0, "{\"city\":"),
        args(1, "{\"city\":"),
        args(0, "\"Paris\"}"),
        args(1, "\"Tokyo\"}"),
        Event::Finish(ir::Finish::ToolUse),
    ]);
    let flat: Vec<Event> = outs.iter().flatten().cloned().collect();
    assert_eq!(
        flat,
        vec![
            start(0),
            args(0, "{\"city\":"),
            args(0, "\"Paris\"}"),
            start(1),
            args(1, "{\"city\":\"Tokyo\"}"),
            Event::Finish(ir::Finish::ToolUse),
        ]
    );
    // Call 0's fragments were not held back.
    assert_eq!(outs[2], vec![args(0, "{\"city\":")]);
}

#[test]
fn errors_are_not_delayed_by_held_calls() {
    let err = Event::Error(ir::ErrorInfo {
        status: 502,
        message: "x".into(),
        code: None,
    });
    let outs = run(vec![start(0), start(1), err.clone()]);
    assert_eq!(outs[2], vec![err]);
}

/// A body that never yields: an upstream gone silent.
struct Silent;

impl HttpBody for Silent {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Pending
    }
}

fn translation(client: Protocol) -> Translation {
    let body = match client {
        Protocol::Messages => {
            r#"{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
        }
        _ => r#"{"model":"m","stream":true,"input":"hi"}"#,
    };
    to_chat(client, body)
}

/// The translation of `body`, a `client` request for model `m`, toward a chat upstream.
fn to_chat(client: Protocol, body: &str) -> Translation {
    let config = crate::config::Config::parse(
        "[listen]\nbase = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"c\"\nkind = \"chat\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[[models]]\nname = \"m\"\nupstream = \"c\"\n",
        std::path::Path::new("."),
        &|_| None,
    )
    .unwrap();
    request(
        client,
        Protocol::Chat,
        body.as_bytes(),
        config.models[0].primary(),
        "m",
    )
    .unwrap()
    .1
}

#[tokio::test(start_paused = true)]
async fn anthropic_clients_get_a_ping_while_the_upstream_is_silent() {
    use http_body_util::BodyExt;
    let t = translation(Protocol::Messages);
    let mut body = std::pin::pin!(TranslateBody::new(Silent, &t, DEFAULT_MAX_EVENT));
    let started = tokio::time::Instant::now();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.data_ref().unwrap().as_ref(), messages::PING);
    assert!(started.elapsed() >= PING_INTERVAL);
    // And again after another interval of silence.
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.data_ref().unwrap().as_ref(), messages::PING);
    assert!(started.elapsed() >= PING_INTERVAL * 2);
}

#[tokio::test(start_paused = true)]
async fn other_clients_get_no_ping() {
    use http_body_util::BodyExt;
    let t = translation(Protocol::Responses);
    let mut body = std::pin::pin!(TranslateBody::new(Silent, &t, DEFAULT_MAX_EVENT));
    let waited = tokio::time::timeout(PING_INTERVAL * 3, body.frame()).await;
    assert!(
        waited.is_err(),
        "a Responses stream has no keep-alive event"
    );
}

/// A kept Responses stream's encoder leaves, when it writes the terminal event, exactly the
/// response object that event carries, with its id and its output items' ids: what the store
/// would otherwise read out of the stream.
#[test]
fn a_kept_streams_final_response_is_its_terminal_events() {
    #[derive(serde::Deserialize)]
    struct Terminal<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        #[serde(borrow)]
        response: &'a serde_json::value::RawValue,
    }
    let chunk = |delta: &str, finish: &str| {
        format!("data: {{\"id\":\"c1\",\"created\":1,\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n")
    };
    let text = chunk(r#"{"role":"assistant","content":"Hi"}"#, "null");
    let call = chunk(
        r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}"#,
        "null",
    );
    let reasoning = chunk(r#"{"reasoning_content":"hmm"}"#, "null");
    let stop = chunk("{}", r#""stop""#);
    let length = chunk("{}", r#""length""#);
    let calls = chunk("{}", r#""tool_calls""#);
    let error = "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
    let done = "data: [DONE]\n\n";
    for (stream, terminal) in [
        (vec![&*text, &*stop, done], "response.completed"),
        (
            vec![&*reasoning, &*text, &*stop, done],
            "response.completed",
        ),
        (vec![&*text, &*call, &*calls, done], "response.completed"),
        (vec![&*text, &*length, done], "response.incomplete"),
        (vec![&*text, error], "response.failed"),
        // Broken off: the translator fails it when the body ends.
        (vec![&*text], "response.failed"),
    ] {
        let mut st = StreamTranslator::new(&translation(Protocol::Responses));
        let slot = st.final_slot().expect("kept unless `store: false`");
        let mut out = Vec::new();
        for frame in &stream {
            assert!(slot.take().is_none(), "nothing before the terminal event");
            st.feed(frame.as_bytes(), &mut out);
        }
        st.finish(&mut out);
        let out = String::from_utf8(out).unwrap();
        let event = out
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str::<Terminal<'_>>(d).ok())
            .find(|t| t.kind == terminal)
            .unwrap_or_else(|| panic!("no {terminal} in {out}"));
        let last = slot
            .take()
            .unwrap_or_else(|| panic!("nothing left for {out}"));
        assert_eq!(&*last.text, event.response.get(), "{out}");
        let response: serde_json::Value = serde_json::from_str(event.response.get()).unwrap();
        assert_eq!(last.id, response["id"].as_str().unwrap());
        let output: Vec<&str> = (response["output"].as_array().unwrap().iter())
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert_eq!(last.output, output, "{out}");
        assert!(!last.output.is_empty() || terminal == "response.failed");
    }
    // `store: false`: nothing is kept, so nothing is left.
    let t = to_chat(
        Protocol::Responses,
        r#"{"model":"m","stream":true,"input":"hi","store":false}"#,
    );
    assert!(StreamTranslator::new(&t).final_slot().is_none());
    assert!(StreamTranslator::new(&translation(Protocol::Messages))
        .final_slot()
        .is_none());
}

/// A kept Responses JSON reply comes with what the store keeps of it: its own bytes, its id
/// and its output items' ids.
#[test]
fn a_kept_json_reply_says_what_the_store_keeps() {
    let t = translation(Protocol::Responses);
    for reply in [
        r#"{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"Hm","reasoning_content":"think","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
        r#"{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"cut"},"finish_reason":"length"}]}"#,
    ] {
        let got = t.json_reply_counted(StatusCode::OK, reply.as_bytes());
        assert_eq!(got.status, StatusCode::OK);
        let last = got
            .last
            .unwrap_or_else(|| panic!("nothing kept of {reply}"));
        assert_eq!(last.text.as_bytes(), got.body);
        let written: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(last.id, written["id"].as_str().unwrap());
        let output: Vec<&str> = (written["output"].as_array().unwrap().iter())
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert!(!output.is_empty());
        assert_eq!(last.output, output, "{reply}");
    }
    // Errors are not kept, and neither is anything for other clients.
    let error = t.json_reply_counted(StatusCode::OK, b"not json");
    assert_eq!(error.status, StatusCode::BAD_GATEWAY);
    assert!(error.last.is_none());
    let upstream_error = t.json_reply_counted(
        StatusCode::TOO_MANY_REQUESTS,
        br#"{"error":{"message":"slow down"}}"#,
    );
    assert!(upstream_error.last.is_none());
    let other = translation(Protocol::Messages).json_reply_counted(
        StatusCode::OK,
        br#"{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}"#,
    );
    assert_eq!(other.status, StatusCode::OK);
    assert!(other.last.is_none());
}

#[test]
fn a_path_walks_keys_and_array_indexes_as_a_pointer_does() {
    let v = serde_json::json!({"choices": [{"delta": {"a/b": 1}}], "usage": {"n": 2}});
    for (path, pointer) in [
        (&["choices", "0", "delta"][..], "/choices/0/delta"),
        (&["usage", "n"][..], "/usage/n"),
        (&["choices", "1"][..], "/choices/1"),
        (&["choices", "x"][..], "/choices/x"),
        (&["usage", "n", "deeper"][..], "/usage/n/deeper"),
    ] {
        assert_eq!(common::at(&v, path), v.pointer(pointer), "{pointer}");
    }
    assert_eq!(
        common::at(&v, &["choices", "0", "delta", "a/b"]),
        Some(&serde_json::json!(1))
    );
}

/// A client's pretty-printed request is echoed in the streamed response objects on one line
/// each, so every event stays one `data:` line, and as the client's values.
#[test]
fn a_pretty_printed_request_is_echoed_without_breaking_the_events() {
    let body = "{\n  \"model\": \"m\",\n  \"stream\": true,\n  \"input\": \"hi\",\n  \"instructions\": \"Line one.\\nLine \\\"two\\\".\",\n  \"temperature\": 0.5,\n  \"tool_choice\": {\n    \"type\": \"function\",\n    \"name\": \"get weather\"\n  },\n  \"tools\": [\n    {\n      \"type\": \"function\",\n      \"name\": \"get weather\",\n      \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}\n    }\n  ]\n}";
    let client: serde_json::Value = serde_json::from_str(body).unwrap();
    let t = to_chat(Protocol::Responses, body);
    let mut st = StreamTranslator::new(&t);
    let mut out = Vec::new();
    st.feed(
        b"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"id\":\"c1\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        &mut out,
    );
    st.finish(&mut out);
    let text = String::from_utf8(out).unwrap();
    let mut responses = Vec::new();
    for event in text.split_terminator("\n\n") {
        let lines: Vec<&str> = event.lines().collect();
        assert_eq!(lines.len(), 2, "one name line and one data line: {event}");
        let data: serde_json::Value =
            serde_json::from_str(lines[1].strip_prefix("data: ").unwrap()).unwrap();
        if let Some(r) = data.get("response") {
            responses.push(r.clone());
        }
    }
    // Created, in progress, completed.
    assert_eq!(responses.len(), 3, "{text}");
    for r in &responses {
        for key in ["instructions", "temperature", "tool_choice", "tools"] {
            assert_eq!(r[key], client[key], "{key}");
        }
        assert_eq!(r["parallel_tool_calls"], true);
        assert_eq!(r["store"], true);
        assert_eq!(r["max_output_tokens"], serde_json::Value::Null);
    }
    assert_eq!(responses[2]["status"], "completed");
    assert_eq!(responses[2]["output"][0]["content"][0]["text"], "Hi");
}
