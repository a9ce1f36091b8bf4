//! `[[rlqs.buckets]]`: the buckets of Envoy's rate-limit quota service (see `crate::rlqs`),
//! each a fleet-wide rule for the bucket ids it matches.
//!
//! ```toml
//! [[rlqs.buckets]]
//! name = "checkout"                              # part of the keys; unique
//! domain = "edge"                                # the streams' domain; unset: any domain
//! bucket = { route = "checkout", tenant = "*" }  # the bucket id's entries, exactly these keys;
//!                                                # "*": any value, each value its own bucket
//! rule = "600/1m"                                # shared by every Envoy and every instance
//! ```
//!
//! A bucket counts in fixed windows: what an assignment admits lies inside the window that
//! counted it.

use std::{collections::BTreeMap, sync::Arc};

use serde::Deserialize;
use tollgate::{Algorithm, Dimension, Identity, Limiter, Policy, Rule};
use toml::Spanned;

use super::{ConfigError, Errors, valid_name};

/// The bucket id entry a bucket's value is found under (the identity of its checks).
const VALUE: &str = "bucket";
/// What a `bucket` entry matches when it matches any value.
const ANY: &str = "*";

/// `[rlqs]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRlqs {
    #[serde(default)]
    buckets: Vec<Spanned<RawBucket>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    name: Spanned<String>,
    domain: Option<String>,
    bucket: Spanned<BTreeMap<String, String>>,
    rule: Spanned<String>,
}

/// One configured bucket: what bucket ids it matches, and its fleet-wide rule as a policy of
/// one limiter by the matched values.
#[derive(Debug, Clone)]
pub(crate) struct RlqsBucket {
    pub(crate) name: String,
    domain: Option<String>,
    /// The id's entries, by key: a fixed value, or `None` for any.
    entries: BTreeMap<String, Option<String>>,
    pub(crate) policy: Arc<Policy>,
}

/// Every configured bucket, in file order (the first that matches an id serves it).
#[derive(Debug, Clone, Default)]
pub(crate) struct RlqsBuckets(pub(crate) Vec<RlqsBucket>);

impl RlqsBuckets {
    /// The bucket serving `id` (its entries, sorted by key) on a stream of `domain`, and the
    /// identity its checks count by: the values of its `*` entries.
    pub(crate) fn find(
        &self,
        domain: &str,
        id: &BTreeMap<String, String>,
    ) -> Option<(&RlqsBucket, Identity)> {
        self.0.iter().find_map(|b| {
            if b.domain.as_deref().is_some_and(|d| d != domain) || b.entries.len() != id.len() {
                return None;
            }
            let mut value = String::new();
            for ((key, wanted), (id_key, given)) in b.entries.iter().zip(id) {
                if key != id_key || wanted.as_ref().is_some_and(|w| w != given) {
                    return None;
                }
                if wanted.is_none() {
                    // Escaped parts joined by ':' (which escaping replaces): no two lists of
                    // values make one text.
                    tollgate::key::push_part(&mut value, given);
                    value.push(':');
                }
            }
            Some((b, Identity::new().with_header(VALUE, value)))
        })
    }
}

impl RawRlqs {
    pub(super) fn validate(self, errors: &Errors<'_>) -> Result<RlqsBuckets, ConfigError> {
        let mut buckets: Vec<RlqsBucket> = Vec::new();
        for (i, raw) in self.buckets.into_iter().enumerate() {
            let field = format!("rlqs.buckets[{i}]");
            let bucket = raw.into_inner().validate(&field, errors)?;
            if buckets.iter().any(|b| b.name == bucket.name) {
                return Err(errors.at(
                    None,
                    format!("{field}.name"),
                    format!(
                        "two buckets are named {:?}; give one a distinct name (they would share counters)",
                        bucket.name
                    ),
                ));
            }
            buckets.push(bucket);
        }
        Ok(RlqsBuckets(buckets))
    }
}

impl RawBucket {
    fn validate(self, field: &str, errors: &Errors<'_>) -> Result<RlqsBucket, ConfigError> {
        let name = self.name.get_ref();
        if !valid_name(name) {
            return Err(errors.at(
                Some(self.name.span()),
                format!("{field}.name"),
                "a bucket name uses only letters, digits, '_', '-' and '.' (at most 64)",
            ));
        }
        if self.bucket.get_ref().is_empty() {
            return Err(errors.at(
                Some(self.bucket.span()),
                format!("{field}.bucket"),
                "expected the bucket id's entries, e.g. { route = \"checkout\", tenant = \"*\" }",
            ));
        }
        let rule = self.rule.get_ref().parse::<Rule>().map_err(|e| {
            errors.at(
                Some(self.rule.span()),
                format!("{field}.rule"),
                format!("{e} (a rule is `limit/window`, e.g. \"600/1m\")"),
            )
        })?;
        let policy = Policy::builder(format!("rlqs.{name}"))
            .limiter(Limiter::new(
                Dimension::Header(VALUE.into()),
                [rule.with_algorithm(Algorithm::FixedWindow)],
            ))
            .build()
            .map_err(|e| {
                errors.at(
                    Some(self.rule.span()),
                    format!("{field}.rule"),
                    e.to_string(),
                )
            })?;
        let entries = self
            .bucket
            .into_inner()
            .into_iter()
            .map(|(k, v)| (k, (v != ANY).then_some(v)))
            .collect();
        Ok(RlqsBucket {
            name: self.name.into_inner(),
            domain: self.domain,
            entries,
            policy: Arc::new(policy),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn parse(text: &str) -> Result<RlqsBuckets, String> {
        let raw: RawRlqs = toml::from_str(text).map_err(|e| e.to_string())?;
        raw.validate(&Errors {
            file: "t.toml",
            text,
        })
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_bucket_matches_its_entries_exactly_and_counts_by_its_any_values() {
        let buckets = parse(
            r#"
[[buckets]]
name = "checkout"
domain = "edge"
bucket = { route = "checkout", tenant = "*" }
rule = "600/1m"

[[buckets]]
name = "all"
bucket = { route = "*" }
rule = "100/1s"
"#,
        )
        .unwrap();
        let (b, who) = buckets
            .find("edge", &id(&[("route", "checkout"), ("tenant", "t:1")]))
            .unwrap();
        assert_eq!(b.name, "checkout");
        assert_eq!(who.header(VALUE), Some("t%3A1:"));
        // Another domain, a value that differs, a key missing or added: not this bucket.
        assert!(
            buckets
                .find("other", &id(&[("route", "checkout"), ("tenant", "t1")]))
                .is_none()
        );
        assert!(
            buckets
                .find("edge", &id(&[("route", "cart"), ("tenant", "t1")]))
                .is_none()
        );
        assert!(buckets.find("edge", &id(&[("tenant", "t1")])).is_none());
        let (b, _) = buckets.find("any", &id(&[("route", "cart")])).unwrap();
        assert_eq!(b.name, "all");
        assert_eq!(
            b.policy.limiters()[0].rules()[0].algorithm(),
            Algorithm::FixedWindow
        );
    }

    #[test]
    fn bad_buckets_name_their_field() {
        let e = parse("[[buckets]]\nname = \"a\"\nbucket = {}\nrule = \"1/1s\"\n").unwrap_err();
        assert!(e.contains("rlqs.buckets[0].bucket"), "{e}");
        let e = parse(
            "[[buckets]]\nname = \"a\"\nbucket = { r = \"*\" }\nrule = \"1 per fortnight\"\n",
        )
        .unwrap_err();
        assert!(e.contains("rlqs.buckets[0].rule"), "{e}");
        let e = parse(
            "[[buckets]]\nname = \"a\"\nbucket = { r = \"*\" }\nrule = \"1/1s\"\nalgorithm = \"gcra\"\n",
        )
        .unwrap_err();
        assert!(e.contains("unknown field `algorithm`"), "{e}");
        let twice = "[[buckets]]\nname = \"a\"\nbucket = { r = \"*\" }\nrule = \"1/1s\"\n";
        let e = parse(&format!("{twice}{twice}")).unwrap_err();
        assert!(e.contains("two buckets are named"), "{e}");
    }
}
