//! Driving the load: the open-loop timetable (constant or Poisson arrivals, kept by a dedicated thread so latencies start at the scheduled time), the closed-loop workers, warmup, the live progress line and Ctrl-C.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::client::{self, BenchClient, Measured, Target};
use super::prompt::{self, Bodies, Source};
use super::{Arrivals, BenchArgs, Protocol};

/// How requests are started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// `rate` requests per second per endpoint on a fixed timetable.
    Open { rate: f64, arrivals: Arrivals },
    /// `concurrency` workers per endpoint, back to back.
    Closed { concurrency: usize },
}

/// When the counted part of the run ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    Duration(Duration),
    /// Counted requests per endpoint.
    Requests(u64),
}

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `--url` and, with `--compare`, the second URL, as given.
    pub urls: Vec<String>,
    pub targets: Vec<Target>,
    pub protocol: Protocol,
    pub model: String,
    pub stream: bool,
    pub mode: Mode,
    pub stop: Stop,
    pub warmup: Duration,
    pub bodies: Bodies,
}

impl Plan {
    pub fn from_args(a: &BenchArgs) -> Result<Self, String> {
        let key = std::env::var(&a.key_env).ok().filter(|k| !k.is_empty());
        let mut urls = vec![a.url.clone()];
        urls.extend(a.compare.clone());
        let targets = urls
            .iter()
            .map(|u| Target::new(u, a.protocol, key.as_deref()))
            .collect::<Result<Vec<_>, _>>()?;
        let mode = match (a.rate, a.concurrency) {
            (Some(rate), _) => {
                if !(rate.is_finite() && rate > 0.0) {
                    return Err("--rate must be a positive number of requests per second".into());
                }
                Mode::Open {
                    rate,
                    arrivals: a.arrivals.unwrap_or(Arrivals::Constant),
                }
            }
            (None, c) => {
                let concurrency = c.unwrap_or(1);
                if concurrency == 0 {
                    return Err("--concurrency must be at least 1".into());
                }
                Mode::Closed { concurrency }
            }
        };
        let stop = match (a.duration, a.requests) {
            (_, Some(0)) => return Err("--requests must be at least 1".into()),
            (_, Some(n)) => Stop::Requests(n),
            (Some(s), None) => Stop::Duration(seconds("--duration", s)?),
            (None, None) => Stop::Duration(Duration::from_secs(10)),
        };
        if stop == Stop::Duration(Duration::ZERO) {
            return Err("--duration must be positive".into());
        }
        let warmup = seconds("--warmup", a.warmup)?;
        let source = match &a.dataset {
            Some(path) => Source::Dataset {
                lines: prompt::read_dataset(path)?,
                output_tokens: a.output_tokens,
            },
            None => Source::Synthetic {
                input_tokens: a.input_tokens,
                output_tokens: a.output_tokens,
            },
        };
        let stream = !a.no_stream;
        Ok(Self {
            urls,
            targets,
            protocol: a.protocol,
            model: a.model.clone(),
            stream,
            mode,
            stop,
            warmup,
            bodies: Bodies {
                protocol: a.protocol,
                model: a.model.clone(),
                stream,
                source,
            },
        })
    }

    /// One line saying what this run does, for the table and the HTML report.
    pub fn describe(&self) -> String {
        let load = match self.mode {
            Mode::Open { rate, arrivals } => format!(
                "open loop, {rate} req/s{} ({})",
                if self.targets.len() > 1 {
                    " per endpoint"
                } else {
                    ""
                },
                match arrivals {
                    Arrivals::Constant => "constant arrivals",
                    Arrivals::Poisson => "Poisson arrivals",
                }
            ),
            Mode::Closed { concurrency } => format!(
                "closed loop, concurrency {concurrency}{}",
                if self.targets.len() > 1 {
                    " per endpoint"
                } else {
                    ""
                }
            ),
        };
        let stop = match self.stop {
            Stop::Duration(d) => format!("{} s", d.as_secs_f64()),
            Stop::Requests(n) => format!(
                "{n} requests{}",
                if self.targets.len() > 1 {
                    " per endpoint"
                } else {
                    ""
                }
            ),
        };
        let warmup = if self.warmup.is_zero() {
            String::new()
        } else {
            format!(" after {} s warmup", self.warmup.as_secs_f64())
        };
        let input = match &self.bodies.source {
            Source::Synthetic {
                input_tokens,
                output_tokens,
            } => format!("~{input_tokens} input tokens, max {output_tokens} output"),
            Source::Dataset { lines, .. } => format!("dataset of {} bodies", lines.len()),
        };
        format!(
            "{} {}, model {}, {load}, {stop}{warmup}, {input}",
            self.protocol.name(),
            if self.stream { "stream" } else { "no stream" },
            self.model
        )
    }
}

fn seconds(flag: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| format!("{flag} must be a non-negative number of seconds"))
}

/// One counted request.
#[derive(Debug, Clone)]
pub struct Record {
    pub endpoint: usize,
    /// Scheduled send time, from the start of the counted part of the run.
    pub scheduled: Duration,
    pub m: Measured,
}

impl Record {
    /// When it ended, from the start of the counted part.
    pub fn end(&self) -> Duration {
        self.scheduled + self.m.e2e
    }
}

/// What a run produced.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Counted requests, in the order they finished.
    pub records: Vec<Record>,
    pub interrupted: bool,
    /// Wall time of the counted part (its start to the last counted request's end).
    pub elapsed: Duration,
}

/// A finished request as it travels to the collector; warmup ones are dropped there.
struct Done {
    endpoint: usize,
    /// Scheduled time from the run's start (warmup included).
    offset: Duration,
    counted: bool,
    m: Measured,
}

/// Runs the plan to its end, or until Ctrl-C.
pub async fn execute(plan: &Plan) -> Outcome {
    let client = BenchClient::new();
    let (tx, rx) = mpsc::unbounded_channel::<Done>();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    match plan.mode {
        Mode::Open { rate, arrivals } => {
            let timetable = Timetable::new(plan, rate, arrivals);
            let ctx = OpenCtx {
                client,
                targets: plan.targets.clone(),
                bodies: plan.bodies.clone(),
                stream: plan.stream,
                tx,
                stop: stop.clone(),
                runtime: tokio::runtime::Handle::current(),
            };
            // A thread of its own keeps the timetable: tokio's timer wheel has a 1 ms grain, so
            // sleeping on it would add up to 1 ms of lag to every request; a thread's sleep is
            // accurate to tens of microseconds. It ends by itself after the last arrival, or at
            // the next arrival after `stop` is set.
            // Linux ends a sleep up to the thread's timer slack late (50 µs by default) so it
            // can batch wake-ups; a timetable wants its sleeps exact. A thread takes the slack
            // of the one that starts it, and this runs on the main thread, whose slack the
            // process's own entry sets. Best effort: elsewhere there is no such file.
            #[cfg(target_os = "linux")]
            let _ = std::fs::write("/proc/self/timerslack_ns", "1");
            let spawned = std::thread::Builder::new()
                .name("bench-timetable".into())
                .spawn(move || open_loop(ctx, timetable, start));
            if let Err(e) = spawned {
                eprintln!("modelgate bench: cannot start the timetable thread: {e}");
                return Outcome::default();
            }
        }
        Mode::Closed { concurrency } => {
            let deadline = match plan.stop {
                Stop::Duration(d) => Some(start + plan.warmup + d),
                Stop::Requests(_) => None,
            };
            for endpoint in 0..plan.targets.len() {
                let counted = Arc::new(AtomicU64::new(0));
                let seq = Arc::new(AtomicU64::new(0));
                let limit = match plan.stop {
                    Stop::Requests(n) => n,
                    Stop::Duration(_) => u64::MAX,
                };
                for _ in 0..concurrency {
                    let w = ClosedWorker {
                        client: client.clone(),
                        target: plan.targets[endpoint].clone(),
                        endpoint,
                        endpoints: plan.targets.len(),
                        bodies: plan.bodies.clone(),
                        stream: plan.stream,
                        start,
                        warmup_end: start + plan.warmup,
                        deadline,
                        counted: counted.clone(),
                        limit,
                        seq: seq.clone(),
                        stop: stop.clone(),
                        tx: tx.clone(),
                    };
                    workers.spawn(w.run());
                }
            }
            drop(tx);
        }
    }
    let outcome = collect(plan, rx, start).await;
    // Nothing still running should outlive the report: the timetable thread stops at its next
    // arrival, closed-loop workers are aborted with their JoinSet, and open-loop requests still
    // in flight after Ctrl-C end with the runtime when the command returns.
    stop.store(true, Ordering::SeqCst);
    workers.abort_all();
    outcome
}

/// The open loop's arrival times, from the run's start, with each slot's endpoint.
struct Timetable {
    rng: fastrand::Rng,
    /// Combined rate over all endpoints (they take slots in turn).
    rate: f64,
    arrivals: Arrivals,
    endpoints: usize,
    warmup: Duration,
    stop: Stop,
    next: Duration,
    slot: u64,
    counted: u64,
}

impl Timetable {
    fn new(plan: &Plan, rate: f64, arrivals: Arrivals) -> Self {
        let endpoints = plan.targets.len();
        Self {
            // A fixed seed: the same arguments give the same timetable on every run, so two
            // runs (say before and after a change) see the same arrival pattern.
            rng: fastrand::Rng::with_seed(0x6d6f_6465_6c67_6174),
            rate: rate * endpoints as f64,
            arrivals,
            endpoints,
            warmup: plan.warmup,
            stop: plan.stop,
            next: Duration::ZERO,
            slot: 0,
            counted: 0,
        }
    }
}

/// A slot of the timetable: when (from the start), which endpoint, whether it is counted.
struct Slot {
    offset: Duration,
    index: u64,
    endpoint: usize,
    counted: bool,
}

impl Iterator for Timetable {
    type Item = Slot;

    fn next(&mut self) -> Option<Slot> {
        let offset = self.next;
        let counted = offset >= self.warmup;
        match self.stop {
            Stop::Duration(d) if offset >= self.warmup + d => return None,
            Stop::Requests(n) if counted && self.counted >= n * self.endpoints as u64 => {
                return None
            }
            _ => {}
        }
        let gap = match self.arrivals {
            Arrivals::Constant => 1.0 / self.rate,
            // Exponential with mean 1/rate; 1 - U is in (0, 1], so the log is finite.
            Arrivals::Poisson => -(1.0 - self.rng.f64()).ln() / self.rate,
        };
        self.next = offset + Duration::from_secs_f64(gap);
        let slot = Slot {
            offset,
            index: self.slot,
            // Alternate endpoints slot by slot: both see the same load at the same moments.
            endpoint: usize::try_from(self.slot % self.endpoints as u64).unwrap_or(0),
            counted,
        };
        self.slot += 1;
        if counted {
            self.counted += 1;
        }
        Some(slot)
    }
}

struct OpenCtx {
    client: BenchClient,
    targets: Vec<Target>,
    bodies: Bodies,
    stream: bool,
    tx: mpsc::UnboundedSender<Done>,
    stop: Arc<AtomicBool>,
    runtime: tokio::runtime::Handle,
}

/// The timetable thread: prepares each body ahead, sleeps until the slot's time, starts the request.
fn open_loop(ctx: OpenCtx, timetable: Timetable, start: Instant) {
    for slot in timetable {
        let body = ctx.bodies.body(slot.index);
        let scheduled = start + slot.offset;
        let now = Instant::now();
        if scheduled > now {
            std::thread::sleep(scheduled - now);
        }
        if ctx.stop.load(Ordering::Relaxed) || ctx.tx.is_closed() {
            return;
        }
        let client = ctx.client.clone();
        let target = ctx.targets[slot.endpoint].clone();
        let tx = ctx.tx.clone();
        let stream = ctx.stream;
        // Each request is its own task so a slow reply never delays the next arrival. It is
        // tracked through `tx`: the collector waits until every sender (this thread's and each
        // request's) is gone, so all requests have reported before the report is made.
        drop(ctx.runtime.spawn(async move {
            let m = client::measure(&client, &target, body, scheduled, stream).await;
            let _ = tx.send(Done {
                endpoint: slot.endpoint,
                offset: slot.offset,
                counted: slot.counted,
                m,
            });
        }));
    }
}

struct ClosedWorker {
    client: BenchClient,
    target: Target,
    endpoint: usize,
    endpoints: usize,
    bodies: Bodies,
    stream: bool,
    start: Instant,
    warmup_end: Instant,
    deadline: Option<Instant>,
    /// Counted requests started against this endpoint (shared by its workers).
    counted: Arc<AtomicU64>,
    limit: u64,
    seq: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<Done>,
}

impl ClosedWorker {
    async fn run(self) {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            if self.deadline.is_some_and(|d| now >= d) {
                return;
            }
            let counted = now >= self.warmup_end;
            if counted && self.counted.fetch_add(1, Ordering::SeqCst) >= self.limit {
                return;
            }
            // Bodies are numbered across endpoints so both see the same sequence of prompts.
            let i = self.seq.fetch_add(1, Ordering::Relaxed) * self.endpoints as u64
                + self.endpoint as u64;
            let body = self.bodies.body(i);
            // In a closed loop a request is scheduled the moment its worker is free.
            let scheduled = Instant::now();
            let m = client::measure(&self.client, &self.target, body, scheduled, self.stream).await;
            let done = Done {
                endpoint: self.endpoint,
                offset: scheduled.saturating_duration_since(self.start),
                counted,
                m,
            };
            if self.tx.send(done).is_err() {
                return;
            }
        }
    }
}

/// Gathers finished requests until all are in (or Ctrl-C), drawing the progress line on a TTY.
async fn collect(plan: &Plan, mut rx: mpsc::UnboundedReceiver<Done>, start: Instant) -> Outcome {
    let bar = progress_bar();
    let mut out = Outcome::default();
    let mut warmups = 0u64;
    let mut errors = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            done = rx.recv() => {
                let Some(done) = done else { break };
                if !done.counted {
                    warmups += 1;
                    continue;
                }
                if done.m.error.is_some() {
                    errors += 1;
                }
                out.records.push(Record {
                    endpoint: done.endpoint,
                    scheduled: done.offset.saturating_sub(plan.warmup),
                    m: done.m,
                });
            }
            _ = tick.tick() => {
                if let Some(bar) = &bar {
                    let t = start.elapsed().as_secs_f64();
                    let phase = if t < plan.warmup.as_secs_f64() { "warmup " } else { "" };
                    bar.set_message(format!(
                        "{phase}{t:.1} s  done {}  errors {errors}  warmup {warmups}",
                        out.records.len()
                    ));
                }
            }
            _ = &mut ctrl_c => {
                out.interrupted = true;
                break;
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if out.interrupted {
        eprintln!(
            "interrupted: reporting the {} requests that finished",
            out.records.len()
        );
    }
    out.elapsed = out
        .records
        .iter()
        .map(Record::end)
        .max()
        .unwrap_or_default();
    out
}

/// A spinner line on stderr when it is a terminal; nothing at all when piped.
fn progress_bar() -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        None,
        indicatif::ProgressDrawTarget::stderr_with_hz(5),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str]) -> Plan {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: BenchArgs,
        }
        let mut v = vec!["x", "--url", "http://127.0.0.1:1/v1", "--model", "m"];
        v.extend_from_slice(args);
        Plan::from_args(&P::parse_from(v).a).unwrap()
    }

    #[test]
    fn constant_timetable_spaces_and_counts() {
        let p = plan(&["--rate", "10", "--requests", "5", "--warmup", "0.25"]);
        let slots: Vec<Slot> = Timetable::new(&p, 10.0, Arrivals::Constant).collect();
        // 0, 0.1, 0.2 are warmup; 5 counted from 0.3.
        assert_eq!(slots.len(), 8);
        assert_eq!(slots.iter().filter(|s| s.counted).count(), 5);
        assert!((slots[3].offset.as_secs_f64() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn compare_alternates_and_doubles() {
        let p = plan(&[
            "--rate",
            "10",
            "--duration",
            "1",
            "--compare",
            "http://127.0.0.1:2/v1",
        ]);
        let slots: Vec<Slot> = Timetable::new(&p, 10.0, Arrivals::Constant).collect();
        assert_eq!(slots.len(), 20);
        assert_eq!(slots.iter().filter(|s| s.endpoint == 1).count(), 10);
        assert_eq!(slots[1].endpoint, 1);
    }

    #[test]
    fn poisson_mean_gap_is_one_over_rate() {
        let p = plan(&["--rate", "100", "--requests", "20000"]);
        let slots: Vec<Slot> = Timetable::new(&p, 100.0, Arrivals::Poisson).collect();
        let last = slots.last().unwrap().offset.as_secs_f64();
        let mean = last / (slots.len() - 1) as f64;
        assert!((mean - 0.01).abs() < 0.0005, "mean gap {mean}");
    }
}
