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

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use serde::Deserialize;
use tollgate::{Algorithm, Dimension, Identity, Limiter, Policy, Rule};
use toml::Spanned;

use super::{ConfigError, Errors, valid_name};
use crate::envoy::{
    Domains,
    descriptors::{Domain, Node, NodeKind},
};

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

/// What serves a bucket id: a fleet-wide quota, or a blanket answer.
#[derive(Debug, Clone)]
pub(crate) enum Serves {
    /// A policy of one limiter by the matched values (fixed windows).
    Quota(Arc<Policy>),
    /// Every request admitted (a YAML descriptor that is `unlimited` or in shadow mode).
    AllowAll,
    /// Every request refused (a YAML descriptor of `requests_per_unit: 0`).
    DenyAll,
}

/// A bucket: its name (distinct among buckets; part of its counters' keys) and what serves it.
#[derive(Debug)]
pub(crate) struct RlqsBucket {
    pub(crate) name: String,
    pub(crate) serves: Serves,
}

/// A `[[rlqs.buckets]]` entry: what bucket ids it matches, and its bucket.
#[derive(Debug, Clone)]
struct TomlBucket {
    domain: Option<String>,
    /// The id's entries, by key: a fixed value, or `None` for any.
    entries: BTreeMap<String, Option<String>>,
    bucket: Arc<RlqsBucket>,
}

/// Every configured bucket: `[[rlqs.buckets]]` in file order (the first that matches an id
/// serves it), then the descriptors of the stream's Envoy domain (`[[envoy.domains]]` or
/// Envoy's YAML), whose buckets are made at their first report and kept for the configuration's
/// life (at most one per descriptor node).
#[derive(Debug, Clone, Default)]
pub(crate) struct RlqsBuckets {
    toml: Vec<TomlBucket>,
    nodes: Arc<Mutex<NodeBuckets>>,
}

/// The buckets of descriptor nodes, by domain and node path.
type NodeBuckets = HashMap<(String, Arc<str>), Arc<RlqsBucket>>;

impl RlqsBuckets {
    /// The bucket serving `id` on a stream of `domain`, and the identity its checks count by:
    /// a `[[rlqs.buckets]]` entry whose entries are exactly the id's (the values of its `*`
    /// entries), else the node of `domain`'s descriptor tree that limits the id's entries in
    /// some order (see `Domain::find_unordered`; the values the node's path does not fix).
    pub(crate) fn find(
        &self,
        domains: &Domains,
        domain: &str,
        id: &BTreeMap<String, String>,
    ) -> Option<(Arc<RlqsBucket>, Identity)> {
        self.find_toml(domain, id)
            .or_else(|| self.find_node(domains.get(domain)?, id))
    }

    fn find_toml(
        &self,
        domain: &str,
        id: &BTreeMap<String, String>,
    ) -> Option<(Arc<RlqsBucket>, Identity)> {
        self.toml.iter().find_map(|b| {
            if b.domain.as_deref().is_some_and(|d| d != domain) || b.entries.len() != id.len() {
                return None;
            }
            let mut value = String::new();
            for ((key, wanted), (id_key, given)) in b.entries.iter().zip(id) {
                if key != id_key || wanted.as_ref().is_some_and(|w| w != given) {
                    return None;
                }
                if wanted.is_none() {
                    push_value(&mut value, given);
                }
            }
            Some((b.bucket.clone(), Identity::new().with_header(VALUE, value)))
        })
    }

    fn find_node(
        &self,
        domain: &Domain,
        id: &BTreeMap<String, String>,
    ) -> Option<(Arc<RlqsBucket>, Identity)> {
        let (found, entries) = domain.find_unordered(id)?;
        let mut value = String::new();
        for (i, entry) in entries.iter().enumerate() {
            // A wildcard with a shared counter counts every value it matches as one.
            match found.shared.iter().find(|(at, _)| *at == i) {
                Some((_, pattern)) => push_value(&mut value, pattern),
                None => push_value(&mut value, &entry.value),
            }
        }
        let key = (domain.name.to_string(), found.node.path.clone());
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = nodes
            .entry(key)
            .or_insert_with(|| Arc::new(node_bucket(&domain.name, &found.node)))
            .clone();
        Some((bucket, Identity::new().with_header(VALUE, value)))
    }
}

/// Appends one value of an identity: escaped parts joined by ':' (which escaping replaces),
/// so that no two lists of values make one text.
fn push_value(out: &mut String, value: &str) {
    tollgate::key::push_part(out, value);
    out.push(':');
}

/// The bucket of a descriptor node: its rules in fixed windows (a bucket's assignments lie in
/// the window that counted them), or a blanket answer.
fn node_bucket(domain: &str, node: &Node) -> RlqsBucket {
    let name = format!("envoy:{domain}/{}", node.path);
    let serves = match node.kind {
        NodeKind::Unlimited => Serves::AllowAll,
        NodeKind::Blocked(_) => Serves::DenyAll,
        NodeKind::Rules if node.shadow => Serves::AllowAll,
        NodeKind::Rules => {
            let rules = node
                .rules
                .iter()
                .map(|r| r.with_algorithm(Algorithm::FixedWindow));
            match Policy::builder(format!("rlqs.{name}"))
                .limiter(Limiter::new(Dimension::Header(VALUE.into()), rules))
                .build()
            {
                Ok(policy) => Serves::Quota(Arc::new(policy)),
                Err(e) => {
                    // The node's rules were valid as a descriptor's: refuse rather than admit
                    // what nothing counts.
                    tracing::error!(bucket = %name, error = %e, "an RLQS bucket from a descriptor cannot be served; denying it");
                    Serves::DenyAll
                }
            }
        }
    };
    RlqsBucket { name, serves }
}

impl RawRlqs {
    pub(super) fn validate(self, errors: &Errors<'_>) -> Result<RlqsBuckets, ConfigError> {
        let mut buckets: Vec<TomlBucket> = Vec::new();
        for (i, raw) in self.buckets.into_iter().enumerate() {
            let field = format!("rlqs.buckets[{i}]");
            let bucket = raw.into_inner().validate(&field, errors)?;
            if buckets.iter().any(|b| b.bucket.name == bucket.bucket.name) {
                return Err(errors.at(
                    None,
                    format!("{field}.name"),
                    format!(
                        "two buckets are named {:?}; give one a distinct name (they would share counters)",
                        bucket.bucket.name
                    ),
                ));
            }
            buckets.push(bucket);
        }
        Ok(RlqsBuckets {
            toml: buckets,
            nodes: Arc::default(),
        })
    }
}

impl RawBucket {
    fn validate(self, field: &str, errors: &Errors<'_>) -> Result<TomlBucket, ConfigError> {
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
        Ok(TomlBucket {
            domain: self.domain,
            entries,
            bucket: Arc::new(RlqsBucket {
                name: self.name.into_inner(),
                serves: Serves::Quota(Arc::new(policy)),
            }),
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
            .find(
                &Domains::default(),
                "edge",
                &id(&[("route", "checkout"), ("tenant", "t:1")]),
            )
            .unwrap();
        assert_eq!(b.name, "checkout");
        assert_eq!(who.header(VALUE), Some("t%3A1:"));
        // Another domain, a value that differs, a key missing or added: not this bucket.
        assert!(
            buckets
                .find(
                    &Domains::default(),
                    "other",
                    &id(&[("route", "checkout"), ("tenant", "t1")])
                )
                .is_none()
        );
        assert!(
            buckets
                .find(
                    &Domains::default(),
                    "edge",
                    &id(&[("route", "cart"), ("tenant", "t1")])
                )
                .is_none()
        );
        assert!(
            buckets
                .find(&Domains::default(), "edge", &id(&[("tenant", "t1")]))
                .is_none()
        );
        let (b, _) = buckets
            .find(&Domains::default(), "any", &id(&[("route", "cart")]))
            .unwrap();
        assert_eq!(b.name, "all");
        let Serves::Quota(policy) = &b.serves else {
            panic!("{:?}", b.serves)
        };
        assert_eq!(
            policy.limiters()[0].rules()[0].algorithm(),
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
