//! Every request decoder (chat, messages, responses, count_tokens, video creation) with the checks the pipeline runs before it, on arbitrary bytes: a clean refusal or a request written as one JSON object, with no repeated key, for every target.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{run_request_kind, REQUEST_KINDS};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the decoder: 0 chat, 1 messages, 2 responses, 3 count_tokens, 4 video.
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    run_request_kind(
        REQUEST_KINDS[usize::from(which) % REQUEST_KINDS.len()],
        body,
    );
});
