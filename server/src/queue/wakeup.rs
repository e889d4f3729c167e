//! Waking long-polling agents when jobs arrive: [`notify_jobs`] queues a
//! NOTIFY with a submission's transaction, and [`run`] LISTENs on the
//! channel that any server instance NOTIFYs, waking this server's waiting
//! lease requests (`AppState::job_signal`) and reconnecting after errors.
//! While it is down, lease requests still poll, so nothing is missed, only
//! later.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The NOTIFY channel that wakes long-polling agents on every server.
pub const JOBS_CHANNEL: &str = "flotilla_jobs";

/// Queues a wake-up for agents; delivered when the transaction commits.
pub async fn notify_jobs(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(JOBS_CHANNEL)
        .execute(conn)
        .await?;
    Ok(())
}

/// Listens until `shutdown`, waking `signal`'s waiters on every NOTIFY and
/// after every reconnect.
pub async fn run(db: PgPool, signal: Arc<Notify>, shutdown: CancellationToken) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let listener = async {
            let mut l = PgListener::connect_with(&db).await?;
            l.listen(JOBS_CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        };
        let mut listener = tokio::select! {
            _ = shutdown.cancelled() => return,
            l = listener => match l {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        };
        backoff = Duration::from_millis(200);
        // Anything may have been submitted while we were not listening.
        signal.notify_waiters();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                n = listener.try_recv() => match n {
                    Ok(Some(_)) => signal.notify_waiters(),
                    // The connection dropped; sqlx reconnects on the next
                    // call, but notifications in between are lost: recheck.
                    Ok(None) => signal.notify_waiters(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                        signal.notify_waiters();
                        break;
                    }
                }
            }
        }
    }
}
