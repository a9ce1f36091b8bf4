//! The clock read of a memory-store check: the wall clock (`SystemTime::now`, what the store
//! read before) against the store's `SystemClock` (wall time once, then a monotonic counter).

use std::{
    hint::black_box,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use criterion::Criterion;
use tollgate::{Clock, SystemClock};

pub(crate) fn clock_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock_read");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g.bench_function("system_time", |b| {
        b.iter(|| {
            black_box(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as u64),
            )
        });
    });
    g.bench_function("tollgate_system_clock", |b| {
        b.iter(|| black_box(SystemClock.now_us()));
    });
    g.finish();
}
