//! Calendar windows: a fixed-window rule aligned to the days, ISO weeks or months of a named
//! time zone (`60/1d@Europe/Berlin`, `1000/1mo@UTC`), whatever their length: a day across a
//! daylight-saving change lasts 23 or 25 hours, a month 28 to 31 days.

use std::{fmt, str::FromStr, sync::OnceLock};

use jiff::{Span, Timestamp, civil::Date, tz::TimeZone};
use parking_lot::RwLock;

/// The calendar unit of a [`Calendar`] window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From midnight to midnight.
    Day,
    /// From Monday's midnight to the next Monday's (ISO 8601 weeks).
    Week,
    /// From the first of the month's midnight to the next month's.
    Month,
}

impl CalendarUnit {
    /// The unit's text in a rule: `1d`, `1w`, `1mo`.
    pub fn as_str(self) -> &'static str {
        match self {
            CalendarUnit::Day => "1d",
            CalendarUnit::Week => "1w",
            CalendarUnit::Month => "1mo",
        }
    }

    /// The longest such window, in milliseconds: a day of 25 hours, a week with one, a month of
    /// 31 days with one. What a rate-limit field shows as the window, and how long state is
    /// kept at most.
    pub fn longest_ms(self) -> u64 {
        const HOUR: u64 = 3_600_000;
        match self {
            CalendarUnit::Day => 25 * HOUR,
            CalendarUnit::Week => 7 * 24 * HOUR + HOUR,
            CalendarUnit::Month => 31 * 24 * HOUR + HOUR,
        }
    }
}

impl FromStr for CalendarUnit {
    type Err = String;

    /// `1d`, `d`, `day`, `1w`, `w`, `week`, `1mo`, `mo`, `month` (`1 day` and friends too).
    fn from_str(text: &str) -> Result<CalendarUnit, String> {
        let unit = text.trim();
        let unit = unit.strip_prefix('1').map_or(unit, str::trim_start);
        match unit.to_ascii_lowercase().as_str() {
            "d" | "day" => Ok(CalendarUnit::Day),
            "w" | "week" => Ok(CalendarUnit::Week),
            "mo" | "month" => Ok(CalendarUnit::Month),
            _ => Err(format!(
                "a calendar window is 1d, 1w or 1mo (a day, an ISO week or a month), not {text:?}"
            )),
        }
    }
}

/// A calendar window: the days, ISO weeks or months of an IANA time zone.
///
/// The time zone database is the system's (`/usr/share/zoneinfo`), or a copy built in where
/// the system has none. A window starts at local midnight (or the first instant after it, on
/// a day whose midnight a clock change skips).
///
/// ```
/// use tollgate::{Calendar, CalendarUnit};
///
/// let berlin = Calendar::new(CalendarUnit::Day, "Europe/Berlin")?;
/// // 2024-03-31, the day Berlin moves its clocks forward, lasts 23 hours.
/// let noon = 1_711_882_800_000_000; // 2024-03-31T11:00:00Z, 13:00 in Berlin
/// let (start, end) = berlin.window_at(noon);
/// assert_eq!(start, 1_711_839_600_000_000); // 2024-03-30T23:00:00Z, midnight in Berlin
/// assert_eq!(end - start, 23 * 3_600_000_000);
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    unit: CalendarUnit,
    /// The zone's place in the process's table of zones (see [`zones`]).
    zone: u16,
}

/// A time zone a calendar names, looked up once per process, with the last window of each unit
/// it computed (most checks fall in the window the one before them did).
struct Zone {
    name: &'static str,
    tz: TimeZone,
    /// Per unit (day, week, month): the last window's start and end, `(0, 0)` for none yet.
    last: [RwLock<(u64, u64)>; 3],
}

/// Every time zone a calendar of this process names: rules stay `Copy` by holding an index.
fn zones() -> &'static RwLock<Vec<Zone>> {
    static ZONES: OnceLock<RwLock<Vec<Zone>>> = OnceLock::new();
    ZONES.get_or_init(|| RwLock::new(Vec::new()))
}

impl Calendar {
    /// The windows of `unit` in the IANA time zone `zone` (`Europe/Berlin`, `UTC`).
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Calendar, String> {
        if let Some(at) = zones().read().iter().position(|z| z.name == zone) {
            return Ok(Calendar {
                unit,
                zone: at as u16,
            });
        }
        let tz = TimeZone::get(zone).map_err(|_| {
            format!("unknown time zone {zone:?} (an IANA name, e.g. Europe/Berlin or UTC)")
        })?;
        let mut zones = zones().write();
        let at = match zones.iter().position(|z| z.name == zone) {
            Some(at) => at,
            None => {
                if zones.len() >= usize::from(u16::MAX) {
                    return Err("too many time zones in one process".to_owned());
                }
                // A zone name lives as long as the process: there are a few hundred at most.
                let name: &'static str = Box::leak(zone.to_owned().into_boxed_str());
                zones.push(Zone {
                    name,
                    tz,
                    last: Default::default(),
                });
                zones.len() - 1
            }
        };
        Ok(Calendar {
            unit,
            zone: at as u16,
        })
    }

    /// The unit.
    pub fn unit(self) -> CalendarUnit {
        self.unit
    }

    /// The zone's index in this process's table of zones (to tell calendars apart in memory;
    /// never stored outside the process).
    pub(crate) fn zone_index(self) -> u16 {
        self.zone
    }

    /// The time zone's name.
    pub fn zone(self) -> &'static str {
        zones().read()[usize::from(self.zone)].name
    }

    /// The window holding the instant `at_us` (µs since the Unix epoch): its start and its end
    /// (the next window's start), in µs since the epoch.
    pub fn window_at(self, at_us: u64) -> (u64, u64) {
        let zones = zones().read();
        let zone = &zones[usize::from(self.zone)];
        let last = &zone.last[self.unit as usize];
        let (start, end) = *last.read();
        if start <= at_us && at_us < end {
            return (start, end);
        }
        match self.window_in(&zone.tz, at_us) {
            Some(window) => {
                *last.write() = window;
                window
            }
            None => {
                // Outside the calendar's range (before 1970 or after 9999): a plain day.
                let day = 86_400_000_000;
                let start = at_us - at_us % day;
                (start, start + day)
            }
        }
    }

    fn window_in(self, tz: &TimeZone, at_us: u64) -> Option<(u64, u64)> {
        let at = Timestamp::from_microsecond(i64::try_from(at_us).ok()?).ok()?;
        let date = at.to_zoned(tz.clone()).date();
        let (first, step) = match self.unit {
            CalendarUnit::Day => (date, Span::new().days(1)),
            CalendarUnit::Week => {
                let back = Span::new().days(date.weekday().to_monday_zero_offset());
                (date.checked_sub(back).ok()?, Span::new().weeks(1))
            }
            CalendarUnit::Month => (date.first_of_month(), Span::new().months(1)),
        };
        let next: Date = first.checked_add(step).ok()?;
        let micros = |d: Date| -> Option<u64> {
            let z = d.to_zoned(tz.clone()).ok()?;
            u64::try_from(z.timestamp().as_microsecond()).ok()
        };
        Some((micros(first)?, micros(next)?))
    }
}

impl fmt::Display for Calendar {
    /// `1d@Europe/Berlin`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.unit.as_str(), self.zone())
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Calendar({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000_000;

    /// µs since the epoch of an RFC 3339 instant.
    fn at(text: &str) -> u64 {
        let ts: Timestamp = text.parse().unwrap();
        u64::try_from(ts.as_microsecond()).unwrap()
    }

    #[test]
    fn days_follow_the_local_clock_across_daylight_saving_changes() {
        let berlin = Calendar::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
        // Spring forward: 23 hours; fall back: 25 hours; an ordinary day: 24.
        let (start, end) = berlin.window_at(at("2024-03-31T12:00:00Z"));
        assert_eq!(
            (start, end - start),
            (at("2024-03-30T23:00:00Z"), 23 * HOUR)
        );
        let (start, end) = berlin.window_at(at("2024-10-27T12:00:00Z"));
        assert_eq!(
            (start, end - start),
            (at("2024-10-26T22:00:00Z"), 25 * HOUR)
        );
        let (start, end) = berlin.window_at(at("2024-06-01T21:59:59Z"));
        assert_eq!(
            (start, end),
            (at("2024-05-31T22:00:00Z"), at("2024-06-01T22:00:00Z"))
        );
        // The first instant of a window belongs to it; the last before it, to the one before.
        assert_eq!(
            berlin.window_at(at("2024-06-01T22:00:00Z")).0,
            at("2024-06-01T22:00:00Z")
        );
        assert_eq!(
            berlin.window_at(at("2024-06-01T22:00:00Z") - 1).1,
            at("2024-06-01T22:00:00Z")
        );
    }

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first() {
        let ny_week = Calendar::new(CalendarUnit::Week, "America/New_York").unwrap();
        // Wednesday 2024-11-06 (EST); the week began Monday 2024-11-04 00:00 EST.
        let (start, end) = ny_week.window_at(at("2024-11-06T15:00:00Z"));
        assert_eq!(
            (start, end),
            (at("2024-11-04T05:00:00Z"), at("2024-11-11T05:00:00Z"))
        );
        // The week of the change to EST (Sunday 2024-11-03) has one more hour.
        let (start, end) = ny_week.window_at(at("2024-10-30T12:00:00Z"));
        assert_eq!(
            (start, end),
            (at("2024-10-28T04:00:00Z"), at("2024-11-04T05:00:00Z"))
        );
        let utc_month = Calendar::new(CalendarUnit::Month, "UTC").unwrap();
        let (start, end) = utc_month.window_at(at("2024-02-29T23:59:59Z"));
        assert_eq!(
            (start, end),
            (at("2024-02-01T00:00:00Z"), at("2024-03-01T00:00:00Z"))
        );
    }

    #[test]
    fn units_and_zones_are_checked() {
        assert_eq!("1mo".parse(), Ok(CalendarUnit::Month));
        assert_eq!("day".parse(), Ok(CalendarUnit::Day));
        assert_eq!("1 week".parse(), Ok(CalendarUnit::Week));
        assert!(
            "2d".parse::<CalendarUnit>()
                .unwrap_err()
                .contains("1d, 1w or 1mo")
        );
        let e = Calendar::new(CalendarUnit::Day, "Mars/Olympus").unwrap_err();
        assert!(e.contains("unknown time zone"), "{e}");
        let a = Calendar::new(CalendarUnit::Day, "Asia/Tokyo").unwrap();
        assert_eq!(a, Calendar::new(CalendarUnit::Day, "Asia/Tokyo").unwrap());
        assert_ne!(a, Calendar::new(CalendarUnit::Week, "Asia/Tokyo").unwrap());
        assert_eq!(a.to_string(), "1d@Asia/Tokyo");
    }
}
