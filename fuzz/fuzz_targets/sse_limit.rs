//! The SSE decoder with a small event limit (`SseDecoder::with_limit`, as translated streams use it), on arbitrary bytes fed in arbitrary pieces: it refuses exactly when what it holds for one event (its data so far and the line still arriving) passes the limit, gives exactly the reference decoder's events until then, and its work stays linear (checked on inputs stretched to 256 KiB when MODELGATE_FUZZ_STRETCH=1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate_fuzz::{
    check_limited_decoder, piece_ends, stretch_enabled, stretched, within_linear_time,
};

fuzz_target!(|data: &[u8]| {
    // Header: the limit, then how many of the next bytes are piece lengths; the rest is the stream.
    let [limit, ncuts, rest @ ..] = data else {
        return;
    };
    let n = usize::from(ncuts % 16).min(rest.len());
    let (cuts, stream) = rest.split_at(n);
    if *ncuts == 0xFF && stretch_enabled() {
        // Stretched: 256 KiB of the stream with a limit that lets most of it through, in pieces
        // of at least 16 bytes; the work must stay linear.
        let stream = stretched(stream, 256 * 1024);
        let cuts: Vec<u8> = cuts.iter().map(|c| (*c).max(16)).collect();
        let max = 1024 * usize::from(*limit);
        // Each line end costs a little of its own: an eighth of a piece.
        let lines = memchr::memchr2_iter(b'\n', b'\r', &stream).count();
        let pieces = piece_ends(stream.len(), &cuts).len() + lines / 8;
        within_linear_time("the limited decoder", stream.len(), pieces, || {
            check_limited_decoder(&stream, &cuts, max)
        });
        return;
    }
    check_limited_decoder(stream, cuts, usize::from(*limit));
});
