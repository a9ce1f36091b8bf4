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

/// What [`sliding_log`] says for no units, from what it said for `cost` units it admitted, on
/// the same log at the same instant: the same count, so `cost` more remain, and the quota is
/// back when the newest live entry leaves. No second search for the window's edge (a denied
/// check reports its admitting rules so).
#[inline]
pub(crate) fn sliding_log_settled(
    admitted: &RuleOutcome,
    log: &[u64],
    now: u64,
    rule: &Rule,
    cost: u64,
) -> RuleOutcome {
    debug_assert!(admitted.allowed);
    // The newest entry leaves at `t + window`: already, if it is not live.
    let leaves = |&t: &u64| (t + rule.window_us()).saturating_sub(now);
    RuleOutcome {
        allowed: true,
        remaining: admitted.remaining + cost,
        reset_after_us: log.last().map_or(0, leaves),
        retry_after_us: None,
    }
}

/// The index of the first entry of the sorted `log` later than `edge`.
///
/// The same as `partition_point(|&t| t <= edge)`, but it reads only the ends of a long log in
/// the common cases: a short window starts near its newest entries, and the longest window
/// (the one the log is trimmed to) near its oldest. It gallops from both ends at once, so it
/// reads a few entries whichever end the edge is near.
fn first_after(log: &[u64], edge: u64) -> usize {
    let (Some(&oldest), Some(&newest)) = (log.first(), log.last()) else {
        return 0;
    };
    if oldest > edge {
        return 0;
    }
    if newest <= edge {
        return log.len();
    }
    // `log[old] <= edge < log[new]`: the first later entry is in `old + 1..=new`.
    let (mut old, mut new) = (0, log.len() - 1);
    let mut step = 1;
    while new - old > 2 * step {
        if log[old + step] > edge {
            new = old + step;
            break;
        }
        old += step;
        if log[new - step] <= edge {
            old = new - step;
            break;
        }
        new -= step;
        step *= 2;
    }
    old + 1 + log[old + 1..new].partition_point(|&t| t <= edge)
}

/// State of a fixed-window rule: the window's start and the units counted in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the window the count belongs to.
    pub start: u64,
    /// Units admitted in that window.
    pub count: u64,
}

/// Fixed window aligned to the epoch (or to a calendar: see [`Rule::fixed_window_at`]). Returns
/// the outcome and, when admitted, the new state.
pub fn fixed_window(
    state: Option<FixedWindowState>,
    now: u64,
    rule: &Rule,
    cost: u64,
) -> (RuleOutcome, Option<FixedWindowState>) {
    let limit = rule.limit();
    let (start, end) = rule.fixed_window_at(now);
    let count = match state {
        Some(s) if s.start == start => s.count,
        _ => 0,
    };
    let reset_after_us = end - now;
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
            // A cost above the limit fits in no window.
            retry_after_us: (cost <= limit).then_some(reset_after_us),
        };
        (outcome, None)
    }
}

/// State of a sliding-window rule: the current window's start and count, and the count of
/// the window before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Start of the window `count` belongs to (aligned to the epoch).
    pub start: u64,
    /// Units admitted in the window before it.
    pub previous: u64,
    /// Units admitted in this window.
    pub count: u64,
}

/// The largest `limit × window in milliseconds` of a sliding-window rule: its arithmetic stays
/// exact in the doubles of Redis's Lua (below 2^53 with room for the sums).
pub const MAX_SLIDING_WINDOW_PRODUCT: u64 = 1 << 51;

/// Sliding window counter. Windows of `W` milliseconds are aligned to the epoch; at `now`,
/// `e` whole milliseconds into the current window, the sliding window `(now - W, now]` is
/// estimated as
///
/// ```text
/// estimate = previous * (W - e) / W + count
/// ```
///
/// (the previous window's units taken as spread evenly over it). A request of `cost` is
/// admitted if `estimate + cost <= limit`, computed exactly in integers
/// (`previous * (W - e) + (count + cost) * W <= limit * W`). Returns the outcome and, when
/// admitted, the new state.
///
/// How far it may stray from the exact sliding log: the units it admits in any sliding window
/// `(t - W, t]` number less than `2 * limit` (the previous window's units, all counted by the
/// log while the estimate lets them fade, and at most `limit` of the current window's); and
/// it admits a request whenever the units admitted since the previous window began, plus
/// `cost`, are at most `limit` (the estimate never exceeds that count).
///
/// `retry_after_us` is exact for this model: the first instant the estimate leaves room (the
/// weight changes each millisecond), later in this window or in the next.
pub fn sliding_window(
    state: Option<SlidingWindowState>,
    now: u64,
    rule: &Rule,
    cost: u64,
) -> (RuleOutcome, Option<SlidingWindowState>) {
    let w = rule.window_us();
    let w_ms = u128::from(rule.window_ms());
    let limit = rule.limit();
    let start = now - now % w;
    let (previous, count) = rolled(state, start, w);
    let into_ms = u128::from((now - start) / 1000);
    let capacity = u128::from(limit) * w_ms;
    // The estimate scaled by W: previous * (W - e) + count * W.
    let scaled = u128::from(previous) * (w_ms - into_ms) + u128::from(count) * w_ms;
    let wanted = scaled + u128::from(cost) * w_ms;
    // The quota is back when the estimate is 0: at the end of the next window if this one
    // counts anything, else at the end of this one if the previous did.
    let reset = |count: u64| {
        if count > 0 {
            start + 2 * w - now
        } else if previous > 0 {
            start + w - now
        } else {
            0
        }
    };
    let whole =
        |scaled: u128| u64::try_from(div(capacity.saturating_sub(scaled), w_ms)).unwrap_or(0);
    if wanted <= capacity {
        let total = count + cost;
        let outcome = RuleOutcome {
            allowed: true,
            remaining: whole(wanted),
            reset_after_us: reset(total),
            retry_after_us: None,
        };
        let state = SlidingWindowState {
            start,
            previous,
            count: total,
        };
        return (outcome, Some(state));
    }
    // When it first fits: the first whole millisecond e' of this window with
    // previous * (W - e') <= (limit - count - cost) * W, else the first e'' of the next with
    // count * (W - e'') <= (limit - cost) * W. Never if the cost is above the limit.
    let first = |fading: u64, room: u64| -> u128 {
        if fading == 0 {
            return 0;
        }
        w_ms.saturating_sub(div(u128::from(room) * w_ms, u128::from(fading)))
    };
    let retry_after_us = limit.checked_sub(cost).map(|room| {
        let at_ms = match room.checked_sub(count) {
            Some(room_now) => Some(first(previous, room_now).max(into_ms)).filter(|&e| e < w_ms),
            None => None,
        };
        let at = match at_ms {
            Some(e) => start + u64::try_from(e).unwrap_or(0) * 1000,
            None => start + w + u64::try_from(first(count, room)).unwrap_or(0) * 1000,
        };
        at.saturating_sub(now)
    });
    let outcome = RuleOutcome {
        allowed: false,
        remaining: whole(scaled),
        reset_after_us: reset(count),
        retry_after_us,
    };
    (outcome, None)
}

/// The counts (previous, current) of `state` seen from the window that starts at `start`.
#[inline(always)]
fn rolled(state: Option<SlidingWindowState>, start: u64, w: u64) -> (u64, u64) {
    match state {
        Some(s) if s.start == start => (s.previous, s.count),
        Some(s) if s.start.checked_add(w) == Some(start) => (s.count, 0),
        _ => (0, 0),
    }
}

/// The state [`sliding_window`] returns beside its admitting `outcome` of `cost` units at
/// `now`, from that outcome rather than a second evaluation: an admission of units resets at
/// the end of the window after theirs, so the outcome names their window's start.
#[inline]
pub(crate) fn sliding_window_recorded(
    state: Option<SlidingWindowState>,
    now: u64,
    rule: &Rule,
    cost: u64,
    outcome: &RuleOutcome,
) -> SlidingWindowState {
    debug_assert!(outcome.allowed);
    let w = rule.window_us();
    let start = if cost > 0 {
        now + outcome.reset_after_us - 2 * w
    } else {
        now - now % w
    };
    let (previous, count) = rolled(state, start, w);
    SlidingWindowState {
        start,
        previous,
        count: count + cost,
    }
}

/// `n / d`, in u64 when both fit (the common case: a u128 division costs several times more).
fn div(n: u128, d: u128) -> u128 {
    match (u64::try_from(n), u64::try_from(d)) {
        (Ok(n), Ok(d)) => u128::from(n / d),
        _ => n / d,
    }
}

/// The GCRA emission interval: microseconds one unit occupies.
pub fn gcra_interval(rule: &Rule) -> u64 {
    rule.interval_us()
}

/// How long after now the units of an admitting GCRA outcome are due (0: at once): the time
/// by which its new arrival time passes the rule's burst.
pub fn gcra_due_us(rule: &Rule, reset_after_us: u64) -> u64 {
    reset_after_us.saturating_sub(gcra_interval(rule) * rule.limit())
}

/// GCRA over the theoretical arrival time `tat`. Returns the outcome and, when admitted, the
/// new `tat`.
pub fn gcra(tat: Option<u64>, now: u64, rule: &Rule, cost: u64) -> (RuleOutcome, Option<u64>) {
    gcra_within(tat, now, rule, cost, 0)
}

/// [`gcra`], admitting units that conform within `delay_us` too: their place in the schedule
/// is reserved (the new `tat` holds them), and they are due [`gcra_due_us`] from now.
#[inline]
pub fn gcra_within(
    tat: Option<u64>,
    now: u64,
    rule: &Rule,
    cost: u64,
    delay_us: u64,
) -> (RuleOutcome, Option<u64>) {
    let interval = gcra_interval(rule);
    let capacity = interval * rule.limit();
    let tat = tat.unwrap_or(now).max(now);
    // The wait after this request, in u128: `interval * cost` passes u64::MAX for a large
    // enough cost.
    let wait = u128::from(tat - now) + u128::from(interval) * u128::from(cost);
    let tolerance = capacity.saturating_add(delay_us);
    // More units than the limit never fit, however long they may wait (without a delay, their
    // wait is past the capacity already): refused, and no wait helps.
    let fits = |wait: &u64| *wait <= tolerance && (delay_us == 0 || cost <= rule.limit());
    match u64::try_from(wait).ok().filter(fits) {
        Some(wait) => {
            // Nothing owed before this request (the common case): what is left needs no
            // division, `wait` being `cost` intervals and `cost` within the limit.
            let remaining = if tat == now {
                rule.limit().saturating_sub(cost)
            } else {
                capacity.saturating_sub(wait) / interval
            };
            let outcome = RuleOutcome {
                allowed: true,
                remaining,
                reset_after_us: wait,
                retry_after_us: None,
            };
            (outcome, Some(now.saturating_add(wait)))
        }
        None => {
            let outcome = RuleOutcome {
                allowed: false,
                // Less than a unit's interval left (every refusal of one unit): none, without
                // a division.
                remaining: match capacity.saturating_sub(tat - now) {
                    left if left < interval => 0,
                    left => left / interval,
                },
                reset_after_us: tat - now,
                // A cost within the limit is refused only past the tolerance.
                retry_after_us: (cost <= rule.limit())
                    .then(|| u64::try_from(wait - u128::from(tolerance)).unwrap_or(u64::MAX)),
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
        // Every length to 64, distinct entries: each step of both gallops ends somewhere.
        let distinct: Vec<Vec<u64>> = (0..=64)
            .map(|n| (0..n).map(|i| 2 * i + 1).collect())
            .collect();
        let lengths = distinct.iter().map(Vec::as_slice);
        for log in logs.into_iter().chain([&long[..]]).chain(lengths) {
            for edge in 0..=210 {
                assert_eq!(
                    first_after(log, edge),
                    log.partition_point(|&t| t <= edge),
                    "{log:?} {edge}"
                );
            }
        }
    }

    /// What a sliding log says for no units, from its admission of `cost`, is what it says
    /// when asked for none: on logs before, across and after the window's edge, and before
    /// the clock has passed one window.
    #[test]
    fn a_sliding_log_settles_as_it_says_for_no_units() {
        let r = rule("10/10s");
        let logs: [&[u64]; 6] = [
            &[],
            &[S],
            &[S, 2 * S, 2 * S, 9 * S],
            &[3 * S, 12 * S, 19 * S],
            &[20 * S, 21 * S],
            &[25 * S],
        ];
        let mut admissions = 0;
        for log in logs {
            for now in [5 * S, 10 * S, 11 * S, 12 * S, 19 * S + 1, 22 * S, 40 * S] {
                for cost in 0..=4 {
                    let admitted = sliding_log(log, now, &r, cost);
                    if !admitted.allowed {
                        continue;
                    }
                    admissions += 1;
                    assert_eq!(
                        sliding_log_settled(&admitted, log, now, &r, cost),
                        sliding_log(log, now, &r, 0),
                        "{log:?} at {now} for {cost}"
                    );
                }
            }
        }
        assert!(admissions > 150, "{admissions} admissions");
    }

    /// The state recorded from an admitting outcome is the one the evaluation returned, for
    /// every window a state may be seen from (its own, the next, later) and every cost.
    #[test]
    fn a_sliding_window_records_the_state_its_admission_returned() {
        let r = rule("10/10s");
        let mut admissions = 0;
        for start in [0, 10 * S, 20 * S] {
            for (previous, count) in [(0, 0), (0, 3), (6, 0), (4, 2), (10, 0)] {
                let state = SlidingWindowState {
                    start,
                    previous,
                    count,
                };
                for now in [
                    10 * S,
                    10 * S + 1,
                    15 * S,
                    20 * S - 1,
                    20 * S,
                    27 * S + 500,
                    45 * S,
                ] {
                    for cost in 0..=4 {
                        let Some(state) = Some(state).filter(|s| s.start <= now) else {
                            continue;
                        };
                        let (outcome, next) = sliding_window(Some(state), now, &r, cost);
                        let Some(next) = next else { continue };
                        admissions += 1;
                        assert_eq!(
                            sliding_window_recorded(Some(state), now, &r, cost, &outcome),
                            next,
                            "{state:?} at {now} for {cost}"
                        );
                    }
                }
            }
        }
        let (outcome, next) = sliding_window(None, 3 * S, &r, 2);
        assert_eq!(
            sliding_window_recorded(None, 3 * S, &r, 2, &outcome),
            next.unwrap()
        );
        assert!(admissions > 100, "{admissions} admissions");
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let r = rule("10/10s");
        // 10 units in [0, 10 s), then at 15 s half of them still count: 5 fit.
        let prev = SlidingWindowState {
            start: 0,
            previous: 0,
            count: 10,
        };
        let (o, s) = sliding_window(Some(prev), 15 * S, &r, 5);
        assert!(o.allowed);
        assert_eq!(o.remaining, 0);
        assert_eq!(
            s,
            Some(SlidingWindowState {
                start: 10 * S,
                previous: 10,
                count: 5
            })
        );
        // One more is denied; it fits once the previous window's weight lets a unit go: at
        // 16 s (10 * 4/10 + 5 = 9).
        let (o, none) = sliding_window(s, 15 * S, &r, 1);
        assert!(!o.allowed);
        assert_eq!(none, None);
        assert_eq!(o.retry_after_us, Some(S));
        assert!(sliding_window(s, 16 * S, &r, 1).0.allowed);
        assert!(!sliding_window(s, 16 * S - 1, &r, 1).0.allowed);
        // Quota back when this window's count has faded too: the end of the next window.
        assert_eq!(o.reset_after_us, 15 * S);
    }

    #[test]
    fn sliding_window_retry_moves_to_the_next_window_when_this_one_is_full() {
        let r = rule("4/10s");
        let s = SlidingWindowState {
            start: 10 * S,
            previous: 0,
            count: 4,
        };
        let (o, _) = sliding_window(Some(s), 12 * S, &r, 1);
        assert!(!o.allowed);
        // Next window from 20 s: 4 * (10 - e) / 10 + 1 <= 4 once e >= 2.5 s: at 22.5 s.
        assert_eq!(o.retry_after_us, Some(10_500_000));
        assert!(sliding_window(Some(s), 22_500_000, &r, 1).0.allowed);
        assert!(!sliding_window(Some(s), 22_499_999, &r, 1).0.allowed);
        // A cost above the limit never fits.
        assert_eq!(sliding_window(None, 0, &r, 5).0.retry_after_us, None);
    }

    proptest::proptest! {
        /// The sliding window counter against the exact sliding log, on the same random
        /// traffic, each deciding on its own: the log never has more than `limit` units in a
        /// window; the counter fewer than `2 * limit` (its stated bound), and it denies only
        /// when the units it admitted since the previous window began, plus the cost, pass
        /// `limit`. `retry_after` is exact: a denied request waits exactly that long.
        #[test]
        fn sliding_window_stays_within_its_bound_of_the_log(
            limit in 1u64..20,
            window_ms in 1u64..50,
            gaps in proptest::collection::vec((0u64..30_000, 1u64..4), 1..300),
        ) {
            let r = Rule::new(limit, std::time::Duration::from_millis(window_ms)).unwrap();
            let w = r.window_us();
            let mut now = 1_000_000_000;
            let mut log: Vec<u64> = Vec::new();
            let mut state = None;
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (gap, cost) in gaps {
                now += gap;
                if sliding_log(&log, now, &r, cost).allowed {
                    log.extend(std::iter::repeat_n(now, usize::try_from(cost).unwrap()));
                }
                let live = log.iter().filter(|&&t| t + w > now).count() as u64;
                proptest::prop_assert!(live <= limit);

                let (outcome, next) = sliding_window(state, now, &r, cost);
                let start = now - now % w;
                let since = admitted
                    .iter()
                    .filter(|&&(t, _)| t + w >= start)
                    .map(|&(_, c)| c)
                    .sum::<u64>();
                if outcome.allowed {
                    state = next;
                    admitted.push((now, cost));
                    let in_window: u64 = admitted
                        .iter()
                        .filter(|&&(t, _)| t + w > now)
                        .map(|&(_, c)| c)
                        .sum();
                    proptest::prop_assert!(in_window < 2 * limit, "{in_window} units in a window of {limit}");
                } else {
                    proptest::prop_assert!(since + cost > limit, "denied with {since} + {cost} <= {limit}");
                    if let Some(wait) = outcome.retry_after_us {
                        proptest::prop_assert!(sliding_window(state, now + wait, &r, cost).0.allowed);
                        if wait > 0 {
                            proptest::prop_assert!(!sliding_window(state, now + wait - 1, &r, cost).0.allowed);
                        }
                    }
                }
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
