//! End to end, on the simulated lab with the node agent on every GPU node (its fake
//! NVML and `/proc`, the notebooks' kernels real processes):
//!
//! - the idle GPU process of a lent notebook is reclaimed by the agent: the process
//!   has exited, the pod still runs where it ran, with an Event that says why, and
//!   the booking service's audit log has the row;
//! - of two lent notebooks, the one whose GPU was idle longest (as the agent reports
//!   it) is the one that gives way to a booked user, even though it started last
//!   (without the agent's reports the controller would take the older one);
//! - with the chart's settings, a booked user's idle kernel is kept while a lent
//!   user's, idle for less time, is warned and then reclaimed.
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_fake_apiserver::FakeApiServer;
use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{GpuNode, SimBuilder, SimCluster};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use sqlx::PgPool;

const LAST_ACTIVITY: &str = "gpu-booking.io/last-gpu-activity";
const BOB: &str = "bob@example.com";
const CAROL: &str = "carol@example.com";
const ALICE: &str = "alice@example.com";

/// The two A100s and a CPU node; the agents sample five times a second.
fn a100_lab() -> SimBuilder {
    SimCluster::builder()
        .nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 2, 40960),
            GpuNode::cpu_only("cpu-0"),
        ])
        .agent_interval(Duration::from_millis(200))
}

fn on_gpu(pod: &Pod) -> bool {
    gpus(pod) > 0 && node_of(pod).is_some_and(|n| n.starts_with("gpu-"))
}

/// Polls `condition` (state outside the API server: the node's processes) until it
/// holds; fails with `wrong` and the cluster as it was after [`SETTLE`].
async fn on_node_eventually(lab: &Lab, wrong: &str, mut condition: impl FnMut() -> bool) {
    eventually(|| {
        let held = condition();
        async move {
            if held {
                return Ok(());
            }
            Err(format!(
                "{wrong}\ncluster after {SETTLE:?}:\n{}",
                serde_json::to_string_pretty(&lab.sim.view()).unwrap_or_default()
            ))
        }
    })
    .await
}

/// `user`'s lent notebook, spawned and running on a GPU with its kernel on the card.
async fn lent_notebook(lab: &Lab, user: &str) -> (Pod, u32) {
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
    on_node_eventually(
        lab,
        &format!("{user}'s notebook runs but no GPU process of it is on the node's cards"),
        || lab.sim.gpu_process(user).is_some(),
    )
    .await;
    let pid = lab.sim.gpu_process(user).unwrap();
    (lab.notebook(user).unwrap(), pid)
}

fn last_activity(pod: &Pod) -> Option<DateTime<Utc>> {
    annotation(pod, LAST_ACTIVITY)?.parse().ok()
}

/// Whether process `pid` still runs on this machine (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
    })
}

#[sqlx::test(migrations = "./migrations")]
async fn the_agent_reclaims_the_idle_gpu_process_of_a_lent_notebook(pool: PgPool) {
    // An idle window of five samples (a second), ended unwarned: the PRD's minutes
    // and the warning are the agent's own tests' business; here the whole chain is.
    let lab = Lab::start_with(
        pool.clone(),
        a100_lab().agent(|cfg| {
            cfg.policy.idle.idle_minutes = 0;
            cfg.policy.idle.idle_samples = 5;
            cfg.reclaim_warning = TimeDelta::zero();
        }),
    )
    .await;
    let (pod, pid) = lent_notebook(&lab, BOB).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let node = node_of(&pod).unwrap().to_owned();

    on_node_eventually(
        &lab,
        "the agent never ended the idle GPU process of bob's lent notebook",
        || lab.sim.gpu_process(BOB).is_none() && !alive(pid),
    )
    .await;
    lab.expect(
        "the agent ended the process but recorded no GPUProcessesReclaimed Event on the pod",
        |s| {
            s.list::<Event>(Some(NOTEBOOK_NAMESPACE)).iter().any(|e| {
                e.reason.as_deref() == Some("GPUProcessesReclaimed")
                    && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
            })
        },
    )
    .await;

    // The pod itself is untouched: same pod, same node, still holding its card.
    let after = lab.notebook(BOB).expect("bob's notebook is still there");
    assert_eq!(
        after.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "idle reclaim must end GPU processes, never the pod"
    );
    assert!(is_running(&after), "bob's notebook no longer runs");
    assert_eq!(node_of(&after), Some(node.as_str()));
    assert_eq!(gpus(&after), 1);
    assert!(
        last_activity(&after).is_some(),
        "the agent never reported bob's last GPU activity: {:?}",
        after.metadata.annotations
    );

    // The audit log has the kill, with the evidence, from the agent.
    let row = eventually(|| async {
        let row: Option<(String, Option<String>, serde_json::Value)> = sqlx::query_as(
            "SELECT action, user_name, details FROM audit_event WHERE action = 'agent.reclaim' AND subject = $1",
        )
        .bind(format!("{NOTEBOOK_NAMESPACE}/{}", pod_name(BOB)))
        .fetch_optional(&pool)
        .await
        .expect("the audit log answers");
        row.ok_or_else(|| {
            "the agent's reclaim never reached the booking service's audit log".to_owned()
        })
    })
    .await;
    assert_eq!(
        row.1.as_deref(),
        Some(BOB),
        "the audit row does not name the user"
    );
    assert!(
        row.2.to_string().contains(&pid.to_string()),
        "the audit row does not carry the process it ended: {}",
        row.2
    );
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn the_lent_notebook_idle_longest_gives_way_to_a_booked_user(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_lab()).await;
    // Bob spawns first and works on his GPU; carol spawns later and leaves hers idle.
    let (bob, _) = lent_notebook(&lab, BOB).await;
    assert!(
        lab.sim.set_gpu_util(BOB, 80),
        "bob's kernel is not on a card"
    );
    let (carol, _) = lent_notebook(&lab, CAROL).await;
    lab.wait_in_use("a100", 2).await;
    let started = |p: &Pod| p.status.as_ref().and_then(|s| s.start_time.clone());
    assert!(
        started(&bob) <= started(&carol),
        "the scenario needs bob's notebook to be the older one"
    );
    let (bob_uid, carol_uid) = (bob.metadata.uid.unwrap(), carol.metadata.uid.unwrap());

    // The agent reports bob active after carol's last activity.
    lab.expect(
        "the agent never reported bob's busy GPU as more recently active than carol's idle one",
        |s| {
            let at = |user| {
                s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(user))
                    .as_ref()
                    .and_then(last_activity)
            };
            matches!((at(BOB), at(CAROL)), (Some(b), Some(c)) if b > c)
        },
    )
    .await;

    lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    lab.sim.spawn(ALICE, 1).await.expect("admitted");
    lab.expect(
        "alice's booked notebook never got a card back from the lent pods (see why below)",
        |s| running(s, ALICE).is_some_and(|p| on_gpu(&p)),
    )
    .await;
    lab.expect(
        "carol's idle notebook was not the one recreated CPU-only",
        |s| {
            s.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(CAROL))
                .is_some_and(|p| p.metadata.uid.as_ref() != Some(&carol_uid) && gpus(&p) == 0)
        },
    )
    .await;
    let bob_now = lab.notebook(BOB).expect("bob's notebook");
    assert!(
        bob_now.metadata.uid.as_ref() == Some(&bob_uid) && on_gpu(&bob_now) && is_running(&bob_now),
        "bob, busy on his GPU, lost it although carol's was idle longer:\n{}",
        serde_json::to_string_pretty(&lab.sim.view()).unwrap()
    );
    lab.shutdown().await;
}

/// The reasons of the Events on the pod with `uid`.
fn events_on(s: &FakeApiServer, uid: &str) -> Vec<String> {
    s.list::<Event>(Some(NOTEBOOK_NAMESPACE))
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid))
        .filter_map(|e| e.reason)
        .collect()
}

#[sqlx::test(migrations = "./migrations")]
async fn a_booked_users_idle_kernel_is_kept_while_a_lent_users_is_warned_then_reclaimed(
    pool: PgPool,
) {
    // The chart's agent settings (booked pods spared, a warning first) with a warning
    // of a second and an idle window of five samples.
    let lab = Lab::start_with(
        pool,
        a100_lab()
            .rendered_chart(chart(&["agent.reclaimWarning=1s"]))
            .agent(|cfg| {
                cfg.policy.idle.idle_minutes = 0;
                cfg.policy.idle.idle_samples = 5;
            }),
    )
    .await;
    // Alice books an A100 and spawns first; her kernel waits for her from the start.
    lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    let alice = lab.sim.spawn(ALICE, 1).await.expect("admitted");
    assert_eq!(
        label(&alice, PRIORITY_LABEL),
        Some("high"),
        "alice is booked"
    );
    lab.expect("alice's booked notebook never ran on a GPU", |s| {
        running(s, ALICE).is_some_and(|p| on_gpu(&p))
    })
    .await;
    on_node_eventually(&lab, "alice's booked kernel is not on the card", || {
        lab.sim.gpu_process(ALICE).is_some()
    })
    .await;
    let alice_pid = lab.sim.gpu_process(ALICE).unwrap();
    let alice_uid = lab.notebook(ALICE).and_then(|p| p.metadata.uid).unwrap();

    // Bob is lent the other card and leaves it idle too, for less time than alice.
    let (bob, bob_pid) = lent_notebook(&lab, BOB).await;
    let bob_uid = bob.metadata.uid.clone().unwrap();
    lab.expect(
        "the agent never warned bob before reclaiming his idle kernel",
        |s| events_on(s, &bob_uid).contains(&"GPUReclaimWarning".to_owned()),
    )
    .await;
    on_node_eventually(
        &lab,
        "the agent never ended bob's idle kernel after its warning",
        || lab.sim.gpu_process(BOB).is_none() && !alive(bob_pid),
    )
    .await;
    lab.expect("bob's reclaim left no Event after the warning", |s| {
        events_on(s, &bob_uid) == ["GPUReclaimWarning", "GPUProcessesReclaimed"]
    })
    .await;

    // Alice's kernel has been idle longer than bob's, and is hers: still on the card,
    // never warned, and still reported (its last GPU activity) for the usage report.
    assert!(
        alive(alice_pid) && lab.sim.gpu_process(ALICE) == Some(alice_pid),
        "the agent ended alice's booked kernel:\n{}",
        serde_json::to_string_pretty(&lab.sim.view()).unwrap_or_default()
    );
    let alice_events = events_on(&lab.sim.server, &alice_uid);
    assert!(
        alice_events.is_empty(),
        "alice's booked pod got {alice_events:?}"
    );
    let alice_now = lab.notebook(ALICE).expect("alice's notebook");
    assert!(
        last_activity(&alice_now).is_some(),
        "the agent stopped reporting alice's GPU activity: {:?}",
        alice_now.metadata.annotations
    );
    lab.shutdown().await;
}
