//! Step jobs run by the real step code, here and on a real sshd on
//! loopback (`tests/src/sshd.rs`, included as it is: the e2e crate depends
//! on the server, and the agent's tests stay light).
//!
//! A job's context is made as the agent makes it, with its log in memory
//! and its server a stub on loopback that takes output uploads and serves
//! `GET jobs/{id}/moved` from the bytes a test gives it: the server's side
//! of a move is tested end to end elsewhere (the e2e tests).
#![cfg(unix)]

// Not every helper of the fixture is used here.
#[allow(dead_code)]
#[path = "../../tests/src/sshd.rs"]
mod sshd;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_agent::jobs::log::{JobLog, LogSink};
use flotilla_agent::jobs::step::{self, SshDir, SshSessions};
use flotilla_agent::jobs::JobContext;
use flotilla_agent::process::RunAs;
use flotilla_agent::server_api::{CallError, Delivery, ServerApi};
use flotilla_core::job::{
    FailureClass, StepAction, StepHost, StepItems, StepJob, StepOut, StepProbe,
};
use flotilla_core::pipeline::spec::SshTarget;
use flotilla_core::protocol::{Complete, Fail, LeaseRef, LogBatch};
use sha2::Digest;
use sshd::Sshd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The stub server's state: uploaded outputs by job, tars to serve by job.
#[derive(Default)]
struct Stub {
    uploads: Mutex<HashMap<Uuid, Vec<u8>>>,
    moved: Mutex<HashMap<Uuid, Vec<u8>>>,
}

/// Starts the stub on loopback; its URL.
async fn start_stub(stub: Arc<Stub>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::spawn(serve(conn, stub.clone()));
        }
    });
    format!("http://{addr}")
}

/// One request per connection: `PUT …/outputs/NAME` stores the body and
/// answers an `OutputView`; `GET …/moved` answers the tar set for the job
/// (404 when none).
async fn serve(mut conn: tokio::net::TcpStream, stub: Arc<Stub>) {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed inside the headers");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut body = buf[head_end..].to_vec();
    let request_line = head.lines().next().unwrap().to_string();
    let mut words = request_line.split(' ');
    let (method, target) = (words.next().unwrap(), words.next().unwrap());
    let path = target.split('?').next().unwrap();
    let job: Uuid = path
        .strip_prefix("/api/agent/v1/jobs/")
        .and_then(|p| p.split('/').next())
        .and_then(|id| id.parse().ok())
        .expect("a job path");
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while body.len() < len {
        let mut chunk = vec![0u8; 1 << 16];
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed inside the body");
        body.extend_from_slice(&chunk[..n]);
    }
    let (status, answer) = match (method, path.ends_with("/moved")) {
        // Asked whether it takes outputs directly into its store: no (it has
        // none), so the agent streams them with the PUT below.
        ("POST", false) if path.ends_with("/output-uploads/terms") => {
            ("200 OK", br#"{"part_size":null}"#.to_vec())
        }
        ("PUT", false) => {
            let name = path.rsplit('/').next().unwrap().to_string();
            let view = serde_json::json!({
                "name": name,
                "key": format!("jobs/{job}/{name}"),
                "size": body.len(),
                "sha256": hex::encode(sha2::Sha256::digest(&body)),
            });
            stub.uploads.lock().unwrap().insert(job, body);
            ("200 OK", serde_json::to_vec(&view).unwrap())
        }
        ("GET", true) => match stub.moved.lock().unwrap().get(&job) {
            Some(tar) => ("200 OK", tar.clone()),
            None => (
                "404 Not Found",
                br#"{"error":{"code":"not_found","message":"no such tar"}}"#.to_vec(),
            ),
        },
        _ => panic!("the stub does not serve {method} {path}"),
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        answer.len()
    )
    .into_bytes();
    reply.extend_from_slice(&answer);
    let _ = conn.write_all(&reply).await;
    let _ = conn.shutdown().await;
}

/// A job's log, kept in memory.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl LogSink for Log {
    async fn send(
        &self,
        _job: Uuid,
        batch: &LogBatch,
        _stop: &CancellationToken,
    ) -> Result<(), CallError> {
        let mut lines = self.0.lock().unwrap();
        lines.extend(batch.lines.iter().map(|l| l.line.clone()));
        Ok(())
    }
}

/// What the step code needs around it: a stub server, a work directory,
/// the agent's ssh sessions.
struct Agent {
    // Dropped first: its masters are closed through sockets under `work`.
    ssh: SshSessions,
    stub: Arc<Stub>,
    api: ServerApi,
    work: tempfile::TempDir,
    run_as: RunAs,
}

/// Whether the agent has an `--ssh-dir`, and how it takes new hosts.
#[derive(Clone, Copy)]
enum Ssh {
    /// No `--ssh-dir`: no ssh host is reached.
    None,
    /// `--ssh-dir`: only hosts in its known_hosts.
    Strict,
    /// `--ssh-dir --ssh-accept-new`.
    AcceptNew,
}

/// One job's end: its report and its log.
struct Ran {
    job: Uuid,
    result: Result<Complete, Fail>,
    log: Vec<String>,
}

impl Ran {
    fn ok(&self) -> &Complete {
        match &self.result {
            Ok(c) => c,
            Err(f) => panic!("the step failed: {f:?}; log: {:#?}", self.log),
        }
    }

    fn failed(&self, class: FailureClass) -> &Fail {
        match &self.result {
            Err(f) if f.class == class => f,
            other => panic!(
                "expected a {class:?} failure, got {other:?}; log: {:#?}",
                self.log
            ),
        }
    }
}

impl Agent {
    async fn new() -> Agent {
        Self::running_jobs_as(RunAs::agent_user(&[])).await
    }

    async fn running_jobs_as(run_as: RunAs) -> Agent {
        Self::with(run_as, Ssh::Strict).await
    }

    async fn with(run_as: RunAs, ssh: Ssh) -> Agent {
        let stub = Arc::new(Stub::default());
        let url = start_stub(stub.clone()).await;
        let work = tempfile::Builder::new().prefix("agent-").tempdir().unwrap();
        let ssh_dir = match ssh {
            Ssh::None => None,
            Ssh::Strict => Some(SshDir::prepare(&work.path().join("ssh-dir"), false).unwrap()),
            Ssh::AcceptNew => Some(SshDir::prepare(&work.path().join("ssh-dir"), true).unwrap()),
        };
        let ssh = SshSessions::new(&work.path().join("ssh"), ssh_dir);
        Agent {
            stub,
            api: ServerApi::new(&url, "token").unwrap(),
            work,
            ssh,
            run_as,
        }
    }

    async fn run(&self, host: &StepHost, action: StepAction) -> Ran {
        self.run_until(host, action, CancellationToken::new()).await
    }

    /// Runs one step job as the agent would, `stop` being its stop token.
    async fn run_until(&self, host: &StepHost, action: StepAction, stop: CancellationToken) -> Ran {
        self.run_job(Uuid::new_v4(), host, action, stop).await
    }

    async fn run_job(
        &self,
        job: Uuid,
        host: &StepHost,
        action: StepAction,
        stop: CancellationToken,
    ) -> Ran {
        let lease = LeaseRef {
            job_id: job,
            lease_token: Uuid::new_v4(),
        };
        let sink = Log::default();
        let delivery = Delivery::new(CancellationToken::new(), Duration::from_secs(10));
        let (log, forwarder) = JobLog::start(sink.clone(), lease, delivery);
        let ctx = JobContext {
            api: self.api.clone(),
            lease,
            attempt: 1,
            cost: 1,
            stop,
            progress: Arc::new(|_, _| {}),
            log,
            job_dir: self.job_dir(job),
            agent_dir: self.work.path().join("agent-side").join(format!("{job}-1")),
            kill_grace: Duration::from_secs(2),
            run_as: self.run_as.clone(),
        };
        let spec = StepJob {
            run_id: Uuid::new_v4(),
            item: "item-1".into(),
            step: "test".into(),
            host: host.clone(),
            action,
            timeout_s: Some(120),
        };
        let result = step::run(&ctx, &self.ssh, &spec).await;
        drop(ctx);
        forwarder.finish().await;
        let log = sink.0.lock().unwrap().clone();
        Ran { job, result, log }
    }

    /// A directory of this agent's for a test's local files.
    fn local_dir(&self) -> PathBuf {
        let d = self.work.path().join("data");
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The attempt's directory of `job` (attempt 1).
    fn job_dir(&self, job: Uuid) -> PathBuf {
        self.work.path().join("jobs").join(format!("{job}-1"))
    }

    /// This agent's `--ssh-dir`.
    fn ssh_dir(&self) -> PathBuf {
        self.work.path().join("ssh-dir")
    }

    /// A started sshd this agent may reach: its key and host key in the
    /// agent's `--ssh-dir`.
    fn sshd(&self, name: &str) -> Sshd {
        let sshd = Sshd::start(name).unwrap_or_else(|e| panic!("{e}"));
        sshd.install_for(&self.ssh_dir()).unwrap();
        sshd
    }
}

fn on(sshd: &Sshd) -> StepHost {
    StepHost::Ssh(sshd.ssh_target())
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn items(c: &Complete) -> Vec<String> {
    let result = c.result.clone().expect("a listing has a result");
    serde_json::from_value::<StepItems>(result).unwrap().items
}

#[tokio::test]
async fn a_listing_here_and_over_ssh_gives_the_trimmed_lines_of_stdout() {
    let agent = Agent::new().await;
    let host = agent.sshd("list");
    let command = "printf 'a\\n\\n  b  \\nc d\\n'; echo 'not an item' >&2";
    for place in [StepHost::Local, on(&host)] {
        let ran = agent
            .run(
                &place,
                StepAction::List {
                    command: command.into(),
                },
            )
            .await;
        assert_eq!(items(ran.ok()), ["a", "b", "c d"], "{place:?}");
        // Over ssh stderr shares the terminal with stdout; it is still the
        // log, not an item.
        assert!(ran.log.iter().any(|l| l == "not an item"), "{:?}", ran.log);
        assert!(
            ran.log.iter().any(|l| l.contains("listed 3 items")),
            "{:?}",
            ran.log
        );
        // stdin is empty both here and behind the remote terminal.
        let ran = agent
            .run(
                &place,
                StepAction::List {
                    command: "cat; echo read-nothing".into(),
                },
            )
            .await;
        assert_eq!(items(ran.ok()), ["read-nothing"], "{place:?}");
    }
}

#[tokio::test]
async fn a_listing_line_that_is_no_item_id_fails_fatal_naming_its_line() {
    let agent = Agent::new().await;
    let host = agent.sshd("badlist");
    for place in [StepHost::Local, on(&host)] {
        let ran = agent
            .run(
                &place,
                StepAction::List {
                    command: "printf 'ok\\n\\nx/y\\nz\\n'".into(),
                },
            )
            .await;
        let f = ran.failed(FailureClass::Fatal);
        assert!(f.message.contains("line 3"), "{place:?}: {}", f.message);
        assert!(f.message.contains("x/y"), "{}", f.message);
        let ran = agent
            .run(
                &place,
                StepAction::List {
                    command: "echo a; exit 5".into(),
                },
            )
            .await;
        assert_eq!(
            ran.failed(FailureClass::Retryable).exit_code,
            Some(5),
            "{place:?}"
        );
    }
}

/// A stage's `out` for `path`, written at `path.tmp`.
fn out(path: &Path, dir: bool) -> StepOut {
    StepOut {
        path: s(path),
        temp: format!("{}.tmp", s(path)),
        dir,
    }
}

#[tokio::test]
async fn a_stage_renames_its_temp_into_place_and_consumes_its_input() {
    let agent = Agent::new().await;
    let host = agent.sshd("stage");
    for (place, root) in [
        (StepHost::Local, agent.local_dir()),
        (on(&host), host.home()),
    ] {
        // A file out, its parent made by the step.
        std::fs::write(root.join("in.txt"), "input").unwrap();
        let o = out(&root.join("texts/page.txt"), false);
        let ran = agent
            .run(
                &place,
                StepAction::Run {
                    command: format!(
                        "tr a-z A-Z < {} > \"$FLOTILLA_OUT\"",
                        s(&root.join("in.txt"))
                    ),
                    out: Some(o.clone()),
                    consume: Some(s(&root.join("in.txt"))),
                },
            )
            .await;
        ran.ok();
        assert_eq!(std::fs::read_to_string(&o.path).unwrap(), "INPUT");
        assert!(!Path::new(&o.temp).exists());
        assert!(!root.join("in.txt").exists(), "consumed");

        // A directory out replaces the one there.
        let o = out(&root.join("pages"), true);
        std::fs::create_dir_all(root.join("pages")).unwrap();
        std::fs::write(root.join("pages/stale"), "old").unwrap();
        let ran = agent
            .run(
                &place,
                StepAction::Run {
                    command: "echo 1 > \"$FLOTILLA_OUT/p1\"; echo 2 > \"$FLOTILLA_OUT/p2\"".into(),
                    out: Some(o.clone()),
                    consume: None,
                },
            )
            .await;
        ran.ok();
        assert_eq!(
            std::fs::read_to_string(root.join("pages/p2")).unwrap(),
            "2\n"
        );
        assert!(!root.join("pages/stale").exists());
        assert!(!Path::new(&o.temp).exists());
    }
}

#[tokio::test]
async fn a_failing_stage_leaves_no_output_and_one_that_writes_nothing_is_fatal() {
    let agent = Agent::new().await;
    let host = agent.sshd("failing");
    for (place, root) in [
        (StepHost::Local, agent.local_dir()),
        (on(&host), host.home()),
    ] {
        std::fs::write(root.join("input"), "x").unwrap();
        let o = out(&root.join("result"), false);
        let ran = agent
            .run(
                &place,
                StepAction::Run {
                    command: "echo partial > \"$FLOTILLA_OUT\"; exit 4".into(),
                    out: Some(o.clone()),
                    consume: Some(s(&root.join("input"))),
                },
            )
            .await;
        let f = ran.failed(FailureClass::Retryable);
        assert_eq!(f.exit_code, Some(4), "{place:?}");
        assert!(!Path::new(&o.path).exists(), "{place:?}: no final path");
        assert!(root.join("input").exists(), "{place:?}: not consumed");

        let ran = agent
            .run(
                &place,
                StepAction::Run {
                    command: "true".into(),
                    out: Some(o.clone()),
                    consume: None,
                },
            )
            .await;
        let f = ran.failed(FailureClass::Fatal);
        assert!(
            f.message.starts_with(&format!(
                "the command exited 0 but wrote nothing at {}-",
                o.temp
            )),
            "{place:?}: {}",
            f.message
        );
        assert!(!Path::new(&o.path).exists());
    }
}

/// True when `pid` no longer runs: gone, or a zombie nobody reaped yet.
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn stopping_a_stage_over_ssh_ends_its_remote_grandchild() {
    let agent = Agent::new().await;
    let host = agent.sshd("cancel");
    let pidfile = host.home().join("sleep.pid");
    let stop = CancellationToken::new();
    let action = StepAction::Run {
        command: format!("sh -c 'sleep 300 & echo $! > {}; wait'", s(&pidfile)),
        out: None,
        consume: None,
    };
    let place = on(&host);
    let job = agent.run_until(&place, action, stop.clone());
    let watch = async {
        let start = Instant::now();
        let pid = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
            {
                break pid;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the stage never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(!is_dead(pid), "the remote sleep runs");
        stop.cancel();
        pid
    };
    let (ran, pid) = tokio::join!(job, watch);
    ran.failed(FailureClass::Cancelled);
    let start = Instant::now();
    while !is_dead(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the remote sleep (pid {pid}) outlived its stopped job by 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every file under `root` with its content (a link's target), by path.
fn tree(root: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = s(p.strip_prefix(root).unwrap());
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                out.push((rel, format!("-> {}", s(&std::fs::read_link(&p).unwrap()))));
            } else if meta.is_dir() {
                out.push((rel.clone(), "/".into()));
                walk(root, &p, out);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.push((rel, hex::encode(sha2::Sha256::digest(&bytes))));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("a/b/c/deep.txt"), "deep\n").unwrap();
    std::fs::write(root.join("a/page 1.png"), [0u8, 255, 13, 10, 0, 26, 4]).unwrap();
    std::fs::write(root.join(".hidden"), "h").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("big.bin"), big).unwrap();
    std::os::unix::fs::symlink("a/b", root.join("link")).unwrap();
}

impl Agent {
    /// Sends `path` from `from`, then hands its tar to a receive of
    /// `dest` on `to`; both reports' logs on failure.
    async fn move_path(&self, from: &StepHost, path: &Path, to: &StepHost, dest: &Path) {
        let sent = self.run(from, StepAction::Send { path: s(path) }).await;
        assert_eq!(sent.ok().outputs, [StepJob::SENT_OUTPUT]);
        let tar = self.stub.uploads.lock().unwrap()[&sent.job].clone();
        let receive = Uuid::new_v4();
        self.stub.moved.lock().unwrap().insert(receive, tar.clone());
        let ran = self
            .run_job(
                receive,
                to,
                StepAction::Receive {
                    size: tar.len() as u64,
                    sha256: hex::encode(sha2::Sha256::digest(&tar)),
                    path: s(dest),
                },
                CancellationToken::new(),
            )
            .await;
        ran.ok();
    }
}

#[tokio::test]
async fn a_directory_moves_here_to_a_host_and_back_whole() {
    let agent = Agent::new().await;
    let host = agent.sshd("move");
    let here = agent.local_dir();
    make_tree(&here.join("pages"));
    let want = tree(&here.join("pages"));

    // Here → the host, to a different name, over what was there.
    std::fs::create_dir_all(host.home().join("in/recv/old")).unwrap();
    agent
        .move_path(
            &StepHost::Local,
            &here.join("pages"),
            &on(&host),
            &host.home().join("in/recv"),
        )
        .await;
    assert_eq!(tree(&host.home().join("in/recv")), want);
    assert!(!host.home().join("in/.recv.flotilla-recv").exists());

    // The host → here.
    agent
        .move_path(
            &on(&host),
            &host.home().join("in/recv"),
            &StepHost::Local,
            &here.join("back/pages"),
        )
        .await;
    assert_eq!(tree(&here.join("back/pages")), want);

    // One file, host to host (two fixtures), then its source removed, twice.
    let other = agent.sshd("move-other");
    std::fs::write(host.home().join("one.txt"), "one").unwrap();
    agent
        .move_path(
            &on(&host),
            &host.home().join("one.txt"),
            &on(&other),
            &other.home().join("x/one.txt"),
        )
        .await;
    assert_eq!(
        std::fs::read_to_string(other.home().join("x/one.txt")).unwrap(),
        "one"
    );
    for _ in 0..2 {
        let ran = agent
            .run(
                &on(&host),
                StepAction::Remove {
                    path: s(&host.home().join("one.txt")),
                },
            )
            .await;
        ran.ok();
        assert!(!host.home().join("one.txt").exists());
    }
}

/// As root with a job user, local sends and receives run as that user
/// (the agent reads nothing the job could not, and what arrives is the
/// job's), while ssh still runs as the agent (its master serves only its
/// own user).
#[tokio::test]
async fn with_a_job_user_moves_here_run_as_that_user() {
    use flotilla_agent::process::user::JobUser;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: not root, so no job user can be switched to");
        return;
    }
    let user = JobUser::lookup("nobody").expect("the nobody user exists");
    let uid = user.uid();
    let agent = Agent::running_jobs_as(RunAs::job_user(user, &[])).await;
    std::fs::set_permissions(agent.work.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let here = agent.local_dir();
    std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o711)).unwrap();
    let mine = here.join("mine");
    std::fs::create_dir(&mine).unwrap();
    agent.run_as.give_dir(&mine).unwrap();
    std::fs::write(mine.join("page.txt"), "the job's").unwrap();
    std::os::unix::fs::chown(mine.join("page.txt"), Some(uid), None).unwrap();

    agent
        .move_path(
            &StepHost::Local,
            &mine.join("page.txt"),
            &StepHost::Local,
            &mine.join("got/page.txt"),
        )
        .await;
    let got = mine.join("got/page.txt");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "the job's");
    assert_eq!(
        std::fs::metadata(&got).unwrap().uid(),
        uid,
        "received as the job's user"
    );

    // A file only root may read is not sent.
    std::fs::write(here.join("secret"), "root's").unwrap();
    std::fs::set_permissions(here.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let ran = agent
        .run(
            &StepHost::Local,
            StepAction::Send {
                path: s(&here.join("secret")),
            },
        )
        .await;
    assert!(
        ran.result.is_err(),
        "sent a file the job cannot read: {:?}",
        ran.log
    );

    let host = agent.sshd("jobuser");
    let ran = agent
        .run(
            &on(&host),
            StepAction::List {
                command: "id -u".into(),
            },
        )
        .await;
    assert_eq!(items(ran.ok()), ["0"]);
}

#[tokio::test]
async fn a_moved_tar_that_is_not_what_was_sent_fails_and_changes_nothing() {
    let agent = Agent::new().await;
    let host = agent.sshd("badsum");
    let here = agent.local_dir();
    std::fs::write(here.join("f"), "content").unwrap();
    let sent = agent
        .run(
            &StepHost::Local,
            StepAction::Send {
                path: s(&here.join("f")),
            },
        )
        .await;
    sent.ok();
    let tar = agent.stub.uploads.lock().unwrap()[&sent.job].clone();
    for place in [StepHost::Local, on(&host)] {
        let dest = host.home().join("dest");
        let job = Uuid::new_v4();
        agent.stub.moved.lock().unwrap().insert(job, tar.clone());
        let wrong = "0".repeat(64);
        let ran = agent
            .run_job(
                job,
                &place,
                StepAction::Receive {
                    size: tar.len() as u64,
                    sha256: wrong.clone(),
                    path: s(&dest),
                },
                CancellationToken::new(),
            )
            .await;
        let f = ran.failed(FailureClass::Retryable);
        let right = hex::encode(sha2::Sha256::digest(&tar));
        assert!(
            f.message.contains(&wrong) && f.message.contains(&right),
            "{}",
            f.message
        );
        assert!(!dest.exists());
    }
}

#[tokio::test]
async fn sending_a_missing_path_fails_fatal_naming_it() {
    let agent = Agent::new().await;
    let host = agent.sshd("missing");
    for (place, root) in [
        (StepHost::Local, agent.local_dir()),
        (on(&host), host.home()),
    ] {
        let path = s(&root.join("not-there"));
        let ran = agent
            .run(&place, StepAction::Send { path: path.clone() })
            .await;
        let f = ran.failed(FailureClass::Fatal);
        assert!(f.message.contains(&path), "{place:?}: {}", f.message);
    }
}

#[tokio::test]
async fn each_host_keeps_its_master_while_others_connect() {
    let agent = Agent::new().await;
    let (a, b) = (agent.sshd("keep-a"), agent.sshd("keep-b"));
    let first = agent.ssh.connect(&a.ssh_target()).await.unwrap();
    let other = agent.ssh.connect(&b.ssh_target()).await.unwrap();
    let again = agent.ssh.connect(&a.ssh_target()).await.unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "the first host's master was replaced"
    );
    assert!(!Arc::ptr_eq(&first, &other));
    first.check().await.unwrap();
}

#[tokio::test]
async fn a_master_connection_that_died_is_replaced() {
    let agent = Agent::new().await;
    let host = agent.sshd("reconnect");
    let list = || StepAction::List {
        command: "echo one".into(),
    };
    agent.run(&on(&host), list()).await.ok();
    let session = agent.ssh.connect(&host.ssh_target()).await.unwrap();
    let exit = std::process::Command::new("ssh")
        .arg("-S")
        .arg(session.control_socket())
        .args(["-O", "exit", "none"])
        .output()
        .unwrap();
    assert!(
        exit.status.success(),
        "{}",
        String::from_utf8_lossy(&exit.stderr)
    );
    drop(session);
    let ran = agent.run(&on(&host), list()).await;
    assert_eq!(items(ran.ok()), ["one"]);
}

/// A listing on `target` that says it ran.
fn reached() -> StepAction {
    StepAction::List {
        command: "echo reached".into(),
    }
}

/// Review C1: any agent running steps took ssh jobs, with the agent user's
/// own identities. Without `--ssh-dir` it reaches no ssh host at all.
#[tokio::test]
async fn an_agent_without_an_ssh_dir_fails_an_ssh_step_fatal_naming_the_flag() {
    let agent = Agent::with(RunAs::agent_user(&[]), Ssh::None).await;
    let host = Sshd::start("no-ssh-dir").unwrap_or_else(|e| panic!("{e}"));
    // Even with the fixture's key where a --ssh-dir would have it.
    host.install_for(&agent.ssh_dir()).unwrap();
    let ran = agent.run(&on(&host), reached()).await;
    let f = ran.failed(FailureClass::Fatal);
    assert!(
        f.message.contains("reaches no ssh hosts") && f.message.contains("--ssh-dir"),
        "{}",
        f.message
    );
}

/// Review C1: `key PATH` was any file on the agent, and without `key` the
/// agent user's own identities were used. A key is a regular file in
/// `--ssh-dir`/keys/, named by a bare name.
#[tokio::test]
async fn a_key_is_a_file_of_the_ssh_dirs_keys_and_nothing_else() {
    let agent = Agent::new().await;
    let host = agent.sshd("keys");
    let keys = agent.ssh_dir().join("keys");
    std::os::unix::fs::symlink(keys.join(host.key_name()), keys.join("link")).unwrap();
    std::fs::create_dir(keys.join("dir")).unwrap();
    let outside = agent.work.path().join("outside-key");
    std::fs::copy(host.key_path(), &outside).unwrap();
    for (key, want) in [
        (None, "names no key"),
        (Some(s(&outside)), "not a bare file name"),
        (Some("../outside-key".into()), "not a bare file name"),
        (Some("~".into()), "not a bare file name"),
        (Some("link".into()), "symbolic link"),
        (Some("dir".into()), "not a regular file"),
        (Some("absent".into()), "no key `absent`"),
    ] {
        let target = SshTarget {
            key: key.clone(),
            ..host.ssh_target()
        };
        let ran = agent.run(&StepHost::Ssh(target), reached()).await;
        let f = ran.failed(FailureClass::Fatal);
        assert!(f.message.contains(want), "{key:?}: {}", f.message);
    }
    let ran = agent.run(&on(&host), reached()).await;
    assert_eq!(items(ran.ok()), ["reached"]);
}

/// Review C1: host keys were accepted on first sight. A host whose key is
/// not in `--ssh-dir`/known_hosts is refused, unless the agent was started
/// with `--ssh-accept-new`, which then records it.
#[tokio::test]
async fn a_host_not_in_known_hosts_is_refused_unless_new_hosts_are_accepted() {
    let strict = Agent::with(RunAs::agent_user(&[]), Ssh::Strict).await;
    let host = Sshd::start("unknown-host").unwrap_or_else(|e| panic!("{e}"));
    host.install_key(&strict.ssh_dir()).unwrap();
    let ran = strict.run(&on(&host), reached()).await;
    let f = ran.failed(FailureClass::Fatal);
    assert!(
        f.message.contains("known_hosts") && f.message.contains("--ssh-accept-new"),
        "{}",
        f.message
    );

    let accepting = Agent::with(RunAs::agent_user(&[]), Ssh::AcceptNew).await;
    host.install_key(&accepting.ssh_dir()).unwrap();
    let ran = accepting.run(&on(&host), reached()).await;
    assert_eq!(items(ran.ok()), ["reached"]);
    let known = std::fs::read_to_string(accepting.ssh_dir().join("known_hosts")).unwrap();
    let line = host.known_hosts_line();
    let host_key = line.split_whitespace().nth(2).unwrap();
    assert!(known.contains(host_key), "{known}");

    // A key that changed is refused even so.
    let other = Sshd::start("changed-host").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        accepting.ssh_dir().join("known_hosts"),
        other.known_hosts_line().replace(
            &format!(":{} ", other.port()),
            &format!(":{} ", host.port()),
        ),
    )
    .unwrap();
    let fresh = Agent::with(RunAs::agent_user(&[]), Ssh::AcceptNew).await;
    std::fs::copy(
        accepting.ssh_dir().join("known_hosts"),
        fresh.ssh_dir().join("known_hosts"),
    )
    .unwrap();
    host.install_key(&fresh.ssh_dir()).unwrap();
    let ran = fresh.run(&on(&host), reached()).await;
    ran.failed(FailureClass::Fatal);
}

/// What the user's `~/.ssh/config` says in
/// [`inside_a_home_whose_ssh_config_breaks_every_connection`]: every
/// connection goes through a proxy that fails.
const BOGUS_USER_CONFIG: &str = "Host *\n  ProxyCommand false\n  Port 1\n";

/// Review C1: the master read the agent user's `~/.ssh/config`, so its
/// `IdentityFile`, `ProxyCommand` and the rest applied to a client's
/// pipeline. ssh finds that file through the password database's home, not
/// `$HOME`, so this test runs the one below again in a mount namespace of
/// its own, with an empty home mounted over the real one holding a config
/// that breaks every connection; the step still connects. Root only (it
/// mounts), like the job-user tests.
#[test]
fn the_agent_users_own_ssh_config_is_not_read() {
    use std::process::Command;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: not root, so no home can be mounted over for ssh");
        return;
    }
    let probe = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: `unshare --mount` is not allowed here: {probe:?}");
        return;
    }
    let home = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .expect("the user is in the password database")
        .dir;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount -t tmpfs -o mode=700 flotilla-test-home \"$1\" && mkdir -m 700 \"$1/.ssh\" \
             && printf '%s' \"$2\" > \"$1/.ssh/config\" && chmod 600 \"$1/.ssh/config\" \
             && shift 2 && exec \"$@\"",
        )
        .arg("sh")
        .arg(&home)
        .arg(BOGUS_USER_CONFIG)
        .arg(std::env::current_exe().unwrap())
        .args([
            "inside_a_home_whose_ssh_config_breaks_every_connection",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("1 passed"),
        "the inner test did not run: {text}"
    );
}

/// Run by [`the_agent_users_own_ssh_config_is_not_read`] only.
#[tokio::test]
#[ignore = "run inside a mount namespace by the_agent_users_own_ssh_config_is_not_read"]
async fn inside_a_home_whose_ssh_config_breaks_every_connection() {
    let home = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap()
        .dir;
    assert_eq!(
        std::fs::read_to_string(home.join(".ssh/config")).unwrap(),
        BOGUS_USER_CONFIG
    );
    let agent = Agent::new().await;
    let host = agent.sshd("home");
    // ssh reading its usual files does not get through here.
    let plain = std::process::Command::new("ssh")
        .arg("-i")
        .arg(host.key_path())
        .arg("-p")
        .arg(host.port().to_string())
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .arg(format!("{}@127.0.0.1", host.user()))
        .arg("true")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        !plain.status.success(),
        "the user's ssh config is not in effect, so this test proves nothing"
    );
    let ran = agent.run(&on(&host), reached()).await;
    assert_eq!(items(ran.ok()), ["reached"]);
}

/// Review H1: the attempt's directory is the job user's, and the agent
/// (root) wrote `probe.paths` there with `std::fs::write`, and ssh's tar
/// through a `> send.tar` redirection, following whatever link a job of
/// that user planted. Now its files are in its own directory, made with
/// O_NOFOLLOW and handed over open.
#[tokio::test]
async fn with_a_job_user_the_agent_follows_no_link_planted_in_the_attempt_directory() {
    use flotilla_agent::process::user::JobUser;
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: not root, so no job user can be switched to");
        return;
    }
    let user = JobUser::lookup("nobody").expect("the nobody user exists");
    let agent = Agent::running_jobs_as(RunAs::job_user(user, &[])).await;
    std::fs::set_permissions(agent.work.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let jobs = agent.work.path().join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::set_permissions(&jobs, std::fs::Permissions::from_mode(0o711)).unwrap();
    let sentinel = agent.work.path().join("sentinel");
    std::fs::write(&sentinel, "the agent's own\n").unwrap();
    // What a job of the same user could do before another's attempt.
    let plant = |job: Uuid| {
        let dir = agent.job_dir(job);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["probe.paths", "send.tar", "moved.tar"] {
            std::os::unix::fs::symlink(&sentinel, dir.join(name)).unwrap();
        }
        job
    };
    let host = agent.sshd("planted");

    for place in [StepHost::Local, on(&host)] {
        let job = plant(Uuid::new_v4());
        let ran = agent
            .run_job(
                job,
                &place,
                StepAction::Probe {
                    paths: vec!["/etc".into(), "/no/such/path".into()],
                },
                CancellationToken::new(),
            )
            .await;
        let result = ran.ok().result.clone().unwrap();
        let probe: StepProbe = serde_json::from_value(result).unwrap();
        assert_eq!(probe.exist, ["/etc"], "{place:?}");
    }

    std::fs::write(host.home().join("page.txt"), "moved\n").unwrap();
    let sent = agent
        .run_job(
            plant(Uuid::new_v4()),
            &on(&host),
            StepAction::Send {
                path: s(&host.home().join("page.txt")),
            },
            CancellationToken::new(),
        )
        .await;
    sent.ok();
    let tar = agent.stub.uploads.lock().unwrap()[&sent.job].clone();
    for (place, dest) in [
        (on(&host), host.home().join("got.txt")),
        (StepHost::Local, PathBuf::new()),
    ] {
        let job = plant(Uuid::new_v4());
        // Here, where the job's user may write: its own directory.
        let dest = if dest.as_os_str().is_empty() {
            agent.job_dir(job).join("got.txt")
        } else {
            dest
        };
        agent.stub.moved.lock().unwrap().insert(job, tar.clone());
        let ran = agent
            .run_job(
                job,
                &place,
                StepAction::Receive {
                    size: tar.len() as u64,
                    sha256: hex::encode(sha2::Sha256::digest(&tar)),
                    path: s(&dest),
                },
                CancellationToken::new(),
            )
            .await;
        ran.ok();
        assert_eq!(
            std::fs::read_to_string(&dest).unwrap(),
            "moved\n",
            "{place:?}"
        );
    }
    let after = std::fs::read(&sentinel).unwrap();
    assert!(
        after == b"the agent's own\n",
        "the agent wrote through a planted link: the sentinel now holds {} bytes starting {:?}",
        after.len(),
        String::from_utf8_lossy(&after[..after.len().min(40)])
    );
}

/// Review M2: an attempt that outlived its job (ssh gone but the remote
/// command not, an agent killed) writes into its own temporary path, not
/// into the one the next attempt renames into place. The orphan here is a
/// writer the first attempt left in a session of its own.
#[tokio::test]
async fn an_orphan_of_an_earlier_attempt_cannot_write_into_the_output() {
    let agent = Agent::new().await;
    let root = agent.local_dir();
    let o = out(&root.join("pages"), true);
    let first = agent
        .run(
            &StepHost::Local,
            StepAction::Run {
                // Its own session and no pipe of the attempt's: it outlives it.
                command: "setsid sh -c 'sleep 1; echo orphan > \"$FLOTILLA_OUT/y\"' \
                          </dev/null >/dev/null 2>&1 & exit 1"
                    .into(),
                out: Some(o.clone()),
                consume: None,
            },
        )
        .await;
    first.failed(FailureClass::Retryable);
    let second = agent
        .run(
            &StepHost::Local,
            StepAction::Run {
                command: "sleep 2; echo good > \"$FLOTILLA_OUT/x\"".into(),
                out: Some(o.clone()),
                consume: None,
            },
        )
        .await;
    second.ok();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        std::fs::read_to_string(root.join("pages/x")).unwrap(),
        "good\n"
    );
    assert!(
        !root.join("pages/y").exists(),
        "the first attempt's orphan wrote into the output"
    );
}
