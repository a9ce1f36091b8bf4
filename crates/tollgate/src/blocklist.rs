//! The blocklist: offenders banned for a while after a violation, checked before any rule.

use std::{cmp::Ordering, fmt, hash, net::IpAddr, time::Duration};

use crate::{
    bypass::IpNet,
    identity::{IpPrefix, canonical},
    key,
    page::PageCursor,
};

/// Whom the bans a policy writes refuse (see [`PolicyBuilder::ban_scope`]).
///
/// [`PolicyBuilder::ban_scope`]: crate::PolicyBuilder::ban_scope
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BanScope {
    /// Every policy of the engine, and the Envoy domains that map identities (the default).
    #[default]
    Everywhere,
    /// This policy alone: its bans live apart (`Tollgate::bans_in`, `unban_in`), and other
    /// policies never see them.
    Policy,
}

/// How a limiter bans an offender when it denies: for `duration`, and, with escalation, for
/// `duration * factor^(strikes - 1)` up to `cap` for repeat offenders.
///
/// A repeat offence counts as a strike if it comes while the offender is still remembered:
/// until its ban ends plus `cap` (plus nothing without escalation).
///
/// ```
/// use std::time::Duration;
/// use tollgate::BanRule;
///
/// let ban = BanRule::new(Duration::from_secs(600)).escalate(2, Duration::from_secs(86_400));
/// assert_eq!(ban.duration_for(1), Duration::from_secs(600));
/// assert_eq!(ban.duration_for(3), Duration::from_secs(2_400));
/// assert_eq!(ban.duration_for(20), Duration::from_secs(86_400));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BanRule {
    duration: Duration,
    factor: u32,
    cap: Duration,
}

impl BanRule {
    /// Ban for `duration` on every violation.
    pub fn new(duration: Duration) -> BanRule {
        BanRule {
            duration,
            factor: 1,
            cap: duration,
        }
    }

    /// Multiply the ban by `factor` for each repeat offence, up to `cap`.
    #[must_use]
    pub fn escalate(mut self, factor: u32, cap: Duration) -> BanRule {
        self.factor = factor.max(1);
        self.cap = cap.max(self.duration);
        self
    }

    /// The first ban's length.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The escalation factor (1: none).
    pub fn factor(&self) -> u32 {
        self.factor
    }

    /// The longest ban.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The ban for the `strike`-th offence (1 for the first).
    pub fn duration_for(&self, strike: u32) -> Duration {
        let mut d = self.duration;
        for _ in 1..strike {
            d = d.saturating_mul(self.factor);
            if d >= self.cap {
                return self.cap;
            }
        }
        d.min(self.cap)
    }

    /// How long after a ban ends its strikes are remembered.
    pub fn memory(&self) -> Duration {
        if self.factor > 1 {
            self.cap
        } else {
            Duration::ZERO
        }
    }
}

/// Who is banned: a client network or a user id.
///
/// An IP ban covers the client's network as [`IpPrefix::DEFAULT`] counts it: the /64 of an
/// IPv6 address (every address one subscriber holds), the address itself for IPv4 (an
/// IPv4-mapped IPv6 address counts as IPv4). Two targets are equal, hash and sort alike, and
/// share one key when they name the same network: `BanTarget::Ip` of `2001:db8::1` and of
/// `2001:db8::2` are one ban, listed as `2001:db8::/64`.
///
/// ```
/// use tollgate::BanTarget;
///
/// let one = BanTarget::Ip("2001:db8::1".parse()?);
/// assert_eq!(one.value(), "2001:db8::/64");
/// assert_eq!(one, BanTarget::Ip("2001:db8::ffff:2".parse()?));
/// assert_eq!(one, BanTarget::parse("ip", "2001:db8::/64")?);
/// assert_ne!(one, BanTarget::Ip("2001:db8:0:1::1".parse()?));
/// assert_eq!(BanTarget::Ip("192.0.2.7".parse()?).value(), "192.0.2.7");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub enum BanTarget {
    /// A client IP: the ban covers its network (see above).
    Ip(IpAddr),
    /// An authenticated user id.
    UserId(String),
}

/// What a target means: the network an IP ban covers, or the user id.
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Normal<'a> {
    Ip(IpAddr),
    UserId(&'a str),
}

impl BanTarget {
    /// The prefixes a ban covers.
    pub const PREFIX: IpPrefix = IpPrefix::DEFAULT;

    /// Parses a (kind, value) pair as used by APIs: kind `ip` or `user_id`. An `ip` value is an
    /// address, or a network no wider than a ban covers (`2001:db8::/64`, `192.0.2.7/32`),
    /// as the blocklist lists it.
    pub fn parse(kind: &str, value: &str) -> Result<BanTarget, String> {
        match kind {
            "ip" => parse_ip(value).map(BanTarget::Ip),
            "user_id" if !value.is_empty() => Ok(BanTarget::UserId(value.to_owned())),
            "user_id" => Err("a user id cannot be empty".to_owned()),
            other => Err(format!("unknown ban kind {other:?} (use ip or user_id)")),
        }
    }

    /// `ip` or `user_id`.
    pub fn kind(&self) -> &'static str {
        match self {
            BanTarget::Ip(_) => "ip",
            BanTarget::UserId(_) => "user_id",
        }
    }

    /// The network an IP ban covers; `None` for a user id.
    pub fn network(&self) -> Option<IpNet> {
        match self {
            BanTarget::Ip(ip) => Some(BanTarget::PREFIX.network(*ip)),
            BanTarget::UserId(_) => None,
        }
    }

    /// The network (`2001:db8::/64`, `192.0.2.7`) or user id as text.
    pub fn value(&self) -> String {
        match self {
            BanTarget::Ip(ip) => BanTarget::PREFIX.network_text(*ip),
            BanTarget::UserId(id) => id.clone(),
        }
    }

    /// The store key holding this target's ban: `prefix:ban:kind:value`.
    ///
    /// The key has no hash tag, so on a Redis Cluster the bans spread over the slots by
    /// target; the ban index (`prefix:{ban}:index`) lists them.
    pub fn key(&self, prefix: &str) -> String {
        let mut k = String::new();
        key::push_ban_key(&mut k, prefix, self.kind(), &self.value());
        k
    }

    fn normal(&self) -> Normal<'_> {
        match self {
            BanTarget::Ip(ip) => Normal::Ip(BanTarget::PREFIX.network(*ip).addr()),
            BanTarget::UserId(id) => Normal::UserId(id),
        }
    }
}

/// An address, or a network no wider than a ban covers, as the address of its network.
fn parse_ip(value: &str) -> Result<IpAddr, String> {
    if !value.contains('/') {
        return value
            .parse()
            .map_err(|_| format!("{value:?} is not an IP address"));
    }
    let net: IpNet = value
        .parse()
        .map_err(|_| format!("{value:?} is not an IP address or network"))?;
    // An IPv4-mapped network (`::ffff:192.0.2.0/120`) is as wide as its IPv4 part.
    let (len, widest) = match (net.addr(), canonical(net.addr())) {
        (IpAddr::V6(_), IpAddr::V4(_)) => (net.prefix().saturating_sub(96), BanTarget::PREFIX.v4()),
        (_, IpAddr::V4(_)) => (net.prefix(), BanTarget::PREFIX.v4()),
        (_, IpAddr::V6(_)) => (net.prefix(), BanTarget::PREFIX.v6()),
    };
    if len < widest {
        return Err(format!(
            "{value:?} is wider than a ban covers (one IPv4 address or one IPv6 /{})",
            BanTarget::PREFIX.v6()
        ));
    }
    Ok(net.addr())
}

impl PartialEq for BanTarget {
    fn eq(&self, other: &BanTarget) -> bool {
        self.normal() == other.normal()
    }
}

impl Eq for BanTarget {}

impl hash::Hash for BanTarget {
    fn hash<H: hash::Hasher>(&self, state: &mut H) {
        self.normal().hash(state);
    }
}

impl PartialOrd for BanTarget {
    fn partial_cmp(&self, other: &BanTarget) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BanTarget {
    fn cmp(&self, other: &BanTarget) -> Ordering {
        self.normal().cmp(&other.normal())
    }
}

impl fmt::Display for BanTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind(), self.value())
    }
}

/// One active ban.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BanEntry {
    /// Who.
    pub target: BanTarget,
    /// Time left.
    pub expires_in: Duration,
    /// Offences remembered, this one included (1 for a first or manual ban).
    pub strikes: u32,
}

/// One page of the blocklist (see [`BanStore::bans_page`](crate::BanStore::bans_page)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BanPage {
    /// The bans, in the order they end.
    pub bans: Vec<BanEntry>,
    /// Where the next page starts; `None` after the last page. A page may come back shorter
    /// than asked, or even empty, while more follow.
    pub next: Option<PageCursor>,
}

/// Pages `bans` by target, for stores that can only list every ban: their cursors carry the
/// target's key and no end time.
pub(crate) fn page_by_key(
    prefix: &str,
    bans: Vec<BanEntry>,
    after: Option<&PageCursor>,
    limit: usize,
) -> BanPage {
    let limit = limit.max(1);
    let mut keyed: Vec<(String, BanEntry)> = bans
        .into_iter()
        .map(|b| (b.target.key(prefix), b))
        .filter(|(key, _)| after.is_none_or(|a| key.as_str() > a.key()))
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let more = keyed.len() > limit;
    keyed.truncate(limit);
    let next = more
        .then(|| keyed.last().map(|(key, _)| PageCursor::new(0, key.clone())))
        .flatten();
    BanPage {
        bans: keyed.into_iter().map(|(_, b)| b).collect(),
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escalation_doubles_and_caps() {
        let b = BanRule::new(Duration::from_secs(600)).escalate(2, Duration::from_secs(3000));
        let secs: Vec<u64> = (1..=5).map(|s| b.duration_for(s).as_secs()).collect();
        assert_eq!(secs, [600, 1200, 2400, 3000, 3000]);
        let flat = BanRule::new(Duration::from_secs(60));
        assert_eq!(flat.duration_for(9), Duration::from_secs(60));
        assert_eq!(flat.memory(), Duration::ZERO);
    }

    #[test]
    fn paging_by_key_visits_every_ban_once() {
        let bans: Vec<BanEntry> = (0..7)
            .map(|i| BanEntry {
                target: BanTarget::UserId(format!("u{i}")),
                expires_in: Duration::from_secs(60),
                strikes: 1,
            })
            .collect();
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = page_by_key("p", bans.clone(), after.as_ref(), 3);
            assert!(page.bans.len() <= 3);
            seen.extend(page.bans.into_iter().map(|b| b.target));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let mut expected: Vec<BanTarget> = bans.into_iter().map(|b| b.target).collect();
        expected.sort();
        assert_eq!(seen, expected);
    }

    #[test]
    fn targets_parse_and_key_safely() {
        assert_eq!(
            BanTarget::parse("ip", "10.0.0.1"),
            Ok(BanTarget::Ip("10.0.0.1".parse().unwrap()))
        );
        assert!(BanTarget::parse("ip", "nope").is_err());
        assert!(BanTarget::parse("cookie", "x").is_err());
        let a = BanTarget::UserId("a:b".into()).key("tg");
        let b = BanTarget::UserId("a%3Ab".into()).key("tg");
        assert_ne!(a, b);
        assert_eq!(a, "tg:ban:user_id:a%3Ab");
    }

    #[test]
    fn ip_bans_cover_the_network() {
        let ip = |s: &str| BanTarget::Ip(s.parse().unwrap());
        let a = ip("2001:db8:1:2::1");
        let b = ip("2001:db8:1:2:ffff:ffff:ffff:ffff");
        let other = ip("2001:db8:1:3::1");
        assert_eq!(a, b);
        assert_eq!(a.key("tg"), b.key("tg"));
        assert_eq!(a.key("tg"), "tg:ban:ip:2001%3Adb8%3A1%3A2%3A%3A/64");
        assert_ne!(a, other);
        assert_ne!(a.key("tg"), other.key("tg"));
        assert_eq!(a.value(), "2001:db8:1:2::/64");
        assert_eq!(a.to_string(), "ip:2001:db8:1:2::/64");
        assert_eq!(a.network().unwrap().to_string(), "2001:db8:1:2::/64");
        let set: std::collections::HashSet<BanTarget> = [a.clone(), b, other].into();
        assert_eq!(set.len(), 2);

        // IPv4 keeps its per-address key; a mapped address is the IPv4 address.
        assert_eq!(ip("192.0.2.7").key("tg"), "tg:ban:ip:192.0.2.7");
        assert_eq!(ip("::ffff:192.0.2.7"), ip("192.0.2.7"));
        assert_ne!(ip("192.0.2.7"), ip("192.0.2.8"));

        // What the listing shows parses back to the same ban.
        for t in [a.clone(), ip("192.0.2.7")] {
            assert_eq!(BanTarget::parse("ip", &t.value()), Ok(t));
        }
        assert_eq!(BanTarget::parse("ip", "2001:db8:1:2::9/128"), Ok(a.clone()));
        assert_eq!(BanTarget::parse("ip", "2001:db8:1:2::/96"), Ok(a));
        assert_eq!(BanTarget::parse("ip", "192.0.2.7/32"), Ok(ip("192.0.2.7")));
        for wide in ["2001:db8::/48", "192.0.2.0/24", "::ffff:192.0.2.0/120"] {
            let e = BanTarget::parse("ip", wide).unwrap_err();
            assert!(e.contains("wider than a ban covers"), "{wide}: {e}");
        }
        assert!(BanTarget::parse("ip", "2001:db8::/x").is_err());
    }
}
