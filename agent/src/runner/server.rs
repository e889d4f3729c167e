//! The server as the loops see it: a trait, so that a test can fake it.

use std::future::Future;
use std::time::Duration;

use flotilla_core::protocol::{Heartbeat, HeartbeatReply, LeaseReply};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::server_api::{CallError, JobCall, ServerApi};

/// The agent-protocol calls the lease loop, the heartbeat loop and the
/// reports make; [`ServerApi`] in the agent.
pub trait Server: Send + Sync + 'static {
    /// Long-polls for a job for up to `wait`; retried while the server is
    /// unreachable until `stop` fires.
    fn lease(
        &self,
        wait: Duration,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<LeaseReply, CallError>> + Send;

    /// One try: a missed heartbeat is sent again at the next interval.
    fn heartbeat(
        &self,
        hb: &Heartbeat,
    ) -> impl Future<Output = Result<HeartbeatReply, CallError>> + Send;

    /// Start, complete or fail a job; retried while the server is
    /// unreachable until `stop` fires.
    fn job_call(
        &self,
        job: Uuid,
        call: JobCall<'_>,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<(), CallError>> + Send;
}

impl Server for ServerApi {
    async fn lease(
        &self,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<LeaseReply, CallError> {
        ServerApi::lease(self, wait, stop).await
    }

    async fn heartbeat(&self, hb: &Heartbeat) -> Result<HeartbeatReply, CallError> {
        ServerApi::heartbeat(self, hb).await
    }

    async fn job_call(
        &self,
        job: Uuid,
        call: JobCall<'_>,
        stop: &CancellationToken,
    ) -> Result<(), CallError> {
        ServerApi::job_call(self, job, call, stop).await
    }
}
