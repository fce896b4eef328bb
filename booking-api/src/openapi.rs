//! The OpenAPI 3 document served at `/api/openapi.json`.
//!
//! Each handler documents what it decides (its 403s, 404s, 409s, 422s and the
//! limits of its inputs); [`Contract`] adds what every operation answers because of
//! the layers around the handlers, in one place: 401 from the bearer-token
//! extractor, 400 from the query, path and JSON extractors, 422 from any handler's
//! validation of an input, 413 and 415 from the JSON extractor, 429 (with
//! `Retry-After`) from the write limits on every write, 503 (with `Retry-After`)
//! when the database cannot answer. It also
//! names every operation uniquely (utoipa's default, the function name, repeats:
//! `list`, `get`).

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, Ref, RefOr, Response, ResponseBuilder, Schema, SchemaFormat, Type,
};
use utoipa::{Modify, OpenApi};

use crate::routes;

/// The largest request body the service reads: axum's default limit (the router sets
/// none of its own), stated in every 413 answer's description.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

#[derive(OpenApi)]
#[openapi(
    info(title = "gpu-booking", description = "Book GPUs of a JupyterHub cluster; rules enforced by Postgres."),
    paths(
        routes::bookings::create, routes::bookings::list, routes::bookings::get, routes::bookings::cancel,
        routes::me::next_start, routes::notices::get, routes::notices::put,
        routes::availability::get,
        routes::bookings::change, routes::changes::list,
        routes::models::list, routes::models::put, routes::models::put_usage, routes::models::availability,
        routes::schedulability::get,
        routes::admission::get,
        routes::audit::report, routes::audit::report_batch, routes::audit::list,
        routes::units::policy, routes::units::put_held,
        routes::groups::list, routes::groups::create, routes::groups::get, routes::groups::put,
        routes::groups::delete, routes::groups::put_member, routes::groups::delete_member,
        routes::groups::usage, routes::groups::terms, routes::groups::put_terms,
        routes::notebooks::list,
        routes::offers::put, routes::offers::list,
        routes::waitlist::join, routes::waitlist::list, routes::waitlist::cancel,
        routes::feeds::token_status, routes::feeds::issue_token, routes::feeds::revoke_token,
        routes::feeds::own_feed, routes::feeds::model_feed,
        routes::usage::get,
        routes::maintenance::create, routes::maintenance::list, routes::maintenance::remove,
        routes::reservations::create, routes::reservations::list, routes::reservations::get,
        routes::reservations::remove, routes::reservations::cancel_occurrence,
    ),
    modifiers(&BearerAuth, &Contract)
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
    }
}

/// The statuses every operation can answer whatever its handler decides, and
/// unique operation ids.
struct Contract;

impl Modify for Contract {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (method, op) in [
                ("get", &mut item.get),
                ("put", &mut item.put),
                ("post", &mut item.post),
                ("delete", &mut item.delete),
                ("patch", &mut item.patch),
            ] {
                if let Some(op) = op.as_mut() {
                    op.operation_id = Some(operation_id(method, path));
                    add_common_responses(op);
                    if method != "get" {
                        add_write_limit(op);
                    }
                }
            }
        }
    }
}

/// `get` + `/api/v1/models/{name}/availability` -> `get_models_by_name_availability`:
/// unique because (method, path) is.
pub fn operation_id(method: &str, path: &str) -> String {
    let mut id = method.to_owned();
    for segment in path
        .trim_start_matches("/api/v1")
        .split('/')
        .filter(|s| !s.is_empty())
    {
        id.push('_');
        match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(param) => {
                id.push_str("by_");
                id.push_str(param);
            }
            None => id.push_str(&segment.replace('-', "_")),
        }
    }
    id
}

fn add_common_responses(op: &mut Operation) {
    let has_input = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
    let has_body = op.request_body.is_some();
    let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
    let mut add = |status: &str, response: Response| {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert(RefOr::T(response));
    };
    if has_input || has_body {
        add(
            "400",
            error("Malformed query, path or body (not JSON, wrong type, unknown field)."),
        );
    }
    if has_input || has_body {
        add(
            "422",
            error("Well-formed but not acceptable: a value out of range or a refused rule."),
        );
    }
    if secured {
        add(
            "401",
            error("Missing, malformed, expired or otherwise invalid bearer token."),
        );
    }
    if has_body {
        add(
            "413",
            error(&format!(
                "The request body is larger than the service accepts: more than {MAX_BODY_BYTES} bytes (2 MiB)."
            )),
        );
        add(
            "415",
            error("The request body is not `Content-Type: application/json`."),
        );
    }
    add("503", unavailable());
}

/// 429 on a write of a caller without the `service` role (`crate::write_limits`).
fn add_write_limit(op: &mut Operation) {
    if op.security.as_ref().is_none_or(|s| s.is_empty()) {
        return;
    }
    let response = with_retry_after(error(
        "`rate_limited`: too many writes from this user or this address in a short time \
         (`--user-write-burst` and `--user-write-rate`, `--source-write-burst` and \
         `--source-write-rate`); nothing was changed. Callers with the `service` role are \
         not limited.",
    ));
    op.responses
        .responses
        .entry("429".to_owned())
        .or_insert(RefOr::T(response));
}

/// An error answer: the JSON `ErrorBody`.
fn error(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

fn unavailable() -> Response {
    with_retry_after(error(
        "The booking database cannot be reached or is overloaded: try again.",
    ))
}

/// `response` with its `Retry-After` header: whole seconds to wait.
fn with_retry_after(mut response: Response) -> Response {
    let seconds = Schema::Object(
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Int32,
            )))
            .build(),
    );
    response.headers.insert(
        "Retry-After".to_owned(),
        HeaderBuilder::new()
            .schema(seconds)
            .description(Some("Seconds to wait before trying again."))
            .build(),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_unique_and_readable() {
        assert_eq!(
            operation_id("get", "/api/v1/models/{name}/availability"),
            "get_models_by_name_availability"
        );
        assert_eq!(
            operation_id("get", "/api/v1/me/next-start"),
            "get_me_next_start"
        );
        let doc = ApiDoc::openapi();
        let mut ids = std::collections::BTreeSet::new();
        for item in doc.paths.paths.values() {
            for op in [&item.get, &item.put, &item.post, &item.delete]
                .into_iter()
                .flatten()
            {
                let id = op.operation_id.clone().unwrap_or_default();
                assert!(ids.insert(id.clone()), "operation id {id} repeats");
            }
        }
    }
}
