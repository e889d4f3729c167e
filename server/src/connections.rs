//! Accepting and serving HTTP connections under limits a hostile client
//! cannot outlast: a cap on open connections, a header-read (and keep-alive)
//! timeout, and a timeout on writes that make no progress; with TLS, a
//! timeout on the handshake too.
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
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
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
/// connections finish (for at most [`SHUTDOWN_GRACE`]). With `tls`, each
/// connection is a TLS one (the handshake within the header-read timeout).
/// The request-body limit of `limits` is not applied here (see the
/// module's head).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let max = fit_to_fd_limit(limits.max_connections);
    // One permit per open connection, taken before `accept` and released
    // when the connection's task ends (mini-redis's `limit_connections`):
    // a TLS handshake in progress holds one too.
    let permits = Arc::new(Semaphore::new(max));
    let mut http = http1::Builder::new();
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
        let socket = Box::pin(socket);
        let app = app.clone();
        let http = http.clone();
        let stop = shutdown.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let _permit = permit;
            let Some(tls) = tls else {
                return serve_one(socket, app, &http, &stop, peer).await;
            };
            // In this task, not the accept loop: a client that opens a
            // connection and never finishes its handshake holds its own
            // slot only, and for at most the header-read timeout.
            let handshake = tls.accept(socket);
            let handshake = async {
                match limits.header_read_timeout {
                    Some(limit) => {
                        tokio::time::timeout(limit, handshake)
                            .await
                            .unwrap_or_else(|_| {
                                Err(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    "TLS handshake timed out",
                                ))
                            })
                    }
                    None => handshake.await,
                }
            };
            let stream = tokio::select! {
                s = handshake => s,
                _ = stop.cancelled() => return,
            };
            match stream {
                Ok(stream) => serve_one(stream, app, &http, &stop, peer).await,
                // Plain HTTP to the TLS port, scanners, timeouts, clients
                // that do not trust our certificate: none is the server's
                // fault.
                Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
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

/// Serves HTTP/1 requests on one connection (`io`: a TCP or a TLS stream)
/// until the client closes it, a limit ends it, or shutdown finishes the
/// request in flight.
async fn serve_one<I>(
    io: I,
    app: Router,
    http: &http1::Builder,
    stop: &CancellationToken,
    peer: std::net::SocketAddr,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app.into_service::<Incoming>());
    let conn = http.serve_connection(TokioIo::new(io), service);
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

/// How many connections a server asked for `wanted` will hold: what
/// [`fit_to_fd_limit`] will allow once it raises the open-files limit to
/// its hard limit (read only; nothing is changed here).
pub fn connections_held(wanted: usize) -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((_, hard)) => wanted.min(room_under(hard)).max(1),
        Err(_) => wanted,
    }
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
    let room = room_under(soft);
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

/// The connections an open-files limit of `open_files` leaves room for.
fn room_under(open_files: u64) -> usize {
    usize::try_from(open_files.saturating_sub(FDS_FOR_THE_REST)).unwrap_or(usize::MAX)
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
