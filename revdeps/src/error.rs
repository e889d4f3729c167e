//! Errors, each carrying the file and line (or the command) it came from.

use std::path::PathBuf;

/// A syntax error inside one opam file, before the file name is known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {col}: {msg}")]
pub struct SyntaxError {
    pub line: u32,
    pub col: u32,
    pub msg: String,
}

/// A problem with one opam file; the run reports it and skips the package.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FileError {
    #[error("{file}:{line}:{col}: {msg}")]
    Syntax {
        file: String,
        line: u32,
        col: u32,
        msg: String,
    },
    #[error("{file}:{line}: field `{field}`: {msg}")]
    Field {
        file: String,
        line: u32,
        field: String,
        msg: String,
    },
    #[error("{file}: {msg}")]
    Other { file: String, msg: String },
}

impl FileError {
    pub fn syntax(file: &str, e: SyntaxError) -> Self {
        FileError::Syntax {
            file: file.to_string(),
            line: e.line,
            col: e.col,
            msg: e.msg,
        }
    }
}

/// Errors that stop a run: the repository or the request itself is unusable.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("git {args}: {msg}")]
    Git { args: String, msg: String },
    #[error("{0}: not an opam repository (no packages/ directory)")]
    NotARepository(PathBuf),
    #[error("bad package `{0}`: expected NAME.VERSION")]
    BadPackage(String),
    #[error("package {0} is not in the repository")]
    UnknownPackage(String),
}
