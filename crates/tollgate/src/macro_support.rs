//! How the attribute macros build a limiter and a policy from an attribute's strings: once
//! while expanding (so that an invalid one is a compile error at the attribute) and once at run
//! time (the same limiter). Not a public API: it changes with the macros.

use crate::{Algorithm, BanRule, Dimension, IpPrefix, Limiter, Policy, Rule, parse_duration};

/// One `#[rate_limit]`'s limiter, as strings and flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct LimiterSpec<'a> {
    pub by: &'a str,
    pub rules: &'a [&'a str],
    pub algorithm: Option<&'a str>,
    pub name: Option<&'a str>,
    pub blocklist: Option<&'a str>,
    pub message: Option<&'a str>,
    /// The (IPv4, IPv6) prefix lengths of a `by = "ip"` limiter that sets them.
    pub prefix: Option<(u8, u8)>,
    pub shadow: bool,
    pub overrides: bool,
    pub warn_at: Option<f64>,
    pub soft: &'a [&'a str],
}

/// The rules `texts`, with `algorithm`.
pub fn rules(texts: &[&str], algorithm: Option<&str>) -> Result<Vec<Rule>, String> {
    let algorithm = algorithm
        .map(str::parse::<Algorithm>)
        .transpose()
        .map_err(|e| e.to_string())?;
    texts
        .iter()
        .map(|text| {
            let rule: Rule = text.parse().map_err(|e| format!("invalid rule {e}"))?;
            Ok(match algorithm {
                Some(a) => rule.with_algorithm(a),
                None => rule,
            })
        })
        .collect()
}

/// The limiter `spec` describes.
pub fn limiter(spec: &LimiterSpec<'_>) -> Result<Limiter, String> {
    let dimension: Dimension = match spec.prefix {
        Some((v4, v6)) => Dimension::ip_prefix(v4, v6)?,
        None => spec.by.parse::<Dimension>().map_err(|e| e.to_string())?,
    };
    let mut limiter = Limiter::new(dimension, rules(spec.rules, spec.algorithm)?)
        .with_shadow(spec.shadow)
        .with_overrides(spec.overrides);
    if let Some(name) = spec.name {
        limiter = limiter.with_name(name);
    }
    if let Some(ban) = spec.blocklist {
        let duration = parse_duration(ban).map_err(|e| e.to_string())?;
        limiter = limiter.with_blocklist(BanRule::new(duration));
    }
    if let Some(message) = spec.message {
        limiter = limiter.with_message(message);
    }
    if let Some(fraction) = spec.warn_at {
        limiter = limiter.with_warning(fraction);
    }
    if !spec.soft.is_empty() {
        limiter = limiter.with_soft_rules(rules(spec.soft, spec.algorithm)?);
    }
    Ok(limiter)
}

/// The policy of a function's limiters, under `scope`.
pub fn policy(scope: &str, limiters: Vec<Limiter>) -> Result<Policy, String> {
    limiters
        .into_iter()
        .fold(Policy::builder(scope), |builder, limiter| {
            builder.limiter(limiter)
        })
        .build()
        .map_err(|e| e.to_string())
}

/// The prefix lengths a `by = "ip"` limiter counts by when it sets only one of them.
pub fn prefix(v4: Option<u8>, v6: Option<u8>) -> Option<(u8, u8)> {
    let default = IpPrefix::DEFAULT;
    (v4.is_some() || v6.is_some()).then(|| (v4.unwrap_or(default.v4()), v6.unwrap_or(default.v6())))
}
