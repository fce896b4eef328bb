//! Priority preemption as kube-scheduler's DefaultPreemption plugin does it ("Pod
//! Priority and Preemption"): only a pod whose `preemptionPolicy` is not `Never`
//! preempts; victims are pods of strictly lower priority on one node; on each node all
//! of them are removed, then the most important (higher priority, then earlier start)
//! are reprieved one by one while the preemptor still fits; the node is the one whose
//! victims matter least. PodDisruptionBudgets are not consulted (the fake has none).

use std::cmp::Ordering;

use serde_json::Value;

use crate::fields::str_at;
use crate::resources;
use crate::snapshot::{Snapshot, Verdict};

/// What preemption decided for a pod that fits nowhere.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Preemption {
    /// Evict `victims` (pod indices) from node `node`, nominate the preemptor there.
    Evict { node: usize, victims: Vec<usize> },
    /// Nothing to do; the message kube-scheduler appends (`preemption: ...`), and
    /// whether the pod's nomination is cleared (no node where preemption could help).
    Not {
        message: String,
        clear_nomination: bool,
    },
}

/// The DisruptionTarget condition's reason on a pod preempted by the scheduler.
pub(crate) const PREEMPTION_REASON: &str = "PreemptionByScheduler";

fn preempted_by_scheduler(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            str_at(c, "/type") == "DisruptionTarget"
                && str_at(c, "/status") == "True"
                && str_at(c, "/reason") == PREEMPTION_REASON
        })
}

/// `PodEligibleToPreemptOthers`: `Never` does not preempt, and a pod whose nominated
/// node still has lower-priority pods terminating because of a preemption waits for
/// them instead of preempting again.
fn ineligible(snap: &Snapshot, p: usize, verdicts: &[Verdict]) -> Option<&'static str> {
    let pod = &snap.pods[p];
    if str_at(&pod.obj, "/spec/preemptionPolicy") == "Never" {
        return Some("not eligible due to preemptionPolicy=Never.");
    }
    let n = snap.node_index(pod.nominated.as_deref()?)?;
    if matches!(verdicts[n], Verdict::Unresolvable(_)) {
        return None;
    }
    snap.nodes[n]
        .members
        .iter()
        .map(|&m| &snap.pods[m])
        .any(|m| m.priority < pod.priority && m.terminating() && preempted_by_scheduler(&m.obj))
        .then_some("not eligible due to a terminating pod on the nominated node.")
}

/// `MoreImportantPod`: higher priority, then the one that started first.
fn more_important(snap: &Snapshot, a: usize, b: usize) -> Ordering {
    let (pa, pb) = (&snap.pods[a], &snap.pods[b]);
    pb.priority
        .cmp(&pa.priority)
        .then_with(|| pa.start_time().cmp(&pb.start_time()))
}

/// `selectVictimsOnNode`: the fewest and least important victims on node `n` that make
/// room for pod `p`, most important first; or why there are none.
fn victims_on(snap: &Snapshot, p: usize, n: usize) -> Result<Vec<usize>, Vec<String>> {
    let priority = snap.pods[p].priority;
    let node = &snap.nodes[n];
    let mut lower: Vec<usize> = node
        .members
        .iter()
        .copied()
        .filter(|&m| snap.pods[m].priority < priority)
        .collect();
    if lower.is_empty() {
        return Err(vec![
            "No preemption victims found for incoming pod".to_owned()
        ]);
    }
    let mut used = node.used.clone();
    let mut count = node.pods;
    for &m in &lower {
        resources::sub_from(&mut used, &snap.pods[m].request());
        count -= 1;
    }
    let short = snap.insufficient_with(p, n, &used, count);
    if !short.is_empty() {
        return Err(short);
    }
    lower.sort_by(|&a, &b| more_important(snap, a, b));
    let mut victims = Vec::new();
    for m in lower {
        let request = snap.pods[m].request();
        resources::add_to(&mut used, &request);
        if snap.insufficient_with(p, n, &used, count + 1).is_empty() {
            count += 1;
        } else {
            resources::sub_from(&mut used, &request);
            victims.push(m);
        }
    }
    Ok(victims)
}

/// `pickOneNodeForPreemption`'s criteria, in order: the lowest highest-priority
/// victim, the lowest sum of priorities, the fewest victims, the latest start among
/// the highest-priority victims; then the first node (by name).
fn pick(snap: &Snapshot, candidates: &[(usize, Vec<usize>)]) -> usize {
    let key = |victims: &[usize]| {
        let top = victims
            .iter()
            .map(|&v| snap.pods[v].priority)
            .max()
            .unwrap_or(i64::MIN);
        // kube-scheduler offsets each priority by MaxInt32+1 so that negative
        // priorities still add up to more victims being worse.
        let sum: i128 = victims
            .iter()
            .map(|&v| i128::from(snap.pods[v].priority) + i128::from(i32::MAX) + 1)
            .sum();
        let earliest_top = victims
            .iter()
            .filter(|&&v| snap.pods[v].priority == top)
            .map(|&v| snap.pods[v].start_time())
            .min();
        (top, sum, victims.len(), std::cmp::Reverse(earliest_top))
    };
    let mut best = 0;
    for i in 1..candidates.len() {
        if key(&candidates[i].1) < key(&candidates[best].1) {
            best = i;
        }
    }
    candidates[best].0
}

/// The PostFilter step for pod `p`, which no node fits (`verdicts`, one per node).
pub(crate) fn preempt(snap: &Snapshot, p: usize, verdicts: &[Verdict]) -> Preemption {
    if let Some(why) = ineligible(snap, p, verdicts) {
        return Preemption::Not {
            message: format!("preemption: {why}"),
            clear_nomination: false,
        };
    }
    let mut statuses: Vec<Vec<String>> = Vec::new();
    let mut candidates = Vec::new();
    let mut potential = 0;
    for (n, verdict) in verdicts.iter().enumerate() {
        match verdict {
            Verdict::Insufficient(_) => {
                potential += 1;
                match victims_on(snap, p, n) {
                    Ok(victims) => candidates.push((n, victims)),
                    Err(reasons) => statuses.push(reasons),
                }
            }
            _ => statuses.push(vec!["Preemption is not helpful for scheduling".to_owned()]),
        }
    }
    if candidates.is_empty() {
        return Preemption::Not {
            message: format!(
                "preemption: {}",
                crate::filters::fit_error(verdicts.len(), &statuses)
            ),
            clear_nomination: potential == 0,
        };
    }
    let node = pick(snap, &candidates);
    let victims = candidates
        .into_iter()
        .find(|(n, _)| *n == node)
        .map(|(_, v)| v)
        .unwrap_or_default();
    Preemption::Evict { node, victims }
}
