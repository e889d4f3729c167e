//! A private PostgreSQL cluster for the zero-config default (`flotilla up`)
//! and for the tests: made with the system's `initdb`/`pg_ctl`, listening
//! only on a Unix socket in a directory of ours, reused on the next start.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use sqlx::postgres::PgConnectOptions;
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedPgError {
    #[error(
        "PostgreSQL's initdb/pg_ctl were not found on PATH or under /usr/lib/postgresql/*/bin; \
         install PostgreSQL (Debian/Ubuntu: `apt-get install postgresql`)"
    )]
    NotInstalled,
    #[error("running as root, PostgreSQL must run as an unprivileged user, but user `{0}` does not exist (Debian's postgresql package creates it)")]
    NoUnprivilegedUser(String),
    #[error("the socket directory path {0} is too long for a Unix socket (max ~100 bytes); use a shorter --data directory")]
    SocketPathTooLong(PathBuf),
    #[error("{what} failed ({status}); see {log}: {tail}")]
    CommandFailed {
        what: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("PostgreSQL is running but did not accept connections within {seconds} s ({last_error}); see {log}")]
    NotReady {
        seconds: u64,
        log: PathBuf,
        last_error: String,
    },
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedPgError + '_ {
    move |source| EmbeddedPgError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A cluster in `DIR/pg` with its socket in `DIR/run` and its log in
/// `DIR/run/postgres.log`.
#[derive(Debug, Clone)]
pub struct EmbeddedPostgres {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    /// Set when we are root: PostgreSQL refuses to run as root, so every
    /// command runs through `runuser -u USER`.
    run_as: Option<String>,
    /// Whether `start` launched the server (and `stop` should stop it) or
    /// found it already running.
    started_here: bool,
}

/// The directory holding `initdb` and `pg_ctl`: `PATH` first, else the
/// newest `/usr/lib/postgresql/*/bin` (Debian keeps them off `PATH`).
pub fn find_bin_dir() -> Result<PathBuf, EmbeddedPgError> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return Ok(dir);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, b)| b)
        .ok_or(EmbeddedPgError::NotInstalled)
}

const UNPRIVILEGED_USER: &str = "postgres";

/// How long start-up may take: crash recovery of a large cluster on a slow
/// disk takes minutes (a data-directory fsync alone took 50 s here).
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

impl EmbeddedPostgres {
    /// Makes the cluster if `dir/pg` holds none, then starts it unless it is
    /// already running.
    pub async fn start(dir: &Path) -> Result<Self, EmbeddedPgError> {
        let bin_dir = find_bin_dir()?;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let dir = dir.canonicalize().map_err(io_err(dir))?;
        let data_dir = dir.join("pg");
        let socket_dir = dir.join("run");
        // sun_path is 108 bytes; the file is `.s.PGSQL.5432` inside the dir.
        if socket_dir.as_os_str().len() > 92 {
            return Err(EmbeddedPgError::SocketPathTooLong(socket_dir));
        }
        let log_file = socket_dir.join("postgres.log");
        let run_as = if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name(UNPRIVILEGED_USER)
                .ok()
                .flatten()
                .ok_or_else(|| EmbeddedPgError::NoUnprivilegedUser(UNPRIVILEGED_USER.into()))?;
            for d in [&data_dir, &socket_dir] {
                std::fs::create_dir_all(d).map_err(io_err(d))?;
                nix::unistd::chown(d.as_path(), Some(user.uid), Some(user.gid))
                    .map_err(|e| io_err(d)(e.into()))?;
            }
            // The user must be able to reach the directories through ours.
            make_traversable(&dir)?;
            Some(UNPRIVILEGED_USER.to_string())
        } else {
            std::fs::create_dir_all(&socket_dir).map_err(io_err(&socket_dir))?;
            None
        };
        set_mode(&socket_dir, 0o700)?;
        let mut pg = EmbeddedPostgres {
            bin_dir,
            data_dir,
            socket_dir,
            log_file,
            run_as,
            started_here: false,
        };
        if !pg.data_dir.join("PG_VERSION").is_file() {
            pg.initdb().await?;
        }
        if !pg.is_running().await {
            pg.pg_ctl_start().await?;
            pg.started_here = true;
        }
        // Running is not ready: after a host crash the cluster first syncs
        // its data directory and replays WAL, refusing connections ("not yet
        // accepting connections") for as long as that takes.
        pg.wait_ready(READY_TIMEOUT).await?;
        Ok(pg)
    }

    fn command(&self, program: &str) -> Command {
        let exe = self.bin_dir.join(program);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        // LC_ALL=C keeps initdb from failing on a host without the caller's locale.
        cmd.env("LC_ALL", "C");
        cmd
    }

    async fn run(&self, what: &str, mut cmd: Command) -> Result<(), EmbeddedPgError> {
        let out = cmd.output().await.map_err(io_err(&self.bin_dir))?;
        if out.status.success() {
            return Ok(());
        }
        let mut tail = String::from_utf8_lossy(&out.stderr).into_owned();
        if let Ok(log) = std::fs::read_to_string(&self.log_file) {
            let lines: Vec<&str> = log.lines().collect();
            tail.push_str(&lines[lines.len().saturating_sub(10)..].join("\n"));
        }
        Err(EmbeddedPgError::CommandFailed {
            what: what.to_string(),
            status: out.status.to_string(),
            log: self.log_file.clone(),
            tail,
        })
    }

    async fn initdb(&self) -> Result<(), EmbeddedPgError> {
        tracing::info!(data_dir = %self.data_dir.display(), "creating PostgreSQL cluster");
        let mut cmd = self.command("initdb");
        cmd.arg("-D").arg(&self.data_dir).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ]);
        self.run("initdb", cmd).await
    }

    async fn pg_ctl_start(&self) -> Result<(), EmbeddedPgError> {
        tracing::info!(socket_dir = %self.socket_dir.display(), "starting PostgreSQL");
        let opts = format!(
            "-k {} -c listen_addresses='' -c unix_socket_permissions=0700 -c max_connections=200 \
             -c fsync=on -c shared_buffers=128MB",
            self.socket_dir.display()
        );
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log_file)
            .args([
                "-w",
                "-t",
                &READY_TIMEOUT.as_secs().to_string(),
                "-o",
                &opts,
                "start",
            ]);
        // pg_ctl leaves the server running after it exits; it must not be
        // killed with the process that started it.
        cmd.kill_on_drop(false)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        self.run("pg_ctl start", cmd).await
    }

    /// Waits until the cluster accepts a connection, logging while it recovers.
    async fn wait_ready(&self, timeout: std::time::Duration) -> Result<(), EmbeddedPgError> {
        use sqlx::Connection;
        let started = std::time::Instant::now();
        let mut last_note = started;
        loop {
            let last_error =
                match sqlx::PgConnection::connect_with(&self.connect_options("postgres")).await {
                    Ok(conn) => {
                        let _ = conn.close().await;
                        return Ok(());
                    }
                    Err(e) => e.to_string(),
                };
            if started.elapsed() > timeout {
                return Err(EmbeddedPgError::NotReady {
                    seconds: timeout.as_secs(),
                    log: self.log_file.clone(),
                    last_error,
                });
            }
            if last_note.elapsed() > std::time::Duration::from_secs(10) {
                tracing::info!(
                    waited_s = started.elapsed().as_secs(),
                    log = %self.log_file.display(),
                    error = %last_error,
                    "PostgreSQL is running but not accepting connections yet (recovering?)"
                );
                last_note = std::time::Instant::now();
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    async fn is_running(&self) -> bool {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir).arg("status");
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        matches!(cmd.status().await, Ok(s) if s.success())
    }

    /// Stops the cluster (fast shutdown: open transactions roll back) if this
    /// process started it.
    pub async fn stop(&self) -> Result<(), EmbeddedPgError> {
        if !self.started_here {
            return Ok(());
        }
        self.stop_now().await
    }

    /// Stops the cluster whoever started it.
    pub async fn stop_now(&self) -> Result<(), EmbeddedPgError> {
        tracing::info!("stopping PostgreSQL");
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "fast", "-w", "stop"]);
        self.run("pg_ctl stop", cmd).await
    }

    /// Restarts the cluster (used by tests of reconnection).
    pub async fn restart(&self) -> Result<(), EmbeddedPgError> {
        self.stop_now().await?;
        self.pg_ctl_start().await?;
        self.wait_ready(READY_TIMEOUT).await
    }

    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// Options for a connection as the `postgres` superuser to `database`.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .username("postgres")
            .database(database)
    }

    /// The same as a URL, for `flotilla serve --database-url`.
    pub fn database_url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@localhost/{database}?host={}",
            self.socket_dir.display()
        )
    }

    /// Creates `database` unless it exists.
    pub async fn ensure_database(&self, database: &str) -> Result<(), sqlx::Error> {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = self.connect_options("postgres").connect().await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(database)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            // Identifiers cannot be bound; quote it.
            let quoted = format!("\"{}\"", database.replace('"', "\"\""));
            sqlx::query(&format!("CREATE DATABASE {quoted}"))
                .execute(&mut conn)
                .await?;
        }
        conn.close().await?;
        Ok(())
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), EmbeddedPgError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

/// Adds o+x to `dir` and its ancestors that lack it, so the unprivileged
/// user can reach the data directory inside it.
fn make_traversable(dir: &Path) -> Result<(), EmbeddedPgError> {
    use std::os::unix::fs::PermissionsExt;
    for d in dir.ancestors() {
        let meta = std::fs::metadata(d).map_err(io_err(d))?;
        let mode = meta.permissions().mode();
        if mode & 0o001 == 0 {
            set_mode(d, (mode | 0o011) & 0o7777)?;
        }
    }
    Ok(())
}
