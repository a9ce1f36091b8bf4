//! A check's keys, built once on the stack: every limiter's (text, or compact for a store
//! that keeps no text) and the ban keys, in one buffer.

use smallvec::SmallVec;

use crate::{
    blocklist::{BanScope, BanTarget},
    decision::{Decision, Reason},
    engine::Tollgate,
    error::CheckError,
    identity::{Identity, NetworkText},
    key::{self, KeyBuf, KeyHead, KeyOut},
    policy::{Limiter, Policy},
    store::{BanKey, CheckRequest, LimiterRequest, Store},
    text::StackText,
};

use super::{conclude::missing_dimension, cost_exceeds_limit};

/// The most limiters a check holds on the stack; larger policies spill to the heap.
pub(crate) const INLINE_LIMITERS: usize = 4;

impl<S: Store> Tollgate<S> {
    /// What every check does before the store: the bypass, the keys, the cost. False when that
    /// decided already (into `out`); true when `keys` hold what the store needs.
    pub(crate) fn prepare<'i>(
        &self,
        policy: &Policy,
        identity: &'i Identity,
        cost: u64,
        consume: bool,
        keys: &mut CheckKeys<'i>,
        out: &mut Decision,
    ) -> Result<bool, CheckError> {
        if policy.bypass.as_ref().is_some_and(|b| b.matches(identity)) {
            out.reset(true, Reason::Bypassed);
            return Ok(false);
        }
        self.limiter_keys(policy, identity, keys)?;
        if cost > policy.max_units {
            cost_exceeds_limit(&policy.limiters, cost, out);
            return Ok(false);
        }
        // Ban keys cost a key per target: left out when this check can neither meet a ban (the
        // store knows none can be live) nor write one. When it can only write one, they are
        // left out until it does: only a denial writes a ban, and a denial writes nothing
        // else, so a denied check is asked again with them (see `Tollgate::check_now`).
        if self.blocklist && self.store.bans_possible() {
            self.ban_keys(policy, identity, keys);
        } else if self.blocklist && consume && policy.may_ban {
            // An identity with neither an IP nor a user has no ban keys to wait for.
            keys.bans_deferred = identity.ip().is_some() || identity.user_id().is_some();
        }
        Ok(true)
    }

    /// Adds the identity's ban keys.
    pub(crate) fn ban_keys<'i>(
        &self,
        policy: &Policy,
        identity: &'i Identity,
        keys: &mut CheckKeys<'i>,
    ) {
        keys.bans_deferred = false;
        if let Some(ip) = identity.ip() {
            // A ban covers the client's network: its text is the target's value.
            keys.ip_text = BanTarget::PREFIX.network_inline(ip);
            key::push_ban_key(&mut keys.bans, &self.prefix, "ip", &keys.ip_text);
            keys.ip_ban = Some(keys.bans.len());
        }
        if let Some(id) = identity.user_id() {
            key::push_ban_key(&mut keys.bans, &self.prefix, "user_id", id);
            keys.user_ban = Some((keys.bans.len(), id));
        }
        // Bans of its own: read beside the blocklist every policy sees, and the only ones
        // a violation writes.
        if policy.ban_scope == BanScope::Policy {
            let scope = &policy.scope;
            if keys.ip_ban.is_some() {
                key::push_policy_ban_key(&mut keys.bans, &self.prefix, scope, "ip", &keys.ip_text);
                keys.own.ip = Some(keys.bans.len());
            }
            if let Some((_, id)) = keys.user_ban {
                key::push_policy_ban_key(&mut keys.bans, &self.prefix, scope, "user_id", id);
                keys.own.user = Some(keys.bans.len());
            }
            let start = keys.bans.len();
            key::push_policy_ban_index(&mut keys.bans, &self.prefix, scope);
            keys.own.index = start..keys.bans.len();
        }
    }

    /// Writes the key of every limiter of `policy` for `identity` into `keys`, one after the
    /// other (`prefix:{head:value}`, where `head:` is the limiter's entry in
    /// `Policy::key_heads`), noting where each ends.
    pub(crate) fn limiter_keys(
        &self,
        policy: &Policy,
        identity: &Identity,
        keys: &mut CheckKeys<'_>,
    ) -> Result<(), CheckError> {
        keys.compact = !self.store.text_keys();
        for (limiter, head) in policy.limiters.iter().zip(&policy.key_heads) {
            let at = (&self.key_start, head);
            if !push_limiter_key(&mut keys.text, at, limiter, identity, keys.compact) {
                return Err(missing_dimension(limiter));
            }
            keys.ends.push(keys.text.len());
        }
        Ok(())
    }
}

/// Writes `limiter`'s key for `identity` (`start` and `head`: the engine's key start and the
/// limiter's entry in `Policy::key_heads`): text, or compact for a store that keeps no text.
/// False when the identity has no value in the limiter's dimension.
#[inline(always)]
pub(crate) fn push_limiter_key(
    out: &mut KeyBuf,
    (start, head): (&KeyHead, &KeyHead),
    limiter: &Limiter,
    identity: &Identity,
    compact: bool,
) -> bool {
    if compact {
        key::push_compact_head(out, start, head);
        limiter.dimension.push_compact(identity, out)
    } else {
        out.push_str(&start.text);
        out.push_str(&head.text);
        let found = limiter.dimension.push_value(identity, out);
        out.push_ascii(b'}');
        found
    }
}

/// The limiters of one check, on the stack for up to [`INLINE_LIMITERS`].
pub(crate) type LimiterRequests<'a> = SmallVec<[LimiterRequest<'a>; INLINE_LIMITERS]>;

/// The ban keys of one check: the IP's and the user's.
pub(crate) type BanKeys<'a> = SmallVec<[BanKey<'a>; 2]>;

/// The keys of one check, on the stack: every limiter's key in one buffer, the ban keys in
/// another, and the IP ban's value.
pub(crate) struct CheckKeys<'i> {
    /// The limiters' keys (text, or compact for a store that keeps no text).
    text: KeyBuf,
    /// The ban keys, and a policy's own ban index (text, read without a UTF-8 check).
    bans: StackText,
    /// The limiters' keys are compact ([`Store::text_keys`]).
    compact: bool,
    /// Where each limiter's key ends.
    ends: SmallVec<[usize; INLINE_LIMITERS]>,
    ip_text: NetworkText,
    /// Where the IP's ban key ends.
    ip_ban: Option<usize>,
    /// Where the user's ban key ends, and the user id.
    user_ban: Option<(usize, &'i str)>,
    /// The policy's own bans, when its bans are its own.
    own: OwnBans,
    /// The ban keys are left out for now: the store knows no ban is live, and only a denial
    /// needs them, to write one.
    pub(crate) bans_deferred: bool,
}

/// Where a policy's own ban keys and ban index end among a check's ban keys
/// ([`BanScope::Policy`]).
#[derive(Default)]
struct OwnBans {
    ip: Option<usize>,
    user: Option<usize>,
    /// Empty unless the policy's bans are its own.
    index: std::ops::Range<usize>,
}

impl<'i> CheckKeys<'i> {
    #[inline(always)]
    pub(crate) fn new() -> CheckKeys<'i> {
        CheckKeys {
            text: KeyBuf::default(),
            bans: StackText::new(),
            compact: false,
            ends: SmallVec::new(),
            ip_text: NetworkText::new(),
            ip_ban: None,
            user_ban: None,
            own: OwnBans::default(),
            bans_deferred: false,
        }
    }

    /// The ban index the check's bans go to: the policy's own, or `every` (the engine's).
    #[inline(always)]
    pub(crate) fn ban_index<'a>(&'a self, every: &'a str) -> &'a str {
        if self.own.index.is_empty() {
            every
        } else {
            &self.bans.as_str()[self.own.index.clone()]
        }
    }

    /// The store's request for this check of `policy` (`how`: whether it records, and how long
    /// its units may wait, in µs), its limiter and ban requests built in the caller's vectors;
    /// `every_ban_index`: the engine's ban index.
    #[inline(always)]
    pub(crate) fn request<'r, 'a: 'r>(
        &'a self,
        policy: &'a Policy,
        every_ban_index: &'a str,
        (limiters, bans): (&'r mut LimiterRequests<'a>, &'r mut BanKeys<'a>),
        cost: u64,
        how: (bool, u64),
    ) -> CheckRequest<'r> {
        self.requests(&policy.limiters, &mut *limiters, &mut *bans);
        let (limiters, bans): (&'r LimiterRequests<'a>, &'r BanKeys<'a>) = (limiters, bans);
        let index = self.ban_index(every_ban_index);
        request_of(policy, limiters, (bans, index), cost, how)
    }

    /// The request of a policy's only limiter, when the check has no ban keys: the common
    /// case, built without the vectors of [`request`](Self::request). As the one-element
    /// slice the store is asked with, built where it stays (a copy of a value just written
    /// stalls the load that reads it).
    #[inline(always)]
    pub(crate) fn only_limiter<'a>(
        &'a self,
        policy: &'a Policy,
    ) -> Option<[LimiterRequest<'a>; 1]> {
        let ([limiter], &[end]) = (&policy.limiters[..], &self.ends[..]) else {
            return None;
        };
        if !self.bans.is_empty() {
            return None;
        }
        let (key, compact) = if self.compact {
            ("", self.text.bytes())
        } else {
            (self.text.text_at(0..end), &[][..])
        };
        Some([limiter.request(key, compact)])
    }

    /// The request of each limiter (its key and rules) and the ban keys, into the caller's
    /// vectors (built in place: returned, they would be copied).
    pub(crate) fn requests<'a>(
        &'a self,
        limiters: &'a [Limiter],
        requests: &mut LimiterRequests<'a>,
        bans: &mut BanKeys<'a>,
    ) {
        let bytes = self.text.bytes();
        let limiters_end = self.ends.last().copied().unwrap_or(0);
        // Text read once, apart from the compact keys (which are not text).
        let limiter_text = if self.compact {
            ""
        } else {
            self.text.text_at(0..limiters_end)
        };
        let mut start = 0;
        for (limiter, &end) in limiters.iter().zip(&self.ends) {
            let (key, compact) = if self.compact {
                ("", &bytes[start..end])
            } else {
                (&limiter_text[start..end], &[][..])
            };
            requests.push(limiter.request(key, compact));
            start = end;
        }
        let text = self.bans.as_str();
        if text.is_empty() {
            return;
        }
        let mut start = 0;
        // With bans of its own, the blocklist every policy sees is only read.
        let shared = self.own.index.is_empty();
        if let Some(end) = self.ip_ban {
            bans.push(BanKey {
                key: &text[start..end],
                kind: "ip",
                value: &self.ip_text,
                write: shared,
            });
            start = end;
        }
        if let Some((end, id)) = self.user_ban {
            bans.push(BanKey {
                key: &text[start..end],
                kind: "user_id",
                value: id,
                write: shared,
            });
            start = end;
        }
        if let Some(end) = self.own.ip {
            bans.push(BanKey {
                key: &text[start..end],
                kind: "ip",
                value: &self.ip_text,
                write: true,
            });
            start = end;
        }
        if let Some(end) = self.own.user {
            let id = self.user_ban.map_or("", |(_, id)| id);
            bans.push(BanKey {
                key: &text[start..end],
                kind: "user_id",
                value: id,
                write: true,
            });
        }
    }
}

/// The store's request for a check of `policy` over `limiters` (`bans`: the ban keys and the
/// ban index they go to; `how`: whether it records, and how long its units may wait, in µs).
#[inline(always)]
pub(crate) fn request_of<'r>(
    policy: &'r Policy,
    limiters: &'r [LimiterRequest<'r>],
    (bans, ban_index): (&'r [BanKey<'r>], &'r str),
    cost: u64,
    (consume, delay_us): (bool, u64),
) -> CheckRequest<'r> {
    let mut request = CheckRequest::new(cost, consume, limiters)
        .with_bans(bans, ban_index)
        .with_durability(policy.durability)
        .with_lease(policy.lease);
    request.delay_us = delay_us;
    request
}
