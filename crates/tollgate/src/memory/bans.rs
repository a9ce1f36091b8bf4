//! Bans: written by a denial of a limiter with a [`BanRule`] or by hand, listed, lifted.

use std::{sync::atomic::Ordering, time::Duration};

use smallvec::SmallVec;

use super::{
    Inner,
    map::{Entry, Kind, Locked, Shard, State},
};
use crate::{
    algorithm::RuleOutcome,
    blocklist::{BanEntry, BanPage, BanRule, BanTarget},
    key,
    page::PageCursor,
    store::CheckRequest,
};

pub(super) struct BanState {
    target: BanTarget,
    until: u64,
    strikes: u32,
}

impl BanState {
    /// When the ban ends (µs); its entry lives on after, to remember its strikes.
    pub(super) fn until(&self) -> u64 {
        self.until
    }
}

impl Inner {
    /// How long the longest live ban among the request's ban keys has left.
    pub(super) fn blocked_for(
        &self,
        request: &CheckRequest<'_>,
        hashes: &[u64],
        locked: &mut Locked<'_>,
        now: u64,
    ) -> Option<u64> {
        request
            .bans
            .iter()
            .zip(hashes)
            .filter_map(
                |(ban, &hash)| match locked.shard(hash).live(hash, ban.key, now) {
                    Some(Entry {
                        state: State::Ban(b),
                        ..
                    }) if b.until > now => Some(b.until - now),
                    _ => None,
                },
            )
            .max()
    }

    /// Bans every target of the request after a denial by a limiter with a ban rule; returns
    /// the longest ban written.
    pub(super) fn ban_offender(
        &self,
        request: &CheckRequest<'_>,
        hashes: &[u64],
        outcomes: &[RuleOutcome],
        locked: &mut Locked<'_>,
        now: u64,
    ) -> Option<u64> {
        let mut first = 0;
        let mut rules = SmallVec::<[BanRule; 4]>::new();
        for limiter in request.limiters {
            let mine = &outcomes[first..first + limiter.rules.len()];
            first += limiter.rules.len();
            if let Some(rule) = limiter.ban.filter(|_| limiter.bans()) {
                // A cost above a rule's limit (one an override set: others never reach the
                // store) is no client's violation.
                let violated = mine
                    .iter()
                    .zip(limiter.rules.iter())
                    .any(|(o, r)| !o.allowed && request.cost <= r.limit());
                if violated {
                    rules.push(rule);
                }
            }
        }
        if rules.is_empty() {
            return None;
        }
        let mut longest = None;
        for (ban, &hash) in request.bans.iter().zip(hashes) {
            // Only read here: the blocklist every policy sees, beside this policy's own.
            if !ban.write {
                continue;
            }
            let Ok(target) = ban.target() else { continue };
            let shard = locked.shard(hash);
            let strikes = match shard.live(hash, ban.key, now) {
                Some(Entry {
                    state: State::Ban(b),
                    ..
                }) => b.strikes + 1,
                _ => 1,
            };
            let duration = rules
                .iter()
                .map(|r| r.duration_for(strikes))
                .max()
                .unwrap_or_default();
            let memory = rules.iter().map(|r| r.memory()).max().unwrap_or_default();
            let until = now.saturating_add(super::micros(duration));
            let state = State::Ban(BanState {
                target,
                until,
                strikes,
            });
            let expires_at = until.saturating_add(super::micros(memory));
            if self.put_ban(shard, hash, ban.key, Entry::new(state, expires_at), now) {
                self.ban_horizon.fetch_max(until, Ordering::AcqRel);
                longest = longest.max(Some(until - now));
            }
        }
        longest
    }

    pub(super) fn bans(&self, prefix: &str) -> Vec<BanEntry> {
        let now = self.clock.now_us();
        let mut bans = Vec::new();
        self.each_live_ban(prefix, now, |_, ban| {
            bans.push(BanEntry {
                target: ban.target.clone(),
                expires_in: Duration::from_micros(ban.until - now),
                strikes: ban.strikes,
            });
        });
        bans.sort_by(|a, b| a.target.cmp(&b.target));
        bans
    }

    pub(super) fn ban(&self, prefix: &str, target: &BanTarget, duration: Duration) {
        let key = target.key(prefix);
        let hash = self.shards.hash(&key);
        let mut shard = self.shards.lock_one(hash);
        let now = self.clock.now_us();
        let until = now.saturating_add(super::micros(duration));
        let (strikes, expires_at) = match shard.live(hash, &key, now) {
            Some(Entry {
                state: State::Ban(b),
                expires_at,
                ..
            }) => (b.strikes, (*expires_at).max(until)),
            _ => (1, until),
        };
        let state = State::Ban(BanState {
            target: target.clone(),
            until,
            strikes,
        });
        if self.put_ban(&mut shard, hash, &key, Entry::new(state, expires_at), now) {
            self.ban_horizon.fetch_max(until, Ordering::AcqRel);
        }
    }

    /// Writes a ban within the ban budget: when it is full of live bans, the new one is not
    /// written (and counted): a flood of new bans never lifts the ones in force.
    fn put_ban(&self, shard: &mut Shard, hash: u64, key: &str, entry: Entry, now: u64) -> bool {
        if shard.find(hash, key).is_none() && !self.make_room(shard, Kind::Ban, 1, now, &[]) {
            self.dropped_bans.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        shard.insert(hash, key, entry);
        true
    }

    pub(super) fn unban(&self, prefix: &str, target: &BanTarget) -> bool {
        let key = target.key(prefix);
        let hash = self.shards.hash(&key);
        let mut shard = self.shards.lock_one(hash);
        let now = self.clock.now_us();
        match shard.get_mut(hash, &key) {
            Some(Entry {
                state: State::Ban(b),
                ..
            }) => {
                let active = b.until > now;
                shard.remove(hash, &key);
                active
            }
            _ => false,
        }
    }
}

/// Counting and paging the blocklist.
impl Inner {
    /// Calls `f` with the key and state of every ban under `prefix` that has not ended.
    fn each_live_ban(&self, prefix: &str, now: u64, mut f: impl FnMut(&str, &BanState)) {
        // No ban ever written is still live: nothing to walk.
        if self.ban_horizon.load(Ordering::Acquire) <= now {
            return;
        }
        let mut ban_keys = String::new();
        key::push_ban_key(&mut ban_keys, prefix, "", "");
        ban_keys.pop();
        for shard in self.shards.iter() {
            for (key, entry) in shard.lock().iter() {
                if let State::Ban(ban) = &entry.state {
                    // Ban keys are text.
                    let key = std::str::from_utf8(key).unwrap_or_default();
                    if ban.until > now && key.starts_with(&ban_keys) {
                        f(key, ban);
                    }
                }
            }
        }
    }

    pub(super) fn ban_count(&self, prefix: &str) -> u64 {
        let mut count = 0;
        self.each_live_ban(prefix, self.clock.now_us(), |_, _| count += 1);
        count
    }

    /// The page after `after`, in the order bans end, then by key (as the Redis index).
    pub(super) fn bans_page(
        &self,
        prefix: &str,
        after: Option<&PageCursor>,
        limit: usize,
    ) -> BanPage {
        let limit = limit.max(1);
        let now = self.clock.now_us();
        let mut found: Vec<(PageCursor, BanEntry)> = Vec::new();
        self.each_live_ban(prefix, now, |key, ban| {
            let at = PageCursor::new(ban.until, key);
            if after.is_none_or(|a| at > *a) {
                let entry = BanEntry {
                    target: ban.target.clone(),
                    expires_in: Duration::from_micros(ban.until - now),
                    strikes: ban.strikes,
                };
                found.push((at, entry));
            }
        });
        let more = found.len() > limit;
        if more {
            found.select_nth_unstable_by(limit - 1, |a, b| a.0.cmp(&b.0));
        }
        found.truncate(limit);
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let next = more
            .then(|| found.last().map(|(at, _)| at.clone()))
            .flatten();
        BanPage {
            bans: found.into_iter().map(|(_, ban)| ban).collect(),
            next,
        }
    }
}
