//! Rules: `limit` requests per `window`, and their text form `N/DURATION`.

use std::{fmt, str::FromStr, time::Duration};

use crate::calendar::{Calendar, CalendarUnit};

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
    /// Sliding window counter: the current epoch-aligned window's count plus the previous
    /// window's, weighted by how much of it the sliding window still covers. Approximate (it
    /// assumes the previous window's requests were spread evenly), two integers per rule.
    SlidingWindow,
}

impl Algorithm {
    /// The name used in configuration files.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Gcra => "gcra",
            Algorithm::SlidingWindow => "sliding_window",
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
            "sliding_window" => Ok(Algorithm::SlidingWindow),
            other => Err(format!(
                "unknown algorithm {other:?} (use sliding_log, sliding_window, fixed_window or gcra)"
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
/// assert_eq!("10 per minute".parse::<Rule>()?, rule);
/// assert_eq!("10/minute".parse::<Rule>()?, rule);
///
/// let err = "10/1x".parse::<Rule>().unwrap_err();
/// assert_eq!(err.text(), "10/1x");
/// assert!(err.to_string().contains(r#"unknown unit "x" (use ms, s, m, h, d, w"#));
/// # Ok::<(), tollgate::RuleError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    limit: u64,
    window_ms: u64,
    algorithm: Algorithm,
    /// A calendar window (a fixed window): `window_ms` is then its usual length.
    calendar: Option<Calendar>,
    /// A concurrency limit: `limit` leases at once, each for `window_ms` unless released or
    /// extended (a log of lease starts, counted over the lease's time to live).
    concurrent: bool,
    /// GCRA's emission interval (µs), `window / limit` and at least 1: made with the rule, as
    /// a division on every check would cost more than the rest of GCRA's arithmetic.
    interval_us: u64,
}

/// GCRA's emission interval (µs) of `limit` per `window_ms`.
fn interval_of(limit: u64, window_ms: u64) -> u64 {
    (window_ms * 1000 / limit).max(1)
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
        let window_ms = window.as_millis() as u64;
        Ok(Rule {
            limit,
            window_ms,
            algorithm: Algorithm::SlidingLog,
            calendar: None,
            concurrent: false,
            interval_us: interval_of(limit, window_ms),
        })
    }

    /// A concurrency limit: at most `max_in_flight` requests at once, each holding a lease
    /// until it ends ([`Tollgate::release`](crate::Tollgate::release_concurrent)) or, if its
    /// holder vanished, for `lease_ttl` (the slot then comes back by itself). A limiter with a
    /// concurrency limit holds that one rule ([`Limiter::concurrent`](crate::Limiter::concurrent)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Rule;
    ///
    /// let exports = Rule::concurrent(3, Duration::from_secs(300))?;
    /// assert!(exports.is_concurrent());
    /// assert_eq!(exports.to_string(), "3/5m concurrent");
    /// assert_eq!("3/5m concurrent".parse::<Rule>()?, exports);
    /// # Ok::<(), tollgate::RuleError>(())
    /// ```
    pub fn concurrent(max_in_flight: u64, lease_ttl: Duration) -> Result<Rule, RuleError> {
        let mut rule = Rule::new(max_in_flight, lease_ttl)?;
        rule.concurrent = true;
        Ok(rule)
    }

    /// Whether this is a concurrency limit (see [`Rule::concurrent`]).
    pub fn is_concurrent(&self) -> bool {
        self.concurrent
    }

    /// A fixed-window rule of `limit` per window of `calendar` (`60/1d@Europe/Berlin`): its
    /// windows are the calendar's days, ISO weeks or months, whatever their length.
    ///
    /// ```
    /// use tollgate::{Algorithm, Calendar, CalendarUnit, Rule};
    ///
    /// let daily = Rule::calendar(60, Calendar::new(CalendarUnit::Day, "Europe/Berlin")?)?;
    /// assert_eq!(daily, "60/1d@Europe/Berlin".parse()?);
    /// assert_eq!(daily.algorithm(), Algorithm::FixedWindow);
    /// assert_eq!("1000/1mo@UTC".parse::<Rule>()?.to_string(), "1000/1mo@UTC");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn calendar(limit: u64, calendar: Calendar) -> Result<Rule, RuleError> {
        if limit == 0 {
            return Err(RuleError::new(
                format!("{limit}/{calendar}"),
                RuleErrorKind::ZeroLimit,
            ));
        }
        let usual_ms = match calendar.unit() {
            CalendarUnit::Day => 86_400_000,
            CalendarUnit::Week => 7 * 86_400_000,
            CalendarUnit::Month => 30 * 86_400_000,
        };
        Ok(Rule {
            limit,
            window_ms: usual_ms,
            algorithm: Algorithm::FixedWindow,
            calendar: Some(calendar),
            concurrent: false,
            interval_us: interval_of(limit, usual_ms),
        })
    }

    /// The calendar of a calendar window, if this rule has one.
    pub fn calendar_window(&self) -> Option<Calendar> {
        self.calendar
    }

    /// The fixed window holding the instant `at_us`: its start and end (µs since the epoch).
    /// Windows are aligned to the Unix epoch, or to the calendar of a calendar window.
    pub fn fixed_window_at(&self, at_us: u64) -> (u64, u64) {
        match self.calendar {
            Some(calendar) => calendar.window_at(at_us),
            None => {
                let window = self.window_us();
                let start = at_us - at_us % window;
                (start, start + window)
            }
        }
    }

    /// The same rule counted with another algorithm.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Rule {
        self.algorithm = algorithm;
        self
    }

    /// The same rule with another limit (at least 1): what a per-identity override counts by
    /// (see [`Tollgate::set_override`](crate::Tollgate::set_override)).
    #[must_use]
    pub fn with_limit(mut self, limit: u64) -> Rule {
        self.limit = limit.max(1);
        self.interval_us = interval_of(self.limit, self.window_ms);
        self
    }

    /// GCRA's emission interval in microseconds: the window over the limit, at least 1.
    pub(crate) fn interval_us(&self) -> u64 {
        self.interval_us
    }

    /// How many units the window admits.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length (of a calendar window: its usual length, 1, 7 or 30 days).
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

/// What the rule is, without what is derived from it (GCRA's emission interval).
impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Rule");
        d.field("limit", &self.limit)
            .field("window", &self.window())
            .field("algorithm", &self.algorithm);
        if let Some(calendar) = &self.calendar {
            d.field("calendar", calendar);
        }
        if self.concurrent {
            d.field("concurrent", &true);
        }
        d.finish()
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.calendar {
            Some(calendar) => write!(f, "{}/{calendar}", self.limit)?,
            None => write!(f, "{}/{}", self.limit, format_duration(self.window()))?,
        }
        if self.concurrent {
            f.write_str(" concurrent")?;
        }
        Ok(())
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Rule, RuleError> {
        let fail = |kind| RuleError::new(text.to_owned(), kind);
        // `3/5m concurrent`: a concurrency limit.
        if let Some(rule) = text.trim_end().strip_suffix(" concurrent") {
            let rule: Rule = rule.parse().map_err(|e: RuleError| fail(e.kind))?;
            if rule.calendar.is_some() {
                return Err(fail(RuleErrorKind::Calendar(
                    "a concurrency limit's lease has a length, not a calendar window".to_owned(),
                )));
            }
            return Ok(Rule {
                concurrent: true,
                ..rule
            });
        }
        // `60/1d@Europe/Berlin`: a calendar window.
        if let Some((rule, zone)) = text.split_once('@') {
            let (limit, unit) = rule
                .split_once('/')
                .or_else(|| split_per(rule))
                .ok_or_else(|| fail(RuleErrorKind::MissingSlash))?;
            let limit = limit.trim();
            let limit: u64 = limit
                .parse()
                .map_err(|_| fail(RuleErrorKind::BadLimit(limit.to_owned())))?;
            let unit: CalendarUnit = unit.parse().map_err(|e| fail(RuleErrorKind::Calendar(e)))?;
            let calendar =
                Calendar::new(unit, zone.trim()).map_err(|e| fail(RuleErrorKind::Calendar(e)))?;
            return Rule::calendar(limit, calendar).map_err(|e| fail(e.kind));
        }
        let (limit, window) = text
            .split_once('/')
            .or_else(|| split_per(text))
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

/// `10 per minute` as (`10`, `minute`): `per` between spaces, any case.
fn split_per(text: &str) -> Option<(&str, &str)> {
    let lower = text.to_ascii_lowercase();
    let at = lower.find(" per ")?;
    Some((&text[..at], &text[at + " per ".len()..]))
}

/// Several rules in one text, separated by `;` (`"1/s; 5/m; 100 per day"`), each in any form
/// [`Rule`] parses. Empty parts (a trailing `;`) are skipped; no rule at all is an error.
///
/// ```
/// use std::time::Duration;
///
/// let rules = tollgate::parse_rules("1/s; 5/m; 100 per day")?;
/// assert_eq!(rules.len(), 3);
/// assert_eq!(rules[2].window(), Duration::from_secs(86_400));
/// assert!(tollgate::parse_rules("1/s; 5/x").is_err());
/// # Ok::<(), tollgate::RuleError>(())
/// ```
pub fn parse_rules(text: &str) -> Result<Vec<Rule>, RuleError> {
    let rules = text
        .split(';')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Rule>, RuleError>>()?;
    if rules.is_empty() {
        return Err(RuleError::new(text.to_owned(), RuleErrorKind::MissingSlash));
    }
    Ok(rules)
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
    /// No `/` (or ` per `) between limit and window.
    #[error("expected LIMIT/WINDOW, e.g. 10/1m or 10 per minute")]
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
    /// A calendar window (`N/1d@Zone`) names no calendar unit or no known time zone.
    #[error("{0}")]
    Calendar(String),
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
    #[error(
        "duration {0:?} has no unit (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"
    )]
    MissingUnit(String),
    /// The unit is not one of ms, s, m, h, d, w, their abbreviations or their names.
    #[error(
        "unknown unit {0:?} (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"
    )]
    UnknownUnit(String),
    /// The number does not fit.
    #[error("duration {0:?} is too long")]
    Overflow(String),
}

/// Parses `500ms`, `10s`, `1m`, `2h`, `1d`, `1w`: a whole number and a unit, short or named
/// (`msec`, `sec`/`secs`, `min`/`mins`, `hr`/`hrs`, `wk`/`wks`, or `millisecond`, `second`,
/// `minute`, `hour`, `day`, `week`, singular or plural; names in any case), with or without a
/// space between.
///
/// ```
/// # use std::time::Duration;
/// assert_eq!(tollgate::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(tollgate::parse_duration("2h"), Ok(Duration::from_secs(7200)));
/// assert_eq!(tollgate::parse_duration("2 weeks"), Ok(Duration::from_secs(14 * 86_400)));
/// assert_eq!(tollgate::parse_duration("3 hrs"), Ok(Duration::from_secs(3 * 3600)));
/// assert_eq!(tollgate::parse_duration("5mins"), Ok(Duration::from_secs(300)));
/// assert!(tollgate::parse_duration("2 fortnights").is_err());
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
    // The one-letter units are lower case only (`M` is not a minute); names in any case.
    let unit = unit.trim();
    let unit_ms: u64 = match unit {
        "" => return Err(DurationError::MissingUnit(text.to_owned())),
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        name => match name.to_ascii_lowercase().as_str() {
            "msec" | "msecs" | "millisecond" | "milliseconds" => 1,
            "sec" | "secs" | "second" | "seconds" => 1_000,
            "min" | "mins" | "minute" | "minutes" => 60_000,
            "hr" | "hrs" | "hour" | "hours" => 3_600_000,
            "day" | "days" => 86_400_000,
            "wk" | "wks" | "week" | "weeks" => 7 * 86_400_000,
            _ => return Err(DurationError::UnknownUnit(unit.to_owned())),
        },
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

    /// Debug shows what the rule is, not the interval derived from it.
    #[test]
    fn debug_shows_the_rule() {
        let ten: Rule = "10/1m".parse().unwrap();
        assert_eq!(
            format!("{ten:?}"),
            "Rule { limit: 10, window: 60s, algorithm: SlidingLog }"
        );
        let lease: Rule = "3/5m concurrent".parse().unwrap();
        assert!(
            format!("{lease:?}").ends_with("concurrent: true }"),
            "{lease:?}"
        );
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
    fn parses_unit_names_per_and_weeks() {
        for (text, same) in [
            ("10/minute", "10/1m"),
            ("10 per minute", "10/1m"),
            ("100 per hour", "100/1h"),
            ("100 PER Hour", "100/1h"),
            ("5/second", "5/1s"),
            ("5 per 30 seconds", "5/30s"),
            ("1/day", "1/1d"),
            ("1000/w", "1000/7d"),
            ("1000 per 2 weeks", "1000/14d"),
            ("3/10min", "3/10m"),
            ("7/250 milliseconds", "7/250ms"),
            ("5/2hrs", "5/2h"),
            ("5 per hr", "5/1h"),
            ("3/10mins", "3/10m"),
            ("3 per 30 secs", "3/30s"),
            ("2/wk", "2/7d"),
            ("9/100msec", "9/100ms"),
        ] {
            assert_eq!(rule(text), rule(same), "{text}");
        }
        // Shown in the canonical short form (a week as days: the form keys were made with).
        assert_eq!(rule("1/week").to_string(), "1/7d");
        assert!("1/1M".parse::<Rule>().is_err(), "M is not a minute");
        assert!("10 per".parse::<Rule>().is_err());
        assert!("per minute".parse::<Rule>().is_err());
        assert_eq!(
            "10 per fortnight".parse::<Rule>().unwrap_err().to_string(),
            r#""10 per fortnight": unknown unit "fortnight" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#
        );
    }

    #[test]
    fn several_rules_in_one_text() {
        let rules = parse_rules("1/s; 5/m ;100 per day;").unwrap();
        assert_eq!(rules, vec![rule("1/1s"), rule("5/1m"), rule("100/1d")]);
        let err = parse_rules("1/s; 5/x").unwrap_err();
        assert_eq!(err.text(), "5/x");
        assert!(parse_rules(" ; ").is_err());
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
            r#""10/1x": unknown unit "x" (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#
        );
        assert_eq!(
            err("ten/1m"),
            r#""ten/1m": limit "ten" is not a whole number"#
        );
        assert_eq!(err("0/1m"), r#""0/1m": limit must be at least 1"#);
        assert_eq!(
            err("10"),
            r#""10": expected LIMIT/WINDOW, e.g. 10/1m or 10 per minute"#
        );
        assert_eq!(err("10/0s"), r#""10/0s": window must be at least 1ms"#);
        assert_eq!(err("10/367d"), r#""10/367d": window must be at most 366d"#);
        assert_eq!(
            err("10/5"),
            r#""10/5": duration "5" has no unit (use ms, s, m, h, d, w, or msec, sec, secs, min, mins, hr, hrs, wk, wks, or millisecond, second, minute, hour, day, week and their plurals)"#
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
