//! The pipeline file's text into a [`PipelineSpec`].
//! (Being written: see the format in the module above.)

use super::error::PipelineErrors;
use super::spec::PipelineSpec;

pub fn parse(_file: &str, _text: &str) -> Result<PipelineSpec, PipelineErrors> {
    todo!("pipeline parser")
}
