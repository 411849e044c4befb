//! Config reload: SIGHUP and changes of the config file re-read it; a valid file replaces the routing in one step, an invalid one changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::config::Config;
use crate::pipeline::Gateway;

/// Editors and ConfigMap updates touch a file several times in a row; one reload covers them.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// What one reload did.
#[derive(Debug)]
pub enum Outcome {
    /// The new routing is in place; the listed sections changed but need a restart.
    Applied { restart_needed: Vec<&'static str> },
    /// The file was invalid or unreadable; every error, each with its key path.
    Refused(Vec<String>),
}

/// Re-reads `path` and, when it is valid, puts its routing in place over `current`.
pub fn reload(gw: &Gateway, path: &Path, current: &mut Config) -> Outcome {
    apply(gw, path, current, Config::load(path))
}

/// Puts `loaded` in place over `current` when it is valid; logs and counts either way.
pub fn apply(
    gw: &Gateway,
    path: &Path,
    current: &mut Config,
    loaded: Result<Config, crate::config::ConfigErrors>,
) -> Outcome {
    let outcome = match loaded {
        Ok(next) => {
            let restart_needed = current.restart_needed(&next);
            gw.replace_routing(&next);
            *current = next;
            Outcome::Applied { restart_needed }
        }
        Err(errors) => Outcome::Refused(errors.0),
    };
    match &outcome {
        Outcome::Applied { restart_needed } => {
            gw.services.metrics.config_reloaded(true);
            tracing::info!(config = %path.display(), "config reloaded: keys, models, upstreams and retry policy replaced for new requests");
            for section in restart_needed {
                tracing::warn!(config = %path.display(), section, "this section changed but only takes effect after a restart");
            }
        }
        Outcome::Refused(errors) => {
            gw.services.metrics.config_reloaded(false);
            tracing::error!(config = %path.display(), errors = errors.len(), "config reload refused: the running config is unchanged");
            for e in errors {
                tracing::error!(config = %path.display(), "  {e}");
            }
        }
    }
    outcome
}

/// What wakes a reload: SIGHUP and changes of the config file.
///
/// Installed before the gateway says it is listening, so a SIGHUP sent the moment the
/// listeners are announced reloads instead of meeting the default action (ending the process).
pub struct Triggers {
    path: PathBuf,
    rx: mpsc::Receiver<()>,
    _watcher: Option<notify::RecommendedWatcher>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Triggers {
    /// Starts watching `path`'s directory and catching SIGHUP; each is optional, with a warning
    /// when the platform refuses it. Needs a running Tokio runtime.
    ///
    /// The file's directory is watched rather than the file: an editor's save or a Kubernetes
    /// ConfigMap update replaces the file by renaming another over it, which a watch on the old
    /// inode would miss.
    pub fn install(path: PathBuf) -> Self {
        let (tx, rx) = mpsc::channel::<()>(1);
        let watcher = file_watcher(&path, tx);
        #[cfg(unix)]
        let hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; reload on file changes only");
                None
            }
        };
        Self {
            path,
            rx,
            _watcher: watcher,
            #[cfg(unix)]
            hup,
        }
    }

    /// Reloads on each trigger, until the process ends.
    pub async fn run(mut self, gw: Arc<Gateway>, mut current: Config) {
        loop {
            #[cfg(unix)]
            let signalled = async {
                match self.hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let signalled = std::future::pending::<Option<()>>();
            tokio::select! {
                got = signalled => {
                    if got.is_none() {
                        return;
                    }
                    tracing::info!("SIGHUP: reloading the config");
                }
                got = self.rx.recv() => {
                    if got.is_none() {
                        return;
                    }
                    // Let the writer finish, and fold its other events into this reload.
                    tokio::time::sleep(DEBOUNCE).await;
                    while self.rx.try_recv().is_ok() {}
                }
            }
            reload(&gw, &self.path, &mut current);
        }
    }
}

/// Watches the directory holding `path`; any event naming the file (or, for a ConfigMap,
/// its `..data` link) sends a wake-up. `None` when the platform's watcher cannot start.
fn file_watcher(path: &Path, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_os_string());
    let handler = move |res: notify::Result<notify::Event>| {
        let Ok(event) = res else { return };
        if event.kind.is_access() {
            return;
        }
        let ours = event.paths.iter().any(|p| {
            let file = p.file_name();
            file == name.as_deref() || file.is_some_and(|f| f == "..data")
        });
        if ours {
            // Full means a reload is already pending; it will read the newest file.
            let _ = tx.try_send(());
        }
    };
    match notify::recommended_watcher(handler) {
        Ok(mut w) => match w.watch(&dir, notify::RecursiveMode::NonRecursive) {
            Ok(()) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the config directory; reload on SIGHUP only");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot start a file watcher; reload on SIGHUP only");
            None
        }
    }
}
