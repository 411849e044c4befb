//! Byte ranges of downloads (RFC 9110 §14): one `Range` read, `If-Range` weighed (§13.1.5), the 206 and 416 answers, and a body cut to a range.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::body::{self, Body, BoxError};

/// One byte range a client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    /// `bytes=a-b` (`last` given) or `bytes=a-`.
    From { first: u64, last: Option<u64> },
    /// `bytes=-n`: the last n bytes.
    Suffix(u64),
}

/// The one range of `headers`, if it asks for exactly one.
///
/// A missing header, another unit, several ranges and anything malformed all mean "the whole
/// file" (RFC 9110 §14.2 lets a server ignore `Range`); several ranges would need a
/// `multipart/byteranges` answer, which video players never ask for.
pub fn parse(headers: &HeaderMap) -> Option<Spec> {
    let mut values = headers.get_all(header::RANGE).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let text = value.to_str().ok()?.trim();
    let (unit, set) = text.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") || set.contains(',') {
        return None;
    }
    let (a, b) = set.trim().split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    match (a.is_empty(), b.is_empty()) {
        (true, false) => Some(Spec::Suffix(number(b)?)),
        (false, true) => Some(Spec::From {
            first: number(a)?,
            last: None,
        }),
        (false, false) => {
            let (first, last) = (number(a)?, number(b)?);
            // `last < first` is an invalid range, not an unsatisfiable one: ignored.
            (last >= first).then_some(Spec::From {
                first,
                last: Some(last),
            })
        }
        (true, true) => None,
    }
}

impl Spec {
    /// The first and last byte within a file of `len` bytes; `None` when unsatisfiable.
    pub fn resolve(self, len: u64) -> Option<(u64, u64)> {
        match self {
            Self::From { first, last } => {
                if first >= len {
                    return None;
                }
                Some((first, last.map_or(len - 1, |l| l.min(len - 1))))
            }
            Self::Suffix(n) => (n > 0 && len > 0).then(|| (len.saturating_sub(n), len - 1)),
        }
    }

    /// The `Range` value that asks an upstream for the same bytes.
    pub fn header(self) -> HeaderValue {
        let text = match self {
            Self::From {
                first,
                last: Some(last),
            } => format!("bytes={first}-{last}"),
            Self::From { first, last: None } => format!("bytes={first}-"),
            Self::Suffix(n) => format!("bytes=-{n}"),
        };
        HeaderValue::try_from(text).unwrap_or(HeaderValue::from_static("bytes=0-"))
    }
}

/// Whether an `If-Range` value can never hold: a weak entity-tag (the comparison is strong) or
/// text that is neither an entity-tag nor a date.
pub fn never_holds(if_range: &HeaderValue) -> bool {
    match if_range.to_str() {
        Ok(text) => {
            let text = text.trim();
            text.is_empty() || text.starts_with("W/")
        }
        Err(_) => true,
    }
}

/// Whether a range may be served under the client's `If-Range` (RFC 9110 §13.1.5), given the
/// validators of the file as it is now: an entity-tag holds when it is strongly equal to `etag`,
/// a date when it is exactly `last_modified`. Without `If-Range` it holds.
///
/// When it does not hold, the client's partial copy is of other bytes: it gets the whole file.
pub fn if_range_holds(
    if_range: Option<&HeaderValue>,
    etag: Option<&HeaderValue>,
    last_modified: Option<&HeaderValue>,
) -> bool {
    let Some(wanted) = if_range else {
        return true;
    };
    if never_holds(wanted) {
        return false;
    }
    let text = |v: &HeaderValue| v.to_str().ok().map(str::trim).map(str::to_owned);
    let Some(wanted) = text(wanted) else {
        return false;
    };
    // An entity-tag starts with a quote (or `W/`); anything else is an HTTP-date.
    if wanted.starts_with('"') {
        etag.and_then(text)
            .is_some_and(|tag| !tag.starts_with("W/") && tag == wanted)
    } else {
        last_modified
            .and_then(text)
            .is_some_and(|date| date == wanted)
    }
}

/// `Content-Range: bytes first-last/len` of an upstream's 206, checked.
pub fn parse_content_range(value: &HeaderValue) -> Option<(u64, u64, Option<u64>)> {
    let rest = value.to_str().ok()?.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (first, last): (u64, u64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse::<u64>().ok()?),
    };
    (last >= first && total.is_none_or(|t| last < t)).then_some((first, last, total))
}

/// The complete length in an upstream's `Content-Range: bytes */len` (a 416) or `bytes a-b/len`.
pub fn complete_length(value: &HeaderValue) -> Option<u64> {
    value.to_str().ok()?.rsplit_once('/')?.1.trim().parse().ok()
}

/// Marks a response as a partial one: 206, `Content-Range`, `Accept-Ranges`.
pub fn mark_partial(resp: &mut Response<Body>, first: u64, last: u64, len: Option<u64>) {
    *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
    let total = len.map_or_else(|| "*".to_owned(), |l| l.to_string());
    if let Ok(v) = HeaderValue::try_from(format!("bytes {first}-{last}/{total}")) {
        resp.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    resp.headers_mut()
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
}

/// 416 with `Content-Range: bytes */len`, in the video envelope.
pub fn unsatisfiable(len: Option<u64>) -> Response<Body> {
    let body = format!(
        "{{\"code\":100416,\"msg\":\"RANGE_NOT_SATISFIABLE: the range asks for bytes the file does not have{}\",\"data\":null}}",
        len.map_or_else(String::new, |l| format!(" (it has {l})"))
    );
    let mut resp = Response::new(body::full(Bytes::from(body)));
    *resp.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let total = len.map_or_else(|| "*".to_owned(), |l| l.to_string());
    if let Ok(v) = HeaderValue::try_from(format!("bytes */{total}")) {
        h.insert(header::CONTENT_RANGE, v);
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    resp
}

pin_project! {
    /// The bytes `first..=last` of the inner body; the rest is read past or never read.
    pub struct Slice<B> {
        #[pin]
        inner: B,
        skip: u64,
        remaining: u64,
    }
}

impl<B> Slice<B> {
    pub fn new(inner: B, first: u64, last: u64) -> Self {
        Self {
            inner,
            skip: first,
            remaining: last - first + 1,
        }
    }
}

impl<B> HttpBody for Slice<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if *this.remaining == 0 {
                return Poll::Ready(None);
            }
            let frame = match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    // Fewer bytes than the length the headers promised: the client must see a failure.
                    return Poll::Ready(Some(Err(
                        "the file ended before the requested range".into()
                    )));
                }
            };
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            let len = data.len() as u64;
            if *this.skip >= len {
                *this.skip -= len;
                continue;
            }
            // Both fit in usize: each is at most `data.len()`.
            let start = usize::try_from(*this.skip).unwrap_or(data.len());
            *this.skip = 0;
            data = data.slice(start..);
            if data.len() as u64 > *this.remaining {
                data.truncate(usize::try_from(*this.remaining).unwrap_or(data.len()));
            }
            *this.remaining -= data.len() as u64;
            if !data.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    fn spec(v: &str) -> Option<Spec> {
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, HeaderValue::from_str(v).unwrap());
        parse(&h)
    }

    #[test]
    fn ranges_parse_and_resolve() {
        assert_eq!(
            spec("bytes=0-99"),
            Some(Spec::From {
                first: 0,
                last: Some(99)
            })
        );
        assert_eq!(
            spec("bytes=5-"),
            Some(Spec::From {
                first: 5,
                last: None
            })
        );
        assert_eq!(spec("bytes=-10"), Some(Spec::Suffix(10)));
        for ignored in [
            "bytes=0-1,5-6",
            "items=0-1",
            "bytes=9-3",
            "bytes=-",
            "bytes=a-b",
            "bytes=+1-2",
        ] {
            assert_eq!(spec(ignored), None, "{ignored}");
        }
        let len = 100;
        assert_eq!(spec("bytes=0-99").unwrap().resolve(len), Some((0, 99)));
        assert_eq!(spec("bytes=90-500").unwrap().resolve(len), Some((90, 99)));
        assert_eq!(spec("bytes=-10").unwrap().resolve(len), Some((90, 99)));
        assert_eq!(spec("bytes=-500").unwrap().resolve(len), Some((0, 99)));
        assert_eq!(spec("bytes=100-").unwrap().resolve(len), None);
        assert_eq!(spec("bytes=-0").unwrap().resolve(len), None);
        assert_eq!(spec("bytes=0-").unwrap().resolve(0), None);
        assert_eq!(
            parse_content_range(&HeaderValue::from_static("bytes 10-19/100")),
            Some((10, 19, Some(100)))
        );
        assert_eq!(
            parse_content_range(&HeaderValue::from_static("bytes 10-200/100")),
            None
        );
        assert_eq!(
            complete_length(&HeaderValue::from_static("bytes */100")),
            Some(100)
        );
    }

    #[test]
    fn if_range_compares_strongly() {
        let v = HeaderValue::from_static;
        let tag = Some(v("\"abc\""));
        let date = Some(v("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert!(if_range_holds(None, None, None));
        assert!(if_range_holds(Some(&v("\"abc\"")), tag.as_ref(), None));
        assert!(!if_range_holds(Some(&v("\"abd\"")), tag.as_ref(), None));
        assert!(!if_range_holds(Some(&v("W/\"abc\"")), tag.as_ref(), None));
        assert!(!if_range_holds(
            Some(&v("\"abc\"")),
            Some(&v("W/\"abc\"")),
            None
        ));
        assert!(!if_range_holds(Some(&v("\"abc\"")), None, date.as_ref()));
        assert!(if_range_holds(
            Some(&v("Wed, 21 Oct 2015 07:28:00 GMT")),
            tag.as_ref(),
            date.as_ref()
        ));
        assert!(!if_range_holds(
            Some(&v("Wed, 21 Oct 2015 07:28:01 GMT")),
            tag.as_ref(),
            date.as_ref()
        ));
        assert!(!if_range_holds(
            Some(&v("Wed, 21 Oct 2015 07:28:00 GMT")),
            tag.as_ref(),
            None
        ));
    }

    #[tokio::test]
    async fn slices_cut_across_frames() {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = [&b"abc"[..], b"defg", b"hij"]
            .into_iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c))))
            .collect();
        let body = Slice::new(StreamBody::new(futures_util::stream::iter(frames)), 2, 7);
        assert_eq!(body.size_hint().exact(), Some(6));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"cdefgh");
    }
}
