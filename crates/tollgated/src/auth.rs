//! Authentication by scope: bearer tokens compared in constant time, and failed attempts rate
//! limited per client address (and for all addresses together) by tollgate itself.
//!
//! Three scopes, each optionally behind its own token: `check` (check, peek, batches,
//! acquire), `refund` (refund, release, extend, the duplicate guard) and `admin` (reset, the
//! blocklist, who is limited). A scope's token is also accepted by the scopes below it: the
//! admin token opens everything. A refund scope without a token of its own takes the check
//! scope's; a scope without a token, and none below it, is open, but for admin, which is then
//! off.
//!
//! A client address gets `server.admin_failure_limit` failed attempts (missing or wrong
//! token); after that every admin request from it is refused with 429 until the window
//! lets a failure go, whatever token it carries, so guessing cannot go on at full speed and
//! a refused guess says nothing about the token. A correct token costs nothing; on the check
//! and refund scopes it is let in even from an address over its budget (their callers share
//! addresses: one of them without its token must not lock the others out).

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tollgate::{
    Algorithm, Dimension, Identity, Limiter, MemoryStore, OnError, Policy, Rule, Tollgate,
};

/// Client addresses whose failures are remembered at once; a bound on what a flood of
/// addresses can make the server hold.
const MAX_TRACKED_ADDRESSES: usize = 1 << 16;

/// Why an admin request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No token is configured: admin endpoints are off.
    Disabled,
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token that is not the admin token.
    Wrong,
    /// Too many failures from this address; retry after the duration.
    TooManyFailures(Duration),
}

/// What a caller may do; see the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scope {
    Check,
    Refund,
    Admin,
}

/// The tokens of the three scopes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tokens {
    pub(crate) check: Option<String>,
    pub(crate) refund: Option<String>,
    pub(crate) admin: Option<String>,
}

/// The scopes' tokens and the failed-attempt limiter.
pub(crate) struct Auth {
    /// SHA-256 of each scope's token (check, refund, admin): comparing fixed-length digests
    /// leaks neither the token's bytes nor its length through timing.
    digests: [Option<[u8; 32]>; 3],
    failures: Tollgate<MemoryStore>,
    /// Failures on admin endpoints: per address, and for all addresses together.
    policy: Policy,
    /// The same failures per address only (the first limiter of `policy`, on its counters).
    address: Policy,
    /// Failures on the check and refund scopes: per address only. A global budget there would
    /// let a few addresses' guesses lock every caller out of checking (tokens of 16 bytes or
    /// more are not guessed anyway).
    scoped: Policy,
    limit: Rule,
    /// The failure lines of the check and refund scopes, and of admin requests refused by the
    /// budget of all addresses together: once a second at most (an attacker rotating
    /// addresses, or knocking on once the global budget is spent, would write one a request).
    failure_log: crate::metrics::OncePerSecond,
}

/// The global failure budget is this many addresses' worth.
const GLOBAL_FACTOR: u64 = 20;

impl Auth {
    /// Admin endpoints guarded by `token` (none: disabled), allowing `failure_limit` failed
    /// attempts per client address.
    pub(crate) fn new(tokens: &Tokens, failure_limit: Rule) -> Auth {
        // Counted by GCRA, two integers a key at any limit: a sliding log's entries are
        // capped, and a large `admin_failure_limit` (times GLOBAL_FACTOR) would pass past it.
        // A calendar window keeps its fixed window (GCRA cannot count one, and it has no cap).
        let failure_limit = if failure_limit.calendar_window().is_none() {
            failure_limit.with_algorithm(Algorithm::Gcra)
        } else {
            failure_limit
        };
        let store = MemoryStore::builder()
            .max_keys(MAX_TRACKED_ADDRESSES)
            .build();
        // Only the memory store's capacity can fail a check; the token comparison still
        // stands then, so failing open costs the lockout, never the protection.
        let failures = Tollgate::new(store)
            .with_blocklist(false)
            .with_on_error(OnError::Allow);
        // Beside each address's budget, one for all of them: rotating addresses (or a whole
        // IPv6 network's /64s) buys no more guesses than GLOBAL_FACTOR addresses would.
        let all = Rule::new(
            failure_limit.limit().saturating_mul(GLOBAL_FACTOR),
            failure_limit.window(),
        )
        .map_or(failure_limit, |all| all.with_algorithm(Algorithm::Gcra));
        let per_address = Limiter::new(Dimension::Ip, [failure_limit]).with_name("failures");
        let policy = Policy::builder("tollgate_admin_auth")
            .limiter(per_address.clone())
            .limiter(Limiter::new(Dimension::Global, [all]).with_name("all_failures"))
            .build()
            .unwrap_or_else(|e| unreachable!("a one-rule policy is valid: {e}"));
        let address = Policy::builder("tollgate_admin_auth")
            .limiter(per_address)
            .build()
            .unwrap_or_else(|e| unreachable!("a one-rule policy is valid: {e}"));
        let scoped = Policy::builder("tollgate_scope_auth")
            .limiter(Limiter::new(Dimension::Ip, [failure_limit]).with_name("failures"))
            .build()
            .unwrap_or_else(|e| unreachable!("a one-rule policy is valid: {e}"));
        Auth {
            digests: [&tokens.check, &tokens.refund, &tokens.admin]
                .map(|t| t.as_deref().map(digest)),
            failures,
            policy,
            address,
            scoped,
            limit: failure_limit,
            failure_log: crate::metrics::OncePerSecond::default(),
        }
    }

    /// A token is configured: admin endpoints are on.
    pub(crate) fn enabled(&self) -> bool {
        self.digests[Scope::Admin as usize].is_some()
    }

    /// Whether `scope` asks for a token.
    pub(crate) fn guarded(&self, scope: Scope) -> bool {
        self.first_accepted(scope).is_some()
    }

    /// Whether `scope` has a token of its own (not one it takes from the scope below).
    pub(crate) fn has_own_token(&self, scope: Scope) -> bool {
        self.digests[scope as usize].is_some()
    }

    /// Where the tokens `scope` accepts start among the digests: its own, or where it has
    /// none, the nearest scope's below that has one (a refund scope left open beside a guarded
    /// check scope would open more than it guards); every higher scope's too. `None`: open
    /// (admin: disabled). Admin never takes a lower scope's token.
    fn first_accepted(&self, scope: Scope) -> Option<usize> {
        let own = scope as usize;
        if self.digests[own].is_some() {
            return Some(own);
        }
        if scope == Scope::Admin {
            return None;
        }
        (0..own).rev().find(|&i| self.digests[i].is_some())
    }

    /// Admits `offered` from `client` for `path` in `scope`: at once where the scope has no
    /// token and none below it has (admin: refused, it is off), else when it is the scope's
    /// token (or, without one, the nearest lower scope's) or a higher one's.
    /// Failures are logged (the address and path, never the offered token) and counted
    /// against the address and against all addresses.
    pub(crate) async fn authorize(
        &self,
        scope: Scope,
        offered: Option<&str>,
        client: Option<IpAddr>,
        path: &str,
    ) -> Result<(), Refusal> {
        let Some(first) = self.first_accepted(scope) else {
            return match scope {
                Scope::Admin => Err(Refusal::Disabled),
                _ => Ok(()),
            };
        };
        let accepted = &self.digests[first..];
        // Requests that did not come through the listener (none in production) share one
        // budget rather than escaping it.
        let ip = client.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ip| ip.to_canonical());
        let identity = Identity::new().with_ip(ip);
        let (policy, own) = if scope == Scope::Admin {
            (&self.policy, &self.address)
        } else {
            (&self.scoped, &self.scoped)
        };
        let valid = offered.is_some_and(|t| accepted.iter().flatten().any(|d| token_matches(d, t)));
        // An admin address over its own budget is refused whatever it offers, so that a
        // refused guess says nothing. On the check and refund scopes a valid token is let in
        // all the same: their callers share addresses (an Envoy sidecar beside its
        // application, a NAT, a /64), and one of them sending no token must not lock the
        // others out (a token of 16 bytes or more is not guessed). The budget of all addresses
        // together refuses only failures, for the same reason.
        if valid && scope != Scope::Admin {
            return Ok(());
        }
        if let Some(retry_after) = self.refused(own, &identity).await {
            tracing::debug!(client_ip = %ip, path = %path, "request refused: too many failed authentications");
            return Err(Refusal::TooManyFailures(retry_after));
        }
        let refusal = match offered {
            _ if valid => return Ok(()),
            Some(_) => Refusal::Wrong,
            None => Refusal::Missing,
        };
        let reason = if refusal == Refusal::Wrong {
            "wrong token"
        } else {
            "no token"
        };
        match self.charge(policy, &identity).await {
            Charged::Refused(retry_after) => {
                // Lost a race with concurrent failures, or the budget of all addresses is
                // spent: this one is over the limit.
                if let Some(skipped) = self.failure_log.due() {
                    tracing::warn!(
                        client_ip = %ip,
                        path = %path,
                        reason,
                        skipped,
                        "admin authentication failed; this address is refused for {}",
                        whole_seconds(retry_after)
                    );
                }
                Err(Refusal::TooManyFailures(retry_after))
            }
            Charged::Last(refused_for) => {
                tracing::warn!(
                    client_ip = %ip,
                    path = %path,
                    reason,
                    "admin authentication failed; that was the last attempt allowed, this address is refused for {}",
                    whole_seconds(refused_for)
                );
                Err(refusal)
            }
            Charged::Counted => {
                // Admin failures are bounded by the budget of all addresses; the other scopes'
                // only per address, so that rotating addresses would write a line each.
                let skipped = if scope == Scope::Admin {
                    Some(0)
                } else {
                    self.failure_log.due()
                };
                if let Some(skipped) = skipped {
                    tracing::warn!(client_ip = %ip, path = %path, reason, skipped, "admin authentication failed");
                }
                Err(refusal)
            }
        }
    }

    /// `Some(retry after)` when the address is over its failure limit; records nothing.
    async fn refused(&self, policy: &Policy, identity: &Identity) -> Option<Duration> {
        match self.failures.peek(policy, identity, 1).await {
            Ok(d) if !d.allowed() => Some(d.retry_after().unwrap_or(self.limit.window())),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "admin failure limiter failed");
                None
            }
        }
    }

    /// Counts one failure against the address.
    async fn charge(&self, policy: &Policy, identity: &Identity) -> Charged {
        match self.failures.check(policy, identity, 1).await {
            Ok(d) if !d.allowed() => {
                Charged::Refused(d.retry_after().unwrap_or(self.limit.window()))
            }
            Ok(d) => match d.rules(policy).first() {
                // The lockout ends when the oldest failure leaves the window, which is what
                // a refusal would say now.
                Some(rule) if rule.remaining == 0 => Charged::Last(
                    self.refused(policy, identity)
                        .await
                        .unwrap_or(rule.reset_after),
                ),
                _ => Charged::Counted,
            },
            Err(e) => {
                tracing::warn!(error = %e, "admin failure limiter failed");
                Charged::Counted
            }
        }
    }
}

/// What counting a failure found.
enum Charged {
    /// Within the limit.
    Counted,
    /// Within the limit, and none left: the address is refused for the duration.
    Last(Duration),
    /// Over the limit already; retry after the duration.
    Refused(Duration),
}

/// The token of an `Authorization` value (an HTTP header, a gRPC metadata entry):
/// `Bearer <token>`, the scheme in any case.
pub(crate) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// A duration for people: whole seconds, rounded up (`1m`, `45s`).
pub(crate) fn whole_seconds(d: Duration) -> String {
    let secs = d.as_nanos().div_ceil(1_000_000_000);
    tollgate::format_duration(Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX)))
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Compares digests in constant time: the answer's timing says nothing about the token.
fn token_matches(expected: &[u8; 32], offered: &str) -> bool {
    expected.ct_eq(&digest(offered)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(token: &str) -> Tokens {
        Tokens {
            admin: Some(token.into()),
            ..Tokens::default()
        }
    }

    /// A scope's token opens it and the scopes below; an open scope asks for nothing.
    #[tokio::test]
    async fn scopes_take_their_token_or_a_higher_one() {
        let tokens = Tokens {
            check: None,
            refund: Some("refund-token".into()),
            admin: Some("admin-token".into()),
        };
        let auth = Auth::new(&tokens, "100/1m".parse().unwrap());
        let at = Some(IpAddr::from([192, 0, 2, 1]));
        let ask = |scope, token| auth.authorize(scope, token, at, "/");
        assert_eq!(ask(Scope::Check, None).await, Ok(()));
        assert_eq!(ask(Scope::Refund, None).await, Err(Refusal::Missing));
        assert_eq!(ask(Scope::Refund, Some("refund-token")).await, Ok(()));
        assert_eq!(ask(Scope::Refund, Some("admin-token")).await, Ok(()));
        assert_eq!(ask(Scope::Refund, Some("guess")).await, Err(Refusal::Wrong));
        assert_eq!(
            ask(Scope::Admin, Some("refund-token")).await,
            Err(Refusal::Wrong)
        );
        assert_eq!(ask(Scope::Admin, Some("admin-token")).await, Ok(()));
    }

    /// A scope without a token of its own takes the nearest lower scope's: with only the
    /// check scope's set, the refund scope (release, extend, the duplicate guard) is not open.
    #[tokio::test]
    async fn a_scope_without_a_token_takes_the_one_below() {
        let tokens = Tokens {
            check: Some("check-token".into()),
            refund: None,
            admin: Some("admin-token".into()),
        };
        let auth = Auth::new(&tokens, "100/1m".parse().unwrap());
        let at = Some(IpAddr::from([192, 0, 2, 1]));
        let ask = |scope, token| auth.authorize(scope, token, at, "/");
        assert_eq!(ask(Scope::Refund, None).await, Err(Refusal::Missing));
        assert_eq!(ask(Scope::Refund, Some("check-token")).await, Ok(()));
        assert_eq!(ask(Scope::Refund, Some("admin-token")).await, Ok(()));
        assert!(auth.guarded(Scope::Refund) && !auth.has_own_token(Scope::Refund));
        assert_eq!(
            ask(Scope::Admin, Some("check-token")).await,
            Err(Refusal::Wrong)
        );
        let open = Auth::new(&admin("admin-token"), "100/1m".parse().unwrap());
        assert!(!open.guarded(Scope::Check) && !open.guarded(Scope::Refund));
    }

    #[test]
    fn tokens_compare_exactly() {
        let matches = |a: &str, b: &str| token_matches(&digest(a), b);
        assert!(matches("secret", "secret"));
        assert!(!matches("secret", "secreT"));
        assert!(!matches("secret", "secret2"));
        assert!(!matches("", "x"));
        assert!(matches("", ""));
    }

    #[tokio::test]
    async fn failures_are_limited_per_address_and_successes_are_free() {
        let auth = Auth::new(&admin("t0ken"), "2/1m".parse().unwrap());
        let a = Some(IpAddr::from([192, 0, 2, 1]));
        let b = Some(IpAddr::from([192, 0, 2, 2]));
        for _ in 0..5 {
            assert_eq!(
                auth.authorize(Scope::Admin, Some("t0ken"), a, "/v1/reset")
                    .await,
                Ok(())
            );
        }
        assert_eq!(
            auth.authorize(Scope::Admin, Some("guess"), a, "/v1/reset")
                .await,
            Err(Refusal::Wrong)
        );
        assert_eq!(
            auth.authorize(Scope::Admin, None, a, "/v1/reset").await,
            Err(Refusal::Missing)
        );
        for token in [Some("guess"), Some("t0ken"), None] {
            match auth.authorize(Scope::Admin, token, a, "/v1/reset").await {
                Err(Refusal::TooManyFailures(d)) => {
                    assert!(d > Duration::ZERO && d <= Duration::from_secs(60), "{d:?}");
                }
                other => panic!("{token:?}: {other:?}"),
            }
        }
        // Another address is not affected.
        assert_eq!(
            auth.authorize(Scope::Admin, Some("t0ken"), b, "/v1/reset")
                .await,
            Ok(())
        );
        assert_eq!(
            auth.authorize(Scope::Admin, Some("guess"), b, "/v1/reset")
                .await,
            Err(Refusal::Wrong)
        );
    }

    /// Guesses from ever new addresses (one per /64 of an IPv6 network) meet a budget for all
    /// addresses together: 20 addresses' worth.
    #[tokio::test]
    async fn rotating_addresses_meets_a_global_budget() {
        let auth = Auth::new(&admin("t0ken"), "2/1m".parse().unwrap());
        let mut wrong = 0;
        for i in 0..100u16 {
            let client = Some(IpAddr::from([0x2001, 0xdb8, i, 0, 0, 0, 0, 1]));
            match auth
                .authorize(Scope::Admin, Some("guess"), client, "/v1/reset")
                .await
            {
                Err(Refusal::Wrong) => wrong += 1,
                Err(Refusal::TooManyFailures(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(wrong, 2 * GLOBAL_FACTOR, "guesses allowed in the window");
        // The check and refund scopes have no global budget: guesses from many addresses
        // lock none of their callers out (a valid token still checks), and a valid token
        // checks from an address over its own budget too.
        let tokens = Tokens {
            check: Some("check-token".into()),
            ..Tokens::default()
        };
        let auth = Auth::new(&tokens, "1/1m".parse().unwrap());
        for i in 0..100u16 {
            let client = Some(IpAddr::from([0x2001, 0xdb8, i, 0, 0, 0, 0, 1]));
            let _ = auth
                .authorize(Scope::Check, Some("guess"), client, "/")
                .await;
        }
        let fresh = Some(IpAddr::from([192, 0, 2, 200]));
        assert_eq!(
            auth.authorize(Scope::Check, Some("check-token"), fresh, "/")
                .await,
            Ok(())
        );
        let spent = Some(IpAddr::from([0x2001, 0xdb8, 7, 0, 0, 0, 0, 1]));
        assert!(matches!(
            auth.authorize(Scope::Check, None, spent, "/").await,
            Err(Refusal::TooManyFailures(_))
        ));
        assert_eq!(
            auth.authorize(Scope::Check, Some("check-token"), spent, "/")
                .await,
            Ok(())
        );
        // Two addresses of one /64 share a budget.
        let auth = Auth::new(&admin("t0ken"), "1/1m".parse().unwrap());
        let a = Some(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]));
        let b = Some(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 2]));
        assert_eq!(
            auth.authorize(Scope::Admin, Some("guess"), a, "/").await,
            Err(Refusal::Wrong)
        );
        assert!(matches!(
            auth.authorize(Scope::Admin, Some("guess"), b, "/").await,
            Err(Refusal::TooManyFailures(_))
        ));
    }

    /// Any limit the configuration accepts makes an `Auth`: a sliding log's cap on entries
    /// (a million) made a large one, times the shared budget's factor, panic at start; GCRA
    /// must not be forced on a calendar window, which it cannot count.
    #[tokio::test]
    async fn a_large_failure_limit_starts() {
        for limit in ["60000/1m", "5/1d@UTC", "2000000/1d@Europe/Berlin"] {
            let auth = Auth::new(&admin("t0ken"), limit.parse().unwrap());
            let a = Some(IpAddr::from([192, 0, 2, 1]));
            assert_eq!(
                auth.authorize(Scope::Admin, Some("t0ken"), a, "/v1/reset")
                    .await,
                Ok(()),
                "{limit}"
            );
        }
    }

    #[tokio::test]
    async fn without_a_token_admin_is_disabled() {
        let auth = Auth::new(&Tokens::default(), "1/1m".parse().unwrap());
        for _ in 0..3 {
            assert_eq!(
                auth.authorize(Scope::Admin, Some("x"), None, "/v1/reset")
                    .await,
                Err(Refusal::Disabled)
            );
        }
    }
}
