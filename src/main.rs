//! The `modelgate` command line: serve (with reload on SIGHUP and file changes) | check | hash-key | mock.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use modelgate::config::{Address, Config, LogFormat, UpstreamKind};
use modelgate::{auth, mock, reload, server};

// Requests and translations make many small, short-lived allocations: under glibc's allocator
// they took about 40% of a translation's time in a profile (malloc_consolidate among the top),
// under mimalloc about 15%. mimalloc is linked as the process's `malloc` (its `override`
// feature) and Rust's default allocator calls that, rather than installing `mimalloc::MiMalloc`:
// that one asks `mi_malloc_aligned` for every block, whose path for blocks over 1 KiB goes
// through an over-allocating generic branch, where plain `malloc` takes mimalloc's ordinary
// path. 4% fewer instructions for a translated request, 2% for a JSON one
// (docs/performance-log.md, "thirty-first session"), and no `unsafe` here. The benches that
// measure the gateway link it the same way.
use mimalloc as _;

/// How long in-flight requests may run after SIGINT/SIGTERM before the process exits anyway.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(name = "modelgate", version, about = "An LLM and video API gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Config file [default: $MODELGATE_CONFIG, else config/modelgate.toml]
        #[arg(long)]
        config: Option<PathBuf>,
        /// Log lines as `text` or `json` (one object per line) [default: the config's
        /// `[log] format`, else text]
        #[arg(long, value_parser = ["text", "json"])]
        log_format: Option<String>,
    },
    /// Validate a config file and print the routing table (exit 1 with every error found).
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Read a key on stdin and print its SHA-256 hex digest for `[[keys]] sha256`.
    HashKey,
    /// Run the mock upstream on its own port.
    Mock {
        #[arg(long, default_value = "127.0.0.1:9999")]
        listen: String,
        /// Pause between streamed chunks, to make streaming visible.
        #[arg(long, default_value_t = 0)]
        chunk_delay_ms: u64,
    },
    /// Measure latency and throughput of an endpoint (or compare two): TTFT, inter-token gaps, TPOT, end to end.
    Bench(Box<modelgate::bench::BenchArgs>),
}

fn config_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("MODELGATE_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("config/modelgate.toml"))
}

fn init_logging() {
    init_logging_as(LogFormat::Text);
}

fn init_logging_as(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // One object per line, the event's fields at the top level, for log collectors.
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        // A person at a terminal gets tracing's coloured lines; a file or a collector gets the
        // same layout from a formatter that costs a fraction per line (src/logfmt.rs).
        LogFormat::Text if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
            fmt.with_ansi(true).init()
        }
        LogFormat::Text => {
            fmt.event_format(modelgate::logfmt::Plain).init();
            modelgate::logfmt::write_access_lines_directly();
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::HashKey => hash_key(),
        Command::Check { config } => check(config_path(config)),
        Command::Serve { config, log_format } => {
            let flag = log_format.as_deref().and_then(LogFormat::parse);
            let path = config_path(config);
            let loaded = Config::load(&path);
            // With event loops of its own the gateway's traffic never reaches this runtime:
            // it keeps only signals, reloads and the shutdown, on the main thread.
            match loaded.as_ref().map(|c| c.server.workers) {
                Ok(0) | Err(_) => run(serve(path, loaded, flag)),
                Ok(_) => run_here(serve(path, loaded, flag)),
            }
        }
        Command::Mock {
            listen,
            chunk_delay_ms,
        } => {
            init_logging();
            run(run_mock(listen, Duration::from_millis(chunk_delay_ms)))
        }
        Command::Bench(args) => run(modelgate::bench::run(*args)),
    }
}

fn run(fut: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    start_runtime(tokio::runtime::Builder::new_multi_thread(), fut)
}

/// Runs `fut` on a runtime on the calling thread alone.
fn run_here(fut: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    start_runtime(tokio::runtime::Builder::new_current_thread(), fut)
}

fn start_runtime(
    mut builder: tokio::runtime::Builder,
    fut: impl std::future::Future<Output = ExitCode>,
) -> ExitCode {
    match builder.enable_all().build() {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

fn hash_key() -> ExitCode {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("cannot read stdin: {e}");
        return ExitCode::FAILURE;
    }
    let key = input
        .strip_suffix("\r\n")
        .or_else(|| input.strip_suffix('\n'))
        .unwrap_or(&input);
    if key.is_empty() {
        eprintln!("no key on stdin");
        return ExitCode::FAILURE;
    }
    println!("{}", auth::hash_key(key));
    ExitCode::SUCCESS
}

fn check(path: PathBuf) -> ExitCode {
    match Config::load(&path) {
        Ok(config) => {
            print!("{}", config.routing_table());
            println!("{}: OK", path.display());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{}: {} error(s)", path.display(), errors.0.len());
            for e in &errors.0 {
                eprintln!("  {e}");
            }
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    path: PathBuf,
    loaded: Result<Config, modelgate::config::ConfigErrors>,
    log_format: Option<LogFormat>,
) -> ExitCode {
    // The flag wins over the file; the file is read first so its `[log]` applies from line one.
    init_logging_as(
        log_format
            .or(loaded.as_ref().ok().map(|c| c.log_format))
            .unwrap_or_default(),
    );
    let signal = shutdown_signal();
    let reload_triggers = reload::Triggers::install(path.clone());
    let config = match loaded {
        Ok(c) => c,
        Err(errors) => {
            tracing::error!(config = %path.display(), "invalid config");
            for e in &errors.0 {
                eprintln!("  {e}");
            }
            return ExitCode::FAILURE;
        }
    };
    for k in config.keys.iter().filter(|k| k.plaintext.is_some()) {
        tracing::warn!(key = %k.name, "plaintext key in the config file: fine for a demo, use sha256 or key_env in production");
    }
    let running = match server::start(&config).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    if config.video.task_secrets.is_empty() {
        tracing::warn!(
            var = %config.video.task_secrets_env,
            "no video task secret set: using a random one, so task ids will not survive a restart"
        );
    }
    warn_if_descriptors_short(&config);
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    for a in [
        Address::Base,
        Address::TokenPlan,
        Address::Video,
        Address::Admin,
    ] {
        if let Some(addr) = running.addr(a) {
            let scheme = if a == Address::Admin { "http" } else { scheme };
            tracing::info!(listener = a.name(), "listening on {scheme}://{addr}");
        }
    }
    print_try_it(&config, &running, scheme);
    #[expect(
        clippy::disallowed_methods,
        reason = "the reload watcher lives as long as the process"
    )]
    let watcher = tokio::spawn(reload_triggers.run(running.gateway().clone(), config));
    signal.await;
    watcher.abort();
    tracing::info!("shutting down: no new connections, waiting for in-flight requests");
    running.shutdown(SHUTDOWN_DEADLINE).await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// For a config with a demo key and a mock-served chat model, a curl line that works as printed.
///
/// The key printed is the plaintext demo key already in the file; real keys are never printed.
fn print_try_it(config: &Config, running: &server::RunningGateway, scheme: &str) {
    let Some(key) = config.keys.iter().find_map(|k| {
        k.addresses
            .contains(Address::Base)
            .then_some(k.plaintext.as_deref())
            .flatten()
    }) else {
        return;
    };
    let Some(model) = config.models.iter().find(|m| {
        m.primary().upstream.kind == UpstreamKind::Mock
            && m.addresses.contains(Address::Base)
            && matches!(m.pattern, modelgate::route::NamePattern::Exact(_))
    }) else {
        return;
    };
    let Some(addr) = running.addr(Address::Base) else {
        return;
    };
    println!(
        "\nTry it:\n  curl {scheme}://{addr}/v1/chat/completions -H 'Authorization: Bearer {key}' \\\n    -H 'Content-Type: application/json' \\\n    -d '{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello there\"}}]}}'\n",
        model.name
    );
}

/// SIGINT or SIGTERM, with the handlers installed when this is called (not when first awaited),
/// so a signal that arrives right after the listeners are up is not lost.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn run_mock(listen: String, delay: Duration) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => tracing::info!("mock upstream listening on http://{addr}/v1"),
        Err(e) => tracing::warn!(error = %e, "mock upstream started"),
    }
    tokio::select! {
        res = mock::serve_standalone(listener, delay) => {
            if let Err(e) = res {
                tracing::error!(error = %e, "mock stopped");
                return ExitCode::FAILURE;
            }
        }
        _ = shutdown_signal() => {}
    }
    ExitCode::SUCCESS
}

/// Warns when the listeners' `max_connections` together exceed the process's descriptor limit:
/// past it, accepts fail before the limit the config promises is reached.
fn warn_if_descriptors_short(config: &modelgate::config::Config) {
    let Some(soft) = open_files_limit() else {
        return;
    };
    let listeners = [Address::Base, Address::TokenPlan, Address::Video]
        .into_iter()
        .filter(|a| config.listen.get(*a).is_some())
        .count() as u64;
    let wanted = (config.limits.max_connections as u64).saturating_mul(listeners);
    if wanted > soft {
        tracing::warn!(
            max_connections = config.limits.max_connections,
            listeners,
            open_files = soft,
            "the listeners' max_connections together exceed the open-files limit (ulimit -n); raise it or lower max_connections"
        );
    }
}

/// The soft limit on open descriptors, from `/proc/self/limits` (Linux).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
