//! The controller against the real booking API on the real Postgres (and the fake
//! API server), in real time: usage reports, a preemption for a Pending booked pod,
//! an expiry, and their audit rows.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use common::*;
use gpu_booking_api::testing::TestApi;
use gpu_booking_client::{BookingClient, TokenSource};
use gpu_booking_controller::{Controller, ControllerArgs, SystemClock};
use gpu_booking_fake_apiserver::{FakeApiServer, PodDeletion};
use serde_json::json;

async fn call(method: reqwest::Method, url: String, token: &str, body: serde_json::Value) {
    let response = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{}",
        response.text().await.unwrap()
    );
}

/// Polls (real time, 50 ms apart, at most 20 s) until `check` gives a value.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    mut check: impl FnMut() -> F,
) -> T {
    for _ in 0..400 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 20 s");
}

#[sqlx::test(migrations = "../migrations")]
async fn usage_preemption_and_expiry_reach_the_booking_service(pool: sqlx::PgPool) {
    let api = TestApi::start(pool.clone()).await.unwrap();
    let admin = api.token("admin@example.com", Some("admin"));
    let service = api.token("gpu-booking-controller", Some("service"));
    for (model, pattern) in [("a100", "*A100*"), ("a6000", "*A6000*")] {
        let url = format!("{}/api/v1/models/{model}", api.url);
        call(
            reqwest::Method::PUT,
            url,
            &admin,
            json!({"units": 0, "patterns": [pattern]}),
        )
        .await;
    }
    // a100 full: a booked pod and a lent one. a6000: a booking that has ended.
    let server = FakeApiServer::new();
    server.set_pod_deletion(PodDeletion::Immediate);
    node(
        &server,
        "a100-node",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 2)],
    );
    node(
        &server,
        "a6000-node",
        Some("NVIDIA-RTX-A6000"),
        &[("nvidia.com/gpu", 4)],
    );
    let now = Utc::now();
    pod("booked")
        .gpu(1)
        .on("a100-node")
        .booked_until(now + TimeDelta::days(1))
        .put(&server);
    pod("lent")
        .gpu(1)
        .on("a100-node")
        .low_priority("a100")
        .put(&server);
    let mut ended = pod("ended")
        .gpu(1)
        .on("a6000-node")
        .booked_until(now - TimeDelta::minutes(1));
    ended.0["metadata"]["labels"]["gpu-booking.io/model"] = json!("a6000");
    ended.put(&server);
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&server);

    let booking = BookingClient::new(
        &api.url,
        TokenSource::Static(service.clone()),
        Duration::from_secs(5),
        "test",
    )
    .unwrap();
    let mut args = ControllerArgs::with_defaults(&api.url);
    args.identity = Some("controller-0".into());
    args.preemption_interval = Duration::from_millis(200);
    args.preemption_grace = Duration::ZERO;
    let _controller = Controller::start(
        server.client(),
        Arc::new(booking),
        Arc::new(SystemClock),
        &args,
    )
    .unwrap();

    let mut actions: Vec<(String, String)> = eventually(|| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT action, subject FROM audit_event WHERE action LIKE 'controller.%' ORDER BY id",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            (rows.len() >= 2).then_some(rows)
        }
    })
    .await;
    actions.sort();
    assert_eq!(
        actions,
        [
            ("controller.expire".to_owned(), "jhub/ended".to_owned()),
            ("controller.preempt".to_owned(), "jhub/lent".to_owned())
        ]
    );
    let details: serde_json::Value =
        sqlx::query_scalar("SELECT details FROM audit_event WHERE action = 'controller.preempt'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(details["for"], "jhub/jupyter-bob");
    assert_eq!(details["model"], "a100");
    // Cards from the nodes, beside the declared units (0 here, and they stay 0: a
    // report never overwrites them); in use settles at what is left on the GPUs (the
    // booked pod).
    type Row = (String, i32, Option<i32>, i32);
    let usage: Vec<Row> = eventually(|| {
        let pool = pool.clone();
        async move {
            let rows: Vec<Row> =
                sqlx::query_as("SELECT name, units, cards, in_use FROM gpu_model ORDER BY name")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            let want = [
                ("a100".to_owned(), 0, Some(2), 1),
                ("a6000".to_owned(), 0, Some(4), 0),
            ];
            (rows == want).then_some(rows)
        }
    })
    .await;
    assert_eq!(usage.len(), 2);
}
