//! The last 15 minutes, one bucket per second: decisions per series (policy, reason,
//! allowed) and the store's check totals, from readings of the exposition taken once a
//! second. Bounded: at most [`SECONDS`] buckets, and one series per (policy, reason,
//! allowed) of the configuration.

use std::collections::{HashMap, VecDeque};

use super::exposition::{Reading, SeriesName, StoreTotals};

/// How many seconds the chart covers.
pub(crate) const SECONDS: usize = 15 * 60;
/// How far back store latency and errors are measured.
pub(crate) const STORE_WINDOW: u64 = 60;

/// One second's decisions: (series id, count), only series that counted.
#[derive(Debug, Default)]
struct Second {
    t: u64,
    counts: Vec<(usize, u64)>,
}

#[derive(Debug, Default)]
pub(crate) struct History {
    names: Vec<SeriesName>,
    ids: HashMap<SeriesName, usize>,
    /// The cumulative count of each series at the last reading.
    last: Vec<u64>,
    seconds: VecDeque<Second>,
    /// (second, store totals), the last [`STORE_WINDOW`] seconds and one more.
    store: VecDeque<(u64, StoreTotals)>,
    pub(crate) evictions: Option<u64>,
}

/// One series over the window: its name and a count per second.
#[derive(Debug)]
pub(crate) struct Series<'a> {
    pub(crate) name: &'a SeriesName,
    pub(crate) counts: Vec<u64>,
    pub(crate) total: u64,
}

impl History {
    /// Takes the reading made at second `t` (Unix time). Decisions counted since the last
    /// reading go to `t`; a series first seen now counted all of its decisions since then,
    /// as it did not exist before.
    pub(crate) fn record(&mut self, t: u64, reading: Reading) {
        let mut counts = Vec::new();
        for (name, total) in reading.decisions {
            let id = match self.ids.get(&name) {
                Some(&id) => id,
                None => {
                    let id = self.names.len();
                    self.ids.insert(name.clone(), id);
                    self.names.push(name);
                    self.last.push(0);
                    id
                }
            };
            let delta = total.saturating_sub(self.last[id]);
            self.last[id] = total;
            // The counters start at zero with the server: the first reading's totals are
            // the decisions since the start, counted in its second like any later delta.
            if delta > 0 {
                counts.push((id, delta));
            }
        }
        match self.seconds.back_mut() {
            // Two readings in one second (a late tick, then an on-time one): one bucket.
            Some(last) if last.t >= t => {
                for (id, n) in counts {
                    match last.counts.iter_mut().find(|(i, _)| *i == id) {
                        Some((_, c)) => *c += n,
                        None => last.counts.push((id, n)),
                    }
                }
            }
            _ => self.seconds.push_back(Second { t, counts }),
        }
        while self
            .seconds
            .front()
            .is_some_and(|s| s.t + SECONDS as u64 <= t)
        {
            self.seconds.pop_front();
        }
        self.store.push_back((t, reading.check));
        while self
            .store
            .front()
            .is_some_and(|(s, _)| s + STORE_WINDOW < t)
        {
            self.store.pop_front();
        }
        self.evictions = reading.evictions;
    }

    /// The seconds after `since` up to the last reading (at most [`SECONDS`] of them), and
    /// every series that counted in the window, with one count per second of them (0 for a
    /// second without a reading) and its total over the whole window.
    pub(crate) fn series(&self, since: Option<u64>) -> (Vec<u64>, Vec<Series<'_>>) {
        let Some(last) = self.seconds.back().map(|s| s.t) else {
            return (Vec::new(), Vec::new());
        };
        let first = last + 1 - (SECONDS as u64).min(last + 1);
        let from = since.map_or(first, |s| s.saturating_add(1).max(first));
        let times: Vec<u64> = (from..=last).collect();
        let mut by_id: HashMap<usize, Series<'_>> = HashMap::new();
        for second in &self.seconds {
            for &(id, n) in &second.counts {
                let series = by_id.entry(id).or_insert_with(|| Series {
                    name: &self.names[id],
                    counts: vec![0; times.len()],
                    total: 0,
                });
                series.total += n;
                if second.t >= from {
                    series.counts[(second.t - from) as usize] += n;
                }
            }
        }
        let mut series: Vec<Series<'_>> = by_id.into_values().collect();
        series.sort_by(|a, b| a.name.cmp(b.name));
        (times, series)
    }

    /// The store totals now and [`STORE_WINDOW`] seconds ago (or as far back as there are).
    pub(crate) fn store_window(&self) -> Option<(&StoreTotals, &StoreTotals, u64)> {
        let (t_then, then) = self.store.front()?;
        let (t_now, now) = self.store.back()?;
        Some((now, then, t_now - t_then))
    }

    /// The cumulative store totals at the last reading.
    pub(crate) fn store_now(&self) -> Option<&StoreTotals> {
        self.store.back().map(|(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(decisions: &[(&str, &str, bool, u64)]) -> Reading {
        Reading {
            decisions: decisions
                .iter()
                .map(|&(policy, reason, allowed, n)| {
                    (
                        SeriesName {
                            policy: policy.into(),
                            reason: reason.into(),
                            allowed,
                        },
                        n,
                    )
                })
                .collect(),
            ..Reading::default()
        }
    }

    #[test]
    fn counts_per_second_come_from_the_deltas_of_the_totals() {
        let mut h = History::default();
        // The first reading counts everything since the server started (its counters start at
        // zero): a check answered before the first tick is not lost.
        h.record(100, reading(&[("p", "ok", true, 5)]));
        h.record(101, reading(&[("p", "ok", true, 8)]));
        // A series that appears counted all its decisions since the last reading.
        h.record(
            103,
            reading(&[("p", "ok", true, 8), ("p", "rate_limited", false, 2)]),
        );
        // A second reading within second 103 adds to it.
        h.record(
            103,
            reading(&[("p", "ok", true, 9), ("p", "rate_limited", false, 2)]),
        );
        let (times, series) = h.series(Some(99));
        assert_eq!(times, [100, 101, 102, 103]);
        let got: Vec<_> = series
            .iter()
            .map(|s| (s.name.reason.as_str(), s.counts.clone(), s.total))
            .collect();
        assert_eq!(
            got,
            [
                ("ok", vec![5, 3, 0, 1], 9),
                ("rate_limited", vec![0, 0, 0, 2], 2)
            ]
        );
        // Since the last second seen: nothing new, totals still over the window.
        let (times, series) = h.series(Some(103));
        assert!(times.is_empty());
        assert_eq!(series[0].total, 9);
    }

    #[test]
    fn the_window_is_bounded() {
        let mut h = History::default();
        for t in 0..(3 * SECONDS as u64) {
            h.record(t, reading(&[("p", "ok", true, t)]));
        }
        assert_eq!(h.seconds.len(), SECONDS);
        let (times, series) = h.series(None);
        assert_eq!(times.len(), SECONDS);
        assert_eq!(series[0].total, SECONDS as u64);
        assert!(h.store.len() <= STORE_WINDOW as usize + 1);
        let (_, _, span) = h.store_window().unwrap();
        assert_eq!(span, STORE_WINDOW);
    }
}
