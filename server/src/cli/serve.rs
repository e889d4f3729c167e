//! `flotilla serve`: the production server, on an existing PostgreSQL and
//! object store; and the token files it and `flotilla up` keep.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use flotilla_core::api::TokenRole;
use sqlx::postgres::PgConnectOptions;

use crate::dashboard::streams::StreamLimits;
use crate::state::{HealthSampling, HttpLimits, Settings};
use crate::transport::{ExposureError, Transport};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// PostgreSQL URL, e.g. postgres://flotilla@db/flotilla (a Unix socket:
    /// postgres://user@localhost/db?host=/run/postgresql).
    #[arg(long, env = "FLOTILLA_DATABASE_URL")]
    pub database_url: String,
    /// Object store: a directory, file:///dir, or s3://bucket/prefix (with
    /// the usual AWS_* variables; AWS_ENDPOINT_URL for S3-compatible
    /// services).
    #[arg(long, env = "FLOTILLA_STORE")]
    pub store: String,
    /// Address to listen on; port 0 picks a free one (printed at start). An
    /// address other machines can reach needs --tls-cert and --tls-key, or
    /// --behind-tls-proxy.
    #[arg(long, env = "FLOTILLA_LISTEN", default_value = "127.0.0.1:8470")]
    pub listen: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM: the server's
    /// certificate, then any intermediate CA's). Read once at start.
    #[arg(long, env = "FLOTILLA_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "FLOTILLA_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A proxy in front terminates TLS and only it reaches this address:
    /// serve plain HTTP on a non-loopback --listen, and take the proxy's
    /// `X-Forwarded-Proto: https` as a request's coming over HTTPS.
    #[arg(long, env = "FLOTILLA_BEHIND_TLS_PROXY")]
    pub behind_tls_proxy: bool,
    /// File holding the admin token; made (mode 0600) with a fresh token if
    /// it does not exist.
    #[arg(long, env = "FLOTILLA_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// How long a lease lives without a heartbeat, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ttl_ms: u64,
    /// Most bytes of log text kept per attempt of a job: its first half and
    /// its last half, with a line saying how much was cut between them.
    #[arg(long, env = "FLOTILLA_LOG_CAP_BYTES", default_value_t = Settings::default().log_cap_bytes)]
    pub log_cap_bytes: u64,
    /// Base of the retry back-off, in milliseconds (doubles per attempt).
    #[arg(long, default_value_t = 2_000)]
    pub backoff_base_ms: u64,
    /// Serve the dashboard (/ui) without a login. Only for a machine whose
    /// listening address nobody else can reach (refused on any other than
    /// loopback).
    #[arg(long)]
    pub no_dashboard_login: bool,
    /// Most HTTP connections open at once; past it new ones wait in the
    /// listen backlog (lowered to fit the open-files limit).
    #[arg(long, env = "FLOTILLA_MAX_CONNECTIONS", default_value_t = HttpLimits::default().max_connections)]
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers, and longest
    /// an idle keep-alive connection stays open, in milliseconds (0: none).
    #[arg(long, env = "FLOTILLA_HEADER_READ_TIMEOUT_MS", default_value_t = ms(HttpLimits::default().header_read_timeout))]
    pub header_read_timeout_ms: u64,
    /// Longest a response may go unread by its client (a write that makes
    /// no progress) before the connection is dropped, in milliseconds (0:
    /// none).
    #[arg(long, env = "FLOTILLA_SEND_STALL_TIMEOUT_MS", default_value_t = ms(HttpLimits::default().send_stall_timeout))]
    pub send_stall_timeout_ms: u64,
    /// Longest a request body may send nothing while the server waits for
    /// it, in milliseconds (0: none). Not a limit on an upload's total time.
    #[arg(long, env = "FLOTILLA_BODY_STALL_TIMEOUT_MS", default_value_t = ms(HttpLimits::default().body_stall_timeout))]
    pub body_stall_timeout_ms: u64,
    /// PostgreSQL connections for the client API, the dashboard and
    /// background work.
    #[arg(long, env = "FLOTILLA_DB_POOL_SIZE", default_value_t = crate::serve::DEFAULT_POOL_SIZE)]
    pub db_pool_size: u32,
    /// With an s3:// store, how long the presigned URLs stay valid that
    /// agents fetch tile inputs and checkpoints by and upload outputs to
    /// (in parts; an upload's URLs last at least 600 s plus its size at
    /// 1 MiB/s), in seconds; 0 moves all of those through the
    /// server instead (as it does for a local store).
    #[arg(long, env = "FLOTILLA_PRESIGN_TTL_S", default_value_t = 900)]
    pub presign_ttl_s: u64,
    /// The longest one database statement may run, in milliseconds (0:
    /// no limit); set on every connection. Migrations run without it.
    #[arg(long, env = "FLOTILLA_STATEMENT_TIMEOUT_MS", default_value_t = crate::serve::DEFAULT_STATEMENT_TIMEOUT.as_millis() as u64)]
    pub statement_timeout_ms: u64,
    /// PostgreSQL connections kept for the agent protocol alone, so that
    /// heartbeats get through whatever clients do.
    #[arg(long, env = "FLOTILLA_AGENT_POOL_SIZE", default_value_t = Settings::default().agent_pool_size)]
    pub agent_pool_size: u32,
    /// Keep at most one health report per agent per this many
    /// milliseconds, for the agent page's charts (kept 7 days).
    #[arg(long, env = "FLOTILLA_HEALTH_SAMPLE_INTERVAL_MS", default_value_t = ms(Some(HealthSampling::default().interval)))]
    pub health_sample_interval_ms: u64,
    /// How long a finished job (with its attempts, logs and outputs' records)
    /// stays in the database; then it is archived to the object store as
    /// JSON lines under archive/jobs/ and deleted. E.g. 30d, 12h, 90s; 0
    /// keeps every job.
    #[arg(long, env = "FLOTILLA_RETENTION", default_value = "30d", value_parser = parse_retention)]
    pub retention: Duration,
    /// How often every open pipeline and revdeps run is looked at for
    /// children that ended on another server or by the reaper (one whose
    /// child ends on this server, or that a request here changed, is
    /// looked at once it does). E.g. 500ms, 5s.
    #[arg(long, env = "FLOTILLA_COORDINATOR_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub coordinator_interval: Duration,
    /// How often finished jobs past --retention are archived.
    #[arg(long, env = "FLOTILLA_RETENTION_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,
    /// How long a superseded checkpoint, or an upload a crash left half
    /// written (a local store's `KEY#N` files, the server's spools in the
    /// temporary directory), stays before it is deleted. E.g. 1d, 6h.
    #[arg(long, env = "FLOTILLA_SWEEP_AFTER", default_value = "1d", value_parser = parse_sweep_after)]
    pub sweep_after: Duration,
    /// How often the store is swept of what --sweep-after lets go.
    #[arg(long, env = "FLOTILLA_SWEEP_INTERVAL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,
    /// Most jobs one submitter (a client token's name) may have waiting to
    /// run when it submits more: a job, a retry or an ROI past it is
    /// refused with 429. Admin tokens are not limited. 0: no limit.
    #[arg(
        long,
        env = "FLOTILLA_MAX_WAITING_PER_SUBMITTER",
        default_value_t = 1_000_000
    )]
    pub max_waiting_per_submitter: u64,
    /// Most live dashboard views (the event streams of open pages) one
    /// login token may hold at once, in all its sessions and tabs; one
    /// more is refused with 429 until a tab closes. 0: no limit.
    #[arg(long, env = "FLOTILLA_MAX_STREAMS_PER_TOKEN", default_value_t = cap(StreamLimits::default().per_token))]
    pub max_streams_per_token: usize,
    /// Most live dashboard views open at once in this server, so that
    /// dashboards cannot take the connections agents need. Default: a
    /// quarter of the connections the server holds (--max-connections, or
    /// less where the open-files limit lowers it). 0: no limit.
    #[arg(long, env = "FLOTILLA_MAX_STREAMS")]
    pub max_streams: Option<usize>,
    #[command(flatten)]
    pub alerts: crate::alerts::AlertArgs,
}

/// `--retention`: a duration; `0` (zero) keeps every job.
pub fn parse_retention(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{e} (a duration such as 30d, 12h or 90s; 0 keeps every job)"))
}

/// `--sweep-after`: a duration of at least an hour (what is swept may be in
/// use until then, see `store::sweep::LEAST_GRACE`).
pub fn parse_sweep_after(s: &str) -> Result<Duration, String> {
    let d =
        humantime::parse_duration(s).map_err(|e| format!("{e} (a duration such as 1d or 6h)"))?;
    let least = crate::store::sweep::LEAST_GRACE;
    if d < least {
        return Err(format!(
            "{s} is shorter than {}: an upload's spool or staged file may still be in use \
             until then",
            humantime::format_duration(least)
        ));
    }
    Ok(d)
}

/// A timeout in milliseconds as the flags take it (0: none).
fn ms(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A cap as the flags take it (0: none).
fn cap(c: Option<usize>) -> usize {
    c.unwrap_or(0)
}

/// The flags' milliseconds as a timeout (0: none).
fn timeout(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

impl ServeArgs {
    /// How requests will arrive, or why --listen may not be served so.
    pub fn transport(&self) -> Result<Transport, ExposureError> {
        crate::transport::transport_for(
            self.listen,
            self.tls_cert.is_some(),
            self.behind_tls_proxy,
            self.no_dashboard_login,
        )
    }

    pub fn settings(&self) -> Settings {
        let mut s = Settings::with_lease_ttl(Duration::from_millis(self.lease_ttl_ms.max(100)));
        // Room for a few lines at either end, whatever was asked.
        s.log_cap_bytes = self.log_cap_bytes.max(64 << 10);
        s.backoff_base = Duration::from_millis(self.backoff_base_ms);
        s.dashboard_open = self.no_dashboard_login;
        s.http = HttpLimits {
            max_connections: self.max_connections.max(1),
            header_read_timeout: timeout(self.header_read_timeout_ms),
            send_stall_timeout: timeout(self.send_stall_timeout_ms),
            body_stall_timeout: timeout(self.body_stall_timeout_ms),
        };
        s.agent_pool_size = self.agent_pool_size.max(1);
        s.alerts = self.alerts.settings();
        s.health_samples.interval = Duration::from_millis(self.health_sample_interval_ms.max(1));
        s.retention = crate::queue::retention::Retention {
            keep_for: (!self.retention.is_zero()).then_some(self.retention),
            interval: self.retention_interval.max(Duration::from_millis(100)),
        };
        s.max_waiting_per_submitter =
            (self.max_waiting_per_submitter > 0).then_some(self.max_waiting_per_submitter);
        s.coordinator_interval = self.coordinator_interval.max(Duration::from_millis(10));
        s.live_streams = StreamLimits {
            per_token: (self.max_streams_per_token > 0).then_some(self.max_streams_per_token),
            total: match self.max_streams {
                None => Some(StreamLimits::total_for(
                    crate::connections::connections_held(s.http.max_connections),
                )),
                Some(0) => None,
                Some(n) => Some(n),
            },
        };
        s.sweep = crate::store::sweep::Sweep {
            local_root: crate::store::local_dir(&self.store),
            grace: self.sweep_after,
            interval: self.sweep_interval.max(Duration::from_millis(100)),
        };
        s
    }
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Before anything is touched: a refused address is a mistake to fix,
    // not to find after the migrations ran.
    let mut settings = args.settings();
    settings.transport = args.transport()?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(crate::transport::acceptor(cert, key)?),
        _ => None,
    };
    let opts: PgConnectOptions = args
        .database_url
        .parse()
        .context("parsing --database-url")?;
    check_root_cert(&args.database_url)?;
    let opts = crate::serve::with_statement_timeout(
        opts,
        Duration::from_millis(args.statement_timeout_ms),
    );
    let db = crate::serve::connect_sized(opts, Duration::from_secs(60), args.db_pool_size).await?;
    crate::serve::migrate(&db).await?;
    if let Some(path) = &args.admin_token_file {
        let token = read_or_make_token(path)?;
        crate::auth::ensure_token(&db, &token, TokenRole::Admin, None, "admin").await?;
    }
    let store = crate::store::open(&args.store)?;
    if args.presign_ttl_s > 0 {
        settings.presigner = crate::store::Presigner::for_store(
            &args.store,
            Duration::from_secs(args.presign_ttl_s),
        )?
        .map(std::sync::Arc::new);
    }
    let listener = crate::connections::bind(args.listen)
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("flotilla: listening on {scheme}://{addr}");
    let shutdown = crate::serve::shutdown_on_signals();
    crate::serve::run(listener, db, store, settings, tls, shutdown).await
}

/// Fails at once, saying which, when the URL's `sslrootcert` cannot be
/// read: connecting would otherwise retry it as an unreachable database.
fn check_root_cert(database_url: &str) -> anyhow::Result<()> {
    let Ok(url) = url::Url::parse(database_url) else {
        return Ok(());
    };
    if let Some((_, path)) = url.query_pairs().find(|(k, _)| k == "sslrootcert") {
        std::fs::File::open(path.as_ref()).with_context(|| {
            format!("reading the sslrootcert {path} of --database-url (the CA certificate, PEM)")
        })?;
    }
    Ok(())
}

/// Reads a token file, or writes a fresh token to it with mode 0600.
pub fn read_or_make_token(path: &std::path::Path) -> anyhow::Result<String> {
    if path.exists() {
        let t = std::fs::read_to_string(path)
            .with_context(|| format!("reading token file {}", path.display()))?;
        let t = t.trim().to_string();
        anyhow::ensure!(!t.is_empty(), "token file {} is empty", path.display());
        return Ok(t);
    }
    let token = crate::auth::new_secret();
    write_private(path, &token)?;
    Ok(token)
}

/// Writes `text` to `path` readable by the owner only, via a temporary file
/// (created exclusively, mode 0600 from the start) renamed into place.
pub fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A fresh name, created exclusively: an existing file or a planted
    // symlink at the temporary path is never written through, and never
    // keeps an older, wider mode.
    let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    /// A symlink planted where the temporary file used to go is not
    /// written through, and the file is 0600 (review finding L4).
    #[test]
    fn write_private_neither_follows_links_nor_keeps_modes() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let path = dir.path().join("admin.token");
        std::os::unix::fs::symlink(&victim, path.with_extension("tmp")).unwrap();
        super::write_private(&path, "secret").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "secret\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
