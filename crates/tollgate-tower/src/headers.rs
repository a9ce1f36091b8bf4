//! `RateLimit-Policy`, `RateLimit` (draft-ietf-httpapi-ratelimit-headers) and `Retry-After`.

use std::{fmt::Write, time::Duration};

use http::{HeaderMap, HeaderName, HeaderValue, header};
use tollgate::{Decision, LimiterName, Policy, RuleDecision, format_duration};

/// The `RateLimit-Policy` field name.
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which rate-limit fields a response carries ([`RateLimitLayer::header_style`](crate::RateLimitLayer::header_style)).
///
/// The draft fields describe every rule; the older forms have room for one, so they describe
/// the rule closest to denying (the fewest units left; of those, the longest to reset).
/// `Retry-After` is sent on a 429 whatever the style.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers), every rule.
    #[default]
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds until the
    /// rule's quota is back), as many existing clients and gateways read them.
    Legacy,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (the draft's sixth
    /// revision): the same three numbers.
    Draft6,
    /// No rate-limit fields on allowed responses; a 429 still carries the draft fields (a
    /// refusal always says why).
    None,
}

const LEGACY: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
];
const DRAFT6: [HeaderName; 3] = [
    HeaderName::from_static("ratelimit-limit"),
    HeaderName::from_static("ratelimit-remaining"),
    HeaderName::from_static("ratelimit-reset"),
];

/// Writes the one-rule fields of `style` (`Legacy` or `Draft6`) for the rule of `rules` closest
/// to denying; nothing for the other styles or without rules.
pub(crate) fn insert_single_rule(
    style: HeaderStyle,
    rules: &[RuleDecision],
    headers: &mut HeaderMap,
) {
    let names = match style {
        HeaderStyle::Legacy => &LEGACY,
        HeaderStyle::Draft6 => &DRAFT6,
        HeaderStyle::Draft | HeaderStyle::None => return,
    };
    let Some(rule) = rules
        .iter()
        .min_by_key(|r| (r.remaining, std::cmp::Reverse(r.reset_after)))
    else {
        return;
    };
    let values = [
        rule.rule.limit(),
        rule.remaining,
        ceil_secs(rule.reset_after),
    ];
    for (name, value) in names.iter().zip(values) {
        headers.insert(name.clone(), HeaderValue::from(value));
    }
}

/// Writes the fields of `style` for `rules` (of one or several decisions).
pub(crate) fn insert_fields(style: HeaderStyle, rules: &[RuleDecision], headers: &mut HeaderMap) {
    match style {
        HeaderStyle::Draft => insert_rule_headers(rules, headers),
        HeaderStyle::None => {}
        style => insert_single_rule(style, rules, headers),
    }
}

/// Whether `headers` already carry the fields of `style` (written by a layer below).
pub(crate) fn has_fields(style: HeaderStyle, headers: &HeaderMap) -> bool {
    match style {
        HeaderStyle::Draft | HeaderStyle::None => headers.contains_key(RATELIMIT),
        HeaderStyle::Legacy => headers.contains_key(&LEGACY[0]),
        HeaderStyle::Draft6 => headers.contains_key(&DRAFT6[0]),
    }
}

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
    let names: Vec<String> = policy_names(rules).iter().map(|n| sf_string(n)).collect();
    let mut policy = String::new();
    write_policy(&mut policy, rules, &names);
    let mut limit = String::new();
    write_limits(&mut limit, rules, &names);
    for (field, text) in [(RATELIMIT_POLICY, policy), (RATELIMIT, limit)] {
        if let Ok(value) = HeaderValue::from_str(&text) {
            headers.insert(field, value);
        }
    }
}

/// The `RateLimit-Policy` items of `rules`, named `names` (quoted).
fn write_policy(out: &mut impl Write, rules: &[RuleDecision], names: &[String]) {
    for (i, (rule, name)) in rules.iter().zip(names).enumerate() {
        let sep = if i > 0 { ", " } else { "" };
        let (q, w) = (rule.rule.limit(), ceil_secs(rule.rule.window()));
        let _ = write!(out, "{sep}{name};q={q};w={w}");
    }
}

/// The `RateLimit` items of `rules`, named `names` (quoted).
fn write_limits(out: &mut impl Write, rules: &[RuleDecision], names: &[String]) {
    for (i, (rule, name)) in rules.iter().zip(names).enumerate() {
        let sep = if i > 0 { ", " } else { "" };
        let (r, t) = (rule.remaining, ceil_secs(rule.reset_after));
        let _ = write!(out, "{sep}{name};r={r};t={t}");
    }
}

/// The fields of one policy that never change, made once per layer: the quoted item names of
/// its rules and its `RateLimit-Policy` value. A decision over exactly these rules (every
/// admission) then costs one formatted field, written on the stack.
pub(crate) struct PolicyFields {
    rules: Vec<RuleDecision>,
    names: Vec<String>,
    policy: Option<HeaderValue>,
}

impl PolicyFields {
    pub(crate) fn new(policy: &Policy) -> PolicyFields {
        let rules: Vec<RuleDecision> = policy
            .limiters()
            .iter()
            .flat_map(|l| {
                let limiter: LimiterName = l.name().into();
                l.rules().iter().map(move |rule| RuleDecision {
                    limiter: limiter.clone(),
                    rule: *rule,
                    allowed: true,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                })
            })
            .collect();
        let names: Vec<String> = policy_names(&rules).iter().map(|n| sf_string(n)).collect();
        let mut text = String::new();
        write_policy(&mut text, &rules, &names);
        PolicyFields {
            policy: HeaderValue::from_str(&text).ok(),
            rules,
            names,
        }
    }

    /// Inserts the fields of `decision`.
    pub(crate) fn insert(&self, decision: &Decision, headers: &mut HeaderMap) {
        let rules = decision.rules();
        let same = rules.len() == self.rules.len()
            && rules
                .iter()
                .zip(&self.rules)
                .all(|(a, b)| a.rule == b.rule && a.limiter == b.limiter);
        if !same {
            return insert_rule_headers(rules, headers);
        }
        let mut limit = smallstr::SmallString::<[u8; 256]>::new();
        write_limits(&mut limit, rules, &self.names);
        if let Some(policy) = &self.policy {
            headers.insert(RATELIMIT_POLICY, policy.clone());
        }
        if let Ok(value) = HeaderValue::from_str(&limit) {
            headers.insert(RATELIMIT, value);
        }
    }
}

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

    use super::*;

    fn rule(limiter: &str, text: &str) -> RuleDecision {
        RuleDecision {
            limiter: limiter.into(),
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
