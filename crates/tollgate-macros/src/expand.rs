//! Code generation: one atomic rate-limit check for every `#[rate_limit]` on the function,
//! then the duplicate guard around the body.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::{Attribute, FnArg, Ident, ItemFn, Meta, Pat, ReturnType, Type, spanned::Spanned};
use tollgate::Dimension;

use crate::options::{self, PreventDuplicate, RateLimit};

/// Which attribute the compiler invoked.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    RateLimit,
    PreventDuplicate,
}

impl Kind {
    fn of(attr: &Attribute) -> Option<Kind> {
        match attr.path().segments.last()?.ident.to_string().as_str() {
            "rate_limit" => Some(Kind::RateLimit),
            "prevent_duplicate" => Some(Kind::PreventDuplicate),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::RateLimit => "#[rate_limit]",
            Kind::PreventDuplicate => "#[prevent_duplicate]",
        }
    }
}

/// The expansion, or the error followed by the function without its tollgate attributes, so
/// that the error is the only one reported (no "unused import" or "unknown function" noise).
pub(crate) fn expand(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    match generate(kind, args, item.clone()) {
        Ok(tokens) => tokens,
        Err(error) => {
            let mut tokens = error.into_compile_error();
            if let Ok(mut item) = syn::parse2::<ItemFn>(item) {
                item.attrs.retain(|a| Kind::of(a).is_none());
                tokens.extend(item.into_token_stream());
            }
            tokens
        }
    }
}

fn generate(kind: Kind, args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut item: ItemFn = syn::parse2(item)
        .map_err(|e| syn::Error::new(e.span(), format!("{} goes on an async fn", kind.name())))?;

    // The first attribute the compiler expands takes every tollgate attribute below it, so
    // stacked limiters become one atomic check and the order of checks does not depend on the
    // order of attributes: rate limits first (a refused request takes no lock), then the guard.
    let mut found = vec![(kind, args, Span::call_site())];
    let mut kept = Vec::with_capacity(item.attrs.len());
    for attr in std::mem::take(&mut item.attrs) {
        match Kind::of(&attr) {
            Some(k) => {
                let tokens = match &attr.meta {
                    Meta::List(list) => list.tokens.clone(),
                    Meta::Path(_) => TokenStream::new(),
                    Meta::NameValue(nv) => {
                        return Err(syn::Error::new(
                            nv.span(),
                            format!("write {}(...), not {} = ...", k.name(), k.name()),
                        ));
                    }
                };
                found.push((k, tokens, attr.path().span()));
            }
            None => kept.push(attr),
        }
    }
    item.attrs = kept;

    let mut limits: Vec<RateLimit> = Vec::new();
    let mut duplicate: Option<PreventDuplicate> = None;
    for (k, tokens, span) in found {
        match k {
            Kind::RateLimit => limits.push(options::parse_rate_limit(tokens, span)?),
            Kind::PreventDuplicate => {
                if duplicate.is_some() {
                    return Err(syn::Error::new(
                        span,
                        "#[prevent_duplicate] can be given once per function",
                    ));
                }
                duplicate = Some(options::parse_prevent_duplicate(tokens, span)?);
            }
        }
    }

    check_signature(&item, kind)?;
    let bound = bound_arguments(&item);
    // The function's own path, read at run time from an item declared in its body: a method's
    // names its type (`app::Sms::send`, `<app::Sms as app::Notify>::send`), where the module
    // path and the name alone would give two types' `send` one scope, one counter.
    let default_scope = quote!(&::tollgate_tower::__private::scope_of(
        ::std::any::type_name_of_val(&__tollgate_scope)
    ));

    let (limit_check, counted) = if limits.is_empty() {
        (TokenStream::new(), false)
    } else {
        rate_limit_check(&limits, &bound, &default_scope)?
    };

    let block = &item.block;
    let output = match &item.sig.output {
        ReturnType::Type(_, ty) => ty.as_ref().clone(),
        ReturnType::Default => unreachable!("checked by check_signature"),
    };
    let rest = match &duplicate {
        None => quote!(#block),
        Some(guard) => {
            let guarded = duplicate_guard(guard, &bound, &default_scope, &output, block, counted)?;
            quote!({ #guarded })
        }
    };
    let body = if counted {
        // The outcome decides whether the charge stays (see `count`); a call the duplicate
        // guard refused never ran, so it is no outcome: its charge is given back.
        let fake_return = pin_return(&output);
        quote! {
            #limit_check
            let __tollgate_refused = ::core::sync::atomic::AtomicBool::new(false);
            let __tollgate_refused_ref = &__tollgate_refused;
            let __tollgate_counted = async move {
                #fake_return
                #rest
            }
            .await;
            if __tollgate_refused.load(::core::sync::atomic::Ordering::Relaxed) {
                __tollgate_charge.refused().await;
            } else {
                __tollgate_charge
                    .finish(
                        ::tollgate_tower::__private::Outcome::succeeded(&__tollgate_counted),
                        __tollgate_settle.and_then(|settle| settle(&__tollgate_counted)),
                    )
                    .await;
            }
            __tollgate_counted
        }
    } else {
        quote! {
            #limit_check
            #rest
        }
    };
    let attrs = &item.attrs;
    let vis = &item.vis;
    let sig = &item.sig;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #[allow(dead_code)]
            fn __tollgate_scope() {}
            #body
        }
    })
}

fn check_signature(item: &ItemFn, kind: Kind) -> syn::Result<()> {
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            format!(
                "{} works on async fns only: make `{}` async",
                kind.name(),
                sig.ident
            ),
        ));
    }
    let refusal = |span: Span| {
        syn::Error::new(
            span,
            format!(
                "a {} fn must return Result<T, E> with E: From<tollgate_tower::Rejection>, \
                 so that a refusal can be returned",
                kind.name()
            ),
        )
    };
    match &sig.output {
        ReturnType::Default => Err(refusal(sig.paren_token.span.join())),
        ReturnType::Type(_, ty) if matches!(**ty, Type::ImplTrait(_)) => Err(refusal(ty.span())),
        // A type that is surely not a Result (`&'static str`, `String`, `Json<T>`, `()`): said
        // here, rather than as a type mismatch inside the expansion.
        ReturnType::Type(_, ty) if not_a_result(ty) => Err(syn::Error::new(
            ty.span(),
            format!(
                "a {} fn must return Result<T, E> with E: From<tollgate_tower::Rejection>, so \
                 that a refusal can be returned; this one returns `{}`: write \
                 `Result<{}, tollgate_tower::Rejection>` (Rejection is an axum response)",
                kind.name(),
                type_text(ty),
                type_text(ty),
            ),
        )),
        ReturnType::Type(..) => Ok(()),
    }
}

/// A type as written, without the token printer's spaces (`&'static str`, `Json<Vec<u8>>`).
fn type_text(ty: &Type) -> String {
    let mut text = ty.to_token_stream().to_string();
    for (spaced, tight) in [
        ("& ", "&"),
        (" <", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" ,", ","),
        (" :: ", "::"),
    ] {
        text = text.replace(spaced, tight);
    }
    text
}

/// A return type that cannot be a `Result` (an alias of one, `AppResult<T>`, can).
fn not_a_result(ty: &Type) -> bool {
    match ty {
        Type::Reference(_) | Type::Tuple(_) | Type::Array(_) | Type::Slice(_) | Type::Never(_) => {
            true
        }
        Type::Path(path) => path.path.segments.last().is_some_and(|last| {
            matches!(
                last.ident.to_string().as_str(),
                "String"
                    | "Json"
                    | "Html"
                    | "StatusCode"
                    | "Response"
                    | "Vec"
                    | "Option"
                    | "Bytes"
                    | "Redirect"
                    | "bool"
            )
        }),
        Type::Paren(inner) => not_a_result(&inner.elem),
        _ => false,
    }
}

/// The names the function's parameters bind (`x: T`, `Json(body): Json<T>`, ...), in order.
fn bound_arguments(item: &ItemFn) -> Vec<Ident> {
    fn walk(pat: &Pat, out: &mut Vec<Ident>) {
        match pat {
            Pat::Ident(p) => {
                out.push(p.ident.clone());
                if let Some((_, sub)) = &p.subpat {
                    walk(sub, out);
                }
            }
            Pat::TupleStruct(p) => p.elems.iter().for_each(|e| walk(e, out)),
            Pat::Tuple(p) => p.elems.iter().for_each(|e| walk(e, out)),
            Pat::Struct(p) => p.fields.iter().for_each(|f| walk(&f.pat, out)),
            Pat::Reference(p) => walk(&p.pat, out),
            Pat::Type(p) => walk(&p.pat, out),
            Pat::Slice(p) => p.elems.iter().for_each(|e| walk(e, out)),
            Pat::Paren(p) => walk(&p.pat, out),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for input in &item.sig.inputs {
        if let FnArg::Typed(typed) = input {
            walk(&typed.pat, &mut out);
        }
    }
    out
}

fn find_bound<'a>(bound: &'a [Ident], name: &str) -> Option<&'a Ident> {
    bound.iter().find(|i| *i == name)
}

fn opt(lit: Option<&syn::LitStr>) -> TokenStream {
    match lit {
        Some(lit) => quote!(::core::option::Option::Some(#lit)),
        None => quote!(::core::option::Option::None),
    }
}

/// Pins an async block's return type to the function's `output`, so `?` in the body converts
/// errors as it would without the macro (the trick tracing's #[instrument] uses).
fn pin_return(output: &Type) -> TokenStream {
    if output.to_token_stream().to_string().contains("impl ") {
        return TokenStream::new();
    }
    quote! {
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::let_unit_value,
            clippy::unreachable,
            clippy::empty_loop
        )]
        if false {
            let __tollgate_never: #output = loop {};
            return __tollgate_never;
        }
    }
}

/// The one check of every `#[rate_limit]`, and whether it keeps a charge to settle once the
/// outcome is known (`count`): then it binds `__tollgate_charge`.
fn rate_limit_check(
    limits: &[RateLimit],
    bound: &[Ident],
    default_scope: &TokenStream,
) -> syn::Result<(TokenStream, bool)> {
    let OneCheck {
        count,
        cost,
        settle,
        max_delay,
    } = one_check(limits)?;
    let mut names: Vec<String> = Vec::new();
    let mut scope: Option<&syn::LitStr> = None;
    let mut limiters = Vec::new();
    let mut args = Vec::new();
    for limit in limits {
        let (name, span) = limit.limiter_name();
        if names.contains(&name) {
            return Err(syn::Error::new(
                span,
                format!("two limiters are named {name:?}; give one a `name`"),
            ));
        }
        names.push(name);
        if let Some(s) = &limit.scope {
            match scope {
                Some(first) if first.value() != s.value() => {
                    return Err(syn::Error::new(
                        s.span(),
                        format!(
                            "the limiters of one function share one scope; {:?} was given above",
                            first.value()
                        ),
                    ));
                }
                _ => scope = Some(s),
            }
        }
        if let Dimension::Arg(arg) = &limit.dimension {
            let Some(ident) = find_bound(bound, arg) else {
                return Err(syn::Error::new(
                    limit.by.span(),
                    format!("no argument named `{arg}` to count by"),
                ));
            };
            if !args.iter().any(|(n, _): &(String, TokenStream)| n == arg) {
                let value = quote_spanned! {ident.span()=>
                    (#arg, ::std::string::ToString::to_string(&#ident))
                };
                args.push((arg.clone(), value));
            }
        }
        limiters.push(limiter_tokens(limit));
    }
    build_now(limits)?;
    let scope = match scope {
        Some(s) => s.to_token_stream(),
        None => default_scope.clone(),
    };
    let args = args.iter().map(|(_, value)| value);
    let policy = quote! {
        static __TOLLGATE_POLICY: ::std::sync::LazyLock<::tollgate_tower::__private::Policy> =
            ::std::sync::LazyLock::new(|| {
                ::tollgate_tower::__private::policy(#scope, ::std::vec![#(#limiters),*])
            });
        let __tollgate_args: ::std::vec::Vec<(&'static str, ::std::string::String)> =
            ::std::vec![#(#args),*];
    };
    let concurrent = limits.iter().any(|l| l.concurrent);
    if count.is_none() && !concurrent && settle.is_none() {
        return Ok((
            quote! {
                {
                    #policy
                    let __tollgate_cost: u64 = #cost;
                    if let ::core::result::Result::Err(__tollgate_rejection) =
                        ::tollgate_tower::__private::check(&__TOLLGATE_POLICY, __tollgate_args, (__tollgate_cost, #max_delay)).await
                    {
                        return ::core::result::Result::Err(::core::convert::From::from(__tollgate_rejection));
                    }
                }
            },
            false,
        ));
    }
    // 0: every call counts; 1: failures only; 2: successes only.
    let mode: u8 = match count.map(syn::LitStr::value).as_deref() {
        Some("failures") => 1,
        Some("successes") => 2,
        _ => 0,
    };
    let settle = match settle {
        Some((f, span)) => quote_spanned! {*span=>
            ::core::option::Option::Some(#f as fn(&_) -> ::core::option::Option<u64>)
        },
        None => quote!(::core::option::Option::<fn(&_) -> ::core::option::Option<u64>>::None),
    };
    Ok((
        quote! {
            // What the call's result says it cost, once known (`settle`).
            let __tollgate_settle = #settle;
            let __tollgate_charge = {
                #policy
                let __tollgate_cost: u64 = #cost;
                match ::tollgate_tower::__private::check_charged(&__TOLLGATE_POLICY, __tollgate_args, #mode, (__tollgate_cost, #max_delay)).await {
                    ::core::result::Result::Ok(charge) => charge,
                    ::core::result::Result::Err(__tollgate_rejection) => {
                        return ::core::result::Result::Err(::core::convert::From::from(__tollgate_rejection));
                    }
                }
            };
        },
        true,
    ))
}

/// The options of a function's one check, given once for all its limiters: `count`, `cost`,
/// `settle` and `max_delay`, as tokens.
struct OneCheck<'a> {
    count: Option<&'a syn::LitStr>,
    cost: TokenStream,
    settle: Option<&'a (syn::Expr, Span)>,
    max_delay: TokenStream,
}

fn one_check(limits: &[RateLimit]) -> syn::Result<OneCheck<'_>> {
    // One check, so one `count` for all the function's limiters.
    let mut count: Option<&syn::LitStr> = None;
    for c in limits.iter().filter_map(|l| l.count.as_ref()) {
        match count {
            Some(first) if first.value() != c.value() => {
                return Err(syn::Error::new(
                    c.span(),
                    format!(
                        "the limiters of one function are checked, and counted, together; count = {:?} was given above",
                        first.value()
                    ),
                ));
            }
            _ => count = Some(c),
        }
    }
    // One check, so one cost and one settlement for all the function's limiters.
    let mut cost: Option<&(syn::Expr, Span)> = None;
    let mut settle: Option<&(syn::Expr, Span)> = None;
    for (slot, given, name) in limits.iter().flat_map(|l| {
        [
            (0, l.cost.as_ref(), "cost"),
            (1, l.settle.as_ref(), "settle"),
        ]
    }) {
        let Some(given) = given else { continue };
        let taken = if slot == 0 { &mut cost } else { &mut settle };
        if taken.is_some() {
            return Err(syn::Error::new(
                given.1,
                format!("the limiters of one function are checked together: give `{name}` once"),
            ));
        }
        *taken = Some(given);
    }
    let cost = match cost {
        Some((expr, span)) => quote_spanned!(*span=> #expr),
        None => quote!(1u64),
    };
    // One check, so one delay.
    let mut max_delay: Option<u64> = None;
    for (us, span) in limits.iter().filter_map(|l| l.max_delay) {
        if max_delay.is_some_and(|first| first != us) {
            return Err(syn::Error::new(
                span,
                "the limiters of one function are checked together: give `max_delay` once",
            ));
        }
        max_delay = Some(us);
    }
    let max_delay = match max_delay {
        Some(us) => quote!(::core::option::Option::Some(::core::time::Duration::from_micros(#us))),
        None => quote!(::core::option::Option::None),
    };
    Ok(OneCheck {
        count,
        cost,
        settle,
        max_delay,
    })
}

/// The expression building `limit`'s limiter.
fn limiter_tokens(limit: &RateLimit) -> TokenStream {
    let by = &limit.by;
    let rules = &limit.rules;
    let algorithm = opt(limit.algorithm.as_ref());
    let name = opt(limit.name.as_ref());
    let blocklist = opt(limit.blocklist.as_ref());
    let message = opt(limit.message.as_ref());
    let prefix = match tollgate::macro_support::prefix(limit.ipv4_prefix, limit.ipv6_prefix) {
        None => quote!(::core::option::Option::None),
        Some((v4, v6)) => quote!(::core::option::Option::Some((#v4, #v6))),
    };
    let shadow = limit.shadow;
    let overrides = limit.overrides;
    let warn_at = match limit.warn_at {
        Some(f) => quote!(::core::option::Option::Some(#f)),
        None => quote!(::core::option::Option::None),
    };
    let soft = &limit.soft;
    quote! {
        ::tollgate_tower::__private::limiter(&::tollgate_tower::__private::LimiterSpec {
            by: #by,
            rules: &[#(#rules),*],
            algorithm: #algorithm,
            name: #name,
            blocklist: #blocklist,
            message: #message,
            prefix: #prefix,
            shadow: #shadow,
            overrides: #overrides,
            warn_at: #warn_at,
            soft: &[#(#soft),*],
        })
    }
}

/// Builds the function's policy now, as it will be built at run time, so that what only the
/// whole policy can tell (a log too long, a calendar rule with another algorithm, two limiters
/// of one name) is an error at the attribute, not a panic at every call.
fn build_now(limits: &[RateLimit]) -> syn::Result<()> {
    let mut limiters = Vec::new();
    for limit in limits {
        let text = |lit: Option<&syn::LitStr>| lit.map(syn::LitStr::value);
        let (rules, soft): (Vec<String>, Vec<String>) = (
            limit.rules.iter().map(syn::LitStr::value).collect(),
            limit.soft.iter().map(syn::LitStr::value).collect(),
        );
        let (algorithm, name, blocklist, message) = (
            text(limit.algorithm.as_ref()),
            text(limit.name.as_ref()),
            text(limit.blocklist.as_ref()),
            text(limit.message.as_ref()),
        );
        let spec = tollgate::macro_support::LimiterSpec {
            by: &limit.by.value(),
            rules: &rules.iter().map(String::as_str).collect::<Vec<_>>(),
            algorithm: algorithm.as_deref(),
            name: name.as_deref(),
            blocklist: blocklist.as_deref(),
            message: message.as_deref(),
            prefix: tollgate::macro_support::prefix(limit.ipv4_prefix, limit.ipv6_prefix),
            shadow: limit.shadow,
            overrides: limit.overrides,
            warn_at: limit.warn_at,
            soft: &soft.iter().map(String::as_str).collect::<Vec<_>>(),
        };
        let limiter = tollgate::macro_support::limiter(&spec)
            .map_err(|e| syn::Error::new(limit.by.span(), e))?;
        limiters.push(limiter);
    }
    let span = limits.first().map_or_else(Span::call_site, |l| l.by.span());
    tollgate::macro_support::policy("scope", limiters).map_err(|e| syn::Error::new(span, e))?;
    Ok(())
}

fn duplicate_guard(
    guard: &PreventDuplicate,
    bound: &[Ident],
    default_scope: &TokenStream,
    output: &Type,
    block: &syn::Block,
    counted: bool,
) -> syn::Result<TokenStream> {
    // Inside a counted call, a refusal tells the charge that the call never ran.
    let refused = counted.then(
        || quote!(__tollgate_refused_ref.store(true, ::core::sync::atomic::Ordering::Relaxed);),
    );
    let scope = match &guard.scope {
        Some(s) => s.to_token_stream(),
        None => default_scope.clone(),
    };
    let by = &guard.by;
    let ttl = &guard.ttl;
    let global = guard.global;
    let mut pushes = Vec::new();
    if by.value() == "args" {
        let chosen: Vec<&Ident> = match &guard.args {
            Some(list) => list
                .iter()
                .map(|lit| {
                    find_bound(bound, &lit.value()).ok_or_else(|| {
                        syn::Error::new(
                            lit.span(),
                            format!("no argument named `{}` to fingerprint", lit.value()),
                        )
                    })
                })
                .collect::<syn::Result<_>>()?,
            None => bound.iter().collect(),
        };
        for ident in chosen {
            let name = ident.to_string();
            pushes.push(quote_spanned! {ident.span()=>
                __tollgate_fingerprint.push(#name, &#ident);
            });
        }
    }
    let fake_return = pin_return(output);
    Ok(quote! {
        static __TOLLGATE_GUARD: ::std::sync::LazyLock<::tollgate_tower::__private::DuplicateGuard> =
            ::std::sync::LazyLock::new(|| {
                ::tollgate_tower::__private::guard(#scope, #by, #ttl, #global)
            });
        let __tollgate_fingerprint = {
            #[allow(unused_mut)]
            let mut __tollgate_fingerprint = ::tollgate_tower::__private::Args::new();
            #(#pushes)*
            __tollgate_fingerprint.fingerprint()
        };
        let __tollgate_held =
            match ::tollgate_tower::__private::acquire(&__TOLLGATE_GUARD, __tollgate_fingerprint).await {
                ::core::result::Result::Ok(held) => held,
                ::core::result::Result::Err(__tollgate_rejection) => {
                    #refused
                    return ::core::result::Result::Err(::core::convert::From::from(__tollgate_rejection));
                }
            };
        let __tollgate_result = async move {
            #fake_return
            #block
        }
        .await;
        __tollgate_held
            .finish(::tollgate_tower::__private::Outcome::succeeded(&__tollgate_result))
            .await;
        __tollgate_result
    })
}
