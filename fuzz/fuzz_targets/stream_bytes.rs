//! Every stream translator (each upstream protocol's stream to each client protocol) on arbitrary bytes in arbitrary pieces: the client gets well-formed events ending in its protocol's terminal event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{pairs, run_stream, translations};

fuzz_target!(|data: &[u8]| {
    // Header: pair, translation (request context), ending, piece lengths; then the stream.
    let [pair, which, end, ncuts, rest @ ..] = data else {
        return;
    };
    let all = translations();
    let ts = &all[usize::from(*pair) % pairs().len()];
    if ts.is_empty() {
        return;
    }
    let t = &ts[usize::from(*which) % ts.len()];
    let n = usize::from(ncuts % 8).min(rest.len());
    let (cuts, stream) = rest.split_at(n);
    run_stream(t, stream, cuts, end & 1 == 1);
});
