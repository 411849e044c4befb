//! Config validation: raw serde types for each section, then the checks that turn them into typed values, each error with its key path.

use super::*;

// === raw serde types ===

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    base: String,
    token_plan: Option<String>,
    video: Option<String>,
    admin: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_request_bytes: Option<u64>,
    connect_timeout_ms: Option<u64>,
    first_byte_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    client_idle_timeout_ms: Option<u64>,
    client_body_timeout_ms: Option<u64>,
    max_connections: Option<u64>,
    max_reply_bytes: Option<u64>,
    max_event_bytes: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawVideo {
    task_secrets_env: Option<String>,
    public_url: Option<String>,
    file_url_ttl_s: Option<u64>,
    status_cache_ms: Option<u64>,
    gcs_api_url: Option<String>,
    #[serde(default)]
    trusted_hosts: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    name: String,
    key: Option<String>,
    sha256: Option<String>,
    key_env: Option<String>,
    addresses: Option<Vec<String>>,
    models: Option<Vec<String>>,
    rpm: Option<u32>,
    tpm: Option<u64>,
    max_concurrent: Option<u32>,
    daily_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    workers: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawStore {
    redis_url_env: Option<String>,
    on_error: Option<String>,
    responses_ttl_s: Option<i64>,
    responses_max_mb: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    name: String,
    kind: String,
    base_url: Option<String>,
    api_key_env: Option<String>,
    /// `veo-vertex`: a service-account JSON key file (else `GOOGLE_APPLICATION_CREDENTIALS`).
    credentials_file: Option<PathBuf>,
    /// `veo-vertex`: the metadata server's root (else `GCE_METADATA_HOST`, else Google's default).
    metadata_url: Option<String>,
    /// `veo-vertex`: `storageUri`, the `gs://` prefix results are written under.
    storage_uri: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Client headers this upstream also receives, beyond the built-in allowlist.
    #[serde(default)]
    forward_headers: Vec<String>,
    /// Only for `kind = "mock"`: the protocol it is spoken to in.
    protocol: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    upstream: String,
    upstream_model: Option<String>,
    weight: Option<u32>,
    thinking: Option<String>,
    default_max_tokens: Option<u32>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<u32>,
    on: Option<Vec<String>>,
    backoff_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
    retry_after_max_ms: Option<u64>,
    budget_percent: Option<u32>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    eject_after: Option<u32>,
    eject_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    upstream: Option<String>,
    upstream_model: Option<String>,
    targets: Option<Vec<RawTarget>>,
    strategy: Option<String>,
    #[serde(default)]
    fallbacks: Vec<String>,
    retry: Option<RawRetry>,
    health: Option<RawHealth>,
    endpoints: Option<Vec<String>>,
    addresses: Option<Vec<String>>,
    #[serde(default)]
    vision: bool,
    thinking: Option<String>,
    default_max_tokens: Option<u32>,
    /// `veo-vertex` models: `storageUri`, overriding the upstream's.
    storage_uri: Option<String>,
    hosted_tools: Option<String>,
}

const TOP_KEYS: &[&str] = &[
    "listen",
    "server",
    "tls",
    "limits",
    "retry",
    "health",
    "store",
    "log",
    "video",
    "keys",
    "upstreams",
    "models",
];

/// Collects errors with their key paths while validation goes on.
struct Errors(Vec<String>);

impl Errors {
    fn push(&mut self, path: impl fmt::Display, msg: impl fmt::Display) {
        self.0.push(format!("{path}: {msg}"));
    }
}

/// Deserialises one table, reporting a type error or unknown key under `path`.
fn section<T: for<'de> Deserialize<'de>>(
    value: toml::Value,
    path: &str,
    errors: &mut Errors,
) -> Option<T> {
    match T::deserialize(value) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(path, e.message().trim_end());
            None
        }
    }
}

/// Deserialises an array of tables, one error per bad element.
fn array_section<T: for<'de> Deserialize<'de>>(
    value: toml::Value,
    path: &str,
    errors: &mut Errors,
) -> Vec<Option<T>> {
    match value {
        toml::Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| section(item, &format!("{path}[{i}]"), errors))
            .collect(),
        _ => {
            errors.push(path, "must be an array of tables ([[...]])");
            Vec::new()
        }
    }
}

/// Validates config text; `env` resolves secret variables and `base_dir` relative TLS paths.
pub(super) fn parse(
    text: &str,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigErrors(vec![format!("syntax: {e}")]))?;
    let mut errors = Errors(Vec::new());
    for key in table.keys() {
        if !TOP_KEYS.contains(&key.as_str()) {
            errors.push(
                key,
                format!("unknown key; expected one of {}", TOP_KEYS.join(", ")),
            );
        }
    }
    let mut table = table;
    let raw_listen: Option<RawListen> = match table.remove("listen") {
        Some(v) => section(v, "listen", &mut errors),
        None => {
            errors.push(
                "listen",
                "missing; at least `base = \"host:port\"` is required",
            );
            None
        }
    };
    let raw_server: RawServer = table
        .remove("server")
        .and_then(|v| section(v, "server", &mut errors))
        .unwrap_or_default();
    let raw_tls: Option<RawTls> = table
        .remove("tls")
        .and_then(|v| section(v, "tls", &mut errors));
    let raw_limits: RawLimits = table
        .remove("limits")
        .and_then(|v| section(v, "limits", &mut errors))
        .unwrap_or_default();
    let raw_retry: RawRetry = table
        .remove("retry")
        .and_then(|v| section(v, "retry", &mut errors))
        .unwrap_or_default();
    let raw_health: RawHealth = table
        .remove("health")
        .and_then(|v| section(v, "health", &mut errors))
        .unwrap_or_default();
    let raw_store: RawStore = table
        .remove("store")
        .and_then(|v| section(v, "store", &mut errors))
        .unwrap_or_default();
    let raw_log: RawLog = table
        .remove("log")
        .and_then(|v| section(v, "log", &mut errors))
        .unwrap_or_default();
    let log_format = match raw_log.format.as_deref() {
        None => LogFormat::Text,
        Some(f) => LogFormat::parse(f).unwrap_or_else(|| {
            errors.push(
                "log.format",
                format!("unknown value {f:?}; allowed: text, json"),
            );
            LogFormat::Text
        }),
    };
    let raw_video: RawVideo = table
        .remove("video")
        .and_then(|v| section(v, "video", &mut errors))
        .unwrap_or_default();
    let raw_keys: Vec<Option<RawKey>> = table
        .remove("keys")
        .map(|v| array_section(v, "keys", &mut errors))
        .unwrap_or_default();
    let raw_upstreams: Vec<Option<RawUpstream>> = table
        .remove("upstreams")
        .map(|v| array_section(v, "upstreams", &mut errors))
        .unwrap_or_default();
    let raw_models: Vec<Option<RawModel>> = table
        .remove("models")
        .map(|v| array_section(v, "models", &mut errors))
        .unwrap_or_default();

    let listen = raw_listen.and_then(|l| validate_listen(l, &mut errors));
    let mut tls_fingerprint = None;
    let tls = raw_tls.and_then(|t| {
        let cert = base_dir.join(&t.cert);
        let key = base_dir.join(&t.key);
        tls_fingerprint = Some(fingerprint(&[&cert, &key]));
        match crate::tls::server_config(&cert, &key) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                errors.push("tls", e);
                None
            }
        }
    });
    let limits = validate_limits(&raw_limits, &mut errors);
    let server = validate_server(&raw_server, &mut errors);
    let video = validate_video(raw_video, env, &mut errors);
    let store = validate_store(raw_store, env, &mut errors);
    let upstreams = validate_upstreams(raw_upstreams, env, base_dir, &mut errors);
    let defaults = Defaults {
        retry: validate_retry(&raw_retry, RetryPolicy::default(), "retry", &mut errors),
        health: validate_health(&raw_health, HealthPolicy::default(), "health", &mut errors),
    };
    let models = validate_models(
        raw_models,
        &upstreams,
        listen.as_ref(),
        &defaults,
        &mut errors,
    );
    let keys = validate_keys(raw_keys, env, &mut errors);

    match listen {
        Some(listen) if errors.0.is_empty() => Ok(Config {
            listen,
            server,
            tls,
            tls_fingerprint,
            limits,
            store,
            log_format,
            video,
            keys,
            upstreams,
            models,
        }),
        _ => Err(ConfigErrors(errors.0)),
    }
}

/// SHA-256 over files' paths and contents (an unreadable file counts as empty; loading it
/// reports the error).
fn fingerprint(files: &[&Path]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for f in files {
        h.update(f.as_os_str().as_encoded_bytes());
        h.update([0]);
        h.update(std::fs::read(f).unwrap_or_default());
        h.update([0]);
    }
    h.finalize().into()
}

fn validate_listen(raw: RawListen, errors: &mut Errors) -> Option<Listen> {
    let mut parse = |name: &str, text: &str| -> Option<SocketAddr> {
        match text.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                errors.push(
                    format!("listen.{name}"),
                    format!("invalid address {text:?}; expected host:port like \"127.0.0.1:8080\""),
                );
                None
            }
        }
    };
    let base = parse("base", &raw.base);
    let token_plan = raw
        .token_plan
        .as_deref()
        .and_then(|t| parse("token_plan", t));
    let video = raw.video.as_deref().and_then(|t| parse("video", t));
    let admin = raw.admin.as_deref().and_then(|t| parse("admin", t));
    let mut seen: Vec<(&str, SocketAddr)> = Vec::new();
    for (name, addr) in [
        ("base", base),
        ("token_plan", token_plan),
        ("video", video),
        ("admin", admin),
    ] {
        if let Some(addr) = addr {
            if let Some((other, _)) = seen.iter().find(|(_, a)| *a == addr && addr.port() != 0) {
                errors.push(
                    format!("listen.{name}"),
                    format!("address {addr} is already used by listen.{other}"),
                );
            }
            seen.push((name, addr));
        }
    }
    Some(Listen {
        base: base?,
        token_plan,
        video,
        admin,
    })
}

/// Most event loops one gateway runs: far past any core count, and each costs a thread.
const MAX_WORKERS: i64 = 1024;

fn validate_server(raw: &RawServer, errors: &mut Errors) -> ServerSettings {
    let workers = match raw.workers {
        None => ServerSettings::default().workers,
        Some(n) if (0..=MAX_WORKERS).contains(&n) => n as usize,
        Some(n) => {
            errors.push(
                "server.workers",
                format!("{n} is out of range; allowed: 0 (the starting runtime) to {MAX_WORKERS}"),
            );
            1
        }
    };
    ServerSettings { workers }
}

fn validate_limits(raw: &RawLimits, errors: &mut Errors) -> Limits {
    let mut ms = |name: &str, v: Option<u64>, default: u64| {
        let v = v.unwrap_or(default);
        if v == 0 {
            errors.push(format!("limits.{name}"), "must be greater than 0");
        }
        Duration::from_millis(v)
    };
    let limits = Limits {
        max_request_bytes: raw.max_request_bytes.unwrap_or(32 * 1024 * 1024),
        connect_timeout: ms("connect_timeout_ms", raw.connect_timeout_ms, 5_000),
        first_byte_timeout: ms("first_byte_timeout_ms", raw.first_byte_timeout_ms, 300_000),
        idle_timeout: ms("idle_timeout_ms", raw.idle_timeout_ms, 300_000),
        client_idle_timeout: ms("client_idle_timeout_ms", raw.client_idle_timeout_ms, 60_000),
        client_body_timeout: ms("client_body_timeout_ms", raw.client_body_timeout_ms, 30_000),
        max_connections: usize::try_from(raw.max_connections.unwrap_or(10_000))
            .unwrap_or(usize::MAX),
        max_reply_bytes: raw.max_reply_bytes.unwrap_or(64 * 1024 * 1024),
        max_event_bytes: usize::try_from(raw.max_event_bytes.unwrap_or(16 * 1024 * 1024))
            .unwrap_or(usize::MAX),
    };
    for (name, v) in [
        ("max_request_bytes", limits.max_request_bytes),
        ("max_connections", limits.max_connections as u64),
        ("max_reply_bytes", limits.max_reply_bytes),
        ("max_event_bytes", limits.max_event_bytes as u64),
    ] {
        if v == 0 {
            errors.push(format!("limits.{name}"), "must be greater than 0");
        }
    }
    // Each connection holds a semaphore permit; tokio's semaphore holds at most this many.
    let most = tokio::sync::Semaphore::MAX_PERMITS;
    if limits.max_connections > most {
        errors.push(
            "limits.max_connections",
            format!("must be at most {most} (one permit per connection)"),
        );
    }
    limits
}

fn validate_video(
    raw: RawVideo,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
) -> VideoSettings {
    let task_secrets_env = raw
        .task_secrets_env
        .unwrap_or_else(|| "MODELGATE_TASK_SECRETS".to_owned());
    // An unset variable is allowed (a random secret is made at start, with a warning);
    // a set one must hold usable secrets.
    let task_secrets = match env(&task_secrets_env) {
        Some(v) => {
            let secrets: Vec<Vec<u8>> = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec())
                .collect();
            if secrets.is_empty() {
                errors.push(
                    "video.task_secrets_env",
                    format!("environment variable {task_secrets_env} is set but holds no secret"),
                );
            }
            secrets
        }
        None => Vec::new(),
    };
    if let Some(url) = &raw.public_url {
        if let Err(e) = BaseUrl::parse(url) {
            errors.push("video.public_url", e);
        }
    }
    if let Some(url) = &raw.gcs_api_url {
        if let Err(e) = BaseUrl::parse(url) {
            errors.push("video.gcs_api_url", e);
        }
    }
    let mut trusted_hosts = Vec::new();
    for (i, h) in raw.trusted_hosts.iter().enumerate() {
        let ok = !h.is_empty()
            && h.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
            });
        if ok {
            trusted_hosts.push(h.to_ascii_lowercase());
        } else {
            errors.push(
                format!("video.trusted_hosts[{i}]"),
                format!("{h:?} is not a host or host:port"),
            );
        }
    }
    if raw.file_url_ttl_s == Some(0) {
        errors.push("video.file_url_ttl_s", "must be greater than 0");
    }
    VideoSettings {
        task_secrets,
        task_secrets_env,
        public_url: raw.public_url.map(|u| u.trim_end_matches('/').to_owned()),
        file_url_ttl: Duration::from_secs(raw.file_url_ttl_s.unwrap_or(86_400)),
        status_cache: Duration::from_millis(raw.status_cache_ms.unwrap_or(1_000)),
        gcs_api_url: raw.gcs_api_url.map_or_else(
            || "https://storage.googleapis.com".to_owned(),
            |u| u.trim_end_matches('/').to_owned(),
        ),
        trusted_hosts,
    }
}

/// A `storage_uri`: `gs://bucket/` and an optional prefix; only Vertex can write there.
fn check_storage_uri(uri: &str, path: String, vertex: bool, errors: &mut Errors) {
    if !vertex {
        errors.push(
            path,
            "only a veo-vertex upstream writes results to Cloud Storage",
        );
        return;
    }
    let bucket = uri
        .strip_prefix("gs://")
        .map(|rest| rest.split('/').next().unwrap_or(""));
    if bucket.is_none_or(str::is_empty) {
        errors.push(
            path,
            format!("{uri:?} must be a Cloud Storage address, gs://bucket/prefix/"),
        );
    }
}

/// A Vertex upstream's credential when `api_key_env` names none: a key file, else the metadata server.
fn google_source(
    u: &RawUpstream,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
    base_dir: &Path,
    errors: &mut Errors,
) -> Option<crate::google_auth::Source> {
    use crate::google_auth::{Source, DEFAULT_METADATA_ROOT};
    let from_env = env("GOOGLE_APPLICATION_CREDENTIALS").filter(|v| !v.is_empty());
    let file = u
        .credentials_file
        .clone()
        .map(|f| (base_dir.join(f), format!("{path}.credentials_file")))
        .or_else(|| {
            from_env.map(|f| {
                (
                    PathBuf::from(f),
                    format!("{path}.credentials_file (from GOOGLE_APPLICATION_CREDENTIALS)"),
                )
            })
        });
    let result = match file {
        Some((file, key)) => Source::from_key_file(&file).map_err(|e| (key, e)),
        None => {
            let root = match (&u.metadata_url, env("GCE_METADATA_HOST")) {
                (Some(url), _) => url.clone(),
                // Google's libraries take a bare host[:port] here.
                (None, Some(host)) if !host.is_empty() => format!("http://{host}"),
                _ => DEFAULT_METADATA_ROOT.to_owned(),
            };
            Source::metadata(&root).map_err(|e| (format!("{path}.metadata_url"), e))
        }
    };
    match result {
        Ok(s) => Some(s),
        Err((key, e)) => {
            errors.push(key, e);
            None
        }
    }
}

fn validate_store(
    raw: RawStore,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
) -> StoreSettings {
    let on_error = match raw.on_error.as_deref() {
        None | Some("allow") => OnStoreError::Allow,
        Some("deny") => OnStoreError::Deny,
        Some(other) => {
            errors.push(
                "store.on_error",
                format!("unknown value {other:?}; allowed: allow, deny"),
            );
            OnStoreError::Allow
        }
    };
    let redis_url = raw.redis_url_env.as_deref().and_then(|var| {
        let url = env_secret(env, var, "store.redis_url_env".to_owned(), errors)?;
        if !(url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("redis+unix://")
            || url.starts_with("unix://"))
        {
            // The value is a secret (it may hold a password): name the variable, not the URL.
            errors.push(
                "store.redis_url_env",
                format!("the value of {var} must be a redis://, rediss:// or unix:// URL"),
            );
            return None;
        }
        match HeaderValue::try_from(url) {
            Ok(mut v) => {
                v.set_sensitive(true);
                Some(Secret(v))
            }
            Err(_) => {
                errors.push(
                    "store.redis_url_env",
                    format!("the value of {var} is not a valid URL"),
                );
                None
            }
        }
    });
    // A zero TTL or cap would store nothing while promising GET and previous_response_id.
    let mut positive = |value: Option<i64>, name: &str, default: u64, max: u64| match value {
        None => default,
        Some(v) if v >= 1 && v.unsigned_abs() <= max => v.unsigned_abs(),
        Some(v) => {
            errors.push(
                format!("store.{name}"),
                format!("must be between 1 and {max}; got {v}"),
            );
            default
        }
    };
    // A year, and a terabyte: far past any sane value, low enough that no arithmetic overflows.
    let ttl_s = positive(
        raw.responses_ttl_s,
        "responses_ttl_s",
        crate::config::DEFAULT_RESPONSES_TTL_S,
        365 * 86_400,
    );
    let max_mb = positive(
        raw.responses_max_mb,
        "responses_max_mb",
        crate::config::DEFAULT_RESPONSES_MAX_MB,
        1 << 20,
    );
    StoreSettings {
        redis_url,
        redis_url_env: raw.redis_url_env,
        on_error,
        responses_ttl: std::time::Duration::from_secs(ttl_s),
        responses_max_bytes: max_mb * 1024 * 1024,
    }
}

/// Reads a secret from the environment; a missing or empty variable is an error at `path`.
fn env_secret(
    env: &dyn Fn(&str) -> Option<String>,
    var: &str,
    path: String,
    errors: &mut Errors,
) -> Option<String> {
    match env(var) {
        Some(v) if !v.is_empty() => Some(v),
        _ => {
            errors.push(path, format!("environment variable {var} is not set"));
            None
        }
    }
}

fn validate_upstreams(
    raw: Vec<Option<RawUpstream>>,
    env: &dyn Fn(&str) -> Option<String>,
    base_dir: &Path,
    errors: &mut Errors,
) -> Vec<Arc<Upstream>> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, u) in raw.into_iter().enumerate() {
        let Some(u) = u else { continue };
        let path = format!("upstreams[{i}]");
        if u.name.is_empty() {
            errors.push(format!("{path}.name"), "must not be empty");
        } else if !names.insert(u.name.clone()) {
            errors.push(
                format!("{path}.name"),
                format!("duplicate upstream name {:?}", u.name),
            );
        }
        let Some(kind) = UpstreamKind::ALL.into_iter().find(|k| k.name() == u.kind) else {
            let allowed: Vec<_> = UpstreamKind::ALL.iter().map(|k| k.name()).collect();
            errors.push(
                format!("{path}.kind"),
                format!("unknown kind {:?}; allowed: {}", u.kind, allowed.join(", ")),
            );
            continue;
        };
        let base_url = match (&u.base_url, kind) {
            (Some(_), UpstreamKind::Mock) => {
                errors.push(
                    format!("{path}.base_url"),
                    "a mock upstream is built in and takes no base_url",
                );
                None
            }
            (None, UpstreamKind::Mock) => None,
            (None, _) => {
                errors.push(
                    format!("{path}.base_url"),
                    format!("required for kind {:?}", kind.name()),
                );
                None
            }
            (Some(text), _) => match BaseUrl::parse(text) {
                Ok(b) => Some(b),
                Err(e) => {
                    errors.push(format!("{path}.base_url"), e);
                    None
                }
            },
        };
        let credential = match &u.api_key_env {
            Some(var) => {
                env_secret(env, var, format!("{path}.api_key_env"), errors).and_then(|value| {
                    let formatted = match kind {
                        UpstreamKind::Messages | UpstreamKind::VeoGemini => value,
                        _ => format!("Bearer {value}"),
                    };
                    match HeaderValue::try_from(formatted) {
                        Ok(mut hv) => {
                            hv.set_sensitive(true);
                            Some(Secret(hv))
                        }
                        Err(_) => {
                            errors.push(
                                format!("{path}.api_key_env"),
                                format!("the value of {var} is not a valid header value"),
                            );
                            None
                        }
                    }
                })
            }
            None => {
                // Vertex finds its credential as Google's libraries do (below); Gemini needs its key.
                if kind == UpstreamKind::VeoGemini {
                    errors.push(
                        format!("{path}.api_key_env"),
                        format!("required for kind {:?}", kind.name()),
                    );
                }
                None
            }
        };
        let google = if kind != UpstreamKind::VeoVertex {
            for (set, key) in [
                (u.credentials_file.is_some(), "credentials_file"),
                (u.metadata_url.is_some(), "metadata_url"),
                (u.storage_uri.is_some(), "storage_uri"),
            ] {
                if set {
                    errors.push(
                        format!("{path}.{key}"),
                        "only a veo-vertex upstream takes this key",
                    );
                }
            }
            None
        } else if u.api_key_env.is_some() {
            if u.credentials_file.is_some() || u.metadata_url.is_some() {
                errors.push(
                    path.clone(),
                    "give either `api_key_env` (a static token) or `credentials_file`/`metadata_url`, not both",
                );
            }
            None
        } else {
            google_source(&u, &path, env, base_dir, errors)
                .map(|s| Arc::new(crate::google_auth::GoogleAuth::new(s, &u.name)))
        };
        if let Some(uri) = &u.storage_uri {
            if kind == UpstreamKind::VeoVertex {
                check_storage_uri(uri, format!("{path}.storage_uri"), true, errors);
            }
        }
        let mut headers = Vec::new();
        for (name, value) in &u.headers {
            let hpath = format!("{path}.headers.{name}");
            match (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                (Ok(n), Ok(v)) => headers.push((n, v)),
                (Err(_), _) => errors.push(hpath, "invalid header name"),
                (_, Err(_)) => errors.push(hpath, "invalid header value"),
            }
        }
        let mut forward_headers = Vec::new();
        for (j, name) in u.forward_headers.iter().enumerate() {
            let hpath = format!("{path}.forward_headers[{j}]");
            match HeaderName::try_from(name.as_str()) {
                Ok(n) if crate::upstream::never_forwarded(&n) => errors.push(
                    hpath,
                    format!("{name:?} is a credential or connection header and is never forwarded"),
                ),
                Ok(n) => forward_headers.push(n),
                Err(_) => errors.push(hpath, "invalid header name"),
            }
        }
        let mock_protocol = match (kind, u.protocol.as_deref()) {
            (UpstreamKind::Mock, None) => Some(Protocol::Chat),
            (UpstreamKind::Mock, Some(p)) => match Protocol::parse(p) {
                Some(p) => Some(p),
                None => {
                    errors.push(
                        format!("{path}.protocol"),
                        format!("unknown protocol {p:?}; allowed: chat, messages, responses"),
                    );
                    None
                }
            },
            (_, Some(_)) => {
                errors.push(
                    format!("{path}.protocol"),
                    "only a mock upstream takes `protocol`; other kinds speak their own",
                );
                None
            }
            (_, None) => None,
        };
        let mut protocol_uris: [Option<Uri>; 3] = [None, None, None];
        if let (Some(b), Some(_)) = (&base_url, kind.protocol()) {
            for p in Protocol::ALL {
                match b.join(p.upstream_suffix()) {
                    Ok(uri) => protocol_uris[p as usize] = Some(uri),
                    Err(e) => errors.push(format!("{path}.base_url"), e),
                }
            }
        }
        out.push(Arc::new(Upstream {
            name_header: HeaderValue::try_from(u.name.as_str()).ok(),
            name: Arc::from(u.name),
            kind,
            base_url,
            credential,
            google,
            storage_uri: u.storage_uri,
            headers,
            forward_headers,
            protocol_uris,
            mock_protocol,
            attempts: Default::default(),
        }));
    }
    out
}

fn parse_addresses(
    list: &[String],
    path: &str,
    listen: Option<&Listen>,
    errors: &mut Errors,
) -> AddressSet {
    let mut set = AddressSet::default();
    for (j, name) in list.iter().enumerate() {
        match Address::parse_client(name) {
            Some(a) => {
                if listen.is_some_and(|l| l.get(a).is_none()) {
                    errors.push(
                        format!("{path}[{j}]"),
                        format!("address {name:?} has no listener in [listen]"),
                    );
                }
                set.insert(a);
            }
            None => errors.push(
                format!("{path}[{j}]"),
                format!("unknown address {name:?}; allowed: base, token_plan, video"),
            ),
        }
    }
    set
}

fn parse_pattern(text: &str, path: String, errors: &mut Errors) -> Option<NamePattern> {
    match NamePattern::parse(text) {
        Ok(p) => Some(p),
        Err(e) => {
            errors.push(path, e);
            None
        }
    }
}

/// The two video model names of the interface (§2.5); on the mock they default to the video address.
const VIDEO_MODELS: [&str; 2] = ["video-3.1-generate-001", "video-3.1-fast-generate-001"];

/// The `[retry]` and `[health]` tables, which every model inherits and may override.
struct Defaults {
    retry: RetryPolicy,
    health: HealthPolicy,
}

const RETRY_ON: [&str; 4] = ["connect", "timeout", "429", "5xx"];

/// Applies the keys `raw` sets over `base`; errors are reported under `path`.
fn validate_retry(
    raw: &RawRetry,
    base: RetryPolicy,
    path: &str,
    errors: &mut Errors,
) -> RetryPolicy {
    let mut p = base;
    if let Some(n) = raw.attempts {
        if !(1..=10).contains(&n) {
            errors.push(
                format!("{path}.attempts"),
                format!("must be between 1 and 10; got {n}"),
            );
        }
        p.attempts = n.clamp(1, 10);
    }
    if let Some(list) = &raw.on {
        let mut on = RetryOn {
            connect: false,
            timeout: false,
            rate_limited: false,
            server_error: false,
        };
        for (j, item) in list.iter().enumerate() {
            match item.as_str() {
                "connect" => on.connect = true,
                "timeout" => on.timeout = true,
                "429" => on.rate_limited = true,
                "5xx" => on.server_error = true,
                other => errors.push(
                    format!("{path}.on[{j}]"),
                    format!("unknown value {other:?}; allowed: {}", RETRY_ON.join(", ")),
                ),
            }
        }
        p.on = on;
    }
    if let Some(ms) = raw.backoff_ms {
        p.backoff = Duration::from_millis(ms);
    }
    if let Some(ms) = raw.max_backoff_ms {
        p.max_backoff = Duration::from_millis(ms);
    }
    if p.max_backoff < p.backoff {
        errors.push(
            format!("{path}.max_backoff_ms"),
            format!(
                "must be at least backoff_ms ({} ms); got {} ms",
                p.backoff.as_millis(),
                p.max_backoff.as_millis()
            ),
        );
    }
    if let Some(ms) = raw.retry_after_max_ms {
        p.retry_after_max = Duration::from_millis(ms);
    }
    if let Some(pc) = raw.budget_percent {
        if pc > 100 {
            errors.push(
                format!("{path}.budget_percent"),
                format!("must be between 0 and 100; got {pc}"),
            );
        }
        p.budget_percent = pc.min(100);
    }
    p
}

fn validate_health(
    raw: &RawHealth,
    base: HealthPolicy,
    path: &str,
    errors: &mut Errors,
) -> HealthPolicy {
    let mut h = base;
    if let Some(n) = raw.eject_after {
        h.eject_after = n;
    }
    if let Some(ms) = raw.eject_ms {
        if ms == 0 {
            errors.push(format!("{path}.eject_ms"), "must be greater than 0");
        }
        h.eject = Duration::from_millis(ms).min(HealthPolicy::MAX_EJECTION);
    }
    h
}

fn parse_thinking(
    text: Option<&str>,
    default: ThinkingStyle,
    path: String,
    errors: &mut Errors,
) -> ThinkingStyle {
    match text {
        None => default,
        Some(t) => match ThinkingStyle::ALL.into_iter().find(|s| s.name() == t) {
            Some(s) => s,
            None => {
                let allowed: Vec<_> = ThinkingStyle::ALL.iter().map(|s| s.name()).collect();
                errors.push(
                    path,
                    format!("unknown value {t:?}; allowed: {}", allowed.join(", ")),
                );
                default
            }
        },
    }
}

/// A model's targets: the `targets` list, or the one-target shorthand (`upstream`, `upstream_model`).
fn validate_targets(
    m: &RawModel,
    path: &str,
    upstreams: &[Arc<Upstream>],
    thinking: ThinkingStyle,
    hosted_tools: HostedTools,
    errors: &mut Errors,
) -> Vec<Target> {
    let find = |name: &str, at: String, errors: &mut Errors| {
        let u = upstreams.iter().find(|u| &*u.name == name).cloned();
        if u.is_none() {
            errors.push(at, format!("no upstream named {name:?}"));
        }
        u
    };
    let check_rename = |name: &Option<String>, at: String, errors: &mut Errors| {
        if name.as_deref() == Some("") {
            errors.push(at, "must not be empty");
        }
    };
    match (&m.upstream, &m.targets) {
        (Some(_), Some(_)) => {
            errors.push(
                path,
                "give either `upstream` (one target) or `targets = [...]`, not both",
            );
            Vec::new()
        }
        (None, None) => {
            errors.push(
                format!("{path}.upstream"),
                "missing; a model needs `upstream = \"name\"` or `targets = [...]`",
            );
            Vec::new()
        }
        (Some(name), None) => {
            check_rename(&m.upstream_model, format!("{path}.upstream_model"), errors);
            find(name, format!("{path}.upstream"), errors)
                .map(|upstream| Target {
                    upstream,
                    upstream_model: m.upstream_model.clone(),
                    weight: 1,
                    thinking,
                    default_max_tokens: m.default_max_tokens,
                    hosted_tools,
                })
                .into_iter()
                .collect()
        }
        (None, Some(list)) => {
            if m.upstream_model.is_some() {
                errors.push(
                    format!("{path}.upstream_model"),
                    "with `targets`, each target names its own upstream_model",
                );
            }
            if list.is_empty() {
                errors.push(format!("{path}.targets"), "must not be empty");
            }
            let mut out = Vec::new();
            for (j, t) in list.iter().enumerate() {
                let tpath = format!("{path}.targets[{j}]");
                check_rename(&t.upstream_model, format!("{tpath}.upstream_model"), errors);
                if t.weight == Some(0) {
                    errors.push(format!("{tpath}.weight"), "must be at least 1");
                }
                if t.default_max_tokens == Some(0) {
                    errors.push(
                        format!("{tpath}.default_max_tokens"),
                        "must be greater than 0",
                    );
                }
                let style = parse_thinking(
                    t.thinking.as_deref(),
                    thinking,
                    format!("{tpath}.thinking"),
                    errors,
                );
                if let Some(upstream) = find(&t.upstream, format!("{tpath}.upstream"), errors) {
                    out.push(Target {
                        upstream,
                        upstream_model: t.upstream_model.clone(),
                        weight: t.weight.unwrap_or(1).max(1),
                        thinking: style,
                        default_max_tokens: t.default_max_tokens.or(m.default_max_tokens),
                        hosted_tools,
                    });
                }
            }
            out
        }
    }
}

fn validate_models(
    raw: Vec<Option<RawModel>>,
    upstreams: &[Arc<Upstream>],
    listen: Option<&Listen>,
    defaults: &Defaults,
    errors: &mut Errors,
) -> Vec<Arc<Model>> {
    let mut out: Vec<Arc<Model>> = Vec::new();
    let mut all_fallbacks: Vec<(String, String, AddressSet)> = Vec::new();
    for (i, m) in raw.into_iter().enumerate() {
        let Some(m) = m else { continue };
        let path = format!("models[{i}]");
        let pattern = parse_pattern(&m.name, format!("{path}.name"), errors);
        let thinking = parse_thinking(
            m.thinking.as_deref(),
            ThinkingStyle::None,
            format!("{path}.thinking"),
            errors,
        );
        let hosted_tools = match m.hosted_tools.as_deref() {
            None | Some("drop") => HostedTools::Drop,
            Some("refuse") => HostedTools::Refuse,
            Some(other) => {
                errors.push(
                    format!("{path}.hosted_tools"),
                    format!("unknown value {other:?}; allowed: drop, refuse"),
                );
                HostedTools::Drop
            }
        };
        let targets = validate_targets(&m, &path, upstreams, thinking, hosted_tools, errors);
        let endpoints = match &m.endpoints {
            None => EndpointSet::ALL,
            Some(list) => {
                let mut set = EndpointSet::default();
                for (j, e) in list.iter().enumerate() {
                    match Protocol::parse(e) {
                        Some(p) => set.insert(p),
                        None => errors.push(
                            format!("{path}.endpoints[{j}]"),
                            format!("unknown endpoint {e:?}; allowed: chat, messages, responses"),
                        ),
                    }
                }
                if list.is_empty() {
                    errors.push(format!("{path}.endpoints"), "must not be empty");
                }
                set
            }
        };
        let video_targets = targets
            .iter()
            .filter(|t| {
                t.upstream.kind.is_video()
                    || (t.upstream.kind == UpstreamKind::Mock
                        && VIDEO_MODELS.contains(&m.name.as_str()))
            })
            .count();
        let is_video = video_targets > 0;
        if let Some(uri) = &m.storage_uri {
            let vertex = targets
                .iter()
                .all(|t| t.upstream.kind == UpstreamKind::VeoVertex);
            check_storage_uri(uri, format!("{path}.storage_uri"), vertex, errors);
        }
        if is_video && targets.len() > 1 {
            errors.push(
                format!("{path}.targets"),
                "a video model has exactly one target (its task ids name the upstream that runs them)",
            );
        }
        if is_video && !m.fallbacks.is_empty() {
            errors.push(
                format!("{path}.fallbacks"),
                "video models take no fallbacks",
            );
        }
        let addresses = match &m.addresses {
            None if is_video => AddressSet::only(Address::Video),
            None => AddressSet::only(Address::Base),
            Some(list) => {
                let set = parse_addresses(list, &format!("{path}.addresses"), listen, errors);
                if list.is_empty() {
                    errors.push(format!("{path}.addresses"), "must not be empty");
                }
                set
            }
        };
        for t in &targets {
            let u = &t.upstream;
            if u.kind.is_video()
                && (addresses.contains(Address::Base) || addresses.contains(Address::TokenPlan))
            {
                errors.push(
                    format!("{path}.addresses"),
                    format!("upstream {:?} is a video upstream; it can only be served on the video address", u.name),
                );
            }
            if u.kind.protocol().is_some() && addresses.contains(Address::Video) {
                errors.push(
                    format!("{path}.addresses"),
                    format!("upstream {:?} is an LLM upstream; the video address serves only video models", u.name),
                );
            }
        }
        if addresses.contains(Address::TokenPlan) && !endpoints.contains(Protocol::Chat) {
            errors.push(
                format!("{path}.addresses"),
                "token_plan serves only chat completions, but endpoints excludes \"chat\"",
            );
        }
        if m.default_max_tokens == Some(0) {
            errors.push(
                format!("{path}.default_max_tokens"),
                "must be greater than 0",
            );
        }
        let strategy = match m.strategy.as_deref() {
            None => Strategy::Weighted,
            Some(text) => {
                match Strategy::ALL.into_iter().find(|s| s.name() == text) {
                    Some(s) => s,
                    None => {
                        errors.push(
                        format!("{path}.strategy"),
                        format!("unknown strategy {text:?}; allowed: weighted, least_inflight, latency"),
                    );
                        Strategy::Weighted
                    }
                }
            }
        };
        let retry = match &m.retry {
            Some(r) => validate_retry(r, defaults.retry, &format!("{path}.retry"), errors),
            None => defaults.retry,
        };
        let health = match &m.health {
            Some(h) => validate_health(h, defaults.health, &format!("{path}.health"), errors),
            None => defaults.health,
        };
        for (j, f) in m.fallbacks.iter().enumerate() {
            if f == &m.name {
                errors.push(
                    format!("{path}.fallbacks[{j}]"),
                    "a model cannot fall back to itself",
                );
            } else {
                all_fallbacks.push((format!("{path}.fallbacks[{j}]"), f.clone(), addresses));
            }
        }
        // One name may appear once per address, so each address routes it to one entry.
        if let Some(other) = out
            .iter()
            .find(|o| o.name == m.name && o.addresses.0 & addresses.0 != 0)
        {
            errors.push(
                format!("{path}.name"),
                format!(
                    "duplicate model name {:?} on address(es) {}",
                    m.name,
                    AddressSet(other.addresses.0 & addresses.0)
                        .names()
                        .join(", ")
                ),
            );
        }
        if let Some(pattern) = pattern {
            if !targets.is_empty() {
                out.push(Arc::new(Model {
                    name: m.name,
                    pattern,
                    index: out.len(),
                    targets,
                    strategy,
                    fallbacks: m.fallbacks,
                    retry,
                    health,
                    endpoints,
                    addresses,
                    vision: m.vision,
                    thinking,
                    default_max_tokens: m.default_max_tokens,
                    storage_uri: m.storage_uri,
                    hosted_tools,
                    series: Default::default(),
                }));
            }
        }
    }
    // A fallback is looked up like a client's model name, on the addresses its model serves.
    for (path, name, addresses) in all_fallbacks {
        let found = out.iter().any(|m| {
            m.pattern.matches(&name)
                && m.addresses.0 & addresses.0 != 0
                && m.primary().protocol().is_some()
                && !m.primary().upstream.kind.is_video()
        });
        if !found {
            errors.push(
                path,
                format!("no LLM model named {name:?} is served on this model's addresses"),
            );
        }
    }
    out
}

fn validate_keys(
    raw: Vec<Option<RawKey>>,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
) -> Vec<Key> {
    use sha2::{Digest, Sha256};
    let mut names = HashSet::new();
    let mut digests = HashSet::new();
    let mut out = Vec::new();
    for (i, k) in raw.into_iter().enumerate() {
        let Some(k) = k else { continue };
        let path = format!("keys[{i}]");
        if k.name.is_empty() {
            errors.push(format!("{path}.name"), "must not be empty");
        } else if !names.insert(k.name.clone()) {
            errors.push(
                format!("{path}.name"),
                format!("duplicate key name {:?}", k.name),
            );
        }
        let given = [k.key.is_some(), k.sha256.is_some(), k.key_env.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if given != 1 {
            errors.push(
                path.clone(),
                "exactly one of `key` (demo only), `sha256` or `key_env` is required",
            );
            continue;
        }
        let mut plaintext = None;
        let digest: Option<[u8; 32]> = if let Some(key) = &k.key {
            plaintext = Some(key.clone());
            Some(Sha256::digest(key.as_bytes()).into())
        } else if let Some(hexed) = &k.sha256 {
            let mut d = [0u8; 32];
            match hex::decode_to_slice(hexed.trim(), &mut d) {
                Ok(()) => Some(d),
                Err(_) => {
                    errors.push(
                        format!("{path}.sha256"),
                        "must be 64 hex characters (the output of `modelgate hash-key`)",
                    );
                    None
                }
            }
        } else if let Some(var) = &k.key_env {
            env_secret(env, var, format!("{path}.key_env"), errors)
                .map(|v| Sha256::digest(v.as_bytes()).into())
        } else {
            None
        };
        if let Some(d) = digest {
            if !digests.insert(d) {
                errors.push(path.clone(), "the same key is configured twice");
            }
        }
        let addresses = match &k.addresses {
            None => AddressSet::all_client(),
            Some(list) => parse_addresses(list, &format!("{path}.addresses"), None, errors),
        };
        let models = match &k.models {
            None => vec![NamePattern::Any],
            Some(list) => list
                .iter()
                .enumerate()
                .filter_map(|(j, p)| parse_pattern(p, format!("{path}.models[{j}]"), errors))
                .collect(),
        };
        for (field, zero) in [
            ("rpm", k.rpm == Some(0)),
            ("tpm", k.tpm == Some(0)),
            ("max_concurrent", k.max_concurrent == Some(0)),
            ("daily_tokens", k.daily_tokens == Some(0)),
        ] {
            if zero {
                errors.push(
                    format!("{path}.{field}"),
                    "must be greater than 0 (leave it out for no limit)",
                );
            }
        }
        if let Some(digest) = digest {
            out.push(Key {
                name: k.name,
                digest,
                plaintext,
                addresses,
                models,
                limits: KeyLimits {
                    rpm: k.rpm,
                    tpm: k.tpm,
                    max_concurrent: k.max_concurrent,
                    daily_tokens: k.daily_tokens,
                },
            });
        }
    }
    out
}
