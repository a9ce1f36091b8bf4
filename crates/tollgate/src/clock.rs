//! Time sources for the memory store. Redis-backed checks read the Redis server's clock instead.

use std::{
    fmt,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A source of wall-clock time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> u64;
}

/// The system clock: wall time read once, then advanced by a monotonic counter.
///
/// The first read takes the wall time and a monotonic instant (`quanta`: the CPU's invariant
/// time-stamp counter where it has one, else the OS monotonic clock); every read after that is
/// the wall time of the first plus the monotonic time since, about a tenth of a wall-clock read.
/// So time never steps back within a process, and it does not follow later steps of the wall
/// clock (an NTP correction after start shows only in a new process). Only the memory store
/// reads it; Redis-backed checks use the Redis server's `TIME`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

/// The wall time (µs since the epoch) at the anchor, the monotonic clock (held here, so a read
/// skips quanta's per-thread look-up of a mocked clock), and the clock's raw reading at the
/// anchor.
static ANCHOR: OnceLock<(u64, quanta::Clock, u64)> = OnceLock::new();

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        let (wall, clock, at) = ANCHOR.get_or_init(|| {
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64);
            let clock = quanta::Clock::new();
            let at = clock.raw();
            (wall, clock, at)
        });
        // Raw readings scaled once, as a difference (0 if the counter reads behind the anchor):
        // no instant is scaled and no `Duration` made.
        wall + clock.delta_as_nanos(*at, clock.raw()) / 1_000
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(Duration::from_secs(1_000));
/// let seen_by_store = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(seen_by_store.now_us(), 1_001_500_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock showing `since_epoch`.
    pub fn new(since_epoch: Duration) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(since_epoch.as_micros() as u64)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Sets the clock (also backwards, to test clock steps).
    pub fn set(&self, since_epoch: Duration) {
        self.0
            .store(since_epoch.as_micros() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
