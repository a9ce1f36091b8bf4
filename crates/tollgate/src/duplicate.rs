//! The duplicate-submission guard: the first submission proceeds, repeats are refused or
//! answered with the first response.

use std::{fmt, str::FromStr, sync::Arc, time::Duration};

use sha2::{Digest, Sha256};

use crate::{
    identity::{Dimension, Identity},
    key,
};

/// A SHA-256 fingerprint of a submission's canonical arguments.
///
/// Arguments are fingerprinted, never stored: a huge argument list never makes a huge key,
/// and different argument lists never share one.
///
/// ```
/// use tollgate::Fingerprint;
///
/// let a = Fingerprint::of_args([("phone", "123"), ("code", "9")]);
/// let b = Fingerprint::of_args([("phone", "1"), ("code", "239")]);
/// assert_ne!(a, b);
/// assert_eq!(a.to_string().len(), 64);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of some bytes (e.g. a canonical JSON body).
    pub fn of(bytes: impl AsRef<[u8]>) -> Fingerprint {
        Fingerprint(Sha256::digest(bytes.as_ref()).into())
    }

    /// The fingerprint of named arguments, each length-prefixed so no two lists collide.
    pub fn of_args<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        args: impl IntoIterator<Item = (K, V)>,
    ) -> Fingerprint {
        let mut hash = Sha256::new();
        for (k, v) in args {
            for part in [k.as_ref(), v.as_ref()] {
                hash.update((part.len() as u64).to_be_bytes());
                hash.update(part);
            }
        }
        Fingerprint(hash.finalize().into())
    }

    /// The fingerprint of nothing (for guards that do not look at arguments).
    pub fn empty() -> Fingerprint {
        Fingerprint::of([])
    }
}

/// Writes `value` in one canonical text, so that equal values fingerprint alike: an object's
/// members sorted by key at every depth, and each number one way, exactly (an integer as its
/// digits, also when written `1.0` or `1e2`; any other number in its shortest exact form).
/// Integers are exact within 64 bits (`i64` and `u64`); serde_json reads a larger one as a
/// double. Arrays keep their order: a set whose order varies (a `HashSet`) has many texts.
///
/// ```
/// let text = |json: &str| {
///     let mut out = String::new();
///     tollgate::canonical_json(&serde_json::from_str(json).unwrap(), &mut out);
///     out
/// };
/// assert_eq!(text(r#"{"b":1.0,"a":[2.50,1e2]}"#), r#"{"a":[2.5,100],"b":1}"#);
/// // Integers past 2^53 stay exact.
/// assert_ne!(text("9007199254740993"), text("9007199254740992"));
/// ```
#[cfg(feature = "serde")]
pub fn canonical_json(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => canonical_number(n, out),
        // A string's JSON form is written one way (serde_json's escapes) and never fails.
        Value::String(text) => out.push_str(&Value::String(text.clone()).to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<_> = members.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical_json(item, out);
            }
            out.push('}');
        }
    }
}

/// A number as its digits when it is an integer (however written), else its shortest form.
#[cfg(feature = "serde")]
fn canonical_number(n: &serde_json::Number, out: &mut String) {
    let mut digits = itoa::Buffer::new();
    if let Some(u) = n.as_u64() {
        return out.push_str(digits.format(u));
    }
    if let Some(i) = n.as_i64() {
        return out.push_str(digits.format(i));
    }
    let Some(f) = n.as_f64() else {
        return out.push_str(&n.to_string());
    };
    // Integral floats within the integers' range convert exactly (-0.0 is 0).
    if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) {
        return out.push_str(digits.format(f as u64));
    }
    if f.fract() == 0.0 && (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
        return out.push_str(digits.format(f as i64));
    }
    out.push_str(&n.to_string());
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The longest idempotency key accepted, in bytes (a UUID is 36; the slack is for prefixes).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// An `Idempotency-Key` header's value as the key it names: the structured-field string form
/// (`"abc"`) and the bare token (`abc`) are one key. The error says what is wrong, for a 400.
///
/// Every front end (the tower layer, the server) reads keys through this, so a client that
/// quotes its key and one that does not are refused as the same submission everywhere.
///
/// ```
/// use tollgate::idempotency_key;
///
/// assert_eq!(idempotency_key(" \"8e03978e\" "), Ok("8e03978e"));
/// assert_eq!(idempotency_key("8e03978e"), Ok("8e03978e"));
/// assert!(idempotency_key("\"\"").is_err());
/// ```
pub fn idempotency_key(value: &str) -> Result<&str, &'static str> {
    let text = value.trim();
    let key = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    if key.is_empty() {
        return Err("the Idempotency-Key is empty");
    }
    if key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err("the Idempotency-Key is longer than 255 characters");
    }
    Ok(key)
}

/// What makes two submissions "the same".
///
/// ```
/// use tollgate::{Dimension, DuplicateBy};
///
/// assert_eq!("args".parse::<DuplicateBy>()?, DuplicateBy::Args);
/// assert_eq!(
///     "user_id".parse::<DuplicateBy>()?,
///     DuplicateBy::Dimension(Dimension::UserId)
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum DuplicateBy {
    /// The same value of a dimension: `ip`, `user_id`, `user_name`, or an explicit idempotency
    /// key (`Dimension::Header("idempotency-key")`). The fingerprint is remembered, so a reused
    /// key with other arguments is reported as a mismatch.
    Dimension(Dimension),
    /// The same arguments: the key is the fingerprint itself.
    Args,
}

impl FromStr for DuplicateBy {
    type Err = String;

    /// `args`, `key` (the `Idempotency-Key` header), or any dimension text (`ip`, `user_id`,
    /// `user_name`, `header:<name>`, `arg:<name>`).
    fn from_str(s: &str) -> Result<DuplicateBy, String> {
        match s {
            "args" => Ok(DuplicateBy::Args),
            "key" => Ok(DuplicateBy::Dimension(Dimension::Header(
                "idempotency-key".into(),
            ))),
            "global" => Err("duplicate guards need a per-request value; use args, key, ip, user_id or user_name".into()),
            other => other
                .parse()
                .map(DuplicateBy::Dimension)
                .map_err(|e| format!("{e}; or args, key")),
        }
    }
}

impl fmt::Display for DuplicateBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DuplicateBy::Args => f.write_str("args"),
            DuplicateBy::Dimension(d) => d.fmt(f),
        }
    }
}

/// A short lock per (action, what makes submissions the same): the first submission
/// acquires it, repeats within the TTL are refused.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Acquire, DuplicateBy, DuplicateGuard, Fingerprint, Identity, MemoryStore, Tollgate};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let gate = Tollgate::new(MemoryStore::new());
/// let guard = DuplicateGuard::new("submit_order", "args".parse()?).with_ttl(Duration::from_secs(5));
/// let who = Identity::new().with_user_id("42");
/// let args = Fingerprint::of(br#"{"item":7,"qty":1}"#);
///
/// let Acquire::Acquired(lease) = gate.acquire(&guard, &who, &args).await? else { panic!() };
/// assert!(matches!(gate.acquire(&guard, &who, &args).await?, Acquire::Duplicate(_)));
/// gate.release(&lease).await?; // the submission failed: let the client retry at once
/// assert!(matches!(gate.acquire(&guard, &who, &args).await?, Acquire::Acquired(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct DuplicateGuard {
    pub(crate) scope: Arc<str>,
    pub(crate) by: DuplicateBy,
    pub(crate) ttl: Duration,
    pub(crate) global: bool,
}

impl DuplicateGuard {
    /// A guard for the action `scope`, with the seed's TTL of one second.
    pub fn new(scope: impl AsRef<str>, by: DuplicateBy) -> DuplicateGuard {
        DuplicateGuard {
            scope: scope.as_ref().into(),
            by,
            ttl: Duration::from_secs(1),
            global: false,
        }
    }

    /// How long the lock lives if the holder neither releases nor completes it.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> DuplicateGuard {
        self.ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// Share the lock across every action (the seed's `global = true`).
    #[must_use]
    pub fn global(mut self, global: bool) -> DuplicateGuard {
        self.global = global;
        self
    }

    /// The action this guard protects.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Whether the lock is shared across every action.
    pub fn is_global(&self) -> bool {
        self.global
    }

    /// The lock's TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// What makes submissions the same.
    pub fn by(&self) -> &DuplicateBy {
        &self.by
    }

    /// The lock key for this identity and fingerprint, or `None` if the identity lacks the
    /// dimension: `prefix:{d:scope:by:value}` (scope empty when global).
    pub(crate) fn key(
        &self,
        prefix: &str,
        identity: &Identity,
        fingerprint: &Fingerprint,
    ) -> Option<String> {
        let value = match &self.by {
            DuplicateBy::Args => fingerprint.to_string(),
            DuplicateBy::Dimension(d) => d.value(identity)?.into_owned(),
        };
        let scope = if self.global { "" } else { &self.scope };
        Some(key::guard_key(prefix, scope, &self.by.to_string(), &value))
    }
}

/// Proof of holding a duplicate-guard lock; only its holder can release or complete it.
///
/// Its text form (`Display` / `FromStr`) carries it across an API.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    pub(crate) key: String,
    pub(crate) token: String,
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.token, self.key)
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a credential: never in logs.
        write!(f, "Lease({})", self.key)
    }
}

impl FromStr for Lease {
    type Err = String;

    fn from_str(s: &str) -> Result<Lease, String> {
        match s.split_once('.') {
            Some((token, key))
                if token.len() == 32
                    && token.bytes().all(|b| b.is_ascii_hexdigit())
                    && !key.is_empty() =>
            {
                Ok(Lease {
                    key: key.to_owned(),
                    token: token.to_owned(),
                })
            }
            _ => Err("not a lease (expected the text returned by acquire)".to_owned()),
        }
    }
}

/// Whether a refused duplicate's first submission is still running or done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
pub enum DuplicateState {
    /// The first submission has not completed ("operation in progress").
    InProgress,
    /// The first submission completed ("repeated request").
    Completed,
}

/// A refused duplicate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duplicate {
    /// Still running, or done.
    pub state: DuplicateState,
    /// When the lock (or stored response) expires.
    pub retry_after: Duration,
    /// The first submission's stored response, if it completed with one.
    pub response: Option<Vec<u8>>,
    /// The first submission had the same fingerprint (false: a reused key with other arguments).
    pub fingerprint_matches: bool,
}

impl Duplicate {
    /// The seed's message for this duplicate: "operation in progress" for an argument match
    /// still running, "repeated request" otherwise.
    pub fn message(&self, by: &DuplicateBy) -> &'static str {
        match (by, self.state) {
            (DuplicateBy::Args, DuplicateState::InProgress) => "operation in progress",
            _ => "repeated request",
        }
    }
}

/// The answer to [`Tollgate::acquire`](crate::Tollgate::acquire).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// This is the first submission: proceed, then complete or release the lease.
    Acquired(Lease),
    /// A repeat.
    Duplicate(Duplicate),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_text_round_trips_and_rejects_junk() {
        let lease = Lease {
            key: "tg:{d:s:args:ab}".into(),
            token: "0123456789abcdef0123456789abcdef".into(),
        };
        assert_eq!(lease.to_string().parse::<Lease>(), Ok(lease.clone()));
        assert!(!format!("{lease:?}").contains("0123"));
        assert!("x.y".parse::<Lease>().is_err());
        assert!("".parse::<Lease>().is_err());
    }

    #[test]
    fn args_fingerprints_are_length_prefixed() {
        assert_ne!(
            Fingerprint::of_args([("ab", "c")]),
            Fingerprint::of_args([("a", "bc")])
        );
        assert_eq!(
            Fingerprint::of_args([("a", "b")]),
            Fingerprint::of_args([("a", "b")])
        );
    }

    #[test]
    fn keys_separate_scope_mode_and_value() {
        let who = Identity::new().with_user_id("7");
        let fp = Fingerprint::of("x");
        let by_user = DuplicateGuard::new("a", "user_id".parse().unwrap());
        let k = by_user.key("tg", &who, &fp).unwrap();
        assert_eq!(k, "tg:{d:a:user_id:7}");
        let global = by_user.clone().global(true).key("tg", &who, &fp).unwrap();
        assert_eq!(global, "tg:{d::user_id:7}");
        assert!(by_user.key("tg", &Identity::new(), &fp).is_none());
        let args = DuplicateGuard::new("a", DuplicateBy::Args)
            .key("tg", &who, &fp)
            .unwrap();
        assert!(args.contains(&fp.to_string()));
    }
}
