//! The scripts: how a [`CheckPlan`] becomes one EVALSHA and its reply a [`Verdict`]; the
//! guard scripts (locks, bans) and their replies.

use std::{fmt, time::Duration};

use redis::{Script, ScriptInvocation, Value};
use tollgate::{
    Algorithm, BanEntry, BanTarget, CheckPlan, HeldLock, LockReply, StoreError, StoreErrorKind,
    Verdict, algorithm::RuleOutcome,
};

/// The Lua source; its header lists KEYS, ARGV and the reply.
pub(crate) const SOURCE: &str = include_str!("../scripts/check.lua");

/// A guard script: the shared prelude (time, TTLs) and the body.
macro_rules! guard_script {
    ($file:literal) => {
        concat!(
            include_str!("../scripts/prelude.lua"),
            include_str!(concat!("../scripts/", $file))
        )
    };
}

/// Integers above this are not exact in Lua's doubles.
const MAX_EXACT: u64 = 1 << 53;

/// Every script the store runs (redis-rs sends EVALSHA and loads the source on NOSCRIPT).
pub(crate) struct Scripts {
    pub(crate) check: Script,
    pub(crate) lock_acquire: Script,
    pub(crate) lock_release: Script,
    pub(crate) lock_complete: Script,
    pub(crate) ban: Script,
    pub(crate) unban: Script,
    pub(crate) bans: Script,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            check: Script::new(SOURCE),
            lock_acquire: Script::new(guard_script!("lock_acquire.lua")),
            lock_release: Script::new(guard_script!("lock_release.lua")),
            lock_complete: Script::new(guard_script!("lock_complete.lua")),
            ban: Script::new(guard_script!("ban.lua")),
            unban: Script::new(guard_script!("unban.lua")),
            bans: Script::new(guard_script!("bans.lua")),
        }
    }

    pub(crate) fn all(&self) -> [&Script; 7] {
        [
            &self.check,
            &self.lock_acquire,
            &self.lock_release,
            &self.lock_complete,
            &self.ban,
            &self.unban,
            &self.bans,
        ]
    }
}

/// The first argument of every guard script: the test clock's time, or empty for `TIME`.
pub(crate) fn now_arg(now_us: Option<u64>) -> String {
    now_us.map(|t| t.to_string()).unwrap_or_default()
}

fn protocol(what: &str, why: impl fmt::Display) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("{what} script reply: {why}"),
    )
}

/// Reads the lock-acquire reply: `{1}`, or `{0, completed, ttl_left_us, fingerprint, response}`.
pub(crate) fn lock_reply(reply: &[Value]) -> Result<LockReply, StoreError> {
    let bad = |why: &str| protocol("lock", format!("{why}: {reply:?}"));
    match reply {
        [Value::Int(1)] => Ok(LockReply::Acquired),
        [
            Value::Int(0),
            Value::Int(completed),
            Value::Int(ttl),
            fingerprint,
            response,
        ] => Ok(LockReply::Held(HeldLock {
            completed: *completed == 1,
            ttl_left_us: u64::try_from(*ttl).map_err(|_| bad("negative ttl"))?,
            fingerprint: match fingerprint {
                Value::BulkString(b) => {
                    String::from_utf8(b.clone()).map_err(|_| bad("the fingerprint is not text"))?
                }
                _ => return Err(bad("no fingerprint")),
            },
            response: match response {
                Value::BulkString(b) => Some(b.clone()),
                Value::Nil => None,
                _ => return Err(bad("a response that is not bytes")),
            },
        })),
        _ => Err(bad("unexpected shape")),
    }
}

/// Reads the bans reply: kind, value, µs left, strikes per ban; sorted by target.
pub(crate) fn bans_reply(reply: &[Value]) -> Result<Vec<BanEntry>, StoreError> {
    let mut bans = reply
        .chunks(4)
        .map(|ban| match ban {
            [
                Value::BulkString(kind),
                Value::BulkString(value),
                Value::Int(left),
                Value::Int(strikes),
            ] => {
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                let target = BanTarget::parse(&text(kind), &text(value))
                    .map_err(|why| protocol("bans", why))?;
                Ok(BanEntry {
                    target,
                    expires_in: Duration::from_micros(u64::try_from(*left).unwrap_or(0)),
                    strikes: u32::try_from(*strikes).unwrap_or(u32::MAX),
                })
            }
            other => Err(protocol("bans", format!("unexpected entry {other:?}"))),
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    bans.sort_by(|a, b| a.target.cmp(&b.target));
    Ok(bans)
}

/// Fills `invocation` with the plan's keys and arguments.
///
/// `now_us` overrides the server's `TIME` (tests only); `nonce` makes this call's sliding-log
/// members unique.
pub(crate) fn prepare(
    invocation: &mut ScriptInvocation<'_>,
    plan: &CheckPlan,
    now_us: Option<u64>,
    nonce: [u8; 8],
) -> Result<(), StoreError> {
    if plan.cost >= MAX_EXACT {
        return Err(too_large("cost", plan.cost));
    }
    invocation
        .arg(plan.cost)
        .arg(u8::from(plan.consume))
        .arg(now_arg(now_us))
        .arg(&nonce[..])
        .arg(plan.limiters.len());
    for limiter in &plan.limiters {
        invocation.key(limiter.state_keys());
        invocation.arg(limiter.rules.len());
        match limiter.ban {
            Some(ban) => invocation
                .arg(1)
                .arg(micros(ban.duration()))
                .arg(ban.factor())
                .arg(micros(ban.cap())),
            None => invocation.arg(&[0, 0, 1, 0]),
        };
        for rule in limiter.rules.iter() {
            if rule.limit() >= MAX_EXACT {
                return Err(too_large("rule limit", rule.limit()));
            }
            invocation
                .arg(algorithm_code(rule.algorithm())?)
                .arg(rule.limit())
                .arg(rule.window_us());
        }
    }
    invocation.arg(plan.bans.len());
    for ban in &plan.bans {
        invocation
            .key(&ban.key)
            .arg(ban.target.kind())
            .arg(ban.target.value());
    }
    if !plan.bans.is_empty() {
        invocation.key(&plan.ban_index);
    }
    Ok(())
}

/// A duration in µs as the scripts take it: whole, and below 2^53 (a longer ban is a
/// century-long ban anyway).
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).map_or(MAX_EXACT - 1, |us| us.min(MAX_EXACT - 1))
}

fn too_large(what: &str, value: u64) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("{what} {value} is too large for the Redis store (the most is 2^53 - 1)"),
    )
}

fn algorithm_code(algorithm: Algorithm) -> Result<u8, StoreError> {
    match algorithm {
        Algorithm::SlidingLog => Ok(1),
        Algorithm::FixedWindow => Ok(2),
        Algorithm::Gcra => Ok(3),
        other => Err(StoreError::new(
            StoreErrorKind::Protocol,
            format!("the Redis store does not implement the {other} algorithm"),
        )),
    }
}

/// Reads the script's reply: `allowed`, `blocked_us`, `banned_us`, then four integers per rule.
pub(crate) fn verdict(plan: &CheckPlan, reply: &[i64]) -> Result<Verdict, StoreError> {
    let rules = plan.rule_count();
    let bad = |why: &str| {
        StoreError::new(
            StoreErrorKind::Protocol,
            format!(
                "check script reply ({} integers for {rules} rules): {why}",
                reply.len()
            ),
        )
    };
    let [allowed, blocked, banned, outcomes @ ..] = reply else {
        return Err(bad("too short"));
    };
    let optional = |v: i64| match v {
        -1 => Ok(None),
        v => u64::try_from(v)
            .map(Some)
            .map_err(|_| bad("a negative duration")),
    };
    if let Some(blocked) = optional(*blocked)? {
        if *allowed != 0 || !outcomes.is_empty() {
            return Err(bad("blocked, yet rules were evaluated"));
        }
        return Ok(Verdict::blocked(blocked));
    }
    if outcomes.len() != rules * 4 {
        return Err(bad("wrong length"));
    }
    let flag = |v: i64| match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(bad("a flag is neither 0 nor 1")),
    };
    let count = |v: i64| u64::try_from(v).map_err(|_| bad("a negative count or duration"));
    let outcomes = outcomes
        .chunks_exact(4)
        .map(|o| {
            Ok(RuleOutcome {
                allowed: flag(o[0])?,
                remaining: count(o[1])?,
                reset_after_us: count(o[2])?,
                retry_after_us: optional(o[3])?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let allowed = flag(*allowed)?;
    if allowed != outcomes.iter().all(|o| o.allowed) {
        return Err(bad("the overall flag disagrees with the rules"));
    }
    let mut verdict = Verdict::new(allowed, outcomes);
    verdict.banned_us = optional(*banned)?;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate::{PlanLimiter, Rule};

    use super::*;

    fn plan(rules: &[&str]) -> CheckPlan {
        let rules: Arc<[Rule]> = rules.iter().map(|r| r.parse().unwrap()).collect();
        CheckPlan::new(
            1,
            true,
            vec![PlanLimiter {
                key: "tg:{k}".into(),
                rules,
                ban: None,
            }],
        )
    }

    #[test]
    fn reply_becomes_a_verdict() {
        let v = verdict(
            &plan(&["2/1s", "5/1m"]),
            &[0, -1, 9, 1, 1, 5, -1, 0, 0, 7, 3],
        )
        .unwrap();
        assert_eq!(v.banned_us, Some(9));
        assert_eq!(v.blocked_us, None);
        assert!(!v.allowed);
        assert_eq!(v.rules[0].retry_after_us, None);
        assert_eq!(v.rules[1].retry_after_us, Some(3));
        assert_eq!(v.rules[1].reset_after_us, 7);
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let p = plan(&["2/1s"]);
        for reply in [
            &[][..],
            &[1, -1, -1],
            &[1, -1, -1, 1, 0, 0],
            &[1, -1, -1, 2, 0, 0, -1],
            &[1, -1, -1, 1, -3, 0, -1],
            &[0, -1, -1, 1, 0, 0, -1],
            &[0, 5, -1, 1, 0, 0, -1],
            &[0, -7, -1],
        ] {
            let err = verdict(&p, reply).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Protocol, "{reply:?}: {err}");
        }
    }

    #[test]
    fn a_blocked_reply_has_no_rules() {
        let v = verdict(&plan(&["2/1s"]), &[0, 1_000, -1]).unwrap();
        assert_eq!(v, Verdict::blocked(1_000));
    }

    #[test]
    fn huge_numbers_are_refused_before_lua_rounds_them() {
        let scripts = Scripts::new();
        let mut inv = scripts.check.prepare_invoke();
        let mut p = plan(&["2/1s"]);
        p.cost = 1 << 60;
        assert!(prepare(&mut inv, &p, None, [0; 8]).is_err());
    }
}
