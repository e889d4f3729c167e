//! `/ui/jobs`: the jobs a viewer may see, filtered by state, kind, agent,
//! submitter and text, newest first, a page at a time by cursor.

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use flotilla_core::api::JobView;
use flotilla_core::job::{JobKind, JobState};

use super::{render, session, to_login};
use crate::api::jobs::ListQuery;
use crate::error::{ApiError, ApiResult};
use crate::extract::QueryParams;
use crate::state::AppState;

/// Jobs on one page.
const PAGE: i64 = 50;

struct Row {
    id: String,
    tail: String,
    state: &'static str,
    kind: &'static str,
    what: String,
    agent: String,
    submitter: String,
    created: String,
    attempt: String,
}

/// An option of a select: its value, and whether it is the one chosen.
struct Choice {
    value: &'static str,
    chosen: bool,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    states: Vec<Choice>,
    kinds: Vec<Choice>,
    agents: Vec<String>,
    agent: String,
    submitter: String,
    q: String,
    rows: Vec<Row>,
    /// The next (older) page's address, with the same filters.
    older: Option<String>,
    /// Whether this is a later page (so a link back to the newest).
    paged: bool,
    /// The newest page with the same filters.
    newest: String,
    error: Option<String>,
    show_logout: bool,
}

fn row(j: JobView) -> Row {
    Row {
        tail: super::short_id(j.id),
        id: j.id.to_string(),
        state: j.state.as_str(),
        kind: j.kind.as_str(),
        what: j.summary(100),
        agent: j.agent.unwrap_or_default(),
        submitter: j.submitter,
        created: super::utc(j.created_at),
        attempt: format!("{}/{}", j.attempt, j.max_attempts),
    }
}

/// `/ui/jobs?…` with `q`'s filters and page size, and `before` (none:
/// the newest page).
fn address(q: &ListQuery, before: Option<&str>) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in [
        ("state", &q.state),
        ("kind", &q.kind),
        ("agent", &q.agent),
        ("submitter", &q.submitter),
        ("q", &q.q),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.trim().is_empty()) {
            s.append_pair(name, v);
        }
    }
    if let Some(n) = q.limit {
        s.append_pair("limit", &n.to_string());
    }
    if let Some(b) = before {
        s.append_pair("before", b);
    }
    let query = s.finish();
    if query.is_empty() {
        "/ui/jobs".into()
    } else {
        format!("/ui/jobs?{query}")
    }
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Response> {
    let Some(who) = session::who(&state, &headers).await? else {
        return Ok(to_login());
    };
    // A filter that does not parse, or a search that took too long, is
    // said on the page, above the form to correct it.
    let listed = match q.parse(&state, who.own_only(), PAGE).await {
        Ok(req) => req.run(&state).await,
        Err(e) => Err(e),
    };
    let (page, error) = match listed {
        Ok(page) => (Some(page), None),
        Err(ApiError::BadRequest(m)) | Err(ApiError::Invalid { message: m, .. }) => (None, Some(m)),
        Err(e) => return Err(e),
    };
    let chosen = |v: &Option<String>, value: &str| v.as_deref().map(str::trim) == Some(value);
    let agents = crate::agents::list(&state.db, state.settings.heartbeat_interval)
        .await?
        .into_iter()
        .map(|a| a.name)
        .collect();
    let (rows, next) = match page {
        Some(p) => (p.jobs.into_iter().map(row).collect(), p.next),
        None => (Vec::new(), None),
    };
    let html = render(&JobsPage {
        states: JobState::ALL
            .iter()
            .map(|s| Choice {
                value: s.as_str(),
                chosen: chosen(&q.state, s.as_str()),
            })
            .collect(),
        kinds: JobKind::ALL
            .iter()
            .map(|k| Choice {
                value: k.as_str(),
                chosen: chosen(&q.kind, k.as_str()),
            })
            .collect(),
        agents,
        agent: q.agent.clone().unwrap_or_default(),
        submitter: q.submitter.clone().unwrap_or_default(),
        q: q.q.clone().unwrap_or_default(),
        rows,
        older: next.map(|n| address(&q, Some(&n.to_string()))),
        paged: q.before.as_deref().is_some_and(|b| !b.trim().is_empty()),
        newest: address(&q, None),
        show_logout: !state.settings.dashboard_open,
        error: error.clone(),
    })?;
    let status = if error.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    Ok((status, html).into_response())
}
