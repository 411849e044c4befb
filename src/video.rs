//! Video generation and task lookup on the video address (not enabled yet: every path answers 404 in the video envelope).

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::body::Body;
use crate::config::Config;
use crate::error::{ErrorKind, GatewayError};
use crate::pipeline::Gateway;

/// State of the video endpoints, built once from the config.
pub struct VideoService {}

impl VideoService {
    pub fn new(_config: &Config) -> Self {
        Self {}
    }

    /// Serves one request on the video address; errors are rendered in the video envelope by the pipeline.
    pub async fn handle(
        &self,
        _gw: &Gateway,
        req: Request<Incoming>,
        _request_id: &HeaderValue,
    ) -> Result<Response<Body>, GatewayError> {
        Err(GatewayError::new(
            ErrorKind::NotFound,
            format!(
                "no such path: {}; video generation is not enabled on this gateway yet",
                req.uri().path()
            ),
        ))
    }
}
