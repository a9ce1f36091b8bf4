//! The local over-limit cache: denials Redis gave, remembered until they end, so that the
//! checks that would meet them again are denied here without a call.
//!
//! When Redis denies a check, each denying limiter whose rules said when they would admit is
//! remembered as "denies `cost` units until T" (T = when the call was sent + the longest
//! `retry_after` of its denying rules; sending time, not reply time, so T is never later than
//! Redis's). Until T less a margin ([`margin_us`]), a check that needs that limiter (same key,
//! same rules) with the same cost is denied here. A live ban that blocked a check is
//! remembered the same way, for the same set of ban keys, until it ends.
//!
//! Sound because what Redis counted cannot shrink before T: sliding-log entries leave at
//! their own time (the earliest that matters at T), a fixed window's count only grows until
//! the window ends, a GCRA timestamp only moves forward, a ban only ends at its deadline. Only
//! a reset or an unban moves them back: through this store they clear the entries they
//! concern; done elsewhere (another instance), this one keeps denying until T. On a Cluster,
//! a denial may have counted another check's reservation that was undone since: an extra
//! denial, as in the residual window. The cache never admits, so it can never over-admit.
//!
//! Only the same cost: a smaller one may fit, a larger one would wait longer than the
//! `retry_after` Redis gave, which stays exact (for a sliding log, the instant the entries
//! that must leave have left). An admission through this store forgets its limiters (their
//! numbers moved).
//!
//! A local denial has Redis's shape: every rule of every limiter as Redis last reported it
//! (the limiters that did not deny: from the same denial), `reset_after` and `retry_after`
//! shortened by the time since. Approximated: `remaining` and a rule that did not deny are
//! as Redis reported them then; what other instances admitted since (with a smaller cost),
//! and entries of a rule that did not deny that left its window since, are not seen, and the
//! `retry_after` does not grow for what other instances admitted. A check is answered here
//! only when every limiter it needs has an entry, at least one of them denies it, and it
//! cannot ban (a check that may write a ban goes to Redis, which bans; the ban then blocks,
//! and that is cached).
//!
//! Memory is bounded: two direct-mapped tables of [`LIMITER_SLOTS`] and [`BAN_SLOTS`] entries;
//! a key takes the slot its hash names, replacing whatever was there (a lost entry costs a
//! call, nothing else).

use std::{
    collections::hash_map::RandomState,
    hash::BuildHasher,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tollgate::{CheckRequest, LimiterRequest, Rule, Verdict, algorithm::RuleOutcome};

/// Limiter entries kept at most.
pub(crate) const LIMITER_SLOTS: usize = 4096;
/// Ban entries kept at most.
pub(crate) const BAN_SLOTS: usize = 1024;

/// Whether `plan` holds a concurrency limit.
fn has_leases(plan: &CheckRequest<'_>) -> bool {
    plan.limiters.iter().any(LimiterRequest::is_concurrent)
}

/// How long before a remembered denial ends the cache stops answering for it: 1 ms plus
/// 0.1 % of its length, for clock rates that differ between this host and Redis's.
pub(crate) fn margin_us(length_us: u64) -> u64 {
    1_000 + length_us / 1_000
}

/// One limiter as Redis last described it in a denial.
struct LimiterEntry {
    key: Box<str>,
    rules: Box<[Rule]>,
    /// Each rule's outcome, as Redis reported it at `seen_us`.
    outcomes: Box<[RuleOutcome]>,
    /// When the call was sent (the cache's clock).
    seen_us: u64,
    /// This limiter denies this many units until its end; `None`: it did not deny,
    /// and its outcomes only describe it, until the end of the denial it came with.
    denies: Option<u64>,
    /// That end less the margin: answers are given before this instant only.
    answer_until_us: u64,
}

/// A live ban over a set of ban keys.
struct BanEntry {
    keys: Box<[Box<str>]>,
    until_us: u64,
    answer_until_us: u64,
}

/// See the module docs.
pub(crate) struct LocalCache {
    limiters: Box<[Mutex<Option<LimiterEntry>>]>,
    bans: Box<[Mutex<Option<BanEntry>>]>,
    hasher: RandomState,
    answered: AtomicU64,
}

impl LocalCache {
    pub(crate) fn new() -> LocalCache {
        LocalCache {
            limiters: (0..LIMITER_SLOTS).map(|_| Mutex::new(None)).collect(),
            bans: (0..BAN_SLOTS).map(|_| Mutex::new(None)).collect(),
            hasher: RandomState::new(),
            answered: AtomicU64::new(0),
        }
    }

    /// Checks answered here so far.
    pub(crate) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn limiter_slot(&self, key: &str) -> std::sync::MutexGuard<'_, Option<LimiterEntry>> {
        let at = self.index(key.as_bytes(), self.limiters.len());
        self.limiters[at].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ban_slot(&self, keys: &[&str]) -> std::sync::MutexGuard<'_, Option<BanEntry>> {
        let at = self.index(keys, self.bans.len());
        self.bans[at].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn index(&self, value: impl std::hash::Hash, slots: usize) -> usize {
        // The remainder of a u64 by a small table size fits in usize.
        usize::try_from(self.hasher.hash_one(value) % slots as u64).unwrap_or(0)
    }

    /// The denial this cache gives `plan` at `now_us`, if it can.
    pub(crate) fn answer(&self, plan: &CheckRequest<'_>, now_us: u64) -> Option<Verdict> {
        if !plan.bans.is_empty() {
            let keys: Vec<&str> = plan.bans.iter().map(|b| b.key).collect();
            let slot = self.ban_slot(&keys);
            if let Some(ban) = slot.as_ref()
                && now_us < ban.answer_until_us
                && ban.keys.iter().map(|k| &**k).eq(keys.iter().copied())
            {
                self.answered.fetch_add(1, Ordering::Relaxed);
                return Some(Verdict::blocked(ban.until_us - now_us));
            }
        }
        // A check that may write a ban goes to Redis, which writes it; so does one with a
        // concurrency limit (see `learn`).
        if plan.may_ban() || plan.limiters.is_empty() || has_leases(plan) {
            return None;
        }
        let mut outcomes = Vec::with_capacity(plan.rule_count());
        let mut denied = false;
        for limiter in plan.limiters {
            let slot = self.limiter_slot(limiter.key);
            let entry = slot
                .as_ref()
                .filter(|e| &*e.key == limiter.key && *e.rules == *limiter.rules)
                .filter(|e| now_us < e.answer_until_us)?;
            match entry.denies {
                // A shadow limiter's denial denies nothing; its outcomes are shown as they are.
                Some(_) if limiter.shadow => {}
                Some(cost) if plan.cost == cost => denied = true,
                // Another cost: a smaller one may fit, a larger one waits longer than the
                // retry_after Redis gave (which must stay exact): Redis answers.
                Some(_) => return None,
                None => {}
            }
            let elapsed = now_us.saturating_sub(entry.seen_us);
            outcomes.extend(entry.outcomes.iter().map(|o| RuleOutcome {
                allowed: o.allowed,
                remaining: o.remaining,
                reset_after_us: o.reset_after_us.saturating_sub(elapsed),
                retry_after_us: o.retry_after_us.map(|r| r.saturating_sub(elapsed).max(1)),
            }));
        }
        if !denied {
            return None;
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        Some(Verdict::new(false, outcomes))
    }

    /// Remembers what Redis answered `plan`, asked at `sent_us`.
    pub(crate) fn learn(&self, plan: &CheckRequest<'_>, verdict: &Verdict, sent_us: u64) {
        if verdict.allowed {
            // Its limiters counted more: what the cache says of them is out of date (still
            // a denial, but with the wrong numbers).
            if plan.consume && plan.cost > 0 {
                self.forget_limiters(plan);
            }
            return;
        }
        // A concurrency limit's refusal lasts until some holder releases its slot, which may be
        // any moment (its retry_after only bounds it): nothing to remember.
        if has_leases(plan) && verdict.blocked_us.is_none() {
            return;
        }
        // Nor a limiter that takes overrides: an override set by any instance counts from the
        // identity's next check, which a remembered denial would not see.
        if plan.limiters.iter().any(|l| l.overrides.is_some()) && verdict.blocked_us.is_none() {
            return;
        }
        if let Some(left) = verdict.blocked_us {
            if left > 0 && !plan.bans.is_empty() {
                let keys: Vec<&str> = plan.bans.iter().map(|b| b.key).collect();
                let until_us = sent_us.saturating_add(left);
                *self.ban_slot(&keys) = Some(BanEntry {
                    keys: keys.iter().map(|&k| k.into()).collect(),
                    until_us,
                    answer_until_us: until_us.saturating_sub(margin_us(left)),
                });
            }
            return;
        }
        if verdict.rules.len() != plan.rule_count() {
            return;
        }
        // Each limiter's outcomes, and how long it denies (if it does, and says until when).
        let mut at = 0;
        let mut limiters = Vec::with_capacity(plan.limiters.len());
        let mut longest = None::<u64>;
        for limiter in plan.limiters {
            let outcomes = &verdict.rules[at..at + limiter.rules.len()];
            at += limiter.rules.len();
            let mut denies = None::<u64>;
            let mut known = true;
            for o in outcomes.iter().filter(|o| !o.allowed) {
                match o.retry_after_us {
                    Some(r) => denies = Some(denies.unwrap_or(0).max(r)),
                    None => known = false,
                }
            }
            let denies = denies.filter(|_| known);
            if let Some(wait) = denies {
                longest = Some(longest.unwrap_or(0).max(wait));
            }
            // A limiter that denies without saying until when is not remembered at all.
            limiters.push((limiter, outcomes, denies, known));
        }
        let Some(longest) = longest else { return };
        for (limiter, outcomes, denies, known) in limiters {
            if !known {
                continue;
            }
            let wait = denies.unwrap_or(longest);
            let until_us = sent_us.saturating_add(wait);
            let entry = LimiterEntry {
                key: limiter.key.into(),
                rules: limiter.rules.into(),
                outcomes: outcomes.into(),
                seen_us: sent_us,
                denies: denies.map(|_| plan.cost),
                answer_until_us: until_us.saturating_sub(margin_us(wait)),
            };
            let mut slot = self.limiter_slot(limiter.key);
            // A description never replaces a live denial of the same limiter.
            let keep = slot.as_ref().is_some_and(|old| {
                entry.denies.is_none()
                    && old.denies.is_some()
                    && sent_us < old.answer_until_us
                    && old.key == entry.key
                    && old.rules == entry.rules
            });
            if !keep {
                *slot = Some(entry);
            }
        }
    }

    /// Forgets every limiter of `plan` (a reset through this store).
    pub(crate) fn forget_limiters(&self, plan: &CheckRequest<'_>) {
        for limiter in plan.limiters {
            let mut slot = self.limiter_slot(limiter.key);
            if slot.as_ref().is_some_and(|e| &*e.key == limiter.key) {
                *slot = None;
            }
        }
    }

    /// Forgets every ban that `ban_key` is part of (an unban through this store).
    pub(crate) fn forget_ban(&self, ban_key: &str) {
        for slot in &*self.bans {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            if slot
                .as_ref()
                .is_some_and(|b| b.keys.iter().any(|k| &**k == ban_key))
            {
                *slot = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate::{BanKey, LimiterRequest};

    use super::*;

    fn rules(texts: &[&str]) -> Vec<Rule> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    fn outcome(allowed: bool, remaining: u64, reset: u64, retry: Option<u64>) -> RuleOutcome {
        RuleOutcome {
            allowed,
            remaining,
            reset_after_us: reset,
            retry_after_us: retry,
        }
    }

    #[test]
    fn a_denial_is_answered_until_its_end_less_the_margin_for_at_least_its_cost() {
        let cache = LocalCache::new();
        let (a, b) = (rules(&["2/1s"]), rules(&["10/1m"]));
        let limiters = [
            LimiterRequest {
                key: "tg:{a}",
                compact: &[],
                rules: &a,
                ban: None,
                shadow: false,
                overrides: None,
            },
            LimiterRequest {
                key: "tg:{b}",
                compact: &[],
                rules: &b,
                ban: None,
                shadow: false,
                overrides: None,
            },
        ];
        let plan = CheckRequest::new(2, true, &limiters);
        let denial = Verdict::new(
            false,
            [
                outcome(false, 0, 900_000, Some(400_000)),
                outcome(true, 8, 50_000_000, None),
            ],
        );
        cache.learn(&plan, &denial, 1_000_000);
        // 100 ms later: denied here, times shortened, remaining as reported.
        let local = cache.answer(&plan, 1_100_000).unwrap();
        assert!(!local.allowed);
        assert_eq!(local.rules[0], outcome(false, 0, 800_000, Some(300_000)));
        assert_eq!(local.rules[1], outcome(true, 8, 49_900_000, None));
        assert_eq!(cache.answered(), 1);
        // A smaller cost may fit, a larger one waits longer; the margin before the end is left
        // to Redis.
        for cost in [1, 3] {
            let other_cost = CheckRequest::new(cost, true, &limiters);
            assert!(
                cache.answer(&other_cost, 1_100_000).is_none(),
                "cost {cost}"
            );
        }
        let end = 1_000_000 + 400_000;
        assert!(cache.answer(&plan, end - margin_us(400_000) - 1).is_some());
        assert!(cache.answer(&plan, end - margin_us(400_000)).is_none());
        // A limiter the cache knows nothing of: Redis answers.
        let c = rules(&["5/1h"]);
        let more = [
            limiters[0],
            LimiterRequest {
                key: "tg:{c}",
                compact: &[],
                rules: &c,
                ban: None,
                shadow: false,
                overrides: None,
            },
        ];
        assert!(
            cache
                .answer(&CheckRequest::new(2, true, &more), 1_100_000)
                .is_none()
        );
        // Other rules on the same key are another limiter.
        let other = [LimiterRequest {
            key: "tg:{a}",
            compact: &[],
            rules: &b,
            ban: None,
            shadow: false,
            overrides: None,
        }];
        assert!(
            cache
                .answer(&CheckRequest::new(2, true, &other), 1_100_000)
                .is_none()
        );
        // A reset through the store forgets it.
        cache.forget_limiters(&plan);
        assert!(cache.answer(&plan, 1_100_000).is_none());
        assert_eq!(cache.answered(), 2);
    }

    #[test]
    fn admissions_and_unknown_waits_are_not_remembered_and_an_admission_forgets() {
        let cache = LocalCache::new();
        let a = rules(&["2/1s"]);
        let limiters = [LimiterRequest {
            key: "tg:{a}",
            compact: &[],
            rules: &a,
            ban: None,
            shadow: false,
            overrides: None,
        }];
        let plan = CheckRequest::new(1, true, &limiters);
        cache.learn(&plan, &Verdict::new(true, [outcome(true, 1, 1, None)]), 0);
        assert!(cache.answer(&plan, 1).is_none());
        cache.learn(&plan, &Verdict::new(false, [outcome(false, 0, 1, None)]), 0);
        assert!(cache.answer(&plan, 1).is_none());
        // Remembered, then an admission of the same limiter (a cost that fitted) comes back.
        let denial = Verdict::new(false, [outcome(false, 0, 5_000, Some(5_000))]);
        cache.learn(&plan, &denial, 0);
        assert!(cache.answer(&plan, 1).is_some());
        cache.learn(&plan, &Verdict::new(true, [outcome(true, 0, 1, None)]), 2);
        assert!(cache.answer(&plan, 3).is_none());
    }

    #[test]
    fn bans_are_answered_until_they_end_and_an_unban_forgets_them() {
        let cache = LocalCache::new();
        let a = rules(&["2/1s"]);
        let limiters = [LimiterRequest {
            key: "tg:{a}",
            compact: &[],
            rules: &a,
            ban: None,
            shadow: false,
            overrides: None,
        }];
        let bans = [
            BanKey {
                write: true,
                key: "tg:ban:ip:1",
                kind: "ip",
                value: "1",
            },
            BanKey {
                write: true,
                key: "tg:ban:user_id:u",
                kind: "user_id",
                value: "u",
            },
        ];
        let plan = CheckRequest::new(1, true, &limiters).with_bans(&bans, "tg:{ban}:index");
        cache.learn(&plan, &Verdict::blocked(60_000_000), 0);
        assert_eq!(
            cache.answer(&plan, 10_000_000),
            Some(Verdict::blocked(50_000_000))
        );
        // Only the same set of ban keys.
        let one = CheckRequest::new(1, true, &limiters).with_bans(&bans[..1], "tg:{ban}:index");
        assert!(cache.answer(&one, 10_000_000).is_none());
        cache.forget_ban("tg:ban:user_id:u");
        assert!(cache.answer(&plan, 10_000_000).is_none());
    }
}
