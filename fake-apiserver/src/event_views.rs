//! Events are one resource served by two APIs: the core group's `v1` Event
//! (`involvedObject`, `message`, what `kubectl get events` and `kubectl describe`
//! read) and `events.k8s.io/v1` (`regarding`, `note`, what kube-runtime's `Recorder`
//! writes). kube-apiserver stores them once and converts between the two on the way
//! out (`pkg/apis/events/v1` conversion), so a get or a list of either API sees the
//! events written through the other, converted, and so does a watch.

use std::sync::Arc;

use serde_json::Value;

use crate::event_convert::{convert, other};
use crate::path::ResourceKey;
use crate::select::Selector;
use crate::store::Store;

/// `ns/name` of `resource`: stored, else the other API's, converted.
pub(crate) fn get(
    store: &Store,
    resource: &ResourceKey,
    ns: &str,
    name: &str,
) -> Option<Arc<Value>> {
    store.get(resource, ns, name).or_else(|| {
        let other = other(resource)?;
        let obj = store.get(&other, ns, name)?;
        Some(Arc::new(convert(&obj, resource)))
    })
}

/// The objects of `resource` in `ns` (or all) that `sel` selects, the other API's
/// Events converted and selected as this API's fields name them.
pub(crate) fn list(
    store: &Store,
    resource: &ResourceKey,
    ns: Option<&str>,
    sel: &Selector,
) -> Vec<Arc<Value>> {
    let mut all = store.list(resource, ns, sel);
    if let Some(other) = other(resource) {
        all.extend(
            store
                .list(&other, ns, &Selector::default())
                .iter()
                .map(|obj| convert(obj, resource))
                .filter(|obj| sel.matches(obj))
                .map(Arc::new),
        );
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_convert::{CORE, EVENTS};
    use crate::select::{FieldSelector, LabelSelector};
    use serde_json::json;

    fn recorded() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "nb.1", "namespace": "jhub"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "gpu-booking-agent", "reportingInstance": "gpu-a100-0",
            "action": "Reclaim", "reason": "GPUProcessesReclaimed", "type": "Normal",
            "regarding": {"kind": "Pod", "namespace": "jhub", "name": "jupyter-bob", "uid": "u1"},
            "note": "ended PID 42",
        })
    }

    #[test]
    fn an_event_written_through_events_k8s_io_reads_as_a_core_event() {
        let mut store = Store::new();
        store
            .create(
                &ResourceKey::new(EVENTS, "events"),
                Some("jhub"),
                recorded(),
            )
            .expect("stored");
        let core = ResourceKey::new(CORE, "events");
        let fields = FieldSelector::parse(
            "involvedObject.name=jupyter-bob,involvedObject.kind=Pod,involvedObject.uid=u1",
            &core,
        )
        .expect("core field labels");
        let sel = Selector {
            labels: LabelSelector::default(),
            fields,
        };
        let found = list(&store, &core, Some("jhub"), &sel);
        assert_eq!(found.len(), 1, "the describe's selector finds it");
        let event = &found[0];
        assert_eq!(event["apiVersion"], "v1");
        assert_eq!(event["message"], "ended PID 42");
        assert_eq!(event["involvedObject"]["name"], "jupyter-bob");
        assert_eq!(event["reportingComponent"], "gpu-booking-agent");
        assert!(event.get("note").is_none() && event.get("regarding").is_none());
        let other_pod = FieldSelector::parse("involvedObject.name=jupyter-carol", &core).unwrap();
        let sel = Selector {
            labels: LabelSelector::default(),
            fields: other_pod,
        };
        assert!(list(&store, &core, None, &sel).is_empty());
        let got = get(&store, &core, "jhub", "nb.1").expect("a get finds it too");
        assert_eq!(got["reason"], "GPUProcessesReclaimed");
        // And back: a core Event reads as an events.k8s.io one.
        let back = convert(&got, &ResourceKey::new(EVENTS, "events"));
        assert_eq!(back["note"], "ended PID 42");
        assert_eq!(back["regarding"]["uid"], "u1");
    }

    #[test]
    fn a_watch_of_core_events_sees_those_written_through_events_k8s_io() {
        // KubeSpawner's spawn progress: a core watch of a namespace's Pod Events,
        // which sees the Events kube-runtime's Recorder writes.
        let mut store = Store::new();
        let core = ResourceKey::new(CORE, "events");
        let sel = Selector {
            labels: LabelSelector::default(),
            fields: FieldSelector::parse("involvedObject.kind=Pod", &core).unwrap(),
        };
        let since = store
            .create(
                &ResourceKey::new(CORE, "configmaps"),
                Some("jhub"),
                json!({"metadata": {"name": "x"}}),
            )
            .expect("stored")["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok());
        let mut rx = store
            .watch(core, Some("jhub".into()), sel, since)
            .expect("watching");
        store
            .create(
                &ResourceKey::new(EVENTS, "events"),
                Some("jhub"),
                recorded(),
            )
            .expect("stored");
        let line = rx.try_recv().expect("the core watch saw the event");
        let seen: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(seen["type"], "ADDED");
        assert_eq!(seen["object"]["apiVersion"], "v1");
        assert_eq!(seen["object"]["message"], "ended PID 42");
        assert_eq!(seen["object"]["involvedObject"]["name"], "jupyter-bob");
        assert_eq!(
            seen["object"]["lastTimestamp"],
            Value::Null,
            "present, null"
        );
        assert_eq!(seen["object"]["eventTime"], "2026-01-01T00:00:00.000000Z");
        // Elsewhere, or not a Pod's: not seen.
        let mut elsewhere = recorded();
        elsewhere["metadata"] = json!({"name": "nb.2", "namespace": "other"});
        store
            .create(
                &ResourceKey::new(EVENTS, "events"),
                Some("other"),
                elsewhere,
            )
            .expect("stored");
        let mut node = recorded();
        node["metadata"]["name"] = json!("nb.3");
        node["regarding"]["kind"] = json!("Node");
        store
            .create(&ResourceKey::new(EVENTS, "events"), Some("jhub"), node)
            .expect("stored");
        assert!(rx.try_recv().is_err());
    }
}
