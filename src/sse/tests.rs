//! SSE decoder tests: line ends, comments, multi-line data, and any split of the bytes.

use super::*;

fn decode_all(pieces: &[&[u8]]) -> Vec<SseEvent> {
    let mut d = SseDecoder::new();
    let mut out = Vec::new();
    for p in pieces {
        d.feed(p, &mut out).unwrap();
    }
    d.finish(&mut out);
    out
}

fn ev(event: Option<&str>, data: &str) -> SseEvent {
    SseEvent {
        event: event.map(str::to_owned),
        data: data.to_owned(),
    }
}

#[test]
fn line_endings_comments_and_multiline_data() {
    let text = b": hello\r\nevent: a\r\ndata: 1\r\ndata:2\r\n\r\ndata: x\rdata: y\r\rid: 3\nretry: 5\nfoo\ndata\n\n";
    let want = vec![ev(Some("a"), "1\n2"), ev(None, "x\ny"), ev(None, "")];
    assert_eq!(decode_all(&[text]), want);
}

#[test]
fn every_split_gives_the_same_events() {
    let text: &[u8] = b"event: message_start\ndata: {\"a\":1}\n\n: ping\r\n\r\nevent: x\r\ndata: 2\r\n\r\ndata: [DONE]\n\n";
    let whole = decode_all(&[text]);
    assert_eq!(whole.len(), 3);
    for i in 0..=text.len() {
        for j in i..=text.len() {
            assert_eq!(
                decode_all(&[&text[..i], &text[i..j], &text[j..]]),
                whole,
                "split at {i},{j}"
            );
        }
    }
    let bytes: Vec<&[u8]> = text.chunks(1).collect();
    assert_eq!(decode_all(&bytes), whole);
}

#[test]
fn a_cr_lf_split_across_feeds_is_one_line_end() {
    assert_eq!(
        decode_all(&[b"data: a\r", b"\n\r", b"\n"]),
        vec![ev(None, "a")]
    );
}

#[test]
fn an_event_name_belongs_to_its_own_event_only() {
    // A name without data is dropped with its event; the next event has no name of its own.
    let text = b"event: a\ndata: 1\n\nevent: lost\n\ndata: 2\n\nevent: b\ndata: 3\n\n";
    let want = vec![ev(Some("a"), "1"), ev(None, "2"), ev(Some("b"), "3")];
    assert_eq!(decode_all(&[text]), want);
}

#[test]
fn invalid_utf8_is_replaced_however_the_bytes_are_split() {
    // A two-byte character cut between feeds is whole again; a lone continuation byte and a
    // character cut by its line end are each one replacement character.
    let mut bytes = b"data: \xc3".to_vec();
    bytes.extend_from_slice(b"\xa9 \x80|\xc3\ndata: x\n\n");
    let whole = decode_all(&[&bytes]);
    assert_eq!(whole, vec![ev(None, "\u{e9} \u{fffd}|\u{fffd}\nx")]);
    for cut in 0..=bytes.len() {
        assert_eq!(
            decode_all(&[&bytes[..cut], &bytes[cut..]]),
            whole,
            "cut at {cut}"
        );
    }
}

#[test]
fn events_are_handed_over_borrowed_one_by_one() {
    let mut d = SseDecoder::new();
    let mut seen = Vec::new();
    d.feed_with(b"event: a\ndata: 1\n\ndata: 2\n", |e| {
        seen.push(format!("{:?}={}", e.event, e.data))
    })
    .unwrap();
    assert_eq!(seen, ["Some(\"a\")=1"]);
    d.feed_with(b"data: 3\n\n", |e| {
        seen.push(format!("{:?}={}", e.event, e.data))
    })
    .unwrap();
    d.finish_with(|e| seen.push(format!("{:?}={}", e.event, e.data)));
    assert_eq!(seen, ["Some(\"a\")=1", "None=2\n3"]);
}

#[test]
fn unterminated_final_event_is_dispatched_at_finish() {
    assert_eq!(decode_all(&[b"data: tail"]), vec![ev(None, "tail")]);
}

#[test]
fn random_splits_property() {
    // A small deterministic generator: events built from random fields, split at random points.
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..300 {
        let mut text = Vec::new();
        for _ in 0..rng.usize(1..6) {
            if rng.bool() {
                text.extend_from_slice(b": comment\n");
            }
            if rng.bool() {
                text.extend_from_slice(format!("event: e{}\n", rng.u8(..)).as_bytes());
            }
            for _ in 0..rng.usize(1..3) {
                let payload: String = (0..rng.usize(0..20))
                    .map(|_| char::from(rng.u8(b' '..b'~')))
                    .collect();
                text.extend_from_slice(format!("data: {payload}").as_bytes());
                let eol: &[u8] = [&b"\n"[..], b"\r\n", b"\r"][rng.usize(0..3)];
                text.extend_from_slice(eol);
            }
            let eol: &[u8] = [&b"\n"[..], b"\r\n", b"\r"][rng.usize(0..3)];
            text.extend_from_slice(eol);
        }
        let whole = decode_all(&[&text]);
        let mut cuts: Vec<usize> = (0..rng.usize(0..8))
            .map(|_| rng.usize(0..=text.len()))
            .collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut last = 0;
        for c in cuts {
            pieces.push(&text[last..c]);
            last = c;
        }
        pieces.push(&text[last..]);
        assert_eq!(
            decode_all(&pieces),
            whole,
            "text {:?}",
            String::from_utf8_lossy(&text)
        );
    }
}

#[test]
fn an_event_over_the_limit_is_refused_and_one_within_it_is_not() {
    let mut d = SseDecoder::with_limit(64);
    let mut out = Vec::new();
    d.feed(b"data: ", &mut out).unwrap();
    // A line without a break grows the pending buffer; the limit counts it.
    let err = (0..20).find_map(|_| d.feed(b"xxxxxxxx", &mut out).err());
    assert_eq!(err, Some(EventTooLarge(64)));
    assert!(out.is_empty());

    // Many data lines of one event count together too.
    let mut d = SseDecoder::with_limit(64);
    let err = (0..20).find_map(|_| d.feed(b"data: 0123456789\n", &mut out).err());
    assert_eq!(err, Some(EventTooLarge(64)));

    // Events under the limit pass, however many there are.
    let mut d = SseDecoder::with_limit(64);
    let mut out = Vec::new();
    for _ in 0..1000 {
        d.feed(b"data: 0123456789\n\n", &mut out).unwrap();
    }
    assert_eq!(out.len(), 1000);
}

#[test]
fn a_long_line_fed_in_small_pieces_is_searched_once() {
    // 4 MiB in feeds of 4 KiB: quadratic rescanning would be ~2 G byte checks; the decoder
    // keeps only the open line, never searched again, so this stays a linear pass.
    let mut d = SseDecoder::new();
    let mut out = Vec::new();
    d.feed(b"data: ", &mut out).unwrap();
    let piece = vec![b'a'; 4096];
    for _ in 0..1024 {
        d.feed(&piece, &mut out).unwrap();
    }
    assert_eq!(d.partial.len(), 6 + 4 * 1024 * 1024);
    d.feed(b"\n\n", &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].data.len(), 4 * 1024 * 1024);
    assert!(d.partial.is_empty());
}

/// Event ends found by feeding `pieces`, as offsets in the whole input.
fn ends_of(pieces: &[&[u8]]) -> Vec<usize> {
    let mut scan = EventEnds::default();
    let mut ends = Vec::new();
    let mut base = 0;
    for p in pieces {
        scan.feed(p, |e| ends.push(base + e));
        base += p.len();
    }
    ends
}

#[test]
fn event_ends_under_every_line_end() {
    let input = b"data: a\n\ndata: b\r\n\r\ndata: c\r\rid: 4\ndata: d\r\n\nx";
    let whole = ends_of(&[input]);
    let expect = |prefix: &str| prefix.len();
    assert_eq!(
        whole,
        [
            expect("data: a\n\n"),
            // The blank line's `\r` ends the event; its `\n` is the next one's first byte.
            expect("data: a\n\ndata: b\r\n\r"),
            expect("data: a\n\ndata: b\r\n\r\ndata: c\r\r"),
            expect("data: a\n\ndata: b\r\n\r\ndata: c\r\rid: 4\ndata: d\r\n\n"),
        ]
    );
    // A line's `\r\n` split across pieces is still one line end, and a blank line split from the
    // line before it still ends the event: every split into two and three pieces agrees.
    for i in 0..=input.len() {
        assert_eq!(ends_of(&[&input[..i], &input[i..]]), whole, "split at {i}");
        for j in i..=input.len() {
            assert_eq!(
                ends_of(&[&input[..i], &input[i..j], &input[j..]]),
                whole,
                "split at {i}, {j}"
            );
        }
    }
}

#[test]
fn a_crlf_line_end_is_not_two_line_ends() {
    assert!(ends_of(&[b"data: a\r\ndata: b\r\n"]).is_empty());
    assert!(ends_of(&[b"data: a\r", b"\ndata: b\r", b"\n"]).is_empty());
    assert_eq!(ends_of(&[b"data: a\r", b"\n", b"\r", b"\n"]), [10]);
}

/// The whole-piece LF path agrees with the line-by-line one on the last event end and on the
/// state it leaves, for every split of these streams in two or three.
#[test]
fn the_lf_path_matches_the_line_by_line_one() {
    let streams: [&[u8]; 6] = [
        b"data: a\n\ndata: b\n\n",
        b"event: x\ndata: {}\n\n\n\ndata: [DONE]\n\n",
        b"\n\ndata: x\n",
        b"data: partial",
        b"data: a\n\n\ndata: b\ndata: c\n\n\n",
        b"\n",
    ];
    for s in streams {
        for i in 0..=s.len() {
            for j in i..=s.len() {
                let (mut slow, mut fast) = (EventEnds::default(), EventEnds::default());
                for piece in [&s[..i], &s[i..j], &s[j..]] {
                    assert!(fast.lf_only(piece));
                    let mut want = None;
                    slow.feed(piece, |end| want = Some(end));
                    let got = fast.feed_lf_whole(piece);
                    let at = (String::from_utf8_lossy(s), i, j);
                    assert_eq!(got, want, "{at:?}");
                    assert_eq!(fast.at_event_end(), slow.at_event_end(), "{at:?}");
                    assert_eq!(fast.in_line, slow.in_line, "{at:?}");
                }
            }
        }
    }
    assert!(!EventEnds::default().lf_only(b"data: x\r\n"));
    let mut after_cr = EventEnds::default();
    after_cr.feed(b"data: x\r", |_| {});
    assert!(!after_cr.lf_only(b"\ndata: y\n"));
}
