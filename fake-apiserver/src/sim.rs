//! The state of the opt-in cluster behaviour (scheduler, kubelet) that the store holds:
//! what is switched on, and what changed since the last pass ([`Sim::note`], called by
//! the store for every change). [`crate::settle`] runs the passes.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::change::{Change, ChangeKind};
use crate::fields::{finished, meta_str, str_at};
use crate::path::ResourceKey;

/// Picks a started pod's IP address (the cluster's network plugin); `None` leaves
/// the kubelet's own choice.
pub(crate) type PodNetwork = std::sync::Arc<dyn Fn(&Value) -> Option<String> + Send + Sync>;

#[derive(Default)]
pub(crate) struct Sim {
    /// The network plugin, if the test gave one ([`crate::FakeApiServer::set_pod_network`]).
    pub pod_network: Option<PodNetwork>,
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
