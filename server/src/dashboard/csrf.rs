//! Form tokens against cross-site request forgery: every dashboard form
//! that changes something carries one in a hidden `csrf` field, and every
//! such POST is refused (`403`) without the viewer's own.
//!
//! A session's token is HMAC-SHA256 keyed by the session id (the cookie's
//! value, which the server sees on every request and stores only hashed),
//! so nothing new is stored, every server of a fleet derives the same one,
//! and it lives exactly as long as its session. Another site can neither
//! read it (the page is same-origin, the cookie HttpOnly) nor compute it
//! (the key is a 256-bit secret); the database alone does not give it
//! either, since it keeps only the id's hash. An open dashboard (no login)
//! has no session: its key is random per server process, so its forms need
//! a reload after a restart. The cookie's `SameSite=Strict` stays: a
//! cross-site POST carries no session at all in browsers that honour it.

use std::sync::OnceLock;

use askama::Template;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::session::{self, Who};
use super::to_login;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The form field that carries the token.
pub const FIELD: &str = "csrf";

/// What the HMAC signs: names its use, so the key signs nothing else alike.
const PURPOSE: &[u8] = b"flotilla dashboard form token v1";

/// The form token of the session whose id is `session_id` (`None`: an open
/// dashboard), as hex.
pub(super) fn token(session_id: Option<&str>) -> String {
    let mac = match session_id {
        Some(id) => hmac_sha256(id.as_bytes(), PURPOSE),
        None => hmac_sha256(open_key(), PURPOSE),
    };
    hex::encode(mac)
}

/// The key of an open dashboard's forms: random, made once per process.
fn open_key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        key
    })
}

/// HMAC-SHA256 (RFC 2104) over the `sha2` the server has already.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new()
        .chain_update(k.map(|b| b ^ 0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(k.map(|b| b ^ 0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Whether the url-encoded form `body` carries `expected` in its `csrf`
/// field, compared in constant time.
fn carried(expected: &str, body: &[u8]) -> bool {
    url::form_urlencoded::parse(body)
        .find(|(k, _)| k == FIELD)
        .is_some_and(|(_, got)| {
            let (a, b) = (got.as_bytes(), expected.as_bytes());
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
        })
}

#[derive(Template)]
#[template(path = "refused.html")]
struct RefusedPage {
    why: String,
    show_logout: bool,
}

/// `403` as a page saying why.
pub(super) fn refused(state: &AppState, why: impl Into<String>) -> Response {
    let page = RefusedPage {
        why: why.into(),
        show_logout: !state.settings.dashboard_open,
    };
    match page.render() {
        Ok(html) => (StatusCode::FORBIDDEN, Html(html)).into_response(),
        Err(e) => ApiError::Internal(anyhow::anyhow!("rendering a page: {e}")).into_response(),
    }
}

/// The viewer of a dashboard POST, if it may post: signed in (else to the
/// login page) and carrying its own form token in `body` (else `403`).
pub(super) async fn check_post(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> ApiResult<Result<Who, Response>> {
    let Some(who) = session::who(state, headers).await? else {
        return Ok(Err(to_login()));
    };
    if !carried(&who.csrf, body) {
        return Ok(Err(refused(
            state,
            "This form did not carry this session's form token (it may be from an older \
             page or another site). Reload the page and try again.",
        )));
    }
    Ok(Ok(who))
}

/// Why a POST that opens or ends a session (login, logout) looks like
/// another site's, if it does: those forms come before any session, so
/// they carry no form token, and a cross-site form could otherwise sign a
/// viewer's browser in as the attacker (whose token then owns what the
/// viewer does) or out. Browsers say where a request comes from: by
/// `Sec-Fetch-Site` (computed by the browser, so a proxy's rewriting of
/// `Host` does not matter), else by `Origin`, compared with the `Host` or
/// `X-Forwarded-Host` the request came to. A request with neither (curl,
/// scripts) is no browser's and passes.
pub(super) fn cross_site(headers: &HeaderMap) -> Option<String> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        return match site {
            "same-origin" | "none" => None,
            other => Some(format!(
                "the browser says this form came from a {other} page"
            )),
        };
    }
    let origin = text("origin")?;
    let host = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'))
        .filter(|h| !h.is_empty() && !h.contains('/'));
    // A proxy's X-Forwarded-Host names the host the browser asked for (the
    // first, where proxies in a row appended theirs).
    let forwarded = text("x-forwarded-host")
        .and_then(|v| v.split(',').next())
        .map(str::trim);
    let served = [forwarded, text("host")];
    match host {
        Some(h) if served.iter().flatten().any(|s| s.eq_ignore_ascii_case(h)) => None,
        _ => Some(format!("it came from {origin}, not from this dashboard")),
    }
}

/// [`cross_site`]'s refusal as a page, if the POST is cross-site.
pub(super) fn refuse_cross_site(state: &AppState, headers: &HeaderMap) -> Option<Response> {
    cross_site(headers).map(|why| {
        refused(
            state,
            format!(
                "Refused: {why}. Sign in or out from this dashboard's own page \
                 (/ui/login)."
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_login_from_another_site_is_told_apart() {
        // Fetch metadata decides where a browser sends it.
        for (site, ok) in [
            ("same-origin", true),
            ("none", true),
            ("same-site", false),
            ("cross-site", false),
        ] {
            let h = headers(&[
                ("sec-fetch-site", site),
                ("origin", "https://flotilla.example"),
                ("host", "flotilla.example"),
            ]);
            assert_eq!(cross_site(&h).is_none(), ok, "{site}");
        }
        // Else the origin against the host it came to (a proxy's too).
        let from = |origin: &'static str, more: &[(&'static str, &str)]| {
            let mut pairs = vec![("origin", origin), ("host", "127.0.0.1:8080")];
            pairs.extend_from_slice(more);
            cross_site(&headers(&pairs))
        };
        assert!(from("http://127.0.0.1:8080", &[]).is_none());
        assert!(from(
            "https://flotilla.example",
            &[("x-forwarded-host", "flotilla.example")]
        )
        .is_none());
        assert!(from(
            "https://flotilla.example",
            &[("x-forwarded-host", "flotilla.example, 10.0.0.5:8080")]
        )
        .is_none());
        let why = from("https://evil.example", &[]).unwrap();
        assert!(why.contains("https://evil.example"), "{why}");
        assert!(from("null", &[]).is_some());
        assert!(from("http://127.0.0.1:8080/../", &[]).is_some());
        // No browser's headers at all: a script, which passes.
        assert!(cross_site(&headers(&[("host", "127.0.0.1:8080")])).is_none());
    }

    /// RFC 4231 test cases 2 (a short key) and 6 (a key longer than a
    /// block, hashed first: session ids are 68 bytes).
    #[test]
    fn hmac_matches_rfc_4231() {
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_form_carries_only_its_own_sessions_token() {
        let mine = token(Some("flt_aaaa"));
        let theirs = token(Some("flt_bbbb"));
        assert_ne!(mine, theirs);
        assert_eq!(
            mine,
            token(Some("flt_aaaa")),
            "the same session, the same token"
        );
        assert_eq!(token(None), token(None), "one per process when open");
        let form = format!("x=1&csrf={mine}");
        assert!(carried(&mine, form.as_bytes()));
        assert!(!carried(&theirs, form.as_bytes()));
        assert!(!carried(&mine, b"x=1"));
        assert!(!carried(&mine, b"csrf="));
        assert!(!carried(&mine, format!("csrf={}", &mine[..63]).as_bytes()));
    }
}
