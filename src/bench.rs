//! `modelgate bench`: a latency benchmarking client for chat, messages and responses endpoints — its arguments and one run from the first request to the report.
//!
//! The pieces, one file each under `bench/`:
//!
//! ```text
//! prompt   the request bodies: synthetic prompts of about --input-tokens words, or --dataset lines
//! client   the pooled HTTP client and one request measured (TTFT, gaps, tokens, error kind)
//! events   which stream event of which protocol is a content delta, carries usage, ends the reply
//! load     the timetable (open loop) or the workers (closed loop), warmup, Ctrl-C
//! stats    HDR histograms into p50/p90/p95/p99/max/mean, throughput, the compare diff
//! report   the printed table, --json and --csv
//! html     --html: one self-contained page with inline SVG charts
//! ```

pub mod client;
pub mod events;
pub mod html;
pub mod load;
pub mod prompt;
pub mod report;
pub mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::ValueEnum;

/// The protocol spoken to the endpoint(s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    Chat,
    Messages,
    Responses,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }

    /// What is appended to `--url` (which already holds the version prefix, as `/v1`).
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/chat/completions",
            Self::Messages => "/messages",
            Self::Responses => "/responses",
        }
    }
}

/// How open-loop arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Arrivals {
    /// Exactly 1/R seconds apart.
    Constant,
    /// Exponential gaps with mean 1/R: independent users arriving at random.
    Poisson,
}

/// `modelgate bench` as gateway.md §12 has it.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Base URL with its version prefix (http://127.0.0.1:8080/v1); the protocol's path is appended.
    #[arg(long)]
    pub url: String,
    /// Model name sent in every request (it also replaces the model of --dataset lines).
    #[arg(long)]
    pub model: String,
    #[arg(long, value_enum, default_value_t = Protocol::Chat)]
    pub protocol: Protocol,
    /// Environment variable holding the API key (unset: no auth header is sent).
    #[arg(long, default_value = "MODELGATE_API_KEY")]
    pub key_env: String,
    /// Open loop: start R requests per second on a fixed timetable, whatever the replies do.
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Spacing of the open-loop timetable [default: constant].
    #[arg(long, value_enum, requires = "rate")]
    pub arrivals: Option<Arrivals>,
    /// Closed loop: C workers, each sending its next request when the last one ended [default: 1].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Seconds of counted load after the warmup [default: 10 unless --requests].
    #[arg(long, conflicts_with = "requests")]
    pub duration: Option<f64>,
    /// Number of counted requests (per endpoint with --compare).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Seconds of load at the start that are run but not counted.
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Stream the replies (the default).
    #[arg(long, overrides_with = "no_stream")]
    pub stream: bool,
    /// Ask for whole replies; TTFT is then the end-to-end time.
    #[arg(long, overrides_with = "stream")]
    pub no_stream: bool,
    /// Words in each synthetic prompt (a word is about one token of a common tokenizer).
    #[arg(long, default_value_t = 256)]
    pub input_tokens: usize,
    /// max_tokens (max_output_tokens for responses) of each synthetic request.
    #[arg(long, default_value_t = 128)]
    pub output_tokens: u64,
    /// JSONL file, one request body of the protocol per line, used in turn (model and stream are set).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Second base URL: the same schedule runs interleaved against both, one request each in turn.
    #[arg(long)]
    pub compare: Option<String>,
    /// Write every figure and every request as JSON (times in ms).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one CSV row per request.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write a self-contained HTML report (inline SVG: latency CDFs, TTFT and ITL histograms).
    #[arg(long)]
    pub html: Option<PathBuf>,
}

/// Runs the benchmark and reports; the exit code is 0 when the run finished and at least one
/// request succeeded, 1 when none did or a report could not be written, 2 for unusable
/// arguments, 130 after Ctrl-C (the partial report is still printed and written).
pub async fn run(args: BenchArgs) -> ExitCode {
    let plan = match load::Plan::from_args(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("modelgate bench: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = load::execute(&plan).await;
    let report = report::Report::build(&plan, &outcome);
    print!("{}", report.table());
    let mut failed = false;
    if let Some(path) = &args.json {
        failed |= write_file(path, report.json().as_bytes());
    }
    if let Some(path) = &args.csv {
        failed |= write_file(path, report.csv().as_bytes());
    }
    if let Some(path) = &args.html {
        failed |= write_file(path, html::render(&report).as_bytes());
    }
    if outcome.interrupted {
        return ExitCode::from(130);
    }
    if failed || report.endpoints.iter().all(|e| e.ok == 0) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Writes a report file; true when that failed (the message is printed).
fn write_file(path: &std::path::Path, bytes: &[u8]) -> bool {
    match std::fs::write(path, bytes) {
        Ok(()) => false,
        Err(e) => {
            eprintln!("modelgate bench: cannot write {}: {e}", path.display());
            true
        }
    }
}

/// Milliseconds as a float, the unit of every figure reported.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
