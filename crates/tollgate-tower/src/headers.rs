//! `RateLimit-Policy`, `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11), the one-rule forms
//! and `Retry-After` in a `HeaderMap`; the text comes from [`tollgate::fields`].

use std::{borrow::Cow, cmp::Reverse, time::Duration};

use http::{HeaderMap, HeaderName, HeaderValue, header};
pub use tollgate::fields::HeaderStyle;
use tollgate::{
    Decision, Policy, RuleDecision,
    fields::{self, PolicyFields as Fields},
};

pub(crate) use tollgate::fields::{ceil_secs, policy_names};

/// Inserts `(name, value)` pairs as written by [`tollgate::fields`] (lower-case names).
fn insert(headers: &mut HeaderMap) -> impl FnMut(&'static str, &str) + '_ {
    |name, value| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(header_name(name), value);
        }
    }
}

/// Adds `(name, value)` pairs of list fields (`RateLimit-Warning`) after any items already
/// there: a layer below (of another header style) or the service may have warned too.
fn append(headers: &mut HeaderMap) -> impl FnMut(&'static str, &str) + '_ {
    |name, value| {
        let value = match field_lines(headers, name) {
            Some(there) => HeaderValue::from_str(&format!("{there}, {value}")),
            None => HeaderValue::from_str(value),
        };
        if let Ok(value) = value {
            headers.insert(header_name(name), value);
        }
    }
}

/// The header of a field [`tollgate::fields`] writes: made at compile time for the fields every
/// answer carries (`HeaderName::from_static` looks a name up among the standard ones first).
fn header_name(name: &'static str) -> HeaderName {
    const RATELIMIT: HeaderName = HeaderName::from_static(fields::RATELIMIT);
    const RATELIMIT_POLICY: HeaderName = HeaderName::from_static(fields::RATELIMIT_POLICY);
    match name {
        fields::RATELIMIT => RATELIMIT,
        fields::RATELIMIT_POLICY => RATELIMIT_POLICY,
        _ => HeaderName::from_static(name),
    }
}

/// Writes the fields of `style` for `rules` (of one or several decisions); `wait` is the
/// `retry_after` of a denial (see [`fields::write_fields`]).
pub(crate) fn insert_fields(
    style: HeaderStyle,
    rules: &[RuleDecision],
    wait: Option<std::time::Duration>,
    headers: &mut HeaderMap,
) {
    fields::write_fields(style, rules, wait, insert(headers));
}

/// Adds `RateLimit-Warning` items for `warnings` among `rules` after any already there (see
/// [`fields::write_warnings`]).
pub(crate) fn insert_warnings(
    rules: &[RuleDecision],
    warnings: &[RuleDecision],
    headers: &mut HeaderMap,
) {
    fields::write_warnings(rules, warnings, append(headers));
}

/// Whether `headers` already carry the fields of `style` (a layer below, a refusal or the
/// service wrote them).
pub(crate) fn has_fields(style: HeaderStyle, headers: &HeaderMap) -> bool {
    let name = match style {
        HeaderStyle::Legacy => "x-ratelimit-limit",
        HeaderStyle::Draft6 => "ratelimit-limit",
        _ => "ratelimit",
    };
    headers.contains_key(name)
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
/// tollgate_tower::insert_rate_limit_headers(&decision, &policy, &mut headers);
/// assert_eq!(headers["ratelimit-policy"], r#""ip-1m";q=1;w=60"#);
/// assert_eq!(headers["ratelimit"], r#""ip-1m";r=0;t=60"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub fn insert_rate_limit_headers(decision: &Decision, policy: &Policy, headers: &mut HeaderMap) {
    insert_fields(
        HeaderStyle::Draft,
        &decision.rules(policy),
        decision.retry_after(),
        headers,
    );
}

/// The fields of one policy that never change, made once per layer.
pub(crate) struct PolicyFields {
    fields: Fields,
    /// The `RateLimit-Policy` value, made once.
    policy: Option<HeaderValue>,
}

impl PolicyFields {
    pub(crate) fn new(policy: &Policy) -> PolicyFields {
        let fields = Fields::new(policy);
        PolicyFields {
            policy: HeaderValue::from_str(fields.policy()).ok(),
            fields,
        }
    }

    /// Inserts the fields of `style` for `decision`, beside any already there (see
    /// [`merge`](Self::merge)).
    pub(crate) fn insert(
        &self,
        style: HeaderStyle,
        decision: &Decision,
        policy: &Policy,
        headers: &mut HeaderMap,
    ) {
        if has_fields(style, headers) {
            return self.merge(style, decision, policy, headers);
        }
        self.fields.write(style, decision, policy, |name, value| {
            if name == fields::RATELIMIT_POLICY {
                if let Some(policy) = self
                    .policy
                    .as_ref()
                    .filter(|p| p.as_bytes() == value.as_bytes())
                {
                    headers.insert(header_name(name), policy.clone());
                    return;
                }
            }
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(header_name(name), value);
            }
        });
        if style != HeaderStyle::None {
            self.fields
                .write_warnings(decision, policy, append(headers));
        }
    }

    /// [`merge_fields`] of this policy's fields for `decision`.
    #[cold]
    #[inline(never)]
    fn merge(
        &self,
        style: HeaderStyle,
        decision: &Decision,
        policy: &Policy,
        headers: &mut HeaderMap,
    ) {
        let mut ours = Vec::new();
        let mut add = |name, value: &str| ours.push((name, value.to_owned()));
        self.fields.write(style, decision, policy, &mut add);
        if style != HeaderStyle::None {
            self.fields.write_warnings(decision, policy, &mut add);
        }
        merge_fields(style, ours, headers);
    }
}

/// Marks the answer of a [`Rejection`](crate::Rejection) of a rate limit: its fields are the
/// refusing decision's own, which the [`Context`](crate::Context)'s admissions must not join.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RateLimitRefusal;

/// Writes the fields of `style` for `rules` and their `warnings` (the checks of one request
/// under a [`Context`](crate::Context)), beside any already there (see [`merge_fields`]),
/// except on a refusal's own (see [`RateLimitRefusal`]).
pub(crate) fn add_fields(
    style: HeaderStyle,
    rules: &[RuleDecision],
    warnings: &[RuleDecision],
    response: &mut http::response::Parts,
) {
    if rules.is_empty() {
        return;
    }
    let headers = &mut response.headers;
    if has_fields(style, headers) {
        // A refusal by guarded code says what refused it: the admissions before it in the
        // same request would name the same rules again, with counts from before.
        if response.extensions.get::<RateLimitRefusal>().is_some() {
            return;
        }
        let mut ours = Vec::new();
        let mut add = |name, value: &str| ours.push((name, value.to_owned()));
        fields::write_fields(style, rules, None, &mut add);
        if style != HeaderStyle::None {
            fields::write_warnings(rules, warnings, &mut add);
        }
        return merge_fields(style, ours, headers);
    }
    insert_fields(style, rules, None, headers);
    if style != HeaderStyle::None {
        insert_warnings(rules, warnings, headers);
    }
}

/// Adds `ours`, rate-limit fields of `style`, to a response that already carries such fields:
/// a layer below wrote them (nested layers: one over the whole API, one over a route), or the
/// service did. No policy's fields hide another's. The draft's lists (`RateLimit-Policy`,
/// `RateLimit`, `RateLimit-Warning`) take our items after those there; the one-rule styles
/// keep, of the two, the rule the style itself picks among a policy's rules: fewer units left,
/// then the longer to reset (those there on a tie, ours when those there name no count).
#[cold]
#[inline(never)]
fn merge_fields(style: HeaderStyle, ours: Vec<(&'static str, String)>, headers: &mut HeaderMap) {
    let one_rule = match style {
        HeaderStyle::Legacy => Some(("x-ratelimit-remaining", "x-ratelimit-reset")),
        HeaderStyle::Draft6 => Some(("ratelimit-remaining", "ratelimit-reset")),
        _ => None,
    };
    let closer = one_rule.is_some_and(|(remaining, reset)| {
        let number = |text: Option<&str>| text.and_then(|t| t.trim().parse::<u64>().ok());
        let mine = |name| number(ours.iter().find(|(n, _)| *n == name).map(|(_, v)| &**v));
        let theirs = |name| number(field_lines(headers, name).as_deref());
        match (mine(remaining), theirs(remaining)) {
            (Some(mine_left), Some(their_left)) => {
                let (mine_reset, their_reset) = (mine(reset), theirs(reset));
                (mine_left, Reverse(mine_reset)) < (their_left, Reverse(their_reset))
            }
            (_, None) => true,
            (None, Some(_)) => false,
        }
    });
    for (name, value) in ours {
        if one_rule.is_none() || name == fields::RATELIMIT_WARNING {
            append(headers)(name, &value);
        } else if closer || field_lines(headers, name).is_none() {
            insert(headers)(name, &value);
        }
    }
}

/// Every line of the field `name`, as one list; `None` if it is absent or not text.
fn field_lines<'h>(headers: &'h HeaderMap, name: &str) -> Option<Cow<'h, str>> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next()?.to_str().ok()?;
    let mut joined = Cow::Borrowed(first);
    for line in lines {
        let text = joined.to_mut();
        text.push_str(", ");
        text.push_str(line.to_str().ok()?);
    }
    Some(joined)
}

pub(crate) fn insert_retry_after(retry_after: Duration, headers: &mut HeaderMap) {
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(ceil_secs(retry_after)),
    );
}
