//! The YAML configuration of Envoy's reference rate-limit service (`envoyproxy/ratelimit`),
//! read unchanged: one domain per file, nested `descriptors` with `key`, `value` (with `*`
//! wildcards), `rate_limit { unit, requests_per_unit, unlimited, name, replaces }`,
//! `shadow_mode`, `quota_mode`, `share_threshold`, `metadata`, and the statistics' `detailed_metric`
//! and `value_to_metric` (see `crate::envoy::stats`); the tree is built in `crate::envoy::descriptors`.
//! Every check is made while parsing, so a mistake is reported with its line.

use std::{
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Deserializer};

use super::ConfigError;

/// One file: a domain and its descriptors.
#[derive(Debug, Deserialize)]
pub(crate) struct YamlRoot {
    #[serde(default)]
    pub(crate) domain: String,
    #[serde(default)]
    pub(crate) descriptors: Descriptors,
}

/// A list of descriptors (two of one key and value are refused where the tree is built,
/// which knows their path).
#[derive(Debug, Default, Deserialize)]
#[serde(from = "Option<Vec<YamlDescriptor>>")]
pub(crate) struct Descriptors(pub(crate) Vec<YamlDescriptor>);

/// `descriptors:` with nothing after it is an empty list, as in the reference.
impl From<Option<Vec<YamlDescriptor>>> for Descriptors {
    fn from(list: Option<Vec<YamlDescriptor>>) -> Descriptors {
        Descriptors(list.unwrap_or_default())
    }
}

/// One descriptor, checked.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawDescriptor")]
pub(crate) struct YamlDescriptor {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) limit: Limit,
    pub(crate) name: Option<String>,
    pub(crate) replaces: Vec<String>,
    pub(crate) shadow: bool,
    /// `quota_mode`: over its limit, the request is still OK unless every quota descriptor
    /// of it is over (see `Semantics::Reference`).
    pub(crate) quota: bool,
    /// `metadata`: a map the answer's `dynamic_metadata` carries when the descriptor passes
    /// (the reference's `RESPONSE_DYNAMIC_METADATA`).
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub(crate) share_threshold: bool,
    /// `detailed_metric`: a descriptor ending here is counted in the statistics under the
    /// request's own values.
    pub(crate) detailed_metric: bool,
    /// `value_to_metric`: the statistics name the request's value for this entry, where the
    /// configuration has none of its own (no value, or a wildcard).
    pub(crate) value_to_metric: bool,
    pub(crate) descriptors: Descriptors,
}

/// What a descriptor's `rate_limit` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// No `rate_limit`: a descriptor that only holds others, or, without them, one that is
    /// never limited (the reference service's allow-list).
    None,
    /// `unlimited: true`.
    Unlimited,
    /// `requests_per_unit` per `unit` (0: every request is over).
    PerUnit(u32, Unit),
}

/// Envoy's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }
}

#[derive(Debug, Deserialize)]
struct RawDescriptor {
    #[serde(default, deserialize_with = "scalar")]
    key: Option<String>,
    #[serde(default, deserialize_with = "scalar")]
    value: Option<String>,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Descriptors,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct RawRateLimit {
    #[serde(default)]
    requests_per_unit: u32,
    unit: Option<String>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplaces>,
}

#[derive(Debug, Deserialize)]
struct RawReplaces {
    #[serde(default, deserialize_with = "scalar")]
    name: Option<String>,
}

/// A YAML scalar as its text, as written: `value: 8080`, `value: True` and
/// `value: +15551234567` are the strings `8080`, `True` and `+15551234567`, as the reference
/// service reads them into a string (a number is not read as a number and written again).
fn scalar<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}

impl TryFrom<RawDescriptor> for YamlDescriptor {
    type Error = String;

    fn try_from(raw: RawDescriptor) -> Result<YamlDescriptor, String> {
        let key = raw.key.unwrap_or_default();
        if key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        // An empty value is no value, as in the reference service.
        let value = raw.value.filter(|v| !v.is_empty());
        if raw.share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            let local = match &value {
                Some(v) => format!("{key}_{v}"),
                None => key.clone(),
            };
            return Err(format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{local}'"
            ));
        }
        let metadata = match raw.metadata {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Object(map)) => Some(map),
            Some(_) => return Err(format!("descriptor {key}: metadata should be a map")),
        };
        let (limit, name, replaces) = match raw.rate_limit {
            None => (Limit::None, None, Vec::new()),
            Some(rl) => {
                let unit = rl.unit.as_deref().filter(|u| !u.is_empty());
                // As the reference: an unlimited descriptor may not name a unit (one it does
                // not know is ignored).
                let limit = match (rl.unlimited, unit.and_then(Unit::parse)) {
                    (true, Some(_)) => {
                        return Err(format!(
                            "descriptor {key}: should not specify rate limit unit when unlimited"
                        ));
                    }
                    (true, None) => Limit::Unlimited,
                    (false, Some(u)) => Limit::PerUnit(rl.requests_per_unit, u),
                    (false, None) => {
                        return Err(format!(
                            "descriptor {key}: invalid rate limit unit '{}' (expected second, minute, hour, day, week, month or year)",
                            unit.unwrap_or("")
                        ));
                    }
                };
                let mut replaces = Vec::with_capacity(rl.replaces.len());
                for r in rl.replaces {
                    let Some(name) = r.name.filter(|n| !n.is_empty()) else {
                        return Err(format!(
                            "descriptor {key}: should not have an empty replaces entry"
                        ));
                    };
                    if rl.name.as_deref() == Some(name.as_str()) {
                        return Err(format!(
                            "descriptor {key}: replaces should not contain name of same descriptor"
                        ));
                    }
                    replaces.push(name);
                }
                (limit, rl.name.filter(|n| !n.is_empty()), replaces)
            }
        };
        Ok(YamlDescriptor {
            key,
            value,
            limit,
            name,
            replaces,
            shadow: raw.shadow_mode,
            quota: raw.quota_mode,
            metadata,
            share_threshold: raw.share_threshold,
            detailed_metric: raw.detailed_metric,
            value_to_metric: raw.value_to_metric,
            descriptors: raw.descriptors,
        })
    }
}

/// A parsed file: its path, for errors and the summary, and its root.
#[derive(Debug)]
pub(crate) struct YamlFile {
    pub(crate) path: PathBuf,
    pub(crate) root: YamlRoot,
}

/// Every key the reference service reads, at any depth (it checks them as one set).
const KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Parses one file's text; `file` names it in errors, which say what the reference service
/// says of the same mistake.
pub(crate) fn parse(file: &Path, text: &str) -> Result<YamlRoot, ConfigError> {
    let name = file.display().to_string();
    let error = |e: serde_norway::Error| {
        let line = e.location().map(|l| l.line());
        let mut message = e.to_string();
        // The location is given apart.
        if let Some(at) = message.find(" at line ") {
            message.truncate(at);
        }
        // The parser's own mistakes, as the reference words them; ours are already worded.
        if [
            "invalid type",
            "invalid value",
            "missing field",
            "invalid length",
        ]
        .iter()
        .any(|p| message.starts_with(p))
        {
            message = format!("error loading config file: {message}");
        }
        ConfigError::new(name.clone(), line, "", message)
    };
    // First the keys, as the reference checks them: each a string of the known set, each
    // list one of maps.
    let value: serde_norway::Value = serde_norway::from_str(text).map_err(|e| {
        let e = error(e);
        let message = format!("error loading config file: {}", e.message());
        ConfigError::new(name.clone(), e.line(), "", message)
    })?;
    check_keys(&value).map_err(|(message, near)| {
        ConfigError::new(name.clone(), line_of(text, &near), "", message)
    })?;
    let root: YamlRoot = serde_norway::from_str(text).map_err(error)?;
    if root.domain.is_empty() {
        return Err(ConfigError::new(
            name,
            text.lines()
                .position(|l| l.starts_with("domain:"))
                .map(|i| i + 1),
            "domain",
            "config file cannot have empty domain",
        ));
    }
    let mut seen = std::collections::HashMap::new();
    if let Err((message, key, nth)) = duplicates(&root.descriptors.0, &root.domain, &mut seen) {
        let line = nth_key_line(text, &key, (nth, count_key(&root.descriptors.0, &key)));
        return Err(ConfigError::new(name, line, "descriptors", message));
    }
    Ok(root)
}

/// The reference's check that no two descriptors of one level have the same key and value (the
/// only one: the descriptor tree is built from files that passed it), in the order of the file. On a duplicate: the message, its key, and how many descriptors of
/// that key came before it in the file (to find its line by). `seen` counts them by key.
fn duplicates(
    level: &[YamlDescriptor],
    composite: &str,
    seen: &mut std::collections::HashMap<String, usize>,
) -> Result<(), (String, String, usize)> {
    let mut here = std::collections::HashSet::new();
    for d in level {
        let nth = seen.entry(d.key.clone()).or_insert(0);
        let before = *nth;
        *nth += 1;
        let part = match &d.value {
            Some(v) => format!("{}_{v}", d.key),
            None => d.key.clone(),
        };
        let composite = format!("{composite}.{part}");
        if !here.insert((d.key.as_str(), d.value.as_deref())) {
            let message = format!("duplicate descriptor composite key '{composite}'");
            return Err((message, d.key.clone(), before));
        }
        duplicates(&d.descriptors.0, &composite, seen)?;
    }
    Ok(())
}

/// How many descriptors of the tree have `key`.
fn count_key(level: &[YamlDescriptor], key: &str) -> usize {
    level
        .iter()
        .map(|d| usize::from(d.key == key) + count_key(&d.descriptors.0, key))
        .sum()
}

/// The line (from 1) of the `nth` (from 0) of `of` descriptors with `key`, found as lines
/// that say `key: <key>` plainly, outside comments; `None` unless there is exactly one such
/// line per descriptor (a quoted key, two on a line or the text in a metadata map would make
/// the count a guess: the file is still named).
fn nth_key_line(text: &str, key: &str, (nth, of): (usize, usize)) -> Option<usize> {
    let written = format!("key: {key}");
    let at = |line: &str| {
        let line = line.split('#').next().unwrap_or("");
        let found = line.match_indices(&written).filter(|&(i, _)| {
            let before = line[..i].chars().next_back();
            let after = line[i + written.len()..].chars().next();
            matches!(before, None | Some(' ' | '-' | '{' | ',' | '\t'))
                && matches!(after, None | Some(' ' | ',' | '}' | '\t' | '\r'))
        });
        found.count() == 1
    };
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| at(l))
        .map(|(i, _)| i + 1)
        .collect();
    (lines.len() == of)
        .then(|| lines.get(nth).copied())
        .flatten()
}

/// A scalar as Go's `%v` writes it, for errors.
fn scalar_text(value: &serde_norway::Value) -> String {
    use serde_norway::Value as V;
    match value {
        V::Null => "<nil>".into(),
        V::Bool(b) => b.to_string(),
        V::Number(n) => n.to_string(),
        V::String(s) => s.clone(),
        V::Sequence(_) | V::Mapping(_) | V::Tagged(_) => format!("{value:?}"),
    }
}

/// The reference's check of a file's keys: every map key a string of [`KEYS`] (what is under
/// `metadata` is free), every list element a map, no value of another type than a string, a
/// whole number, a boolean or null. On a mistake: the message, and text to find its line by.
fn check_keys(value: &serde_norway::Value) -> Result<(), (String, String)> {
    use serde_norway::Value as V;
    match value {
        V::Mapping(map) => {
            for (key, value) in map {
                let V::String(key) = key else {
                    let text = scalar_text(key);
                    return Err((
                        format!("config error, key is not of type string: {text}"),
                        text,
                    ));
                };
                if !KEYS.contains(&key.as_str()) {
                    return Err((format!("config error, unknown key '{key}'"), key.clone()));
                }
                if key != "metadata" {
                    check_keys(value)?;
                }
            }
            Ok(())
        }
        V::Sequence(list) => {
            for element in list {
                if !matches!(element, V::Mapping(_)) {
                    let text = scalar_text(element);
                    return Err((
                        format!(
                            "config error, yaml file contains list of type other than map: {text}"
                        ),
                        text,
                    ));
                }
                check_keys(element)?;
            }
            Ok(())
        }
        V::Number(n) if n.is_f64() => Err(("error checking config".into(), n.to_string())),
        V::Tagged(_) => Err(("error checking config".into(), String::new())),
        V::Null | V::Bool(_) | V::Number(_) | V::String(_) => Ok(()),
    }
}

/// The first line (from 1) that holds `text`, if any.
fn line_of(text: &str, near: &str) -> Option<usize> {
    if near.is_empty() {
        return None;
    }
    text.lines().position(|l| l.contains(near)).map(|i| i + 1)
}

/// The files of `path`: the file itself, or every `.yaml` / `.yml` file under the directory
/// (its subdirectories included, as the reference service's runtime directory is read),
/// sorted by path; dotfiles are skipped when `ignore_dotfiles`.
pub(crate) fn files(path: &Path, ignore_dotfiles: bool) -> Result<Vec<PathBuf>, ConfigError> {
    let error = |e: std::io::Error| {
        ConfigError::new(
            path.display().to_string(),
            None,
            "envoy.ratelimit_config",
            format!("cannot read: {e}"),
        )
    };
    let meta = fs::metadata(path).map_err(error)?;
    if meta.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    let mut out = Vec::new();
    let mut dirs = vec![path.to_owned()];
    // Each directory is read once, by its real path: a link back up the tree (`a -> .`)
    // would otherwise be walked again and again, each time deeper.
    let mut seen = std::collections::HashSet::new();
    while let Some(dir) = dirs.pop() {
        if !seen.insert(fs::canonicalize(&dir).map_err(error)?) {
            continue;
        }
        for entry in fs::read_dir(&dir).map_err(error)? {
            let entry = entry.map_err(error)?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if ignore_dotfiles && name.starts_with('.') {
                continue;
            }
            // Follows symbolic links, as Kubernetes ConfigMap volumes are made of them.
            let Ok(meta) = fs::metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                // Kubernetes keeps the real files in `..data`-like directories and links to
                // them: reading the links is enough.
                if !name.starts_with("..") {
                    dirs.push(entry.path());
                }
            } else if meta.is_file() && (name.ends_with(".yaml") || name.ends_with(".yml")) {
                // Regular files only: a pipe or a device (a link to `/dev/zero`) would hang the
                // start, or each poll for changes, or fill the memory.
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Reads and parses every file of `path` (see [`files`]).
pub(crate) fn load(path: &Path, ignore_dotfiles: bool) -> Result<Vec<YamlFile>, ConfigError> {
    files(path, ignore_dotfiles)?
        .into_iter()
        .map(|file| {
            let text = fs::read_to_string(&file).map_err(|e| {
                ConfigError::new(
                    file.display().to_string(),
                    None,
                    "",
                    format!("cannot read the file: {e}"),
                )
            })?;
            let root = parse(&file, &text)?;
            Ok(YamlFile { path: file, root })
        })
        .collect()
}

/// Every file's name and bytes under `path`, for noticing a change (a file added, removed or
/// edited); empty if it cannot be read.
pub(crate) fn fingerprint(path: &Path, ignore_dotfiles: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for file in files(path, ignore_dotfiles).unwrap_or_default() {
        out.extend_from_slice(file.as_os_str().as_encoded_bytes());
        out.push(0);
        out.extend_from_slice(&fs::read(&file).unwrap_or_default());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use tollgate::{Algorithm, OnError};

    use super::*;
    use crate::envoy::{
        Domains, DomainsBuilder, Semantics,
        descriptors::{Found, NodeKind},
    };

    fn domains(files: &[&str]) -> Result<Domains, String> {
        let mut builder = DomainsBuilder::new(OnError::Allow, Semantics::reference(false));
        for (i, text) in files.iter().enumerate() {
            let path = PathBuf::from(format!("f{i}.yaml"));
            let root = parse(&path, text).map_err(|e| e.to_string())?;
            builder.yaml_domain(&YamlFile { path, root }, true, Algorithm::FixedWindow)?;
        }
        Ok(builder.build())
    }

    fn find(domains: &Domains, domain: &str, pairs: &[(&str, &str)]) -> Option<Found> {
        let entries: Vec<Entry> = pairs
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect();
        domains.get(domain)?.find(&entries, None)
    }

    /// (path, kind, rules as text) of what `pairs` match.
    fn matched(domains: &Domains, pairs: &[(&str, &str)]) -> Option<(String, NodeKind, String)> {
        let found = find(domains, "d", pairs)?;
        let rules: Vec<String> = found
            .node
            .rules
            .iter()
            .map(|r| format!("{r} {}", r.algorithm()))
            .collect();
        Some((
            found.node.path.to_string(),
            found.node.kind,
            rules.join(", "),
        ))
    }

    #[test]
    fn the_most_specific_match_and_the_blocklist() {
        let d = domains(&["
domain: d
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: remote_address
    value: 10.0.0.1
"])
        .unwrap();
        assert_eq!(
            matched(&d, &[("remote_address", "50.0.0.1")]),
            Some((
                "remote_address".into(),
                NodeKind::Rules,
                "10/1s fixed_window".into()
            ))
        );
        let blocked = matched(&d, &[("remote_address", "50.0.0.5")]).unwrap();
        assert_eq!(
            blocked.1,
            NodeKind::Blocked(envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::Second)
        );
        // A value without a limit is an allow-list entry: it does not fall back to the key.
        assert_eq!(matched(&d, &[("remote_address", "10.0.0.1")]), None);
    }

    /// A value is its scalar's text as written, as the reference service reads it into a
    /// string: a phone number keeps its `+`, a hexadecimal or a `True` stays as written.
    #[test]
    fn values_are_their_text_as_written() {
        let d = domains(&["
domain: d
descriptors:
  - key: to
    value: +15551234567
    rate_limit: { unit: day, requests_per_unit: 0 }
  - key: port
    value: 0x1F
    rate_limit: { unit: day, requests_per_unit: 0 }
  - key: flag
    value: True
    rate_limit: { unit: day, requests_per_unit: 0 }
  - key: n
    value: 8080
    rate_limit: { unit: day, requests_per_unit: 0 }
"])
        .unwrap();
        for (key, value) in [
            ("to", "+15551234567"),
            ("port", "0x1F"),
            ("flag", "True"),
            ("n", "8080"),
        ] {
            let found = matched(&d, &[(key, value)]);
            assert!(
                matches!(found, Some((_, NodeKind::Blocked(_), _))),
                "{key}={value}: {found:?}"
            );
        }
    }

    #[test]
    fn nested_lists_match_at_the_same_depth_only() {
        let d = domains(&["
domain: d
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: { unit: day, requests_per_unit: 5 }
  - key: to_number
    rate_limit: { unit: day, requests_per_unit: 100 }
  - key: key
    value: value
    rate_limit: { unit: second, requests_per_unit: 300 }
  - key: ldap
    rate_limit: { unlimited: true }
"])
        .unwrap();
        let path = |pairs: &[(&str, &str)]| matched(&d, pairs).map(|m| m.0);
        assert_eq!(
            path(&[("message_type", "marketing"), ("to_number", "2061111111")]).as_deref(),
            Some("message_type=marketing/to_number")
        );
        assert_eq!(
            path(&[("to_number", "2061111111")]).as_deref(),
            Some("to_number")
        );
        assert_eq!(path(&[("message_type", "marketing")]), None);
        assert_eq!(path(&[("key", "value"), ("subkey", "subvalue")]), None);
        assert_eq!(
            matched(&d, &[("ldap", "x")]).map(|m| m.1),
            Some(NodeKind::Unlimited)
        );
    }

    #[test]
    fn wildcards_match_anywhere_in_configuration_order() {
        let d = domains(&["
domain: d
descriptors:
  - key: path
    value: /api/*/action
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: path
    value: /api/*
    rate_limit: { unit: minute, requests_per_unit: 30 }
  - key: path
    value: /api/exact
    rate_limit: { unit: minute, requests_per_unit: 40 }
  - key: file
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
"])
        .unwrap();
        let path = |value: &str| matched(&d, &[("path", value)]).map(|m| m.0);
        assert_eq!(
            path("/api/123/action").as_deref(),
            Some("path=/api/*/action")
        );
        assert_eq!(path("/api/123/other").as_deref(), Some("path=/api/*"));
        assert_eq!(path("/api/exact").as_deref(), Some("path=/api/exact"));
        assert_eq!(path("/other"), None);
        let shared = find(&d, "d", &[("file", "files/a.pdf")]).unwrap().shared;
        assert_eq!(shared.len(), 1);
        assert_eq!(&*shared[0].1, "files/*");
        assert!(
            find(&d, "d", &[("path", "/api/1")])
                .unwrap()
                .shared
                .is_empty()
        );
    }

    #[test]
    fn names_and_replaces_are_kept_and_domains_merge() {
        let d = domains(&[
            "
domain: d
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: { name: specific_limit, unit: second, requests_per_unit: 5 }
",
            "
domain: d
descriptors:
  - key: key_2
    rate_limit:
      unit: second
      requests_per_unit: 10
      replaces:
        - name: specific_limit
",
        ])
        .unwrap();
        let first = find(&d, "d", &[("key_1", "value_1"), ("user", "u")]).unwrap();
        assert_eq!(first.node.name.as_deref(), Some("specific_limit"));
        let second = find(&d, "d", &[("key_2", "x")]).unwrap();
        assert_eq!(&*second.node.replaces[0], "specific_limit");
    }

    /// Links back up the tree are followed once: two of them made the walk grow with each
    /// level until the path was too long (a hang at start or reload).
    #[test]
    fn a_directory_linked_into_itself_is_read_once_and_only_files_are_read() {
        let root = std::env::temp_dir().join(format!("tollgate-yaml-loop-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("a.yaml"), "domain: a\n").unwrap();
        fs::write(root.join("sub/b.yml"), "domain: b\n").unwrap();
        for link in ["loop1", "loop2", "sub/up"] {
            let target = if link == "sub/up" { ".." } else { "." };
            std::os::unix::fs::symlink(target, root.join(link)).unwrap();
        }
        // Neither a device nor a pipe is read, whatever its name.
        std::os::unix::fs::symlink("/dev/zero", root.join("zero.yaml")).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(root.join("pipe.yaml"))
            .status()
            .unwrap();
        assert!(fifo.success());
        let found = files(&root, true).unwrap();
        let _ = fs::remove_dir_all(&root);
        let names: Vec<_> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{found:?}");
        assert!(
            names.contains(&"a.yaml".into()) && names.contains(&"b.yml".into()),
            "{found:?}"
        );
    }

    #[test]
    fn mistakes_name_the_file_and_line() {
        let error = |text: &str| domains(&[text]).unwrap_err();
        let e = error(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
        );
        assert!(e.starts_with("f0.yaml:"), "{e}");
        assert!(
            e.contains("invalid rate limit unit 'fortnight' (expected second, minute"),
            "{e}"
        );
        let e = error(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n",
        );
        assert!(
            e.contains("should not specify rate limit unit when unlimited"),
            "{e}"
        );
        let e = error("domain: d\ndescriptors:\n  - key: a\n    ratelimit:\n      unit: second\n");
        assert!(e.starts_with("f0.yaml:4: "), "{e}");
        assert!(e.contains("config error, unknown key 'ratelimit'"), "{e}");
        let e = error("domain: d\ndescriptors:\n  - key: a\n  - key: a\n");
        assert_eq!(
            e,
            "f0.yaml:4: descriptors: duplicate descriptor composite key 'd.a'"
        );
        // Deeper, among keys of the same name elsewhere: the duplicate's own line.
        let e = error(
            "domain: d\ndescriptors:\n  - key: b\n  - key: a\n    descriptors:\n      - key: b\n        value: c\n      - { key: b, value: c }\n",
        );
        assert_eq!(
            e,
            "f0.yaml:8: descriptors: duplicate descriptor composite key 'd.a.b_c'"
        );
        // A commented-out descriptor is no descriptor; text that makes the count a guess
        // gives no line.
        let e = error("domain: d\n# - key: a\ndescriptors:\n  - key: a\n  - key: a\n");
        assert!(e.starts_with("f0.yaml:5: "), "{e}");
        let e = error("domain: d\ndescriptors:\n  - key: a\n  - key: \"a\"\n");
        assert!(e.starts_with("f0.yaml: descriptors: duplicate"), "{e}");
        let e = error("descriptors: []\ndomain: \"\"\n");
        assert_eq!(e, "f0.yaml:2: domain: config file cannot have empty domain");
        let e = error(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { name: x, unit: second, requests_per_unit: 1, replaces: [{ name: x }] }\n",
        );
        assert!(
            e.contains("replaces should not contain name of same descriptor"),
            "{e}"
        );
        // Two files of one domain merge only when asked.
        let mut builder = DomainsBuilder::new(OnError::Allow, Semantics::reference(false));
        for i in 0..2 {
            let path = PathBuf::from(format!("g{i}.yaml"));
            let root = parse(&path, "domain: d\ndescriptors:\n  - key: a\n").unwrap();
            let result =
                builder.yaml_domain(&YamlFile { path, root }, false, Algorithm::FixedWindow);
            assert_eq!(result.is_ok(), i == 0, "{result:?}");
        }
    }
}
