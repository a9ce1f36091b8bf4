//! The duplicate-guard, blocklist, bypass and IP-prefix scenarios on the memory store.

tollgate_testkit::guard_suite!(|| async { tollgate_testkit::conformance::memory_subject() });
tollgate_testkit::prefix_suite!(|| async { tollgate_testkit::conformance::memory_subject() });
