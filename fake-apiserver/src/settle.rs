//! When the opt-in cluster behaviour (scheduler, kubelet) runs: after every change to
//! pods or nodes, synchronously, before the request that made the change is answered,
//! until nothing more changes. Above the scheduler and the kubelet; the state it reads
//! is the store's [`crate::sim::Sim`].

use crate::{kubelet, scheduler, Shared};

/// Rounds of scheduling and kubelet work after one change; each round only acts on
/// what the previous one changed, so a handful always suffice.
const MAX_ROUNDS: usize = 16;

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
