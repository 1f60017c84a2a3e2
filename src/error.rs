//! The crate's error type and its mapping onto NCCL's `ncclResult_t` codes.
//!
//! Rich text goes to the log; the code goes to NCCL (the hyper/rustls-ffi pattern).
#![forbid(unsafe_code)]

/// NCCL's `ncclResult_t` values (`src/nccl.h.in`). The FFI layer converts these to the bindgen type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ResultCode {
    Success = 0,
    UnhandledCudaError = 1,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6,
    InProgress = 7,
    Timeout = 8,
}

/// Every failure the plugin can report. The message names what was wrong and, for input errors,
/// what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// NCCL passed a NULL or invalid argument (NCCL misused the API).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The user's configuration or environment is wrong (env variables, files).
    #[error("invalid configuration: {0}")]
    InvalidUsage(String),
    /// The kernel, a library or the fabric failed (verbs calls, sockets, completion errors on our side).
    #[error("system error: {0}")]
    System(String),
    /// The peer failed or sent something invalid; remote completion errors.
    #[error("remote error: {0}")]
    Remote(String),
    /// A deadline passed (connection set-up).
    #[error("timeout: {0}")]
    Timeout(String),
    /// A bug in the plugin (a broken invariant, a caught panic).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The `ncclResult_t` value NCCL receives for this error.
    pub fn code(&self) -> ResultCode {
        match self {
            Error::InvalidArgument(_) => ResultCode::InvalidArgument,
            Error::InvalidUsage(_) => ResultCode::InvalidUsage,
            Error::System(_) => ResultCode::SystemError,
            Error::Remote(_) => ResultCode::RemoteError,
            Error::Timeout(_) => ResultCode::SystemError,
            Error::Internal(_) => ResultCode::InternalError,
        }
    }

    /// The same error, its message prefixed with `context: ` (the kind, and so NCCL's code, is kept).
    pub fn context(self, context: impl std::fmt::Display) -> Error {
        self.map_message(|x| format!("{context}: {x}"))
    }

    /// The same error, `tail` appended to its message (the kind, and so NCCL's code, is kept).
    pub fn append(self, tail: impl std::fmt::Display) -> Error {
        self.map_message(|x| format!("{x}{tail}"))
    }

    fn map_message(self, m: impl FnOnce(String) -> String) -> Error {
        match self {
            Error::InvalidArgument(x) => Error::InvalidArgument(m(x)),
            Error::InvalidUsage(x) => Error::InvalidUsage(m(x)),
            Error::System(x) => Error::System(m(x)),
            Error::Remote(x) => Error::Remote(m(x)),
            Error::Timeout(x) => Error::Timeout(m(x)),
            Error::Internal(x) => Error::Internal(m(x)),
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl std::fmt::Display, err: std::io::Error) -> Self {
        Error::System(format!("{context}: {err}"))
    }
}

/// The crate-wide result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_nccl() {
        assert_eq!(Error::InvalidArgument("x".into()).code() as i32, 4);
        assert_eq!(Error::InvalidUsage("x".into()).code() as i32, 5);
        assert_eq!(Error::System("x".into()).code() as i32, 2);
        assert_eq!(Error::Remote("x".into()).code() as i32, 6);
        assert_eq!(Error::Internal("x".into()).code() as i32, 3);
        assert_eq!(Error::Timeout("x".into()).code() as i32, 2);
    }

    #[test]
    fn context_prefixes_the_message_and_keeps_the_kind() {
        let e = Error::Remote("peer closed".into()).context("connection with 10.0.0.2: reply");
        assert_eq!(
            e,
            Error::Remote("connection with 10.0.0.2: reply: peer closed".into())
        );
        let e = Error::Timeout("5 s".into()).context("connect");
        assert_eq!(e.code(), ResultCode::SystemError);
        assert_eq!(e.to_string(), "timeout: connect: 5 s");
    }
}
