//! `GET /api/v1/openapi.json`: the REST API's OpenAPI 3.1 document, made
//! from the handlers' `#[utoipa::path]` attributes and the JSON types'
//! `ToSchema` (flotilla-core's `openapi` feature), so it changes with them.
//!
//! It is served without a token: it describes the API and holds no data,
//! and a client reads it before it has a token. Every operation in it
//! takes the admin or client token as `Authorization: Bearer …` (the
//! `bearer` scheme); the agent protocol under `/api/agent/v1` and the
//! dashboard under `/ui` are not in it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use flotilla_core::api::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flotilla",
        description = "The flotilla job orchestrator's REST API. Errors are \
                       `{\"error\": {\"code\", \"message\", \"detail\"}}` with a 4xx \
                       (5xx only when the server or its database fails). Lists are \
                       paged by cursor: pass a page's `next` as the cursor parameter \
                       (`before`, or `after` for agents) for the following page."
    ),
    paths(
        super::jobs::submit,
        super::jobs::list,
        super::jobs::show,
        super::logs::text,
        super::jobs::cancel,
        super::jobs::retry,
        super::agents::list,
        super::agents::steer,
        super::agent_health::history,
        super::tokens::create,
        super::tokens::list,
        super::tokens::revoke,
        super::revdeps::submit,
        super::revdeps::list,
        super::revdeps::show,
        super::pipelines::submit,
        super::pipelines::list,
        super::pipelines::show,
        super::pipelines::cancel,
        super::pipelines::cancel_item,
        super::rois::submit,
        super::rois::list,
        super::rois::plan,
        super::rois::show,
        super::tiles::stats,
        super::datasets::add,
        super::datasets::list,
        super::datasets::put_checkpoint,
        super::coverage::import,
        super::alerts::list,
        document,
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "jobs", description = "Jobs: submit, list, follow, cancel, retry"),
        (name = "agents", description = "The fleet, and steering it"),
        (name = "tokens", description = "API and agent tokens (admin only)"),
        (name = "revdeps", description = "opam reverse-dependency runs"),
        (name = "pipelines", description = "Multi-host pipeline runs"),
        (name = "rois", description = "Regions of interest: TESSERA tiles for a year"),
        (name = "datasets", description = "Datasets, checkpoints and coverage"),
        (name = "alerts", description = "What needs an operator now"),
        (name = "meta", description = "This document"),
    )
)]
pub struct ApiDoc;

/// The `bearer` security scheme every operation names.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The error answers any call may get, each the JSON error body: a
/// malformed path segment, query or body (400), no or an unknown token
/// (401), a token whose role may not make the call (403), an id that names
/// nothing (404), a body whose values are wrong (422, `detail.path` names
/// the field), and the database unreachable (503). Calls that can also
/// answer 409 or 413 list those themselves.
pub struct Errors;

impl utoipa::IntoResponses for Errors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        [
            ("400", "Malformed path, query string or body"),
            ("401", "No token, or one the server does not know"),
            ("403", "The token's role may not make this call"),
            ("404", "Nothing by that id or name"),
            ("422", "A value is wrong; `detail.path` names it"),
            ("503", "The database is unavailable; retry shortly"),
        ]
        .into_iter()
        .map(|(status, why)| (status.to_string(), error_response(why)))
        .collect()
    }
}

/// One error answer: `why`, with the JSON error body.
fn error_response(why: &str) -> RefOr<Response> {
    let body = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("ErrorBody")))
        .build();
    ResponseBuilder::new()
        .description(why)
        .content("application/json", body)
        .build()
        .into()
}

/// The document, made once.
pub fn json() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_json()
            .expect("the OpenAPI document serialises")
    })
}

/// This document.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "meta",
    security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document", body = serde_json::Value))
)]
pub async fn document() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], json())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every documented operation names a tag and its errors, and the
    /// components hold every schema an operation refers to.
    #[test]
    fn the_document_is_whole() {
        let doc: serde_json::Value = serde_json::from_str(json()).unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let text = json();
        for (at, _) in text.match_indices("#/components/schemas/") {
            let name: String = text[at + 21..].chars().take_while(|c| *c != '"').collect();
            assert!(schemas.contains_key(&name), "missing schema {name}");
        }
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths.len() >= 20, "{} paths", paths.len());
        for (path, ops) in paths {
            for (method, op) in ops.as_object().unwrap() {
                assert!(op["tags"].is_array(), "{method} {path} has no tag");
                if path != "/api/v1/openapi.json" {
                    assert!(op["responses"]["401"].is_object(), "{method} {path}");
                }
            }
        }
    }
}
