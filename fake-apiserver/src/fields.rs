//! The readings of an API object's JSON that every part of the fake shares (the store,
//! the scheduler's snapshot and filters, the kubelet, the simulation's bookkeeping):
//! the lowest layer, importing nothing of the crate.

use serde_json::Value;

/// The string at a JSON pointer; `""` when absent or not a string.
pub(crate) fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A string field of `metadata`.
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// A pod that ran to its end (`Succeeded` or `Failed`).
pub(crate) fn finished(pod: &Value) -> bool {
    matches!(str_at(pod, "/status/phase"), "Succeeded" | "Failed")
}
