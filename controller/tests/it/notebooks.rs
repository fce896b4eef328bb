//! The controller's report of every user's notebooks (with the units held): booked,
//! lent and stripped pods from our marks alone, the whole list each time, and a last
//! GPU activity only when it moved by a step.

use crate::common::*;

use std::time::Duration;

use chrono::TimeDelta;
use gpu_booking_client::{NextStep, NotebookStanding};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn of(user: &str, spec: PodSpec) -> PodSpec {
    let mut spec = spec;
    spec.0["metadata"]["annotations"]["hub.jupyter.org/username"] = json!(user);
    spec.0["metadata"]["labels"]["hub.jupyter.org/username"] = json!(user);
    spec
}

#[tokio::test(start_paused = true)]
async fn reports_each_users_notebooks_as_our_marks_say() {
    let h = Harness::new();
    node(
        &h.server,
        "a100-node",
        Some("NVIDIA-A100-SXM4-40GB"),
        &[("nvidia.com/gpu", 2)],
    );
    let end = h.after(TimeDelta::hours(2));
    let active = h.now() - TimeDelta::minutes(3);
    pod("jupyter-alice")
        .gpu(1)
        .on("a100-node")
        .booked_until(end)
        .last_gpu_activity(active)
        .put(&h.server);
    of(
        "bob",
        pod("jupyter-bob")
            .gpu(1)
            .on("a100-node")
            .low_priority("a100"),
    )
    .put(&h.server);
    let mut carol = of("carol", pod("jupyter-carol").on("a100-node"));
    carol.0["metadata"]["annotations"]["gpu-booking.io/gpu-removed"] =
        json!("no free a100 GPU and no active booking");
    carol.put(&h.server);
    // A CPU pod without the note, and a GPU pod of another workload: no notebooks.
    of("dan", pod("jupyter-dan").on("a100-node")).put(&h.server);
    of("erin", pod("training").gpu(1).on("a100-node")).put(&h.server);
    let _c = h.start();

    h.wait_booking(|s| s.held.last().is_some_and(|r| r.notebooks.len() == 3))
        .await;
    let report = h.booking.state().held.last().cloned().unwrap();
    let seen: Vec<(&str, &str, NotebookStanding)> = report
        .notebooks
        .iter()
        .map(|n| (n.user.as_str(), n.pod.as_str(), n.standing))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("alice", "jupyter-alice", NotebookStanding::Booked),
            ("bob", "jupyter-bob", NotebookStanding::Lent),
            ("carol", "jupyter-carol", NotebookStanding::Stripped),
        ]
    );
    let alice = &report.notebooks[0];
    assert_eq!(alice.ends_at.map(|t| t.timestamp()), Some(end.timestamp()));
    assert_eq!(
        alice.last_activity.map(|t| t.timestamp()),
        Some(active.timestamp())
    );
    assert_eq!(
        (alice.booking_id, alice.next.clone()),
        (Some(7), vec![NextStep::Extend])
    );
    assert_eq!(
        report.notebooks[2].why,
        "on CPU: no free a100 GPU and no active booking"
    );

    // A minute more of activity is no news; the list is not sent again for it.
    let reports = h.booking.state().held.len();
    let mut alice_pod: Pod = h.pod("jupyter-alice").unwrap();
    let bump = |pod: &mut Pod, at: chrono::DateTime<chrono::Utc>| {
        pod.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("gpu-booking.io/last-gpu-activity".into(), rfc3339(at));
    };
    bump(&mut alice_pod, active + TimeDelta::minutes(1));
    h.server.put(&alice_pod);
    h.run_for(Duration::from_secs(5)).await;
    assert_eq!(h.booking.state().held.len(), reports, "a minute is no news");
    // A step of activity is.
    bump(&mut alice_pod, active + TimeDelta::minutes(10));
    h.server.put(&alice_pod);
    h.wait_booking(|s| {
        s.held.last().is_some_and(|r| {
            r.notebooks[0].last_activity.map(|t| t.timestamp())
                == Some((active + TimeDelta::minutes(10)).timestamp())
        })
    })
    .await;

    // The whole list each time: a pod gone is left out.
    assert!(h.server.remove::<Pod>(Some(NS), "jupyter-carol"));
    h.wait_booking(|s| s.held.last().is_some_and(|r| r.notebooks.len() == 2))
        .await;
}
