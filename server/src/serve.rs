//! Running the server: connect (retrying while PostgreSQL comes up), apply
//! migrations, start the reaper, the NOTIFY listener, the coordinator and
//! retention,
//! serve HTTP until the shutdown token fires, then wait for every task.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use object_store::ObjectStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::state::{AppState, Settings};

/// Connections of the main pool: the client API, the dashboard and the
/// background tasks (the agent protocol has its own, [`run`]).
pub const DEFAULT_POOL_SIZE: u32 = 48;

/// How long a request waits for a pool connection before it fails (503).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest any one statement of the server may run
/// (`--statement-timeout-ms`). The server's statements are claims,
/// updates of one run and pages of lists, milliseconds each; a minute is
/// far past any of them at a million jobs, so one that runs longer is a
/// bug or a lock pile-up, and it is cut off with an error (logged, a 5xx
/// or a retry) rather than holding a connection and its locks for ever.
/// Migrations run without it ([`migrate`]).
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);

/// `opts` with every connection's `statement_timeout` set to `limit`
/// (zero: none), sent at connection start-up, so every pool made from it
/// (the agents' included) has it.
pub fn with_statement_timeout(opts: PgConnectOptions, limit: Duration) -> PgConnectOptions {
    opts.options([("statement_timeout", limit.as_millis().to_string())])
}

/// Connects the main pool ([`DEFAULT_POOL_SIZE`] connections), retrying
/// for up to `patience` while the database is unreachable (it may be
/// starting).
pub async fn connect(opts: PgConnectOptions, patience: Duration) -> anyhow::Result<PgPool> {
    connect_sized(opts, patience, DEFAULT_POOL_SIZE).await
}

/// [`connect`] with a pool of `size` connections.
pub async fn connect_sized(
    opts: PgConnectOptions,
    patience: Duration,
    size: u32,
) -> anyhow::Result<PgPool> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let pool = PgPoolOptions::new()
            .max_connections(size.max(2))
            .min_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(opts.clone())
            .await;
        match pool {
            Ok(p) => return Ok(p),
            // A certificate does not get better by waiting.
            Err(e) if tls_refused(&e) => return Err(tls_error(e)),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "database not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("connecting to PostgreSQL"),
        }
    }
}

/// Whether `e` is a failure of TLS with PostgreSQL, which retrying will not
/// cure: the server offers no TLS (`Error::Tls`), or its certificate was
/// refused (rustls's error, inside the handshake's `io::Error`).
fn tls_refused(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(io) => {
            io.kind() == std::io::ErrorKind::InvalidData
                && flotilla_core::tls::classify(&io.to_string(), "").is_some()
        }
        _ => false,
    }
}

/// A [`tls_refused`] failure, with what to do about it.
fn tls_error(e: sqlx::Error) -> anyhow::Error {
    let advice = if e.to_string().contains("does not support TLS") {
        "PostgreSQL offers no TLS, which the sslmode of --database-url requires: turn on ssl at \
         the database server (ssl = on, with ssl_cert_file and ssl_key_file)"
    } else {
        "PostgreSQL's TLS certificate was refused. With sslmode=verify-full (or verify-ca), the \
         sslrootcert parameter of --database-url must name the CA certificate (PEM) that signed \
         the database's certificate (managed services publish theirs, e.g. AWS RDS's \
         global-bundle.pem), and with verify-full the URL's host must be a name the certificate \
         gives; sslmode=require encrypts without checking the certificate"
    };
    let cause = flotilla_core::tls::chain(&e);
    anyhow::anyhow!("connecting to PostgreSQL over TLS failed ({cause}). {advice}")
}

/// The database migrations this build knows (`migrations/`), in order.
pub static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The newest of [`MIGRATIONS`]: the schema this build expects.
pub fn schema_version() -> i64 {
    MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Applies the migrations under `migrations/` (an advisory lock keeps
/// several servers starting at once from racing), on a connection without
/// the statement timeout: an index built over a large table may rightly
/// take longer than any request should.
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    let mut conn = db.acquire().await.context("connecting to migrate")?;
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await
        .context("lifting the statement timeout for the migrations")?;
    let migrated = MIGRATIONS
        .run(&mut *conn)
        .await
        .context("applying database migrations");
    // Still without the limit: the catalogue may be large.
    if migrated.is_ok() {
        match invalid_indexes(&mut *conn).await {
            Ok(names) => {
                for name in names {
                    tracing::error!(
                        index = %name,
                        "index {name} is invalid: a CREATE INDEX CONCURRENTLY of a migration was \
                         interrupted (or another server is building it now). Queries do not use \
                         it, and a unique one does not hold; rebuild it with `REINDEX INDEX \
                         CONCURRENTLY {name}` (or, for a name ending in _ccnew, left by an \
                         interrupted REINDEX, drop it: `DROP INDEX CONCURRENTLY {name}`)"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "looking for invalid indexes after migrating"),
        }
    }
    // The connection goes back to the pool: give it the limit back.
    sqlx::query("RESET statement_timeout")
        .execute(&mut *conn)
        .await
        .context("restoring the statement timeout after the migrations")?;
    migrated
}

/// Indexes of this schema that are not valid: what an interrupted
/// `CREATE INDEX CONCURRENTLY` leaves, which the migration's `IF NOT
/// EXISTS` then takes for built.
pub async fn invalid_indexes(
    db: impl sqlx::Executor<'_, Database = sqlx::Postgres>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i
         JOIN pg_class c ON c.oid = i.indexrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE NOT i.indisvalid AND n.nspname = current_schema()
         ORDER BY 1",
    )
    .fetch_all(db)
    .await
}

/// Serves on `listener` until `shutdown` fires, over TLS with `tls`.
///
/// The agent calls that keep leases alive (register, lease, heartbeat,
/// start, log, complete, fail) run on a pool of their own,
/// `settings.agent_pool_size` connections next to `db`: clients, dashboard
/// tabs and their streams, floods of bad tokens, and agents' own bulk
/// downloads and uploads can then empty `db` while heartbeats still get a
/// connection, so no lease is lost to someone else's load. A second pool
/// rather than a gate on the other requests: a gate counts requests, not
/// connections, and dashboard streams, background tasks and handlers that
/// hold two connections would slip past it. The hostile-clients e2e test
/// lost both its leases when the 900 downloads of its attack shared the
/// agents' pool.
pub async fn run(
    listener: TcpListener,
    db: PgPool,
    store: Arc<dyn ObjectStore>,
    settings: Settings,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let state = AppState {
        db: db.clone(),
        store,
        job_signal: Arc::new(Notify::new()),
        parents_signal: Arc::new(crate::coordinator::ParentWakeups::default()),
        settings: Arc::new(settings),
        shutdown: shutdown.clone(),
        auth_cache: Arc::default(),
        agent_instances: Arc::default(),
        live_pages: Arc::default(),
        cap_refusals: Arc::default(),
    };
    let extended = crate::queue::reaper::grace_after_start(&db, state.settings.lease_ttl)
        .await
        .context("extending leases at start-up")?;
    if extended > 0 {
        tracing::info!(
            leases = extended,
            "gave live leases a grace period after start-up"
        );
    }
    let tasks = TaskTracker::new();
    tasks.spawn(crate::queue::reaper::run(
        db.clone(),
        state.settings.reap_interval,
        state.settings.lease_ttl,
        (state.settings.backoff_base, state.settings.backoff_max),
        shutdown.clone(),
    ));
    tasks.spawn(crate::queue::wakeup::run(
        db.clone(),
        state.job_signal.clone(),
        shutdown.clone(),
    ));
    let coordinator_db = db.clone();
    tasks.spawn(crate::coordinator::run(
        move |parents| {
            let db = coordinator_db.clone();
            async move { crate::coordinator::advance_all(&db, &parents).await }
        },
        state.parents_signal.clone(),
        state.settings.coordinator_interval,
        shutdown.clone(),
    ));
    tasks.spawn(crate::queue::retention::run(
        db.clone(),
        state.store.clone(),
        state.settings.retention,
        shutdown.clone(),
    ));
    tasks.spawn(crate::store::sweep::run(
        db.clone(),
        state.store.clone(),
        state.settings.sweep.clone(),
        shutdown.clone(),
    ));
    tasks.close();
    let agent_db = PgPoolOptions::new()
        .max_connections(state.settings.agent_pool_size.max(1))
        .min_connections(1)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with((*db.connect_options()).clone());
    let limits = state.settings.http;
    let mut app = crate::api::router(state, agent_db);
    if let Some(stall) = limits.body_stall_timeout {
        // Resets at every chunk received: a limit on progress, not on time.
        app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(stall));
    }
    crate::connections::serve(listener, app, limits, tls, shutdown.clone()).await;
    shutdown.cancel();
    tasks.wait().await;
    Ok(())
}

/// A token cancelled on Ctrl-C or SIGTERM.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("installing a SIGTERM handler succeeds at start-up");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}
