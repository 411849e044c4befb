//! The words every module shares: protocols, addresses, upstream kinds, name patterns. A leaf: it imports nothing of the crate.

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

    pub(crate) fn parse_client(s: &str) -> Option<Self> {
        Self::CLIENT.into_iter().find(|a| a.name() == s)
    }

    pub(crate) fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A small set of client addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressSet(pub(crate) u8);

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

    pub(crate) fn insert(&mut self, a: Address) {
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

    pub(crate) fn parse(s: &str) -> Option<Self> {
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

    pub(crate) fn insert(&mut self, p: Protocol) {
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
    pub(crate) const ALL: [UpstreamKind; 7] = [
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

/// A model name or key restriction: an exact name, or a `prefix*` pattern (`*` alone matches all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamePattern {
    Exact(String),
    Prefix(String),
    Any,
}

impl NamePattern {
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        match text.find('*') {
            None => Ok(Self::Exact(text.to_owned())),
            Some(pos) if pos + 1 == text.len() => {
                if pos == 0 {
                    Ok(Self::Any)
                } else {
                    Ok(Self::Prefix(text[..pos].to_owned()))
                }
            }
            Some(_) => Err(format!(
                "invalid pattern {text:?}: `*` is allowed only at the end (prefix*)"
            )),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::Exact(n) => n == name,
            Self::Prefix(p) => name.starts_with(p.as_str()),
            Self::Any => true,
        }
    }

    /// True when every name `other` matches is also matched by `self` (used to list models a key may use).
    pub fn covers(&self, other: &NamePattern) -> bool {
        match (self, other) {
            (Self::Any, _) => true,
            (_, Self::Any) => false,
            (Self::Exact(a), Self::Exact(b)) => a == b,
            (Self::Exact(_), Self::Prefix(_)) => false,
            (Self::Prefix(p), Self::Exact(b)) => b.starts_with(p.as_str()),
            (Self::Prefix(p), Self::Prefix(q)) => q.starts_with(p.as_str()),
        }
    }
}
