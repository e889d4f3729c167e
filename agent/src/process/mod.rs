//! Supervised child processes: every shell command the agent runs goes through [`run`].
//!
//! The command runs in its own process group (a Job Object on Windows); its
//! output lines are streamed; the whole tree is ended on exit, timeout,
//! cancellation or drop. `tree.rs` supervises the group, `lines.rs` reads the
//! pipes.
//!
//! # How a run ends
//!
//! [`run`] waits for the first of: the shell exits, the timeout passes, the
//! cancellation token fires. Then it makes sure nothing of the job is left:
//!
//! - Unix: on timeout or cancellation it sends SIGTERM to the whole process
//!   group, waits up to [`CommandSpec::kill_grace`] for the group to empty,
//!   then SIGKILLs the group. When the shell exits on its own, members it left
//!   behind (`sleep 1000 &`) get the same SIGTERM, grace, SIGKILL treatment.
//!   Zombies are not counted as members: they are dead, and whoever is their
//!   parent reaps them (this process too, when it is a subreaper or PID 1).
//! - Windows: there is no SIGTERM for a console tree, so the Job Object is
//!   terminated at once on timeout or cancellation, and again after the shell
//!   exits to end anything it left behind; `kill_grace` is not used.
//!
//! A process that leaves the group (`setsid`, a double-forking daemon) escapes
//! this; only a cgroup would catch it. If such a process keeps the output
//! pipes open, reading stops [`DRAIN_AFTER_EXIT`] after the group ended.
//!
//! # Output
//!
//! stdout and stderr are read concurrently, split into lines (`\n`, with a
//! trailing `\r` removed), converted lossily to UTF-8, split further at
//! [`MAX_LINE_BYTES`], and sent in order per stream (not across streams) on
//! the bounded log channel. A full channel pauses reading, so the child
//! blocks on its next write once the pipe fills: the receiver must be drained
//! concurrently with `run`, or `run` does not return. A closed channel does
//! not stop reading: output is discarded so the child never blocks on a
//! full pipe. Every line read is sent before `run` returns.
//!
//! If the future returned by [`run`] is dropped before it completes, the
//! whole group is SIGKILLed (the Job Object closed) and tokio reaps the shell.
//!
//! # Who it runs as
//!
//! The child starts from an empty environment plus [`RunAs::env`] (an
//! allowlist of the agent's variables, `env.rs`) plus [`CommandSpec::env`];
//! with [`RunAs::user`] it runs as that user (`user.rs`).

pub mod env;
mod lines;
mod tree;
pub mod user;

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::pin::pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use process_wrap::tokio::{KillOnDrop, TokioChildWrapper, TokioCommandWrap};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::env::BaseEnv;
use self::lines::pump;
use self::tree::Tree;
use self::user::JobUser;

/// Lines longer than this are sent in pieces of at most this many bytes (cut
/// at a UTF-8 character boundary where the input is UTF-8), so one runaway
/// line cannot hold unbounded memory or exceed a log request's size.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How long to keep reading the output pipes after the process group has
/// ended. Only a process that escaped the group can keep them open that long.
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// A default for [`CommandSpec::kill_grace`]: `docker stop`'s default
/// SIGTERM-to-SIGKILL wait, which programs that handle SIGTERM are used to.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

/// What to run and the limits to run it under.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// A shell command line: run as `sh -c COMMAND` on Unix, `cmd.exe /C
    /// COMMAND` on Windows.
    pub command: String,
    /// The job's variables, set over [`RunAs::env`].
    pub env: BTreeMap<String, String>,
    /// The user and base environment the process starts with.
    pub run_as: RunAs,
    /// Working directory; must exist.
    pub workdir: PathBuf,
    /// Wall-clock limit from spawn; `None` for no limit.
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL of the group (Unix only).
    pub kill_grace: Duration,
}

impl CommandSpec {
    /// `command` in `workdir`, as the agent's user with the allowlisted
    /// environment ([`RunAs::agent_user`]), no timeout and
    /// [`DEFAULT_KILL_GRACE`].
    pub fn new(command: impl Into<String>, workdir: impl Into<PathBuf>) -> Self {
        Self {
            command: command.into(),
            env: BTreeMap::new(),
            run_as: RunAs::agent_user(&[]),
            workdir: workdir.into(),
            timeout: None,
            kill_grace: DEFAULT_KILL_GRACE,
        }
    }
}

/// Who a job's processes run as and the environment they start from; made
/// once when the agent starts and shared by every job.
#[derive(Debug, Clone)]
pub struct RunAs {
    /// Replaces the agent's environment; see `env.rs`.
    pub env: Arc<BaseEnv>,
    /// `--job-user`; `None` runs jobs as the agent's own user.
    pub user: Option<Arc<JobUser>>,
}

impl RunAs {
    /// Jobs as the agent's own user, with the allowlist and `pass_env`.
    pub fn agent_user(pass_env: &[String]) -> Self {
        RunAs {
            env: Arc::new(BaseEnv::from_agent(pass_env, None)),
            user: None,
        }
    }

    /// Jobs as `user`, with the allowlist, `pass_env` and the user's own
    /// `HOME`, `USER`, `LOGNAME` and `SHELL`.
    pub fn job_user(user: JobUser, pass_env: &[String]) -> Self {
        RunAs {
            env: Arc::new(BaseEnv::from_agent(pass_env, Some(&user.vars()))),
            user: Some(Arc::new(user)),
        }
    }

    /// Hands a directory the agent made for a job to the job's user (a
    /// no-op when jobs run as the agent's user).
    pub fn give_dir(&self, dir: &std::path::Path) -> Result<(), user::JobUserError> {
        match &self.user {
            Some(u) => u.give_dir(dir),
            None => Ok(()),
        }
    }
}

/// Files the caller opened, given to the child as its stdin and stdout
/// instead of nothing and a pipe into the log. The child needs no right
/// to open them by name, and no name is resolved after the caller opened
/// them (a step's tars and path lists, opened without following links).
#[derive(Debug, Default)]
pub struct Redirect {
    pub stdin: Option<std::fs::File>,
    pub stdout: Option<std::fs::File>,
}

/// Which output stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl From<Stream> for flotilla_core::protocol::LogStream {
    fn from(s: Stream) -> Self {
        match s {
            Stream::Stdout => Self::Stdout,
            Stream::Stderr => Self::Stderr,
        }
    }
}

/// One line of output, without its line terminator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub stream: Stream,
    pub line: String,
}

impl From<LogLine> for flotilla_core::protocol::LogLine {
    fn from(l: LogLine) -> Self {
        Self {
            stream: l.stream.into(),
            line: l.line,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The shell exited on its own with this code.
    Exited { code: i32 },
    /// The shell was killed by this signal, not by us (Unix only).
    Signalled { signal: i32 },
    /// [`CommandSpec::timeout`] passed and the tree was ended.
    TimedOut,
    /// The cancellation token fired and the tree was ended.
    Cancelled,
}

impl Outcome {
    /// True only for exit code 0.
    pub fn success(&self) -> bool {
        matches!(self, Outcome::Exited { code: 0 })
    }
}

/// Why a command could not be run or followed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot run `{command}`: work directory {} is not usable: {source}", workdir.display())]
    Workdir {
        command: String,
        workdir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start `{command}` in {}: {source}", workdir.display())]
    Spawn {
        command: String,
        workdir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("lost track of `{command}` (pid {pid}): {source}")]
    Wait {
        command: String,
        pid: u32,
        #[source]
        source: io::Error,
    },
}

/// Runs `spec` to the end and reports how it ended; see the module
/// documentation for the guarantees. Output lines go to `log` as they come;
/// `cancel` ends the run early with [`Outcome::Cancelled`].
pub async fn run(
    spec: &CommandSpec,
    log: mpsc::Sender<LogLine>,
    cancel: CancellationToken,
) -> Result<Outcome, ProcessError> {
    run_with(spec, Redirect::default(), log, cancel).await
}

/// [`run`], with the child's stdin and stdout from `redirect` where it
/// gives a file (only stderr reaches the log when stdout goes to a file).
pub async fn run_with(
    spec: &CommandSpec,
    redirect: Redirect,
    log: mpsc::Sender<LogLine>,
    cancel: CancellationToken,
) -> Result<Outcome, ProcessError> {
    let command = abbreviate(&spec.command);
    check_workdir(spec, &command)?;
    let redirected_stdout = redirect.stdout.is_some();
    let mut child = spawn(spec, redirect).map_err(|source| ProcessError::Spawn {
        command: command.clone(),
        workdir: spec.workdir.clone(),
        source,
    })?;
    let stdout = child.stdout().take();
    assert!(
        stdout.is_some() != redirected_stdout,
        "stdout is piped at spawn unless redirected to a file"
    );
    let stderr = child
        .stderr()
        .take()
        .expect("stderr was set to piped at spawn");
    let mut tree = Tree::new(child, command);

    let stop_reading = CancellationToken::new();
    let mut pumps = pin!(async {
        tokio::join!(
            async {
                if let Some(stdout) = stdout {
                    pump(stdout, Stream::Stdout, log.clone(), stop_reading.clone()).await
                }
            },
            pump(stderr, Stream::Stderr, log.clone(), stop_reading.clone()),
        )
    });
    let mut pumps_done = false;
    let result = {
        let mut supervise = pin!(tree.supervise(spec, &cancel));
        loop {
            tokio::select! {
                r = &mut supervise => break r,
                _ = &mut pumps, if !pumps_done => pumps_done = true,
            }
        }
    };
    if result.is_err() {
        // The tree's state is unknown: end it now rather than let the pipes'
        // drain below wait on it.
        tree.kill();
    }
    if !pumps_done {
        tokio::select! {
            _ = &mut pumps => {}
            _ = tokio::time::sleep(DRAIN_AFTER_EXIT) => {
                tracing::warn!(
                    command = %tree.command,
                    "output pipes still open {DRAIN_AFTER_EXIT:?} after the process group ended \
                     (a process left the group and holds them); no longer reading them",
                );
                stop_reading.cancel();
                // Lines already read are still delivered.
                pumps.await;
            }
        }
    }
    result
}

/// Fails with a clear message when the work directory is missing, instead of
/// the spawn's ENOENT, which reads as if `sh` were missing.
fn check_workdir(spec: &CommandSpec, command: &str) -> Result<(), ProcessError> {
    let error = |source| ProcessError::Workdir {
        command: command.to_owned(),
        workdir: spec.workdir.clone(),
        source,
    };
    let meta = std::fs::metadata(&spec.workdir).map_err(error)?;
    if !meta.is_dir() {
        return Err(error(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    Ok(())
}

#[cfg(unix)]
fn spawn(spec: &CommandSpec, redirect: Redirect) -> io::Result<Box<dyn TokioChildWrapper>> {
    use process_wrap::tokio::ProcessGroup;
    let mut user_error = None;
    let mut cmd = TokioCommandWrap::with_new("sh", |c| {
        c.arg("-c").arg(&spec.command);
        configure(c, spec, redirect);
        if let Some(user) = &spec.run_as.user {
            if let Err(e) = user.apply(c, &spec.workdir) {
                user_error = Some(e);
            }
        }
    });
    if let Some(e) = user_error {
        return Err(e);
    }
    cmd.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    cmd.spawn()
}

#[cfg(windows)]
fn spawn(spec: &CommandSpec, redirect: Redirect) -> io::Result<Box<dyn TokioChildWrapper>> {
    use process_wrap::tokio::JobObject;
    let mut cmd = TokioCommandWrap::with_new("cmd.exe", |c| {
        // cmd.exe does not parse its command line by the MSVC rules that
        // `arg` quotes for, so the command goes in verbatim.
        c.arg("/C").raw_arg(&spec.command);
        configure(c, spec, redirect);
    });
    // With KillOnDrop the Job Object is created kill-on-close: dropping the
    // child ends the whole tree.
    cmd.wrap(JobObject).wrap(KillOnDrop);
    cmd.spawn()
}

/// Everything but the user switch: the environment starts empty, so the
/// agent's own variables (its token file's path, cloud keys) never reach a
/// job.
fn configure(c: &mut tokio::process::Command, spec: &CommandSpec, redirect: Redirect) {
    if spec.run_as.user.is_none() {
        // With a job user the child enters its directory after switching.
        c.current_dir(&spec.workdir);
    }
    c.env_clear()
        .envs(spec.run_as.env.iter())
        .envs(&spec.env)
        .stdin(redirect.stdin.map_or_else(Stdio::null, Stdio::from))
        .stdout(redirect.stdout.map_or_else(Stdio::piped, Stdio::from))
        .stderr(Stdio::piped());
}

/// The command as it appears in errors and logs: a whole script would drown
/// the message.
fn abbreviate(command: &str) -> String {
    const MAX_CHARS: usize = 200;
    match command.char_indices().nth(MAX_CHARS) {
        None => command.to_owned(),
        Some((cut, _)) => format!("{}…", &command[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_commands_are_abbreviated_in_messages() {
        let long = "x".repeat(500);
        assert_eq!(abbreviate(&long).chars().count(), 201);
        assert_eq!(abbreviate("echo hi"), "echo hi");
    }
}
