//! The report as one self-contained HTML page: styles and charts (SVG) inline, no script and
//! nothing fetched, so it opens anywhere, offline, and can be attached to a pull request.
//! Every value from the traffic is escaped.

use std::fmt::Write as _;

use super::report::{Report, time_text};

/// Chart colours: the candidate, the baseline.
const NOW: &str = "#c0392b";
const THEN: &str = "#7f8c8d";

/// The page.
pub(crate) fn page(report: &Report) -> String {
    let mut out = String::with_capacity(32 << 10);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>tollgate plan: {}</title><style>{STYLE}</style></head><body>\n",
        esc(&report.candidate)
    );
    let _ = write!(
        out,
        "<h1>tollgate plan</h1>\n<p class=\"lead\"><b>{}</b> against <b>{}</b>: {} requests from {} to {}.</p>\n",
        esc(&report.candidate),
        esc(&report.baseline),
        report.requests,
        time_text(report.from_us),
        time_text(report.to_us)
    );
    summary(&mut out, report);
    let _ = writeln!(
        out,
        "<p class=\"legend\"><span style=\"background:{NOW}\"></span>{} <span style=\"background:{THEN}\"></span>{}</p>",
        esc(&report.candidate),
        esc(&report.baseline)
    );
    timeline(&mut out, report);
    identities(&mut out, report);
    retry_after(&mut out, report);
    policies(&mut out, report);
    malformed(&mut out, report);
    out.push_str("</body></html>\n");
    out
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222;padding:0 1em}\
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:2em}\
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:right}\
td:first-child,th:first-child,#identities-table td:nth-child(2),#identities-table th:nth-child(2){text-align:left}th{background:#f4f4f4}\
.cards{display:flex;gap:1em;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:9em}\
.card b{display:block;font-size:1.5em}.ok{color:#1e8449}.bad{color:#c0392b;font-weight:bold}\
.legend span{display:inline-block;width:1em;height:1em;margin:0 .3em 0 1em;vertical-align:middle}\
svg text{font:11px system-ui,sans-serif;fill:#444}code{background:#f4f4f4;padding:0 .2em}";

fn summary(out: &mut String, r: &Report) {
    out.push_str("<div class=\"cards\" id=\"summary\">");
    let card = |out: &mut String, id: &str, label: &str, value: String| {
        let _ = write!(
            out,
            "<div class=\"card\" id=\"{id}\"><b>{value}</b>{label}</div>"
        );
    };
    card(
        out,
        "newly-denied",
        "newly denied",
        format!("{} ({:.3}%)", r.newly_denied, r.newly_denied_share * 100.0),
    );
    card(
        out,
        "newly-admitted",
        "newly admitted",
        r.newly_admitted.to_string(),
    );
    card(
        out,
        "denied-identities",
        "identities denied",
        r.denied_identities.to_string(),
    );
    card(out, "malformed", "malformed lines", r.malformed.to_string());
    out.push_str("</div>\n");
    if !r.budgets.is_empty() {
        out.push_str("<h2>Budgets</h2><table id=\"budgets\"><tr><th>budget</th><th>limit</th><th>plan</th><th></th></tr>");
        for b in &r.budgets {
            let shown = |v: f64| {
                if b.name == "max_newly_denied" {
                    format!("{:.3}%", v * 100.0)
                } else {
                    format!("{v}")
                }
            };
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>",
                b.name,
                shown(b.limit),
                shown(b.value),
                if b.passed { "ok" } else { "bad" },
                if b.passed { "ok" } else { "exceeded" }
            );
        }
        out.push_str("</table>\n");
    }
}

/// Denials over time, the two configurations side by side in each bucket.
fn timeline(out: &mut String, r: &Report) {
    let _ = write!(
        out,
        "<h2>Denials over time</h2><p>per {} s, from {}</p>",
        r.timeline.bucket_s,
        time_text(r.from_us)
    );
    let pairs: Vec<(String, u64, u64)> = r
        .timeline
        .buckets
        .iter()
        .map(|b| (time_text(b.start_us), b.candidate, b.baseline))
        .collect();
    paired_bars(out, "timeline", "denials over time", &pairs, false);
}

/// The most affected identities, as bars of newly denied (and newly admitted) requests.
fn identities(out: &mut String, r: &Report) {
    out.push_str("<h2>Most affected identities</h2>");
    if r.top_identities.is_empty() {
        out.push_str(
            "<p id=\"identities-none\">No identity is denied by either configuration.</p>\n",
        );
        return;
    }
    let (w, row) = (960.0, 22.0);
    let max = r
        .top_identities
        .iter()
        .map(|i| i.newly_denied.max(i.newly_admitted).max(i.candidate_denied))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let _ = write!(
        out,
        "<svg id=\"identities\" width=\"{w}\" height=\"{}\" role=\"img\" aria-label=\"most affected identities\">",
        row * r.top_identities.len() as f64 + 4.0
    );
    for (k, i) in r.top_identities.iter().enumerate() {
        let y = k as f64 * row;
        let value = if i.newly_denied + i.newly_admitted > 0 {
            i.newly_denied + i.newly_admitted
        } else {
            i.candidate_denied
        };
        let bar = value as f64 / max * (w - 480.0);
        let _ = write!(
            out,
            "<text x=\"0\" y=\"{:.1}\">{} · {}</text><rect class=\"bar now\" data-value=\"{value}\" x=\"400\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{:.1}\" fill=\"{NOW}\"><title>{value}</title></rect><text x=\"{:.1}\" y=\"{:.1}\">{value}</text>",
            y + 15.0,
            esc(&i.target),
            esc(&clip(&i.identity, 60)),
            y + 3.0,
            row - 6.0,
            404.0 + bar,
            y + 15.0
        );
    }
    out.push_str("</svg>\n<table id=\"identities-table\"><tr><th>policy</th><th>identity</th><th>newly denied</th><th>newly admitted</th><th>denied now</th><th>denied then</th></tr>");
    for i in &r.top_identities {
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&i.target),
            esc(&i.identity),
            i.newly_denied,
            i.newly_admitted,
            i.candidate_denied,
            i.baseline_denied
        );
    }
    out.push_str("</table>\n");
}

/// How long the denied were told to wait, both configurations per bucket.
fn retry_after(out: &mut String, r: &Report) {
    out.push_str("<h2>How long the denied were told to wait</h2>");
    let pairs: Vec<(String, u64, u64)> = r
        .retry_after
        .iter()
        .map(|b| (b.label.to_owned(), b.candidate, b.baseline))
        .collect();
    paired_bars(out, "retry-after", "retry-after histogram", &pairs, true);
}

/// A chart of bars in pairs, the candidate's and the baseline's, one pair for each of `pairs`
/// (a title, then the two counts), on one scale; `labelled`: each pair's title under it, else
/// the scale beside the chart.
fn paired_bars(
    out: &mut String,
    id: &str,
    label: &str,
    pairs: &[(String, u64, u64)],
    labelled: bool,
) {
    let (w, h) = (960.0, 200.0);
    let (left, below) = if labelled { (0.0, 20.0) } else { (30.0, 10.0) };
    let max = pairs
        .iter()
        .map(|(_, now, then)| *now.max(then))
        .max()
        .unwrap_or(0)
        .max(1);
    let _ = write!(
        out,
        "<svg id=\"{id}\" width=\"{w}\" height=\"{}\" role=\"img\" aria-label=\"{label}\">",
        h + below
    );
    let step = (w - left) / pairs.len().max(1) as f64;
    // A gap between pairs where they are wide enough for one.
    let gap = if step > 40.0 { 10.0 } else { 0.0 };
    let width = ((step - 2.0 * gap) / 2.0 - 0.5).max(0.5);
    for (i, (title, now, then)) in pairs.iter().enumerate() {
        let x = left + i as f64 * step + gap;
        for (j, (value, colour, class)) in [(*now, NOW, "now"), (*then, THEN, "then")]
            .into_iter()
            .enumerate()
        {
            let bar = value as f64 / max as f64 * h;
            let _ = write!(
                out,
                "<rect class=\"bar {class}\" data-value=\"{value}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{width:.1}\" height=\"{bar:.1}\" fill=\"{colour}\"><title>{}: {value}</title></rect>",
                x + j as f64 * (width + 0.5),
                h - bar,
                esc(title)
            );
        }
        if labelled {
            let _ = write!(
                out,
                "<text x=\"{x:.1}\" y=\"{}\">{}</text>",
                h + 14.0,
                esc(title)
            );
        }
    }
    if !labelled {
        let _ = write!(
            out,
            "<line x1=\"{left}\" y1=\"{h}\" x2=\"{w}\" y2=\"{h}\" stroke=\"#888\"/><text x=\"0\" y=\"10\">{max}</text><text x=\"0\" y=\"{h}\">0</text>"
        );
    }
    out.push_str("</svg>\n");
}

fn policies(out: &mut String, r: &Report) {
    out.push_str("<h2>By policy and limiter</h2><table id=\"policies\"><tr><th>policy / limiter</th><th>requests</th><th>denied now</th><th>denied then</th><th>newly denied</th><th>newly admitted</th><th>identities denied</th></tr>");
    for t in &r.targets {
        let denied = |configured: bool, n: u64| {
            if configured {
                n.to_string()
            } else {
                "not configured".to_owned()
            }
        };
        let _ = write!(
            out,
            "<tr><td><b>{}{}</b></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if t.kind == "policy" { "" } else { "envoy:" },
            esc(&t.name),
            t.requests,
            denied(t.candidate.configured, t.candidate.denied),
            denied(t.baseline.configured, t.baseline.denied),
            t.newly_denied,
            t.newly_admitted,
            t.candidate.denied_identities
        );
        for l in &t.limiters {
            let _ = write!(
                out,
                "<tr><td>&nbsp;&nbsp;{}</td><td></td><td>{}</td><td>{}</td><td></td><td></td><td></td></tr>",
                esc(&l.name),
                l.candidate_denied,
                l.baseline_denied
            );
        }
    }
    out.push_str("</table>\n");
    for t in r.targets.iter().filter(|t| t.candidate.unchecked > 0) {
        let _ = writeln!(
            out,
            "<p class=\"bad\">{}: {} requests could not be checked (the identity lacks a dimension a limiter counts by: the server answers them an error).</p>",
            esc(&t.name),
            t.candidate.unchecked
        );
    }
}

fn malformed(out: &mut String, r: &Report) {
    if r.malformed == 0 {
        return;
    }
    let _ = write!(
        out,
        "<h2>Malformed lines</h2><p>{} lines could not be read; the first:</p><table id=\"malformed-lines\"><tr><th>file</th><th>line</th><th>what is wrong</th></tr>",
        r.malformed
    );
    for m in &r.malformed_lines {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
            esc(&m.file),
            m.line,
            esc(&m.error)
        );
    }
    out.push_str("</table>\n");
}

fn clip(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Text for HTML, attributes included.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
