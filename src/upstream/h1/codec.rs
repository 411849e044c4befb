//! The client side of HTTP/1.1 on the wire: request heads written straight to bytes, response heads parsed, and response bodies de-framed in place.

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use smallvec::SmallVec;

pub use crate::http1::Chunked;
use crate::http1::{header_line as line, ChunkError, FramingHeaders};

/// The largest response head accepted, as hyper's default read limit allows.
pub const MAX_HEAD: usize = 64 * 1024;
/// Headers in one response head.
const MAX_HEADERS: usize = 128;

/// Why an upstream's response could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the upstream's response head is malformed: {0}")]
    Head(&'static str),
    #[error("the upstream's response head is larger than {} KiB", MAX_HEAD / 1024)]
    HeadTooLarge,
    #[error("the upstream's chunked body is malformed: {0}")]
    Chunk(&'static str),
    #[error("the upstream closed the connection before the end of its response")]
    Incomplete,
    #[error("upstream connection: {0}")]
    Io(#[from] std::io::Error),
}

impl From<ChunkError> for Error {
    fn from(e: ChunkError) -> Self {
        Error::Chunk(e.0)
    }
}

/// Takes a request's headers one by one, as [`write_head`] asks for them.
pub type Emit<'e> = dyn FnMut(&HeaderName, &HeaderValue) + 'e;

/// Writes a request head: the request line, `Host` unless the headers carry one, the headers
/// `headers` hands to its emitter (their own framing headers dropped), and the body's
/// `content-length`. GET and HEAD without a body send none, as clients do.
pub fn write_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    host: &HeaderValue,
    headers: impl FnOnce(&mut Emit<'_>),
    body_len: usize,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    // `Host` goes first, as clients send it; taken out again in the rare case the headers
    // bring their own.
    let host_at = out.len();
    line(out, b"host", host.as_bytes());
    let host_end = out.len();
    let mut own_host = false;
    headers(&mut |name, value| {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            return;
        }
        own_host |= name == header::HOST;
        line(out, name.as_str().as_bytes(), value.as_bytes());
    });
    if own_host {
        out.drain(host_at..host_end);
    }
    if body_len > 0 || !(method == Method::GET || method == Method::HEAD) {
        let mut digits = itoa::Buffer::new();
        line(out, b"content-length", digits.format(body_len).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// Hands every header of `map` to an emitter, for [`write_head`].
pub fn map_headers(map: &HeaderMap) -> impl FnOnce(&mut Emit<'_>) + '_ {
    move |emit| {
        for (name, value) in map {
            emit(name, value);
        }
    }
}

/// How a response's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes follow (zero for HEAD, 204, 304).
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Everything until the upstream closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request once this response is read.
    pub keep_alive: bool,
}

/// Which of a response's headers [`parse_head`] puts in the head's map.
#[derive(Debug, Clone, Copy)]
pub enum Keep {
    /// Every header: the caller reads the head.
    All,
    /// These (lower-case names) and the framing headers reading the body needs; the rest are
    /// skipped before they are made names and values. An API upstream sends a score of headers
    /// (rate limits, tracing, cookies) that never reach a client.
    Only(&'static [&'static str]),
}

/// The headers that say how a body is delimited and whether the connection stays open.
const FRAMING_NAMES: [&str; 3] = ["content-length", "transfer-encoding", "connection"];

impl Keep {
    fn wants(self, name: &str) -> bool {
        match self {
            Keep::All => true,
            Keep::Only(names) => FRAMING_NAMES
                .iter()
                .chain(names)
                .any(|n| n.eq_ignore_ascii_case(name)),
        }
    }
}

/// Parses the response head at the start of `buf` and removes it from `buf`, with the headers
/// `keep` asks for. `Ok(None)`: the head is not complete yet. Header values share the head's bytes
/// rather than being copied.
pub fn parse_head(buf: &mut BytesMut, method: &Method, keep: Keep) -> Result<Option<Head>, Error> {
    // Uninitialised slots: zeroing 128 of them cost more than parsing a typical head.
    let mut slots =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, &mut slots);
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(Error::HeadTooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Error::Head("too many headers")),
        Err(_) => return Err(Error::Head("not an HTTP/1.x response")),
    };
    if len > MAX_HEAD {
        return Err(Error::HeadTooLarge);
    }
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(Error::Head("bad status code"))?;
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Offsets, so the values can be cut from the head once it is frozen.
    let base = buf.as_ptr() as usize;
    // On the stack for a usual head.
    let mut spans: SmallVec<[(HeaderName, usize, usize); 16]> = SmallVec::new();
    // The framing headers are read on the way, so that none is looked up in the map after (each
    // lookup hashes its name); for a client's answer they stay out of the map, whose headers
    // all go on to the client, and these never may.
    let mut seen = FramingHeaders::default();
    let own = matches!(keep, Keep::All);
    for h in resp.headers.iter().filter(|h| keep.wants(h.name)) {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| Error::Head("bad header name"))?;
        if seen.note(&name, h.value) && !own {
            continue;
        }
        let start = h.value.as_ptr() as usize - base;
        spans.push((name, start, start + h.value.len()));
    }
    let raw = buf.split_to(len).freeze();
    // Room for the headers the gateway adds to an answer it passes on (`x-request-id`,
    // `x-modelgate-upstream`, `x-modelgate-attempts`, the upstream's request id): the map is
    // kept for the client's response, and growing it then would allocate twice more.
    let mut headers = HeaderMap::with_capacity(spans.len() + 4);
    // Drained in place: `into_iter` would first move the whole inline array (768 bytes).
    for (name, start, end) in spans.drain(..) {
        let value = HeaderValue::from_maybe_shared(raw.slice(start..end))
            .map_err(|_| Error::Head("bad header value"))?;
        headers.append(name, value);
    }
    let (framing, keep_alive) = framing(&seen, status, method)?;
    Ok(Some(Head {
        status,
        version,
        headers,
        framing,
        keep_alive: keep_alive && version == Version::HTTP_11 && !seen.close,
    }))
}

/// A response body's framing, and false when it leaves the connection unusable afterwards.
fn framing(
    seen: &FramingHeaders,
    status: StatusCode,
    method: &Method,
) -> Result<(Framing, bool), Error> {
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Length(0), true));
    }
    if seen.coded {
        // With a content-length beside it, a message is a smuggling attempt or a broken
        // server: read as the transfer coding says (RFC 9112 §6.3), then close.
        return Ok(if seen.chunked {
            (Framing::Chunked, seen.length.is_none())
        } else {
            (Framing::Close, false)
        });
    }
    Ok(match seen.length {
        Some(Ok(n)) => (Framing::Length(n), true),
        Some(Err(e)) => return Err(Error::Head(e)),
        None => (Framing::Close, false),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn head(raw: &str, method: Method) -> Result<Option<Head>, Error> {
        parse_head(&mut BytesMut::from(raw.as_bytes()), &method, Keep::All)
    }

    #[test]
    fn a_head_read_for_a_client_keeps_the_named_and_the_framing_headers_whatever_their_case() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nSet-Cookie: s=1\r\n\
                   X-RateLimit-Remaining-Requests: 4999\r\nTransfer-Encoding: chunked\r\n\
                   X-Request-Id: req_up\r\nConnection: close\r\nopenai-processing-ms: 12\r\n\r\n";
        let only = Keep::Only(&["content-type", "x-request-id", "retry-after"]);
        let forwarded = parse_head(&mut BytesMut::from(raw), &Method::POST, only)
            .unwrap()
            .unwrap();
        let mut names: Vec<&str> = forwarded.headers.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        // The framing headers are read, and left out of a map whose headers go to a client.
        assert_eq!(names, ["content-type", "x-request-id"]);
        assert_eq!(forwarded.headers["x-request-id"], "req_up");
        let all = head(raw, Method::POST).unwrap().unwrap();
        assert_eq!(all.headers.len(), 7);
        // The body is read the same either way.
        assert_eq!(
            (forwarded.framing, forwarded.keep_alive),
            (all.framing, all.keep_alive)
        );
        assert_eq!((all.framing, all.keep_alive), (Framing::Chunked, false));
        // Left out of the map, the framing headers are still read and checked.
        let length = "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n";
        let r = parse_head(&mut BytesMut::from(length), &Method::POST, only)
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.framing, r.keep_alive, r.headers.len()),
            (Framing::Length(12), true, 0)
        );
        let conflicting = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n";
        assert!(parse_head(&mut BytesMut::from(conflicting), &Method::POST, only).is_err());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = |raw: &str| head(raw, Method::POST).unwrap().unwrap();
        let r = h("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Length(12), true));
        let r = h("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Chunked, true));
        let r = h("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Chunked, false));
        let r = h("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Close, false));
        let r = h("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Close, false));
        let r = h("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n");
        assert_eq!((r.framing, r.keep_alive), (Framing::Length(2), false));
        let r = h("HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 2\r\n\r\n");
        assert!(!r.keep_alive);
        let r = h("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n");
        assert_eq!(r.framing, Framing::Length(0));
        let r = h("HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\ncontent-length: 5\r\n\r\n");
        assert_eq!(r.framing, Framing::Length(5));
        let r = head("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", Method::HEAD)
            .unwrap()
            .unwrap();
        assert_eq!(r.framing, Framing::Length(0));
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            "HTTP/2 200 OK\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(head(bad, Method::POST).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_head_is_taken_from_the_buffer_and_keeps_its_values() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nX-Two: a\r\nx-two: b\r\n\r\nbody"[..],
        );
        assert!(
            parse_head(&mut BytesMut::from(&buf[..20]), &Method::POST, Keep::All)
                .unwrap()
                .is_none()
        );
        let h = parse_head(&mut buf, &Method::POST, Keep::All)
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(h.headers["retry-after"], "7");
        let two: Vec<_> = h.headers.get_all("x-two").iter().collect();
        assert_eq!(two, ["a", "b"]);
        assert_eq!(&buf[..], b"body");
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "y".repeat(MAX_HEAD));
        assert!(matches!(
            head(&huge, Method::POST),
            Err(Error::HeadTooLarge)
        ));
    }

    #[test]
    fn a_request_head_carries_host_headers_and_length() {
        let mut headers = HeaderMap::new();
        headers.insert("x-request-id", HeaderValue::from_static("r1"));
        headers.insert("content-length", HeaderValue::from_static("999"));
        let mut out = Vec::new();
        let host = HeaderValue::from_static("up:8080");
        write_head(
            &mut out,
            &Method::POST,
            "/v1/x?y=1",
            &host,
            map_headers(&headers),
            12,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/x?y=1 HTTP/1.1\r\nhost: up:8080\r\nx-request-id: r1\r\ncontent-length: 12\r\n\r\n"
        );
        let mut out = Vec::new();
        write_head(
            &mut out,
            &Method::GET,
            "/",
            &host,
            map_headers(&HeaderMap::new()),
            0,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.1\r\nhost: up:8080\r\n\r\n"
        );
        // A `Host` of the request's own replaces the authority's, and stays the only one.
        headers.insert("host", HeaderValue::from_static("virtual.example"));
        let mut out = Vec::new();
        write_head(
            &mut out,
            &Method::POST,
            "/",
            &host,
            map_headers(&headers),
            0,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST / HTTP/1.1\r\nx-request-id: r1\r\nhost: virtual.example\r\ncontent-length: 0\r\n\r\n"
        );
    }
}
