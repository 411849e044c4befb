//! The Veo upstream kinds (protocols.md §E): Vertex AI (`:predictLongRunning`, `:fetchPredictOperation`) and the Gemini API (`:predictLongRunning`, operation GET); the request field map and operation → state.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::Full;
use serde::Serialize;
use serde_json::Value;

use crate::config::{Upstream, UpstreamKind};
use crate::error::{ErrorKind, GatewayError};
use crate::gateway::Services;
use crate::upstream;
use crate::video::call::{self, Failure};
use crate::video::inline;
use crate::video::request::{Image, VideoRequest};
use crate::video::task::{http_url, Outcome, TaskStatus, Video};
use crate::video::token::FileSource;

/// gRPC's CANCELLED: the operation was cancelled, not failed (§E.5).
const GRPC_CANCELLED: i64 = 1;

#[derive(Serialize)]
struct Body<'a> {
    instances: [Instance<'a>; 1],
    parameters: Parameters<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Instance<'a> {
    prompt: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<VeoImage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_frame: Option<VeoImage<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct VeoImage<'a> {
    bytes_base64_encoded: &'a str,
    mime_type: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Parameters<'a> {
    aspect_ratio: &'a str,
    duration_seconds: u8,
    resolution: &'a str,
    /// Vertex only: the Gemini API refuses the field (§E.3).
    #[serde(skip_serializing_if = "Option::is_none")]
    generate_audio: Option<bool>,
    person_generation: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    negative_prompt: Option<&'a str>,
    /// The interface returns one `url`, so one sample is asked for.
    sample_count: u8,
    /// Vertex only: results go to Cloud Storage and come back as small `gcsUri`s (§E.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    storage_uri: Option<&'a str>,
}

fn veo_image(i: &Image) -> VeoImage<'_> {
    VeoImage {
        bytes_base64_encoded: &i.base64,
        mime_type: i.mime_type,
    }
}

/// The `predictLongRunning` body for `kind` (§E.4), or a 400 when the request cannot be served there.
pub fn body(
    kind: UpstreamKind,
    req: &VideoRequest,
    storage_uri: Option<&str>,
) -> Result<Bytes, GatewayError> {
    let generate_audio = if kind == UpstreamKind::VeoGemini {
        // Veo 3 on the Gemini API always makes sound and refuses the switch, so only `true` can be honoured.
        if !req.generate_audio {
            return Err(GatewayError::invalid(
                "parameters.generate_audio",
                "`parameters.generate_audio` false cannot be served: this model's upstream \
                 (Veo on the Gemini API) always generates audio; send true",
            ));
        }
        None
    } else {
        Some(req.generate_audio)
    };
    let body = Body {
        instances: [Instance {
            prompt: &req.prompt,
            image: req.image.as_ref().map(veo_image),
            last_frame: req.last_frame.as_ref().map(veo_image),
        }],
        parameters: Parameters {
            aspect_ratio: req.aspect_ratio,
            duration_seconds: req.duration,
            resolution: req.resolution,
            generate_audio,
            person_generation: req.person_generation,
            negative_prompt: req.negative_prompt.as_deref(),
            sample_count: 1,
            // The Gemini API refuses the field; validation allows it only on Vertex.
            storage_uri: storage_uri.filter(|_| kind == UpstreamKind::VeoVertex),
        },
    };
    serde_json::to_vec(&body).map(Bytes::from).map_err(|e| {
        GatewayError::new(
            ErrorKind::Internal,
            format!("encoding the Veo request: {e}"),
        )
    })
}

/// The start of every operation name of `model` on `upstream`, so task ids carry only the rest.
///
/// Vertex: `projects/…/models/{model}/operations/` (the base_url's path minus its version);
/// Gemini: `models/{model}/operations/`.
pub fn op_prefix(upstream: &Upstream, model: &str) -> Option<String> {
    match upstream.kind {
        UpstreamKind::VeoGemini => Some(format!("models/{model}/operations/")),
        UpstreamKind::VeoVertex => {
            let text = &upstream.base_url.as_ref()?.text;
            let uri: http::Uri = text.parse().ok()?;
            let path = uri.path().trim_matches('/');
            let (_version, rest) = path.split_once('/')?;
            Some(format!("{rest}/{model}/operations/"))
        }
        _ => None,
    }
}

/// Starts the job; returns the operation name.
pub async fn create(
    gw: &Services,
    upstream: &Upstream,
    model: &str,
    req: &VideoRequest,
    storage_uri: Option<&str>,
    request_id: &HeaderValue,
) -> Result<String, Failure> {
    let body = body(upstream.kind, req, storage_uri)?;
    let suffix = match upstream.kind {
        UpstreamKind::VeoGemini => format!("/models/{model}:predictLongRunning"),
        _ => format!("/{model}:predictLongRunning"),
    };
    let uri = join(upstream, &suffix)?;
    let mut req = upstream::build_call(upstream, Method::POST, uri, request_id, Some(body), true);
    call::authorize(gw, upstream, &mut req).await?;
    let resp = call::send(gw, upstream, req).await?;
    let (parts, body) = resp.into_parts();
    let bytes = call::read(gw, upstream, body).await?;
    if !parts.status.is_success() {
        return Err(call::upstream_error(
            upstream,
            parts.status,
            &parts.headers,
            &bytes,
        ));
    }
    serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("name").and_then(Value::as_str).map(str::to_owned))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!(
                    "upstream {:?} answered without an operation name",
                    upstream.name
                ),
            )
            .into()
        })
}

fn join(upstream: &Upstream, suffix: &str) -> Result<http::Uri, Failure> {
    let base = upstream.base_url.as_ref().ok_or_else(|| {
        GatewayError::new(
            ErrorKind::Internal,
            format!("upstream {:?} has no base_url", upstream.name),
        )
    })?;
    base.join(suffix).map_err(|e| call::bad_url(upstream, e))
}

/// The request that reads an operation: Vertex `POST …/{model}:fetchPredictOperation`, Gemini `GET …/{name}`.
pub async fn poll_request(
    gw: &Services,
    upstream: &Upstream,
    model: &str,
    operation: &str,
    request_id: &HeaderValue,
) -> Result<Request<Full<Bytes>>, Failure> {
    let mut req = match upstream.kind {
        UpstreamKind::VeoGemini => {
            let uri = join(upstream, &format!("/{operation}"))?;
            upstream::build_call(upstream, Method::GET, uri, request_id, None, true)
        }
        _ => {
            let uri = join(upstream, &format!("/{model}:fetchPredictOperation"))?;
            let body = serde_json::json!({ "operationName": operation }).to_string();
            upstream::build_call(
                upstream,
                Method::POST,
                uri,
                request_id,
                Some(Bytes::from(body)),
                true,
            )
        }
    };
    call::authorize(gw, upstream, &mut req).await?;
    Ok(req)
}

/// Reads the operation (its inline video left out) and maps it onto an outcome.
pub async fn poll(
    gw: &Services,
    upstream: &Upstream,
    model: &str,
    operation: &str,
    request_id: &HeaderValue,
) -> Result<Outcome, Failure> {
    let req = poll_request(gw, upstream, model, operation, request_id).await?;
    let resp = call::send(gw, upstream, req).await?;
    let (parts, body) = resp.into_parts();
    if !parts.status.is_success() {
        let bytes = call::read(gw, upstream, body).await?;
        if parts.status == StatusCode::NOT_FOUND {
            // An operation Google no longer knows (expired, or never was) ends the task (§E.5).
            return Ok(Outcome::failed(format!(
                "the upstream no longer knows this operation: {}",
                call::safe_detail(upstream, &bytes)
            )));
        }
        return Err(call::upstream_error(
            upstream,
            parts.status,
            &parts.headers,
            &bytes,
        ));
    }
    let (json, _) =
        inline::read_elided(Box::pin(call::guarded(gw, body)), call::JSON_LIMIT).await?;
    let op: Value = serde_json::from_slice(&json).map_err(|_| {
        GatewayError::new(
            ErrorKind::UpstreamBadResponse,
            format!(
                "upstream {:?} answered an operation that is not JSON",
                upstream.name
            ),
        )
    })?;
    Ok(outcome(upstream, model, operation, &op))
}

/// §E.5: not done → RUNNING; error → FAILED (cancelled → CANCELED); a video → SUCCEEDED; all filtered → FAILED with the reasons.
pub fn outcome(upstream: &Upstream, model: &str, operation: &str, op: &Value) -> Outcome {
    if op.get("done").and_then(Value::as_bool) != Some(true) {
        return Outcome::status(TaskStatus::Running);
    }
    if let Some(err) = op.get("error").filter(|e| !e.is_null()) {
        let code = err.get("code").and_then(Value::as_i64).unwrap_or(0);
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map_or_else(
                || format!("the upstream reported error code {code}"),
                str::to_owned,
            );
        let status = if code == GRPC_CANCELLED {
            TaskStatus::Canceled
        } else {
            TaskStatus::Failed
        };
        return Outcome::ended(status, message);
    }
    let resp = op.get("response").unwrap_or(&Value::Null);
    // Vertex: response.videos[]; Gemini: response.generateVideoResponse.generatedSamples[].video.
    let gemini = resp.get("generateVideoResponse");
    let first = resp
        .pointer("/videos/0")
        .or_else(|| gemini.and_then(|g| g.pointer("/generatedSamples/0/video")))
        .or_else(|| resp.pointer("/generatedSamples/0/video"));
    if let Some(video) = first {
        return match locate(upstream, model, operation, video) {
            Some(v) => Outcome::succeeded(v),
            None => Outcome::failed("the upstream's video has no location the gateway understands"),
        };
    }
    fn filtered_in(v: &Value) -> (i64, Vec<&str>) {
        let count = v
            .get("raiMediaFilteredCount")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let reasons: Vec<&str> = v
            .get("raiMediaFilteredReasons")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        (count, reasons)
    }
    let (mut count, mut reasons) = filtered_in(resp);
    if let Some(g) = gemini {
        let (c, r) = filtered_in(g);
        count += c;
        reasons.extend(r);
    }
    if count > 0 || !reasons.is_empty() {
        let why = if reasons.is_empty() {
            "no reason given".to_owned()
        } else {
            reasons.join("; ")
        };
        return Outcome::failed(format!(
            "the video was blocked by the upstream's safety filters: {why}"
        ));
    }
    Outcome::failed("the upstream finished without a video")
}

/// Where one video of a done operation is, as the gateway will hand it out.
fn locate(upstream: &Upstream, model: &str, operation: &str, video: &Value) -> Option<Video> {
    let mime = video
        .get("mimeType")
        .or_else(|| video.get("encoding"))
        .and_then(Value::as_str)
        .unwrap_or("video/mp4");
    let uri = video
        .get("gcsUri")
        .or_else(|| video.get("uri"))
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty());
    // An address is cheaper to serve than inline bytes, which mean fetching the operation again.
    let Some(uri) = uri else {
        // The bytes themselves were left out while reading; the key says they were there.
        if video.get("bytesBase64Encoded").is_some() || video.get("encodedVideo").is_some() {
            return Some(Video::Gateway(FileSource::Inline {
                upstream: upstream.name.to_string(),
                model: model.to_owned(),
                reference: operation.to_owned(),
                mime: mime.to_owned(),
            }));
        }
        return None;
    };
    if let Some(path) = uri.strip_prefix("gs://") {
        let (bucket, object) = path.split_once('/')?;
        return (!bucket.is_empty() && !object.is_empty()).then(|| {
            Video::Gateway(FileSource::Gcs {
                upstream: upstream.name.to_string(),
                bucket: bucket.to_owned(),
                object: object.to_owned(),
            })
        });
    }
    let uri = http_url(uri)?;
    Some(match upstream.kind {
        // A Gemini file URI needs the API key, which must never reach the client (§E.3).
        UpstreamKind::VeoGemini => Video::Gateway(FileSource::Remote {
            upstream: upstream.name.to_string(),
            uri: uri.to_owned(),
        }),
        _ => Video::Public(uri.to_owned()),
    })
}

/// The status and headers of an operation read for a download, checked before any byte goes out.
pub fn check_download_status(
    upstream: &Upstream,
    status: StatusCode,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Failure {
    if status == StatusCode::NOT_FOUND {
        return GatewayError::new(
            ErrorKind::NotFound,
            "the upstream no longer has this video; create the task again",
        )
        .into();
    }
    call::upstream_error(upstream, status, headers, bytes)
}

#[cfg(test)]
mod tests;
