//! Bypass: requests let through without counting (the seed's administrators).

use std::{collections::HashSet, fmt, net::IpAddr, str::FromStr, sync::Arc};

use crate::identity::Identity;

/// An IP network in CIDR form: `10.0.0.0/8`, `2001:db8::/32`, or one address.
///
/// ```
/// use tollgate::IpNet;
///
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// assert!(!net.contains("11.0.0.1".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The network `addr/prefix`; host bits are cleared.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<IpNet, IpNetError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(IpNetError::PrefixTooLong { prefix, max });
        }
        Ok(IpNet {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// The network `addr/prefix` for a prefix known to fit the address family.
    pub(crate) fn masked(addr: IpAddr, prefix: u8) -> IpNet {
        IpNet {
            addr: mask(addr, prefix),
            prefix,
        }
    }

    /// The network's first address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & m).into())
        }
    }
}

/// Why text is not an [`IpNet`], or a prefix does not fit its address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IpNetError {
    /// The text is neither an address nor `address/prefix`.
    #[error("{0:?} is not an IP network (e.g. 10.0.0.0/8 or 192.0.2.7)")]
    Syntax(String),
    /// The prefix is longer than the address (`/33` on IPv4, `/129` on IPv6).
    #[error("prefix /{prefix} is longer than {max} bits")]
    PrefixTooLong {
        /// The prefix given.
        prefix: u8,
        /// The address family's bits: 32 or 128.
        max: u8,
    },
    /// The same, in a network given as text.
    #[error("{text:?}: prefix /{prefix} is longer than {max} bits")]
    PrefixTooLongIn {
        /// The text given.
        text: String,
        /// The prefix given.
        prefix: u8,
        /// The address family's bits: 32 or 128.
        max: u8,
    },
}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(s: &str) -> Result<IpNet, IpNetError> {
        let bad = || IpNetError::Syntax(s.to_owned());
        match s.split_once('/') {
            Some((addr, prefix)) => {
                let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
                let prefix: u8 = prefix.trim().parse().map_err(|_| bad())?;
                IpNet::new(addr, prefix).map_err(|e| match e {
                    IpNetError::PrefixTooLong { prefix, max } => IpNetError::PrefixTooLongIn {
                        text: s.to_owned(),
                        prefix,
                        max,
                    },
                    other => other,
                })
            }
            None => {
                let addr: IpAddr = s.trim().parse().map_err(|_| bad())?;
                IpNet::new(addr, if addr.is_ipv4() { 32 } else { 128 })
            }
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Who passes a policy without being counted: allowlisted networks and user ids, and a
/// predicate over the identity (e.g. "is an administrator").
///
/// The bypass is consulted before the blocklist: an allowlisted identity that is banned is
/// still let through.
///
/// ```
/// use tollgate::{Bypass, Identity};
///
/// let bypass = Bypass::new()
///     .ip_net("10.0.0.0/8".parse()?)
///     .user_id("admin")
///     .when(|who| who.header("x-role") == Some("ops"));
/// assert!(bypass.matches(&Identity::new().with_user_id("admin")));
/// assert!(bypass.matches(&Identity::new().with_header("X-Role", "ops")));
/// assert!(!bypass.matches(&Identity::new().with_user_id("bob")));
/// # Ok::<(), tollgate::IpNetError>(())
/// ```
#[derive(Clone, Default)]
pub struct Bypass {
    nets: Vec<IpNet>,
    user_ids: HashSet<String>,
    predicate: Option<Predicate>,
}

type Predicate = Arc<dyn Fn(&Identity) -> bool + Send + Sync>;

impl Bypass {
    /// A bypass that lets nobody through.
    pub fn new() -> Bypass {
        Bypass::default()
    }

    /// Lets requests from `net` through.
    #[must_use]
    pub fn ip_net(mut self, net: IpNet) -> Bypass {
        self.nets.push(net);
        self
    }

    /// Lets the user `id` through.
    #[must_use]
    pub fn user_id(mut self, id: impl Into<String>) -> Bypass {
        self.user_ids.insert(id.into());
        self
    }

    /// Lets through every identity for which `predicate` is true.
    #[must_use]
    pub fn when(mut self, predicate: impl Fn(&Identity) -> bool + Send + Sync + 'static) -> Bypass {
        self.predicate = Some(Arc::new(predicate));
        self
    }

    /// Whether `identity` passes.
    pub fn matches(&self, identity: &Identity) -> bool {
        identity
            .ip()
            .is_some_and(|ip| self.nets.iter().any(|n| n.contains(ip)))
            || identity
                .user_id()
                .is_some_and(|id| self.user_ids.contains(id))
            || self.predicate.as_ref().is_some_and(|p| p(identity))
    }
}

impl fmt::Debug for Bypass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bypass")
            .field("nets", &self.nets)
            .field("user_ids", &self.user_ids)
            .field("predicate", &self.predicate.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_match_by_prefix() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(net("192.168.1.77/24").contains(ip("192.168.1.1")));
        assert_eq!(net("192.168.1.77/24").to_string(), "192.168.1.0/24");
        assert!(net("0.0.0.0/0").contains(ip("8.8.8.8")));
        assert!(net("2001:db8::/32").contains(ip("2001:db8:1::1")));
        assert!(!net("2001:db8::/32").contains(ip("10.0.0.1")));
        assert!(net("10.0.0.0/8").contains(ip("::ffff:10.2.3.4")));
        assert!(net("203.0.113.9").contains(ip("203.0.113.9")));
        assert!(!net("203.0.113.9").contains(ip("203.0.113.8")));
        assert_eq!(
            "10.0.0.0/33".parse::<IpNet>().unwrap_err().to_string(),
            "\"10.0.0.0/33\": prefix /33 is longer than 32 bits"
        );
        assert_eq!(
            "ten/8".parse::<IpNet>().unwrap_err(),
            IpNetError::Syntax("ten/8".into())
        );
    }
}
