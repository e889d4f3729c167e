//! `process::run` against real shells: exit status, output streaming,
//! environment, timeout, cancellation, and that no process of a job's group
//! outlives the run.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flotilla_agent::process::{
    run, CommandSpec, LogLine, Outcome, ProcessError, Stream, DRAIN_AFTER_EXIT, MAX_LINE_BYTES,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn spec(command: &str, workdir: &Path) -> CommandSpec {
    CommandSpec {
        timeout: Some(Duration::from_secs(60)),
        kill_grace: Duration::from_secs(2),
        ..CommandSpec::new(command, workdir)
    }
}

/// Runs `spec` with a log channel of `capacity`, drained concurrently.
async fn run_collect(
    spec: &CommandSpec,
    capacity: usize,
    cancel: CancellationToken,
) -> (Result<Outcome, ProcessError>, Vec<LogLine>) {
    let (tx, mut rx) = mpsc::channel(capacity);
    let reader = tokio::spawn(async move {
        let mut lines = Vec::new();
        while let Some(l) = rx.recv().await {
            lines.push(l);
        }
        lines
    });
    let outcome = run(spec, tx, cancel).await;
    let lines = reader.await.expect("log reader task");
    (outcome, lines)
}

fn lines_of(lines: &[LogLine], stream: Stream) -> Vec<&str> {
    lines
        .iter()
        .filter(|l| l.stream == stream)
        .map(|l| l.line.as_str())
        .collect()
}

/// True when `pid` no longer runs: gone, or a zombie waiting for its parent
/// (init) to reap it — dead either way.
fn is_dead(pid: i32) -> bool {
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    if kill(Pid::from_raw(pid), None).is_err() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Vanished between the two looks; without /proc, assume alive.
        Err(_) => Path::new("/proc/self").exists(),
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

async fn wait_for_file(path: &Path) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn read_pid(s: &str) -> i32 {
    s.trim().parse().expect("the script wrote a pid")
}

#[tokio::test]
async fn exit_codes_and_signals_are_reported() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        ("true", Outcome::Exited { code: 0 }),
        ("exit 3", Outcome::Exited { code: 3 }),
        ("kill -KILL $$", Outcome::Signalled { signal: 9 }),
    ];
    for (command, want) in cases {
        let (got, _) = run_collect(&spec(command, dir.path()), 8, CancellationToken::new()).await;
        assert_eq!(got.expect("runs"), want, "{command}");
    }
    assert!(Outcome::Exited { code: 0 }.success());
    assert!(!Outcome::Exited { code: 1 }.success());
}

#[tokio::test]
async fn stdout_and_stderr_lines_arrive_in_order_per_stream() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = r#"for i in 1 2 3 4 5; do echo "out $i"; echo "err $i" >&2; done
printf 'crlf\r\n'; echo; printf 'no newline'"#;
    let (got, lines) = run_collect(&spec(script, dir.path()), 2, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
    assert_eq!(
        lines_of(&lines, Stream::Stdout),
        [
            "out 1",
            "out 2",
            "out 3",
            "out 4",
            "out 5",
            "crlf",
            "",
            "no newline"
        ]
    );
    assert_eq!(
        lines_of(&lines, Stream::Stderr),
        ["err 1", "err 2", "err 3", "err 4", "err 5"]
    );
}

#[tokio::test]
async fn env_and_workdir_are_honoured() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut s = spec(
        r#"echo "$FLOTILLA_TEST_VAR"; pwd -P; echo "${PATH:+path kept}""#,
        dir.path(),
    );
    s.env
        .insert("FLOTILLA_TEST_VAR".into(), "hello world".into());
    let (got, lines) = run_collect(&s, 8, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
    let canonical = dir.path().canonicalize().expect("canonical temp dir");
    assert_eq!(
        lines_of(&lines, Stream::Stdout),
        [
            "hello world",
            canonical.to_str().expect("utf-8 temp path"),
            "path kept"
        ]
    );
}

/// The child's environment is the base (allowlisted) one plus the job's:
/// nothing of the agent's own reaches it, not even what this test process
/// itself was started with (CARGO_*, RUST_*).
#[tokio::test]
async fn a_job_sees_only_allowlisted_variables() {
    use std::ffi::OsString;
    use std::sync::Arc;

    use flotilla_agent::process::env::BaseEnv;
    let dir = tempfile::tempdir().expect("temp dir");
    let agent_env: Vec<(OsString, OsString)> = [
        (
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        ),
        ("LANG", "C.UTF-8".into()),
        ("HOME", "/home/agent".into()),
        (
            "FLOTILLA_AGENT_TOKEN_FILE",
            "/etc/flotilla/agent.token".into(),
        ),
        ("FLOTILLA_AGENT_TOKEN", "agent-secret".into()),
        ("AWS_SECRET_ACCESS_KEY", "aws-secret".into()),
        ("DATABASE_URL", "postgres://u:db-secret@db/x".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    let mut s = spec("env", dir.path());
    s.run_as.env = Arc::new(BaseEnv::from_vars(agent_env, &[], None));
    s.env.insert("JOB_VAR".into(), "job value".into());
    let (got, lines) = run_collect(&s, 64, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
    let out = lines_of(&lines, Stream::Stdout).join("\n");
    assert!(!out.contains("secret"), "{out}");
    let mut names: Vec<&str> = lines_of(&lines, Stream::Stdout)
        .into_iter()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        // sh itself sets these.
        .filter(|k| !matches!(*k, "PWD" | "SHLVL" | "_" | "OLDPWD"))
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["HOME", "JOB_VAR", "LANG", "PATH"], "{out}");
}

/// As root, a job user's process has that user's uid, gid and groups and
/// enters its directory as that user.
#[tokio::test]
async fn a_job_user_runs_the_process() {
    use flotilla_agent::process::user::JobUser;
    use flotilla_agent::process::RunAs;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: not root, so no job user can be switched to");
        return;
    }
    let user = JobUser::lookup("nobody").expect("the nobody user exists");
    let uid = user.uid();
    let dir = tempfile::tempdir().expect("temp dir");
    let job_dir = dir.path().join("job");
    std::fs::create_dir(&job_dir).expect("job dir");
    user.give_dir(&job_dir).expect("chown to nobody");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
    }
    let mut s = spec("id -u; pwd -P; touch mine && echo wrote; cat /etc/shadow >/dev/null 2>&1 || echo no shadow", &job_dir);
    s.run_as = RunAs::job_user(user, &[]);
    let (got, lines) = run_collect(&s, 64, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 }, "{lines:?}");
    let canonical = job_dir.canonicalize().expect("canonical");
    assert_eq!(
        lines_of(&lines, Stream::Stdout),
        [
            uid.to_string().as_str(),
            canonical.to_str().expect("utf-8"),
            "wrote",
            "no shadow"
        ]
    );

    // A directory the user may not enter fails the start.
    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).expect("closed dir");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    }
    let mut s2 = spec("true", &closed);
    s2.run_as = s.run_as.clone();
    let (tx, _rx) = mpsc::channel(1);
    let err = run(&s2, tx, CancellationToken::new())
        .await
        .expect_err("nobody cannot enter a 0700 root directory");
    assert!(matches!(err, ProcessError::Spawn { .. }), "{err:?}");
}

#[tokio::test]
async fn missing_workdir_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nope");
    let (tx, _rx) = mpsc::channel(1);
    let err = run(&spec("true", &missing), tx, CancellationToken::new())
        .await
        .expect_err("no such workdir");
    assert!(matches!(err, ProcessError::Workdir { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("nope") && msg.contains("true"), "{msg}");

    let file = dir.path().join("file");
    std::fs::write(&file, "").expect("write");
    let (tx, _rx) = mpsc::channel(1);
    let err = run(&spec("true", &file), tx, CancellationToken::new())
        .await
        .expect_err("workdir is a file");
    assert!(matches!(err, ProcessError::Workdir { .. }), "{err:?}");
}

#[tokio::test]
async fn timeout_kills_the_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pidfile = dir.path().join("pid");
    let mut s = spec("sleep 300 & echo $! > pid; wait", dir.path());
    // Long enough for the shell to have written the pid file even on a
    // loaded machine.
    s.timeout = Some(Duration::from_secs(1));
    let start = Instant::now();
    let (got, _) = run_collect(&s, 8, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::TimedOut);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    let pid = read_pid(&wait_for_file(&pidfile).await);
    assert!(is_dead(pid), "grandchild {pid} survived the timeout");
}

#[tokio::test]
async fn cancel_kills_the_grandchild() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pidfile = dir.path().join("pidfile");
    let s = spec("sleep 300 & echo $! > pidfile; wait", dir.path());
    let cancel = CancellationToken::new();
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move { run_collect(&s, 8, cancel).await }
    });
    let pid = read_pid(&wait_for_file(&pidfile).await);
    assert!(
        !is_dead(pid),
        "grandchild {pid} should be running before cancel"
    );
    let start = Instant::now();
    cancel.cancel();
    let (got, _) = run.await.expect("run task");
    assert_eq!(got.expect("runs"), Outcome::Cancelled);
    // SIGTERM ends sleep at once: no need to wait for the grace.
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    assert!(is_dead(pid), "grandchild {pid} survived cancellation");
}

#[tokio::test]
async fn strays_left_by_a_finished_shell_are_killed() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The background sleep keeps stdout open too: `run` must not wait for it.
    let s = spec("sleep 300 & echo $! > pid; echo done", dir.path());
    let start = Instant::now();
    let (got, lines) = run_collect(&s, 8, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
    assert_eq!(lines_of(&lines, Stream::Stdout), ["done"]);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    let pid = read_pid(&wait_for_file(&dir.path().join("pid")).await);
    assert!(is_dead(pid), "stray {pid} outlived its shell");
}

#[tokio::test]
async fn a_group_ignoring_sigterm_is_killed_after_the_grace() {
    let dir = tempfile::tempdir().expect("temp dir");
    // An ignored signal stays ignored across fork and exec, so the sleep
    // ignores SIGTERM too.
    let mut s = spec("trap '' TERM; sleep 300 & echo $! > pid; wait", dir.path());
    s.kill_grace = Duration::from_millis(700);
    let cancel = CancellationToken::new();
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move { run_collect(&s, 8, cancel).await }
    });
    let pid = read_pid(&wait_for_file(&dir.path().join("pid")).await);
    let start = Instant::now();
    cancel.cancel();
    let (got, _) = run.await.expect("run task");
    let took = start.elapsed();
    assert_eq!(got.expect("runs"), Outcome::Cancelled);
    assert!(
        took >= Duration::from_millis(700),
        "SIGKILL before the grace: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(is_dead(pid), "{pid} survived SIGKILL");
}

#[tokio::test]
async fn large_output_arrives_complete_through_a_small_channel() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = spec("seq 1 100000 & seq 100001 200000 >&2; wait", dir.path());
    let (got, lines) = run_collect(&s, 4, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
    let expect = |range: std::ops::RangeInclusive<u32>| -> Vec<String> {
        range.map(|i| i.to_string()).collect()
    };
    assert_eq!(lines_of(&lines, Stream::Stdout), expect(1..=100_000));
    assert_eq!(lines_of(&lines, Stream::Stderr), expect(100_001..=200_000));
}

#[tokio::test]
async fn long_lines_are_split_and_bad_utf8_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let total = 3 * MAX_LINE_BYTES + 100;
    let s = spec(
        &format!("head -c {total} /dev/zero | tr '\\0' a; echo; printf 'x\\377y\\n'"),
        dir.path(),
    );
    let (got, lines) = run_collect(&s, 4, CancellationToken::new()).await;
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
    let out = lines_of(&lines, Stream::Stdout);
    let lens: Vec<usize> = out.iter().map(|l| l.len()).collect();
    assert_eq!(
        lens,
        [MAX_LINE_BYTES, MAX_LINE_BYTES, MAX_LINE_BYTES, 100, 3 + 2]
    );
    assert_eq!(out[4], "x\u{FFFD}y");
}

#[tokio::test]
async fn a_closed_log_channel_does_not_block_the_child() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    // Far more than a pipe buffer holds: the child blocks unless we drain.
    let s = spec("seq 1 200000", dir.path());
    let got = tokio::time::timeout(
        Duration::from_secs(20),
        run(&s, tx, CancellationToken::new()),
    )
    .await
    .expect("run finished");
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
}

#[tokio::test]
async fn dropping_the_run_kills_the_tree() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = spec("sleep 300 & echo $! > pid; wait", dir.path());
    let task = tokio::spawn(async move {
        let (tx, _rx) = mpsc::channel(8);
        run(&s, tx, CancellationToken::new()).await
    });
    let pid = read_pid(&wait_for_file(&dir.path().join("pid")).await);
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    let start = Instant::now();
    while !is_dead(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{pid} outlived the dropped run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn spawn_failure_names_the_command() {
    // A workdir that exists but cannot be entered makes the spawn fail after
    // the workdir check.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let locked: PathBuf = dir.path().join("locked");
    std::fs::create_dir(&locked).expect("mkdir");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    if std::fs::read_dir(&locked).is_ok() {
        return; // running as root, which enters any directory
    }
    let (tx, _rx) = mpsc::channel(1);
    let err = run(&spec("echo hi", &locked), tx, CancellationToken::new())
        .await
        .expect_err("cannot chdir");
    assert!(err.to_string().contains("echo hi"), "{err}");
}

#[tokio::test]
async fn a_process_that_left_the_group_does_not_hold_the_run() {
    if std::process::Command::new("setsid")
        .arg("--version")
        .output()
        .is_err()
    {
        return; // no setsid(1) here (macOS)
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // setsid puts the sleep in a new session and group, out of our reach; it
    // inherits stdout, so the pipe stays open after the group has ended.
    let s = spec(
        "echo before; setsid sh -c 'echo $$ > pid; exec sleep 300' & \
         while [ ! -s pid ]; do sleep 0.01; done; echo after",
        dir.path(),
    );
    let start = Instant::now();
    let (got, lines) = run_collect(&s, 8, CancellationToken::new()).await;
    let took = start.elapsed();
    let pid = read_pid(&wait_for_file(&dir.path().join("pid")).await);
    // Clean up the escapee before asserting, so a failure leaves nothing.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert_eq!(got.expect("runs"), Outcome::Exited { code: 0 });
    assert_eq!(lines_of(&lines, Stream::Stdout), ["before", "after"]);
    assert!(
        took >= DRAIN_AFTER_EXIT,
        "stopped reading too early: {took:?}"
    );
    assert!(
        took < DRAIN_AFTER_EXIT + Duration::from_secs(3),
        "took {took:?}"
    );
}
