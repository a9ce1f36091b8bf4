//! Reads the server's own Prometheus exposition (what `/metrics` serves): the dashboard sees
//! exactly what a scraper sees, and the request path pays nothing for it.

/// One decision series: `tollgate_decisions_total{policy, reason, allowed}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SeriesName {
    pub(crate) policy: String,
    pub(crate) reason: String,
    pub(crate) allowed: bool,
}

/// The store's check calls so far: the latency histogram's cumulative buckets (upper bound
/// in seconds, count at or below it), their count, and the calls that failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StoreTotals {
    pub(crate) buckets: Vec<(f64, u64)>,
    pub(crate) count: u64,
    pub(crate) errors: u64,
}

/// What one reading of the exposition holds for the dashboard.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Reading {
    pub(crate) decisions: Vec<(SeriesName, u64)>,
    pub(crate) check: StoreTotals,
    pub(crate) evictions: Option<u64>,
}

/// Reads `text` (OpenMetrics as prometheus-client writes it). Lines it does not know are
/// skipped.
pub(crate) fn read(text: &str) -> Reading {
    let mut reading = Reading::default();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((name, labels, value)) = split(line) else {
            continue;
        };
        let label = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let count = value.parse::<f64>().ok().map(|v| v as u64);
        match name {
            "tollgate_decisions_total" => {
                if let (Some(policy), Some(reason), Some(allowed), Some(n)) =
                    (label("policy"), label("reason"), label("allowed"), count)
                {
                    reading.decisions.push((
                        SeriesName {
                            policy: policy.to_owned(),
                            reason: reason.to_owned(),
                            allowed: allowed == "true",
                        },
                        n,
                    ));
                }
            }
            "tollgate_store_latency_seconds_bucket" if label("op") == Some("check") => {
                let le = match label("le") {
                    Some("+Inf") => Some(f64::INFINITY),
                    Some(le) => le.parse().ok(),
                    None => None,
                };
                if let (Some(le), Some(n)) = (le, count) {
                    reading.check.buckets.push((le, n));
                }
            }
            "tollgate_store_latency_seconds_count" if label("op") == Some("check") => {
                reading.check.count = count.unwrap_or(0);
            }
            "tollgate_store_errors_total" if label("op") == Some("check") => {
                reading.check.errors = count.unwrap_or(0);
            }
            "tollgate_memory_store_evictions_total" => reading.evictions = count,
            _ => {}
        }
    }
    reading.check.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    reading
}

/// A sample's labels, values unescaped.
type Labels = Vec<(String, String)>;

/// `name{k="v",...} value` into its parts.
fn split(line: &str) -> Option<(&str, Labels, &str)> {
    let Some(open) = line.find('{') else {
        let (name, value) = line.split_once(' ')?;
        return Some((name, Vec::new(), value.split(' ').next()?));
    };
    let name = &line[..open];
    let mut labels = Vec::new();
    let mut rest = &line[open + 1..];
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            let value = after.trim_start().split(' ').next()?;
            return Some((name, labels, value));
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.to_owned(), value));
        rest = &after[end + 1..];
    }
}

/// The `q` quantile (0..1) of the calls between two readings of the latency histogram, in
/// seconds, interpolated linearly inside its bucket; `None` when no call was made. A
/// quantile in the last, unbounded bucket is reported as the largest finite bound.
pub(crate) fn quantile(now: &StoreTotals, then: &StoreTotals, q: f64) -> Option<f64> {
    let calls = now.count.saturating_sub(then.count);
    if calls == 0 {
        return None;
    }
    let before = |le: f64| {
        then.buckets
            .iter()
            .find(|(b, _)| *b == le)
            .map_or(0, |(_, n)| *n)
    };
    let rank = q * calls as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for &(le, n) in &now.buckets {
        let here = n.saturating_sub(before(le));
        if here as f64 >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = here.saturating_sub(below);
            if inside == 0 {
                return Some(le);
            }
            let fraction = (rank - below as f64) / inside as f64;
            return Some(lower + (le - lower) * fraction.clamp(0.0, 1.0));
        }
        (lower, below) = (le, here);
    }
    Some(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_own_exposition_is_read() {
        let text = r#"# HELP tollgate_decisions Rate-limit decisions.
# TYPE tollgate_decisions counter
tollgate_decisions_total{policy="sms_code",reason="ok",allowed="true"} 7
tollgate_decisions_total{policy="we\"ird\\name",reason="rate_limited",allowed="false"} 3
tollgate_store_latency_seconds_sum{op="check"} 0.5
tollgate_store_latency_seconds_count{op="check"} 10
tollgate_store_latency_seconds_bucket{le="0.001",op="check"} 4
tollgate_store_latency_seconds_bucket{le="+Inf",op="check"} 10
tollgate_store_latency_seconds_bucket{le="0.002",op="check"} 9
tollgate_store_latency_seconds_bucket{le="0.001",op="ping"} 1
tollgate_store_errors_total{op="check"} 2
tollgate_memory_store_evictions_total 5
# EOF
"#;
        let r = read(text);
        assert_eq!(r.decisions.len(), 2);
        assert_eq!(r.decisions[1].0.policy, "we\"ird\\name");
        assert!(!r.decisions[1].0.allowed);
        assert_eq!(r.decisions[0].1, 7);
        assert_eq!(
            r.check,
            StoreTotals {
                buckets: vec![(0.001, 4), (0.002, 9), (f64::INFINITY, 10)],
                count: 10,
                errors: 2,
            }
        );
        assert_eq!(r.evictions, Some(5));
    }

    /// The coupling with `metrics`: what it renders is what this module reads.
    #[test]
    fn what_the_metrics_render_is_read() {
        use crate::metrics::{DecisionHandles, Metrics};
        let metrics = Metrics::new();
        let handles = DecisionHandles::default();
        for _ in 0..3 {
            metrics.decision(&handles, "sms", tollgate::Reason::Ok, true);
        }
        metrics.decision(&handles, "sms", tollgate::Reason::StoreUnavailable, false);
        metrics.store_call("check", std::time::Duration::from_micros(300), false);
        metrics.store_call("check", std::time::Duration::from_millis(3), true);
        let r = read(&metrics.render());
        let mut decisions = r.decisions.clone();
        decisions.sort();
        let name = |reason: &str, allowed| SeriesName {
            policy: "sms".into(),
            reason: reason.into(),
            allowed,
        };
        assert_eq!(
            decisions,
            [(name("ok", true), 3), (name("store_unavailable", false), 1)]
        );
        assert_eq!((r.check.count, r.check.errors), (2, 1));
        assert_eq!(r.check.buckets.last(), Some(&(f64::INFINITY, 2)));
        let p50 = quantile(&r.check, &StoreTotals::default(), 0.5).unwrap();
        assert!((0.0002..=0.0004).contains(&p50), "{p50}");
    }

    #[test]
    fn quantiles_come_from_the_calls_between_two_readings() {
        let then = StoreTotals {
            buckets: vec![(0.001, 100), (0.002, 100), (f64::INFINITY, 100)],
            count: 100,
            errors: 0,
        };
        // 10 new calls: 5 at most 1 ms, 4 in (1, 2] ms, 1 above.
        let now = StoreTotals {
            buckets: vec![(0.001, 105), (0.002, 109), (f64::INFINITY, 110)],
            count: 110,
            errors: 0,
        };
        let p50 = quantile(&now, &then, 0.5).unwrap();
        assert!((p50 - 0.001).abs() < 1e-12, "{p50}");
        let p80 = quantile(&now, &then, 0.8).unwrap();
        assert!((p80 - 0.00175).abs() < 1e-12, "{p80}");
        assert_eq!(quantile(&now, &then, 0.99), Some(0.002));
        assert_eq!(quantile(&then, &then, 0.5), None);
    }
}
