//! The PRD's acceptance criteria (section 13) and the ADR's watchdog, on a fake node:
//! scripted fake GPU, fake /proc tree, fake cluster; real child processes where
//! signals are sent. Ticks carry explicit times a minute apart, so a 30-minute window
//! takes 31 calls and no waiting.

use crate::common;

use common::*;
use gpu_booking_agent::action::ActionKind;
use gpu_booking_agent::cluster::EventKind;
use gpu_booking_agent::fake_gpu::{FakeGpu, FakeStep};
use gpu_booking_agent::gpu::GpuSampler;
use gpu_booking_agent::reclaim_policy::NamespacePolicy;
use serde_json::Value;

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

#[tokio::test]
async fn ac1_idle_pod_is_reclaimed_after_the_window_and_its_memory_freed() {
    let pods = vec![pod("jhub", "jupyter-alice", 1).build()];
    let mut node = Node::new(config(), pods);
    let pid = node.sleeper(1, 0, 0, 2_000);

    // Minutes 0..29: idle, but not for the whole window yet.
    for report in node.ticks(0, 29).await {
        assert!(report.actions.is_empty());
        assert_eq!(report.pods, vec!["jhub/jupyter-alice".to_owned()]);
    }
    assert!(node.running(pid));
    // Minute 30: idle for 30 minutes and 30 consecutive samples.
    let report = node.tick(30).await;
    assert_eq!(report.idle_candidates, 1);
    assert_eq!(report.actions.len(), 1, "{report:?}");
    let action = &report.actions[0];
    assert_eq!(action.kind, ActionKind::IdleReclaim);
    assert_eq!(action.result, "success");
    assert_eq!(action.pids, vec![pid]);
    assert_eq!(action.kills[0].signals, vec!["TERM"]);
    assert_eq!(action.freed_bytes, 2_000 * 1024 * 1024);
    assert_eq!(node.ended_by(pid).await, Some(SIGTERM));
    assert!(!node.gpu.holds(pid), "NVML no longer lists it");
    // What `--once` prints.
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["actions"][0]["result"], "success");
    assert_eq!(json["actions"][0]["kind"], "idle_reclaim");
    let free = node.gpu.sample().unwrap()[0].memory_free_bytes / (1024 * 1024);
    assert_eq!(free, GPU_MIB, "its memory is free for others");

    // AC-3: the pod is still there (the agent has no call that deletes pods).
    let events = node.cluster.events();
    assert_eq!(events.len(), 1);
    let (key, event) = &events[0];
    assert_eq!(key, "jhub/jupyter-alice");
    assert_eq!(event.kind, EventKind::Warning);
    assert_eq!(event.reason, "GPUProcessesReclaimed");
    assert!(event.note.contains("2000 MiB"), "{}", event.note);
    assert!(event.note.contains("30 minutes"), "{}", event.note);

    // The audit row carries the evidence.
    let records = node.audit.records();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.action, "agent.reclaim");
    assert_eq!(r.subject.as_deref(), Some("jhub/jupyter-alice"));
    assert_eq!(r.user.as_deref(), Some("user-jupyter-alice"));
    let d = &r.details;
    assert_eq!(d["result"], "success");
    assert_eq!(d["reason"], "idle");
    assert_eq!(d["idle_minutes"], 30.0);
    assert_eq!(d["idle_samples"], 30);
    assert_eq!(d["util_samples"].as_array().map(Vec::len), Some(30));
    assert_eq!(d["freed_mib"], 2000);
    assert_eq!(d["node"], "gpu-node-1");
    let p = &d["processes"][0];
    assert_eq!(p["pid"], pid);
    assert_eq!(p["cmdline"], "sleep 60");
    assert_eq!(p["container"], "notebook");
    assert_eq!(p["container_id"], cid(1));
    assert_eq!(p["used_mib"], 2000);
    assert_eq!(d["signals"][0]["signals"][0], "TERM");

    let text = node.metrics_text();
    assert_eq!(
        metric(
            &text,
            r#"gpu_booking_agent_reclaim_total{result="success",reason="idle"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, r#"gpu_booking_agent_kill_total{signal="TERM"}"#),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "gpu_booking_agent_pid_attribution_fail_total"),
        Some(0.0)
    );

    // The next round finds nothing to do and forgets the pod's series.
    let report = node.tick(31).await;
    assert!(report.actions.is_empty() && report.pods.is_empty());
    let text = node.metrics_text();
    assert!(
        !text.contains("gpu_booking_agent_pod_gpu_memory_used_bytes{"),
        "{text}"
    );
}

#[tokio::test]
async fn ac4_dry_run_sends_no_signal_and_reports_the_same_evidence() {
    let run = |dry_run: bool| async move {
        let mut cfg = config();
        cfg.policy.idle.dry_run = dry_run;
        let mut node = Node::new(cfg, vec![pod("jhub", "jupyter-bob", 2).build()]);
        let pid = node.sleeper(2, 1, 1, 3_000);
        let reports = node.ticks(0, 30).await;
        let action = reports[30]
            .actions
            .first()
            .cloned()
            .expect("an action at minute 30");
        let alive = node.running(pid);
        let records = node.audit.records();
        (action, alive, records, node.cluster.events(), pid)
    };
    let (dry, dry_alive, dry_records, dry_events, dry_pid) = run(true).await;
    let (real, real_alive, real_records, _, _) = run(false).await;
    assert_eq!(real.result, "success");

    assert_eq!(dry.result, "dry_run");
    assert!(dry.kills.is_empty());
    assert!(dry_alive, "dry run sends no signal");
    assert!(!real_alive);
    assert_eq!(dry_records[0].action, "agent.reclaim_dry_run");
    assert_eq!(dry_events[0].1.reason, "GPUReclaimDryRun");
    assert!(dry_events[0].1.note.contains("Nothing was done"));

    // The same evidence: every field of the real run's row, with the same values
    // except the process's own PID and what only an action has.
    let (d, r) = (&dry_records[0].details, &real_records[0].details);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(d), keys(r));
    for field in [
        "reason",
        "idle_minutes",
        "idle_samples",
        "util_samples",
        "util_threshold_percent",
        "window_minutes",
        "used_mib",
        "pod_ns",
        "pod_name",
        "pod_uid",
        "node",
        "last_activity",
    ] {
        assert_eq!(d[field], r[field], "{field}");
    }
    let (dp, rp) = (&d["processes"][0], &r["processes"][0]);
    assert_eq!(dp["pid"], dry_pid);
    for field in [
        "cmdline",
        "container",
        "container_id",
        "gpu_index",
        "used_mib",
        "runtime",
    ] {
        assert_eq!(dp[field], rp[field], "{field}");
    }
    assert_eq!(d["dry_run"], true);
    assert_eq!(r["dry_run"], false);
}

#[tokio::test]
async fn dry_run_reports_again_once_per_window() {
    let mut cfg = config();
    cfg.policy.idle.dry_run = true;
    let mut node = Node::new(cfg, vec![pod("jhub", "jupyter-bob", 2).build()]);
    node.sleeper(2, 1, 0, 3_000);
    let reports = node.ticks(0, 61).await;
    let at: Vec<usize> = reports
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.actions.is_empty())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at, vec![30, 60]);
}

#[tokio::test]
async fn ac5_busy_and_opted_out_pods_are_never_touched() {
    let pods = vec![
        pod("jhub", "busy", 3).build(),
        pod("jhub", "opted-out", 4)
            .annotation("gpu-reclaimer/enabled", "false")
            .build(),
        pod("ml-prod", "allowlisted-label", 5)
            .label("gpu-booking.io/critical", "true")
            .build(),
        pod("kube-system", "system", 6).build(),
    ];
    let mut cfg = config();
    cfg.policy.label_allowlist =
        vec![
            gpu_booking_agent::reclaim_policy::LabelMatch::parse("gpu-booking.io/critical=true")
                .unwrap(),
        ];
    let mut node = Node::new(cfg, pods);
    let busy = node.sleeper(3, 2, 0, 4_000);
    let opted_out = node.sleeper(4, 3, 0, 2_000);
    let labelled = node.sleeper(5, 0, 1, 1_000);
    let system = node.sleeper(6, 1, 1, 1_000);
    // Busy now and then: short bursts every 10 minutes reset the count.
    for m in 0..=95 {
        node.gpu
            .set_process_util(busy, if m % 10 == 0 { 35 } else { 0 });
        let report = node.tick(m).await;
        assert!(
            report.actions.is_empty(),
            "minute {m}: {:?}",
            report.actions
        );
        assert_eq!(report.idle_candidates, 0, "minute {m}");
    }
    for pid in [busy, opted_out, labelled, system] {
        assert!(node.running(pid), "{pid} untouched");
    }
    assert!(node.cluster.events().is_empty());
    assert!(node.audit.records().is_empty());
    assert!(node
        .metrics_text()
        .contains("gpu_booking_agent_idle_candidates 0"));
}

#[tokio::test]
async fn a_process_ignoring_sigterm_gets_sigkill() {
    let mut node = Node::new(config(), vec![pod("jhub", "stubborn", 7).build()]);
    let cg = cgroup(0, &uid(7), &cid(7));
    let pid = node.spawn_in(&["sh", "-c", "trap '' TERM; exec sleep 60"], 0, &cg, 5_000);
    wait_for_exec(pid, "sleep").await;
    let report = node.ticks(0, 30).await.pop().unwrap();
    let action = &report.actions[0];
    assert_eq!(action.result, "success", "{action:?}");
    assert_eq!(action.kills[0].signals, vec!["TERM", "KILL"]);
    assert_eq!(node.ended_by(pid).await, Some(SIGKILL));
    let text = node.metrics_text();
    assert_eq!(
        metric(&text, r#"gpu_booking_agent_kill_total{signal="TERM"}"#),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, r#"gpu_booking_agent_kill_total{signal="KILL"}"#),
        Some(1.0)
    );
    assert_eq!(
        node.audit.records()[0].details["signals"][0]["signals"][1],
        "KILL"
    );
}

#[tokio::test]
async fn unattributable_pids_are_counted_logged_and_left_alone() {
    let mut node = Node::new(config(), vec![pod("jhub", "known", 8).build()]);
    let host = node.spawn_in(
        &["sleep", "60"],
        0,
        "0::/system.slice/inference.service\n",
        1_000,
    );
    let pod_level = node.spawn_in(
        &["sleep", "60"],
        0,
        &format!("0::/kubepods/burstable/pod{}\n", uid(8)),
        1_000,
    );
    let stranger = node.sleeper(99, 0, 1, 1_000);
    let wrong_container =
        node.spawn_in(&["sleep", "60"], 1, &cgroup(1, &uid(8), &cid(1234)), 1_000);
    // A system daemon on the host: allowlisted by name, not an attribution failure.
    node.fake_process(
        4_000_000,
        &["/usr/bin/nvidia-persistenced", "--user", "nvidia"],
        0,
        "0::/system.slice/nvidia-persistenced.service\n",
        10,
    );
    let reports = node.ticks(0, 40).await;
    for r in &reports {
        assert!(r.actions.is_empty());
        assert_eq!(r.unattributed.len(), 4);
        assert_eq!(r.allowlisted_processes, 1);
    }
    let mut reasons: Vec<&str> = reports[0].unattributed.iter().map(|u| u.reason).collect();
    reasons.sort_unstable();
    assert_eq!(
        reasons,
        vec![
            "no_container",
            "not_in_pod",
            "unknown_container",
            "unknown_pod"
        ]
    );
    for pid in [host, pod_level, stranger, wrong_container] {
        assert!(node.running(pid));
    }
    let text = node.metrics_text();
    // Each process counted once, not once per round.
    assert_eq!(
        metric(&text, "gpu_booking_agent_pid_attribution_fail_total"),
        Some(4.0)
    );
    assert_eq!(
        metric(
            &text,
            r#"gpu_booking_agent_unattributed_processes{reason="unknown_pod"}"#
        ),
        Some(1.0)
    );
    // An unknown pod makes the agent list the pods again (at most every 10 s).
    assert!(node.cluster.lists() >= 41);
}

#[tokio::test]
async fn a_pod_created_after_the_last_list_is_found_by_listing_again() {
    let mut node = Node::new(config(), vec![]);
    node.tick(0).await;
    let pid = node.sleeper(9, 2, 0, 1_000);
    node.cluster.set_pods(vec![pod("jhub", "late", 9).build()]);
    // Ten seconds later: the pod list is not due, but the miss triggers a list.
    let report = node
        .agent
        .tick(node.at(0) + chrono::TimeDelta::seconds(10))
        .await;
    assert_eq!(report.pods, vec!["jhub/late".to_owned()]);
    assert!(report.unattributed.is_empty());
    assert!(node.running(pid));
}

#[tokio::test]
async fn the_recheck_spares_a_pod_that_wakes_up() {
    let mut node = Node::new(config(), vec![pod("jhub", "sleepy", 10).build()]);
    let pid = node.sleeper(10, 0, 0, 1_000);
    // Samples 1..31 are the rounds of minutes 0..30; sample 32 is the re-check.
    node.gpu
        .at_sample(32, FakeStep::SetProcessUtil { pid, percent: 80 });
    let report = node.ticks(0, 30).await.pop().unwrap();
    assert_eq!(report.idle_candidates, 1);
    assert!(report.actions.is_empty());
    assert_eq!(report.rechecked_active, vec!["jhub/sleepy".to_owned()]);
    assert!(node.running(pid));
    // Busy in the next round too, so the count starts again.
    assert!(node.tick(31).await.actions.is_empty());
}

#[tokio::test]
async fn watchdog_acts_only_under_the_floor_on_the_biggest_over_budget_tenant() {
    let pods = vec![
        pod("jhub", "big-over", 11).budget(3_000).build(),
        pod("jhub", "small-over", 12).budget(2_000).build(),
        pod("jhub", "within", 13).budget(8_000).build(),
        pod("jhub", "unbudgeted", 14).build(),
    ];
    for dry_run in [true, false] {
        let mut cfg = config();
        cfg.vram_dry_run = dry_run;
        let mut node = Node::new(cfg, pods.clone());
        let big = node.sleeper(11, 0, 0, 5_000);
        let small = node.sleeper(12, 1, 0, 2_500);
        let within = node.sleeper(13, 2, 0, 5_000);
        let unbudgeted = node.sleeper(14, 3, 0, 1_000);
        for pid in [big, small, within, unbudgeted] {
            node.gpu.set_process_util(pid, 50);
        }
        // 16000 - 13500 = 2500 MiB free: over budget, but above the floor.
        for m in 0..3 {
            assert!(node.tick(m).await.actions.is_empty());
        }
        // big-over grows: 1500 MiB free, under the 1536 MiB floor.
        node.gpu.set_process_memory(big, 6_000);
        let report = node.tick(3).await;
        assert_eq!(report.actions.len(), 1, "{report:?}");
        let a = &report.actions[0];
        assert_eq!(a.kind, ActionKind::VramRecycle);
        assert_eq!(a.pod, "jhub/big-over");
        let d = &a.details;
        assert_eq!(d["reason"], "vram_over_budget");
        assert_eq!(
            (d["used_mib"].as_u64(), d["budget_mib"].as_u64()),
            (Some(6000), Some(3000))
        );
        assert_eq!(
            (d["gpu_free_mib"].as_u64(), d["floor_mib"].as_u64()),
            (Some(1500), Some(1536))
        );
        for pid in [small, within, unbudgeted] {
            assert!(node.running(pid));
        }
        if dry_run {
            assert_eq!(a.result, "dry_run");
            assert!(node.running(big));
            assert_eq!(node.audit.records()[0].action, "agent.vram_recycle_dry_run");
            assert_eq!(node.cluster.events()[0].1.reason, "VRAMOverBudgetDryRun");
            // Still over budget under pressure: reported again after ten minutes, not
            // every round.
            for m in 4..13 {
                assert!(node.tick(m).await.actions.is_empty(), "minute {m}");
            }
            assert_eq!(node.tick(13).await.actions.len(), 1);
        } else {
            assert_eq!(a.result, "success");
            assert_eq!(node.ended_by(big).await, Some(SIGTERM));
            assert_eq!(node.audit.records()[0].action, "agent.vram_recycle");
            assert_eq!(node.cluster.events()[0].1.reason, "VRAMOverBudgetRecycled");
            // With it gone the GPU is above the floor again: nothing more happens.
            assert!(node.tick(4).await.actions.is_empty());
            let text = node.metrics_text();
            assert_eq!(
                metric(
                    &text,
                    r#"gpu_booking_agent_reclaim_total{result="success",reason="vram_over_budget"}"#
                ),
                Some(1.0)
            );
        }
    }
}

#[tokio::test]
async fn per_namespace_policy_is_looser_for_development() {
    let mut cfg = config();
    cfg.policy.namespace_policies = vec![
        NamespacePolicy::parse("dev-*:idle-minutes=90,idle-samples=90").unwrap(),
        NamespacePolicy::parse("inference:idle-minutes=5,idle-samples=5").unwrap(),
    ];
    let pods = vec![
        pod("dev-alice", "nb", 15).build(),
        pod("inference", "server", 16).build(),
        pod("jhub", "nb", 17).build(),
    ];
    let mut node = Node::new(cfg, pods);
    let dev = node.sleeper(15, 0, 0, 1_000);
    let inf = node.sleeper(16, 1, 0, 1_000);
    let jhub = node.sleeper(17, 2, 1, 1_000);
    let reports = node.ticks(0, 90).await;
    let when = |key: &str| {
        reports
            .iter()
            .position(|r| r.actions.iter().any(|a| a.pod == key))
    };
    assert_eq!(when("inference/server"), Some(5));
    assert_eq!(when("jhub/nb"), Some(30));
    assert_eq!(when("dev-alice/nb"), Some(90));
    for pid in [dev, inf, jhub] {
        assert!(!node.running(pid));
    }
}

#[tokio::test]
async fn last_activity_annotation_is_written_at_most_once_a_minute() {
    let mut node = Node::new(config(), vec![pod("jhub", "active", 18).build()]);
    let pid = node.sleeper(18, 0, 0, 1_000);
    node.gpu.set_process_util(pid, 90);
    // A round every 20 s for 5 minutes, busy throughout.
    for i in 0..=15 {
        node.agent
            .tick(node.at(0) + chrono::TimeDelta::seconds(20 * i))
            .await;
    }
    let written: Vec<String> = node
        .cluster
        .annotations()
        .into_iter()
        .filter(|(pod, key, _)| pod == "jhub/active" && key == "gpu-booking.io/last-gpu-activity")
        .map(|(_, _, v)| v)
        .collect();
    assert_eq!(
        written,
        vec![
            "2027-01-15T08:00:00Z",
            "2027-01-15T08:01:00Z",
            "2027-01-15T08:02:00Z",
            "2027-01-15T08:03:00Z",
            "2027-01-15T08:04:00Z",
            "2027-01-15T08:05:00Z",
        ]
    );
    // Idle from now on: the annotation stays at the last activity.
    node.gpu.set_process_util(pid, 0);
    node.ticks(6, 20).await;
    assert_eq!(
        node.cluster
            .annotations()
            .iter()
            .filter(|(_, key, _)| key == "gpu-booking.io/last-gpu-activity")
            .count(),
        6
    );
    let text = node.metrics_text();
    assert_eq!(
        metric(
            &text,
            r#"gpu_booking_agent_pod_last_gpu_activity_timestamp_seconds{namespace="jhub",pod="active"}"#
        ),
        Some((node.at(5).timestamp()) as f64)
    );
}

#[tokio::test]
async fn an_agent_restart_keeps_the_pods_last_activity() {
    let earlier = "2027-01-15T06:00:00Z";
    let pods = vec![pod("jhub", "old", 19)
        .annotation("gpu-booking.io/last-gpu-activity", earlier)
        .build()];
    let mut node = Node::new(config(), pods);
    let pid = node.sleeper(19, 0, 0, 1_000);
    // Idle for two hours by the annotation, but this agent has seen no samples yet:
    // it waits for 30 of its own before acting.
    let reports = node.ticks(0, 28).await;
    assert!(reports.iter().all(|r| r.actions.is_empty()));
    assert!(
        node.cluster.annotations().is_empty(),
        "nothing new to write"
    );
    let report = node.tick(29).await;
    assert_eq!(report.actions.len(), 1);
    assert_eq!(report.actions[0].details["idle_minutes"], 149.0);
    assert!(!node.running(pid));
}

#[tokio::test]
async fn whole_card_utilisation_when_the_gpu_has_no_per_process_figures() {
    let pods = vec![
        pod("jhub", "idle", 20).build(),
        pod("jhub", "busy", 21).build(),
    ];
    let gpu = FakeGpu::new(1, GPU_MIB).without_process_utilization();
    let mut node = Node::with_gpu(config(), pods, gpu);
    let idle = node.sleeper(20, 0, 0, 1_000);
    let busy = node.sleeper(21, 1, 0, 1_000);
    node.gpu.set_process_util(busy, 60);
    // The PRD's v1 rule: the card is busy, so neither pod counts as idle.
    assert!(node.ticks(0, 40).await.iter().all(|r| r.actions.is_empty()));
    node.gpu.set_process_util(busy, 0);
    let reports = node.ticks(41, 71).await;
    let acted = reports.iter().position(|r| !r.actions.is_empty()).unwrap();
    assert_eq!(reports[acted].actions.len(), 2);
    assert_eq!(acted, 29, "idle from minute 41, reclaimed at minute 70");
    assert!(!node.running(idle) && !node.running(busy));
}

#[tokio::test]
async fn a_gpu_that_reports_no_utilisation_never_looks_idle() {
    let gpu = FakeGpu::new(1, GPU_MIB).without_utilization();
    let mut node = Node::with_gpu(config(), vec![pod("jhub", "mig", 23).build()], gpu);
    let pid = node.sleeper(23, 0, 0, 1_000);
    for r in node.ticks(0, 90).await {
        assert!(r.actions.is_empty() && r.idle_candidates == 0, "{r:?}");
    }
    assert!(node.running(pid));
}

#[tokio::test]
async fn nvml_failures_and_api_outages_do_no_harm() {
    let mut node = Node::new(config(), vec![pod("jhub", "p", 22).build()]);
    let pid = node.sleeper(22, 0, 0, 1_000);
    node.gpu.fail_next(1);
    let report = node.tick(0).await;
    assert!(report.error.is_some());
    assert_eq!(
        metric(
            &node.metrics_text(),
            r#"gpu_booking_agent_samples_total{result="error"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&node.metrics_text(), "gpu_booking_agent_nvml_up"),
        Some(0.0)
    );
    // The API server is down: the last pod list is kept, nothing breaks.
    node.tick(1).await;
    node.cluster.set_failing(true);
    let reports = node.ticks(2, 40).await;
    assert!(reports
        .iter()
        .take_while(|r| r.actions.is_empty())
        .all(|r| r.pods == vec!["jhub/p".to_owned()]));
    // The reclaim happens; the Event cannot be recorded and is counted as failed.
    assert!(reports.iter().any(|r| !r.actions.is_empty()));
    assert!(!node.running(pid));
    let text = node.metrics_text();
    assert_eq!(
        metric(
            &text,
            r#"gpu_booking_agent_kubernetes_and_audit_calls_total{call="event",outcome="error"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        node.audit.records().len(),
        1,
        "the audit row is still written"
    );
}

/// The chart's defaults (idle reclaim and the VRAM watchdog both in dry run): the
/// activity annotation that preemption orders lent pods by, and the per-pod telemetry,
/// are live; the idle pod is reported and keeps its process.
#[tokio::test]
async fn in_dry_run_the_activity_annotation_and_telemetry_are_live() {
    let mut cfg = config();
    cfg.policy.idle.dry_run = true;
    cfg.vram_dry_run = true;
    let mut node = Node::new(
        cfg,
        vec![
            pod("jhub", "busy", 3).build(),
            pod("jhub", "idle", 4).build(),
        ],
    );
    let busy = node.sleeper(3, 0, 0, 1_000);
    node.gpu.set_process_util(busy, 90);
    let idle = node.sleeper(4, 0, 1, 2_000);
    let reports = node.ticks(0, 30).await;
    let annotated: Vec<String> = node
        .cluster
        .annotations()
        .into_iter()
        .filter(|(_, key, _)| key == "gpu-booking.io/last-gpu-activity")
        .map(|(pod, _, _)| pod)
        .collect();
    // The busy pod's activity moves every minute; the idle one's stays where it was.
    let count = |name: &str| annotated.iter().filter(|p| *p == name).count();
    assert!(count("jhub/busy") >= 30, "{annotated:?}");
    assert!(count("jhub/idle") <= 1, "{annotated:?}");
    let text = node.metrics_text();
    assert!(
        text.lines().any(
            |l| l.starts_with("gpu_booking_agent_pod_gpu_memory_used_bytes{")
                && l.contains("pod=\"idle\"")
        ),
        "{text}"
    );
    let dry: Vec<_> = reports
        .iter()
        .flat_map(|r| r.actions.iter())
        .filter(|a| a.result == "dry_run")
        .collect();
    assert!(!dry.is_empty(), "the idle pod is reported");
    assert!(node.running(idle) && node.running(busy), "nothing is ended");
}
