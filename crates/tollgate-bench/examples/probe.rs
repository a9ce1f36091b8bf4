//! Runs N checks of one case, for instruction counts that do not depend on load:
//!
//! ```sh
//! cargo build --release -p tollgate-bench --example probe
//! valgrind --tool=callgrind target/release/examples/probe gcra_admit 25000
//! ```
//!
//! The difference between the totals of 25,000 and 5,000 checks, divided by 20,000, is the
//! cost of one check without the set-up. Cases: `gcra_admit`, `gcra_deny`, `log_admit`,
//! `log_deny`, `two_by_three_admit`, `governor_admit`, `governor_deny`.

use std::{
    future::Future,
    hint::black_box,
    net::IpAddr,
    num::NonZeroU32,
    pin::pin,
    task::{Context, Poll, Waker},
};

use governor::{Quota, RateLimiter};
use tollgate::{Algorithm, Dimension, Identity, Limiter, MemoryStore, Policy, Rule, Tollgate};
use tollgate_bench::client_ip;

const KEYS: u32 = 1000;

fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("a memory-store check is ready at once"),
    }
}

fn rule(text: &str, algorithm: Algorithm) -> Rule {
    text.parse::<Rule>()
        .expect("a valid rule")
        .with_algorithm(algorithm)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "gcra_admit".into());
    let n: u32 = args.next().and_then(|n| n.parse().ok()).unwrap_or(25_000);
    let ips: Vec<IpAddr> = (0..KEYS).map(client_ip).collect();
    let who: Vec<Identity> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| Identity::new().with_ip(*ip).with_user_id(format!("u{i}")))
        .collect();
    if let Some(admit) = case.strip_prefix("governor_").map(|c| c == "admit") {
        let per_hour = NonZeroU32::new(if admit { u32::MAX } else { 1 }).expect("non-zero");
        let limiter = RateLimiter::keyed(Quota::per_hour(per_hour));
        let mut wrong = 0;
        for i in 0..n {
            let ip = &ips[(i % KEYS) as usize];
            wrong += u32::from(black_box(limiter.check_key(ip)).is_ok() != admit);
        }
        // The first check of each key admits.
        assert!(wrong <= KEYS, "{wrong} checks went the wrong way");
        return;
    }
    let (rules, admit, limiters): (Vec<Rule>, bool, usize) = match case.as_str() {
        "gcra_admit" => (vec![rule("1000000000/1h", Algorithm::Gcra)], true, 1),
        "gcra_deny" => (vec![rule("1/1h", Algorithm::Gcra)], false, 1),
        "log_admit" => (
            ["1000000/1m", "2000000/1h", "3000000/1d"]
                .iter()
                .map(|t| rule(t, Algorithm::SlidingLog))
                .collect(),
            true,
            1,
        ),
        "log_deny" => (
            ["10/1m", "20/1h", "60/1d"]
                .iter()
                .map(|t| rule(t, Algorithm::SlidingLog))
                .collect(),
            false,
            1,
        ),
        "two_by_three_admit" => (
            ["1000000/1m", "2000000/1h", "3000000/1d"]
                .iter()
                .map(|t| rule(t, Algorithm::SlidingLog))
                .collect(),
            true,
            2,
        ),
        other => panic!("unknown case {other}"),
    };
    let mut policy = Policy::builder("probe").limiter(Limiter::new(Dimension::Ip, rules.clone()));
    if limiters == 2 {
        policy = policy.limiter(Limiter::new(Dimension::UserId, rules));
    }
    let policy = policy.build().expect("a valid policy");
    let gate = Tollgate::new(MemoryStore::new());
    // Deny cases: use up every key first.
    if !admit {
        for who in &who {
            while ready(gate.check(&policy, who, 1))
                .expect("a check")
                .allowed()
            {}
        }
    }
    let mut wrong = 0;
    for i in 0..n {
        let who = &who[(i % KEYS) as usize];
        let decision = ready(gate.check(&policy, black_box(who), 1)).expect("a check");
        wrong += u32::from(black_box(decision).allowed() != admit);
    }
    assert_eq!(wrong, 0, "checks went the wrong way");
}
