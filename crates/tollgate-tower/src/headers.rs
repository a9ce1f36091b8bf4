//! `RateLimit-Policy`, `RateLimit` (draft-ietf-httpapi-ratelimit-headers) and `Retry-After`.

use std::{fmt::Write, time::Duration};

use http::{HeaderMap, HeaderName, HeaderValue, header};
use tollgate::{Decision, RuleDecision, format_duration};

/// The `RateLimit-Policy` field name.
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up: a client that waits this long is never early.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The policy names of the decision's rules, one per rule, unique: `limiter-window`
/// (`ip-1m`), with the limit appended where two rules of a limiter share a window.
pub(crate) fn policy_names(rules: &[RuleDecision]) -> Vec<String> {
    let base = |r: &RuleDecision| format!("{}-{}", r.limiter, format_duration(r.rule.window()));
    let mut names: Vec<String> = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        let mut name = base(rule);
        if rules.iter().filter(|r| base(r) == name).count() > 1 {
            name = format!("{name}-{}", rule.rule.limit());
        }
        if names.contains(&name) {
            name = format!("{name}-{i}");
        }
        names.push(name);
    }
    names
}

/// Writes `RateLimit-Policy` and `RateLimit` for every rule of `decision` (nothing for a
/// decision without rules, e.g. bypassed).
///
/// ```
/// use http::HeaderMap;
/// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let gate = Tollgate::new(MemoryStore::new());
/// let policy = Policy::builder("sms")
///     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?]))
///     .build()?;
/// let who = Identity::new().with_ip("192.0.2.1".parse()?);
/// let decision = gate.check(&policy, &who, 1).await?;
///
/// let mut headers = HeaderMap::new();
/// tollgate_tower::insert_rate_limit_headers(&decision, &mut headers);
/// assert_eq!(headers["ratelimit-policy"], r#""ip-1m";q=1;w=60"#);
/// assert_eq!(headers["ratelimit"], r#""ip-1m";r=0;t=60"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub fn insert_rate_limit_headers(decision: &Decision, headers: &mut HeaderMap) {
    insert_rule_headers(decision.rules(), headers);
}

/// Writes `RateLimit-Policy` and `RateLimit` for `rules` (of one or several decisions).
pub(crate) fn insert_rule_headers(rules: &[RuleDecision], headers: &mut HeaderMap) {
    if rules.is_empty() {
        return;
    }
    let names = policy_names(rules);
    let mut policy = String::new();
    let mut limit = String::new();
    for (rule, name) in rules.iter().zip(&names) {
        if !policy.is_empty() {
            policy.push_str(", ");
            limit.push_str(", ");
        }
        let name = sf_string(name);
        let _ = write!(
            policy,
            "{name};q={};w={}",
            rule.rule.limit(),
            ceil_secs(rule.rule.window())
        );
        let _ = write!(
            limit,
            "{name};r={};t={}",
            rule.remaining,
            ceil_secs(rule.reset_after)
        );
    }
    for (field, text) in [(RATELIMIT_POLICY, policy), (RATELIMIT, limit)] {
        if let Ok(value) = HeaderValue::from_str(&text) {
            headers.insert(field, value);
        }
    }
}

/// Writes `Retry-After` in whole seconds, rounded up.
pub(crate) fn insert_retry_after(retry_after: Duration, headers: &mut HeaderMap) {
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(ceil_secs(retry_after)),
    );
}

/// An RFC 8941 sf-string: printable ASCII, `"` and `\` escaped; anything else becomes `?`
/// (limiter names come from configuration, so this is a guard, not a feature).
pub(crate) fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn rule(limiter: &str, text: &str) -> RuleDecision {
        RuleDecision {
            limiter: Arc::from(limiter),
            rule: text.parse().unwrap(),
            allowed: true,
            remaining: 0,
            reset_after: Duration::ZERO,
        }
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(41_001)), 42);
        assert_eq!(ceil_secs(Duration::from_secs(42)), 42);
    }

    #[test]
    fn names_are_unique_per_rule() {
        let names = policy_names(&[
            rule("ip", "1/1m"),
            rule("ip", "10/1h"),
            rule("ip", "5/1h"),
            rule("user_id", "20/1d"),
            rule("ip", "5/500ms"),
        ]);
        assert_eq!(
            names,
            ["ip-1m", "ip-1h-10", "ip-1h-5", "user_id-1d", "ip-500ms"]
        );
    }

    #[test]
    fn sf_strings_escape() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("é"), r#""?""#);
    }
}
