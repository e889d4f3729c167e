//! A private PostgreSQL cluster for the zero-config default (`flotilla up`)
//! and for the tests: made with the system's `initdb`/`pg_ctl`, listening
//! only on a Unix socket in a directory of ours, reused on the next start.
//!
//! - `auth.rs`: SCRAM passwords for the superuser and the owner role the
//!   server connects as, and the upgrade of clusters that trusted every
//!   local connection.
//! - `account.rs`: the host users PostgreSQL and jobs run as, and whether
//!   they can reach their directories (checked, never opened up).
//!
//! Layout of `DIR`: `pg/` the cluster, `run/` its socket and log (0700, the
//! cluster's user), `secrets/` the password files (0600 in 0700, ours).

pub mod account;
pub mod auth;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tokio::process::Command;

use self::account::Account;
use self::auth::{Secrets, OWNER, SUPERUSER};

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedPgError {
    #[error(
        "PostgreSQL's initdb/pg_ctl were not found on PATH or under /usr/lib/postgresql/*/bin; \
         install PostgreSQL (Debian/Ubuntu: `apt-get install postgresql`)"
    )]
    NotInstalled,
    #[error("running as root, PostgreSQL must run as an unprivileged user, but user `{0}` does not exist (Debian's postgresql package creates it)")]
    NoUnprivilegedUser(String),
    #[error(
        "running as root, PostgreSQL runs as `{user}`, which cannot reach {}: {} (mode {mode:03o}) \
         does not let it pass. flotilla does not open up directories it did not make; choose a \
         data directory under one that others may enter (e.g. --data /var/lib/flotilla), or \
         allow it yourself (`chmod o+x {}`)",
        dir.display(), blocker.display(), blocker.display()
    )]
    Unreachable {
        user: String,
        dir: PathBuf,
        blocker: PathBuf,
        mode: u32,
    },
    #[error(
        "the private PostgreSQL refused `{role}` with the password in {}: {detail}. If that file \
         was lost, put `local all all trust` alone in {} and start again: flotilla then sets new \
         passwords and restores password logins",
        file.display(), hba.display()
    )]
    LoginRefused {
        role: String,
        file: PathBuf,
        hba: PathBuf,
        detail: String,
    },
    #[error("{what}: {source}")]
    Sql {
        what: String,
        #[source]
        source: sqlx::Error,
    },
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

fn sql_err(what: &str) -> impl FnOnce(sqlx::Error) -> EmbeddedPgError + '_ {
    move |source| EmbeddedPgError::Sql {
        what: what.to_string(),
        source,
    }
}

/// A cluster in `DIR/pg` with its socket in `DIR/run`, its log in
/// `DIR/run/postgres.log` and its passwords in `DIR/secrets`.
#[derive(Debug, Clone)]
pub struct EmbeddedPostgres {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    secrets: Secrets,
    /// Set when we are root: PostgreSQL refuses to run as root, so every
    /// command runs through `runuser -u USER`.
    run_as: Option<Account>,
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
    /// already running, then makes sure it takes password logins only and
    /// that the owner role exists. As root, `dir` is made passable (0711)
    /// for the cluster's user, but its parents are only checked.
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
        let secrets = Secrets::load_or_make(&dir.join("secrets"))?;
        let run_as = if nix::unistd::geteuid().is_root() {
            let user = Account::lookup(UNPRIVILEGED_USER)
                .ok()
                .flatten()
                .ok_or_else(|| EmbeddedPgError::NoUnprivilegedUser(UNPRIVILEGED_USER.into()))?;
            open_for_others(&dir)?;
            if let Some((blocker, mode)) = user.first_closed(&dir).map_err(io_err(&dir))? {
                return Err(EmbeddedPgError::Unreachable {
                    user: user.name.clone(),
                    dir,
                    blocker,
                    mode,
                });
            }
            for d in [&data_dir, &socket_dir] {
                std::fs::create_dir_all(d).map_err(io_err(d))?;
                std::os::unix::fs::chown(d, Some(user.uid), Some(user.gid)).map_err(io_err(d))?;
            }
            Some(user)
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
            secrets,
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
        pg.secure().await?;
        Ok(pg)
    }

    /// Password logins only (upgrading a cluster that trusted local
    /// connections), and the owner role with the password in its file.
    async fn secure(&self) -> Result<(), EmbeddedPgError> {
        let hba = self.data_dir.join("pg_hba.conf");
        if auth::hba_needs_rewrite(&hba)? {
            let mut conn = self.admin_connection("postgres").await?;
            auth::set_password(&mut conn, SUPERUSER, &self.secrets.superuser)
                .await
                .map_err(sql_err("setting the superuser's password"))?;
            auth::write_hba(&hba, self.run_as.as_ref().map(|u| (u.uid, u.gid)))?;
            sqlx::query("SELECT pg_reload_conf()")
                .execute(&mut conn)
                .await
                .map_err(sql_err("reloading the configuration"))?;
            let _ = conn.close().await;
            tracing::warn!(
                hba = %hba.display(),
                "the private PostgreSQL trusted every local connection; it now takes SCRAM \
                 password logins only (passwords in {})",
                self.secrets.dir.display()
            );
        }
        // The owner's login is tried first: on an up-to-date cluster there
        // is nothing to change, and two processes starting at once on one
        // cluster (the tests) then make no catalog writes.
        match self.connect_options("postgres").connect().await {
            Ok(conn) => {
                let _ = conn.close().await;
                Ok(())
            }
            Err(e) if auth::is_login_refused(&e) => {
                let mut conn = self.admin_connection("postgres").await?;
                auth::ensure_owner(&mut conn, &self.secrets.owner)
                    .await
                    .map_err(sql_err("making the owner role"))?;
                let _ = conn.close().await;
                Ok(())
            }
            Err(e) => Err(sql_err("logging in as the owner role")(e)),
        }
    }

    /// A connection as the superuser, or what to do if it is refused.
    async fn admin_connection(
        &self,
        database: &str,
    ) -> Result<sqlx::PgConnection, EmbeddedPgError> {
        self.admin_connect_options(database)
            .connect()
            .await
            .map_err(|e| self.login_error(SUPERUSER, e))
    }

    fn login_error(&self, role: &str, e: sqlx::Error) -> EmbeddedPgError {
        if auth::is_login_refused(&e) {
            EmbeddedPgError::LoginRefused {
                role: role.to_string(),
                file: self.secrets.file(role),
                hba: self.data_dir.join("pg_hba.conf"),
                detail: e.to_string(),
            }
        } else {
            sql_err(&format!("connecting as {role}"))(e)
        }
    }

    fn command(&self, program: &str) -> Command {
        let exe = self.bin_dir.join(program);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(&user.name).arg("--").arg(exe);
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

    /// Makes the cluster with password logins from the start: the
    /// superuser's password goes to initdb in a file the cluster's user can
    /// read (a copy in its own 0700 socket directory, removed after).
    async fn initdb(&self) -> Result<(), EmbeddedPgError> {
        tracing::info!(data_dir = %self.data_dir.display(), "creating PostgreSQL cluster");
        let pwfile = match &self.run_as {
            None => self.secrets.file(SUPERUSER),
            Some(user) => {
                use std::os::unix::fs::OpenOptionsExt;
                let copy = self.socket_dir.join("initdb.pwfile");
                let _ = std::fs::remove_file(&copy);
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&copy)
                    .map_err(io_err(&copy))?;
                std::io::Write::write_all(
                    &mut f,
                    format!("{}\n", self.secrets.superuser).as_bytes(),
                )
                .map_err(io_err(&copy))?;
                std::os::unix::fs::chown(&copy, Some(user.uid), Some(user.gid))
                    .map_err(io_err(&copy))?;
                copy
            }
        };
        let mut cmd = self.command("initdb");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args([
                "-U",
                SUPERUSER,
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", pwfile.display()));
        let result = self.run("initdb", cmd).await;
        if self.run_as.is_some() {
            let _ = std::fs::remove_file(&pwfile);
        }
        result?;
        // initdb also allows TCP logins from localhost; the server listens
        // on none, but the rules say only what is meant.
        auth::write_hba(
            &self.data_dir.join("pg_hba.conf"),
            self.run_as.as_ref().map(|u| (u.uid, u.gid)),
        )
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

    /// Waits until the cluster accepts a connection, logging while it
    /// recovers; a refused password fails at once.
    async fn wait_ready(&self, timeout: std::time::Duration) -> Result<(), EmbeddedPgError> {
        let started = std::time::Instant::now();
        let mut last_note = started;
        loop {
            let last_error = match self.admin_connect_options("postgres").connect().await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Err(e) if auth::is_login_refused(&e) => return Err(self.login_error(SUPERUSER, e)),
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

    /// Options for a connection to `database` as the owner role, which is
    /// what the server connects as: it owns the flotilla databases and is
    /// not a superuser.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .username(OWNER)
            .password(&self.secrets.owner)
            .database(database)
    }

    /// Options for a connection to `database` as the superuser: only for
    /// making databases and roles.
    pub fn admin_connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .username(SUPERUSER)
            .password(&self.secrets.superuser)
            .database(database)
    }

    /// [`Self::connect_options`] as a URL, for `flotilla serve`. It holds
    /// the password: pass it in the environment (`FLOTILLA_DATABASE_URL`),
    /// not on a command line, which every local user can read.
    pub fn database_url(&self, database: &str) -> String {
        format!(
            "postgres://{OWNER}:{}@localhost/{database}?host={}",
            self.secrets.owner,
            self.socket_dir.display()
        )
    }

    /// [`Self::database_url`] without the password, to show.
    pub fn display_url(&self, database: &str) -> String {
        format!(
            "postgres://{OWNER}@localhost/{database}?host={}",
            self.socket_dir.display()
        )
    }

    /// The file holding `role`'s password.
    pub fn password_file(&self, role: &str) -> PathBuf {
        self.secrets.file(role)
    }

    /// Creates `database`, owned by the owner role, unless it exists; one
    /// made by an older flotilla (owned by the superuser) is handed over
    /// with everything in it.
    pub async fn ensure_database(&self, database: &str) -> Result<(), EmbeddedPgError> {
        let mut conn = self.admin_connection("postgres").await?;
        let owner: Option<String> = sqlx::query_scalar(
            "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1",
        )
        .bind(database)
        .fetch_optional(&mut conn)
        .await
        .map_err(sql_err("looking up the database"))?;
        // Identifiers cannot be bound; quote it.
        let quoted = format!("\"{}\"", database.replace('"', "\"\""));
        match owner.as_deref() {
            None => {
                let made = sqlx::query(&format!("CREATE DATABASE {quoted} OWNER \"{OWNER}\""))
                    .execute(&mut conn)
                    .await;
                match made {
                    Ok(_) => {}
                    // Made by another process at the same moment.
                    Err(e) if auth::sql_state(&e).is_some_and(|c| c == "42P04") => {}
                    Err(e) => return Err(sql_err("creating the database")(e)),
                }
            }
            Some(OWNER) => {}
            Some(old) => {
                tracing::info!(
                    database,
                    old_owner = old,
                    "handing the database to the owner role"
                );
                sqlx::query(&format!("ALTER DATABASE {quoted} OWNER TO \"{OWNER}\""))
                    .execute(&mut conn)
                    .await
                    .map_err(sql_err("handing the database over"))?;
                let mut inside = self.admin_connection(database).await?;
                auth::hand_over(&mut inside)
                    .await
                    .map_err(sql_err("handing the database's tables over"))?;
                let _ = inside.close().await;
            }
        }
        let _ = conn.close().await;
        Ok(())
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), EmbeddedPgError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

/// Makes `dir` (ours: the data directory) passable by other users but not
/// listable: they may reach what inside it is theirs (the cluster's user its
/// `pg/` and `run/`, a job user its work directory), and nothing else.
fn open_for_others(dir: &Path) -> Result<(), EmbeddedPgError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir)
        .map_err(io_err(dir))?
        .permissions()
        .mode();
    if mode & 0o011 != 0o011 {
        set_mode(dir, (mode | 0o011) & 0o7777)?;
    }
    Ok(())
}
