//! Accepting and serving HTTP connections under limits a hostile client
//! cannot outlast: a cap on open connections, a header-read (and keep-alive)
//! timeout, and a timeout on writes that make no progress.
//!
//! `axum::serve` sets no timer, so hyper's header-read timeout never applies
//! there, and it has no connection cap; this is the same loop (hyper's
//! HTTP/1 connection per accepted socket, graceful shutdown on the token)
//! with those limits. The request-body timeout is a router layer
//! (`serve::run`), since only a handler knows when it waits for the body.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::state::HttpLimits;

/// After shutdown is signalled, how long open connections get to finish
/// their requests (a lease long poll answers at once, streams end) before
/// the server stops waiting for them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// File descriptors kept for everything but client connections: the
/// database pool, the object store, log files, the listener.
const FDS_FOR_THE_REST: u64 = 256;

/// Connections the kernel completes and queues for us while we have not
/// accepted them yet: those that arrive in a burst, and those that wait
/// while we are at the connection cap. Linux caps it at
/// `net.core.somaxconn` (4096 by default since 5.4); tokio's `bind` asks
/// for 1024, and a burst past it drops handshakes, which clients retry
/// only after a second or more.
const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with a [`LISTEN_BACKLOG`]-deep accept queue.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std and tokio do: a restarted server can bind at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `app` on `listener` until `shutdown` fires, then lets open
/// connections finish (for at most [`SHUTDOWN_GRACE`]). The request-body
/// limit of `limits` is not applied here (see the module's head).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: CancellationToken,
) {
    let max = fit_to_fd_limit(limits.max_connections);
    // One permit per open connection, taken before `accept` and released
    // when the connection's task ends (mini-redis's `limit_connections`).
    let permits = Arc::new(Semaphore::new(max));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let connections = TaskTracker::new();
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the connection semaphore is never closed"),
            _ = shutdown.cancelled() => break,
        };
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        if let Err(e) = socket.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
        }
        let mut socket = TimeoutStream::new(socket);
        socket.set_write_timeout(limits.send_stall_timeout);
        let io = TokioIo::new(Box::pin(socket));
        let service = TowerToHyperService::new(app.clone().into_service::<Incoming>());
        let conn = http.serve_connection(io, service);
        let stop = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            tokio::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                _ = stop.cancelled() => {
                    // Finish the request in flight, then close (an idle
                    // keep-alive connection closes at once).
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                // Timeouts, resets and clients that hung up mid-request end
                // up here; none is the server's fault.
                tracing::debug!(%peer, error = %e, "connection ended");
            }
        });
    }
    drop(listener);
    connections.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            open = max - permits.available_permits(),
            "connections still open after the shutdown grace; closing them"
        );
    }
}

/// An accept error is about one connection (it was reset before we took it)
/// or about us (out of descriptors): for the latter, wait a little, since
/// accepting again at once would only spin (axum::serve does the same).
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed; pausing accepts for 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Raises the soft limit on open files to the hard limit (as Go's runtime
/// does at start-up) and returns `wanted`, lowered if even then it would not
/// leave [`FDS_FOR_THE_REST`] descriptors for everything else.
fn fit_to_fd_limit(wanted: usize) -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return wanted;
    };
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    let room = usize::try_from(soft.saturating_sub(FDS_FOR_THE_REST)).unwrap_or(usize::MAX);
    if wanted > room {
        tracing::warn!(
            wanted,
            allowed = room,
            open_files_limit = soft,
            "the connection cap does not fit the open-files limit; lowering it"
        );
    }
    wanted.min(room).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_open_files_limit() {
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .expect("reading RLIMIT_NOFILE");
        assert_eq!(fit_to_fd_limit(10), 10);
        let huge = fit_to_fd_limit(usize::MAX);
        let (raised, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .expect("reading RLIMIT_NOFILE");
        assert!(raised >= soft);
        assert_eq!(huge as u64, raised - FDS_FOR_THE_REST);
    }
}
