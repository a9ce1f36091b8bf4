//! Traffic made up to a stated pattern (`tollgate plan --synthetic`), for a configuration's
//! shape before there is a record: the same seed gives the same traffic.

use rand::{RngExt as _, SeedableRng as _, rngs::StdRng};

use super::input::{Event, Names, Reading};
use crate::cli::Synthetic;

/// When synthetic traffic starts: 2026-01-01T00:00:00Z, so that the same arguments give the
/// same report.
const START_S: f64 = 1_767_225_600.0;

/// The scraper's address.
const SCRAPER: &str = "203.0.113.66";

pub(crate) struct Generator {
    rng: StdRng,
    pattern: Synthetic,
    rate: f64,
    identities: u32,
    /// Seconds since [`START_S`].
    t: f64,
    end: f64,
    line: u64,
}

impl Generator {
    pub(crate) fn new(
        pattern: Synthetic,
        rate: f64,
        duration_s: f64,
        identities: u32,
        seed: u64,
    ) -> Result<Generator, String> {
        if !(rate > 0.0 && rate.is_finite()) {
            return Err(format!(
                "--rate {rate}: expected requests a second, above 0"
            ));
        }
        if identities == 0 {
            return Err("--identities 0: synthetic traffic needs at least one client".into());
        }
        Ok(Generator {
            rng: StdRng::seed_from_u64(seed),
            pattern,
            rate,
            identities,
            t: 0.0,
            end: duration_s,
            line: 0,
        })
    }

    /// Seconds to the next arrival at `rate` a second (exponentially distributed).
    fn gap(&mut self, rate: f64) -> f64 {
        let u: f64 = self.rng.random();
        -(1.0 - u).ln() / rate
    }

    /// The next request, through `reading`'s target (`--policy`, or `--domain` with
    /// `--descriptor KEY=ip`).
    pub(crate) fn next(
        &mut self,
        reading: &Reading,
        names: &mut Names,
    ) -> Option<Result<Event, String>> {
        let scraper = match self.pattern {
            Synthetic::Steady => {
                self.t += self.gap(self.rate);
                false
            }
            Synthetic::Bursty => {
                // Ten times the rate for the first tenth of each minute.
                self.t += self.gap(self.rate * 10.0);
                if self.t % 60.0 >= 6.0 {
                    self.t = (self.t / 60.0).floor() * 60.0 + 60.0;
                }
                false
            }
            Synthetic::Scraper => {
                self.t += self.gap(self.rate * 2.0);
                self.rng.random::<bool>()
            }
        };
        if self.t >= self.end {
            return None;
        }
        self.line += 1;
        let ip = if scraper {
            SCRAPER.to_owned()
        } else {
            let i = self.rng.random_range(0..self.identities) + 1;
            format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
        };
        let t_us = ((START_S + self.t) * 1e6) as u64;
        let time = t_us.to_string();
        let fields = vec![("time", time.as_str()), ("ip", ip.as_str())];
        Some(match reading.fields_event(fields, names) {
            Ok(Some((t_us, what, _))) => Ok(Event {
                t_us,
                file: 0,
                line: self.line,
                what,
                recorded: None,
            }),
            Ok(None) => Err("synthetic traffic was filtered out by --where".into()),
            Err(e) => Err(e),
        })
    }
}
