//! Failures every layer shares.
//!
//! Each layer has its own error enum whose variants say what failed (see
//! ARCHITECTURE.md, "Errors"); `service/` alone decides which gRPC code each
//! one gets. This module holds what they all build on: [`IoError`] (a system
//! call that failed, with what the driver was doing), [`IoContext`] to attach
//! that context, and [`blocking`] to run syscalls off the async executor.

use std::io;

/// A system call or file operation that failed, and what the driver was doing.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct IoError {
    pub context: String,
    #[source]
    pub source: io::Error,
}

impl IoError {
    pub fn new(context: impl Into<String>, source: io::Error) -> Self {
        Self {
            context: context.into(),
            source,
        }
    }
    /// The device or the volume's quota is full (ENOSPC, EDQUOT).
    pub fn is_out_of_space(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::ENOSPC) | Some(libc::EDQUOT)
        )
    }
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

/// Adds context to `io::Result`s: `fs::read(p).ctx(|| format!("reading {p:?}"))`.
pub trait IoContext<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> std::result::Result<T, IoError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> std::result::Result<T, IoError> {
        self.map_err(|e| IoError::new(f(), e))
    }
}

impl<T> IoContext<T> for nix::Result<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> std::result::Result<T, IoError> {
        self.map_err(|e| IoError::new(f(), io::Error::from(e)))
    }
}

/// Runs blocking filesystem or syscall work off the async executor. A task
/// that panicked comes back as an [`IoError`] of kind `Other`.
pub async fn blocking<T, E, F>(f: F) -> std::result::Result<T, E>
where
    F: FnOnce() -> std::result::Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<IoError> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        E::from(IoError::new(
            "blocking task failed",
            io::Error::other(e.to_string()),
        ))
    })?
}
