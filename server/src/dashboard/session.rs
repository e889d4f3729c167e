//! Dashboard sessions: the login page, the session cookie (an admin or
//! client API token, HttpOnly), logout.

use askama::Template;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use flotilla_core::api::TokenRole;
use serde::Deserialize;

use super::render;
use crate::error::ApiResult;
use crate::state::AppState;

const COOKIE: &str = "flotilla_session";

/// Whether the request carries the cookie of a valid admin or client token.
pub(super) async fn signed_in(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(token) = cookie(headers, COOKIE) else {
        return false;
    };
    matches!(
        crate::auth::lookup(state, &token).await,
        Ok(c) if matches!(c.role, TokenRole::Admin | TokenRole::Client)
    )
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
    Form(form): Form<LoginForm>,
) -> ApiResult<Response> {
    let token = form.token.trim();
    let ok = !token.is_empty()
        && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && matches!(
            crate::auth::lookup(&state, token).await,
            Ok(c) if matches!(c.role, TokenRole::Admin | TokenRole::Client)
        );
    if !ok {
        let page = render(&LoginPage {
            error: Some("That token is not a valid admin or client token.".into()),
            show_logout: false,
        })?;
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    }
    let cookie = format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=2592000");
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui")).into_response())
}

pub async fn logout() -> Response {
    let cookie = format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response()
}
