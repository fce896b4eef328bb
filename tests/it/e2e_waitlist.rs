//! End to end, on the simulated lab: a waitlist entry turned into a booking by an early
//! end is a booking like any other for the webhook: the waiting user's notebook gets a
//! card of the booked model, high priority, labelled with that booking.
//!
//! Runs on the real Postgres (`DATABASE_URL`), on a fresh database.

use crate::common;

use chrono::{TimeDelta, Utc};
use common::*;
use gpu_booking_api::auth::Role;
use gpu_booking_core::admission::PRIORITY_LABEL;
use serde_json::{json, Value};
use sqlx::PgPool;

const WAITER: &str = "wendy@example.com";

#[sqlx::test(migrations = "./migrations")]
async fn an_entry_booked_by_an_early_end_gets_its_user_the_card(pool: PgPool) {
    let lab = Lab::start(pool).await;
    // Both A100s booked for two hours.
    let first = lab
        .book("hal@example.com", "a100", TimeDelta::hours(2))
        .await;
    lab.book("ida@example.com", "a100", TimeDelta::hours(2))
        .await;

    // wendy waits for a day of an A100 starting within the hour.
    let http = reqwest::Client::new();
    let token = lab.api.token(WAITER, None::<Role>).unwrap();
    let entry: Value = http
        .post(format!("{}/api/v1/waitlist", lab.api.url))
        .bearer_auth(&token)
        .json(
            &json!({"model": "a100", "days": 1, "latest_start": Utc::now() + TimeDelta::hours(1)}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(entry["state"], "waiting", "{entry}");
    assert_eq!(entry["position"], 1);

    // hal ends early: wendy is booked from now, on the unit hal held.
    lab.end_early(&first).await;
    let entries: Value = http
        .get(format!("{}/api/v1/waitlist", lab.api.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(entries[0]["state"], "booked", "{entries}");
    let booking_id = entries[0]["booking_id"].as_i64().unwrap();
    // The promotion reaches the webhook's replica through the change stream.
    lab.webhook_sees(booking_id, |b| b.is_some()).await;

    // Her notebook gets the booked card, marked as booked by that booking.
    let pod = lab
        .sim
        .spawn(WAITER, 1)
        .await
        .expect("the API server admits wendy's notebook");
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("high"),
        "{:?}",
        pod.metadata.labels
    );
    assert_eq!(
        label(&pod, "gpu-booking.io/booking"),
        Some(&*booking_id.to_string())
    );
    lab.expect("wendy's booked notebook never ran on the A100 node", |s| {
        running(s, WAITER).is_some_and(|p| node_of(&p) == Some("gpu-a100-0"))
    })
    .await;
    assert_eq!(gpus(&lab.notebook(WAITER).unwrap()), 1);
    lab.shutdown().await;
}
