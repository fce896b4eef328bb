//! The VRAM budget on the nodes and the inventory's cards, against the fake API
//! server: advertised before any pod asks, re-asserted when a node registers again or
//! its status loses it, removed with the GPUs, never rewritten when right; one budget
//! per model with a resource of its own on a node of several models; a time-sliced
//! card counts once; a node with several models is refused with an Event.

use crate::common;

use std::time::Duration;

use common::*;
use gpu_booking_fake_apiserver::{FakeApiServer, Verb};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

const GPUMEM: &str = "gpu-booking.io/gpumem";
/// The budget of the MIG profile that the usual models name by its own resource.
const MIG_SMALL: &str = "gpu-booking.io/gpumem-mig-1g.5gb";
const T4: &str = "gpu-booking.io/gpumem-t4";

/// A time-sliced Tesla T4 (one card, four replicas), as GFD and the device plugin show it.
fn t4_node(server: &FakeApiServer, name: &str) -> Node {
    gpu_node(
        server,
        name,
        &[
            ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
            ("nvidia.com/gpu.count", "1"),
            ("nvidia.com/gpu.replicas", "4"),
            ("nvidia.com/gpu.memory", "15360"),
        ],
        &[("nvidia.com/gpu", 4), ("cpu", 8)],
    )
}

fn a100_node(server: &FakeApiServer, name: &str) -> Node {
    gpu_node(
        server,
        name,
        &[
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
            ("nvidia.com/gpu.count", "2"),
            ("nvidia.com/gpu.memory", "40960"),
        ],
        &[("nvidia.com/gpu", 2)],
    )
}

/// The budget a node advertises: (capacity, allocatable).
fn advertised(server: &FakeApiServer, name: &str) -> (Option<String>, Option<String>) {
    advertised_as(server, name, GPUMEM)
}

/// The budget `resource` a node advertises: (capacity, allocatable).
fn advertised_as(
    server: &FakeApiServer,
    name: &str,
    resource: &str,
) -> (Option<String>, Option<String>) {
    let Some(node) = server.get_value("v1", "nodes", None, name) else {
        return (None, None);
    };
    let read = |field: &str| node["status"][field][resource].as_str().map(str::to_owned);
    (read("capacity"), read("allocatable"))
}

fn says(server: &FakeApiServer, name: &str, mib: &str) -> bool {
    says_as(server, name, GPUMEM, mib)
}

fn says_as(server: &FakeApiServer, name: &str, resource: &str, mib: &str) -> bool {
    advertised_as(server, name, resource) == (Some(mib.into()), Some(mib.into()))
}

/// The budget resources a node advertises (allocatable), by name.
fn budgets(server: &FakeApiServer, name: &str) -> Vec<String> {
    let node = server
        .get_value("v1", "nodes", None, name)
        .unwrap_or_default();
    node["status"]["allocatable"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| k.starts_with(GPUMEM))
        .cloned()
        .collect()
}

fn status_patches(server: &FakeApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.plural == "nodes"
                && r.verb == Verb::Patch
                && r.subresource.as_deref() == Some("status")
        })
        .count()
}

#[tokio::test(start_paused = true)]
async fn gpumem_is_advertised_reasserted_removed_and_never_rewritten() {
    let h = Harness::new();
    t4_node(&h.server, "t4");
    a100_node(&h.server, "a1");
    node(&h.server, "cpu", None, &[("cpu", 16)]);
    let c = h.start();
    // One T4: 15360 - 512 reserved; two A100s: 2 x (40960 - 512).
    h.wait(|s| says(s, "t4", "14848") && says(s, "a1", "80896"))
        .await;
    assert_eq!(advertised(&h.server, "cpu"), (None, None));
    // Nodes of one model: the one plain budget, as ever.
    assert_eq!(budgets(&h.server, "t4"), [GPUMEM]);
    assert_eq!(budgets(&h.server, "a1"), [GPUMEM]);
    // The patch is a JSON patch of nodes/status, the name escaped.
    let first = h
        .server
        .requests()
        .into_iter()
        .find(|r| r.subresource.as_deref() == Some("status") && r.name.as_deref() == Some("a1"))
        .and_then(|r| r.body)
        .unwrap();
    assert!(
        first.to_string().contains("gpu-booking.io~1gpumem"),
        "{first}"
    );
    // The report follows: the a100's nodes all advertise, 40448 MiB per card.
    h.wait_booking(|s| {
        s.usage
            .get("a100")
            .is_some_and(|u| u.gpumem_advertised == Some(true))
    })
    .await;
    let a100 = h.booking.state().usage["a100"].clone();
    assert_eq!((a100.cards, a100.gpumem_unit_mib), (Some(2), Some(40448)));

    // Right already: nothing is written however long it runs.
    let writes = status_patches(&h.server);
    h.run_for(Duration::from_secs(60)).await;
    assert_eq!(status_patches(&h.server), writes);

    // The node registers again (a new object, no budget): advertised again.
    h.server.remove::<Node>(None, "a1");
    a100_node(&h.server, "a1");
    assert_eq!(advertised(&h.server, "a1"), (None, None));
    h.wait(|s| says(s, "a1", "80896")).await;

    // Its status loses the budget (as a kubelet may write it): re-asserted.
    h.server.modify::<Node>(None, "a1", |n| {
        if let Some(cap) = n["status"]["capacity"].as_object_mut() {
            cap.remove(GPUMEM);
        }
    });
    h.wait(|s| says(s, "a1", "80896")).await;

    // The T4 node loses its GPU: the budget goes.
    h.server.modify::<Node>(None, "t4", |n| {
        n["metadata"]["labels"] = json!({});
        if let Some(alloc) = n["status"]["allocatable"].as_object_mut() {
            alloc.remove("nvidia.com/gpu");
        }
    });
    h.wait(|s| advertised(s, "t4") == (None, None)).await;
    assert!(c.metrics.action_count("advertise_gpumem", "done") >= 4);
}

#[tokio::test(start_paused = true)]
async fn a_time_sliced_card_is_one_card_and_unnamed_cards_fall_back_to_gpu() {
    let mut h = Harness::new();
    h.booking.state().models = serde_json::from_value(json!([
        {"name": "a100", "patterns": ["*A100*"], "units": 2, "position": 0},
        {"name": "gpu", "patterns": [], "units": 4, "position": 1}
    ]))
    .unwrap();
    h.args.gpumem_reserve_mib = 1024;
    t4_node(&h.server, "t4");
    a100_node(&h.server, "a1");
    // Three pods on the four replicas of one card: one card in use.
    for name in ["p1", "p2", "p3"] {
        pod(name).gpu(1).on("t4").put(&h.server);
    }
    let c = h.start();
    h.wait_booking(|s| {
        s.usage
            .get("gpu")
            .is_some_and(|u| u.gpumem_advertised == Some(true))
    })
    .await;
    let gpu = h.booking.state().usage["gpu"].clone();
    assert_eq!(
        (gpu.cards, gpu.in_use),
        (Some(1), 1),
        "one card, not four replicas"
    );
    assert_eq!(gpu.gpumem_unit_mib, Some(15360 - 1024));
    assert!(says(&h.server, "t4", "14336"));
    let label = h
        .server
        .get::<Node>(None, "t4")
        .and_then(|n| n.metadata.labels)
        .and_then(|l| l.get("gpu-booking.io/model").cloned());
    assert_eq!(label.as_deref(), Some("gpu"), "the Tesla T4 is reachable");
    // The declared 4 units disagree with the 1 card: the gauge says so.
    h.wait(|_| {
        c.metrics
            .encode()
            .contains("model_units_mismatch{model=\"gpu\"} 1")
    })
    .await;
    let text = c.metrics.encode();
    assert!(
        text.contains("gpu_booking_controller_model_units_mismatch{model=\"a100\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("gpu_booking_controller_model_cards{model=\"gpu\"} 1"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_with_several_models_is_refused_with_an_event() {
    let h = Harness::new();
    gpu_node(
        &h.server,
        "mixed",
        &[
            ("nvidia.com/mig.strategy", "mixed"),
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
            ("nvidia.com/gpu.count", "1"),
            ("nvidia.com/mig-1g.5gb.count", "3"),
            ("nvidia.com/mig-1g.5gb.memory", "4864"),
            ("nvidia.com/mig-3g.20gb.count", "1"),
            ("nvidia.com/mig-3g.20gb.memory", "19968"),
            ("nvidia.com/mig-2g.10gb.count", "1"),
            ("nvidia.com/mig-2g.10gb.memory", "9856"),
            ("gpu-booking.io/model", "a100"),
        ],
        &[
            ("nvidia.com/mig-1g.5gb", 3),
            ("nvidia.com/mig-3g.20gb", 1),
            ("nvidia.com/mig-2g.10gb", 1),
        ],
    );
    let c = h.start();
    // The stale label goes: mig-1g.5gb is reached through its own resource, but two
    // profiles no declared model names (mig-2g.10gb, mig-3g.20gb by the fallback)
    // could only be selected by the label, and one label cannot say both.
    h.wait(|s| {
        s.get::<Node>(None, "mixed")
            .and_then(|n| n.metadata.labels)
            .is_some_and(|l| !l.contains_key("gpu-booking.io/model"))
    })
    .await;
    h.wait(|s| {
        s.requests().iter().any(|r| {
            r.plural == "events"
                && r.verb == Verb::Create
                && r.body
                    .as_ref()
                    .is_some_and(|b| b.to_string().contains("SeveralGpuModels"))
        })
    })
    .await;
    // Its devices still count, per profile (the others by the mig-<profile> fallback),
    // and its budgets are advertised: mig-1g.5gb's, under its own resource, apart,
    // 3 x (4864 - 512); the profiles only a label selects share the plain one,
    // (19968 - 512) + (9856 - 512).
    h.wait_booking(|s| {
        s.usage
            .get("mig-1g.5gb")
            .is_some_and(|u| u.cards == Some(3))
    })
    .await;
    h.wait(|s| says(s, "mixed", "28800") && says_as(s, "mixed", MIG_SMALL, "13056"))
        .await;
    h.wait_booking(|s| {
        s.usage
            .get("mig-1g.5gb")
            .is_some_and(|u| u.gpumem_advertised == Some(true) && u.gpumem_unit_mib == Some(4352))
    })
    .await;
    h.wait(|_| c.metrics.encode().contains("nodes_with_several_models 1"))
        .await;
}

/// A node whose models but one are reached through their own resources (seed 001,
/// MIG's mixed strategy): the single model label names that one, and each model
/// present has a label of its own; no Event refuses it.
#[tokio::test(start_paused = true)]
async fn a_node_of_resource_models_carries_a_label_per_model() {
    let h = Harness::new();
    gpu_node(
        &h.server,
        "mixed",
        &[
            ("nvidia.com/mig.strategy", "mixed"),
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
            ("nvidia.com/mig-1g.5gb.count", "3"),
            ("nvidia.com/mig-1g.5gb.memory", "4864"),
            ("nvidia.com/mig-3g.20gb.count", "1"),
            ("nvidia.com/mig-3g.20gb.memory", "19968"),
        ],
        &[("nvidia.com/mig-1g.5gb", 3), ("nvidia.com/mig-3g.20gb", 1)],
    );
    let c = h.start();
    h.wait(|s| {
        s.get::<Node>(None, "mixed")
            .and_then(|n| n.metadata.labels)
            .is_some_and(|l| {
                l.get("gpu-booking.io/model").map(String::as_str) == Some("mig-3g.20gb")
                    && l.get("model.gpu-booking.io/mig-1g.5gb").map(String::as_str) == Some("true")
                    && l.get("model.gpu-booking.io/mig-3g.20gb")
                        .map(String::as_str)
                        == Some("true")
            })
    })
    .await;
    assert!(
        c.metrics.encode().contains("nodes_with_several_models 0"),
        "a usable node counted as refused"
    );
    assert!(!h.server.requests().iter().any(|r| r.plural == "events"
        && r.body
            .as_ref()
            .is_some_and(|b| b.to_string().contains("SeveralGpuModels"))));
}

/// Two A100s (generic) and a T4 time-sliced four ways under its own resource: each
/// model's cards have their own budget, so the T4's pods cannot take the A100s'
/// memory; a budget no longer due goes, the other stays.
#[tokio::test(start_paused = true)]
async fn a_node_of_two_models_advertises_a_budget_per_model() {
    let mut h = Harness::new();
    h.booking.state().models = serde_json::from_value(json!([
        {"name": "a100", "patterns": ["*A100*"], "units": 2, "position": 0},
        {"name": "t4", "patterns": ["*T4*"], "resource": "nvidia.com/t4", "units": 1, "position": 1}
    ]))
    .unwrap();
    h.args.gpumem_reserve_mib = 512;
    gpu_node(
        &h.server,
        "mixed",
        &[
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),
            ("nvidia.com/gpu.count", "2"),
            ("nvidia.com/gpu.memory", "40960"),
            ("nvidia.com/t4.count", "1"),
            ("nvidia.com/t4.replicas", "4"),
            ("nvidia.com/t4.memory", "15360"),
        ],
        &[("nvidia.com/gpu", 2), ("nvidia.com/t4", 4)],
    );
    t4_node(&h.server, "t4-only");
    let _c = h.start();
    // 2 x (40960 - 512) for the A100s; the T4's one card, 15360 - 512, apart.
    h.wait(|s| says(s, "mixed", "80896") && says_as(s, "mixed", T4, "14848"))
        .await;
    // A node of T4s on the generic resource: the plain budget alone.
    h.wait(|s| says(s, "t4-only", "14848")).await;
    assert_eq!(budgets(&h.server, "t4-only"), [GPUMEM]);
    let first = h
        .server
        .requests()
        .into_iter()
        .find(|r| r.subresource.as_deref() == Some("status") && r.name.as_deref() == Some("mixed"))
        .and_then(|r| r.body)
        .unwrap();
    assert!(
        first.to_string().contains("gpu-booking.io~1gpumem-t4"),
        "{first}"
    );
    // The report: each model advertised by its own budget, per unit.
    h.wait_booking(|s| {
        ["a100", "t4"].iter().all(|m| {
            s.usage
                .get(*m)
                .is_some_and(|u| u.gpumem_advertised == Some(true))
        })
    })
    .await;
    let usage = h.booking.state().usage.clone();
    assert_eq!(usage["t4"].gpumem_unit_mib, Some(14848));
    assert_eq!(usage["a100"].gpumem_unit_mib, Some(40448));

    // The T4 card goes: its budget goes, the A100s' stays.
    h.server.modify::<Node>(None, "mixed", |n| {
        if let Some(alloc) = n["status"]["allocatable"].as_object_mut() {
            alloc.remove("nvidia.com/t4");
        }
        if let Some(labels) = n["metadata"]["labels"].as_object_mut() {
            labels.retain(|k, _| !k.starts_with("nvidia.com/t4"));
        }
    });
    h.wait(|s| advertised_as(s, "mixed", T4) == (None, None))
        .await;
    assert!(says(&h.server, "mixed", "80896"));
}

#[tokio::test(start_paused = true)]
async fn pods_pending_on_gpumem_are_counted() {
    let h = Harness::new();
    a100_node(&h.server, "a1");
    let mut waiting = pod("waiting").gpu(1).pending_unschedulable();
    waiting.0["status"]["conditions"][0]["message"] =
        json!("0/1 nodes are available: 1 Insufficient gpu-booking.io/gpumem.");
    waiting.put(&h.server);
    pod("other").gpu(1).pending_unschedulable().put(&h.server);
    let c = h.start();
    h.wait(|_| c.metrics.inventory.pods_pending_gpumem.get() == 1)
        .await;
    h.server
        .remove::<k8s_openapi::api::core::v1::Pod>(Some(NS), "waiting");
    h.wait(|_| c.metrics.inventory.pods_pending_gpumem.get() == 0)
        .await;
}

#[tokio::test(start_paused = true)]
async fn dry_run_advertises_nothing() {
    let mut h = Harness::new();
    h.args.dry_run = true;
    a100_node(&h.server, "a1");
    let c = h.start();
    h.wait(|_| c.metrics.action_count("advertise_gpumem", "dry_run") >= 1)
        .await;
    assert_eq!(status_patches(&h.server), 0);
    assert_eq!(advertised(&h.server, "a1"), (None, None));
}
