//! End to end, on the simulated lab: every GPU in the cluster counts, whoever holds it.
//!
//! - a training job in namespace `research` holding a card is counted (no card that
//!   does not exist is lent), and it is never a victim: a booked user gets a card
//!   from the least recently active lent notebook instead;
//! - a booked user whose cards are all held by bookings and by pods that bookings do
//!   not preempt is told why, on the pod (an Event) and on the booking (the API),
//!   and the admin sees in `GET /models` what other workloads hold;
//! - an admin who made `research` preemptible gets its job deleted for a booked user;
//! - the webhook lends a card to a GPU pod without a user only where the controller
//!   can take it back (`--lend-namespaces`: the chart's `controller.namespace` and
//!   `controller.preemption.otherWorkloadNamespaces`). With the chart's defaults the
//!   controller serves `jhub` only, so the job in `research` is another workload: it
//!   keeps its GPU as written, is not lent (no low class, nothing in the lend
//!   ledger), and is not stripped when every card is held (it outranks lent pods,
//!   as any ordinary pod does). A pod without a user in `jhub` is lent, and gives
//!   way to a booked user.

use crate::common;

use chrono::TimeDelta;
use common::*;
use gpu_booking_core::admission::{GPU_REMOVED_ANNOTATION, MODEL_LABEL, PRIORITY_LABEL};
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use serde_json::Value;
use sqlx::PgPool;

const RESEARCH: &str = "research";

/// One node of `cards` A100s, and a CPU node.
fn a100_node(cards: u32) -> gpu_booking_sim::SimBuilder {
    SimCluster::builder().nodes(vec![
        GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", cards, 40960),
        GpuNode::cpu_only("cpu-0"),
    ])
}

/// The research job, running on a card.
async fn research_job(lab: &Lab) -> Pod {
    let job = lab
        .sim
        .run_workload(RESEARCH, "train-0", 1)
        .await
        .expect("the admin's training job is admitted");
    lab.expect("the research job never ran on a GPU", |s| {
        s.get::<Pod>(Some(RESEARCH), "train-0")
            .is_some_and(|p| is_running(&p) && on_gpu(&p))
    })
    .await;
    job
}

/// Whether `pod` was admitted as another workload: its GPU as written, none of our
/// marks, not our low class.
fn admitted_as_written(pod: &Pod) -> bool {
    gpus(pod) == 1
        && label(pod, PRIORITY_LABEL).is_none()
        && label(pod, MODEL_LABEL).is_none()
        && annotation(pod, GPU_REMOVED_ANNOTATION).is_none()
        && pod
            .spec
            .as_ref()
            .is_some_and(|s| s.priority_class_name.is_none() && s.node_selector.is_none())
}

fn still_running(lab: &Lab, job: &Pod) -> bool {
    lab.sim
        .server
        .get::<Pod>(Some(RESEARCH), "train-0")
        .is_some_and(|p| p.metadata.uid == job.metadata.uid && is_running(&p) && on_gpu(&p))
}

#[sqlx::test(migrations = "./migrations")]
async fn a_job_elsewhere_is_counted_and_never_a_victim(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_node(3)).await;
    let job = research_job(&lab).await;
    // Bob first, so his is the least recently active of the two lent notebooks.
    lab.lent_and_running("bob@example.com").await;
    lab.lent_and_running("carol@example.com").await;
    lab.wait_in_use("a100", 3).await;

    // No card is free: erin runs on CPU, not Pending on a card that is not there.
    let erin = lab
        .sim
        .spawn("erin@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(
        gpus(&erin),
        0,
        "the webhook lent erin a card the research job holds"
    );

    let bob = lab.notebook("bob@example.com").unwrap();
    let carol = lab.notebook("carol@example.com").unwrap();
    lab.book_and_run("alice@example.com", "a100").await;
    lab.expect("bob's lent notebook did not come back CPU-only", |s| {
        running(s, "bob@example.com")
            .is_some_and(|p| p.metadata.uid != bob.metadata.uid && gpus(&p) == 0)
    })
    .await;
    let still = lab.notebook("carol@example.com").unwrap();
    assert!(
        still.metadata.uid == carol.metadata.uid && on_gpu(&still),
        "carol's lent notebook, more recently active than bob's, was ended too"
    );
    assert!(
        still_running(&lab, &job),
        "the research job was ended for a booking"
    );
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_booked_user_is_told_which_workloads_hold_the_cards(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_node(2)).await;
    let job = research_job(&lab).await;
    lab.book_and_run("alice@example.com", "a100").await;
    lab.wait_in_use("a100", 2).await;

    // Both cards are taken: one by a booking, one by a job bookings do not preempt.
    let frank = lab
        .book("frank@example.com", "a100", TimeDelta::hours(2))
        .await;
    let pod = lab
        .sim
        .spawn("frank@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(label(&pod, PRIORITY_LABEL), Some("high"));
    let why = "waiting: 2 of 2 a100 held, 1 by bookings, 1 by pods in namespace research that bookings do not preempt";
    lab.expect("frank's pod has no Event saying why it waits", |s| {
        s.list::<Event>(Some("jhub")).iter().any(|e| {
            e.regarding.as_ref().and_then(|r| r.uid.as_ref()) == pod.metadata.uid.as_ref()
                && e.reason.as_deref() == Some("WaitingForGpu")
                && e.note.as_deref().is_some_and(|n| n.contains(why))
        })
    })
    .await;
    // The booking says so to its user.
    let token = lab.api.token("frank@example.com", None).unwrap();
    let http = reqwest::Client::new();
    let mut shown = Value::Null;
    for _ in 0..100 {
        shown = http
            .get(format!("{}/api/v1/bookings/{}", lab.api.url, frank.id))
            .bearer_auth(&token)
            .send()
            .await
            .expect("the booking API answers")
            .json()
            .await
            .expect("a booking as JSON");
        if shown["waiting"] == why {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        shown["waiting"], why,
        "the booking does not say why: {shown}"
    );
    // The admin sees what other workloads hold, and that the declared units are
    // more than bookings can get.
    let a100 = lab
        .models()
        .await
        .into_iter()
        .find(|m| m["name"] == "a100")
        .unwrap();
    assert_eq!(a100["others_in_use"], 1, "{a100}");
    assert_eq!(
        a100["other_namespaces"],
        serde_json::json!([RESEARCH]),
        "{a100}"
    );
    assert_eq!(a100["bookable"], 1, "{a100}");
    assert_eq!(a100["over_declared"], true, "{a100}");
    assert!(still_running(&lab, &job), "the research job was ended");
    assert!(
        lab.notebook("frank@example.com")
            .is_some_and(|p| node_of(&p).is_none()),
        "frank's pod should still wait"
    );
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn an_admin_may_make_a_namespace_give_way(pool: PgPool) {
    let chart = chart(&["controller.preemption.otherWorkloadNamespaces={research}"]);
    let lab = Lab::start_with(pool, a100_node(1).rendered_chart(chart)).await;
    let job = research_job(&lab).await;
    lab.wait_in_use("a100", 1).await;
    lab.book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    lab.sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    lab.expect(
        "the research job was not deleted (never re-created by us)",
        |s| {
            s.get::<Pod>(Some(RESEARCH), "train-0")
                .is_none_or(|p| p.metadata.uid != job.metadata.uid)
        },
    )
    .await;
    lab.expect(
        "alice's booked notebook never got the research job's card",
        |s| running(s, "alice@example.com").is_some_and(|p| on_gpu(&p)),
    )
    .await;
    assert!(
        lab.sim
            .server
            .get::<Pod>(Some(RESEARCH), "train-0")
            .is_none(),
        "the controller re-created the research job: only its owner may"
    );
    lab.shutdown().await;
}

/// A booked user whose card is held by a lent notebook that is ending (its user
/// stopped it; it holds the card for its grace period), beside a research job: the
/// user is told to wait for the pod that is ending, not that workloads bookings do
/// not preempt hold the cards; and runs once it is gone.
#[sqlx::test(migrations = "./migrations")]
async fn a_booked_user_waiting_for_a_notebook_that_is_ending_is_told_so(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_node(2).notebook_grace_period(15)).await;
    let job = research_job(&lab).await;
    lab.lent_and_running("bob@example.com").await;
    lab.wait_in_use("a100", 2).await;
    lab.sim
        .stop_notebook("bob@example.com")
        .await
        .expect("bob stops his notebook");
    let bob = gpu_booking_sim::spawner::pod_name("bob@example.com");
    lab.expect("bob's notebook is not terminating", |s| {
        s.get::<Pod>(Some("jhub"), &bob)
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;

    let alice = lab
        .book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    let pod = lab
        .sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    assert_eq!(label(&pod, PRIORITY_LABEL), Some("high"));
    let why = "waiting: the a100 GPU for this pod is held by a pod that is ending (its grace period); this pod starts once it is gone";
    let said = |s: &gpu_booking_fake_apiserver::FakeApiServer| -> Vec<String> {
        s.list::<Event>(Some("jhub"))
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.uid.as_ref()) == pod.metadata.uid.as_ref()
            })
            .filter(|e| e.reason.as_deref() == Some("WaitingForGpu"))
            .filter_map(|e| e.note)
            .collect()
    };
    lab.expect(
        "alice's pod has no Event saying it waits for a pod that is ending",
        |s| said(s).iter().any(|n| n.contains(why)),
    )
    .await;
    assert!(
        said(&lab.sim.server)
            .iter()
            .all(|n| !n.contains("that bookings do not preempt")),
        "alice was told that pods bookings do not preempt keep her waiting: {:?}",
        said(&lab.sim.server)
    );
    // Her booking says so too.
    let token = lab.api.token("alice@example.com", None).unwrap();
    let http = reqwest::Client::new();
    let mut shown = Value::Null;
    for _ in 0..100 {
        shown = http
            .get(format!("{}/api/v1/bookings/{}", lab.api.url, alice.id))
            .bearer_auth(&token)
            .send()
            .await
            .expect("the booking API answers")
            .json()
            .await
            .expect("a booking as JSON");
        if shown["waiting"] == why {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        shown["waiting"], why,
        "the booking does not say why: {shown}"
    );
    lab.expect("alice's booked notebook never got bob's card", |s| {
        running(s, "alice@example.com").is_some_and(|p| on_gpu(&p))
    })
    .await;
    assert!(still_running(&lab, &job), "the research job was ended");
    lab.shutdown().await;
}

/// A GPU pod without a user in `research`, where the controller does not act, is
/// another workload: its GPU as written, no low class, nothing in the lend ledger (a
/// notebook spawned at once is lent the card still free, which a ledger that counted
/// the job would refuse until a report a minute later), and not stripped when every
/// card is held: like any ordinary pod it outranks the lent ones.
#[sqlx::test(migrations = "./migrations")]
async fn a_job_where_no_lent_card_comes_back_keeps_its_gpu_and_is_not_lent(pool: PgPool) {
    // The ledger holds an admission for a minute: a unit it counted would stay
    // counted while the notebook is spawned.
    let chart = chart(&["webhook.lendSettle=1min"]);
    let lab = Lab::start_with(pool, a100_node(2).rendered_chart(chart)).await;
    let job = research_job(&lab).await;
    assert!(
        admitted_as_written(&job),
        "the research job was lent: {job:?}"
    );
    lab.wait_in_use("a100", 1).await;
    lab.lent_and_running("bob@example.com").await;
    lab.wait_in_use("a100", 2).await;
    let bob = lab.notebook("bob@example.com").unwrap();

    // Every card held: a second job keeps its GPU. It outranks the lent notebook
    // (priority 0 over our low class's -10), so kube-scheduler preempts that for it,
    // and the controller re-creates the notebook CPU-only.
    let second = lab
        .sim
        .run_workload(RESEARCH, "train-1", 1)
        .await
        .expect("the second training job is admitted");
    assert!(
        admitted_as_written(&second),
        "the second research job was stripped or lent: {second:?}"
    );
    let metrics = lab.sim.webhook_metrics().await.unwrap_or_default();
    assert!(
        metrics.contains("gpu_booking_webhook_admissions_total{decision=\"other_workload\"} 2"),
        "{metrics}"
    );
    lab.expect("the second research job never ran on bob's card", |s| {
        s.get::<Pod>(Some(RESEARCH), "train-1")
            .is_some_and(|p| p.metadata.uid == second.metadata.uid && is_running(&p) && on_gpu(&p))
    })
    .await;
    lab.expect("bob's lent notebook did not come back CPU-only", |s| {
        running(s, "bob@example.com")
            .is_some_and(|p| p.metadata.uid != bob.metadata.uid && gpus(&p) == 0)
    })
    .await;
    assert!(still_running(&lab, &job), "the research job was ended");
    lab.shutdown().await;
}

/// A GPU pod without a user in the namespace the controller serves is lent as
/// before, and gives way to a booked user.
#[sqlx::test(migrations = "./migrations")]
async fn a_pod_without_a_user_where_the_controller_serves_is_lent(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_node(1)).await;
    let pod = lab
        .sim
        .run_workload("jhub", "train-jhub", 1)
        .await
        .expect("admitted");
    assert_eq!(label(&pod, PRIORITY_LABEL), Some("low"), "{pod:?}");
    assert_eq!(label(&pod, MODEL_LABEL), Some("a100"));
    assert_eq!(
        pod.spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref()),
        Some("gpu-booking-low")
    );
    lab.expect("the lent pod never ran on a GPU", |s| {
        s.get::<Pod>(Some("jhub"), "train-jhub")
            .is_some_and(|p| is_running(&p) && on_gpu(&p))
    })
    .await;
    lab.wait_in_use("a100", 1).await;
    lab.book_and_run("alice@example.com", "a100").await;
    assert!(
        lab.sim
            .server
            .get::<Pod>(Some("jhub"), "train-jhub")
            .is_none_or(|p| p.metadata.uid != pod.metadata.uid && !on_gpu(&p)),
        "the lent pod kept its card"
    );
    lab.shutdown().await;
}
