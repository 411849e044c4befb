//! The request path: endpoint → auth → body → route → validate → passthrough/translate → upstream → response; the one place an error becomes a response.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

use arc_swap::ArcSwap;
use smallvec::SmallVec;

use crate::attempt::{Chain, Selector};
use crate::auth::{KeyMemo, Principal};
use crate::body::{self, Body, Sent, SentBody, SizeLimit, StreamGuard, UpstreamBody};
use crate::config::KeyLimits;
use crate::config::{
    Address, Config, Limits, Model, Protocol, RetryPolicy, Target, Upstream, UpstreamKind,
};
use crate::error::{ErrorKind, ErrorShape, GatewayError, RetryClass};
use crate::gateway::Services;
use crate::limits::Hold;
use crate::metrics::{Metrics, RouteSeries};
use crate::observe::{Fate, Holds, Metered, Observed, Record, Tried, Tries, Usage, UsageReader};
use crate::phases::{self, Phase};
use crate::plan::{Encoded, Plan, Reply};
use crate::route::{self, NamePattern};
use crate::routing::Routing;
use crate::server::ClientBody;
use crate::translate::{self, Translation};
use crate::upstream;
use crate::video::{Call as VideoCall, Endpoint as VideoEndpoint, Seen as VideoSeen};
use crate::{inplace, mock, stateful, validate};

/// Everything a request needs, built once from the config and shared by all connections.
pub struct Gateway {
    /// The upstream client, metrics and limits: for the life of the process.
    pub services: Services,
    /// Keys, models, targets: replaced whole by a reload, read once per request.
    routing: ArcSwap<Routing>,
    ready: AtomicBool,
}

impl Gateway {
    /// Fails only when the OS's random source does (see `Services::new`).
    pub fn new(config: &Config) -> std::io::Result<Self> {
        let services = Services::new(config)?;
        let routing = Routing::new(config, None, &services.process_secret);
        Ok(Self {
            services,
            routing: ArcSwap::from_pointee(routing),
            ready: AtomicBool::new(true),
        })
    }

    /// The routing state new requests use.
    pub fn routing(&self) -> Arc<Routing> {
        self.routing.load_full()
    }

    /// Puts a new config's routing in place for every request that starts from now on;
    /// requests already running keep the one they started with.
    pub fn replace_routing(&self, config: &Config) {
        let next = Routing::new(
            config,
            Some(&self.routing.load()),
            &self.services.process_secret,
        );
        self.routing.store(Arc::new(next));
    }

    /// Makes `/readyz` fail so load balancers drain this instance during shutdown.
    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::Relaxed);
    }
}

/// What one request touched, for the access log and the `x-modelgate-*` headers.
struct Ctx<'a> {
    /// The client connection's memo of the last key it presented.
    keys_seen: &'a KeyMemo,
    request_id: HeaderValue,
    key: Option<Arc<Principal>>,
    model: Option<Arc<Model>>,
    /// The upstream tried last.
    upstream: Option<Arc<str>>,
    /// Its name as a header value, when it is a configured upstream's.
    upstream_header: Option<HeaderValue>,
    /// The metrics series of `model` served by `upstream`.
    series: Option<Arc<RouteSeries>>,
    /// Requests sent upstream.
    attempts: u32,
    /// `upstream outcome time` per attempt, for the access log.
    tries: Tries,
    /// Headers every answer carries, refusals included (`x-ratelimit-*`, `retry-after`).
    extra_headers: Vec<(http::HeaderName, HeaderValue)>,
    /// The model name the client sent.
    client_model: Option<Arc<str>>,
    /// The key's name where no authenticated key gives it (a video download's signed id).
    key_name: Option<String>,
    /// The client's protocol, for LLM requests.
    protocol: &'static str,
    /// What the answer holds until its body is dropped.
    holds: Holds,
    /// Set by the response body: how it failed after its head, if it did, and its usage.
    fate: Fate,
}

impl Ctx<'_> {
    /// Notes one attempt for the access log and `modelgate_upstream_attempts_total`.
    fn log_attempt(
        &mut self,
        metrics: &Metrics,
        upstream: &Upstream,
        tried: Tried,
        took: Duration,
    ) {
        let result = match tried {
            Tried::Status(429) => "429",
            Tried::Status(s) if s >= 500 => "5xx",
            Tried::Status(s) if s >= 400 => "4xx",
            Tried::Status(_) => "ok",
            Tried::Failed(f @ ("connect" | "timeout" | "5xx")) => f,
            Tried::Failed(_) => "error",
        };
        upstream.attempts.count(metrics, &upstream.name, result);
        self.tries.push(upstream.name.clone(), tried, took);
    }
}

fn tried<B, E>(resp: &Result<Response<B>, E>) -> Tried {
    match resp {
        Ok(r) => Tried::Status(r.status().as_u16()),
        Err(_) => Tried::Failed("error"),
    }
}

/// The endpoints, decided by address and path alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Llm(Protocol),
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// `GET`/`DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`.
    StoredResponse,
    Models,
    Health,
    Ready,
    Metrics,
    /// Every path on the video address; the video module owns its paths and methods.
    Video,
    /// The built-in mock over HTTP on the admin address, so configs can reach it as a real
    /// upstream of any protocol (and every translation pair works on the shipped config).
    Mock(Protocol),
}

impl Endpoint {
    /// The one method the endpoint takes, or `None` when its module checks methods itself.
    fn method(self) -> Option<(Method, &'static str)> {
        match self {
            Self::Llm(_) | Self::Mock(_) | Self::CountTokens => Some((Method::POST, "POST")),
            Self::Video | Self::StoredResponse => None,
            _ => Some((Method::GET, "GET")),
        }
    }

    fn shape(self) -> ErrorShape {
        match self {
            Self::Llm(Protocol::Messages) | Self::CountTokens => ErrorShape::Anthropic,
            Self::Llm(_) | Self::Models | Self::StoredResponse => ErrorShape::OpenAi,
            Self::Health | Self::Ready | Self::Metrics => ErrorShape::Text,
            Self::Mock(Protocol::Messages) => ErrorShape::Anthropic,
            Self::Mock(_) => ErrorShape::OpenAi,
            Self::Video => ErrorShape::Video,
        }
    }
}

fn address_shape(address: Address) -> ErrorShape {
    match address {
        Address::Base | Address::TokenPlan => ErrorShape::OpenAi,
        Address::Video => ErrorShape::Video,
        Address::Admin => ErrorShape::Text,
    }
}

/// The path as a request's record keeps it: an LLM path as the constant it equals, any other
/// path copied.
fn kept_path(path: &str) -> Cow<'static, str> {
    match Protocol::ALL
        .map(Protocol::client_path)
        .into_iter()
        .find(|p| *p == path)
    {
        Some(p) => Cow::Borrowed(p),
        None => Cow::Owned(path.to_owned()),
    }
}

fn endpoint(address: Address, path: &str) -> Option<Endpoint> {
    match (address, path) {
        (Address::Base | Address::TokenPlan, "/v1/chat/completions") => {
            Some(Endpoint::Llm(Protocol::Chat))
        }
        (Address::Base, "/v1/messages") => Some(Endpoint::Llm(Protocol::Messages)),
        (Address::Base, "/v1/responses") => Some(Endpoint::Llm(Protocol::Responses)),
        (Address::Base, "/v1/messages/count_tokens") => Some(Endpoint::CountTokens),
        (Address::Base | Address::TokenPlan, "/v1/models") => Some(Endpoint::Models),
        (Address::Base, p) if p.starts_with("/v1/responses/") => Some(Endpoint::StoredResponse),
        (Address::Admin, "/healthz") => Some(Endpoint::Health),
        (Address::Admin, "/readyz") => Some(Endpoint::Ready),
        (Address::Admin, "/metrics") => Some(Endpoint::Metrics),
        (Address::Video, _) => Some(Endpoint::Video),
        (Address::Admin, "/mock/v1/chat/completions") => Some(Endpoint::Mock(Protocol::Chat)),
        (Address::Admin, "/mock/v1/messages") => Some(Endpoint::Mock(Protocol::Messages)),
        (Address::Admin, "/mock/v1/responses") => Some(Endpoint::Mock(Protocol::Responses)),
        _ => None,
    }
}

static X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
static X_MODELGATE_UPSTREAM: http::HeaderName =
    http::HeaderName::from_static("x-modelgate-upstream");
static X_MODELGATE_ATTEMPTS: http::HeaderName =
    http::HeaderName::from_static("x-modelgate-attempts");
static X_MODELGATE_DROPPED: http::HeaderName = http::HeaderName::from_static("x-modelgate-dropped");
static X_MODELGATE_UPSTREAM_REQUEST_ID: http::HeaderName =
    http::HeaderName::from_static("x-modelgate-upstream-request-id");

/// A small count as a header value: from a table up to 9, as `From<u32>` allocates twice.
fn count_value(n: u32) -> HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match DIGITS.get(n as usize) {
        Some(d) => HeaderValue::from_static(d),
        None => HeaderValue::from(n),
    }
}

/// The request's id: the client's `x-request-id` when it sends a usable one, else ours. Its
/// bytes are owned by a reference-counted owner, so the clones the response header and the
/// access record take allocate nothing (a copied value allocates again at its first clone).
fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(&X_REQUEST_ID) {
        if !v.is_empty() && v.len() <= 128 {
            // Copied: a clone would share the connection's read buffer (the head's bytes are a
            // slice of it), and the request's record keeps
            // the id until its access line is written.
            let owned = Bytes::from_owner(v.as_bytes().to_vec());
            if let Ok(copy) = HeaderValue::from_maybe_shared(owned) {
                return copy;
            }
        }
    }
    // `req_` and 24 hex digits, written by hand: this runs on every request.
    let mut id = *b"req_000000000000000000000000";
    id[4..].copy_from_slice(&crate::ir::random_hex());
    HeaderValue::from_maybe_shared(Bytes::from_owner(id))
        .unwrap_or_else(|_| HeaderValue::from_static("req_unknown"))
}

/// Serves one request; never fails, every error is rendered here in the path's shape.
/// `keys_seen` is the client connection's memo of the last key it presented.
pub async fn handle(
    gw: &Gateway,
    address: Address,
    req: Request<ClientBody>,
    keys_seen: &KeyMemo,
    request: crate::server::RequestGuard,
) -> Response<Body> {
    let started = Instant::now();
    // The head stays here and the layers below borrow it: an `async fn` keeps a by-value
    // argument twice in its future (as the argument and as the local it moves to), so handing
    // the whole request down each layer made the request's future about 1 KB larger.
    let (parts, body) = req.into_parts();
    let method = parts.method.clone();
    let path = kept_path(parts.uri.path());
    let mut ctx = Ctx {
        keys_seen,
        request_id: request_id(&parts.headers),
        key: None,
        model: None,
        upstream: None,
        upstream_header: None,
        series: None,
        attempts: 0,
        tries: Tries::default(),
        extra_headers: Vec::new(),
        client_model: None,
        key_name: None,
        protocol: "",
        fate: Fate::default(),
        holds: Holds {
            request: Some(request),
            ..Holds::default()
        },
    };
    phases::mark(Phase::Context);
    let ep = endpoint(address, &path);
    // Anthropic clients read every error under their path in their own shape, a 404 included.
    let shape = match ep {
        None if address == Address::Base && path.starts_with("/v1/messages/") => {
            ErrorShape::Anthropic
        }
        _ => ep.map_or(address_shape(address), Endpoint::shape),
    };
    let result = match ep {
        None => Err(GatewayError::new(
            ErrorKind::NotFound,
            format!("no such path: {method} {path}"),
        )),
        Some(ep) => match ep.method() {
            Some((m, allow)) if parts.method != m => Err(GatewayError::method_not_allowed(allow)),
            _ => dispatch(gw, &gw.routing(), address, ep, &parts, body, &mut ctx).await,
        },
    };
    let mut resp = match result {
        Ok(resp) => resp,
        Err(err) => {
            // What an attempt held is let go with the answer it did not become.
            ctx.holds.in_flight = None;
            ctx.holds.slot = None;
            match err.side() {
                crate::error::Side::Client => {
                    tracing::debug!(request_id = ?ctx.request_id, error = %err, "request refused")
                }
                _ => tracing::warn!(request_id = ?ctx.request_id, error = %err, "request failed"),
            }
            err.into_response(shape)
        }
    };
    let headers = resp.headers_mut();
    for (name, value) in ctx.extra_headers {
        headers.insert(name, value);
    }
    // Only LLM answers name their upstream: a download link may be handed to anyone.
    if let Some(up) = ctx
        .upstream
        .as_deref()
        .filter(|_| ep != Some(Endpoint::Video))
        .and_then(|u| {
            // Made once with the config; copied from the name only where no target set it.
            ctx.upstream_header
                .take()
                .or_else(|| HeaderValue::try_from(u).ok())
        })
    {
        headers.insert(X_MODELGATE_UPSTREAM.clone(), up);
        headers.insert(X_MODELGATE_ATTEMPTS.clone(), count_value(ctx.attempts));
    }
    // An upstream's own request id (OpenAI's comes as `x-request-id`) stays readable beside ours.
    if let Some(theirs) = headers
        .insert(X_REQUEST_ID.clone(), ctx.request_id.clone())
        .filter(|v| *v != ctx.request_id)
    {
        headers.insert(X_MODELGATE_UPSTREAM_REQUEST_ID.clone(), theirs);
    }
    let stream = body::is_event_stream(resp.headers());
    let record = Record {
        request_id: ctx.request_id,
        address: address.name(),
        method,
        path,
        principal: ctx.key,
        key_name: ctx.key_name,
        model: ctx.client_model,
        model_entry: ctx.model,
        upstream: ctx.upstream,
        series: ctx.series,
        protocol: ctx.protocol,
        attempts: ctx.attempts,
        tries: ctx.tries,
        status: resp.status().as_u16(),
        started,
        fate: ctx.fate,
    };
    let metrics = gw.services.metrics.clone();
    phases::mark(Phase::Recorded);
    // Boxed, though a server could keep it by its type: the body is moved on its way out (by
    // hyper several times), and moves of the whole layer (about 250 bytes) cost more than the
    // allocation (memcpy 178 -> 383 instructions in hyper's `poll_write` alone), and every
    // connection's state, idle ones included, would be sized for it.
    resp.map(|b| BodyExt::boxed(Observed::new(b, record, metrics, stream, ctx.holds)))
}

async fn dispatch(
    gw: &Gateway,
    rt: &Routing,
    address: Address,
    ep: Endpoint,
    parts: &Parts,
    body: ClientBody,
    ctx: &mut Ctx<'_>,
) -> Result<Response<Body>, GatewayError> {
    // The future of a request is one box (the server's) sized for its largest branch, held
    // until the answer's head is out: the less frequent branches with large futures are boxed
    // on their own, so the common ones do not allocate for them.
    match ep {
        Endpoint::Llm(protocol) => {
            ctx.protocol = protocol.name();
            llm(gw, rt, address, protocol, parts, body, ctx).await
        }
        Endpoint::CountTokens => {
            ctx.protocol = Protocol::Messages.name();
            inplace::boxed(|| count_tokens(gw, rt, address, parts, body, ctx)).await
        }
        Endpoint::StoredResponse => {
            ctx.protocol = Protocol::Responses.name();
            inplace::boxed(|| stored_response(gw, rt, address, parts, ctx)).await
        }
        Endpoint::Models => {
            let principal = rt
                .keys
                .authenticate(&parts.headers, address, false, ctx.keys_seen)?;
            ctx.key = Some(principal.clone());
            Ok(list_models(rt, address, &principal))
        }
        Endpoint::Health => Ok(text(StatusCode::OK, "ok\n")),
        Endpoint::Ready if gw.ready.load(Ordering::Relaxed) => Ok(text(StatusCode::OK, "ready\n")),
        Endpoint::Ready => Ok(text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")),
        Endpoint::Metrics => {
            let mut resp = text(StatusCode::OK, gw.services.metrics.render());
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            Ok(resp)
        }
        Endpoint::Video => {
            ctx.protocol = "video";
            inplace::boxed(|| video(gw, rt, parts, body, ctx)).await
        }
        Endpoint::Mock(protocol) => {
            let bytes = read_body(body, &parts.headers, &gw.services.limits).await?;
            Ok(mock::handle(protocol, &bytes, std::time::Duration::ZERO))
        }
    }
}

/// The video address: the key checked and a creation's body read here, the rest in `video`.
async fn video(
    gw: &Gateway,
    rt: &Routing,
    parts: &Parts,
    body: ClientBody,
    ctx: &mut Ctx<'_>,
) -> Result<Response<Body>, GatewayError> {
    let ep = VideoEndpoint::parse(&parts.method, parts.uri.path())?;
    if ep.needs_key() {
        ctx.key =
            Some(
                rt.keys
                    .authenticate(&parts.headers, Address::Video, false, ctx.keys_seen)?,
            );
    }
    // Video creation counts against the key's requests per minute; a task has no tokens.
    let mut _hold = Hold::default();
    if let (VideoEndpoint::Create, Some(key)) = (ep, ctx.key.clone()) {
        let limits = KeyLimits {
            rpm: key.limits.rpm,
            ..KeyLimits::default()
        };
        _hold = admit(gw, &key, limits, ctx).await?;
    }
    let bytes = match ep {
        VideoEndpoint::Create => Some(read_body(body, &parts.headers, &gw.services.limits).await?),
        _ => None,
    };
    let seen = VideoSeen::default();
    let call = VideoCall {
        method: &parts.method,
        headers: &parts.headers,
        uri: &parts.uri,
        request_id: &ctx.request_id,
        principal: ctx.key.as_ref(),
        body: bytes.as_ref(),
        seen: &seen,
    };
    let result = rt.video.handle(&gw.services, &rt.models, ep, call).await;
    // Errors included: a refused create still names the model it asked for, and a failure
    // after the upstream was reached is the upstream's (outcome `upstream_error`).
    ctx.client_model = seen.model.into_inner().map(Arc::from);
    ctx.key_name = seen.key.into_inner();
    ctx.model = seen.entry.into_inner();
    ctx.upstream = seen.upstream.into_inner().map(Arc::from);
    ctx.attempts = u32::from(seen.reached.into_inner());
    result
}

/// Admits the request under its key's limits; the answer's headers go on the response either way.
async fn admit(
    gw: &Gateway,
    key: &Principal,
    limits: KeyLimits,
    ctx: &mut Ctx<'_>,
) -> Result<Hold, GatewayError> {
    if limits.is_unlimited() {
        return Ok(Hold::default());
    }
    let slot = ctx.request_id.to_str().unwrap_or("request");
    // Boxed: the store's round trip is a large future, needed only by limited keys.
    match inplace::boxed(|| gw.services.limiter.admit(key, limits, slot)).await {
        Ok(mut admission) => {
            ctx.extra_headers = std::mem::take(&mut admission.headers);
            Ok(admission.take_hold())
        }
        Err(refusal) => {
            ctx.extra_headers = refusal.headers;
            Err(refusal.error)
        }
    }
}

/// `GET`/`DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`: answered from
/// the store for a translated response, forwarded to the upstream that keeps a passthrough one.
/// Each costs a request of the key's rate, never tokens.
async fn stored_response(
    gw: &Gateway,
    rt: &Routing,
    address: Address,
    parts: &Parts,
    ctx: &mut Ctx<'_>,
) -> Result<Response<Body>, GatewayError> {
    let principal = rt
        .keys
        .authenticate(&parts.headers, address, false, ctx.keys_seen)?;
    ctx.key = Some(principal.clone());
    let path = parts.uri.path();
    let rest = path.strip_prefix("/v1/responses/").unwrap_or_default();
    let (id, items) = match rest.split_once('/') {
        None => (rest, false),
        Some((id, "input_items")) => (id, true),
        Some(_) => {
            return Err(GatewayError::new(
                ErrorKind::NotFound,
                format!("no such path: {} {path}", parts.method),
            ))
        }
    };
    let method = parts.method.clone();
    match (&method, items) {
        (&Method::GET, _) | (&Method::DELETE, false) => {}
        (_, false) => return Err(GatewayError::method_not_allowed("GET, DELETE")),
        (_, true) => return Err(GatewayError::method_not_allowed("GET")),
    }
    let id = id.to_owned();
    let limits = KeyLimits {
        rpm: principal.limits.rpm,
        ..KeyLimits::default()
    };
    let _hold = admit(gw, &principal, limits, ctx).await?;
    let store = &gw.services.responses;
    let record = store
        .get(&principal.name, &id)
        .await
        .map_err(|e| stateful::unavailable(&e))?
        .ok_or_else(|| stateful::not_found(&id))?;
    let upstream_name = match record {
        stateful::Record::Translated { response, input } => {
            let value = match (method, items) {
                (_, true) => stateful::input_items_page(&input, parts.uri.query())?,
                (Method::DELETE, _) => {
                    store
                        .delete(&principal.name, &id)
                        .await
                        .map_err(|e| stateful::unavailable(&e))?;
                    serde_json::json!({"id": id, "object": "response.deleted", "deleted": true})
                }
                _ => response,
            };
            return Ok(stateful::json_response(&value));
        }
        stateful::Record::Passthrough { upstream } => upstream,
    };
    // The upstream as the current config has it (its URL and credential may have changed).
    let upstream = rt
        .models
        .all()
        .iter()
        .flat_map(|m| m.targets.iter())
        .find(|t| *t.upstream.name == *upstream_name)
        .map(|t| t.upstream.clone())
        .ok_or_else(|| {
            tracing::warn!(upstream = %upstream_name, "a stored response's upstream is no longer configured");
            stateful::not_found(&id)
        })?;
    let base = upstream.uri_for(Protocol::Responses).ok_or_else(|| {
        GatewayError::new(
            ErrorKind::Internal,
            format!("upstream {upstream_name:?} has no responses URL"),
        )
    })?;
    let mut uri = format!("{}/{id}", base.to_string().trim_end_matches('/'));
    if items {
        uri.push_str("/input_items");
    }
    if let Some(q) = parts.uri.query() {
        uri.push('?');
        uri.push_str(q);
    }
    let uri: http::Uri = uri.parse().map_err(|_| stateful::not_found(&id))?;
    let call = upstream::build_call(&upstream, method.clone(), uri, &ctx.request_id, None, true);
    ctx.attempts = 1;
    ctx.upstream = Some(Arc::from(upstream_name.as_str()));
    let started = Instant::now();
    let resp = gw.services.client.send(&upstream, call).await;
    ctx.log_attempt(
        &gw.services.metrics,
        &upstream,
        tried(&resp),
        started.elapsed(),
    );
    let resp = upstream::check_answer(&upstream, resp?, false, gw.services.limits.max_reply_bytes)?;
    if method == Method::DELETE && resp.status().is_success() {
        if let Err(e) = store.delete(&principal.name, &id).await {
            tracing::warn!(error = %e, "a deleted response's record stays until it expires");
        }
    }
    let resp = redact_errors(resp, &upstream, gw.services.limits.max_reply_bytes);
    let stream = body::is_event_stream(resp.headers());
    Ok(wrap_response(
        resp,
        gw.services.limits,
        StreamGuard::None,
        &ctx.fate,
        None,
        stream,
    ))
}

/// `POST /v1/messages/count_tokens`: forwarded to the model's first target when it speaks
/// messages, else estimated here (`x-modelgate-estimate: true`). It costs a request of the key's
/// rate, never tokens.
async fn count_tokens(
    gw: &Gateway,
    rt: &Routing,
    address: Address,
    parts: &Parts,
    body: ClientBody,
    ctx: &mut Ctx<'_>,
) -> Result<Response<Body>, GatewayError> {
    let principal = rt
        .keys
        .authenticate(&parts.headers, address, true, ctx.keys_seen)?;
    ctx.key = Some(principal.clone());
    let bytes = read_body(body, &parts.headers, &gw.services.limits).await?;
    let obj = crate::validate::request_object(&bytes)?;
    let client_model = validate::model_name(&obj)?.into_owned();
    ctx.client_model = Some(Arc::from(client_model.as_str()));
    principal.check_model(&client_model, address)?;
    let model = rt.models.resolve(&client_model, address)?.clone();
    ctx.model = Some(model.clone());
    route::check_endpoint(&model, &client_model, Protocol::Messages)?;
    let target = model.primary();
    let protocol = target.protocol().ok_or_else(|| {
        GatewayError::invalid(
            "model",
            format!("the model {client_model:?} is a video model; use the video address"),
        )
    })?;
    // Checked as a messages request whatever happens next: bad input never reaches an upstream.
    let decoded = crate::count_tokens::decode(&bytes, &client_model)?;
    let limits = KeyLimits {
        rpm: principal.limits.rpm,
        ..KeyLimits::default()
    };
    let _hold = admit(gw, &principal, limits, ctx).await?;
    let messages_uri = target.upstream.uri_for(Protocol::Messages);
    if let (Protocol::Messages, Some(uri), false) = (
        protocol,
        messages_uri,
        target.upstream.kind == UpstreamKind::Mock,
    ) {
        let uri = crate::count_tokens::upstream_uri(uri).ok_or_else(|| {
            GatewayError::new(
                ErrorKind::Internal,
                "the count_tokens URL could not be built",
            )
        })?;
        let name = target.model_name(&client_model);
        let body =
            crate::passthrough::rename_model(&bytes, obj, (name != client_model).then_some(name));
        let req =
            upstream::build_request(&target.upstream, uri, &parts.headers, &ctx.request_id, body);
        ctx.attempts = 1;
        ctx.upstream = Some(target.upstream.name.clone());
        ctx.upstream_header.clone_from(&target.upstream.name_header);
        let started = Instant::now();
        let resp = gw.services.client.send(&target.upstream, req).await;
        ctx.log_attempt(
            &gw.services.metrics,
            &target.upstream,
            tried(&resp),
            started.elapsed(),
        );
        // The same rules as any upstream answer (§14): no redirect, no 401/403 passed on as the
        // client's, the credential never quoted back.
        let resp = upstream::check_answer(
            &target.upstream,
            resp?,
            false,
            gw.services.limits.max_reply_bytes,
        )?;
        let resp = redact_errors(resp, &target.upstream, gw.services.limits.max_reply_bytes);
        let stream = body::is_event_stream(resp.headers());
        return Ok(wrap_response(
            resp,
            gw.services.limits,
            StreamGuard::None,
            &ctx.fate,
            None,
            stream,
        ));
    }
    // Off the async workers: a long prompt is milliseconds of CPU, and the first count loads
    // the vocabulary.
    let tokens = tokio::task::spawn_blocking(move || crate::count_tokens::count(&decoded.ir))
        .await
        .map_err(|e| GatewayError::new(ErrorKind::Internal, format!("counting tokens: {e}")))?;
    let mut resp = Response::new(body::full(
        serde_json::json!({ "input_tokens": tokens }).to_string(),
    ));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        http::HeaderName::from_static("x-modelgate-estimate"),
        HeaderValue::from_static("true"),
    );
    Ok(resp)
}

/// `POST /v1/chat/completions`, `/v1/messages`, `/v1/responses`.
async fn llm(
    gw: &Gateway,
    rt: &Routing,
    address: Address,
    protocol: Protocol,
    parts: &Parts,
    body: ClientBody,
    ctx: &mut Ctx<'_>,
) -> Result<Response<Body>, GatewayError> {
    let principal = rt.keys.authenticate(
        &parts.headers,
        address,
        protocol == Protocol::Messages,
        ctx.keys_seen,
    )?;
    ctx.key = Some(principal.clone());
    phases::mark(Phase::Authenticated);
    let bytes = read_body(body, &parts.headers, &gw.services.limits).await?;
    phases::mark(Phase::Body);
    let obj = crate::validate::request_object(&bytes)?;
    let client_model: Arc<str> = Arc::from(validate::model_name(&obj)?.as_ref());
    ctx.client_model = Some(client_model.clone());
    principal.check_model(&client_model, address)?;
    let model = rt.models.resolve(&client_model, address)?.clone();
    ctx.model = Some(model.clone());
    route::check_endpoint(&model, &client_model, protocol)?;
    if model.primary().upstream.kind.is_video() || model.primary().protocol().is_none() {
        return Err(GatewayError::invalid(
            "model",
            format!("the model {client_model:?} is a video model; use the video address"),
        ));
    }
    phases::mark(Phase::Validated);
    let mut hold = admit(gw, &principal, principal.limits, ctx).await?;
    phases::mark(Phase::Admitted);
    // A responses request may continue a stored conversation: it is expanded (or pinned to
    // the upstream that keeps it) before anything is planned.
    let prepared = match protocol {
        Protocol::Responses => {
            // Boxed, as is `finish` below: large futures only responses requests need.
            let prepare =
                || stateful::prepare(&gw.services.responses, &principal.name, &bytes, &obj);
            Some(inplace::boxed(prepare).await?)
        }
        _ => None,
    };
    let (bytes, obj) = match &prepared {
        Some(p) if p.rewritten() => (&p.body, p.object(&obj)),
        _ => (&bytes, obj),
    };
    let mut plan = Plan::new(protocol, bytes, obj, &model, &client_model)?;
    plan.needs_usage = hold.wants_usage();
    phases::mark(Phase::Planned);
    if let Some(p) = &prepared {
        plan.echo_previous = p.previous.clone();
        plan.pinned = p.pinned.clone();
    }
    let mut chain: Chain = smallvec::smallvec![(model.clone(), client_model.clone())];
    for name in &model.fallbacks {
        match rt.models.resolve(name, address) {
            Ok(f) if f.primary().protocol().is_some() && !f.primary().upstream.kind.is_video() => {
                chain.push((f.clone(), Arc::from(name.as_str())))
            }
            _ => {
                tracing::warn!(model = %model.name, fallback = %name, "fallback not served on this address; skipped")
            }
        }
    }
    if let Some(pinned) = &plan.pinned {
        let reachable = chain
            .iter()
            .any(|(m, _)| m.targets.iter().any(|t| *t.upstream.name == **pinned));
        if !reachable {
            return Err(GatewayError::invalid(
                "previous_response_id",
                format!(
                    "the previous response is kept by an upstream the model {client_model:?} does not route to; use the model that made it"
                ),
            ));
        }
    }
    let mut selector = Selector::new(chain);
    let resp = attempts(
        gw,
        rt,
        &mut plan,
        &mut selector,
        &parts.headers,
        &mut hold,
        ctx,
    )
    .await?;
    let resp = match (&prepared, plan.served) {
        (Some(p), Some((served_protocol, upstream_keeps))) => {
            let served = match (&ctx.upstream, served_protocol, upstream_keeps) {
                (Some(up), Protocol::Responses, true) => stateful::Served::Upstream(up.to_string()),
                _ => stateful::Served::Kept,
            };
            inplace::boxed(|| {
                stateful::finish(
                    gw.services.responses.clone(),
                    &principal.name,
                    p,
                    served,
                    resp,
                    gw.services.limits.max_event_bytes,
                )
            })
            .await?
        }
        _ => resp,
    };
    // The concurrency slot is held until the response's body is dropped.
    ctx.holds.slot = Some(hold);
    Ok(resp)
}

/// The answer in the client's protocol. A macro rather than an `async fn`: a passthrough
/// answer needs no await, and the future of a function awaited on every request was moved
/// into the request's future and out again (two copies of about 260 bytes each).
macro_rules! respond {
    ($resp:expr, $limits:expr, $reply:expr, $fate:expr, $usage:expr, $stream:expr) => {
        match $reply {
            Reply::Passthrough { guard, strip_usage } => Ok(passthrough(
                $resp,
                $limits,
                guard,
                strip_usage,
                $fate,
                $usage,
                $stream,
            )),
            Reply::Translated(t) => {
                translated_response($resp, $limits, &t, $fate, $usage, $stream).await
            }
        }
    };
}

/// An attempt that failed in a way another attempt could mend, kept to answer with if it is the last.
enum Failed {
    /// No usable head: connect error, timeout, a body that broke before its first byte.
    Transport(GatewayError),
    /// A retryable status (429, 5xx), answered as it is if no other attempt does better.
    Status(Response<Sent>, Box<Encoded>),
}

/// Tries the plan on targets until one answers before the first byte reaches the client
/// (gateway.md §10): retryable failures go to the next target after a pause, within the
/// model's attempts and retry budget; anything else is the answer.
async fn attempts(
    gw: &Gateway,
    rt: &Routing,
    plan: &mut Plan<'_>,
    selector: &mut Selector,
    headers: &HeaderMap,
    hold: &mut Hold,
    ctx: &mut Ctx<'_>,
) -> Result<Response<Body>, GatewayError> {
    let model = selector.model().clone();
    let policy = model.retry;
    rt.runtime.request_started(&model);
    let mut last: Option<Failed> = None;
    let mut refusal: Option<GatewayError> = None;
    let mut smallest_retry_after: Option<Duration> = None;
    while ctx.attempts < policy.attempts {
        let Some(pick) = selector.next(&rt.runtime) else {
            break;
        };
        // Counted from the pick on: a probe chosen here is released by this guard whatever
        // happens before it is sent (a refusal, a spent budget, a client leaving in the pause).
        let inflight = rt.runtime.start(&pick.model, pick.index, pick.probe);
        let target = &pick.model.targets[pick.index];
        if plan
            .pinned
            .as_deref()
            .is_some_and(|p| *p != *target.upstream.name)
        {
            // Another upstream does not know the conversation this request continues.
            selector.exclude(&pick);
            continue;
        }
        let encoded = match plan.encode(target, &pick.name) {
            Ok(e) => e,
            Err(e) => {
                // This target cannot express the request; another may. Nothing was sent.
                tracing::debug!(request_id = ?ctx.request_id, upstream = %target.upstream.name, error = %e, "target skipped");
                selector.exclude(&pick);
                refusal.get_or_insert(e);
                continue;
            }
        };
        if ctx.attempts > 0 {
            if !rt.runtime.take_retry(&model) {
                tracing::warn!(request_id = ?ctx.request_id, model = %model.name, "retry budget spent; answering the last failure");
                break;
            }
            let pause = selector.pause(&pick, ctx.attempts, &policy);
            // The client leaving drops this future, and with it the pause and every later attempt.
            tokio::time::sleep(pause).await;
        }
        ctx.attempts += 1;
        ctx.upstream = Some(target.upstream.name.clone());
        ctx.upstream_header.clone_from(&target.upstream.name_header);
        ctx.series = ctx
            .model
            .as_ref()
            .map(|m| m.series.get(&m.name, &target.upstream.name));
        let started = tokio::time::Instant::now();
        phases::mark(Phase::Picked);
        let result = send(gw, target, &encoded, headers, &ctx.request_id, plan.stream).await;
        phases::mark(Phase::Checked);
        let elapsed = started.elapsed();
        let unhealthy = |rt: &Routing| {
            // Health follows what the target did, whatever the retry policy makes of it.
            if rt.runtime.failure(&pick.model, pick.index, elapsed) {
                tracing::warn!(upstream = %target.upstream.name, model = %pick.model.name, "target ejected");
            }
        };
        let failure = match result {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let class = RetryClass::of_status(status);
                if class.is_some() {
                    unhealthy(rt);
                }
                if class.is_some_and(|c| policy_retries(&policy, c)) {
                    ctx.log_attempt(
                        &gw.services.metrics,
                        &target.upstream,
                        Tried::Status(status),
                        elapsed,
                    );
                    if let Some(a) = retry_after(resp.headers()) {
                        selector.retry_after(&pick, a, &policy);
                        if status == 429 {
                            smallest_retry_after =
                                Some(smallest_retry_after.map_or(a, |s| s.min(a)));
                        }
                    }
                    last = Some(Failed::Status(resp, Box::new(encoded)));
                    continue;
                }
                let ok = resp.status().is_success();
                // Asked once of the answer's head: each layer below would ask it again.
                let stream = body::is_event_stream(resp.headers());
                let within = gw
                    .services
                    .limits
                    .first_byte_timeout
                    .saturating_sub(elapsed);
                match first_frame(resp, stream, within).await {
                    Ok(resp) => {
                        if class.is_none() {
                            rt.runtime
                                .success(&pick.model, pick.index, ok.then_some(elapsed));
                        }
                        ctx.log_attempt(
                            &gw.services.metrics,
                            &target.upstream,
                            Tried::Status(status),
                            started.elapsed(),
                        );
                        let meter = hold.meter.take();
                        let usage = ok.then(|| {
                            let reader = UsageReader::new(encoded.protocol, stream);
                            Usage::new(reader, ctx.fate.clone(), meter)
                        });
                        plan.served =
                            Some((encoded.protocol, target.upstream.kind != UpstreamKind::Mock));
                        let limits = gw.services.limits;
                        let resp = respond!(resp, limits, encoded.reply, &ctx.fate, usage, stream)?;
                        phases::mark(Phase::Responded);
                        // The target counts this attempt in flight until its body is dropped.
                        ctx.holds.in_flight = Some(inflight);
                        return Ok(resp);
                    }
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        ctx.log_attempt(
            &gw.services.metrics,
            &target.upstream,
            Tried::Failed(failure.retry.map_or("error", RetryClass::name)),
            elapsed,
        );
        if failure.retry.is_some() {
            unhealthy(rt);
        }
        let retryable = failure
            .retry
            .is_some_and(|class| policy_retries(&policy, class));
        last = Some(Failed::Transport(failure));
        if !retryable {
            break;
        }
    }
    match last {
        Some(Failed::Transport(e)) => Err(e),
        Some(Failed::Status(resp, encoded)) => {
            let limits = gw.services.limits;
            let stream = body::is_event_stream(resp.headers());
            let mut resp = respond!(resp, limits, encoded.reply, &ctx.fate, None, stream)?;
            if let Some(after) = smallest_retry_after.filter(|_| resp.status().as_u16() == 429) {
                let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            Ok(resp)
        }
        None => Err(refusal.unwrap_or_else(|| {
            GatewayError::new(
                ErrorKind::UpstreamUnreachable,
                format!("no target of the model {:?} could be tried", model.name),
            )
        })),
    }
}

/// True when `policy.on` lists this kind of failure.
fn policy_retries(policy: &RetryPolicy, class: RetryClass) -> bool {
    match class {
        RetryClass::Connect => policy.on.connect,
        RetryClass::Timeout => policy.on.timeout,
        RetryClass::RateLimited => policy.on.rate_limited,
        RetryClass::ServerError => policy.on.server_error,
    }
}

/// An upstream's `retry-after`, in seconds (the HTTP-date form is rare from APIs and ignored).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    let secs: f64 = v.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// Waits for a successful event stream's first body frame, so a stream that breaks before its
/// first byte is still a failure another target can mend; the frame is put back in front.
/// A JSON reply is not waited for: the extra wake-up cost its added latency 35% at 500 req/s
/// (benchbed S1), and a JSON body that breaks is rare and answered as a 502.
async fn first_frame(
    mut resp: Response<Sent>,
    stream: bool,
    within: Duration,
) -> Result<Response<Sent>, GatewayError> {
    if !resp.status().is_success() || !stream {
        return Ok(resp);
    }
    let body = resp.body_mut();
    let first = match tokio::time::timeout(within, body.frame()).await {
        Ok(Some(Ok(frame))) => Some(frame),
        Ok(None) => None,
        Ok(Some(Err(e))) => {
            return Err(GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!("the upstream reply broke before its first byte: {e}"),
            )
            .retryable(RetryClass::ServerError))
        }
        Err(_) => {
            return Err(GatewayError::upstream(
                ErrorKind::UpstreamTimeout,
                RetryClass::Timeout,
                "the upstream sent a head but no body within the first-byte timeout",
                crate::upstream::FirstByteTimeout(within),
            ))
        }
    };
    if let Some(frame) = first {
        body.put_back(frame);
    }
    Ok(resp)
}

/// A passthrough answer: the upstream's head and body, watched.
fn passthrough(
    resp: Response<Sent>,
    limits: Limits,
    guard: StreamGuard,
    strip_usage: bool,
    fate: &Fate,
    usage: Option<Usage>,
    stream: bool,
) -> Response<Body> {
    let resp = wrap_response(resp, limits, guard, fate, usage, stream);
    if strip_usage && stream {
        resp.map(|b| BodyExt::boxed(body::StripUsage::new(b)))
    } else {
        resp
    }
}

/// Sends an encoded request to its target; the answer's body is not read yet.
async fn send(
    gw: &Gateway,
    target: &Target,
    encoded: &Encoded,
    client_headers: &HeaderMap,
    request_id: &HeaderValue,
    stream: bool,
) -> Result<Response<Sent>, GatewayError> {
    let upstream = &target.upstream;
    if upstream.kind == UpstreamKind::Mock {
        let resp = mock::handle(encoded.protocol, &encoded.body, Duration::ZERO);
        return Ok(resp.map(|b| SentBody::Here(b).sent()));
    }
    let uri = upstream.uri_for(encoded.protocol).cloned().ok_or_else(|| {
        GatewayError::new(
            ErrorKind::Internal,
            format!(
                "upstream {:?} has no URL for {}",
                upstream.name,
                encoded.protocol.name()
            ),
        )
    })?;
    let headers = upstream::Headers::forward(upstream, request_id, client_headers);
    let resp = gw
        .services
        .client
        .send_forward(upstream, uri, headers, encoded.body.clone())
        .await?;
    phases::mark(Phase::Returned);
    let resp = upstream::check_answer(upstream, resp, stream, gw.services.limits.max_reply_bytes)?;
    if !resp.status().is_success() {
        tracing::info!(upstream = %upstream.name, status = resp.status().as_u16(), "upstream answered with an error");
    }
    Ok(redact_errors(
        resp,
        upstream,
        gw.services.limits.max_reply_bytes,
    ))
}

/// An upstream answer as the pipeline holds it; an error body has the upstream's credential
/// replaced if it quotes it.
fn redact_errors(
    resp: Response<upstream::UpstreamIncoming>,
    upstream: &crate::config::Upstream,
    max: u64,
) -> Response<Sent> {
    if !resp.status().is_success() {
        if let Some(secret) = upstream.quotable_credential() {
            let secret = Bytes::copy_from_slice(secret);
            return resp
                .map(|b| SentBody::Redacted(Box::new(body::Redacted::new(b, secret, max))).sent());
        }
    }
    resp.map(|b| SentBody::Upstream(b).sent())
}

/// Forwards the upstream's head (hop-by-hop headers removed) and polls its body frame by frame;
/// `stream`: the head says the body is an event stream.
fn wrap_response(
    resp: Response<Sent>,
    limits: Limits,
    guard: StreamGuard,
    fate: &Fate,
    usage: Option<Usage>,
    stream: bool,
) -> Response<Body> {
    let (mut parts, inner) = resp.into_parts();
    // Only a successful event stream is ours to police; an error body passes through as sent.
    let guard = if parts.status.is_success() && stream {
        guard
    } else {
        StreamGuard::None
    };
    upstream::keep_response_headers(&mut parts.headers);
    let limit = if stream {
        parts
            .headers
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        SizeLimit::Event(limits.max_event_bytes)
    } else {
        SizeLimit::Reply(limits.max_reply_bytes)
    };
    let inner = Metered::new(inner, usage);
    let body = UpstreamBody::for_client(inner, limits.idle_timeout, guard, fate.clone(), limit);
    let body: Body = BodyExt::boxed(body);
    Response::from_parts(parts, body)
}

/// The upstream's answer in the client's protocol: a stream translated as it arrives, or a whole
/// JSON body (reply or error) translated at once.
async fn translated_response(
    resp: Response<Sent>,
    limits: Limits,
    t: &Translation,
    fate: &Fate,
    usage: Option<Usage>,
    stream: bool,
) -> Result<Response<Body>, GatewayError> {
    let (mut parts, inner) = resp.into_parts();
    let stream = parts.status.is_success() && stream;
    let mut headers = std::mem::take(&mut parts.headers);
    upstream::keep_response_headers(&mut headers);
    // The content type is the client protocol's, set below in the upstream's one's place.
    headers.remove(header::CONTENT_ENCODING);
    if !t.dropped.is_empty() {
        let names = t.dropped.join(", ");
        tracing::info!(dropped = %names, "hosted tools left out of the translated request");
        if let Ok(v) = HeaderValue::try_from(names) {
            headers.insert(X_MODELGATE_DROPPED.clone(), v);
        }
    }
    if !stream {
        // Read in this future, not behind a box: every request's future is 512 bytes larger
        // for it (5.4 KB; it lives until the answer's head is out, never with a stream), and a
        // translated reply is spared a box and a poll of each watching layer per frame.
        let bounds = body::Bounds {
            idle: limits.idle_timeout,
            max: limits.max_reply_bytes,
            fate,
        };
        let bytes = body::collect_reply_within(inner, bounds).await?;
        let reply = t.json_reply_counted(parts.status, &bytes);
        // The translation read the reply's usage already: the counter takes it from there.
        if let Some(usage) = usage {
            usage.settle_reply(&bytes, reply.usage);
        }
        let mut resp = Response::new(body::full(reply.body));
        *resp.status_mut() = reply.status;
        *resp.headers_mut() = headers;
        // The store (`stateful::finish`) takes what it keeps of the reply from here.
        if let Some(last) = reply.last {
            resp.extensions_mut()
                .insert(translate::responses::FinalSlot::holding(last));
        }
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return Ok(resp);
    }
    // The translator bounds a stream's events itself, and reads the usage in them for the
    // request's charge. One box, around the translator: it polls the layers under it directly.
    let upstream_body = UpstreamBody::for_client(
        inner,
        limits.idle_timeout,
        StreamGuard::None,
        fate.clone(),
        SizeLimit::Unbounded,
    );
    let mut translated =
        translate::TranslateBody::new(upstream_body, t, limits.max_event_bytes).counting(usage);
    let last = translated.final_slot();
    let mut resp = Response::new(BodyExt::boxed(translated));
    // The store (`stateful::finish`) takes a kept reply's final response from here rather
    // than searching the stream for it.
    if let Some(last) = last {
        resp.extensions_mut().insert(last);
    }
    *resp.headers_mut() = headers;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

/// The slowest average pace a request body may arrive at once `client_body_timeout` has passed:
/// far below any real link, far above a client dribbling bytes to hold a connection.
const MIN_BODY_RATE: u64 = 1024;

/// How much longer than `client_body_timeout` a body that has sent `received` bytes may take.
fn body_allowance(received: u64) -> Duration {
    Duration::from_millis(received.saturating_mul(1000) / MIN_BODY_RATE)
}

/// Reads the whole request body, refusing with 413 as soon as it exceeds
/// `max_request_bytes`, and with 408 when the client is silent for `client_body_timeout` or
/// sends slower than `MIN_BODY_RATE` after it.
pub(crate) async fn read_body(
    body: ClientBody,
    headers: &HeaderMap,
    limits: &Limits,
) -> Result<Bytes, GatewayError> {
    let max = limits.max_request_bytes;
    let too_large = || {
        GatewayError::new(
            ErrorKind::TooLarge,
            format!("the request body is larger than the limit of {max} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max) {
        // A client waiting for `100 Continue` sends nothing more: the refusal alone answers it.
        if !headers.contains_key(header::EXPECT) {
            body.linger();
        }
        return Err(too_large());
    }
    // Most bodies came with their head: no frame to wait for.
    let mut body = match body {
        ClientBody::Full(bytes) => {
            let bytes = bytes.unwrap_or_default();
            if bytes.len() as u64 > max {
                return Err(too_large());
            }
            return Ok(bytes);
        }
        streaming => streaming,
    };
    // A body that came in one frame is that frame, with no list allocated.
    let mut chunks: SmallVec<[Bytes; 1]> = SmallVec::new();
    let mut total: u64 = 0;
    // The clock is read, and a timer set, only once the body has to be waited for: a small
    // body mostly came with the head, and its frames are ready when first asked for.
    let mut started = None;
    loop {
        let mut next = body.frame();
        let ready = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut next).poll(cx))).await;
        let waited = match ready {
            Poll::Ready(frame) => Ok(frame),
            Poll::Pending => {
                // Each wait is bounded by the silence allowed, and the whole body by a pace: a
                // large upload at a steady rate is fine, one byte every few seconds is not.
                let now = tokio::time::Instant::now();
                let started = *started.get_or_insert(now);
                let paced = started + limits.client_body_timeout + body_allowance(total);
                let silent = now + limits.client_body_timeout;
                match tokio::time::timeout_at(paced.min(silent), next).await {
                    Ok(frame) => Ok(frame),
                    // Which limit ran out: the pace (true) or the silence (false).
                    Err(_) => Err(paced < silent),
                }
            }
        };
        let frame = match waited {
            Err(true) => {
                return Err(GatewayError::new(
                    ErrorKind::RequestTimeout,
                    format!(
                        "the request body is arriving slower than {MIN_BODY_RATE} bytes a second \
                         (after the first {} ms)",
                        limits.client_body_timeout.as_millis()
                    ),
                ))
            }
            Err(false) => {
                return Err(GatewayError::new(
                    ErrorKind::RequestTimeout,
                    format!(
                        "the request body stalled: no bytes for {} ms",
                        limits.client_body_timeout.as_millis()
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(GatewayError::new(
                    ErrorKind::InvalidRequest,
                    format!("could not read the request body: {e}"),
                ))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            total += data.len() as u64;
            if total > max {
                body.linger();
                return Err(too_large());
            }
            chunks.push(data);
        }
    }
    Ok(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => Bytes::from(chunks.concat()),
    })
}

/// `GET /v1/models`: what the calling key may use on this address, in OpenAI's list shape.
fn list_models(rt: &Routing, address: Address, principal: &Principal) -> Response<Body> {
    let mut ids: Vec<String> = Vec::new();
    for m in rt.models.all() {
        if !m.addresses.contains(address)
            || (address == Address::TokenPlan && !m.endpoints.contains(Protocol::Chat))
        {
            continue;
        }
        for p in &principal.models {
            if p.covers(&m.pattern) {
                ids.push(m.name.clone());
                break;
            }
            // A key narrower than a pattern entry sees its own slice of it: an exact name it
            // may use (`gpt-4o` inside `gpt-*`), or its narrower pattern (`gpt-4*`).
            let narrower = match (p, &m.pattern) {
                (NamePattern::Exact(n), _) if m.pattern.matches(n) => Some(n.clone()),
                (NamePattern::Prefix(k), NamePattern::Prefix(e)) if k.starts_with(e.as_str()) => {
                    Some(format!("{k}*"))
                }
                (NamePattern::Prefix(k), NamePattern::Any) => Some(format!("{k}*")),
                _ => None,
            };
            if let Some(id) = narrower {
                let probe = id.trim_end_matches('*');
                if rt
                    .models
                    .resolve(probe, address)
                    .is_ok_and(|r| Arc::ptr_eq(r, m))
                {
                    ids.push(id);
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let data: Vec<serde_json::Value> = ids
        .into_iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "modelgate"}))
        .collect();
    let body = serde_json::json!({"object": "list", "data": data});
    let mut resp = Response::new(body::json(&body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(body::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    #[test]
    fn a_kept_path_is_the_path_and_borrows_only_a_served_llm_path() {
        for path in ["/v1/chat/completions", "/v1/messages", "/v1/responses"] {
            assert!(
                matches!(kept_path(path), Cow::Borrowed(p) if p == path),
                "{path}"
            );
        }
        for path in [
            "/v1/models",
            "/v1/chat/completions/",
            "/v1/messages/count_tokens",
            "/",
            "",
        ] {
            assert!(
                matches!(kept_path(path), Cow::Owned(p) if p == path),
                "{path}"
            );
        }
    }

    #[test]
    fn count_values_read_as_the_counts_they_stand_for() {
        for n in [0, 1, 2, 9, 10, 11, 99, 1000, u32::MAX] {
            assert_eq!(count_value(n), HeaderValue::from(n), "{n}");
        }
    }
}
