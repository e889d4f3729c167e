//! A job's log: its processes' lines and the agent's own, batched to the server.

use std::time::Duration;

use flotilla_core::protocol::{LeaseRef, LogBatch, LogLine, LogStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::server_api::{JobCall, ServerApi};

/// Lines per request at most: well under the server's limit of 10,000 per
/// batch, and 500 lines of at most 64 KiB stay under 32 MiB.
const BATCH_LINES: usize = 500;

/// How long a line may wait for others to share its request: a log that
/// trickles still shows up in the dashboard within a fifth of a second.
const BATCH_WAIT: Duration = Duration::from_millis(200);

/// Lines buffered between the job and the forwarder. When full, the job
/// waits (a child process then blocks on its next write once its pipe
/// fills), so a slow server slows the job instead of growing memory.
const BUFFERED_LINES: usize = 1024;

/// Where a job writes its log lines. Clones share one forwarder; the log is
/// closed when the last clone is dropped.
#[derive(Clone)]
pub struct JobLog {
    tx: mpsc::Sender<LogLine>,
}

/// The task that sends a job's log lines; [`Forwarder::finish`] waits until
/// every line written was delivered (or given up on).
pub struct Forwarder {
    task: JoinHandle<()>,
}

impl JobLog {
    /// Starts forwarding lines for the attempt `lease`. Deliveries are
    /// retried while the server is unreachable until `give_up` fires.
    pub fn start(
        api: ServerApi,
        lease: LeaseRef,
        give_up: CancellationToken,
    ) -> (JobLog, Forwarder) {
        let (tx, rx) = mpsc::channel(BUFFERED_LINES);
        let task = tokio::spawn(forward(api, lease, rx, give_up));
        (JobLog { tx }, Forwarder { task })
    }

    /// Appends one line. A log whose forwarder has stopped drops it.
    pub async fn line(&self, line: LogLine) {
        let _ = self.tx.send(line).await;
    }

    /// Appends a line of the agent's own about the job (shown as `[agent] …`).
    pub async fn agent(&self, text: impl Into<String>) {
        self.line(agent_line(text)).await;
    }

    /// [`JobLog::agent`] for a blocking thread (the encoder's, the solver's).
    pub fn agent_blocking(&self, text: impl Into<String>) {
        let _ = self.tx.blocking_send(agent_line(text));
    }
}

fn agent_line(text: impl Into<String>) -> LogLine {
    LogLine {
        stream: LogStream::Agent,
        line: text.into(),
    }
}

impl Forwarder {
    /// Waits until the log is closed (every [`JobLog`] dropped) and its
    /// lines were sent.
    pub async fn finish(self) {
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "the log forwarder panicked; log lines lost");
        }
    }
}

/// Batches lines to the server: up to [`BATCH_LINES`] lines or
/// [`BATCH_WAIT`], whichever comes first.
async fn forward(
    api: ServerApi,
    lease: LeaseRef,
    mut rx: mpsc::Receiver<LogLine>,
    give_up: CancellationToken,
) {
    let job = lease.job_id;
    let mut batch = Vec::new();
    loop {
        let deadline = tokio::time::sleep(BATCH_WAIT);
        tokio::pin!(deadline);
        let mut closed = false;
        loop {
            tokio::select! {
                line = rx.recv() => match line {
                    Some(l) => {
                        batch.push(l);
                        if batch.len() >= BATCH_LINES { break; }
                    }
                    None => { closed = true; break; }
                },
                _ = &mut deadline => break,
            }
        }
        if !batch.is_empty() {
            let b = LogBatch {
                lease_token: lease.lease_token,
                lines: std::mem::take(&mut batch),
            };
            if let Err(e) = api.job_call(job, JobCall::Log(&b), &give_up).await {
                if e.lease_gone() {
                    // Keep draining so the process is never blocked.
                    while rx.recv().await.is_some() {}
                    return;
                }
                tracing::warn!(%job, error = %e, "log lines lost");
            }
        }
        if closed {
            return;
        }
    }
}
