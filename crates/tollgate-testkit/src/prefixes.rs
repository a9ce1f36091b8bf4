//! Conformance scenarios for IP prefixes: `ip` limiters and bans count a client by its network,
//! so rotating addresses inside one network never buys a fresh quota (invariant 9).
//!
//! Like [`guards`](crate::guards), each scenario takes a fresh [`Subject`];
//! [`prefix_suite!`](crate::prefix_suite) expands to one `#[tokio::test]` per scenario.

use std::{
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use crate::FullStore;
use tollgate::{BanRule, BanTarget, Bypass, Dimension, Identity, Limiter, Policy, Reason, Rule};

use crate::conformance::{START, Subject};

/// Expands to one `#[tokio::test]` per IP-prefix scenario; `$make` as for
/// [`conformance_suite!`](crate::conformance_suite).
#[macro_export]
macro_rules! prefix_suite {
    ($make:expr) => {
        $crate::prefix_suite!(@each $make;
            ip_prefix_one_ipv6_network_shares_one_quota,
            ip_prefix_configured_prefixes_group_wider_networks,
            ip_prefix_bans_cover_the_ipv6_network,
            ip_prefix_bypass_matches_the_exact_address,
        );
    };
    (@each $make:expr; $($scenario:ident),+ $(,)?) => {
        $(
            #[::tokio::test]
            async fn $scenario() {
                let subject = ($make)().await;
                $crate::prefixes::$scenario(subject).await;
            }
        )+
    };
}

fn rule(text: &str) -> Rule {
    text.parse().expect("scenario rules are valid")
}

fn from(ip: IpAddr) -> Identity {
    Identity::new().with_ip(ip)
}

fn parse(ip: &str) -> IpAddr {
    ip.parse().expect("scenario addresses are valid")
}

/// The `n`-th address of the /64 `base`: distinct for every `n` (an odd multiplier is a
/// bijection), spread over the whole interface id.
fn nth(base: &str, n: u64) -> IpAddr {
    let base = u128::from(base.parse::<Ipv6Addr>().expect("an IPv6 base"));
    let host = u128::from((n + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    IpAddr::V6(Ipv6Addr::from(base | host))
}

fn per_ip(scope: &str, dimension: Dimension, rules: &str) -> Policy {
    Policy::builder(scope)
        .limiter(Limiter::new(dimension, [rule(rules)]))
        .build()
        .expect("valid policy")
}

async fn check<S: FullStore>(s: &Subject<S>, p: &Policy, who: &Identity) -> tollgate::Decision {
    s.gate().check(p, who, 1).await.expect("identity complete")
}

async fn admitted<S: FullStore>(
    s: &Subject<S>,
    p: &Policy,
    ips: impl Iterator<Item = IpAddr>,
) -> usize {
    let mut admitted = 0;
    for ip in ips {
        admitted += usize::from(check(s, p, &from(ip)).await.allowed());
    }
    admitted
}

/// 1,000 distinct addresses of one /64 share one quota of 5; addresses of other /64s each get
/// their own; IPv4 addresses still count one by one.
pub async fn ip_prefix_one_ipv6_network_shares_one_quota<S: FullStore>(s: Subject<S>) {
    s.clock().set(START);
    let p = per_ip("rotate", Dimension::Ip, "5/1m");
    let rotated = admitted(&s, &p, (0..1000).map(|n| nth("2001:db8:1:2::", n))).await;
    assert_eq!(
        rotated, 5,
        "1,000 addresses of one /64 admitted {rotated}, not 5"
    );
    // Every one of them is now refused, whichever address it comes from.
    let d = check(&s, &p, &from(parse("2001:db8:1:2::1"))).await;
    assert_eq!(d.reason(), Reason::RateLimited);
    // 50 other /64s of the same /48 each have their own quota.
    let others = (0..50u16).map(|i| parse(&format!("2001:db8:1:{:x}::1", 0x100 + i)));
    assert_eq!(admitted(&s, &p, others).await, 50);
    // IPv4 keeps counting each address: 10 addresses of one /24, 5 checks each.
    let v4 = (0..10).flat_map(|i| std::iter::repeat_n(parse(&format!("192.0.2.{i}")), 6));
    assert_eq!(admitted(&s, &p, v4).await, 50);
    // A mapped address is the IPv4 address it carries.
    let d = check(&s, &p, &from(parse("::ffff:192.0.2.3"))).await;
    assert_eq!(d.reason(), Reason::RateLimited);
}

/// `/48` for IPv6 groups every /64 of a site; `/24` for IPv4 groups a small network; the
/// limiter keeps its name, and another network is counted apart.
pub async fn ip_prefix_configured_prefixes_group_wider_networks<S: FullStore>(s: Subject<S>) {
    s.clock().set(START);
    let dimension = Dimension::ip_prefix(24, 48).expect("valid prefixes");
    let p = per_ip("site", dimension, "3/1m");
    assert_eq!(p.limiters()[0].name(), "ip");
    let site = (0..40u16).map(|i| nth(&format!("2001:db8:aa:{i:x}::"), u64::from(i)));
    assert_eq!(admitted(&s, &p, site).await, 3);
    let next_site = (0..10u16).map(|i| parse(&format!("2001:db8:ab:{i:x}::1")));
    assert_eq!(admitted(&s, &p, next_site).await, 3);
    let lan = (1..=40).map(|i| parse(&format!("198.51.100.{i}")));
    assert_eq!(admitted(&s, &p, lan).await, 3);
    let d = check(&s, &p, &from(parse("::ffff:198.51.100.200"))).await;
    assert_eq!(d.reason(), Reason::RateLimited);
    assert!(check(&s, &p, &from(parse("198.51.101.1"))).await.allowed());
    // The same policy counting by the default prefixes keeps separate counters per /64.
    let p64 = per_ip("site64", Dimension::Ip, "3/1m");
    let site = (0..40u16).map(|i| parse(&format!("2001:db8:aa:{i:x}::1")));
    assert_eq!(admitted(&s, &p64, site).await, 40);
}

/// A ban on one IPv6 address bans its /64: every neighbour is blocked, another /64 is not; the
/// listing shows the network; a manual ban of one address bans its /64 and any address of it
/// lifts it.
pub async fn ip_prefix_bans_cover_the_ipv6_network<S: FullStore>(s: Subject<S>) {
    s.clock().set(START);
    let sms = Policy::builder("sms")
        .limiter(
            Limiter::new(Dimension::Ip, [rule("1/1m")])
                .with_blocklist(BanRule::new(Duration::from_secs(600))),
        )
        .build()
        .expect("valid policy");
    let other = per_ip("other", Dimension::Global, "1000/1m");
    let offender = from(parse("2001:db8:5:5::1"));
    assert!(check(&s, &sms, &offender).await.allowed());
    assert_eq!(
        check(&s, &sms, &offender).await.reason(),
        Reason::RateLimited
    );
    for n in 0..100 {
        let neighbour = from(nth("2001:db8:5:5::", n));
        let d = check(&s, &other, &neighbour).await;
        assert_eq!(d.reason(), Reason::Blocked, "neighbour {n}");
        assert_eq!(d.retry_after(), Some(Duration::from_secs(600)));
    }
    assert!(
        check(&s, &other, &from(parse("2001:db8:5:6::1")))
            .await
            .allowed()
    );
    let bans = s.gate().blocklist().await.expect("store answers");
    let listed: Vec<String> = bans.iter().map(|b| b.target.to_string()).collect();
    assert_eq!(listed, ["ip:2001:db8:5:5::/64"]);
    assert_eq!(bans[0].target, BanTarget::Ip(parse("2001:db8:5:5:ffff::7")));

    let manual = BanTarget::parse("ip", "2001:db8:7::1").expect("an address");
    s.gate()
        .ban(&manual, Duration::from_secs(60))
        .await
        .expect("store answers");
    let d = check(&s, &other, &from(parse("2001:db8:7:0:ffff:ffff:ffff:ffff"))).await;
    assert_eq!(d.reason(), Reason::Blocked);
    assert!(
        check(&s, &other, &from(parse("2001:db8:7:1::1")))
            .await
            .allowed()
    );
    let mut listed: Vec<String> = s
        .gate()
        .blocklist()
        .await
        .expect("store answers")
        .iter()
        .map(|b| b.target.value())
        .collect();
    listed.sort();
    assert_eq!(listed, ["2001:db8:5:5::/64", "2001:db8:7::/64"]);
    let neighbour = BanTarget::Ip(parse("2001:db8:7::abcd"));
    assert!(s.gate().unban(&neighbour).await.expect("store answers"));
    assert!(
        check(&s, &other, &from(parse("2001:db8:7::1")))
            .await
            .allowed()
    );
}

/// A bypass network matches the full address: one allowlisted IPv6 address passes, its /64
/// neighbours are counted (and share one quota).
pub async fn ip_prefix_bypass_matches_the_exact_address<S: FullStore>(s: Subject<S>) {
    s.clock().set(START);
    let p = Policy::builder("admin")
        .limiter(Limiter::new(Dimension::Ip, [rule("1/1m")]))
        .bypass(Bypass::new().ip_net("2001:db8:9::1".parse().expect("an address")))
        .build()
        .expect("valid policy");
    let office = from(parse("2001:db8:9::1"));
    for _ in 0..3 {
        assert_eq!(check(&s, &p, &office).await.reason(), Reason::Bypassed);
    }
    // Nothing was counted for the /64: one neighbour gets the unit, the next is refused.
    assert!(check(&s, &p, &from(parse("2001:db8:9::2"))).await.allowed());
    let d = check(&s, &p, &from(parse("2001:db8:9::3"))).await;
    assert_eq!(d.reason(), Reason::RateLimited);
    assert_eq!(check(&s, &p, &office).await.reason(), Reason::Bypassed);
}
