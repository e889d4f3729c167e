//! Dashboard sessions: the login page, the session cookie, logout. The
//! cookie holds a random session id (HttpOnly, SameSite=Strict, Secure over
//! HTTPS), never the API token; the `dashboard_sessions` table keeps its
//! hash, the token it was opened with, and its expiry. A session ends at
//! logout, at expiry, or when its token is revoked, and live streams check
//! it every [`RECHECK`], so they end within that.

use std::time::Duration;

use askama::Template;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use flotilla_core::api::TokenRole;
use serde::Deserialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::render;
use crate::auth::{hash_token, new_secret, Caller};
use crate::error::ApiResult;
use crate::state::AppState;
use crate::transport::Transport;

const COOKIE: &str = "flotilla_session";
/// How long a session lasts: a working day.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How often a live stream checks that its session is still valid.
pub(super) const RECHECK: Duration = Duration::from_secs(5);

/// Who is looking at the dashboard.
#[derive(Debug, Clone)]
pub(super) enum Viewer {
    /// The operator turned the login off (a local run).
    Open,
    /// A signed-in session, by the hash of its id.
    Session(Vec<u8>),
}

impl Viewer {
    /// Whether the viewer may still look: an open dashboard always; a
    /// session until logout, expiry or the revocation of its token. A
    /// database error counts as no (a stream ends; the page can reload).
    /// The tabs of one session share one check per [`RECHECK`].
    pub(super) async fn still_allowed(&self, state: &AppState) -> bool {
        match self {
            Viewer::Open => true,
            Viewer::Session(hash) => state
                .live_pages
                .sessions
                .get(hash.clone(), || live(&state.db, hash))
                .await
                .unwrap_or(false),
        }
    }
}

/// The viewer of a request, if it may look.
pub(super) async fn viewer(state: &AppState, headers: &HeaderMap) -> Option<Viewer> {
    if state.settings.dashboard_open {
        return Some(Viewer::Open);
    }
    let id = cookie(headers, COOKIE)?;
    let hash = hash_token(&id);
    live(&state.db, &hash)
        .await
        .unwrap_or(false)
        .then_some(Viewer::Session(hash))
}

/// The viewer of a request that every open page repeats (the alert
/// banner's poll): a session already known valid is checked through the
/// check the live streams share, once per [`RECHECK`] however many tabs
/// poll, so 200 open tabs cost the database what one does; a logout or a
/// revocation reaches it within that, as it reaches the streams. A cookie
/// not known is looked up as [`viewer`] does, and only a valid one is
/// remembered (made-up cookies cannot grow the shared map).
pub(super) async fn polling_viewer(state: &AppState, headers: &HeaderMap) -> Option<Viewer> {
    if state.settings.dashboard_open {
        return Some(Viewer::Open);
    }
    let hash = hash_token(&cookie(headers, COOKIE)?);
    let sessions = &state.live_pages.sessions;
    if sessions.fresh(&hash) == Some(true) {
        return Some(Viewer::Session(hash));
    }
    let viewer = if sessions.known(&hash) {
        Viewer::Session(hash)
    } else {
        viewer(state, headers).await?
    };
    viewer.still_allowed(state).await.then_some(viewer)
}

/// Who is looking, as the forms and the ownership checks need it.
pub(super) struct Who {
    pub viewer: Viewer,
    /// The session's token; `None` on an open dashboard, which acts as an
    /// admin.
    pub caller: Option<Caller>,
    /// What this viewer's forms carry ([`super::csrf`]).
    pub csrf: String,
}

impl Who {
    pub fn is_admin(&self) -> bool {
        self.caller
            .as_ref()
            .is_none_or(|c| c.role == TokenRole::Admin)
    }

    /// The owner a client's lists are limited to (`None`: all jobs).
    pub fn own_only(&self) -> Option<Uuid> {
        match &self.caller {
            Some(c) if c.role != TokenRole::Admin => Some(c.token_id),
            _ => None,
        }
    }

    /// Who what this viewer submits belongs to, and how it is counted:
    /// (owner token, submitter, waiting cap). An open dashboard has no
    /// token: its submissions belong to admins.
    pub fn submitting<'s>(
        &self,
        state: &'s AppState,
    ) -> (
        Option<Uuid>,
        String,
        Option<crate::queue::submit::WaitingCap<'s>>,
    ) {
        match &self.caller {
            Some(c) => (Some(c.token_id), c.submitter(), state.waiting_cap(c.role)),
            None => (None, "dashboard".to_string(), None),
        }
    }

    /// Whether this viewer may see and act on a job of `owner`: as the
    /// API has it, an admin all jobs, a client its own.
    pub fn may_see(&self, owner: Option<Uuid>) -> bool {
        self.is_admin() || owner.is_some_and(|o| Some(o) == self.own_only())
    }
}

/// Who is looking, if anyone may: the session's token and role, looked up
/// as [`viewer`] checks it.
pub(super) async fn who(state: &AppState, headers: &HeaderMap) -> ApiResult<Option<Who>> {
    if state.settings.dashboard_open {
        return Ok(Some(Who {
            viewer: Viewer::Open,
            caller: None,
            csrf: super::csrf::token(None),
        }));
    }
    let Some(id) = cookie(headers, COOKIE) else {
        return Ok(None);
    };
    let hash = hash_token(&id);
    let row: Option<(Uuid, String, Option<String>)> = sqlx::query_as(
        "SELECT t.id, t.role, t.description
         FROM dashboard_sessions s JOIN api_tokens t ON t.id = s.token_id
         WHERE s.id_hash = $1 AND s.ended_at IS NULL AND s.expires_at > now()
           AND t.revoked_at IS NULL AND t.role IN ('admin', 'client')",
    )
    .bind(&hash)
    .fetch_optional(&state.db)
    .await?;
    Ok(row.and_then(|(token_id, role, description)| {
        Some(Who {
            viewer: Viewer::Session(hash),
            caller: Some(Caller {
                token_id,
                role: TokenRole::parse(&role)?,
                agent_name: None,
                description,
            }),
            csrf: super::csrf::token(Some(&id)),
        })
    }))
}

/// Whether session `hash` is open, unexpired, and its token unrevoked.
async fn live(db: &PgPool, hash: &[u8]) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM dashboard_sessions s JOIN api_tokens t ON t.id = s.token_id
                        WHERE s.id_hash = $1 AND s.ended_at IS NULL AND s.expires_at > now()
                          AND t.revoked_at IS NULL AND t.role IN ('admin', 'client'))",
    )
    .bind(hash)
    .fetch_one(db)
    .await
}

/// Opens a session for `token_id`; returns its id (the cookie's value).
/// Sessions that ended or expired a day ago are deleted on the way.
async fn open(db: &PgPool, token_id: Uuid) -> Result<String, sqlx::Error> {
    sqlx::query(
        "DELETE FROM dashboard_sessions
         WHERE COALESCE(ended_at, expires_at) < now() - interval '1 day'",
    )
    .execute(db)
    .await?;
    let id = new_secret();
    sqlx::query(
        "INSERT INTO dashboard_sessions (id_hash, token_id, expires_at)
         VALUES ($1, $2, now() + $3 * interval '1 second')",
    )
    .bind(hash_token(&id))
    .bind(token_id)
    .bind(SESSION_TTL.as_secs() as i64)
    .execute(db)
    .await?;
    Ok(id)
}

/// Whether the request carries a session cookie at all (not whether the
/// session is valid: that takes the database). Enough to offer "Log out",
/// which only ends a session where there is one.
pub fn carries_session(headers: &HeaderMap) -> bool {
    cookie(headers, COOKIE).is_some_and(|v| !v.is_empty())
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// Whether the browser reached us over HTTPS: always when we serve TLS
/// ourselves; behind a TLS proxy (`--behind-tls-proxy`) when it says so
/// (`X-Forwarded-Proto`); never on plain HTTP, where anyone may send that
/// header.
fn over_https(state: &AppState, headers: &HeaderMap) -> bool {
    match state.settings.transport {
        Transport::Tls => true,
        Transport::Proxy => headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https")),
        Transport::Plain => false,
    }
}

/// The session cookie with `value` and `max_age` seconds.
fn session_cookie(value: &str, max_age: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    error: Option<String>,
    show_logout: bool,
}

pub async fn login_page() -> ApiResult<Html<String>> {
    render(&LoginPage {
        error: None,
        show_logout: false,
    })
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

pub async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> ApiResult<Response> {
    if let Some(refusal) = super::csrf::refuse_cross_site(&state, &headers) {
        return Ok(refusal);
    }
    let token = form.token.trim();
    let caller =
        if !token.is_empty() && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            crate::auth::lookup(&state, token)
                .await
                .ok()
                .filter(|c| matches!(c.role, TokenRole::Admin | TokenRole::Client))
        } else {
            None
        };
    let Some(caller) = caller else {
        let page = render(&LoginPage {
            error: Some("That token is not a valid admin or client token.".into()),
            show_logout: false,
        })?;
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };
    let id = open(&state.db, caller.token_id).await?;
    let cookie = session_cookie(&id, SESSION_TTL.as_secs(), over_https(&state, &headers));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui")).into_response())
}

/// Ends the session (live streams on it stop within [`RECHECK`]) and
/// clears the cookie.
pub async fn logout(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    if let Some(refusal) = super::csrf::refuse_cross_site(&state, &headers) {
        return Ok(refusal);
    }
    if let Some(id) = cookie(&headers, COOKIE) {
        sqlx::query(
            "UPDATE dashboard_sessions SET ended_at = now()
             WHERE id_hash = $1 AND ended_at IS NULL",
        )
        .bind(hash_token(&id))
        .execute(&state.db)
        .await?;
    }
    let cookie = session_cookie("", 0, over_https(&state, &headers));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response())
}
