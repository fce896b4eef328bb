//! The demo's user picker: sign in as any user. Only `gpu-booking demo` merges these
//! routes into its router (a real server has no way to mint tokens for others); the
//! demo signs with its own per-run secret and serves on its local address.
//!
//! - `GET /demo/sign-in`: `{"users": [...]}`, the demo's sample users (the page shows
//!   the picker only where this answers);
//! - `POST /demo/sign-in` `{"user": "...", "admin": false}`: `{"user", "token"}`, a
//!   bearer token for that user (the name normalised as the API does), valid a day;
//!   a name the API would refuse gets 422 and no token.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::TimeDelta;
use gpu_booking_api::auth::{mint_token, Role};
use gpu_booking_core::username::Username;
use serde::Deserialize;
use serde_json::json;

/// What the routes need.
pub struct SignIn {
    secret: Vec<u8>,
    /// Names offered in the picker.
    users: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignInRequest {
    user: String,
    #[serde(default)]
    admin: bool,
}

/// How long a picked user's token lasts (the demo's printed tokens last as long).
const TOKEN_LIFETIME: TimeDelta = TimeDelta::days(1);

/// The routes, for merging into the demo's router.
pub fn routes(secret: Vec<u8>, users: Vec<String>) -> Router {
    Router::new()
        .route("/demo/sign-in", get(offered).post(sign_in))
        .with_state(Arc::new(SignIn { secret, users }))
}

async fn offered(State(s): State<Arc<SignIn>>) -> Json<serde_json::Value> {
    Json(json!({"users": s.users}))
}

fn refuse(status: StatusCode, code: &str, message: String) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

async fn sign_in(
    State(s): State<Arc<SignIn>>,
    body: Result<Json<SignInRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(req)) => req,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, "bad_request", e.body_text()),
    };
    // The API's own parser: the token names the user exactly as the API will.
    let user = match Username::parse(&req.user) {
        Ok(user) => user,
        Err(e) => {
            return refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_user",
                e.to_string(),
            )
        }
    };
    let role = req.admin.then_some(Role::Admin);
    match mint_token(&s.secret, user.as_str(), role, TOKEN_LIFETIME) {
        Ok(token) => {
            Json(json!({"user": user.as_str(), "admin": req.admin, "token": token})).into_response()
        }
        Err(e) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("minting the token failed: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use gpu_booking_api::auth::Authenticator;
    use tower::ServiceExt;

    fn secret() -> Vec<u8> {
        b"0123456789abcdef0123456789abcdef".to_vec()
    }

    async fn post(body: &str) -> (StatusCode, serde_json::Value) {
        let app = routes(secret(), vec!["zoë@uni.example".into()]);
        let resp = app
            .oneshot(
                Request::post("/demo/sign-in")
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_owned()))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    #[tokio::test]
    async fn mints_a_token_the_api_accepts_for_the_picked_user() {
        let (status, body) = post(r#"{"user": "dana@example.com"}"#).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let auth = Authenticator::new(Some(&secret()), None);
        let who = auth
            .verify(body["token"].as_str().unwrap())
            .await
            .expect("the API accepts the picked user's token");
        assert_eq!(who.user.as_str(), "dana@example.com");
        assert!(!who.admin);
    }

    #[tokio::test]
    async fn an_admin_when_asked() {
        let (status, body) = post(r#"{"user": "root@example.com", "admin": true}"#).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let auth = Authenticator::new(Some(&secret()), None);
        let who = auth.verify(body["token"].as_str().unwrap()).await.unwrap();
        assert!(who.admin);
    }

    #[tokio::test]
    async fn bad_names_and_bodies_get_no_token() {
        for (body, status) in [
            (r#"{"user": ""}"#, StatusCode::UNPROCESSABLE_ENTITY),
            (
                r#"{"user": "bad\u0007name"}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (r#"{"user": 42}"#, StatusCode::UNPROCESSABLE_ENTITY),
            (
                r#"{"user": "a", "role": "admin"}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            ("not json", StatusCode::BAD_REQUEST),
        ] {
            let (got, reply) = post(body).await;
            assert!(
                got == status || (got.is_client_error() && status.is_client_error()),
                "{body}: {got} {reply}"
            );
            assert!(
                reply.get("token").is_none(),
                "{body}: a token for bad input"
            );
        }
    }
}
