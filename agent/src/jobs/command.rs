//! Command jobs: a shell command in its work directory, then its declared outputs uploaded.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_core::job::{CommandJob, FailureClass};
use flotilla_core::protocol::{Complete, Fail};

use crate::process::{CommandSpec, Outcome};
use crate::server_api::CallError;

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
    if let Err(e) = std::fs::create_dir_all(&workdir) {
        return Err(fail(
            FailureClass::Retryable,
            format!("cannot make work directory {}: {e}", workdir.display()),
            None,
        ));
    }
    let mut env = cmd.env.clone();
    env.insert("FLOTILLA_JOB_ID".into(), ctx.job_id().to_string());
    env.insert("FLOTILLA_ATTEMPT".into(), ctx.attempt.to_string());
    let spec = CommandSpec {
        command: cmd.command.clone(),
        env,
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
                match ctx.api.upload(ctx.lease, name, &path).await {
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
