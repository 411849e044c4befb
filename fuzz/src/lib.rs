//! The fuzz targets' side of the hostile-input harness: arbitrary JSON trees made of protocol words, fixture requests and streams mutated by libFuzzer's bytes; the models, checks and reference decoder are `tests/hostile/mod.rs`, shared with the property tests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "fuzz harness: a broken invariant must abort the run loudly, with the input saved"
)]

#[path = "../../tests/hostile/mod.rs"]
mod hostile;

pub use hostile::*;

use arbitrary::{Result, Unstructured};
use modelgate::config::Protocol;
use serde_json::{Map, Number, Value};

/// Upper bound on a generated tree's depth: deep enough for every protocol field, shallow enough
/// that serialising it never nears a recursion limit.
const MAX_DEPTH: u32 = 6;

// ---------------------------------------------------------------------------------------------
// Arbitrary JSON
// ---------------------------------------------------------------------------------------------

/// Numbers where the validators' ranges and integer conversions have their edges.
const EDGE_NUMBERS: &[f64] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1.5,
    2.0,
    2.5,
    4.0,
    20.0,
    128.0,
    129.0,
    1e9,
    1e300,
    -1e300,
    9.007_199_254_740_993e15,
];

fn word(u: &mut Unstructured) -> Result<String> {
    let words = &fixtures().words;
    if u.ratio(3, 4)? && !words.is_empty() {
        Ok(u.choose(words)?.clone())
    } else {
        u.arbitrary()
    }
}

fn number(u: &mut Unstructured) -> Result<Value> {
    Ok(match u.int_in_range(0..=4)? {
        0 => Value::from(u.arbitrary::<i64>()?),
        1 => Value::from(u.arbitrary::<u64>()?),
        2 => Value::from(u.int_in_range(-3i64..=130)?),
        3 => Number::from_f64(*u.choose(EDGE_NUMBERS)?).map_or(Value::Null, Value::Number),
        _ => Number::from_f64(u.arbitrary::<f64>()?).map_or(Value::Null, Value::Number),
    })
}

/// An arbitrary JSON value whose keys and strings are mostly protocol words.
pub fn value(u: &mut Unstructured, depth: u32) -> Result<Value> {
    let top = if depth >= MAX_DEPTH { 4 } else { 6 };
    Ok(match u.int_in_range(0..=top)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => number(u)?,
        3 | 4 => Value::String(word(u)?),
        5 => {
            let n = u.int_in_range(0..=4)?;
            let mut a = Vec::with_capacity(n);
            for _ in 0..n {
                a.push(value(u, depth + 1)?);
            }
            Value::Array(a)
        }
        _ => {
            let n = u.int_in_range(0..=5)?;
            let mut o = Map::new();
            for _ in 0..n {
                o.insert(word(u)?, value(u, depth + 1)?);
            }
            Value::Object(o)
        }
    })
}

/// Changes one node of `v`, reached by a random walk from the root: replaced, or (objects and
/// arrays) given, robbed of or duplicating a child.
pub fn mutate(u: &mut Unstructured, v: &mut Value, depth: u32) -> Result<()> {
    let descend = u.ratio(2, 3)?;
    match v {
        Value::Object(o) if descend && !o.is_empty() => {
            let keys: Vec<String> = o.keys().cloned().collect();
            let k = u.choose(&keys)?;
            if let Some(child) = o.get_mut(k) {
                return mutate(u, child, depth + 1);
            }
        }
        Value::Array(a) if descend && !a.is_empty() => {
            let i = u.choose_index(a.len())?;
            return mutate(u, &mut a[i], depth + 1);
        }
        _ => {}
    }
    match (u.int_in_range(0..=3)?, &mut *v) {
        (0, Value::Object(o)) => {
            o.insert(word(u)?, value(u, depth + 1)?);
        }
        (1, Value::Object(o)) if !o.is_empty() => {
            let keys: Vec<String> = o.keys().cloned().collect();
            let k = u.choose(&keys)?.clone();
            o.remove(&k);
        }
        (0, Value::Array(a)) => {
            let at = u.int_in_range(0..=a.len())?;
            a.insert(at, value(u, depth + 1)?);
        }
        (1, Value::Array(a)) if !a.is_empty() => {
            let i = u.choose_index(a.len())?;
            a.remove(i);
        }
        (2, Value::Array(a)) if !a.is_empty() && a.len() < 64 => {
            let i = u.choose_index(a.len())?;
            let copy = a[i].clone();
            a.insert(i, copy);
        }
        _ => *v = value(u, depth)?,
    }
    Ok(())
}

/// A request of `kind`: one of its fixtures mutated a few times, or (sometimes) a fresh tree.
pub fn request_value(u: &mut Unstructured, kind: RequestKind) -> Result<Value> {
    let seeds = request_seeds(kind);
    let mut v = if u.ratio(1, 8)? || seeds.is_empty() {
        value(u, 0)?
    } else {
        (*u.choose(&seeds)?).clone()
    };
    for _ in 0..u.int_in_range(0..=4)? {
        mutate(u, &mut v, 0)?;
    }
    Ok(v)
}

/// An upstream stream of `upstream`'s protocol: a fixture stream whose events are mutated,
/// dropped, repeated or replaced, written out as SSE bytes.
pub fn stream_bytes(u: &mut Unstructured, upstream: Protocol) -> Result<Vec<u8>> {
    let seeds: Vec<&Events> = fixtures()
        .streams
        .iter()
        .filter(|(p, _)| *p == upstream)
        .map(|(_, s)| s)
        .collect();
    let mut events: Events = if seeds.is_empty() {
        Vec::new()
    } else {
        (*u.choose(&seeds)?).clone()
    };
    for _ in 0..u.int_in_range(0..=6)? {
        if events.is_empty() {
            break;
        }
        let i = u.choose_index(events.len())?;
        match u.int_in_range(0..=5)? {
            0 => {
                events.remove(i);
            }
            1 if events.len() < 256 => {
                let e = events[i].clone();
                events.insert(i, e);
            }
            2 => {
                let j = u.choose_index(events.len())?;
                events.swap(i, j);
            }
            3 => {
                let names = &fixtures().event_names;
                events[i].0 = if names.is_empty() || u.ratio(1, 4)? {
                    None
                } else {
                    Some(u.choose(names)?.clone())
                };
            }
            4 => {
                events[i].1 = match u.int_in_range(0..=2)? {
                    0 => "[DONE]".to_owned(),
                    1 => value(u, 0)?.to_string(),
                    _ => u.arbitrary()?,
                };
            }
            _ => {
                if let Ok(mut v) = serde_json::from_str::<Value>(&events[i].1) {
                    mutate(u, &mut v, 0)?;
                    events[i].1 = v.to_string();
                }
            }
        }
    }
    let mut out = Vec::new();
    for (name, data) in &events {
        if let Some(name) = name {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(name.as_bytes());
            out.push(b'\n');
        }
        // A data field holds one line per `data:` line, as the decoder joins them.
        for line in data.split('\n') {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        out.push(b'\n');
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Linear work
// ---------------------------------------------------------------------------------------------

/// CPU time this thread has used, in nanoseconds: unlike the wall clock it does not count the
/// time the (shared, niced) machine gave to others.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Runs `f` and fails when it took more CPU than a generous linear bound in `bytes` and
/// `pieces` (each piece costs a poll or a call on top of its bytes): a quadratic rescan of a
/// stretched input overshoots it many times.
pub fn within_linear_time(what: &str, bytes: usize, pieces: usize, f: impl FnOnce()) {
    let start = thread_cpu_ns();
    f();
    let took = thread_cpu_ns() - start;
    let bound = 20_000_000 + 20_000 * pieces as u64 + 200 * bytes as u64;
    assert!(
        took <= bound,
        "{what}: {} ms of CPU for {bytes} bytes in {pieces} pieces (bound {} ms)",
        took / 1_000_000,
        bound / 1_000_000
    );
}

/// True when the stretched linear-time runs are asked for (`MODELGATE_FUZZ_STRETCH=1`): they
/// cost tens of milliseconds each, so a campaign for coverage leaves them out and a short one
/// with this set checks the work stays linear.
pub fn stretch_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MODELGATE_FUZZ_STRETCH").is_some_and(|v| v == "1"))
}

/// `input` repeated until it is at least `len` bytes long (at most 65 536 times).
pub fn stretched(input: &[u8], len: usize) -> Vec<u8> {
    if input.is_empty() {
        return Vec::new();
    }
    let times = len.div_ceil(input.len()).min(65_536);
    input.repeat(times)
}
