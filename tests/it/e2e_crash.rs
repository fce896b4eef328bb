//! A two-step action survives the controller's crash.
//!
//! Six booked notebooks end at once; the controller (replica A, holding the Lease) is
//! killed as SIGKILL kills it ([`Controller::kill`]: its loop, its election and every
//! action in flight stop where they are, the Lease is not given up), once between its
//! deletes and its re-creates and once before its deletes. Replica B takes the Lease
//! when it runs out, finds the recorded intents and finishes each action exactly once:
//! every notebook comes back CPU-only, one create per pod, no intent left.
//!
//! [`Controller::kill`]: gpu_booking_controller::Controller::kill

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::TimeDelta;
use common::{gpus, label, Lab};
use gpu_booking_controller::intent::INTENT_LABEL;
use gpu_booking_controller::{ControllerArgs, OnExpiry};
use gpu_booking_fake_apiserver::{Failure, FakeApiServer, Verb};
use gpu_booking_sim::spawner::{pod_name, NOTEBOOK_NAMESPACE};
use gpu_booking_sim::{GpuNode, SimCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use sqlx::PgPool;

/// Where the replicas keep their Lease and their intents: the release's namespace,
/// as the chart sets it.
const CONTROLLER_NAMESPACE: &str = gpu_booking_sim::rendered::RELEASE_NAMESPACE;
/// Long enough that replica A is surely killed while the pods terminate.
const GRACE: i64 = 4;

/// Short Lease times, so the successor takes over within seconds.
fn replica(identity: &'static str) -> impl FnOnce(&mut ControllerArgs) + Send + 'static {
    move |args| {
        common::leader_elected(identity)(args);
        args.preemption_interval = Duration::from_millis(200);
    }
}

const USERS: [(&str, &str); 6] = [
    ("ada@example.com", "a100"),
    ("ben@example.com", "a100"),
    ("cai@example.com", "a6000"),
    ("dee@example.com", "a6000"),
    ("eli@example.com", "a6000"),
    ("fay@example.com", "a6000"),
];

fn intents(server: &FakeApiServer) -> Vec<ConfigMap> {
    server
        .list::<ConfigMap>(Some(CONTROLLER_NAMESPACE))
        .into_iter()
        .filter(|cm| {
            cm.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(INTENT_LABEL))
        })
        .collect()
}

fn notebook(server: &FakeApiServer, user: &str) -> Option<Pod> {
    server.get::<Pod>(Some(NOTEBOOK_NAMESPACE), &pod_name(user))
}

/// Six booked notebooks, running, whose bookings end in a few seconds; their uids.
async fn six_booked_notebooks(lab: &Lab) -> BTreeMap<&'static str, String> {
    for (user, model) in USERS {
        lab.book(user, model, TimeDelta::seconds(8)).await;
    }
    let mut uids = BTreeMap::new();
    for (user, _) in USERS {
        let pod = lab.sim.spawn(user, 1).await.expect("the hub spawns");
        assert_eq!(
            label(&pod, "gpu-booking.io/priority"),
            Some("high"),
            "{user}"
        );
        uids.insert(user, pod.metadata.uid.clone().unwrap());
    }
    lab.expect("every booked notebook runs", |s| {
        USERS.iter().all(|(u, _)| common::running(s, u).is_some())
    })
    .await;
    uids
}

/// Every notebook is back, CPU-only, a new pod, and no intent is left; exactly one
/// create per notebook since `creates_before`.
async fn each_recreated_once(
    lab: &Lab,
    originals: &BTreeMap<&'static str, String>,
    creates_before: u64,
) {
    lab.expect(
        "the successor re-created every notebook CPU-only and removed the intents",
        |s| {
            intents(s).is_empty()
                && originals.iter().all(|(user, uid)| {
                    common::running(s, user).is_some_and(|p| {
                        p.metadata.uid.as_deref() != Some(uid.as_str()) && gpus(&p) == 0
                    })
                })
        },
    )
    .await;
    let creates = lab.sim.server.count(Verb::Create, "pods") - creates_before;
    assert_eq!(creates, USERS.len() as u64, "one create per notebook");
    for (user, _) in USERS {
        let pod = notebook(&lab.sim.server, user).unwrap();
        assert_eq!(label(&pod, "gpu-booking.io/priority"), None, "{user}");
        assert!(
            common::annotation(&pod, "gpu-booking.io/gpu-removed").is_some(),
            "{user}"
        );
    }
}

async fn lab(pool: PgPool) -> Lab {
    Lab::start_with(
        pool,
        SimCluster::builder()
            .notebook_grace_period(GRACE)
            .controller(replica("replica-a")),
    )
    .await
}

#[sqlx::test(migrations = "./migrations")]
async fn killed_between_the_deletes_and_the_recreates(pool: PgPool) {
    let lab = lab(pool).await;
    let originals = six_booked_notebooks(&lab).await;
    // The bookings end: A records six intents and deletes the six pods; while they
    // terminate (A waits to re-create them), A dies.
    lab.expect(
        "replica A deleted every expired notebook after recording it",
        |s| {
            intents(s).len() == USERS.len()
                && USERS.iter().all(|(u, _)| {
                    notebook(s, u).is_some_and(|p| p.metadata.deletion_timestamp.is_some())
                })
        },
    )
    .await;
    lab.sim.controller.kill();
    let creates_before = lab.sim.server.count(Verb::Create, "pods");
    // The pods finish terminating with nobody to re-create them...
    lab.expect("the expired notebooks are gone", |s| {
        USERS.iter().all(|(u, _)| notebook(s, u).is_none())
    })
    .await;
    assert_eq!(intents(&lab.sim.server).len(), USERS.len());
    // ... until B leads.
    let b = lab
        .sim
        .start_replica("replica-b", replica("replica-b"))
        .unwrap();
    each_recreated_once(&lab, &originals, creates_before).await;
    assert!(b.leadership.is_leader());
    drop(b);
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn killed_before_the_deletes(pool: PgPool) {
    let lab = lab(pool).await;
    let originals = six_booked_notebooks(&lab).await;
    // Every pod delete fails for now: A records its intents and cannot take the
    // first step; then it dies.
    lab.sim.server.fail(Failure {
        verb: Some(Verb::Delete),
        plural: Some("pods".into()),
        name: None,
        code: 503,
        times: None,
    });
    lab.expect(
        "replica A recorded an intent for each expired notebook",
        |s| intents(s).len() == USERS.len(),
    )
    .await;
    lab.sim.controller.kill();
    lab.sim.server.clear_failures();
    let creates_before = lab.sim.server.count(Verb::Create, "pods");
    for (user, uid) in &originals {
        let pod = notebook(&lab.sim.server, user).unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some(uid.as_str()), "{user}");
        assert!(pod.metadata.deletion_timestamp.is_none(), "{user}");
    }
    // B ends each original first, then re-creates it.
    let b = lab
        .sim
        .start_replica("replica-b", replica("replica-b"))
        .unwrap();
    each_recreated_once(&lab, &originals, creates_before).await;
    drop(b);
    lab.shutdown().await;
}

/// A lab whose only GPU node holds two A100s, and controller replicas set by `mode`.
fn a100_lab(mode: OnExpiry) -> gpu_booking_sim::SimBuilder {
    SimCluster::builder()
        .nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 2, 40960),
            GpuNode::cpu_only("cpu-0"),
        ])
        .notebook_grace_period(GRACE)
        .controller(replica("replica-a"))
        .controller(move |args| args.on_expiry = mode)
}

fn terminating(server: &FakeApiServer, user: &str) -> bool {
    notebook(server, user).is_some_and(|p| p.metadata.deletion_timestamp.is_some())
}

/// `--on-expiry demote`: A is killed between the delete and the lent copy; B creates
/// the lent copy, once, and the webhook admits it as the controller decided: no usage
/// report was sent while no replica led, so the last one (and the webhook's lend
/// ledger) still count the original's a100, and a copy decided from the free count
/// would lose its GPU ("no free GPU").
#[sqlx::test(migrations = "./migrations")]
async fn demote_killed_between_the_delete_and_the_lent_copy(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_lab(OnExpiry::Demote)).await;
    let user = "ada@example.com";
    lab.book(user, "a100", TimeDelta::seconds(6)).await;
    let original = lab.sim.spawn(user, 1).await.expect("the hub spawns");
    assert_eq!(label(&original, "gpu-booking.io/priority"), Some("high"));
    lab.expect("replica A recorded the demotion and deleted the pod", |s| {
        intents(s).len() == 1 && terminating(s, user)
    })
    .await;
    lab.sim.controller.kill();
    let creates_before = lab.sim.server.count(Verb::Create, "pods");
    let b = lab
        .sim
        .start_replica("replica-b", |args| {
            replica("replica-b")(args);
            args.on_expiry = OnExpiry::Demote;
        })
        .unwrap();
    lab.expect("B created the lent copy and removed the intent", |s| {
        intents(s).is_empty()
            && common::running(s, user).is_some_and(|p| {
                p.metadata.uid != original.metadata.uid
                    && label(&p, "gpu-booking.io/priority") == Some("low")
                    && gpus(&p) == 1
            })
    })
    .await;
    assert_eq!(
        lab.sim.server.count(Verb::Create, "pods") - creates_before,
        1
    );
    drop(b);
    lab.shutdown().await;
}

/// A lent pod preempted for a booked one: A is killed between the victim's delete and
/// its CPU-only copy; B makes the copy once and ends no second lent pod.
#[sqlx::test(migrations = "./migrations")]
async fn preemption_killed_between_the_delete_and_the_copy(pool: PgPool) {
    let lab = Lab::start_with(pool, a100_lab(OnExpiry::RecreateCpu)).await;
    let lent = ["bob@example.com", "carol@example.com"];
    for user in lent {
        let pod = lab.sim.spawn(user, 1).await.expect("admitted");
        assert_eq!(
            label(&pod, "gpu-booking.io/priority"),
            Some("low"),
            "{user}"
        );
    }
    lab.expect("both lent notebooks run", |s| {
        lent.iter().all(|u| common::running(s, u).is_some())
    })
    .await;
    lab.wait_in_use("a100", 2).await;
    let uids: Vec<String> = lent
        .iter()
        .map(|u| lab.notebook(u).unwrap().metadata.uid.unwrap())
        .collect();
    lab.book("alice@example.com", "a100", TimeDelta::hours(2))
        .await;
    lab.sim
        .spawn("alice@example.com", 1)
        .await
        .expect("admitted");
    lab.expect(
        "replica A recorded the preemption and deleted one lent pod",
        |s| intents(s).len() == 1 && lent.iter().any(|u| terminating(s, u)),
    )
    .await;
    lab.sim.controller.kill();
    let creates_before = lab.sim.server.count(Verb::Create, "pods");
    let victim = lent
        .into_iter()
        .find(|u| terminating(&lab.sim.server, u))
        .unwrap();
    let spared = lent.into_iter().find(|u| *u != victim).unwrap();
    let b = lab
        .sim
        .start_replica("replica-b", replica("replica-b"))
        .unwrap();
    lab.expect(
        "B re-created the victim CPU-only and alice's booked notebook got the card",
        |s| {
            intents(s).is_empty()
                && common::running(s, victim).is_some_and(|p| {
                    !uids.contains(p.metadata.uid.as_ref().unwrap()) && gpus(&p) == 0
                })
                && common::running(s, "alice@example.com").is_some_and(|p| gpus(&p) == 1)
        },
    )
    .await;
    assert_eq!(
        lab.sim.server.count(Verb::Create, "pods") - creates_before,
        1
    );
    let other = notebook(&lab.sim.server, spared).unwrap();
    assert!(
        uids.contains(other.metadata.uid.as_ref().unwrap()) && gpus(&other) == 1,
        "no second lent pod was ended"
    );
    drop(b);
    lab.shutdown().await;
}

/// "A bounded number of attempts", across a change of leader: A
/// spends the only preemption round it is allowed for alice's booked pod (the round
/// is recorded on her pod; its eviction cannot start, since no intent can be
/// written) and gives up; A is killed; B, allowed one round too, reads the round on
/// the pod and gives up as well: no lent pod is ended. (Counted in memory, B would
/// start a round of its own and end one.)
#[sqlx::test(migrations = "./migrations")]
async fn preemption_rounds_survive_a_change_of_leader(pool: PgPool) {
    let one_round = |args: &mut ControllerArgs| {
        args.preemption_attempts = 1;
        args.preemption_retry = Duration::from_millis(300);
    };
    let lab = Lab::start_with(pool, a100_lab(OnExpiry::RecreateCpu).controller(one_round)).await;
    let lent = ["bob@example.com", "carol@example.com"];
    for user in lent {
        let pod = lab.sim.spawn(user, 1).await.expect("admitted");
        assert_eq!(
            label(&pod, "gpu-booking.io/priority"),
            Some("low"),
            "{user}"
        );
    }
    lab.expect("both lent notebooks run", |s| {
        lent.iter().all(|u| common::running(s, u).is_some())
    })
    .await;
    lab.wait_in_use("a100", 2).await;
    // No intent can be recorded: a round's evictions fail before their first step.
    lab.sim.server.fail(Failure {
        verb: Some(Verb::Create),
        plural: Some("configmaps".into()),
        name: None,
        code: 503,
        times: None,
    });
    let alice = "alice@example.com";
    lab.book(alice, "a100", TimeDelta::hours(2)).await;
    lab.sim.spawn(alice, 1).await.expect("admitted");
    let a = &lab.sim.controller;
    lab.expect(
        "replica A recorded its round on alice's pod and gave up",
        |s| {
            notebook(s, alice).is_some_and(|p| {
                common::annotation(&p, "gpu-booking.io/preemption-rounds") == Some("1")
            }) && a.metrics.action_count("preempt", "gave_up") == 1
        },
    )
    .await;
    a.kill();
    lab.sim.server.clear_failures();
    let deletes_before = lab.sim.server.count(Verb::Delete, "pods");
    let b = lab
        .sim
        .start_replica("replica-b", |args| {
            replica("replica-b")(args);
            one_round(args);
        })
        .unwrap();
    lab.expect("replica B read the round on the pod and gave up", |_| {
        b.metrics.action_count("preempt", "gave_up") == 1
    })
    .await;
    assert!(b.leadership.is_leader());
    assert_eq!(
        lab.sim.server.count(Verb::Delete, "pods") - deletes_before,
        0,
        "B ended a lent pod: its attempts started over"
    );
    for user in lent {
        assert!(!terminating(&lab.sim.server, user), "{user}");
    }
    assert!(intents(&lab.sim.server).is_empty());
    let pod = notebook(&lab.sim.server, alice).unwrap();
    assert!(pod.spec.unwrap().node_name.is_none(), "alice still waits");
    drop(b);
    lab.shutdown().await;
}
