//! Which low-priority pods give way when a booked user needs a unit of a model.

use std::collections::{HashMap, HashSet};

use crate::inventory::pod_model;
use crate::pods::{PodInfo, Priority};

/// The pods to preempt so that `needed` units of `model` come free: low-priority pods
/// holding a GPU of that model (never a high-priority pod, never another model's,
/// never one already terminating or being acted on), least recently used first (the
/// last GPU activity the node agent reported, else the start), until their units
/// cover `needed`. Empty when nothing qualifies.
pub fn choose<'a>(
    pods: impl IntoIterator<Item = &'a PodInfo>,
    model: &str,
    node_models: &HashMap<String, Option<String>>,
    needed: u64,
    busy: &HashSet<String>,
) -> Vec<&'a PodInfo> {
    let mut candidates: Vec<&PodInfo> = pods
        .into_iter()
        .filter(|p| {
            p.priority == Some(Priority::Low)
                && p.holds_gpu()
                && !p.deleting
                && !busy.contains(&p.uid)
                && pod_model(p, node_models).as_deref() == Some(model)
        })
        .collect();
    // Unknown times sort first (`None` < `Some`): a pod that never reported is the
    // least recently used we know of. Names break ties, so the choice is stable.
    candidates.sort_by(|a, b| {
        (a.last_used(), &a.namespace, &a.name).cmp(&(b.last_used(), &b.namespace, &b.name))
    });
    let mut freed = 0u64;
    let mut out = Vec::new();
    for pod in candidates {
        if freed >= needed {
            break;
        }
        freed += pod.gpu.as_ref().map_or(0, |g| g.units);
        out.push(pod);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::GpuUse;
    use chrono::{DateTime, Utc};

    fn t(s: &str) -> Option<DateTime<Utc>> {
        Some(s.parse().unwrap())
    }

    fn pod(name: &str, node: &str, priority: Priority, started: &str) -> PodInfo {
        PodInfo {
            namespace: "jhub".into(),
            name: name.into(),
            uid: name.into(),
            priority: Some(priority),
            booking_id: None,
            model_label: None,
            user: None,
            terminate_at: None,
            owned: false,
            node: Some(node.into()),
            finished: false,
            deleting: false,
            gpu: Some(GpuUse {
                units: 1,
                model: None,
            }),
            started: t(started),
            last_activity: None,
            scheduler_preempted: false,
            unschedulable: false,
        }
    }

    #[test]
    fn oldest_low_priority_pod_of_the_model() {
        let nodes: HashMap<String, Option<String>> = [
            ("a".to_owned(), Some("a100".to_owned())),
            ("b".to_owned(), Some("a6000".to_owned())),
        ]
        .into();
        let pods = vec![
            pod("new-low", "a", Priority::Low, "2026-01-03T00:00:00Z"),
            pod("old-low", "a", Priority::Low, "2026-01-02T00:00:00Z"),
            pod("oldest-high", "a", Priority::High, "2026-01-01T00:00:00Z"),
            pod(
                "oldest-other-model",
                "b",
                Priority::Low,
                "2026-01-01T00:00:00Z",
            ),
        ];
        let names = |v: Vec<&PodInfo>| v.into_iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(choose(&pods, "a100", &nodes, 1, &HashSet::new())),
            ["old-low"]
        );
        assert_eq!(
            names(choose(&pods, "a100", &nodes, 2, &HashSet::new())),
            ["old-low", "new-low"]
        );
        assert!(choose(&pods, "h100", &nodes, 1, &HashSet::new()).is_empty());
        // One being acted on is not chosen again.
        let busy = HashSet::from(["old-low".to_owned()]);
        assert_eq!(names(choose(&pods, "a100", &nodes, 1, &busy)), ["new-low"]);
    }

    #[test]
    fn gpu_activity_wins_over_start() {
        let nodes: HashMap<String, Option<String>> =
            [("a".to_owned(), Some("a100".to_owned()))].into();
        let mut busy_old = pod("old-but-active", "a", Priority::Low, "2026-01-01T00:00:00Z");
        busy_old.last_activity = t("2026-01-05T00:00:00Z");
        let mut idle_new = pod("new-but-idle", "a", Priority::Low, "2026-01-03T00:00:00Z");
        idle_new.last_activity = t("2026-01-03T01:00:00Z");
        let pods = [busy_old, idle_new];
        let chosen = choose(&pods, "a100", &nodes, 1, &HashSet::new());
        assert_eq!(chosen[0].name, "new-but-idle");
    }
}
