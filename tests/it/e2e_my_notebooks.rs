//! End to end, on the simulated lab: "My notebooks". The controller reports each
//! user's notebooks with the units held, and each user reads theirs from the booking
//! API: a booked one (until the booking's end), a lent one, one stripped at spawn (in
//! the webhook's words), and a booked one re-created on CPU when its booking ends
//! early.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use chrono::{DateTime, Utc};
use common::*;
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::{GpuNode, SimCluster};
use serde_json::Value;
use sqlx::PgPool;

/// `GET /api/v1/notebooks` as `user` (the status and the answer).
async fn notebooks(lab: &Lab, user: &str, query: &str) -> (u16, Value) {
    let token = lab.api.token(user, None).unwrap();
    let res = reqwest::Client::new()
        .get(format!("{}/api/v1/notebooks{query}", lab.api.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("the booking API answers");
    let status = res.status().as_u16();
    (status, res.json().await.expect("an answer as JSON"))
}

/// Waits until `user`'s only notebook, as the API shows it, satisfies `ok`; returns it.
async fn wait_for_notebook(
    lab: &Lab,
    user: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    // The controller reports on its sync tick; the service has no feed to wait on.
    eventually(|| async {
        let (status, answer) = notebooks(lab, user, "").await;
        assert_eq!(status, 200, "{answer}");
        let list = answer["notebooks"].as_array().cloned().unwrap_or_default();
        if let [only] = list.as_slice() {
            if ok(only) {
                return Ok(only.clone());
            }
        }
        Err(format!(
            "the API never showed {user}'s notebook {what}: {answer}\ncluster:\n{}",
            serde_json::to_string_pretty(&lab.sim.view()).unwrap_or_default()
        ))
    })
    .await
}

#[sqlx::test(migrations = "./migrations")]
async fn the_api_shows_each_users_booked_lent_and_stripped_notebooks(pool: PgPool) {
    // Two A100s and a CPU node: alice's booking holds one, bob is lent the other,
    // dave finds none free.
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 2, 40960),
            GpuNode::cpu_only("cpu-0"),
        ]),
    )
    .await;
    let booking = lab.book_and_run("alice@example.com", "a100").await;
    let bob = lab.sim.spawn("bob@example.com", 1).await.expect("admitted");
    assert_eq!(label(&bob, PRIORITY_LABEL), Some("low"));
    lab.expect("bob's lent notebook never ran on a GPU", |s| {
        running(s, "bob@example.com").is_some_and(|p| on_gpu(&p))
    })
    .await;
    lab.wait_in_use("a100", 2).await;
    let dave = lab
        .sim
        .spawn("dave@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(gpus(&dave), 0, "nothing was free for dave");

    let alice = wait_for_notebook(&lab, "alice@example.com", "booked", |n| {
        n["standing"] == "booked"
    })
    .await;
    assert_eq!(alice["model"], "a100");
    assert_eq!(alice["gpus"], 1);
    assert_eq!(alice["booking_id"], booking.id);
    let ends: DateTime<Utc> = alice["ends_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(ends.timestamp(), booking.end.timestamp(), "{alice}");
    assert_eq!(alice["next"], serde_json::json!(["extend"]));

    let bob = wait_for_notebook(&lab, "bob@example.com", "lent", |n| n["standing"] == "lent").await;
    assert_eq!(bob["model"], "a100");
    assert!(
        bob["booking_id"].is_null() && bob["ends_at"].is_null(),
        "{bob}"
    );
    assert_eq!(bob["next"], serde_json::json!(["book"]));

    let dave = wait_for_notebook(&lab, "dave@example.com", "stripped", |n| {
        n["standing"] == "stripped"
    })
    .await;
    assert!(dave["model"].is_null(), "{dave}");
    // In the webhook's words (dave asked for any GPU).
    assert_eq!(dave["why"], "on CPU: no free GPU and no active booking");
    assert_eq!(dave["next"], serde_json::json!(["book"]));

    // One user cannot read another's.
    let (status, _) = notebooks(&lab, "dave@example.com", "?user=alice@example.com").await;
    assert_eq!(status, 403);

    // Alice ends her booking early: her notebook is re-created on CPU, and shows so.
    lab.end_early(&booking).await;
    let copy = wait_for_notebook(&lab, "alice@example.com", "re-created on CPU", |n| {
        n["standing"] == "stripped"
    })
    .await;
    assert!(
        copy["why"].as_str().unwrap().starts_with("on CPU: "),
        "{copy}"
    );
    assert!(copy["ends_at"].is_null(), "{copy}");
    lab.shutdown().await;
}
