//! Where a page of a listing ended, for listings too long for one answer.

use std::fmt;

/// Where a page of a listing ended (the blocklist's, [`BanPage`](crate::BanPage), or the
/// overrides', [`OverridePage`](crate::OverridePage)): the next page starts after it.
///
/// Stores list bans and overrides in the order they end, then by key; a cursor is the end of
/// the last entry of a page (µs since the epoch, on the store's clock; an override that never
/// ends, `u64::MAX`) and its key. Its text form (`Display` and `FromStr`) is URL-safe, for APIs
/// that hand it to clients; it is only meaningful to the store that made it, for the listing
/// it came from.
///
/// ```
/// use tollgate::PageCursor;
///
/// let cursor = PageCursor::new(1_700_000_000_000_000, "tg:ban:ip:192.0.2.1");
/// let text = cursor.to_string();
/// assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'));
/// assert_eq!(text.parse::<PageCursor>().unwrap(), cursor);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageCursor {
    until_us: u64,
    key: String,
}

impl PageCursor {
    /// After the entry stored under `key` that ends at `until_us`.
    pub fn new(until_us: u64, key: impl Into<String>) -> PageCursor {
        PageCursor {
            until_us,
            key: key.into(),
        }
    }

    /// The end of the last entry of the page, µs since the epoch on the store's clock.
    pub fn until_us(&self) -> u64 {
        self.until_us
    }

    /// The store key of the last entry of the page.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for PageCursor {
    /// `until.hexkey`: digits, a dot, and the key's bytes in lowercase hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.", self.until_us)?;
        for b in self.key.bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for PageCursor {
    type Err = String;

    fn from_str(s: &str) -> Result<PageCursor, String> {
        let bad = || format!("{s:?} is not a page cursor");
        let (until, hex) = s.split_once('.').ok_or_else(bad)?;
        let until_us = until.parse().map_err(|_| bad())?;
        if hex.len() % 2 != 0 {
            return Err(bad());
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(bad)?;
        let key = String::from_utf8(bytes).map_err(|_| bad())?;
        Ok(PageCursor { until_us, key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let odd = PageCursor::new(7, "p:ban:user_id:é \"x\"/?&");
        assert_eq!(odd.to_string().parse::<PageCursor>(), Ok(odd));
        for bad in ["", "12", "x.00", "1.0", "1.zz", "1.ff", "-1.61"] {
            assert!(bad.parse::<PageCursor>().is_err(), "{bad:?}");
        }
    }
}
