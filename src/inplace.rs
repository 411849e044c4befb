//! Futures boxed where they are built, for the large futures the request path boxes.
//!
//! `Box::pin(f)` builds `f` on the stack, then allocates, then copies it whole into the box:
//! for the request's future that was 4.8 KB copied per request (`memcpy` was the largest
//! missed-data-line cost in benches/footprint.sh). Allocating first lets the compiler build the
//! future straight into its box.

use std::future::Future;
use std::pin::Pin;

/// The future `make` returns, built in its own box.
#[inline(always)]
pub fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}
