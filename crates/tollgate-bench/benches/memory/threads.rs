//! Throughput of one limiter shared by 1 and 2 threads: governor's keyed limiter and
//! tollgate's memory store with one GCRA rule, each thread over its own 1000 keys, or every
//! thread on one hot key.
//!
//! Each sample starts the threads, lets them go together through a barrier and stops the clock
//! when the last one is done; an iteration is one check on every thread, so criterion's
//! throughput (`Throughput::Elements` = threads) is checks per second across all threads.

use std::{
    hint::black_box,
    net::IpAddr,
    sync::Barrier,
    thread,
    time::{Duration, Instant},
};

use criterion::{Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate::{Algorithm, Identity, MemoryStore, Tollgate};

use crate::support::{KEYS, group, ips_from, policy, ready, rule};

/// Runs `check(thread, key index)` `iters` times on each of `threads` threads, all started
/// together; returns the time until the last finished and how many checks were denied.
fn run(
    threads: usize,
    keys: usize,
    iters: u64,
    check: &(impl Fn(usize, usize) -> bool + Sync),
) -> (Duration, u64) {
    let barrier = Barrier::new(threads + 1);
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let mut denied = 0;
                    for i in 0..iters {
                        denied += u64::from(!check(t, i as usize % keys));
                    }
                    denied
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let denied = handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread does not panic"))
            .sum();
        (start.elapsed(), denied)
    })
}

pub(crate) fn gcra_threads(c: &mut Criterion) {
    // One unit every microsecond, with a burst far above what a hot key sees in the run: no
    // check is denied (each is counted and a denial fails the bench).
    let quota = Quota::per_second(1_000_000.try_into().expect("non-zero"))
        .allow_burst(1_000_000_000.try_into().expect("non-zero"));
    let p = policy(&[rule(
        1_000_000_000,
        Duration::from_secs(1_000),
        Algorithm::Gcra,
    )]);
    for hot in [false, true] {
        for threads in [1, 2] {
            let keys = if hot { 1 } else { KEYS };
            // Thread t's keys: one for everybody, or its own thousand.
            let ips: Vec<Vec<IpAddr>> = (0..threads)
                .map(|t| ips_from(if hot { 0 } else { t * KEYS }, keys))
                .collect();
            let who: Vec<Vec<Identity>> = ips
                .iter()
                .map(|ips| ips.iter().map(|&ip| Identity::new().with_ip(ip)).collect())
                .collect();
            let name = format!(
                "gcra_1rule_throughput/{threads}_thread{}_{}",
                if threads == 1 { "" } else { "s" },
                if hot { "hot_key" } else { "distinct_keys" }
            );
            let mut g = group(c, &name);
            g.throughput(Throughput::Elements(threads as u64));

            let limiter: DefaultKeyedRateLimiter<IpAddr> = RateLimiter::keyed(quota);
            let mut denied = 0;
            g.bench_function("governor", |b| {
                b.iter_custom(|iters| {
                    let check =
                        |t: usize, i: usize| limiter.check_key(black_box(&ips[t][i])).is_ok();
                    let (time, d) = run(threads, keys, iters, &check);
                    denied += d;
                    time
                })
            });
            assert_eq!(denied, 0, "{name}/governor: {denied} checks were denied");

            let gate = Tollgate::new(MemoryStore::new());
            let mut denied = 0;
            g.bench_function("tollgate", |b| {
                b.iter_custom(|iters| {
                    let check = |t: usize, i: usize| {
                        ready(gate.check(black_box(&p), black_box(&who[t][i]), 1))
                            .expect("the identity has an IP")
                            .allowed()
                    };
                    let (time, d) = run(threads, keys, iters, &check);
                    denied += d;
                    time
                })
            });
            assert_eq!(denied, 0, "{name}/tollgate: {denied} checks were denied");
            g.finish();
        }
    }
}
