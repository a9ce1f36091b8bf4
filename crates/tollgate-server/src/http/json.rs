//! The API's wire types: what requests carry and what answers say.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use serde::{Deserialize, Serialize, Serializer, ser::SerializeStruct as _};
use serde_json::Value;
use tollgate::{Decision, DuplicateState, Identity, RuleDecision};

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
        for (name, value) in self.headers {
            identity = identity.with_header(name, value);
        }
        for (name, value) in self.args {
            identity = identity.with_arg(name, value);
        }
        identity
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckRequest {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
    pub(crate) cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResetRequest {
    pub(crate) policy: String,
    #[serde(default)]
    pub(crate) identity: IdentityJson,
}

/// A decision as JSON, written straight from the decision: no intermediate strings.
///
/// `{"allowed", "reason", "retry_after_ms", "message", "rules": [{"limiter", "rule", "limit",
/// "remaining", "reset_after_ms"}]}`.
pub(crate) struct DecisionJson<'a>(pub(crate) &'a Decision);

impl Serialize for DecisionJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        let mut out = serializer.serialize_struct("Decision", 5)?;
        out.serialize_field("allowed", &d.allowed())?;
        out.serialize_field("reason", &d.reason())?;
        out.serialize_field("retry_after_ms", &d.retry_after().map(ceil_ms))?;
        out.serialize_field("message", &d.message())?;
        out.serialize_field("rules", &RulesJson(d.rules()))?;
        out.end()
    }
}

impl DecisionJson<'_> {
    /// Room for the whole answer, so that writing it takes one allocation.
    pub(crate) fn size_hint(&self) -> usize {
        128 + 128 * self.0.rules().len() + self.0.message().map_or(0, str::len)
    }
}

struct RulesJson<'a>(&'a [RuleDecision]);

impl Serialize for RulesJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(RuleJson))
    }
}

struct RuleJson<'a>(&'a RuleDecision);

impl Serialize for RuleJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut out = serializer.serialize_struct("Rule", 5)?;
        out.serialize_field("limiter", &*r.limiter)?;
        out.serialize_field("rule", &Text(&r.rule))?;
        out.serialize_field("limit", &r.rule.limit())?;
        out.serialize_field("remaining", &r.remaining)?;
        out.serialize_field("reset_after_ms", &ceil_ms(r.reset_after))?;
        out.end()
    }
}

/// A value serialized as its `Display` text, written into the output without a `String`.
struct Text<'a, T>(&'a T);

impl<T: std::fmt::Display> Serialize for Text<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self.0)
    }
}

/// Whole milliseconds, rounded up: waiting the answer is always long enough.
pub(crate) fn ceil_ms(d: Duration) -> u64 {
    let ms = d.as_micros().div_ceil(1000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// `/v1/checks`: the checks, each parsed on its own so that one malformed check fails alone.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    pub(crate) checks: Vec<Value>,
}

/// `/v1/checks`' answer: one result per check, in order.
#[derive(Serialize)]
pub(crate) struct BatchJson {
    pub(crate) results: Vec<ItemJson>,
}

/// One check's result in a batch: its decision, or the error `/v1/check` would have answered
/// (`{"error", "status"}`, with that answer's HTTP status).
// A batch holds one per check; boxing the decision would cost an allocation per check.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ItemJson {
    Decision(Decision),
    Error(super::ApiError),
}

impl Serialize for ItemJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ItemJson::Decision(d) => DecisionJson(d).serialize(serializer),
            ItemJson::Error(e) => {
                let mut out = serializer.serialize_struct("Error", 2)?;
                out.serialize_field("error", &e.message)?;
                out.serialize_field("status", &e.status.as_u16())?;
                out.end()
            }
        }
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
}

#[derive(Debug, Serialize)]
pub(crate) struct BlocklistPage {
    pub(crate) bans: Vec<BanJson>,
    /// Pass as `cursor` for the next page; `null` after the last one.
    pub(crate) next_cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BanRequest {
    pub(crate) kind: String,
    pub(crate) value: String,
    pub(crate) duration: String,
}

/// JSON with object keys sorted at every depth, so `{"a":1,"b":2}` and `{"b":2,"a":1}` are
/// one submission whatever map type serde_json was built with.
pub(crate) fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn milliseconds_round_up() {
        assert_eq!(ceil_ms(Duration::from_micros(1)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(60_000)), 60_000);
        assert_eq!(ceil_ms(Duration::ZERO), 0);
    }
}
