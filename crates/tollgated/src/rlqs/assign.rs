//! What an Envoy is assigned for a bucket: a token bucket at its share of the rate the bucket
//! can still sustain to the end of its window, and what that assignment can admit at most,
//! which the store is charged before the assignment is sent.

use std::time::Duration;

/// A token bucket as RLQS assigns it: it starts full (`max_tokens`) and gains
/// `tokens_per_fill` every `fill_interval`, up to `max_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TokenBucket {
    pub(crate) max_tokens: u32,
    pub(crate) tokens_per_fill: u32,
    pub(crate) fill_interval: Duration,
}

impl TokenBucket {
    /// A bucket admitting `rate` units a second (above 0), a fill about every `fill` (or
    /// one unit at a time, less often, for a slower rate): fine fills waste little when a
    /// bucket is replaced.
    pub(crate) fn for_rate(rate: f64, fill: Duration) -> TokenBucket {
        let per_fill = (rate * fill.as_secs_f64())
            .round()
            .clamp(1.0, f64::from(u32::MAX));
        let interval = Duration::from_secs_f64((per_fill / rate).clamp(1e-3, 3600.0));
        TokenBucket {
            max_tokens: per_fill as u32,
            tokens_per_fill: per_fill as u32,
            fill_interval: interval,
        }
    }

    /// A bucket of `units` that never refills within `span`.
    pub(crate) fn once(units: u32, span: Duration) -> TokenBucket {
        TokenBucket {
            max_tokens: units,
            tokens_per_fill: 1,
            fill_interval: span + Duration::from_secs(1),
        }
    }

    /// Units a second.
    pub(crate) fn rate(&self) -> f64 {
        f64::from(self.tokens_per_fill) / self.fill_interval.as_secs_f64()
    }

    /// The most its fills can add over `span` of its life, wherever the span starts: a fill
    /// at each of at most `ceil(span / fill_interval)` instants.
    pub(crate) fn fills_within(&self, span: Duration) -> u64 {
        let fills = span
            .as_nanos()
            .div_ceil(self.fill_interval.as_nanos().max(1));
        u64::try_from(fills)
            .unwrap_or(u64::MAX)
            .saturating_mul(u64::from(self.tokens_per_fill))
    }

    /// The longest whole number of fill intervals within `span`.
    pub(crate) fn whole_fills(&self, span: Duration) -> Duration {
        let whole = span.as_nanos() / self.fill_interval.as_nanos().max(1);
        self.fill_interval * u32::try_from(whole).unwrap_or(u32::MAX)
    }

    /// The least its fills add over `span` of its life, wherever the span starts.
    pub(crate) fn fills_surely_within(&self, span: Duration) -> u64 {
        let fills = span.as_nanos() / self.fill_interval.as_nanos().max(1);
        u64::try_from(fills)
            .unwrap_or(u64::MAX)
            .saturating_mul(u64::from(self.tokens_per_fill))
    }

    /// Whether `rate` is close enough to this bucket's to keep it (a data plane that is
    /// sent the same bucket again keeps its tokens; a new one starts full, and what the old
    /// one had charged and not filled is lost to rounding). A rate up to a tenth higher or a
    /// half lower keeps it: a bucket kept a little too fast spends the window's units a
    /// little early, which loses none of them; one replaced too often loses some each time.
    pub(crate) fn keeps(&self, rate: f64) -> bool {
        let mine = self.rate();
        rate <= mine * 1.1 && rate >= mine * 0.5
    }
}

/// The rate (units a second) an Envoy gets: its share of what the bucket can sustain until
/// its window ends (`room` units in `window_left`), no more than its demand allows it to use
/// (with room to grow), and all of it when it is the only one asking.
pub(crate) fn rate(room: u64, window_left: Duration, share: f64, demand: Option<f64>) -> f64 {
    let sustainable = room as f64 / window_left.as_secs_f64().max(1e-3);
    let mine = sustainable * share;
    match demand {
        // Twice what it asked for, and a unit a second: enough to see that it wants more.
        Some(demand) => mine.min(demand * 2.0 + 1.0),
        None => mine,
    }
}

/// `demand` out of the total demand of the Envoys sharing a bucket here (`others`: theirs),
/// an equal share when nobody asks.
pub(crate) fn share(demand: f64, others: impl IntoIterator<Item = f64>) -> f64 {
    let mut total = demand;
    let mut count = 1.0;
    for d in others {
        total += d;
        count += 1.0;
    }
    if total > 0.0 {
        demand / total
    } else {
        1.0 / count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TENTH: Duration = Duration::from_millis(100);

    #[test]
    fn a_bucket_refills_about_every_tenth_of_a_second_at_its_rate() {
        let b = TokenBucket::for_rate(100.0, TENTH);
        assert_eq!((b.max_tokens, b.tokens_per_fill), (10, 10));
        assert_eq!(b.fill_interval, Duration::from_millis(100));
        assert!((b.rate() - 100.0).abs() < 1e-9);
        // Slow rates: one token at a time, less often.
        let slow = TokenBucket::for_rate(2.0, TENTH);
        assert_eq!(slow.tokens_per_fill, 1);
        assert_eq!(slow.fill_interval, Duration::from_millis(500));
    }

    #[test]
    fn what_a_bucket_can_admit_over_a_span_is_counted_up() {
        let b = TokenBucket::for_rate(100.0, TENTH);
        assert_eq!(b.fills_within(Duration::from_millis(200)), 20);
        assert_eq!(b.fills_within(Duration::from_millis(201)), 30);
        assert_eq!(b.fills_within(Duration::ZERO), 0);
        assert_eq!(b.fills_surely_within(Duration::from_millis(201)), 20);
        assert_eq!(b.fills_surely_within(Duration::from_millis(99)), 0);
        let once = TokenBucket::once(7, Duration::from_secs(2));
        assert_eq!(once.fills_within(Duration::from_secs(2)), 1);
    }

    #[test]
    fn rates_follow_room_share_and_demand() {
        // 600 left for 60 s: 10/s for the bucket, half each for two Envoys.
        let half = share(50.0, [50.0]);
        assert_eq!(half, 0.5);
        assert_eq!(rate(600, Duration::from_secs(60), half, Some(50.0)), 5.0);
        // One goes quiet: the other has it all.
        let all = share(50.0, [0.0]);
        assert_eq!(rate(600, Duration::from_secs(60), all, Some(50.0)), 10.0);
        // An Envoy asking little gets what it asks, doubled, not the whole room.
        assert_eq!(rate(600, Duration::from_secs(60), 1.0, Some(2.0)), 5.0);
        // Nobody asking yet: equal shares.
        assert_eq!(share(0.0, [0.0, 0.0]), 1.0 / 3.0);
        let ten = TokenBucket::for_rate(10.0, TENTH);
        assert!(ten.keeps(10.5) && ten.keeps(5.0));
        assert!(!ten.keeps(12.0) && !ten.keeps(4.9));
    }
}
