//! `--html`: one self-contained page (inline CSS and SVG, no script, nothing fetched) with the summary table, latency CDFs and TTFT/ITL histograms of each endpoint side by side on shared axes.

use std::fmt::Write as _;

use super::report::Report;
use super::stats::{EndpointStats, Summary};

const W: f64 = 560.0;
const H: f64 = 300.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 44.0;
/// Colours of the CDF lines (TTFT, ITL, E2E), readable for the common colour blindnesses.
const COLOURS: [&str; 3] = ["#0072b2", "#e69f00", "#009e73"];
const BINS: usize = 30;

pub fn render(r: &Report) -> String {
    let mut s = String::with_capacity(64 * 1024);
    s.push_str(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>modelgate bench</title>\n<style>\n\
         body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}\n\
         h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}\n\
         table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #ddd}\n\
         th:first-child,td:first-child{text-align:left}.grid{display:grid;gap:16px}\n\
         .col h3{font-size:14px;margin:0 0 4px;word-break:break-all}svg{background:#fafafa;border:1px solid #e4e4e4}\n\
         .muted{color:#666}\n</style></head><body>\n",
    );
    let _ = writeln!(
        s,
        "<h1>modelgate bench</h1>\n<p class=\"muted\">{}</p>",
        esc(&r.describe)
    );
    if r.interrupted {
        s.push_str("<p><b>Interrupted:</b> partial results.</p>\n");
    }
    summary_table(&mut s, r);

    let n = r.endpoints.len().max(1);
    let _ = writeln!(
        s,
        "<h2>Latency CDFs and histograms</h2>\n<p class=\"muted\">Each column is one endpoint; axes are shared across columns. \
         CDF: the share of requests (TTFT, end to end) or of token gaps (ITL) at or below a latency, log scale. \
         Histograms: share of samples per bin; the last bin holds everything above the largest p99.</p>\n\
         <div class=\"grid\" style=\"grid-template-columns:repeat({n},{W}px)\">"
    );
    let all: Vec<&EndpointStats> = r.endpoints.iter().collect();
    let (lo, hi) = log_range(all.iter().flat_map(|e| {
        e.raw
            .ttft
            .iter()
            .chain(&e.raw.itl)
            .chain(&e.raw.e2e)
            .copied()
    }));
    let ttft_bins = Bins::new(&all, |e| &e.raw.ttft, |e| e.ttft_ms.as_ref());
    let itl_bins = Bins::new(&all, |e| &e.raw.itl, |e| e.itl_ms.as_ref());
    for (i, e) in r.endpoints.iter().enumerate() {
        let _ = writeln!(s, "<div class=\"col\"><h3>[{i}] {}</h3>", esc(&e.url));
        cdf_chart(&mut s, e, lo, hi);
        histogram_chart(
            &mut s,
            "TTFT histogram",
            &e.raw.ttft,
            &ttft_bins,
            COLOURS[0],
        );
        histogram_chart(&mut s, "ITL histogram", &e.raw.itl, &itl_bins, COLOURS[1]);
        s.push_str("</div>\n");
    }
    s.push_str("</div>\n</body></html>\n");
    s
}

fn summary_table(s: &mut String, r: &Report) {
    s.push_str("<h2>Summary (ms)</h2>\n<table><tr><th>endpoint</th><th>requests</th><th>ok</th><th>errors</th><th>req/s</th><th>tokens/s</th>");
    for m in ["ttft", "itl", "tpot", "e2e"] {
        let _ = write!(s, "<th>{m} p50</th><th>{m} p99</th>");
    }
    s.push_str("<th>lag p99</th></tr>\n");
    for (i, e) in r.endpoints.iter().enumerate() {
        let errors = e
            .errors
            .iter()
            .map(|(k, n)| format!("{k}&nbsp;{n}"))
            .collect::<Vec<_>>()
            .join(" ");
        let _ =
            write!(
            s,
            "<tr><td>[{i}] {}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.1}</td>",
            esc(&e.url),
            e.requests,
            e.ok,
            if errors.is_empty() { "-".into() } else { errors },
            e.requests_per_s,
            e.output_tokens_per_s
        );
        for v in [&e.ttft_ms, &e.itl_ms, &e.tpot_ms, &e.e2e_ms] {
            p50_p99(s, v.as_ref(), false);
        }
        let lag = e.schedule_lag_ms.as_ref().map(|l| l.p99);
        let _ = writeln!(s, "<td>{}</td></tr>", num(lag, false));
    }
    if let Some(d) = &r.diff {
        let _ = write!(
            s,
            "<tr><td><b>[1] − [0]</b></td><td></td><td></td><td></td><td>{:+.2}</td><td>{:+.1}</td>",
            d.requests_per_s, d.output_tokens_per_s
        );
        for v in [&d.ttft_ms, &d.itl_ms, &d.tpot_ms, &d.e2e_ms] {
            p50_p99(s, v.as_ref(), true);
        }
        let lag = d.schedule_lag_ms.as_ref().map(|l| l.p99);
        let _ = writeln!(s, "<td>{}</td></tr>", num(lag, true));
    }
    s.push_str("</table>\n");
}

fn p50_p99(s: &mut String, v: Option<&Summary>, signed: bool) {
    let _ = write!(
        s,
        "<td>{}</td><td>{}</td>",
        num(v.map(|v| v.p50), signed),
        num(v.map(|v| v.p99), signed)
    );
}

fn num(v: Option<f64>, signed: bool) -> String {
    match v {
        Some(v) if signed => format!("{v:+.2}"),
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    }
}

fn esc(v: &str) -> String {
    v.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Powers of ten around all positive values (a gap of 0 — two deltas in one read — sits at the
/// left edge).
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.1, 1000.0);
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    (lo, hi)
}

fn fmt_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{} s", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v}")
    } else {
        format!("{v:.2}")
    }
}

fn svg_open(s: &mut String, title: &str) {
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"system-ui,sans-serif\" font-size=\"11\">\n\
         <text x=\"{LEFT}\" y=\"17\" font-size=\"13\" font-weight=\"600\">{}</text>",
        esc(title)
    );
}

fn plot_w() -> f64 {
    W - LEFT - RIGHT
}

fn plot_h() -> f64 {
    H - TOP - BOTTOM
}

fn cdf_chart(s: &mut String, e: &EndpointStats, lo: f64, hi: f64) {
    svg_open(s, "Latency CDF");
    let (llo, lhi) = (lo.log10(), hi.log10());
    let x = |v: f64| LEFT + (v.max(lo).log10() - llo) / (lhi - llo) * plot_w();
    let y = |q: f64| TOP + (1.0 - q) * plot_h();
    // Grid: decades and 2/5 within them on x, quarters on y.
    let mut d = lo;
    while d <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let v = d * m;
            if v > hi * 1.0001 {
                break;
            }
            let xv = x(v);
            let _ = writeln!(
                s,
                "<line x1=\"{xv:.1}\" y1=\"{TOP}\" x2=\"{xv:.1}\" y2=\"{:.1}\" stroke=\"#e0e0e0\"/>\
                 <text x=\"{xv:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + plot_h(),
                TOP + plot_h() + 14.0,
                fmt_ms(v)
            );
        }
        d *= 10.0;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let yv = y(q);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yv:.1}\" x2=\"{:.1}\" y2=\"{yv:.1}\" stroke=\"#e0e0e0\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{q}</text>",
            W - RIGHT,
            LEFT - 4.0,
            yv + 4.0
        );
    }
    axis_labels(s, "latency (ms, log scale)", "share ≤ x");
    let series = [
        ("TTFT", &e.raw.ttft),
        ("ITL", &e.raw.itl),
        ("E2E", &e.raw.e2e),
    ];
    for (k, (name, values)) in series.iter().enumerate() {
        let colour = COLOURS[k];
        let lx = W - RIGHT - 170.0 + k as f64 * 56.0;
        let _ = writeln!(
            s,
            "<rect x=\"{lx:.1}\" y=\"8\" width=\"10\" height=\"10\" fill=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"17\">{name}</text>",
            lx + 13.0
        );
        if values.is_empty() {
            continue;
        }
        let n = values.len();
        let step = (n / 400).max(1);
        let mut pts = String::new();
        let mut prev_y = y(0.0);
        let mut i = 0;
        loop {
            let idx = i.min(n - 1);
            let xv = x(values[idx]);
            let q = (idx + 1) as f64 / n as f64;
            // A step plot: across at the previous share, then up.
            let _ = write!(pts, "{xv:.1},{prev_y:.1} {xv:.1},{:.1} ", y(q));
            prev_y = y(q);
            if idx == n - 1 {
                break;
            }
            i += step;
        }
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.8\" points=\"{pts}\"/>"
        );
    }
    frame(s);
    s.push_str("</svg>\n");
}

fn axis_labels(s: &mut String, xlabel: &str, ylabel: &str) {
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{xlabel}</text>\
         <text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#555\">{ylabel}</text>",
        LEFT + plot_w() / 2.0,
        H - 6.0,
        TOP + plot_h() / 2.0
    );
}

fn frame(s: &mut String) {
    let _ = writeln!(
        s,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#999\"/>",
        plot_w(),
        plot_h()
    );
}

/// Bins shared by all endpoints of one measure, so their histograms line up.
struct Bins {
    lo: f64,
    hi: f64,
    /// Largest share in any bin of any endpoint: the common y scale.
    ymax: f64,
}

impl Bins {
    fn new(
        all: &[&EndpointStats],
        raw: impl Fn(&EndpointStats) -> &Vec<f64>,
        summary: impl Fn(&EndpointStats) -> Option<&Summary>,
    ) -> Self {
        let lo = all
            .iter()
            .filter_map(|e| raw(e).first().copied())
            .fold(f64::INFINITY, f64::min);
        // Up to the largest p99: one slow outlier should not squeeze every other bar into one.
        let hi = all
            .iter()
            .filter_map(|e| summary(e).map(|s| s.p99))
            .fold(0.0, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > lo {
            (lo, hi)
        } else if lo.is_finite() {
            (lo * 0.9, lo * 1.1 + 0.01)
        } else {
            (0.0, 1.0)
        };
        let mut b = Self { lo, hi, ymax: 0.0 };
        for e in all {
            let counts = b.counts(raw(e));
            let total = raw(e).len().max(1) as f64;
            for c in counts {
                b.ymax = b.ymax.max(c as f64 / total);
            }
        }
        if b.ymax <= 0.0 {
            b.ymax = 1.0;
        }
        b
    }

    fn counts(&self, values: &[f64]) -> [u64; BINS] {
        let mut c = [0u64; BINS];
        let width = (self.hi - self.lo) / BINS as f64;
        for v in values {
            let k = ((v - self.lo) / width).floor();
            let k = if k.is_finite() && k > 0.0 {
                (k as usize).min(BINS - 1)
            } else {
                0
            };
            c[k] += 1;
        }
        c
    }
}

fn histogram_chart(s: &mut String, title: &str, values: &[f64], bins: &Bins, colour: &str) {
    svg_open(s, &format!("{title} ({} samples)", values.len()));
    let counts = bins.counts(values);
    let total = values.len().max(1) as f64;
    let bw = plot_w() / BINS as f64;
    for q in [0.25, 0.5, 0.75, 1.0] {
        let yv = TOP + (1.0 - q) * plot_h();
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yv:.1}\" x2=\"{:.1}\" y2=\"{yv:.1}\" stroke=\"#e0e0e0\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}%</text>",
            W - RIGHT,
            LEFT - 4.0,
            yv + 4.0,
            q * bins.ymax * 100.0
        );
    }
    for (k, c) in counts.iter().enumerate() {
        if *c == 0 {
            continue;
        }
        let h = (*c as f64 / total) / bins.ymax * plot_h();
        let _ = writeln!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{colour}\"><title>{c}</title></rect>",
            LEFT + k as f64 * bw + 0.5,
            TOP + plot_h() - h,
            (bw - 1.0).max(0.5)
        );
    }
    for k in 0..=5 {
        let v = bins.lo + (bins.hi - bins.lo) * k as f64 / 5.0;
        let xv = LEFT + plot_w() * k as f64 / 5.0;
        let _ = writeln!(
            s,
            "<text x=\"{xv:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            TOP + plot_h() + 14.0,
            tick(v)
        );
    }
    if values.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#999\">no samples</text>",
            LEFT + plot_w() / 2.0,
            TOP + plot_h() / 2.0
        );
    }
    axis_labels(s, "latency (ms)", "share of samples");
    frame(s);
    s.push_str("</svg>\n");
}

fn tick(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
