//! A sliding log's entries: the instants of a limiter's admitted units, oldest first.

use std::ops::{Deref, Range};

/// The entries are a vector read from `start`: those before it have left. So the live entries
/// are always one slice, read in place by every check (a ring buffer would have to be made
/// contiguous first, moving its entries whenever it wraps). The entries that left are dropped
/// when a push finds the vector full and at least half of it gone, moving the live ones once;
/// otherwise the vector grows. Each entry is moved at most once per entry that left before it,
/// and while entries keep coming the vector holds at most about twice the live ones (like a
/// ring's, its capacity does not shrink when they stop).
#[derive(Debug, Default)]
pub(super) struct Log {
    entries: Vec<u64>,
    start: usize,
}

impl Deref for Log {
    type Target = [u64];

    #[inline(always)]
    fn deref(&self) -> &[u64] {
        // `start <= entries.len()` always holds: the bounds check never fails.
        &self.entries[self.start..]
    }
}

impl Log {
    /// Forgets every entry, keeping the allocation.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.start = 0;
    }

    /// Drops the entries at or before `edge` (they left the longest window).
    #[inline]
    pub(super) fn leave_until(&mut self, edge: u64) {
        let left = self.iter().take_while(|&&t| t <= edge).count();
        self.start += left;
        if self.start == self.entries.len() {
            self.clear();
        }
    }

    /// Appends `n` entries at `t`, which no entry is later than.
    #[inline]
    pub(super) fn push_n(&mut self, t: u64, n: usize) {
        debug_assert!(self.last().is_none_or(|&last| last <= t));
        if self.entries.len() + n > self.entries.capacity()
            && self.start > 0
            && self.start >= self.len()
        {
            self.entries.drain(..self.start);
            self.start = 0;
        }
        self.entries.extend(std::iter::repeat_n(t, n));
    }

    /// Inserts `n` entries at `t` where they keep the log sorted.
    pub(super) fn insert_n(&mut self, t: u64, n: usize) {
        let at = self.start + self.partition_point(|&e| e <= t);
        self.entries
            .splice(at..at, std::iter::repeat_n(t, n))
            .for_each(drop);
    }

    /// Removes the entries at `range` (indices into the live entries).
    pub(super) fn remove(&mut self, range: Range<usize>) {
        self.entries
            .drain(self.start + range.start..self.start + range.end);
        if self.start == self.entries.len() {
            self.clear();
        }
    }

    /// Removes the newest `n` entries.
    pub(super) fn remove_newest(&mut self, n: usize) {
        let len = self.len();
        self.remove(len - n.min(len)..len);
    }
}

#[cfg(test)]
mod tests {
    use super::Log;

    #[test]
    fn entries_leave_from_the_front_and_the_vector_stays_within_twice_the_live_ones() {
        let mut log = Log::default();
        // A steady log: one entry in, the oldest out, for a long time.
        for t in 0..10_000u64 {
            log.push_n(t, 1);
            if let Some(edge) = t.checked_sub(100) {
                log.leave_until(edge);
            }
            assert_eq!(log.first(), Some(&t.saturating_sub(99)));
            assert_eq!(log.last(), Some(&t));
            assert!(log.windows(2).all(|w| w[0] < w[1]));
        }
        assert_eq!(log.len(), 100);
        assert!(
            log.entries.capacity() <= 256,
            "{} for 100 live entries",
            log.entries.capacity()
        );
    }

    #[test]
    fn inserts_and_removals_keep_it_sorted() {
        let mut log = Log::default();
        log.push_n(10, 2);
        log.push_n(20, 1);
        log.leave_until(10);
        assert_eq!(&*log, &[20]);
        log.insert_n(15, 2);
        log.insert_n(30, 1);
        log.insert_n(5, 1);
        assert_eq!(&*log, &[5, 15, 15, 20, 30]);
        log.remove(1..3);
        assert_eq!(&*log, &[5, 20, 30]);
        log.remove_newest(2);
        assert_eq!(&*log, &[5]);
        log.remove_newest(5);
        assert!(log.is_empty());
        assert_eq!((log.start, log.entries.len()), (0, 0));
    }
}
