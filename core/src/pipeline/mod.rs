//! Pipelines: the file format, its checks and the plan the server walks.
//!
//! # Layout
//!
//! - [`spec`]: the typed pipeline (hosts, items, steps) with spans.
//! - [`template`]: `{id}`, `{out}`, `{in}`, `{STAGE.out}` in commands and
//!   paths, and shell quoting of their values.
//! - [`lexer`]: the file's statements as words: comments, `\` lines and the
//!   command colon, each character's line and column.
//! - [`parse`]: the file's text into a [`PipelineSpec`], syntax errors with
//!   line and column.
//! - [`check`]: what must hold before any host is contacted (hosts exist,
//!   fields known where used, every move has a source, …).
//! - [`items`]: what an item id may be, and how many a listing may give.
//! - [`error`]: an error in a pipeline file: file, line, column, message and
//!   the line itself.
//! - [`plan`]: the checked pipeline as the engine walks it: nodes, gates,
//!   what follows each node.
//!
//! The format, one statement per line (`#` starts a comment; a line ending
//! in `\` continues on the next):
//!
//! ```text
//! host scan = agent local-1
//! host gpus = agent labels gpu=h200
//! host ocr  = ssh://ocr@10.0.0.7:22 key id_ed25519
//! items on scan: ls /data/pdf | sed -n 's/\.pdf$//p'
//! stage split on scan jobs 2 out /scratch/pages/{id}/: pdftoppm -png /data/pdf/{id}.pdf {out}/p
//! move pages to ocr:/tmp/pages/{id}
//! limit 4 {
//!     stage read on ocr jobs 2 out /tmp/text/{id}.txt consume: cat {in}/*.png | ocr > {out}
//! }
//! move text to gpus:/x/in/{id}.txt
//! either {
//!     stage fast on gpus jobs 4 out /x/fast/{id}: enc {in} {out}
//! |
//!     stage slow on gpus jobs 1 out /x/slow/{id}: enc --slow {in} {out}
//! }
//! ```

pub mod check;
pub mod error;
pub mod items;
pub mod lexer;
pub mod parse;
pub mod plan;
pub mod spec;
pub mod template;

pub use error::{PipelineError, PipelineErrors};
pub use plan::Plan;
pub use spec::PipelineSpec;

/// Parses and checks a pipeline file; `file` names it in errors.
pub fn load(file: &str, text: &str) -> Result<PipelineSpec, PipelineErrors> {
    let spec = parse::parse(file, text)?;
    check::check(file, text, &spec)?;
    Ok(spec)
}
