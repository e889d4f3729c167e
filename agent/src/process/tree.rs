//! The process tree of one command: waiting for it and ending its whole group.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use process_wrap::tokio::TokioChildWrapper;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{CommandSpec, Outcome, ProcessError};

/// How long to wait for the group to vanish after SIGKILL before giving up
/// with a warning (a process in uninterruptible sleep dies only when its I/O
/// finishes).
#[cfg(unix)]
const KILL_WAIT: Duration = Duration::from_secs(10);

/// The spawned shell and everything it starts.
pub(super) struct Tree {
    child: Box<dyn TokioChildWrapper>,
    /// The shell's pid, which is also the process group id: the shell leads
    /// a new group.
    pid: u32,
    pub(super) command: String,
    /// Set once the whole tree is known to be ended; until then, dropping
    /// the tree kills it.
    ended: bool,
}

impl Tree {
    pub(super) fn new(child: Box<dyn TokioChildWrapper>, command: String) -> Self {
        let pid = child
            .id()
            .expect("a child that was just spawned has not been reaped");
        Self {
            child,
            pid,
            command,
            ended: false,
        }
    }

    fn wait_error(&self, source: io::Error) -> ProcessError {
        ProcessError::Wait {
            command: self.command.clone(),
            pid: self.pid,
            source,
        }
    }

    /// Waits for the shell to exit, the timeout or cancellation; then ends
    /// and reaps the tree.
    pub(super) async fn supervise(
        &mut self,
        spec: &CommandSpec,
        cancel: &CancellationToken,
    ) -> Result<Outcome, ProcessError> {
        let deadline = spec.timeout.map(|t| Instant::now() + t);
        let first = tokio::select! {
            // A shell that has already exited wins over a cancellation that
            // arrives at the same time: its exit status is the truth.
            biased;
            status = self.child.inner_mut().wait() => End::Exited(status.map_err(|e| self.wait_error(e))?),
            _ = cancel.cancelled() => End::Stopped(Outcome::Cancelled),
            _ = sleep_until(deadline) => End::Stopped(Outcome::TimedOut),
        };
        let status = self.end_tree(first, spec.kill_grace).await?;
        self.ended = true;
        Ok(match first {
            End::Stopped(outcome) => outcome,
            End::Exited(_) => outcome_of(status),
        })
    }

    /// Ends everything left of the tree and returns the shell's exit status.
    #[cfg(unix)]
    async fn end_tree(&mut self, first: End, grace: Duration) -> Result<ExitStatus, ProcessError> {
        use nix::sys::signal::Signal;
        let pgid = self.pgid();
        let mut status = match first {
            End::Exited(status) => Some(status),
            End::Stopped(_) => None,
        };
        if status.is_none() || group::has_live_members(pgid) {
            tracing::debug!(command = %self.command, pgid = self.pid, "SIGTERM to the process group");
            group::signal(pgid, Signal::SIGTERM);
        }
        let grace_end = Instant::now() + grace;
        if status.is_none() {
            if let Ok(s) = tokio::time::timeout_at(grace_end, self.child.inner_mut().wait()).await {
                status = Some(s.map_err(|e| self.wait_error(e))?);
            }
        }
        let gone = status.is_some() && group::wait_until_empty(pgid, grace_end).await;
        if !gone {
            tracing::debug!(command = %self.command, pgid = self.pid, "SIGKILL to the process group");
            group::signal(pgid, Signal::SIGKILL);
        }
        let status = match status {
            Some(s) => s,
            None => self
                .child
                .inner_mut()
                .wait()
                .await
                .map_err(|e| self.wait_error(e))?,
        };
        if !gone && !group::wait_until_empty(pgid, Instant::now() + KILL_WAIT).await {
            tracing::warn!(
                command = %self.command,
                pgid = self.pid,
                "process group members survive SIGKILL after {KILL_WAIT:?} (uninterruptible I/O?)",
            );
        }
        group::reap_adopted(pgid);
        Ok(status)
    }

    /// Ends everything left of the tree and returns the shell's exit status.
    #[cfg(windows)]
    async fn end_tree(&mut self, first: End, _grace: Duration) -> Result<ExitStatus, ProcessError> {
        // After the shell exits this ends what it left behind; before, it is
        // the cancellation itself. Terminating an empty job is harmless.
        if let Err(e) = self.child.start_kill() {
            tracing::warn!(command = %self.command, "terminating the job object: {e}");
        }
        let status = match first {
            End::Exited(status) => status,
            End::Stopped(_) => self
                .child
                .inner_mut()
                .wait()
                .await
                .map_err(|e| self.wait_error(e))?,
        };
        // Waits until the job object has no process left.
        Box::into_pin(self.child.wait())
            .await
            .map_err(|e| self.wait_error(e))?;
        Ok(status)
    }

    #[cfg(unix)]
    fn pgid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(
            i32::try_from(self.pid).expect("pids fit in pid_t, the type they come from"),
        )
    }
}

impl Tree {
    /// Kills the whole tree at once, without waiting. The shell itself is
    /// reaped by tokio, which takes over children dropped before they were
    /// waited for.
    pub(super) fn kill(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        #[cfg(unix)]
        group::signal(self.pgid(), nix::sys::signal::Signal::SIGKILL);
        #[cfg(windows)]
        if let Err(e) = self.child.start_kill() {
            tracing::warn!(command = %self.command, "terminating the job object: {e}");
        }
    }
}

impl Drop for Tree {
    /// The run was abandoned (its future dropped): nothing of it may stay.
    fn drop(&mut self) {
        self.kill();
    }
}

/// What ended the first wait.
#[derive(Clone, Copy)]
enum End {
    Exited(ExitStatus),
    Stopped(Outcome),
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn outcome_of(status: ExitStatus) -> Outcome {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return Outcome::Signalled { signal };
        }
    }
    // `code` is None only for a signal death, handled above.
    Outcome::Exited {
        code: status.code().unwrap_or(-1),
    }
}

/// Process-group operations by pgid. They never fail the run: a group that
/// is already gone is the goal, and any other error is logged.
#[cfg(unix)]
mod group {
    use std::time::Duration;

    use nix::errno::Errno;
    use nix::sys::signal::{killpg, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::Pid;
    use tokio::time::Instant;

    pub(super) fn signal(pgid: Pid, sig: Signal) {
        match killpg(pgid, sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pgid = pgid.as_raw(), "{sig} to the process group: {e}"),
        }
    }

    /// True while a process of the group is alive (not a zombie).
    pub(super) fn has_live_members(pgid: Pid) -> bool {
        match killpg(pgid, None) {
            Err(Errno::ESRCH) => false,
            // EPERM: a member exists that we may not signal; count it.
            Ok(()) | Err(_) => live_beyond_zombies(pgid),
        }
    }

    /// `killpg` also finds zombies, which only their parent can clear;
    /// /proc tells them apart from the living.
    #[cfg(target_os = "linux")]
    fn live_beyond_zombies(pgid: Pid) -> bool {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return true;
        };
        dir.filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            })
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .any(|stat| {
                // "pid (comm) state ppid pgrp ...": comm may hold spaces and
                // parentheses, so fields are counted from the last ')'.
                let Some((_, rest)) = stat.rsplit_once(')') else {
                    return false;
                };
                let mut fields = rest.split_whitespace();
                let state = fields.next();
                let pgrp = fields.nth(1).and_then(|f| f.parse::<i32>().ok());
                pgrp == Some(pgid.as_raw()) && !matches!(state, Some("Z" | "X" | "x"))
            })
    }

    #[cfg(not(target_os = "linux"))]
    fn live_beyond_zombies(_pgid: Pid) -> bool {
        true
    }

    /// Polls until the group has no live member or `until` passes; true if
    /// it emptied.
    pub(super) async fn wait_until_empty(pgid: Pid, until: Instant) -> bool {
        // Start fast (most groups are gone within a few ms of the signal),
        // then back off so a long grace does not scan /proc hundreds of times.
        let mut pause = Duration::from_millis(5);
        loop {
            if !has_live_members(pgid) {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            tokio::time::sleep(pause.min(until - now)).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Reaps members that were re-parented to this process, which happens
    /// when it is PID 1 or a subreaper; elsewhere there are none (ECHILD).
    /// Called after the shell was reaped, so it cannot steal tokio's child.
    pub(super) fn reap_adopted(pgid: Pid) {
        let any_in_group = Pid::from_raw(-pgid.as_raw());
        while let Ok(status) = waitpid(any_in_group, Some(WaitPidFlag::WNOHANG)) {
            if status == WaitStatus::StillAlive {
                break;
            }
        }
    }
}
