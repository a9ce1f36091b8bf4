//! Traffic to replay: tollgate's record, JSON lines mapped field by field, nginx's `combined`
//! and Envoy's default access logs; read a line at a time, several files merged in time order.

use std::{
    borrow::Cow,
    collections::{BinaryHeap, HashMap},
    fs::File,
    io::{BufRead, BufReader},
    net::IpAddr,
    path::PathBuf,
};

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{
        RateLimitDescriptor,
        rate_limit_descriptor::{Entry, RateLimitOverride},
    },
    service::ratelimit::v3::RateLimitRequest,
};
use serde::Deserialize;
use smallvec::SmallVec;
use tollgate::Identity;

use crate::{cli::InputFormat, http::json::IdentityJson};

/// One request to replay.
pub(crate) struct Event {
    /// When it came, in microseconds since the epoch.
    pub(crate) t_us: u64,
    /// Its file (an index into the plan's files) and line.
    pub(crate) file: u32,
    pub(crate) line: u64,
    pub(crate) what: What,
    /// What the server decided, when the record says.
    pub(crate) recorded: Option<Recorded>,
}

/// A decision as the record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) allowed: bool,
    /// The wait the server gave, when the record says (Envoy lines do not).
    pub(crate) retry_after_us: Option<u64>,
}

/// What a request asks.
pub(crate) enum What {
    /// A policy check: the policy (an index into [`Names`]), identity and cost.
    Check {
        policy: u32,
        identity: Identity,
        cost: u64,
    },
    /// An Envoy `ShouldRateLimit`.
    Envoy(RateLimitRequest),
}

/// Policy names, each kept once: events name them by index.
#[derive(Default)]
pub(crate) struct Names {
    pub(crate) names: Vec<Box<str>>,
    index: HashMap<Box<str>, u32>,
    /// The name found last.
    last: u32,
}

impl Names {
    pub(crate) fn intern(&mut self, name: &str) -> u32 {
        // Traffic mostly names the policy the line before it named.
        if let Some(last) = self.names.get(self.last as usize)
            && **last == *name
        {
            return self.last;
        }
        if let Some(&i) = self.index.get(name) {
            self.last = i;
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.into());
        self.index.insert(name.into(), i);
        self.last = i;
        i
    }
}

/// A line that could not be read as a request.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Malformed {
    pub(crate) file: String,
    pub(crate) line: u64,
    pub(crate) error: String,
}

/// How lines become requests: the format, where each dimension comes from, which lines
/// count, and the target of lines that name none.
pub(crate) struct Reading {
    pub(crate) format: InputFormat,
    /// Dimension -> field.
    map: Vec<(Dimension, String)>,
    filters: Vec<(String, Pattern)>,
    policy: Option<String>,
    /// The Envoy domain and descriptor entries (key, field), for lines against a domain.
    domain: Option<(String, Vec<(String, String)>)>,
    /// The last time read, as written and parsed: access logs repeat a second for many lines.
    last_time: std::cell::RefCell<Option<(String, u64)>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Dimension {
    Time,
    Ip,
    UserId,
    UserName,
    Header(String),
    Arg(String),
    Policy,
    Cost,
}

impl Dimension {
    fn parse(text: &str) -> Result<Dimension, String> {
        Ok(match text {
            "time" => Dimension::Time,
            "ip" => Dimension::Ip,
            "user_id" => Dimension::UserId,
            "user_name" => Dimension::UserName,
            "policy" => Dimension::Policy,
            "cost" => Dimension::Cost,
            other => match (other.strip_prefix("header."), other.strip_prefix("arg.")) {
                (Some(name), _) if !name.is_empty() => Dimension::Header(name.to_ascii_lowercase()),
                (_, Some(name)) if !name.is_empty() => Dimension::Arg(name.to_owned()),
                _ => {
                    return Err(format!(
                        "--map {text:?}: expected time, ip, user_id, user_name, header.NAME, arg.NAME, policy or cost"
                    ));
                }
            },
        })
    }
}

impl Reading {
    /// The reading the command line asks for; an error names the flag.
    pub(crate) fn new(
        format: InputFormat,
        map: &[String],
        filters: &[String],
        policy: Option<String>,
        domain: Option<String>,
        descriptor: &[String],
    ) -> Result<Reading, String> {
        let pair = |flag: &str, text: &str| -> Result<(String, String), String> {
            match text.split_once('=') {
                Some((a, b)) if !a.trim().is_empty() && !b.trim().is_empty() => {
                    Ok((a.trim().to_owned(), b.trim().to_owned()))
                }
                _ => Err(format!("{flag} {text:?}: expected NAME=VALUE")),
            }
        };
        let defaults: &[(&str, &str)] = match format {
            InputFormat::Record => &[],
            InputFormat::Json => &[
                ("time", "time"),
                ("ip", "ip"),
                ("user_id", "user_id"),
                ("user_name", "user_name"),
                ("policy", "policy"),
                ("cost", "cost"),
            ],
            InputFormat::Nginx => &[
                ("time", "time_local"),
                ("ip", "remote_addr"),
                ("user_id", "remote_user"),
            ],
            InputFormat::Envoy => &[("time", "start_time"), ("ip", "forwarded_for")],
        };
        let mut mapped: Vec<(Dimension, String)> = defaults
            .iter()
            .map(|(d, f)| {
                (
                    Dimension::parse(d).expect("a known dimension"),
                    (*f).to_owned(),
                )
            })
            .collect();
        if format == InputFormat::Record
            && (!map.is_empty()
                || !filters.is_empty()
                || policy.is_some()
                || domain.is_some()
                || !descriptor.is_empty())
        {
            return Err(
                "--map, --where, --policy, --domain and --descriptor apply to JSON lines and access logs; a record names its own policies and fields"
                    .into(),
            );
        }
        for text in map {
            let (dimension, field) = pair("--map", text)?;
            let dimension = Dimension::parse(&dimension)?;
            mapped.retain(|(d, _)| *d != dimension);
            mapped.push((dimension, field));
        }
        let filters = filters
            .iter()
            .map(|text| pair("--where", text).map(|(field, p)| (field, Pattern::new(&p))))
            .collect::<Result<_, _>>()?;
        let domain = match (domain, descriptor.is_empty()) {
            (Some(domain), false) => Some((
                domain,
                descriptor
                    .iter()
                    .map(|text| pair("--descriptor", text))
                    .collect::<Result<_, _>>()?,
            )),
            (Some(_), true) => {
                return Err(
                    "--domain needs the descriptor's entries: --descriptor KEY=FIELD".into(),
                );
            }
            (None, false) => return Err("--descriptor needs the domain: --domain DOMAIN".into()),
            (None, true) => None,
        };
        Ok(Reading {
            format,
            map: mapped,
            filters,
            policy,
            domain,
            last_time: Default::default(),
        })
    }

    /// The request of one line; `Ok(None)` for a line to skip (blank, or filtered out).
    pub(crate) fn event(
        &self,
        line: &[u8],
        names: &mut Names,
    ) -> Result<Option<(u64, What, Option<Recorded>)>, String> {
        if line.trim_ascii().is_empty() {
            return Ok(None);
        }
        // Checked once, whole: cheaper than string by string.
        let text = std::str::from_utf8(line).map_err(|e| format!("not UTF-8 text: {e}"))?;
        match self.format {
            InputFormat::Record => record_line(text, names).map(Some),
            InputFormat::Json => {
                let value: serde_json::Value =
                    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
                self.mapped(&JsonFields(&value), names)
            }
            InputFormat::Nginx => self.mapped(&nginx_fields(text)?, names),
            InputFormat::Envoy => self.mapped(&envoy_fields(text)?, names),
        }
    }

    /// The request of a line already in fields (synthetic traffic), through the mapping.
    pub(crate) fn fields_event(
        &self,
        fields: Vec<(&'static str, &str)>,
        names: &mut Names,
    ) -> Result<Option<(u64, What, Option<Recorded>)>, String> {
        self.mapped(&LogFields(fields.into()), names)
    }

    /// A request from a line's fields, through the mapping.
    fn mapped(
        &self,
        fields: &dyn Fields,
        names: &mut Names,
    ) -> Result<Option<(u64, What, Option<Recorded>)>, String> {
        for (field, pattern) in &self.filters {
            if !fields.get(field).is_some_and(|v| pattern.matches(&v)) {
                return Ok(None);
            }
        }
        let field = |dimension: &Dimension| {
            self.map
                .iter()
                .find(|(d, _)| d == dimension)
                .and_then(|(_, f)| fields.get(f).map(|v| (f, v)))
        };
        let (time_field, time) = field(&Dimension::Time).ok_or_else(|| {
            let name = self.map.iter().find(|(d, _)| *d == Dimension::Time);
            match name {
                Some((_, f)) => format!("no time in field {f:?} (--map time=FIELD)"),
                None => "no time: --map time=FIELD".to_owned(),
            }
        })?;
        let t_us = {
            let mut last = self.last_time.borrow_mut();
            match &*last {
                Some((text, t_us)) if *text == *time => *t_us,
                _ => {
                    let t_us =
                        parse_time(&time).map_err(|e| format!("field {time_field:?}: {e}"))?;
                    *last = Some((time.to_string(), t_us));
                    t_us
                }
            }
        };
        if let Some((domain, entries)) = &self.domain {
            let entries = entries
                .iter()
                .map(|(key, f)| {
                    fields
                        .get(f)
                        .map(|v| Entry {
                            key: key.clone(),
                            value: v.into_owned(),
                        })
                        .ok_or_else(|| format!("no field {f:?} for descriptor entry {key:?}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let request = RateLimitRequest {
                domain: domain.clone(),
                descriptors: vec![RateLimitDescriptor {
                    entries,
                    ..Default::default()
                }],
                hits_addend: 1,
            };
            return Ok(Some((t_us, What::Envoy(request), None)));
        }
        let policy = match field(&Dimension::Policy) {
            Some((_, p)) => names.intern(&p),
            None => match &self.policy {
                Some(p) => names.intern(p),
                None => return Err("no policy: give --policy NAME or --map policy=FIELD".into()),
            },
        };
        let mut identity = Identity::new();
        for (dimension, _) in &self.map {
            let Some((f, value)) = field(dimension) else {
                continue;
            };
            identity = match dimension {
                Dimension::Ip => {
                    // A forwarded-for list names the client first.
                    let first = value.split(',').next().unwrap_or("").trim();
                    let ip: IpAddr = first
                        .parse()
                        .map_err(|_| format!("field {f:?}: {first:?} is not an IP address"))?;
                    identity.with_ip(ip)
                }
                Dimension::UserId => identity.with_user_id(value),
                Dimension::UserName => identity.with_user_name(value),
                Dimension::Header(name) => identity.with_header(name, value),
                Dimension::Arg(name) => identity.with_arg(name.clone(), value),
                Dimension::Time | Dimension::Policy | Dimension::Cost => identity,
            };
        }
        let cost = match field(&Dimension::Cost) {
            Some((f, c)) => c
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("field {f:?}: {c:?} is not a whole number of units"))?,
            None => 1,
        };
        Ok(Some((
            t_us,
            What::Check {
                policy,
                identity,
                cost,
            },
            None,
        )))
    }
}

/// A field of a line by name; `None` when missing (or `-` in an access log).
trait Fields {
    fn get(&self, name: &str) -> Option<Cow<'_, str>>;
}

struct JsonFields<'a>(&'a serde_json::Value);

impl Fields for JsonFields<'_> {
    fn get(&self, name: &str) -> Option<Cow<'_, str>> {
        let mut at = self.0;
        for part in name.split('.') {
            at = at.get(part)?;
        }
        match at {
            serde_json::Value::String(s) => Some(Cow::Borrowed(s)),
            serde_json::Value::Number(n) => Some(Cow::Owned(n.to_string())),
            serde_json::Value::Bool(b) => Some(Cow::Owned(b.to_string())),
            _ => None,
        }
    }
}

/// An access log line's fields, by name.
struct LogFields<'a>(SmallVec<[(&'static str, &'a str); 16]>);

impl Fields for LogFields<'_> {
    fn get(&self, name: &str) -> Option<Cow<'_, str>> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .filter(|v| *v != "-" && !v.is_empty())
            .map(Cow::Borrowed)
    }
}

/// Splits an access log line into its tokens: bare words, `"quoted"` (with `\"` inside) and
/// `[bracketed]`. Walked as bytes: every delimiter is ASCII, so every cut is at a character's
/// edge.
fn tokens(line: &str) -> Result<SmallVec<[&str; 16]>, String> {
    let bytes = line.as_bytes();
    let end = line.trim_end_matches(['\r', '\n']).len();
    let mut out = SmallVec::new();
    let mut i = 0;
    while i < end {
        match bytes[i] {
            b' ' | b'\t' => i += 1,
            b'"' => {
                let mut j = i + 1;
                loop {
                    match bytes[..end].get(j) {
                        None => return Err("a quoted field is not closed".into()),
                        Some(b'\\') => j += 2,
                        Some(b'"') => break,
                        Some(_) => j += 1,
                    }
                }
                out.push(&line[i + 1..j]);
                i = j + 1;
            }
            b'[' => {
                let close = bytes[i..end]
                    .iter()
                    .position(|&b| b == b']')
                    .ok_or("a [bracketed] field is not closed")?;
                out.push(&line[i + 1..i + close]);
                i += close + 1;
            }
            _ => {
                let start = i;
                while i < end && bytes[i] != b' ' && bytes[i] != b'\t' {
                    i += 1;
                }
                out.push(&line[start..i]);
            }
        }
    }
    Ok(out)
}

/// nginx's `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status
/// $body_bytes_sent "$http_referer" "$http_user_agent"`.
fn nginx_fields(line: &str) -> Result<LogFields<'_>, String> {
    let t = tokens(line)?;
    if t.len() < 9 {
        return Err(format!(
            "expected nginx's combined format (9 fields), found {} fields",
            t.len()
        ));
    }
    let mut request = t[4].splitn(3, ' ');
    let (method, path) = (request.next().unwrap_or(""), request.next().unwrap_or(""));
    Ok(LogFields(smallvec::smallvec![
        ("remote_addr", t[0]),
        ("remote_user", t[2]),
        ("time_local", t[3]),
        ("request", t[4]),
        ("method", method),
        ("path", path),
        ("status", t[5]),
        ("body_bytes_sent", t[6]),
        ("referer", t[7]),
        ("user_agent", t[8]),
    ]))
}

/// Envoy's default access log: `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%
/// %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION%
/// %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%"
/// "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"`.
fn envoy_fields(line: &str) -> Result<LogFields<'_>, String> {
    let t = tokens(line)?;
    if t.len() < 13 {
        return Err(format!(
            "expected Envoy's default access log format (13 fields), found {} fields",
            t.len()
        ));
    }
    let mut request = t[1].splitn(3, ' ');
    let (method, path, protocol) = (
        request.next().unwrap_or(""),
        request.next().unwrap_or(""),
        request.next().unwrap_or(""),
    );
    Ok(LogFields(smallvec::smallvec![
        ("start_time", t[0]),
        ("method", method),
        ("path", path),
        ("protocol", protocol),
        ("status", t[2]),
        ("response_flags", t[3]),
        ("bytes_received", t[4]),
        ("bytes_sent", t[5]),
        ("duration", t[6]),
        ("upstream_service_time", t[7]),
        ("forwarded_for", t[8]),
        ("user_agent", t[9]),
        ("request_id", t[10]),
        ("authority", t[11]),
        ("upstream_host", t[12]),
    ]))
}

/// The times a line may give, in µs since the epoch: from 2000 to 2100. Anything else is a
/// mistake (a unit misread, a field that is not a time), and a replay's clock never goes back:
/// one request in the year 5000 would decide every request after it.
pub(crate) const TIMES_US: std::ops::RangeInclusive<u64> =
    946_684_800_000_000..=4_102_444_800_000_000;

/// A time: a number since the epoch (seconds, milliseconds, microseconds or nanoseconds, told
/// apart by size), RFC 3339 (`2026-12-05T10:00:00.250Z`), or nginx's `05/Dec/2026:10:00:00
/// +0000`; in microseconds since the epoch.
pub(crate) fn parse_time(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(n) = text.parse::<f64>() {
        if !(n >= 0.0 && n.is_finite()) {
            return Err(format!("{text:?} is not a time"));
        }
        let us = if n < 1e11 {
            n * 1e6
        } else if n < 1e14 {
            n * 1e3
        } else if n < 1e17 {
            n
        } else {
            n / 1e3
        };
        return Ok(us as u64);
    }
    let at = match text.parse::<jiff::Timestamp>() {
        Ok(at) => at,
        Err(_) => jiff::fmt::strtime::parse("%d/%b/%Y:%H:%M:%S %z", text)
            .and_then(|t| t.to_timestamp())
            .map_err(|_| {
                format!(
                    "{text:?} is not a time (seconds since the epoch, RFC 3339, or nginx's 05/Dec/2026:10:00:00 +0000)"
                )
            })?,
    };
    u64::try_from(at.as_microsecond()).map_err(|_| format!("{text:?} is before 1970"))
}

/// `*` matches any run of characters; anything else itself.
struct Pattern(Vec<String>);

impl Pattern {
    fn new(text: &str) -> Pattern {
        Pattern(text.split('*').map(str::to_owned).collect())
    }

    fn matches(&self, value: &str) -> bool {
        let parts = &self.0;
        if parts.len() == 1 {
            return value == parts[0];
        }
        let (first, last) = (&parts[0], &parts[parts.len() - 1]);
        if value.len() < first.len() + last.len()
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &parts[1..parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// A line of tollgate's record (see `crate::record`).
#[derive(Deserialize)]
struct RecordLine<'a> {
    t_us: u64,
    #[serde(borrow)]
    policy: Option<Cow<'a, str>>,
    #[serde(default)]
    identity: IdentityJson,
    cost: Option<u64>,
    allowed: Option<bool>,
    retry_after_ms: Option<u64>,
    #[serde(borrow)]
    domain: Option<Cow<'a, str>>,
    descriptors: Option<Vec<RecordDescriptor>>,
    hits_addend: Option<u32>,
}

#[derive(Deserialize)]
struct RecordDescriptor {
    entries: Vec<(String, String)>,
    limit: Option<(u32, i32)>,
    hits_addend: Option<u64>,
}

fn record_line(text: &str, names: &mut Names) -> Result<(u64, What, Option<Recorded>), String> {
    if let Some(read) = check_line(text, names) {
        return Ok(read);
    }
    let line: RecordLine<'_> =
        serde_json::from_str(text).map_err(|e| format!("not a line of tollgate's record: {e}"))?;
    let what = match (line.policy, line.domain, line.descriptors) {
        (Some(policy), None, None) => What::Check {
            policy: names.intern(&policy),
            identity: line.identity.into_identity(),
            cost: line.cost.unwrap_or(1),
        },
        (None, Some(domain), Some(descriptors)) => What::Envoy(RateLimitRequest {
            domain: domain.into_owned(),
            descriptors: descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|(key, value)| Entry { key, value })
                        .collect(),
                    limit: d.limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                        requests_per_unit,
                        unit,
                    }),
                    hits_addend: d
                        .hits_addend
                        .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                })
                .collect(),
            hits_addend: line.hits_addend.unwrap_or(0),
        }),
        _ => {
            return Err(
                "a record line names a policy, or a domain with its descriptors".to_owned(),
            );
        }
    };
    let recorded = line.allowed.map(|allowed| Recorded {
        allowed,
        retry_after_us: line.retry_after_ms.map(|ms| ms.saturating_mul(1000)),
    });
    Ok((line.t_us, what, recorded))
}

/// A policy check's line as the server writes it, read without a JSON parser: its fields in
/// the writer's order, an identity of an address and user id or name, no escaped text.
/// `None` for any other line, which the JSON parser then reads (so both read a line alike;
/// this one is only faster, four times, on the lines nearly every record is made of).
fn check_line(text: &str, names: &mut Names) -> Option<(u64, What, Option<Recorded>)> {
    let mut at = Plain(text.trim_ascii_end().as_bytes());
    at.expect(b"{\"t_us\":")?;
    let t_us = at.number()?;
    at.expect(b",\"policy\":")?;
    let policy = at.text()?;
    at.expect(b",\"identity\":{")?;
    let mut identity = Identity::new();
    let mut first = true;
    while !at.take(b"}") {
        if !first {
            at.expect(b",")?;
        }
        first = false;
        let field = at.text()?;
        at.expect(b":")?;
        let value = at.text()?;
        // A field given twice is the JSON parser's to refuse.
        identity = match field {
            "ip" if identity.ip().is_none() => identity.with_ip(value.parse().ok()?),
            "user_id" if identity.user_id().is_none() => identity.with_user_id(value),
            "user_name" if identity.user_name().is_none() => identity.with_user_name(value),
            _ => return None,
        };
    }
    at.expect(b",\"cost\":")?;
    let cost = at.number()?;
    at.expect(b",\"allowed\":")?;
    let allowed = if at.take(b"true") {
        true
    } else {
        at.expect(b"false")?;
        false
    };
    at.expect(b",\"reason\":")?;
    at.text()?;
    at.expect(b",\"retry_after_ms\":")?;
    let retry_after_ms = if at.take(b"null") {
        None
    } else {
        Some(at.number()?)
    };
    at.expect(b"}")?;
    if !at.0.is_empty() {
        return None;
    }
    let what = What::Check {
        policy: names.intern(policy),
        identity,
        cost,
    };
    let recorded = Recorded {
        allowed,
        retry_after_us: retry_after_ms.map(|ms| ms.saturating_mul(1000)),
    };
    Some((t_us, what, Some(recorded)))
}

/// What is left of a line [`check_line`] reads.
struct Plain<'a>(&'a [u8]);

impl<'a> Plain<'a> {
    fn take(&mut self, literal: &[u8]) -> bool {
        match self.0.strip_prefix(literal) {
            Some(rest) => {
                self.0 = rest;
                true
            }
            None => false,
        }
    }

    fn expect(&mut self, literal: &[u8]) -> Option<()> {
        self.take(literal).then_some(())
    }

    /// A whole number of at most 19 digits (no sign, no fraction).
    fn number(&mut self) -> Option<u64> {
        let digits = self.0.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || digits > 19 || (digits > 1 && self.0[0] == b'0') {
            return None;
        }
        let n = self.0[..digits]
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        self.0 = &self.0[digits..];
        Some(n)
    }

    /// A string without escapes or control characters.
    fn text(&mut self) -> Option<&'a str> {
        let rest = self.0.strip_prefix(b"\"")?;
        let end = rest
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if rest[end] != b'"' {
            return None;
        }
        self.0 = &rest[end + 1..];
        std::str::from_utf8(&rest[..end]).ok()
    }
}

/// The files' requests in time order: each file read a line at a time, the earliest head
/// taken first (a file's own lines in the order written).
pub(crate) struct Merged<'r> {
    reading: &'r Reading,
    files: Vec<Source<'r>>,
    heads: BinaryHeap<std::cmp::Reverse<(u64, u32, u64)>>,
    pending: Vec<Option<Event>>,
    pub(crate) malformed: Vec<Malformed>,
    pub(crate) malformed_count: u64,
    pub(crate) skipped: u64,
    /// Every file's first request is read.
    started: bool,
}

struct Source<'r> {
    path: PathBuf,
    lines: Box<dyn BufRead + 'r>,
    line: u64,
    buf: Vec<u8>,
}

/// Counts a malformed line, and names it while fewer than [`MALFORMED_NAMED`] are.
fn note(count: &mut u64, named: &mut Vec<Malformed>, line: Malformed) {
    *count += 1;
    if named.len() < MALFORMED_NAMED {
        named.push(line);
    }
}

/// The most malformed lines a report names (all are counted).
const MALFORMED_NAMED: usize = 20;

impl<'r> Merged<'r> {
    pub(crate) fn open(reading: &'r Reading, paths: &[PathBuf]) -> Result<Merged<'r>, String> {
        let mut files = Vec::new();
        for path in paths {
            let file =
                File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            files.push(Source {
                path: path.clone(),
                lines: Box::new(BufReader::with_capacity(1 << 16, file)),
                line: 0,
                buf: Vec::new(),
            });
        }
        Ok(Merged::of(reading, files))
    }

    fn of(reading: &'r Reading, files: Vec<Source<'r>>) -> Merged<'r> {
        let pending = files.iter().map(|_| None).collect();
        Merged {
            reading,
            files,
            heads: BinaryHeap::new(),
            pending,
            malformed: Vec::new(),
            malformed_count: 0,
            skipped: 0,
            started: false,
        }
    }

    /// The file `i`'s name.
    pub(crate) fn file_name(&self, i: u32) -> String {
        self.files[i as usize].path.display().to_string()
    }

    /// The next request of file `i`, its malformed lines counted on the way.
    fn read(&mut self, i: usize, names: &mut Names) -> Option<Event> {
        let source = &mut self.files[i];
        loop {
            source.buf.clear();
            match source.lines.read_until(b'\n', &mut source.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => {
                    let (file, line) = (source.path.display().to_string(), source.line + 1);
                    note(
                        &mut self.malformed_count,
                        &mut self.malformed,
                        Malformed {
                            file,
                            line,
                            error: format!("cannot read: {e}"),
                        },
                    );
                    return None;
                }
            }
            source.line += 1;
            let read = self
                .reading
                .event(&source.buf, names)
                .and_then(|e| match e {
                    Some((t_us, ..)) if !TIMES_US.contains(&t_us) => Err(format!(
                        "time {t_us} µs since the epoch is not between the years 2000 and 2100"
                    )),
                    e => Ok(e),
                });
            match read {
                Ok(Some((t_us, what, recorded))) => {
                    return Some(Event {
                        t_us,
                        file: i as u32,
                        line: source.line,
                        what,
                        recorded,
                    });
                }
                Ok(None) => self.skipped += 1,
                Err(error) => {
                    let (file, line) = (source.path.display().to_string(), source.line);
                    note(
                        &mut self.malformed_count,
                        &mut self.malformed,
                        Malformed { file, line, error },
                    );
                }
            }
        }
    }

    /// The next request in time order.
    pub(crate) fn next(&mut self, names: &mut Names) -> Option<Event> {
        if !self.started {
            self.started = true;
            for i in 0..self.files.len() {
                if let Some(event) = self.read(i, names) {
                    self.heads
                        .push(std::cmp::Reverse((event.t_us, i as u32, event.line)));
                    self.pending[i] = Some(event);
                }
            }
        }
        let std::cmp::Reverse((_, i, _)) = self.heads.pop()?;
        let i = i as usize;
        let event = self.pending[i].take()?;
        if let Some(next) = self.read(i, names) {
            self.heads
                .push(std::cmp::Reverse((next.t_us, i as u32, next.line)));
            self.pending[i] = Some(next);
        }
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(format: InputFormat, map: &[&str], policy: Option<&str>) -> Reading {
        let map: Vec<String> = map.iter().map(|s| (*s).to_owned()).collect();
        Reading::new(format, &map, &[], policy.map(str::to_owned), None, &[]).unwrap()
    }

    fn check(reading: &Reading, line: &str) -> (u64, String, Identity, u64) {
        let mut names = Names::default();
        match reading.event(line.as_bytes(), &mut names).unwrap().unwrap() {
            (
                t,
                What::Check {
                    policy,
                    identity,
                    cost,
                },
                _,
            ) => (t, names.names[policy as usize].to_string(), identity, cost),
            _ => panic!("a check"),
        }
    }

    #[test]
    fn nginx_combined_lines_give_time_address_and_user() {
        let r = reading(InputFormat::Nginx, &[], Some("login"));
        let (t, policy, who, cost) = check(
            &r,
            r#"203.0.113.7 - alice [05/Dec/2026:10:00:01 +0100] "POST /login?x=1 HTTP/1.1" 429 12 "-" "curl/8.5 \"quoted\"""#,
        );
        assert_eq!(t, parse_time("2026-12-05T09:00:01Z").unwrap());
        assert_eq!(policy, "login");
        assert_eq!(who.ip(), Some("203.0.113.7".parse().unwrap()));
        assert_eq!(who.user_id(), Some("alice"));
        assert_eq!(cost, 1);
        let (_, _, anonymous, _) = check(
            &r,
            r#"203.0.113.7 - - [05/Dec/2026:10:00:01 +0100] "GET / HTTP/1.1" 200 12 "-" "-""#,
        );
        assert_eq!(anonymous.user_id(), None, "'-' is no user");
    }

    #[test]
    fn envoy_access_lines_take_the_forwarded_client() {
        let r = reading(
            InputFormat::Envoy,
            &["header.user-agent=user_agent"],
            Some("api"),
        );
        let (t, _, who, _) = check(
            &r,
            r#"[2026-12-05T10:00:00.310Z] "POST /api/v1/sms HTTP/2" 204 - 154 0 226 100 "198.51.100.4, 10.0.0.1" "app/1.0" "cc21d9b0" "api.example.com" "tcp://10.0.2.1:80""#,
        );
        assert_eq!(t, 1_796_464_800_310_000);
        assert_eq!(who.ip(), Some("198.51.100.4".parse().unwrap()));
        assert_eq!(who.header("user-agent"), Some("app/1.0"));
    }

    #[test]
    fn json_lines_follow_the_mapping() {
        let r = reading(
            InputFormat::Json,
            &["time=ts", "user_id=user.id", "cost=usage.tokens"],
            Some("chat"),
        );
        let (t, _, who, cost) = check(
            &r,
            r#"{"ts": 1796551200.5, "user": {"id": 42}, "usage": {"tokens": 350}, "ip": "192.0.2.1"}"#,
        );
        assert_eq!(t, 1_796_551_200_500_000);
        assert_eq!(who.user_id(), Some("42"));
        assert_eq!(who.ip(), Some("192.0.2.1".parse().unwrap()));
        assert_eq!(cost, 350);
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let r = reading(InputFormat::Json, &[], Some("chat"));
        let mut names = Names::default();
        let error = |line: &str| {
            r.event(line.as_bytes(), &mut Names::default())
                .err()
                .unwrap()
        };
        assert!(error("{not json").starts_with("not JSON"));
        assert_eq!(
            error(r#"{"ip": "1.2.3.4"}"#),
            r#"no time in field "time" (--map time=FIELD)"#
        );
        assert_eq!(
            error(r#"{"time": 1, "ip": "nope"}"#),
            r#"field "ip": "nope" is not an IP address"#
        );
        assert!(r.event(b"   ", &mut names).unwrap().is_none());
        // The last time read is reused only for the same text.
        assert!(
            r.event(br#"{"time": 7, "ip": "192.0.2.1"}"#, &mut names)
                .is_ok()
        );
        assert!(error(r#"{"time": "", "ip": "192.0.2.1"}"#).contains("is not a time"));
        let (t, _, _) = r
            .event(br#"{"time": 8, "ip": "192.0.2.1"}"#, &mut names)
            .unwrap()
            .unwrap();
        assert_eq!(t, 8_000_000);
        let nginx = reading(InputFormat::Nginx, &[], Some("p"));
        assert!(nginx.event(b"just words", &mut names).is_err());
        let record = reading(InputFormat::Record, &[], None);
        assert!(record.event(br#"{"t_us": 1}"#, &mut names).is_err());
    }

    /// The quick reader of check lines reads what the JSON parser reads, or leaves the line
    /// to it.
    #[test]
    fn check_lines_read_alike_with_and_without_the_json_parser() {
        let lines = [
            r#"{"t_us":1796464800000001,"policy":"sms","identity":{"ip":"203.0.113.7","user_id":"42"},"cost":2,"allowed":false,"reason":"rate_limited","retry_after_ms":60000}"#,
            r#"{"t_us":5,"policy":"api","identity":{},"cost":1,"allowed":true,"reason":"ok","retry_after_ms":null}"#,
            r#"{"t_us":5,"policy":"api","identity":{"user_name":"Zoë","ip":"2001:db8::1"},"cost":1,"allowed":true,"reason":"ok","retry_after_ms":null}"#,
            // Left to the parser: escapes, headers, another order, spaces, a fraction.
            r#"{"t_us":5,"policy":"a\"b","identity":{"user_id":"x\u0041"},"cost":1,"allowed":true,"reason":"ok","retry_after_ms":null}"#,
            r#"{"t_us":5,"policy":"api","identity":{"ip":"192.0.2.1","headers":{"x-key":"k"}},"cost":1,"allowed":true,"reason":"ok","retry_after_ms":null}"#,
            r#"{"policy":"api","t_us":5,"identity":{},"cost":1,"allowed":true,"reason":"ok","retry_after_ms":null}"#,
            r#"{ "t_us": 5, "policy": "api", "identity": {}, "cost": 1, "allowed": true, "reason": "ok", "retry_after_ms": null }"#,
        ];
        let quick = |line: &str| {
            check_line(line, &mut Names::default()).map(|(t, what, recorded)| match what {
                What::Check { identity, cost, .. } => (t, identity, cost, recorded),
                What::Envoy(_) => panic!("a check"),
            })
        };
        for (i, line) in lines.iter().enumerate() {
            let mut names = Names::default();
            let parsed = serde_json::from_str::<RecordLine<'_>>(line).unwrap();
            let expected = (
                parsed.t_us,
                parsed.identity.into_identity(),
                parsed.cost.unwrap(),
                parsed.allowed.map(|allowed| Recorded {
                    allowed,
                    retry_after_us: parsed.retry_after_ms.map(|ms| ms.saturating_mul(1000)),
                }),
            );
            match quick(line) {
                Some(read) => assert_eq!(read, expected, "line {i}"),
                None => assert!(i >= 3, "line {i} is the writer's own shape"),
            }
            // Either way, the record reads it as the parser does.
            let (t, what, recorded) = record_line(line, &mut names).unwrap();
            let What::Check { identity, cost, .. } = what else {
                panic!("a check")
            };
            assert_eq!((t, identity, cost, recorded), expected, "line {i}");
        }
        assert!(quick(lines[1]).is_some() && quick(lines[3]).is_none());
        assert!(check_line(r#"{"t_us":01,"policy":"a","identity":{},"cost":1,"allowed":true,"reason":"ok","retry_after_ms":null}"#, &mut Names::default()).is_none());
    }

    #[test]
    fn filters_keep_the_lines_that_match() {
        let filters = vec!["path=/api/sms*".to_owned(), "method=POST".to_owned()];
        let r = Reading::new(
            InputFormat::Nginx,
            &[],
            &filters,
            Some("sms".into()),
            None,
            &[],
        )
        .unwrap();
        let mut names = Names::default();
        let line = |method: &str, path: &str| {
            format!(
                r#"203.0.113.7 - - [05/Dec/2026:10:00:01 +0000] "{method} {path} HTTP/1.1" 200 1 "-" "-""#
            )
        };
        assert!(
            r.event(line("POST", "/api/sms/send").as_bytes(), &mut names)
                .unwrap()
                .is_some()
        );
        assert!(
            r.event(line("GET", "/api/sms/send").as_bytes(), &mut names)
                .unwrap()
                .is_none()
        );
        assert!(
            r.event(line("POST", "/api/mail").as_bytes(), &mut names)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn files_are_merged_in_time_order() {
        let r = reading(InputFormat::Json, &[], Some("p"));
        let dir = std::env::temp_dir().join(format!("tollgate-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
        std::fs::write(
            &a,
            b"{\"time\":1796551201}\n{\"time\":1796551204}\nbroken \xff\n{\"time\":1796551205}\n",
        )
        .unwrap();
        std::fs::write(
            &b,
            "{\"time\":1796551202}\n{\"time\":1796551203}\n{\"time\":1796551206}\n",
        )
        .unwrap();
        let mut merged = Merged::open(&r, &[a, b]).unwrap();
        let mut names = Names::default();
        let mut seen = Vec::new();
        while let Some(e) = merged.next(&mut names) {
            seen.push((e.t_us / 1_000_000 - 1_796_551_200, e.file, e.line));
        }
        assert_eq!(
            seen,
            [
                (1, 0, 1),
                (2, 1, 1),
                (3, 1, 2),
                (4, 0, 2),
                (5, 0, 4),
                (6, 1, 3)
            ]
        );
        assert_eq!(merged.malformed_count, 1);
        assert_eq!(merged.malformed[0].line, 3);
        assert!(
            merged.malformed[0].error.starts_with("not UTF-8"),
            "{:?}",
            merged.malformed
        );
    }
}
