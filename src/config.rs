//! The TOML config: raw serde types, then one validation pass into typed, cross-checked values; every error names its key path.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;

use crate::route::NamePattern;

/// The client-facing listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Address {
    Base,
    TokenPlan,
    Video,
    Admin,
}

impl Address {
    pub const CLIENT: [Address; 3] = [Address::Base, Address::TokenPlan, Address::Video];

    pub fn name(self) -> &'static str {
        match self {
            Self::Base => "base",
            Self::TokenPlan => "token_plan",
            Self::Video => "video",
            Self::Admin => "admin",
        }
    }

    fn parse_client(s: &str) -> Option<Self> {
        Self::CLIENT.into_iter().find(|a| a.name() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A small set of client addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressSet(u8);

impl AddressSet {
    pub fn all_client() -> Self {
        Self::CLIENT_ALL
    }
    const CLIENT_ALL: Self = Self(0b111);

    pub fn only(a: Address) -> Self {
        Self(a.bit())
    }

    pub fn contains(self, a: Address) -> bool {
        self.0 & a.bit() != 0
    }

    fn insert(&mut self, a: Address) {
        self.0 |= a.bit();
    }

    pub fn names(self) -> Vec<&'static str> {
        Address::CLIENT
            .into_iter()
            .filter(|a| self.contains(*a))
            .map(Address::name)
            .collect()
    }
}

/// The three LLM wire protocols, used both for client paths and upstream kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Chat,
    Messages,
    Responses,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Chat, Protocol::Messages, Protocol::Responses];

    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }

    /// The client path that serves this protocol.
    pub fn client_path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Messages => "/v1/messages",
            Self::Responses => "/v1/responses",
        }
    }

    /// What is appended to an upstream's `base_url`.
    pub fn upstream_suffix(self) -> &'static str {
        match self {
            Self::Chat => "/chat/completions",
            Self::Messages => "/messages",
            Self::Responses => "/responses",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointSet(u8);

impl EndpointSet {
    pub const ALL: Self = Self(0b111);

    pub fn contains(self, p: Protocol) -> bool {
        self.0 & (1 << p as u8) != 0
    }

    fn insert(&mut self, p: Protocol) {
        self.0 |= 1 << p as u8;
    }

    pub fn iter(self) -> impl Iterator<Item = Protocol> {
        Protocol::ALL.into_iter().filter(move |p| self.contains(*p))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamKind {
    Chat,
    Messages,
    Responses,
    Video,
    VeoVertex,
    VeoGemini,
    Mock,
}

impl UpstreamKind {
    const ALL: [UpstreamKind; 7] = [
        Self::Chat,
        Self::Messages,
        Self::Responses,
        Self::Video,
        Self::VeoVertex,
        Self::VeoGemini,
        Self::Mock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
            Self::Video => "video",
            Self::VeoVertex => "veo-vertex",
            Self::VeoGemini => "veo-gemini",
            Self::Mock => "mock",
        }
    }

    /// The LLM protocol this kind speaks natively, if it is an LLM upstream.
    pub fn protocol(self) -> Option<Protocol> {
        match self {
            Self::Chat => Some(Protocol::Chat),
            Self::Messages => Some(Protocol::Messages),
            Self::Responses => Some(Protocol::Responses),
            _ => None,
        }
    }

    pub fn is_video(self) -> bool {
        matches!(self, Self::Video | Self::VeoVertex | Self::VeoGemini)
    }
}

/// How a model's upstream spells the thinking switch (gateway.md §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkingStyle {
    None,
    ChatTemplateKwargs,
    EnableThinking,
    ThinkingType,
    Anthropic,
}

impl ThinkingStyle {
    const ALL: [ThinkingStyle; 5] = [
        Self::None,
        Self::ChatTemplateKwargs,
        Self::EnableThinking,
        Self::ThinkingType,
        Self::Anthropic,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ChatTemplateKwargs => "chat_template_kwargs",
            Self::EnableThinking => "enable_thinking",
            Self::ThinkingType => "thinking_type",
            Self::Anthropic => "anthropic",
        }
    }
}

/// A secret header value; never printed.
#[derive(Clone)]
pub struct Secret(HeaderValue);

impl Secret {
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
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
    pub name: String,
    pub kind: UpstreamKind,
    pub base_url: Option<BaseUrl>,
    pub credential: Option<Secret>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Prebuilt URLs for the three LLM protocols, indexed by `Protocol as usize`.
    pub protocol_uris: [Option<Uri>; 3],
}

impl Upstream {
    pub fn uri_for(&self, protocol: Protocol) -> Option<&Uri> {
        self.protocol_uris[protocol as usize].as_ref()
    }
}

#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub pattern: NamePattern,
    pub upstream: Arc<Upstream>,
    pub upstream_model: Option<String>,
    pub endpoints: EndpointSet,
    pub addresses: AddressSet,
    pub vision: bool,
    pub thinking: ThinkingStyle,
    pub default_max_tokens: Option<u32>,
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
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request_bytes: u64,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
}

#[derive(Debug, Clone)]
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
}

/// The validated configuration.
pub struct Config {
    pub listen: Listen,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub limits: Limits,
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

    /// The routing table as `modelgate check` prints it.
    pub fn routing_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let rows: Vec<[String; 6]> = self
            .models
            .iter()
            .map(|m| {
                let endpoints = if m.upstream.kind.is_video()
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
                [
                    m.name.clone(),
                    m.upstream.name.clone(),
                    m.upstream.kind.name().to_owned(),
                    m.upstream_model.clone().unwrap_or_else(|| "(same)".into()),
                    endpoints,
                    m.addresses.names().join(","),
                ]
            })
            .collect();
        let header = [
            "MODEL",
            "UPSTREAM",
            "KIND",
            "UPSTREAM MODEL",
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
