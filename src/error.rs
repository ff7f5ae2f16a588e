//! The driver's error type, and the one place where errors become `tonic::Status`.
//!
//! Backends and helpers return [`Error`]; only the `From<Error> for Status` impl
//! below decides which gRPC code a failure gets.

use std::io;

use crate::command::CommandError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Wraps an I/O error with what the driver was doing.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Adds context to `io::Result`s: `fs::read(p).ctx(|| format!("reading {p:?}"))`.
pub trait IoContext<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|e| Error::io(f(), e))
    }
}

impl<T> IoContext<T> for nix::Result<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|e| Error::io(f(), io::Error::from(e)))
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        use tonic::Code;
        let code = match &e {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::Aborted(_) => Code::Aborted,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                Code::ResourceExhausted
            }
            Error::Io { source, .. } if source.raw_os_error() == Some(libc::EDQUOT) => {
                Code::ResourceExhausted
            }
            Error::Command(c) if c.is_timeout() => Code::DeadlineExceeded,
            Error::Io { .. } | Error::Command(_) | Error::Internal(_) => Code::Internal,
        };
        // Keep the whole source chain in the message: it is what an operator reads
        // in `kubectl describe`.
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            let s_str = s.to_string();
            if !msg.contains(&s_str) {
                msg.push_str(": ");
                msg.push_str(&s_str);
            }
            src = s.source();
        }
        tonic::Status::new(code, msg)
    }
}

/// Runs blocking filesystem or syscall work off the async executor.
pub async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}
