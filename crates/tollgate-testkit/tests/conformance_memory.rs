//! The store conformance suite against `MemoryStore`.

tollgate_testkit::conformance_suite!(|| async { tollgate_testkit::conformance::memory_subject() });
