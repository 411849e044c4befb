//! Translation cost per protocol pair: a 2 KB request with tools, a reply, and a 200-event stream; and the benchbed's plain messages request by the IR and in one pass.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "bench setup: a failure should stop the bench loudly"
)]

mod common;

// The binary's allocator (mimalloc linked as `malloc`, src/main.rs),
// so the figures are what `modelgate serve` does.
use mimalloc as _;

use std::hint::black_box;

use common::*;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http::StatusCode;
use modelgate::config::Protocol;
use modelgate::translate::{self, StreamTranslator};

fn benches(c: &mut Criterion) {
    let models = models();
    let mut g = c.benchmark_group("request");
    for pair in PAIRS {
        let body = request_in(&models, pair.0, false);
        let model = model_for(&models, pair.1);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name(pair)), &body, |b, body| {
            b.iter(|| {
                translate::request(pair.0, pair.1, black_box(body), model.primary(), "bench")
                    .unwrap()
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("reply");
    for pair in PAIRS {
        let reply = reply_in(&models, pair.1);
        let t = translation(&models, pair, false);
        g.bench_with_input(
            BenchmarkId::from_parameter(name(pair)),
            &reply,
            |b, reply| b.iter(|| t.json_reply(StatusCode::OK, black_box(reply))),
        );
    }
    g.finish();

    let mut g = c.benchmark_group("stream_200_events");
    for pair in PAIRS {
        let events = stream_in(&models, pair.1);
        let t = translation(&models, pair, true);
        g.throughput(Throughput::Elements(events.len() as u64));
        g.bench_with_input(
            BenchmarkId::from_parameter(name(pair)),
            &events,
            |b, events| {
                b.iter(|| {
                    let mut st = StreamTranslator::new(&t);
                    let mut out = Vec::with_capacity(512);
                    for e in events {
                        st.feed(black_box(e), &mut out);
                        out.clear();
                    }
                    st.finish(&mut out);
                })
            },
        );
    }
    g.finish();

    // The benchbed's S3 request for a chat upstream, by the IR and in one pass. The one pass
    // starts from the top-level object the request's validation found, which both paths have.
    let mut g = c.benchmark_group("plain_messages_request");
    let body = br#"{"model":"mock-gpt","max_tokens":64,"system":"You are terse.","messages":[{"role":"user","content":"Say hello in five words."}]}"#;
    let model = model_for(&models, Protocol::Chat);
    let obj = modelgate::validate::request_object(body).unwrap();
    g.bench_function("ir", |b| {
        b.iter(|| {
            translate::request(
                Protocol::Messages,
                Protocol::Chat,
                black_box(body),
                model.primary(),
                "bench",
            )
            .unwrap()
        })
    });
    g.bench_function("one_pass", |b| {
        b.iter(|| translate::plain_messages_for_chat(black_box(&obj), "bench", "bench").unwrap())
    });
    g.finish();
}

criterion_group!(translate_benches, benches);
criterion_main!(translate_benches);
