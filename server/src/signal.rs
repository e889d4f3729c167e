//! Wakes long-polling agents when jobs arrive: a `LISTEN` on the jobs channel
//! that any server instance NOTIFYs, reconnecting after errors. While it is
//! down, lease requests still poll, so nothing is missed, only later.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::queue::JOBS_CHANNEL;

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
