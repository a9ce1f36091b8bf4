//! The top limited identities: a Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005),
//! kept over two rotating generations so that it tells about the recent past.
//!
//! A sketch of capacity `k` holds at most `k` keys whatever the stream. Each kept key has a
//! count that never underestimates its true count and overestimates it by at most its
//! `error`, itself at most `N / k` after `N` insertions; and every key inserted more than
//! `N / k` times is kept. So the heavy hitters are always there, with bounded memory and an
//! insertion that costs a hash look-up (and, for a new key in a full sketch, a scan of `k`
//! slots).

use std::{collections::HashMap, hash::Hash};

/// One kept key: its count (an overestimate by at most `error`) and the latest value given
/// with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    pub(crate) count: u64,
    pub(crate) error: u64,
}

/// A Space-Saving sketch of at most `capacity` keys.
#[derive(Debug)]
pub(crate) struct SpaceSaving<K, V> {
    capacity: usize,
    slots: Vec<Slot<K, V>>,
    index: HashMap<K, usize>,
    total: u64,
}

impl<K: Hash + Eq + Clone, V> SpaceSaving<K, V> {
    pub(crate) fn new(capacity: usize) -> SpaceSaving<K, V> {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            slots: Vec::with_capacity(capacity),
            index: HashMap::with_capacity(capacity),
            total: 0,
        }
    }

    /// Counts one occurrence of `key`; `value` replaces the one kept with it.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        self.total += 1;
        if let Some(&i) = self.index.get(&key) {
            let slot = &mut self.slots[i];
            slot.count += 1;
            slot.value = value;
            return;
        }
        if self.slots.len() < self.capacity {
            self.index.insert(key.clone(), self.slots.len());
            self.slots.push(Slot {
                key,
                value,
                count: 1,
                error: 0,
            });
            return;
        }
        // Full: the new key takes the place of the least counted one, inheriting its count
        // as the possible overestimate.
        let Some((i, min)) = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.count))
            .min_by_key(|&(_, c)| c)
        else {
            return;
        };
        self.index.remove(&self.slots[i].key);
        self.index.insert(key.clone(), i);
        self.slots[i] = Slot {
            key,
            value,
            count: min + 1,
            error: min,
        };
    }

    /// The insertions counted since the sketch was made.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// What a key that is not kept may have been counted at most: the smallest count when
    /// the sketch is full, 0 otherwise.
    pub(crate) fn floor(&self) -> u64 {
        if self.slots.len() < self.capacity {
            0
        } else {
            self.slots.iter().map(|s| s.count).min().unwrap_or(0)
        }
    }

    pub(crate) fn get(&self, key: &K) -> Option<&Slot<K, V>> {
        self.index.get(key).map(|&i| &self.slots[i])
    }

    pub(crate) fn slots(&self) -> &[Slot<K, V>] {
        &self.slots
    }
}

/// Two generations of a sketch: the current one takes insertions, the previous one is the
/// generation before. Rotating every `period` makes the answer cover the last `period` to
/// `2 * period`.
#[derive(Debug)]
pub(crate) struct Recent<K, V> {
    current: SpaceSaving<K, V>,
    previous: SpaceSaving<K, V>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Recent<K, V> {
    pub(crate) fn new(capacity: usize) -> Recent<K, V> {
        Recent {
            current: SpaceSaving::new(capacity),
            previous: SpaceSaving::new(capacity),
            capacity,
        }
    }

    pub(crate) fn insert(&mut self, key: K, value: V) {
        self.current.insert(key, value);
    }

    /// Starts a new generation; the oldest is forgotten.
    pub(crate) fn rotate(&mut self) {
        self.previous = std::mem::replace(&mut self.current, SpaceSaving::new(self.capacity));
    }

    /// The `n` keys counted most over both generations, most first. A key kept in one
    /// generation only may have been counted in the other up to that one's floor: that much
    /// is added to its count and its error, so counts stay overestimates and `count - error`
    /// a lower bound.
    pub(crate) fn top(&self, n: usize) -> Vec<Slot<K, V>> {
        let mut merged: HashMap<&K, Slot<K, V>> = HashMap::new();
        for (this, other) in [
            (&self.current, &self.previous),
            (&self.previous, &self.current),
        ] {
            for slot in this.slots() {
                if merged.contains_key(&slot.key) {
                    continue;
                }
                let (count, error) = match other.get(&slot.key) {
                    Some(o) => (slot.count + o.count, slot.error + o.error),
                    None => (slot.count + other.floor(), slot.error + other.floor()),
                };
                merged.insert(
                    &slot.key,
                    Slot {
                        key: slot.key.clone(),
                        value: slot.value.clone(),
                        count,
                        error,
                    },
                );
            }
        }
        let mut top: Vec<Slot<K, V>> = merged.into_values().collect();
        // Ties broken by the guaranteed part, so the order is stable between polls.
        top.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then((b.count - b.error).cmp(&(a.count - a.error)))
        });
        top.truncate(n);
        top
    }

    /// Insertions counted over both generations.
    pub(crate) fn total(&self) -> u64 {
        self.current.total() + self.previous.total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so the streams are the same every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// The sketch's guarantee, on skewed and adversarial streams: every kept count is an
    /// overestimate by at most its error; every error is at most N / k; every key counted
    /// more than N / k times is kept; the sketch never holds more than k keys.
    #[test]
    fn space_saving_keeps_its_guarantee() {
        let k = 16;
        let streams: Vec<(&str, Vec<u64>)> = {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            // Zipf-like: key i drawn with weight ~ 1/(i+1), over 500 keys.
            let weights: Vec<f64> = (0..500).map(|i| 1.0 / f64::from(i + 1)).collect();
            let sum: f64 = weights.iter().sum();
            let skewed = (0..20_000)
                .map(|_| {
                    let mut x = (rng.next() % 1_000_000) as f64 / 1_000_000.0 * sum;
                    let mut key = 0;
                    for (i, w) in weights.iter().enumerate() {
                        if x < *w {
                            key = i as u64;
                            break;
                        }
                        x -= w;
                    }
                    key
                })
                .collect();
            // Heavy hitters hidden in a flood of keys seen once each (address rotation).
            let mut flood = Vec::new();
            for i in 0..10_000u64 {
                flood.push(1_000_000 + i);
                if i % 5 == 0 {
                    flood.push(7);
                }
                if i % 9 == 0 {
                    flood.push(8);
                }
            }
            vec![("skewed", skewed), ("flood", flood)]
        };
        for (name, stream) in streams {
            let mut sketch = SpaceSaving::new(k);
            let mut exact: HashMap<u64, u64> = HashMap::new();
            for &key in &stream {
                sketch.insert(key, ());
                *exact.entry(key).or_default() += 1;
            }
            let n = stream.len() as u64;
            assert_eq!(sketch.total(), n);
            assert!(sketch.slots().len() <= k, "{name}: more than k keys");
            let bound = n / k as u64;
            for slot in sketch.slots() {
                let truth = exact[&slot.key];
                assert!(slot.count >= truth, "{name}: key {} undercounted", slot.key);
                assert!(
                    slot.count - slot.error <= truth,
                    "{name}: key {}: count {} - error {} > true {truth}",
                    slot.key,
                    slot.count,
                    slot.error
                );
                assert!(slot.error <= bound, "{name}: error {} > N/k", slot.error);
            }
            let heavy: Vec<u64> = exact
                .iter()
                .filter(|&(_, &c)| c > bound)
                .map(|(&key, _)| key)
                .collect();
            assert!(!heavy.is_empty(), "{name}: the stream has heavy hitters");
            for key in heavy {
                assert!(sketch.get(&key).is_some(), "{name}: heavy key {key} lost");
            }
        }
    }

    #[test]
    fn the_latest_value_is_kept_with_its_key() {
        let mut sketch = SpaceSaving::new(2);
        sketch.insert("a", "1/1m");
        sketch.insert("a", "10/1h");
        assert_eq!(
            sketch.get(&"a").map(|s| (s.count, s.value)),
            Some((2, "10/1h"))
        );
    }

    #[test]
    fn recent_generations_merge_and_age_out() {
        let mut recent = Recent::new(4);
        for _ in 0..5 {
            recent.insert("old", ());
        }
        recent.rotate();
        for _ in 0..3 {
            recent.insert("new", ());
        }
        recent.insert("old", ());
        let top = recent.top(10);
        assert_eq!(
            top.iter().map(|s| (s.key, s.count)).collect::<Vec<_>>(),
            [("old", 6), ("new", 3)]
        );
        assert_eq!(recent.total(), 9);
        // Two rotations later, nothing of the old generations is left.
        recent.rotate();
        recent.rotate();
        assert!(recent.top(10).is_empty());
        assert_eq!(recent.total(), 0);

        // A key missing from a full generation may have been there up to its floor.
        let mut recent = Recent::new(1);
        recent.insert("a", ());
        recent.insert("a", ());
        recent.rotate();
        recent.insert("b", ());
        let b = recent.top(10).into_iter().find(|s| s.key == "b").unwrap();
        assert_eq!((b.count, b.error), (3, 2));
    }
}
