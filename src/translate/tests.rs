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
