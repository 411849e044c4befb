//! Target choice, health, budget and pauses, on models from a real config, with tokio's paused clock.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed setup step should fail the test loudly"
)]

use std::path::Path;

use super::*;
use crate::config::Config;

fn config(models: &str) -> Config {
    let text = format!(
        r#"
[listen]
base = "127.0.0.1:0"

[[keys]]
name = "k"
key = "sk-k"

[[upstreams]]
name = "a"
kind = "chat"
base_url = "http://127.0.0.1:1/v1"

[[upstreams]]
name = "b"
kind = "chat"
base_url = "http://127.0.0.1:2/v1"

[[upstreams]]
name = "c"
kind = "messages"
base_url = "http://127.0.0.1:3/v1"

{models}
"#
    );
    Config::parse(&text, Path::new("."), &|_| None).unwrap()
}

fn chain(cfg: &Config, names: &[&str]) -> Chain {
    names
        .iter()
        .map(|n| {
            let m = cfg.models.iter().find(|m| m.name == *n).unwrap().clone();
            (m, Arc::from(*n))
        })
        .collect()
}

fn upstream_of(p: &Pick) -> &str {
    &p.model.targets[p.index].upstream.name
}

#[tokio::test(start_paused = true)]
async fn every_target_once_then_fallbacks_then_the_last_model_again() {
    let cfg = config(
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a" }, { upstream = "b" }]
fallbacks = ["f"]

[[models]]
name = "f"
upstream = "c"
"#,
    );
    let rt = Runtime::new(&cfg, None);
    let mut sel = Selector::new(chain(&cfg, &["m", "f"]));
    let first: Vec<String> = (0..2)
        .map(|_| upstream_of(&sel.next(&rt).unwrap()).to_owned())
        .collect();
    let mut sorted = first.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["a", "b"],
        "each target of the model once: {first:?}"
    );
    let third = sel.next(&rt).unwrap();
    assert_eq!((upstream_of(&third), &*third.name), ("c", "f"));
    // The fallback is the last model: it is retried.
    assert_eq!(upstream_of(&sel.next(&rt).unwrap()), "c");
    // Excluded for good, nothing is left.
    sel.exclude(&third);
    assert!(sel.next(&rt).is_none());
}

#[tokio::test(start_paused = true)]
async fn weighted_picks_follow_the_weights() {
    let cfg = config(
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a", weight = 3 }, { upstream = "b", weight = 1 }]
"#,
    );
    let rt = Runtime::new(&cfg, None);
    let n = 4000;
    let a = (0..n)
        .filter(|_| {
            let mut sel = Selector::new(chain(&cfg, &["m"]));
            upstream_of(&sel.next(&rt).unwrap()) == "a"
        })
        .count();
    // Expected 3000, standard deviation about 27: ±200 is over seven deviations.
    assert!((2800..=3200).contains(&a), "a got {a} of {n}");
}

#[tokio::test(start_paused = true)]
async fn least_inflight_avoids_the_busy_target() {
    let cfg = config(
        r#"
[[models]]
name = "m"
strategy = "least_inflight"
targets = [{ upstream = "a" }, { upstream = "b" }]
"#,
    );
    let rt = Arc::new(Runtime::new(&cfg, None));
    let m = cfg.models[0].clone();
    let busy = rt.start(&m, 0, false);
    for _ in 0..50 {
        let mut sel = Selector::new(chain(&cfg, &["m"]));
        assert_eq!(upstream_of(&sel.next(&rt).unwrap()), "b");
    }
    drop(busy);
    let mut seen_a = false;
    for _ in 0..200 {
        let mut sel = Selector::new(chain(&cfg, &["m"]));
        seen_a |= upstream_of(&sel.next(&rt).unwrap()) == "a";
    }
    assert!(
        seen_a,
        "an idle target is chosen again once its request ends"
    );
}

#[tokio::test(start_paused = true)]
async fn latency_prefers_the_faster_target() {
    let cfg = config(
        r#"
[[models]]
name = "m"
strategy = "latency"
targets = [{ upstream = "a" }, { upstream = "b" }]
"#,
    );
    let rt = Runtime::new(&cfg, None);
    let m = cfg.models[0].clone();
    rt.success(&m, 0, Some(Duration::from_millis(400)));
    rt.success(&m, 1, Some(Duration::from_millis(40)));
    for _ in 0..50 {
        let mut sel = Selector::new(chain(&cfg, &["m"]));
        assert_eq!(upstream_of(&sel.next(&rt).unwrap()), "b");
    }
}

#[tokio::test(start_paused = true)]
async fn ejection_probe_and_doubling() {
    let cfg = config(
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a" }, { upstream = "b" }]
health = { eject_after = 2, eject_ms = 1000 }
"#,
    );
    let rt = Arc::new(Runtime::new(&cfg, None));
    let m = cfg.models[0].clone();
    assert!(!rt.failure(&m, 0, Duration::ZERO));
    assert!(
        rt.failure(&m, 0, Duration::ZERO),
        "the second failure in a row ejects"
    );
    let pick_first = |rt: &Runtime| {
        let mut sel = Selector::new(chain(&cfg, &["m"]));
        sel.next(rt).unwrap()
    };
    for _ in 0..50 {
        assert_eq!(upstream_of(&pick_first(&rt)), "b");
    }
    tokio::time::advance(Duration::from_millis(1001)).await;
    // Its time is up: one probe goes to it, and only one while it is out.
    let probe = pick_first(&rt);
    assert_eq!((upstream_of(&probe), probe.probe), ("a", true));
    let guard = rt.start(&m, 0, true);
    for _ in 0..50 {
        assert_eq!(upstream_of(&pick_first(&rt)), "b");
    }
    // The probe fails: ejected again at once, for twice as long.
    assert!(rt.failure(&m, 0, Duration::ZERO));
    drop(guard);
    tokio::time::advance(Duration::from_millis(1500)).await;
    assert_eq!(upstream_of(&pick_first(&rt)), "b");
    tokio::time::advance(Duration::from_millis(600)).await;
    let probe = pick_first(&rt);
    assert!(probe.probe);
    rt.success(&m, 0, Some(Duration::from_millis(5)));
    let mut seen_a = false;
    for _ in 0..200 {
        seen_a |= upstream_of(&pick_first(&rt)) == "a";
    }
    assert!(seen_a, "a healthy probe brings the target back");
}

#[tokio::test(start_paused = true)]
async fn every_target_ejected_tries_the_least_recently_ejected() {
    let cfg = config(
        r#"
[[models]]
name = "m"
targets = [{ upstream = "a" }, { upstream = "b" }]
health = { eject_after = 1, eject_ms = 60000 }
"#,
    );
    let rt = Runtime::new(&cfg, None);
    let m = cfg.models[0].clone();
    assert!(rt.failure(&m, 1, Duration::ZERO));
    tokio::time::advance(Duration::from_millis(10)).await;
    assert!(rt.failure(&m, 0, Duration::ZERO));
    let mut sel = Selector::new(chain(&cfg, &["m"]));
    let p = sel.next(&rt).unwrap();
    assert_eq!((upstream_of(&p), p.probe), ("b", false));
}

#[tokio::test(start_paused = true)]
async fn the_budget_allows_ten_retries_then_its_share() {
    let cfg = config(
        r#"
[[models]]
name = "m"
upstream = "a"
retry = { budget_percent = 50 }
"#,
    );
    let rt = Runtime::new(&cfg, None);
    let m = cfg.models[0].clone();
    let granted = (0..20).filter(|_| rt.take_retry(&m)).count();
    assert_eq!(granted, 10, "the floor, with no requests counted");
    for _ in 0..40 {
        rt.request_started(&m);
    }
    let granted = (0..20).filter(|_| rt.take_retry(&m)).count();
    assert_eq!(
        granted, 10,
        "50% of 40 requests is 20 retries, 10 already taken"
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    assert!(rt.take_retry(&m), "the window moved on");
}

#[tokio::test(start_paused = true)]
async fn pauses_grow_with_jitter_and_honour_retry_after() {
    let cfg = config(
        r#"
[[models]]
name = "m"
upstream = "a"
retry = { backoff_ms = 100, max_backoff_ms = 300, retry_after_max_ms = 5000 }
"#,
    );
    let rt = Runtime::new(&cfg, None);
    let policy = cfg.models[0].retry;
    let mut sel = Selector::new(chain(&cfg, &["m"]));
    let pick = sel.next(&rt).unwrap();
    let mut max_seen = [Duration::ZERO; 4];
    for _ in 0..500 {
        for (retry, seen) in (1..=4).zip(max_seen.iter_mut()) {
            let p = sel.pause(&pick, retry, &policy);
            *seen = (*seen).max(p);
        }
    }
    let ms: Vec<u128> = max_seen.iter().map(Duration::as_millis).collect();
    assert!(ms[0] <= 100 && ms[0] > 50, "{ms:?}");
    assert!(ms[1] <= 200 && ms[1] > 100, "{ms:?}");
    assert!(
        ms[2] <= 300 && ms[3] <= 300 && ms[3] > 200,
        "capped: {ms:?}"
    );
    sel.retry_after(&pick, Duration::from_secs(2), &policy);
    assert!(sel.pause(&pick, 1, &policy) >= Duration::from_millis(1999));
    // A retry-after past the maximum leaves the target for the rest of the request.
    sel.retry_after(&pick, Duration::from_secs(60), &policy);
    assert!(sel.next(&rt).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_state_of_targets_that_stay() {
    let models = r#"
[[models]]
name = "m"
targets = [{ upstream = "a" }, { upstream = "b" }]
health = { eject_after = 1, eject_ms = 60000 }
"#;
    let cfg = config(models);
    let rt = Runtime::new(&cfg, None);
    assert!(rt.failure(&cfg.models[0], 0, Duration::ZERO));
    // The same file again, and one where the model lost target "b": "a" stays ejected.
    for next in [
        models.to_owned(),
        models.replace(r#", { upstream = "b" }"#, ""),
    ] {
        let cfg2 = config(&next);
        let rt2 = Runtime::new(&cfg2, Some(&rt));
        let t = rt2.target(&cfg2.models[0], 0).unwrap();
        assert!(lock(&t.health).ejected_until.is_some(), "{next}");
    }
    // A renamed upstream model is another target: it starts healthy.
    let cfg3 = config(&models.replace(
        r#"{ upstream = "a" }"#,
        r#"{ upstream = "a", upstream_model = "x" }"#,
    ));
    let rt3 = Runtime::new(&cfg3, Some(&rt));
    let t = rt3.target(&cfg3.models[0], 0).unwrap();
    assert!(lock(&t.health).ejected_until.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_target_that_fails_fast_does_not_look_fast() {
    let cfg = config(
        r#"
[[models]]
name = "m"
strategy = "latency"
targets = [{ upstream = "a" }, { upstream = "b" }]
health = { eject_after = 0 }
"#,
    );
    let rt = Runtime::new(&cfg, None);
    let m = cfg.models[0].clone();
    rt.success(&m, 1, Some(Duration::from_millis(300)));
    // "a" refuses connections in a millisecond: never measured as a success, yet avoided.
    assert!(!rt.failure(&m, 0, Duration::from_millis(1)));
    for _ in 0..50 {
        let mut sel = Selector::new(chain(&cfg, &["m"]));
        assert_eq!(upstream_of(&sel.next(&rt).unwrap()), "b");
    }
}
