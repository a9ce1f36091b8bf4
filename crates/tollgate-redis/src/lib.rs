//! Redis store for tollgate (in progress).
