//! Who is asking: the facts about one request that dimensions read.

use std::{
    borrow::Cow,
    fmt::{self, Write as _},
    net::IpAddr,
    str::FromStr,
    sync::Arc,
};

use serde::{Deserialize, Deserializer};

use crate::key;

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    ip: Option<IpAddr>,
    user_id: Option<String>,
    user_name: Option<String>,
    headers: Vec<(String, String)>,
    args: Vec<(String, String)>,
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
        self.user_name = Some(name.into());
        self
    }

    /// Adds a header; names are case-insensitive.
    #[must_use]
    pub fn with_header(mut self, name: impl AsRef<str>, value: impl Into<String>) -> Identity {
        self.headers
            .push((name.as_ref().to_ascii_lowercase(), value.into()));
        self
    }

    /// Adds a named argument (a function argument, a form field).
    #[must_use]
    pub fn with_arg(mut self, name: impl Into<String>, value: impl Into<String>) -> Identity {
        self.args.push((name.into(), value.into()));
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
        self.user_name.as_deref()
    }

    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The named argument.
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A function that reads a custom dimension value from an identity.
pub type Extractor = Arc<dyn Fn(&Identity) -> Option<String> + Send + Sync>;

/// What a limiter counts by.
///
/// Text forms: `global`, `ip`, `user_id`, `user_name`, `header:<name>`, `arg:<name>`.
#[derive(Clone)]
#[non_exhaustive]
pub enum Dimension {
    /// One counter for everybody.
    Global,
    /// Per client IP.
    Ip,
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
            Dimension::Ip => identity.ip.map(|ip| Cow::Owned(ip.to_string())),
            Dimension::UserId => identity.user_id().map(Cow::Borrowed),
            Dimension::UserName => identity.user_name().map(Cow::Borrowed),
            Dimension::Header(name) => identity.header(name).map(Cow::Borrowed),
            Dimension::Arg(name) => identity.arg(name).map(Cow::Borrowed),
            Dimension::Custom { extract, .. } => extract(identity).map(Cow::Owned),
        }
    }

    /// Appends this dimension's value for `identity` to `out` as a key part (escaped, see
    /// [`key::push_part`]); false if the identity lacks it.
    pub(crate) fn push_value(&self, identity: &Identity, out: &mut impl key::KeyOut) -> bool {
        match (self, identity.ip) {
            (Dimension::Ip, Some(IpAddr::V4(ip))) => {
                key::push_ipv4(out, ip);
                true
            }
            (Dimension::Ip, Some(IpAddr::V6(ip))) => {
                // Formatted on the stack (at most 45 bytes), then escaped like any value.
                let mut text = smallstr::SmallString::<[u8; 48]>::new();
                let _ = write!(text, "{ip}");
                key::push_escaped(out, &text);
                true
            }
            _ => match self.value(identity) {
                Some(value) => {
                    key::push_escaped(out, &value);
                    true
                }
                None => false,
            },
        }
    }
}

/// Writes `ip` as its `Display` does, without `core::fmt`. Digits and dots need no escaping.
impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dimension::Global => f.write_str("global"),
            Dimension::Ip => f.write_str("ip"),
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
        write!(f, "Dimension({self})")
    }
}

impl PartialEq for Dimension {
    fn eq(&self, other: &Dimension) -> bool {
        match (self, other) {
            (Dimension::Custom { extract: a, .. }, Dimension::Custom { extract: b, .. }) => {
                Arc::ptr_eq(a, b)
            }
            _ => self.to_string() == other.to_string(),
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

impl<'de> Deserialize<'de> for Dimension {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Dimension, D::Error> {
        let text = String::deserialize(deserializer)?;
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
}
