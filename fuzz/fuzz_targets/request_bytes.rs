//! Every request decoder and the validation the pipeline runs, on arbitrary bytes: a clean refusal or a request written as one JSON object for every target protocol.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{run_request, PROTOCOLS};

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    run_request(PROTOCOLS[usize::from(which) % PROTOCOLS.len()], body);
});
