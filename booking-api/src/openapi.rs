//! The OpenAPI 3 document served at `/api/openapi.json`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes;

#[derive(OpenApi)]
#[openapi(
    info(title = "gpu-booking", description = "Book GPUs of a JupyterHub cluster; rules enforced by Postgres."),
    paths(
        routes::bookings::create, routes::bookings::list, routes::bookings::get, routes::bookings::cancel,
        routes::me::next_start,
        routes::models::list, routes::models::put, routes::models::put_usage, routes::models::availability,
        routes::schedulability::get,
        routes::audit::report, routes::audit::list,
    ),
    modifiers(&BearerAuth)
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
