//! `/ui/alerts`: the active alerts as a page (works without script), and
//! `/ui/alerts.json`, what every page's banner (`web/static/alerts.js`)
//! polls.

use askama::Template;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{allowed, render, to_login};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

struct AlertLine {
    alert: &'static str,
    severity: &'static str,
    subject: String,
    message: String,
    since: String,
}

#[derive(Template)]
#[template(path = "alerts.html")]
struct AlertsPage {
    alerts: Vec<AlertLine>,
    evaluated: String,
    show_logout: bool,
}

pub async fn page(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    if !allowed(&state, &headers).await {
        return Ok(to_login());
    }
    let list = crate::alerts::current(&state).await?;
    let alerts = list
        .alerts
        .iter()
        .map(|a| AlertLine {
            alert: a.alert.as_str(),
            severity: a.severity.as_str(),
            subject: a.subject.clone(),
            message: a.message.clone(),
            since: a.since.map_or(String::new(), super::utc),
        })
        .collect();
    Ok(render(&AlertsPage {
        alerts,
        evaluated: list.evaluated_at.format("%H:%M:%S UTC").to_string(),
        show_logout: !state.settings.dashboard_open,
    })?
    .into_response())
}

/// `GET /ui/alerts.json`: the list as `GET /api/v1/alerts` answers it, for
/// a signed-in page; `401` in the JSON error shape otherwise. Every open
/// page polls it, so the session check is the shared one.
pub async fn json(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    if super::session::polling_viewer(&state, &headers)
        .await
        .is_none()
    {
        return Err(ApiError::Unauthorized(
            "sign in at /ui/login to see alerts".into(),
        ));
    }
    let list = crate::alerts::current(&state).await?;
    Ok(Json(list.as_ref().clone()).into_response())
}
