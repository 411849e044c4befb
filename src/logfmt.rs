//! The text log line written when stderr is not a terminal: tracing's own layout (time, level, target, message, `key=value` fields) at a fraction of its cost per line.
//!
//! Every request writes an access line, so its formatting is on the hot path: tracing's default
//! formatter spent about 20 k instructions per line (ANSI styling even when off, an escaping
//! pass over every string, `core::fmt` for every number). This one writes numbers with `itoa`,
//! strings as they are when they need no escaping, and the timestamp from one civil-date
//! computation. Strings that do need escaping (a quote, a backslash, a control character) go
//! through `Debug`, so a client-chosen model name cannot forge a log line.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The longest line buffer a thread keeps between lines.
const MAX_KEPT_LINE: usize = 16 * 1024;

/// The plain-text formatter for `serve` without a terminal.
#[derive(Debug, Default, Clone, Copy)]
pub struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // The line is built in a plain `String` and handed over in one write: every piece
        // written through `Writer` is a dynamic call.
        with_line_buffer(|line| match line {
            Some(line) => {
                format_line(line, event)?;
                writer.write_str(line)
            }
            // A field's `Debug` that logs: this line gets a buffer of its own.
            None => {
                let mut line = String::new();
                format_line(&mut line, event)?;
                writer.write_str(&line)
            }
        })
    }
}

fn format_line(line: &mut String, event: &Event<'_>) -> fmt::Result {
    write_time(line, SystemTime::now());
    let meta = event.metadata();
    line.push_str(match *meta.level() {
        tracing::Level::ERROR => " ERROR ",
        tracing::Level::WARN => "  WARN ",
        tracing::Level::INFO => "  INFO ",
        tracing::Level::DEBUG => " DEBUG ",
        tracing::Level::TRACE => " TRACE ",
    });
    line.push_str(meta.target());
    line.push(':');
    let mut fields = Fields {
        out: line,
        result: Ok(()),
    };
    event.record(&mut fields);
    fields.result?;
    line.push('\n');
    Ok(())
}

/// Writes each field as ` name=value`, the message bare.
struct Fields<'w> {
    out: &'w mut String,
    result: fmt::Result,
}

/// True when `s` can be written between quotes as it is.
fn plain(s: &str) -> bool {
    // Eight bytes at a time and no early exit: the values are short (an id, a path, a model
    // name) and almost always plain, and a byte-wise loop over them was left scalar by the
    // compiler, at a thousand instructions a line.
    let mut words = s.as_bytes().chunks_exact(8);
    let mut flagged = 0;
    for word in words.by_ref() {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            return false; // not reached: the chunks are exact; false only means escaping
        };
        flagged |= escaped_bytes(u64::from_le_bytes(word));
    }
    flagged == 0 && words.remainder().iter().all(|&b| !escaped(b))
}

/// True for a byte [`plain`] refuses: a control character, a quote or a backslash.
fn escaped(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f
}

/// Nonzero when one of the eight bytes of `x` is [`escaped`] (which byte is not told: a borrow
/// may also flag the bytes above a flagged one). Bytes of 0x80 and up, UTF-8's, are never
/// flagged: their high bit is set, and each test keeps only bytes whose high bit was clear.
fn escaped_bytes(x: u64) -> u64 {
    use crate::json::scan::{special_bytes, zeros, ONES};
    // JSON's special bytes, and DEL, which a log line escapes too.
    special_bytes(x) | zeros(x ^ (ONES * 0x7f))
}

/// ` name="value"`, through `Debug` when the value needs escaping.
fn push_str(out: &mut String, name: &str, value: &str) -> fmt::Result {
    push_name(out, name);
    if plain(value) {
        out.push('"');
        out.push_str(value);
        out.push('"');
        Ok(())
    } else {
        write!(out, "{value:?}")
    }
}

fn push_name(out: &mut String, name: &str) {
    out.push(' ');
    out.push_str(name);
    out.push('=');
}

fn push_u64(out: &mut String, name: &str, value: u64) {
    push_name(out, name);
    out.push_str(itoa::Buffer::new().format(value));
}

/// Milliseconds to the microsecond: what a latency field needs, far cheaper than the shortest
/// round-trip form.
fn push_ms(out: &mut String, name: &str, value: f64) -> fmt::Result {
    push_name(out, name);
    if value.is_finite() && value.abs() < 1e15 {
        let micros = (value * 1000.0).round() as i64;
        let (sign, micros) = if micros < 0 {
            ("-", -micros)
        } else {
            ("", micros)
        };
        let mut int = itoa::Buffer::new();
        let mut frac = itoa::Buffer::new();
        let f = frac.format(micros % 1000);
        out.push_str(sign);
        out.push_str(int.format(micros / 1000));
        out.push('.');
        out.push_str(&"000"[f.len()..]);
        out.push_str(f);
        Ok(())
    } else {
        write!(out, "{value}")
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let written = if field.name() == "message" {
            self.out.push(' ');
            if plain(value) {
                self.out.push_str(value);
                Ok(())
            } else {
                write!(self.out, "{value:?}")
            }
        } else {
            push_str(self.out, field.name(), value)
        };
        self.result = self.result.and(written);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        push_u64(self.out, field.name(), value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        push_name(self.out, field.name());
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        push_name(self.out, field.name());
        self.out.push_str(if value { "true" } else { "false" });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        let written = push_ms(self.out, field.name(), value);
        self.result = self.result.and(written);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.out.push(' '),
            name => push_name(self.out, name),
        }
        if self.result.is_ok() {
            self.result = write!(self.out, "{value:?}");
        }
    }
}

/// Access lines written straight to stderr, in [`Plain`]'s layout, without tracing's dispatch
/// (`serve` turns it on when it installs [`Plain`] on stderr).
static DIRECT: AtomicBool = AtomicBool::new(false);

/// Called by `serve` once its subscriber writes [`Plain`] lines to stderr.
pub fn write_access_lines_directly() {
    DIRECT.store(true, Ordering::Relaxed);
}

/// True when access lines skip tracing's dispatch (see [`access_line`]).
pub fn access_lines_direct() -> bool {
    DIRECT.load(Ordering::Relaxed)
}

/// The fields of a line [`access_line`] writes, in order.
pub struct Line<'a>(&'a mut String);

impl Line<'_> {
    /// ` name="value"`, escaped when it needs to be.
    pub fn str(&mut self, name: &str, value: &str) {
        let _ = push_str(self.0, name, value);
    }

    /// Nothing when `None`, as tracing skips an absent optional field.
    pub fn opt_str(&mut self, name: &str, value: Option<&str>) {
        if let Some(v) = value {
            self.str(name, v);
        }
    }

    /// ` name=value` for a value that never needs quotes (a method, a path hyper parsed).
    pub fn bare(&mut self, name: &str, value: &str) {
        if plain(value) && !value.contains(' ') {
            push_name(self.0, name);
            self.0.push_str(value);
        } else {
            self.str(name, value);
        }
    }

    pub fn u64(&mut self, name: &str, value: u64) {
        push_u64(self.0, name, value);
    }

    pub fn ms(&mut self, name: &str, value: f64) {
        let _ = push_ms(self.0, name, value);
    }
}

/// Writes one INFO line of `target` with `message` and the fields `fill` adds, to stderr in
/// one write, as [`Plain`] would have: [`access_line_later`] on a thread that does not hold its
/// lines.
fn access_line(target: &str, message: &str, fill: impl FnOnce(&mut Line<'_>)) {
    with_line_buffer(|line| match line {
        Some(line) => {
            build_line(line, SystemTime::now(), target, message, fill);
            write_stderr(line);
        }
        None => {
            let mut line = String::new();
            build_line(&mut line, SystemTime::now(), target, message, fill);
            write_stderr(&line);
        }
    });
}

/// What an access line says, kept until the line is written.
pub trait Deferred {
    fn fill(&self, line: &mut Line<'_>);
}

/// Writes one INFO access line, as [`Plain`] would have; the caller has checked
/// [`access_lines_direct`] and that the filter lets the line through. An event loop holds it
/// for up to [`HOLD_FOR`] and writes it with the others it holds, putting it together then
/// (its time is still now), so neither formatting it, writing it nor dropping what it says
/// delays the response it describes. Elsewhere it is written at once.
pub fn access_line_later(target: &'static str, message: &'static str, what: Box<dyn Deferred>) {
    let mut what = Some(what);
    HELD.with(|held| {
        let Ok(mut held) = held.try_borrow_mut() else {
            return;
        };
        let Some(held) = held.as_mut() else {
            return;
        };
        if let Some(what) = what.take() {
            held.lines.push(Pending {
                time: SystemTime::now(),
                target,
                message,
                what,
            });
        }
        match held.lines.len() {
            // The first line starts the writer's wait; a full batch cuts it short. Either way
            // the writer runs after this task, so the response this line describes goes first.
            1 | HOLD_LINES => held.wake.notify_one(),
            // Only when no writer runs on this thread (it was never started, or its loop is
            // shutting down): held lines stay bounded.
            n if n >= MAX_HELD_LINES => held.write(),
            _ => {}
        }
    });
    if let Some(what) = what {
        access_line(target, message, |l| what.fill(l));
    }
}

/// As tracing's stderr writer: a failed log write is not the request's failure.
fn write_stderr(text: &str) {
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// How long an event loop holds an access line at most. Each write to a log file costs the
/// kernel more than the gateway spends on a request's line (about 15 µs against 1 µs at 20
/// requests a second): held for a second, the lines of every request in it leave in one
/// write, as Envoy flushes its access log files once a second.
pub const HOLD_FOR: Duration = Duration::from_secs(1);

/// Held lines this many are written without waiting out [`HOLD_FOR`] (about 24 KB of text).
const HOLD_LINES: usize = 64;

/// Held lines past this many are written at once, in the request's own turn.
const MAX_HELD_LINES: usize = 4 * HOLD_LINES;

/// A line held by an event loop.
struct Pending {
    time: SystemTime,
    target: &'static str,
    message: &'static str,
    what: Box<dyn Deferred>,
}

/// An event loop's access lines not written yet, the buffer they are written through, and the
/// loop's writer's wake-up.
#[derive(Default)]
struct Held {
    lines: Vec<Pending>,
    text: String,
    wake: Arc<Notify>,
}

impl Held {
    /// Puts every held line together and writes them in one write.
    fn write(&mut self) {
        if self.lines.is_empty() {
            return;
        }
        for p in self.lines.drain(..) {
            build_line(&mut self.text, p.time, p.target, p.message, |l| {
                p.what.fill(l)
            });
        }
        write_stderr(&self.text);
        self.text.clear();
        if self.text.capacity() > MAX_KEPT_TEXT {
            self.text = String::new();
        }
    }
}

/// A held-lines buffer grown past this by a burst is not kept.
const MAX_KEPT_TEXT: usize = 64 * 1024;

thread_local! {
    /// An event loop's access lines not written yet: they leave together when its writer
    /// ([`write_held_lines`]) runs, after the responses they describe rather than before them,
    /// and in one write however many requests ended.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Makes this thread hold its access lines, for an event loop: the loop runs the writer this
/// returns ([`write_held_lines`]) as a task of its own, and calls [`flush_access_lines`] when
/// it stops.
pub fn hold_access_lines() -> impl std::future::Future<Output = ()> + Send + 'static {
    let wake = HELD.with(|held| match held.try_borrow_mut() {
        Ok(mut held) => held.get_or_insert_with(Held::default).wake.clone(),
        Err(_) => Arc::default(),
    });
    write_held_lines(wake)
}

/// The writer of an event loop's held lines: woken by the first line held, it waits
/// [`HOLD_FOR`] (or until a batch is full) and writes what the loop holds then.
async fn write_held_lines(wake: Arc<Notify>) {
    loop {
        wake.notified().await;
        let _ = tokio::time::timeout(HOLD_FOR, wake.notified()).await;
        flush_access_lines();
    }
}

/// Writes the access lines this thread holds, in one write.
pub fn flush_access_lines() {
    HELD.with(|held| {
        if let Ok(mut held) = held.try_borrow_mut() {
            if let Some(held) = held.as_mut() {
                held.write();
            }
        }
    });
}

fn build_line(
    line: &mut String,
    time: SystemTime,
    target: &str,
    message: &str,
    fill: impl FnOnce(&mut Line<'_>),
) {
    write_time(line, time);
    line.push_str("  INFO ");
    line.push_str(target);
    line.push_str(": ");
    line.push_str(message);
    fill(&mut Line(line));
    line.push('\n');
}

/// Runs `f` with this thread's line buffer, cleared (`None` while it is in use further up the
/// stack); a buffer grown past [`MAX_KEPT_LINE`] is not kept.
fn with_line_buffer<R>(f: impl FnOnce(Option<&mut String>) -> R) -> R {
    thread_local! {
        static LINE: RefCell<String> = const { RefCell::new(String::new()) };
    }
    LINE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut line) => {
            line.clear();
            let r = f(Some(&mut line));
            if line.capacity() > MAX_KEPT_LINE {
                *line = String::new();
            }
            r
        }
        Err(_) => f(None),
    })
}

/// `2026-11-23T15:48:26.123456Z`, as tracing's default writes it.
fn write_time(out: &mut String, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(0));
    let rem = secs % 86_400;
    let mut buf = [0u8; 27];
    let mut put = |at: usize, v: u64, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            buf[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, u64::try_from(y).unwrap_or(0), 4);
    put(5, m, 2);
    put(8, d, 2);
    put(11, rem / 3600, 2);
    put(14, rem % 3600 / 60, 2);
    put(17, rem % 60, 2);
    put(20, u64::from(since.subsec_micros()), 6);
    for (at, c) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
    ] {
        buf[at] = c;
    }
    buf[26] = b'Z';
    // Only ASCII digits and separators were written.
    out.push_str(std::str::from_utf8(&buf).unwrap_or("0000-00-00T00:00:00.000000Z"));
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (y, m as u64, d as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_are_right_across_leap_years_and_eras() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_415), (2025, 11, 23));
        assert_eq!(civil_from_days(20_780), (2026, 11, 23));
    }

    #[test]
    fn only_strings_that_need_no_escaping_are_written_bare() {
        assert!(plain("gpt-4o mini/2024"));
        assert!(!plain("a\"b"));
        assert!(!plain("line\nbreak"));
        assert!(!plain("esc\u{1b}[31m"));
        assert!(!plain("back\\slash"));
    }

    #[test]
    fn plain_agrees_with_the_byte_rule_at_every_position() {
        // Every byte value at every position of strings long enough to fill whole words and a
        // remainder, among plain ASCII and among UTF-8's high bytes (which must never flag).
        for fill in ["a", "\u{e9}"] {
            for len in 1..=17 {
                for at in 0..len {
                    for b in 0..=0x7fu8 {
                        let mut chars: Vec<char> = fill.repeat(len).chars().collect();
                        chars[at] = char::from(b);
                        let s: String = chars.into_iter().collect();
                        let want = !s.bytes().any(escaped);
                        assert_eq!(plain(&s), want, "{s:?}");
                    }
                }
            }
        }
    }

    /// What [`Plain`] writes for the events `log` makes.
    fn traced(log: impl FnOnce()) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .map_err(|_| std::io::Error::other("poisoned"))?
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let out = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(Plain)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        String::from_utf8(sink.0.lock().map(|v| v.clone()).unwrap_or_default()).unwrap_or_default()
    }

    #[test]
    fn a_line_reads_as_tracing_writes_it() {
        let text = traced(|| {
            tracing::info!(
                target: "modelgate::access",
                model = "m\"x\n",
                status = 200u16,
                duration_ms = 1.5f64,
                ttfb_ms = 0.0004f64,
                ok = true,
                key = Some("team"),
                "request"
            );
        });
        let (time, rest) = text.split_at(27);
        assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{text}");
        assert_eq!(
            rest,
            "  INFO modelgate::access: request model=\"m\\\"x\\n\" status=200 duration_ms=1.500 ttfb_ms=0.000 ok=true key=\"team\"\n"
        );
    }

    struct Counted(std::rc::Rc<std::cell::Cell<u32>>);
    impl Deferred for Counted {
        fn fill(&self, line: &mut Line<'_>) {
            self.0.set(self.0.get() + 1);
            line.str("test", "held");
        }
    }

    /// On a loop that holds its lines, a line is put together only when its writer runs:
    /// `HOLD_FOR` after the first line held, or as soon as a batch is full, after the task
    /// that held it; and then exactly once. Paused time: the runtime's clock moves only when
    /// everything waits.
    #[test]
    fn a_held_line_is_put_together_when_the_loop_writes_it() {
        use std::cell::Cell;
        use std::rc::Rc;
        let filled = Rc::new(Cell::new(0));
        // A thread of its own, so the held lines of other tests are not in the way.
        let seen = std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                #[expect(
                    clippy::disallowed_methods,
                    reason = "the test loop's writer, dropped with its runtime"
                )]
                tokio::spawn(hold_access_lines());
                let filled = Rc::new(Cell::new(0));
                let mut seen = Vec::new();
                let later = |n: u32| {
                    for _ in 0..n {
                        access_line_later("t", "m", Box::new(Counted(filled.clone())));
                    }
                };
                later(2);
                tokio::task::yield_now().await;
                seen.push(filled.get());
                tokio::time::sleep(HOLD_FOR - Duration::from_millis(10)).await;
                later(1);
                seen.push(filled.get());
                tokio::time::sleep(Duration::from_millis(20)).await;
                seen.push(filled.get());
                // Written, so the wait starts again with the next line.
                tokio::time::sleep(HOLD_FOR * 3).await;
                seen.push(filled.get());
                later(1);
                tokio::time::sleep(HOLD_FOR / 2).await;
                seen.push(filled.get());
                // A full batch is written without waiting, once the task that filled it yields.
                later(HOLD_LINES as u32 - 1);
                seen.push(filled.get());
                tokio::task::yield_now().await;
                seen.push(filled.get());
                // Shutting down writes what is left.
                later(1);
                flush_access_lines();
                seen.push(filled.get());
                flush_access_lines();
                seen.push(filled.get());
                seen
            })
        })
        .join()
        .unwrap();
        let batch = HOLD_LINES as u32;
        assert_eq!(seen, [0, 0, 3, 3, 3, 3, 3 + batch, 4 + batch, 4 + batch]);
        // A thread that does not hold its lines writes each at once.
        access_line_later("t", "m", Box::new(Counted(filled.clone())));
        assert_eq!(filled.get(), 1);
    }

    /// Without a writer running, held lines stay bounded: past `MAX_HELD_LINES` they are
    /// written in the turn of the request that ended last.
    #[test]
    fn held_lines_without_a_writer_stay_bounded() {
        use std::cell::Cell;
        use std::rc::Rc;
        let counts = std::thread::spawn(|| {
            let filled = Rc::new(Cell::new(0));
            drop(hold_access_lines());
            let mut counts = Vec::new();
            for _ in 0..MAX_HELD_LINES - 1 {
                access_line_later("t", "m", Box::new(Counted(filled.clone())));
            }
            counts.push(filled.get());
            access_line_later("t", "m", Box::new(Counted(filled.clone())));
            counts.push(filled.get());
            counts
        })
        .join()
        .unwrap();
        assert_eq!(counts, [0, MAX_HELD_LINES as u32]);
    }

    #[test]
    fn a_direct_access_line_reads_as_the_traced_one() {
        let method = http::Method::POST;
        let (model, none): (Option<&str>, Option<&str>) = (Some("m\"x\u{1b}"), None);
        let traced = traced(|| {
            tracing::info!(
                target: "modelgate::access",
                request_id = "r-1",
                method = %method,
                path = %"/v1/chat/completions",
                key = none,
                model,
                attempts = 2u32,
                status = 200u16,
                ttfb_ms = Some(12.25f64),
                duration_ms = 1500.0004f64,
                "request"
            );
        });
        let mut direct = String::new();
        build_line(
            &mut direct,
            SystemTime::now(),
            "modelgate::access",
            "request",
            |l| {
                l.str("request_id", "r-1");
                l.bare("method", method.as_str());
                l.bare("path", "/v1/chat/completions");
                l.opt_str("key", none);
                l.opt_str("model", model);
                l.u64("attempts", 2);
                l.u64("status", 200);
                l.ms("ttfb_ms", 12.25);
                l.ms("duration_ms", 1500.0004);
            },
        );
        // The timestamps differ; everything after them is the same.
        assert_eq!(direct[27..], traced[27..], "{traced}");
        assert!(direct.contains("model=\"m\\\"x\\u{1b}\""), "{direct}");
    }
}
