//! What a parsed pipeline must satisfy before any host is contacted.
//! (Being written.)

use super::error::PipelineErrors;
use super::spec::PipelineSpec;

pub fn check(_file: &str, _text: &str, _spec: &PipelineSpec) -> Result<(), PipelineErrors> {
    Ok(())
}
