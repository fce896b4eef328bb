//! What the agent adds to the PRD's idle reclaim, on a fake node with the agent's own
//! defaults: a booked pod's idle kernel is its user's (kept, still reported idle), a
//! lent pod is warned before its processes end and activity withdraws the warning,
//! and the signals go in the configured order, each after the grace.

use crate::common;

use common::*;
use gpu_booking_agent::action::ActionKind;
use gpu_booking_agent::cluster::EventKind;
use gpu_booking_agent::signal_policy::SignalSequence;

const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;
const LAST_ACTIVITY: &str = "gpu-booking.io/last-gpu-activity";

/// The reasons of the Events recorded on `pod` (`namespace/name`), in order.
fn events_on(node: &Node, pod: &str) -> Vec<String> {
    node.cluster
        .events()
        .into_iter()
        .filter(|(key, _)| key == pod)
        .map(|(_, e)| e.reason)
        .collect()
}

#[tokio::test]
async fn a_booked_pods_idle_kernel_is_kept_while_a_lent_ones_is_reclaimed_after_a_warning() {
    let pods = vec![
        pod("jhub", "alice", 1).booked().build(),
        pod("jhub", "bob", 2).lent().build(),
        // Calls itself booked, without our class: lent, as the controller sees it.
        pod("jhub", "mallory", 3)
            .label("gpu-booking.io/priority", "high")
            .build(),
    ];
    let mut node = Node::new(our_defaults(), pods);
    let alice = node.sleeper(1, 0, 0, 2_000);
    let bob = node.sleeper(2, 0, 0, 2_000);
    let mallory = node.sleeper(3, 0, 1, 2_000);

    for report in node.ticks(0, 29).await {
        assert!(report.actions.is_empty() && report.warned.is_empty());
    }
    // Minute 30 (08:30): all three idle for the whole window; the lent two are warned.
    let report = node.tick(30).await;
    assert_eq!(report.idle_candidates, 2, "the booked pod is no candidate");
    assert_eq!(report.warned, ["jhub/bob", "jhub/mallory"]);
    assert!(report.actions.is_empty(), "warned, not yet reclaimed");
    let (_, warning) = node
        .cluster
        .events()
        .into_iter()
        .find(|(key, _)| key == "jhub/bob")
        .expect("bob is warned");
    assert_eq!(
        (warning.kind, warning.reason.as_str()),
        (EventKind::Warning, "GPUReclaimWarning")
    );
    for words in [
        "Idle since 08:00 UTC",
        "no GPU activity for 30 minutes",
        "end at 08:35 UTC unless it uses the GPU",
        &format!("{bob} sleep in notebook"),
        "keeps running",
    ] {
        assert!(
            warning.note.contains(words),
            "{words:?} in {}",
            warning.note
        );
    }

    // The warning period: nothing ends.
    for report in node.ticks(31, 34).await {
        assert!(report.actions.is_empty() && report.warned.is_empty());
    }
    assert!(node.running(bob) && node.running(mallory));
    // Minute 35: still idle, so they end, with an interrupt first.
    let report = node.tick(35).await;
    let ended: Vec<&str> = report.actions.iter().map(|a| a.pod.as_str()).collect();
    assert_eq!(ended, ["jhub/bob", "jhub/mallory"]);
    for a in &report.actions {
        assert_eq!((a.kind, a.result), (ActionKind::IdleReclaim, "success"));
        assert_eq!(a.kills[0].signals, ["INT"], "a sleep ends at SIGINT");
        assert_eq!(a.details["warned_at"], "2027-01-15T08:30:00Z");
    }
    assert_eq!(node.ended_by(bob).await, Some(SIGINT));
    assert_eq!(node.ended_by(mallory).await, Some(SIGINT));
    assert_eq!(
        events_on(&node, "jhub/bob"),
        ["GPUReclaimWarning", "GPUProcessesReclaimed"]
    );

    // Alice's booked kernel stays, however long it idles, and is never warned ...
    for report in node.ticks(36, 90).await {
        assert!(report.actions.is_empty() && report.warned.is_empty());
    }
    assert!(node.running(alice), "a booked kernel is its user's");
    assert!(events_on(&node, "jhub/alice").is_empty());
    assert!(node
        .audit
        .records()
        .iter()
        .all(|r| r.user.as_deref() != Some("user-alice")));
    // ... and is still reported idle since 08:00, for the usage report and the nudge.
    let alice_annotations: Vec<String> = node
        .cluster
        .annotations()
        .into_iter()
        .filter(|(pod, key, _)| pod == "jhub/alice" && key == LAST_ACTIVITY)
        .map(|(_, _, value)| value)
        .collect();
    assert_eq!(alice_annotations, ["2027-01-15T08:00:00Z"]);
    assert_eq!(
        metric(
            &node.metrics_text(),
            r#"gpu_booking_agent_pod_gpu_idle_seconds{namespace="jhub",pod="alice"}"#
        ),
        Some(90.0 * 60.0)
    );
    // When she uses the GPU, the annotation follows.
    node.gpu.set_process_util(alice, 40);
    node.tick(91).await;
    assert_eq!(
        node.cluster
            .annotations()
            .last()
            .map(|(p, _, v)| (p.as_str(), v.as_str())),
        Some(("jhub/alice", "2027-01-15T09:31:00Z"))
    );
}

#[tokio::test]
async fn booked_pods_are_reclaimed_when_the_lab_says_so() {
    let mut cfg = config();
    cfg.policy.reclaim_booked_pods = true;
    let mut node = Node::new(cfg, vec![pod("jhub", "alice", 1).booked().build()]);
    let alice = node.sleeper(1, 0, 0, 2_000);
    let report = node.ticks(0, 30).await.pop().unwrap();
    assert_eq!(report.actions.len(), 1, "{report:?}");
    assert_eq!(node.ended_by(alice).await, Some(SIGTERM));
}

#[tokio::test]
async fn the_vram_watchdog_still_holds_a_booked_pod_to_its_budget() {
    let mut cfg = our_defaults();
    cfg.vram_dry_run = false;
    let mut node = Node::new(
        cfg,
        vec![pod("jhub", "alice", 1).booked().budget(2_000).build()],
    );
    let alice = node.sleeper(1, 0, 0, 15_000);
    node.gpu.set_process_util(alice, 60);
    // 16000 - 15000 = 1000 MiB free, under the floor; alice 13000 MiB over budget.
    let report = node.tick(0).await;
    assert_eq!(report.actions.len(), 1, "{report:?}");
    assert_eq!(report.actions[0].kind, ActionKind::VramRecycle);
    assert!(report.warned.is_empty(), "the watchdog does not warn");
    assert_eq!(node.ended_by(alice).await, Some(SIGINT));
}

#[tokio::test]
async fn activity_withdraws_the_warning_and_a_later_idle_window_warns_again() {
    let mut node = Node::new(our_defaults(), vec![pod("jhub", "bob", 2).lent().build()]);
    let bob = node.sleeper(2, 0, 0, 2_000);
    let reports = node.ticks(0, 30).await;
    assert_eq!(reports[30].warned, ["jhub/bob"]);
    node.tick(31).await;
    // Minute 32: bob runs a cell on the GPU; his warning is withdrawn.
    node.gpu.set_process_util(bob, 70);
    let report = node.tick(32).await;
    assert_eq!(report.withdrawn, ["jhub/bob"]);
    node.gpu.set_process_util(bob, 0);
    // No reclaim at the first warning's end, nor before a new warning.
    for report in node.ticks(33, 61).await {
        assert!(report.actions.is_empty() && report.warned.is_empty());
    }
    assert!(node.running(bob));
    // Idle again for a whole window (from 08:32): warned again, reclaimed 5 minutes on.
    let report = node.tick(62).await;
    assert_eq!(report.warned, ["jhub/bob"]);
    let (_, warning) = node.cluster.events().pop().unwrap();
    assert!(
        warning.note.contains("Idle since 08:32 UTC") && warning.note.contains("end at 09:07 UTC"),
        "{}",
        warning.note
    );
    for report in node.ticks(63, 66).await {
        assert!(report.actions.is_empty());
    }
    assert_eq!(node.tick(67).await.actions.len(), 1);
    assert_eq!(node.ended_by(bob).await, Some(SIGINT));
    assert_eq!(
        events_on(&node, "jhub/bob"),
        [
            "GPUReclaimWarning",
            "GPUReclaimWarning",
            "GPUProcessesReclaimed"
        ]
    );
}

#[tokio::test]
async fn no_reclaim_before_the_warning_is_recorded() {
    let mut node = Node::new(our_defaults(), vec![pod("jhub", "bob", 2).lent().build()]);
    let bob = node.sleeper(2, 0, 0, 2_000);
    node.ticks(0, 29).await;
    // The API server is down when the window ends: no warning, so no countdown.
    node.cluster.set_failing(true);
    for report in node.ticks(30, 40).await {
        assert!(report.actions.is_empty() && report.warned.is_empty());
    }
    node.cluster.set_failing(false);
    assert_eq!(node.tick(41).await.warned, ["jhub/bob"]);
    for report in node.ticks(42, 45).await {
        assert!(report.actions.is_empty());
    }
    assert_eq!(node.tick(46).await.actions.len(), 1);
    assert!(!node.running(bob));
}

#[tokio::test]
async fn a_dry_run_warns_nobody_and_reports_at_the_end_of_the_window() {
    let mut cfg = our_defaults();
    cfg.policy.idle.dry_run = true;
    let mut node = Node::new(cfg, vec![pod("jhub", "bob", 2).lent().build()]);
    let bob = node.sleeper(2, 0, 0, 2_000);
    let report = node.ticks(0, 30).await.pop().unwrap();
    assert!(report.warned.is_empty());
    assert_eq!(report.actions[0].result, "dry_run");
    assert_eq!(events_on(&node, "jhub/bob"), ["GPUReclaimDryRun"]);
    assert!(node.running(bob));
}

#[tokio::test]
async fn signals_go_in_order_each_after_the_grace() {
    let mut cfg = our_defaults();
    cfg.reclaim_warning = chrono::TimeDelta::zero();
    let pods = vec![
        pod("jhub", "deaf-to-int", 4).lent().build(),
        pod("jhub", "deaf-to-both", 5).lent().build(),
    ];
    let mut node = Node::new(cfg, pods);
    let one = node.spawn_in(
        &["sh", "-c", "trap '' INT; exec sleep 60"],
        0,
        &cgroup(0, &uid(4), &cid(4)),
        1_000,
    );
    let both = node.spawn_in(
        &["sh", "-c", "trap '' INT TERM; exec sleep 60"],
        1,
        &cgroup(0, &uid(5), &cid(5)),
        1_000,
    );
    wait_for_exec(one, "sleep").await;
    wait_for_exec(both, "sleep").await;
    let report = node.ticks(0, 30).await.pop().unwrap();
    let signals = |pod: &str| {
        let a = report.actions.iter().find(|a| a.pod == pod).unwrap();
        assert_eq!(a.result, "success", "{a:?}");
        a.kills[0].signals.clone()
    };
    assert_eq!(signals("jhub/deaf-to-int"), ["INT", "TERM"]);
    assert_eq!(signals("jhub/deaf-to-both"), ["INT", "TERM", "KILL"]);
    assert_eq!(node.ended_by(one).await, Some(SIGTERM));
    assert_eq!(node.ended_by(both).await, Some(SIGKILL));
    let text = node.metrics_text();
    for (signal, sent) in [("INT", 2.0), ("TERM", 2.0), ("KILL", 1.0)] {
        assert_eq!(
            metric(
                &text,
                &format!(r#"gpu_booking_agent_kill_total{{signal="{signal}"}}"#)
            ),
            Some(sent),
            "{signal}"
        );
    }
    let (_, event) = node
        .cluster
        .events()
        .into_iter()
        .find(|(pod, _)| pod == "jhub/deaf-to-both")
        .unwrap();
    assert!(
        event.note.contains("(SIGINT, SIGTERM, SIGKILL)"),
        "{}",
        event.note
    );
}

#[tokio::test]
async fn a_sequence_of_the_labs_own() {
    let mut cfg = config();
    cfg.reclaim_signals = SignalSequence::parse("USR1,KILL").unwrap();
    let mut node = Node::new(cfg, vec![pod("jhub", "trainer", 6).lent().build()]);
    let pid = node.spawn_in(
        &["sh", "-c", "trap '' USR1; exec sleep 60"],
        0,
        &cgroup(0, &uid(6), &cid(6)),
        1_000,
    );
    wait_for_exec(pid, "sleep").await;
    let report = node.ticks(0, 30).await.pop().unwrap();
    assert_eq!(report.actions[0].kills[0].signals, ["USR1", "KILL"]);
    assert_eq!(node.ended_by(pid).await, Some(SIGKILL));
}
