//! Caps on the dashboard's live streams open at once: per login token, and in all.
//!
//! A stream holds a connection and a task for as long as its tab is open,
//! and one following a job, an ROI or a run nobody else follows makes its
//! own queries every tick. Without a cap one login (a script with a stolen
//! cookie, a page reloaded in a loop, any number of sessions opened with
//! one token) could take the connections the agents need
//! (`--max-connections` counts both) and set the database polling on its
//! behalf. So a token's sessions together hold at most
//! [`StreamLimits::per_token`] streams, and the server at most
//! [`StreamLimits::total`] (by default a quarter of its connections). Past
//! a cap the stream is refused with 429, `Retry-After` and a message saying
//! which cap and what to do; the page keeps what it showed and says its
//! live updates stopped. A slot is given back when its stream is dropped
//! (the tab closed: noticed at the next write, within the keep-alive's
//! 15 s). Per server process, as the connections are.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use uuid::Uuid;

use super::session::{Viewer, Who};
use crate::error::ApiError;
use crate::state::AppState;

/// The caps; `None`: no cap.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Streams open at once for one login token, all its sessions and
    /// tabs together. An open dashboard (`--no-dashboard-login`) has no
    /// tokens and is held by [`StreamLimits::total`] alone.
    pub per_token: Option<usize>,
    /// Streams open at once in this server.
    pub total: Option<usize>,
}

impl StreamLimits {
    /// The default total for a server holding at most `connections`
    /// connections: a quarter of them, so the rest stay for agents and API
    /// clients.
    pub fn total_for(connections: usize) -> usize {
        (connections / 4).max(1)
    }
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            // A person has a few tabs open, each with one stream; a
            // browser opens at most 6 HTTP/1.1 connections to one server.
            per_token: Some(32),
            total: Some(Self::total_for(
                crate::state::HttpLimits::default().max_connections,
            )),
        }
    }
}

/// The streams open now, in all and by token.
#[derive(Default)]
pub struct OpenStreams {
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_token: HashMap<Uuid, usize>,
    refused: u64,
}

/// Which cap a stream was refused by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Token(usize),
    Total(usize),
}

impl OpenStreams {
    /// A slot for one more stream of `token` (`None`: an open
    /// dashboard's viewer), or the cap it would pass.
    fn take(self: &Arc<Self>, limits: StreamLimits, token: Option<Uuid>) -> Result<Slot, Refused> {
        let mut c = self
            .counts
            .lock()
            .expect("the counts lock is never poisoned");
        let refused = if let Some(cap) = limits.total.filter(|&cap| c.total >= cap) {
            Some(Refused::Total(cap))
        } else {
            token
                .zip(limits.per_token)
                .filter(|(t, cap)| c.by_token.get(t).copied().unwrap_or(0) >= *cap)
                .map(|(_, cap)| Refused::Token(cap))
        };
        if let Some(r) = refused {
            c.refused += 1;
            return Err(r);
        }
        c.total += 1;
        if let Some(t) = token {
            *c.by_token.entry(t).or_default() += 1;
        }
        Ok(Slot {
            streams: Arc::clone(self),
            token,
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
    token: Option<Uuid>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self
            .streams
            .counts
            .lock()
            .expect("the counts lock is never poisoned");
        c.total -= 1;
        if let Some(t) = self.token {
            if let Some(n) = c.by_token.get_mut(&t) {
                *n -= 1;
                if *n == 0 {
                    c.by_token.remove(&t);
                }
            }
        }
    }
}

/// The stream `events` makes for `who`, as server-sent events with
/// keep-alives, if `who` is under the caps; else a 429 saying which cap
/// and what to do (and `events` is not called).
pub(super) fn answer<S>(
    state: AppState,
    who: Who,
    events: impl FnOnce(AppState, Viewer) -> S,
) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let token = who.caller.as_ref().map(|c| c.token_id);
    let taken = state
        .live_pages
        .streams
        .take(state.settings.live_streams, token);
    match taken {
        Ok(slot) => {
            // The slot lives as long as the stream: axum drops the body
            // when the client has gone.
            let held = events(state, who.viewer).map(move |e| {
                let _ = &slot;
                e
            });
            Sse::new(held)
                .keep_alive(KeepAlive::default())
                .into_response()
        }
        Err(refused) => {
            let message = match refused {
                Refused::Token(cap) => format!(
                    "this login already has {cap} live views open, in all its tabs and \
                     sessions (the limit is the server setting --max-streams-per-token); \
                     close some dashboard tabs, then reload"
                ),
                Refused::Total(cap) => format!(
                    "the server already has {cap} live views open (the limit is its \
                     setting --max-streams); try again later, or ask the operator to raise it"
                ),
            };
            tracing::info!(%message, "live stream refused");
            ApiError::TooManyStreams(message).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: u8) -> Option<Uuid> {
        Some(Uuid::from_bytes([n; 16]))
    }

    #[test]
    fn a_token_is_held_to_its_cap_and_gets_slots_back_as_streams_end() {
        let open = Arc::new(OpenStreams::default());
        let limits = StreamLimits {
            per_token: Some(2),
            total: Some(10),
        };
        let a1 = open.take(limits, token(1)).unwrap();
        let _a2 = open.take(limits, token(1)).unwrap();
        assert_eq!(open.take(limits, token(1)).err(), Some(Refused::Token(2)));
        // Another token is not held by the first one's streams.
        let _b1 = open.take(limits, token(2)).unwrap();
        drop(a1);
        let _a3 = open.take(limits, token(1)).unwrap();
        assert_eq!(open.counts(), (3, 1));
    }

    #[test]
    fn the_total_holds_every_viewer_and_an_open_dashboard_only_by_it() {
        let open = Arc::new(OpenStreams::default());
        let limits = StreamLimits {
            per_token: Some(1),
            total: Some(3),
        };
        let o1 = open.take(limits, None).unwrap();
        let _o2 = open.take(limits, None).unwrap();
        let _s = open.take(limits, token(1)).unwrap();
        assert_eq!(open.take(limits, None).err(), Some(Refused::Total(3)));
        assert_eq!(open.take(limits, token(2)).err(), Some(Refused::Total(3)));
        drop(o1);
        assert!(open.take(limits, token(2)).is_ok());
    }

    #[test]
    fn no_caps_refuse_nothing_and_the_map_keeps_no_closed_token() {
        let open = Arc::new(OpenStreams::default());
        let limits = StreamLimits {
            per_token: None,
            total: None,
        };
        let slots: Vec<_> = (0..100)
            .map(|i| open.take(limits, token(i)).unwrap())
            .collect();
        assert_eq!(open.counts(), (100, 0));
        drop(slots);
        assert_eq!(open.counts(), (0, 0));
        assert!(open.counts.lock().unwrap().by_token.is_empty());
    }

    #[test]
    fn the_default_total_is_a_quarter_of_the_connections() {
        assert_eq!(StreamLimits::total_for(4096), 1024);
        assert_eq!(StreamLimits::total_for(100), 25);
        assert_eq!(StreamLimits::total_for(2), 1);
    }
}
