//! The `video` upstream kind: a service with this same interface; requests pass through with paths rewritten and its task ids wrapped in ours.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use serde_json::Value;

use crate::config::{Model, Upstream};
use crate::error::{ErrorKind, GatewayError};
use crate::gateway::Services;
use crate::json::{self, RawObject};
use crate::upstream;
use crate::video::call::{self, Failure};
use crate::video::task::{http_url, Outcome, TaskStatus, Video};

const SUCCESS: i64 = 100_000;

/// `POST {base_url}/video/generations` with the client's body (model renamed if configured); returns the upstream's task id.
pub async fn create(
    gw: &Services,
    model: &Model,
    client_headers: &HeaderMap,
    request_id: &HeaderValue,
    original: &Bytes,
    mut obj: RawObject<'_>,
) -> Result<String, Failure> {
    let upstream = &model.primary().upstream;
    // Fields the gateway does not know go through untouched: this upstream speaks the interface.
    let body = match &model.primary().upstream_model {
        Some(name) => {
            obj.set("model", json::to_raw(name.as_str()));
            Bytes::from(obj.to_vec())
        }
        None => original.clone(),
    };
    let uri = base(upstream)?
        .join("/video/generations")
        .map_err(|e| call::bad_url(upstream, e))?;
    let req = upstream::build_request(upstream, uri, client_headers, request_id, body);
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
    let v = envelope(upstream, &bytes)?;
    v.pointer("/data/taskId")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| bad_answer(upstream, "its answer has no data.taskId"))
}

/// `GET {base_url}/tasks/{id}`, its status mapped onto ours.
pub async fn poll(
    gw: &Services,
    upstream: &Upstream,
    reference: &str,
    request_id: &HeaderValue,
) -> Result<Outcome, Failure> {
    let uri = base(upstream)?
        .join(&format!("/tasks/{}", call::encode_component(reference)))
        .map_err(|e| call::bad_url(upstream, e))?;
    let req = upstream::build_call(upstream, Method::GET, uri, request_id, None, true);
    let resp = call::send(gw, upstream, req).await?;
    let (parts, body) = resp.into_parts();
    let bytes = call::read(gw, upstream, body).await?;
    if parts.status == http::StatusCode::NOT_FOUND {
        return Ok(gone());
    }
    if !parts.status.is_success() {
        return Err(call::upstream_error(
            upstream,
            parts.status,
            &parts.headers,
            &bytes,
        ));
    }
    let v = match envelope(upstream, &bytes) {
        Err(f) if f.error.kind == ErrorKind::NotFound => return Ok(gone()),
        other => other?,
    };
    Ok(outcome(upstream, &v))
}

fn gone() -> Outcome {
    Outcome::failed("the upstream no longer knows this task (it may have expired)")
}

/// Maps a successful lookup envelope onto an outcome.
fn outcome(upstream: &Upstream, v: &Value) -> Outcome {
    let data = v.get("data").unwrap_or(&Value::Null);
    let raw = data.get("taskStatus").and_then(Value::as_str).unwrap_or("");
    let status = TaskStatus::parse(raw).unwrap_or_else(|| {
        // Unknown states are read as "still working"; a later lookup will see the end.
        tracing::warn!(upstream = %upstream.name, status = raw, "unknown task status from a video upstream");
        TaskStatus::Running
    });
    let message = || {
        data.pointer("/error/message")
            .or_else(|| data.get("error"))
            .and_then(Value::as_str)
            .map_or_else(
                || format!("the upstream reported the task {}", status.as_str()),
                str::to_owned,
            )
    };
    match status {
        TaskStatus::Succeeded => match data.get("url").and_then(Value::as_str) {
            Some(url) if !url.is_empty() => {
                let url = absolute(upstream, url);
                match http_url(&url) {
                    Some(ok) => Outcome::succeeded(Video::Public(ok.to_owned())),
                    None => {
                        tracing::warn!(upstream = %upstream.name, "a video upstream reported a file url that is not http(s); not handed out");
                        Outcome::failed(
                            "the upstream reported a file url that is not an http(s) address",
                        )
                    }
                }
            }
            _ => Outcome::failed("the upstream reported success without a file url"),
        },
        TaskStatus::Failed | TaskStatus::Canceled => Outcome::ended(status, message()),
        other => Outcome::status(other),
    }
}

/// The upstream's file address is public as it is; a path is made absolute against its origin.
fn absolute(upstream: &Upstream, url: &str) -> String {
    if !url.starts_with('/') {
        return url.to_owned();
    }
    let origin = upstream.base_url.as_ref().and_then(|b| {
        let uri: http::Uri = b.text.parse().ok()?;
        Some(format!("{}://{}", uri.scheme_str()?, uri.authority()?))
    });
    match origin {
        Some(o) => format!("{o}{url}"),
        None => url.to_owned(),
    }
}

fn base(upstream: &Upstream) -> Result<&crate::config::BaseUrl, Failure> {
    upstream.base_url.as_ref().ok_or_else(|| {
        GatewayError::new(
            ErrorKind::Internal,
            format!("upstream {:?} has no base_url", upstream.name),
        )
        .into()
    })
}

fn bad_answer(upstream: &Upstream, why: &str) -> Failure {
    GatewayError::new(
        ErrorKind::UpstreamBadResponse,
        format!("upstream {:?} answered garbage: {why}", upstream.name),
    )
    .into()
}

/// A 2xx envelope: `code` 100000 is success; another code is the upstream refusing, with the status its code names.
fn envelope(upstream: &Upstream, bytes: &[u8]) -> Result<Value, Failure> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| bad_answer(upstream, "not JSON"))?;
    match v.get("code").and_then(Value::as_i64) {
        Some(SUCCESS) => Ok(v),
        Some(code) => {
            let status = u16::try_from(code - SUCCESS)
                .ok()
                .and_then(|s| http::StatusCode::from_u16(s).ok())
                .filter(|s| s.is_client_error() || s.is_server_error())
                .unwrap_or(http::StatusCode::BAD_GATEWAY);
            Err(call::upstream_error(
                upstream,
                status,
                &HeaderMap::new(),
                bytes,
            ))
        }
        None => Err(bad_answer(upstream, "no envelope code")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up() -> Upstream {
        Upstream {
            name: "native".into(),
            name_header: None,
            kind: crate::config::UpstreamKind::Video,
            base_url: None,
            credential: None,
            google: None,
            storage_uri: None,
            headers: Vec::new(),
            forward_headers: Vec::new(),
            protocol_uris: [None, None, None],
            mock_protocol: None,
            attempts: Default::default(),
        }
    }

    #[test]
    fn states_map_one_to_one() {
        let u = up();
        let o = outcome(
            &u,
            &serde_json::json!({"data": {"taskStatus": "SUSPENDED"}}),
        );
        assert_eq!(o, Outcome::status(TaskStatus::Suspended));
        let o = outcome(
            &u,
            &serde_json::json!({"data": {"taskStatus": "SUCCEEDED", "url": "https://cdn/x.mp4"}}),
        );
        assert_eq!(
            o,
            Outcome::succeeded(Video::Public("https://cdn/x.mp4".into()))
        );
        let o = outcome(
            &u,
            &serde_json::json!({"data": {"taskStatus": "FAILED", "error": {"message": "boom"}}}),
        );
        assert_eq!(o, Outcome::failed("boom"));
        let o = outcome(
            &u,
            &serde_json::json!({"data": {"taskStatus": "SUCCEEDED", "url": "javascript:alert(document.domain)"}}),
        );
        assert_eq!(o.status, TaskStatus::Failed);
        assert!(o.video.is_none());
        let o = outcome(&u, &serde_json::json!({"data": {"taskStatus": "WEIRD"}}));
        assert_eq!(o.status, TaskStatus::Running);
    }
}
