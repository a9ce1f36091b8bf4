//! The attributes' options, parsed and validated with the same grammar as at run time.

use std::str::FromStr;

use proc_macro2::{Span, TokenStream};
use syn::{
    LitBool, LitFloat, LitInt, LitStr, bracketed, meta::ParseNestedMeta, punctuated::Punctuated,
};
use tollgate::{Algorithm, Dimension, Rule, parse_duration};

/// One `#[rate_limit(...)]`: one limiter.
pub(crate) struct RateLimit {
    pub(crate) by: LitStr,
    pub(crate) dimension: Dimension,
    pub(crate) rules: Vec<LitStr>,
    pub(crate) name: Option<LitStr>,
    pub(crate) algorithm: Option<LitStr>,
    pub(crate) blocklist: Option<LitStr>,
    pub(crate) scope: Option<LitStr>,
    pub(crate) message: Option<LitStr>,
    /// `ipv4_prefix`, validated (0 to 32).
    pub(crate) ipv4_prefix: Option<u8>,
    /// `ipv6_prefix`, validated (0 to 128).
    pub(crate) ipv6_prefix: Option<u8>,
    /// `shadow = true`: a dry run (counted and reported, never denying).
    pub(crate) shadow: bool,
    /// `warn_at = 0.8`, validated (above 0, at most 1).
    pub(crate) warn_at: Option<f64>,
    /// `soft = ["..."]`: rules that never deny (see `Limiter::with_soft_rules`).
    pub(crate) soft: Vec<LitStr>,
    /// `count = "failures"` or `"successes"` (`"all"`, the default, is `None`).
    pub(crate) count: Option<LitStr>,
    /// `concurrent = N`: a concurrency limiter (its rule is in `rules`).
    pub(crate) concurrent: bool,
    /// `overrides = true`: identities may get limits of their own (see
    /// `Limiter::with_overrides`).
    pub(crate) overrides: bool,
    /// `cost = "expr"`: the units a call is checked for, an expression over the arguments.
    pub(crate) cost: Option<(syn::Expr, Span)>,
    /// `settle = "path"`: a function of the call's result giving its real cost
    /// (`Option<u64>`; `None` keeps the check's).
    pub(crate) settle: Option<(syn::Expr, Span)>,
    /// `max_delay = "200ms"`: how long a call may wait for its GCRA units (µs), validated.
    pub(crate) max_delay: Option<(u64, Span)>,
}

impl RateLimit {
    /// The limiter's name: `name`, or the dimension's text.
    pub(crate) fn limiter_name(&self) -> (String, Span) {
        match &self.name {
            Some(name) => (name.value(), name.span()),
            None => (self.dimension.to_string(), self.by.span()),
        }
    }
}

/// `#[prevent_duplicate(...)]`.
pub(crate) struct PreventDuplicate {
    pub(crate) by: LitStr,
    pub(crate) ttl: LitStr,
    pub(crate) global: bool,
    pub(crate) scope: Option<LitStr>,
    pub(crate) args: Option<Vec<LitStr>>,
}

const RATE_LIMIT_OPTIONS: &str = "by, rules, name, algorithm, blocklist, scope, message, ipv4_prefix, ipv6_prefix, shadow, warn_at, soft, overrides, cost, settle, max_delay, count, concurrent, lease_ttl";
const DUPLICATE_OPTIONS: &str = "by, ttl, global, scope, args";

fn set<T>(
    slot: &mut Option<T>,
    value: T,
    meta: &ParseNestedMeta<'_>,
    name: &str,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(meta.error(format!("`{name}` is given twice")));
    }
    *slot = Some(value);
    Ok(())
}

fn non_empty(lit: LitStr, what: &str) -> syn::Result<LitStr> {
    if lit.value().trim().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{what}` cannot be empty"),
        ));
    }
    Ok(lit)
}

fn string_list(meta: &ParseNestedMeta<'_>) -> syn::Result<Vec<LitStr>> {
    let value = meta.value()?;
    let content;
    let brackets = bracketed!(content in value);
    let list = Punctuated::<LitStr, syn::Token![,]>::parse_terminated(&content)?;
    not_empty(list.into_iter().collect(), brackets, meta)
}

/// `list`, or an error at its brackets when it is empty (one that names the option).
fn not_empty(
    list: Vec<LitStr>,
    brackets: syn::token::Bracket,
    meta: &ParseNestedMeta<'_>,
) -> syn::Result<Vec<LitStr>> {
    if !list.is_empty() {
        return Ok(list);
    }
    let name = meta
        .path
        .get_ident()
        .map(ToString::to_string)
        .unwrap_or_default();
    let hint = match name.as_str() {
        "rules" => "give at least one, e.g. \"10/1m\"",
        "args" => "omit it to fingerprint every argument",
        _ => "give at least one",
    };
    Err(syn::Error::new(
        brackets.span.join(),
        format!("`{name}` is empty; {hint}"),
    ))
}

/// `rules`: a list (`["1/1m", "10 per hour"]`) or one string of rules separated by `;`
/// (`"1/1m; 10 per hour"`), as one literal per rule.
fn rule_list(meta: &ParseNestedMeta<'_>) -> syn::Result<Vec<LitStr>> {
    let value = meta.value()?;
    if !value.peek(LitStr) {
        let content;
        let brackets = bracketed!(content in value);
        let list = Punctuated::<LitStr, syn::Token![,]>::parse_terminated(&content)?;
        return not_empty(list.into_iter().collect(), brackets, meta);
    }
    let lit: LitStr = value.parse()?;
    Ok(lit
        .value()
        .split(';')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| LitStr::new(part, lit.span()))
        .collect())
}

/// A duration option (`"5s"`): checked now, parsed again at run time.
fn duration(lit: &LitStr, what: &str) -> syn::Result<()> {
    match parse_duration(&lit.value()) {
        Ok(d) if d.is_zero() => Err(syn::Error::new(
            lit.span(),
            format!("`{what}` must be at least 1ms"),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(syn::Error::new(
            lit.span(),
            format!("invalid `{what}`: {e}"),
        )),
    }
}

/// A prefix length option (`ipv6_prefix = 48`): at most `max` bits.
fn prefix_length(lit: &LitInt, what: &str, max: u8) -> syn::Result<u8> {
    match lit.base10_parse::<u8>() {
        Ok(len) if len <= max => Ok(len),
        _ => Err(syn::Error::new(
            lit.span(),
            format!(
                "`{what}` is a prefix length from 0 to {max}, not {}",
                lit.base10_digits()
            ),
        )),
    }
}

/// `#[rate_limit(...)]`'s options as written, each at most once.
#[derive(Default)]
struct RateLimitOptions {
    by: Option<LitStr>,
    rules: Option<Vec<LitStr>>,
    name: Option<LitStr>,
    algorithm: Option<LitStr>,
    blocklist: Option<LitStr>,
    scope: Option<LitStr>,
    message: Option<LitStr>,
    ipv4_prefix: Option<LitInt>,
    ipv6_prefix: Option<LitInt>,
    shadow: Option<LitBool>,
    warn_at: Option<LitFloat>,
    soft: Option<Vec<LitStr>>,
    overrides: Option<LitBool>,
    cost: Option<LitStr>,
    settle: Option<LitStr>,
    max_delay: Option<LitStr>,
    count: Option<LitStr>,
    concurrent: Option<LitInt>,
    lease_ttl: Option<LitStr>,
}

impl RateLimitOptions {
    /// Reads the options, refusing an unknown one or one given twice.
    fn parse(tokens: TokenStream) -> syn::Result<RateLimitOptions> {
        let mut o = RateLimitOptions::default();
        let parser = syn::meta::parser(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            let lit = |meta: &ParseNestedMeta<'_>| meta.value()?.parse::<LitStr>();
            match key.as_str() {
                "by" => set(&mut o.by, lit(&meta)?, &meta, "by"),
                "rules" => set(&mut o.rules, rule_list(&meta)?, &meta, "rules"),
                "name" => set(&mut o.name, non_empty(lit(&meta)?, "name")?, &meta, "name"),
                "algorithm" => set(&mut o.algorithm, lit(&meta)?, &meta, "algorithm"),
                "blocklist" => set(&mut o.blocklist, lit(&meta)?, &meta, "blocklist"),
                "scope" => set(
                    &mut o.scope,
                    non_empty(lit(&meta)?, "scope")?,
                    &meta,
                    "scope",
                ),
                "message" => set(&mut o.message, lit(&meta)?, &meta, "message"),
                "ipv4_prefix" => set(
                    &mut o.ipv4_prefix,
                    meta.value()?.parse::<LitInt>()?,
                    &meta,
                    "ipv4_prefix",
                ),
                "ipv6_prefix" => set(
                    &mut o.ipv6_prefix,
                    meta.value()?.parse::<LitInt>()?,
                    &meta,
                    "ipv6_prefix",
                ),
                "shadow" => set(
                    &mut o.shadow,
                    meta.value()?.parse::<LitBool>()?,
                    &meta,
                    "shadow",
                ),
                "warn_at" => set(
                    &mut o.warn_at,
                    meta.value()?.parse::<LitFloat>()?,
                    &meta,
                    "warn_at",
                ),
                "soft" => set(&mut o.soft, rule_list(&meta)?, &meta, "soft"),
                "overrides" => set(
                    &mut o.overrides,
                    meta.value()?.parse::<LitBool>()?,
                    &meta,
                    "overrides",
                ),
                "count" => set(&mut o.count, lit(&meta)?, &meta, "count"),
                "cost" => set(&mut o.cost, lit(&meta)?, &meta, "cost"),
                "settle" => set(&mut o.settle, lit(&meta)?, &meta, "settle"),
                "max_delay" => set(&mut o.max_delay, lit(&meta)?, &meta, "max_delay"),
                "concurrent" => set(
                    &mut o.concurrent,
                    meta.value()?.parse::<LitInt>()?,
                    &meta,
                    "concurrent",
                ),
                "lease_ttl" => set(&mut o.lease_ttl, lit(&meta)?, &meta, "lease_ttl"),
                _ => Err(meta.error(format!(
                    "unknown option for #[rate_limit] (expected {RATE_LIMIT_OPTIONS})"
                ))),
            }
        });
        syn::parse::Parser::parse2(parser, tokens)?;
        Ok(o)
    }

    /// The limiter's rules: `rules`, or for `concurrent = N` (with `lease_ttl`, default 5m)
    /// the rule `N/TTL concurrent`; exactly one of them.
    fn rules(&self, span: Span) -> syn::Result<Vec<LitStr>> {
        let rules = match (&self.rules, &self.concurrent) {
            (Some(_), Some(n)) => {
                return Err(syn::Error::new(
                    n.span(),
                    "a concurrency limiter (`concurrent`) has no `rules`: give rate rules a #[rate_limit] of their own",
                ));
            }
            (Some(rules), None) => {
                if let Some(ttl) = &self.lease_ttl {
                    return Err(syn::Error::new(
                        ttl.span(),
                        "`lease_ttl` goes with `concurrent = N`",
                    ));
                }
                rules.clone()
            }
            (None, Some(n)) => {
                if n.base10_parse::<u64>().ok() == Some(0) {
                    return Err(syn::Error::new(
                        n.span(),
                        "`concurrent` must be at least 1: a limit of 0 admits nothing",
                    ));
                }
                if let Some(a) = &self.algorithm {
                    return Err(syn::Error::new(
                        a.span(),
                        "a concurrency limiter counts leases: it takes no `algorithm`",
                    ));
                }
                let ttl = self
                    .lease_ttl
                    .as_ref()
                    .map_or_else(|| "5m".to_owned(), LitStr::value);
                let at = self.lease_ttl.as_ref().map_or(n.span(), LitStr::span);
                vec![LitStr::new(
                    &format!("{}/{ttl} concurrent", n.base10_digits()),
                    at,
                )]
            }
            (None, None) => {
                return Err(syn::Error::new(
                    span,
                    "#[rate_limit] needs `rules`, e.g. rules = [\"1/1m\", \"10/1h\"] (or `concurrent = N`)",
                ));
            }
        };
        if rules.is_empty() {
            return Err(syn::Error::new(
                span,
                "`rules` is empty; give at least one, e.g. \"10/1m\"",
            ));
        }
        Ok(rules)
    }

    /// Checks each rule (and the algorithm) as the library will read them, none twice.
    fn check_rules(&self, rules: &[LitStr]) -> syn::Result<()> {
        let algorithm = match &self.algorithm {
            Some(lit) => Some(
                Algorithm::from_str(&lit.value()).map_err(|e| syn::Error::new(lit.span(), e))?,
            ),
            None => None,
        };
        let mut seen: Vec<Rule> = Vec::new();
        for lit in rules {
            let rule = Rule::from_str(&lit.value())
                .map_err(|e| syn::Error::new(lit.span(), format!("invalid rule {e}")))?;
            let rule = match algorithm {
                Some(a) => rule.with_algorithm(a),
                None => rule,
            };
            if seen.contains(&rule) {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("rule {rule} is listed twice in this limiter"),
                ));
            }
            seen.push(rule);
        }
        Ok(())
    }

    /// The IP prefixes, for `by = "ip"` only.
    fn prefixes(
        &self,
        by: &LitStr,
        dimension: &Dimension,
    ) -> syn::Result<(Option<u8>, Option<u8>)> {
        if let Some(lit) = self.ipv4_prefix.as_ref().or(self.ipv6_prefix.as_ref()) {
            if dimension.prefix().is_none() {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`ipv4_prefix` and `ipv6_prefix` apply to by = \"ip\", not by = {:?}",
                        by.value()
                    ),
                ));
            }
        }
        let ipv4 = match &self.ipv4_prefix {
            Some(lit) => Some(prefix_length(lit, "ipv4_prefix", 32)?),
            None => None,
        };
        let ipv6 = match &self.ipv6_prefix {
            Some(lit) => Some(prefix_length(lit, "ipv6_prefix", 128)?),
            None => None,
        };
        Ok((ipv4, ipv6))
    }

    /// What `count` counts: `None` for every call (`"all"`, the default).
    fn count(&self) -> syn::Result<Option<LitStr>> {
        match &self.count {
            Some(lit) => match lit.value().as_str() {
                "all" => Ok(None),
                "failures" | "successes" => Ok(Some(lit.clone())),
                other => Err(syn::Error::new(
                    lit.span(),
                    format!("`count` is \"all\", \"failures\" or \"successes\", not {other:?}"),
                )),
            },
            None => Ok(None),
        }
    }
}

pub(crate) fn parse_rate_limit(tokens: TokenStream, span: Span) -> syn::Result<RateLimit> {
    let options = RateLimitOptions::parse(tokens)?;
    let by = options
        .by
        .clone()
        .ok_or_else(|| syn::Error::new(span, "#[rate_limit] needs `by`, e.g. by = \"ip\""))?;
    let dimension = Dimension::from_str(&by.value()).map_err(|e| syn::Error::new(by.span(), e))?;
    let rules = options.rules(span)?;
    options.check_rules(&rules)?;
    if let Some(lit) = &options.blocklist {
        duration(lit, "blocklist")?;
    }
    let (ipv4_prefix, ipv6_prefix) = options.prefixes(&by, &dimension)?;
    let count = options.count()?;
    let soft = options.soft.clone().unwrap_or_default();
    options.check_rules(&soft)?;
    if let (Some(lit), Some(_)) = (soft.first(), &options.concurrent) {
        return Err(syn::Error::new(
            lit.span(),
            "a concurrency limiter has no `soft` rules: give them a #[rate_limit] of their own",
        ));
    }
    if let Some(lit) = soft
        .iter()
        .find(|s| rules.iter().any(|r| r.value() == s.value()))
    {
        return Err(syn::Error::new(
            lit.span(),
            "this rule is both enforced and soft",
        ));
    }
    let warn_at = match &options.warn_at {
        None => None,
        Some(lit) => {
            let fraction: f64 = lit.base10_parse()?;
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(syn::Error::new(
                    lit.span(),
                    "`warn_at` is a fraction of each rule's limit above 0 and at most 1, e.g. 0.8",
                ));
            }
            Some(fraction)
        }
    };
    Ok(RateLimit {
        warn_at,
        soft,
        overrides: options.overrides.as_ref().is_some_and(LitBool::value),
        cost: expression(
            options.cost.as_ref(),
            "cost",
            "an expression of the arguments, e.g. \"req.max_tokens\"",
        )?,
        max_delay: match &options.max_delay {
            None => None,
            Some(lit) => {
                duration(lit, "max_delay")?;
                let d = parse_duration(&lit.value()).unwrap_or_default();
                Some((u64::try_from(d.as_micros()).unwrap_or(u64::MAX), lit.span()))
            }
        },
        settle: expression(
            options.settle.as_ref(),
            "settle",
            "a function of the result, e.g. \"tokens_used\" (fn(&Result<T, E>) -> Option<u64>)",
        )?,
        by,
        dimension,
        rules,
        concurrent: options.concurrent.is_some(),
        name: options.name,
        algorithm: options.algorithm,
        blocklist: options.blocklist,
        scope: options.scope,
        message: options.message,
        ipv4_prefix,
        ipv6_prefix,
        shadow: options.shadow.is_some_and(|b| b.value),
        count,
    })
}

pub(crate) fn parse_prevent_duplicate(
    tokens: TokenStream,
    span: Span,
) -> syn::Result<PreventDuplicate> {
    let (mut by, mut ttl, mut global, mut scope, mut args) = (None, None, None, None, None);
    let parser = syn::meta::parser(|meta| {
        let key = meta
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        match key.as_str() {
            "by" => set(&mut by, meta.value()?.parse::<LitStr>()?, &meta, "by"),
            "ttl" => set(&mut ttl, meta.value()?.parse::<LitStr>()?, &meta, "ttl"),
            "global" => set(
                &mut global,
                meta.value()?.parse::<LitBool>()?,
                &meta,
                "global",
            ),
            "scope" => set(
                &mut scope,
                non_empty(meta.value()?.parse()?, "scope")?,
                &meta,
                "scope",
            ),
            "args" => set(&mut args, string_list(&meta)?, &meta, "args"),
            _ => Err(meta.error(format!(
                "unknown option for #[prevent_duplicate] (expected {DUPLICATE_OPTIONS})"
            ))),
        }
    });
    syn::parse::Parser::parse2(parser, tokens)?;

    let by: LitStr = by.ok_or_else(|| {
        syn::Error::new(
            span,
            "#[prevent_duplicate] needs `by`: args, ip, user_id or user_name",
        )
    })?;
    match by.value().as_str() {
        "args" | "ip" | "user_id" | "user_name" => {}
        "key" | "idempotency-key" => {
            return Err(syn::Error::new(
                by.span(),
                "idempotency keys live in the request: use tollgate_tower::DuplicateLayer::idempotency_key on the route",
            ));
        }
        other => {
            return Err(syn::Error::new(
                by.span(),
                format!(
                    "unknown `by` {other:?} for #[prevent_duplicate] (use args, ip, user_id or user_name)"
                ),
            ));
        }
    }
    let ttl = ttl.unwrap_or_else(|| LitStr::new("1s", span));
    duration(&ttl, "ttl")?;
    if args.is_some() && by.value() != "args" {
        return Err(syn::Error::new(
            by.span(),
            "`args` selects the arguments to fingerprint; it needs by = \"args\"",
        ));
    }
    Ok(PreventDuplicate {
        by,
        ttl,
        global: global.is_some_and(|b| b.value),
        scope,
        args,
    })
}

/// The Rust expression in option `name`'s string, if given.
fn expression(
    lit: Option<&LitStr>,
    name: &str,
    expected: &str,
) -> syn::Result<Option<(syn::Expr, Span)>> {
    let Some(lit) = lit else { return Ok(None) };
    match lit.parse::<syn::Expr>() {
        Ok(expr) => Ok(Some((expr, lit.span()))),
        Err(e) => Err(syn::Error::new(
            lit.span(),
            format!("`{name}` is {expected}: {e}"),
        )),
    }
}
