//! Helpers for the crate's own unit tests.

/// Says, where it cannot be missed, that a test (or a part of one) did not
/// run here and why. libtest captures `println!`/`eprintln!` of passing
/// tests, so this writes to the process's stderr directly: every run shows
/// the line, and a test never passes silently by returning early.
pub fn skip(what: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {what}: {why}");
}
