//! The API's wire types: what requests carry and what answers say.

use std::{borrow::Cow, collections::BTreeMap, net::IpAddr, time::Duration};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Value, value::RawValue};
use tollgate::{Decision, DuplicateState, Identity, Policy, Reason, Receipt, RuleDecision};

use crate::{app::App, config::RuleText};

/// The request's identity as JSON.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdentityJson {
    pub(crate) ip: Option<IpAddr>,
    pub(crate) user_id: Option<String>,
    pub(crate) user_name: Option<String>,
    #[serde(default)]
    pub(crate) headers: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) args: BTreeMap<String, String>,
}

impl IdentityJson {
    /// Whether nothing identifies anyone.
    pub(crate) fn is_empty(&self) -> bool {
        self.ip.is_none()
            && self.user_id.is_none()
            && self.user_name.is_none()
            && self.headers.is_empty()
            && self.args.is_empty()
    }

    pub(crate) fn into_identity(self) -> Identity {
        let mut identity = Identity::new();
        if let Some(ip) = self.ip {
            identity = identity.with_ip(ip);
        }
        if let Some(id) = self.user_id {
            identity = identity.with_user_id(id);
        }
        if let Some(name) = self.user_name {
            identity = identity.with_user_name(name);
        }
        if !self.headers.is_empty() {
            for (name, value) in self.headers {
                identity = identity.with_header(name, value);
            }
        }
        if !self.args.is_empty() {
            for (name, value) in self.args {
                identity = identity.with_arg(name, value);
            }
        }
        identity
    }
}

/// `/v1/check`, `/v1/peek` and each check of `/v1/checks`; the policy name is borrowed from the
/// body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckRequest<'a> {
    #[serde(borrow)]
    pub(crate) policy: Cow<'a, str>,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
    pub(crate) cost: Option<u64>,
    /// Answer the admission's receipt, for `/v1/refund` (a lease is always answered).
    #[serde(default)]
    pub(crate) receipt: bool,
    /// How long the caller would wait for its units (GCRA rules): an admission then answers
    /// `"wait_ms"`, and its receipt to give them back if it stops waiting.
    pub(crate) max_delay_ms: Option<u64>,
}

/// `/v1/release` and `/v1/extend`: the lease `/v1/acquire` answered.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseRequest {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
    pub(crate) lease: String,
}

/// `/v1/refund`: units to give back, with the check's receipt when the caller kept it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundRequest {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
    pub(crate) cost: Option<u64>,
    pub(crate) receipt: Option<String>,
}

/// `/v1/settle`: the check's sealed receipt and what its work cost.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleRequest {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
    pub(crate) receipt: String,
    pub(crate) cost: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResetRequest {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
}

/// Writes a decision as JSON into `out`, straight from the decision: `{"allowed", "reason",
/// "retry_after_ms", "message", "rules": [{"limiter", "rule", "limit", "remaining",
/// "reset_after_ms"}]}`; a shadow limiter's rules add `"shadow": true` and `"would_deny"`, and
/// a decision that a shadow limiter would have denied adds `"shadow_denied"`, their names; an
/// admission that brought rules to their limiter's warning adds `"warnings"`: [{"limiter",
/// "rule", "remaining"}]; an admission that must wait for its units (a check with
/// `max_delay_ms`) adds `"wait_ms"`; a recorded admission adds `"receipt"`, sealed (see [`sealed_receipt`]), and `"lease"` when it
/// holds a concurrency slot.
///
/// `texts` are the policy's rules as written (see `PolicyEntry::rule_texts`); a decision's
/// rules are some of them, in the same order, so each is found by walking them once. A rule
/// that is not there (none is) is formatted instead.
pub(crate) fn write_decision(
    out: &mut Vec<u8>,
    d: &Decision,
    policy: &Policy,
    rules: &[RuleDecision],
    texts: &[RuleText],
    receipt: Option<&str>,
) {
    out.extend_from_slice(if d.allowed() {
        b"{\"allowed\":true,\"reason\":\""
    } else {
        b"{\"allowed\":false,\"reason\":\""
    });
    out.extend_from_slice(d.reason().as_str().as_bytes());
    out.extend_from_slice(b"\",\"retry_after_ms\":");
    match d.retry_after() {
        Some(wait) => write_u64(out, ceil_ms(wait)),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"message\":");
    match d.message() {
        Some(message) => write_str(out, message),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"rules\":[");
    let mut next = 0;
    for (i, r) in rules.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"limiter\":");
        write_str(out, &r.limiter);
        out.extend_from_slice(b",\"rule\":\"");
        let known = texts[next.min(texts.len())..]
            .iter()
            .position(|t| t.rule == r.rule && *t.limiter == *r.limiter);
        match known {
            Some(at) => {
                out.extend_from_slice(texts[next + at].text.as_bytes());
                next += at + 1;
            }
            None => out.extend_from_slice(r.rule.to_string().as_bytes()),
        }
        out.extend_from_slice(b"\",\"limit\":");
        write_u64(out, r.rule.limit());
        out.extend_from_slice(b",\"remaining\":");
        write_u64(out, r.remaining);
        out.extend_from_slice(b",\"reset_after_ms\":");
        write_u64(out, ceil_ms(r.reset_after));
        if r.shadow {
            out.extend_from_slice(if r.allowed {
                b",\"shadow\":true,\"would_deny\":false"
            } else {
                b",\"shadow\":true,\"would_deny\":true"
            });
        }
        out.push(b'}');
    }
    out.push(b']');
    if d.shadow_denied() {
        out.extend_from_slice(b",\"shadow_denied\":[");
        let mut last = None;
        for r in rules.iter().filter(|r| !r.allowed && r.shadow) {
            if last == Some(&r.limiter) {
                continue;
            }
            if last.is_some() {
                out.push(b',');
            }
            write_str(out, &r.limiter);
            last = Some(&r.limiter);
        }
        out.push(b']');
    }
    if policy.warns() {
        let mut warnings = d.warnings(policy).peekable();
        if warnings.peek().is_some() {
            out.extend_from_slice(b",\"warnings\":[");
            for (i, r) in warnings.enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"limiter\":");
                write_str(out, &r.limiter);
                out.extend_from_slice(b",\"rule\":");
                write_str(out, &r.rule.to_string());
                out.extend_from_slice(b",\"remaining\":");
                write_u64(out, r.remaining);
                out.push(b'}');
            }
            out.push(b']');
        }
    }
    if let Some(due) = d.due(policy) {
        out.extend_from_slice(b",\"wait_ms\":");
        write_u64(out, ceil_ms(due));
    }
    if let Some(text) = receipt {
        // A receipt's text is ASCII without quotes: written as it is.
        out.extend_from_slice(b",\"receipt\":\"");
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
        if is_lease(d, policy) {
            out.extend_from_slice(b",\"lease\":\"");
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
        }
    }
    out.push(b'}');
}

/// A concurrency limit's slot: the receipt names the lease.
fn is_lease(d: &Decision, policy: &Policy) -> bool {
    // The policy first: reading the receipt makes one.
    policy
        .limiters()
        .iter()
        .any(tollgate::Limiter::is_concurrent)
        && d.receipt().is_some()
}

/// The receipt an answer carries, sealed for its policy and identity: when the caller asked
/// (`asked`) or when it names a lease (always answered); none for an admission that recorded
/// nothing, unless it was a counted check of cost 0 (`free`): that one gets a receipt of no
/// units, stamped now, so that settling it charges the real cost (without one, an estimate
/// of 0 would make the work free).
pub(crate) fn sealed_receipt(
    app: &App,
    policy: &Policy,
    identity: &Identity,
    d: &Decision,
    (asked, free): (bool, bool),
) -> Option<String> {
    if !asked && !is_lease(d, policy) {
        return None;
    }
    let receipt = match d.receipt() {
        Some(receipt) => receipt,
        None if free && d.reason() == Reason::Ok => {
            let now = u64::try_from(crate::metrics::epoch().as_micros()).unwrap_or(u64::MAX);
            Receipt::per_limiter([now], 0, 0)
        }
        None => return None,
    };
    Some(app.receipts.seal(policy, identity, &receipt))
}

/// Room for a decision's JSON, so that writing it takes one allocation.
pub(crate) fn decision_size_hint(d: &Decision, policy: &Policy) -> usize {
    // A sealed receipt (and lease) takes about 100 bytes per limiter.
    let rules: usize = policy.limiters().iter().map(|l| l.rules().len()).sum();
    256 + 128 * rules + d.message().map_or(0, str::len)
}

fn write_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A JSON string, escaped.
fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Whole milliseconds, rounded up: waiting the answer is always long enough.
pub(crate) fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_micros().div_ceil(1000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// `/v1/checks`: the checks, each kept as its text (borrowed from the body): the shape whose
/// errors name what is wrong with a body that is not a batch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest<'a> {
    // Read only to name what is wrong with a body (the checks themselves are read by
    // `batch::AtMost`, which stops at the batch's cap).
    #[serde(borrow)]
    #[allow(dead_code)]
    pub(crate) checks: Vec<&'a RawValue>,
}

/// One check's result in a batch, written as `/v1/check`'s answer or, for a check it would
/// refuse, the problem document `/v1/check` would answer.
pub(crate) struct ItemErrorJson<'a>(pub(crate) &'a super::ApiError);

impl Serialize for ItemErrorJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.problem().serialize(serializer)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AcquireRequest {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
    #[serde(default)]
    pub(crate) args: Value,
}

#[derive(Debug, Serialize)]
pub(crate) struct AcquireJson {
    pub(crate) acquired: bool,
    pub(crate) lease: Option<String>,
    pub(crate) state: Option<DuplicateState>,
    pub(crate) retry_after_ms: u64,
    pub(crate) message: Option<&'static str>,
    /// Whether the first submission had the same `args` (false: a reused key with others).
    pub(crate) same_args: Option<bool>,
    /// The first submission's response, stored by `/v1/duplicate/complete`.
    pub(crate) response: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteRequest {
    pub(crate) lease: String,
    #[serde(default)]
    pub(crate) response: Value,
    pub(crate) keep_for: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseRequest {
    pub(crate) lease: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct BanJson {
    pub(crate) kind: &'static str,
    pub(crate) value: String,
    pub(crate) expires_in_ms: u64,
    pub(crate) strikes: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BlocklistQuery {
    pub(crate) limit: Option<String>,
    pub(crate) cursor: Option<String>,
    /// The bans of this policy, when its bans are its own (`ban_scope = "policy"`).
    pub(crate) policy: Option<String>,
}

/// `?limit=&cursor=` of the overrides' listing: the page size, and `next_cursor` of the page
/// before.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    pub(crate) limit: Option<String>,
    pub(crate) cursor: Option<String>,
}

/// `GET /v1/overrides`: one page of the overrides.
#[derive(Debug, Serialize)]
pub(crate) struct OverridesPage {
    pub(crate) overrides: Vec<OverrideJson>,
    /// Pass as `cursor` for the next page; `null` after the last one.
    pub(crate) next_cursor: Option<String>,
}

/// `?policy=` of an unban: the policy whose own ban to lift.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnbanQuery {
    pub(crate) policy: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct BlocklistPage {
    pub(crate) bans: Vec<BanJson>,
    /// Pass as `cursor` for the next page; `null` after the last one.
    pub(crate) next_cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OverrideRequest {
    pub(crate) policy: Option<String>,
    pub(crate) limiter: Option<String>,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
    /// An Envoy domain, instead of a policy: the override is the counter of `descriptor`.
    pub(crate) domain: Option<String>,
    pub(crate) descriptor: Option<Vec<EntryJson>>,
    /// `PUT`: the rules whose limits change, e.g. `["500/1h"]`; each names a rule of the
    /// limiter by its window. `DELETE` takes none.
    pub(crate) rules: Option<Vec<String>>,
    /// `PUT`: how long the override lasts, e.g. `"30d"`; absent: until removed.
    pub(crate) ttl: Option<String>,
}

/// One entry of an Envoy descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EntryJson {
    pub(crate) key: String,
    pub(crate) value: String,
}

/// One override as the API lists it.
#[derive(Debug, Serialize)]
pub(crate) struct OverrideJson {
    pub(crate) policy: String,
    pub(crate) limiter: String,
    pub(crate) value: String,
    /// The limiter's rules under the override; `None` when the configuration no longer has
    /// the rules it was made for (it is then not applied).
    pub(crate) rules: Option<Vec<String>>,
    /// When it ends, ms since the epoch; `None`: never.
    pub(crate) expires_at_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BanRequest {
    pub(crate) kind: String,
    pub(crate) value: String,
    pub(crate) duration: String,
}

/// The canonical form of a JSON value ([`tollgate::canonical_json`]): object keys sorted at
/// every depth and numbers written one way, exactly, so `{"a":1,"b":2}` and `{"b":2,"a":1.0}`
/// are one submission and `{"id":9007199254740993}` is not `{"id":9007199254740992}`.
pub(crate) fn canonical_json(value: &Value, out: &mut String) {
    tollgate::canonical_json(value, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// The decisions of a few checks of `policy`, written as answers.
    fn answers(config: &str, policy: &str, costs: &[u64]) -> Vec<String> {
        let config = Config::parse("t.toml", config).unwrap();
        let entry = &config.policies[policy];
        let gate = tollgate::Tollgate::new(tollgate::MemoryStore::new());
        let who = Identity::new()
            .with_ip("192.0.2.1".parse().unwrap())
            .with_user_id("u");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        costs
            .iter()
            .map(|&cost| {
                let d = rt.block_on(gate.check(&entry.policy, &who, cost)).unwrap();
                let mut out = Vec::new();
                let receipt = d.receipt().map(|r| r.to_string());
                write_decision(
                    &mut out,
                    &d,
                    &entry.policy,
                    &d.rules(&entry.policy),
                    &entry.rule_texts,
                    receipt.as_deref(),
                );
                assert!(
                    out.len() <= decision_size_hint(&d, &entry.policy),
                    "{}",
                    out.len()
                );
                String::from_utf8(out).unwrap()
            })
            .collect()
    }

    #[test]
    fn decisions_are_written_field_by_field() {
        let config = r#"
[policies.p]
limiters = [
  { by = "ip", name = "per \"ip\"", rules = ["2/1m", "10/1h"], message = "slow down" },
  { by = "user_id", rules = ["100/1d"], algorithm = "gcra" },
]
"#;
        let [first, _, denied, too_big] = answers(config, "p", &[1, 1, 1, 5]).try_into().unwrap();
        assert!(
            first.starts_with(
                r#"{"allowed":true,"reason":"ok","retry_after_ms":null,"message":null,"rules":[{"limiter":"per \"ip\"","rule":"2/1m","limit":2,"remaining":1,"reset_after_ms":"#
            ),
            "{first}"
        );
        let v: Value = serde_json::from_str(&first).unwrap();
        assert_eq!(v["rules"][2]["rule"], "100/1d");
        assert_eq!(v["rules"][2]["limiter"], "user_id");
        assert_eq!(v["rules"][2]["remaining"], 99);
        let v: Value = serde_json::from_str(&denied).unwrap();
        assert_eq!(v["allowed"], false);
        assert_eq!(v["reason"], "rate_limited");
        assert_eq!(v["message"], "slow down");
        let wait = v["retry_after_ms"].as_u64().unwrap();
        assert!(wait > 0 && wait <= 60_000, "{denied}");
        // A cost above some limits reports only those rules: found among the policy's.
        let v: Value = serde_json::from_str(&too_big).unwrap();
        assert_eq!(v["reason"], "cost_exceeds_limit");
        let rules: Vec<&str> = v["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["rule"].as_str().unwrap())
            .collect();
        assert_eq!(rules, ["2/1m"]);
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a: Value = serde_json::from_str(r#"{"b":[{"y":1,"x":2}],"a":"s"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"s","b":[{"x":2,"y":1}]}"#).unwrap();
        let (mut ca, mut cb) = (String::new(), String::new());
        canonical_json(&a, &mut ca);
        canonical_json(&b, &mut cb);
        assert_eq!(ca, cb);
        assert_eq!(ca, r#"{"a":"s","b":[{"x":2,"y":1}]}"#);
    }

    #[test]
    fn canonical_json_writes_each_number_one_way() {
        let canonical = |text: &str| {
            let mut out = String::new();
            canonical_json(&serde_json::from_str(text).unwrap(), &mut out);
            out
        };
        assert_eq!(
            canonical(r#"{"n":1.0,"m":[2.50,1e2]}"#),
            r#"{"m":[2.5,100],"n":1}"#
        );
        assert_eq!(canonical(r#"{"n":1}"#), canonical(r#"{"n":1.0}"#));
        assert_ne!(canonical(r#"{"n":1}"#), canonical(r#"{"n":"1"}"#));
        // Integers stay exact past 2^53, where a double has no room for them.
        assert_eq!(canonical("9007199254740993"), "9007199254740993");
        assert_ne!(
            canonical(r#"{"id":9007199254740993}"#),
            canonical(r#"{"id":9007199254740992}"#)
        );
        assert_eq!(canonical("-9223372036854775808"), "-9223372036854775808");
        assert_eq!(canonical("18446744073709551615"), "18446744073709551615");
        assert_eq!(canonical("-0.0"), "0");
        assert_eq!(canonical("1e300"), canonical("1.0e300"));
    }

    #[test]
    fn milliseconds_round_up() {
        assert_eq!(ceil_ms(Duration::from_micros(1)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(60_000)), 60_000);
        assert_eq!(ceil_ms(Duration::ZERO), 0);
    }
}
