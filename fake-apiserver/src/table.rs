//! The `Table` form of gets and lists ("Receiving resources as Tables"), which
//! `kubectl get` asks for with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`:
//! the columns kube-apiserver's printers give pods, nodes, namespaces and (core)
//! events, every column included as the server always sends them (`-o wide` only
//! shows more), and the default columns (`Name`, `Created At`) for any other
//! resource, as its default table convertor gives them. Each row carries the object's
//! metadata (`includeObject=Metadata`, the default), the whole object
//! (`includeObject=Object`) or nothing (`None`).

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::path::ResourceKey;

/// What a row carries besides its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Include {
    None,
    Metadata,
    Object,
}

/// A request for the Table form, and which version of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wanted {
    api_version: &'static str,
    include: Include,
}

/// Whether the request's `Accept` asks for a Table (`as=Table;g=meta.k8s.io`, `v1` or
/// `v1beta1`, `v1` preferred where both are listed), and what its rows carry.
pub(crate) fn wanted(
    headers: &http::HeaderMap,
    params: &std::collections::HashMap<String, String>,
) -> Option<Wanted> {
    let accept = headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let mut versions = accept.split(',').filter_map(|media| {
        let mut parts = media.split(';').map(str::trim);
        if !parts.next()?.eq_ignore_ascii_case("application/json") {
            return None;
        }
        let (mut table, mut group, mut version) = (false, false, None);
        for param in parts {
            match param.split_once('=')? {
                ("as", "Table") => table = true,
                ("g", "meta.k8s.io") => group = true,
                ("v", "v1") => version = Some("meta.k8s.io/v1"),
                ("v", "v1beta1") => version = Some("meta.k8s.io/v1beta1"),
                _ => {}
            }
        }
        (table && group).then_some(version).flatten()
    });
    let first = versions.next()?;
    let api_version = if first == "meta.k8s.io/v1" || versions.any(|v| v == "meta.k8s.io/v1") {
        "meta.k8s.io/v1"
    } else {
        first
    };
    let include = match params.get("includeObject").map(String::as_str) {
        Some("None") => Include::None,
        Some("Object") => Include::Object,
        _ => Include::Metadata,
    };
    Some(Wanted {
        api_version,
        include,
    })
}

/// A column: name, type, format, priority (0: always shown; 1: with `-o wide`).
type Column = (&'static str, &'static str, &'static str, u8);
/// The cells of one object's row, at a time (ages are relative to it).
type Cells = fn(&Value, DateTime<Utc>) -> Vec<Value>;

const POD: &[Column] = &[
    ("Name", "string", "name", 0),
    ("Ready", "string", "", 0),
    ("Status", "string", "", 0),
    ("Restarts", "string", "", 0),
    ("Age", "string", "", 0),
    ("IP", "string", "", 1),
    ("Node", "string", "", 1),
    ("Nominated Node", "string", "", 1),
    ("Readiness Gates", "string", "", 1),
];
const NODE: &[Column] = &[
    ("Name", "string", "name", 0),
    ("Status", "string", "", 0),
    ("Roles", "string", "", 0),
    ("Age", "string", "", 0),
    ("Version", "string", "", 0),
    ("Internal-IP", "string", "", 1),
    ("External-IP", "string", "", 1),
    ("OS-Image", "string", "", 1),
    ("Kernel-Version", "string", "", 1),
    ("Container-Runtime", "string", "", 1),
];
const EVENT: &[Column] = &[
    ("Last Seen", "string", "", 0),
    ("Type", "string", "", 0),
    ("Reason", "string", "", 0),
    ("Object", "string", "", 0),
    ("Subobject", "string", "", 1),
    ("Source", "string", "", 1),
    ("Message", "string", "", 0),
    ("First Seen", "string", "", 1),
    ("Count", "string", "", 1),
    ("Name", "string", "", 1),
];
const NAMESPACE: &[Column] = &[
    ("Name", "string", "name", 0),
    ("Status", "string", "", 0),
    ("Age", "string", "", 0),
];
const DEFAULT: &[Column] = &[("Name", "string", "name", 0), ("Created At", "date", "", 0)];

impl Wanted {
    /// `objects` of `resource` as a Table; `metadata` is the list's (resource
    /// version, continue token).
    pub(crate) fn table(
        &self,
        resource: &ResourceKey,
        objects: &[std::sync::Arc<Value>],
        metadata: Value,
        now: DateTime<Utc>,
    ) -> Value {
        let core = resource.group().is_empty();
        let (columns, cells): (&[Column], Cells) = match resource.plural.as_str() {
            "pods" if core => (POD, pod),
            "nodes" if core => (NODE, node),
            "events" if core => (EVENT, event),
            "namespaces" if core => (NAMESPACE, namespace),
            _ => (DEFAULT, default),
        };
        let definitions: Vec<Value> = columns
            .iter()
            .map(|(name, kind, format, priority)| {
                json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
            })
            .collect();
        let rows: Vec<Value> = objects
            .iter()
            .map(|obj| {
                let mut row = json!({"cells": cells(obj, now)});
                match self.include {
                    Include::None => {}
                    Include::Metadata => {
                        row["object"] = json!({
                            "kind": "PartialObjectMetadata",
                            "apiVersion": self.api_version,
                            "metadata": obj["metadata"],
                        });
                    }
                    Include::Object => row["object"] = (**obj).clone(),
                }
                row
            })
            .collect();
        json!({
            "kind": "Table",
            "apiVersion": self.api_version,
            "metadata": metadata,
            "columnDefinitions": definitions,
            "rows": rows,
        })
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_owned()
    } else {
        s.to_owned()
    }
}

/// Time since an RFC 3339 timestamp, as kubectl writes ages (`<unknown>` without one).
fn since(timestamp: &Value, now: DateTime<Utc>) -> String {
    match timestamp
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
    {
        Some(t) => human_duration(now - t.with_timezone(&Utc)),
        None => "<unknown>".to_owned(),
    }
}

/// apimachinery's `duration.HumanDuration`: `45s`, `3m20s`, `2h5m`, `3d4h`, `2y10d`.
pub(crate) fn human_duration(d: chrono::TimeDelta) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    let pair = |big: i64, unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{unit}")
        } else {
            format!("{big}{unit}{small}{small_unit}")
        }
    };
    if minutes < 10 {
        return pair(minutes, "m", seconds % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        return pair(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return pair(hours / 24, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return pair(hours / 24 / 365, "y", (hours / 24) % 365, "d");
    }
    format!("{}y", hours / 24 / 365)
}

fn name(obj: &Value) -> Value {
    obj["metadata"]["name"].clone()
}

/// kubectl's `printPod`: ready containers, the status a person reads (a waiting or
/// terminated container's reason, `Terminating` while a deletion runs), restarts.
fn pod(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let spec = &obj["spec"];
    let status = &obj["status"];
    let total = spec["containers"].as_array().map_or(0, Vec::len);
    let mut reason = match text(&status["reason"]) {
        "" => text(&status["phase"]).to_owned(),
        r => r.to_owned(),
    };
    let mut ready = 0;
    let mut restarts = 0;
    let mut running = false;
    let statuses = status["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for container in statuses.iter().rev() {
        restarts += container["restartCount"].as_i64().unwrap_or(0);
        let state = &container["state"];
        let waiting = text(&state["waiting"]["reason"]);
        let terminated = &state["terminated"];
        if !waiting.is_empty() {
            reason = waiting.to_owned();
        } else if !text(&terminated["reason"]).is_empty() {
            reason = text(&terminated["reason"]).to_owned();
        } else if terminated.is_object() {
            reason = match terminated["signal"].as_i64().unwrap_or(0) {
                0 => format!("ExitCode:{}", terminated["exitCode"].as_i64().unwrap_or(0)),
                signal => format!("Signal:{signal}"),
            };
        } else if container["ready"] == true && state["running"].is_object() {
            running = true;
            ready += 1;
        }
    }
    if reason == "Completed" && running {
        let pod_ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        reason = if pod_ready { "Running" } else { "NotReady" }.to_owned();
    }
    let terminal = matches!(text(&status["phase"]), "Succeeded" | "Failed");
    if !obj["metadata"]["deletionTimestamp"].is_null() {
        if text(&status["reason"]) == "NodeLost" {
            reason = "Unknown".to_owned();
        } else if !terminal {
            reason = "Terminating".to_owned();
        }
    }
    let gates = spec["readinessGates"].as_array().map_or(0, Vec::len);
    let gates = if gates == 0 {
        "<none>".to_owned()
    } else {
        let met = spec["readinessGates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| {
                status["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
            })
            .count();
        format!("{met}/{gates}")
    };
    vec![
        name(obj),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts.to_string()),
        json!(since(&obj["metadata"]["creationTimestamp"], now)),
        json!(or_none(text(&status["podIP"]))),
        json!(or_none(text(&spec["nodeName"]))),
        json!(or_none(text(&status["nominatedNodeName"]))),
        json!(gates),
    ]
}

/// kubectl's `printNode`: `Ready`/`NotReady`/`Unknown` from the Ready condition,
/// `SchedulingDisabled` when cordoned, roles from `node-role.kubernetes.io/*`.
fn node(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let status = &obj["status"];
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready");
    let mut state = match ready {
        Some(c) if c["status"] == "True" => "Ready".to_owned(),
        Some(_) => "NotReady".to_owned(),
        None => "Unknown".to_owned(),
    };
    if obj["spec"]["unschedulable"] == true {
        state.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = obj["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                Some(role.to_owned())
            } else if k == "kubernetes.io/role" {
                Some(text(v).to_owned())
            } else {
                None
            }
        })
        .filter(|r| !r.is_empty())
        .collect();
    roles.sort();
    roles.dedup();
    let address = |kind: &str| {
        status["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["type"] == kind)
            .map_or_else(|| "<none>".to_owned(), |a| text(&a["address"]).to_owned())
    };
    let info = &status["nodeInfo"];
    let unknown = |v: &Value| match text(v) {
        "" => "<unknown>".to_owned(),
        s => s.to_owned(),
    };
    vec![
        name(obj),
        json!(state),
        json!(or_none(&roles.join(","))),
        json!(since(&obj["metadata"]["creationTimestamp"], now)),
        json!(text(&info["kubeletVersion"])),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(unknown(&info["osImage"])),
        json!(unknown(&info["kernelVersion"])),
        json!(unknown(&info["containerRuntimeVersion"])),
    ]
}

/// kubectl's `printEvent` of a core Event: last and first seen (the event time and
/// series of an events.k8s.io-style event where the deprecated timestamps are
/// missing), `kind/name` of the object, the source or reporting controller.
fn event(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let first = match &obj["firstTimestamp"] {
        Value::String(_) => since(&obj["firstTimestamp"], now),
        _ => since(&obj["eventTime"], now),
    };
    let mut last = match &obj["lastTimestamp"] {
        Value::String(_) => since(&obj["lastTimestamp"], now),
        _ => first.clone(),
    };
    let mut count = obj["count"].as_i64().unwrap_or(0);
    if obj["series"].is_object() {
        last = since(&obj["series"]["lastObservedTime"], now);
        count = obj["series"]["count"].as_i64().unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let involved = &obj["involvedObject"];
    let kind = text(&involved["kind"]).to_lowercase();
    let target = match text(&involved["name"]) {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    let component_instance = |component: &str, instance: &str| {
        if instance.is_empty() {
            component.to_owned()
        } else {
            format!("{component}, {instance}")
        }
    };
    let source = match text(&obj["source"]["component"]) {
        "" => component_instance(
            text(&obj["reportingComponent"]),
            text(&obj["reportingInstance"]),
        ),
        c => component_instance(c, text(&obj["source"]["host"])),
    };
    vec![
        json!(last),
        obj["type"].clone(),
        obj["reason"].clone(),
        json!(target),
        json!(text(&involved["fieldPath"])),
        json!(source),
        json!(text(&obj["message"]).trim()),
        json!(first),
        json!(count),
        name(obj),
    ]
}

fn namespace(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let phase = match text(&obj["status"]["phase"]) {
        "" => "Active",
        p => p,
    };
    vec![
        name(obj),
        json!(phase),
        json!(since(&obj["metadata"]["creationTimestamp"], now)),
    ]
}

fn default(obj: &Value, _now: DateTime<Utc>) -> Vec<Value> {
    vec![name(obj), obj["metadata"]["creationTimestamp"].clone()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn accept(value: &str) -> Option<Wanted> {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::ACCEPT, value.parse().unwrap());
        wanted(&headers, &HashMap::new())
    }

    #[test]
    fn kubectls_accept_asks_for_a_v1_table() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(accept(kubectl).unwrap().api_version, "meta.k8s.io/v1");
        assert_eq!(
            accept("application/json;as=Table;v=v1beta1;g=meta.k8s.io")
                .unwrap()
                .api_version,
            "meta.k8s.io/v1beta1"
        );
        assert_eq!(accept("application/json"), None);
        assert_eq!(accept("application/json;as=Table;v=v1;g=other.io"), None);
    }

    #[test]
    fn ages_read_as_kubectl_writes_them() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (300, "5m"),
            (3_000, "50m"),
            (4 * 3600 + 300, "4h5m"),
            (20 * 3600, "20h"),
            (3 * 86_400 + 4 * 3600, "3d4h"),
            (30 * 86_400, "30d"),
            (3 * 365 * 86_400 + 10 * 86_400, "3y10d"),
        ];
        for (seconds, text) in cases {
            assert_eq!(
                human_duration(TimeDelta::seconds(seconds)),
                text,
                "{seconds}s"
            );
        }
        assert_eq!(human_duration(TimeDelta::seconds(-5)), "<invalid>");
    }

    #[test]
    fn a_pod_row_says_what_kubectl_shows() {
        let now = Utc::now();
        let created = (now - TimeDelta::seconds(200)).to_rfc3339();
        let pod = json!({
            "metadata": {"name": "jupyter-bob", "namespace": "jhub", "creationTimestamp": created},
            "spec": {"nodeName": "gpu-a100-0", "containers": [{"name": "notebook"}]},
            "status": {"phase": "Running", "podIP": "127.0.0.2", "containerStatuses": [
                {"name": "notebook", "ready": true, "restartCount": 0, "state": {"running": {}}}]},
        });
        let wanted = Wanted {
            api_version: "meta.k8s.io/v1",
            include: Include::Metadata,
        };
        let key = ResourceKey::new("/api/v1", "pods");
        let table = wanted.table(&key, &[Arc::new(pod.clone())], json!({}), now);
        assert_eq!(
            table["rows"][0]["cells"],
            json!([
                "jupyter-bob",
                "1/1",
                "Running",
                "0",
                "3m20s",
                "127.0.0.2",
                "gpu-a100-0",
                "<none>",
                "<none>"
            ])
        );
        assert_eq!(table["rows"][0]["object"]["metadata"]["namespace"], "jhub");
        assert_eq!(table["columnDefinitions"][2]["name"], "Status");
        let mut ending = pod;
        ending["metadata"]["deletionTimestamp"] = json!(now.to_rfc3339());
        assert_eq!(super::pod(&ending, now)[2], "Terminating");
        let other = wanted.table(
            &ResourceKey::new("/apis/coordination.k8s.io/v1", "leases"),
            &[Arc::new(
                json!({"metadata": {"name": "l", "creationTimestamp": "2026-01-01T00:00:00Z"}}),
            )],
            json!({}),
            now,
        );
        assert_eq!(
            other["rows"][0]["cells"],
            json!(["l", "2026-01-01T00:00:00Z"])
        );
    }

    #[test]
    fn a_recorded_event_reads_with_its_reporting_controller() {
        let now = Utc::now();
        let event = json!({
            "metadata": {"name": "e1"},
            "eventTime": (now - TimeDelta::seconds(30)).to_rfc3339(),
            "type": "Normal", "reason": "GPUProcessesReclaimed",
            "involvedObject": {"kind": "Pod", "name": "jupyter-bob"},
            "reportingComponent": "gpu-booking-agent", "reportingInstance": "gpu-a100-0",
            "message": "ended PID 42\n",
        });
        assert_eq!(
            super::event(&event, now),
            vec![
                json!("30s"),
                json!("Normal"),
                json!("GPUProcessesReclaimed"),
                json!("pod/jupyter-bob"),
                json!(""),
                json!("gpu-booking-agent, gpu-a100-0"),
                json!("ended PID 42"),
                json!("30s"),
                json!(1),
                json!("e1"),
            ]
        );
    }
}
