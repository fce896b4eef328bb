//! The opt-in cluster behaviour (scheduler, kubelet) and when it runs: after every
//! change to pods or nodes, synchronously, before the request that made the change is
//! answered, until nothing more changes.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::path::ResourceKey;
use crate::snapshot::{finished, str_at};
use crate::store::{meta_str, Change, ChangeKind};
use crate::{kubelet, scheduler, Shared};

/// Rounds of scheduling and kubelet work after one change; each round only acts on
/// what the previous one changed, so a handful always suffice.
const MAX_ROUNDS: usize = 16;

#[derive(Default)]
pub(crate) struct Sim {
    pub scheduler: bool,
    pub kubelet: bool,
    /// A pod or node changed since the last pass.
    pub dirty: bool,
    /// Queue arrival order of pending pods, by uid.
    pub arrivals: HashMap<String, u64>,
    pub next_arrival: u64,
    /// Pods (uids) whose graceful deletion is being timed.
    pub timers: HashSet<String>,
    /// Pods (uids) found unschedulable, parked until something can make room, as
    /// kube-scheduler's unschedulable pool holds them until a cluster event.
    pub parked: HashSet<String>,
    /// Something happened that can make room (a node changed, a pod on a node went
    /// away or finished, a nomination was dropped): every parked pod is retried.
    pub room: bool,
}

fn bound(pod: &Value) -> bool {
    !str_at(pod, "/spec/nodeName").is_empty()
}

/// Holds resources on a node.
fn holds(pod: &Value) -> bool {
    bound(pod) && !finished(pod)
}

fn nominated(pod: &Value) -> bool {
    !str_at(pod, "/status/nominatedNodeName").is_empty()
}

impl Sim {
    /// Whether a change to `resource` can change what the cluster does.
    pub fn watches(resource: &ResourceKey) -> bool {
        resource.prefix == "/api/v1" && matches!(resource.plural.as_str(), "pods" | "nodes")
    }

    /// Takes note of a stored change: something to do, and whether parked pods may
    /// now fit. A new pending pod, a bind, a pod starting or being marked for deletion
    /// make no room (a terminating pod still holds what it had).
    pub fn note(&mut self, change: &Change) {
        if !Self::watches(&change.resource) {
            return;
        }
        self.dirty = true;
        if change.resource.plural == "nodes" {
            self.room = true;
            return;
        }
        let now = &change.object;
        match (change.kind, &change.old) {
            (ChangeKind::Deleted, _) => self.room |= holds(now) || nominated(now),
            (ChangeKind::Modified, Some(old)) => {
                self.room |= holds(old) && !holds(now);
                self.room |= nominated(old) && !nominated(now) && !bound(now);
                // A pending pod changed by its owner (tolerations, say) is retried.
                if !bound(now) && old.get("spec") != now.get("spec") {
                    if let Some(uid) = meta_str(now, "uid") {
                        self.parked.remove(uid);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Runs the enabled parts until the cluster is settled (`force`: at least one
/// scheduling pass, enabled or not).
pub(crate) fn settle(shared: &Shared, force: bool) {
    let mut store = shared.lock();
    let mut force = force;
    for _ in 0..MAX_ROUNDS {
        let (sched, kubelet) = (store.sim.scheduler, store.sim.kubelet);
        if !(force || (store.sim.dirty && (sched || kubelet))) {
            return;
        }
        store.sim.dirty = false;
        if sched || force {
            scheduler::run(&mut store);
        }
        if kubelet {
            kubelet::run(&mut store, shared);
        }
        force = false;
    }
    if store.sim.dirty {
        tracing::warn!("fake cluster: still changing after {MAX_ROUNDS} rounds");
    }
}
