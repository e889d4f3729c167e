//! An error in a pipeline file: where it is and what is wrong.

use std::fmt;

use super::spec::Span;

/// One mistake in a pipeline file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineError {
    pub file: String,
    pub span: Span,
    pub message: String,
    /// The line it is on, to show under the message with a caret.
    pub line_text: String,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.span.line, self.span.col, self.message
        )?;
        if !self.line_text.is_empty() {
            let pad: String = self
                .line_text
                .chars()
                .take(self.span.col.saturating_sub(1) as usize)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            write!(f, "\n    {}\n    {pad}^", self.line_text)?;
        }
        Ok(())
    }
}

/// Every mistake found, in file order (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineErrors(pub Vec<PipelineError>);

impl fmt::Display for PipelineErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PipelineErrors {}
