//! ServiceAccount tokens as bearer tokens, verified by TokenReview against the
//! simulated cluster's API server (the fake answers TokenReviews for the tokens it
//! issued, as the kubelet's projected tokens): roles from NAMESPACE/NAME, the audience
//! enforced, answers cached (bounded), a failed review never reads as "authenticated".

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpu_booking_api::auth::{Authenticator, Role};
use gpu_booking_api::clock::SystemClock;
use gpu_booking_api::error::ApiError;
use gpu_booking_api::service_accounts::ServiceAccounts;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_fake_apiserver::{Failure, FakeApiServer, Verb};
use sqlx::PgPool;
use tower::ServiceExt;

const NS: &str = "gpu-booking";
const AUDIENCE: &str = "gpu-booking";

fn authenticator(fake: &FakeApiServer) -> Authenticator {
    let roles = BTreeMap::from([
        (
            (NS.to_owned(), "gpu-booking-webhook".to_owned()),
            Role::Service,
        ),
        ((NS.to_owned(), "lab-admin".to_owned()), Role::Admin),
    ]);
    Authenticator::new(None, None).with_service_accounts(ServiceAccounts::new(
        fake.client(),
        AUDIENCE.into(),
        roles,
    ))
}

#[tokio::test]
async fn a_projected_token_names_its_service_account_and_role() {
    let fake = FakeApiServer::new();
    let auth = authenticator(&fake);
    let webhook = fake.service_account_token(NS, "gpu-booking-webhook", &[AUDIENCE]);
    let caller = auth.verify(&webhook).await.unwrap();
    assert_eq!(
        caller.user.as_str(),
        "system:serviceaccount:gpu-booking:gpu-booking-webhook"
    );
    assert!(caller.service && !caller.admin);
    let admin = fake.service_account_token(NS, "lab-admin", &[AUDIENCE]);
    assert!(auth.verify(&admin).await.unwrap().admin);
    // Authenticated but not listed: a caller without a role.
    let other = fake.service_account_token("jhub", "hub", &[AUDIENCE]);
    let caller = auth.verify(&other).await.unwrap();
    assert!(!caller.service && !caller.admin);
    assert!(caller.require_service().is_err());
}

#[tokio::test]
async fn another_audience_a_forged_token_and_a_failed_review_are_refused() {
    let fake = FakeApiServer::new();
    let auth = authenticator(&fake);
    // A token for the API server itself (the default audience) is not ours.
    let kube_token = fake.service_account_token(
        NS,
        "gpu-booking-webhook",
        &["https://kubernetes.default.svc"],
    );
    assert!(matches!(
        auth.verify(&kube_token).await,
        Err(ApiError::Unauthorized(_))
    ));
    let genuine = fake.service_account_token(NS, "gpu-booking-webhook", &[AUDIENCE]);
    let forged = format!("{}x", genuine);
    assert!(matches!(
        auth.verify(&forged).await,
        Err(ApiError::Unauthorized(_))
    ));
    // The cluster cannot answer: an error, never a caller.
    let fresh = fake.service_account_token(NS, "gpu-booking-webhook", &[AUDIENCE]);
    fake.fail(Failure::on(Verb::Create, "tokenreviews"));
    assert!(matches!(
        auth.verify(&fresh).await,
        Err(ApiError::Internal(_))
    ));
    // ... and is not remembered: the next try asks again.
    assert!(auth.verify(&fresh).await.unwrap().service);
}

#[tokio::test]
async fn answers_are_cached_so_each_token_costs_one_review() {
    let fake = FakeApiServer::new();
    let auth = authenticator(&fake);
    let token = fake.service_account_token(NS, "gpu-booking-webhook", &[AUDIENCE]);
    for _ in 0..20 {
        auth.verify(&token).await.unwrap();
    }
    assert_eq!(fake.count(Verb::Create, "tokenreviews"), 1);
    let bad = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJ4In0.c2ln";
    for _ in 0..5 {
        assert!(auth.verify(bad).await.is_err());
    }
    assert_eq!(
        fake.count(Verb::Create, "tokenreviews"),
        2,
        "refusals are cached too"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn the_api_serves_the_webhooks_call_with_its_service_account_token(pool: PgPool) {
    let fake = FakeApiServer::new();
    let mut state = gpu_booking_api::testing::test_state(
        pool,
        Policy::default(),
        Arc::new(SystemClock),
        b"an-unused-hs256-secret-of-32-bytes!!",
    );
    state.auth = authenticator(&fake);
    let app = gpu_booking_api::app::router(state);
    let call = |token: String| {
        Request::get("/api/v1/schedulability?user=alice")
            .header("Authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    };
    let webhook = fake.service_account_token(NS, "gpu-booking-webhook", &[AUDIENCE]);
    let answer = app.clone().oneshot(call(webhook)).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    // The hub's own token is genuine but has no service role.
    let hub = fake.service_account_token("jhub", "hub", &[AUDIENCE]);
    let answer = app.clone().oneshot(call(hub)).await.unwrap();
    assert_eq!(answer.status(), StatusCode::FORBIDDEN);
    let answer = app.oneshot(call("not-a-token".into())).await.unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
}
