//! Checks on a Redis Cluster: one check.lua call per hash slot, all at once, and the
//! reservations undone when any slot denies or the identity is banned.
//!
//! Every key of one limiter carries the limiter's hash tag, so a limiter lives in one slot;
//! a ban key has no tag, so each target's ban lives in a slot of its own key, and the bans
//! spread over the cluster (no slot is read by every check). A plan whose keys all share one
//! slot, and that writes no ban, is one EVALSHA, exactly as on a standalone server. Otherwise
//! each slot's limiters run check.lua at once, and the bans are read beside them by banned.lua,
//! one call per slot holding ban keys: a slot that admits records its admission at once, and
//! reports what it wrote. If every slot admits and nobody is banned, that is the answer, one
//! round trip later. If not, a second round trip undoes what the admitting slots wrote
//! (undo.lua, concurrently) and, when a denying limiter bans, bans the offender (offend.lua in
//! each ban key's slot, then ban_index.lua adds the bans to the index, in its own slot).
//!
//! Between the two round trips the reservations are visible: a concurrent check may count
//! them and be denied when it would have been admitted. That is the residual window, and it
//! can only cost an admission, never add one: every slot still checks its rules atomically
//! against everything recorded, reservations included.

use std::collections::HashMap;

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use tollgate::{
    Algorithm, CheckRequest, LimiterRequest, Receipt, StoreError, StoreErrorKind, Verdict,
    algorithm::RuleOutcome, key,
};

use crate::{
    backend::Backend,
    batch::Lane,
    repair::Journal,
    script::{self, Record, Report, SlotReply},
};

/// The limiters (or the ban keys) of a plan that share one slot, in plan order.
pub(crate) struct Group {
    slot: Slot,
    /// Indices into the plan's limiters (or ban keys).
    members: Vec<usize>,
}

/// Where a plan's keys live.
pub(crate) enum Layout {
    /// Every key in one slot (or no key at all), and no ban to write: the standalone script,
    /// one call on that slot's lane.
    OneSlot(Lane),
    /// The limiters' slots, and the ban keys' (read beside them, and written there on a
    /// denial that bans).
    Slots {
        limiters: Vec<Group>,
        bans: Vec<Group>,
    },
}

/// Where `plan`'s keys live; an error if a limiter's keys could span slots.
pub(crate) fn layout(plan: &CheckRequest<'_>) -> Result<Layout, StoreError> {
    let mut limiters: Vec<Group> = Vec::new();
    for (i, limiter) in plan.limiters.iter().enumerate() {
        join(&mut limiters, limiter_slot(limiter)?, i);
    }
    // A ban key has no hash tag: each target's ban lives in the slot of its own key.
    let mut bans: Vec<Group> = Vec::new();
    for (i, ban) in plan.bans.iter().enumerate() {
        join(&mut bans, Slot::for_key(ban.key), i);
    }
    // A ban written on a Cluster also goes to the index, in a slot of its own: a check that
    // may ban takes the spread path, which writes both.
    let one_slot = match (limiters.as_slice(), bans.as_slice()) {
        ([] | [_], []) | ([], [_]) => true,
        ([group], [bans]) => group.slot == bans.slot && !plan.may_ban(),
        _ => false,
    };
    Ok(if one_slot {
        Layout::OneSlot(one_slot_lane(plan))
    } else {
        Layout::Slots { limiters, bans }
    })
}

/// Adds member `i` to the group of `slot`.
/// The plan's limiters grouped by hash slot (indices into `plan.limiters`).
pub(crate) fn slot_members(plan: &CheckRequest<'_>) -> Result<Vec<Vec<usize>>, StoreError> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, limiter) in plan.limiters.iter().enumerate() {
        join(&mut groups, limiter_slot(limiter)?, i);
    }
    Ok(groups.into_iter().map(|g| g.members).collect())
}

fn join(groups: &mut Vec<Group>, slot: Slot, i: usize) {
    match groups.iter_mut().find(|g| g.slot == slot) {
        Some(group) => group.members.push(i),
        None => groups.push(Group {
            slot,
            members: vec![i],
        }),
    }
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

fn cross_slot(key: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!(
            "key {key:?} has no hash tag shared with its siblings: on a Redis Cluster every key \
             of one limiter must share a hash tag"
        ),
    )
}

/// One slot's call: the slot's limiters (no bans), as requests and as indices into the whole
/// request's.
struct SlotCall<'a> {
    requests: Vec<LimiterRequest<'a>>,
    limiters: Vec<usize>,
}

impl<'a> SlotCall<'a> {
    /// The slot's own check.
    fn request(&self, whole: &CheckRequest<'_>) -> CheckRequest<'_> {
        let mut request = CheckRequest::new(whole.cost, whole.consume, &self.requests);
        request.delay_us = whole.delay_us;
        request
    }

    /// Each limiter of the slot: its index in the plan, its request, and its slice of
    /// `outcomes` (the slot's, one per rule, in call order).
    fn per_limiter<'o>(
        &'o self,
        outcomes: &'o [RuleOutcome],
    ) -> impl Iterator<Item = (usize, &'o LimiterRequest<'a>, &'o [RuleOutcome])> {
        self.limiters
            .iter()
            .zip(&self.requests)
            .zip(script::per_limiter(&self.requests, outcomes))
            .map(|((&i, limiter), mine)| (i, limiter, mine))
    }
}

/// One slot's answer; `None` if its call failed.
struct SlotAnswer<'a> {
    call: SlotCall<'a>,
    reply: Option<SlotReply>,
}

/// Checks `plan`, whose limiters and ban keys live in these groups ([`Layout::Slots`]), on
/// the cluster (see the module docs).
pub(crate) async fn check(
    store: &Backend,
    plan: &CheckRequest<'_>,
    limiters: Vec<Group>,
    bans: Vec<Group>,
    journal: Option<&Journal>,
) -> Result<Verdict, StoreError> {
    let report = if limiters.len() > 1 {
        Report::RecordAndZero
    } else {
        Report::Record
    };
    let nonce: [u8; 8] = rand::random();
    let now = store.test_now();
    let scripts = &store.scripts;
    let calls: Vec<SlotCall> = limiters
        .into_iter()
        .map(|g| SlotCall {
            requests: g.members.iter().map(|&i| plan.limiters[i]).collect(),
            limiters: g.members,
        })
        .collect();

    // Round trip 1: every slot, and the bans, at once.
    // A replicated check waits for each slot's replicas (a slot short of them fails, and the
    // others' reservations are undone as for any failed slot).
    let slots = join_all(calls.iter().map(|c| async move {
        let request = c.request(plan);
        let mut call = scripts.check.call();
        script::prepare(&mut call, &request, now, nonce, Some(report))?;
        let reply = store.check_call(&call, plan.durability).await?;
        script::slot_reply(&request, &script::only_reply(reply)?, report)
    }));
    // The longest live ban over every ban slot.
    let bans = async {
        let reads = join_all(bans.iter().map(|group| {
            let mut call = scripts.banned.call();
            for &i in &group.members {
                call.key(plan.bans[i].key);
            }
            call.arg(script::now_arg(now));
            let mut conn = store.conn();
            async move {
                let left: i64 = call
                    .invoke(&mut conn)
                    .await
                    .map_err(|e| store.redis_error("check bans", e))?;
                Ok::<_, StoreError>(u64::try_from(left).ok())
            }
        }))
        .await;
        reads
            .into_iter()
            .try_fold(None, |longest: Option<u64>, left| Ok(longest.max(left?)))
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
    let receipt = allowed.then(|| receipt(plan, &answers, nonce)).flatten();
    if failure.is_none() && blocked.is_none() && allowed {
        if let Some(journal) = journal {
            for answer in &answers {
                if let Some(SlotReply {
                    verdict,
                    record: Some(record),
                    ..
                }) = &answer.reply
                {
                    let request = answer.call.request(plan);
                    let lane = request.limiters.first().map(|l| Slot::for_key(l.key));
                    let said = (&verdict.rules[..], &verdict.limits[..]);
                    journal.learn(lane, &request, said, record, nonce);
                }
            }
        }
        let mut verdict = assemble(plan, answers, true);
        verdict.receipt = receipt;
        return Ok(verdict);
    }

    // Round trip 2: undo every reservation; ban the offender if a denying limiter says so.
    let undo = join_all(
        answers
            .iter()
            .filter_map(|a| {
                let reply = a.reply.as_ref()?;
                let record = reply.record.as_ref()?;
                Some(undo(store, plan, &a.call, reply, record, nonce, now))
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

/// Where each limiter recorded an admission (each slot at its own node's time), when every
/// slot recorded one.
fn receipt(plan: &CheckRequest<'_>, answers: &[SlotAnswer<'_>], nonce: [u8; 8]) -> Option<Receipt> {
    let mut at = vec![Receipt::NOT_RECORDED; plan.limiters.len()];
    for answer in answers {
        let reply = answer.reply.as_ref()?;
        let record = reply.record.as_ref()?;
        let now = u64::try_from(record.now).ok()?;
        for (i, limiter, mine) in answer.call.per_limiter(&reply.verdict.rules) {
            if !script::shadow_denies(limiter, mine) {
                at[i] = now;
            }
        }
    }
    Some(Receipt::per_limiter(
        at,
        u64::from_be_bytes(nonce),
        plan.cost,
    ))
}

/// The plan's verdict from every slot's: rules back in plan order; when denied, the rules of
/// the slots that admitted show the state as it stays once undone.
fn assemble(plan: &CheckRequest<'_>, answers: Vec<SlotAnswer<'_>>, allowed: bool) -> Verdict {
    let mut per_limiter: Vec<Vec<RuleOutcome>> = vec![Vec::new(); plan.limiters.len()];
    // Where each limiter's rules start in the plan, for the limits overrides set.
    let starts: Vec<usize> = plan
        .limiters
        .iter()
        .scan(0, |at, l| {
            let start = *at;
            *at += l.rules.len();
            Some(start)
        })
        .collect();
    let mut limits = Vec::new();
    for answer in answers {
        let Some(reply) = answer.reply else { continue };
        let mut first = 0;
        for (i, limiter, _) in answer.call.per_limiter(&reply.verdict.rules) {
            let mine = first..first + limiter.rules.len();
            for &(place, limit) in &reply.verdict.limits {
                if mine.contains(&place) {
                    limits.push((starts[i] + place - first, limit));
                }
            }
            first = mine.end;
        }
        let outcomes = match (allowed, reply.zero) {
            (false, Some(zero)) => zero,
            _ => reply.verdict.rules,
        };
        for (i, _, mine) in answer.call.per_limiter(&outcomes) {
            per_limiter[i].extend_from_slice(mine);
        }
    }
    let mut verdict = Verdict::new(allowed, per_limiter.into_iter().flatten());
    limits.sort_unstable();
    verdict.limits = limits;
    verdict
}

/// Undoes what one slot's call wrote (undo.lua): each state key once.
async fn undo(
    store: &Backend,
    plan: &CheckRequest<'_>,
    call: &SlotCall<'_>,
    reply: &SlotReply,
    record: &Record,
    nonce: [u8; 8],
    now: Option<u64>,
) -> Result<i64, StoreError> {
    let scripts = &store.scripts;
    let mut undo = scripts.undo.call();
    let marker_ttl_ms = store.marker_ttl_ms().unwrap_or(0);
    undo.arg(script::now_arg(now))
        .arg(plan.cost)
        .arg(&nonce[..])
        .arg(marker_ttl_ms);
    // (key, op, a, b), each key once: a limiter's sliding-log rules share one log.
    let mut ops: Vec<(String, u8, i64, i64)> = Vec::new();
    let mut writes = record.writes.iter();
    for (_, limiter, mine) in call.per_limiter(&reply.verdict.rules) {
        let writes = writes.by_ref().take(limiter.rules.len());
        if script::shadow_denies(limiter, mine) {
            // A shadow limiter that would deny wrote nothing.
            writes.for_each(drop);
            continue;
        }
        for (rule, &(a, b)) in limiter.rules.iter().zip(writes) {
            let key = key::rule_key(limiter.key, rule);
            if ops.iter().any(|(k, ..)| *k == key) {
                continue;
            }
            ops.push(match rule.algorithm() {
                Algorithm::SlidingLog => (key, 1, record.now, a),
                Algorithm::FixedWindow => (key, 2, a, b),
                Algorithm::SlidingWindow => (key, 4, a, b),
                _ => (key, 3, a, b),
            });
        }
    }
    for (key, op, a, b) in &ops {
        undo.key(key).arg(op).arg(a).arg(b);
    }
    // Nothing written (shadow limiters that would deny): nothing to undo.
    let Some(limiter) = call.requests.first().filter(|_| !ops.is_empty()) else {
        return Ok(0);
    };
    // The call's marker (a re-sent undo gives back nothing more), beside the slot's keys.
    if marker_ttl_ms > 0 {
        undo.key(key::applied_key(limiter.key, rand::random()));
    }
    let mut conn = store.conn();
    undo.invoke(&mut conn)
        .await
        .map_err(|e| store.redis_error("undo", e))
}

/// Bans the plan's targets if a denying limiter bans offenders: offend.lua in each ban key's
/// slot, then the new bans into the index (ban_index.lua); the longest ban written.
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
        let mut first = 0;
        for (i, limiter, mine) in answer.call.per_limiter(&reply.verdict.rules) {
            // A cost above a rule's limit (an override's) is no client's violation.
            let place = first;
            first += limiter.rules.len();
            let limit = |j: usize| {
                Verdict::limit_at(&reply.verdict.limits, place + j, limiter.rules[j].limit())
            };
            let violated = mine
                .iter()
                .enumerate()
                .any(|(j, o)| !o.allowed && plan.cost <= limit(j));
            denied.insert(i, violated);
        }
    }
    let bans: Vec<_> = plan
        .limiters
        .iter()
        .enumerate()
        .filter(|(i, _)| denied.get(i).copied().unwrap_or(false))
        .filter(|(_, l)| l.bans())
        .filter_map(|(_, l)| l.ban)
        .collect();
    if bans.is_empty() {
        return Ok(None);
    }
    let mut groups: Vec<Group> = Vec::new();
    // Bans are written where the policy writes them: keys only read are left alone.
    for (i, ban) in plan.bans.iter().enumerate().filter(|(_, b)| b.write) {
        join(&mut groups, Slot::for_key(ban.key), i);
    }
    let writes = join_all(groups.iter().map(|group| {
        let mut call = store.scripts.offend.call();
        for &i in &group.members {
            call.key(plan.bans[i].key);
        }
        call.arg(script::now_arg(now)).arg(bans.len());
        for ban in &bans {
            call.arg(script::micros(ban.duration()))
                .arg(ban.factor())
                .arg(script::micros(ban.cap()));
        }
        for &i in &group.members {
            call.arg(plan.bans[i].kind).arg(plan.bans[i].value);
        }
        let mut conn = store.conn();
        async move {
            let reply: Vec<i64> = call
                .invoke(&mut conn)
                .await
                .map_err(|e| store.redis_error("ban", e))?;
            match reply.split_first() {
                Some((&longest, ends)) if ends.len() == group.members.len() => Ok((
                    longest,
                    group.members.iter().zip(ends.to_vec()).collect::<Vec<_>>(),
                )),
                _ => Err(script::protocol("offend", format!("{reply:?}"))),
            }
        }
    }))
    .await;
    let mut longest = None;
    let mut entries = Vec::new();
    let mut failure = None;
    for write in writes {
        match write {
            Ok((written, ends)) => {
                longest = longest.max(u64::try_from(written).ok());
                entries.extend(ends.into_iter().map(|(&i, end)| (end, plan.bans[i].key)));
            }
            Err(err) => failure = Some(err),
        }
    }
    // Listed once written. A ban the index missed is still enforced, only not listed or
    // counted: the denial still reports it.
    if !entries.is_empty() {
        let _unlisted = index_bans(store, plan.ban_index, now, &entries, &[]).await;
    }
    match failure {
        Some(err) if longest.is_none() => Err(err),
        _ => Ok(longest),
    }
}

/// Adds bans (their end in µs and key) to the ban index at `index` and removes others, then
/// trims it (ban_index.lua): how a Cluster store keeps the index, which lives in a slot of its
/// own.
pub(crate) async fn index_bans(
    store: &Backend,
    index: &str,
    now: Option<u64>,
    add: &[(i64, &str)],
    remove: &[&str],
) -> Result<(), StoreError> {
    let mut call = store.scripts.ban_index.call();
    call.key(index).arg(script::now_arg(now)).arg(add.len());
    for (end, key) in add {
        call.arg(end).arg(key);
    }
    for key in remove {
        call.arg(key);
    }
    let mut conn = store.conn();
    let _: i64 = call
        .invoke(&mut conn)
        .await
        .map_err(|e| store.redis_error("index bans", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use tollgate::{BanKey, BanRule, BanTarget, Rule, ban_index_key};

    use super::*;

    const RULES: &[Rule] = &[];

    fn limiter(key: &str) -> LimiterRequest<'_> {
        LimiterRequest {
            key,
            compact: &[],
            rules: RULES,
            ban: None,
            shadow: false,
            overrides: None,
        }
    }

    #[test]
    fn one_slot_plans_are_one_call() {
        let ip = BanTarget::Ip("10.0.0.1".parse().unwrap());
        let user = BanTarget::UserId("u".into());
        let (ip_key, user_key, index) = (ip.key("tg"), user.key("tg"), ban_index_key("tg"));
        let bans = [
            BanKey {
                write: true,
                key: &ip_key,
                kind: "ip",
                value: "10.0.0.1",
            },
            BanKey {
                write: true,
                key: &user_key,
                kind: "user_id",
                value: "u",
            },
        ];
        let spread = |l: Layout| match l {
            Layout::Slots { limiters, bans } => (limiters.len(), bans.len()),
            Layout::OneSlot(_) => (0, 0),
        };
        let same = [limiter("tg:{a}"), limiter("tg:{a}:x")];
        let same = CheckRequest::new(1, true, &same);
        assert!(matches!(layout(&same).unwrap(), Layout::OneSlot(_)));
        // Each target's ban in its own slot, none in the limiters'.
        let banned = same.with_bans(&bans, &index);
        assert_eq!(spread(layout(&banned).unwrap()), (1, 2));
        let two = [limiter("tg:{a}"), limiter("tg:{b}")];
        assert_eq!(
            spread(layout(&CheckRequest::new(1, true, &two)).unwrap()),
            (2, 0)
        );
        let only_bans = CheckRequest::new(1, true, &[]).with_bans(&bans[..1], &index);
        assert!(matches!(layout(&only_bans).unwrap(), Layout::OneSlot(_)));
        let both = CheckRequest::new(1, true, &[]).with_bans(&bans, &index);
        assert_eq!(spread(layout(&both).unwrap()), (0, 2));
        // A limiter in the ban key's slot: one call while no ban can be written there (the
        // index lives elsewhere).
        let tagged = format!("x:{{{ip_key}}}");
        let mut banning = limiter(&tagged);
        let read_only = [banning];
        let read_only = CheckRequest::new(1, true, &read_only).with_bans(&bans[..1], &index);
        assert!(matches!(layout(&read_only).unwrap(), Layout::OneSlot(_)));
        banning.ban = Some(BanRule::new(std::time::Duration::from_secs(60)));
        let writes = [banning];
        let writes = CheckRequest::new(1, true, &writes).with_bans(&bans[..1], &index);
        assert_eq!(spread(layout(&writes).unwrap()), (1, 1));
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
