//! The TOML config: raw serde types, then one validation pass into typed, cross-checked values; every error names its key path.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;

pub use crate::domain::{Address, AddressSet, EndpointSet, NamePattern, Protocol, UpstreamKind};

/// How a model's upstream spells the thinking switch (gateway.md §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkingStyle {
    None,
    ChatTemplateKwargs,
    EnableThinking,
    ThinkingType,
    Anthropic,
    /// OpenAI's own: `reasoning_effort` on chat, `reasoning.effort` on responses.
    OpenAi,
}

impl ThinkingStyle {
    const ALL: [ThinkingStyle; 6] = [
        Self::None,
        Self::ChatTemplateKwargs,
        Self::EnableThinking,
        Self::ThinkingType,
        Self::Anthropic,
        Self::OpenAi,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ChatTemplateKwargs => "chat_template_kwargs",
            Self::EnableThinking => "enable_thinking",
            Self::ThinkingType => "thinking_type",
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
        }
    }
}

/// What a translated request does with a hosted tool its target cannot run (gateway.md §13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HostedTools {
    /// Left out of the upstream request and named in `x-modelgate-dropped`.
    #[default]
    Drop,
    /// A 400 naming the tool.
    Refuse,
}

/// A secret header value; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(HeaderValue);

impl Secret {
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }

    /// The credential itself, without an `Authorization` scheme: what an upstream would quote.
    pub fn key_bytes(&self) -> &[u8] {
        let v = self.0.as_bytes();
        v.strip_prefix(b"Bearer ").unwrap_or(v)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An upstream's `base_url`, split so a suffix joins before the query string.
#[derive(Clone, Debug)]
pub struct BaseUrl {
    pub text: String,
    scheme: String,
    authority: String,
    path: String,
    query: Option<String>,
}

impl BaseUrl {
    fn parse(text: &str) -> Result<Self, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("invalid URL {text:?}: {e}"))?;
        let scheme = uri.scheme_str().unwrap_or("");
        if scheme != "http" && scheme != "https" {
            return Err(format!("URL {text:?} must start with http:// or https://"));
        }
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .ok_or_else(|| format!("URL {text:?} has no host"))?;
        Ok(Self {
            text: text.to_owned(),
            scheme: scheme.to_owned(),
            authority,
            path: uri.path().trim_end_matches('/').to_owned(),
            query: uri.query().map(str::to_owned),
        })
    }

    /// `base_url` + `suffix`, keeping `base_url`'s query string.
    pub fn join(&self, suffix: &str) -> Result<Uri, http::Error> {
        let mut s = String::with_capacity(self.text.len() + suffix.len() + 8);
        s.push_str(&self.scheme);
        s.push_str("://");
        s.push_str(&self.authority);
        s.push_str(&self.path);
        s.push_str(suffix);
        if let Some(q) = &self.query {
            s.push('?');
            s.push_str(q);
        }
        Ok(Uri::try_from(s)?)
    }
}

#[derive(Debug)]
pub struct Upstream {
    pub name: Arc<str>,
    /// `name` as the `x-modelgate-upstream` header every answer carries, made once here (`None`
    /// for a name no header can hold).
    pub name_header: Option<HeaderValue>,
    pub kind: UpstreamKind,
    pub base_url: Option<BaseUrl>,
    pub credential: Option<Secret>,
    /// `veo-vertex` without `api_key_env`: tokens from a service-account key or the metadata
    /// server, fetched when needed (the static `credential` is then `None`).
    pub google: Option<Arc<crate::google_auth::GoogleAuth>>,
    /// `veo-vertex`: the `gs://` prefix results are written under (`storageUri`), unless the model names its own.
    pub storage_uri: Option<String>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Client headers forwarded to this upstream beyond the built-in allowlist (gateway.md §14).
    pub forward_headers: Vec<HeaderName>,
    /// Prebuilt URLs for the three LLM protocols, indexed by `Protocol as usize`.
    pub protocol_uris: [Option<Uri>; 3],
    /// For the built-in mock: the protocol it is spoken to in (`protocol = "chat"` by default).
    pub mock_protocol: Option<Protocol>,
    /// Its `upstream_attempts` counters, once looked up.
    pub attempts: crate::metrics::AttemptCache,
}

impl Upstream {
    /// The credential as an upstream would quote it back, when it is long enough to replace in
    /// text without hitting ordinary words (real keys are far longer than eight bytes).
    pub fn quotable_credential(&self) -> Option<&[u8]> {
        self.credential
            .as_ref()
            .map(Secret::key_bytes)
            .filter(|k| k.len() >= 8)
    }

    /// The LLM protocol requests to this upstream are written in; the mock's is configurable.
    pub fn protocol(&self) -> Option<Protocol> {
        self.kind.protocol().or(self.mock_protocol)
    }

    pub fn uri_for(&self, protocol: Protocol) -> Option<&Uri> {
        self.protocol_uris[protocol as usize].as_ref()
    }
}

/// One deployment that can serve a model: an upstream, the name it knows the model by, and how
/// it spells what differs between deployments.
#[derive(Debug)]
pub struct Target {
    pub upstream: Arc<Upstream>,
    pub upstream_model: Option<String>,
    /// Share of the `weighted` strategy's picks; at least 1.
    pub weight: u32,
    /// The model's `thinking` unless the target says otherwise.
    pub thinking: ThinkingStyle,
    /// The model's `default_max_tokens` unless the target says otherwise.
    pub default_max_tokens: Option<u32>,
    /// The model's `hosted_tools`: each target reads it when its request is translated.
    pub hosted_tools: HostedTools,
}

impl Target {
    /// The LLM protocol this target is spoken to in.
    pub fn protocol(&self) -> Option<Protocol> {
        self.upstream.protocol()
    }

    /// The model name to send: the configured rename, or what the client asked for.
    pub fn model_name<'a>(&'a self, requested: &'a str) -> &'a str {
        self.upstream_model.as_deref().unwrap_or(requested)
    }
}

/// How a model's targets are chosen for each attempt (gateway.md §10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Random, in proportion to each target's weight.
    Weighted,
    /// The target with the fewest requests (streams included) in flight.
    LeastInflight,
    /// Power of two choices over an EWMA of each target's time to first byte.
    Latency,
}

impl Strategy {
    const ALL: [Strategy; 3] = [Self::Weighted, Self::LeastInflight, Self::Latency];

    pub fn name(self) -> &'static str {
        match self {
            Self::Weighted => "weighted",
            Self::LeastInflight => "least_inflight",
            Self::Latency => "latency",
        }
    }
}

/// Which failures before the first byte are worth another attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryOn {
    pub connect: bool,
    pub timeout: bool,
    pub rate_limited: bool,
    pub server_error: bool,
}

impl RetryOn {
    pub const ALL: Self = Self {
        connect: true,
        timeout: true,
        rate_limited: true,
        server_error: true,
    };
}

/// Attempts, backoff and budget: `[retry]`, overridable per model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in all, across targets and fallbacks; 1 means no retry.
    pub attempts: u32,
    pub on: RetryOn,
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub retry_after_max: Duration,
    pub budget_percent: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            on: RetryOn::ALL,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(2000),
            retry_after_max: Duration::from_millis(10_000),
            budget_percent: 20,
        }
    }
}

/// Passive health: `[health]`, overridable per model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Consecutive failures that eject a target; 0 never ejects.
    pub eject_after: u32,
    /// The first ejection's length; each repeat doubles it up to `MAX_EJECTION`.
    pub eject: Duration,
}

impl HealthPolicy {
    pub const MAX_EJECTION: Duration = Duration::from_secs(600);
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            eject_after: 5,
            eject: Duration::from_millis(10_000),
        }
    }
}

#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub pattern: NamePattern,
    /// Position in `Config::models`; runtime state (health, budget) is kept by this index.
    pub index: usize,
    /// At least one; the first is the one-target shorthand's.
    pub targets: Vec<Target>,
    pub strategy: Strategy,
    /// Other model names, tried in order once every target failed.
    pub fallbacks: Vec<String>,
    pub retry: RetryPolicy,
    pub health: HealthPolicy,
    pub endpoints: EndpointSet,
    pub addresses: AddressSet,
    pub vision: bool,
    pub thinking: ThinkingStyle,
    pub default_max_tokens: Option<u32>,
    /// `veo-vertex`: where results are written (`storageUri`); the upstream's when unset.
    pub storage_uri: Option<String>,
    pub hosted_tools: HostedTools,
    /// The metrics series of its requests, by the upstream that answered, once looked up.
    pub series: crate::metrics::RouteCache,
}

impl Model {
    /// The first target: the only one a video model has.
    pub fn primary(&self) -> &Target {
        // Validation never builds a model without a target.
        &self.targets[0]
    }
}

/// How a client key is stored.
#[derive(Debug, Clone)]
pub struct Key {
    pub name: String,
    pub digest: [u8; 32],
    /// True for a plaintext key in the file; allowed for demos, warned about at start.
    pub plaintext: Option<String>,
    pub addresses: AddressSet,
    pub models: Vec<NamePattern>,
    pub limits: KeyLimits,
}

/// A key's share of the upstreams (gateway.md §11); `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// Requests per minute, smoothed by GCRA with a burst of a tenth of it.
    pub rpm: Option<u32>,
    /// Input plus output tokens per minute, charged from each reply's usage.
    pub tpm: Option<u64>,
    /// Requests open at once, streams until their last byte.
    pub max_concurrent: Option<u32>,
    /// Input plus output tokens per UTC day.
    pub daily_tokens: Option<u64>,
}

impl KeyLimits {
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }

    /// Whether replies must be read for their usage.
    pub fn counts_tokens(&self) -> bool {
        self.tpm.is_some() || self.daily_tokens.is_some()
    }
}

/// What a request gets while the shared store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    /// Served, with a warning and a metric: limits lapse rather than the service.
    Allow,
    /// Refused with 503 `store_unavailable`.
    Deny,
}

/// How log lines are written: `text` for people, `json` (one object per line) for collectors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "text" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// `[store]`: where shared state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// The Redis (or Valkey) URL, read from `redis_url_env`; `None` keeps state in this process.
    pub redis_url: Option<Secret>,
    pub redis_url_env: Option<String>,
    pub on_error: OnStoreError,
    /// How long a stored `/v1/responses` answer stays retrievable (`responses_ttl_s`).
    pub responses_ttl: std::time::Duration,
    /// The in-process cap on stored responses, in bytes (`responses_max_mb`); Redis has its own
    /// `maxmemory`.
    pub responses_max_bytes: u64,
}

/// Stored responses live a day unless `[store] responses_ttl_s` says otherwise.
pub const DEFAULT_RESPONSES_TTL_S: u64 = 86_400;
/// The in-process response store's cap unless `[store] responses_max_mb` says otherwise.
pub const DEFAULT_RESPONSES_MAX_MB: u64 = 256;

/// `[server]`: how the gateway's connections are spread over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerSettings {
    /// Event loops, each a thread with its own single-threaded runtime that accepts and serves
    /// whole connections (with their upstream connections), so no request's work hops between
    /// threads. 0 serves everything on the runtime that started the gateway.
    pub workers: usize,
}

impl Default for ServerSettings {
    /// One event loop per core, as nginx's `worker_processes auto`.
    fn default() -> Self {
        Self {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_request_bytes: u64,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    /// A client connection with no request in progress is closed after this much silence,
    /// counted from accept (so a connection that never sends a byte is closed too).
    pub client_idle_timeout: Duration,
    /// The longest silence while a request body is being read.
    pub client_body_timeout: Duration,
    /// Connections per listener; past it the listener stops accepting until one closes.
    pub max_connections: usize,
    /// A non-streamed upstream reply longer than this ends the request with 502.
    pub max_reply_bytes: u64,
    /// One server-sent event longer than this ends the stream with the protocol's error.
    pub max_event_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub base: SocketAddr,
    pub token_plan: Option<SocketAddr>,
    pub video: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
}

impl Listen {
    pub fn get(&self, a: Address) -> Option<SocketAddr> {
        match a {
            Address::Base => Some(self.base),
            Address::TokenPlan => self.token_plan,
            Address::Video => self.video,
            Address::Admin => self.admin,
        }
    }
}

#[derive(Debug, Clone)]
pub struct VideoSettings {
    /// The verification secrets; the first signs. Empty means "make a random one per process".
    pub task_secrets: Vec<Vec<u8>>,
    pub task_secrets_env: String,
    pub public_url: Option<String>,
    pub file_url_ttl: Duration,
    pub status_cache: Duration,
    /// Root of the Cloud Storage JSON API that `gs://` results are downloaded from.
    pub gcs_api_url: String,
    /// `Host` values (lowercase `host[:port]`, or a bare host for any port) that file URLs may be built from.
    pub trusted_hosts: Vec<String>,
}

/// The validated configuration.
pub struct Config {
    pub listen: Listen,
    pub server: ServerSettings,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// SHA-256 over the TLS files' paths and contents: a reload compares it to see a change.
    pub tls_fingerprint: Option<[u8; 32]>,
    pub limits: Limits,
    pub store: StoreSettings,
    pub log_format: LogFormat,
    pub video: VideoSettings,
    pub keys: Vec<Key>,
    pub upstreams: Vec<Arc<Upstream>>,
    pub models: Vec<Arc<Model>>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("tls", &self.tls.is_some())
            .field("limits", &self.limits)
            .field("models", &self.models.len())
            .finish_non_exhaustive()
    }
}

/// Every problem found in a config file, each prefixed by its key path.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(e)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl Config {
    /// Reads and validates the file at `path`, with secrets from the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors(vec![format!("{}: cannot read: {e}", path.display())]))?;
        let base_dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base_dir, &|name| std::env::var(name).ok())
    }

    /// Validates config text; `env` resolves secret variables and `base_dir` relative TLS paths.
    pub fn parse(
        text: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        validate::parse(text, base_dir, env)
    }

    /// What differs from `self` in `next` that only a restart applies: listeners, TLS files,
    /// and the `[limits]` the upstream client and listeners were built with.
    pub fn restart_needed(&self, next: &Config) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.listen != next.listen {
            out.push("listen");
        }
        if self.server != next.server {
            out.push("server");
        }
        if self.tls_fingerprint != next.tls_fingerprint {
            out.push("tls");
        }
        if self.limits != next.limits {
            out.push("limits");
        }
        if self.store != next.store {
            out.push("store");
        }
        out
    }

    /// The routing table as `modelgate check` prints it: one row per target, so every
    /// deployment a model can reach is listed, then each model's fallbacks.
    pub fn routing_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let mut rows: Vec<[String; 8]> = Vec::new();
        for m in &self.models {
            let endpoints = if m.primary().upstream.kind.is_video()
                || m.addresses == AddressSet::only(Address::Video)
            {
                "video".to_owned()
            } else {
                m.endpoints
                    .iter()
                    .map(Protocol::name)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            for t in &m.targets {
                let kind = match (t.upstream.kind, t.upstream.mock_protocol) {
                    (UpstreamKind::Mock, Some(p)) if !m.primary().upstream.kind.is_video() => {
                        format!("mock({})", p.name())
                    }
                    (k, _) => k.name().to_owned(),
                };
                rows.push([
                    m.name.clone(),
                    t.upstream.name.to_string(),
                    kind,
                    t.upstream_model.clone().unwrap_or_else(|| "(same)".into()),
                    if m.targets.len() > 1 {
                        format!("{}", t.weight)
                    } else {
                        "-".into()
                    },
                    if m.targets.len() > 1 {
                        m.strategy.name().to_owned()
                    } else {
                        "-".into()
                    },
                    endpoints.clone(),
                    m.addresses.names().join(","),
                ]);
            }
        }
        let header = [
            "MODEL",
            "UPSTREAM",
            "KIND",
            "UPSTREAM MODEL",
            "WEIGHT",
            "STRATEGY",
            "ENDPOINTS",
            "ADDRESSES",
        ];
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let mut line = |cells: Vec<&str>| {
            let mut l = String::new();
            for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(cell);
                } else {
                    let _ = write!(l, "{cell:<w$}  ");
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(header.to_vec());
        for row in &rows {
            line(row.iter().map(String::as_str).collect());
        }
        let _ = writeln!(out);
        for m in self.models.iter().filter(|m| !m.fallbacks.is_empty()) {
            let _ = writeln!(out, "fallbacks {}: {}", m.name, m.fallbacks.join(" → "));
        }
        if self.models.iter().any(|m| !m.fallbacks.is_empty()) {
            let _ = writeln!(out);
        }
        for a in [
            Address::Base,
            Address::TokenPlan,
            Address::Video,
            Address::Admin,
        ] {
            if let Some(addr) = self.listen.get(a) {
                let _ = writeln!(out, "listen {:<10} {addr}", a.name());
            }
        }
        out
    }
}

mod validate;

#[cfg(test)]
mod tests;
