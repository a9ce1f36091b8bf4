//! A multi-rule policy admitting and denying, on the embedded store with a manual clock.
//!
//! Run with `cargo run --example quickstart`.

use std::time::Duration;

use tollgate::{
    BanRule, Dimension, Identity, Limiter, ManualClock, MemoryStore, Policy, Reason, Tollgate,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A manual clock lets the example move through an hour instantly.
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let gate = Tollgate::new(MemoryStore::builder().clock(clock.clone()).build());

    // "1 SMS code per minute AND 5 per hour per IP, AND 3 per hour per user"; an IP that
    // breaks its limits is banned for ten minutes.
    let sms = Policy::builder("sms_code")
        .limiter(
            Limiter::new(Dimension::Ip, ["1/1m".parse()?, "5/1h".parse()?])
                .with_blocklist(BanRule::new(Duration::from_secs(600))),
        )
        .limiter(Limiter::new(Dimension::UserId, ["3/1h".parse()?]))
        .build()?;

    let alice = Identity::new()
        .with_ip("198.51.100.7".parse()?)
        .with_user_id("alice");
    for minute in 0..5 {
        let decision = gate.check(&sms, &alice, 1).await?;
        let rules: Vec<String> = decision
            .rules(&sms)
            .iter()
            .map(|r| format!("{} {}: {} left", r.limiter, r.rule, r.remaining))
            .collect();
        println!(
            "minute {minute}: {:<12} retry after {:>6}  [{}]",
            decision.reason().as_str(),
            decision
                .retry_after()
                .map_or("-".into(), |d| format!("{}s", d.as_secs())),
            rules.join(", ")
        );
        if minute == 1 {
            // A second click in the same minute: denied, and the IP is banned.
            let again = gate.check(&sms, &alice, 1).await?;
            println!(
                "  second click: {} (retry after {:?})",
                again.reason(),
                again.retry_after()
            );
            assert_eq!(again.reason(), Reason::RateLimited);
        }
        clock.advance(Duration::from_secs(61));
    }
    clock.advance(Duration::from_secs(600));
    let later = gate.check(&sms, &alice, 1).await?;
    println!(
        "after the ban: {} — the user's 3/1h rule decides now",
        later.reason()
    );
    Ok(())
}
