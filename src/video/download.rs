//! `GET /v1/files/{fileId}`: a signed, expiring download, streamed chunk by chunk from where the file lives, with the upstream's credential.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::upstream::UpstreamIncoming;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

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
#[derive(Clone, Copy, Debug, Default)]
pub struct Want {
    /// `HEAD`: the headers only.
    pub head: bool,
    /// One byte range (`Range`); `None` is the whole file.
    pub range: Option<Spec>,
}

/// Streams the file `source` names; `upstream` is the one it names (none for the mock).
pub async fn serve(
    gw: &Services,
    upstream: Option<&Upstream>,
    source: &FileSource,
    gcs_api_url: &str,
    request_id: &HeaderValue,
    want: Want,
) -> Result<Response<Body>, Failure> {
    let resp = match (source, upstream) {
        (FileSource::Mock, _) => whole(Bytes::from_static(mock::MP4), "video/mp4", want.range),
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
            let resp = fetch(gw, upstream, uri, true, request_id, want.range).await?;
            relay(gw, upstream, resp, want.range).await?
        }
        (FileSource::Remote { uri, .. }, Some(upstream)) => {
            let uri: Uri = uri.parse().map_err(|e| call::bad_url(upstream, e))?;
            // The key goes only where the upstream itself lives.
            let same_origin = upstream
                .base_url
                .as_ref()
                .and_then(|b| b.text.parse::<Uri>().ok())
                .is_some_and(|b| origin(&b) == origin(&uri));
            let resp = fetch(gw, upstream, uri, same_origin, request_id, want.range).await?;
            relay(gw, upstream, resp, want.range).await?
        }
        (
            FileSource::Inline {
                model,
                reference,
                mime,
                ..
            },
            Some(upstream),
        ) => inline(gw, upstream, model, reference, mime, request_id, want).await?,
    };
    Ok(if want.head { head_only(resp) } else { resp })
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
fn whole(bytes: Bytes, content_type: &'static str, range: Option<Spec>) -> Response<Body> {
    let len = bytes.len() as u64;
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
    range: Option<Spec>,
) -> Result<Response<UpstreamIncoming>, Failure> {
    for _ in 0..=MAX_REDIRECTS {
        let mut req = upstream::build_call(
            upstream,
            Method::GET,
            uri.clone(),
            request_id,
            None,
            credential,
        )?;
        if credential {
            call::authorize(gw, upstream, &mut req).await?;
        }
        if let Some(r) = range {
            req.headers_mut().insert(header::RANGE, r.header());
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

/// Sends the upstream's bytes on as they come; its failure status becomes the client's error first.
///
/// With a range: an upstream's 206 goes on as it is; a 200 that ignored the range is cut to it
/// here when its length is known, and sent whole otherwise (a server may ignore `Range`).
async fn relay(
    gw: &Services,
    upstream: &Upstream,
    resp: Response<UpstreamIncoming>,
    range: Option<Spec>,
) -> Result<Response<Body>, Failure> {
    let (parts, body) = resp.into_parts();
    if parts.status == StatusCode::RANGE_NOT_SATISFIABLE && range.is_some() {
        let len = parts
            .headers
            .get(header::CONTENT_RANGE)
            .and_then(range::complete_length);
        return Ok(range::unsatisfiable(len));
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
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .filter(|v| !v.as_bytes().starts_with(b"application/json"))
        .cloned()
        .unwrap_or(HeaderValue::from_static("video/mp4"));
    let known_len = body.size_hint().exact();
    let body = call::guarded(gw, body);
    // The size hint passes through, so a known length becomes the client's content-length.
    let mut out = match range {
        Some(_) if parts.status == StatusCode::PARTIAL_CONTENT => {
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
        Some(spec) => match known_len.map(|len| (len, spec.resolve(len))) {
            Some((len, None)) => return Ok(range::unsatisfiable(Some(len))),
            Some((len, Some((first, last)))) => {
                let mut out = Response::new(BodyExt::boxed(Slice::new(body, first, last)));
                range::mark_partial(&mut out, first, last, Some(len));
                out
            }
            None => Response::new(BodyExt::boxed(body)),
        },
        None => Response::new(BodyExt::boxed(body)),
    };
    out.headers_mut().insert(header::CONTENT_TYPE, content_type);
    out.headers_mut()
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    Ok(out)
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
    want: Want,
) -> Result<Response<Body>, Failure> {
    let content_type = HeaderValue::try_from(mime).unwrap_or(HeaderValue::from_static("video/mp4"));
    let len = if want.head || want.range.is_some() {
        Some(inline_length(gw, upstream, model, reference, request_id).await?)
    } else {
        None
    };
    let span = match (want.range, len) {
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
