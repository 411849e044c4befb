//! Video generation and task lookup on the video address: create, look up (GET or POST), download; stateless tasks in front of native, Veo and mock upstreams.
//!
//! ```text
//! POST /v1/video/generations   key → body → model (route, key scope) → request rules → upstream start → signed task id
//! GET|POST /v1/tasks/{taskId}  key → verify id for this key → cache (one upstream poll per task at a time) → answer
//! GET /v1/files/{fileId}       verify id and expiry → stream from the upstream with its credential
//! ```
//!
//! `request` checks the body, `token` signs ids, `native`, `veo` and `mock` speak to the upstream
//! kinds (`mock` also serves the interface for `modelgate mock`), `task` is the state they report, `download` and `inline` stream files, `call` holds
//! what every upstream call shares. Every error is a `GatewayError`, rendered by the pipeline in
//! the `{code,msg,data:null}` envelope.

mod call;
mod download;
mod inline;
pub mod mock;
mod native;
mod range;
pub mod request;
mod task;
mod token;
mod veo;

/// The body a Veo upstream is sent for a checked creation request (for the fuzz targets and
/// property tests, which check it against what was validated).
pub use veo::body as veo_body;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Response};
use moka::future::Cache;
use moka::Expiry;
use serde::Serialize;

use crate::auth::Principal;
use crate::body::{self, Body};
use crate::config::{Address, Config, Model, Upstream, UpstreamKind};
use crate::error::{ErrorKind, ErrorShape, GatewayError};
use crate::gateway::Services;
use crate::route::ModelTable;
use call::Failure;
use task::{Outcome, TaskStatus, Video};
use token::{FileToken, Signer, TaskToken};

/// Finished tasks kept by the lookup cache; each entry is a few hundred bytes.
const CACHE_ENTRIES: u64 = 10_000;

static TASK_ID: HeaderName = HeaderName::from_static("taskid");
static TASK_STATUS: HeaderName = HeaderName::from_static("taskstatus");

/// Keeps a finished task's answer until evicted by count; an unfinished one for `status_cache`.
struct TaskExpiry {
    status_cache: Duration,
}

impl Expiry<String, Arc<Outcome>> for TaskExpiry {
    fn expire_after_create(
        &self,
        _: &String,
        value: &Arc<Outcome>,
        _: Instant,
    ) -> Option<Duration> {
        (!value.status.is_final()).then_some(self.status_cache)
    }
}

/// State of the video endpoints, built once from the config.
pub struct VideoService {
    signer: Signer,
    /// Task id → what its last upstream poll learned.
    cache: Cache<String, Arc<Outcome>>,
    upstreams: HashMap<String, Arc<Upstream>>,
    public_url: Option<String>,
    /// `Host` values file URLs may be built from (lowercase).
    trusted_hosts: Vec<String>,
    /// The scheme of the video listener, for URLs built from a request's `Host`.
    scheme: &'static str,
    listen: Option<std::net::SocketAddr>,
    file_ttl: Duration,
    gcs_api_url: String,
}

impl VideoService {
    pub fn new(config: &Config, process_secret: &[u8; 32]) -> Self {
        let v = &config.video;
        let upstreams = config
            .upstreams
            .iter()
            .filter(|u| u.kind.is_video() || u.kind == UpstreamKind::Mock)
            .map(|u| (u.name.to_string(), u.clone()))
            .collect();
        for u in config.upstreams.iter() {
            if let Some(auth) = &u.google {
                tracing::info!(upstream = %u.name, source = ?auth.source(), "Google credentials for a Vertex upstream");
            }
        }
        let cache = Cache::builder()
            .max_capacity(CACHE_ENTRIES)
            .expire_after(TaskExpiry {
                status_cache: v.status_cache,
            })
            .build();
        Self {
            signer: Signer::new(&v.task_secrets, process_secret),
            cache,
            upstreams,
            public_url: v.public_url.clone(),
            trusted_hosts: v.trusted_hosts.clone(),
            scheme: if config.tls.is_some() {
                "https"
            } else {
                "http"
            },
            listen: config.listen.video,
            file_ttl: v.file_url_ttl,
            gcs_api_url: v.gcs_api_url.clone(),
        }
    }

    /// Serves one request on the video address, already routed to `ep` (and, where the
    /// endpoint needs one, authenticated); errors are rendered in the video envelope by the
    /// pipeline.
    pub async fn handle(
        &self,
        gw: &Services,
        models: &ModelTable,
        ep: Endpoint<'_>,
        call: Call<'_>,
    ) -> Result<Response<Body>, GatewayError> {
        let result = match ep {
            Endpoint::Create => self.create(gw, models, call).await,
            Endpoint::Lookup(id) => self.lookup(gw, models, call, id).await,
            Endpoint::Download(id) => self.download(gw, models, id, call).await,
        };
        match result {
            Ok(resp) => Ok(resp),
            Err(Failure {
                error,
                retry_after: None,
            }) => Err(error),
            Err(Failure {
                error,
                retry_after: Some(after),
            }) => {
                // The pipeline renders plain errors; this one must keep the upstream's retry-after.
                tracing::info!(request_id = ?call.request_id, error = %error, "video upstream rate limited");
                let mut resp = error.into_response(ErrorShape::Video);
                resp.headers_mut().insert(header::RETRY_AFTER, *after);
                Ok(resp)
            }
        }
    }

    /// `POST /v1/video/generations`: checks, starts the job upstream, answers PENDING with a signed id.
    async fn create(
        &self,
        gw: &Services,
        models: &ModelTable,
        call: Call<'_>,
    ) -> Result<Response<Body>, Failure> {
        let (principal, request_id) = (call.key()?, call.request_id);
        let bytes = call.body.cloned().unwrap_or_default();
        let obj = crate::validate::request_object(&bytes)?;
        let client_model = request::model(&obj)?.into_owned();
        let _ = call.seen.model.set(client_model.clone());
        principal.check_model(&client_model, Address::Video)?;
        let model = models.resolve(&client_model, Address::Video)?.clone();
        let _ = call.seen.entry.set(model.clone());
        let upstream = &model.primary().upstream;
        call.seen.route(upstream);
        let checked = request::validate(&obj)?;
        let upstream_model = match (&model.primary().upstream_model, upstream.kind) {
            (Some(name), _) => name.clone(),
            // The interface's "video-" stands in for the vendor's name (§E.4).
            (None, UpstreamKind::VeoVertex | UpstreamKind::VeoGemini) => {
                match client_model.strip_prefix("video-") {
                    Some(rest) => format!("veo-{rest}"),
                    None => client_model.clone(),
                }
            }
            (None, _) => client_model.clone(),
        };
        call.seen.reach(upstream);
        let reference = match upstream.kind {
            UpstreamKind::Mock => mock::reference(&checked),
            UpstreamKind::Video => {
                native::create(gw, &model, call.headers, request_id, &bytes, obj).await?
            }
            UpstreamKind::VeoVertex | UpstreamKind::VeoGemini => {
                let storage_uri = model
                    .storage_uri
                    .as_deref()
                    .or(upstream.storage_uri.as_deref());
                veo::create(
                    gw,
                    upstream,
                    &upstream_model,
                    &checked,
                    storage_uri,
                    request_id,
                )
                .await?
            }
            other => {
                return Err(GatewayError::new(
                    ErrorKind::Internal,
                    format!(
                        "model {client_model:?} is routed to a {} upstream, which makes no videos",
                        other.name()
                    ),
                )
                .into())
            }
        };
        let task = TaskToken {
            created_ms: now_ms(),
            upstream: upstream.name.to_string(),
            model: upstream_model,
            client_model: Some(client_model),
            reference,
        };
        let id = self.signer.sign_task(
            &principal.name,
            &task,
            self.prefix(&task.upstream, &task.model).as_deref(),
        );
        tracing::info!(request_id = ?request_id, key = %principal.name, upstream = %task.upstream, model = %task.model, "video task created");
        Ok(envelope(&TaskData::new(&id, TaskStatus::Pending)))
    }

    /// `GET|POST /v1/tasks/{taskId}`: the task's state, polled through the cache.
    async fn lookup(
        &self,
        gw: &Services,
        models: &ModelTable,
        call: Call<'_>,
        id: &str,
    ) -> Result<Response<Body>, Failure> {
        let (principal, request_id) = (call.key()?, call.request_id);
        let not_found = || {
            GatewayError::new(
                ErrorKind::NotFound,
                "no such task (or it belongs to another API key)",
            )
        };
        let task = self
            .signer
            .verify_task(&principal.name, id, |u, m| self.prefix(u, m))
            .ok_or_else(not_found)?;
        // §12: a lookup's model is the task's, as its creator named it.
        let model_name = task
            .client_model
            .clone()
            .unwrap_or_else(|| task.model.clone());
        let _ = call.seen.model.set(model_name.clone());
        call.seen.entry_of(models, &model_name);
        let upstream = self.upstreams.get(&task.upstream).ok_or_else(|| {
            GatewayError::new(
                ErrorKind::NotFound,
                format!(
                    "the upstream {:?} that ran this task is no longer configured",
                    task.upstream
                ),
            )
        })?;
        call.seen.route(upstream);
        // Concurrent lookups of one task share one poll; its result is kept per `TaskExpiry`.
        let outcome = self
            .cache
            .try_get_with(id.to_owned(), async {
                call.seen.reach(upstream);
                poll(gw, upstream, &task, request_id).await.map(Arc::new)
            })
            .await
            .map_err(|e| {
                // A failed poll is never kept: whoever shared it got it from the upstream too.
                call.seen.reach(upstream);
                (*e).clone()
            })?;
        let mut data = TaskData::new(id, outcome.status);
        match &outcome.video {
            Some(Video::Public(url)) => data.url = Some(url.clone()),
            Some(Video::Gateway(source)) => {
                let expires_s = now_ms() / 1000 + self.file_ttl.as_secs();
                let file = FileToken {
                    expires_s,
                    key: principal.name.clone(),
                    model: model_name.clone(),
                    source: source.clone(),
                };
                let prefix = match source {
                    token::FileSource::Inline {
                        upstream, model, ..
                    } => self.prefix(upstream, model),
                    _ => None,
                };
                let file_id = self.signer.sign_file(&file, prefix.as_deref());
                data.url = Some(format!(
                    "{}/v1/files/{file_id}",
                    self.public_base(gw, call.headers, call.uri)
                ));
            }
            None => {}
        }
        data.error = outcome
            .error
            .as_deref()
            .map(|message| TaskError { message });
        Ok(envelope(&data))
    }

    /// `GET|HEAD /v1/files/{fileId}`: no key; the id itself is the permission, until it expires.
    async fn download(
        &self,
        gw: &Services,
        models: &ModelTable,
        id: &str,
        call: Call<'_>,
    ) -> Result<Response<Body>, Failure> {
        let file = self
            .signer
            .verify_file(id, |u, m| self.prefix(u, m))
            .ok_or_else(|| GatewayError::new(ErrorKind::NotFound, "no such file"))?;
        // The id names who looked the task up and its model: the download's log line says so.
        if !file.key.is_empty() {
            let _ = call.seen.key.set(file.key.clone());
        }
        if !file.model.is_empty() {
            let _ = call.seen.model.set(file.model.clone());
            call.seen.entry_of(models, &file.model);
        }
        if file.expires_s < now_ms() / 1000 {
            return Err(GatewayError::new(
                ErrorKind::NotFound,
                "this download link has expired; look the task up again for a fresh one",
            )
            .into());
        }
        let upstream = match &file.source {
            token::FileSource::Mock => None,
            token::FileSource::Gcs { upstream, .. }
            | token::FileSource::Remote { upstream, .. }
            | token::FileSource::Inline { upstream, .. } => {
                self.upstreams.get(upstream).map(Arc::as_ref)
            }
        };
        // The mock's file names no upstream: it is the model's, when that is a mock.
        let mock = call
            .seen
            .entry
            .get()
            .map(|m| &m.primary().upstream)
            .filter(|u| u.kind == UpstreamKind::Mock);
        match (upstream, &file.source) {
            (Some(u), _) => call.seen.reach(u),
            (None, token::FileSource::Mock) => {
                if let Some(u) = mock {
                    call.seen.reach(u);
                }
            }
            (None, _) => {}
        }
        let range = range::parse(call.headers);
        let want = download::Want {
            head: call.method == Method::HEAD,
            range,
            // RFC 9110 §13.1.5: ignored without a range.
            if_range: range.and_then(|_| call.headers.get(header::IF_RANGE).cloned()),
            tag: download::file_tag(id),
        };
        download::serve(
            gw,
            upstream,
            &file.source,
            &self.gcs_api_url,
            call.request_id,
            want,
        )
        .await
    }

    /// The operation-name prefix of an upstream and model, shared by signing and verifying.
    fn prefix(&self, upstream: &str, model: &str) -> Option<String> {
        veo::op_prefix(self.upstreams.get(upstream)?, model)
    }

    /// How clients reach the video address (gateway.md §14): `[video] public_url`, else the
    /// request's `Host` when it is one of `trusted_hosts`, else the listen address.
    ///
    /// An untrusted `Host` must never choose the domain: a client (or anyone between it and the
    /// gateway) could otherwise make the gateway hand out links to a host they control.
    fn public_base(&self, gw: &Services, headers: &HeaderMap, uri: &http::Uri) -> String {
        if let Some(url) = &self.public_url {
            return url.clone();
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| uri.authority().map(http::uri::Authority::as_str))
            .map(str::to_ascii_lowercase)
            .filter(|h| self.trusts(h));
        let host = host.unwrap_or_else(|| {
            // The bound address: the config's may say port 0.
            gw.video_addr
                .get()
                .copied()
                .or(self.listen)
                .map_or_else(|| "localhost".to_owned(), |a| a.to_string())
        });
        format!("{}://{host}", self.scheme)
    }

    /// Whether `host` (`host[:port]`, lowercase) is listed, exactly or by its host part.
    fn trusts(&self, host: &str) -> bool {
        let bare = match host.rsplit_once(':') {
            // `[::1]:8082` and `example.com:8082`, not the colons inside `[::1]`.
            Some((h, port)) if !port.contains(']') && port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        self.trusted_hosts
            .iter()
            .any(|t| t == host || (!t.contains(':') || t.ends_with(']')) && t == bare)
    }
}

/// The endpoints of the video address, decided by method and path alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint<'a> {
    /// `POST /v1/video/generations`
    Create,
    /// `GET|POST /v1/tasks/{taskId}`
    Lookup(&'a str),
    /// `GET|HEAD /v1/files/{fileId}`: no key; the signed id is the permission.
    Download(&'a str),
}

impl<'a> Endpoint<'a> {
    pub fn parse(method: &Method, path: &'a str) -> Result<Self, GatewayError> {
        if path == "/v1/video/generations" {
            if method != Method::POST {
                return Err(GatewayError::method_not_allowed("POST"));
            }
            Ok(Self::Create)
        } else if let Some(id) = path.strip_prefix("/v1/tasks/") {
            if method != Method::GET && method != Method::POST {
                return Err(GatewayError::method_not_allowed("GET, POST"));
            }
            Ok(Self::Lookup(id))
        } else if let Some(id) = path.strip_prefix("/v1/files/") {
            if method != Method::GET && method != Method::HEAD {
                return Err(GatewayError::method_not_allowed("GET, HEAD"));
            }
            Ok(Self::Download(id))
        } else {
            Err(GatewayError::new(
                ErrorKind::NotFound,
                format!("no such path: {method} {path}"),
            ))
        }
    }

    /// Whether the caller must present a key (everything but a signed download).
    pub fn needs_key(self) -> bool {
        !matches!(self, Self::Download(_))
    }
}

/// What a video request turned out to be about, for its access log line and metrics (gateway.md §12).
#[derive(Default, Debug)]
pub struct Seen {
    /// The key's name where no `Authorization` named it (a download: from its signed id).
    pub key: OnceLock<String>,
    /// The model as the client named it (a lookup or download: the task's).
    pub model: OnceLock<String>,
    /// The config entry serving that model, whose name is the metrics' label.
    pub entry: OnceLock<Arc<Model>>,
    /// The upstream the request is for, by its config name.
    pub upstream: OnceLock<String>,
    /// Whether the request went to that upstream (a lookup answered from the cache did not), so
    /// a failure after it is the upstream's, not a refusal.
    pub reached: AtomicBool,
}

impl Seen {
    fn route(&self, upstream: &Upstream) {
        let _ = self.upstream.set(upstream.name.to_string());
    }

    fn reach(&self, upstream: &Upstream) {
        self.route(upstream);
        self.reached.store(true, Ordering::Relaxed);
    }

    /// The entry now serving `model` (a task's, named when it was created): the label is a
    /// config name even if the config changed since; none if the model is gone.
    fn entry_of(&self, models: &ModelTable, model: &str) {
        if let Ok(m) = models.resolve(model, Address::Video) {
            let _ = self.entry.set(m.clone());
        }
    }
}

/// What the pipeline hands over with a video request.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    pub uri: &'a http::Uri,
    pub request_id: &'a HeaderValue,
    /// The authenticated key, for endpoints that need one.
    pub principal: Option<&'a Arc<Principal>>,
    /// The request body, read for task creation.
    pub body: Option<&'a Bytes>,
    /// Filled in as the request is understood; the pipeline logs it.
    pub seen: &'a Seen,
}

impl Call<'_> {
    fn key(&self) -> Result<&Arc<Principal>, GatewayError> {
        self.principal.ok_or_else(|| {
            GatewayError::new(
                ErrorKind::Internal,
                "a video endpoint was not authenticated",
            )
        })
    }
}

/// One upstream poll, by kind.
async fn poll(
    gw: &Services,
    upstream: &Upstream,
    task: &TaskToken,
    request_id: &HeaderValue,
) -> Result<Outcome, Failure> {
    match upstream.kind {
        UpstreamKind::Mock => Ok(mock::outcome(&task.reference, task.created_ms, now_ms())),
        UpstreamKind::Video => native::poll(gw, upstream, &task.reference, request_id).await,
        UpstreamKind::VeoVertex | UpstreamKind::VeoGemini => {
            veo::poll(gw, upstream, &task.model, &task.reference, request_id).await
        }
        other => Err(GatewayError::new(
            ErrorKind::Internal,
            format!(
                "upstream {:?} is a {} upstream, which runs no video tasks",
                upstream.name,
                other.name()
            ),
        )
        .into()),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The `data` of a task answer, in the interface's field order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskData<'a> {
    task_id: &'a str,
    task_status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<TaskError<'a>>,
}

#[derive(Serialize)]
struct TaskError<'a> {
    message: &'a str,
}

impl<'a> TaskData<'a> {
    pub(crate) fn new(task_id: &'a str, status: TaskStatus) -> Self {
        Self {
            task_id,
            task_status: status.as_str(),
            url: None,
            error: None,
        }
    }

    pub(crate) fn with(mut self, url: Option<String>, error: Option<&'a str>) -> Self {
        self.url = url;
        self.error = error.map(|message| TaskError { message });
        self
    }
}

/// A success envelope, `{"code":100000,"msg":"SUCCESS","data":…}`, with the task's id and status
/// also as response headers (interface §4.3).
pub(crate) fn envelope(data: &TaskData) -> Response<Body> {
    #[derive(Serialize)]
    struct Envelope<'a, 'd> {
        code: u32,
        msg: &'static str,
        data: &'a TaskData<'d>,
    }
    let body = serde_json::to_vec(&Envelope {
        code: 100_000,
        msg: "SUCCESS",
        data,
    })
    .unwrap_or_default();
    let mut resp = Response::new(body::full(Bytes::from(body)));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::try_from(data.task_id) {
        h.insert(TASK_ID.clone(), v);
    }
    h.insert(
        TASK_STATUS.clone(),
        HeaderValue::from_static(data.task_status),
    );
    resp
}
