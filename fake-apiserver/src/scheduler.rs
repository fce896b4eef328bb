//! One scheduling pass as kube-scheduler would make it: pending pods in its queue
//! order (PrioritySort: higher `spec.priority` first, then the earlier arrival), each
//! bound to a node that passes every filter, or marked `PodScheduled=False,
//! Unschedulable` with kube-scheduler's message and handed to preemption.
//!
//! Simplifications, one line each: nodes are scored by LeastAllocated over requested
//! CPU and memory only (ties go to the first node by name, not a random one); an
//! unschedulable pod is parked until a node changes or a pod on a node goes away or
//! finishes (or its own spec changes), with no backoff timer; no inter-pod affinity,
//! topology spread, ports or volumes; no Events are written.

use serde_json::{json, Value};

use crate::fields::{meta_str, str_at};
use crate::filters::fit_error;
use crate::preemption::{self, Preemption, PREEMPTION_REASON};
use crate::resources::MILLI;
use crate::snapshot::{pending, pods_key, Snapshot, Verdict};
use crate::store::{Store, Write};

/// The scheduler's name for conditions it writes (`spec.schedulerName`, defaulted).
fn scheduler_name(pod: &Value) -> &str {
    match str_at(pod, "/spec/schedulerName") {
        "" => "default-scheduler",
        name => name,
    }
}

/// Sets condition `type` on a pod's status as the API's `UpdatePodCondition` does:
/// `lastTransitionTime` changes only when the status does.
pub(crate) fn set_condition(pod: &mut Value, condition: Value, now: &str) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    if !pod["status"]["conditions"].is_array() {
        pod["status"]["conditions"] = json!([]);
    }
    let kind = str_at(&condition, "/type").to_owned();
    let status = str_at(&condition, "/status").to_owned();
    let Some(list) = pod["status"]["conditions"].as_array_mut() else {
        return;
    };
    let mut condition = condition;
    condition["lastProbeTime"] = Value::Null;
    match list.iter_mut().find(|c| str_at(c, "/type") == kind) {
        Some(old) => {
            condition["lastTransitionTime"] = if str_at(old, "/status") == status {
                old["lastTransitionTime"].clone()
            } else {
                json!(now)
            };
            *old = condition;
        }
        None => {
            condition["lastTransitionTime"] = json!(now);
            list.push(condition);
        }
    }
}

/// What happened to a pod's `status.nominatedNodeName` in an attempt.
enum Nomination {
    Keep,
    Set(String),
    Clear,
}

/// Writes `new` over pod `p` and keeps the snapshot's copy current.
fn write(store: &mut Store, snap: &mut Snapshot, p: usize, mut new: Value) {
    let pod = &snap.pods[p];
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    if let Ok(stored) = store.update(&pods_key(), &pod.ns, &pod.name, Write::Whole, new) {
        snap.pods[p].obj = stored;
    }
}

/// Binds pod `p` to node `n` as the `binding` subresource does: `spec.nodeName`,
/// `PodScheduled=True`, and no nomination left.
fn bind(store: &mut Store, snap: &mut Snapshot, p: usize, n: usize, now: &str) {
    let mut pod = (*snap.pods[p].obj).clone();
    pod["spec"]["nodeName"] = json!(snap.nodes[n].name);
    set_condition(
        &mut pod,
        json!({"type": "PodScheduled", "status": "True"}),
        now,
    );
    if let Some(status) = pod["status"].as_object_mut() {
        status.remove("nominatedNodeName");
    }
    write(store, snap, p, pod);
    snap.place(p, n);
}

fn mark_unschedulable(
    store: &mut Store,
    snap: &mut Snapshot,
    p: usize,
    message: &str,
    nomination: Nomination,
    now: &str,
) {
    let mut pod = (*snap.pods[p].obj).clone();
    set_condition(
        &mut pod,
        json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}),
        now,
    );
    match nomination {
        Nomination::Keep => {}
        Nomination::Set(node) => {
            pod["status"]["nominatedNodeName"] = json!(node);
            snap.nominate(p, Some(node));
        }
        Nomination::Clear => {
            if let Some(status) = pod["status"].as_object_mut() {
                status.remove("nominatedNodeName");
            }
            snap.nominate(p, None);
        }
    }
    write(store, snap, p, pod);
}

/// LeastAllocated over CPU and memory: the node left with the larger free share.
fn score(snap: &Snapshot, p: usize, n: usize) -> i128 {
    let request = snap.pods[p].request();
    let node = &snap.nodes[n];
    let mut total = 0;
    for name in ["cpu", "memory"] {
        let alloc = node.allocatable.get(name).copied().unwrap_or(0);
        if alloc <= 0 {
            continue;
        }
        let after =
            node.used.get(name).copied().unwrap_or(0) + request.get(name).copied().unwrap_or(0);
        total += (alloc - after).max(0) * 100 * MILLI / alloc;
    }
    total
}

/// Evicts preemption victims as `prepareCandidate` does: a `DisruptionTarget`
/// condition (reason `PreemptionByScheduler`), then a graceful delete; pods of lower
/// priority nominated to the same node lose their nomination.
fn evict(store: &mut Store, snap: &mut Snapshot, p: usize, n: usize, victims: &[usize], now: &str) {
    let message = format!(
        "{}: preempting to accommodate a higher priority pod",
        scheduler_name(&snap.pods[p].obj)
    );
    for &v in victims {
        let mut pod = (*snap.pods[v].obj).clone();
        set_condition(
            &mut pod,
            json!({"type": "DisruptionTarget", "status": "True", "reason": PREEMPTION_REASON, "message": message}),
            now,
        );
        write(store, snap, v, pod);
        let (ns, name) = (snap.pods[v].ns.clone(), snap.pods[v].name.clone());
        match store.delete(&pods_key(), &ns, &name, &json!({}), None) {
            Ok(_) => match store.get(&pods_key(), &ns, &name) {
                Some(obj) => snap.pods[v].obj = obj,
                None => snap.unplace(v),
            },
            Err(e) => {
                tracing::warn!(pod = %name, error = ?e.body, "fake scheduler: preemption delete failed")
            }
        }
    }
    let priority = snap.pods[p].priority;
    let lower: Vec<usize> = snap
        .nominated_to(n)
        .filter(|&i| i != p && snap.pods[i].priority < priority)
        .collect();
    for i in lower {
        let mut pod = (*snap.pods[i].obj).clone();
        if let Some(status) = pod["status"].as_object_mut() {
            status.remove("nominatedNodeName");
        }
        write(store, snap, i, pod);
        snap.nominate(i, None);
    }
}

/// One scheduling attempt for pod `p`; whether it was bound.
fn attempt(store: &mut Store, snap: &mut Snapshot, p: usize, now: &str) -> bool {
    try_bind(store, snap, p, now);
    snap.pods[p].node.is_some()
}

fn try_bind(store: &mut Store, snap: &mut Snapshot, p: usize, now: &str) {
    if let Err(why) = &snap.pods[p].request {
        let message = format!("fake scheduler: the pod's resources cannot be read: {why}");
        mark_unschedulable(store, snap, p, &message, Nomination::Keep, now);
        return;
    }
    if snap.nodes.is_empty() {
        mark_unschedulable(
            store,
            snap,
            p,
            "no nodes available to schedule pods",
            Nomination::Clear,
            now,
        );
        return;
    }
    // A nominated pod tries its nominated node first ("Prefer Nominated Node").
    if let Some(n) = snap.pods[p]
        .nominated
        .as_deref()
        .and_then(|name| snap.node_index(name))
    {
        if snap.verdict(p, n) == Verdict::Fits {
            bind(store, snap, p, n, now);
            return;
        }
    }
    let verdicts: Vec<Verdict> = (0..snap.nodes.len()).map(|n| snap.verdict(p, n)).collect();
    let best = (0..snap.nodes.len())
        .filter(|&n| verdicts[n] == Verdict::Fits)
        .max_by(|&a, &b| score(snap, p, a).cmp(&score(snap, p, b)).then(b.cmp(&a)));
    if let Some(n) = best {
        bind(store, snap, p, n, now);
        return;
    }
    let statuses: Vec<Vec<String>> = verdicts.iter().map(Verdict::reasons).collect();
    let mut message = fit_error(snap.nodes.len(), &statuses);
    let nomination = match preemption::preempt(snap, p, &verdicts) {
        Preemption::Evict { node, victims } => {
            evict(store, snap, p, node, &victims, now);
            Nomination::Set(snap.nodes[node].name.clone())
        }
        Preemption::Not {
            message: why,
            clear_nomination,
        } => {
            message.push(' ');
            message.push_str(&why);
            if clear_nomination {
                Nomination::Clear
            } else {
                Nomination::Keep
            }
        }
    };
    mark_unschedulable(store, snap, p, &message, nomination, now);
}

/// Schedules every pending pod once, in queue order.
pub(crate) fn run(store: &mut Store) {
    // Most changes (a bind, a pod starting, a pod parked again) leave nothing to try:
    // then no snapshot is taken.
    if !store.sim.room {
        let parked = &store.sim.parked;
        let any = store
            .list(&pods_key(), None, &Default::default())
            .iter()
            .any(|p| pending(p) && !meta_str(p, "uid").is_some_and(|uid| parked.contains(uid)));
        if !any {
            return;
        }
    }
    let mut snap = Snapshot::take(store);
    let now = crate::store::timestamp(store.now());
    // Arrival order stands in for the queue's timestamp (creation times have only
    // second precision); pods no longer pending leave the queue.
    let pending: Vec<usize> = (0..snap.pods.len())
        .filter(|&p| snap.pods[p].pending())
        .collect();
    let waiting: std::collections::HashSet<&str> =
        pending.iter().map(|&p| snap.pods[p].uid.as_str()).collect();
    let sim = &mut store.sim;
    sim.arrivals.retain(|uid, _| waiting.contains(uid.as_str()));
    if std::mem::take(&mut sim.room) {
        sim.parked.clear();
    }
    sim.parked.retain(|uid| waiting.contains(uid.as_str()));
    for &p in &pending {
        if !sim.arrivals.contains_key(&snap.pods[p].uid) {
            sim.next_arrival += 1;
            sim.arrivals
                .insert(snap.pods[p].uid.clone(), sim.next_arrival);
        }
    }
    let mut queue: Vec<usize> = pending
        .into_iter()
        .filter(|&p| !sim.parked.contains(&snap.pods[p].uid))
        .collect();
    queue.sort_by_key(|&p| {
        let pod = &snap.pods[p];
        (
            std::cmp::Reverse(pod.priority),
            str_at(&pod.obj, "/metadata/creationTimestamp").to_owned(),
            sim.arrivals.get(&pod.uid).copied().unwrap_or(0),
        )
    });
    for p in queue {
        if !attempt(store, &mut snap, p, &now) {
            store.sim.parked.insert(snap.pods[p].uid.clone());
        }
    }
}

/// The node a pod is bound to.
pub(crate) fn node_of(pod: &Value) -> Option<String> {
    Some(str_at(pod, "/spec/nodeName").to_owned()).filter(|n| !n.is_empty())
}

/// Why the scheduler left a pod pending: its `PodScheduled=False` message.
pub(crate) fn unschedulable_message(pod: &Value) -> Option<String> {
    pod.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| str_at(c, "/type") == "PodScheduled" && str_at(c, "/status") == "False")
        .map(|c| str_at(c, "/message").to_owned())
}
