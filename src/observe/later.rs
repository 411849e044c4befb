//! A reply's bookkeeping run right after its last byte is handed to the socket rather than before: each event loop queues it and a task of its own runs it next, in order.
//!
//! Reading a JSON reply's usage and counting the request in the metrics took 2–4 µs of the
//! 25–29 between the upstream's answer and the client's write when caches were cold (benchbed
//! rate); the client waits for neither. What a client could see early is a scrape of
//! `/metrics` made the moment its reply arrived; [`settled`] closes that gap, so a scrape counts
//! every reply whose last byte went out before it began. A reply whose key has token limits is
//! still charged before its last byte ([`super::Metered`] settles it in place): the next
//! request of that key must see the charge.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use super::{Finisher, Usage};

/// What a reply leaves for after its last byte, in the order it is left.
pub(super) enum Later {
    /// The usage read out of the reply (and published to its record).
    Settle(Usage),
    /// The record written to the metrics and the access log; `bool` is whether the body ended.
    Finish(Box<Finisher>, bool),
}

impl Later {
    fn run(self) {
        match self {
            Self::Settle(mut usage) => usage.settle(),
            Self::Finish(finisher, ended) => finisher.finish(ended),
        }
    }
}

/// How far one event loop has got: work queued, and work run.
#[derive(Debug, Default)]
struct Progress {
    queued: AtomicU64,
    done: AtomicU64,
}

/// An event loop's work not run yet, and its runner's wake-up.
struct Queue {
    items: Vec<Later>,
    /// The runner's buffer between runs, so neither side allocates once warm.
    spare: Vec<Later>,
    /// The runner, once it has found the queue empty: woken by the next work queued. A waker
    /// of this thread's own task rather than a `Notify`, whose waiter list takes a lock twice
    /// for every wake-up.
    runner: Option<Waker>,
    progress: Arc<Progress>,
}

thread_local! {
    /// This thread's queue, when it is an event loop that runs one ([`run_later`]).
    static QUEUE: RefCell<Option<Queue>> = const { RefCell::new(None) };
}

/// Every event loop's progress, for [`settled`].
static LOOPS: Mutex<Vec<Arc<Progress>>> = Mutex::new(Vec::new());

/// The longest a scrape waits for other loops' queued work: a loop's runner goes right after
/// the task that queued it, so only a thread the kernel has put aside takes longer than µs.
const SETTLE_WAIT: Duration = Duration::from_secs(1);

/// Queues `work` on this thread's loop; runs it at once where no loop runs a queue (the one
/// shared runtime, or a loop that is stopping).
pub(super) fn later(work: Later) {
    let work = QUEUE.with(|queue| {
        let Ok(mut queue) = queue.try_borrow_mut() else {
            return Some(work);
        };
        let Some(queue) = queue.as_mut() else {
            return Some(work);
        };
        // Counted before the reply's last byte can leave: a scrape that follows it waits.
        queue.progress.queued.fetch_add(1, Ordering::Release);
        if queue.items.is_empty() {
            // Scheduled only: the runner is polled once this task yields.
            if let Some(runner) = &queue.runner {
                runner.wake_by_ref();
            }
        }
        queue.items.push(work);
        None
    });
    if let Some(work) = work {
        work.run();
    }
}

/// Makes this thread queue what replies leave for later: an event loop runs the future this
/// returns as a task of its own, and calls [`stop`] when it ends.
pub fn run_later() -> impl std::future::Future<Output = ()> + Send + 'static {
    let installed = QUEUE.with(|queue| {
        let Ok(mut queue) = queue.try_borrow_mut() else {
            return false;
        };
        let progress = Arc::new(Progress::default());
        LOOPS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&progress));
        *queue = Some(Queue {
            items: Vec::new(),
            spare: Vec::new(),
            runner: None,
            progress,
        });
        true
    });
    std::future::poll_fn(move |cx| {
        if !installed {
            return Poll::Ready(());
        }
        // Work run here may queue more (a finish that ends a body): run until none is left.
        while run_queued() {}
        QUEUE.with(|queue| {
            if let Ok(mut queue) = queue.try_borrow_mut() {
                if let Some(queue) = queue.as_mut() {
                    if !queue
                        .runner
                        .as_ref()
                        .is_some_and(|w| w.will_wake(cx.waker()))
                    {
                        queue.runner = Some(cx.waker().clone());
                    }
                }
            }
        });
        Poll::Pending
    })
}

/// Runs what this thread's loop has queued, outside the queue's borrow; false when there was
/// nothing.
fn run_queued() -> bool {
    let taken = QUEUE.with(|queue| {
        let mut queue = queue.try_borrow_mut().ok()?;
        let queue = queue.as_mut()?;
        if queue.items.is_empty() {
            return None;
        }
        let spare = std::mem::take(&mut queue.spare);
        Some(std::mem::replace(&mut queue.items, spare))
    });
    let Some(mut items) = taken else {
        return false;
    };
    let n = items.len() as u64;
    for work in items.drain(..) {
        work.run();
    }
    QUEUE.with(|queue| {
        if let Ok(mut queue) = queue.try_borrow_mut() {
            if let Some(queue) = queue.as_mut() {
                queue.progress.done.fetch_add(n, Ordering::Release);
                queue.spare = items;
            }
        }
    });
    true
}

/// Runs what is left and stops queuing on this thread: an event loop that has ended. What its
/// runtime drops afterwards runs in place.
pub fn stop() {
    while run_queued() {}
    let rest = QUEUE.with(|queue| queue.try_borrow_mut().ok().and_then(|mut q| q.take()));
    if let Some(rest) = rest {
        let n = rest.items.len() as u64;
        for work in rest.items {
            work.run();
        }
        rest.progress.done.fetch_add(n, Ordering::Release);
        LOOPS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|p| !Arc::ptr_eq(p, &rest.progress));
    }
}

/// Waits until every loop has run the work it had queued when this was called (at most
/// [`SETTLE_WAIT`]): a scrape made after a reply's last byte counts that reply.
pub async fn settled() {
    let marks: Vec<(Arc<Progress>, u64)> = LOOPS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|p| (Arc::clone(p), p.queued.load(Ordering::Acquire)))
        .filter(|(p, queued)| p.done.load(Ordering::Acquire) < *queued)
        .collect();
    if marks.is_empty() {
        return;
    }
    let deadline = Instant::now() + SETTLE_WAIT;
    for (progress, queued) in marks {
        let mut turns = 0u32;
        while progress.done.load(Ordering::Acquire) < queued && Instant::now() < deadline {
            // A few turns of this loop first (its own runner may be what is waited for), then
            // a timer's tick, so a loop held off the CPU is not waited for by spinning.
            if turns < 16 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            turns += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::sync::mpsc;

    use bytes::Bytes;

    use super::*;
    use crate::config::Protocol;
    use crate::observe::{Fate, Tokens, UsageReader};

    /// A JSON reply's usage, read into `fate` when the returned work runs.
    fn usage_of_a_reply(fate: &Fate) -> Later {
        let mut reader = UsageReader::new(Protocol::Chat, false);
        reader.feed(&Bytes::from_static(
            br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
        ));
        Later::Settle(Usage::new(reader, fate.clone(), None))
    }

    const READ: Tokens = Tokens {
        input: 3,
        output: 4,
        cached: 0,
    };

    #[expect(
        clippy::disallowed_methods,
        reason = "the test loop's runner, as an event loop starts it; ends with the runtime"
    )]
    fn runner() {
        tokio::spawn(run_later());
    }

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn work_runs_at_once_where_no_loop_queues_it() {
        let fate = Fate::default();
        later(usage_of_a_reply(&fate));
        assert_eq!(fate.tokens(), READ);
    }

    #[test]
    fn work_runs_after_the_task_that_left_it_and_in_order() {
        let rt = current_thread();
        let (first, second) = (Fate::default(), Fate::default());
        rt.block_on(async {
            runner();
            later(usage_of_a_reply(&first));
            later(usage_of_a_reply(&second));
            // Still this task's turn: nothing has run.
            assert_eq!(first.tokens(), Tokens::default());
            tokio::task::yield_now().await;
            assert_eq!(first.tokens(), READ);
            assert_eq!(second.tokens(), READ);
            // A second batch wakes the runner again.
            let third = Fate::default();
            later(usage_of_a_reply(&third));
            tokio::task::yield_now().await;
            assert_eq!(third.tokens(), READ);
        });
        stop();
        // Stopped: work runs in place again.
        let after = Fate::default();
        later(usage_of_a_reply(&after));
        assert_eq!(after.tokens(), READ);
    }

    #[test]
    fn stopping_runs_what_was_left() {
        let rt = current_thread();
        let fate = Fate::default();
        rt.block_on(async {
            runner();
            later(usage_of_a_reply(&fate));
        });
        assert_eq!(fate.tokens(), Tokens::default());
        stop();
        assert_eq!(fate.tokens(), READ);
    }

    /// A scrape on another thread made while a loop holds queued work (its thread busy) waits
    /// for it: what the scrape reads afterwards includes it.
    #[test]
    fn a_scrape_waits_for_work_queued_before_it() {
        let fate = Fate::default();
        let (queued, on_queued) = mpsc::channel();
        let busy = {
            let fate = fate.clone();
            std::thread::spawn(move || {
                let rt = current_thread();
                rt.block_on(async {
                    runner();
                    later(usage_of_a_reply(&fate));
                    queued.send(()).unwrap();
                    // The loop's thread is held: its runner cannot run until this ends.
                    std::thread::sleep(Duration::from_millis(50));
                    tokio::task::yield_now().await;
                });
                stop();
            })
        };
        on_queued.recv().unwrap();
        assert_eq!(
            fate.tokens(),
            Tokens::default(),
            "ran before the loop was free"
        );
        current_thread().block_on(settled());
        assert_eq!(fate.tokens(), READ);
        busy.join().unwrap();
    }
}
