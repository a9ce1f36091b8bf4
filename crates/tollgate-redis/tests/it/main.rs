//! Integration tests of `RedisStore`; each test starts its own `redis-server`.

// clippy.toml allows unwrap in test functions only; the helpers here are test code too.
#![allow(clippy::unwrap_used)]

mod ban_index;
mod batching;
mod chaos;
mod cluster;
mod concurrency;
mod connect;
mod durability;
mod failover;
mod failure;
mod guards;
mod layout;
mod leases;
mod local_cache;
mod override_index;
mod parity;
mod persistence;
mod quota_leases;
mod redis_time;
mod repair;
mod round_trip;
mod script;
mod sentinel;
mod support;
mod tls;
