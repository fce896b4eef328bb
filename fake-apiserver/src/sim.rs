//! The opt-in cluster behaviour (scheduler, kubelet) and when it runs: after every
//! change to pods or nodes, synchronously, before the request that made the change is
//! answered, until nothing more changes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::path::ResourceKey;
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
}

impl Sim {
    /// Whether a change to `resource` can change what the cluster does.
    pub fn watches(resource: &ResourceKey) -> bool {
        resource.prefix == "/api/v1" && matches!(resource.plural.as_str(), "pods" | "nodes")
    }
}

/// Runs the enabled parts until the cluster is settled (`force`: at least one
/// scheduling pass, enabled or not).
pub(crate) fn settle(shared: &Arc<Shared>, force: bool) {
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
