//! Which target serves each attempt of a request: strategies, passive health, the retry budget and the pause between attempts.
//!
//! Config is data; what this module keeps per target (requests in flight, time-to-first-byte
//! EWMA, consecutive failures, ejections) and per model (the retry budget's window) lives in a
//! [`Runtime`] indexed like the config's models, so choosing a target never takes a lock held
//! across an await.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::config::{Config, HealthPolicy, Model, RetryPolicy, Strategy};

/// The retry budget's window (gateway.md §10).
const BUDGET_WINDOW: Duration = Duration::from_secs(10);
/// Retries always allowed per window, whatever the percentage: a quiet model can still retry.
const BUDGET_FLOOR: u64 = 10;
/// Weight of a new time-to-first-byte sample in the latency strategy's average.
const EWMA_ALPHA: f64 = 0.3;
/// Added to a failed attempt's time when it enters the latency average: a target that fails
/// fast (connection refused) must not look fast.
const FAILURE_PENALTY: Duration = Duration::from_secs(1);

/// Per-target and per-model state for one loaded config.
#[derive(Debug)]
pub struct Runtime {
    models: Vec<ModelRuntime>,
}

/// The state of one model entry, named so a reload can hand it to the same entry's successor.
#[derive(Debug)]
struct ModelRuntime {
    name: String,
    targets: Vec<(TargetKey, Arc<TargetRuntime>)>,
    budget: Arc<Mutex<BudgetWindow>>,
}

/// A target is the same across a reload when its upstream and model name are.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TargetKey {
    upstream: String,
    upstream_model: Option<String>,
}

#[derive(Debug, Default)]
struct TargetRuntime {
    inflight: AtomicUsize,
    /// Microseconds; 0 until the first sample, which makes an unmeasured target the first tried.
    ttfb_ewma_us: AtomicU64,
    health: Mutex<Health>,
}

#[derive(Debug, Default)]
struct Health {
    consecutive_failures: u32,
    /// Ejections since the target was last healthy; each doubles the next one's length.
    ejections: u32,
    ejected_at: Option<Instant>,
    ejected_until: Option<Instant>,
    /// A probe is on its way to a target whose ejection ran out; others wait for its result.
    probing: bool,
}

impl Runtime {
    /// State for `config`'s models; what `previous` kept for the same model and target carries over.
    pub fn new(config: &Config, previous: Option<&Runtime>) -> Self {
        let models = config
            .models
            .iter()
            .map(|m| {
                let old = previous.and_then(|p| p.models.iter().find(|o| o.name == m.name));
                let targets = m
                    .targets
                    .iter()
                    .map(|t| {
                        let key = TargetKey {
                            upstream: t.upstream.name.to_string(),
                            upstream_model: t.upstream_model.clone(),
                        };
                        let state = old
                            .and_then(|o| o.targets.iter().find(|(k, _)| *k == key))
                            .map_or_else(Arc::default, |(_, s)| s.clone());
                        (key, state)
                    })
                    .collect();
                ModelRuntime {
                    name: m.name.clone(),
                    targets,
                    budget: old.map_or_else(Arc::default, |o| o.budget.clone()),
                }
            })
            .collect();
        Self { models }
    }

    fn target(&self, model: &Model, index: usize) -> Option<&TargetRuntime> {
        self.models
            .get(model.index)?
            .targets
            .get(index)
            .map(|(_, t)| t.as_ref())
    }

    /// Counts a new request against `model`'s retry budget.
    pub fn request_started(&self, model: &Model) {
        if let Some(m) = self.models.get(model.index) {
            lock(&m.budget).add(Instant::now(), 1, 0);
        }
    }

    /// Takes one retry from `model`'s budget; false when the budget is spent.
    pub fn take_retry(&self, model: &Model) -> bool {
        let Some(m) = self.models.get(model.index) else {
            return true;
        };
        let mut w = lock(&m.budget);
        let now = Instant::now();
        let (requests, retries) = w.totals(now);
        let allowed = (requests * u64::from(model.retry.budget_percent) / 100).max(BUDGET_FLOOR);
        if retries >= allowed {
            return false;
        }
        w.add(now, 0, 1);
        true
    }

    /// Marks an attempt on a target as started; the guard counts it in flight until dropped
    /// (for a stream, with the response body) and clears a probe that never reported.
    pub fn start(self: &Arc<Self>, model: &Arc<Model>, index: usize, probe: bool) -> InFlight {
        if let Some(t) = self.target(model, index) {
            t.inflight.fetch_add(1, Ordering::Relaxed);
        }
        InFlight {
            runtime: self.clone(),
            model: model.clone(),
            index,
            probe,
        }
    }

    /// The target answered (any status that is not a retryable failure): healthy again.
    pub fn success(&self, model: &Model, index: usize, ttfb: Option<Duration>) {
        let Some(t) = self.target(model, index) else {
            return;
        };
        if let Some(ttfb) = ttfb {
            t.sample(ttfb);
        }
        let mut h = lock(&t.health);
        *h = Health::default();
    }

    /// A failure another attempt could mend (whether or not the policy retries it), after
    /// `took`; ejects the target after `eject_after` of them in a row, and at once when a probe
    /// fails. Returns true when this failure ejected it.
    pub fn failure(&self, model: &Model, index: usize, took: Duration) -> bool {
        let Some(t) = self.target(model, index) else {
            return false;
        };
        t.sample(took.saturating_add(FAILURE_PENALTY));
        let policy = model.health;
        let mut h = lock(&t.health);
        let probe_failed = std::mem::take(&mut h.probing);
        h.consecutive_failures += 1;
        if policy.eject_after == 0 || (!probe_failed && h.consecutive_failures < policy.eject_after)
        {
            return false;
        }
        h.consecutive_failures = 0;
        h.ejections += 1;
        let now = Instant::now();
        h.ejected_at = Some(now);
        h.ejected_until = Some(now + ejection_length(policy, h.ejections));
        true
    }
}

impl TargetRuntime {
    /// Folds one time-to-first-byte sample into the average.
    fn sample(&self, took: Duration) {
        let sample = took.as_micros().min(u128::from(u64::MAX / 2)) as f64;
        let old = self.ttfb_ewma_us.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            EWMA_ALPHA * sample + (1.0 - EWMA_ALPHA) * old as f64
        };
        // A lost update between racing requests only drops one sample of an average.
        self.ttfb_ewma_us
            .store((new as u64).max(1), Ordering::Relaxed);
    }
}

/// `eject_ms`, doubled for each ejection after the first, capped.
fn ejection_length(policy: HealthPolicy, ejections: u32) -> Duration {
    let factor = 1u32 << ejections.saturating_sub(1).min(16);
    policy
        .eject
        .saturating_mul(factor)
        .min(HealthPolicy::MAX_EJECTION)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The state under these locks stays valid whatever a panicking holder did.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An attempt in flight on one target.
#[derive(Debug)]
pub struct InFlight {
    runtime: Arc<Runtime>,
    model: Arc<Model>,
    index: usize,
    probe: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(t) = self.runtime.target(&self.model, self.index) {
            t.inflight.fetch_sub(1, Ordering::Relaxed);
            if self.probe {
                // A probe whose client left before any result must not block the target forever.
                lock(&t.health).probing = false;
            }
        }
    }
}

/// Requests and retries per second over the last ten seconds.
#[derive(Debug, Default)]
struct BudgetWindow {
    /// `(second, requests, retries)`, one slot per second of the window.
    slots: [(u64, u64, u64); 10],
    epoch: Option<Instant>,
}

impl BudgetWindow {
    fn second(&mut self, now: Instant) -> u64 {
        let epoch = *self.epoch.get_or_insert(now);
        now.saturating_duration_since(epoch).as_secs()
    }

    fn add(&mut self, now: Instant, requests: u64, retries: u64) {
        let sec = self.second(now);
        let slot = &mut self.slots[(sec % 10) as usize];
        if slot.0 != sec {
            *slot = (sec, 0, 0);
        }
        slot.1 += requests;
        slot.2 += retries;
    }

    fn totals(&mut self, now: Instant) -> (u64, u64) {
        let sec = self.second(now);
        let window = BUDGET_WINDOW.as_secs();
        self.slots
            .iter()
            .filter(|(s, _, _)| *s + window > sec && *s <= sec)
            .fold((0, 0), |(q, r), (_, sq, sr)| (q + sq, r + sr))
    }
}

/// One try: which model's which target, and whether it is a health probe.
#[derive(Debug, Clone)]
pub struct Pick {
    pub model: Arc<Model>,
    /// The name the model was asked for: the client's, or the fallback's as configured.
    pub name: Arc<str>,
    pub index: usize,
    pub probe: bool,
}

/// The requested model followed by its resolved fallbacks, each with the name it was asked by.
/// Inline for up to two models: a request builds one, and most have no fallback.
pub type Chain = SmallVec<[(Arc<Model>, Arc<str>); 2]>;

/// The order of attempts for one request: the model's targets, each once, by its strategy;
/// then each fallback's; then the last model's targets again while attempts remain.
#[derive(Debug)]
pub struct Selector {
    chain: Chain,
    /// Position in `chain` of the model being tried.
    pos: usize,
    /// Where the request stands with each target: the chain's models' targets one after another,
    /// in one list (most requests have one model with one target). Inline for a few, as
    /// `open`: a request makes one selector.
    slots: SmallVec<[Slot; 4]>,
    /// The targets still open in the current round.
    open: SmallVec<[usize; 8]>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Tried in this round.
    tried: bool,
    /// Not to be tried again for this request (its retry-after is too long, or it cannot
    /// express the request).
    excluded: bool,
    /// An honoured retry-after runs until then.
    not_before: Option<Instant>,
}

impl Selector {
    /// `chain` is the requested model followed by its resolved fallbacks, each with the name
    /// it was asked by.
    pub fn new(chain: Chain) -> Self {
        let targets = chain.iter().map(|(m, _)| m.targets.len()).sum();
        Self {
            slots: smallvec::smallvec![Slot::default(); targets],
            chain,
            pos: 0,
            open: SmallVec::new(),
        }
    }

    /// The requested model (first of the chain).
    pub fn model(&self) -> &Arc<Model> {
        &self.chain[0].0
    }

    /// The slots of the chain's `p`-th model's targets.
    fn slots(&mut self, p: usize) -> &mut [Slot] {
        let start: usize = self.chain[..p].iter().map(|(m, _)| m.targets.len()).sum();
        let len = self.chain[p].0.targets.len();
        &mut self.slots[start..start + len]
    }

    /// The next target to try, or `None` when every target is excluded.
    pub fn next(&mut self, rt: &Runtime) -> Option<Pick> {
        loop {
            let (m, name) = self.chain.get(self.pos)?.clone();
            let p = self.pos;
            let mut open = std::mem::take(&mut self.open);
            open.clear();
            open.extend(
                self.slots(p)
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.tried && !s.excluded)
                    .map(|(i, _)| i),
            );
            let found = (!open.is_empty()).then(|| choose(rt, &m, &open));
            self.open = open;
            if let Some((index, probe)) = found {
                self.slots(p)[index].tried = true;
                return Some(Pick {
                    model: m,
                    name,
                    index,
                    probe,
                });
            }
            if self.pos + 1 < self.chain.len() {
                self.pos += 1;
                continue;
            }
            // The last model: another round over its targets, if any may still be tried.
            let last = self.slots(p);
            if last.iter().all(|s| s.excluded) {
                return None;
            }
            last.iter_mut().for_each(|s| s.tried = false);
        }
    }

    /// Keeps `pick`'s target out of the rest of this request.
    pub fn exclude(&mut self, pick: &Pick) {
        if let Some(slot) = self.slot(pick) {
            slot.excluded = true;
        }
    }

    /// Remembers an upstream's retry-after for `pick`'s target: honoured when it fits
    /// `retry_after_max`, else the target is left for the rest of the request.
    pub fn retry_after(&mut self, pick: &Pick, after: Duration, policy: &RetryPolicy) {
        if after > policy.retry_after_max {
            self.exclude(pick);
        } else if let Some(slot) = self.slot(pick) {
            slot.not_before = Some(Instant::now() + after);
        }
    }

    /// How long to wait before `pick`, the `retry`-th retry: full-jitter exponential backoff,
    /// or the target's own retry-after when that is longer.
    pub fn pause(&mut self, pick: &Pick, retry: u32, policy: &RetryPolicy) -> Duration {
        let exp = retry.saturating_sub(1).min(20);
        let cap = policy
            .backoff
            .saturating_mul(1u32 << exp)
            .min(policy.max_backoff);
        let jitter = cap.mul_f64(fastrand::f64());
        let until = self
            .slot(pick)
            .and_then(|s| s.not_before)
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or_default();
        jitter.max(until)
    }

    /// The slot of `pick`'s target.
    fn slot(&mut self, pick: &Pick) -> Option<&mut Slot> {
        let p = self
            .chain
            .iter()
            .position(|(m, _)| Arc::ptr_eq(m, &pick.model))?;
        self.slots(p).get_mut(pick.index)
    }
}

/// Chooses among `open` (untried, not excluded) targets of `m`: the healthy ones by strategy;
/// if every one is ejected, the least recently ejected. Returns the index and whether the pick
/// is a probe of a target whose ejection ran out.
fn choose(rt: &Runtime, m: &Model, open: &[usize]) -> (usize, bool) {
    let now = Instant::now();
    let mut healthy: SmallVec<[usize; 8]> = SmallVec::new();
    let mut probe = None;
    let mut oldest: Option<(Instant, usize)> = None;
    for &i in open {
        let Some(t) = rt.target(m, i) else {
            healthy.push(i);
            continue;
        };
        let h = lock(&t.health);
        match h.ejected_until {
            None => healthy.push(i),
            Some(until) if until <= now && !h.probing => {
                probe.get_or_insert(i);
            }
            Some(_) => {
                let at = h.ejected_at.unwrap_or(now);
                if oldest.is_none_or(|(t, _)| at < t) {
                    oldest = Some((at, i));
                }
            }
        }
    }
    // A target back from ejection gets its one probe before the strategy spreads load again.
    if let Some(i) = probe {
        if let Some(t) = rt.target(m, i) {
            lock(&t.health).probing = true;
        }
        return (i, true);
    }
    if healthy.is_empty() {
        return (oldest.map_or(open[0], |(_, i)| i), false);
    }
    (by_strategy(rt, m, &healthy), false)
}

fn by_strategy(rt: &Runtime, m: &Model, candidates: &[usize]) -> usize {
    if let [only] = candidates {
        return *only;
    }
    match m.strategy {
        Strategy::Weighted => {
            let total: u64 = candidates
                .iter()
                .map(|&i| u64::from(m.targets[i].weight))
                .sum();
            let mut roll = fastrand::u64(0..total.max(1));
            for &i in candidates {
                let w = u64::from(m.targets[i].weight);
                if roll < w {
                    return i;
                }
                roll -= w;
            }
            candidates[candidates.len() - 1]
        }
        Strategy::LeastInflight => {
            // Read once: the counters move under other requests while this one chooses.
            let loads: Vec<(usize, usize)> = candidates
                .iter()
                .map(|&i| {
                    let load = rt
                        .target(m, i)
                        .map_or(0, |t| t.inflight.load(Ordering::Relaxed));
                    (i, load)
                })
                .collect();
            let least = loads.iter().map(|(_, l)| *l).min().unwrap_or(0);
            let ties: Vec<usize> = loads
                .iter()
                .filter(|(_, l)| *l == least)
                .map(|(i, _)| *i)
                .collect();
            ties.get(fastrand::usize(0..ties.len().max(1)))
                .copied()
                .unwrap_or(candidates[0])
        }
        Strategy::Latency => {
            let a = candidates[fastrand::usize(0..candidates.len())];
            let mut b = candidates[fastrand::usize(0..candidates.len() - 1)];
            if b == a {
                b = candidates[candidates.len() - 1];
            }
            let ewma = |i: usize| {
                rt.target(m, i)
                    .map_or(0, |t| t.ttfb_ewma_us.load(Ordering::Relaxed))
            };
            if ewma(b) < ewma(a) {
                b
            } else {
                a
            }
        }
    }
}

#[cfg(test)]
mod tests;
