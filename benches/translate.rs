//! Translation cost per protocol pair: a 2 KB request with tools, a reply, and a 200-event stream.
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
}

criterion_group!(translate_benches, benches);
criterion_main!(translate_benches);
