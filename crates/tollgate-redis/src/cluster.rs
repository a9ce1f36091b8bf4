//! Checks on a Redis Cluster: one check.lua call per hash slot, all at once, and the
//! reservations undone when any slot denies or the identity is banned.
//!
//! Every key of one limiter carries the limiter's hash tag, so a limiter lives in one slot;
//! the bans live under `{ban}`. A plan whose keys all share one slot is one EVALSHA, exactly as
//! on a standalone server. Otherwise each slot's limiters run check.lua at once (the bans are
//! read beside them by banned.lua): a slot that admits records its admission at once, and
//! reports what it wrote. If every slot admits and nobody is banned, that is the answer, one
//! round trip later. If not, a second round trip undoes what the admitting slots wrote
//! (undo.lua, concurrently) and, when a denying limiter bans, bans the offender (offend.lua).
//!
//! Between the two round trips the reservations are visible: a concurrent check may count
//! them and be denied when it would have been admitted. That is the residual window, and it
//! can only cost an admission, never add one: every slot still checks its rules atomically
//! against everything recorded, reservations included.

use std::collections::HashMap;

use futures_util::future::join_all;
use redis::{RedisResult, cluster_routing::Slot};
use tollgate::{
    Algorithm, CheckRequest, LimiterRequest, StoreError, StoreErrorKind, Verdict,
    algorithm::RuleOutcome, key,
};

use crate::{
    backend::Backend,
    batch::Lane,
    script::{self, Record, Report, SlotReply},
};

/// The limiters of a plan that share one slot, in plan order.
pub(crate) struct Group {
    slot: Slot,
    /// Indices into the plan's limiters.
    limiters: Vec<usize>,
}

/// Where a plan's keys live.
pub(crate) enum Layout {
    /// Every key in one slot (or no key at all): the standalone script, one call on that
    /// slot's lane.
    OneSlot(Lane),
    /// The limiters' slots; the bans are read beside them.
    Slots(Vec<Group>),
}

/// Where `plan`'s keys live; an error if a limiter's keys could span slots.
pub(crate) fn layout(plan: &CheckRequest<'_>) -> Result<Layout, StoreError> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, limiter) in plan.limiters.iter().enumerate() {
        let slot = limiter_slot(limiter)?;
        match groups.iter_mut().find(|g| g.slot == slot) {
            Some(group) => group.limiters.push(i),
            None => groups.push(Group {
                slot,
                limiters: vec![i],
            }),
        }
    }
    let ban_slot = ban_slot(plan)?;
    let one_slot = match (groups.as_slice(), ban_slot) {
        ([], _) | ([_], None) => true,
        ([group], Some(bans)) => group.slot == bans,
        _ => false,
    };
    Ok(if one_slot {
        Layout::OneSlot(one_slot_lane(plan))
    } else {
        Layout::Slots(groups)
    })
}

/// The slot of a plan whose keys share one ([`Layout::OneSlot`]): its batching lane.
fn one_slot_lane(plan: &CheckRequest<'_>) -> Lane {
    let first = plan
        .limiters
        .first()
        .map(|l| l.key)
        .or_else(|| plan.bans.first().map(|b| b.key))
        .unwrap_or("");
    Some(Slot::for_key(first))
}

/// The one slot of all of a limiter's keys: its state keys are its base key plus a suffix, so
/// a hash tag in the base key is every state key's tag.
fn limiter_slot(limiter: &LimiterRequest<'_>) -> Result<Slot, StoreError> {
    if !has_hash_tag(limiter.key) {
        return Err(cross_slot(limiter.key));
    }
    Ok(Slot::for_key(limiter.key))
}

/// Whether `key` has a non-empty `{...}` hash tag, which alone then decides its slot.
fn has_hash_tag(key: &str) -> bool {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .is_some_and(|(tag, _)| !tag.is_empty())
}

/// The one slot of the ban keys and the ban index, if the plan has bans.
fn ban_slot(plan: &CheckRequest<'_>) -> Result<Option<Slot>, StoreError> {
    let Some(first) = plan.bans.first() else {
        return Ok(None);
    };
    let slot = Slot::for_key(first.key);
    let keys = plan.bans.iter().map(|b| b.key).chain([plan.ban_index]);
    for k in keys {
        if Slot::for_key(k) != slot {
            return Err(cross_slot(k));
        }
    }
    Ok(Some(slot))
}

fn cross_slot(key: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!(
            "key {key:?} has no hash tag shared with its siblings: on a Redis Cluster every key \
             of one limiter (and every ban key) must share a hash tag"
        ),
    )
}

/// One slot's call: the slot's limiters (no bans), as requests and as indices into the whole
/// request's.
struct SlotCall<'a> {
    requests: Vec<LimiterRequest<'a>>,
    limiters: Vec<usize>,
}

impl SlotCall<'_> {
    /// The slot's own check.
    fn request(&self, whole: &CheckRequest<'_>) -> CheckRequest<'_> {
        CheckRequest::new(whole.cost, whole.consume, &self.requests)
    }
}

/// One slot's answer; `None` if its call failed.
struct SlotAnswer<'a> {
    call: SlotCall<'a>,
    reply: Option<SlotReply>,
}

/// Checks `plan`, whose limiters live in `groups` ([`Layout::Slots`]), on the cluster (see
/// the module docs).
pub(crate) async fn check(
    store: &Backend,
    plan: &CheckRequest<'_>,
    groups: Vec<Group>,
) -> Result<Verdict, StoreError> {
    let report = if groups.len() > 1 {
        Report::RecordAndZero
    } else {
        Report::Record
    };
    let nonce: [u8; 8] = rand::random();
    let now = store.test_now();
    let scripts = &store.scripts;
    let calls: Vec<SlotCall> = groups
        .into_iter()
        .map(|g| SlotCall {
            requests: g.limiters.iter().map(|&i| plan.limiters[i]).collect(),
            limiters: g.limiters,
        })
        .collect();

    // Round trip 1: every slot, and the bans, at once.
    let slots = join_all(calls.iter().map(|c| {
        let mut conn = store.conn();
        async move {
            let request = c.request(plan);
            let mut call = scripts.check.call();
            script::prepare(&mut call, &request, now, nonce, Some(report))?;
            let replies: RedisResult<Vec<Vec<i64>>> = call.invoke(&mut conn).await;
            let reply = replies.map_err(|e| store.redis_error("check", e))?;
            script::slot_reply(&request, &script::only_reply(reply)?, report)
        }
    }));
    let bans = async {
        if plan.bans.is_empty() {
            return Ok(None);
        }
        let mut call = scripts.banned.call();
        for ban in plan.bans {
            call.key(ban.key);
        }
        call.arg(script::now_arg(now));
        let mut conn = store.conn();
        let left: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| store.redis_error("check bans", e))?;
        Ok::<_, StoreError>(u64::try_from(left).ok())
    };
    let (replies, banned) = store
        .bounded_store("check", async { Ok(tokio::join!(slots, bans)) })
        .await?;
    let mut failure = None;
    let mut answers = Vec::with_capacity(calls.len());
    for (call, reply) in calls.into_iter().zip(replies) {
        let reply = reply.map_err(|e| failure.get_or_insert(e)).ok();
        answers.push(SlotAnswer { call, reply });
    }
    let blocked = banned.map_err(|e| failure.get_or_insert(e)).ok().flatten();

    // Every slot admitted and nobody is banned: done, in one round trip.
    let allowed = answers
        .iter()
        .all(|a| a.reply.as_ref().is_some_and(|r| r.verdict.allowed));
    if failure.is_none() && blocked.is_none() && allowed {
        return Ok(assemble(plan, answers, true));
    }

    // Round trip 2: undo every reservation; ban the offender if a denying limiter says so.
    let undo = join_all(
        answers
            .iter()
            .filter_map(|a| {
                let record = a.reply.as_ref()?.record.as_ref()?;
                Some(undo(store, plan, &a.call, record, nonce, now))
            })
            .collect::<Vec<_>>(),
    );
    let offence = async {
        match (&failure, blocked) {
            (None, None) => offend(store, plan, &answers, now).await,
            _ => Ok(None),
        }
    };
    // A failed undo leaves a reservation that expires with its window: the denied request is
    // charged, which can cost a later admission but never adds one.
    let (_undone, banned_us) = store
        .bounded_store("undo", async { Ok(tokio::join!(undo, offence)) })
        .await
        .unwrap_or_else(|err| (Vec::new(), Err(err)));
    if let Some(err) = failure {
        return Err(err);
    }
    if let Some(left) = blocked {
        return Ok(Verdict::blocked(left));
    }
    let mut verdict = assemble(plan, answers, false);
    // The denial stands even if the ban could not be written.
    verdict.banned_us = banned_us.ok().flatten();
    Ok(verdict)
}

/// The plan's verdict from every slot's: rules back in plan order; when denied, the rules of
/// the slots that admitted show the state as it stays once undone.
fn assemble(plan: &CheckRequest<'_>, answers: Vec<SlotAnswer<'_>>, allowed: bool) -> Verdict {
    let mut per_limiter: Vec<Vec<RuleOutcome>> = vec![Vec::new(); plan.limiters.len()];
    for answer in answers {
        let Some(reply) = answer.reply else { continue };
        let outcomes = match (allowed, reply.zero) {
            (false, Some(zero)) => zero,
            _ => reply.verdict.rules,
        };
        let mut outcomes = outcomes.into_iter();
        for &i in &answer.call.limiters {
            per_limiter[i].extend(outcomes.by_ref().take(plan.limiters[i].rules.len()));
        }
    }
    Verdict::new(allowed, per_limiter.into_iter().flatten())
}

/// Undoes what one slot's call wrote (undo.lua): each state key once.
async fn undo(
    store: &Backend,
    plan: &CheckRequest<'_>,
    call: &SlotCall<'_>,
    record: &Record,
    nonce: [u8; 8],
    now: Option<u64>,
) -> Result<i64, StoreError> {
    let scripts = &store.scripts;
    let mut undo = scripts.undo.call();
    undo.arg(script::now_arg(now))
        .arg(plan.cost)
        .arg(&nonce[..]);
    // (key, op, a, b), each key once: a limiter's sliding-log rules share one log.
    let mut ops: Vec<(String, u8, i64, i64)> = Vec::new();
    let mut writes = record.writes.iter();
    for &i in &call.limiters {
        let limiter = &plan.limiters[i];
        for (rule, &(a, b)) in limiter.rules.iter().zip(writes.by_ref()) {
            let key = key::rule_key(limiter.key, rule);
            if ops.iter().any(|(k, ..)| *k == key) {
                continue;
            }
            ops.push(match rule.algorithm() {
                Algorithm::SlidingLog => (key, 1, record.now, a),
                Algorithm::FixedWindow => (key, 2, a, b),
                _ => (key, 3, a, b),
            });
        }
    }
    for (key, op, a, b) in &ops {
        undo.key(key).arg(op).arg(a).arg(b);
    }
    let mut conn = store.conn();
    undo.invoke(&mut conn)
        .await
        .map_err(|e| store.redis_error("undo", e))
}

/// Bans the plan's targets if a denying limiter bans offenders (offend.lua); the ban's length.
async fn offend(
    store: &Backend,
    plan: &CheckRequest<'_>,
    answers: &[SlotAnswer<'_>],
    now: Option<u64>,
) -> Result<Option<u64>, StoreError> {
    if !plan.may_ban() {
        return Ok(None);
    }
    let mut denied: HashMap<usize, bool> = HashMap::new();
    for answer in answers {
        let Some(reply) = &answer.reply else { continue };
        let mut outcomes = reply.verdict.rules.iter();
        for &i in &answer.call.limiters {
            let n = plan.limiters[i].rules.len();
            let denies = outcomes.by_ref().take(n).any(|o| !o.allowed);
            denied.insert(i, denies);
        }
    }
    let bans: Vec<_> = plan
        .limiters
        .iter()
        .enumerate()
        .filter(|(i, _)| denied.get(i).copied().unwrap_or(false))
        .filter_map(|(_, l)| l.ban)
        .collect();
    if bans.is_empty() {
        return Ok(None);
    }
    let mut call = store.scripts.offend.call();
    for ban in plan.bans {
        call.key(ban.key);
    }
    call.key(plan.ban_index);
    call.arg(script::now_arg(now)).arg(bans.len());
    for ban in &bans {
        call.arg(script::micros(ban.duration()))
            .arg(ban.factor())
            .arg(script::micros(ban.cap()));
    }
    for ban in plan.bans {
        call.arg(ban.kind).arg(ban.value);
    }
    let mut conn = store.conn();
    let reply: Vec<i64> = call
        .invoke(&mut conn)
        .await
        .map_err(|e| store.redis_error("ban", e))?;
    Ok(reply
        .first()
        .and_then(|&longest| u64::try_from(longest).ok()))
}

#[cfg(test)]
mod tests {
    use tollgate::{BanKey, BanTarget, Rule, ban_index_key};

    use super::*;

    const RULES: &[Rule] = &[];

    fn limiter(key: &str) -> LimiterRequest<'_> {
        LimiterRequest {
            key,
            rules: RULES,
            ban: None,
        }
    }

    #[test]
    fn one_slot_plans_are_one_call() {
        let target = BanTarget::Ip("10.0.0.1".parse().unwrap());
        let (ban_key, index) = (target.key("tg"), ban_index_key("tg"));
        let bans = [BanKey {
            key: &ban_key,
            kind: "ip",
            value: "10.0.0.1",
        }];
        let same = [limiter("tg:{a}"), limiter("tg:{a}:x")];
        let same = CheckRequest::new(1, true, &same);
        assert!(matches!(layout(&same).unwrap(), Layout::OneSlot(_)));
        let banned = same.with_bans(&bans, &index);
        assert!(matches!(layout(&banned).unwrap(), Layout::Slots(g) if g.len() == 1));
        let two = [limiter("tg:{a}"), limiter("tg:{b}")];
        let Layout::Slots(groups) = layout(&CheckRequest::new(1, true, &two)).unwrap() else {
            panic!("two slots")
        };
        assert_eq!(groups.len(), 2);
        let only_bans = CheckRequest::new(1, true, &[]).with_bans(&bans, &index);
        assert!(matches!(layout(&only_bans).unwrap(), Layout::OneSlot(_)));
    }

    #[test]
    fn hash_tags_are_found_as_redis_finds_them() {
        assert!(has_hash_tag("tg:{a:b}:l"));
        assert!(has_hash_tag("{a}"));
        assert!(!has_hash_tag("tg:{}:x"));
        assert!(!has_hash_tag("tg:{open"));
        assert!(!has_hash_tag("tg:}x{"));
    }

    #[test]
    fn untagged_limiters_are_refused() {
        let untagged = [limiter("tg:untagged")];
        let err = layout(&CheckRequest::new(1, true, &untagged))
            .err()
            .unwrap();
        assert_eq!(err.kind(), StoreErrorKind::Protocol);
    }
}
