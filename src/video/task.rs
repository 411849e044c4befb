//! A task as the gateway reports it: the interface's six statuses and what one upstream poll learned.

use crate::video::token::FileSource;

/// `taskStatus` values (interface §2.6, §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Canceled,
    Suspended,
}

impl TaskStatus {
    const ALL: [TaskStatus; 6] = [
        Self::Pending,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
        Self::Canceled,
        Self::Suspended,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Running => "RUNNING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Canceled => "CANCELED",
            Self::Suspended => "SUSPENDED",
        }
    }

    /// A native upstream's status; `CANCELLED` (the British spelling Google uses) is read too.
    pub fn parse(s: &str) -> Option<Self> {
        if s.eq_ignore_ascii_case("cancelled") {
            return Some(Self::Canceled);
        }
        Self::ALL
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
    }

    /// A finished task never changes again, so its answer may be kept.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Canceled)
    }
}

/// Where the produced file is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Video {
    /// An address anyone can download from: handed out as it is.
    Public(String),
    /// Needs the upstream's credential or is the gateway's own: served at `/v1/files/{fileId}`.
    Gateway(FileSource),
}

/// `url` when it is an absolute `http`/`https` address, the only kind handed to clients (gateway.md §14):
/// a `javascript:` or `data:` URL from an upstream would run in whatever page shows the link.
pub fn http_url(url: &str) -> Option<&str> {
    let uri: http::Uri = url.parse().ok()?;
    let scheme_ok = matches!(uri.scheme_str(), Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"));
    (scheme_ok && uri.host().is_some_and(|h| !h.is_empty())).then_some(url)
}

/// What a lookup learned; rendered per request, since file URLs depend on the time and the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: TaskStatus,
    pub video: Option<Video>,
    pub error: Option<String>,
}

impl Outcome {
    pub fn status(status: TaskStatus) -> Self {
        Self {
            status,
            video: None,
            error: None,
        }
    }

    pub fn succeeded(video: Video) -> Self {
        Self {
            status: TaskStatus::Succeeded,
            video: Some(video),
            error: None,
        }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self::ended(TaskStatus::Failed, message)
    }

    pub fn ended(status: TaskStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            video: None,
            error: Some(message.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_pass() {
        for ok in [
            "https://cdn.example/v.mp4",
            "http://10.0.0.1:8080/a?b=c",
            "HTTPS://CDN.example/x",
        ] {
            assert_eq!(http_url(ok), Some(ok), "{ok}");
        }
        for bad in [
            "javascript:alert(1)",
            "JavaScript://cdn.example/%0aalert(1)",
            "data:text/html,<script>alert(1)</script>",
            "ftp://cdn.example/v.mp4",
            "//cdn.example/v.mp4",
            "https://",
            "https://cdn.example/a b",
            "",
        ] {
            assert_eq!(http_url(bad), None, "{bad}");
        }
    }
}
