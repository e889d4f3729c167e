//! One job of a pipeline run: list items, run a stage, send, receive or
//! remove a moved output, here or on an ssh host.
//!
//! Every action is a POSIX `sh` script run under the agent's process
//! machinery ([`crate::process`]), here in the attempt's directory as the
//! job's user, or through `ssh` on the host (in the remote user's home
//! directory): the same timeout, stop and log for both. Relative paths
//! are taken from there. The files the agent itself writes or reads for a
//! step (a probe's path list, a move's tar) are in the attempt's
//! agent-side directory instead, which the job's user cannot reach.
//!
//! # Layout
//!
//! - [`place`]: here or over ssh; runs a script and picks out its marker
//!   lines.
//! - [`script`]: the scripts' text, and the marker lines they speak with.
//! - [`agent_side`]: the agent's own directory per attempt, its files
//!   opened without following links.
//! - [`ssh_dir`]: the operator's `--ssh-dir`: keys, known hosts and the
//!   ssh_config every `ssh` reads.
//! - [`ssh`]: the master connection per host and the `ssh -S` command lines.
//! - [`items`]: a listing's lines as checked item ids.
//! - [`transfer`]: send and receive: tars packed, uploaded, downloaded,
//!   checked and unpacked.
//!
//! Steps need a Unix shell on both ends; elsewhere the agent does not
//! offer the kind ([`SUPPORTED`]).

#[cfg(unix)]
pub mod agent_side;
#[cfg(unix)]
pub mod items;
#[cfg(unix)]
pub mod place;
#[cfg(unix)]
pub mod script;
#[cfg(unix)]
pub mod ssh;
#[cfg(unix)]
pub mod ssh_dir;
#[cfg(unix)]
pub mod transfer;

use flotilla_core::job::{FailureClass, StepJob};
use flotilla_core::protocol::{Complete, Fail};

use super::JobContext;

/// Whether this agent can run step jobs (it offers the `step` kind).
pub const SUPPORTED: bool = cfg!(unix);

#[cfg(unix)]
pub use self::ssh::SshSessions;
#[cfg(unix)]
pub use self::ssh_dir::SshDir;

/// No ssh sessions where steps do not run.
#[cfg(not(unix))]
pub struct SshSessions;

#[cfg(not(unix))]
impl SshSessions {
    pub fn new(_dir: &std::path::Path, _ssh_dir: Option<SshDir>) -> Self {
        SshSessions
    }
}

/// No `--ssh-dir` where steps do not run.
#[cfg(not(unix))]
#[derive(Debug, Clone)]
pub enum SshDir {}

#[cfg(not(unix))]
impl SshDir {
    pub fn prepare(_dir: &std::path::Path, _accept_new: bool) -> Result<SshDir, String> {
        Err("ssh hosts need a Unix agent".into())
    }
}

#[cfg(not(unix))]
pub async fn run(ctx: &JobContext, _ssh: &SshSessions, _spec: &StepJob) -> Result<Complete, Fail> {
    Err(ctx.fail(FailureClass::Fatal, "pipeline steps need a Unix agent"))
}

#[cfg(unix)]
pub use self::unix::run;

#[cfg(unix)]
use self::unix::ended;

#[cfg(unix)]
mod unix {
    use std::time::Duration;

    use flotilla_core::job::{StepAction, StepHost, StepItems};
    use flotilla_core::pipeline::spec::SshTarget;

    use super::items::Items;
    use super::place::{run_script, Ended, Io, Place};
    use super::script::{self, Marker, Out};
    use super::*;
    use crate::process::Outcome;

    /// Runs one step job to its report; `ssh` holds the agent's master
    /// connections.
    pub async fn run(
        ctx: &JobContext,
        ssh: &SshSessions,
        spec: &StepJob,
    ) -> Result<Complete, Fail> {
        make_job_dir(ctx).map_err(|e| {
            ctx.fail(
                FailureClass::Retryable,
                format!("cannot make work directory {}: {e}", ctx.job_dir.display()),
            )
        })?;
        agent_side::make(ctx).map_err(|e| {
            ctx.fail(
                FailureClass::Retryable,
                format!(
                    "cannot make the agent's directory {}: {e}",
                    ctx.agent_dir.display()
                ),
            )
        })?;
        let place = match &spec.host {
            StepHost::Local => Place::Local,
            StepHost::Ssh(target) => {
                check_target(target).map_err(|why| ctx.fail(FailureClass::Fatal, why))?;
                let session = tokio::select! {
                    s = ssh.connect(target) => s,
                    _ = ctx.stop.cancelled() => return Err(ctx.fail(FailureClass::Cancelled, "stopped")),
                };
                let session = session.map_err(|e| {
                    let class = if e.is_fatal() {
                        FailureClass::Fatal
                    } else {
                        FailureClass::Retryable
                    };
                    ctx.fail(class, e.to_string())
                })?;
                Place::Ssh {
                    target: target.clone(),
                    session,
                    config: ssh
                        .config_file()
                        .expect("a session was made, so the agent has an --ssh-dir"),
                }
            }
        };
        ctx.note(format!(
            "step `{}` of item `{}` on {}",
            spec.step,
            spec.item,
            place.describe()
        ))
        .await;
        let marker = Marker::new();
        let timeout = spec.timeout_s.map(Duration::from_secs);
        match &spec.action {
            StepAction::List { command } => list(ctx, &place, &marker, command, timeout).await,
            StepAction::Run {
                command,
                out,
                consume,
            } => {
                // Each attempt writes its own temporary path: an earlier
                // attempt that outlived its job (ssh gone, the remote
                // command not) cannot write into what this one renames.
                let temp = out
                    .as_ref()
                    .map(|o| format!("{}-{}-{}", o.temp, ctx.job_id().simple(), ctx.attempt));
                let out = out.as_ref().zip(temp.as_deref()).map(|(o, temp)| Out {
                    path: &o.path,
                    temp,
                    others: &o.temp,
                    dir: o.dir,
                });
                // Only a retry can follow an attempt that finished unreported.
                let retry = ctx.attempt > 1;
                let script = script::run(&marker, command, out, consume.as_deref(), retry);
                run_plain(ctx, &place, &marker, &script, timeout).await
            }
            StepAction::Send { path } => transfer::send(ctx, &place, &marker, path, timeout).await,
            StepAction::Receive { size, sha256, path } => {
                transfer::receive(ctx, &place, &marker, (*size, sha256), path, timeout).await
            }
            StepAction::Remove { path } => {
                let script = script::remove(&marker, path);
                run_plain(ctx, &place, &marker, &script, timeout).await
            }
            StepAction::Probe { paths } => probe(ctx, &place, &marker, paths, timeout).await,
        }
    }

    /// Which of `paths` exist: they go to the script on its stdin (a list
    /// of thousands would not fit one argument; written to the agent-side
    /// directory and handed over open), the ones that exist come back as
    /// marker lines.
    async fn probe(
        ctx: &JobContext,
        place: &Place,
        marker: &Marker,
        paths: &[String],
        timeout: Option<Duration>,
    ) -> Result<Complete, Fail> {
        let list = ctx.agent_dir.join("probe.paths");
        let mut text = String::new();
        for p in paths {
            if p.contains('\n') || p.contains('\0') {
                return Err(ctx.fail(
                    FailureClass::Fatal,
                    format!("a path to look for holds a line break or NUL: {p:?}"),
                ));
            }
            text.push_str(p);
            text.push('\n');
        }
        let written = (|| {
            use std::io::{Seek, Write};
            let mut f = agent_side::create(&list)?;
            f.write_all(text.as_bytes())?;
            f.rewind()?;
            Ok::<_, std::io::Error>(f)
        })();
        let file = written.map_err(|e| {
            ctx.fail(
                FailureClass::Retryable,
                format!("cannot write the paths to look for: {e}"),
            )
        })?;
        let mut exist = Vec::new();
        let mut exist_size = flotilla_core::pipeline::items::ListSize::default();
        let io = Io {
            stdin: Some(file),
            stdout: None,
        };
        let end = run_script(
            ctx,
            place,
            marker,
            &script::probe(marker),
            io,
            timeout,
            |line| {
                // The report carries the list whole (see `Items`).
                if !exist_size.add(line) {
                    return Err(format!(
                        "the outputs found take more than {} MiB as the report carries them \
                         ({} so far); run the rest of this file as a new run in another \
                         directory, or remove the outputs it should not resume from",
                        items::MAX_LIST_JSON_BYTES >> 20,
                        exist.len()
                    ));
                }
                exist.push(line.to_string());
                Ok(())
            },
        )
        .await
        .map_err(|e| ctx.fail(FailureClass::Fatal, e.to_string()))?;
        ended(ctx, place, end, timeout)?;
        ctx.note(format!(
            "{} of {} outputs exist already on {}",
            exist.len(),
            paths.len(),
            place.describe()
        ))
        .await;
        let result = serde_json::to_value(flotilla_core::job::StepProbe { exist })
            .expect("a list of strings is valid JSON");
        Ok(ctx.complete(Some(0), Vec::new(), Some(result)))
    }

    /// Runs a script that reports nothing but how it ended.
    async fn run_plain(
        ctx: &JobContext,
        place: &Place,
        marker: &Marker,
        script: &str,
        timeout: Option<Duration>,
    ) -> Result<Complete, Fail> {
        let end = run_script(ctx, place, marker, script, Io::default(), timeout, |_| {
            Ok(())
        })
        .await
        .map_err(|e| ctx.fail(FailureClass::Fatal, e.to_string()))?;
        ended(ctx, place, end, timeout)?;
        Ok(ctx.complete(Some(0), Vec::new(), None))
    }

    /// Runs the listing; its stdout's lines are the items.
    async fn list(
        ctx: &JobContext,
        place: &Place,
        marker: &Marker,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<Complete, Fail> {
        let mut items = Items::default();
        let script = script::list(marker, command);
        let end = run_script(
            ctx,
            place,
            marker,
            &script,
            Io::default(),
            timeout,
            |line| items.push_line(line).map_err(|e| e.to_string()),
        )
        .await
        .map_err(|e| ctx.fail(FailureClass::Fatal, e.to_string()))?;
        ended(ctx, place, end, timeout)?;
        ctx.note(format!(
            "listed {} items on {}",
            items.len(),
            place.describe()
        ))
        .await;
        let result = serde_json::to_value(StepItems {
            items: items.into_vec(),
        })
        .expect("a list of strings is valid JSON");
        Ok(ctx.complete(Some(0), Vec::new(), Some(result)))
    }

    /// The report for a script that did not end well, or nothing: a
    /// marker's message first, then how the process ended.
    pub fn ended(
        ctx: &JobContext,
        place: &Place,
        end: Ended,
        timeout: Option<Duration>,
    ) -> Result<(), Fail> {
        let code = match end.outcome {
            Outcome::Exited { code } => Some(code),
            _ => None,
        };
        let fail = |class, message: String| Fail {
            exit_code: code,
            ..ctx.fail(class, message)
        };
        if let Some(why) = end.fatal {
            return Err(fail(FailureClass::Fatal, why));
        }
        match end.outcome {
            Outcome::Exited { code: 0 } => Ok(()),
            Outcome::Exited { code } => Err(fail(
                FailureClass::Retryable,
                match end.failed {
                    Some(why) => why,
                    // ssh's own failures are 255 too.
                    None if code == 255 && place.is_ssh() => format!(
                        "exited with code 255 on {}: the command's own, or ssh lost the \
                         connection",
                        place.describe()
                    ),
                    None => format!("command exited with code {code}"),
                },
            )),
            Outcome::Signalled { signal } => Err(fail(
                FailureClass::Retryable,
                format!("command was killed by signal {signal}"),
            )),
            Outcome::TimedOut => Err(fail(
                FailureClass::TimedOut,
                format!(
                    "command ran past its timeout of {}s",
                    timeout.unwrap_or_default().as_secs()
                ),
            )),
            Outcome::Cancelled => Err(fail(FailureClass::Cancelled, "stopped".into())),
        }
    }

    /// Refuses what `ssh` would read as an option instead of a name.
    fn check_target(t: &SshTarget) -> Result<(), String> {
        let bad = |s: &str| {
            s.is_empty()
                || s.starts_with('-')
                || s.chars().any(|c| c.is_whitespace() || c.is_control())
        };
        if bad(&t.host) {
            return Err(format!(
                "`{}` is not an ssh host name",
                t.host.escape_debug()
            ));
        }
        if let Some(u) = &t.user {
            if bad(u) || u.contains('@') {
                return Err(format!("`{}` is not an ssh user name", u.escape_debug()));
            }
        }
        Ok(())
    }

    /// The attempt's directory, handed to the job's user: local scripts
    /// run in it, tars pass through it.
    fn make_job_dir(ctx: &JobContext) -> std::io::Result<()> {
        std::fs::create_dir_all(&ctx.job_dir)?;
        ctx.run_as
            .give_dir(&ctx.job_dir)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}
