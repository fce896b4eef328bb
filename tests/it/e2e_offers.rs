//! End to end, on the simulated lab: a GPU offered back. A user whose notebook was
//! stripped at spawn is offered the card that frees when a booking's pod ends: the
//! service records the offer and a notice for them, the webhook holds the card for
//! them against another user's spawn, and their own spawn gets it. With
//! `--on-expiry hub-restart`, a user who opted in is restarted through the hub and
//! comes back on the GPU.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_core::offers::GPU_WANTED_ANNOTATION;
use gpu_booking_fake_apiserver::FakeApiServer;
use gpu_booking_sim::hub::{FakeHub, ServerStatus};
use gpu_booking_sim::spawner::NOTEBOOK_NAMESPACE;
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::net::TcpListener;

/// One A100 and a CPU node.
fn one_a100() -> Vec<GpuNode> {
    vec![
        GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 1, 40960),
        GpuNode::cpu_only("cpu-0"),
    ]
}

/// `GET /api/v1/offers` as the controller would read it (the admin sees all).
async fn offers(lab: &Lab) -> Value {
    let token = lab
        .api
        .token(
            "admin@example.com",
            Some(gpu_booking_api::role::Role::Admin),
        )
        .unwrap();
    reqwest::Client::new()
        .get(format!("{}/api/v1/offers", lab.api.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("the booking API answers")
        .json()
        .await
        .expect("an answer as JSON")
}

/// Waits until the service holds an offer for `user`; returns it.
async fn wait_for_offer(lab: &Lab, user: &str) -> Value {
    // The controller offers on its sync tick; the service has no feed to wait on.
    eventually(|| async {
        let all = offers(lab).await;
        if let Some(o) = all["offers"]
            .as_array()
            .and_then(|l| l.iter().find(|o| o["user"] == user))
        {
            return Ok(o.clone());
        }
        Err(format!(
            "{user} was never offered a GPU: {all}\ncluster:\n{}",
            serde_json::to_string_pretty(&lab.sim.view()).unwrap_or_default()
        ))
    })
    .await
}

/// Waits until the webhook has read a usage report of `model` taken more than its
/// lend ledger's settle time (3 s) after now: from then on the admissions made so
/// far count only through the reports, as a lab's do a few seconds after a spawn.
async fn settled(lab: &Lab, model: &str) {
    let after = chrono::Utc::now() + chrono::TimeDelta::seconds(3);
    let Some(replica) = lab.sim.webhook_replica().await else {
        return;
    };
    eventually(|| async {
        let answer = replica.schedulability("", "").await.expect("an answer");
        if answer
            .usage_reported_at
            .iter()
            .any(|(m, at)| m.as_str() == model && *at > after)
        {
            return Ok(());
        }
        Err(format!("no usage report of {model} came"))
    })
    .await
}

/// The notices of kind `gpu_offered` for `user`, after one round of the notice worker.
async fn offer_notices(pool: &PgPool, user: &str) -> Vec<String> {
    let worker = gpu_booking_api::notices::Worker::new(
        pool.clone(),
        Arc::new(gpu_booking_api::clock::SystemClock),
        gpu_booking_api::notices::send::Senders::from_args(
            &gpu_booking_api::notices::config::NoticeArgs::default(),
        )
        .unwrap(),
        gpu_booking_api::notices::Settings::default(),
    );
    worker.round().await.expect("a notice round");
    sqlx::query_scalar("SELECT body FROM notice WHERE kind = 'gpu_offered' AND user_name = $1")
        .bind(user)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = "./migrations")]
async fn a_stripped_user_is_offered_the_freed_card_and_it_is_held_for_them(pool: PgPool) {
    // The card is offered once nobody took one for `--offer-quiet`, counted from
    // alice's pod taking it: shortened, since that wait is not under test here.
    let builder = SimCluster::builder()
        .nodes(one_a100())
        .controller(|a| a.offer_quiet = Duration::from_secs(5));
    let lab = Lab::start_with(pool.clone(), builder).await;
    // Alice's booking holds the only card; dave finds none and runs on CPU.
    let booking = lab.book_and_run("alice@example.com", "a100").await;
    let dave = lab
        .sim
        .spawn("dave@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(gpus(&dave), 0, "nothing was free for dave");
    assert_eq!(annotation(&dave, GPU_WANTED_ANNOTATION), Some("1 any"));
    settled(&lab, "a100").await;

    // Alice's booking ends: her pod goes to CPU (her GPU time is over: she waits
    // for nothing), the card frees and is offered to dave.
    lab.end_early(&booking).await;
    let offer = wait_for_offer(&lab, "dave@example.com").await;
    assert_eq!(offer["model"], "a100", "{offer}");
    assert_eq!(offer["pod"], dave.metadata.name.clone().unwrap());
    assert!(
        offers(&lab).await["offers"].as_array().unwrap().len() == 1,
        "alice, whose booking ended, is offered nothing"
    );
    // Dave is told, once.
    let told = offer_notices(&pool, "dave@example.com").await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains("restart your server to get it"),
        "{}",
        told[0]
    );
    assert_eq!(offer_notices(&pool, "dave@example.com").await.len(), 1);

    // While it is held, bob's spawn is not lent the card.
    lab.webhook_refreshed().await;
    let bob = lab.sim.spawn("bob@example.com", 1).await.expect("admitted");
    assert_eq!(gpus(&bob), 0, "bob was lent the card held for dave");

    // Dave restarts his server: his spawn gets it.
    lab.sim
        .stop_notebook("dave@example.com")
        .await
        .expect("dave's server stops");
    lab.expect("dave's CPU notebook never went", |s| {
        s.get::<k8s_openapi::api::core::v1::Pod>(
            Some(gpu_booking_sim::spawner::NOTEBOOK_NAMESPACE),
            &gpu_booking_sim::spawner::pod_name("dave@example.com"),
        )
        .is_none()
    })
    .await;
    let dave = lab
        .sim
        .spawn("dave@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(
        gpus(&dave),
        1,
        "dave's spawn did not get the card held for him: {:?} {}",
        annotation(&dave, gpu_booking_core::admission::GPU_REMOVED_ANNOTATION),
        offers(&lab).await
    );
    assert_eq!(label(&dave, PRIORITY_LABEL), Some("low"));
    lab.expect("dave's notebook never ran on the GPU", |s| {
        running(s, "dave@example.com").is_some_and(|p| on_gpu(&p))
    })
    .await;
    // Taken: the offer is over.
    eventually(|| async {
        if offers(&lab).await["offers"].as_array().unwrap().is_empty() {
            return Ok(());
        }
        Err("the offer outlived its use".to_owned())
    })
    .await;
    lab.shutdown().await;
}

/// A spawn burst of unbooked users, two every half second for 12 s on the demo lab's
/// 6 cards, with offers on as the chart sets them: the webhook strips some spawns
/// while the pods it lent in the last seconds are not counted yet (its lend ledger,
/// webhook.md), and those users wait for a GPU. The cards still free must go to the
/// spawns behind them, not be held as offers for users who must restart to use
/// them: at the end every card is lent.
#[sqlx::test(migrations = "./migrations")]
async fn a_spawn_burst_is_lent_every_card_with_offers_on(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let cards: u64 = gpu_booking_sim::lab::demo_lab()
        .iter()
        .map(|n| u64::from(n.gpus))
        .sum();
    let mut spawned = 0;
    let began = tokio::time::Instant::now();
    while began.elapsed() < Duration::from_secs(12) {
        let pair = [spawned, spawned + 1].map(|i| format!("burst{i:02}@example.com"));
        let (a, b) = tokio::join!(lab.sim.spawn(&pair[0], 1), lab.sim.spawn(&pair[1], 1));
        a.expect("admitted");
        b.expect("admitted");
        spawned += 2;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let lent = |s: &FakeApiServer| -> u64 {
        s.list::<Pod>(Some(NOTEBOOK_NAMESPACE))
            .iter()
            .filter(|p| label(p, PRIORITY_LABEL) == Some("low"))
            .map(gpus)
            .sum()
    };
    let offered = offers(&lab).await;
    assert_eq!(
        lent(&lab.sim.server),
        cards,
        "{spawned} spawns were lent fewer than the lab's {cards} cards; offers: {offered}"
    );
    lab.expect("the lent notebooks never all ran on their cards", |s| {
        s.list::<Pod>(Some(NOTEBOOK_NAMESPACE))
            .iter()
            .filter(|p| gpus(p) > 0)
            .all(|p| is_running(p) && on_gpu(p))
    })
    .await;
    assert_eq!(lent(&lab.sim.server), cards);
    lab.shutdown().await;
}

const USER: &str = "zoë@uni.example";

#[sqlx::test(migrations = "./migrations")]
async fn an_opted_in_user_is_restarted_through_the_hub_onto_the_freed_gpu(pool: PgPool) {
    // The lab in hub-restart mode, as e2e_hub sets it up.
    let token = "hub-service-token";
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = FakeHub::api_url_of(&listener).unwrap();
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("token"), token).unwrap();
    let hub_service = "http://hub.jhub.svc:8081";
    let hub_address = api_url
        .split_once("/hub/api")
        .map(|(base, _)| base.to_owned())
        .unwrap();
    let builder = SimCluster::builder()
        .nodes(one_a100())
        .rendered_chart(chart(&[
            "controller.onExpiry=hub-restart",
            &format!("controller.hub.apiUrl={hub_service}/hub/api"),
            "controller.hub.tokenSecretName=hub-token",
            "controller.offerRestartIdle=0s",
            // As in the test above: the quiet wait is not under test.
            "controller.offerQuiet=5s",
        ]))
        .lab_service(hub_service, &hub_address)
        .lab_secret("hub-token", secret.path().to_owned());
    let lab = Lab::start_with(pool, builder).await;
    let hub = FakeHub::start_on(listener, &lab.sim, token).await.unwrap();

    // Zoë opts in on the notices page.
    let zoe_token = lab.api.token(USER, None).unwrap();
    let answer = reqwest::Client::new()
        .put(format!("{}/api/v1/me/notices", lab.api.url))
        .bearer_auth(&zoe_token)
        .json(
            &json!({"email": null, "email_enabled": true, "webhook_enabled": true,
            "muted": [], "restart_on_offer": true}),
        )
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success());

    // Alice's booking holds the card; zoë's server starts on CPU.
    let booking = lab.book_and_run("alice@example.com", "a100").await;
    hub.spawn(USER, 1).await.expect("the hub spawns");
    let cpu = lab.notebook(USER).expect("zoë's notebook");
    assert_eq!(gpus(&cpu), 0, "nothing was free for zoë");
    let cpu_uid = cpu.metadata.uid.clone().unwrap();
    settled(&lab, "a100").await;

    // The card frees: zoë is offered it, to be restarted; the controller restarts
    // her idle server through the hub and the new pod gets the card.
    lab.end_early(&booking).await;
    let offer = wait_for_offer(&lab, USER).await;
    assert_eq!(offer["restart"], true, "{offer}");
    lab.expect("zoë's server never came back on the GPU", |s| {
        hub.status(USER) == Some(ServerStatus::Running)
            && running(s, USER)
                .is_some_and(|p| p.metadata.uid.as_deref() != Some(cpu_uid.as_str()) && on_gpu(&p))
    })
    .await;
    assert!(
        hub.poll_deletes().is_empty(),
        "the hub never lost the server"
    );
    hub.stop().await;
    lab.shutdown().await;
}
