//! Every request decoder and the validation the pipeline runs, on structure-aware JSON: golden fixture requests mutated with protocol words, or fresh trees of them.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{request_value, run_request, PROTOCOLS};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(client) = u.choose(&PROTOCOLS).copied() else {
        return;
    };
    let Ok(v) = request_value(&mut u, client) else {
        return;
    };
    let body = if u.ratio(1, 2).unwrap_or(true) {
        serde_json::to_vec(&v)
    } else {
        serde_json::to_vec_pretty(&v)
    };
    if let Ok(body) = body {
        run_request(client, &body);
    }
});
