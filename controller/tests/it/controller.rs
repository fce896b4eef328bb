//! The controller against the fake API server and a fake booking service, on tokio's
//! paused clock: timers fire at their virtual time, nothing sleeps for real.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use gpu_booking_controller::OnExpiry;
use gpu_booking_fake_apiserver::{Failure, PodDeletion, Verb};
use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Value};

fn containers(pod: &Value) -> Vec<&Value> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|l| pod["spec"][l].as_array().into_iter().flatten())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn expiry_on_time_recreates_without_gpu() {
    let h = Harness::new();
    node(
        &h.server,
        "gpu-1",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 2)],
    );
    let end = h.after(TimeDelta::hours(3));
    let mut spec = pod("jupyter-alice").gpu(1).on("gpu-1").booked_until(end);
    spec.0["spec"]["initContainers"] = json!([{"name": "init", "image": "busybox",
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
    let old = spec.put(&h.server);
    let old_uid = old.metadata.uid.clone().unwrap();
    let controller = h.start();

    h.until_deleting("jupyter-alice").await;
    let acted_at = h.now();
    assert!(acted_at >= end, "acted before the end: {acted_at}");
    assert!(
        acted_at - end < TimeDelta::seconds(1),
        "acted {:?} late",
        acted_at - end
    );
    // The name is reused only once the old pod is gone.
    h.run_for(Duration::from_secs(30)).await;
    assert_eq!(h.server.count(Verb::Create, "pods"), 0);
    assert!(h.server.pod_gone(NS, "jupyter-alice"));
    h.until_replaced("jupyter-alice", &old_uid).await;

    let new = h.pod_json("jupyter-alice").unwrap();
    for c in containers(&new) {
        let resources = c["resources"].to_string();
        assert!(
            !resources.contains("nvidia.com/gpu") && !resources.contains("gpumem"),
            "{resources}"
        );
        assert!(c["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"})));
    }
    assert_eq!(
        new["spec"]["containers"][0]["resources"]["limits"]["cpu"],
        "2"
    );
    assert!(new["spec"].get("nodeName").is_none());
    assert!(new["spec"].get("priorityClassName").is_none());
    assert_eq!(
        new["status"]["phase"], "Pending",
        "a fresh pod, not the old status"
    );
    let labels = new["metadata"]["labels"].as_object().unwrap();
    assert!(
        labels.keys().all(|k| !k.starts_with("gpu-booking")),
        "{labels:?}"
    );
    assert_eq!(labels["app"], "jupyterhub");
    let annotations = new["metadata"]["annotations"].as_object().unwrap();
    assert!(annotations.get("terminate-at").is_none());
    assert_eq!(annotations["hub.jupyter.org/username"], "alice");
    assert!(annotations["gpu-booking.io/gpu-removed"]
        .as_str()
        .unwrap()
        .contains("booking ended"));

    // An event on the old and on the new pod, an audit row, metrics.
    h.wait_booking(|s| !s.audits.is_empty()).await;
    let audit = h.booking.state().audits[0].clone();
    assert_eq!(audit.action, "controller.expire");
    assert_eq!(audit.subject.as_deref(), Some("jhub/jupyter-alice"));
    assert_eq!(
        (audit.user.as_deref(), audit.booking_id),
        (Some("alice"), Some(7))
    );
    assert_eq!(audit.details["result"], "recreated");
    let events = h
        .server
        .requests()
        .into_iter()
        .filter(|r| r.plural == "events" && r.verb == Verb::Create)
        .count();
    assert!(events >= 2, "events: {events}");
    assert_eq!(controller.metrics.action_count("expire", "recreated"), 1);
    let text = controller.metrics.encode();
    assert!(
        text.contains("gpu_booking_controller_expiry_lag_seconds_count 1"),
        "{text}"
    );
}

/// A model with its own resource (a MIG profile, `nvidia.com/mig-1g.5gb`) is known
/// from the booking service, not from the options: the action that ends a booked
/// pod of it reads the same learned configuration as the loop that saw it, so the
/// pod is ended at its time and its CPU-only copy asks for none of the profile.
#[tokio::test(start_paused = true)]
async fn a_models_own_resource_is_stripped_from_the_cpu_only_copy() {
    let h = Harness::new();
    node(&h.server, "mig-1", None, &[("nvidia.com/mig-1g.5gb", 7)]);
    let end = h.after(TimeDelta::hours(1));
    let mut spec = pod("jupyter-alice")
        .resource("nvidia.com/mig-1g.5gb", 1)
        .on("mig-1")
        .booked_until(end);
    spec.0["metadata"]["labels"]["gpu-booking.io/model"] = json!("mig-1g.5gb");
    spec.0["spec"]["nodeSelector"] = json!({});
    let old_uid = spec.put(&h.server).metadata.uid.unwrap();
    let _controller = h.start();
    h.until_deleting("jupyter-alice").await;
    assert!(h.server.pod_gone(NS, "jupyter-alice"));
    h.until_replaced("jupyter-alice", &old_uid).await;
    let copy = h.pod_json("jupyter-alice").unwrap();
    for c in containers(&copy) {
        let resources = c["resources"].to_string();
        assert!(!resources.contains("mig-1g.5gb"), "{resources}");
    }
}

#[tokio::test(start_paused = true)]
async fn expired_while_down_is_handled_at_start_and_after_a_restart() {
    let h = Harness::new();
    pod("expired-before")
        .gpu(1)
        .on("gpu-1")
        .booked_until(h.now() - TimeDelta::minutes(10))
        .put(&h.server);
    let first = h.start();
    h.until_deleting("expired-before").await;
    assert!(h.now() - t0() < TimeDelta::seconds(1));
    h.server.pod_gone(NS, "expired-before");
    h.wait(|s| s.count(Verb::Create, "pods") == 1).await;

    // Stopped; a pod expires meanwhile; the next controller ends it as it starts.
    let end = h.after(TimeDelta::minutes(5));
    let down = pod("expires-while-down")
        .gpu(1)
        .on("gpu-1")
        .booked_until(end)
        .put(&h.server);
    drop(first);
    h.run_for(Duration::from_secs(600)).await;
    assert!(h
        .pod("expires-while-down")
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());
    let restart = h.now();
    let _second = h.start();
    h.until_deleting("expires-while-down").await;
    assert!(
        h.now() - restart < TimeDelta::seconds(1),
        "{:?}",
        h.now() - restart
    );
    h.server.pod_gone(NS, "expires-while-down");
    h.until_replaced("expires-while-down", down.metadata.uid.as_deref().unwrap())
        .await;
}

#[tokio::test(start_paused = true)]
async fn owned_pods_are_only_deleted() {
    let h = Harness::new();
    pod("sts-0")
        .gpu(1)
        .on("gpu-1")
        .booked_until(h.after(TimeDelta::minutes(1)))
        .owned_by_statefulset()
        .put(&h.server);
    let controller = h.start();
    h.until_deleting("sts-0").await;
    h.server.pod_gone(NS, "sts-0");
    h.wait_booking(|s| !s.audits.is_empty()).await;
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.server.count(Verb::Create, "pods"), 0);
    assert!(h.pod("sts-0").is_none());
    assert_eq!(controller.metrics.action_count("expire", "deleted"), 1);
}

#[tokio::test(start_paused = true)]
async fn on_expiry_delete_and_demote() {
    let h = Harness {
        args: {
            let mut a = Harness::new().args;
            a.on_expiry = OnExpiry::Delete;
            a
        },
        ..Harness::new()
    };
    h.server.set_pod_deletion(PodDeletion::Immediate);
    pod("d")
        .gpu(1)
        .on("gpu-1")
        .booked_until(h.after(TimeDelta::minutes(1)))
        .put(&h.server);
    let c = h.start();
    h.wait(|s| s.count(Verb::Delete, "pods") == 1).await;
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(h.server.count(Verb::Create, "pods"), 0);
    assert_eq!(c.metrics.action_count("expire", "deleted"), 1);

    let mut h = Harness::new();
    h.args.on_expiry = OnExpiry::Demote;
    h.server.set_pod_deletion(PodDeletion::Immediate);
    let old = pod("m")
        .gpu(1)
        .on("gpu-1")
        .booked_until(h.after(TimeDelta::minutes(1)))
        .put(&h.server);
    let c = h.start();
    // A pod's priority cannot change: it is created again as a lent pod.
    h.until_replaced("m", old.metadata.uid.as_deref().unwrap())
        .await;
    let p = h.pod_json("m").unwrap();
    assert_eq!(p["metadata"]["labels"]["gpu-booking.io/priority"], "low");
    assert_eq!(p["metadata"]["labels"]["gpu-booking.io/model"], "a100");
    assert!(p["metadata"]["annotations"].get("terminate-at").is_none());
    assert!(p["metadata"]["labels"]
        .get("gpu-booking.io/booking")
        .is_none());
    assert_eq!(p["spec"]["priorityClassName"], "gpu-booking-low");
    assert!(p["spec"].get("priority").is_none() && p["spec"].get("nodeName").is_none());
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1",
        "keeps its GPU"
    );
    assert_eq!(h.server.count(Verb::Delete, "pods"), 1);
    assert_eq!(c.metrics.action_count("expire", "demoted"), 1);
    assert!(h.events_on("m").iter().any(|e| e.contains("as a lent pod")));
    // As a lent pod it gives way to a booked pod like any other.
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    node(
        &h.server,
        "gpu-1",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 1)],
    );
    h.server
        .modify::<k8s_openapi::api::core::v1::Pod>(Some(NS), "m", |p| {
            p["spec"]["nodeName"] = json!("gpu-1");
            p["status"] = json!({"phase": "Running"});
        });
    let uid = h.pod("m").unwrap().metadata.uid.unwrap();
    h.until_replaced("m", &uid).await;
    assert_eq!(c.metrics.eviction_count("a100", "booked_pod_pending"), 1);
}

/// Two models, three a100 units all taken; a booked user asks for an a100.
fn busy_cluster(h: &Harness) {
    node(
        &h.server,
        "a100-node",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 3)],
    );
    node(
        &h.server,
        "a6000-node",
        Some("NVIDIA-RTX-A6000"),
        &[("nvidia.com/gpu", 2)],
    );
    let day = |d: i64| t0() - TimeDelta::days(d);
    pod("booked-oldest")
        .gpu(1)
        .on("a100-node")
        .high_priority("a100")
        .started(day(9))
        .put(&h.server);
    pod("low-old")
        .gpu(1)
        .on("a100-node")
        .low_priority("a100")
        .started(day(5))
        .put(&h.server);
    pod("low-new")
        .gpu(1)
        .on("a100-node")
        .low_priority("a100")
        .started(day(1))
        .put(&h.server);
    pod("low-other-model")
        .gpu(1)
        .on("a6000-node")
        .low_priority("a6000")
        .started(day(8))
        .put(&h.server);
}

#[tokio::test(start_paused = true)]
async fn one_pending_booked_pod_ends_exactly_the_least_recently_used_lent_pod() {
    let h = Harness::new();
    busy_cluster(&h);
    // low-old started first but was on its GPU an hour ago; low-new has been idle
    // since yesterday: the agent's report decides, not the start.
    h.server
        .modify::<k8s_openapi::api::core::v1::Pod>(Some(NS), "low-old", |p| {
            p["metadata"]["annotations"]["gpu-booking.io/last-gpu-activity"] =
                json!(rfc3339(t0() - TimeDelta::hours(1)));
        });
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    let c = h.start();
    h.until_deleting("low-new").await;
    // While it terminates nothing else goes (150 rounds; within --gone-timeout, so
    // that the copy is still made).
    h.run_for(Duration::from_secs(300)).await;
    assert_eq!(h.deletes(), 1, "one victim only");
    for untouched in ["booked-oldest", "low-old", "low-other-model", "jupyter-bob"] {
        let p = h.pod(untouched).unwrap();
        assert!(p.metadata.deletion_timestamp.is_none(), "{untouched}");
    }
    // Gone: its CPU-only copy comes; the booked pod has its unit, nothing more goes.
    let uid = h.pod("low-new").unwrap().metadata.uid.unwrap();
    h.server.pod_gone(NS, "low-new");
    h.until_replaced("low-new", &uid).await;
    assert!(!h.pod_json("low-new").unwrap()["spec"]
        .to_string()
        .contains("nvidia.com/gpu"));
    h.run_for(Duration::from_secs(600)).await;
    assert_eq!(h.deletes(), 1);
    assert_eq!(c.metrics.action_count("preempt", "recreated"), 1);
    assert_eq!(c.metrics.eviction_count("a100", "booked_pod_pending"), 1);
    assert!(c.metrics.encode().contains(
        "gpu_booking_controller_evictions_total{model=\"a100\",reason=\"booked_pod_pending\"} 1"
    ));
    // Events on both pods, an audit row for the victim.
    let on_booked = h.events_on("jupyter-bob");
    assert!(
        on_booked
            .iter()
            .any(|e| e.starts_with("PreemptingForBooking")
                && e.contains("jhub/low-new")
                && e.contains("round 1 of 3")),
        "{on_booked:?}"
    );
    let on_victim = h.events_on("low-new");
    assert!(
        on_victim
            .iter()
            .any(|e| e.starts_with("PreemptedForBooking") && e.contains("jhub/jupyter-bob")),
        "{on_victim:?}"
    );
    let audits = h.booking.state().audits.clone();
    let row = audits
        .iter()
        .find(|a| a.action == "controller.preempt")
        .unwrap();
    assert_eq!(row.subject.as_deref(), Some("jhub/low-new"));
    assert_eq!(row.details["model"], "a100");
    assert_eq!(row.details["for"], "jhub/jupyter-bob");
}

/// After the victim is gone, another lent pod takes the unit before the scheduler
/// places the booked pod.
fn grab_the_unit(h: &Harness, name: &str) {
    pod(name)
        .gpu(1)
        .on("a100-node")
        .low_priority("a100")
        .started(h.now())
        .last_gpu_activity(h.now())
        .put(&h.server);
}

#[tokio::test(start_paused = true)]
async fn a_second_round_only_once_the_victim_is_gone_and_the_pod_still_waits() {
    let h = Harness::new();
    busy_cluster(&h);
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    let c = h.start();
    h.until_deleting("low-old").await;
    h.server.pod_gone(NS, "low-old");
    grab_the_unit(&h, "grabber");
    // Not before --preemption-retry (60 s) has passed since the first round.
    h.run_for(Duration::from_secs(30)).await;
    assert_eq!(h.deletes(), 1);
    h.until_deleting("low-new").await;
    assert_eq!(h.deletes(), 2);
    assert!(h
        .pod("grabber")
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());
    assert_eq!(c.metrics.eviction_count("a100", "booked_pod_pending"), 1);
}

#[tokio::test(start_paused = true)]
async fn preemption_rounds_are_bounded() {
    let mut h = Harness::new();
    h.args.preemption_attempts = 2;
    h.server.set_pod_deletion(PodDeletion::Immediate);
    busy_cluster(&h);
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    let c = h.start();
    // Every unit freed is taken by someone else at once.
    for (round, grabber) in ["g1", "g2", "g3"].iter().enumerate() {
        if round < 2 {
            h.wait(|s| s.count(Verb::Delete, "pods") as usize == round + 1)
                .await;
        }
        grab_the_unit(&h, grabber);
        h.run_for(Duration::from_secs(3600)).await;
    }
    assert_eq!(h.deletes(), 2, "two rounds, then it gives up");
    assert_eq!(c.metrics.action_count("preempt", "gave_up"), 1);
    let on_booked = h.events_on("jupyter-bob");
    assert!(
        on_booked.iter().any(|e| e.starts_with("PreemptionGaveUp")),
        "{on_booked:?}"
    );
}

/// The rounds are recorded on the booked pod before their evictions: a controller
/// that starts (a new leader) goes on from them instead of starting over.
#[tokio::test(start_paused = true)]
async fn preemption_rounds_recorded_on_the_pod_count_for_the_next_leader() {
    for (recorded, more) in [(None, 2), (Some("1"), 1), (Some("2"), 0), (Some("junk"), 2)] {
        let mut h = Harness::new();
        h.args.preemption_attempts = 2;
        h.server.set_pod_deletion(PodDeletion::Immediate);
        busy_cluster(&h);
        pod("jupyter-bob")
            .gpu(1)
            .booked_pending("a100")
            .put(&h.server);
        if let Some(n) = recorded {
            h.server
                .modify::<k8s_openapi::api::core::v1::Pod>(Some(NS), "jupyter-bob", |p| {
                    p["metadata"]["annotations"]["gpu-booking.io/preemption-rounds"] = json!(n);
                });
        }
        let c = h.start();
        for grabber in ["g1", "g2", "g3"] {
            h.run_for(Duration::from_secs(3600)).await;
            grab_the_unit(&h, grabber);
        }
        h.run_for(Duration::from_secs(3600)).await;
        assert_eq!(h.deletes(), more, "{recorded:?}: rounds left");
        assert_eq!(
            c.metrics.action_count("preempt", "gave_up"),
            1,
            "{recorded:?}"
        );
        if more > 0 {
            let booked = h.pod_json("jupyter-bob").unwrap();
            assert_eq!(
                booked["metadata"]["annotations"]["gpu-booking.io/preemption-rounds"], "2",
                "{recorded:?}: each round is written on the pod"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn no_victim_on_another_model() {
    let h = Harness::new();
    node(
        &h.server,
        "a100-node",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 1)],
    );
    node(
        &h.server,
        "a6000-node",
        Some("NVIDIA-RTX-A6000"),
        &[("nvidia.com/gpu", 1)],
    );
    pod("booked-a100")
        .gpu(1)
        .on("a100-node")
        .high_priority("a100")
        .put(&h.server);
    pod("lent-a6000")
        .gpu(1)
        .on("a6000-node")
        .low_priority("a6000")
        .put(&h.server);
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    let c = h.start();
    h.run_for(Duration::from_secs(600)).await;
    assert_eq!(h.deletes(), 0);
    assert_eq!(c.metrics.action_count("preempt", "no_victim"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_free_unit_means_no_preemption() {
    let h = Harness::new();
    node(
        &h.server,
        "a100-node",
        Some("A100-PCIE-40GB"),
        &[("nvidia.com/gpu", 2)],
    );
    pod("low")
        .gpu(1)
        .on("a100-node")
        .low_priority("a100")
        .put(&h.server);
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    let _c = h.start();
    h.run_for(Duration::from_secs(600)).await;
    assert_eq!(h.deletes(), 0);
}

#[tokio::test(start_paused = true)]
async fn scheduler_preempted_pods_are_recreated_without_gpu() {
    let h = Harness::new();
    let victim = pod("lent")
        .gpu(1)
        .on("gpu-1")
        .low_priority("a100")
        .preempted_by_scheduler()
        .put(&h.server);
    pod("not-ours")
        .gpu(1)
        .on("gpu-1")
        .preempted_by_scheduler()
        .put(&h.server);
    let c = h.start();
    h.until_deleting("lent").await;
    h.server.pod_gone(NS, "lent");
    h.until_replaced("lent", victim.metadata.uid.as_deref().unwrap())
        .await;
    assert!(!h.pod_json("lent").unwrap()["spec"]
        .to_string()
        .contains("nvidia.com/gpu"));
    h.run_for(Duration::from_secs(10)).await;
    assert!(
        h.pod("not-ours")
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "pods without our label are the scheduler's business"
    );
    assert_eq!(
        c.metrics.action_count("scheduler_preempted", "recreated"),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn inventory_of_several_models_and_mig_is_reported_and_nodes_labelled() {
    let h = Harness::new();
    node(
        &h.server,
        "a1",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 4)],
    );
    node(
        &h.server,
        "a2",
        Some("A100-PCIE-40GB"),
        &[("nvidia.com/gpu", 2)],
    );
    node(
        &h.server,
        "r1",
        Some("NVIDIA-RTX-A6000"),
        &[("nvidia.com/gpu", 8)],
    );
    node(&h.server, "m1", None, &[("nvidia.com/mig-1g.5gb", 7)]);
    node(&h.server, "cpu", None, &[("cpu", 16)]);
    pod("p1").gpu(2).on("a1").put(&h.server);
    pod("p2").gpu(1).on("a2").put(&h.server);
    pod("p3")
        .resource("nvidia.com/mig-1g.5gb", 2)
        .on("m1")
        .put(&h.server);
    pod("waiting").gpu(1).pending_unschedulable().put(&h.server);
    let mut done = pod("done").gpu(1).on("r1");
    done.0["status"]["phase"] = json!("Succeeded");
    done.put(&h.server);
    let _c = h.start();
    h.wait_booking(|s| s.usage.len() == 3).await;
    let usage = h.booking.state().usage.clone();
    let counted = |m: &str| (usage[m].in_use, usage[m].cards);
    assert_eq!(counted("a100"), (3, Some(6)));
    assert_eq!(counted("a6000"), (0, Some(8)));
    assert_eq!(counted("mig-1g.5gb"), (2, Some(7)));
    let label = |n: &str| {
        h.server.get::<Node>(None, n).and_then(|n| {
            n.metadata
                .labels
                .and_then(|l| l.get("gpu-booking.io/model").cloned())
        })
    };
    h.wait(|_| label("m1").is_some() && label("a1").is_some())
        .await;
    assert_eq!(label("a1").as_deref(), Some("a100"));
    assert_eq!(label("a2").as_deref(), Some("a100"));
    assert_eq!(label("r1").as_deref(), Some("a6000"));
    assert_eq!(label("m1").as_deref(), Some("mig-1g.5gb"));
    assert_eq!(label("cpu"), None);

    // Unchanged usage is re-sent every 5 s (the webhook's lend ledger waits for a
    // report newer than what it admitted), not at every tick: 3 models, 10 s.
    let calls = h.booking.state().usage_calls;
    h.run_for(Duration::from_secs(10)).await;
    let resent = h.booking.state().usage_calls - calls;
    assert!((3..=12).contains(&resent), "{resent} reports in 10 s");
    // A change is pushed at once.
    pod("p4").gpu(1).on("r1").put(&h.server);
    h.wait_booking(|s| s.usage["a6000"].in_use == 1).await;
}

#[tokio::test(start_paused = true)]
async fn dry_run_changes_nothing() {
    let mut h = Harness::new();
    h.args.dry_run = true;
    busy_cluster(&h);
    pod("expired")
        .gpu(1)
        .on("a100-node")
        .booked_until(h.now() - TimeDelta::minutes(1))
        .put(&h.server);
    pod("jupyter-bob")
        .gpu(1)
        .high_priority("a100")
        .pending_unschedulable()
        .put(&h.server);
    let c = h.start();
    h.run_for(Duration::from_secs(120)).await;
    for verb in [
        Verb::Create,
        Verb::Delete,
        Verb::Patch,
        Verb::DeleteCollection,
    ] {
        let writes: Vec<_> = h
            .server
            .requests()
            .into_iter()
            .filter(|r| r.verb == verb && r.plural != "leases")
            .collect();
        assert!(writes.is_empty(), "{verb:?}: {writes:?}");
    }
    let updates = h
        .server
        .requests()
        .into_iter()
        .filter(|r| r.verb == Verb::Update && r.plural != "leases")
        .count();
    assert_eq!(updates, 0);
    let state = h.booking.state();
    assert!(state.audits.is_empty() && state.usage_calls == 0);
    assert!(c.metrics.action_count("expire", "dry_run") >= 1);
    assert!(c.metrics.action_count("preempt", "dry_run") >= 1);
}

#[tokio::test(start_paused = true)]
async fn losing_the_lease_stops_actions_at_once() {
    let h = Harness::new();
    h.server.set_pod_deletion(PodDeletion::Immediate);
    let c = h.start();
    h.wait(|s| s.count(Verb::Create, "leases") == 1).await;
    tokio::task::yield_now().await;
    assert!(c.leadership.is_leader());

    // Another replica takes the Lease over (as if ours had expired).
    h.server
        .modify::<k8s_openapi::api::coordination::v1::Lease>(
            Some("default"),
            "gpu-booking-controller",
            |l| {
                l["spec"]["holderIdentity"] = json!("controller-1");
                l["spec"]["renewTime"] = json!(rfc3339(t0() + TimeDelta::days(1)));
            },
        );
    pod("booked")
        .gpu(1)
        .on("gpu-1")
        .booked_until(h.after(TimeDelta::seconds(30)))
        .put(&h.server);
    h.run_for(Duration::from_secs(120)).await;
    assert!(!c.leadership.is_leader());
    assert!(c
        .metrics
        .encode()
        .contains("gpu_booking_controller_is_leader 0"));
    assert_eq!(h.server.count(Verb::Delete, "pods"), 0);

    // Renewals that fail: acting stops at the renew deadline, before anyone may take over.
    let h = Harness::new();
    let c = h.start();
    h.wait(|s| s.count(Verb::Create, "leases") == 1).await;
    h.server.fail(Failure {
        verb: None,
        plural: Some("leases".into()),
        name: None,
        code: 503,
        times: None,
    });
    pod("booked")
        .gpu(1)
        .on("gpu-1")
        .booked_until(h.after(TimeDelta::seconds(20)))
        .put(&h.server);
    h.run_for(Duration::from_secs(60)).await;
    assert!(!c.leadership.is_leader());
    assert_eq!(h.server.count(Verb::Delete, "pods"), 0);
    // Back: the Lease is ours again (nobody else took it) and the overdue pod ends.
    h.server.clear_failures();
    h.until_deleting("booked").await;
}

/// A time-sliced card (4 replicas, 48 GiB of VRAM budget): the least recently used
/// lent pod is small and may stay beside the booked pod; the big one goes.
#[tokio::test(start_paused = true)]
async fn a_small_tenant_of_a_time_sliced_card_coexists_with_the_booked_pod() {
    let mut h = Harness::new();
    // The node's budget is given here as the test writes it (no GFD memory label):
    // the controller must not advertise over it.
    h.args.advertise_gpumem = false;
    node(
        &h.server,
        "sliced",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 4), ("gpu-booking.io/gpumem", 49_152)],
    );
    pod("small-idle")
        .gpu(1)
        .resource("gpu-booking.io/gpumem", 8_192)
        .on("sliced")
        .low_priority("a100")
        .last_gpu_activity(t0() - TimeDelta::days(2))
        .put(&h.server);
    pod("big-busy")
        .gpu(1)
        .resource("gpu-booking.io/gpumem", 36_864)
        .on("sliced")
        .low_priority("a100")
        .last_gpu_activity(t0() - TimeDelta::minutes(5))
        .put(&h.server);
    pod("jupyter-bob")
        .gpu(1)
        .resource("gpu-booking.io/gpumem", 16_384)
        .booked_pending("a100")
        .put(&h.server);
    let c = h.start();
    h.until_deleting("big-busy").await;
    h.run_for(Duration::from_secs(300)).await;
    assert_eq!(h.deletes(), 1);
    assert!(h
        .pod("small-idle")
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());
    assert_eq!(c.metrics.action_count("preempt", "no_victim"), 0);
}

/// The annotations of a marked victim: its deadline and the booked pod.
fn mark_of(h: &Harness, name: &str) -> (Option<String>, Option<String>) {
    let pod = h.pod(name).expect("the pod is there");
    let annotations = pod.metadata.annotations.unwrap_or_default();
    (
        annotations.get("gpu-booking.io/preempt-at").cloned(),
        annotations.get("gpu-booking.io/preempt-for").cloned(),
    )
}

/// The busy cluster, a booked pod waiting for an a100, and two minutes' warning.
fn graced_cluster() -> Harness {
    let mut h = Harness::new();
    h.args.preemption_grace = Duration::from_secs(120);
    busy_cluster(&h);
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    h
}

/// Until `name` carries the mark (or no longer does).
async fn until_marked(h: &Harness, name: &str, marked: bool) {
    h.wait(|s| {
        s.get::<k8s_openapi::api::core::v1::Pod>(Some(NS), name)
            .and_then(|p| p.metadata.annotations)
            .is_some_and(|a| a.contains_key("gpu-booking.io/preempt-at") == marked)
    })
    .await;
}

/// With `--preemption-grace`, the victim is marked (its deadline on it, a Warning
/// Event, an audit row that notices its user) and ended at the deadline, not before.
#[tokio::test(start_paused = true)]
async fn a_lent_pod_is_warned_then_ended_at_its_deadline() {
    let h = graced_cluster();
    let _c = h.start();
    until_marked(&h, "low-old", true).await;
    let (at, for_whom) = mark_of(&h, "low-old");
    let at: DateTime<Utc> = at.unwrap().parse().unwrap();
    assert!(at > h.now() + TimeDelta::seconds(100), "{at}");
    assert_eq!(for_whom.as_deref(), Some("jhub/jupyter-bob"));
    let events = h.events_on("low-old");
    assert!(
        events.iter().any(|e| e.starts_with("GpuTakenBackSoon")),
        "{events:?}"
    );
    assert!(h
        .booking
        .state()
        .audits
        .iter()
        .any(|a| a.action == "controller.preempt_warned"
            && a.subject.as_deref() == Some("jhub/low-old")));
    // Only as many as needed: low-new is neither marked nor ended.
    assert_eq!(mark_of(&h, "low-new"), (None, None));
    h.run_for(Duration::from_secs(90)).await;
    assert_eq!(h.deletes(), 0, "ended before its deadline");
    h.until_deleting("low-old").await;
    assert!(h.now() >= at, "ended at {} before {at}", h.now());
    assert_eq!(h.deletes(), 1);
    assert_eq!(mark_of(&h, "low-new"), (None, None));
}

/// A victim its booked pod no longer needs (the booked pod stopped) is unmarked and
/// told, and keeps its GPU.
#[tokio::test(start_paused = true)]
async fn a_marked_pod_no_longer_needed_is_unmarked() {
    let h = graced_cluster();
    let c = h.start();
    until_marked(&h, "low-old", true).await;
    h.server.pod_gone(NS, "jupyter-bob");
    until_marked(&h, "low-old", false).await;
    assert_eq!(mark_of(&h, "low-old"), (None, None));
    let events = h.events_on("low-old");
    assert!(
        events.iter().any(|e| e.starts_with("GpuKept")),
        "{events:?}"
    );
    h.run_for(Duration::from_secs(600)).await;
    assert_eq!(h.deletes(), 0, "a victim no longer needed was ended");
    assert_eq!(c.metrics.action_count("preempt", "unmarked"), 1);
}

/// A victim chosen in one round is kept for its booked pod in the next, before the
/// watch shows its mark: a second booked pod that comes meanwhile, and comes first in
/// the round's order, gets a victim of its own. Here the mark on bob's victim fails
/// (4 failed patches, beyond the retries), so the watch never shows it; carol, older
/// than bob and pending a round later, gets the other lent pod, not the one chosen
/// for bob (which left bob without a victim until his next round, a minute on, and
/// a second warning).
#[tokio::test(start_paused = true)]
async fn a_victim_chosen_but_not_yet_marked_is_not_chosen_again() {
    let h = graced_cluster();
    h.server
        .fail(Failure::on(Verb::Patch, "pods").named("low-old").times(4));
    let _c = h.start();
    h.wait(|s| {
        s.get::<k8s_openapi::api::core::v1::Pod>(Some(NS), "jupyter-bob")
            .and_then(|p| p.metadata.annotations)
            .is_some_and(|a| {
                a.get("gpu-booking.io/preemption-rounds")
                    .map(String::as_str)
                    == Some("1")
            })
    })
    .await;
    // The mark's four attempts (200 + 500 + 1,000 ms apart) are spent.
    h.run_for(Duration::from_secs(3)).await;
    assert_eq!(mark_of(&h, "low-old"), (None, None), "the mark was written");
    pod("jupyter-carol")
        .gpu(1)
        .booked_pending("a100")
        .started(t0() - TimeDelta::days(1))
        .put(&h.server);
    until_marked(&h, "low-new", true).await;
    assert_eq!(
        mark_of(&h, "low-new").1.as_deref(),
        Some("jhub/jupyter-carol")
    );
    assert_eq!(
        mark_of(&h, "low-old"),
        (None, None),
        "bob's victim taken for carol"
    );
}

/// The deadline is on the pod: a controller that starts (a new leader) ends a marked
/// victim then, not at once and not a grace later.
#[tokio::test(start_paused = true)]
async fn a_new_leader_honours_a_recorded_deadline() {
    let h = graced_cluster();
    let deadline = h.now() + TimeDelta::seconds(60);
    h.server
        .modify::<k8s_openapi::api::core::v1::Pod>(Some(NS), "low-new", |p| {
            p["metadata"]["annotations"]["gpu-booking.io/preempt-at"] = json!(rfc3339(deadline));
            p["metadata"]["annotations"]["gpu-booking.io/preempt-for"] = json!("jhub/jupyter-bob");
        });
    let _c = h.start();
    h.run_for(Duration::from_secs(30)).await;
    assert_eq!(h.deletes(), 0, "ended before the recorded deadline");
    // The mark's room counts as coming: no second victim is chosen meanwhile.
    assert_eq!(mark_of(&h, "low-old"), (None, None));
    h.until_deleting("low-new").await;
    assert!(h.now() >= deadline);
    assert!(h.now() < deadline + TimeDelta::seconds(30), "a grace later");
    assert_eq!(h.deletes(), 1);
}

/// Lent pods the scheduler cannot place for want of a GPU are a gauge (the alert on
/// the webhook lending GPUs that are not free reads it), whatever else waits.
#[tokio::test(start_paused = true)]
async fn lent_pods_pending_on_gpu_are_counted() {
    let mut h = Harness::new();
    // Long enough that nothing is recreated while the test looks.
    h.args.lent_pending_grace = Duration::from_secs(3600);
    node(
        &h.server,
        "a100-node",
        Some("A100-PCIE-40GB"),
        &[("nvidia.com/gpu", 1)],
    );
    let mut lent = pod("lent")
        .gpu(1)
        .low_priority("a100")
        .pending_unschedulable();
    lent.0["status"]["conditions"][0]["message"] =
        json!("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.");
    lent.put(&h.server);
    // Pending for another reason, and a booked pod waiting: neither counts.
    pod("elsewhere")
        .gpu(1)
        .low_priority("a100")
        .pending_unschedulable()
        .put(&h.server);
    pod("jupyter-bob")
        .gpu(1)
        .booked_pending("a100")
        .put(&h.server);
    let c = h.start();
    h.wait(|_| c.metrics.lent_pods_pending.get() == 1).await;
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(c.metrics.lent_pods_pending.get(), 1);
    assert!(
        c.metrics
            .encode()
            .contains("gpu_booking_controller_lent_pods_pending 1"),
        "the gauge's name"
    );
    h.server
        .remove::<k8s_openapi::api::core::v1::Pod>(Some(NS), "lent");
    h.wait(|_| c.metrics.lent_pods_pending.get() == 0).await;
}
