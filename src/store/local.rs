//! The in-process store: every key's counters in one map behind a mutex, for a single instance.

use std::collections::HashMap;
use std::sync::Mutex;

use super::*;

#[derive(Debug, Default)]
struct KeyState {
    tat_ms: u64,
    /// `(minute number, tokens)` for the current and the previous minute.
    minutes: [(u64, u64); 2],
    /// `(day number, tokens)`.
    day: (u64, u64),
    in_flight: u32,
}

impl KeyState {
    /// Tokens charged this minute and the one before, as of `now`.
    fn minute_tokens(&self, now_ms: u64) -> (u64, u64) {
        let minute = now_ms / MINUTE_MS;
        let at = |m: u64| {
            self.minutes
                .iter()
                .find(|(n, _)| *n == m)
                .map_or(0, |(_, t)| *t)
        };
        (at(minute), minute.checked_sub(1).map_or(0, at))
    }

    fn day_tokens(&self, now_ms: u64) -> u64 {
        if self.day.0 == now_ms / DAY_MS {
            self.day.1
        } else {
            0
        }
    }
}

/// Counters for the keys of this process.
#[derive(Debug, Default)]
pub struct LocalStore {
    keys: Mutex<HashMap<String, KeyState>>,
}

impl LocalStore {
    fn with<R>(&self, key: &str, f: impl FnOnce(&mut KeyState) -> R) -> R {
        // The counters stay valid whatever a panicking holder did.
        let mut map = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(map.entry(key.to_owned()).or_default())
    }

    pub fn admit(&self, key: &str, limits: &KeyLimits, _slot: &str, now_ms: u64) -> Verdict {
        self.with(key, |s| {
            let (current, previous) = s.minute_tokens(now_ms);
            let used = tokens_in_window(current, previous, now_ms);
            let today = s.day_tokens(now_ms);
            let mut refused = None;
            let mut tat = s.tat_ms;
            if let Some(rpm) = limits.rpm {
                match gcra(s.tat_ms, rpm, now_ms) {
                    Ok(next) => tat = next,
                    Err(wait) => refused = Some((Limit::Rpm, wait)),
                }
            }
            if refused.is_none() && limits.tpm.is_some_and(|tpm| used >= tpm) {
                refused = Some((Limit::Tpm, MINUTE_MS - now_ms % MINUTE_MS));
            }
            if refused.is_none() && limits.daily_tokens.is_some_and(|d| today >= d) {
                refused = Some((Limit::DailyTokens, until_midnight_ms(now_ms)));
            }
            if refused.is_none() && limits.max_concurrent.is_some_and(|m| s.in_flight >= m) {
                refused = Some((Limit::MaxConcurrent, 1000));
            }
            if refused.is_none() {
                s.tat_ms = tat;
                if limits.max_concurrent.is_some() {
                    s.in_flight += 1;
                }
            }
            Verdict {
                refused,
                requests: limits.rpm.map(|rpm| requests_window(s.tat_ms, rpm, now_ms)),
                tokens: limits.tpm.map(|tpm| tokens_window(used, tpm, now_ms)),
                daily: limits.daily_tokens.map(|d| (today, d)),
            }
        })
    }

    pub fn charge(&self, key: &str, tokens: u64, now_ms: u64) {
        self.with(key, |s| {
            let minute = now_ms / MINUTE_MS;
            if s.minutes[0].0 != minute {
                // Keep the newest other minute as the previous one.
                s.minutes[1] = if s.minutes[0].0 + 1 == minute {
                    s.minutes[0]
                } else {
                    (0, 0)
                };
                s.minutes[0] = (minute, 0);
            }
            s.minutes[0].1 = s.minutes[0].1.saturating_add(tokens);
            let day = now_ms / DAY_MS;
            if s.day.0 != day {
                s.day = (day, 0);
            }
            s.day.1 = s.day.1.saturating_add(tokens);
        });
    }

    pub fn release(&self, key: &str, _slot: &str) {
        self.with(key, |s| s.in_flight = s.in_flight.saturating_sub(1));
    }
}
