//! The crate's error type.
//!
//! A failed oneDNN call (with its status and name) or a caller mistake caught
//! before the call.

use crate::sys;

/// A `dnnl_status_t` other than success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    OutOfMemory,
    InvalidArguments,
    /// No implementation for this problem/attribute combination on this CPU.
    Unimplemented,
    IteratorEnds,
    RuntimeError,
    NotRequired,
    Other(i32),
}

impl Status {
    fn from_raw(raw: sys::dnnl_status_t) -> Self {
        match raw {
            sys::dnnl_out_of_memory => Status::OutOfMemory,
            sys::dnnl_invalid_arguments => Status::InvalidArguments,
            sys::dnnl_unimplemented => Status::Unimplemented,
            sys::dnnl_iterator_ends => Status::IteratorEnds,
            sys::dnnl_runtime_error => Status::RuntimeError,
            sys::dnnl_not_required => Status::NotRequired,
            other => Status::Other(other),
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::OutOfMemory => f.write_str("out of memory"),
            Status::InvalidArguments => f.write_str("invalid arguments"),
            Status::Unimplemented => f.write_str("unimplemented"),
            Status::IteratorEnds => f.write_str("iterator ends"),
            Status::RuntimeError => f.write_str("runtime error"),
            Status::NotRequired => f.write_str("not required"),
            Status::Other(raw) => write!(f, "status {raw}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A oneDNN call returned a non-success status.
    #[error("oneDNN {call} failed: {status}")]
    Dnnl { call: &'static str, status: Status },
    /// A buffer passed to `execute` (or a weight/bias slice) has the wrong length.
    #[error("{what}: expected {expected} elements, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// The element type of a buffer does not match what the primitive was created for.
    #[error("{what}: primitive expects {expected:?}, got {got:?}")]
    DataType {
        what: &'static str,
        expected: crate::DataType,
        got: crate::DataType,
    },
    /// A shape, post-op list or argument combination this crate does not accept.
    #[error("invalid {what}: {why}")]
    Invalid { what: &'static str, why: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a oneDNN status into a `Result`, naming the call that returned it.
pub(crate) fn check(call: &'static str, raw: sys::dnnl_status_t) -> Result<()> {
    if raw == sys::dnnl_success {
        Ok(())
    } else {
        Err(Error::Dnnl {
            call,
            status: Status::from_raw(raw),
        })
    }
}
