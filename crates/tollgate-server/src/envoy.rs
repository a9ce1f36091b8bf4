//! The Envoy rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`): domains and
//! descriptor trees from `[envoy]`, matching like Envoy's reference service, and one atomic
//! check per request.
//!
//! Matching: for each request descriptor, its entries are walked down the domain's tree; at
//! each level an entry `key = value` matches a configured `{ key, value }` first and a
//! key-only `{ key }` otherwise (no backtracking). The descriptor is limited by the node its
//! *last* entry reaches, if that node has rules; an unknown domain, or a descriptor that stops
//! early or reaches a node without rules, is not limited.
//!
//! Counting: the counters of a descriptor are keyed by the domain and the request's own
//! entries (key and value, escaped), as Envoy's service does, so a key-only entry counts each
//! value separately and a reload that keeps the entries keeps the counts.
//!
//! Overrides: a descriptor that carries its own `limit` (Envoy's `RateLimitOverride`, e.g.
//! from route metadata) is limited by that rate instead of the configured rules, in a domain
//! that is configured, whether or not a configured descriptor matches it; its counter is a
//! fixed window of the override's unit, as in Envoy's reference service, kept apart from the
//! configured counter of the same entries and from other overrides. An override with no
//! requests or an unknown unit is ignored.
//!
//! Atomicity: the matched descriptors of one request become one policy, one limiter each,
//! checked at once; if any non-shadow descriptor is over its limit nothing is recorded for
//! any of them. A shadow descriptor never makes the request OVER_LIMIT: when only shadow
//! descriptors deny, the check runs again without them so the others are recorded.

use std::{collections::HashMap, fmt::Write as _, ops::Range, sync::Arc, time::Instant};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit},
            rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
        },
    },
    google::protobuf::Duration as PbDuration,
};
use tollgate::{
    Algorithm, Decision, Dimension, Identity, Limiter, OnError, Policy, Rule, key::push_part,
};
use toml::Spanned;

use crate::{
    app::App,
    config::{RawDescriptor, RawDomain},
};

/// A configuration error inside one domain: span, field path below the domain, message.
pub(crate) type DomainError = (Range<usize>, String, String);

/// The configured domains.
#[derive(Debug, Clone, Default)]
pub(crate) struct Domains {
    map: HashMap<String, Arc<Domain>>,
    summary: String,
}

impl Domains {
    pub(crate) fn summary(&self) -> String {
        self.summary.clone()
    }

    fn get(&self, name: &str) -> Option<&Arc<Domain>> {
        self.map.get(name)
    }
}

#[derive(Debug)]
struct Domain {
    scope: Arc<str>,
    on_error: OnError,
    root: Level,
}

#[derive(Debug, Default)]
struct Level {
    by_key: HashMap<String, KeyEntry>,
}

#[derive(Debug, Default)]
struct KeyEntry {
    by_value: HashMap<String, Arc<Node>>,
    any: Option<Arc<Node>>,
}

#[derive(Debug)]
struct Node {
    /// `key` or `key=value` segments joined by `/`, for names and logs.
    path: Arc<str>,
    /// The node's rules in a limiter, built once; a request only renames a clone of it.
    limiter: Limiter,
    shadow: bool,
    children: Level,
}

impl Domain {
    /// The node that limits a request descriptor with these entries, if any.
    fn find(&self, entries: &[Entry]) -> Option<&Arc<Node>> {
        let mut level = &self.root;
        let last = entries.len().checked_sub(1)?;
        for (i, entry) in entries.iter().enumerate() {
            let keyed = level.by_key.get(&entry.key)?;
            let node = keyed.by_value.get(&entry.value).or(keyed.any.as_ref())?;
            if i == last {
                return (!node.limiter.rules().is_empty()).then_some(node);
            }
            level = &node.children;
        }
        None
    }
}

/// Builds [`Domains`] from the configuration.
pub(crate) struct DomainsBuilder {
    on_error: OnError,
    map: HashMap<String, Arc<Domain>>,
    summary: String,
}

impl DomainsBuilder {
    pub(crate) fn new(on_error: OnError) -> DomainsBuilder {
        DomainsBuilder {
            on_error,
            map: HashMap::new(),
            summary: String::new(),
        }
    }

    pub(crate) fn domain(&mut self, raw: RawDomain) -> Result<(), DomainError> {
        let _ = writeln!(self.summary, "envoy domain {}", raw.name);
        let root = self.level(raw.descriptors, "", "", 1)?;
        let scope: Arc<str> = format!("envoy:{}", raw.name).into();
        self.map.insert(
            raw.name,
            Arc::new(Domain {
                scope,
                on_error: self.on_error,
                root,
            }),
        );
        Ok(())
    }

    fn level(
        &mut self,
        descriptors: Vec<Spanned<RawDescriptor>>,
        field: &str,
        parent: &str,
        depth: usize,
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
            if raw.rules.is_empty() && raw.descriptors.is_empty() {
                return fail(
                    ".rules",
                    "a descriptor needs rules, nested descriptors, or both".into(),
                );
            }
            let mut rules: Vec<Rule> = Vec::with_capacity(raw.rules.len());
            for (j, rule) in raw.rules.iter().enumerate() {
                let rule = raw.algorithm.map_or(*rule, |a| rule.with_algorithm(a));
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
            let taken = match &raw.value {
                Some(v) => keyed.by_value.contains_key(v),
                None => keyed.any.is_some(),
            };
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
            self.summary.push('\n');
            let children = self.level(raw.descriptors, &here, &path, depth + 1)?;
            let limiter = Limiter::new(Dimension::Global, rules.iter().copied());
            let node = Arc::new(Node {
                path: path.into(),
                limiter,
                shadow: raw.shadow,
                children,
            });
            // Re-borrow: the recursive call above needed `self`.
            let keyed = level.by_key.entry(raw.key).or_default();
            match raw.value {
                Some(v) => {
                    keyed.by_value.insert(v, node);
                }
                None => keyed.any = Some(node),
            }
        }
        Ok(level)
    }

    pub(crate) fn build(self) -> Domains {
        Domains {
            map: self.map,
            summary: self.summary,
        }
    }
}

/// The gRPC service over the running server's configuration.
pub(crate) fn service(app: Arc<App>) -> RateLimitServiceServer<RateLimiter> {
    RateLimitServiceServer::new(limiter(app))
}

/// The service's implementation, without the gRPC transport.
pub(crate) fn limiter(app: Arc<App>) -> RateLimiter {
    RateLimiter { app }
}

/// Implements `ShouldRateLimit`.
pub(crate) struct RateLimiter {
    app: Arc<App>,
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request.into_inner();
        if request.domain.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if request.descriptors.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        let config = self.app.config();
        let response = match config.envoy.get(&request.domain) {
            Some(domain) => decide(&self.app, domain, &request).await,
            None => not_limited(request.descriptors.len()),
        };
        Ok(tonic::Response::new(response))
    }
}

fn not_limited(count: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![ok_status(); count],
        ..RateLimitResponse::default()
    }
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

/// One distinct counter of a request: the node that limits it and its key name.
struct Counter {
    name: String,
    node: Arc<Node>,
}

/// A node for a descriptor's own `limit`: `requests_per_unit` per unit, in a fixed window of
/// that unit (the units' lengths are Envoy's: a month is 30 days, a year 365); `None` for an
/// override that cannot be one (no requests, unknown unit).
fn override_node(descriptor: &RateLimitDescriptor) -> Option<Arc<Node>> {
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
    let path = descriptor
        .entries
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect::<Vec<_>>()
        .join("/");
    Some(Arc::new(Node {
        path: path.into(),
        limiter: Limiter::new(Dimension::Global, [rule]),
        shadow: false,
        children: Level::default(),
    }))
}

/// The escaped request entries: `key:value|key:value`. Escaping keeps `:` and `|` out of
/// the parts, so two different entry lists never share a name.
fn counter_name(entries: &[Entry]) -> String {
    let mut name = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            name.push('|');
        }
        push_part(&mut name, &entry.key);
        name.push(':');
        push_part(&mut name, &entry.value);
    }
    name
}

/// The matched descriptors of one cost, checked together (Envoy sends one cost per request
/// unless descriptors override it with their own `hits_addend`).
struct Group {
    cost: u64,
    counters: Vec<Counter>,
    /// (descriptor index, counter index) per matched descriptor.
    members: Vec<(usize, usize)>,
}

fn descriptor_cost(descriptor: &RateLimitDescriptor, request_addend: u64) -> u64 {
    descriptor
        .hits_addend
        .as_ref()
        .map_or(request_addend, |h| h.value)
}

async fn decide(app: &App, domain: &Domain, request: &RateLimitRequest) -> RateLimitResponse {
    let request_addend = u64::from(request.hits_addend.max(1));
    let mut statuses = vec![ok_status(); request.descriptors.len()];
    let mut groups: Vec<Group> = Vec::new();
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        let mut name = counter_name(&descriptor.entries);
        let node = match override_node(descriptor) {
            Some(node) => {
                // `#` is escaped in entries and starts only hashed parts (32 hex digits), so
                // this suffix names no configured counter.
                let rule = &node.limiter.rules()[0];
                let _ = write!(name, "|#override:{}/{}", rule.limit(), rule.window_ms());
                node
            }
            None => match domain.find(&descriptor.entries) {
                Some(node) => node.clone(),
                None => continue,
            },
        };
        let cost = descriptor_cost(descriptor, request_addend);
        let g = match groups.iter().position(|g| g.cost == cost) {
            Some(g) => g,
            None => {
                groups.push(Group {
                    cost,
                    counters: Vec::new(),
                    members: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let group = &mut groups[g];
        let c = match group.counters.iter().position(|c| c.name == name) {
            Some(c) => c,
            None => {
                group.counters.push(Counter { name, node });
                group.counters.len() - 1
            }
        };
        group.members.push((i, c));
    }
    let mut over = false;
    for group in groups {
        let outcome = check_group(app, domain, &group.counters, group.cost).await;
        for (i, c) in group.members {
            let status = &outcome[c];
            over |= status.code == Code::OverLimit as i32;
            statuses[i] = status.clone();
        }
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        ..RateLimitResponse::default()
    }
}

/// Checks the counters together; returns one status per counter.
async fn check_group(
    app: &App,
    domain: &Domain,
    counters: &[Counter],
    cost: u64,
) -> Vec<DescriptorStatus> {
    // Counters taken out of the check because they are shadow counters over their limit;
    // they are reported from the decision that found them over.
    let mut dropped: Vec<Option<DescriptorStatus>> = vec![None; counters.len()];
    loop {
        let active: Vec<usize> = (0..counters.len())
            .filter(|&c| dropped[c].is_none())
            .collect();
        if active.is_empty() {
            return dropped.into_iter().map(Option::unwrap_or_default).collect();
        }
        let mut builder = Policy::builder(&*domain.scope).on_error(domain.on_error);
        for &c in &active {
            let counter = &counters[c];
            builder = builder.limiter(counter.node.limiter.clone().with_name(&counter.name));
        }
        let decision = match builder.build() {
            Ok(policy) => {
                let started = Instant::now();
                let result = app.gate.check(&policy, &Identity::new(), cost).await;
                match result {
                    Ok(d) => {
                        app.record("check", &domain.scope, d.reason(), d.allowed(), started);
                        d
                    }
                    Err(e) => {
                        // Global limiters need nothing from the identity; keep the request
                        // flowing rather than fail Envoy's call.
                        tracing::error!(error = %e, "envoy check failed");
                        return vec![ok_status(); counters.len()];
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "envoy policy could not be built");
                return vec![ok_status(); counters.len()];
            }
        };
        let denied_by = |c: usize| {
            decision
                .denied_rules()
                .any(|r| *r.limiter == *counters[c].name)
        };
        let has_denied_rules = decision.denied_rules().next().is_some();
        let only_shadow_denied = !decision.allowed()
            && has_denied_rules
            && active
                .iter()
                .all(|&c| !denied_by(c) || counters[c].node.shadow);
        if only_shadow_denied {
            for &c in &active {
                if denied_by(c) {
                    dropped[c] = Some(status(&decision, &counters[c], false));
                }
            }
            continue;
        }
        let mut out: Vec<DescriptorStatus> = Vec::with_capacity(counters.len());
        for (c, counter) in counters.iter().enumerate() {
            if let Some(s) = dropped[c].take() {
                out.push(s);
                continue;
            }
            let over =
                !decision.allowed() && !counter.node.shadow && (denied_by(c) || !has_denied_rules);
            out.push(status(&decision, counter, over));
        }
        return out;
    }
}

/// The status of one counter: its strictest rule as `current_limit`, with what is left of
/// it and when it resets.
fn status(decision: &Decision, counter: &Counter, over: bool) -> DescriptorStatus {
    let mine = decision
        .rules()
        .iter()
        .filter(|r| *r.limiter == *counter.name);
    // The strictest rule: a denying one that resets last, else the one with the least left
    // (the longer window on a tie).
    let strictest = mine.max_by(|a, b| {
        (
            !a.allowed,
            a.allowed.then_some(u64::MAX - a.remaining),
            a.reset_after,
        )
            .cmp(&(
                !b.allowed,
                b.allowed.then_some(u64::MAX - b.remaining),
                b.reset_after,
            ))
            .then(a.rule.window().cmp(&b.rule.window()))
    });
    let code = if over { Code::OverLimit } else { Code::Ok } as i32;
    match strictest {
        Some(r) => DescriptorStatus {
            code,
            current_limit: Some(current_limit(&r.rule, &counter.node.path)),
            limit_remaining: u32::try_from(r.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(pb_duration(r.reset_after)),
            quota: None,
        },
        None => DescriptorStatus {
            code,
            current_limit: lowest_rate(counter.node.limiter.rules())
                .map(|rule| current_limit(rule, &counter.node.path)),
            ..DescriptorStatus::default()
        },
    }
}

fn lowest_rate(rules: &[Rule]) -> Option<&Rule> {
    rules.iter().min_by(|a, b| {
        // a.limit / a.window < b.limit / b.window, without division.
        (u128::from(a.limit()) * u128::from(b.window_ms()))
            .cmp(&(u128::from(b.limit()) * u128::from(a.window_ms())))
    })
}

fn pb_duration(d: std::time::Duration) -> PbDuration {
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
        let path =
            |pairs: &[(&str, &str)]| domain.find(&entries(pairs)).map(|n| n.path.to_string());
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
        let a = counter_name(&entries(&[("a", "b|c:d")]));
        let b = counter_name(&entries(&[("a", "b"), ("c", "d")]));
        assert_ne!(a, b);
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
    }
}
