//! Test kit for tollgate: real Redis processes for integration tests.
//!
//! Tests in this workspace run against real `redis-server` processes, never mocks, and never
//! skip silently: if `redis-server` is missing, starting a server panics and says how to install
//! it (or run `scripts/test`, which installs it when it can).
//!
//! ```no_run
//! use tollgate_testkit::RedisServer;
//!
//! let server = RedisServer::start();
//! let url = server.url(); // "redis://127.0.0.1:<port>/"
//! # let _ = url;
//! // ... the process is killed and its directory removed when `server` is dropped.
//! ```
//!
//! # Layout
//!
//! - [`server`](RedisServer): [`RedisServer`] and [`RedisServerBuilder`], one standalone
//!   `redis-server` child process on a free loopback port, with kill and restart on the same port
//!   for failure tests.
//! - `cluster`: [`RedisCluster`] and [`RedisClusterBuilder`], a local Redis Cluster (three
//!   primaries, three replicas, `redis-cli --cluster create`) with slot look-ups, killing a
//!   slot's primary and waiting for the failover.
//! - `sentinel`: [`RedisSentinelSet`] and [`RedisSentinelSetBuilder`], a primary, its replica
//!   and three sentinels (quorum 2), optionally with TLS everywhere and a password on the
//!   sentinels, with killing the primary and waiting for the sentinels to promote the replica.
//! - `certs`: [`TestCerts`], a CA, server and client certificates made with `openssl` for
//!   TLS tests.
//! - [`guards`]: conformance scenarios for the duplicate guard, blocklist and bypass, and
//!   [`guard_suite!`].
//! - [`prefixes`]: conformance scenarios for IP prefixes (a network shares one quota and one
//!   ban; bypass matches the address) and [`prefix_suite!`].
//! - [`conformance`]: the store conformance suite, scenarios every [`tollgate::Store`] must
//!   pass with the same numbers, and [`conformance_suite!`] that turns them into one test each.

mod certs;
mod cluster;
pub mod conformance;
pub mod guards;
pub mod plan;
pub mod prefixes;
mod sentinel;
mod server;

pub use certs::TestCerts;
pub use cluster::{RedisCluster, RedisClusterBuilder};
pub use sentinel::{RedisSentinelSet, RedisSentinelSetBuilder};
pub use server::{RedisServer, RedisServerBuilder};

/// A store with every ability (the core's): the conformance suites run on such stores.
pub use tollgate::FullStore;
