//! Every request decoder with the checks the pipeline runs before it, on structure-aware JSON: golden fixture requests (video creation bodies included) mutated with protocol words, or fresh trees of them, sometimes with one of their keys written twice.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{repeat_a_key, request_value, run_request_kind, REQUEST_KINDS};

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(kind) = u.choose(&REQUEST_KINDS).copied() else {
        return;
    };
    let Ok(v) = request_value(&mut u, kind) else {
        return;
    };
    let body = if u.ratio(1, 2).unwrap_or(true) {
        serde_json::to_string(&v)
    } else {
        serde_json::to_string_pretty(&v)
    };
    let Ok(mut body) = body else {
        return;
    };
    if u.ratio(1, 4).unwrap_or(false) {
        let at = u.arbitrary::<u16>().unwrap_or(0);
        body = repeat_a_key(&body, usize::from(at));
    }
    run_request_kind(kind, body.as_bytes());
});
