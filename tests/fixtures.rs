//! Golden fixtures: every case folder under `tests/fixtures/<client>_to_<upstream>/` runs end to end
//! (client → gateway → fake upstream → gateway → client), and every upstream stream is replayed
//! through `translate::StreamTranslator` whole, byte by byte and split at random points.
//!
//! `UPDATE_GOLDEN=1 cargo test --test fixtures` rewrites the expected files from what the code does
//! now; every rewritten file must then be reviewed against `../shared/reference/protocols.md`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a broken fixture or a failed setup step should fail the test loudly"
)]

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use modelgate::config::{Config, Model, Protocol};
use modelgate::sse::{SseDecoder, SseEvent};
use modelgate::translate::{self, StreamTranslator, Translation};
use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Prefixes `ir::mint_id` is called with; a minted id is one of these plus 24 lowercase hex
/// digits, or, for an item of a kept Responses answer, 32: the answer's 24 and the item's place.
const MINTED_PREFIXES: [&str; 7] = [
    "chatcmpl-",
    "msg_",
    "resp_",
    "toolu_",
    "call_",
    "fc_",
    "rs_",
];

/// How long the fake upstream pauses before it breaks a stream, so the head and the events reach
/// the gateway before the connection drops.
const BREAK_PAUSE: Duration = Duration::from_millis(100);

/// One case folder.
struct Case {
    dir: PathBuf,
    id: String,
    client: Protocol,
    upstream: Protocol,
}

impl Case {
    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.path(file)).ok()
    }

    fn json(&self, file: &str) -> Option<Value> {
        self.read(file)
            .map(|t| serde_json::from_str(&t).unwrap_or_else(|e| panic!("{}/{file}: {e}", self.id)))
    }

    fn status(&self, file: &str) -> u16 {
        self.read(file).map_or(200, |s| {
            s.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{}/{file}: {e}", self.id))
        })
    }

    fn headers(&self, file: &str) -> Vec<(String, String)> {
        self.read(file)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').expect("header lines are `name: value`");
                (k.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect()
    }

    fn is_break(&self) -> bool {
        self.id
            .rsplit('/')
            .next()
            .is_some_and(|n| n.contains("break"))
    }
}

/// Every case folder of every ordered pair of different protocols, sorted.
fn discover() -> Vec<Case> {
    let mut cases = Vec::new();
    for client in Protocol::ALL {
        for upstream in Protocol::ALL {
            if client == upstream {
                continue;
            }
            let pair = format!("{}_to_{}", client.name(), upstream.name());
            let Ok(entries) = std::fs::read_dir(Path::new(ROOT).join(&pair)) else {
                continue;
            };
            for e in entries {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    cases.push(Case {
                        dir: e.path(),
                        id: format!("{pair}/{name}"),
                        client,
                        upstream,
                    });
                }
            }
        }
    }
    cases.sort_by(|a, b| a.id.cmp(&b.id));
    cases
}

/// The fixed gateway setup every case runs on (documented in tests/fixtures/README.md).
fn case_config(upstream_url: &str, upstream: Protocol) -> String {
    let thinking = match upstream {
        Protocol::Messages => "thinking = \"anthropic\"",
        Protocol::Chat => "thinking = \"chat_template_kwargs\"",
        Protocol::Responses => "thinking = \"openai\"",
    };
    config(
        upstream_url,
        &format!(
            r#"
[[upstreams]]
name = "fx-upstream"
kind = "{}"
base_url = "{{UPSTREAM}}/v1"
api_key_env = "UPSTREAM_KEY"

[[models]]
name = "fx"
upstream = "fx-upstream"
upstream_model = "upstream-model"
vision = true
default_max_tokens = 1024
# One attempt: the error cases check what one upstream failure becomes, not the retries.
retry = {{ attempts = 1 }}
{thinking}
"#,
            upstream.name()
        ),
    )
}

fn model_for(upstream: Protocol) -> Arc<Model> {
    let toml = case_config("http://127.0.0.1:9", upstream);
    let config = Config::parse(&toml, Path::new("."), &|_| Some("k".into())).unwrap();
    config.models[0].clone()
}

// === normalisation ===

/// Replaces minted ids by `<minted:PREFIX#N>` (N counts distinct ids in order of appearance, so
/// an item id that must repeat is still checked to repeat) and `created`/`created_at` by 0.
#[derive(Default)]
struct Normaliser {
    seen: HashMap<String, String>,
    counts: HashMap<&'static str, usize>,
}

impl Normaliser {
    fn minted(&mut self, s: &str) -> Option<String> {
        let hex = |rest: &str| rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let prefix = MINTED_PREFIXES.into_iter().find(|p| {
            s.strip_prefix(p).is_some_and(|rest| match rest.len() {
                24 => hex(rest),
                // An item id naming its answer: only one whose answer came before it.
                32 => hex(rest) && self.seen.contains_key(&format!("resp_{}", &rest[..24])),
                _ => false,
            })
        })?;
        if let Some(m) = self.seen.get(s) {
            return Some(m.clone());
        }
        let n = self.counts.entry(prefix).or_default();
        *n += 1;
        let m = format!("<minted:{prefix}#{n}>");
        self.seen.insert(s.to_owned(), m.clone());
        Some(m)
    }

    fn value(&mut self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Some(m) = self.minted(s) {
                    *s = m;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.value(x)),
            Value::Object(o) => {
                for (k, x) in o.iter_mut() {
                    if (k == "created" || k == "created_at") && x.is_number() {
                        *x = Value::from(0);
                    } else {
                        self.value(x);
                    }
                }
            }
            _ => {}
        }
    }
}

fn normalised(mut v: Value) -> Value {
    Normaliser::default().value(&mut v);
    v
}

/// An event stream as (event name, data parsed as JSON or kept as a string), normalised.
type Events = Vec<(Option<String>, Value)>;

fn events_of(bytes: &[u8]) -> Events {
    let mut raw: Vec<SseEvent> = Vec::new();
    let mut d = SseDecoder::new();
    d.feed(bytes, &mut raw).unwrap();
    d.finish(&mut raw);
    let mut n = Normaliser::default();
    raw.into_iter()
        .map(|e| {
            let mut data =
                serde_json::from_str(&e.data).unwrap_or_else(|_| Value::String(e.data.clone()));
            n.value(&mut data);
            (e.event, data)
        })
        .collect()
}

fn sse_text(events: &Events) -> String {
    let mut out = String::new();
    for (name, data) in events {
        if let Some(name) = name {
            writeln!(out, "event: {name}").unwrap();
        }
        match data {
            Value::String(s) => writeln!(out, "data: {s}").unwrap(),
            v => writeln!(out, "data: {v}").unwrap(),
        }
        out.push('\n');
    }
    out
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap() + "\n"
}

fn show_events(events: &Events) -> String {
    events
        .iter()
        .map(|(n, d)| format!("  {} {d}", n.as_deref().unwrap_or("-")))
        .collect::<Vec<_>>()
        .join("\n")
}

// === end to end ===

/// What the fake upstream answers, rebuilt for every request it gets.
#[derive(Clone)]
struct UpstreamReply {
    status: u16,
    sse: bool,
    broken: bool,
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

impl UpstreamReply {
    fn of(case: &Case) -> Self {
        let (sse, body) = match case.read("upstream_reply.sse") {
            Some(s) => (true, s),
            // A case refused before anything goes upstream needs no reply; a wrong request gets this.
            None => (
                false,
                case.read("upstream_reply.json").unwrap_or_else(|| {
                    r#"{"error": {"message": "this fixture expects no upstream call"}}"#.into()
                }),
            ),
        };
        let mut headers: Vec<(&'static str, String)> = Vec::new();
        for (k, v) in case.headers("upstream_headers") {
            headers.push((Box::leak(k.into_boxed_str()), v));
        }
        let missing = !case.path("upstream_reply.json").exists() && !sse;
        Self {
            status: if missing {
                500
            } else {
                case.status("upstream_status")
            },
            sse,
            broken: case.is_break(),
            headers,
            body: Bytes::from(body),
        }
    }

    fn reply(&self) -> Reply {
        if !self.sse {
            let mut headers = vec![("content-type", "application/json".to_owned())];
            headers.extend(self.headers.iter().cloned());
            return Reply::Full {
                status: self.status,
                headers,
                body: self.body.clone(),
            };
        }
        let bytes = self.body.clone();
        // A breaking stream: every byte of the transcript, then a pause (so the head and the
        // events are flushed to the gateway), then a comment line, then the connection drops.
        let chunks = if self.broken {
            vec![
                (Duration::ZERO, bytes),
                (BREAK_PAUSE, Bytes::from_static(b":\n")),
            ]
        } else {
            vec![(Duration::ZERO, bytes)]
        };
        Reply::Stream {
            status: self.status,
            content_type: "text/event-stream",
            chunks,
            abort: self.broken,
        }
    }
}

/// Runs one case; returns what went wrong, if anything.
async fn run_case(case: &Case, update: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let reply = UpstreamReply::of(case);
    let up = FakeUpstream::start(move |_| reply.reply()).await;
    let gw = TestGateway::start(&case_config(&up.url(), case.upstream)).await;
    let body = case
        .read("client_request.json")
        .unwrap_or_else(|| panic!("{}: no client_request.json", case.id));
    let resp = client()
        .post(gw.base(case.client.client_path()))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap_or_default();
    let is_sse = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));

    // What the upstream received.
    let seen = up.seen();
    let sent = seen.first().map(|s| s.json());
    let want_path = format!("/v1{}", case.upstream.upstream_suffix());
    if let Some(s) = seen.first() {
        if s.uri != want_path {
            problems.push(format!("upstream path {} (want {want_path})", s.uri));
        }
    }
    if update {
        write_or_remove(case, "upstream_request.json", sent.as_ref().map(pretty));
    } else {
        match (case.json("upstream_request.json"), &sent) {
            (Some(want), Some(got)) if want == *got => {}
            (Some(want), Some(got)) => problems.push(format!(
                "upstream request differs\n--- expected\n{}--- got\n{}",
                pretty(&want),
                pretty(got)
            )),
            (Some(_), None) => problems.push("the upstream received nothing".into()),
            (None, Some(got)) => problems.push(format!(
                "the upstream must receive nothing, got\n{}",
                pretty(got)
            )),
            (None, None) => {}
        }
    }
    if seen.len() > 1 {
        problems.push(format!("the upstream received {} requests", seen.len()));
    }

    // What the client received.
    let (sse_file, json_file) = ("client_reply.sse", "client_reply.json");
    if update {
        write_or_remove(
            case,
            "client_status",
            (status != 200).then(|| format!("{status}\n")),
        );
        if is_sse {
            write_or_remove(case, sse_file, Some(sse_text(&events_of(&bytes))));
            write_or_remove(case, json_file, None);
        } else {
            let v = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
            write_or_remove(case, json_file, Some(pretty(&normalised(v))));
            write_or_remove(case, sse_file, None);
        }
        return problems;
    }
    let want_status = case.status("client_status");
    if status != want_status {
        problems.push(format!("client status {status} (want {want_status})"));
    }
    for (k, v) in case.headers("client_headers") {
        let got = headers.get(k.as_str()).and_then(|h| h.to_str().ok());
        if got != Some(v.as_str()) {
            problems.push(format!("client header {k}: {got:?} (want {v:?})"));
        }
    }
    if let Some(want) = case.read(sse_file) {
        if !is_sse {
            problems.push(format!(
                "the client got no event stream: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        let (want, got) = (events_of(want.as_bytes()), events_of(&bytes));
        if want != got {
            problems.push(format!(
                "client stream differs\n--- expected\n{}\n--- got\n{}",
                show_events(&want),
                show_events(&got)
            ));
        }
    } else {
        let want = normalised(
            case.json(json_file)
                .unwrap_or_else(|| panic!("{}: no client_reply.json or .sse", case.id)),
        );
        let got = serde_json::from_slice(&bytes).map(normalised);
        match got {
            Ok(got) if got == want => {}
            Ok(got) => problems.push(format!(
                "client reply differs\n--- expected\n{}--- got\n{}",
                pretty(&want),
                pretty(&got)
            )),
            Err(_) => problems.push(format!(
                "client reply is not JSON: {}",
                String::from_utf8_lossy(&bytes)
            )),
        }
        if is_sse {
            problems.push("the client got an event stream, a JSON reply was expected".into());
        }
    }
    problems
}

fn write_or_remove(case: &Case, file: &str, content: Option<String>) {
    let path = case.path(file);
    match content {
        Some(c) => std::fs::write(&path, c).unwrap(),
        None => {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_fixtures() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let cases = discover();
    assert!(
        cases.len() >= 6 * 10,
        "only {} fixture cases found",
        cases.len()
    );
    let runs = cases
        .iter()
        .map(|c| async move { (c, run_case(c, update).await) });
    let results = futures_util::future::join_all(runs).await;
    let mut report = String::new();
    for (case, problems) in &results {
        for p in problems {
            writeln!(report, "\n=== {}: {p}", case.id).unwrap();
        }
    }
    println!("{} fixture cases run", results.len());
    assert!(report.is_empty(), "fixture failures:{report}");
}

// === split replay ===

fn translation_for(case: &Case) -> Option<Translation> {
    let body = case.read("client_request.json")?;
    let model = model_for(case.upstream);
    translate::request(
        case.client,
        case.upstream,
        body.as_bytes(),
        model.primary(),
        "fx",
    )
    .ok()
    .map(|(_, t)| t)
}

/// Feeds the upstream bytes in the given pieces and ends the stream as the gateway does.
fn replay(t: &Translation, bytes: &[u8], cuts: &[usize], broken: bool) -> Events {
    let mut st = StreamTranslator::new(t);
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        st.feed(&bytes[at..cut], &mut out);
        at = cut;
    }
    if broken {
        st.fail(
            modelgate::ir::ErrorInfo {
                status: 502,
                message: "the upstream stream broke: scripted abort".into(),
                code: None,
            },
            &mut out,
        );
    } else {
        st.finish(&mut out);
    }
    events_of(&out)
}

#[test]
fn stream_fixtures_survive_any_split() {
    let mut report = String::new();
    let mut replayed = 0;
    for case in discover() {
        let Some(sse) = case.read("upstream_reply.sse") else {
            continue;
        };
        let Some(t) = translation_for(&case) else {
            continue;
        };
        let bytes = sse.as_bytes();
        let broken = case.is_break();
        let whole = replay(&t, bytes, &[], broken);
        // While UPDATE_GOLDEN rewrites the golden files, only the splits are compared.
        let golden = case
            .read("client_reply.sse")
            .filter(|_| std::env::var_os("UPDATE_GOLDEN").is_none())
            .map(|s| events_of(s.as_bytes()));
        if !broken && golden.as_ref().is_some_and(|g| *g != whole) {
            writeln!(
                report,
                "\n=== {}: whole replay differs from the golden reply\n{}",
                case.id,
                show_events(&whole)
            )
            .unwrap();
        }
        let bytewise: Vec<usize> = (1..bytes.len()).collect();
        let mut splits = vec![("one byte at a time".to_owned(), bytewise)];
        for seed in 0..10u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut cuts: Vec<usize> = (0..50).map(|_| rng.usize(0..=bytes.len())).collect();
            cuts.sort_unstable();
            splits.push((format!("50 random cuts, seed {seed}"), cuts));
        }
        for (what, cuts) in splits {
            let got = replay(&t, bytes, &cuts, broken);
            if got != whole {
                writeln!(report, "\n=== {} ({what}): output differs from the whole replay\n--- whole\n{}\n--- split\n{}", case.id, show_events(&whole), show_events(&got)).unwrap();
            }
        }
        replayed += 1;
    }
    println!("{replayed} upstream streams replayed");
    assert!(replayed >= 6 * 5, "only {replayed} streams replayed");
    assert!(report.is_empty(), "split replay failures:{report}");
}
