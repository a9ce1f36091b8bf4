//! Who is asking: the facts about one request that dimensions read.

use std::{
    borrow::Cow,
    fmt::{self, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
    sync::Arc,
};

use crate::{bypass::IpNet, key};

/// The facts about one request that [`Dimension`]s read: client IP, user id, user name,
/// headers and named arguments.
///
/// ```
/// use tollgate::Identity;
///
/// let who = Identity::new()
///     .with_ip("203.0.113.7".parse()?)
///     .with_user_id("42")
///     .with_header("X-Api-Key", "k1");
/// assert_eq!(who.header("x-api-key"), Some("k1"));
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Identity {
    ip: Option<IpAddr>,
    user_id: Option<String>,
    /// Every other fact, boxed: an identity of what most limiters count by (a client IP, a
    /// user id) is 56 bytes to build, move and read, and allocates nothing more. `None` while
    /// it has none (never an empty box, so that equal identities compare and hash equal).
    facts: Option<Box<Facts>>,
}

/// The facts of an identity beside its IP and user id.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
struct Facts {
    user_name: Option<String>,
    headers: Vec<(String, String)>,
    args: Vec<(String, String)>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("ip", &self.ip)
            .field("user_id", &self.user_id())
            .field("user_name", &self.user_name())
            .field("headers", &self.headers().collect::<Vec<_>>())
            .field("args", &self.args().collect::<Vec<_>>())
            .finish()
    }
}

impl Identity {
    /// An identity that knows nothing yet.
    pub fn new() -> Identity {
        Identity::default()
    }

    /// Sets the client IP.
    #[must_use]
    pub fn with_ip(mut self, ip: IpAddr) -> Identity {
        self.ip = Some(ip);
        self
    }

    /// Sets the authenticated user's id.
    #[must_use]
    pub fn with_user_id(mut self, id: impl Into<String>) -> Identity {
        self.user_id = Some(id.into());
        self
    }

    /// Sets the authenticated user's name.
    #[must_use]
    pub fn with_user_name(mut self, name: impl Into<String>) -> Identity {
        self.facts_mut().user_name = Some(name.into());
        self
    }

    /// Adds a header; names are case-insensitive.
    #[must_use]
    pub fn with_header(mut self, name: impl AsRef<str>, value: impl Into<String>) -> Identity {
        self.facts_mut()
            .headers
            .push((name.as_ref().to_ascii_lowercase(), value.into()));
        self
    }

    /// Adds a named argument (a function argument, a form field).
    #[must_use]
    pub fn with_arg(mut self, name: impl Into<String>, value: impl Into<String>) -> Identity {
        self.facts_mut().args.push((name.into(), value.into()));
        self
    }

    /// The client IP.
    pub fn ip(&self) -> Option<IpAddr> {
        self.ip
    }

    /// The user id.
    pub fn user_id(&self) -> Option<&str> {
        self.user_id.as_deref()
    }

    /// The user name.
    pub fn user_name(&self) -> Option<&str> {
        self.facts.as_ref()?.user_name.as_deref()
    }

    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.facts
            .as_ref()?
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The named argument.
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.facts
            .as_ref()?
            .args
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every header, as given (names in lower case).
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.facts
            .as_ref()
            .map_or(&[][..], |f| &f.headers)
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Every named argument, as given.
    pub fn args(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.facts
            .as_ref()
            .map_or(&[][..], |f| &f.args)
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
    }

    fn facts_mut(&mut self) -> &mut Facts {
        self.facts.get_or_insert_with(Box::default)
    }
}

/// A function that reads a custom dimension value from an identity.
pub type Extractor = Arc<dyn Fn(&Identity) -> Option<String> + Send + Sync>;

/// What an `ip` dimension counts by: the client's network, not its address.
///
/// One IPv6 subscriber holds a whole /64 (2^64 addresses), so counting IPv6 clients by address
/// would give each new address of the same client a fresh quota. By default IPv6 addresses count
/// by their /64 and IPv4 addresses by themselves (/32); stricter limiters group IPv6 by /56 or
/// /48 (what one site is often given) and IPv4 by /24 (at the cost of counting the neighbours
/// behind one NAT or in one small network together). An IPv4-mapped IPv6 address
/// (`::ffff:192.0.2.7`) counts as the IPv4 address.
///
/// The network's text, as it appears in keys and the blocklist, is the address for a network of
/// one address (`192.0.2.7`) and CIDR otherwise (`2001:db8:1:2::/64`, `192.0.2.0/24`).
///
/// ```
/// use tollgate::IpPrefix;
///
/// let wide = IpPrefix::new(24, 48)?;
/// assert_eq!(wide.network_text("2001:db8:1:2::7".parse()?), "2001:db8:1::/48");
/// assert_eq!(wide.network_text("198.51.100.9".parse()?), "198.51.100.0/24");
/// assert_eq!(IpPrefix::DEFAULT.network_text("2001:db8:1:2::7".parse()?), "2001:db8:1:2::/64");
/// assert_eq!(IpPrefix::DEFAULT.network_text("::ffff:198.51.100.9".parse()?), "198.51.100.9");
/// assert!(IpPrefix::new(33, 64).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    v4: u8,
    v6: u8,
}

impl IpPrefix {
    /// IPv4 by the address (/32), IPv6 by the /64: what [`Dimension::Ip`] counts by, and what a
    /// ban covers.
    pub const DEFAULT: IpPrefix = IpPrefix { v4: 32, v6: 64 };

    /// Count IPv4 addresses by their `/v4` network and IPv6 addresses by their `/v6` network.
    /// `v4` is at most 32 and `v6` at most 128.
    pub fn new(v4: u8, v6: u8) -> Result<IpPrefix, String> {
        if v4 > 32 {
            return Err(format!(
                "an IPv4 prefix is at most 32 bits, not {v4} (32 counts each address)"
            ));
        }
        if v6 > 128 {
            return Err(format!(
                "an IPv6 prefix is at most 128 bits, not {v6} (64 is one subscriber)"
            ));
        }
        Ok(IpPrefix { v4, v6 })
    }

    /// The IPv4 prefix length.
    pub fn v4(self) -> u8 {
        self.v4
    }

    /// The IPv6 prefix length.
    pub fn v6(self) -> u8 {
        self.v6
    }

    /// The network `ip` counts in.
    pub fn network(self, ip: IpAddr) -> IpNet {
        match canonical(ip) {
            IpAddr::V4(v4) => IpNet::masked(IpAddr::V4(v4), self.v4),
            IpAddr::V6(v6) => IpNet::masked(IpAddr::V6(v6), self.v6),
        }
    }

    /// The text of the network `ip` counts in: the address for a network of one address,
    /// CIDR otherwise.
    pub fn network_text(self, ip: IpAddr) -> String {
        self.network_inline(ip).to_string()
    }

    /// Appends the network's text to `out` as an escaped key part; the same as
    /// `key::push_part(out, &self.network_text(ip))`, without allocating.
    pub(crate) fn push_key(self, ip: IpAddr, out: &mut (impl key::KeyOut + ?Sized)) {
        match canonical(ip) {
            // The common case, written by hand: `core::fmt` is slow, and digits, dots and `/`
            // need no escaping.
            IpAddr::V4(v4) => {
                key::push_ipv4(out, mask_v4(v4, self.v4));
                if self.v4 < 32 {
                    out.push_ascii(b'/');
                    key::push_u8(out, self.v4);
                }
            }
            ip => key::push_escaped(out, &self.network_inline(ip)),
        }
    }

    /// Appends the network of `ip` to a compact key: the family, the prefix length and the
    /// masked address, as bytes.
    pub(crate) fn push_compact(self, ip: IpAddr, out: &mut key::KeyBuf) {
        match canonical(ip) {
            IpAddr::V4(v4) => {
                let [a, b, c, d] = mask_v4(v4, self.v4).octets();
                out.push_bytes(&[4, self.v4, a, b, c, d]);
            }
            IpAddr::V6(v6) => {
                out.push_bytes(&[6, self.v6]);
                out.push_bytes(&mask_v6(v6, self.v6).octets());
            }
        }
    }

    /// The network's text in a stack buffer. The longest (`ffff:...:ffff/127`) is 44 bytes.
    pub(crate) fn network_inline(self, ip: IpAddr) -> NetworkText {
        let mut text = NetworkText::new();
        match canonical(ip) {
            // The common case, written by hand (as in `push_key`): `core::fmt` costs a
            // thousand instructions here.
            IpAddr::V4(v4) => {
                key::push_ipv4(&mut text, mask_v4(v4, self.v4));
                if self.v4 < 32 {
                    let _ = text.try_push('/');
                    key::push_u8(&mut text, self.v4);
                }
            }
            IpAddr::V6(v6) => {
                let _ = write!(text, "{}", mask_v6(v6, self.v6));
                if self.v6 < 128 {
                    let _ = write!(text, "/{}", self.v6);
                }
            }
        }
        text
    }
}

impl Default for IpPrefix {
    fn default() -> IpPrefix {
        IpPrefix::DEFAULT
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries; others unchanged.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn mask_v4(ip: Ipv4Addr, len: u8) -> Ipv4Addr {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    Ipv4Addr::from(u32::from(ip) & mask)
}

fn mask_v6(ip: Ipv6Addr, len: u8) -> Ipv6Addr {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    Ipv6Addr::from(u128::from(ip) & mask)
}

/// An IP network as text, on the stack (see [`IpPrefix::network_inline`]).
pub(crate) type NetworkText = arrayvec::ArrayString<64>;

/// What a limiter counts by.
///
/// Text forms: `global`, `ip`, `user_id`, `user_name`, `header:<name>`, `arg:<name>`.
///
/// ```
/// use tollgate::Dimension;
///
/// let by_key: Dimension = "header:x-api-key".parse()?;
/// assert_eq!(by_key.to_string(), "header:x-api-key");
/// // A /56 per IPv6 site, a /24 per IPv4 network.
/// let by_site = Dimension::ip_prefix(24, 56)?;
/// assert_eq!(by_site.to_string(), "ip");
/// assert!("phone".parse::<Dimension>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum Dimension {
    /// One counter for everybody.
    Global,
    /// Per client network with the default prefixes ([`IpPrefix::DEFAULT`]): IPv4 by address,
    /// IPv6 by /64.
    Ip,
    /// Per client network with chosen prefixes; see [`Dimension::ip_prefix`]. Written `ip`,
    /// like [`Dimension::Ip`].
    IpPrefix(IpPrefix),
    /// Per authenticated user id.
    UserId,
    /// Per authenticated user name.
    UserName,
    /// Per value of a request header (name in lower case).
    Header(String),
    /// Per value of a named argument.
    Arg(String),
    /// Per value of an application-defined function.
    Custom {
        /// Names the dimension in keys and messages.
        name: String,
        /// Reads the value; `None` means the identity lacks it.
        extract: Extractor,
    },
}

impl Dimension {
    /// Per client network: IPv4 addresses by their `/v4`, IPv6 addresses by their `/v6`
    /// ([`IpPrefix::new`] says what is valid).
    ///
    /// ```
    /// use tollgate::{Dimension, Identity};
    ///
    /// let per_site = Dimension::ip_prefix(24, 48)?;
    /// let a = Identity::new().with_ip("2001:db8:7:1::1".parse()?);
    /// let b = Identity::new().with_ip("2001:db8:7:ffff::2".parse()?);
    /// assert_eq!(per_site.value(&a), per_site.value(&b));
    /// assert_eq!(per_site.value(&a).as_deref(), Some("2001:db8:7::/48"));
    /// assert!(Dimension::ip_prefix(24, 129).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ip_prefix(v4: u8, v6: u8) -> Result<Dimension, String> {
        IpPrefix::new(v4, v6).map(Dimension::IpPrefix)
    }

    /// The prefixes an `ip` dimension counts by; `None` for other dimensions.
    pub fn prefix(&self) -> Option<IpPrefix> {
        match self {
            Dimension::Ip => Some(IpPrefix::DEFAULT),
            Dimension::IpPrefix(prefix) => Some(*prefix),
            _ => None,
        }
    }

    /// A custom dimension computed by `extract`.
    pub fn custom(
        name: impl Into<String>,
        extract: impl Fn(&Identity) -> Option<String> + Send + Sync + 'static,
    ) -> Dimension {
        Dimension::Custom {
            name: name.into(),
            extract: Arc::new(extract),
        }
    }

    /// This dimension's value for `identity`, or `None` if the identity lacks it.
    pub fn value<'a>(&self, identity: &'a Identity) -> Option<Cow<'a, str>> {
        match self {
            Dimension::Global => Some(Cow::Borrowed("")),
            Dimension::Ip => identity
                .ip
                .map(|ip| Cow::Owned(IpPrefix::DEFAULT.network_text(ip))),
            Dimension::IpPrefix(prefix) => {
                identity.ip.map(|ip| Cow::Owned(prefix.network_text(ip)))
            }
            Dimension::UserId => identity.user_id().map(Cow::Borrowed),
            Dimension::UserName => identity.user_name().map(Cow::Borrowed),
            Dimension::Header(name) => identity.header(name).map(Cow::Borrowed),
            Dimension::Arg(name) => identity.arg(name).map(Cow::Borrowed),
            Dimension::Custom { extract, .. } => extract(identity).map(Cow::Owned),
        }
    }

    /// What this dimension counts `identity` by, as a key writes it: the client's network for an
    /// IP dimension, the value for any other; `None` if the identity lacks it.
    fn key_part<'a>(&self, identity: &'a Identity) -> Option<KeyPart<'a>> {
        match (self.prefix(), identity.ip) {
            (Some(prefix), Some(ip)) => Some(KeyPart::Network(prefix, ip)),
            (Some(_), None) => None,
            (None, _) => self.value(identity).map(KeyPart::Value),
        }
    }

    /// Appends this dimension's value for `identity` to a compact key (bytes, not text: see
    /// [`key::push_compact_part`]); false if the identity lacks it.
    pub(crate) fn push_compact(&self, identity: &Identity, out: &mut key::KeyBuf) -> bool {
        match self.key_part(identity) {
            Some(KeyPart::Network(prefix, ip)) => prefix.push_compact(ip, out),
            Some(KeyPart::Value(value)) => key::push_compact_part(out, &value),
            None => return false,
        }
        true
    }

    /// Appends this dimension's value for `identity` to `out` as a key part (escaped, see
    /// [`key::push_part`]); false if the identity lacks it.
    pub(crate) fn push_value(&self, identity: &Identity, out: &mut impl key::KeyOut) -> bool {
        match self.key_part(identity) {
            Some(KeyPart::Network(prefix, ip)) => prefix.push_key(ip, out),
            Some(KeyPart::Value(value)) => key::push_escaped(out, &value),
            None => return false,
        }
        true
    }
}

/// A dimension's value for an identity, as keys write it (see `Dimension::key_part`).
enum KeyPart<'a> {
    /// The client's network, by the dimension's prefixes.
    Network(IpPrefix, IpAddr),
    /// Any other dimension's value.
    Value(Cow<'a, str>),
}

/// Writes `ip` as its `Display` does, without `core::fmt`. Digits and dots need no escaping.
impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dimension::Global => f.write_str("global"),
            Dimension::Ip | Dimension::IpPrefix(_) => f.write_str("ip"),
            Dimension::UserId => f.write_str("user_id"),
            Dimension::UserName => f.write_str("user_name"),
            Dimension::Header(name) => write!(f, "header:{name}"),
            Dimension::Arg(name) => write!(f, "arg:{name}"),
            Dimension::Custom { name, .. } => f.write_str(name),
        }
    }
}

impl fmt::Debug for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.prefix() {
            Some(p) if p != IpPrefix::DEFAULT => {
                write!(f, "Dimension(ip, IPv4 /{}, IPv6 /{})", p.v4, p.v6)
            }
            _ => write!(f, "Dimension({self})"),
        }
    }
}

impl PartialEq for Dimension {
    fn eq(&self, other: &Dimension) -> bool {
        match (self, other) {
            (Dimension::Custom { extract: a, .. }, Dimension::Custom { extract: b, .. }) => {
                Arc::ptr_eq(a, b)
            }
            _ => self.prefix() == other.prefix() && self.to_string() == other.to_string(),
        }
    }
}

impl FromStr for Dimension {
    type Err = String;

    fn from_str(s: &str) -> Result<Dimension, String> {
        let named = |kind: &str, name: &str| {
            if name.is_empty() {
                Err(format!("{kind}: needs a name, e.g. {kind}:x-api-key"))
            } else {
                Ok(name.to_owned())
            }
        };
        match s {
            "global" => Ok(Dimension::Global),
            "ip" => Ok(Dimension::Ip),
            "user_id" => Ok(Dimension::UserId),
            "user_name" => Ok(Dimension::UserName),
            _ => match s.split_once(':') {
                Some(("header", name)) => {
                    named("header", name).map(|n| Dimension::Header(n.to_ascii_lowercase()))
                }
                Some(("arg", name)) => named("arg", name).map(Dimension::Arg),
                _ => Err(format!(
                    "unknown dimension {s:?} (use global, ip, user_id, user_name, header:<name> or arg:<name>)"
                )),
            },
        }
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Dimension {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Dimension, D::Error> {
        let text = <String as serde::Deserialize>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_parse_and_read() {
        let who = Identity::new()
            .with_ip("10.0.0.1".parse().unwrap())
            .with_header("X-Key", "k")
            .with_arg("phone", "123");
        let value = |d: &str| {
            d.parse::<Dimension>()
                .unwrap()
                .value(&who)
                .map(|v| v.into_owned())
        };
        assert_eq!(value("global").as_deref(), Some(""));
        assert_eq!(value("ip").as_deref(), Some("10.0.0.1"));
        assert_eq!(value("header:x-key").as_deref(), Some("k"));
        assert_eq!(value("header:X-KEY").as_deref(), Some("k"));
        assert_eq!(value("arg:phone").as_deref(), Some("123"));
        assert_eq!(value("user_id"), None);
        assert!("header:".parse::<Dimension>().is_err());
        // The key part is the escaped value, whichever way it is written.
        for ip in [
            "0.0.0.0",
            "10.20.3.255",
            "1.100.99.9",
            "::1",
            "::ffff:1.2.3.4",
        ] {
            let who = Identity::new().with_ip(ip.parse().unwrap());
            let (mut fast, mut slow) = (String::new(), String::new());
            assert!(Dimension::Ip.push_value(&who, &mut fast));
            key::push_part(&mut slow, &Dimension::Ip.value(&who).unwrap());
            assert_eq!(fast, slow);
        }
        assert!(
            "cookie"
                .parse::<Dimension>()
                .unwrap_err()
                .contains("unknown dimension")
        );
    }

    #[test]
    fn ip_dimensions_count_by_network() {
        let value = |d: &Dimension, ip: &str| {
            let who = Identity::new().with_ip(ip.parse().unwrap());
            d.value(&who).unwrap().into_owned()
        };
        let ip = Dimension::Ip;
        assert_eq!(value(&ip, "2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(value(&ip, "2001:db8:1:2:ffff::9"), "2001:db8:1:2::/64");
        assert_eq!(value(&ip, "2001:db8:1:3::1"), "2001:db8:1:3::/64");
        assert_eq!(value(&ip, "203.0.113.7"), "203.0.113.7");
        assert_eq!(value(&ip, "::ffff:203.0.113.7"), "203.0.113.7");
        let wide = Dimension::ip_prefix(24, 48).unwrap();
        assert_eq!(value(&wide, "2001:db8:1:2::1"), "2001:db8:1::/48");
        assert_eq!(value(&wide, "2001:db8:1:ff00::1"), "2001:db8:1::/48");
        assert_eq!(value(&wide, "2001:db8:2::1"), "2001:db8:2::/48");
        assert_eq!(value(&wide, "203.0.113.7"), "203.0.113.0/24");
        assert_eq!(value(&wide, "::ffff:203.0.113.7"), "203.0.113.0/24");
        let exact = Dimension::ip_prefix(32, 128).unwrap();
        assert_eq!(value(&exact, "2001:db8::1"), "2001:db8::1");
        let all = Dimension::ip_prefix(0, 0).unwrap();
        assert_eq!(value(&all, "198.51.100.1"), "0.0.0.0/0");
        assert_eq!(value(&all, "2001:db8::1"), "::/0");

        // Same text as before for the common IPv4 case, so existing counters carry over.
        assert_eq!(ip, Dimension::ip_prefix(32, 64).unwrap());
        assert_ne!(ip, wide);
        assert_eq!(wide.to_string(), "ip");
        assert_eq!(format!("{wide:?}"), "Dimension(ip, IPv4 /24, IPv6 /48)");
        assert_eq!(Dimension::UserId.prefix(), None);

        let e = Dimension::ip_prefix(33, 64).unwrap_err();
        assert!(e.contains("IPv4 prefix is at most 32 bits, not 33"), "{e}");
        let e = Dimension::ip_prefix(32, 129).unwrap_err();
        assert!(
            e.contains("IPv6 prefix is at most 128 bits, not 129"),
            "{e}"
        );
    }

    #[test]
    fn ip_keys_written_fast_equal_the_escaped_value() {
        let addrs = [
            "0.0.0.0",
            "255.255.255.255",
            "10.20.3.255",
            "::",
            "::1",
            "::ffff:1.2.3.4",
            "2001:db8::1",
            "2001:db8:1:2:3:4:5:6",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80::1:2",
        ];
        for (v4, v6) in [(32, 64), (24, 48), (0, 0), (31, 127), (1, 128), (16, 56)] {
            let d = Dimension::ip_prefix(v4, v6).unwrap();
            for ip in addrs {
                let who = Identity::new().with_ip(ip.parse().unwrap());
                let (mut fast, mut slow) = (String::new(), String::new());
                assert!(d.push_value(&who, &mut fast));
                key::push_part(&mut slow, &d.value(&who).unwrap());
                assert_eq!(fast, slow, "{ip} /{v4} /{v6}");
                assert!(!fast.contains(':'), "{fast}");
            }
        }
        assert!(!Dimension::Ip.push_value(&Identity::new(), &mut String::new()));
    }

    /// A network's text, written by hand for IPv4, is what `Display` writes of the masked
    /// address, with the prefix length when it is not the whole address.
    #[test]
    fn network_text_is_what_display_writes() {
        let addrs = [
            "0.0.0.0",
            "255.255.255.255",
            "10.20.3.255",
            "192.0.2.1",
            "100.64.9.99",
            "::ffff:1.2.3.4",
            "2001:db8:1:2:3:4:5:6",
        ];
        for (v4, v6) in [(32, 64), (24, 48), (0, 0), (31, 127), (1, 128), (9, 56)] {
            let prefix = IpPrefix::new(v4, v6).unwrap();
            for ip in addrs {
                let ip: IpAddr = ip.parse().unwrap();
                let expected = match canonical(ip) {
                    IpAddr::V4(a) => {
                        let mask = u32::MAX.checked_shl(32 - u32::from(v4)).unwrap_or(0);
                        let masked = Ipv4Addr::from(u32::from(a) & mask);
                        if v4 < 32 {
                            format!("{masked}/{v4}")
                        } else {
                            masked.to_string()
                        }
                    }
                    IpAddr::V6(a) => {
                        let mask = u128::MAX.checked_shl(128 - u32::from(v6)).unwrap_or(0);
                        let masked = Ipv6Addr::from(u128::from(a) & mask);
                        if v6 < 128 {
                            format!("{masked}/{v6}")
                        } else {
                            masked.to_string()
                        }
                    }
                };
                assert_eq!(prefix.network_text(ip), expected, "{ip} /{v4} /{v6}");
            }
        }
    }

    /// An identity of a client IP and a user id is small (it is built per request and read per
    /// check); the other facts read back as given, and identities compare, hash and print by
    /// their facts whatever order they were set in.
    #[test]
    fn an_identity_keeps_its_facts_beside_a_small_ip() {
        use std::hash::BuildHasher;

        assert!(std::mem::size_of::<Identity>() <= 56);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let bare = Identity::new().with_ip(ip);
        assert_eq!(
            (bare.ip(), bare.user_id(), bare.header("x")),
            (Some(ip), None, None)
        );
        assert_eq!((bare.headers().len(), bare.args().len()), (0, 0));

        let a = Identity::new()
            .with_user_id("42")
            .with_ip(ip)
            .with_user_name("ann")
            .with_header("X-Key", "k")
            .with_arg("form", "f");
        let b = Identity::new()
            .with_arg("form", "f")
            .with_header("x-key", "k")
            .with_user_name("ann")
            .with_ip(ip)
            .with_user_id("42");
        assert_eq!((a.user_id(), a.user_name()), (Some("42"), Some("ann")));
        assert_eq!((a.header("X-KEY"), a.arg("form")), (Some("k"), Some("f")));
        assert_eq!(a.headers().collect::<Vec<_>>(), [("x-key", "k")]);
        assert_eq!(a.args().collect::<Vec<_>>(), [("form", "f")]);
        assert_eq!(a, b);
        let hasher = std::hash::RandomState::new();
        assert_eq!(hasher.hash_one(&a), hasher.hash_one(&b));
        assert_ne!(a, bare);
        assert_ne!(bare, Identity::new().with_ip(ip).with_user_id(""));
        assert_eq!(
            format!("{a:?}"),
            "Identity { ip: Some(10.0.0.1), user_id: Some(\"42\"), user_name: Some(\"ann\"), \
             headers: [(\"x-key\", \"k\")], args: [(\"form\", \"f\")] }"
        );
    }
}
