//! The built-in mock video upstream: stateless tasks that go PENDING → RUNNING → SUCCEEDED over a few seconds, timed from the creation time in the task id; its file is a small real MP4.

use http::{header, HeaderValue, Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::body::{self, Body};
use crate::error::{ErrorKind, ErrorShape, GatewayError};
use crate::json::RawObject;
use crate::video::request::{self, VideoRequest};
use crate::video::task::{Outcome, TaskStatus, Video};
use crate::video::token::FileSource;
use crate::video::TaskData;

/// A 2-second 160x90 H.264 + AAC clip (tests/fixtures/video/README.md says how it was made).
pub const MP4: &[u8] = include_bytes!("../../tests/fixtures/video/mock.mp4");

/// Milliseconds after creation when the mock task starts running, and when it ends.
pub const RUNNING_AFTER_MS: u64 = 1_000;
pub const DONE_AFTER_MS: u64 = 3_000;

/// What the mock will do, kept in the task id as the "upstream reference".
const SUCCEED: &str = "ok";
const FAIL: &str = "fail";
const CANCEL: &str = "cancel";

/// The prompt decides the ending: the word "fail" makes the task fail, "cancel" cancels it.
pub fn reference(req: &VideoRequest) -> String {
    let has = |word: &str| {
        req.prompt
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| w.eq_ignore_ascii_case(word))
    };
    if has("fail") {
        FAIL
    } else if has("cancel") {
        CANCEL
    } else {
        SUCCEED
    }
    .to_owned()
}

/// The task's state `now_ms`, a pure function of its creation time and reference.
pub fn outcome(reference: &str, created_ms: u64, now_ms: u64) -> Outcome {
    let age = now_ms.saturating_sub(created_ms);
    if age < RUNNING_AFTER_MS {
        return Outcome::status(TaskStatus::Pending);
    }
    if age < DONE_AFTER_MS {
        return Outcome::status(TaskStatus::Running);
    }
    match reference {
        FAIL => Outcome::failed("the mock upstream failed the task because the prompt asked it to"),
        CANCEL => Outcome::ended(
            TaskStatus::Canceled,
            "the mock upstream cancelled the task because the prompt asked it to",
        ),
        _ => Outcome::succeeded(Video::Gateway(FileSource::Mock)),
    }
}

/// The mock's file.
pub fn file() -> Response<Body> {
    let mut resp = Response::new(body::full(MP4));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("video/mp4"));
    resp
}

/// True for the paths of the video interface, which `modelgate mock` serves too.
pub fn is_video_path(path: &str) -> bool {
    path == "/v1/video/generations"
        || path.starts_with("/v1/tasks/")
        || path.starts_with("/v1/files/")
}

/// `modelgate mock` on the video paths: the same interface the gateway serves, without keys, so
/// an upstream of kind `video` can point at it. Its task ids are plain (`mock-{ms}-{ending}`):
/// a mock has nothing to protect.
pub async fn standalone(req: Request<Incoming>) -> Response<Body> {
    match standalone_inner(req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(ErrorShape::Video),
    }
}

async fn standalone_inner(req: Request<Incoming>) -> Result<Response<Body>, GatewayError> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/v1/video/generations" {
        if method != Method::POST {
            return Err(GatewayError::method_not_allowed("POST"));
        }
        let bytes = req
            .into_body()
            .collect()
            .await
            .map_err(|e| {
                GatewayError::new(
                    ErrorKind::InvalidRequest,
                    format!("could not read the body: {e}"),
                )
            })?
            .to_bytes();
        let obj = RawObject::parse(&bytes).map_err(|e| {
            GatewayError::new(
                ErrorKind::InvalidRequest,
                format!("the body is not a JSON object: {e}"),
            )
        })?;
        request::model(&obj)?;
        let checked = request::validate(&obj)?;
        let id = format!("mock-{}-{}", super::now_ms(), reference(&checked));
        return Ok(super::envelope(&TaskData::new(&id, TaskStatus::Pending)));
    }
    if let Some(id) = path.strip_prefix("/v1/tasks/") {
        if method != Method::GET && method != Method::POST {
            return Err(GatewayError::method_not_allowed("GET, POST"));
        }
        let not_found = || GatewayError::new(ErrorKind::NotFound, "no such task");
        let mut parts = id.splitn(3, '-');
        let (Some("mock"), Some(ms), Some(ending)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(not_found());
        };
        let created_ms: u64 = ms.parse().map_err(|_| not_found())?;
        let o = outcome(ending, created_ms, super::now_ms());
        let url = o.video.as_ref().map(|_| {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost");
            format!("http://{host}/v1/files/mock.mp4")
        });
        let data = TaskData::new(id, o.status).with(url, o.error.as_deref());
        return Ok(super::envelope(&data));
    }
    match (method, path.as_str()) {
        (Method::GET, "/v1/files/mock.mp4") => Ok(file()),
        (_, "/v1/files/mock.mp4") => Err(GatewayError::method_not_allowed("GET")),
        _ => Err(GatewayError::new(
            ErrorKind::NotFound,
            format!("no such path: {path}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_and_endings() {
        assert_eq!(outcome("ok", 10_000, 10_000).status, TaskStatus::Pending);
        assert_eq!(outcome("ok", 10_000, 10_999).status, TaskStatus::Pending);
        assert_eq!(outcome("ok", 10_000, 11_000).status, TaskStatus::Running);
        assert_eq!(outcome("ok", 10_000, 12_999).status, TaskStatus::Running);
        assert_eq!(outcome("ok", 10_000, 13_000).status, TaskStatus::Succeeded);
        assert_eq!(outcome("fail", 10_000, 13_000).status, TaskStatus::Failed);
        assert_eq!(
            outcome("cancel", 10_000, 13_000).status,
            TaskStatus::Canceled
        );
        // A clock that went backwards reads as "just created".
        assert_eq!(outcome("ok", 10_000, 5_000).status, TaskStatus::Pending);
        assert!(MP4.len() < 50_000 && &MP4[4..8] == b"ftyp");
    }
}
