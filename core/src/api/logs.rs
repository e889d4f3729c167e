//! `GET /api/v1/jobs/{id}/log`: a job's log as text, one stored line per
//! line, `--- attempt N ---` where the attempt changes, the server's own
//! lines marked `[agent]`, and a `[flotilla] … cut here` line where an
//! attempt's log went over its cap (its head and tail are kept).
//!
//! Without a query the whole log is streamed. With `?after=SEQ&limit=N` the
//! answer is one page: at most N lines after line SEQ, with the sequence
//! number of its last line in [`LOG_NEXT_HEADER`] (pass it as `after` for
//! the next page) and [`LOG_MORE_HEADER`] `true` when the page is full (more
//! lines may follow at once). A follower polls with the last `after` and
//! gets only what is new.

use serde::{Deserialize, Serialize};

/// The sequence number of the last line of a page (or the `after` given,
/// when the page is empty).
pub const LOG_NEXT_HEADER: &str = "flotilla-log-next";
/// `true` when the page holds `limit` lines.
pub const LOG_MORE_HEADER: &str = "flotilla-log-more";
/// The most lines one page holds, and a page's size when `limit` is not
/// given.
pub const MAX_LOG_PAGE_LINES: i64 = 10_000;

/// The query of a page.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct LogQuery {
    /// Lines after this sequence number (0: from the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<i64>,
    /// At most this many lines (1 to [`MAX_LOG_PAGE_LINES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

impl LogQuery {
    /// Whether the query asks for a page (else: the whole log).
    pub fn is_page(&self) -> bool {
        self.after.is_some() || self.limit.is_some()
    }

    /// The page's `limit`, clamped to what a page may hold.
    pub fn page_limit(&self) -> i64 {
        self.limit
            .unwrap_or(MAX_LOG_PAGE_LINES)
            .clamp(1, MAX_LOG_PAGE_LINES)
    }
}
