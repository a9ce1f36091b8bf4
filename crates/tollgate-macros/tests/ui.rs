//! Compile-time checks of the attribute macros: every misuse is a compile error with a
//! message that points at the offending text (snapshots in `ui/fail/*.stderr`), and the
//! documented uses compile (`ui/pass`).
//!
//! Regenerate the snapshots after an intended change with `TRYBUILD=overwrite`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
