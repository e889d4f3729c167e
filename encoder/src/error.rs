//! The library's error type: every variant names the file, tensor or setting at fault.

use std::path::PathBuf;

/// Everything that can go wrong while loading a checkpoint, reading a tile,
/// encoding it or writing the result.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid .npy file: {reason}")]
    Npy { path: PathBuf, reason: String },
    #[error("tile input {path}: {reason}")]
    Tile { path: PathBuf, reason: String },
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },
    #[error("checkpoint tensor `{name}`: {reason}")]
    Tensor { name: String, reason: String },
    #[error("device profile {path}: {reason}")]
    Profile { path: PathBuf, reason: String },
    #[error("backend `{backend}`: {reason}")]
    Backend { backend: String, reason: String },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("cancelled")]
    Cancelled,
}

impl EncodeError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EncodeError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn tensor(name: impl Into<String>, reason: impl Into<String>) -> Self {
        EncodeError::Tensor {
            name: name.into(),
            reason: reason.into(),
        }
    }
    pub(crate) fn backend(backend: &str, reason: impl std::fmt::Display) -> Self {
        EncodeError::Backend {
            backend: backend.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// For conversions that cannot fail (`DeviceProfile::resolve` given a
/// `BackendChoice` rather than a name).
impl From<std::convert::Infallible> for EncodeError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

pub type Result<T, E = EncodeError> = std::result::Result<T, E>;
