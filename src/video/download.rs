//! `GET /v1/files/{fileId}`: a signed, expiring download, streamed chunk by chunk from where the file lives, with the upstream's credential; ranges, `If-Range` and the file's validators (`ETag`, `Last-Modified`).

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::upstream::UpstreamIncoming;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use sha2::{Digest, Sha256};

use crate::body::{Body, BoxError};
use crate::config::Upstream;
use crate::error::{ErrorKind, GatewayError};
use crate::gateway::Services;
use crate::upstream;
use crate::video::call::{self, Failure};
use crate::video::inline::{DecodeBody, Part, Scanner};
use crate::video::range::{self, Slice, Spec};
use crate::video::token::FileSource;
use crate::video::{mock, veo};

/// Redirects followed for one download (Gemini's file download answers with one).
const MAX_REDIRECTS: usize = 5;

/// What a download request asks for besides the file.
#[derive(Clone, Debug)]
pub struct Want {
    /// `HEAD`: the headers only.
    pub head: bool,
    /// One byte range (`Range`); `None` is the whole file.
    pub range: Option<Spec>,
    /// The client's `If-Range`, kept only with a range.
    pub if_range: Option<HeaderValue>,
    /// The strong ETag of this file id, sent when the source has none of its own.
    pub tag: HeaderValue,
}

/// A strong ETag for the file behind `file_id`: the bytes a file id names never change, so a
/// tag derived from it lets a browser resume with `If-Range` whatever the source says.
pub fn file_tag(file_id: &str) -> HeaderValue {
    let digest = Sha256::digest(file_id.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    HeaderValue::try_from(format!("\"{hex}\"")).unwrap_or(HeaderValue::from_static("\"file\""))
}

/// Streams the file `source` names; `upstream` is the one it names (none for the mock).
pub async fn serve(
    gw: &Services,
    upstream: Option<&Upstream>,
    source: &FileSource,
    gcs_api_url: &str,
    request_id: &HeaderValue,
    mut want: Want,
) -> Result<Response<Body>, Failure> {
    if want.range.is_none() || want.if_range.as_ref().is_some_and(range::never_holds) {
        // If-Range means nothing without a range, and a weak tag never matches: then the whole
        // file, as if no range had been asked for.
        want.range = None;
        want.if_range = None;
    }
    let resp = match (source, upstream) {
        (FileSource::Mock, _) => whole(Bytes::from_static(mock::MP4), "video/mp4", &want),
        (_, None) => {
            return Err(gone(
                "the upstream that made this file is no longer configured",
            ))
        }
        (FileSource::Gcs { bucket, object, .. }, Some(upstream)) => {
            // The JSON API's media download: the object name is one encoded path segment.
            let url = format!(
                "{gcs_api_url}/storage/v1/b/{}/o/{}?alt=media",
                call::encode_component(bucket),
                call::encode_component(object)
            );
            let uri: Uri = url.parse().map_err(|e| call::bad_url(upstream, e))?;
            remote(gw, upstream, uri, true, request_id, &want).await?
        }
        (FileSource::Remote { uri, .. }, Some(upstream)) => {
            let uri: Uri = uri.parse().map_err(|e| call::bad_url(upstream, e))?;
            // The key goes only where the upstream itself lives.
            let same_origin = upstream
                .base_url
                .as_ref()
                .and_then(|b| b.text.parse::<Uri>().ok())
                .is_some_and(|b| origin(&b) == origin(&uri));
            remote(gw, upstream, uri, same_origin, request_id, &want).await?
        }
        (
            FileSource::Inline {
                model,
                reference,
                mime,
                ..
            },
            Some(upstream),
        ) => inline(gw, upstream, model, reference, mime, request_id, &want).await?,
    };
    Ok(if want.head { head_only(resp) } else { resp })
}

/// A file an upstream serves (Cloud Storage, a file URI): the range and `If-Range` forwarded,
/// and the file fetched again whole when the upstream sent a range `If-Range` rules out.
async fn remote(
    gw: &Services,
    upstream: &Upstream,
    uri: Uri,
    credential: bool,
    request_id: &HeaderValue,
    want: &Want,
) -> Result<Response<Body>, Failure> {
    // The gateway's own tag means nothing to the upstream (it had no tag of its own): weighed here.
    let if_range = want.if_range.as_ref().filter(|v| **v != want.tag);
    let ask = want.range.map(|r| (r, if_range));
    let resp = fetch(gw, upstream, uri.clone(), credential, request_id, ask).await?;
    match relay(gw, upstream, resp, want).await? {
        Relayed::Sent(resp) => Ok(resp),
        Relayed::Changed => {
            let whole = Want {
                range: None,
                if_range: None,
                ..want.clone()
            };
            let resp = fetch(gw, upstream, uri, credential, request_id, None).await?;
            match relay(gw, upstream, resp, &whole).await? {
                Relayed::Sent(resp) => Ok(resp),
                // Only an answer to a range is ever `Changed`; this request had none.
                Relayed::Changed => Err(GatewayError::new(
                    ErrorKind::Internal,
                    "a download without a range was taken for a range",
                )
                .into()),
            }
        }
    }
}

/// The answer to a `HEAD`: the same head, no body, the length the body would have had.
fn head_only(resp: Response<Body>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    if let Some(n) = body.size_hint().exact() {
        parts
            .headers
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(n));
    }
    // Dropping the body drops the upstream's: nothing more is read.
    drop(body);
    Response::from_parts(parts, crate::boxed::empty())
}

/// A file the gateway holds whole: 200, or the range of it.
fn whole(bytes: Bytes, content_type: &'static str, want: &Want) -> Response<Body> {
    let len = bytes.len() as u64;
    let range = want
        .range
        .filter(|_| range::if_range_holds(want.if_range.as_ref(), Some(&want.tag), None));
    let (body, span) = match range.map(|r| r.resolve(len)) {
        None => (bytes, None),
        Some(None) => return range::unsatisfiable(Some(len)),
        // Both ends lie inside `bytes`, whose length fits in usize.
        Some(Some((first, last))) => (
            bytes.slice(first as usize..=last as usize),
            Some((first, last)),
        ),
    };
    let mut resp = Response::new(crate::boxed::full(body));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    resp.headers_mut().insert(header::ETAG, want.tag.clone());
    if let Some((first, last)) = span {
        range::mark_partial(&mut resp, first, last, Some(len));
    }
    resp
}

fn gone(why: &str) -> Failure {
    GatewayError::new(ErrorKind::NotFound, why.to_owned()).into()
}

fn origin(uri: &Uri) -> (Option<&str>, Option<&str>) {
    (
        uri.scheme_str(),
        uri.authority().map(http::uri::Authority::as_str),
    )
}

/// GET `uri`, following redirects; the credential is dropped as soon as a hop leaves the origin.
async fn fetch(
    gw: &Services,
    upstream: &Upstream,
    mut uri: Uri,
    mut credential: bool,
    request_id: &HeaderValue,
    range: Option<(Spec, Option<&HeaderValue>)>,
) -> Result<Response<UpstreamIncoming>, Failure> {
    for _ in 0..=MAX_REDIRECTS {
        let mut req = upstream::build_call(
            upstream,
            Method::GET,
            uri.clone(),
            request_id,
            None,
            credential,
        );
        if credential {
            call::authorize(gw, upstream, &mut req).await?;
        }
        if let Some((r, if_range)) = range {
            req.headers_mut().insert(header::RANGE, r.header());
            if let Some(v) = if_range {
                req.headers_mut().insert(header::IF_RANGE, v.clone());
            }
        }
        let resp = call::send(gw, upstream, req).await?;
        let redirect = matches!(resp.status().as_u16(), 301 | 302 | 303 | 307 | 308);
        let location = resp
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok());
        let Some(location) = location.filter(|_| redirect) else {
            return Ok(resp);
        };
        let next = resolve(&uri, location).ok_or_else(|| {
            Failure::from(GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!(
                    "upstream {:?} redirected to an unusable address",
                    upstream.name
                ),
            ))
        })?;
        credential = credential && origin(&next) == origin(&uri);
        uri = next;
    }
    Err(GatewayError::new(
        ErrorKind::UpstreamBadResponse,
        format!(
            "upstream {:?} redirected more than {MAX_REDIRECTS} times",
            upstream.name
        ),
    )
    .into())
}

/// A `Location` value made absolute against the address that answered with it.
fn resolve(base: &Uri, location: &str) -> Option<Uri> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return location.parse().ok();
    }
    if location.starts_with('/') && !location.starts_with("//") {
        return format!("{}://{}{location}", base.scheme_str()?, base.authority()?)
            .parse()
            .ok();
    }
    None
}

/// What [`relay`] made of the upstream's answer.
enum Relayed {
    Sent(Response<Body>),
    /// The upstream sent the range, but `If-Range` does not hold for what it sent (it ignored
    /// the condition): the client must get the whole file, which takes another request.
    Changed,
}

/// Sends the upstream's bytes on as they come; its failure status becomes the client's error first.
///
/// With a range: an upstream's 206 goes on as it is; a 200 that ignored the range is cut to it
/// here when its length is known, and sent whole otherwise (a server may ignore `Range`). Either
/// way `If-Range` is weighed against the validators the upstream answered with, so a file that
/// changed is sent whole. The upstream's `ETag` and `Last-Modified` go to the client; without an
/// `ETag`, the file id's own.
async fn relay(
    gw: &Services,
    upstream: &Upstream,
    resp: Response<UpstreamIncoming>,
    want: &Want,
) -> Result<Relayed, Failure> {
    let (parts, body) = resp.into_parts();
    let range = want.range;
    if parts.status == StatusCode::RANGE_NOT_SATISFIABLE && range.is_some() {
        let len = parts
            .headers
            .get(header::CONTENT_RANGE)
            .and_then(range::complete_length);
        return Ok(Relayed::Sent(range::unsatisfiable(len)));
    }
    if !parts.status.is_success() {
        let bytes = call::read(gw, upstream, body).await?;
        return Err(veo::check_download_status(
            upstream,
            parts.status,
            &parts.headers,
            &bytes,
        ));
    }
    if parts.status == StatusCode::PARTIAL_CONTENT && range.is_none() {
        // A 206 nobody asked for (a broken upstream) is not passed on as a whole file.
        return Err(GatewayError::new(
            ErrorKind::UpstreamBadResponse,
            format!(
                "upstream {:?} answered 206 to a request without a range",
                upstream.name
            ),
        )
        .into());
    }
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .filter(|v| !v.as_bytes().starts_with(b"application/json"))
        .cloned()
        .unwrap_or(HeaderValue::from_static("video/mp4"));
    let etag = parts
        .headers
        .get(header::ETAG)
        .cloned()
        .unwrap_or_else(|| want.tag.clone());
    let last_modified = parts.headers.get(header::LAST_MODIFIED).cloned();
    let holds = range::if_range_holds(want.if_range.as_ref(), Some(&etag), last_modified.as_ref());
    let known_len = body.size_hint().exact();
    // Whether a range of this file can be served: the upstream cut one, or the length is known
    // so the gateway can; else only if the upstream says it takes ranges and was not asked yet.
    let mut ranges = parts.status == StatusCode::PARTIAL_CONTENT
        || known_len.is_some()
        || (range.is_none()
            && parts
                .headers
                .get(header::ACCEPT_RANGES)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"bytes")));
    let body = call::guarded(gw, body);
    // The size hint passes through, so a known length becomes the client's content-length.
    let mut out = match range {
        Some(_) if parts.status == StatusCode::PARTIAL_CONTENT => {
            if !holds {
                return Ok(Relayed::Changed);
            }
            let span = parts
                .headers
                .get(header::CONTENT_RANGE)
                .and_then(range::parse_content_range)
                .ok_or_else(|| {
                    GatewayError::new(
                        ErrorKind::UpstreamBadResponse,
                        format!(
                            "upstream {:?} answered 206 without a usable Content-Range",
                            upstream.name
                        ),
                    )
                })?;
            let mut out = Response::new(BodyExt::boxed(body));
            range::mark_partial(&mut out, span.0, span.1, span.2);
            out
        }
        Some(spec) if holds => match known_len.map(|len| (len, spec.resolve(len))) {
            Some((len, None)) => return Ok(Relayed::Sent(range::unsatisfiable(Some(len)))),
            Some((len, Some((first, last)))) => {
                let mut out = Response::new(BodyExt::boxed(Slice::new(body, first, last)));
                range::mark_partial(&mut out, first, last, Some(len));
                out
            }
            None => {
                // The range could not be honoured: no promise that another would be.
                ranges = false;
                Response::new(BodyExt::boxed(body))
            }
        },
        _ => Response::new(BodyExt::boxed(body)),
    };
    let h = out.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type);
    h.insert(header::ETAG, etag);
    if let Some(v) = last_modified {
        h.insert(header::LAST_MODIFIED, v);
    }
    if ranges {
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    } else {
        h.remove(header::ACCEPT_RANGES);
    }
    Ok(Relayed::Sent(out))
}

/// Reads the operation again for its inline video: the response, checked, ready to stream.
async fn operation(
    gw: &Services,
    upstream: &Upstream,
    model: &str,
    reference: &str,
    request_id: &HeaderValue,
) -> Result<UpstreamIncoming, Failure> {
    let req = veo::poll_request(gw, upstream, model, reference, request_id).await?;
    let resp = call::send(gw, upstream, req).await?;
    let (parts, body) = resp.into_parts();
    if !parts.status.is_success() {
        let bytes = call::read(gw, upstream, body).await?;
        return Err(veo::check_download_status(
            upstream,
            parts.status,
            &parts.headers,
            &bytes,
        ));
    }
    Ok(body)
}

/// The decoded length of the operation's inline video, counted from its base64 text as it streams.
async fn inline_length(
    gw: &Services,
    upstream: &Upstream,
    model: &str,
    reference: &str,
    request_id: &HeaderValue,
) -> Result<u64, Failure> {
    let mut body = Box::pin(call::guarded(
        gw,
        operation(gw, upstream, model, reference, request_id).await?,
    ));
    let mut scanner = Scanner::new(true);
    let mut chars: u64 = 0;
    while !scanner.done() {
        let Some(frame) = body.frame().await else {
            return Err(GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                "the upstream's answer holds no inline video",
            )
            .into());
        };
        let frame = frame.map_err(|e| {
            GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!("reading the upstream's answer: {e}"),
            )
        })?;
        if let Some(data) = frame.data_ref() {
            scanner.feed(data, |part, text| {
                if part == Part::Video {
                    chars += text.iter().filter(|b| **b != b'=').count() as u64;
                }
            });
        }
    }
    // Every base64 character carries six bits; a partial last byte is padding.
    Ok(chars * 6 / 8)
}

/// Fetches the operation again and decodes its inline video as it streams.
///
/// A range or a HEAD needs the length first, which costs one more read of the operation.
async fn inline(
    gw: &Services,
    upstream: &Upstream,
    model: &str,
    reference: &str,
    mime: &str,
    request_id: &HeaderValue,
    want: &Want,
) -> Result<Response<Body>, Failure> {
    let content_type = HeaderValue::try_from(mime).unwrap_or(HeaderValue::from_static("video/mp4"));
    // The operation has no validators of its own: only the file id's tag can match.
    let range = want
        .range
        .filter(|_| range::if_range_holds(want.if_range.as_ref(), Some(&want.tag), None));
    let len = if want.head || range.is_some() {
        Some(inline_length(gw, upstream, model, reference, request_id).await?)
    } else {
        None
    };
    let span = match (range, len) {
        (Some(spec), Some(len)) => match spec.resolve(len) {
            Some(span) => Some(span),
            None => return Ok(range::unsatisfiable(Some(len))),
        },
        _ => None,
    };
    if want.head {
        let mut out = Response::new(crate::boxed::empty());
        let n = match (span, len) {
            (Some((first, last)), _) => Some(last - first + 1),
            (None, len) => len,
        };
        if let Some(n) = n {
            out.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        out.headers_mut().insert(header::CONTENT_TYPE, content_type);
        out.headers_mut()
            .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        out.headers_mut().insert(header::ETAG, want.tag.clone());
        if let Some((first, last)) = span {
            range::mark_partial(&mut out, first, last, len);
        }
        return Ok(out);
    }
    let body = operation(gw, upstream, model, reference, request_id).await?;
    let mut decoded = Box::pin(DecodeBody::new(call::guarded(gw, body)));
    // Wait for the first bytes, so a missing or broken video is still a proper error response.
    let first = match decoded.frame().await {
        Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
        Some(Err(e)) => {
            let err = match e.downcast::<GatewayError>() {
                Ok(g) => *g,
                Err(e) => GatewayError::new(ErrorKind::UpstreamBadResponse, e.to_string()),
            };
            return Err(err.into());
        }
        None => Bytes::new(),
    };
    let stream = Prepend {
        first: Some(first),
        inner: decoded,
    };
    let mut out = match span {
        Some((first, last)) => {
            let mut out = Response::new(BodyExt::boxed(Slice::new(stream, first, last)));
            range::mark_partial(&mut out, first, last, len);
            out
        }
        None => Response::new(BodyExt::boxed(stream)),
    };
    out.headers_mut().insert(header::CONTENT_TYPE, content_type);
    out.headers_mut()
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.headers_mut().insert(header::ETAG, want.tag.clone());
    Ok(out)
}

pin_project! {
    /// A body whose first frame was already read.
    struct Prepend<B> {
        first: Option<Bytes>,
        #[pin]
        inner: B,
    }
}

impl<B> HttpBody for Prepend<B>
where
    B: HttpBody<Data = Bytes, Error = BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(first) = this.first.take() {
            if !first.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(first))));
            }
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve_against_the_answering_address() {
        let base: Uri = "https://a.example/v1beta/files/x:download?alt=media"
            .parse()
            .unwrap();
        assert_eq!(
            resolve(&base, "/other?y=1").unwrap().to_string(),
            "https://a.example/other?y=1"
        );
        assert_eq!(
            resolve(&base, "https://b.example/z").unwrap().to_string(),
            "https://b.example/z"
        );
        assert!(resolve(&base, "//evil/z").is_none());
        assert!(resolve(&base, "relative").is_none());
    }
}
