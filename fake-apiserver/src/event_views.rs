//! Events are one resource served by two APIs: the core group's `v1` Event
//! (`involvedObject`, `message`, what `kubectl get events` and `kubectl describe`
//! read) and `events.k8s.io/v1` (`regarding`, `note`, what kube-runtime's `Recorder`
//! writes). kube-apiserver stores them once and converts between the two on the way
//! out (`pkg/apis/events/v1` conversion), so a get or a list of either API sees the
//! events written through the other, converted. Watches see the writes of their own
//! API only.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::path::ResourceKey;
use crate::select::Selector;
use crate::store::Store;

const CORE: &str = "/api/v1";
const EVENTS: &str = "/apis/events.k8s.io/v1";

/// Field pairs: the core `v1` name, the `events.k8s.io/v1` name.
const RENAMED: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// Fields of the same name in both.
const SAME: [&str; 7] = [
    "metadata",
    "reason",
    "type",
    "eventTime",
    "series",
    "action",
    "related",
];

/// The other API's Event resource, for an Event resource of one.
fn other(resource: &ResourceKey) -> Option<ResourceKey> {
    if resource.plural != "events" {
        return None;
    }
    match resource.prefix.as_str() {
        CORE => Some(ResourceKey::new(EVENTS, "events")),
        EVENTS => Some(ResourceKey::new(CORE, "events")),
        _ => None,
    }
}

/// An Event of the other API as the API of `resource` serves it.
fn convert(obj: &Value, resource: &ResourceKey) -> Value {
    let to_core = resource.prefix == CORE;
    let mut out = Map::new();
    out.insert("apiVersion".into(), resource.api_version().into());
    out.insert("kind".into(), "Event".into());
    let mut copy = |from: &str, to: &str| {
        if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
            out.insert(to.to_owned(), v.clone());
        }
    };
    for field in SAME {
        copy(field, field);
    }
    for (core, events) in RENAMED {
        if to_core {
            copy(events, core);
        } else {
            copy(core, events);
        }
    }
    Value::Object(out)
}

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
}
