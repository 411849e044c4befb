//! `GET /v1/files/{fileId}`: a signed, expiring download, streamed chunk by chunk from where the file lives, with the upstream's credential.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::body::{Body, BoxError};
use crate::config::Upstream;
use crate::error::{ErrorKind, GatewayError};
use crate::gateway::Services;
use crate::upstream;
use crate::video::call::{self, Failure};
use crate::video::inline::DecodeBody;
use crate::video::token::FileSource;
use crate::video::{mock, veo};

/// Redirects followed for one download (Gemini's file download answers with one).
const MAX_REDIRECTS: usize = 5;

/// Streams the file `source` names; `upstream` is the one it names (none for the mock).
pub async fn serve(
    gw: &Services,
    upstream: Option<&Upstream>,
    source: &FileSource,
    gcs_api_url: &str,
    request_id: &HeaderValue,
) -> Result<Response<Body>, Failure> {
    let upstream = match (source, upstream) {
        (FileSource::Mock, _) => return Ok(mock::file()),
        (_, Some(u)) => u,
        (_, None) => {
            return Err(gone(
                "the upstream that made this file is no longer configured",
            ))
        }
    };
    match source {
        FileSource::Mock => Ok(mock::file()),
        FileSource::Gcs { bucket, object, .. } => {
            // The JSON API's media download: the object name is one encoded path segment.
            let url = format!(
                "{gcs_api_url}/storage/v1/b/{}/o/{}?alt=media",
                call::encode_component(bucket),
                call::encode_component(object)
            );
            let uri: Uri = url.parse().map_err(|e| call::bad_url(upstream, e))?;
            let resp = fetch(gw, upstream, uri, true, request_id).await?;
            relay(gw, upstream, resp).await
        }
        FileSource::Remote { uri, .. } => {
            let uri: Uri = uri.parse().map_err(|e| call::bad_url(upstream, e))?;
            // The key goes only where the upstream itself lives.
            let same_origin = upstream
                .base_url
                .as_ref()
                .and_then(|b| b.text.parse::<Uri>().ok())
                .is_some_and(|b| origin(&b) == origin(&uri));
            let resp = fetch(gw, upstream, uri, same_origin, request_id).await?;
            relay(gw, upstream, resp).await
        }
        FileSource::Inline {
            model,
            reference,
            mime,
            ..
        } => inline(gw, upstream, model, reference, mime, request_id).await,
    }
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
) -> Result<Response<Incoming>, Failure> {
    for _ in 0..=MAX_REDIRECTS {
        let req = upstream::build_call(
            upstream,
            Method::GET,
            uri.clone(),
            request_id,
            None,
            credential,
        )?;
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
async fn relay(
    gw: &Services,
    upstream: &Upstream,
    resp: Response<Incoming>,
) -> Result<Response<Body>, Failure> {
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
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .filter(|v| !v.as_bytes().starts_with(b"application/json"))
        .cloned()
        .unwrap_or(HeaderValue::from_static("video/mp4"));
    // The size hint passes through, so a known length becomes the client's content-length.
    let mut out = Response::new(BodyExt::boxed(call::guarded(gw, body)));
    out.headers_mut().insert(header::CONTENT_TYPE, content_type);
    Ok(out)
}

/// Fetches the operation again and decodes its inline video as it streams.
async fn inline(
    gw: &Services,
    upstream: &Upstream,
    model: &str,
    reference: &str,
    mime: &str,
    request_id: &HeaderValue,
) -> Result<Response<Body>, Failure> {
    let req = veo::poll_request(upstream, model, reference, request_id)?;
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
    let mut out = Response::new(BodyExt::boxed(Prepend {
        first: Some(first),
        inner: decoded,
    }));
    *out.status_mut() = StatusCode::OK;
    let content_type = HeaderValue::try_from(mime).unwrap_or(HeaderValue::from_static("video/mp4"));
    out.headers_mut().insert(header::CONTENT_TYPE, content_type);
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
