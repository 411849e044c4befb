//! Every stream translator on structure-aware streams: golden fixture streams of the upstream's protocol with events dropped, repeated, swapped, renamed and their JSON mutated.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{pairs, run_stream, stream_bytes, translations};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let all = translations();
    let Ok(i) = u.choose_index(pairs().len()) else {
        return;
    };
    let (ts, upstream) = (&all[i], pairs()[i].1);
    let Ok(t) = u.choose(ts) else {
        return;
    };
    let Ok(broken) = u.ratio(1, 8) else {
        return;
    };
    let Ok(cuts) = u.arbitrary::<[u8; 3]>() else {
        return;
    };
    let Ok(stream) = stream_bytes(&mut u, upstream) else {
        return;
    };
    run_stream(t, &stream, &cuts, broken);
});
