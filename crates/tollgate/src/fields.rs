//! The rate-limit header fields of a decision, as text: `RateLimit-Policy` and `RateLimit` as
//! draft-ietf-httpapi-ratelimit-headers-11 (2026-05) has them (the same fields as -10: policy
//! names as strings, `q`, `w`, `qu` and `r`, `t`; a denying rule's `t` is the time until more
//! quota is available, never later than `Retry-After`), or the older one-rule forms
//! (`X-RateLimit-*`, and draft-06's `RateLimit-Limit`/`-Remaining`/`-Reset`). Every front end writes
//! these: the tower layer into its responses, the server into its answers and into Envoy's
//! `response_headers_to_add`.
//!
//! ```
//! use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate};
//! use tollgate::fields::{HeaderStyle, PolicyFields};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let gate = Tollgate::new(MemoryStore::new());
//! let policy = Policy::builder("sms")
//!     .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse()?, "10/1h".parse()?]))
//!     .build()?;
//! let fields = PolicyFields::new(&policy); // once per policy
//! let who = Identity::new().with_ip("192.0.2.1".parse()?);
//! let decision = gate.check(&policy, &who, 1).await?;
//!
//! let mut written = Vec::new();
//! fields.write(HeaderStyle::Draft, &decision, &policy, |name, value| {
//!     written.push((name, value.to_owned()))
//! });
//! assert_eq!(written, [
//!     ("ratelimit-policy", r#""ip-1m";q=1;w=60, "ip-1h";q=10;w=3600"#.to_owned()),
//!     ("ratelimit", r#""ip-1m";r=0;t=60, "ip-1h";r=9;t=3600"#.to_owned()),
//! ]);
//!
//! written.clear();
//! fields.write(HeaderStyle::Legacy, &decision, &policy, |name, value| {
//!     written.push((name, value.to_owned()))
//! });
//! assert_eq!(written, [
//!     ("x-ratelimit-limit", "1".to_owned()),
//!     ("x-ratelimit-remaining", "0".to_owned()),
//!     ("x-ratelimit-reset", "60".to_owned()),
//! ]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::{
    collections::{HashMap, HashSet},
    fmt,
    str::FromStr,
    time::Duration,
};

use smallvec::SmallVec;

use crate::{INLINE_RULES, LimiterName, Policy, RuleDecision, format_duration, text::StackText};

/// Which rate-limit fields an answer carries.
///
/// The draft fields describe every rule; the older forms have room for one, so they describe
/// the rule closest to denying (the fewest units left; of those, the longest to reset).
///
/// ```
/// use tollgate::fields::HeaderStyle;
///
/// let style: HeaderStyle = "legacy".parse()?;
/// assert_eq!(style, HeaderStyle::Legacy);
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Draft);
/// # Ok::<(), tollgate::fields::HeaderStyleError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11), every rule.
    #[default]
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds until the
    /// rule's quota is back), as many existing clients and gateways read them.
    Legacy,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (the draft's sixth
    /// revision): the same three numbers.
    Draft6,
    /// No rate-limit fields on allowed answers; a refusal still carries the draft fields (a
    /// refusal always says why).
    None,
}

impl HeaderStyle {
    /// The style's name in configuration: `draft`, `legacy`, `draft6` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderStyle::Draft => "draft",
            HeaderStyle::Legacy => "legacy",
            HeaderStyle::Draft6 => "draft6",
            HeaderStyle::None => "none",
        }
    }

    /// The style for an answer that `allowed` or not: a denial always says why, so `None`
    /// becomes `Draft` for it.
    pub fn for_answer(self, allowed: bool) -> HeaderStyle {
        match self {
            HeaderStyle::None if !allowed => HeaderStyle::Draft,
            style => style,
        }
    }

    /// The three field names of a one-rule style (limit, remaining, reset).
    fn single_rule_names(self) -> Option<[&'static str; 3]> {
        match self {
            HeaderStyle::Legacy => Some(LEGACY),
            HeaderStyle::Draft6 => Some(DRAFT6),
            HeaderStyle::Draft | HeaderStyle::None => None,
        }
    }
}

impl fmt::Display for HeaderStyle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A header style that is none of `draft`, `legacy`, `draft6`, `none`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderStyleError(String);

impl fmt::Display for HeaderStyleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown header style {:?} (expected draft, legacy, draft6 or none)",
            self.0
        )
    }
}

impl std::error::Error for HeaderStyleError {}

impl FromStr for HeaderStyle {
    type Err = HeaderStyleError;

    fn from_str(s: &str) -> Result<HeaderStyle, HeaderStyleError> {
        match s {
            "draft" => Ok(HeaderStyle::Draft),
            "legacy" => Ok(HeaderStyle::Legacy),
            "draft6" => Ok(HeaderStyle::Draft6),
            "none" => Ok(HeaderStyle::None),
            other => Err(HeaderStyleError(other.to_owned())),
        }
    }
}

/// The `RateLimit-Policy` field name. Names are written in lower case, as HTTP/2 and gRPC
/// metadata require (HTTP/1.1 compares them case-insensitively).
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// The `RateLimit` field name.
pub const RATELIMIT: &str = "ratelimit";
/// tollgate's `RateLimit-Warning` field (not in the draft): the rules an admission brought to
/// their limiter's warning (see [`Limiter::with_warning`](crate::Limiter::with_warning)), as
/// items of the `RateLimit` field, named as there.
pub const RATELIMIT_WARNING: &str = "ratelimit-warning";
const LEGACY: [&str; 3] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];
const DRAFT6: [&str; 3] = ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"];

/// Whole seconds, rounded up: a client that waits this long is never early.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The item names of `rules`, one per rule, unique: `limiter-window` (`ip-1m`), with the limit
/// appended where two rules of a limiter share a window. Problem documents name violated
/// policies by these too.
pub fn policy_names(rules: &[RuleDecision]) -> Vec<String> {
    let base = |r: &RuleDecision| {
        if r.rule.is_concurrent() {
            format!("{}-concurrent", r.limiter)
        } else {
            format!("{}-{}", r.limiter, format_duration(r.rule.window()))
        }
    };
    // Linear in the rules: each base name is written once and counted in a map.
    let bases: Vec<String> = rules.iter().map(base).collect();
    let mut shared: HashMap<&str, usize> = HashMap::with_capacity(bases.len());
    for b in &bases {
        *shared.entry(b.as_str()).or_default() += 1;
    }
    let mut taken: HashSet<String> = HashSet::with_capacity(rules.len());
    let mut names: Vec<String> = Vec::with_capacity(rules.len());
    for (i, (rule, b)) in rules.iter().zip(&bases).enumerate() {
        let mut name = if shared[b.as_str()] > 1 {
            format!("{b}-{}", rule.rule.limit())
        } else {
            b.clone()
        };
        if !taken.insert(name.clone()) {
            name = format!("{name}-{i}");
            taken.insert(name.clone());
        }
        names.push(name);
    }
    names
}

/// An RFC 8941 sf-string: printable ASCII, `"` and `\` escaped; anything else becomes `?`
/// (limiter names come from configuration, so this is a guard, not a feature).
fn sf_string(text: &str) -> String {
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

/// The `RateLimit-Policy` items of `rules`, named `names` (quoted).
fn write_policy(out: &mut impl fmt::Write, rules: &[RuleDecision], names: &[String]) {
    for (i, (rule, name)) in rules.iter().zip(names).enumerate() {
        if rule.rule.is_concurrent() {
            // A quota of requests at once, not per window: the draft's quota unit says so.
            write_item(out, i, name, [";q="], [rule.rule.limit()]);
            let _ = out.write_str(";qu=\"concurrent-requests\"");
            continue;
        }
        let (q, w) = (rule.rule.limit(), ceil_secs(rule.rule.window()));
        write_item(out, i, name, [";q=", ";w="], [q, w]);
    }
}

/// The `RateLimit` items of `rules`, named `names` (quoted). `t` is the time until the quota
/// is back; for a rule that denied, the time until more of it is available (draft-10 and
/// later), `wait` (the decision's `retry_after`), so that `Retry-After` is never earlier than
/// the effective window.
fn write_limits(
    out: &mut impl fmt::Write,
    rules: impl Iterator<Item = Numbers>,
    names: &[String],
    wait: Option<Duration>,
) {
    for (i, (rule, name)) in rules.zip(names).enumerate() {
        let t = match wait {
            Some(wait) if !rule.allowed => wait,
            _ => rule.reset_after,
        };
        let (r, t) = (rule.remaining, ceil_secs(t));
        write_item(out, i, name, [";r=", ";t="], [r, t]);
    }
}

/// What the fields say of one rule.
#[derive(Clone, Copy)]
struct Numbers {
    limit: u64,
    allowed: bool,
    remaining: u64,
    reset_after: Duration,
}

impl From<&RuleDecision> for Numbers {
    fn from(rule: &RuleDecision) -> Numbers {
        Numbers {
            limit: rule.rule.limit(),
            allowed: rule.allowed,
            remaining: rule.remaining,
            reset_after: rule.reset_after,
        }
    }
}

/// The `RateLimit-Policy` value: made once per policy, or written for the rules of decisions
/// whose policy is not known.
enum PolicyText<'a> {
    Made(&'a str),
    Of(&'a [RuleDecision]),
}

/// One list item, `name;a=1;b=2` (`keys` with their separators: `;a=`), after a separator
/// unless it is the first (`i == 0`). Numbers are written with `itoa`: the formatting
/// machinery costs more than the rest of the field.
fn write_item<const N: usize>(
    out: &mut impl fmt::Write,
    i: usize,
    name: &str,
    keys: [&str; N],
    values: [u64; N],
) {
    let mut digits = itoa::Buffer::new();
    if i > 0 {
        let _ = out.write_str(", ");
    }
    let _ = out.write_str(name);
    for (key, value) in keys.into_iter().zip(values) {
        let _ = out.write_str(key);
        let _ = out.write_str(digits.format(value));
    }
}

/// Writes the fields of `style` for `rules` (of one decision or several) through `f`, as
/// `(name, value)` with the name in lower case: nothing for [`HeaderStyle::None`] or without rules. For decisions of one
/// known policy, [`PolicyFields`] writes the same with less work.
///
/// Shadow rules (see [`Limiter::with_shadow`](crate::Limiter::with_shadow)) are left out: a
/// client is told only of the limits that are enforced.
///
/// `wait` is the decision's `retry_after` when it denied: a denying rule's `t` then says when
/// more quota is available (draft-ietf-httpapi-ratelimit-headers-10 and -11), rather than when
/// all of it is back.
pub fn write_fields(
    style: HeaderStyle,
    rules: &[RuleDecision],
    wait: Option<Duration>,
    f: impl FnMut(&'static str, &str),
) {
    if let Some(enforced) = without_shadow(rules) {
        return write_fields(style, &enforced, wait, f);
    }
    if rules.is_empty() {
        return;
    }
    let names: Vec<String> = policy_names(rules).iter().map(|n| sf_string(n)).collect();
    let numbers = rules.iter().map(Numbers::from);
    write_with(style, numbers, &names, PolicyText::Of(rules), wait, f);
}

/// Writes `RateLimit-Warning` through `f` for `warnings` (rules in warning, see
/// [`Decision::warnings`](crate::Decision::warnings)) among `rules` (every rule of the decisions
/// whose fields are written with [`write_fields`], which names the items): nothing without
/// warnings. For decisions of one known policy, [`PolicyFields::write_warnings`] does it.
pub fn write_warnings(
    rules: &[RuleDecision],
    warnings: &[RuleDecision],
    f: impl FnMut(&'static str, &str),
) {
    if warnings.is_empty() {
        return;
    }
    let enforced = without_shadow(rules);
    let rules = enforced.as_deref().unwrap_or(rules);
    let names: Vec<String> = policy_names(rules).iter().map(|n| sf_string(n)).collect();
    let place = |w: &RuleDecision| {
        rules
            .iter()
            .position(|r| r.rule == w.rule && r.limiter == w.limiter)
    };
    write_warning_items(warnings.iter().cloned(), place, &names, f);
}

/// `RateLimit-Warning` through `f`: one item per rule of `warnings` that `place` finds among
/// the rules named (quoted) by `names`; nothing when none is.
fn write_warning_items(
    warnings: impl Iterator<Item = RuleDecision>,
    place: impl Fn(&RuleDecision) -> Option<usize>,
    names: &[String],
    mut f: impl FnMut(&'static str, &str),
) {
    let mut text = StackText::new();
    let mut items = 0;
    for warned in warnings {
        let Some(at) = place(&warned) else {
            continue;
        };
        let (r, t) = (warned.remaining, ceil_secs(warned.reset_after));
        write_item(&mut text, items, &names[at], [";r=", ";t="], [r, t]);
        items += 1;
    }
    if items > 0 {
        f(RATELIMIT_WARNING, text.as_str());
    }
}

/// The enforced rules of `rules`, if some of them are shadow.
fn without_shadow(rules: &[RuleDecision]) -> Option<SmallVec<[RuleDecision; INLINE_RULES]>> {
    rules
        .iter()
        .any(|r| r.shadow)
        .then(|| rules.iter().filter(|r| !r.shadow).cloned().collect())
}

/// Writes the fields of `style` for `rules` (named `names`, quoted) through `f`.
fn write_with(
    style: HeaderStyle,
    rules: impl Iterator<Item = Numbers> + Clone,
    names: &[String],
    policy: PolicyText<'_>,
    wait: Option<Duration>,
    mut f: impl FnMut(&'static str, &str),
) {
    if let Some(fields) = style.single_rule_names() {
        // The rule closest to denying: the fewest units left; of those, the longest to reset.
        let closest = rules.min_by_key(|r| (r.remaining, std::cmp::Reverse(r.reset_after)));
        let Some(rule) = closest else {
            return;
        };
        let values = [rule.limit, rule.remaining, ceil_secs(rule.reset_after)];
        let mut digits = itoa::Buffer::new();
        for (name, value) in fields.into_iter().zip(values) {
            f(name, digits.format(value));
        }
        return;
    }
    if style == HeaderStyle::None || rules.clone().next().is_none() {
        return;
    }
    let mut text = StackText::new();
    match policy {
        PolicyText::Made(policy) => f(RATELIMIT_POLICY, policy),
        PolicyText::Of(rules) => {
            write_policy(&mut text, rules, names);
            f(RATELIMIT_POLICY, text.as_str());
            text.clear();
        }
    }
    write_limits(&mut text, rules, names, wait);
    f(RATELIMIT, text.as_str());
}

/// The fields of one policy that never change, made once (at configuration load, per layer):
/// its rules' quoted item names and its `RateLimit-Policy` value. A decision over exactly these
/// rules (every admission and every rate-limit denial) then costs one formatted field, written
/// on the stack.
#[derive(Clone, Debug)]
pub struct PolicyFields {
    rules: Vec<(LimiterName, crate::Rule)>,
    names: Vec<String>,
    policy: String,
}

impl PolicyFields {
    /// The fields of `policy`.
    pub fn new(policy: &Policy) -> PolicyFields {
        let rules: Vec<RuleDecision> = policy
            .limiters()
            .iter()
            .filter(|l| !l.is_shadow())
            .flat_map(|l| {
                let limiter: LimiterName = l.name().into();
                l.rules().iter().map(move |rule| RuleDecision {
                    limiter: limiter.clone(),
                    rule: *rule,
                    allowed: true,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    shadow: false,
                })
            })
            .collect();
        let names: Vec<String> = policy_names(&rules).iter().map(|n| sf_string(n)).collect();
        let mut policy = String::new();
        write_policy(&mut policy, &rules, &names);
        PolicyFields {
            rules: rules.into_iter().map(|r| (r.limiter, r.rule)).collect(),
            names,
            policy,
        }
    }

    /// Writes `RateLimit-Warning` through `f` for `decision` of `policy` (the policy these
    /// fields are of), when it admitted a request that brought rules to their warning:
    /// `"user_id-1h";r=2;t=3600`. Nothing for a policy without warnings, at no cost.
    ///
    /// ```
    /// use tollgate::{Dimension, Identity, Limiter, MemoryStore, Policy, Tollgate, fields::PolicyFields};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let gate = Tollgate::new(MemoryStore::new());
    /// let policy = Policy::builder("export")
    ///     .limiter(Limiter::new(Dimension::UserId, ["4/1h".parse()?]).with_warning(0.5))
    ///     .build()?;
    /// let fields = PolicyFields::new(&policy);
    /// let who = Identity::new().with_user_id("u1");
    /// let mut written = Vec::new();
    /// for _ in 0..2 {
    ///     let d = gate.check(&policy, &who, 1).await?;
    ///     fields.write_warnings(&d, &policy, |name, value| written.push(format!("{name}: {value}")));
    /// }
    /// assert_eq!(written, [r#"ratelimit-warning: "user_id-1h";r=2;t=3600"#]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn write_warnings(
        &self,
        decision: &crate::Decision,
        policy: &Policy,
        f: impl FnMut(&'static str, &str),
    ) {
        if !policy.warns() {
            return;
        }
        let place = |w: &RuleDecision| {
            self.rules
                .iter()
                .position(|(limiter, r)| *r == w.rule && *limiter == w.limiter)
        };
        write_warning_items(decision.warnings(policy), place, &self.names, f);
    }

    /// The policy's `RateLimit-Policy` value.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// Writes the fields of `style` for `decision` of `policy` (the policy these fields are of;
    /// see [`write_fields`]) through `f`. A decision over exactly the policy's rules (every
    /// admission and every rate-limit denial, unless an override set a limit) costs one
    /// formatted field, written on the stack, its rules never named.
    pub fn write(
        &self,
        style: HeaderStyle,
        decision: &crate::Decision,
        policy: &Policy,
        f: impl FnMut(&'static str, &str),
    ) {
        let wait = decision.retry_after();
        // Fields made for a policy of another shape take the way that names the rules.
        let enforced = decision
            .enforced(&policy.limiters)
            .filter(|enforced| enforced.clone().count() == self.names.len());
        if let Some(enforced) = enforced {
            let numbers = enforced.map(|(rule, said)| Numbers {
                limit: rule.limit(),
                allowed: said.allowed(),
                remaining: said.remaining(),
                reset_after: Duration::from_micros(said.reset_after_us()),
            });
            let policy = PolicyText::Made(&self.policy);
            return write_with(style, numbers, &self.names, policy, wait, f);
        }
        // Overridden limits, or a decision that names some rules only: named, and written
        // as any decision's.
        write_fields(style, &decision.rules(policy), wait, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(limiter: &str, text: &str, remaining: u64, reset_secs: u64) -> RuleDecision {
        RuleDecision {
            limiter: limiter.into(),
            rule: text.parse().unwrap(),
            allowed: remaining > 0,
            remaining,
            reset_after: Duration::from_secs(reset_secs),
            shadow: false,
        }
    }

    fn collect(style: HeaderStyle, rules: &[RuleDecision]) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        write_fields(style, rules, None, |n, v| out.push((n, v.to_owned())));
        out
    }

    /// A policy's fields, written from its decisions without naming their rules, say what the
    /// fields of the decisions' named (enforced) rules say: admitted and denied, with a shadow
    /// limiter, with a limit an override set, and refusing a cost only some rules can never
    /// admit, in every style.
    #[test]
    fn a_policys_fields_write_what_its_named_rules_say() {
        use crate::{Dimension, Identity, Limiter, MemoryStore, Tollgate};
        let r = |text: &str| text.parse::<crate::Rule>().unwrap();
        let policy = Policy::builder("sms")
            .limiter(Limiter::new(
                Dimension::Ip,
                // A denying GCRA rule's wait (20 s) is not its reset (60 s).
                [r("3/1m").with_algorithm(crate::Algorithm::Gcra), r("5/1h")],
            ))
            .limiter(Limiter::new(Dimension::UserId, [r("4/10s")]).with_overrides(true))
            .limiter(
                Limiter::new(Dimension::Ip, [r("1/1d")])
                    .with_name("trial")
                    .with_shadow(true),
            )
            .build()
            .unwrap();
        let fields = PolicyFields::new(&policy);
        let gate = Tollgate::new(MemoryStore::new());
        let (who, raised) = (
            Identity::new()
                .with_ip("192.0.2.1".parse().unwrap())
                .with_user_id("u1"),
            Identity::new()
                .with_ip("192.0.2.2".parse().unwrap())
                .with_user_id("u2"),
        );
        crate::ready_now(gate.set_override(&policy, "user_id", &raised, &[r("9/10s")], None))
            .unwrap();
        let mut decisions = Vec::new();
        for who in [&who, &raised] {
            for cost in [1, 1, 1, 1, 4] {
                decisions.push(crate::ready_now(gate.check(&policy, who, cost)).unwrap());
            }
        }
        let styles = [
            HeaderStyle::Draft,
            HeaderStyle::Legacy,
            HeaderStyle::Draft6,
            HeaderStyle::None,
        ];
        let mut fast = 0;
        for decision in &decisions {
            fast += usize::from(decision.enforced(&policy.limiters).is_some());
            let rules: Vec<RuleDecision> = decision
                .rules(&policy)
                .into_iter()
                .filter(|r| !r.shadow)
                .collect();
            for style in styles {
                let (mut written, mut named) = (Vec::new(), Vec::new());
                fields.write(style, decision, &policy, |n, v| {
                    written.push((n, v.to_owned()))
                });
                write_fields(style, &rules, decision.retry_after(), |n, v| {
                    named.push((n, v.to_owned()))
                });
                assert_eq!(written, named, "{style}: {decision:?}");
                assert_eq!(written.is_empty(), style == HeaderStyle::None);
            }
        }
        // The first identity's four rate decisions take the way that names nothing; its cost
        // of 4 (over "3/1m") and the overridden identity's decisions do not.
        assert_eq!(fast, 4);
        assert!(decisions.iter().any(|d| !d.allowed()));
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
            rule("ip", "1/1m", 0, 0),
            rule("ip", "10/1h", 0, 0),
            rule("ip", "5/1h", 0, 0),
            rule("user_id", "20/1d", 0, 0),
            rule("ip", "5/500ms", 0, 0),
        ]);
        assert_eq!(
            names,
            ["ip-1m", "ip-1h-10", "ip-1h-5", "user_id-1d", "ip-500ms"]
        );
    }

    #[test]
    fn a_concurrency_limit_is_a_quota_of_concurrent_requests() {
        let rules = [
            rule("jobs", "3/5m concurrent", 1, 300),
            rule("ip", "100/1m", 99, 60),
        ];
        assert_eq!(
            collect(HeaderStyle::Draft, &rules),
            [
                (
                    RATELIMIT_POLICY,
                    r#""jobs-concurrent";q=3;qu="concurrent-requests", "ip-1m";q=100;w=60"#
                        .to_owned()
                ),
                (
                    RATELIMIT,
                    r#""jobs-concurrent";r=1;t=300, "ip-1m";r=99;t=60"#.to_owned()
                ),
            ]
        );
    }

    /// A denying rule's `t` is the wait for more quota (draft-10 and later), so `Retry-After`
    /// is never earlier than it; an admitting rule's is the time until all of it is back.
    #[test]
    fn a_denying_rules_t_is_the_wait_for_more_quota() {
        // A sliding log of 10/1m, one request at 0 s and nine at 50 s, asked again at 55 s:
        // full again in 55 s, one more unit in 5 s.
        let rules = [rule("ip", "10/1m", 0, 55), rule("ip", "100/1h", 40, 3000)];
        let mut out = Vec::new();
        write_fields(
            HeaderStyle::Draft,
            &rules,
            Some(Duration::from_secs(5)),
            |n, v| {
                out.push((n, v.to_owned()));
            },
        );
        assert_eq!(
            out[1],
            (
                RATELIMIT,
                r#""ip-1m";r=0;t=5, "ip-1h";r=40;t=3000"#.to_owned()
            )
        );
        assert_eq!(
            collect(HeaderStyle::Draft, &rules)[1].1,
            r#""ip-1m";r=0;t=55, "ip-1h";r=40;t=3000"#
        );
    }

    #[test]
    fn sf_strings_escape() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("é"), r#""?""#);
    }

    #[test]
    fn one_rule_styles_describe_the_rule_closest_to_denying() {
        let rules = [rule("ip", "10/1m", 3, 20), rule("ip", "100/1h", 3, 3000)];
        assert_eq!(
            collect(HeaderStyle::Draft6, &rules),
            [
                ("ratelimit-limit", "100".to_owned()),
                ("ratelimit-remaining", "3".to_owned()),
                ("ratelimit-reset", "3000".to_owned()),
            ]
        );
        assert!(collect(HeaderStyle::None, &rules).is_empty());
        assert!(collect(HeaderStyle::Legacy, &[]).is_empty());
    }

    #[test]
    fn long_fields_spill_to_the_heap_whole() {
        let rules: Vec<_> = (1..40)
            .map(|i| rule("a_long_limiter_name", &format!("{i}/{i}s"), 1, 1))
            .collect();
        let fields = collect(HeaderStyle::Draft, &rules);
        assert!(fields[1].1.len() > 256);
        assert_eq!(fields[1].1.matches(";r=1;t=1").count(), 39);
        assert!(
            fields[1]
                .1
                .ends_with(r#""a_long_limiter_name-39s";r=1;t=1"#),
            "{}",
            fields[1].1
        );
    }

    #[test]
    fn a_denial_always_says_why() {
        assert_eq!(HeaderStyle::None.for_answer(true), HeaderStyle::None);
        assert_eq!(HeaderStyle::None.for_answer(false), HeaderStyle::Draft);
        assert_eq!(HeaderStyle::Legacy.for_answer(false), HeaderStyle::Legacy);
    }

    #[test]
    fn styles_parse_by_name() {
        for style in [
            HeaderStyle::Draft,
            HeaderStyle::Legacy,
            HeaderStyle::Draft6,
            HeaderStyle::None,
        ] {
            assert_eq!(style.as_str().parse::<HeaderStyle>(), Ok(style));
        }
        let error = "Draft".parse::<HeaderStyle>().unwrap_err().to_string();
        assert!(
            error.contains("expected draft, legacy, draft6 or none"),
            "{error}"
        );
    }
}
