//! What every clone of a [`RedisStore`](crate::RedisStore) shares: the backend, the batching
//! lanes and the local over-limit cache. The store and its batches both use it; it depends on
//! neither.

use std::time::Instant;

use crate::{backend::Backend, batch::Lanes, cache::LocalCache, lease::Leases, repair::Journal};

/// What every clone of a store shares, and what its batches are sent with.
pub(crate) struct Inner {
    pub(crate) backend: Backend,
    /// Send checks of one lane together while a call is in flight (see `batch`).
    pub(crate) batching: bool,
    /// The lanes with a call in flight.
    pub(crate) lanes: Lanes,
    /// The local over-limit cache, if on.
    pub(crate) cache: Option<LocalCache>,
    /// What recent admissions wrote, to write again after a failover, if on.
    pub(crate) journal: Option<Journal>,
    /// The quota leases in hand (see `lease`).
    pub(crate) leases: Leases,
    /// The cache's clock without a test clock: µs since this instant.
    pub(crate) epoch: Instant,
}

impl Inner {
    /// The local cache's clock: the test clock's time, or µs since the store was built.
    pub(crate) fn local_now_us(&self) -> u64 {
        match &self.backend.clock {
            Some(clock) => clock.now_us(),
            None => u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }
}
