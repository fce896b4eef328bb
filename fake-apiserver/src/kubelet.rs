//! A minimal kubelet for every node the fake holds ("Pod Lifecycle"): a pod bound to
//! an existing node starts at once (`Running`, `startTime`, ready containers and the
//! `Ready` condition), and a pod deleted with a grace period is gone when the period
//! has passed on the tokio clock (so paused-clock tests can advance it), freeing what
//! it held. A started pod gets its own IP address (`status.podIP`): the lowest
//! `127.0.0.N` no other unfinished pod holds, or what the test's network plugin
//! ([`crate::FakeApiServer::set_pod_network`]) picks.
//!
//! Simplifications, one line each: containers always start and always take their whole
//! grace period to stop; no probes, restarts or images; a pod bound straight to a node
//! that cannot hold it is not rejected (kubelet admission); without a tokio runtime at
//! the moment of deletion the pod waits for `pod_gone`/`finish_deletions`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::fields::{meta_str, str_at};
use crate::scheduler::set_condition;
use crate::snapshot::{nodes_key, pods_key};
use crate::store::{timestamp, Store, Write};
use crate::Shared;

/// A container's runtime ID as containerd reports it (`containerd://` and 64 hex
/// digits, the shape the node agent finds again in `/proc/<pid>/cgroup`): the pod
/// UID's hex digits then the container's index, so it is unique per container.
fn container_id(uid: &str, index: usize) -> String {
    let digits: String = uid.chars().filter(char::is_ascii_hexdigit).collect();
    format!(
        "containerd://{:0>32.32}{index:032x}",
        digits.to_ascii_lowercase()
    )
}

/// A started pod's address: the network plugin's, else the lowest `127.0.0.N`
/// (from 2) that no other unfinished pod holds, so that each pod has its own.
fn pod_ip(store: &Store, pod: &Value) -> String {
    if let Some(ip) = store
        .sim
        .pod_network
        .as_ref()
        .and_then(|network| network(pod))
    {
        return ip;
    }
    let held: HashSet<String> = store
        .list(&pods_key(), None, &crate::select::Selector::default())
        .iter()
        .filter(|p| !crate::fields::finished(p))
        .map(|p| str_at(p, "/status/podIP").to_owned())
        .collect();
    (2..=u32::from(u16::MAX))
        .map(|n| format!("127.0.{}.{}", n / 256, n % 256))
        .find(|ip| !held.contains(ip) && !ip.ends_with(".0") && !ip.ends_with(".255"))
        .unwrap_or_default()
}

/// The phase and status a started pod reports, at address `ip`.
fn started(pod: &Value, now: &str, ip: &str) -> Value {
    let mut pod = pod.clone();
    let uid = meta_str(&pod, "uid").unwrap_or("").to_owned();
    let statuses: Vec<Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let name = str_at(c, "/name");
            json!({
                "name": name,
                "image": str_at(c, "/image"),
                "imageID": "",
                "containerID": container_id(&uid, i),
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    pod["status"]["phase"] = json!("Running");
    pod["status"]["startTime"] = json!(now);
    if !ip.is_empty() {
        pod["status"]["podIP"] = json!(ip);
        pod["status"]["podIPs"] = json!([{"ip": ip}]);
    }
    pod["status"]["containerStatuses"] = json!(statuses);
    for kind in ["Initialized", "ContainersReady", "Ready"] {
        set_condition(&mut pod, json!({"type": kind, "status": "True"}), now);
    }
    if let Some(m) = pod["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    pod
}

/// Starts the pods bound to existing nodes and times the graceful deletions that have
/// no timer yet.
pub(crate) fn run(store: &mut Store, shared: &Shared) {
    let all = crate::select::Selector::default();
    let nodes: HashSet<String> = store
        .list(&nodes_key(), None, &all)
        .iter()
        .filter_map(|n| meta_str(n, "name").map(str::to_owned))
        .collect();
    let now = timestamp(store.now());
    for pod in store.list(&pods_key(), None, &all) {
        let node = str_at(&pod, "/spec/nodeName");
        if node.is_empty() || !nodes.contains(node) {
            continue;
        }
        let ns = meta_str(&pod, "namespace").unwrap_or("").to_owned();
        let name = meta_str(&pod, "name").unwrap_or("").to_owned();
        let uid = meta_str(&pod, "uid").unwrap_or("").to_owned();
        let phase = str_at(&pod, "/status/phase");
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            if !matches!(phase, "Succeeded" | "Failed") && !store.sim.timers.contains(&uid) {
                let grace = pod
                    .pointer("/metadata/deletionGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(30)
                    .max(0);
                let runtime = tokio::runtime::Handle::try_current().ok();
                if let (Some(runtime), Some(shared)) = (runtime, shared.me.upgrade()) {
                    store.sim.timers.insert(uid.clone());
                    runtime.spawn(async move {
                        tokio::time::sleep(Duration::from_secs(grace.unsigned_abs())).await;
                        stopped(&shared, &ns, &name, &uid);
                    });
                }
            }
        } else if matches!(phase, "" | "Pending") {
            let ip = pod_ip(store, &pod);
            let _ = store.update(
                &pods_key(),
                &ns,
                &name,
                Write::Whole,
                started(&pod, &now, &ip),
            );
        }
    }
}

/// The grace period of pod `uid` is over: its containers are stopped and the kubelet
/// confirms the deletion (the pod is removed); with finalizers left it stays, `Failed`,
/// until they are removed.
fn stopped(shared: &Arc<Shared>, ns: &str, name: &str, uid: &str) {
    {
        let mut store = shared.lock();
        store.sim.timers.remove(uid);
        let Some(pod) = store.get(&pods_key(), ns, name) else {
            return;
        };
        if meta_str(&pod, "uid") != Some(uid)
            || pod.pointer("/metadata/deletionTimestamp").is_none()
        {
            return;
        }
        let has_finalizers = pod
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            let mut failed = (*pod).clone();
            if !failed["status"].is_object() {
                failed["status"] = json!({});
            }
            failed["status"]["phase"] = json!("Failed");
            if let Some(m) = failed["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            let _ = store.update(&pods_key(), ns, name, Write::Whole, failed);
        } else {
            store.remove(&pods_key(), ns, name);
        }
    }
    shared.changed();
}
