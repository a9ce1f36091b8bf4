//! Per-identity overrides, found by their limiter key's bytes (see `crate::OverrideStore`).

use std::{
    collections::HashMap,
    sync::{
        RwLock,
        atomic::{AtomicBool, Ordering},
    },
};

use smallvec::SmallVec;

use crate::{
    INLINE_RULES, Override, StoreError, StoreErrorKind,
    overrides::apply,
    rule::Rule,
    store::{CheckRequest, LimiterRequest},
};

/// The overrides of one store, at most `max` of them.
pub(super) struct Overrides {
    map: RwLock<HashMap<Box<[u8]>, Override>>,
    /// An override was ever set: until then a check reads nothing (no lock).
    any: AtomicBool,
    max: usize,
}

/// A check's rules with the overrides applied, on the stack for most checks.
pub(super) type Rules = SmallVec<[Rule; INLINE_RULES]>;

impl Overrides {
    pub(super) fn new(max: usize) -> Overrides {
        Overrides {
            map: RwLock::new(HashMap::new()),
            any: AtomicBool::new(false),
            max: max.max(1),
        }
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
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut applied = false;
        for l in request.limiters {
            let start = rules.len();
            let found = l.overrides.and_then(|fingerprint| {
                map.get(l.key_bytes()).filter(|o| {
                    o.fingerprint == fingerprint.get()
                        && o.limits.len() == l.rules.len()
                        && o.live_at(now)
                })
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
        entry: Override,
        now: u64,
    ) -> Result<(), StoreError> {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let key = limiter.key_bytes();
        if map.len() >= self.max && !map.contains_key(key) {
            map.retain(|_, o| o.live_at(now));
            if map.len() >= self.max {
                return Err(StoreError::new(
                    StoreErrorKind::Capacity,
                    format!(
                        "the memory store holds {} overrides, its most; remove some first",
                        self.max
                    ),
                ));
            }
        }
        map.insert(key.into(), entry);
        self.any.store(true, Ordering::Release);
        Ok(())
    }

    pub(super) fn remove(&self, limiter: &LimiterRequest<'_>, now: u64) -> bool {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.remove(limiter.key_bytes())
            .is_some_and(|o| o.live_at(now))
    }

    /// The live overrides, by policy, limiter and value.
    pub(super) fn list(&self, now: u64) -> Vec<Override> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<Override> = map.values().filter(|o| o.live_at(now)).cloned().collect();
        all.sort_by(|a, b| {
            (&a.policy, &a.limiter, &a.value).cmp(&(&b.policy, &b.limiter, &b.value))
        });
        all
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
