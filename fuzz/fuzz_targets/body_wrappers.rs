//! The passthrough body wrappers (`body::UpstreamBody` with its event and reply limits and stream guard, `Prepend`, the usage reader `observe::Metered`, `StripUsage`, `Redacted`), composed as `pipeline::respond` composes them, over an arbitrary upstream byte stream split into arbitrary frames: the bytes come out as they went in except what a wrapper is documented to take out or add, an event-size error only when an event by SSE rules is really over the limit, and linear work (checked on inputs stretched to 256 KiB when MODELGATE_FUZZ_STRETCH=1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::body::StreamGuard;
use modelgate_fuzz::{
    frames_of, run_json_reply, run_passthrough_stream, stretch_enabled, stretched,
    within_linear_time, StreamCase,
};

const GUARDS: [StreamGuard; 4] = [
    StreamGuard::None,
    StreamGuard::Chat,
    StreamGuard::Messages,
    StreamGuard::Responses,
];

fuzz_target!(|data: &[u8]| {
    // Header: flags (guard, StripUsage, a broken connection, which path), the limit, then how
    // many of the next bytes are frame lengths; the rest is what the upstream sends.
    let [flags, limit, ncuts, rest @ ..] = data else {
        return;
    };
    let n = usize::from(ncuts % 8).min(rest.len());
    let (cuts, input) = rest.split_at(n);
    let guard = GUARDS[usize::from(flags & 3)];
    let strip = flags & 4 != 0 && guard == StreamGuard::Chat;
    let broken = flags & 8 != 0;
    let path = (flags >> 4) & 3;
    let stretch = *ncuts == 0xFF && stretch_enabled();
    let (input, cuts) = if stretch {
        // 256 KiB of the input in frames of at least 16 bytes, under the default limits.
        let cuts: Vec<u8> = cuts.iter().map(|c| (*c).max(16)).collect();
        (stretched(input, 256 * 1024), cuts)
    } else {
        (input.to_vec(), cuts.to_vec())
    };
    let frames = frames_of(&input, &cuts).len();
    let run = || match path {
        0 | 1 => run_passthrough_stream(&StreamCase {
            input: &input,
            cuts: &cuts,
            guard,
            strip,
            max_event: if stretch {
                16 << 20
            } else {
                usize::from(*limit) * 4
            },
            broken,
        }),
        reply => {
            let max = if stretch {
                u64::MAX
            } else {
                u64::from(*limit) * 16
            };
            run_json_reply(&input, &cuts, max, broken, reply == 3);
        }
    };
    if stretch {
        // Each line end may end an event, and each event costs a little of its own: they
        // count as an eighth of a piece (a stream of 100 000 CR line ends is slow but linear).
        let lines = memchr::memchr2_iter(b'\n', b'\r', &input).count();
        within_linear_time("the body wrappers", input.len(), frames + lines / 8, run);
    } else {
        // A few KiB take well under a millisecond: CPU time is too noisy there to judge by (a
        // 1 ms input once measured 34 ms while a compiler ran beside it).
        run();
    }
});
