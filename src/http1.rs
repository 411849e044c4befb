//! HTTP/1.1 wire pieces both sides of the gateway share: `transfer-encoding: chunked` de-framed in place, and what a head's framing headers say by RFC 9112's length and token rules.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName};

/// Bytes of chunk framing (a size line with its extensions, or the trailer section) allowed
/// between two runs of data: enough for any real extension, not a way to stream without data.
pub const MAX_FRAMING: usize = 16 * 1024;

/// Why a chunked body could not be de-framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ChunkError(pub &'static str);

/// One header line of a head being written.
pub fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A `content-length` value's digits as a number (none, a sign or more than 19 digits: `None`).
pub fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    )
}

/// What a head's framing headers (`content-length`, `transfer-encoding`, `connection`) say,
/// noted as its parse passes them, so that none is looked up in the map afterwards (each lookup
/// hashes its name). Each side draws its own framing from them: a request and a response are
/// delimited by different rules (RFC 9112 §6.3).
#[derive(Debug, Default)]
pub struct FramingHeaders {
    /// A `transfer-encoding` line was seen.
    pub coded: bool,
    /// The last `transfer-encoding` line's last coding is `chunked`.
    pub chunked: bool,
    /// The `content-length` lines' agreed value, or why they disagree.
    pub length: Option<Result<u64, &'static str>>,
    /// `connection` lists `close`.
    pub close: bool,
    /// `connection` lists `keep-alive`, which is what keeps an HTTP/1.0 connection open.
    pub keep_alive: bool,
}

impl FramingHeaders {
    /// Notes one header line; true when it is one of the framing headers.
    pub fn note(&mut self, name: &HeaderName, value: &[u8]) -> bool {
        if *name == header::CONTENT_LENGTH {
            self.length = Some(match self.length {
                Some(Err(e)) => Err(e),
                seen => agreed_length(value, seen.and_then(Result::ok)),
            });
        } else if *name == header::TRANSFER_ENCODING {
            self.coded = true;
            // The last line's last coding decides.
            self.chunked = ends_chunked(value);
        } else if *name == header::CONNECTION {
            self.close |= lists(value, "close");
            self.keep_alive |= lists(value, "keep-alive");
        } else {
            return false;
        }
        true
    }
}

/// The length one more `content-length` line says, beside the `seen` ones: a repeated or listed
/// length is accepted only when every value agrees (RFC 9110 §8.6). `Err` says why not.
fn agreed_length(value: &[u8], seen: Option<u64>) -> Result<u64, &'static str> {
    let mut length = seen;
    for part in members(value) {
        let n = parse_length(part).ok_or("bad content-length")?;
        if length.is_some_and(|l| l != n) {
            return Err("conflicting content-length values");
        }
        length = Some(n);
    }
    length.ok_or("bad content-length")
}

/// The comma-separated members of a header value, trimmed.
fn members(value: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii)
}

/// Whether a `transfer-encoding` line ends with `chunked`.
fn ends_chunked(value: &[u8]) -> bool {
    members(value)
        .next_back()
        .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
}

/// Whether a header value lists `token`, in any case.
fn lists(value: &[u8], token: &str) -> bool {
    members(value).any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the hex digits of a chunk size; `digits` so far.
    Size {
        value: u64,
        digits: u8,
    },
    /// After the size: whitespace, or extensions up to the line's end.
    Extension {
        value: u64,
        ext: bool,
    },
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd {
        cr: bool,
    },
    /// At the start of a trailer line, or the blank line ending the body.
    TrailerStart {
        cr: bool,
    },
    /// Inside a trailer field line.
    Trailer,
    Done,
}

/// Decodes `transfer-encoding: chunked` in place: the data of every chunk already read comes out
/// as one run, framing removed, so a read holding many small chunks (many events) is one frame.
#[derive(Debug)]
pub struct Chunked {
    state: State,
    /// Framing bytes read since the last data, against [`MAX_FRAMING`].
    framing: usize,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Size {
                value: 0,
                digits: 0,
            },
            framing: 0,
        }
    }
}

impl Chunked {
    /// True once the last chunk and the trailers are read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes what `buf` holds of the body: returns the data of every chunk in it, in order, as
    /// one run (`None` when it held only framing). Stops at the body's end, leaving any bytes
    /// after it in `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, ChunkError> {
        // Data moves down over the framing before it: [0, w) is data, [w, r) spent framing.
        let (mut r, mut w) = (0usize, 0usize);
        let bytes = &mut buf[..];
        while r < bytes.len() {
            if let State::Data(left) = self.state {
                let n = usize::try_from(left).map_or(bytes.len() - r, |l| l.min(bytes.len() - r));
                if w != r {
                    bytes.copy_within(r..r + n, w);
                }
                r += n;
                w += n;
                let left = left - n as u64;
                self.state = if left == 0 {
                    State::DataEnd { cr: false }
                } else {
                    State::Data(left)
                };
                self.framing = 0;
                continue;
            }
            // Whole size lines and data ends, the usual case, are taken at once.
            let fast = match self.state {
                State::Size { digits: 0, .. } => size_line(&bytes[r..]).map(|(size, used)| {
                    let next = if size == 0 {
                        State::TrailerStart { cr: false }
                    } else {
                        State::Data(size)
                    };
                    (next, used)
                }),
                State::DataEnd { cr: false } if bytes[r..].starts_with(b"\r\n") => Some((
                    State::Size {
                        value: 0,
                        digits: 0,
                    },
                    2,
                )),
                State::Done => break,
                _ => None,
            };
            if let Some((next, used)) = fast {
                r += used;
                self.framing += used;
                self.state = next;
                continue;
            }
            let b = bytes[r];
            r += 1;
            self.framing += 1;
            if self.framing > MAX_FRAMING {
                return Err(ChunkError("too many bytes of chunk framing"));
            }
            self.state = step(self.state, b)?;
        }
        if w == 0 {
            buf.advance(r);
            return Ok(None);
        }
        let mut data = buf.split_to(r);
        data.truncate(w);
        Ok(Some(data.freeze()))
    }
}

/// A chunk-size line with no extension, whole at the start of `bytes`: the size and the line's
/// length. `None` leaves the line to the byte-by-byte path.
fn size_line(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(17) {
        match hex(b) {
            Some(d) if i < 16 => value = value << 4 | u64::from(d),
            Some(_) => return None,
            None if i > 0 && b == b'\r' && bytes.get(i + 1) == Some(&b'\n') => {
                return Some((value, i + 2))
            }
            None => return None,
        }
    }
    None
}

/// One framing byte.
fn step(state: State, b: u8) -> Result<State, ChunkError> {
    Ok(match state {
        State::Size { value, digits } => match hex(b) {
            Some(d) if digits < 16 => State::Size {
                value: value << 4 | u64::from(d),
                digits: digits + 1,
            },
            Some(_) => return Err(ChunkError("chunk size too large")),
            None if digits == 0 => return Err(ChunkError("chunk size is not hexadecimal")),
            None => return extension(value, false, b),
        },
        State::Extension { value, ext } => return extension(value, ext, b),
        State::DataEnd { cr: false } if b == b'\r' => State::DataEnd { cr: true },
        State::DataEnd { .. } if b == b'\n' => State::Size {
            value: 0,
            digits: 0,
        },
        State::DataEnd { .. } => return Err(ChunkError("chunk data not followed by CRLF")),
        State::TrailerStart { cr: false } if b == b'\r' => State::TrailerStart { cr: true },
        State::TrailerStart { .. } if b == b'\n' => State::Done,
        State::TrailerStart { cr: true } => return Err(ChunkError("bare CR in the trailers")),
        State::TrailerStart { cr: false } | State::Trailer if b == b'\n' => {
            State::TrailerStart { cr: false }
        }
        State::TrailerStart { cr: false } | State::Trailer => State::Trailer,
        State::Data(_) | State::Done => state,
    })
}

/// A byte after a chunk size: whitespace and `;` extensions are skipped to the line's end.
fn extension(value: u64, ext: bool, b: u8) -> Result<State, ChunkError> {
    Ok(match b {
        b'\n' if value == 0 => State::TrailerStart { cr: false },
        b'\n' => State::Data(value),
        b'\r' => State::Extension { value, ext },
        b';' => State::Extension { value, ext: true },
        b' ' | b'\t' => State::Extension { value, ext },
        _ if ext && b != 0 => State::Extension { value, ext },
        _ => return Err(ChunkError("bad character after a chunk size")),
    })
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn decode_all(input: &[u8], splits: &[usize]) -> Result<(Vec<u8>, bool, Vec<u8>), ChunkError> {
        let mut dec = Chunked::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut at = 0;
        for &end in splits.iter().chain(std::iter::once(&input.len())) {
            buf.extend_from_slice(&input[at..end]);
            at = end;
            if let Some(d) = dec.decode(&mut buf)? {
                out.extend_from_slice(&d);
            }
        }
        Ok((out, dec.is_done(), buf.to_vec()))
    }

    fn noted(lines: &[(&str, &str)]) -> (FramingHeaders, Vec<bool>) {
        let mut seen = FramingHeaders::default();
        let framing = lines
            .iter()
            .map(|(n, v)| seen.note(&HeaderName::from_bytes(n.as_bytes()).unwrap(), v.as_bytes()))
            .collect();
        (seen, framing)
    }

    #[test]
    fn framing_headers_are_noted_by_their_lists_and_lengths_must_agree() {
        let (seen, framing) = noted(&[
            ("content-type", "text/event-stream"),
            ("content-length", "12, 12"),
            ("content-length", "12"),
            ("connection", "Keep-Alive, upgrade"),
            ("Transfer-Encoding", "gzip, Chunked"),
        ]);
        assert_eq!(framing, [false, true, true, true, true]);
        assert_eq!(seen.length, Some(Ok(12)));
        assert!(seen.keep_alive && !seen.close);
        assert!(seen.coded && seen.chunked);
        // Only the last line's last coding decides.
        let (seen, _) = noted(&[
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "gzip"),
        ]);
        assert!(seen.coded && !seen.chunked);
        // A disagreement stays one, whatever agrees after it.
        let (seen, _) = noted(&[
            ("content-length", "3"),
            ("content-length", "4"),
            ("content-length", "4"),
            ("connection", "close"),
        ]);
        assert_eq!(seen.length, Some(Err("conflicting content-length values")));
        assert!(seen.close && !seen.keep_alive);
        let (seen, _) = noted(&[("content-length", "+3")]);
        assert_eq!(seen.length, Some(Err("bad content-length")));
    }

    const BODY: &[u8] =
        b"5\r\nhello\r\n1;name=value\r\n \r\nA  \r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";

    #[test]
    fn every_split_in_three_decodes_as_the_whole() {
        let whole = decode_all(BODY, &[]).unwrap();
        assert_eq!(whole.0, b"hello 0123456789");
        assert!(whole.1);
        assert_eq!(whole.2, b"NEXT");
        for i in 0..=BODY.len() {
            for j in i..=BODY.len() {
                let got = decode_all(BODY, &[i, j]).unwrap();
                assert_eq!(got, whole, "split at {i} and {j}");
            }
        }
    }

    #[test]
    fn a_read_of_many_chunks_is_one_run_of_data() {
        let mut dec = Chunked::default();
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n3\r\ndef\r\n2\r\ngh"[..]);
        let data = dec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(&data[..], b"abcdefgh");
        assert!(buf.is_empty());
        assert!(!dec.is_done());
    }

    #[test]
    fn bare_lf_line_ends_are_accepted() {
        let (data, done, rest) = decode_all(b"3\nabc\n0\n\n", &[]).unwrap();
        assert_eq!(
            (data.as_slice(), done, rest.as_slice()),
            (&b"abc"[..], true, &b""[..])
        );
    }

    #[test]
    fn malformed_framing_is_an_error() {
        for bad in [
            &b"g\r\n"[..],
            b"\r\n",
            b"3\r\nabcX\r\n",
            b"3x\r\n",
            b"11111111111111111\r\n",
            b"0\r\n\rX",
        ] {
            assert!(
                decode_all(bad, &[]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let endless = [b"1;".as_slice(), &vec![b'x'; MAX_FRAMING + 10]].concat();
        assert!(matches!(
            decode_all(&endless, &[]),
            Err(ChunkError("too many bytes of chunk framing"))
        ));
    }
}
