//! Behaviour over real HTTP on loopback: axum servers on 127.0.0.1:0, a reqwest client.

// Test helpers outside #[test] fns unwrap too; clippy.toml only exempts the tests themselves.
#![allow(clippy::unwrap_used)]

mod duplicate;
mod fuzz;
mod identity;
mod macros;
mod rate_limit;
mod support;
