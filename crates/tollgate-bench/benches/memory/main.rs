//! The memory store against the in-process limiters Rust users would pick instead, side by side
//! in one criterion group per case: `cargo bench -p tollgate-bench --bench memory`, then
//! `python3 crates/tollgate-bench/ratios.py` for the table of ratios (docs/benchmarks.md).
//!
//! tollgate is called as a user calls it: `Tollgate::check(&policy, &identity, 1)`. The memory
//! store's future is ready at once, so it is polled once with a no-op waker (what
//! `futures::FutureExt::now_or_never` does) instead of going through a runtime. Each peer is
//! called as its users call it. Every benchmark counts the decisions that went the unintended
//! way (an admission in a deny benchmark or the reverse) and fails if there is one, so each
//! figure measures the path its name says.
//!
//! # Layout
//! - `support`: the keys (1000 client IPs taken in turn), policies, and the single-threaded
//!   timing of governor's and tollgate's checks.
//! - `vs_governor`: governor's keyed limiter, one quota, against 1-rule GCRA (`gcra_1rule/*`),
//!   3 sliding-log rules (`sliding_log_3rules/*`) and 2 limiters x 3 rules (`limiters_2x3/*`);
//!   GCRA also with each identity built for its check from governor's IPs
//!   (`tollgate_identity_per_check`: what a caller holding a client IP pays).
//! - `vs_limitador`: limitador's in-memory fixed windows, 1 and 3 limits, against as many
//!   fixed-window rules (`fixed_window_1rule/admit`, `fixed_window_3rules/admit`).
//! - `threads`: governor and 1-rule GCRA on 1 and 2 threads, distinct keys and one hot key, as
//!   throughput (`gcra_1rule_throughput/*`).
//! - `middleware`: an axum route bare, behind `RateLimitLayer` and behind tower_governor's
//!   `GovernorLayer` (`middleware/gcra_1rule`).
//! - `kinds`: the limit kinds beside the rate rules, each beside the plain check it extends
//!   (`limit_kinds/admit`): calendar windows, shadow limiters, concurrency leases, refunds.

mod clock;
mod kinds;
mod middleware;
mod support;
mod threads;
mod vs_governor;
mod vs_limitador;

use criterion::{Criterion, criterion_group, criterion_main};

fn config() -> Criterion {
    // The HTML plots take longer than the measurements on a small machine.
    Criterion::default().without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = vs_governor::gcra_one_rule, vs_governor::sliding_log, vs_limitador::fixed_windows,
        threads::gcra_threads, middleware::middleware, clock::clock_read, kinds::limit_kinds
}
criterion_main!(benches);
