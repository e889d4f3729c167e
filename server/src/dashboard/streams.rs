//! How many live streams the dashboard keeps open: at most
//! [`StreamLimits::per_session`] for one signed-in session and
//! [`StreamLimits::total`] in all. A stream holds a connection and a task
//! for as long as its tab is open, and one following a job, an ROI or a
//! run nobody else follows makes its own queries every tick; so without a
//! cap one session (a script with a stolen cookie, a page reloaded in a
//! loop) could take the connections the agents need (`--max-connections`
//! counts both) and set the database polling on its behalf. Past a cap the
//! stream is refused with 429, `Retry-After` and a message saying which
//! cap and what to do; the page keeps what it showed and says its live
//! updates stopped. A slot is given back when its stream is dropped (the
//! tab closed: noticed at the next write, within the keep-alive's 15 s).
//! Per server process, as the connections are.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use super::session::Viewer;
use crate::state::AppState;

/// The caps; `None`: no cap.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Streams open at once for one signed-in session (all its tabs). An
    /// open dashboard (`--no-dashboard-login`) has no sessions and is held
    /// by [`StreamLimits::total`] alone.
    pub per_session: Option<usize>,
    /// Streams open at once in this server.
    pub total: Option<usize>,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            // A person has a few tabs open, each with one stream; a
            // browser opens at most 6 HTTP/1.1 connections to one server.
            per_session: Some(32),
            // A quarter of the default --max-connections: the rest stays
            // for agents and API clients.
            total: Some(1024),
        }
    }
}

/// The streams open now, in all and by session.
#[derive(Default)]
pub struct OpenStreams {
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_session: HashMap<Vec<u8>, usize>,
    refused: u64,
}

/// Which cap a stream was refused by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Session(usize),
    Total(usize),
}

impl OpenStreams {
    /// A slot for one more stream of `viewer`, or the cap it would pass.
    fn take(self: &Arc<Self>, limits: StreamLimits, viewer: &Viewer) -> Result<Slot, Refused> {
        let mut c = self
            .counts
            .lock()
            .expect("the counts lock is never poisoned");
        let session = match viewer {
            Viewer::Open => None,
            Viewer::Session(hash) => Some(hash),
        };
        let refused = if let Some(cap) = limits.total.filter(|&cap| c.total >= cap) {
            Some(Refused::Total(cap))
        } else {
            session
                .zip(limits.per_session)
                .filter(|(hash, cap)| c.by_session.get(*hash).copied().unwrap_or(0) >= *cap)
                .map(|(_, cap)| Refused::Session(cap))
        };
        if let Some(r) = refused {
            c.refused += 1;
            return Err(r);
        }
        c.total += 1;
        if let Some(hash) = session {
            *c.by_session.entry(hash.clone()).or_default() += 1;
        }
        Ok(Slot {
            streams: Arc::clone(self),
            session: session.cloned(),
        })
    }

    /// Streams open now, and how many were refused since the start.
    pub fn counts(&self) -> (usize, u64) {
        let c = self
            .counts
            .lock()
            .expect("the counts lock is never poisoned");
        (c.total, c.refused)
    }
}

/// One open stream's place under the caps, given back when dropped.
struct Slot {
    streams: Arc<OpenStreams>,
    session: Option<Vec<u8>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self
            .streams
            .counts
            .lock()
            .expect("the counts lock is never poisoned");
        c.total -= 1;
        if let Some(hash) = self.session.take() {
            if let Some(n) = c.by_session.get_mut(&hash) {
                *n -= 1;
                if *n == 0 {
                    c.by_session.remove(&hash);
                }
            }
        }
    }
}

/// The stream `events` makes for `viewer`, as server-sent events with
/// keep-alives, if `viewer` is under the caps; else a 429 saying which cap
/// and what to do (and `events` is not called).
pub(super) fn answer<S>(
    state: AppState,
    viewer: Viewer,
    events: impl FnOnce(AppState, Viewer) -> S,
) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let taken = state
        .live_pages
        .streams
        .take(state.settings.live_streams, &viewer);
    match taken {
        Ok(slot) => {
            // The slot lives as long as the stream: axum drops the body
            // when the client has gone.
            let held = events(state, viewer).map(move |e| {
                let _ = &slot;
                e
            });
            Sse::new(held)
                .keep_alive(KeepAlive::default())
                .into_response()
        }
        Err(refused) => {
            let message = match refused {
                Refused::Session(cap) => format!(
                    "this session already has {cap} live views open (the server's \
                     --max-streams-per-session); close some dashboard tabs, then reload"
                ),
                Refused::Total(cap) => format!(
                    "the server already has {cap} live views open (its --max-streams); \
                     try again later, or ask the operator to raise it"
                ),
            };
            tracing::info!(%message, "live stream refused");
            (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    (header::RETRY_AFTER, "30"),
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                ],
                message,
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(n: u8) -> Viewer {
        Viewer::Session(vec![n; 32])
    }

    #[test]
    fn a_session_is_held_to_its_cap_and_gets_slots_back_as_streams_end() {
        let open = Arc::new(OpenStreams::default());
        let limits = StreamLimits {
            per_session: Some(2),
            total: Some(10),
        };
        let a1 = open.take(limits, &session(1)).unwrap();
        let _a2 = open.take(limits, &session(1)).unwrap();
        assert_eq!(
            open.take(limits, &session(1)).err(),
            Some(Refused::Session(2))
        );
        // Another session is not held by the first one's streams.
        let _b1 = open.take(limits, &session(2)).unwrap();
        drop(a1);
        let _a3 = open.take(limits, &session(1)).unwrap();
        assert_eq!(open.counts(), (3, 1));
    }

    #[test]
    fn the_total_holds_every_viewer_and_an_open_dashboard_only_by_it() {
        let open = Arc::new(OpenStreams::default());
        let limits = StreamLimits {
            per_session: Some(1),
            total: Some(3),
        };
        let o1 = open.take(limits, &Viewer::Open).unwrap();
        let _o2 = open.take(limits, &Viewer::Open).unwrap();
        let _s = open.take(limits, &session(1)).unwrap();
        assert_eq!(
            open.take(limits, &Viewer::Open).err(),
            Some(Refused::Total(3))
        );
        assert_eq!(
            open.take(limits, &session(2)).err(),
            Some(Refused::Total(3))
        );
        drop(o1);
        assert!(open.take(limits, &session(2)).is_ok());
    }

    #[test]
    fn no_caps_refuse_nothing_and_the_map_keeps_no_closed_session() {
        let open = Arc::new(OpenStreams::default());
        let limits = StreamLimits {
            per_session: None,
            total: None,
        };
        let slots: Vec<_> = (0..100)
            .map(|i| open.take(limits, &session(i)).unwrap())
            .collect();
        assert_eq!(open.counts(), (100, 0));
        drop(slots);
        assert_eq!(open.counts(), (0, 0));
        assert!(open.counts.lock().unwrap().by_session.is_empty());
    }
}
