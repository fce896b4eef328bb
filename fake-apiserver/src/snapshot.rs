//! The cluster as the scheduler sees it for one pass: every pod with its priority and
//! request, every node with what its pods hold. Like kube-scheduler's cache, a pod
//! bound to a node holds its request until it is gone or finished (`Succeeded` or
//! `Failed`): a terminating pod still counts.

use std::sync::Arc;

use serde_json::Value;

use crate::fields::{finished, meta_str, str_at};
use crate::filters;
use crate::path::ResourceKey;
use crate::resources::{self, Amounts};
use crate::select::Selector;
use crate::store::Store;

pub(crate) fn pods_key() -> ResourceKey {
    ResourceKey::new("/api/v1", "pods")
}

pub(crate) fn nodes_key() -> ResourceKey {
    ResourceKey::new("/api/v1", "nodes")
}

pub(crate) struct PodView {
    pub ns: String,
    pub name: String,
    pub uid: String,
    pub obj: Arc<Value>,
    /// `spec.priority` (0 when unset, as `PodPriority` reads it).
    pub priority: i64,
    /// The effective request, or why it cannot be read.
    pub request: Result<Amounts, String>,
    /// The node it is bound to and holds resources on.
    pub node: Option<usize>,
    /// `status.nominatedNodeName`, for a pod that is not bound.
    pub nominated: Option<String>,
}

impl PodView {
    pub fn request(&self) -> Amounts {
        self.request.clone().unwrap_or_default()
    }

    pub fn terminating(&self) -> bool {
        self.obj.pointer("/metadata/deletionTimestamp").is_some()
    }

    pub fn pending(&self) -> bool {
        pending(&self.obj)
    }

    /// When it started (`status.startTime`); a pod that has not started counts as
    /// starting now, as kube-scheduler's `GetPodStartTime` has it.
    pub fn start_time(&self) -> chrono::DateTime<chrono::Utc> {
        self.obj
            .pointer("/status/startTime")
            .and_then(Value::as_str)
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map_or(chrono::DateTime::<chrono::Utc>::MAX_UTC, |t| t.to_utc())
    }
}

pub(crate) struct NodeView {
    pub name: String,
    pub obj: Arc<Value>,
    pub allocatable: Amounts,
    /// What the pods bound here hold, and how many there are.
    pub used: Amounts,
    pub pods: i128,
    pub members: Vec<usize>,
}

pub(crate) struct Snapshot {
    pub pods: Vec<PodView>,
    pub nodes: Vec<NodeView>,
    /// The pods with a nominated node (few), so that checking a node does not walk
    /// every pod.
    nominees: Vec<usize>,
}

/// Waiting to be scheduled: not bound, not being deleted, not finished, and for the
/// default scheduler (pods naming another `schedulerName` are not ours).
pub(crate) fn pending(pod: &Value) -> bool {
    let bound = !str_at(pod, "/spec/nodeName").is_empty();
    let scheduler = str_at(pod, "/spec/schedulerName");
    !bound
        && pod.get("spec").is_some_and(Value::is_object)
        && pod.pointer("/metadata/deletionTimestamp").is_none()
        && !finished(pod)
        && (scheduler.is_empty() || scheduler == "default-scheduler")
}

/// A node's verdict for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Fits,
    /// A filter that preemption cannot change (selector, taint, cordon).
    Unresolvable(String),
    /// NodeResourcesFit: what is short.
    Insufficient(Vec<String>),
}

impl Verdict {
    pub fn reasons(&self) -> Vec<String> {
        match self {
            Verdict::Fits => Vec::new(),
            Verdict::Unresolvable(r) => vec![r.clone()],
            Verdict::Insufficient(rs) => rs.clone(),
        }
    }
}

impl Snapshot {
    pub fn take(store: &Store) -> Self {
        let all = Selector::default();
        let mut nodes: Vec<NodeView> = store
            .list(&nodes_key(), None, &all)
            .into_iter()
            .map(|obj| NodeView {
                name: meta_str(&obj, "name").unwrap_or("").to_owned(),
                allocatable: resources::allocatable(&obj),
                obj,
                used: Amounts::new(),
                pods: 0,
                members: Vec::new(),
            })
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut snap = Snapshot {
            pods: Vec::new(),
            nodes,
            nominees: Vec::new(),
        };
        for obj in store.list(&pods_key(), None, &all) {
            let node_name = str_at(&obj, "/spec/nodeName");
            let holds = !node_name.is_empty() && !finished(&obj);
            let node = holds.then(|| snap.node_index(node_name)).flatten();
            let nominated = Some(str_at(&obj, "/status/nominatedNodeName"))
                .filter(|n| !n.is_empty() && node_name.is_empty())
                .map(str::to_owned);
            let view = PodView {
                ns: meta_str(&obj, "namespace").unwrap_or("").to_owned(),
                name: meta_str(&obj, "name").unwrap_or("").to_owned(),
                uid: meta_str(&obj, "uid").unwrap_or("").to_owned(),
                priority: obj
                    .pointer("/spec/priority")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                request: resources::pod_request(&obj),
                node: None,
                nominated,
                obj,
            };
            let p = snap.pods.len();
            if view.nominated.is_some() {
                snap.nominees.push(p);
            }
            snap.pods.push(view);
            if let Some(n) = node {
                snap.place(p, n);
            }
        }
        snap
    }

    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
    }

    /// Counts pod `p` on node `n`.
    pub fn place(&mut self, p: usize, n: usize) {
        let request = self.pods[p].request();
        let node = &mut self.nodes[n];
        resources::add_to(&mut node.used, &request);
        node.pods += 1;
        node.members.push(p);
        self.pods[p].node = Some(n);
        self.nominate(p, None);
    }

    /// Records pod `p`'s nominated node (`None`: no nomination).
    pub fn nominate(&mut self, p: usize, node: Option<String>) {
        self.nominees.retain(|&i| i != p);
        if node.is_some() {
            self.nominees.push(p);
        }
        self.pods[p].nominated = node;
    }

    /// The pods nominated to node `n`.
    pub fn nominated_to(&self, n: usize) -> impl Iterator<Item = usize> + '_ {
        let name = self.nodes[n].name.as_str();
        self.nominees
            .iter()
            .copied()
            .filter(move |&i| self.pods[i].nominated.as_deref() == Some(name))
    }

    /// Stops counting pod `p` where it was (it is gone).
    pub fn unplace(&mut self, p: usize) {
        let Some(n) = self.pods[p].node.take() else {
            return;
        };
        let request = self.pods[p].request();
        let node = &mut self.nodes[n];
        resources::sub_from(&mut node.used, &request);
        node.pods -= 1;
        node.members.retain(|&m| m != p);
    }

    /// What NodeResourcesFit says about pod `p` on node `n` if the node's pods held
    /// `used` (and were `count`), with the pods nominated to the node that are at
    /// least as important as `p` counted as if they ran there: the room a preemption
    /// made is kept for its preemptor ("Pod Priority and Preemption").
    pub fn insufficient_with(
        &self,
        p: usize,
        n: usize,
        used: &Amounts,
        count: i128,
    ) -> Vec<String> {
        let pod = &self.pods[p];
        let node = &self.nodes[n];
        let mut used = used.clone();
        let mut count = count;
        for i in self.nominated_to(n) {
            let other = &self.pods[i];
            if i != p && other.node.is_none() && other.priority >= pod.priority && other.pending() {
                resources::add_to(&mut used, &other.request());
                count += 1;
            }
        }
        resources::insufficient(&pod.request(), &node.allocatable, &used, count)
    }

    /// Every filter, in kube-scheduler's order, for pod `p` on node `n`.
    pub fn verdict(&self, p: usize, n: usize) -> Verdict {
        let node = &self.nodes[n];
        if let Some(why) = filters::reject(&self.pods[p].obj, &node.obj) {
            return Verdict::Unresolvable(why);
        }
        let short = self.insufficient_with(p, n, &node.used, node.pods);
        if short.is_empty() {
            Verdict::Fits
        } else {
            Verdict::Insufficient(short)
        }
    }
}
