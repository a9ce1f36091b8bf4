//! Per-identity overrides, found by their limiter key's bytes (see `crate::OverrideStore`).

use std::{
    collections::HashMap,
    hash::BuildHasher,
    sync::{
        RwLock,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use smallvec::SmallVec;

use crate::{
    INLINE_RULES, Override, OverridePage, StoreError, StoreErrorKind,
    overrides::{Pager, apply},
    page::PageCursor,
    rule::Rule,
    store::{CheckRequest, LimiterRequest},
};

/// How many maps the overrides are spread over: checks of different keys on different threads
/// rarely share a lock.
const SHARDS: usize = 16;

/// The memory store's fast keyed hash (a key is hashed once more to find its map, and once in
/// it: SipHash would cost more than the rest of the look-up).
type Hasher = foldhash::fast::RandomState;

type Map = RwLock<HashMap<Box<[u8]>, Kept, Hasher>>;

/// An override and the index it is listed under (engines of different prefixes may share a
/// store: each lists its own).
struct Kept {
    entry: Override,
    index: Box<str>,
}

/// The overrides of one store, at most `max` of them, spread over [`SHARDS`] maps by key.
pub(super) struct Overrides {
    maps: Box<[Map]>,
    hasher: Hasher,
    /// An override was ever set: until then a check reads nothing (no lock).
    any: AtomicBool,
    /// How many are kept, over every map.
    len: AtomicUsize,
    max: usize,
}

/// A check's rules with the overrides applied, on the stack for most checks.
pub(super) type Rules = SmallVec<[Rule; INLINE_RULES]>;

impl Overrides {
    pub(super) fn new(max: usize) -> Overrides {
        Overrides {
            maps: (0..SHARDS).map(|_| RwLock::default()).collect(),
            hasher: Hasher::default(),
            any: AtomicBool::new(false),
            len: AtomicUsize::new(0),
            max: max.max(1),
        }
    }

    /// The map `key` lives in.
    fn map(&self, key: &[u8]) -> &Map {
        let at = self.hasher.hash_one(key) as usize % SHARDS;
        &self.maps[at]
    }

    /// Whether `request` may count by an override: one of its limiters takes them, and one
    /// was ever set.
    #[inline]
    pub(super) fn may_apply(&self, request: &CheckRequest<'_>) -> bool {
        self.any.load(Ordering::Acquire) && request.limiters.iter().any(|l| l.overrides.is_some())
    }

    /// Every rule of `request`, with the limits of the live overrides made for them, into
    /// `rules`; each limit an override set into `limits` (rule place, limit). False if none
    /// applied.
    pub(super) fn apply(
        &self,
        request: &CheckRequest<'_>,
        now: u64,
        rules: &mut Rules,
        limits: &mut Vec<(usize, u64)>,
    ) -> bool {
        let mut applied = false;
        for l in request.limiters {
            let start = rules.len();
            let Some(fingerprint) = l.overrides else {
                rules.extend_from_slice(l.rules);
                continue;
            };
            let map = self.map(l.key_bytes());
            let map = map.read().unwrap_or_else(|e| e.into_inner());
            let found = map.get(l.key_bytes()).map(|k| &k.entry).filter(|o| {
                o.fingerprint == fingerprint.get()
                    && o.limits.len() == l.rules.len()
                    && o.live_at(now)
            });
            match found {
                Some(o) => {
                    rules.extend(apply(l.rules, &o.limits));
                    let set = o.limits.iter().enumerate().filter(|(_, limit)| **limit > 0);
                    limits.extend(set.map(|(i, &limit)| (start + i, limit)));
                    applied = true;
                }
                None => rules.extend_from_slice(l.rules),
            }
        }
        applied
    }

    pub(super) fn set(
        &self,
        limiter: &LimiterRequest<'_>,
        (entry, index): (Override, &str),
        now: u64,
    ) -> Result<(), StoreError> {
        let key = limiter.key_bytes();
        if self.len.load(Ordering::Acquire) >= self.max {
            // Full: the ended ones go first, from every map.
            for map in self.maps.iter() {
                let mut map = map.write().unwrap_or_else(|e| e.into_inner());
                let before = map.len();
                map.retain(|_, k| k.entry.live_at(now));
                self.len.fetch_sub(before - map.len(), Ordering::AcqRel);
            }
        }
        let mut map = self.map(key).write().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(key) {
            // Counted before it is kept, so that concurrent sets never pass the most together.
            if self.len.fetch_add(1, Ordering::AcqRel) >= self.max {
                self.len.fetch_sub(1, Ordering::AcqRel);
                return Err(StoreError::new(
                    StoreErrorKind::Capacity,
                    format!(
                        "the memory store holds {} overrides, its most; remove some first",
                        self.max
                    ),
                ));
            }
        }
        let index = index.into();
        map.insert(key.into(), Kept { entry, index });
        self.any.store(true, Ordering::Release);
        Ok(())
    }

    pub(super) fn remove(&self, limiter: &LimiterRequest<'_>, now: u64) -> bool {
        let key = limiter.key_bytes();
        let removed = self
            .map(key)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if removed.is_some() {
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
        removed.is_some_and(|k| k.entry.live_at(now))
    }

    /// The live overrides listed under `index`, by policy, limiter and value.
    pub(super) fn list(&self, index: &str, now: u64) -> Vec<Override> {
        let mut all: Vec<Override> = Vec::new();
        for map in self.maps.iter() {
            let map = map.read().unwrap_or_else(|e| e.into_inner());
            let listed = map.values().filter(|k| &*k.index == index);
            all.extend(listed.map(|k| &k.entry).filter(|o| o.live_at(now)).cloned());
        }
        all.sort_by(|a, b| {
            (&a.policy, &a.limiter, &a.value).cmp(&(&b.policy, &b.limiter, &b.value))
        });
        all
    }

    /// One page of the live overrides under `index` (see `OverrideStore::overrides_page`):
    /// each map read once, only the page's overrides cloned.
    pub(super) fn page(
        &self,
        index: &str,
        now: u64,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> OverridePage {
        let mut pager = Pager::new(after, limit);
        for map in self.maps.iter() {
            let map = map.read().unwrap_or_else(|e| e.into_inner());
            let listed = map.values().filter(|k| &*k.index == index);
            listed
                .map(|k| &k.entry)
                .filter(|o| o.live_at(now))
                .for_each(|o| pager.feed(o));
        }
        pager.page()
    }
}

/// `request`'s limiters over `rules` (what [`Overrides::apply`] wrote for them).
pub(super) fn over<'a>(
    request: &CheckRequest<'a>,
    rules: &'a [Rule],
) -> SmallVec<[LimiterRequest<'a>; 4]> {
    let mut start = 0;
    request
        .limiters
        .iter()
        .map(|l| {
            let end = start + l.rules.len();
            let limiter = LimiterRequest {
                rules: &rules[start..end],
                ..*l
            };
            start = end;
            limiter
        })
        .collect()
}
