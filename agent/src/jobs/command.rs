//! Command jobs: a shell command in its work directory, then its declared outputs uploaded.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_core::job::{CommandJob, FailureClass};
use flotilla_core::protocol::{Complete, Fail};

use crate::process::{CommandSpec, Outcome};
use crate::server_api::CallError;

use super::outputs::open_without_links;
use super::JobContext;

/// Runs the command to its end, then uploads each declared output. The log
/// holds only the command's own lines, the agent adding none: a command's
/// log is its output, which scripts that read it rely on.
pub async fn run(ctx: &JobContext, cmd: &CommandJob) -> Result<Complete, Fail> {
    let fail = |class, message: String, exit_code| Fail {
        exit_code,
        ..ctx.fail(class, message)
    };
    let workdir = match &cmd.workdir {
        Some(w) if Path::new(w).is_absolute() => PathBuf::from(w),
        Some(w) => ctx.job_dir.join(w),
        None => ctx.job_dir.clone(),
    };
    if let Err(e) = make_workdir(ctx, &workdir) {
        return Err(fail(
            FailureClass::Retryable,
            format!("cannot make work directory {}: {e}", workdir.display()),
            None,
        ));
    }
    // Only the job's own variables and its identity are added to the
    // allowlisted base (`RunAs`): nothing else of the agent's environment.
    let mut env = cmd.env.clone();
    env.insert("FLOTILLA_JOB_ID".into(), ctx.job_id().to_string());
    env.insert("FLOTILLA_ATTEMPT".into(), ctx.attempt.to_string());
    let spec = CommandSpec {
        command: cmd.command.clone(),
        env,
        run_as: ctx.run_as.clone(),
        workdir: workdir.clone(),
        timeout: cmd.timeout_s.map(Duration::from_secs),
        kill_grace: ctx.kill_grace,
    };
    let outcome = match ctx.run_process(&spec).await {
        Ok(o) => o,
        Err(e) => return Err(fail(FailureClass::Fatal, e.to_string(), None)),
    };
    let result = match outcome {
        Outcome::Exited { code: 0 } => {
            let mut uploaded = Vec::new();
            for name in &cmd.outputs {
                let path = workdir.join(name);
                // As another user, the job's files are read as the job
                // could read them: through no link it made.
                let opened = match &ctx.run_as.user {
                    Some(_) => match open_without_links(&path) {
                        Ok(o) => Some(o),
                        Err(e) => {
                            return Err(fail(
                                FailureClass::Fatal,
                                format!("output `{name}`: {e}"),
                                Some(0),
                            ))
                        }
                    },
                    None => None,
                };
                let read_from = opened.as_ref().map_or(path.as_path(), |o| o.path());
                match ctx.upload(name, read_from).await {
                    Ok(view) => {
                        tracing::info!(job = %ctx.job_id(), %name, size = view.size, "output stored");
                        uploaded.push(name.clone());
                    }
                    Err(e) => {
                        // A declared output the command did not write will
                        // be missing on every attempt.
                        let class = match &e {
                            CallError::Local { .. } => FailureClass::Fatal,
                            _ => FailureClass::Retryable,
                        };
                        return Err(fail(class, format!("output `{name}`: {e}"), Some(0)));
                    }
                }
            }
            Ok(ctx.complete(Some(0), uploaded, None))
        }
        Outcome::Exited { code } => Err(fail(
            FailureClass::Retryable,
            format!("command exited with code {code}"),
            Some(code),
        )),
        Outcome::Signalled { signal } => Err(fail(
            FailureClass::Retryable,
            format!("command was killed by signal {signal}"),
            None,
        )),
        Outcome::TimedOut => Err(fail(
            FailureClass::TimedOut,
            format!(
                "command ran past its timeout of {}s",
                cmd.timeout_s.unwrap_or(0)
            ),
            None,
        )),
        Outcome::Cancelled => Err(fail(FailureClass::Cancelled, "stopped".into(), None)),
    };
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&ctx.job_dir);
    }
    result
}

/// Makes the job's directory and its work directory in it, each handed to
/// the job's user. With a job user, a work directory outside the job's
/// directory (absolute, or reached with `..`) is not made by the agent,
/// which is root: it must exist, and the job enters it as its user.
fn make_workdir(ctx: &JobContext, workdir: &Path) -> std::io::Result<()> {
    let give = |d: &Path| {
        ctx.run_as
            .give_dir(d)
            .map_err(|e| std::io::Error::other(e.to_string()))
    };
    if ctx.run_as.user.is_none() {
        return std::fs::create_dir_all(workdir);
    }
    std::fs::create_dir_all(&ctx.job_dir)?;
    give(&ctx.job_dir)?;
    let Ok(inside) = workdir.strip_prefix(&ctx.job_dir) else {
        return Ok(());
    };
    let mut dir = ctx.job_dir.clone();
    for part in inside.components() {
        let std::path::Component::Normal(part) = part else {
            return Ok(());
        };
        dir.push(part);
        match std::fs::create_dir(&dir) {
            Ok(()) => give(&dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
