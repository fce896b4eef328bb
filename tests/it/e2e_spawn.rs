//! End to end, on the simulated lab: what a spawn gets.
//!
//! - a booked user gets the booked model (a node of that model, high priority,
//!   `terminate-at` = the booking's end);
//! - an unbooked user gets a free card, then loses it to a booked user, and exactly
//!   one lent pod gives way;
//! - an unbooked user with nothing free runs on CPU, with the warning.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use gpu_booking_core::admission::{GPU_REMOVED_ANNOTATION, PRIORITY_LABEL};
use gpu_booking_sim::spawner::pod_name;
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use sqlx::PgPool;

const GPUMEM: &str = "gpu-booking.io/gpumem";

#[sqlx::test(migrations = "./migrations")]
async fn booked_user_gets_the_booked_model(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let booking = lab
        .book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    let pod = lab
        .sim
        .spawn("alice@example.com", 1)
        .await
        .expect("the API server admits alice's notebook");
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        Some("high"),
        "the webhook did not mark alice's pod as booked: labels {:?}",
        pod.metadata.labels
    );
    lab.expect("alice's booked notebook never ran (see why below)", |s| {
        running(s, "alice@example.com").is_some()
    })
    .await;
    let pod = lab.notebook("alice@example.com").unwrap();
    assert_eq!(
        node_of(&pod),
        Some("gpu-a100-0"),
        "alice booked an A100 but runs elsewhere"
    );
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("gpu-booking-high")
    );
    assert_eq!(
        spec.priority,
        Some(1000),
        "the Priority plugin resolved another priority"
    );
    let until: DateTime<Utc> = annotation(&pod, "terminate-at")
        .expect("a booked pod carries terminate-at")
        .parse()
        .unwrap();
    assert_eq!(
        until.timestamp(),
        booking.end.timestamp(),
        "terminate-at is not the booking's end"
    );
    assert_eq!(
        label(&pod, "gpu-booking.io/booking"),
        Some(&*booking.id.to_string())
    );
    assert_eq!(gpus(&pod), 1);
    let limits = pod.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    assert!(
        limits.contains_key(GPUMEM),
        "the booked pod has no VRAM budget: {limits:?}"
    );
    lab.shutdown().await;
}

/// A lab with only the two A100s (and a CPU node), so that two lent pods fill it.
pub(crate) fn a100_lab() -> gpu_booking_sim::SimBuilder {
    SimCluster::builder().nodes(vec![
        GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 2, 40960),
        GpuNode::cpu_only("cpu-0"),
    ])
}

#[sqlx::test(migrations = "./migrations")]
async fn lent_gpu_is_taken_back_from_exactly_one_pod(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_lab()).await;
    // Two unbooked users take both cards, one after the other.
    for user in ["bob@example.com", "carol@example.com"] {
        let pod = lab.sim.spawn(user, 1).await.expect("admitted");
        assert_eq!(
            label(&pod, PRIORITY_LABEL),
            Some("low"),
            "{user} should be lent a free card"
        );
        lab.expect(
            &format!("{user}'s lent notebook never ran on a GPU (see why below)"),
            |s| running(s, user).is_some_and(|p| on_gpu(&p)),
        )
        .await;
    }
    lab.wait_in_use("a100", 2).await;
    let lent_uids: Vec<String> = ["bob@example.com", "carol@example.com"]
        .iter()
        .map(|u| lab.notebook(u).unwrap().metadata.uid.unwrap())
        .collect();

    // A booked user needs one of them.
    lab.book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    lab.sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    lab.expect(
        "alice's booked notebook never got a card back from the lent pods (see why below)",
        |s| running(s, "alice@example.com").is_some_and(|p| on_gpu(&p)),
    )
    .await;
    // The victim is recreated CPU-only; wait for that, then count.
    lab.expect("no lent pod was recreated CPU-only after giving way", |s| {
        ["bob@example.com", "carol@example.com"].iter().any(|u| {
            s.get::<Pod>(Some("jhub"), &pod_name(u)).is_some_and(|p| {
                !lent_uids.contains(p.metadata.uid.as_ref().unwrap()) && gpus(&p) == 0
            })
        })
    })
    .await;
    let still_lent: Vec<&str> = ["bob@example.com", "carol@example.com"]
        .into_iter()
        .filter(|u| {
            lab.notebook(u)
                .is_some_and(|p| lent_uids.contains(p.metadata.uid.as_ref().unwrap()) && on_gpu(&p))
        })
        .collect();
    assert_eq!(
        still_lent.len(),
        1,
        "one booked pod should cost exactly one lent pod its GPU; lent pods still on a GPU: {still_lent:?}\n{}",
        serde_json::to_string_pretty(&lab.sim.view()).unwrap()
    );
    let victim = ["bob@example.com", "carol@example.com"]
        .into_iter()
        .find(|u| !still_lent.contains(u))
        .unwrap();
    let copy = lab.notebook(victim).unwrap();
    assert!(
        annotation(&copy, GPU_REMOVED_ANNOTATION).is_some(),
        "the victim's CPU-only copy does not say why its GPU was removed"
    );
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn unbooked_user_with_nothing_free_runs_on_cpu_with_a_warning(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_lab()).await;
    // Both A100s are booked and held.
    for user in ["alice@example.com", "zoë@uni.example"] {
        lab.book(user, "a100", TimeDelta::hours(2)).await;
        lab.sim.spawn(user, 1).await.expect("admitted");
        lab.expect(&format!("{user}'s booked notebook never ran"), |s| {
            running(s, user).is_some()
        })
        .await;
    }
    lab.wait_in_use("a100", 2).await;
    let pod = lab
        .sim
        .spawn("Bob.Smith", 1)
        .await
        .expect("admitted, without its GPU");
    assert_eq!(
        gpus(&pod),
        0,
        "bob's pod kept a GPU request with nothing free"
    );
    let env = &pod.spec.as_ref().unwrap().containers[0].env;
    assert!(
        env.iter()
            .flatten()
            .any(|e| e.name == "NVIDIA_VISIBLE_DEVICES" && e.value.as_deref() == Some("none")),
        "a stripped pod must hide the GPUs (NVIDIA_VISIBLE_DEVICES=none)"
    );
    let warnings = lab.sim.admission_warnings(&pod_name("Bob.Smith"));
    assert!(
        !warnings.is_empty(),
        "the user is not told why the notebook runs without a GPU"
    );
    // The date is the one `GET /me/next-start` answers bob (the
    // model's capacity included: both units are booked for two hours).
    let token = lab.api.token("bob.smith", None).unwrap();
    let next: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/api/v1/me/next-start?model=a100", lab.api.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("the booking API answers")
        .json()
        .await
        .expect("next-start as JSON");
    let start: DateTime<Utc> = next["earliest_start"].as_str().unwrap().parse().unwrap();
    assert!(start > Utc::now() + TimeDelta::hours(1), "{next}");
    let date = format!("you can book from {}", start.format("%Y-%m-%d %H:%M UTC"));
    assert!(
        warnings.iter().any(|w| w.contains(&date)),
        "the warning's date is not next-start's ({date}): {warnings:?}"
    );
    lab.expect("bob's CPU-only notebook never ran", |s| {
        running(s, "Bob.Smith").is_some_and(|p| node_of(&p) == Some("cpu-0") || gpus(&p) == 0)
    })
    .await;
    lab.shutdown().await;
}

/// Victims respect the booked pod's node constraints. Two A100
/// nodes of one card each, both lent (bob's first, so his is the least recently
/// used); alice's booked notebook may only run on carol's node (a required node
/// affinity, as a KubeSpawner profile writes it): carol's pod gives way, and bob,
/// whom the least-recently-used order alone would pick, keeps his card.
#[sqlx::test(migrations = "./migrations")]
async fn a_victim_only_where_the_booked_pod_may_run(pool: PgPool) {
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 1, 40960),
            GpuNode::gpu("gpu-a100-1", "NVIDIA-A100-SXM4-40GB", 1, 40960),
            GpuNode::cpu_only("cpu-0"),
        ]),
    )
    .await;
    let lent = ["bob@example.com", "carol@example.com"];
    for user in lent {
        lab.lent_and_running(user).await;
    }
    lab.wait_in_use("a100", 2).await;
    let bob = lab.notebook(lent[0]).unwrap();
    let carol = lab.notebook(lent[1]).unwrap();
    let carols_node = node_of(&carol).unwrap().to_owned();
    assert_ne!(node_of(&bob), Some(carols_node.as_str()));

    lab.book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    let mut body = gpu_booking_sim::spawner::notebook_pod("alice@example.com", 1);
    body["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": [carols_node]}]}]}}});
    let alice = lab.sim.create_notebook(body).await.expect("admitted");
    assert_eq!(label(&alice, PRIORITY_LABEL), Some("high"));
    lab.expect(
        "alice's booked notebook never ran on the node its affinity names",
        |s| {
            running(s, "alice@example.com")
                .is_some_and(|p| on_gpu(&p) && node_of(&p) == Some(carols_node.as_str()))
        },
    )
    .await;
    lab.expect("carol's lent notebook did not come back CPU-only", |s| {
        running(s, lent[1]).is_some_and(|p| p.metadata.uid != carol.metadata.uid && gpus(&p) == 0)
    })
    .await;
    let still = lab.notebook(lent[0]).unwrap();
    assert!(
        still.metadata.uid == bob.metadata.uid && on_gpu(&still),
        "bob's lent pod on the other node was ended though alice could not use its card"
    );
    lab.shutdown().await;
}

/// A notebook that asks for no GPU but sets `NVIDIA_VISIBLE_DEVICES=all` (which the
/// NVIDIA runtime reads: every card of its node, seen by no count) reaches the
/// webhook through the chart's match condition and runs with the variable set to
/// `none`, warned why.
#[sqlx::test(migrations = "./migrations")]
async fn a_pod_without_a_gpu_request_gets_no_gpu_through_the_runtimes_variable(pool: PgPool) {
    let lab = Lab::start(pool).await;
    let mut body = gpu_booking_sim::spawner::notebook_pod("mallory@example.com", 0);
    body["spec"]["containers"][0]["env"]
        .as_array_mut()
        .expect("KubeSpawner's pod has an env")
        .push(serde_json::json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}));
    let pod = lab.sim.create_notebook(body).await.expect("admitted");
    assert_eq!(gpus(&pod), 0);
    let visible: Vec<Option<String>> = pod.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "NVIDIA_VISIBLE_DEVICES")
        .map(|e| e.value.clone())
        .collect();
    assert_eq!(visible, [Some("none".to_owned())], "the runtime's variable");
    let warnings = lab.sim.admission_warnings(&pod_name("mallory@example.com"));
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("NVIDIA_VISIBLE_DEVICES set to none")),
        "no warning says why: {warnings:?}"
    );
    lab.expect("the notebook without a GPU never ran", |s| {
        running(s, "mallory@example.com").is_some()
    })
    .await;
    lab.shutdown().await;
}

/// With a warning period (`controller.preemption.grace`), the lent notebook chosen to
/// give way is marked with its deadline and warned (a Warning Event), keeps its GPU
/// until then, and only then comes back CPU-only for the booked user; the other lent
/// notebook is never marked.
#[sqlx::test(migrations = "./migrations")]
async fn a_lent_notebook_is_warned_before_its_gpu_is_taken_back(pool: PgPool) {
    let chart = chart(&["controller.preemption.grace=6s"]);
    let lab = Lab::start_with(pool, a100_lab().rendered_chart(chart)).await;
    let lent = ["bob@example.com", "carol@example.com"];
    for user in lent {
        lab.lent_and_running(user).await;
    }
    lab.wait_in_use("a100", 2).await;
    let before: Vec<Pod> = lent.iter().map(|u| lab.notebook(u).unwrap()).collect();
    let booking = lab
        .book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    lab.sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    let preempt_at = "gpu-booking.io/preempt-at";
    lab.expect("no lent notebook was marked to give way", |s| {
        lent.iter()
            .any(|u| running(s, u).is_some_and(|p| annotation(&p, preempt_at).is_some()))
    })
    .await;
    let victim = *lent
        .iter()
        .find(|u| {
            lab.notebook(u)
                .is_some_and(|p| annotation(&p, preempt_at).is_some())
        })
        .unwrap();
    let marked = lab.notebook(victim).unwrap();
    let deadline: DateTime<Utc> = annotation(&marked, preempt_at).unwrap().parse().unwrap();
    let events = lab
        .sim
        .server
        .list::<k8s_openapi::api::events::v1::Event>(Some("jhub"));
    assert!(
        events
            .iter()
            .any(|e| e.regarding.as_ref().and_then(|r| r.uid.as_ref())
                == marked.metadata.uid.as_ref()
                && e.reason.as_deref() == Some("GpuTakenBackSoon")
                && e.type_.as_deref() == Some("Warning")),
        "the victim's user was not warned"
    );
    // Alice's booking says when her GPU comes (the page shows it).
    let token = lab.api.token("alice@example.com", None).unwrap();
    let mut told = serde_json::Value::Null;
    for _ in 0..50 {
        told = reqwest::Client::new()
            .get(format!("{}/api/v1/bookings/{}", lab.api.url, booking.id))
            .bearer_auth(&token)
            .send()
            .await
            .expect("the booking API answers")
            .json()
            .await
            .expect("a booking");
        if told["waiting"].as_str().is_some() || Utc::now() >= deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if Utc::now() < deadline {
        let when = format!("gives its GPU back at {} UTC", deadline.format("%H:%M:%S"));
        assert!(
            told["waiting"].as_str().is_some_and(|w| w.contains(&when)),
            "the booking does not say when its GPU comes: {told}"
        );
    }
    // Until the deadline both lent notebooks keep their GPUs and alice waits.
    let still_there = lent.iter().zip(&before).all(|(u, was)| {
        lab.notebook(u).is_some_and(|p| {
            p.metadata.uid == was.metadata.uid
                && on_gpu(&p)
                && p.metadata.deletion_timestamp.is_none()
        })
    });
    assert!(
        still_there || Utc::now() >= deadline,
        "a lent notebook was ended before its deadline {deadline}"
    );
    lab.expect(
        "alice's booked notebook never got the card after the deadline",
        |s| running(s, "alice@example.com").is_some_and(|p| on_gpu(&p)),
    )
    .await;
    let alice = lab.notebook("alice@example.com").unwrap();
    let started = alice
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .expect("a running pod has a start time");
    assert!(
        started >= deadline - TimeDelta::seconds(1),
        "alice's notebook started at {started}, before the victim's deadline {deadline}"
    );
    lab.expect("the victim did not come back CPU-only", |s| {
        running(s, victim).is_some_and(|p| p.metadata.uid != marked.metadata.uid && gpus(&p) == 0)
    })
    .await;
    let other = lent.iter().find(|u| **u != victim).unwrap();
    let kept = lab.notebook(other).unwrap();
    assert!(
        on_gpu(&kept) && annotation(&kept, preempt_at).is_none(),
        "the other lent notebook was marked or ended too"
    );
    lab.shutdown().await;
}

/// Two booked users wait for the two lent a100s, each marked for one of them
/// (warned 12 s ahead). The lent notebook marked for the second frees its card
/// early (its user stops it), and the scheduler gives that card to the first, who
/// came first. The notebook marked for the first is not let off: the second booked
/// user now waits for its card, so it is named for them and ends at its deadline,
/// and the second booked notebook runs after that one round (unmarked at once, it
/// sent the second user to a round of its own and a second warning).
#[sqlx::test(migrations = "./migrations")]
async fn a_marked_notebook_frees_its_card_for_whichever_booked_user_still_waits(pool: PgPool) {
    let chart = chart(&["controller.preemption.grace=12s"]);
    let lab = Lab::start_with(
        pool,
        a100_lab().notebook_grace_period(2).rendered_chart(chart),
    )
    .await;
    let lent = ["bob@example.com", "carol@example.com"];
    for user in lent {
        lab.lent_and_running(user).await;
    }
    lab.wait_in_use("a100", 2).await;
    let preempt_for = gpu_booking_core::admission::PREEMPT_FOR_ANNOTATION;
    let marked_for = |booked: &str| -> Option<&'static str> {
        let key = format!("jhub/{}", pod_name(booked));
        lent.iter().copied().find(|u| {
            lab.notebook(u)
                .is_some_and(|p| annotation(&p, preempt_for) == Some(key.as_str()))
        })
    };
    let mut victims = Vec::new();
    for booked in ["alice@example.com", "dave@example.com"] {
        lab.book(booked, "a100", TimeDelta::hours(2)).await;
        lab.sim.spawn(booked, 1).await.expect("admitted");
        lab.expect(&format!("no lent notebook was marked for {booked}"), |_| {
            marked_for(booked).is_some()
        })
        .await;
        victims.push(marked_for(booked).unwrap());
    }
    let (first_victim, second_victim) = (victims[0], victims[1]);
    let first = lab.notebook(first_victim).unwrap();
    // Dave's lent notebook goes early: the card it frees goes to alice.
    lab.sim
        .stop_notebook(second_victim)
        .await
        .expect("the lent notebook stops");
    lab.expect(
        "alice's booked notebook never got the card freed early",
        |s| running(s, "alice@example.com").is_some_and(|p| on_gpu(&p)),
    )
    .await;
    lab.expect(
        "dave's booked notebook never got the card of the notebook marked for alice",
        |s| running(s, "dave@example.com").is_some_and(|p| on_gpu(&p)),
    )
    .await;
    let dave = lab.notebook("dave@example.com").unwrap();
    assert_eq!(
        annotation(
            &dave,
            gpu_booking_core::admission::PREEMPTION_ROUNDS_ANNOTATION
        ),
        Some("1"),
        "dave needed a second round"
    );
    let kept = lab
        .sim
        .server
        .list::<k8s_openapi::api::events::v1::Event>(Some("jhub"))
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("GpuKept"))
        .count();
    assert_eq!(
        kept, 0,
        "a marked notebook was let off while dave waited for it"
    );
    lab.expect(
        "the notebook marked for alice did not come back CPU-only",
        |s| {
            running(s, first_victim)
                .is_some_and(|p| p.metadata.uid != first.metadata.uid && gpus(&p) == 0)
        },
    )
    .await;
    lab.shutdown().await;
}
