//! What every store must do, as one scenario run against the in-process store in unit tests and against a real Redis in integration tests.

use super::*;

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what.to_owned())
    }
}

/// Runs the scenario on `store` with keys under `prefix` (so runs sharing a Redis do not meet).
/// Times are explicit, from an arbitrary midday, so the scenario never waits.
pub async fn run(store: &Store, prefix: &str) -> Result<(), String> {
    let t0 = 20_000 * DAY_MS + DAY_MS / 2;
    let e = |e: StoreError| e.to_string();

    // rpm 60: one per second, a burst of 6.
    let key = format!("{prefix}rpm");
    let rpm = KeyLimits {
        rpm: Some(60),
        ..KeyLimits::default()
    };
    for i in 0..6 {
        let v = store.admit(&key, &rpm, "s", t0).await.map_err(e)?;
        check(v.refused.is_none(), &format!("burst request {i} admitted"))?;
    }
    let v = store.admit(&key, &rpm, "s", t0).await.map_err(e)?;
    check(
        v.refused == Some((Limit::Rpm, 1000)),
        &format!("the 7th is refused for 1 s: {v:?}"),
    )?;
    let w = v.requests.ok_or("requests window")?;
    check(
        w.limit == 60 && w.remaining == 54 && w.reset_ms == 6000,
        &format!("window after the burst: {w:?}"),
    )?;
    let v = store.admit(&key, &rpm, "s", t0 + 1000).await.map_err(e)?;
    check(v.refused.is_none(), "a second later one more passes")?;

    // tpm 1000: admitted while under; charges slide out over the next minute.
    let key = format!("{prefix}tpm");
    let tpm = KeyLimits {
        tpm: Some(1000),
        ..KeyLimits::default()
    };
    let minute = t0 - t0 % MINUTE_MS;
    check(
        store
            .admit(&key, &tpm, "s", minute)
            .await
            .map_err(e)?
            .refused
            .is_none(),
        "tpm: first admitted",
    )?;
    store.charge(&key, 1200, minute + 1000).await.map_err(e)?;
    let v = store
        .admit(&key, &tpm, "s", minute + 2000)
        .await
        .map_err(e)?;
    check(
        matches!(v.refused, Some((Limit::Tpm, _))),
        &format!("tpm: over the window is refused: {v:?}"),
    )?;
    check(
        v.tokens
            .is_some_and(|w| w.remaining == 0 && w.limit == 1000),
        &format!("tpm window: {v:?}"),
    )?;
    // Half way through the next minute, half of the 1200 still counts: 600 < 1000.
    let v = store
        .admit(&key, &tpm, "s", minute + MINUTE_MS + MINUTE_MS / 2)
        .await
        .map_err(e)?;
    check(v.refused.is_none(), &format!("tpm: slid under: {v:?}"))?;
    check(
        v.tokens.is_some_and(|w| w.remaining == 400),
        &format!("tpm: 600 of 1000 used: {v:?}"),
    )?;

    // daily_tokens 500: spent, refused until midnight.
    let key = format!("{prefix}day");
    let daily = KeyLimits {
        daily_tokens: Some(500),
        ..KeyLimits::default()
    };
    store.charge(&key, 499, t0).await.map_err(e)?;
    check(
        store
            .admit(&key, &daily, "s", t0)
            .await
            .map_err(e)?
            .refused
            .is_none(),
        "daily: 499 of 500 still admits",
    )?;
    store.charge(&key, 1, t0).await.map_err(e)?;
    let v = store.admit(&key, &daily, "s", t0 + 1).await.map_err(e)?;
    check(
        v.refused == Some((Limit::DailyTokens, DAY_MS / 2 - 1)),
        &format!("daily: spent until midnight: {v:?}"),
    )?;
    let next_day = t0 + DAY_MS / 2;
    check(
        store
            .admit(&key, &daily, "s", next_day)
            .await
            .map_err(e)?
            .refused
            .is_none(),
        "daily: a new UTC day",
    )?;

    // max_concurrent 2: slots held until released.
    let key = format!("{prefix}conc");
    let conc = KeyLimits {
        max_concurrent: Some(2),
        ..KeyLimits::default()
    };
    for slot in ["a", "b"] {
        check(
            store
                .admit(&key, &conc, slot, t0)
                .await
                .map_err(e)?
                .refused
                .is_none(),
            "a slot is free",
        )?;
    }
    let v = store.admit(&key, &conc, "c", t0).await.map_err(e)?;
    check(
        matches!(v.refused, Some((Limit::MaxConcurrent, _))),
        &format!("both slots held: {v:?}"),
    )?;
    store.release(&key, "a").await.map_err(e)?;
    check(
        store
            .admit(&key, &conc, "c", t0)
            .await
            .map_err(e)?
            .refused
            .is_none(),
        "a released slot is free again",
    )?;

    // A refusal counts nothing: with rpm 60 and max_concurrent 1, a request refused for
    // concurrency leaves the GCRA where it was.
    let key = format!("{prefix}both");
    let both = KeyLimits {
        rpm: Some(60),
        max_concurrent: Some(1),
        ..KeyLimits::default()
    };
    store.admit(&key, &both, "x", t0).await.map_err(e)?;
    let v = store.admit(&key, &both, "y", t0).await.map_err(e)?;
    check(
        matches!(v.refused, Some((Limit::MaxConcurrent, _))),
        "second refused for concurrency",
    )?;
    check(
        v.requests.is_some_and(|w| w.remaining == 59),
        &format!("the refused request was not counted: {v:?}"),
    )?;
    Ok(())
}
