//! One job of a pipeline run: list items, run a stage, send, receive or
//! remove a moved output, here or on an ssh host. (Being written.)

use flotilla_core::job::{FailureClass, StepJob};
use flotilla_core::protocol::{Complete, Fail};

use super::JobContext;

pub async fn run(ctx: &JobContext, _spec: &StepJob) -> Result<Complete, Fail> {
    Err(ctx.fail(FailureClass::Fatal, "pipeline steps are not built yet"))
}
