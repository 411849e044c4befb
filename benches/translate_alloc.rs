//! Allocations per translated stream event, for a short and a long stream of each pair: the per-event count must not grow with the stream's length.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "bench setup: a failure should stop the bench loudly"
)]

mod common;

use common::*;
use modelgate::translate::StreamTranslator;

// Counting allocations needs a global allocator; dhat's needs no unsafe code here.
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Allocation blocks per stream event, for a 60-event and a 200-event stream of each pair: the
/// per-event figure must not grow with the stream's length.
fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let models = models();
    println!("\nallocations per upstream event (blocks), short vs long stream:");
    for pair in PAIRS {
        let events = stream_in(&models, pair.1);
        let t = translation(&models, pair, true);
        let mut per = Vec::new();
        for n in [60usize, events.len()] {
            // Same shape, shorter: the head, the middle cut down, and the same tail.
            let tail = events.len().saturating_sub(12);
            let mut subset: Vec<&Vec<u8>> = events[..(n.min(events.len()) - 12)].iter().collect();
            subset.extend(events[tail..].iter());
            let before = dhat::HeapStats::get().total_blocks;
            let mut st = StreamTranslator::new(&t);
            let mut out = Vec::with_capacity(512);
            for e in &subset {
                st.feed(e, &mut out);
                out.clear();
            }
            st.finish(&mut out);
            let blocks = dhat::HeapStats::get().total_blocks - before;
            per.push((subset.len(), blocks as f64 / subset.len() as f64));
        }
        println!(
            "  {:<24} {:>3} events: {:>6.1}/event   {:>3} events: {:>6.1}/event",
            name(pair),
            per[0].0,
            per[0].1,
            per[1].0,
            per[1].1
        );
    }
}
