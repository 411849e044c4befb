//! An upstream's HTTP/1.1 answer as the gateway's own client reads it (`upstream::h1::codec`: the head parser, interim answers skipped, then the body by its framing), from arbitrary bytes split into arbitrary reads: never a panic, and the same status, framing, body bytes, end and left-over bytes, or the same refusal, however the bytes were split and whichever headers the head keeps.
#![no_main]

use bytes::BytesMut;
use http::Method;
use libfuzzer_sys::fuzz_target;
use modelgate::upstream::h1::codec::{parse_head, Chunked, Framing, Keep};

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The head never completed.
    NoHead,
    /// The head was refused.
    BadHead,
    Body {
        status: u16,
        framing: Framing,
        data: Vec<u8>,
        /// The framing said the body ended.
        ended: bool,
        /// The de-framing refused the body.
        broken: bool,
        rest: Vec<u8>,
    },
}

enum Reading {
    Head,
    Length(u64),
    Chunked(Chunked),
    Close,
}

/// Feeds `input` in the reads `cuts` makes of it, as `PooledBody` and `exchange` do.
fn read(input: &[u8], cuts: &[usize], method: &Method, keep: Keep) -> Outcome {
    let mut buf = BytesMut::new();
    let mut reading = Reading::Head;
    let mut head = None;
    let mut data = Vec::new();
    let mut ended = false;
    let mut at = 0;
    for &end in cuts.iter().chain(std::iter::once(&input.len())) {
        let end = end.clamp(at, input.len());
        buf.extend_from_slice(&input[at..end]);
        at = end;
        loop {
            match &mut reading {
                Reading::Head => match parse_head(&mut buf, method, keep) {
                    Ok(Some(h)) if h.status.is_informational() => continue,
                    Ok(Some(h)) => {
                        reading = match h.framing {
                            Framing::Length(0) => {
                                ended = true;
                                Reading::Length(0)
                            }
                            Framing::Length(n) => Reading::Length(n),
                            Framing::Chunked => Reading::Chunked(Chunked::default()),
                            Framing::Close => Reading::Close,
                        };
                        head = Some((h.status.as_u16(), h.framing));
                        continue;
                    }
                    Ok(None) => break,
                    Err(_) => return Outcome::BadHead,
                },
                Reading::Length(left) => {
                    if *left > 0 && !buf.is_empty() {
                        let n = usize::try_from(*left).map_or(buf.len(), |l| l.min(buf.len()));
                        data.extend_from_slice(&buf.split_to(n));
                        *left -= n as u64;
                        ended = *left == 0;
                    }
                    break;
                }
                Reading::Chunked(dec) => {
                    match dec.decode(&mut buf) {
                        Ok(Some(d)) => data.extend_from_slice(&d),
                        Ok(None) => {}
                        Err(_) => {
                            let (status, framing) = head.unwrap_or((0, Framing::Close));
                            return Outcome::Body {
                                status,
                                framing,
                                data: Vec::new(),
                                ended: false,
                                broken: true,
                                rest: Vec::new(),
                            };
                        }
                    }
                    ended = dec.is_done();
                    break;
                }
                Reading::Close => {
                    data.extend_from_slice(&buf.split());
                    break;
                }
            }
        }
    }
    match head {
        None => Outcome::NoHead,
        Some((status, framing)) => Outcome::Body {
            status,
            framing,
            data,
            ended,
            broken: false,
            rest: buf.to_vec(),
        },
    }
}

fuzz_target!(|input: &[u8]| {
    // Header: the method (HEAD or POST), then how many of the next bytes are read lengths.
    let [flags, ncuts, rest @ ..] = input else {
        return;
    };
    let method = if flags & 1 == 1 { Method::HEAD } else { Method::POST };
    let n = usize::from(ncuts % 16).min(rest.len());
    let (lens, wire) = rest.split_at(n);
    let mut cuts = Vec::with_capacity(n);
    let mut at = 0usize;
    for &len in lens {
        at += usize::from(len);
        cuts.push(at);
    }
    let whole = read(wire, &[], &method, Keep::All);
    let split = read(wire, &cuts, &method, Keep::All);
    assert_eq!(whole, split, "reads split at {cuts:?}");
    // A head read for a client keeps only a few headers; the body is read the same.
    if whole != Outcome::BadHead {
        let forwarded = read(wire, &cuts, &method, Keep::Only(&["content-type"]));
        assert_eq!(whole, forwarded, "the head read for a client");
    }
    if let Outcome::Body {
        framing: Framing::Length(n),
        data,
        ..
    } = &whole
    {
        assert!(data.len() as u64 <= *n, "more body than its content-length");
    }
});
