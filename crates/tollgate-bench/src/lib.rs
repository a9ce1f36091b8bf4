//! Benchmarks for tollgate, and the seed's baseline they are measured against. The figures and
//! how to reproduce them are in `docs/benchmarks.md`; everything runs with
//! `cargo bench -p tollgate-bench`.
//!
//! # Layout
//! - `benches/memory/` (criterion): the memory store against the in-process peers, one
//!   criterion group per case: governor's keyed limiter (GCRA, sliding log, two limiters; 1
//!   and 2 threads), limitador's fixed windows, and an axum route behind `RateLimitLayer`
//!   against tower_governor's `GovernorLayer`.
//! - `ratios.py`: the table of tollgate's figures over the peers' from criterion's estimates.
//! - `benches/redis.rs` (a plain `main` printing a table): the Redis store against the seed's
//!   Lua script on one `redis-server` the bench starts itself: throughput against
//!   `redis-benchmark`, two limiters against two script calls, and memory per entry.
//! - `scripts/seed_approach_a.lua`: the seed's "Approach A" script, verbatim.
//! - this file: what both benches share (the seed script, its rules, its members, test IPs).

use std::net::{IpAddr, Ipv4Addr};

/// The seed's "Approach A" sliding-log script: KEYS = (zset, uuid, now ms), ARGV = rule pairs.
pub const SEED_SCRIPT: &str = include_str!("../scripts/seed_approach_a.lua");

/// The three rules of every sliding-log benchmark, in tollgate's text form.
pub const RULES: [&str; 3] = ["10/1m", "20/1h", "60/1d"];

/// The same three rules as the seed passes them: (count, window ms) pairs.
pub const SEED_RULE_ARGS: [u64; 6] = [10, 60_000, 20, 3_600_000, 60, 86_400_000];

/// A random version-4 UUID in its 36-character text form, as the seed's `UUID.randomUUID()`
/// produces for every sliding-log member.
pub fn seed_uuid() -> String {
    let bits: u128 = rand::random();
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The `n`th test client address, `10.x.y.z`; distinct for every `n` below 2^24.
pub fn client_ip(n: u32) -> IpAddr {
    let [_, a, b, c] = n.to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(10, a, b, c))
}

/// Milliseconds since the Unix epoch by this machine's clock, as the seed's client sends them.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `count` scaled by `TOLLGATE_BENCH_SCALE` (default 1; e.g. 0.1 for a quick look), never
/// below `floor`.
pub fn scaled(count: usize, floor: usize) -> usize {
    let scale = std::env::var("TOLLGATE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    ((count as f64 * scale) as usize).max(floor)
}

/// The number of rounds: `TOLLGATE_BENCH_ROUNDS`, or `default`.
pub fn rounds(default: usize) -> usize {
    std::env::var("TOLLGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_look_like_the_seeds() {
        let u = seed_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.matches('-').count(), 4);
        assert_ne!(u, seed_uuid());
        assert_eq!(client_ip(258).to_string(), "10.0.1.2");
    }
}
