//! The duplicate-guard, blocklist and bypass scenarios on the memory store.

tollgate_testkit::guard_suite!(|| async { tollgate_testkit::conformance::memory_subject() });
