//! The algorithms as pure functions over (state, now, rule, cost).
//!
//! The memory store calls these directly; `tollgate-redis/scripts/check.lua` mirrors them line
//! for line. Time is in microseconds since the Unix epoch. A window holds the instants `t` with
//! `now - window < t <= now`, so an entry recorded at `t` stops counting at `t + window`.

use crate::rule::Rule;

/// What one rule says about one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleOutcome {
    /// This rule admits the request.
    pub allowed: bool,
    /// Units left in the window after this request (if admitted) or now (if not).
    pub remaining: u64,
    /// Microseconds until the rule's quota is full again (nothing counted any more).
    pub reset_after_us: u64,
    /// When denied: microseconds until this request would be admitted by this rule.
    pub retry_after_us: Option<u64>,
}

/// Sliding log. `log` holds the instants of admitted units, oldest first; entries older than the
/// window are ignored. On admission the caller appends `cost` entries at `now`.
pub fn sliding_log(log: &[u64], now: u64, rule: &Rule, cost: u64) -> RuleOutcome {
    let window = rule.window_us();
    let limit = rule.limit();
    let first = match now.checked_sub(window) {
        Some(edge) => first_after(log, edge),
        None => 0,
    };
    let live = &log[first..];
    let count = live.len() as u64;
    let newest = live.last().map(|&t| t + window - now);
    // `count + cost` may pass u64::MAX when the limit is near it: such a request does not fit.
    if count.checked_add(cost).is_some_and(|total| total <= limit) {
        let reset_after_us = if cost > 0 {
            window
        } else {
            newest.unwrap_or(0)
        };
        return RuleOutcome {
            allowed: true,
            remaining: limit - count - cost,
            reset_after_us,
            retry_after_us: None,
        };
    }
    // The request fits once the `count + cost - limit` oldest live entries have left.
    let must_leave = u128::from(count) + u128::from(cost) - u128::from(limit);
    let retry_after_us = usize::try_from(must_leave - 1)
        .ok()
        .and_then(|i| live.get(i))
        .map(|&t| t + window - now);
    RuleOutcome {
        allowed: false,
        remaining: limit.saturating_sub(count),
        reset_after_us: newest.unwrap_or(0),
        retry_after_us,
    }
}

/// The index of the first entry of the sorted `log` later than `edge`.
///
/// The same as `partition_point(|&t| t <= edge)`, but it reads only the ends of a long log in
/// the common cases: a short window starts near its newest entries, and the longest window
/// (the one the log is trimmed to) at its oldest.
fn first_after(log: &[u64], edge: u64) -> usize {
    if log.first().is_none_or(|&t| t > edge) {
        return 0;
    }
    // Gallop back from the newest entry, then search the last step.
    let mut step = 1;
    let mut hi = log.len();
    while hi > 0 && log[hi - 1] > edge {
        let lo = hi.saturating_sub(step);
        if log[lo] <= edge {
            return lo + 1 + log[lo + 1..hi].partition_point(|&t| t <= edge);
        }
        hi = lo;
        step *= 2;
    }
    hi
}

/// State of a fixed-window rule: the window's start and the units counted in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the window the count belongs to.
    pub start: u64,
    /// Units admitted in that window.
    pub count: u64,
}

/// Fixed window aligned to the epoch. Returns the outcome and, when admitted, the new state.
pub fn fixed_window(
    state: Option<FixedWindowState>,
    now: u64,
    rule: &Rule,
    cost: u64,
) -> (RuleOutcome, Option<FixedWindowState>) {
    let window = rule.window_us();
    let limit = rule.limit();
    let start = now - now % window;
    let count = match state {
        Some(s) if s.start == start => s.count,
        _ => 0,
    };
    let reset_after_us = start + window - now;
    // `count + cost` may pass u64::MAX when the limit is near it: such a request does not fit.
    if let Some(total) = count.checked_add(cost).filter(|&total| total <= limit) {
        let outcome = RuleOutcome {
            allowed: true,
            remaining: limit - total,
            reset_after_us: if total == 0 { 0 } else { reset_after_us },
            retry_after_us: None,
        };
        (
            outcome,
            Some(FixedWindowState {
                start,
                count: total,
            }),
        )
    } else {
        let outcome = RuleOutcome {
            allowed: false,
            remaining: limit - count.min(limit),
            reset_after_us,
            retry_after_us: Some(reset_after_us),
        };
        (outcome, None)
    }
}

/// The GCRA emission interval: microseconds one unit occupies.
pub fn gcra_interval(rule: &Rule) -> u64 {
    (rule.window_us() / rule.limit()).max(1)
}

/// GCRA over the theoretical arrival time `tat`. Returns the outcome and, when admitted, the
/// new `tat`.
pub fn gcra(tat: Option<u64>, now: u64, rule: &Rule, cost: u64) -> (RuleOutcome, Option<u64>) {
    let interval = gcra_interval(rule);
    let capacity = interval * rule.limit();
    let tat = tat.unwrap_or(now).max(now);
    // The wait after this request, in u128: `interval * cost` passes u64::MAX for a large
    // enough cost.
    let wait = u128::from(tat - now) + u128::from(interval) * u128::from(cost);
    match u64::try_from(wait).ok().filter(|&wait| wait <= capacity) {
        Some(wait) => {
            let outcome = RuleOutcome {
                allowed: true,
                remaining: (capacity - wait) / interval,
                reset_after_us: wait,
                retry_after_us: None,
            };
            (outcome, Some(now.saturating_add(wait)))
        }
        None => {
            let outcome = RuleOutcome {
                allowed: false,
                remaining: capacity.saturating_sub(tat - now) / interval,
                reset_after_us: tat - now,
                retry_after_us: Some(
                    u64::try_from(wait - u128::from(capacity)).unwrap_or(u64::MAX),
                ),
            };
            (outcome, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn rule(text: &str) -> Rule {
        text.parse().unwrap()
    }

    #[test]
    fn sliding_log_counts_only_the_window() {
        let r = rule("3/10s");
        let now = 100 * S;
        // One entry exactly on the edge (no longer counted), two inside.
        let log = [90 * S, 95 * S, 99 * S];
        let o = sliding_log(&log, now, &r, 1);
        assert!(o.allowed);
        assert_eq!(o.remaining, 0);
        let o = sliding_log(&log, now, &r, 2);
        assert!(!o.allowed);
        assert_eq!(o.remaining, 1);
        // One more unit fits once the entry at 95 s leaves, at 105 s.
        assert_eq!(o.retry_after_us, Some(5 * S));
        assert_eq!(o.reset_after_us, 9 * S);
    }

    #[test]
    fn sliding_log_retry_after_is_the_oldest_entry_that_must_leave() {
        let r = rule("2/10s");
        let log = [S, 2 * S, 3 * S];
        let o = sliding_log(&log, 5 * S, &r, 1);
        // Three live entries, one more wanted, limit two: two must leave, the second at 12 s.
        assert_eq!(o.retry_after_us, Some(7 * S));
        assert_eq!(o.remaining, 0);
    }

    #[test]
    fn first_after_is_the_partition_point() {
        let logs: [&[u64]; 5] = [
            &[],
            &[5],
            &[1, 2, 3],
            &[1, 1, 2, 2, 2, 3, 7, 9, 9],
            &[0; 40],
        ];
        let mut long: Vec<u64> = (0..100).map(|i| i / 3).collect();
        long.push(200);
        for log in logs.into_iter().chain([&long[..]]) {
            for edge in 0..=210 {
                assert_eq!(
                    first_after(log, edge),
                    log.partition_point(|&t| t <= edge),
                    "{log:?} {edge}"
                );
            }
        }
    }

    #[test]
    fn sliding_log_early_clock_counts_everything() {
        let r = rule("1/10s");
        let o = sliding_log(&[1], 5, &r, 1);
        assert!(!o.allowed);
    }

    #[test]
    fn fixed_window_resets_at_the_boundary() {
        let r = rule("2/10s");
        let (o, s) = fixed_window(None, 12 * S, &r, 2);
        assert!(o.allowed);
        assert_eq!(o.reset_after_us, 8 * S);
        let (o, none) = fixed_window(s, 19 * S, &r, 1);
        assert!(!o.allowed);
        assert_eq!(none, None);
        assert_eq!(o.retry_after_us, Some(S));
        let (o, s2) = fixed_window(s, 20 * S, &r, 1);
        assert!(o.allowed);
        assert_eq!(
            s2,
            Some(FixedWindowState {
                start: 20 * S,
                count: 1
            })
        );
    }

    #[test]
    fn gcra_spaces_requests_after_the_burst() {
        let r = rule("2/10s"); // one unit every 5 s, burst of 2
        let now = 100 * S;
        let (o, tat) = gcra(None, now, &r, 1);
        assert!(o.allowed);
        assert_eq!(o.remaining, 1);
        let (o, tat) = gcra(tat, now, &r, 1);
        assert!(o.allowed);
        assert_eq!(o.remaining, 0);
        assert_eq!(tat, Some(110 * S));
        let (o, none) = gcra(tat, now, &r, 1);
        assert!(!o.allowed);
        assert_eq!(none, None);
        assert_eq!(o.retry_after_us, Some(5 * S));
        let (o, _) = gcra(tat, now + 5 * S, &r, 1);
        assert!(o.allowed);
    }
}
