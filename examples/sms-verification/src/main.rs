//! The SMS-verification example (work in progress).

fn main() {}
