//! The blocklist: offenders banned for a while after a violation, checked before any rule.

use std::{fmt, net::IpAddr, time::Duration};

use crate::key;

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

/// Who is banned: an IP or a user id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BanTarget {
    /// A client IP.
    Ip(IpAddr),
    /// An authenticated user id.
    UserId(String),
}

impl BanTarget {
    /// Parses a (kind, value) pair as used by APIs: kind `ip` or `user_id`.
    pub fn parse(kind: &str, value: &str) -> Result<BanTarget, String> {
        match kind {
            "ip" => value
                .parse()
                .map(BanTarget::Ip)
                .map_err(|_| format!("{value:?} is not an IP address")),
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

    /// The IP or user id as text.
    pub fn value(&self) -> String {
        match self {
            BanTarget::Ip(ip) => ip.to_string(),
            BanTarget::UserId(id) => id.clone(),
        }
    }

    /// The store key holding this target's ban: `prefix:{ban}:kind:value`.
    ///
    /// All bans share the `{ban}` hash tag so a Redis Cluster can list them from one slot.
    pub fn key(&self, prefix: &str) -> String {
        let mut k = String::new();
        key::push_ban_key(&mut k, prefix, self.kind(), &self.value());
        k
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
        assert_eq!(a, "tg:{ban}:user_id:a%3Ab");
    }
}
