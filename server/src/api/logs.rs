//! `/api/v1/jobs/{id}/log`: a job's log, streamed whole or read in pages
//! ([`flotilla_core::api::logs`]). Memory per request is one page, whatever
//! the log's size.

use axum::body::Body;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use flotilla_core::api::logs::{LogQuery, LOG_MORE_HEADER, LOG_NEXT_HEADER};
use uuid::Uuid;

use crate::auth::ClientAuth;
use crate::error::ApiResult;
use crate::extract::{parse_id, PathParams, QueryParams};
use crate::queue::logs;
use crate::state::AppState;

/// Lines read per query while streaming a whole log.
const STREAM_CHUNK_LINES: i64 = 5_000;

const TEXT: &str = "text/plain; charset=utf-8";

/// The job's log as text: whole (streamed) without a query, else one page
/// (`after`, `limit`) with the page's last line number in the
/// `flotilla-log-next` header and `flotilla-log-more` true when it is full.
#[utoipa::path(
    get,
    path = "/api/v1/jobs/{id}/log",
    tag = "jobs",
    params(("id" = Uuid, Path, description = "The job's id"), LogQuery),
    responses(
        (status = 200, description = "The log, or a page of it", body = String, content_type = "text/plain",
         headers(
             ("flotilla-log-next" = i64, description = "A page's last line (pass as `after`)"),
             ("flotilla-log-more" = bool, description = "The page is full: more may follow"),
         )),
        super::openapi::Errors
    )
)]
pub async fn text(
    State(state): State<AppState>,
    ClientAuth(caller): ClientAuth,
    PathParams(id): PathParams<String>,
    QueryParams(q): QueryParams<LogQuery>,
) -> ApiResult<Response> {
    let id = parse_id(&id, "a job")?;
    super::jobs::check_owner(&state, &caller, id).await?;
    if !q.is_page() {
        return Ok(([(CONTENT_TYPE, TEXT)], Body::from_stream(whole(state, id))).into_response());
    }
    let after = q.after.unwrap_or(0).max(0);
    let limit = q.page_limit();
    let rows = logs::page(&state.db, id, after, limit).await?;
    let prev = if after > 0 {
        logs::attempt_before(&state.db, id, after).await?
    } else {
        None
    };
    let mut text = String::new();
    logs::render(&rows, prev, &mut text);
    let next = rows.last().map_or(after, |r| r.seq);
    let more = rows.len() as i64 == limit;
    Ok((
        [
            (CONTENT_TYPE, TEXT.to_string()),
            (
                LOG_NEXT_HEADER.parse().expect("a valid header name"),
                next.to_string(),
            ),
            (
                LOG_MORE_HEADER.parse().expect("a valid header name"),
                more.to_string(),
            ),
        ],
        text,
    )
        .into_response())
}

/// The whole log, read and sent a chunk at a time. A database error midway
/// ends the body early (the client sees a cut-off transfer, not a silently
/// short log: the chunked encoding is not terminated).
fn whole(state: AppState, id: Uuid) -> impl futures::Stream<Item = Result<String, std::io::Error>> {
    futures::stream::try_unfold(
        (state, 0i64, None::<i32>, false),
        move |(state, after, prev, done)| async move {
            if done {
                return Ok(None);
            }
            let rows = logs::page(&state.db, id, after, STREAM_CHUNK_LINES)
                .await
                .map_err(std::io::Error::other)?;
            let Some(last) = rows.last().map(|r| r.seq) else {
                return Ok(None);
            };
            let full = rows.len() as i64 == STREAM_CHUNK_LINES;
            let mut text = String::new();
            let prev = logs::render(&rows, prev, &mut text);
            Ok(Some((text, (state, last, prev, !full))))
        },
    )
}
