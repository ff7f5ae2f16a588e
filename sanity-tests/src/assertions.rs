//! Checks of RPC results and files with readable panics.

use std::fmt::Debug;
use std::fs;
use std::path::Path;

use tonic::{Code, Response, Status};

/// Asserts that an RPC failed with `want`; returns the status.
#[track_caller]
pub fn assert_code<T: Debug>(what: &str, res: Result<Response<T>, Status>, want: Code) -> Status {
    must_fail(what, res.map(Response::into_inner), want)
}

/// Like [`assert_code`], for a result already out of its `Response`.
#[track_caller]
pub fn must_fail<T: Debug>(what: &str, res: Result<T, Status>, want: Code) -> Status {
    match res {
        Ok(v) => panic!("{what}: expected {want:?}, got OK: {v:?}"),
        Err(s) => {
            assert_eq!(
                s.code(),
                want,
                "{what}: expected {want:?}, got {:?}: {}",
                s.code(),
                s.message()
            );
            s
        }
    }
}

/// Unwraps an RPC result with a readable panic.
#[track_caller]
pub fn ok<T>(what: &str, res: Result<Response<T>, Status>) -> T {
    must(what, res.map(Response::into_inner))
}

/// The file `name` in `dir` holds exactly `want` (a mismatch shows both when
/// they are short, else their lengths: a device's worth of bytes is no message).
#[track_caller]
pub fn assert_file(dir: &Path, name: &str, want: &[u8]) {
    let got = fs::read(dir.join(name)).unwrap_or_else(|e| panic!("reading {name} in {dir:?}: {e}"));
    if got != want {
        if got.len().max(want.len()) <= 64 {
            panic!(
                "{name} in {dir:?}: {:?}, expected {:?}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want)
            );
        }
        panic!(
            "{name} in {dir:?}: content differs ({} bytes, expected {})",
            got.len(),
            want.len()
        );
    }
}

/// Like [`ok`], for a result already out of its `Response`.
#[track_caller]
pub fn must<T>(what: &str, res: Result<T, Status>) -> T {
    res.unwrap_or_else(|s| panic!("{what}: expected OK, got {:?}: {}", s.code(), s.message()))
}
