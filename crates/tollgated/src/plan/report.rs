//! What a plan found: counted as the replay goes ([`Tally`]), then a [`Report`] printed as a
//! table or JSON, or drawn as HTML.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    hash::{Hash as _, Hasher as _},
    sync::Arc,
};

use serde::Serialize;

use super::{
    input::{Event, Malformed, Names, What},
    replay::Outcome,
};

/// The upper bounds of the retry-after histogram's buckets, in milliseconds (a last bucket
/// takes the longer waits).
const RETRY_BOUNDS_MS: [u64; 7] = [100, 1_000, 10_000, 60_000, 600_000, 3_600_000, 86_400_000];
const RETRY_LABELS: [&str; 8] = [
    "<= 100ms", "<= 1s", "<= 10s", "<= 1m", "<= 10m", "<= 1h", "<= 1d", "> 1d",
];

/// The widths the timeline's buckets may take, in seconds: the first that makes at most
/// [`TIMELINE_BUCKETS`] of the replayed span.
const TIMELINE_WIDTHS_S: [u64; 16] = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 10_800, 21_600, 86_400,
];
const TIMELINE_BUCKETS: u64 = 120;

/// Side 0 is the candidate configuration, side 1 the baseline.
const CANDIDATE: usize = 0;
const BASELINE: usize = 1;

/// The counts of a replay, by policy (or Envoy domain), identity, wait and time.
pub(crate) struct Tally {
    targets: Vec<TargetTally>,
    index: HashMap<TargetKey, usize>,
    /// Each policy's target by the policy's index (the look-up of nearly every request).
    by_policy: Vec<Option<usize>>,
    /// Identities denied on either side, or flipped, by target.
    identities: HashMap<(usize, Box<str>), Who>,
    retry: [[u64; RETRY_LABELS.len()]; 2],
    /// Denials by second.
    timeline: BTreeMap<u64, [u64; 2]>,
    /// Hashes of whom each side denied at least once, every policy together.
    denied_ids: [HashSet<u64>; 2],
    pub(crate) events: u64,
    pub(crate) out_of_order: u64,
    last_us: u64,
    first_us: Option<u64>,
}

#[derive(Hash, PartialEq, Eq, Clone)]
enum TargetKey {
    Policy(u32),
    Domain(Box<str>),
}

struct TargetTally {
    name: String,
    kind: &'static str,
    requests: u64,
    admitted: [u64; 2],
    denied: [u64; 2],
    unchecked: [u64; 2],
    known: [bool; 2],
    newly_denied: u64,
    newly_admitted: u64,
    limiters: BTreeMap<Arc<str>, [u64; 2]>,
    /// Hashes of the identities denied at least once.
    denied_ids: [HashSet<u64>; 2],
}

#[derive(Default)]
struct Who {
    newly_denied: u64,
    newly_admitted: u64,
    denied: [u64; 2],
}

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally {
            targets: Vec::new(),
            index: HashMap::new(),
            by_policy: Vec::new(),
            identities: HashMap::new(),
            retry: [[0; RETRY_LABELS.len()]; 2],
            timeline: BTreeMap::new(),
            denied_ids: [HashSet::new(), HashSet::new()],
            events: 0,
            out_of_order: 0,
            last_us: 0,
            first_us: None,
        }
    }

    /// Counts one request and what each side decided.
    pub(crate) fn add(&mut self, event: &Event, names: &Names, sides: [&Outcome; 2]) {
        self.events += 1;
        // The time the request was replayed at: its own, or the latest before it.
        let t_us = event.t_us.max(self.last_us);
        self.first_us.get_or_insert(t_us);
        if event.t_us < self.last_us {
            self.out_of_order += 1;
        }
        self.last_us = t_us;
        let t = self.target(event, names);
        let target = &mut self.targets[t];
        target.requests += 1;
        for (side, outcome) in sides.iter().enumerate() {
            target.known[side] |= outcome.known;
            if outcome.unchecked {
                target.unchecked[side] += 1;
            }
            if outcome.allowed {
                target.admitted[side] += 1;
            } else {
                target.denied[side] += 1;
                for limiter in &outcome.denied_by {
                    target.limiters.entry(limiter.clone()).or_default()[side] += 1;
                }
                if !outcome.wait_unknown {
                    let wait_ms = outcome.retry_after_us.div_ceil(1000);
                    let bucket = RETRY_BOUNDS_MS
                        .iter()
                        .position(|&b| wait_ms <= b)
                        .unwrap_or(RETRY_BOUNDS_MS.len());
                    self.retry[side][bucket] += 1;
                }
                self.timeline.entry(t_us / 1_000_000).or_default()[side] += 1;
            }
        }
        let (c, b) = (sides[CANDIDATE].allowed, sides[BASELINE].allowed);
        if c && b {
            return;
        }
        let newly_denied = !c && b;
        let newly_admitted = c && !b;
        target.newly_denied += u64::from(newly_denied);
        target.newly_admitted += u64::from(newly_admitted);
        // Who is limited: whom the denying limiters count (the candidate's, else the
        // baseline's), or the whole identity where a record does not say.
        let counted = match (c, sides[BASELINE].counted.is_empty()) {
            (false, _) => sides[CANDIDATE].counted.to_vec(),
            (true, false) => sides[BASELINE].counted.to_vec(),
            (true, true) => Vec::new(),
        };
        let counted = if counted.is_empty() {
            vec![identity_text(&event.what)]
        } else {
            counted
        };
        for who in counted {
            let mut hasher = std::hash::DefaultHasher::new();
            who.hash(&mut hasher);
            let hash = hasher.finish();
            if !c {
                target.denied_ids[CANDIDATE].insert(hash);
                self.denied_ids[CANDIDATE].insert(hash);
            }
            if !b {
                target.denied_ids[BASELINE].insert(hash);
                self.denied_ids[BASELINE].insert(hash);
            }
            let entry = self.identities.entry((t, who.into())).or_default();
            entry.newly_denied += u64::from(newly_denied);
            entry.newly_admitted += u64::from(newly_admitted);
            entry.denied[CANDIDATE] += u64::from(!c);
            entry.denied[BASELINE] += u64::from(!b);
        }
    }

    fn target(&mut self, event: &Event, names: &Names) -> usize {
        if let What::Check { policy, .. } = &event.what
            && let Some(&Some(t)) = self.by_policy.get(*policy as usize)
        {
            return t;
        }
        let key = match &event.what {
            What::Check { policy, .. } => TargetKey::Policy(*policy),
            What::Envoy(request) => TargetKey::Domain(request.domain.as_str().into()),
        };
        if let Some(&t) = self.index.get(&key) {
            return t;
        }
        let (name, kind) = match &key {
            TargetKey::Policy(p) => (names.names[*p as usize].to_string(), "policy"),
            TargetKey::Domain(d) => (d.to_string(), "envoy domain"),
        };
        self.targets.push(TargetTally {
            name,
            kind,
            requests: 0,
            admitted: [0; 2],
            denied: [0; 2],
            unchecked: [0; 2],
            known: [false; 2],
            newly_denied: 0,
            newly_admitted: 0,
            limiters: BTreeMap::new(),
            denied_ids: [HashSet::new(), HashSet::new()],
        });
        let t = self.targets.len() - 1;
        if let TargetKey::Policy(p) = key {
            let p = p as usize;
            if self.by_policy.len() <= p {
                self.by_policy.resize(p + 1, None);
            }
            self.by_policy[p] = Some(t);
        }
        self.index.insert(key, t);
        t
    }

    /// The report of everything counted.
    pub(crate) fn report(self, labels: [String; 2], read: Read, top: usize) -> Report {
        let mut targets: Vec<TargetReport> = self
            .targets
            .iter()
            .map(|t| TargetReport {
                name: t.name.clone(),
                kind: t.kind,
                requests: t.requests,
                candidate: Side::of(t, CANDIDATE),
                baseline: Side::of(t, BASELINE),
                newly_denied: t.newly_denied,
                newly_admitted: t.newly_admitted,
                limiters: t
                    .limiters
                    .iter()
                    .map(|(name, denied)| LimiterReport {
                        name: name.to_string(),
                        candidate_denied: denied[CANDIDATE],
                        baseline_denied: denied[BASELINE],
                    })
                    .collect(),
            })
            .collect();
        targets.sort_by(|a, b| a.name.cmp(&b.name).then(a.kind.cmp(b.kind)));
        let mut identities: Vec<IdentityReport> = self
            .identities
            .into_iter()
            .map(|((t, who), w)| IdentityReport {
                target: self.targets[t].name.clone(),
                identity: who.into(),
                newly_denied: w.newly_denied,
                newly_admitted: w.newly_admitted,
                candidate_denied: w.denied[CANDIDATE],
                baseline_denied: w.denied[BASELINE],
            })
            .collect();
        identities.sort_by(|a, b| {
            (b.newly_denied + b.newly_admitted)
                .cmp(&(a.newly_denied + a.newly_admitted))
                .then(b.candidate_denied.cmp(&a.candidate_denied))
                .then(a.target.cmp(&b.target))
                .then(a.identity.cmp(&b.identity))
        });
        identities.truncate(top);
        let retry_after = RETRY_LABELS
            .iter()
            .enumerate()
            .map(|(i, label)| RetryBucket {
                up_to_ms: RETRY_BOUNDS_MS.get(i).copied(),
                label,
                candidate: self.retry[CANDIDATE][i],
                baseline: self.retry[BASELINE][i],
            })
            .collect();
        let from_us = self.first_us.unwrap_or(0);
        let to_us = self.last_us.max(from_us);
        let span_s = (to_us - from_us) / 1_000_000 + 1;
        let width_s = TIMELINE_WIDTHS_S
            .iter()
            .copied()
            .find(|w| span_s.div_ceil(*w) <= TIMELINE_BUCKETS)
            .unwrap_or(span_s.div_ceil(TIMELINE_BUCKETS));
        let start_s = from_us / 1_000_000 / width_s * width_s;
        let count = ((to_us / 1_000_000 - start_s) / width_s + 1) as usize;
        let mut buckets = vec![[0u64; 2]; if self.events == 0 { 0 } else { count }];
        for (second, denied) in &self.timeline {
            let i = ((second - start_s) / width_s) as usize;
            if let Some(b) = buckets.get_mut(i) {
                b[0] += denied[0];
                b[1] += denied[1];
            }
        }
        let newly_denied = targets.iter().map(|t| t.newly_denied).sum::<u64>();
        Report {
            candidate: labels[CANDIDATE].clone(),
            baseline: labels[BASELINE].clone(),
            requests: self.events,
            from_us,
            to_us,
            skipped: read.skipped,
            malformed: read.malformed,
            malformed_lines: read.malformed_lines,
            out_of_order: self.out_of_order,
            newly_denied,
            newly_admitted: targets.iter().map(|t| t.newly_admitted).sum(),
            newly_denied_share: if self.events == 0 {
                0.0
            } else {
                newly_denied as f64 / self.events as f64
            },
            denied_identities: self.denied_ids[CANDIDATE].len() as u64,
            targets,
            top_identities: identities,
            retry_after,
            timeline: Timeline {
                bucket_s: width_s,
                buckets: buckets
                    .into_iter()
                    .enumerate()
                    .map(|(i, [c, b])| TimeBucket {
                        start_us: (start_s + i as u64 * width_s) * 1_000_000,
                        candidate: c,
                        baseline: b,
                    })
                    .collect(),
            },
            budgets: Vec::new(),
            passed: true,
        }
    }
}

/// What reading the traffic skipped or could not read.
pub(crate) struct Read {
    pub(crate) skipped: u64,
    pub(crate) malformed: u64,
    pub(crate) malformed_lines: Vec<Malformed>,
}

/// A request's identity as a report names it where no limiter says whom it counted: its
/// dimensions, or an Envoy request's descriptors.
fn identity_text(what: &What) -> String {
    let mut out = String::new();
    match what {
        What::Check { identity, .. } => {
            if let Some(ip) = identity.ip() {
                let _ = write!(out, "ip={ip} ");
            }
            if let Some(id) = identity.user_id() {
                let _ = write!(out, "user_id={id} ");
            }
            if let Some(name) = identity.user_name() {
                let _ = write!(out, "user_name={name} ");
            }
            for (name, value) in identity.headers() {
                let _ = write!(out, "header.{name}={value} ");
            }
            for (name, value) in identity.args() {
                let _ = write!(out, "arg.{name}={value} ");
            }
            out.pop();
            if out.is_empty() {
                out.push_str("(no identity)");
            }
        }
        What::Envoy(request) => {
            for (i, d) in request.descriptors.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                for (j, e) in d.entries.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}={}", e.key, e.value);
                }
            }
        }
    }
    out
}

/// A plan's findings.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// The candidate configuration, and what it is compared with.
    pub(crate) candidate: String,
    pub(crate) baseline: String,
    pub(crate) requests: u64,
    /// The first and last request's time, µs since the epoch.
    pub(crate) from_us: u64,
    pub(crate) to_us: u64,
    /// Lines left out by --where, or blank.
    pub(crate) skipped: u64,
    pub(crate) malformed: u64,
    /// The first malformed lines, with their file, line number and what is wrong.
    pub(crate) malformed_lines: Vec<Malformed>,
    /// Requests older than one before them (replayed at the latest time seen).
    pub(crate) out_of_order: u64,
    /// Requests the baseline admits and the candidate denies, and the reverse.
    pub(crate) newly_denied: u64,
    pub(crate) newly_admitted: u64,
    pub(crate) newly_denied_share: f64,
    /// Identities the candidate denies at least once (whom a denying limiter counts: an
    /// address, a user, a descriptor), counted once however many policies deny them.
    pub(crate) denied_identities: u64,
    pub(crate) targets: Vec<TargetReport>,
    pub(crate) top_identities: Vec<IdentityReport>,
    pub(crate) retry_after: Vec<RetryBucket>,
    pub(crate) timeline: Timeline,
    pub(crate) budgets: Vec<Budget>,
    /// Every budget holds.
    pub(crate) passed: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct TargetReport {
    pub(crate) name: String,
    /// `policy` or `envoy domain`.
    pub(crate) kind: &'static str,
    pub(crate) requests: u64,
    pub(crate) candidate: Side,
    pub(crate) baseline: Side,
    pub(crate) newly_denied: u64,
    pub(crate) newly_admitted: u64,
    pub(crate) limiters: Vec<LimiterReport>,
}

/// One configuration's decisions for a target.
#[derive(Debug, Serialize)]
pub(crate) struct Side {
    /// The target is in the configuration (else nothing was limited).
    pub(crate) configured: bool,
    pub(crate) admitted: u64,
    pub(crate) denied: u64,
    /// Requests that could not be checked (counted as admitted).
    pub(crate) unchecked: u64,
    pub(crate) denied_identities: u64,
}

impl Side {
    fn of(t: &TargetTally, side: usize) -> Side {
        Side {
            configured: t.known[side],
            admitted: t.admitted[side],
            denied: t.denied[side],
            unchecked: t.unchecked[side],
            denied_identities: t.denied_ids[side].len() as u64,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct LimiterReport {
    pub(crate) name: String,
    pub(crate) candidate_denied: u64,
    pub(crate) baseline_denied: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct IdentityReport {
    pub(crate) target: String,
    pub(crate) identity: String,
    pub(crate) newly_denied: u64,
    pub(crate) newly_admitted: u64,
    pub(crate) candidate_denied: u64,
    pub(crate) baseline_denied: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct RetryBucket {
    /// The bucket's upper bound (none: the longest waits).
    pub(crate) up_to_ms: Option<u64>,
    pub(crate) label: &'static str,
    pub(crate) candidate: u64,
    pub(crate) baseline: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Timeline {
    pub(crate) bucket_s: u64,
    pub(crate) buckets: Vec<TimeBucket>,
}

/// Denials in one bucket of time.
#[derive(Debug, Serialize)]
pub(crate) struct TimeBucket {
    pub(crate) start_us: u64,
    pub(crate) candidate: u64,
    pub(crate) baseline: u64,
}

/// A CI budget and how the plan met it.
#[derive(Debug, Serialize)]
pub(crate) struct Budget {
    pub(crate) name: &'static str,
    pub(crate) limit: f64,
    pub(crate) value: f64,
    pub(crate) passed: bool,
}

impl Report {
    /// Holds the report to `--max-newly-denied` and `--max-denied-identities`.
    pub(crate) fn judge(
        &mut self,
        max_newly_denied: Option<f64>,
        max_denied_identities: Option<u64>,
    ) {
        if let Some(max) = max_newly_denied {
            self.budgets.push(Budget {
                name: "max_newly_denied",
                limit: max,
                value: self.newly_denied_share,
                passed: self.newly_denied_share <= max,
            });
        }
        if let Some(max) = max_denied_identities {
            self.budgets.push(Budget {
                name: "max_denied_identities",
                limit: max as f64,
                value: self.denied_identities as f64,
                passed: self.denied_identities <= max,
            });
        }
        self.passed = self.budgets.iter().all(|b| b.passed);
    }

    /// The report as a table for the terminal.
    pub(crate) fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Plan: {} against {}: {} requests from {} to {}",
            self.candidate,
            self.baseline,
            self.requests,
            time_text(self.from_us),
            time_text(self.to_us)
        );
        if self.malformed > 0 || self.skipped > 0 || self.out_of_order > 0 {
            let _ = writeln!(
                out,
                "  {} malformed lines, {} skipped, {} out of time order",
                self.malformed, self.skipped, self.out_of_order
            );
        }
        for m in &self.malformed_lines {
            let _ = writeln!(out, "  {}:{}: {}", m.file, m.line, m.error);
        }
        let _ = writeln!(
            out,
            "  newly denied {} ({:.3}%), newly admitted {}, identities denied {}",
            self.newly_denied,
            self.newly_denied_share * 100.0,
            self.newly_admitted,
            self.denied_identities
        );
        let _ = writeln!(out);
        let mut rows = vec![[
            "policy".to_owned(),
            "requests".to_owned(),
            "denied now".to_owned(),
            "denied then".to_owned(),
            "newly denied".to_owned(),
            "newly admitted".to_owned(),
            "identities denied".to_owned(),
        ]];
        for t in &self.targets {
            let denied = |s: &Side| {
                if s.configured {
                    s.denied.to_string()
                } else {
                    "(not configured)".to_owned()
                }
            };
            rows.push([
                if t.kind == "policy" {
                    t.name.clone()
                } else {
                    format!("envoy:{}", t.name)
                },
                t.requests.to_string(),
                denied(&t.candidate),
                denied(&t.baseline),
                t.newly_denied.to_string(),
                t.newly_admitted.to_string(),
                t.candidate.denied_identities.to_string(),
            ]);
            for l in &t.limiters {
                rows.push([
                    format!("  {}", l.name),
                    String::new(),
                    l.candidate_denied.to_string(),
                    l.baseline_denied.to_string(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
        table(&mut out, &rows, 1);
        for t in &self.targets {
            if t.candidate.unchecked > 0 {
                let _ = writeln!(
                    out,
                    "  {}: {} requests could not be checked (the identity lacks a dimension a limiter counts by: the server answers them an error)",
                    t.name, t.candidate.unchecked
                );
            }
        }
        if !self.top_identities.is_empty() {
            let _ = writeln!(out, "\nMost affected identities:");
            let mut rows = vec![[
                "policy".to_owned(),
                "identity".to_owned(),
                "newly denied".to_owned(),
                "newly admitted".to_owned(),
                "denied now".to_owned(),
            ]];
            for i in &self.top_identities {
                rows.push([
                    i.target.clone(),
                    i.identity.clone(),
                    i.newly_denied.to_string(),
                    i.newly_admitted.to_string(),
                    i.candidate_denied.to_string(),
                ]);
            }
            table(&mut out, &rows, 2);
        }
        let buckets = &self.timeline.buckets;
        if buckets.iter().any(|b| b.candidate + b.baseline > 0) {
            let _ = writeln!(
                out,
                "\nDenials over time, per {} s from {}:",
                self.timeline.bucket_s,
                time_text(buckets[0].start_us)
            );
            let most = buckets
                .iter()
                .map(|b| b.candidate.max(b.baseline))
                .max()
                .unwrap_or(1);
            let _ = writeln!(
                out,
                "  now   {}",
                spark(buckets.iter().map(|b| b.candidate), most)
            );
            let _ = writeln!(
                out,
                "  then  {}",
                spark(buckets.iter().map(|b| b.baseline), most)
            );
        }
        if self
            .retry_after
            .iter()
            .any(|b| b.candidate + b.baseline > 0)
        {
            let _ = writeln!(out, "\nHow long the denied were told to wait:");
            let mut rows = vec![["wait".to_owned(), "now".to_owned(), "then".to_owned()]];
            for b in self
                .retry_after
                .iter()
                .filter(|b| b.candidate + b.baseline > 0)
            {
                rows.push([
                    b.label.to_owned(),
                    b.candidate.to_string(),
                    b.baseline.to_string(),
                ]);
            }
            table(&mut out, &rows, 1);
        }
        for b in &self.budgets {
            let _ = writeln!(
                out,
                "\nbudget {}: {} (limit {}): {}",
                b.name,
                budget_value(b.name, b.value),
                budget_value(b.name, b.limit),
                if b.passed { "ok" } else { "EXCEEDED" }
            );
        }
        out
    }
}

/// Counts as a line of bars, the tallest `most`: blank for none, then eight heights.
fn spark(counts: impl Iterator<Item = u64>, most: u64) -> String {
    const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    counts
        .map(|n| match n {
            0 => BARS[0],
            n => BARS[(n * 8).div_ceil(most.max(1)).clamp(1, 8) as usize],
        })
        .collect::<String>()
        .trim_end()
        .to_owned()
}

fn budget_value(name: &str, value: f64) -> String {
    if name == "max_newly_denied" {
        format!("{:.3}%", value * 100.0)
    } else {
        format!("{value}")
    }
}

/// A time as RFC 3339, to the millisecond.
pub(crate) fn time_text(us: u64) -> String {
    jiff::Timestamp::from_microsecond(us as i64)
        .map(|t| format!("{t:.3}"))
        .unwrap_or_else(|_| us.to_string())
}

/// Rows aligned in columns, the first a header; the first `left` columns to the left, the
/// others (numbers) to the right.
fn table<const N: usize>(out: &mut String, rows: &[[String; N]], left: usize) {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, (w, cell)) in widths.iter().zip(row).enumerate() {
            if i == 0 {
                let _ = write!(line, "{cell:<w$}");
            } else if i < left {
                let _ = write!(line, "  {cell:<w$}");
            } else {
                let _ = write!(line, "  {cell:>w$}");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}
