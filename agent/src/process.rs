//! Runs one job's shell command in its own process group (a Job Object on Windows), streams its output lines, and ends the whole tree on exit, timeout, cancellation or drop.
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

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use process_wrap::tokio::{KillOnDrop, TokioChildWrapper, TokioCommandWrap};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Lines longer than this are sent in pieces of at most this many bytes (cut
/// at a UTF-8 character boundary where the input is UTF-8), so one runaway
/// line cannot hold unbounded memory or exceed a log request's size.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How long to keep reading the output pipes after the process group has
/// ended. Only a process that escaped the group can keep them open that long.
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// How long to wait for the group to vanish after SIGKILL before giving up
/// with a warning (a process in uninterruptible sleep dies only when its I/O
/// finishes).
#[cfg(unix)]
const KILL_WAIT: Duration = Duration::from_secs(10);

/// A default for [`CommandSpec::kill_grace`]: `docker stop`'s default
/// SIGTERM-to-SIGKILL wait, which programs that handle SIGTERM are used to.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

/// What to run and the limits to run it under.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// A shell command line: run as `sh -c COMMAND` on Unix, `cmd.exe /C
    /// COMMAND` on Windows.
    pub command: String,
    /// Variables added to (or replacing in) the agent's own environment.
    pub env: BTreeMap<String, String>,
    /// Working directory; must exist.
    pub workdir: PathBuf,
    /// Wall-clock limit from spawn; `None` for no limit.
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL of the group (Unix only).
    pub kill_grace: Duration,
}

impl CommandSpec {
    /// `command` in `workdir`, with no extra environment, no timeout and
    /// [`DEFAULT_KILL_GRACE`].
    pub fn new(command: impl Into<String>, workdir: impl Into<PathBuf>) -> Self {
        Self {
            command: command.into(),
            env: BTreeMap::new(),
            workdir: workdir.into(),
            timeout: None,
            kill_grace: DEFAULT_KILL_GRACE,
        }
    }
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
    let command = abbreviate(&spec.command);
    check_workdir(spec, &command)?;
    let mut child = spawn(spec).map_err(|source| ProcessError::Spawn {
        command: command.clone(),
        workdir: spec.workdir.clone(),
        source,
    })?;
    let stdout = child
        .stdout()
        .take()
        .expect("stdout was set to piped at spawn");
    let stderr = child
        .stderr()
        .take()
        .expect("stderr was set to piped at spawn");
    let mut tree = Tree::new(child, command);

    let stop_reading = CancellationToken::new();
    let mut pumps = pin!(async {
        tokio::join!(
            pump(stdout, Stream::Stdout, log.clone(), stop_reading.clone()),
            pump(stderr, Stream::Stderr, log, stop_reading.clone()),
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
fn spawn(spec: &CommandSpec) -> io::Result<Box<dyn TokioChildWrapper>> {
    use process_wrap::tokio::ProcessGroup;
    let mut cmd = TokioCommandWrap::with_new("sh", |c| {
        c.arg("-c").arg(&spec.command);
        configure(c, spec);
    });
    cmd.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    cmd.spawn()
}

#[cfg(windows)]
fn spawn(spec: &CommandSpec) -> io::Result<Box<dyn TokioChildWrapper>> {
    use process_wrap::tokio::JobObject;
    let mut cmd = TokioCommandWrap::with_new("cmd.exe", |c| {
        // cmd.exe does not parse its command line by the MSVC rules that
        // `arg` quotes for, so the command goes in verbatim.
        c.arg("/C").raw_arg(&spec.command);
        configure(c, spec);
    });
    // With KillOnDrop the Job Object is created kill-on-close: dropping the
    // child ends the whole tree.
    cmd.wrap(JobObject).wrap(KillOnDrop);
    cmd.spawn()
}

fn configure(c: &mut tokio::process::Command, spec: &CommandSpec) {
    c.current_dir(&spec.workdir)
        .envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
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

/// The spawned shell and everything it starts.
struct Tree {
    child: Box<dyn TokioChildWrapper>,
    /// The shell's pid, which is also the process group id: the shell leads
    /// a new group.
    pid: u32,
    command: String,
    /// Set once the whole tree is known to be ended; until then, dropping
    /// the tree kills it.
    ended: bool,
}

impl Tree {
    fn new(child: Box<dyn TokioChildWrapper>, command: String) -> Self {
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
    async fn supervise(
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
    fn kill(&mut self) {
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

/// Reads one pipe to its end, sending each line. Stops early only when
/// `stop` fires and the pipe has nothing more to read right now.
async fn pump<R: AsyncRead + Unpin>(
    pipe: R,
    stream: Stream,
    log: mpsc::Sender<LogLine>,
    stop: CancellationToken,
) {
    let mut reader = BufReader::with_capacity(MAX_LINE_BYTES, pipe);
    let mut line = Vec::new();
    let mut delivering = true;
    loop {
        let segment = tokio::select! {
            // Data already in the pipe is read before `stop` is looked at.
            biased;
            s = read_segment(&mut reader, &mut line, MAX_LINE_BYTES) => s,
            _ = stop.cancelled() => Ok(Segment::End),
        };
        let rest = match segment {
            Ok(Segment::Line) => None,
            Ok(Segment::Full) => Some(split_off_incomplete_char(&mut line)),
            Ok(Segment::End) => {
                if !line.is_empty() {
                    send(&log, stream, &mut line, &mut delivering).await;
                }
                return;
            }
            Err(e) => {
                tracing::warn!(?stream, "reading the child's output: {e}");
                if !line.is_empty() {
                    send(&log, stream, &mut line, &mut delivering).await;
                }
                return;
            }
        };
        send(&log, stream, &mut line, &mut delivering).await;
        if let Some(rest) = rest {
            line = rest;
        }
    }
}

/// Sends `line` (and clears it) unless the receiver has gone; after that
/// output is only drained.
async fn send(
    log: &mpsc::Sender<LogLine>,
    stream: Stream,
    line: &mut Vec<u8>,
    delivering: &mut bool,
) {
    let bytes = std::mem::take(line);
    if !*delivering {
        return;
    }
    let text = String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    if log.send(LogLine { stream, line: text }).await.is_err() {
        *delivering = false;
    }
}

/// How [`read_segment`] stopped.
#[derive(Debug, PartialEq, Eq)]
enum Segment {
    /// A line ended; its terminator is not in the buffer.
    Line,
    /// The buffer reached the maximum and the line goes on.
    Full,
    /// End of input; the buffer may hold a last, unterminated line.
    End,
}

/// Appends to `line` until a `\n` (consumed, not appended; a `\r` before it
/// is removed), `max` bytes, or the end of input. Cancel-safe: bytes are
/// consumed from the reader only as they are appended to `line`, which the
/// caller owns, so a cancelled call loses nothing.
async fn read_segment<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<Segment> {
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(Segment::End);
        }
        let room = max.saturating_sub(line.len());
        // One byte beyond the room: a line of exactly `max` bytes whose `\n`
        // is next ends here, rather than being followed by an empty line.
        let window = &buf[..buf.len().min(room + 1)];
        if let Some(i) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&buf[..i]);
            reader.consume(i + 1);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Segment::Line);
        }
        if room == 0 {
            return Ok(Segment::Full);
        }
        let n = window.len().min(room);
        line.extend_from_slice(&buf[..n]);
        reader.consume(n);
    }
}

/// Removes and returns the bytes at the end of `bytes` that start a UTF-8
/// character without finishing it, so a long line split at [`MAX_LINE_BYTES`]
/// does not turn one character into two replacement characters.
fn split_off_incomplete_char(bytes: &mut Vec<u8>) -> Vec<u8> {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let b = bytes[len - back];
        if b & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: the character started earlier
        }
        let needed = match b {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if needed > back {
            bytes.split_off(len - back)
        } else {
            Vec::new()
        };
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn segments(input: &[u8], max: usize) -> Vec<(Segment, Vec<u8>)> {
        let mut reader = input;
        let mut out = Vec::new();
        loop {
            let mut line = Vec::new();
            let s = read_segment(&mut reader, &mut line, max)
                .await
                .expect("reading a slice");
            let end = s == Segment::End;
            out.push((s, line));
            if end {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn splits_lines_and_strips_terminators() {
        let got = segments(b"a\r\nbb\n\nlast", 10).await;
        let lines: Vec<_> = got.iter().map(|(_, l)| l.as_slice()).collect();
        assert_eq!(lines, [&b"a"[..], b"bb", b"", b"last"]);
        assert_eq!(got.last().map(|(s, _)| s), Some(&Segment::End));
    }

    #[tokio::test]
    async fn long_line_is_cut_at_max_and_exact_fit_has_no_empty_tail() {
        let got = segments(b"abcdefg\nabcd\n", 4).await;
        let seen: Vec<_> = got.iter().map(|(s, l)| (s, l.as_slice())).collect();
        assert_eq!(
            seen,
            [
                (&Segment::Full, &b"abcd"[..]),
                (&Segment::Line, b"efg"),
                (&Segment::Line, b"abcd"),
                (&Segment::End, b""),
            ]
        );
    }

    #[test]
    fn incomplete_character_is_carried_over() {
        let mut v = "ab€".as_bytes().to_vec(); // € is E2 82 AC
        v.truncate(4); // "ab" + E2 82
        assert_eq!(split_off_incomplete_char(&mut v), [0xE2, 0x82]);
        assert_eq!(v, b"ab");

        let mut whole = "ab€".as_bytes().to_vec();
        assert!(split_off_incomplete_char(&mut whole).is_empty());
        assert_eq!(whole, "ab€".as_bytes());

        let mut invalid = vec![b'a', 0xFF];
        assert!(split_off_incomplete_char(&mut invalid).is_empty());
    }

    #[test]
    fn long_commands_are_abbreviated_in_messages() {
        let long = "x".repeat(500);
        assert_eq!(abbreviate(&long).chars().count(), 201);
        assert_eq!(abbreviate("echo hi"), "echo hi");
    }
}
