//! Where a request's time goes on its event loop, phase by phase: marks that compile to nothing
//! unless the `phase-times` feature is on (benches/phases.sh builds with it and reads them).
//!
//! A request's phases run on one thread (each event loop serves its connections and their
//! upstream connections), so with the feature the marks go to that thread's own record: no lock,
//! no atomics, nothing shared. Meant for HTTP/1.1 at the rates the benchbed uses, where one
//! request at a time is in flight per loop; two interleaved requests on one loop would mix
//! their marks, and the tool drops a request whose marks are out of order.

/// Declares [`Phase`], its variants in order with the name each prints as, once.
macro_rules! phases {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// The points a served request passes, in order; each phase is the time from the one
        /// before (from the read that brought the request, for the first).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Phase {
            $($(#[$doc])* $variant,)*
        }

        impl Phase {
            pub const ALL: &[Phase] = &[$(Phase::$variant,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $(Phase::$variant => $name,)*
                }
            }
        }
    };
}

phases! {
    /// hyper has parsed the head and called the service.
    Head = "head",
    /// The request's future is polled for the first time.
    Polled = "polled",
    /// The request id and the request's context are made.
    Context = "context",
    /// The key is checked.
    Authenticated = "auth",
    /// The body is read.
    Body = "body",
    /// The body is validated and the model resolved.
    Validated = "validated",
    /// The key's limits admitted the request.
    Admitted = "admitted",
    /// The plan is made (what the request asks, how it is answered).
    Planned = "planned",
    /// A target is picked and the request encoded for it.
    Picked = "picked",
    /// An upstream connection is taken from the pool (the forwarded headers chosen first).
    Connection = "connection",
    /// The request's bytes are ready to write.
    Encoded = "encoded",
    /// The request is written upstream (the write returns).
    Written = "written",
    /// The answer's head is read and parsed.
    Answered = "answered",
    /// The client's send returns the answer.
    Returned = "returned",
    /// The attempt's loop has the answer (checked, errors redacted).
    Checked = "checked",
    /// The answer's body is set up for the client's protocol.
    Responded = "responded",
    /// The response's headers and the access record are made.
    Recorded = "recorded",
    /// hyper has the body's first frame.
    Frame = "frame",
    /// The first write to the client begins.
    Write = "write",
}

/// Whether the marks are compiled in.
pub const ON: bool = cfg!(feature = "phase-times");

#[cfg(not(feature = "phase-times"))]
mod imp {
    #[inline(always)]
    pub fn begin(_fresh: bool) {}
    #[inline(always)]
    pub fn mark(_phase: super::Phase) {}
    #[inline(always)]
    pub fn end() {}
}

#[cfg(feature = "phase-times")]
mod imp {
    use std::cell::RefCell;
    use std::time::Instant;

    use super::Phase;

    const N: usize = Phase::ALL.len();
    /// Requests a thread records before it prints their medians.
    const REPORT_EVERY: usize = 100;

    #[derive(Default)]
    struct Record {
        start: Option<Instant>,
        fresh: bool,
        /// Nanoseconds from the start to each phase's end; 0 while not reached.
        at: [u64; N],
        done: Vec<(bool, [u64; N])>,
    }

    thread_local! {
        static RECORD: RefCell<Record> = RefCell::new(Record::default());
    }

    // Never inlined: a call adds no branch to its caller, so the caller's blocks still match
    // the PGO profile the release build is laid out by, and the phases measure that layout.

    /// A request's bytes were read; `fresh` when they are its connection's first.
    #[inline(never)]
    pub fn begin(fresh: bool) {
        RECORD.with(|r| {
            let mut r = r.borrow_mut();
            r.start = Some(Instant::now());
            r.fresh = fresh;
            r.at = [0; N];
        });
    }

    /// The request on this thread has reached the end of `phase` (the first time only).
    #[inline(never)]
    pub fn mark(phase: Phase) {
        RECORD.with(|r| {
            let mut r = r.borrow_mut();
            let Some(start) = r.start else { return };
            let i = phase as usize;
            if r.at[i] == 0 {
                r.at[i] = u64::try_from(start.elapsed().as_nanos())
                    .unwrap_or(u64::MAX)
                    .max(1);
            }
        });
    }

    /// The first write of the answer begins: the request's record is complete.
    #[inline(never)]
    pub fn end() {
        mark(Phase::Write);
        RECORD.with(|r| {
            let mut r = r.borrow_mut();
            if r.start.take().is_none() {
                return;
            }
            let record = (r.fresh, r.at);
            r.done.push(record);
            if r.done.len() >= REPORT_EVERY {
                report(&r.done);
                r.done.clear();
            }
        });
    }

    /// Prints, per kind of connection, the median of each phase in µs, over the requests that
    /// passed every phase in order.
    fn report(done: &[(bool, [u64; N])]) {
        for (fresh, kind) in [(true, "new"), (false, "reused")] {
            let complete: Vec<&[u64; N]> = done
                .iter()
                .filter(|(f, at)| *f == fresh && at.iter().all(|t| *t > 0) && at.is_sorted())
                .map(|(_, at)| at)
                .collect();
            if complete.is_empty() {
                continue;
            }
            let mut line = format!("phases {kind} n={}:", complete.len());
            let mut total = 0.0;
            for (i, phase) in Phase::ALL.iter().enumerate() {
                let mut took: Vec<u64> = complete
                    .iter()
                    .map(|at| at[i] - if i == 0 { 0 } else { at[i - 1] })
                    .collect();
                took.sort_unstable();
                let median = took[took.len() / 2] as f64 / 1000.0;
                total += median;
                line.push_str(&format!(" {} {median:.1}", phase.name()));
            }
            line.push_str(&format!(" | sum {total:.1}"));
            eprintln!("{line}");
        }
    }
}

pub use imp::{begin, end, mark};
