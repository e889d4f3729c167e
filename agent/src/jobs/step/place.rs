//! Where a step's script runs: here or through ssh, as one supervised process.
//!
//! Its marker lines are picked out of its log.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::pipeline::spec::SshTarget;
use openssh::Session;
use tokio::sync::mpsc;

use crate::process::{self, CommandSpec, Outcome, ProcessError, Redirect, RunAs};

use super::script::{Control, Marker};
use super::ssh::{self, Tty};
use super::JobContext;

/// Where a step's commands run.
pub enum Place {
    /// On this agent, in the attempt's directory, as the job's user.
    Local,
    /// On an ssh host, through the agent's master connection to it.
    Ssh {
        target: SshTarget,
        session: Arc<Session>,
        /// `--ssh-dir`/ssh_config, for `ssh -F`.
        config: PathBuf,
    },
}

/// Files on the agent a script's stdin comes from and its stdout goes
/// to: opened by the agent in its own directory, without following links,
/// and handed to the process as they are (never named to a shell, which
/// would open them as whoever it runs as, following what it finds).
#[derive(Debug, Default)]
pub struct Io {
    pub stdin: Option<File>,
    pub stdout: Option<File>,
}

/// How a script ended, and what it said to the agent.
#[derive(Debug)]
pub struct Ended {
    pub outcome: Outcome,
    /// A `fatal` line, or the item handler's refusal.
    pub fatal: Option<String>,
    /// A `failed` line.
    pub failed: Option<String>,
}

impl Place {
    /// `this agent`, or the ssh target, for messages.
    pub fn describe(&self) -> String {
        match self {
            Place::Local => "this agent".into(),
            Place::Ssh { target, .. } => target.to_string(),
        }
    }

    pub fn is_ssh(&self) -> bool {
        matches!(self, Place::Ssh { .. })
    }

    /// The shell command line that runs `script` here or there.
    fn command_line(&self, script: &str, tty: Tty) -> String {
        match self {
            Place::Local => script.into(),
            Place::Ssh {
                target,
                session,
                config,
            } => ssh::command_line(config, session.control_socket(), &target.host, tty, script),
        }
    }

    /// Variables set for the process over the job's scrubbed environment:
    /// `ssh` gets an empty `SSH_AUTH_SOCK` ("no agent"), should
    /// `--pass-env` have passed the agent's own (its config says
    /// `IdentityAgent none` as well).
    fn env(&self) -> Vec<(String, String)> {
        match self {
            Place::Local => Vec::new(),
            Place::Ssh { .. } => vec![("SSH_AUTH_SOCK".into(), String::new())],
        }
    }

    /// Who the local process runs as: the job's user for a local script;
    /// for `ssh`, the agent's own (the master only serves clients of its
    /// own user, and the key is the agent's), with the job's scrubbed
    /// environment all the same.
    fn run_as(&self, job: &RunAs) -> RunAs {
        match self {
            Place::Local => job.clone(),
            Place::Ssh { .. } => RunAs {
                env: job.env.clone(),
                user: None,
            },
        }
    }
}

/// Runs `script` at `place` under [`process::run`] (the job's stop token,
/// `timeout`, the job's kill grace). Marker lines are taken out of the
/// log: items go to `on_item`, whose error ends the run and is reported as
/// [`Ended::fatal`]; `fatal` and `failed` lines fill [`Ended`]. The rest
/// goes to the job's log, `\r` removed (a remote terminal ends lines in
/// `\r\n`).
pub async fn run_script(
    ctx: &JobContext,
    place: &Place,
    marker: &Marker,
    script: &str,
    io: Io,
    timeout: Option<Duration>,
    mut on_item: impl FnMut(&str) -> Result<(), String>,
) -> Result<Ended, ProcessError> {
    // A transfer needs its bytes untouched; everything else gets a
    // terminal so that a stop reaches the remote processes.
    let tty = if io.stdin.is_some() || io.stdout.is_some() {
        Tty::No
    } else {
        Tty::Yes
    };
    let spec = CommandSpec {
        command: place.command_line(script, tty),
        env: [
            ("FLOTILLA_JOB_ID".to_string(), ctx.job_id().to_string()),
            ("FLOTILLA_ATTEMPT".to_string(), ctx.attempt.to_string()),
        ]
        .into_iter()
        .chain(place.env())
        .collect(),
        run_as: place.run_as(&ctx.run_as),
        workdir: ctx.job_dir.clone(),
        timeout,
        kill_grace: ctx.kill_grace,
    };
    // Stopped by the job, or by us when the listing went wrong.
    let stop = ctx.stop.child_token();
    let (tx, mut rx) = mpsc::channel::<process::LogLine>(256);
    let mut fatal = None;
    let mut failed = None;
    let relay = async {
        while let Some(mut line) = rx.recv().await {
            let text = line.line.trim_end_matches('\r');
            match marker.parse(text) {
                Some(Control::Item(id)) if fatal.is_none() => {
                    if let Err(why) = on_item(id) {
                        ctx.note(why.clone()).await;
                        fatal = Some(why);
                        stop.cancel();
                    }
                }
                Some(Control::Item(_)) => {}
                Some(Control::Fatal(why)) => {
                    ctx.note(why).await;
                    fatal = Some(why.to_string());
                }
                Some(Control::Failed(why)) => {
                    ctx.note(why).await;
                    failed = Some(why.to_string());
                }
                None => {
                    let len = text.len();
                    line.line.truncate(len);
                    ctx.log.line(line.into()).await;
                }
            }
        }
    };
    let redirect = Redirect {
        stdin: io.stdin,
        stdout: io.stdout,
    };
    let (outcome, ()) = tokio::join!(process::run_with(&spec, redirect, tx, stop.clone()), relay);
    Ok(Ended {
        outcome: outcome?,
        fatal,
        failed,
    })
}
