//! A job reaches no credential it was not given (issue #12, review C1 and M12).
//!
//! On a real `flotilla up` (its own PostgreSQL, one local agent) command jobs
//! try every way the review lists: their environment, the agent's
//! `/proc/$PPID/environ` and `cmdline` (and every other process's), relative
//! paths up to the data directory (`admin.token`, `agents/*.token`, the
//! PostgreSQL password files, `pg_hba.conf`), `ls -R` and `find` of it,
//! `psql` on the cluster's socket as the superuser and as the owner role, and
//! declared outputs that are links to the token files. Their logs must hold
//! no token, no password and none of the canary values `up` was started
//! with, and every `psql` must fail.
//!
//! As root (CI) `up` runs jobs as the job user, and everything is asserted.
//! As an ordinary user jobs share that user's rights by design, so only the
//! scrubbing (environment, tokens in `/proc`) is asserted; the test prints
//! what it skipped.
//!
//! Also here: `up` as root leaves a closed parent of its data directory
//! closed and says why it stops (M12), and a cluster made by an older
//! flotilla (trusting every local connection, tables owned by the superuser)
//! is upgraded to password logins with the tables handed to the owner role.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_core::job::JobState;
use flotilla_e2e::api::Api;
use flotilla_e2e::{binary, scratch};
use serde_json::json;

/// `flotilla up`, stopped with SIGTERM (which also stops its PostgreSQL) when dropped.
struct Up {
    child: Child,
    log: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Starts `flotilla up` on `data` with `env` added, and waits until it
/// answers; returns it and its URL.
async fn start_up(dir: &Path, data: &Path, env: &[(&str, &str)]) -> (Up, String) {
    let log = dir.join("up.log");
    let child = Command::new(binary("flotilla"))
        .args(["up", "--data", data.to_str().expect("utf-8 path")])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--agents",
            "1",
            "--capacity",
            "4",
        ])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("up.log"))
        .spawn()
        .expect("starting flotilla up");
    let mut up = Up { child, log };
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        if let Ok(url) = std::fs::read_to_string(data.join("server.url")) {
            let url = url.trim().to_string();
            let healthy = http
                .get(format!("{url}/healthz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if healthy {
                return (up, url);
            }
        }
        if let Ok(Some(status)) = up.child.try_wait() {
            panic!(
                "flotilla up exited ({status}): {}",
                std::fs::read_to_string(&up.log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "flotilla up not ready after 120 s: {}",
            std::fs::read_to_string(&up.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The trimmed contents of `path`, if it exists.
fn secret_in(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Runs a command job and returns its final view and its whole log.
async fn run_job(
    api: &Api,
    command: &str,
    outputs: &[&str],
) -> (flotilla_core::api::JobView, String) {
    let id = api
        .submit(json!({
            "kind": "command",
            "command": command,
            "outputs": outputs,
            "max_attempts": 1,
            "timeout_s": 120,
        }))
        .await;
    let view = api.wait_final(&id, Duration::from_secs(180)).await;
    let (status, log) = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/jobs/{id}/log"),
            None,
        )
        .await;
    assert_eq!(status, 200, "job log: {log}");
    // A string today; whatever shape the log takes, every byte of it is
    // searched.
    let log = match log {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    };
    // Shown when the test fails (or with --nocapture).
    println!(
        "---- job `{command}`: {:?} {:?}\n{log}",
        view.state, view.error
    );
    (view, log)
}

/// Fails naming which secret `text` holds, if any.
fn assert_holds_none(what: &str, text: &str, secrets: &[(&str, String)]) {
    for (name, value) in secrets {
        assert!(
            !text.contains(value.as_str()),
            "{what} holds the {name}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_flotilla_up_reaches_no_credential() {
    let dir = scratch("e2e-creds-");
    let data = dir.path().join("data");
    // Values the agent inherits from `up` and no job may see.
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let canary_aws = format!("canary-aws-{nonce}");
    let canary_db = format!("postgres://canary:canary-db-{nonce}@db/x");
    let canary_flotilla = format!("canary-flotilla-{nonce}");
    let (_up, url) = start_up(
        dir.path(),
        &data,
        &[
            ("AWS_SECRET_ACCESS_KEY", &canary_aws),
            ("DATABASE_URL", &canary_db),
            ("FLOTILLA_CANARY", &canary_flotilla),
        ],
    )
    .await;

    let admin = secret_in(&data.join("admin.token")).expect("up wrote the admin token");
    let agent = secret_in(&data.join("agents/local-1.token")).expect("up wrote the agent token");
    let mut tokens = vec![("admin token", admin.clone()), ("agent token", agent)];
    for role in ["postgres", "flotilla"] {
        let file = data.join("secrets").join(format!("{role}.password"));
        if let Some(p) = secret_in(&file) {
            tokens.push(("PostgreSQL password", p));
        }
    }
    let mut everything = tokens.clone();
    everything.extend([
        ("AWS canary", canary_aws.clone()),
        ("DATABASE_URL canary", canary_db.clone()),
        ("FLOTILLA_* canary", canary_flotilla.clone()),
    ]);
    let api = Api::new(&url, &admin);

    // 1. Its own environment: allowlisted variables and its own only.
    let (view, log) = run_job(&api, "env", &[]).await;
    assert_eq!(view.state, JobState::Succeeded, "{:?}: {log}", view.error);
    assert!(
        log.contains("FLOTILLA_JOB_ID=") && log.contains("PATH="),
        "{log}"
    );
    assert_holds_none("the job's environment", &log, &everything);
    for name in [
        "FLOTILLA_CANARY",
        "AWS_SECRET_ACCESS_KEY",
        "DATABASE_URL",
        "FLOTILLA_LOG",
    ] {
        assert!(
            !log.contains(&format!("{name}=")),
            "{name} reached the job:\n{log}"
        );
    }

    // 2. The agent's /proc entries, and every other process's environment.
    let (_, log) = run_job(
        &api,
        r#"echo "== parent $PPID"
cat /proc/$PPID/environ | tr '\0' '\n'; echo
cat /proc/$PPID/cmdline | tr '\0' ' '; echo
echo "== every process"
for p in /proc/[0-9]*; do cat "$p/environ" 2>/dev/null | tr '\0' '\n'; cat "$p/cmdline" 2>/dev/null | tr '\0' ' '; echo; done
true"#,
        &[],
    )
    .await;
    assert!(log.contains("== every process"), "{log}");
    // Tokens are in no process's environment or arguments, whoever runs it.
    assert_holds_none("/proc as the job sees it", &log, &tokens);

    if !is_root() {
        println!(
            "skipped (not root, so jobs run as this user and may read its files): the data \
             directory, password files, PostgreSQL socket and output-link checks, and the \
             canaries in the agent's own /proc environ"
        );
        return;
    }
    // As another user, not even the agent's environment is readable.
    assert_holds_none("/proc as the job user sees it", &log, &everything);

    // 3. Up to the data directory: every file, listing and socket.
    let psql_found = Command::new("psql").arg("--version").output().is_ok();
    let (view, log) = run_job(
        &api,
        r#"id
D=$(cd ../../../.. && pwd)
echo "== data directory $D"
for f in ../../../../admin.token ../../../../server.url "$D/admin.token" "$D/agents/local-1.token" \
         "$D"/agents/*.token "$D/secrets/postgres.password" "$D/secrets/flotilla.password" \
         "$D"/secrets/* "$D/pg/pg_hba.conf" "$D/run/postgres.log"; do
  echo "-- $f"; cat "$f"
done
echo "== ls -R"
ls -laR "$D"
echo "== find"
find "$D" /tmp -maxdepth 6 \( -name '*.token' -o -name '*.password' -o -name 'server.url' \) 2>/dev/null |
  while read -r f; do echo "-- $f"; cat "$f"; done
echo "== psql"
psql -w -h "$D/run" -U postgres -d postgres -c 'select 1'; echo "PSQL_AS_POSTGRES=$?"
psql -w -h "$D/run" -U flotilla -d flotilla -c 'select 1'; echo "PSQL_AS_FLOTILLA=$?"
true"#,
        &[],
    )
    .await;
    assert_eq!(view.state, JobState::Succeeded, "{:?}: {log}", view.error);
    assert!(log.contains("== data directory"), "{log}");
    assert!(!log.contains("uid=0("), "the job ran as root:\n{log}");
    assert_holds_none("the data directory as the job sees it", &log, &everything);
    assert!(
        !log.contains("local   all"),
        "the job read pg_hba.conf:\n{log}"
    );
    for role in ["POSTGRES", "FLOTILLA"] {
        let line = log
            .lines()
            .find_map(|l| l.split_once(&format!("PSQL_AS_{role}=")).map(|(_, c)| c))
            .unwrap_or_else(|| panic!("psql as {role} did not run:\n{log}"));
        assert_ne!(line.trim(), "0", "psql as {role} got in:\n{log}");
        if psql_found {
            assert_ne!(line.trim(), "127", "psql is not on the job's PATH:\n{log}");
        }
    }
    if !psql_found {
        println!("psql is not installed here: its attempts failed for want of it");
    }

    // 4. Outputs that are links to the tokens: the agent (root) must not
    // read them on the job's behalf.
    let (view, log) = run_job(
        &api,
        r#"D=$(cd ../../../.. && pwd)
ln -s "$D/admin.token" stolen_admin
ln -s "$D/agents/local-1.token" stolen_agent"#,
        &["stolen_admin", "stolen_agent"],
    )
    .await;
    assert_eq!(
        view.state,
        JobState::Failed,
        "a link to a token was uploaded as an output: {view:?}"
    );
    assert!(view.outputs.is_empty(), "{:?}", view.outputs);
    let error = view.error.clone().unwrap_or_default();
    assert!(error.contains("link"), "{error}");
    assert_holds_none("the failed job", &format!("{error}\n{log}"), &everything);
}

/// M12: `up` as root used to add o+x to every parent of its data directory
/// (`/root` included). Under a closed parent it now stops, naming it, and
/// leaves it closed; so does the embedded PostgreSQL on its own.
#[tokio::test]
async fn up_as_root_leaves_a_closed_parent_closed() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        println!("skipped: only root's `flotilla up` changes users and modes");
        return;
    }
    let dir = scratch("e2e-m12-");
    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).expect("closed dir");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mode = || {
        std::fs::metadata(&closed)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    };

    let data = closed.join("data");
    // stderr to a file: an `up` that keeps running leaves PostgreSQL holding
    // whatever it was given.
    let log = dir.path().join("up.log");
    let child = Command::new(binary("flotilla"))
        .args(["up", "--data", data.to_str().expect("utf-8 path")])
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("up.log"))
        .spawn()
        .expect("starting flotilla up");
    let mut up = Up {
        child,
        log: log.clone(),
    };
    let started = Instant::now();
    let status = loop {
        if let Some(s) = up.child.try_wait().expect("waiting for up") {
            break Some(s);
        }
        if started.elapsed() > Duration::from_secs(60) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Still running: stopped (with its PostgreSQL) by SIGTERM on drop.
    drop(up);
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        mode(),
        0o700,
        "up changed {}'s mode: {stderr}",
        closed.display()
    );
    let status = status.expect("up stops at once under a closed parent");
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(closed.to_str().expect("utf-8")) && stderr.contains("does not open up"),
        "the refusal names the closed directory and why: {stderr}"
    );

    let err = flotilla_server::embedded_pg::EmbeddedPostgres::start(&closed.join("pg-only"))
        .await
        .expect_err("postgres cannot reach a cluster under a closed parent");
    assert!(err.to_string().contains("does not open up"), "{err}");
    assert_eq!(mode(), 0o700);
}

/// A cluster made by an older flotilla trusted every local connection and
/// its tables belong to the superuser. Started again it takes passwords
/// only, and the server's role (no superuser) owns and can migrate them.
#[tokio::test]
async fn a_trusting_cluster_is_upgraded_to_passwords() {
    use sqlx::{ConnectOptions, Connection};
    use std::os::unix::fs::PermissionsExt;

    use flotilla_server::embedded_pg::{find_bin_dir, EmbeddedPostgres};

    let dir = scratch("e2e-pgup-");
    let base = dir.path().join("c");
    let (pgdata, run) = (base.join("pg"), base.join("run"));
    for d in [&base, &pgdata, &run] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let postgres = is_root().then(|| {
        let user = nix::unistd::User::from_name("postgres")
            .expect("looking up postgres")
            .expect("the postgres user exists");
        for d in [&pgdata, &run] {
            std::os::unix::fs::chown(d, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .expect("chown");
        }
    });
    let bin = find_bin_dir().expect("PostgreSQL is installed");
    let pg_cmd = |program: &str| {
        let mut c = match postgres {
            Some(()) => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(bin.join(program));
                c
            }
            None => Command::new(bin.join(program)),
        };
        c.env("LC_ALL", "C").stdin(Stdio::null());
        c
    };
    // As flotilla made clusters before: trust.
    let out = pg_cmd("initdb")
        .arg("-D")
        .arg(&pgdata)
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ])
        .output()
        .expect("running initdb");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = pg_cmd("pg_ctl")
        .arg("-D")
        .arg(&pgdata)
        .arg("-l")
        .arg(run.join("postgres.log"))
        .args(["-w", "-o"])
        .arg(format!("-k {} -c listen_addresses=''", run.display()))
        .arg("start")
        .stdout(Stdio::null())
        .output()
        .expect("running pg_ctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trusted = |db: &str| {
        sqlx::postgres::PgConnectOptions::new()
            .socket(&run)
            .username("postgres")
            .database(db)
    };
    let mut conn = trusted("postgres").connect().await.expect("trust login");
    sqlx::query("CREATE DATABASE flotilla")
        .execute(&mut conn)
        .await
        .expect("creating the old database");
    conn.close().await.expect("close");
    let old = flotilla_server::serve::connect(trusted("flotilla"), Duration::from_secs(10))
        .await
        .expect("connecting as the old superuser");
    flotilla_server::serve::migrate(&old)
        .await
        .expect("migrating as the superuser");
    old.close().await;

    // Started by this flotilla: upgraded in place (it is already running).
    let pg = EmbeddedPostgres::start(&base).await.expect("upgrading");
    pg.ensure_database("flotilla").await.expect("handing over");

    // The configuration reload takes effect within moments.
    let started = Instant::now();
    while trusted("postgres").connect().await.is_ok() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a login without a password still works"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let db =
        flotilla_server::serve::connect(pg.connect_options("flotilla"), Duration::from_secs(10))
            .await
            .expect("the owner role logs in with its password");
    flotilla_server::serve::migrate(&db)
        .await
        .expect("migrations run as the owner role");
    let (superuser,): (bool,) =
        sqlx::query_as("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&db)
            .await
            .expect("reading the role");
    assert!(!superuser, "the server's role is a superuser");
    let (foreign,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relowner <> 'flotilla'::regrole",
    )
    .fetch_one(&db)
    .await
    .expect("reading owners");
    assert_eq!(foreign, 0, "relations in public not owned by flotilla");
    let shell = sqlx::query("COPY (SELECT 1) TO PROGRAM 'true'")
        .execute(&db)
        .await;
    assert!(shell.is_err(), "the owner role runs programs on the host");
    db.close().await;
    pg.stop_now().await.expect("stopping the cluster");
}
