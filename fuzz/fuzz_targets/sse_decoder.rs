//! The SSE decoder on arbitrary bytes, fed in arbitrary pieces: the same events as a plain reference decoder of the whole input, whatever the split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{decode_in_pieces, reference_decode};

fuzz_target!(|data: &[u8]| {
    // The first byte says how many of the following bytes are piece lengths; the rest is the stream.
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (cuts, stream) = rest.split_at(n);
    let expected = reference_decode(stream);
    let whole = decode_in_pieces(stream, &[]);
    assert_eq!(whole, expected, "whole input");
    if !cuts.is_empty() {
        let split = decode_in_pieces(stream, cuts);
        assert_eq!(split, expected, "split by {cuts:?}");
    }
});
