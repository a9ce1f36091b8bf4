//! Redis failures as [`StoreError`]s, and URLs safe to print.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use tollgate::{StoreError, StoreErrorKind};

/// `err`, raised while doing `what` against `target`, as a store error of the right kind.
pub(crate) fn from_redis(what: &str, target: &str, err: RedisError) -> StoreError {
    let kind = kind_of(&err);
    StoreError::new(kind, format!("{what} on {target}")).with_source(err)
}

fn kind_of(err: &RedisError) -> StoreErrorKind {
    if err.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    if err.code() == Some("OOM") {
        return StoreErrorKind::Capacity;
    }
    // A busy script, a loading or failing-over server: it cannot serve us now.
    if matches!(
        err.code(),
        Some("BUSY" | "LOADING" | "MASTERDOWN" | "READONLY")
    ) {
        return StoreErrorKind::Unavailable;
    }
    match err.kind() {
        ErrorKind::Io
        | ErrorKind::Client
        | ErrorKind::AuthenticationFailed
        | ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => StoreErrorKind::Unavailable,
        _ => StoreErrorKind::Protocol,
    }
}

/// The error for a call that got no answer in time.
pub(crate) fn timed_out(what: &str, target: &str, timeout: Duration) -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        format!("{what} on {target}: no answer within {timeout:?}"),
    )
}

/// `url` with its passwords (user info, `sentinel_password=`) replaced by `***`, for messages,
/// logs and `Debug`.
pub fn redact(url: &str) -> String {
    match url.split_once("sentinel_password=") {
        Some((before, after)) => {
            let rest = after.find('&').map_or("", |at| &after[at..]);
            format!("{}sentinel_password=***{rest}", redact_userinfo(before))
        }
        None => redact_userinfo(url),
    }
}

fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The last `@` ends the user info even when an unescaped password holds `/` or `#`: better
    // to hide too much than to print a secret.
    let Some((userinfo, after)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        None => userinfo.to_owned(),
    };
    format!("{scheme}://{user}@{after}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("redis://app:s3cret@db:6379/2"),
            "redis://app:***@db:6379/2"
        );
        assert_eq!(redact("rediss://:p@ss@db/0"), "rediss://:***@db/0");
        assert_eq!(redact("redis://db:6379/"), "redis://db:6379/");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact("redis://u:a/b#c@db/0"), "redis://u:***@db/0");
        assert_eq!(
            redact("redis+sentinel://:pw@s1,s2/m?sentinel_password=spw&sentinel_user=u"),
            "redis+sentinel://:***@s1,s2/m?sentinel_password=***&sentinel_user=u"
        );
        assert_eq!(
            redact("redis+cluster://app:pw@a:1,b:2"),
            "redis+cluster://app:***@a:1,b:2"
        );
    }

    #[test]
    fn kinds() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(kind_of(&io), StoreErrorKind::Unavailable);
        let t = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(kind_of(&t), StoreErrorKind::Timeout);
        let parse = RedisError::from((ErrorKind::UnexpectedReturnType, "bad"));
        assert_eq!(kind_of(&parse), StoreErrorKind::Protocol);
    }
}
