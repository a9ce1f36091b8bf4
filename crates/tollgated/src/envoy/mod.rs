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
//! Atomicity: the matched descriptors of one request (of one cost) are one store check, one
//! limiter each: if any non-shadow descriptor is over its limit nothing is recorded for any of
//! them. A shadow descriptor never makes the request OVER_LIMIT: when only shadow descriptors
//! deny, the others are checked once more without them, so they are recorded.
//!
//! # Layout
//! - `descriptors`: the configured trees (built once per configuration load from `[envoy]` and
//!   the reference's YAML, which `crate::config::envoy_yaml` reads), matching, counter names,
//!   statistics keys, Envoy's units.
//! - `service`: `ShouldRateLimit`: a request's descriptors to store checks through the
//!   engine's `run`, and the answer's statuses.
//! - `stats`: the reference's per-descriptor statistics.
//! - `reference_config` (tests): the reference's configuration suite.

pub(crate) mod descriptors;
#[cfg(test)]
mod reference_config;
mod service;
pub(crate) mod stats;

pub(crate) use descriptors::{Domains, DomainsBuilder, Node, RawDomain, Semantics};
pub(crate) use service::RateLimiter;
pub(crate) use service::{limiter, service};
