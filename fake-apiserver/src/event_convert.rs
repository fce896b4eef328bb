//! Converting Events between the two APIs that serve them (see `event_views`), for
//! the reads and for the watches of the store, which must not depend on the
//! reads.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::change::Change;
use crate::path::ResourceKey;

pub(crate) const CORE: &str = "/api/v1";
pub(crate) const EVENTS: &str = "/apis/events.k8s.io/v1";

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

/// The times of a core `v1` Event, present (null when unset) in every one served.
const CORE_TIMES: [&str; 3] = ["eventTime", "firstTimestamp", "lastTimestamp"];

/// The other API's Event resource, for an Event resource of one.
pub(crate) fn other(resource: &ResourceKey) -> Option<ResourceKey> {
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
pub(crate) fn convert(obj: &Value, resource: &ResourceKey) -> Value {
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
    if to_core {
        // kube-apiserver writes a core Event's unset times as null (they are structs,
        // which `omitempty` does not omit): clients index them (KubeSpawner sorts its
        // events by `event["lastTimestamp"] or event["eventTime"]`).
        for time in CORE_TIMES {
            out.entry(time).or_insert(Value::Null);
        }
    }
    Value::Object(out)
}

/// A change to an Event of the other API, as a watch of `resource` sees it
/// (converted); `None` for any other change.
pub(crate) fn as_seen_by(change: &Change, resource: &ResourceKey) -> Option<Change> {
    if other(resource)? != change.resource {
        return None;
    }
    Some(Change {
        rv: change.rv,
        resource: resource.clone(),
        namespace: change.namespace.clone(),
        kind: change.kind,
        object: Arc::new(convert(&change.object, resource)),
        old: change.old.as_ref().map(|o| Arc::new(convert(o, resource))),
    })
}
