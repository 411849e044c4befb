//! The store's arithmetic, and the shared scenario on the in-process store.
#![allow(clippy::unwrap_used, reason = "test code")]

use super::*;

#[test]
fn gcra_admits_a_burst_then_one_per_interval() {
    // rpm 600: T = 100 ms, burst 60.
    let mut tat = 0;
    for _ in 0..60 {
        tat = gcra(tat, 600, 1_000_000).unwrap();
    }
    assert_eq!(gcra(tat, 600, 1_000_000), Err(100));
    assert!(gcra(tat, 600, 1_000_100).is_ok());
    // rpm 5: a burst of one.
    let tat = gcra(0, 5, 1_000_000).unwrap();
    assert_eq!(gcra(tat, 5, 1_000_000), Err(12_000));
}

#[test]
fn windows_and_reset_texts() {
    assert_eq!(
        requests_window(1_000_500, 60, 1_000_000),
        Window {
            limit: 60,
            remaining: 59,
            reset_ms: 500
        }
    );
    assert_eq!(tokens_in_window(100, 1000, 15_000), 100 + 750);
    assert_eq!(reset_text(20), "20ms");
    assert_eq!(reset_text(1500), "1.5s");
    assert_eq!(reset_text(2000), "2s");
    assert_eq!(reset_text(360_000), "6m0s");
    assert_eq!(retry_after_secs(1), 1);
    assert_eq!(retry_after_secs(1001), 2);
    assert_eq!(until_midnight_ms(DAY_MS * 3 + 1000), DAY_MS - 1000);
}

#[tokio::test]
async fn the_local_store_keeps_the_contract() {
    let store = Store::Local(LocalStore::default());
    contract::run(&store, "t:").await.unwrap();
}
