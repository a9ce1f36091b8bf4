//! `ShouldRateLimit`: a request's matched descriptors become one store check (one per cost),
//! and the store's verdict becomes one status per descriptor.
//!
//! The descriptors' nodes and their rules were prepared when the configuration was loaded; a
//! request only writes its counters' keys and borrows the rules into one
//! [`CheckRequest`], run through the engine's one way to the store ([`tollgate::Tollgate::run`]:
//! without a future when the store answers at once, `on_error` and its local fallback when it
//! fails), as every other front end's checks are.

use envoy_types::pb::google::protobuf::{
    ListValue, Struct as PbStruct, Value as PbValue, value::Kind,
};
use std::{
    collections::HashMap,
    fmt::Write as _,
    hash::BuildHasher as _,
    ops::Range,
    sync::Arc,
    time::{Duration, Instant},
};

use envoy_types::pb::envoy::{
    config::core::v3::HeaderValue,
    extensions::common::ratelimit::v3::RateLimitDescriptor,
    service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse,
        rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit},
        rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
    },
};
use smallvec::SmallVec;
use tollgate::{
    Answered, BanKey, BanTarget, CheckRequest, LimiterRequest, Reason, Receipt, Rule, RuleDecision,
    Store as _, Verdict,
    algorithm::RuleOutcome,
    fields::{self, HeaderStyle},
};

use super::{
    descriptors::{
        Domain, Found, Node, NodeKind, Semantics, counter_name, current_limit, override_node,
        pb_duration, unit_ms,
    },
    stats::Hits,
};
use crate::app::App;

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
        crate::grpc::authorize_check(&self.app, &request, "ShouldRateLimit").await?;
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
        // A request's work grows with its size, and its size is bounded here.
        let server = &self.app.config().server;
        let (max, max_entries) = (server.max_descriptors, server.max_descriptor_entries);
        if request.descriptors.len() > max {
            return Err(tonic::Status::invalid_argument(format!(
                "a request holds at most {max} descriptors (server.max_descriptors); this one has {}",
                request.descriptors.len()
            )));
        }
        if let Some((i, d)) = request
            .descriptors
            .iter()
            .enumerate()
            .find(|(_, d)| d.entries.len() > max_entries)
        {
            return Err(tonic::Status::invalid_argument(format!(
                "descriptor {i} has {} entries; a descriptor holds at most {max_entries} (server.max_descriptor_entries)",
                d.entries.len()
            )));
        }
        // The domain outlives a reload that happens while this request is in flight.
        let domain = self.app.config().envoy.get(&request.domain).cloned();
        let response = match &domain {
            Some(domain) => self.decide(domain, &request).await?,
            None => {
                let settings = self.app.config().envoy.stats();
                self.app
                    .metrics
                    .descriptors()
                    .domain_not_found(settings, &request.domain);
                not_limited(request.descriptors.len())
            }
        };
        if let Some(recorder) = &self.app.recorder {
            let statuses = response.statuses.iter().map(|s| s.code).collect();
            let allowed = response.overall_code != Code::OverLimit as i32;
            recorder.envoy(domain, &request, statuses, allowed);
        }
        Ok(tonic::Response::new(response))
    }
}

/// The rate-limit fields of `style` for the descriptors' statuses, for Envoy to add to the
/// response it sends downstream: each status's `current_limit` (as Envoy sees it, in whole
/// units: a rule of `10/30s` shows as `20` per minute), what is left of it and when it resets.
fn response_headers(style: HeaderStyle, statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    if style == HeaderStyle::None {
        return Vec::new();
    }
    let rules: SmallVec<[RuleDecision; 4]> = statuses
        .iter()
        .filter_map(|status| {
            let limit = status.current_limit.as_ref()?;
            let rule = Rule::new(
                u64::from(limit.requests_per_unit),
                Duration::from_millis(unit_ms(limit.unit)?),
            )
            .ok()?;
            let reset = status
                .duration_until_reset
                .as_ref()
                .map_or(Duration::ZERO, |d| {
                    Duration::new(
                        u64::try_from(d.seconds).unwrap_or(0),
                        u32::try_from(d.nanos).unwrap_or(0),
                    )
                });
            Some(RuleDecision {
                limiter: limit.name.as_str().into(),
                rule,
                allowed: status.code != Code::OverLimit as i32,
                remaining: u64::from(status.limit_remaining),
                reset_after: reset,
                shadow: false,
            })
        })
        .collect();
    let mut headers = Vec::new();
    fields::write_fields(style, &rules, None, |key, value| {
        headers.push(HeaderValue {
            key: key.to_owned(),
            value: value.to_owned(),
            ..HeaderValue::default()
        });
    });
    headers
}

/// The reference's response headers: the limit, what is left and the seconds to reset of one
/// status: the first with a limit that has the least left, unless a descriptor that is
/// neither unlimited nor in quota mode is over its limit (the last of those).
fn reference_headers(
    names: &[String; 3],
    statuses: &[DescriptorStatus],
    matched: &[Option<Matched>],
    all_quota: bool,
) -> Vec<HeaderValue> {
    let mut chosen: Option<&DescriptorStatus> = None;
    let mut least = u32::MAX;
    for (status, found) in statuses.iter().zip(matched) {
        if status.current_limit.is_some() && status.limit_remaining < least {
            chosen = Some(status);
            least = status.limit_remaining;
        }
        let node = found.as_ref().map(Matched::node);
        let counts = !node.is_some_and(|n| n.kind == NodeKind::Unlimited || n.quota) && !all_quota;
        if counts && status.code == Code::OverLimit as i32 {
            chosen = Some(status);
            least = 0;
        }
    }
    let Some(status) = chosen else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds);
    let values = [
        limit.to_string(),
        status.limit_remaining.to_string(),
        reset.to_string(),
    ];
    names
        .iter()
        .zip(values)
        .map(|(key, value)| HeaderValue {
            key: key.clone(),
            value,
            ..HeaderValue::default()
        })
        .collect()
}

/// The most addresses, and the most users, one request names: a request comes from one
/// client (its address may come twice, as its proxy saw it and as it says), and one request
/// must not have a crowd of others banned.
const TARGETS_PER_KIND: usize = 2;

/// The identities a request names: the values of its entries whose keys the domain maps to
/// an ip or a user id (an entry that does not parse as one names nobody), without repeats, at
/// most [`TARGETS_PER_KIND`] of each kind (the first).
fn identity_targets(domain: &Domain, request: &RateLimitRequest) -> SmallVec<[BanTarget; 2]> {
    let mut targets: SmallVec<[BanTarget; 2]> = SmallVec::new();
    for entry in request.descriptors.iter().flat_map(|d| &d.entries) {
        let Some((_, kind)) = domain.identity.iter().find(|(key, _)| *key == entry.key) else {
            continue;
        };
        let Ok(target) = BanTarget::parse(kind, &entry.value) else {
            continue;
        };
        let same_kind =
            |t: &&BanTarget| std::mem::discriminant(*t) == std::mem::discriminant(&target);
        if !targets.contains(&target) && targets.iter().filter(same_kind).count() < TARGETS_PER_KIND
        {
            targets.push(target);
        }
    }
    targets
}

/// What a request descriptor matched.
enum Matched {
    /// Its own `limit`.
    Override(Arc<Node>),
    /// A configured node.
    Configured(Found),
}

impl Matched {
    fn node(&self) -> &Arc<Node> {
        match self {
            Matched::Override(node) => node,
            Matched::Configured(found) => &found.node,
        }
    }
}

/// Envoy's `replaces`: a matched limit named by another matched limit's `replaces` is not
/// applied (its descriptor is answered as unmatched). Unlimited descriptors stay unlimited.
fn drop_replaced(matched: &mut [Option<Matched>]) {
    let replaced: SmallVec<[Arc<str>; 2]> = matched
        .iter()
        .flatten()
        .flat_map(|m| m.node().replaces.iter().cloned())
        .collect();
    if replaced.is_empty() {
        return;
    }
    for slot in matched.iter_mut() {
        let drop = slot.as_ref().is_some_and(|m| {
            let node = m.node();
            node.kind != NodeKind::Unlimited
                && node.name.as_ref().is_some_and(|n| replaced.contains(n))
        });
        if drop {
            *slot = None;
        }
    }
}

/// The status of a descriptor that blocks: over (unless shadow), 0 per its unit, until the
/// unit's window (aligned to the Unix epoch) ends.
fn blocked_status(node: &Node, unit: Unit) -> DescriptorStatus {
    let unit_ms = unit_ms(unit as i32).unwrap_or(1_000);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
    let code = if node.shadow {
        Code::Ok
    } else {
        Code::OverLimit
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: node.path.to_string(),
            requests_per_unit: 0,
            unit: unit as i32,
        }),
        limit_remaining: 0,
        duration_until_reset: Some(pb_duration(Duration::from_millis(
            unit_ms - now_ms % unit_ms,
        ))),
        quota: None,
    }
}

/// The reference's `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA`): the domain; each request
/// descriptor's entries (`key=value`), its own limit and `hits_addend` when it has them; the
/// request's `hits_addend` when not zero; and the `metadata` of the descriptors that passed
/// (not over their limit) merged in request order (maps merge, a first value stays).
fn dynamic_metadata(
    request: &RateLimitRequest,
    statuses: &[DescriptorStatus],
    matched: &[Option<Matched>],
) -> PbStruct {
    use std::collections::HashMap as Map;
    let string = |s: String| PbValue {
        kind: Some(Kind::StringValue(s)),
    };
    let number = |n: u64| PbValue {
        kind: Some(Kind::NumberValue(n as f64)),
    };
    let list = |values: Vec<PbValue>| PbValue {
        kind: Some(Kind::ListValue(ListValue { values })),
    };
    let object = |fields: Map<String, PbValue>| PbValue {
        kind: Some(Kind::StructValue(PbStruct { fields })),
    };
    let mut fields = Map::new();
    fields.insert("domain".to_owned(), string(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut f = Map::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(format!("{}={}", e.key, e.value)))
                .collect();
            f.insert("entries".to_owned(), list(entries));
            if let Some(limit) = &d.limit {
                let unit = Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
                f.insert(
                    "limit".to_owned(),
                    string(format!(
                        "requests_per_unit:{} unit:{unit}",
                        limit.requests_per_unit
                    )),
                );
            }
            if let Some(hits) = &d.hits_addend {
                f.insert("hitsAddend".to_owned(), number(hits.value));
            }
            object(f)
        })
        .collect();
    fields.insert("descriptors".to_owned(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            number(u64::from(request.hits_addend)),
        );
    }
    let mut merged = serde_json::Map::new();
    for (status, found) in statuses.iter().zip(matched) {
        if status.code == Code::OverLimit as i32 {
            continue;
        }
        if let Some(metadata) = found.as_ref().and_then(|f| f.node().metadata.as_ref()) {
            merge(&mut merged, metadata);
        }
    }
    if !merged.is_empty() {
        fields.insert(
            "metadata".to_owned(),
            json_value(serde_json::Value::Object(merged)),
        );
    }
    PbStruct { fields }
}

/// Merges `from` into `into`: maps merge, any other value already there stays.
fn merge(
    into: &mut serde_json::Map<String, serde_json::Value>,
    from: &serde_json::Map<String, serde_json::Value>,
) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(serde_json::Value::Object(a)), serde_json::Value::Object(b)) => merge(a, b),
            (Some(_), _) => {}
            (None, v) => {
                into.insert(key.clone(), v.clone());
            }
        }
    }
}

/// A JSON value as a protobuf `Value`.
fn json_value(value: serde_json::Value) -> PbValue {
    use serde_json::Value as J;
    let kind = match value {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s),
        J::Array(values) => Kind::ListValue(ListValue {
            values: values.into_iter().map(json_value).collect(),
        }),
        J::Object(map) => Kind::StructValue(PbStruct {
            fields: map.into_iter().map(|(k, v)| (k, json_value(v))).collect(),
        }),
    };
    PbValue { kind: Some(kind) }
}

/// Whether the request is over, as the reference decides it: a descriptor over its limit
/// that is not in quota mode makes it over; descriptors in quota mode (each one with
/// `quota_mode`, every one with `all_quota`) make it over only when all of them are over.
/// Unlimited descriptors count in neither.
fn over_as_reference(
    statuses: &[DescriptorStatus],
    matched: &[Option<Matched>],
    all_quota: bool,
) -> bool {
    let (mut quota, mut quota_over) = (0, 0);
    for (status, found) in statuses.iter().zip(matched) {
        let node = found.as_ref().map(Matched::node);
        if node.is_some_and(|n| n.kind == NodeKind::Unlimited) {
            continue;
        }
        let over = status.code == Code::OverLimit as i32;
        if all_quota || node.is_some_and(|n| n.quota) {
            quota += 1;
            quota_over += usize::from(over);
        } else if over {
            return true;
        }
    }
    quota > 0 && quota_over == quota
}

/// The statuses of a YAML domain as the reference service writes them: `current_limit.name`
/// is the YAML's `name` (else empty), an OVER_LIMIT status has 0 left, and
/// `duration_until_reset` is whole seconds to the end of the limit's unit by this server's
/// clock (`unit - now % unit`, never 0).
fn as_reference(statuses: &mut [DescriptorStatus], matched: &[Option<Matched>]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (status, found) in statuses.iter_mut().zip(matched) {
        let Some(limit) = &mut status.current_limit else {
            continue;
        };
        limit.name = found
            .as_ref()
            .and_then(|f| f.node().name.as_deref())
            .unwrap_or_default()
            .to_owned();
        if status.code == Code::OverLimit as i32 {
            status.limit_remaining = 0;
        }
        if let Some(unit) = unit_ms(limit.unit).map(|ms| (ms / 1000).max(1)) {
            status.duration_until_reset = Some(pb_duration(Duration::from_secs(unit - now % unit)));
        }
    }
}

fn not_limited(count: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![ok_status(); count],
        ..RateLimitResponse::default()
    }
}

/// A request's decision so far (`None` before its first counting group) with one more group's:
/// the first denial stands; else the first answer that is not plain `Ok` (a failed store's, say).
fn request_decision(so_far: Option<(Reason, bool)>, group: (Reason, bool)) -> (Reason, bool) {
    match so_far {
        Some(denied @ (_, false)) => denied,
        Some(odd @ (reason, true)) if reason != Reason::Ok && group.1 => odd,
        _ => group,
    }
}

/// The status of a descriptor whose `cost` units were given back (another group of its request
/// denied): what it would have left, as a denied request's descriptors report. Within its
/// limit: the units were counted on it.
fn given_back(status: &mut DescriptorStatus, cost: u64) {
    let cost = u32::try_from(cost).unwrap_or(u32::MAX);
    status.limit_remaining = status.limit_remaining.saturating_add(cost);
}

/// Which counters of a group its check counted on.
type Counted = SmallVec<[bool; 2]>;

/// What the check of a group of counters came to.
struct Grouped {
    /// Each counter's status.
    statuses: Statuses,
    store_failed: bool,
    /// Each counter's count before the check, where the store said.
    befores: SmallVec<[Option<u64>; 2]>,
    /// Denied, or admitted with what the store recorded (when asked to keep it).
    answer: Result<Option<Receipt>, ()>,
    /// The group's decision: its reason, and whether it admitted.
    decision: (Reason, bool),
    counted: Counted,
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

/// What each descriptor of a request matched (its own limit, or a configured node; `None`
/// for none, or a limit another one `replaces`), and, for YAML domains, the key each is
/// counted under in the reference's statistics.
struct Matches {
    matched: SmallVec<[Option<Matched>; 4]>,
    /// The statistics keys, one after the other; descriptor `i`'s is `stat_at[i]`.
    stat_keys: String,
    stat_at: SmallVec<[Range<usize>; 4]>,
}

impl Matches {
    fn of(domain: &Domain, request: &RateLimitRequest) -> Matches {
        let counts_stats = matches!(domain.semantics, Semantics::Reference { .. });
        let mut m = Matches {
            matched: SmallVec::new(),
            stat_keys: String::new(),
            stat_at: SmallVec::new(),
        };
        for d in &request.descriptors {
            let start = m.stat_keys.len();
            let stat = counts_stats.then_some(&mut m.stat_keys);
            m.matched.push(match override_node(d) {
                Some(node) => {
                    if let Some(out) = stat {
                        domain.override_stat_key(out, &d.entries);
                    }
                    Some(Matched::Override(node))
                }
                None => domain.find(&d.entries, stat).map(Matched::Configured),
            });
            m.stat_at.push(start..m.stat_keys.len());
        }
        drop_replaced(&mut m.matched);
        m
    }

    fn stat_key(&self, i: usize) -> &str {
        &self.stat_keys[self.stat_at[i].clone()]
    }
}

/// A request's store checks: its counters in groups, their keys, and whether a descriptor
/// of it blocks.
struct Plan {
    groups: SmallVec<[Group; 1]>,
    /// Every counter's key, one after the other.
    keys: String,
    blocked: bool,
}

/// One distinct counter of a request: the node that limits it, and where its key lies in the
/// request's key buffer.
#[derive(Clone)]
struct Counter {
    key: Range<usize>,
    node: Arc<Node>,
}

/// The matched descriptors of one cost, checked together (Envoy sends one cost per request
/// unless descriptors override it with their own `hits_addend`).
struct Group {
    cost: u64,
    counters: SmallVec<[Counter; 2]>,
    /// (descriptor index, counter index) per matched descriptor.
    members: SmallVec<[(usize, usize); 2]>,
}

/// One status per counter of a group.
type Statuses = SmallVec<[DescriptorStatus; 2]>;

fn descriptor_cost(descriptor: &RateLimitDescriptor, request_addend: u64) -> u64 {
    descriptor
        .hits_addend
        .as_ref()
        .map_or(request_addend, |h| h.value)
}

/// The store's request for `counter`, its key among `keys`: its rules, or with `counting` its
/// counting rules (see `count_as_reference`); its ban where the request carries ban keys.
fn limiter_request<'k>(
    keys: &'k str,
    counter: &'k Counter,
    counting: bool,
    bans: bool,
) -> LimiterRequest<'k> {
    let node = &counter.node;
    LimiterRequest {
        key: &keys[counter.key.clone()],
        compact: &[],
        rules: if counting {
            &node.counting
        } else {
            &node.rules
        },
        ban: node.ban.filter(|_| bans),
        shadow: node.shadow,
        // Counting as the reference does counts every hit: no limit to override.
        overrides: node.overrides.filter(|_| !counting),
    }
}

/// What one check of some counters answered.
// One lives on the stack per check; boxing the verdict would cost an allocation instead.
#[allow(clippy::large_enum_variant)]
enum Answer {
    /// The store's verdict (or, with `unavailable`, the local fallback's).
    Verdict { verdict: Verdict, unavailable: bool },
    /// The cost is above some rule's limit: denied without asking the store.
    CostExceeded,
    /// The store failed; `on_error` allowed or denied without rules.
    Unavailable { allowed: bool },
}

impl Answer {
    fn allowed(&self) -> bool {
        match self {
            Answer::Verdict { verdict, .. } => verdict.allowed,
            Answer::CostExceeded => false,
            Answer::Unavailable { allowed } => *allowed,
        }
    }

    fn reason(&self) -> Reason {
        match self {
            Answer::Verdict {
                unavailable: true, ..
            }
            | Answer::Unavailable { .. } => Reason::StoreUnavailable,
            Answer::Verdict { verdict, .. } if verdict.allowed => Reason::Ok,
            Answer::Verdict { verdict, .. } if verdict.blocked_us.is_some() => Reason::Blocked,
            Answer::Verdict { .. } => Reason::RateLimited,
            Answer::CostExceeded => Reason::CostExceedsLimit,
        }
    }
}

/// A check's answer, read per counter.
struct Checked {
    answer: Answer,
    cost: u64,
    /// The check recorded what it admitted (else it only looked: see `status`).
    consumed: bool,
    /// Per counter, where its outcomes start in the verdict.
    starts: SmallVec<[usize; 4]>,
}

impl Checked {
    /// Rule `i` of counter `c`, with the limit an override set, if one did.
    fn rule(&self, c: usize, node: &Node, i: usize) -> tollgate::Rule {
        let rule = node.rules[i];
        let Answer::Verdict { verdict, .. } = &self.answer else {
            return rule;
        };
        let limit = Verdict::limit_at(&verdict.limits, self.starts[c] + i, rule.limit());
        rule.with_limit(limit)
    }

    /// The outcomes of counter `c`'s rules (empty when there are none to report).
    fn outcomes<'a>(&'a self, c: usize, node: &Node) -> &'a [RuleOutcome] {
        match &self.answer {
            Answer::Verdict { verdict, .. } => {
                let start = self.starts[c];
                verdict
                    .rules
                    .get(start..start + node.rules.len())
                    .unwrap_or(&[])
            }
            _ => &[],
        }
    }

    /// Counter `c`'s count after the request, by its counting rule (see `Node::counting`):
    /// `None` when the store did not answer.
    fn count(&self, c: usize) -> Option<u64> {
        match &self.answer {
            // The store's, or, when it failed, the local fallback's.
            Answer::Verdict { verdict, .. } => {
                let o = verdict.rules.get(*self.starts.get(c)?)?;
                Some(super::descriptors::COUNT_ALL.saturating_sub(o.remaining))
            }
            _ => None,
        }
    }

    /// Counter `c`'s count before the request, by its first rule: what an admitting rule
    /// leaves after it, less the cost; what a denying one has left now. A cost above the
    /// limit was never asked of the store: taken as a first request.
    fn before(&self, c: usize, node: &Node) -> Option<u64> {
        node.rules.first()?;
        let limit = self.rule(c, node, 0).limit();
        match &self.answer {
            Answer::Verdict { .. } => {
                let o = self.outcomes(c, node).first()?;
                let left = if o.allowed {
                    o.remaining.saturating_add(self.cost)
                } else {
                    o.remaining
                };
                Some(limit.saturating_sub(left))
            }
            Answer::CostExceeded => Some(0),
            Answer::Unavailable { .. } => None,
        }
    }

    /// Whether counter `c` denied: one of its rules denied, or its cost is above a limit.
    fn denied_by(&self, c: usize, node: &Node) -> bool {
        match self.answer {
            Answer::Verdict { .. } => self.outcomes(c, node).iter().any(|o| !o.allowed),
            Answer::CostExceeded => node.max_cost < self.cost,
            Answer::Unavailable { .. } => false,
        }
    }

    /// The status of counter `c`: its strictest rule as `current_limit`, with what is left of
    /// it and when it resets.
    fn status(&self, c: usize, node: &Node, over: bool) -> DescriptorStatus {
        let code = if over { Code::OverLimit } else { Code::Ok } as i32;
        // (allowed, remaining, reset after) of each rule this answer reports.
        let reported: SmallVec<[(usize, bool, u64, Duration); 8]> = match self.answer {
            Answer::Verdict { .. } => self
                .outcomes(c, node)
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    // A look that would admit reports what is left after the request; nothing
                    // was taken, so what is left now is that plus the cost.
                    let remaining = if !self.consumed && o.allowed {
                        o.remaining
                            .saturating_add(self.cost)
                            .min(self.rule(c, node, i).limit())
                    } else {
                        o.remaining
                    };
                    (
                        i,
                        o.allowed,
                        remaining,
                        Duration::from_micros(o.reset_after_us),
                    )
                })
                .collect(),
            Answer::CostExceeded => node
                .rules
                .iter()
                .enumerate()
                .filter(|(_, r)| super::descriptors::max_cost(r) < self.cost)
                .map(|(i, _)| (i, false, 0, Duration::ZERO))
                .collect(),
            _ => SmallVec::new(),
        };
        // The strictest rule: a denying one that resets last, else the one with the least
        // left (the longer window on a tie).
        let strictest = reported.iter().max_by(|a, b| {
            (!a.1, a.1.then_some(u64::MAX - a.2), a.3)
                .cmp(&(!b.1, b.1.then_some(u64::MAX - b.2), b.3))
                .then(node.rules[a.0].window().cmp(&node.rules[b.0].window()))
        });
        match strictest {
            Some(&(i, _, remaining, reset_after)) => DescriptorStatus {
                code,
                current_limit: Some(current_limit(&self.rule(c, node, i), &node.path)),
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(pb_duration(reset_after)),
                quota: None,
            },
            None => DescriptorStatus {
                code,
                current_limit: node.lowest_rate(),
                // Banned: until the ban ends.
                duration_until_reset: match &self.answer {
                    Answer::Verdict { verdict, .. } => verdict
                        .blocked_us
                        .map(|us| pb_duration(Duration::from_micros(us))),
                    _ => None,
                },
                ..DescriptorStatus::default()
            },
        }
    }
}

impl RateLimiter {
    async fn decide(
        &self,
        domain: &Domain,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let matches = Matches::of(domain, request);
        let mut statuses = vec![ok_status(); request.descriptors.len()];
        let mut plan = self.plan(domain, request, &matches, &mut statuses);
        let texts = self.ban_texts(domain, request, &plan.groups);
        let bans: SmallVec<[BanKey<'_>; 2]> = texts
            .iter()
            .map(|(key, kind, value)| BanKey {
                key,
                kind,
                value,
                write: true,
            })
            .collect();
        let (independent, counting) = domain.semantics.counting();
        let mut over = plan.blocked;
        let mut store_failed = false;
        // The request's one decision, from the groups that counted.
        let mut decided: Option<(Reason, bool)> = None;
        if counting {
            let stop = (!independent, plan.blocked);
            (store_failed, decided) = self
                .count_as_reference(domain, &matches, &plan, stop, &mut statuses)
                .await;
            plan.groups.clear();
        }
        // Descriptors of different costs are checked a group per cost; all or nothing across
        // the groups too: a group that denies stops the later ones from counting (they only
        // look), and gives back what the earlier ones recorded.
        let mut denied = false;
        let mut recorded: SmallVec<[(usize, Receipt, Counted); 2]> = SmallVec::new();
        // Receipts are kept only where another group could deny.
        let keep = !independent && plan.groups.len() > 1;
        for (g, group) in plan.groups.iter().enumerate() {
            let consume = (!plan.blocked || independent) && !denied;
            let Grouped {
                statuses: mut outcome,
                store_failed: failed,
                befores,
                answer,
                decision,
                counted,
            } = self
                .check_group(domain, &plan.keys, group, (consume, keep), &bans)
                .await;
            store_failed |= failed;
            if consume {
                decided = Some(request_decision(decided, decision));
            }
            if consume && keep {
                match answer {
                    Ok(Some(receipt)) => recorded.push((g, receipt, counted)),
                    Ok(None) => {}
                    Err(()) => denied = true,
                }
            }
            // How many descriptors still take each counter's status: the last one takes it,
            // the others a copy.
            let mut uses: SmallVec<[usize; 4]> = SmallVec::from_elem(0, outcome.len());
            for &(i, c) in &group.members {
                uses[c] += 1;
                let node = &group.counters[c].node;
                self.count_stats(domain, &matches, i, node, group.cost, befores[c]);
            }
            for &(i, c) in &group.members {
                uses[c] -= 1;
                let status = if uses[c] == 0 {
                    std::mem::take(&mut outcome[c])
                } else {
                    outcome[c].clone()
                };
                over |= status.code == Code::OverLimit as i32;
                statuses[i] = status;
            }
        }
        if denied {
            for (g, receipt, counted) in recorded {
                // Its descriptors say what they would have left: nothing stays counted (a
                // shadow counter that would have denied counted nothing to give back).
                let group = &plan.groups[g];
                for &(i, c) in &group.members {
                    if counted[c] {
                        given_back(&mut statuses[i], group.cost);
                    }
                }
                self.give_back(&plan.keys, group, receipt);
            }
        }
        if plan.blocked {
            self.record_decision(domain, Reason::RateLimited, false);
        } else if let Some((reason, allowed)) = decided {
            self.record_decision(domain, reason, allowed);
        }
        if over {
            self.show_limited(domain, request, &matches.matched, &statuses);
        }
        self.answer(
            domain,
            request,
            &matches.matched,
            statuses,
            over,
            store_failed,
        )
    }

    /// The request's counters, grouped into the store checks that count them (one per cost,
    /// all or nothing; one per counter where each counts on its own), their keys written
    /// once; the statuses of unlimited and blocking descriptors, which need no check.
    fn plan(
        &self,
        domain: &Domain,
        request: &RateLimitRequest,
        matches: &Matches,
        statuses: &mut [DescriptorStatus],
    ) -> Plan {
        let prefix = self.app.gate.prefix();
        let request_addend = u64::from(request.hits_addend.max(1));
        let (independent, counting) = domain.semantics.counting();
        let mut plan = Plan {
            groups: SmallVec::new(),
            keys: String::new(),
            blocked: false,
        };
        // `name` is a counter's name (see `counter_name`), written again for each descriptor.
        let mut name = String::new();
        // Where each counter is, by its group and the hash of its key: one look-up per
        // descriptor, not a scan of the counters before it.
        let mut seen: HashMap<(usize, u64), usize> = HashMap::new();
        let hasher = std::hash::RandomState::new();
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let Some(found) = &matches.matched[i] else {
                continue;
            };
            let node = found.node();
            match node.kind {
                NodeKind::Unlimited => {
                    statuses[i] = DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..DescriptorStatus::default()
                    };
                    continue;
                }
                NodeKind::Blocked(unit) => {
                    // A descriptor that blocks (`requests_per_unit: 0`) denies the request:
                    // the others are then only looked at, not counted (unless each counts on
                    // its own).
                    plan.blocked |= !node.shadow;
                    statuses[i] = blocked_status(node, unit);
                    // Every hit is over a limit of 0.
                    let hits = descriptor_cost(descriptor, request_addend);
                    self.count_stats(domain, matches, i, node, hits, Some(0));
                    continue;
                }
                NodeKind::Rules => {}
            }
            name.clear();
            // Room for the entries escaped (an escape takes 3 bytes), so the name and the key
            // are written without growing their buffers.
            let raw: usize = descriptor
                .entries
                .iter()
                .map(|e| e.key.len() + e.value.len() + 2)
                .sum();
            name.reserve(raw * 3 + 32);
            let node = match found {
                Matched::Override(node) => {
                    counter_name(&mut name, &descriptor.entries, &[]);
                    // `#` is escaped in entries and starts only hashed parts (32 hex digits),
                    // so this suffix names no configured counter.
                    let rule = &node.rules[0];
                    let _ = write!(name, "|#override:{}/{}", rule.limit(), rule.window_ms());
                    node.clone()
                }
                Matched::Configured(found) => {
                    counter_name(&mut name, &descriptor.entries, &found.shared);
                    found.node.clone()
                }
            };
            let cost = descriptor_cost(descriptor, request_addend);
            // The key is the name's, so descriptors with one name share one counter.
            let keys = &mut plan.keys;
            let start = keys.len();
            keys.reserve(prefix.len() + domain.scope.len() * 3 + name.len() * 3 + 8);
            domain.push_key(keys, prefix, &name);
            // Checked together: the counters of one cost (all or nothing), or, counting as the
            // reference does, each counter on its own.
            let joins = |g: &Group| {
                g.cost == cost && (!independent || keys[g.counters[0].key.clone()] == keys[start..])
            };
            // Counting as the reference: each descriptor on its own, in request order, two
            // of one counter twice.
            let g = match plan.groups.iter().position(joins).filter(|_| !counting) {
                Some(g) => g,
                None => {
                    plan.groups.push(Group {
                        cost,
                        counters: SmallVec::new(),
                        members: SmallVec::new(),
                    });
                    plan.groups.len() - 1
                }
            };
            let group = &mut plan.groups[g];
            let hash = hasher.hash_one(&keys[start..]);
            let same = |c: &Counter| keys[c.key.clone()] == keys[start..];
            let c = match seen
                .get(&(g, hash))
                .copied()
                .filter(|&c| same(&group.counters[c]))
                // Two keys of one hash: found by a scan (never in practice).
                .or_else(|| {
                    seen.contains_key(&(g, hash))
                        .then(|| group.counters.iter().position(same))
                        .flatten()
                }) {
                Some(c) => {
                    keys.truncate(start);
                    c
                }
                None => {
                    group.counters.push(Counter {
                        key: start..keys.len(),
                        node,
                    });
                    seen.entry((g, hash)).or_insert(group.counters.len() - 1);
                    group.counters.len() - 1
                }
            };
            group.members.push((i, c));
        }
        plan
    }

    /// The identity's ban keys (key, kind, value): the values of the entries the domain names
    /// as an ip or a user id; none when no ban can be live or be written.
    fn ban_texts(
        &self,
        domain: &Domain,
        request: &RateLimitRequest,
        groups: &[Group],
    ) -> SmallVec<[(String, &'static str, String); 2]> {
        let may_ban = groups
            .iter()
            .flat_map(|g| &g.counters)
            .any(|c| c.node.ban.is_some() && !c.node.shadow);
        let gate = &self.app.gate;
        if domain.identity.is_empty()
            || !gate.blocklist_enabled()
            || !(may_ban || gate.store().bans_possible())
        {
            return SmallVec::new();
        }
        let prefix = gate.prefix();
        identity_targets(domain, request)
            .iter()
            .map(|t| (t.key(prefix), t.kind(), t.value()))
            .collect()
    }

    /// Counts descriptor `i` in the reference's statistics (YAML domains only).
    fn count_stats(
        &self,
        domain: &Domain,
        matches: &Matches,
        i: usize,
        node: &Node,
        hits: u64,
        before: Option<u64>,
    ) {
        if !matches!(domain.semantics, Semantics::Reference { .. }) {
            return;
        }
        let limit = node.rules.first().map_or(0, Rule::limit);
        self.app.metrics.descriptors().count(
            self.app.config().envoy.stats(),
            &domain.name,
            matches.stat_key(i),
            Hits {
                hits,
                limit,
                before,
                shadow: node.shadow,
            },
        );
    }

    /// The response from the descriptors' statuses: the overall code, the headers, the
    /// metadata, as the domain answers (tollgate's way, or the reference's); the reference's
    /// way fails the call when the store did.
    fn answer(
        &self,
        domain: &Domain,
        request: &RateLimitRequest,
        matched: &[Option<Matched>],
        mut statuses: Vec<DescriptorStatus>,
        mut over: bool,
        store_failed: bool,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let headers = self.app.config().envoy_headers;
        let (style, shadow) = match domain.semantics {
            Semantics::Tollgate => (headers.for_answer(!over), false),
            Semantics::Reference {
                fail_call,
                shadow,
                quota,
                ..
            } => {
                over = over_as_reference(&statuses, matched, quota);
                if fail_call && store_failed {
                    // As the reference: the call fails, and Envoy's `failure_mode_deny` decides.
                    return Err(tonic::Status::unavailable(
                        "the rate-limit store is unavailable",
                    ));
                }
                as_reference(&mut statuses, matched);
                (headers, shadow)
            }
        };
        let mut response_headers_to_add = match domain.semantics {
            Semantics::Tollgate => response_headers(style, &statuses),
            // The reference's headers: only when enabled, and then on allowed answers too.
            Semantics::Reference { .. } if style == HeaderStyle::None => Vec::new(),
            Semantics::Reference { quota, .. } => reference_headers(
                &self.app.config().envoy_header_names,
                &statuses,
                matched,
                quota,
            ),
        };
        let denial_headers = matches!(
            domain.semantics,
            Semantics::Reference {
                denial_headers: true,
                ..
            }
        );
        if over && denial_headers {
            response_headers_to_add.extend(response_headers(HeaderStyle::Draft, &statuses));
        }
        // The reference's SHADOW_MODE: each status stays, the overall code is OK.
        let overall = if over && !shadow {
            Code::OverLimit
        } else {
            Code::Ok
        };
        if over && shadow {
            self.app.metrics.descriptors().global_shadow_admitted();
        }
        let dynamic_metadata = matches!(
            domain.semantics,
            Semantics::Reference { metadata: true, .. }
        )
        .then(|| dynamic_metadata(request, &statuses, matched));
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            response_headers_to_add,
            statuses,
            dynamic_metadata,
            ..RateLimitResponse::default()
        })
    }

    /// Checks the counters together, in one store call; returns one status per counter,
    /// whether the store failed, and per counter its count before the request as the
    /// statistics read it (`None`: the store did not answer).
    ///
    /// Shadow counters are shadow limiters of the check: they are counted when they would
    /// admit, never make the request OVER_LIMIT, and record nothing when they would deny.
    /// With `consume` false (a descriptor of the request blocks), the counters are only looked
    /// at, and the caller counts the request's decision.
    async fn check_group(
        &self,
        domain: &Domain,
        keys: &str,
        group: &Group,
        (consume, keep): (bool, bool),
        bans: &[BanKey<'_>],
    ) -> Grouped {
        let (counters, cost) = (&group.counters[..], group.cost);
        let checked = self
            .check(domain, keys, counters, (cost, consume, false), bans)
            .await;
        let befores = counters
            .iter()
            .enumerate()
            .map(|(c, counter)| checked.before(c, &counter.node))
            .collect();
        let store_failed = checked.answer.reason() == Reason::StoreUnavailable;
        let allowed = checked.answer.allowed();
        // An enforced counter that denied; if none did (a ban, a failed store), every enforced
        // counter is over.
        let denied = |c: usize| !counters[c].node.shadow && checked.denied_by(c, &counters[c].node);
        let has_denied = (0..counters.len()).any(denied);
        let statuses = counters
            .iter()
            .enumerate()
            .map(|(c, counter)| {
                let over = !allowed && !counter.node.shadow && (denied(c) || !has_denied);
                checked.status(c, &counter.node, over)
            })
            .collect();
        if consume && allowed {
            let shadow_denied = counters
                .iter()
                .enumerate()
                .filter(|(c, counter)| counter.node.shadow && checked.denied_by(*c, &counter.node));
            for (_, counter) in shadow_denied {
                self.app
                    .metrics
                    .shadow_denied(&domain.scope, &counter.node.path);
            }
        }
        // Denied, or admitted with what the store recorded if `keep` (none from the local
        // fallback, whose counters are not the store's, nor where the store failed open).
        let answer = match &checked.answer {
            _ if !allowed => Err(()),
            _ if !keep => Ok(None),
            // With the limits an override set, by which the units were counted.
            Answer::Verdict {
                verdict,
                unavailable: false,
            } => Ok(verdict
                .receipt
                .clone()
                .map(|r| r.with_limits(verdict.limits.iter().copied()))),
            _ => Ok(None),
        };
        // What the check counted on: every counter when it admitted, but a shadow one that
        // would have denied.
        let counted = counters
            .iter()
            .enumerate()
            .map(|(c, counter)| !(counter.node.shadow && checked.denied_by(c, &counter.node)))
            .collect();
        Grouped {
            statuses,
            store_failed,
            befores,
            answer,
            decision: (checked.answer.reason(), allowed),
            counted,
        }
    }

    /// Gives back what the check of `group` recorded (its `receipt`): another group of the
    /// same request denied. On a task of its own: the answer does not wait for it, and an
    /// Envoy that stops waiting for the answer does not cancel it. A failure keeps the units
    /// counted (the safe side).
    fn give_back(&self, keys: &str, group: &Group, receipt: Receipt) {
        let (app, keys, cost) = (self.app.clone(), keys.to_owned(), group.cost);
        let counters = group.counters.clone();
        tokio::spawn(async move {
            let limiters: SmallVec<[LimiterRequest<'_>; 4]> = counters
                .iter()
                .map(|counter| limiter_request(&keys, counter, false, false))
                .collect();
            let request = CheckRequest::new(cost, true, &limiters);
            if let Err(e) = app.gate.refund_run(&request, Some(&receipt)).await {
                tracing::debug!(error = %e, "could not give back the units of a denied request's other descriptors");
            }
        });
    }

    /// Puts the request's descriptors that are over their limit in the dashboard's top list:
    /// the request's entries as whom, the configured descriptor as the limiter.
    #[cold]
    fn show_limited(
        &self,
        domain: &Domain,
        request: &RateLimitRequest,
        matched: &[Option<Matched>],
        statuses: &[DescriptorStatus],
    ) {
        for (i, status) in statuses.iter().enumerate() {
            let Some(found) = &matched[i] else { continue };
            if status.code != Code::OverLimit as i32 {
                continue;
            }
            let node = found.node();
            let rule = node
                .rules
                .iter()
                .find(|r| Some(current_limit(r, &node.path)) == status.current_limit)
                .map_or_else(|| "banned or blocked".to_owned(), ToString::to_string);
            let entries: Vec<String> = request.descriptors[i]
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            self.app
                .observed
                .envoy_limited(&domain.scope, &node.path, &entries.join(", "), &rule);
        }
    }

    /// Counts the request's one decision.
    fn record_decision(&self, domain: &Domain, reason: Reason, allowed: bool) {
        self.app
            .metrics
            .decision(&domain.metrics, &domain.scope, reason, allowed);
    }

    /// Counts the counters (a group each) as the reference does, and writes their statuses;
    /// returns whether the store failed, and the request's decision. Each counter's hits are
    /// added and its count read
    /// back; it is over when that count is over its limit. With `all_or_nothing` (the
    /// reference's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), the counts are read first: if
    /// some counter would go over, only those that would are counted (none, when a descriptor
    /// of the request blocks: `blocked`).
    async fn count_as_reference(
        &self,
        domain: &Domain,
        matches: &Matches,
        plan: &Plan,
        (all_or_nothing, blocked): (bool, bool),
        statuses: &mut [DescriptorStatus],
    ) -> (bool, Option<(Reason, bool)>) {
        let (keys, groups) = (plan.keys.as_str(), &plan.groups[..]);
        let mut failed = false;
        let mut decided = None;
        let mut counted: SmallVec<[bool; 4]> =
            SmallVec::from_elem(!(all_or_nothing && blocked), groups.len());
        if all_or_nothing && !blocked {
            let mut over: SmallVec<[bool; 4]> = SmallVec::new();
            for group in groups {
                let checked = self
                    .check(
                        domain,
                        keys,
                        &group.counters,
                        (hits(group.cost), false, true),
                        &[],
                    )
                    .await;
                // A look reports the count as it would be with the hits (at least the hits: a
                // count holds at most 2^52, and hits that would take it past are not recorded).
                let after = checked.count(0).map(|a| a.max(hits(group.cost)));
                failed |= checked.answer.reason() == Reason::StoreUnavailable;
                let node = &group.counters[0].node;
                over.push(after.is_some_and(|a| a > node.rules[0].limit()));
            }
            if over.contains(&true) {
                counted = over;
            }
        }
        for (group, counted) in groups.iter().zip(counted) {
            let cost = if counted { hits(group.cost) } else { 0 };
            let checked = self
                .check(domain, keys, &group.counters, (cost, true, true), &[])
                .await;
            // At least the hits, recorded or not.
            let after = checked.count(0).map(|a| a.max(cost));
            let node = &group.counters[0].node;
            let limit = node.rules[0].limit();
            let over = after.map(|a| a > limit);
            let unavailable = checked.answer.reason() == Reason::StoreUnavailable;
            failed |= unavailable;
            // A failed store's decision is `on_error`'s (or the local fallback's count).
            let reason = match over {
                _ if unavailable => Reason::StoreUnavailable,
                Some(true) => Reason::RateLimited,
                _ => Reason::Ok,
            };
            let allowed = match over {
                Some(over) => !over || node.shadow,
                None => checked.answer.allowed(),
            };
            decided = Some(request_decision(decided, (reason, allowed)));
            for &(i, _) in &group.members {
                let before = after.map(|a| a.saturating_sub(group.cost));
                self.count_stats(domain, matches, i, node, group.cost, before);
                statuses[i] = match (after, &checked.answer) {
                    (Some(after), _) => DescriptorStatus {
                        code: if after > limit && !node.shadow {
                            Code::OverLimit
                        } else {
                            Code::Ok
                        } as i32,
                        current_limit: Some(current_limit(&node.rules[0], &node.path)),
                        limit_remaining: u32::try_from(limit.saturating_sub(after))
                            .unwrap_or(u32::MAX),
                        duration_until_reset: None,
                        quota: None,
                    },
                    // The store failed: `on_error` decided.
                    (None, answer) => {
                        let over = !answer.allowed() && !node.shadow;
                        DescriptorStatus {
                            code: if over { Code::OverLimit } else { Code::Ok } as i32,
                            current_limit: Some(current_limit(&node.rules[0], &node.path)),
                            ..DescriptorStatus::default()
                        }
                    }
                };
            }
        }
        (failed, decided)
    }

    /// One atomic check of the counters (its store call timed in the metrics); `counting`:
    /// of their counting rules (see `Node::counting`), whatever the cost.
    async fn check(
        &self,
        domain: &Domain,
        keys: &str,
        counters: &[Counter],
        (cost, consume, counting): (u64, bool, bool),
        bans: &[BanKey<'_>],
    ) -> Checked {
        let mut limiters: SmallVec<[LimiterRequest<'_>; 4]> = SmallVec::new();
        // A shadow counter never denies, whatever the cost.
        let mut max_cost = u64::MAX;
        let mut starts = SmallVec::new();
        let mut next = 0;
        for counter in counters {
            starts.push(next);
            let limiter = limiter_request(keys, counter, counting, !bans.is_empty());
            next += limiter.rules.len();
            if !counter.node.shadow && !counting {
                max_cost = max_cost.min(counter.node.max_cost);
            }
            limiters.push(limiter);
        }
        let started = Instant::now();
        let answer = if cost > max_cost {
            Answer::CostExceeded
        } else {
            let mut request = CheckRequest::new(cost, consume, &limiters);
            if !bans.is_empty() {
                request = request.with_bans(bans, self.app.gate.ban_index());
            }
            // The engine's one way to the store: at once when it can, `on_error` when it fails.
            let mut verdict = Verdict::empty();
            match self
                .app
                .gate
                .run(&request, domain.on_error, &mut verdict)
                .await
            {
                Answered::Store => Answer::Verdict {
                    verdict,
                    unavailable: false,
                },
                Answered::Local => Answer::Verdict {
                    verdict,
                    unavailable: true,
                },
                Answered::Failed { allowed } => Answer::Unavailable { allowed },
                _ => Answer::Unavailable { allowed: false },
            }
        };
        // Every store call is timed; the request's decision is counted once, by the caller.
        self.app
            .record_store_call("check", answer.reason(), started);
        Checked {
            answer,
            cost,
            consumed: consume,
            starts,
        }
    }
}

/// A descriptor's hits as the reference counts them: at most what a count holds
/// ([`COUNT_ALL`](super::descriptors::COUNT_ALL)), which is past any limit (a store takes no
/// more in one call, and a larger `hits_addend` must not fail the call as the store's fault).
fn hits(cost: u64) -> u64 {
    cost.min(super::descriptors::COUNT_ALL)
}
