//! Black-box tests: the built `tollgate` binary on free loopback ports, driven over HTTP and
//! gRPC like a client would.

// Helpers outside `#[test]` functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod admin_auth;
mod attacks;
mod batch;
mod blocklist;
mod cli;
mod dashboard;
mod env_overrides;
mod envoy_bans;
mod envoy_migration;
mod envoy_reference;
mod envoy_reference_suite;
mod envoy_sim;
mod fuzz;
mod grpc;
pub(crate) mod grpc_health;
mod headers;
mod http_api;
mod leases;
mod one_path;
mod overrides;
mod plan;
mod redis;
mod refund;
mod reload;
mod request_spans;
mod rlqs;
mod settle;
mod shadow;
mod slow_clients;
mod support;
mod warnings;
mod webhook;
