//! Running the server: connect (retrying while PostgreSQL comes up), apply
//! migrations, start the reaper, the NOTIFY listener and the coordinator,
//! serve HTTP until the shutdown token fires, then wait for every task.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use object_store::ObjectStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::state::{AppState, Settings};

/// Connects a pool, retrying for up to `patience` while the database is
/// unreachable (it may be starting).
pub async fn connect(opts: PgConnectOptions, patience: Duration) -> anyhow::Result<PgPool> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let pool = PgPoolOptions::new()
            .max_connections(48)
            .min_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(opts.clone())
            .await;
        match pool {
            Ok(p) => return Ok(p),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "database not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("connecting to PostgreSQL"),
        }
    }
}

/// Applies the migrations under `migrations/` (an advisory lock keeps
/// several servers starting at once from racing).
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    sqlx::migrate!("../migrations")
        .run(db)
        .await
        .context("applying database migrations")
}

/// Serves on `listener` until `shutdown` fires.
pub async fn run(
    listener: TcpListener,
    db: PgPool,
    store: Arc<dyn ObjectStore>,
    settings: Settings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let state = AppState {
        db: db.clone(),
        store,
        job_signal: Arc::new(Notify::new()),
        parents_signal: Arc::new(Notify::new()),
        settings: Arc::new(settings),
        shutdown: shutdown.clone(),
        auth_cache: Arc::default(),
        agent_instances: Arc::default(),
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
        move || {
            let db = coordinator_db.clone();
            async move { crate::coordinator::advance_all(&db).await }
        },
        state.parents_signal.clone(),
        state.settings.coordinator_interval,
        shutdown.clone(),
    ));
    tasks.close();
    let app = crate::api::router(state);
    let stop = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .context("HTTP server")?;
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
