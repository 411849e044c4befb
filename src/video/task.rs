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
