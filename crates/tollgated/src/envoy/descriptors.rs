//! The descriptor tree of each configured domain, built once per configuration load, and
//! matching a request descriptor to the node that limits it.

use std::{collections::HashMap, fmt::Write as _, ops::Range, sync::Arc};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
        service::ratelimit::v3::rate_limit_response::{RateLimit, rate_limit::Unit},
    },
    google::protobuf::Duration as PbDuration,
};
use serde::Deserialize;
use smallvec::SmallVec;
use tollgate::{Algorithm, BanRule, OnError, Rule, key::push_part};
use toml::Spanned;

use super::stats::StatSettings;
use crate::{
    config::{
        RawBlocklist, RuleList,
        envoy_yaml::{Limit, YamlDescriptor, YamlFile},
    },
    metrics::DecisionHandles,
};

/// `[[envoy.domains]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDomain {
    pub(crate) name: String,
    /// Descriptor keys whose values are an identity (`remote_address = "ip"`,
    /// `user = "user_id"`): a request carrying one is checked against the blocklist, and a
    /// descriptor with a `blocklist` bans it.
    #[serde(default)]
    pub(crate) identity: std::collections::BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub(crate) descriptors: Vec<Spanned<RawDescriptor>>,
}

/// One descriptor of a domain as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    #[serde(default)]
    pub(crate) rules: RuleList,
    pub(crate) algorithm: Option<Algorithm>,
    #[serde(default)]
    pub(crate) shadow: bool,
    /// A denial by this descriptor bans the request's identity (see `RawDomain::identity`).
    pub(crate) blocklist: Option<RawBlocklist>,
    /// Descriptor values may get limits of their own at run time (`PUT /v1/overrides`).
    #[serde(default)]
    pub(crate) overrides: bool,
    #[serde(default)]
    pub(crate) descriptors: Vec<Spanned<RawDescriptor>>,
}

/// A configuration error inside one domain: span, field path below the domain, message.
pub(crate) type DomainError = (Range<usize>, String, String);

/// The configured domains.
#[derive(Debug, Clone, Default)]
pub(crate) struct Domains {
    map: HashMap<String, Arc<Domain>>,
    summary: String,
    stats: StatSettings,
}

impl Domains {
    /// How the YAML domains' statistics are counted.
    pub(crate) fn stats(&self) -> StatSettings {
        self.stats
    }

    pub(crate) fn summary(&self) -> &str {
        &self.summary
    }

    /// The descriptors (`domain/path`) with a rule whose window is `long` (see
    /// `config::long_window`), sorted.
    pub(crate) fn with_rules(&self, long: impl Fn(&Rule) -> bool) -> Vec<String> {
        let mut found = Vec::new();
        for domain in self.map.values() {
            domain.root.with_rules(&domain.name, &long, &mut found);
        }
        found.sort();
        found
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Domain>> {
        self.map.get(name)
    }

    /// No domain is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// How a domain answers: tollgate's way (TOML) or as Envoy's reference service does for its
/// YAML, field for field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Semantics {
    /// `current_limit.name` is the descriptor's path, `duration_until_reset` exact, an
    /// OVER_LIMIT status says what is left, a failing store is answered by `on_error`.
    Tollgate,
    /// The reference's: `current_limit.name` is the YAML's `name` (else empty),
    /// `duration_until_reset` whole seconds to the end of the unit by this server's clock,
    /// OVER_LIMIT says 0 left, and a failing store fails the call (`UNAVAILABLE`: Envoy's
    /// `failure_mode_deny` decides) unless `on_error` was set. `shadow` keeps each status and
    /// makes only the overall code OK (the reference's `SHADOW_MODE`). With `independent`
    /// (the reference's default), each counter is checked and counted on its own, as the
    /// reference increments every descriptor; without (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`),
    /// all or nothing.
    Reference {
        fail_call: bool,
        shadow: bool,
        independent: bool,
        /// The reference's `QUOTA_MODE`: every descriptor in quota mode.
        quota: bool,
        /// The reference's `RESPONSE_DYNAMIC_METADATA`: answers carry `dynamic_metadata`.
        metadata: bool,
        /// Counted as the reference counts (the YAML's fixed windows, the default): every
        /// descriptor's hits are added to its counter, over the limit too, and a descriptor
        /// is over when its counter then is (see `Node::counting`).
        counting: bool,
        /// tollgate's `[envoy] denial_headers`: an answer over its limits also carries the
        /// draft's rate-limit fields, as TOML domains' denials do.
        denial_headers: bool,
    },
}

impl Semantics {
    /// Whether each descriptor is counted on its own (else all or nothing), and whether as the
    /// reference counts (see `Semantics::Reference`); neither for tollgate's domains.
    pub(crate) fn counting(self) -> (bool, bool) {
        match self {
            Semantics::Reference {
                independent,
                counting,
                ..
            } => (independent, counting),
            Semantics::Tollgate => (false, false),
        }
    }

    /// The reference's answers: the call fails when the store does, unless `on_error` was
    /// set (`on_error_set`); each descriptor counted as the reference counts; the modes off.
    pub(crate) fn reference(on_error_set: bool) -> Semantics {
        Semantics::Reference {
            fail_call: !on_error_set,
            shadow: false,
            independent: true,
            quota: false,
            metadata: false,
            counting: true,
            denial_headers: false,
        }
    }
}

/// One domain: its descriptor tree, and the part of its counters' keys it fixes.
#[derive(Debug)]
pub(crate) struct Domain {
    /// The domain's name, as requests give it.
    pub(crate) name: Box<str>,
    /// `envoy:<domain>`: the metrics' policy label, and the scope of the counters' keys.
    pub(crate) scope: Arc<str>,
    /// The scope escaped as a key part, written once here rather than per request.
    scope_part: Box<str>,
    pub(crate) on_error: OnError,
    /// Configured in the YAML of Envoy's reference service: its answers are the reference's
    /// (see `Semantics`).
    pub(crate) semantics: Semantics,
    /// The domain's decision counters.
    pub(crate) metrics: DecisionHandles,
    /// Descriptor keys whose values are an identity, and which (`ip` or `user_id`).
    pub(crate) identity: Box<[(String, &'static str)]>,
    root: Level,
}

#[derive(Debug, Default)]
struct Level {
    by_key: HashMap<String, KeyEntry>,
}

impl Level {
    /// The nodes under this level with a rule that `long` picks, as `domain/path`.
    fn with_rules(&self, domain: &str, long: &impl Fn(&Rule) -> bool, found: &mut Vec<String>) {
        for entry in self.by_key.values() {
            let nodes = entry
                .by_value
                .values()
                .chain(entry.wildcards.iter().map(|(_, node)| node))
                .chain(&entry.any);
            for node in nodes {
                if node.rules.iter().any(long) {
                    found.push(format!("{domain}/{}", node.path));
                }
                node.children.with_rules(domain, long, found);
            }
        }
    }
}

impl Level {
    /// The node at `path` (see [`Node::path`]) under this level.
    fn node_at(&self, path: &str) -> Option<&Arc<Node>> {
        self.by_key.values().find_map(|entry| {
            let mut nodes = entry
                .by_value
                .values()
                .chain(entry.wildcards.iter().map(|(_, node)| node))
                .chain(&entry.any);
            nodes.find_map(|node| match &*node.path == path {
                true => Some(node),
                false => node.children.node_at(path),
            })
        })
    }
}

#[derive(Debug, Default)]
struct KeyEntry {
    by_value: HashMap<String, Arc<Node>>,
    /// Values with `*` (each matches any run of characters), tried in configuration order
    /// after the exact values and before the key-only node.
    wildcards: Vec<(Wildcard, Arc<Node>)>,
    any: Option<Arc<Node>>,
}

/// A value pattern with `*`, split on it once at load.
#[derive(Debug)]
pub(crate) struct Wildcard {
    text: Arc<str>,
    parts: Box<[Box<str>]>,
}

impl Wildcard {
    /// `Some` if `value` has a `*`.
    pub(crate) fn new(value: &str) -> Option<Wildcard> {
        value.contains('*').then(|| Wildcard {
            text: value.into(),
            parts: value.split('*').map(Into::into).collect(),
        })
    }

    /// Whether `value` matches: the first part as a prefix, the last as a suffix, the middle
    /// ones in order in between, each `*` standing for any run of characters (none included).
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        let fixed: usize = self.parts.iter().map(|p| p.len()).sum();
        if value.len() < fixed || !value.starts_with(&**first) || !value.ends_with(&**last) {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(&**part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// A node of the tree: what limits the descriptors that end here.
#[derive(Debug)]
pub(crate) struct Node {
    /// `key` or `key=value` segments joined by `/`, for names and logs.
    pub(crate) path: Arc<str>,
    /// The rules, in configuration order; empty for a node that only holds children (or is
    /// unlimited, or blocks).
    pub(crate) rules: Box<[Rule]>,
    /// The smallest limit of the rules: the largest cost they can admit.
    pub(crate) max_cost: u64,
    pub(crate) shadow: bool,
    /// Envoy's `quota_mode`: over its limit, the request stays OK unless every quota
    /// descriptor of it is over.
    pub(crate) quota: bool,
    /// Envoy's descriptor `metadata`, for the answer's `dynamic_metadata`.
    pub(crate) metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// How the node limits beyond its rules (Envoy's YAML).
    pub(crate) kind: NodeKind,
    /// Envoy's `rate_limit.name`, which `replaces` of another matched descriptor names.
    pub(crate) name: Option<Arc<str>>,
    /// The names of the limits this one replaces when both match one request.
    pub(crate) replaces: Box<[Arc<str>]>,
    /// Envoy's `share_threshold`: every value this wildcard matches counts in one counter.
    pub(crate) share_threshold: bool,
    /// This level's part of a statistics key as configured: `key`, or `key_value` (the
    /// value may be a wildcard).
    stat_part: Box<str>,
    /// Envoy's `detailed_metric`: descriptors ending here are counted under their own values.
    detailed_metric: bool,
    /// Envoy's `value_to_metric`: this level's part of a statistics key takes the request's
    /// value when the configuration gives none (no value, or a wildcard not shared).
    value_to_metric: bool,
    /// A denial by this node bans the request's identity.
    pub(crate) ban: Option<BanRule>,
    /// Descriptor values may have limits of their own: the fingerprint of the rules (see
    /// [`tollgate::OverrideStore`]).
    pub(crate) overrides: Option<std::num::NonZeroU64>,
    /// The rule a domain that counts as the reference does checks instead of `rules`: a fixed
    /// window of the same length whose limit ([`COUNT_ALL`]) no count reaches, so that every
    /// hit is added and the count read back (empty where the rules are not one fixed window).
    pub(crate) counting: Box<[Rule]>,
    children: Level,
}

/// The most entries a bucket id of Envoy's quota service has to be matched against a domain's
/// tree (every order of them is tried: 120 at most).
pub(crate) const MAX_UNORDERED: usize = 5;

/// The limit of a counting rule (see `Node::counting`): beyond any count, and exact in Lua's
/// doubles.
pub(crate) const COUNT_ALL: u64 = 1 << 52;

/// What a node does to the descriptors that end on it, beyond its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// Its rules limit (none: it only holds children; ending here is not limited).
    Rules,
    /// Envoy's `unlimited: true`: matched, never counted, OK with `u32::MAX` remaining.
    Unlimited,
    /// Envoy's `requests_per_unit: 0`: always over, reported as 0 per this unit.
    Blocked(Unit),
}

impl Node {
    fn new(path: Arc<str>, rules: Box<[Rule]>, shadow: bool, children: Level) -> Node {
        let counting = match &*rules {
            [rule]
                if rule.algorithm() == Algorithm::FixedWindow
                    && rule.calendar_window().is_none() =>
            {
                Rule::new(
                    COUNT_ALL,
                    std::time::Duration::from_millis(rule.window_ms()),
                )
                .map(|r| Box::new([r.with_algorithm(Algorithm::FixedWindow)]) as Box<[Rule]>)
                .unwrap_or_default()
            }
            _ => Box::default(),
        };
        Node {
            counting,
            path,
            max_cost: rules.iter().map(max_cost).min().unwrap_or(0),
            rules,
            shadow,
            quota: false,
            metadata: None,
            kind: NodeKind::Rules,
            name: None,
            replaces: Box::new([]),
            share_threshold: false,
            stat_part: Box::default(),
            detailed_metric: false,
            value_to_metric: false,
            ban: None,
            overrides: None,
            children,
        }
    }

    /// Whether a descriptor that ends here is limited (or unlimited) by this node.
    fn limits(&self) -> bool {
        !self.rules.is_empty() || self.kind != NodeKind::Rules
    }

    /// The rule with the lowest rate, as Envoy's `current_limit` (statuses without outcomes).
    pub(crate) fn lowest_rate(&self) -> Option<RateLimit> {
        lowest_rate(&self.rules).map(|rule| current_limit(rule, &self.path))
    }
}

impl Domain {
    /// Appends the key of the counter `name` (see [`counter_name`]) under `prefix`
    /// ([`tollgate::key::push_descriptor_key`]).
    pub(crate) fn push_key(&self, out: &mut String, prefix: &str, name: &str) {
        tollgate::key::push_descriptor_key(out, prefix, &self.scope_part, name);
    }

    /// The counter a descriptor with `entries` counts on, for an override of its limits: its
    /// key under `prefix`, its node, and its name; why not when no node limits it or the node
    /// takes no overrides.
    pub(crate) fn override_counter(
        &self,
        prefix: &str,
        entries: &[Entry],
    ) -> Result<(String, Arc<Node>, String), String> {
        let found = self.find(entries, None).ok_or_else(|| {
            format!(
                "no descriptor of domain {:?} limits these entries",
                self.scope.trim_start_matches("envoy:")
            )
        })?;
        let node = found.node;
        if node.overrides.is_none() || node.kind != NodeKind::Rules {
            return Err(format!(
                "descriptor {:?} takes no overrides: configure it with `overrides = true`",
                node.path
            ));
        }
        let mut name = String::new();
        counter_name(&mut name, entries, &found.shared);
        let mut key = String::new();
        self.push_key(&mut key, prefix, &name);
        Ok((key, node, name))
    }

    /// The node at `path` (see [`Node::path`]), if the domain has it.
    pub(crate) fn node_at(&self, path: &str) -> Option<&Arc<Node>> {
        self.root.node_at(path)
    }

    /// The node that limits a request descriptor with these entries, if any: at each level an
    /// exact value first, then the wildcards in configuration order, then the key alone.
    /// With `stat`, writes there the key the reference's statistics count the descriptor
    /// under (see [`Domain::stat_key`]).
    pub(crate) fn find(&self, entries: &[Entry], stat: Option<&mut String>) -> Option<Found> {
        let mut level = &self.root;
        let last = entries.len().checked_sub(1)?;
        let mut shared = SmallVec::new();
        // Each level's node and whether its value came from the configuration.
        let mut path: SmallVec<[(&Node, bool); 4]> = SmallVec::new();
        for (i, entry) in entries.iter().enumerate() {
            let keyed = level.by_key.get(&entry.key)?;
            let (node, exact) = match keyed.by_value.get(&entry.value) {
                Some(node) => (node, true),
                None => match keyed
                    .wildcards
                    .iter()
                    .find(|(w, _)| w.matches(&entry.value))
                {
                    Some((wildcard, node)) => {
                        if node.share_threshold {
                            shared.push((i, wildcard.text.clone()));
                        }
                        (node, node.share_threshold)
                    }
                    None => (keyed.any.as_ref()?, false),
                },
            };
            path.push((node, exact));
            if i == last {
                if !node.limits() {
                    return None;
                }
                if let Some(out) = stat {
                    self.stat_key(out, entries, &path, &shared);
                }
                return Some(Found {
                    node: node.clone(),
                    shared,
                });
            }
            level = &node.children;
        }
        None
    }

    /// The node that limits a descriptor of these entries in some order, for a bucket id of
    /// Envoy's quota service (a map, where a descriptor is a list): the first order of its
    /// entries, in lexicographic order of the orders of their keys, that [`Domain::find`]
    /// matches, with the entries in that order. An id of more than [`MAX_UNORDERED`] entries
    /// matches nothing.
    pub(crate) fn find_unordered(
        &self,
        id: &std::collections::BTreeMap<String, String>,
    ) -> Option<(Found, Vec<Entry>)> {
        if id.len() > MAX_UNORDERED {
            return None;
        }
        let all: Vec<Entry> = id
            .iter()
            .map(|(key, value)| Entry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        let mut order = Vec::with_capacity(all.len());
        self.find_in_order(&all, &mut order)
    }

    /// [`Domain::find_unordered`] of the orders that begin with `order` (indexes into `all`).
    fn find_in_order(&self, all: &[Entry], order: &mut Vec<usize>) -> Option<(Found, Vec<Entry>)> {
        if order.len() == all.len() {
            let entries: Vec<Entry> = order.iter().map(|&i| all[i].clone()).collect();
            return self.find(&entries, None).map(|found| (found, entries));
        }
        for i in 0..all.len() {
            // An order whose first key has no node at the root matches nothing.
            if order.contains(&i) || order.is_empty() && !self.root.by_key.contains_key(&all[i].key)
            {
                continue;
            }
            order.push(i);
            if let Some(found) = self.find_in_order(all, order) {
                return Some(found);
            }
            order.pop();
        }
        None
    }

    /// A descriptor's values as a shared record keeps them (`record.identities = "hashed"`):
    /// a value the tree names at its level is kept; one a wildcard matched becomes the
    /// wildcard with `hashed(value)` for each `*` (it still matches that wildcard, and keeps
    /// apart from other values); any other is `hashed(value)`. So a plan matches the record
    /// as the server matched the traffic, without the values nobody configured.
    pub(crate) fn record_values(
        &self,
        entries: &[Entry],
        hashed: &dyn Fn(&str) -> String,
    ) -> Vec<String> {
        let mut level = Some(&self.root);
        entries
            .iter()
            .map(|entry| {
                let Some(keyed) = level.and_then(|l| l.by_key.get(&entry.key)) else {
                    level = None;
                    return hashed(&entry.value);
                };
                if let Some(node) = keyed.by_value.get(&entry.value) {
                    level = Some(&node.children);
                    return entry.value.clone();
                }
                if let Some((wildcard, node)) = keyed
                    .wildcards
                    .iter()
                    .find(|(w, _)| w.matches(&entry.value))
                {
                    level = Some(&node.children);
                    return wildcard.parts.join(&*hashed(&entry.value));
                }
                level = keyed.any.as_deref().map(|node| &node.children);
                hashed(&entry.value)
            })
            .collect()
    }

    /// Writes the key the reference's statistics count a matched descriptor under:
    /// `domain.part.part...`, a part per entry. A part is the configured one (`key` or
    /// `key_value`, a wildcard as written), except where the node asks for the request's
    /// value: `value_to_metric` on a level matched without a value of its own, or
    /// `detailed_metric` on the last node (every part `key_value` from the request, a shared
    /// wildcard's part as configured).
    fn stat_key(
        &self,
        out: &mut String,
        entries: &[Entry],
        path: &[(&Node, bool)],
        shared: &[(usize, Arc<str>)],
    ) {
        out.push_str(&self.name);
        let detailed = path.last().is_some_and(|(node, _)| node.detailed_metric);
        for (i, (entry, &(node, exact))) in entries.iter().zip(path).enumerate() {
            out.push('.');
            let is_shared = shared.iter().any(|(at, _)| *at == i);
            if detailed && !is_shared {
                out.push_str(&entry.key);
                if shared.is_empty() || !entry.value.is_empty() {
                    out.push('_');
                    out.push_str(&entry.value);
                }
            } else if !detailed && node.value_to_metric && !exact {
                out.push_str(&entry.key);
                if !entry.value.is_empty() {
                    out.push('_');
                    out.push_str(&entry.value);
                }
            } else {
                out.push_str(&node.stat_part);
            }
        }
    }

    /// The key the reference's statistics count a descriptor with its own `limit` under:
    /// `domain.key_value.key_value...` (`key` alone for an empty value).
    pub(crate) fn override_stat_key(&self, out: &mut String, entries: &[Entry]) {
        out.push_str(&self.name);
        for entry in entries {
            out.push('.');
            out.push_str(&entry.key);
            if !entry.value.is_empty() {
                out.push('_');
                out.push_str(&entry.value);
            }
        }
    }
}

/// A matched descriptor: its node, and the entries whose value a shared wildcard stands for
/// in the counter's name (entry index, pattern).
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) node: Arc<Node>,
    pub(crate) shared: SmallVec<[(usize, Arc<str>); 1]>,
}

/// Descriptor keys whose values are an identity, and which (`ip` or `user_id`).
type IdentityKeys = Vec<(String, &'static str)>;

/// Builds [`Domains`] from the configuration: the TOML's `[[envoy.domains]]` and the YAML
/// files of Envoy's reference service.
pub(crate) struct DomainsBuilder {
    on_error: OnError,
    /// How YAML domains answer.
    reference: Semantics,
    /// A descriptor of the domain being built has a blocklist, and the domain no identity.
    bans_without_identity: bool,
    /// Each domain's tree and identity keys, in the order first configured.
    staged: Vec<(String, Level, IdentityKeys, Semantics)>,
    summary: String,
    stats: StatSettings,
}

impl DomainsBuilder {
    /// `on_error` for every domain; YAML domains answer with `reference` (see
    /// [`Semantics::reference`]).
    pub(crate) fn new(on_error: OnError, reference: Semantics) -> DomainsBuilder {
        DomainsBuilder {
            on_error,
            reference,
            bans_without_identity: false,
            staged: Vec::new(),
            summary: String::new(),
            stats: StatSettings::default(),
        }
    }

    /// How the YAML domains' statistics are counted.
    pub(crate) fn stats(&mut self, stats: StatSettings) {
        self.stats = stats;
    }

    pub(crate) fn domain(&mut self, raw: RawDomain, span: Range<usize>) -> Result<(), DomainError> {
        let _ = writeln!(self.summary, "envoy domain {}", raw.name);
        self.bans_without_identity = false;
        let mut identity = Vec::new();
        for (key, kind) in raw.identity {
            let kind_span = kind.span();
            let kind = match kind.into_inner().as_str() {
                "ip" => "ip",
                "user_id" => "user_id",
                other => {
                    return Err((
                        kind_span,
                        format!(".identity.{key}"),
                        format!("{other:?}: a descriptor key maps to ip or user_id"),
                    ));
                }
            };
            let _ = writeln!(self.summary, "  {key} is the {kind}");
            identity.push((key, kind));
        }
        let bans = !identity.is_empty();
        let root = self.level(raw.descriptors, "", "", 1, bans)?;
        if self.bans_without_identity {
            return Err((
                span,
                ".identity".into(),
                "a descriptor with a blocklist needs the keys that name whom to ban, e.g. identity = { remote_address = \"ip\" }".into(),
            ));
        }
        self.staged
            .push((raw.name, root, identity, Semantics::Tollgate));
        Ok(())
    }

    /// Adds the domain of one YAML file (Envoy's reference service), its rules counted by
    /// `algorithm` (a fixed window of the unit, unless chosen otherwise), answering as the
    /// reference does. A domain configured already is an error, unless `merge`: then its
    /// descriptors join the others (a descriptor configured twice is still an error).
    pub(crate) fn yaml_domain(
        &mut self,
        file: &YamlFile,
        merge: bool,
        algorithm: Algorithm,
    ) -> Result<(), String> {
        let name = &file.root.domain;
        let _ = writeln!(
            self.summary,
            "envoy domain {name} (from {})",
            file.path.display()
        );
        let level = self.yaml_level(&file.root.descriptors.0, "", 1, algorithm)?;
        let mut semantics = self.reference;
        if let Semantics::Reference { counting, .. } = &mut semantics {
            *counting &= algorithm == Algorithm::FixedWindow;
        }
        match self.staged.iter_mut().find(|(n, _, _, _)| n == name) {
            None => self
                .staged
                .push((name.clone(), level, Vec::new(), semantics)),
            Some((_, into, _, _)) if merge => merge_level(into, level, name)?,
            Some(_) => {
                return Err(format!(
                    "duplicate domain '{name}' in config file (another file or the TOML configures it; set MERGE_DOMAIN_CONFIG=true or envoy.merge_domains = true to merge them)"
                ));
            }
        }
        Ok(())
    }

    /// One level of a YAML tree; `parent` is its path for names. A file's duplicate descriptors
    /// were refused, with their line, when it was read (`envoy_yaml::parse`).
    fn yaml_level(
        &mut self,
        descriptors: &[YamlDescriptor],
        parent: &str,
        depth: usize,
        algorithm: Algorithm,
    ) -> Result<Level, String> {
        let mut level = Level::default();
        for d in descriptors {
            let stat_part = match &d.value {
                Some(v) => format!("{}_{v}", d.key),
                None => d.key.clone(),
            };
            debug_assert!(
                !level
                    .by_key
                    .get(&d.key)
                    .is_some_and(|k| k.taken(d.value.as_deref())),
                "a duplicate descriptor past envoy_yaml::parse"
            );
            let segment = match &d.value {
                Some(v) => format!("{}={v}", d.key),
                None => d.key.clone(),
            };
            let path = if parent.is_empty() {
                segment
            } else {
                format!("{parent}/{segment}")
            };
            let _ = write!(self.summary, "{}{}", "  ".repeat(depth), path);
            let (rules, kind): (Vec<Rule>, NodeKind) = match d.limit {
                Limit::None => (Vec::new(), NodeKind::Rules),
                Limit::Unlimited => {
                    self.summary.push_str(": unlimited");
                    (Vec::new(), NodeKind::Unlimited)
                }
                Limit::PerUnit(n, unit) => {
                    let (unit, ms) = UNITS[unit as usize];
                    if n == 0 {
                        self.summary.push_str(": blocked (0 per unit)");
                        (Vec::new(), NodeKind::Blocked(unit))
                    } else {
                        let rule = Rule::new(u64::from(n), std::time::Duration::from_millis(ms))
                            .map_err(|e| format!("descriptor {path}: {e}"))?
                            .with_algorithm(algorithm);
                        log_fits(&rule).map_err(|e| format!("descriptor {path}: {e}"))?;
                        let _ = write!(self.summary, ": {rule} {}", rule.algorithm());
                        (vec![rule], NodeKind::Rules)
                    }
                }
            };
            let shadow = d.shadow;
            if shadow {
                self.summary.push_str(" (shadow)");
            }
            self.summary.push('\n');
            let children = self.yaml_level(&d.descriptors.0, &path, depth + 1, algorithm)?;
            let mut node = Node::new(path.into(), rules.into(), shadow, children);
            node.kind = kind;
            node.name = d.name.as_deref().map(Into::into);
            node.replaces = d.replaces.iter().map(|r| r.as_str().into()).collect();
            node.share_threshold = d.share_threshold;
            node.stat_part = stat_part.into();
            node.detailed_metric = d.detailed_metric;
            node.value_to_metric = d.value_to_metric;
            node.quota = d.quota;
            node.metadata = d.metadata.clone().map(Arc::new);
            level
                .by_key
                .entry(d.key.clone())
                .or_default()
                .insert(d.value.clone(), Arc::new(node));
        }
        Ok(level)
    }

    fn level(
        &mut self,
        descriptors: Vec<Spanned<RawDescriptor>>,
        field: &str,
        parent: &str,
        depth: usize,
        bans: bool,
    ) -> Result<Level, DomainError> {
        let mut level = Level::default();
        for (i, raw) in descriptors.into_iter().enumerate() {
            let span = raw.span();
            let here = format!("{field}.descriptors[{i}]");
            let raw = raw.into_inner();
            let fail = |sub: &str, msg: String| Err((span.clone(), format!("{here}{sub}"), msg));
            if raw.key.is_empty() {
                return fail(".key", "a descriptor needs a non-empty key".into());
            }
            if raw.value.as_deref() == Some("") {
                return fail(
                    ".value",
                    "an empty value matches nothing; leave `value` out to match any value".into(),
                );
            }
            if raw.rules.0.is_empty() && raw.descriptors.is_empty() {
                return fail(
                    ".rules",
                    "a descriptor needs rules, nested descriptors, or both".into(),
                );
            }
            let mut rules: Vec<Rule> = Vec::with_capacity(raw.rules.0.len());
            for (j, rule) in raw.rules.0.iter().enumerate() {
                if rule.is_concurrent() {
                    return fail(
                        &format!(".rules[{j}]"),
                        format!(
                            "{rule} is a concurrency limit; Envoy's rate-limit API has no release, so a descriptor takes rate rules only"
                        ),
                    );
                }
                if rule.calendar_window().is_some()
                    && raw
                        .algorithm
                        .is_some_and(|a| a != tollgate::Algorithm::FixedWindow)
                {
                    return fail(
                        ".algorithm",
                        format!("rule {rule} is a calendar window, counted as a fixed window"),
                    );
                }
                let rule = raw.algorithm.map_or(*rule, |a| rule.with_algorithm(a));
                if let Err(why) = log_fits(&rule) {
                    return fail(&format!(".rules[{j}]"), why);
                }
                if rules.contains(&rule) {
                    return fail(
                        &format!(".rules[{j}]"),
                        format!("rule {rule} is listed twice"),
                    );
                }
                rules.push(rule);
            }
            let segment = match &raw.value {
                Some(v) => format!("{}={v}", raw.key),
                None => raw.key.clone(),
            };
            let path = if parent.is_empty() {
                segment
            } else {
                format!("{parent}/{segment}")
            };
            let keyed = level.by_key.entry(raw.key.clone()).or_default();
            let taken = keyed.taken(raw.value.as_deref());
            if taken {
                return fail(
                    "",
                    format!("descriptor {path:?} is configured twice at this level"),
                );
            }
            let _ = write!(self.summary, "{}{}", "  ".repeat(depth), path);
            if !rules.is_empty() {
                let texts: Vec<String> = rules
                    .iter()
                    .map(|r| format!("{r} {}", r.algorithm()))
                    .collect();
                let _ = write!(self.summary, ": {}", texts.join(", "));
            }
            if raw.shadow {
                self.summary.push_str(" (shadow)");
            }
            if raw.overrides {
                if rules.is_empty() {
                    return fail(
                        ".overrides",
                        "a descriptor without rules has no limits to override".to_owned(),
                    );
                }
                self.summary.push_str(" (takes overrides)");
            }
            if let Some(ban) = &raw.blocklist {
                let duration = tollgate::format_duration(ban.0.duration());
                let _ = write!(self.summary, "; blocklist {duration}");
                self.bans_without_identity |= !bans;
            }
            self.summary.push('\n');
            let children = self.level(raw.descriptors, &here, &path, depth + 1, bans)?;
            let mut node = Node::new(path.into(), rules.into(), raw.shadow, children);
            node.ban = raw.blocklist.map(|b| b.0);
            if raw.overrides {
                node.overrides = Some(tollgate::fingerprint(&node.rules));
                // An override may raise the limits: the store decides what a cost fits.
                node.max_cost = node
                    .rules
                    .iter()
                    .map(|r| match r.algorithm() {
                        Algorithm::SlidingLog => tollgate::MAX_LOG_COST,
                        _ => tollgate::MAX_OVERRIDE_LIMIT,
                    })
                    .min()
                    .unwrap_or(0);
            }
            let node = Arc::new(node);
            // Re-borrow: the recursive call above needed `self`.
            level
                .by_key
                .entry(raw.key)
                .or_default()
                .insert(raw.value, node);
        }
        Ok(level)
    }

    pub(crate) fn build(self) -> Domains {
        let map = self
            .staged
            .into_iter()
            .map(|(name, root, identity, semantics)| {
                let scope: Arc<str> = format!("envoy:{name}").into();
                let mut scope_part = String::new();
                push_part(&mut scope_part, &scope);
                let domain = Domain {
                    name: name.as_str().into(),
                    scope,
                    scope_part: scope_part.into(),
                    on_error: self.on_error,
                    semantics,
                    metrics: DecisionHandles::default(),
                    identity: identity.into(),
                    root,
                };
                (name, Arc::new(domain))
            })
            .collect();
        Domains {
            map,
            summary: self.summary,
            stats: self.stats,
        }
    }
}

/// Moves the descriptors of `from` into `into` (of `domain`); one configured in both is an
/// error.
fn merge_level(into: &mut Level, from: Level, domain: &str) -> Result<(), String> {
    for (key, entry) in from.by_key {
        let target = into.by_key.entry(key.clone()).or_default();
        let twice =
            |value: &str| format!("duplicate descriptor composite key '{domain}.{key}{value}'");
        for (value, node) in entry.by_value {
            if target.by_value.contains_key(&value) {
                return Err(twice(&format!("_{value}")));
            }
            target.by_value.insert(value, node);
        }
        for (wildcard, node) in entry.wildcards {
            if target.taken(Some(&wildcard.text)) {
                return Err(twice(&format!("_{}", wildcard.text)));
            }
            target.wildcards.push((wildcard, node));
        }
        if let Some(node) = entry.any {
            if target.any.is_some() {
                return Err(twice(""));
            }
            target.any = Some(node);
        }
    }
    Ok(())
}

impl KeyEntry {
    /// Whether a node for `value` (`None`: the key alone) is there already.
    pub(crate) fn taken(&self, value: Option<&str>) -> bool {
        match value {
            Some(v) if v.contains('*') => self.wildcards.iter().any(|(w, _)| &*w.text == v),
            Some(v) => self.by_value.contains_key(v),
            None => self.any.is_some(),
        }
    }

    fn insert(&mut self, value: Option<String>, node: Arc<Node>) {
        match value {
            Some(v) => match Wildcard::new(&v) {
                Some(wildcard) => self.wildcards.push((wildcard, node)),
                None => {
                    self.by_value.insert(v, node);
                }
            },
            None => self.any = Some(node),
        }
    }
}

/// A node for a descriptor's own `limit`: `requests_per_unit` per unit, in a fixed window of
/// that unit (the units' lengths are Envoy's: a month is 30 days, a year 365); `None` for an
/// override that cannot be one (no requests, unknown unit).
pub(crate) fn override_node(descriptor: &RateLimitDescriptor) -> Option<Arc<Node>> {
    let limit = descriptor.limit.as_ref()?;
    let unit_ms = match limit.unit {
        1 => SECOND_MS,
        2 => 60 * SECOND_MS,
        3 => 3_600 * SECOND_MS,
        4 => DAY_MS,
        5 => 30 * DAY_MS,
        6 => 365 * DAY_MS,
        _ => return None,
    };
    let rule = Rule::new(
        u64::from(limit.requests_per_unit),
        std::time::Duration::from_millis(unit_ms),
    )
    .ok()?
    .with_algorithm(Algorithm::FixedWindow);
    let mut path = String::new();
    for (i, e) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            path.push('/');
        }
        let _ = write!(path, "{}={}", e.key, e.value);
    }
    Some(Arc::new(Node::new(
        path.into(),
        Box::new([rule]),
        false,
        Level::default(),
    )))
}

/// Writes the name of the counter of a request descriptor with `entries` into `name`
/// ([`tollgate::key::push_descriptor_name`]), the entries a shared wildcard matched (see
/// [`Found`]) named by its pattern.
pub(crate) fn counter_name(name: &mut String, entries: &[Entry], shared: &[(usize, Arc<str>)]) {
    let named = entries.iter().enumerate().map(|(i, e)| {
        let pattern = shared.iter().find(|(at, _)| *at == i).map(|(_, p)| &**p);
        (e.key.as_str(), e.value.as_str(), pattern)
    });
    tollgate::key::push_descriptor_name(name, named);
}

fn lowest_rate(rules: &[Rule]) -> Option<&Rule> {
    rules.iter().min_by(|a, b| {
        // a.limit / a.window < b.limit / b.window, without division.
        (u128::from(a.limit()) * u128::from(b.window_ms()))
            .cmp(&(u128::from(b.limit()) * u128::from(a.window_ms())))
    })
}

pub(crate) fn pb_duration(d: std::time::Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

const SECOND_MS: u64 = 1_000;
const DAY_MS: u64 = 86_400_000;
/// Envoy's units, shortest first, with the lengths Envoy's reference service gives them.
const UNITS: [(Unit, u64); 7] = [
    (Unit::Second, SECOND_MS),
    (Unit::Minute, 60 * SECOND_MS),
    (Unit::Hour, 3_600 * SECOND_MS),
    (Unit::Day, DAY_MS),
    (Unit::Week, 7 * DAY_MS),
    (Unit::Month, 30 * DAY_MS),
    (Unit::Year, 365 * DAY_MS),
];

/// The length of an Envoy `RateLimit.Unit`, in milliseconds; `None` for `UNKNOWN`.
pub(crate) fn unit_ms(unit: i32) -> Option<u64> {
    UNITS
        .iter()
        .find(|&&(u, _)| u as i32 == unit)
        .map(|&(_, ms)| ms)
}

/// A rule in Envoy's terms: the shortest unit at least as long as the window, and the rule's
/// rate over that unit, rounded down (`10/1m` is 10 per MINUTE, `10/30s` 20 per MINUTE,
/// `5/500ms` 10 per SECOND). Windows longer than a year are given per YEAR.
pub(crate) fn current_limit(rule: &Rule, name: &str) -> RateLimit {
    let window = rule.window_ms();
    let (unit, unit_ms) = UNITS
        .iter()
        .copied()
        .find(|&(_, ms)| ms >= window)
        .unwrap_or(UNITS[UNITS.len() - 1]);
    let per_unit = u128::from(rule.limit()) * u128::from(unit_ms) / u128::from(window);
    RateLimit {
        name: name.to_owned(),
        requests_per_unit: u32::try_from(per_unit.max(1)).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

/// The largest cost a descriptor's rule admits in one request: its limit, and no more entries
/// than one check may write to a log.
pub(crate) fn max_cost(rule: &Rule) -> u64 {
    match rule.algorithm() {
        tollgate::Algorithm::SlidingLog => rule.limit().min(tollgate::MAX_LOG_COST),
        _ => rule.limit(),
    }
}

/// A sliding-log rule keeps an entry per admitted unit: its limit is bounded as a policy's is.
fn log_fits(rule: &Rule) -> Result<(), String> {
    if rule.algorithm() == tollgate::Algorithm::SlidingLog && rule.limit() > tollgate::MAX_LOG_LIMIT
    {
        return Err(format!(
            "rule {rule} keeps a log of more than {} entries per client; use algorithm \"gcra\" or \"fixed_window\"",
            tollgate::MAX_LOG_LIMIT
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn rule(t: &str) -> Rule {
        t.parse().unwrap()
    }

    #[test]
    fn units_are_the_nearest_that_holds_the_window() {
        let cl = |t: &str| {
            let l = current_limit(&rule(t), "x");
            (l.requests_per_unit, Unit::try_from(l.unit).unwrap())
        };
        assert_eq!(cl("10/1s"), (10, Unit::Second));
        assert_eq!(cl("10/1m"), (10, Unit::Minute));
        assert_eq!(cl("10/30s"), (20, Unit::Minute));
        assert_eq!(cl("5/500ms"), (10, Unit::Second));
        assert_eq!(cl("1000/1h"), (1000, Unit::Hour));
        assert_eq!(cl("60/1d"), (60, Unit::Day));
        assert_eq!(cl("7/7d"), (7, Unit::Week));
        assert_eq!(cl("1/366d"), (1, Unit::Year));
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect()
    }

    #[test]
    fn matching_follows_envoys_reference_service() {
        let config = Config::parse(
            "t.toml",
            r#"
[[envoy.domains]]
name = "d"
descriptors = [
  { key = "remote_address", rules = ["10/1s"] },
  { key = "path", rules = ["100/1s"] },
  { key = "path", value = "/login", rules = ["5/1m"] },
  { key = "tenant", descriptors = [
      { key = "plan", value = "free", rules = ["1/1s"] },
      { key = "plan", rules = ["50/1s"] },
  ] },
]
"#,
        )
        .unwrap();
        let domain = config.envoy.get("d").unwrap();
        let path = |pairs: &[(&str, &str)]| {
            domain
                .find(&entries(pairs), None)
                .map(|f| f.node.path.to_string())
        };
        assert_eq!(
            path(&[("remote_address", "1.2.3.4")]).as_deref(),
            Some("remote_address")
        );
        assert_eq!(path(&[("path", "/login")]).as_deref(), Some("path=/login"));
        assert_eq!(path(&[("path", "/other")]).as_deref(), Some("path"));
        assert_eq!(
            path(&[("tenant", "a"), ("plan", "free")]).as_deref(),
            Some("tenant/plan=free")
        );
        assert_eq!(
            path(&[("tenant", "a"), ("plan", "pro")]).as_deref(),
            Some("tenant/plan")
        );
        // A node without rules limits nothing; nor does a descriptor that goes past the tree.
        assert_eq!(path(&[("tenant", "a")]), None);
        assert_eq!(path(&[("remote_address", "1.2.3.4"), ("path", "/")]), None);
        assert_eq!(path(&[("unknown", "x")]), None);
        assert_eq!(path(&[]), None);
    }

    #[test]
    fn counter_names_cannot_collide() {
        let name = |pairs: &[(&str, &str)]| {
            let mut name = String::new();
            counter_name(&mut name, &entries(pairs), &[]);
            name
        };
        assert_ne!(name(&[("a", "b|c:d")]), name(&[("a", "b"), ("c", "d")]));
        // A shared wildcard's counter is named by its pattern, which no value can spell.
        let mut shared = String::new();
        let pattern: Arc<str> = "files/*".into();
        counter_name(&mut shared, &entries(&[("f", "files/a")]), &[(0, pattern)]);
        assert_eq!(shared, "f:#*files/*");
        assert_ne!(shared, name(&[("f", "#*files/*")]));
        assert_ne!(shared, name(&[("f", "files/*")]));
    }

    #[test]
    fn counter_keys_are_limiter_keys() {
        let config = Config::parse(
            "t.toml",
            "[[envoy.domains]]\nname = \"d:1\"\ndescriptors = [{ key = \"a\", rules = [\"1/1s\"] }]\n",
        )
        .unwrap();
        let domain = config.envoy.get("d:1").unwrap();
        let mut name = String::new();
        counter_name(&mut name, &entries(&[("a", "x{y}")]), &[]);
        let mut key = String::new();
        domain.push_key(&mut key, "tg", &name);
        assert_eq!(
            key,
            tollgate::key::limiter_key("tg", "envoy:d:1", &name, "")
        );
    }

    #[test]
    fn descriptor_errors_name_the_field() {
        let e = Config::parse(
            "t.toml",
            "[[envoy.domains]]\nname = \"d\"\ndescriptors = [\n  { key = \"a\", rules = [\"1/1s\"] },\n  { key = \"a\", rules = [\"2/1s\"] },\n]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "t.toml:5: envoy.domains[0].descriptors[1]: descriptor \"a\" is configured twice"
            ),
            "{e}"
        );
        let e = Config::parse(
            "t.toml",
            "[[envoy.domains]]\nname = \"d\"\ndescriptors = [{ key = \"a\", descriptors = [{ key = \"b\" }] }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("t.toml:3: envoy.domains[0].descriptors[0].descriptors[0].rules: a descriptor needs rules"),
            "{e}"
        );
        let e = Config::parse(
            "t.toml",
            "[[envoy.domains]]\nname = \"d\"\ndescriptors = [{ key = \"a\", rules = [\"1/1s\"], blocklist = \"1m\" }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("t.toml:1: envoy.domains[0].identity: a descriptor with a blocklist needs the keys that name whom to ban"),
            "{e}"
        );
        let e = Config::parse(
            "t.toml",
            "[[envoy.domains]]\nname = \"d\"\nidentity = { remote_address = \"phone\" }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("t.toml:3: envoy.domains[0].identity.remote_address: \"phone\": a descriptor key maps to ip or user_id"),
            "{e}"
        );
    }
}
