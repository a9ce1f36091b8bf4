//! Rules: `limit` requests per `window`, and their text form `N/DURATION`.

use std::{fmt, str::FromStr, time::Duration};

/// The longest window a rule may have: 366 days.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// How a rule counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Algorithm {
    /// Exact: one entry per admitted unit, counted over the last `window`.
    #[default]
    SlidingLog,
    /// One counter per window aligned to the Unix epoch; cheap, allows bursts at the edges.
    FixedWindow,
    /// Generic cell rate algorithm: one timestamp, requests spaced `window / limit` apart,
    /// with a burst of up to `limit`.
    Gcra,
}

impl Algorithm {
    /// The name used in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sliding_log" => Ok(Algorithm::SlidingLog),
            "fixed_window" => Ok(Algorithm::FixedWindow),
            "gcra" => Ok(Algorithm::Gcra),
            other => Err(format!(
                "unknown algorithm {other:?} (use sliding_log, fixed_window or gcra)"
            )),
        }
    }
}

/// `limit` units per `window`, counted with an [`Algorithm`].
///
/// A `Rule` that exists is valid: `limit >= 1` and `1 ms <= window <= 366 days`, with the
/// window a whole number of milliseconds.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Rule};
///
/// let rule: Rule = "10/1m".parse()?;
/// assert_eq!(rule.limit(), 10);
/// assert_eq!(rule.window(), Duration::from_secs(60));
/// assert_eq!(rule.algorithm(), Algorithm::SlidingLog);
/// assert_eq!(rule.to_string(), "10/1m");
///
/// let err = "10/1x".parse::<Rule>().unwrap_err();
/// assert_eq!(err.to_string(), r#""10/1x": unknown unit "x" (use ms, s, m, h, d)"#);
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    limit: u64,
    window_ms: u64,
    algorithm: Algorithm,
}

impl Rule {
    /// A sliding-log rule of `limit` per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Rule, RuleError> {
        let text = || format!("{limit}/{}", format_duration(window));
        if limit == 0 {
            return Err(RuleError::new(text(), RuleErrorKind::ZeroLimit));
        }
        if window.subsec_nanos() % 1_000_000 != 0 {
            return Err(RuleError::new(text(), RuleErrorKind::SubMillisecond));
        }
        if window < Duration::from_millis(1) {
            return Err(RuleError::new(text(), RuleErrorKind::ZeroWindow));
        }
        if window > MAX_WINDOW {
            return Err(RuleError::new(text(), RuleErrorKind::WindowTooLong));
        }
        Ok(Rule {
            limit,
            window_ms: window.as_millis() as u64,
            algorithm: Algorithm::SlidingLog,
        })
    }

    /// The same rule counted with another algorithm.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Rule {
        self.algorithm = algorithm;
        self
    }

    /// How many units the window admits.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The window length in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The window length in microseconds, the unit the algorithms compute in.
    pub fn window_us(&self) -> u64 {
        self.window_ms * 1000
    }

    /// How this rule counts.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.limit, format_duration(self.window()))
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Rule, RuleError> {
        let fail = |kind| RuleError::new(text.to_owned(), kind);
        let (limit, window) = text
            .split_once('/')
            .ok_or_else(|| fail(RuleErrorKind::MissingSlash))?;
        let limit = limit.trim();
        let limit: u64 = limit
            .parse()
            .map_err(|_| fail(RuleErrorKind::BadLimit(limit.to_owned())))?;
        let window = window.trim();
        // `10/m` means `10/1m`.
        let window = if window.starts_with(|c: char| c.is_ascii_alphabetic()) {
            parse_duration(&format!("1{window}"))
        } else {
            parse_duration(window)
        }
        .map_err(|e| fail(RuleErrorKind::Duration(e)))?;
        Rule::new(limit, window).map_err(|e| fail(e.kind))
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Rule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Rule, D::Error> {
        let text = <String as serde::Deserialize>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A rule that could not be built or parsed, with the text it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {kind}")]
pub struct RuleError {
    text: String,
    kind: RuleErrorKind,
}

impl RuleError {
    fn new(text: String, kind: RuleErrorKind) -> RuleError {
        RuleError { text, kind }
    }

    /// What was wrong.
    pub fn kind(&self) -> &RuleErrorKind {
        &self.kind
    }

    /// The rule text, as given.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// What was wrong with a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleErrorKind {
    /// No `/` between limit and window.
    #[error("expected LIMIT/WINDOW, e.g. 10/1m")]
    MissingSlash,
    /// The limit is not a whole number.
    #[error("limit {0:?} is not a whole number")]
    BadLimit(String),
    /// The limit is zero.
    #[error("limit must be at least 1")]
    ZeroLimit,
    /// The window is shorter than a millisecond.
    #[error("window must be at least 1ms")]
    ZeroWindow,
    /// The window is not a whole number of milliseconds.
    #[error("window must be a whole number of milliseconds")]
    SubMillisecond,
    /// The window is longer than 366 days.
    #[error("window must be at most 366d")]
    WindowTooLong,
    /// The window could not be parsed.
    #[error("{0}")]
    Duration(DurationError),
}

/// A duration text (`500ms`, `10s`, `1m`, `2h`, `1d`) that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Nothing to parse.
    #[error("empty duration")]
    Empty,
    /// No number before the unit.
    #[error("duration {0:?} does not start with a whole number")]
    BadNumber(String),
    /// The number has no unit.
    #[error("duration {0:?} has no unit (use ms, s, m, h, d)")]
    MissingUnit(String),
    /// The unit is not one of ms, s, m, h, d.
    #[error("unknown unit {0:?} (use ms, s, m, h, d)")]
    UnknownUnit(String),
    /// The number does not fit.
    #[error("duration {0:?} is too long")]
    Overflow(String),
}

/// Parses `500ms`, `10s`, `1m`, `2h`, `1d`: a whole number and a unit.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(tollgate::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(tollgate::parse_duration("2h"), Ok(Duration::from_secs(7200)));
/// assert!(tollgate::parse_duration("2 weeks").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(DurationError::BadNumber(text.to_owned()));
    }
    let number: u64 = number
        .parse()
        .map_err(|_| DurationError::Overflow(text.to_owned()))?;
    let unit_ms: u64 = match unit.trim() {
        "" => return Err(DurationError::MissingUnit(text.to_owned())),
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(DurationError::UnknownUnit(other.to_owned())),
    };
    number
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| DurationError::Overflow(text.to_owned()))
}

/// Formats a duration in the largest unit that divides it: `1m`, `90s`, `500ms`.
///
/// Sub-millisecond parts are dropped; the result parses back with [`parse_duration`].
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms != 0 && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> Rule {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(rule("1/1m").window(), Duration::from_secs(60));
        assert_eq!(rule("10/1h").window(), Duration::from_secs(3600));
        assert_eq!(rule("60/1d").window(), Duration::from_secs(86_400));
        assert_eq!(rule("5/500ms").window(), Duration::from_millis(500));
        assert_eq!(rule("10/m"), rule("10/1m"));
        assert_eq!(rule(" 3 / 2s ").limit(), 3);
    }

    #[test]
    fn displays_canonically_and_round_trips() {
        for (text, shown) in [
            ("10/60s", "10/1m"),
            ("1/90s", "1/90s"),
            ("5/500ms", "5/500ms"),
            ("2/24h", "2/1d"),
        ] {
            let r = rule(text);
            assert_eq!(r.to_string(), shown);
            assert_eq!(rule(shown), r);
        }
    }

    #[test]
    fn errors_name_the_bad_part() {
        let err = |t: &str| t.parse::<Rule>().unwrap_err().to_string();
        assert_eq!(
            err("10/1x"),
            r#""10/1x": unknown unit "x" (use ms, s, m, h, d)"#
        );
        assert_eq!(
            err("ten/1m"),
            r#""ten/1m": limit "ten" is not a whole number"#
        );
        assert_eq!(err("0/1m"), r#""0/1m": limit must be at least 1"#);
        assert_eq!(err("10"), r#""10": expected LIMIT/WINDOW, e.g. 10/1m"#);
        assert_eq!(err("10/0s"), r#""10/0s": window must be at least 1ms"#);
        assert_eq!(err("10/367d"), r#""10/367d": window must be at most 366d"#);
        assert_eq!(
            err("10/5"),
            r#""10/5": duration "5" has no unit (use ms, s, m, h, d)"#
        );
        assert_eq!(err("-1/1m"), r#""-1/1m": limit "-1" is not a whole number"#);
    }

    #[test]
    fn constructor_validates() {
        assert!(Rule::new(1, Duration::from_millis(1)).is_ok());
        assert!(Rule::new(1, MAX_WINDOW).is_ok());
        assert!(Rule::new(0, Duration::from_secs(1)).is_err());
        assert!(Rule::new(1, Duration::from_micros(1500)).is_err());
        assert!(Rule::new(1, MAX_WINDOW + Duration::from_millis(1)).is_err());
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_uses_the_text_form() {
        let r: Rule = serde_json::from_str(r#""10/1m""#).unwrap();
        assert_eq!(r, rule("10/1m"));
        assert_eq!(serde_json::to_string(&r).unwrap(), r#""10/1m""#);
        let e = serde_json::from_str::<Rule>(r#""10/1x""#).unwrap_err();
        assert!(e.to_string().contains("unknown unit"), "{e}");
    }
}
