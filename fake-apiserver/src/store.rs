//! The objects, their resource versions, the recent change history and the open
//! watches. Everything is synchronous and behind one lock, so each change and its
//! watch events happen atomically (a watch never misses or repeats a change).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::change::{Change, ChangeKind};
use crate::fields::meta_str;
use crate::path::ResourceKey;
use crate::select::Selector;
use crate::sim::Sim;
use crate::status::ApiError;
use crate::{Failure, PodDeletion, Verb};

/// Objects of one resource by (namespace, name); cluster-scoped objects have `""`.
type Objects = BTreeMap<(String, String), Arc<Value>>;

/// An open watch.
pub(crate) struct Watch {
    pub resource: ResourceKey,
    pub namespace: Option<String>,
    pub selector: Selector,
    pub tx: mpsc::UnboundedSender<Bytes>,
}

impl Watch {
    /// The event line this change means to this watch, if any: a modification that
    /// makes an object leave (enter) the selection reads as DELETED (ADDED).
    fn line(&self, change: &Change) -> Option<Bytes> {
        // An Event written through the other Event API is one of this API's too,
        // converted: kube-apiserver stores them once ([`crate::event_convert`]).
        let converted;
        let change = match crate::event_convert::as_seen_by(change, &self.resource) {
            Some(seen) => {
                converted = seen;
                &converted
            }
            None => change,
        };
        if change.resource != self.resource
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != change.namespace)
        {
            return None;
        }
        let now = self.selector.matches(&change.object);
        let kind = match (change.kind, &change.old) {
            (ChangeKind::Modified, Some(old)) => match (self.selector.matches(old), now) {
                (true, true) => "MODIFIED",
                (true, false) => "DELETED",
                (false, true) => "ADDED",
                (false, false) => return None,
            },
            (kind, _) if now => match kind {
                ChangeKind::Added => "ADDED",
                ChangeKind::Modified => "MODIFIED",
                ChangeKind::Deleted => "DELETED",
            },
            _ => return None,
        };
        Some(event_line(kind, &change.object))
    }
}

/// One line of a watch: a `WatchEvent` of `kind` about `object`.
fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// The main resource: everything but the status.
    Main,
    /// A subresource (`status`, `approval`): only the status.
    Status,
    /// A test hook: everything, status included.
    Whole,
}

pub(crate) type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

pub(crate) struct Store {
    pub rv: u64,
    pub objects: HashMap<ResourceKey, Objects>,
    /// The kind of each resource, learned from the objects written to it.
    pub kinds: HashMap<ResourceKey, String>,
    pub history: VecDeque<Change>,
    pub history_limit: usize,
    /// Changes up to this resource version have left the history.
    pub forgotten_rv: u64,
    pub watches: Vec<Watch>,
    pub counts: HashMap<(Verb, String), u64>,
    pub log: Option<Vec<crate::RequestRecord>>,
    pub failures: Vec<Failure>,
    pub pod_deletion: PodDeletion,
    pub clock: Clock,
    pub serial: u64,
    /// The opt-in scheduler and kubelet.
    pub sim: Sim,
}

pub(crate) fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl Store {
    /// The name a create gives `obj` (its `metadata.name`, else `generateName` plus a
    /// serial), after checking that it is an object with a `metadata` map; the one
    /// rule for the API's creates and admission's dry runs.
    pub(crate) fn name_for_create(
        &mut self,
        plural: &str,
        obj: &mut Value,
    ) -> Result<String, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body is not a JSON object"));
        }
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        match meta_str(obj, "name").filter(|n| !n.is_empty()) {
            Some(name) => Ok(name.to_owned()),
            None => match meta_str(obj, "generateName") {
                Some(prefix) => {
                    self.serial += 1;
                    Ok(format!("{prefix}{:05x}", self.serial & 0xfffff))
                }
                None => Err(ApiError::invalid(
                    plural,
                    "",
                    "metadata.name or metadata.generateName is required",
                )),
            },
        }
    }

    pub fn new() -> Self {
        Self {
            rv: 1,
            objects: HashMap::new(),
            kinds: HashMap::new(),
            history: VecDeque::new(),
            history_limit: 10_000,
            forgotten_rv: 1,
            watches: Vec::new(),
            counts: HashMap::new(),
            log: Some(Vec::new()),
            failures: Vec::new(),
            pod_deletion: PodDeletion::WaitForKubelet,
            clock: Arc::new(Utc::now),
            serial: 0,
            sim: Default::default(),
        }
    }

    pub fn now(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Records a change and hands it to every watch that selects it.
    fn publish(&mut self, change: Change) {
        self.sim.note(&change);
        self.watches.retain(|w| match w.line(&change) {
            Some(line) => w.tx.send(line).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push_back(change);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.forgotten_rv = old.rv;
            }
        }
    }

    pub fn get(&self, resource: &ResourceKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(resource)?
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    }

    pub fn list(
        &self,
        resource: &ResourceKey,
        ns: Option<&str>,
        sel: &Selector,
    ) -> Vec<Arc<Value>> {
        let Some(objects) = self.objects.get(resource) else {
            return Vec::new();
        };
        objects
            .iter()
            .filter(|((ons, _), _)| ns.is_none_or(|ns| ns == ons))
            .filter(|(_, obj)| sel.matches(obj))
            .map(|(_, obj)| obj.clone())
            .collect()
    }

    /// Opens a watch; replays the changes after `since` (410 Gone when they are no
    /// longer all kept). Without `since` (or `0`), it begins as kube-apiserver's does
    /// ("Resource versions", watch semantics: "Get State and Start at Most Recent",
    /// "Start at Any"): with a synthetic `ADDED` event for each object there now.
    pub fn watch(
        &mut self,
        resource: ResourceKey,
        namespace: Option<String>,
        selector: Selector,
        since: Option<u64>,
    ) -> Result<mpsc::UnboundedReceiver<Bytes>, ApiError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watch = Watch {
            resource,
            namespace,
            selector,
            tx,
        };
        if let Some(since) = since.filter(|&rv| rv > 0) {
            if since < self.forgotten_rv {
                return Err(ApiError::gone(format!(
                    "too old resource version: {since} ({})",
                    self.forgotten_rv
                )));
            }
            for change in self.history.iter().filter(|c| c.rv > since) {
                if let Some(line) = watch.line(change) {
                    let _ = watch.tx.send(line);
                }
            }
        } else {
            let now = self.list(&watch.resource, watch.namespace.as_deref(), &watch.selector);
            for object in now {
                let _ = watch.tx.send(event_line("ADDED", &object));
            }
        }
        self.watches.push(watch);
        Ok(rx)
    }

    /// Stores a new object, filling in what the API server fills in.
    pub fn create(
        &mut self,
        resource: &ResourceKey,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let plural = resource.plural.as_str();
        let name = self.name_for_create(plural, &mut obj)?;
        let ns_key = ns.unwrap_or("").to_owned();
        if let (Some(url_ns), Some(body_ns)) = (ns, meta_str(&obj, "namespace")) {
            if url_ns != body_ns {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the object ({body_ns}) does not match the namespace on the request ({url_ns})"
                )));
            }
        }
        if self.get(resource, &ns_key, &name).is_some() {
            return Err(ApiError::already_exists(plural, &name));
        }
        let rv = self.next_rv();
        self.serial += 1;
        let uid = format!("00000000-0000-4000-8000-{:012x}", self.serial);
        let now = timestamp(self.now());
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        if let Some(ns) = ns {
            meta["namespace"] = json!(ns);
        }
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(now);
        if let Some(m) = meta.as_object_mut() {
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
        }
        self.fill_type(resource, &mut obj);
        if plural == "pods"
            && resource.prefix == "/api/v1"
            && obj.pointer("/status/phase").is_none()
        {
            obj["status"] = json!({"phase": "Pending"});
        }
        let obj = Arc::new(obj);
        self.objects
            .entry(resource.clone())
            .or_default()
            .insert((ns_key.clone(), name), obj.clone());
        self.publish(Change {
            rv,
            resource: resource.clone(),
            namespace: ns_key,
            kind: ChangeKind::Added,
            object: obj.clone(),
            old: None,
        });
        Ok(obj)
    }

    /// `apiVersion` and `kind`: learned from the object, or filled in from what the
    /// resource held before.
    fn fill_type(&mut self, resource: &ResourceKey, obj: &mut Value) {
        obj["apiVersion"] = json!(resource.api_version());
        match obj.get("kind").and_then(Value::as_str) {
            Some(kind) if !kind.is_empty() => {
                self.kinds.insert(resource.clone(), kind.to_owned());
            }
            _ => {
                if let Some(kind) = self.kinds.get(resource) {
                    obj["kind"] = json!(kind);
                }
            }
        }
    }

    /// Writes `new` over the stored object, keeping what clients cannot change:
    /// identity, creation time, deletion marks, and the status (main resource) or
    /// everything but the status (a subresource such as `status` or `approval`).
    /// No change, no new resource version and no event, as the API server does.
    pub fn update(
        &mut self,
        resource: &ResourceKey,
        ns: &str,
        name: &str,
        write: Write,
        new: Value,
    ) -> Result<Arc<Value>, ApiError> {
        self.update_checked(resource, ns, name, write, new, &|_, _, _| Ok(()))
    }

    /// [`Self::update`], after `check` (admission) accepted the object that would
    /// replace the stored one.
    pub fn update_checked(
        &mut self,
        resource: &ResourceKey,
        ns: &str,
        name: &str,
        write: Write,
        mut new: Value,
        check: &dyn Fn(&Store, &Value, &Value) -> Result<(), ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let plural = resource.plural.as_str();
        let old = self
            .get(resource, ns, name)
            .ok_or_else(|| ApiError::not_found(plural, name))?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the body is not a JSON object"));
        }
        if let Some(rv) = meta_str(&new, "resourceVersion").filter(|rv| !rv.is_empty()) {
            if Some(rv) != meta_str(&old, "resourceVersion") {
                return Err(ApiError::conflict(
                    plural,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
        }
        if meta_str(&new, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "the name of the object does not match the URL",
            ));
        }
        if write == Write::Status {
            let status = new.get("status").cloned();
            new = (*old).clone();
            match status {
                Some(status) => new["status"] = status,
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        } else {
            if !new.get("metadata").is_some_and(Value::is_object) {
                new["metadata"] = json!({});
            }
            for key in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ] {
                match old["metadata"].get(key) {
                    Some(v) => new["metadata"][key] = v.clone(),
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove(key);
                        }
                    }
                }
            }
            if write == Write::Main && resource.prefix == "/api/v1" && plural == "pods" {
                crate::validation::pod_update(&old, &new).map_err(|why| {
                    ApiError::invalid(plural, name, format!("Pod \"{name}\" is invalid: {why}"))
                })?;
            }
            if write == Write::Main {
                match old.get("status") {
                    Some(status) => new["status"] = status.clone(),
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
        }
        self.fill_type(resource, &mut new);
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        check(self, &old, &new)?;
        if new == *old {
            return Ok(old);
        }
        // A deleted object waits for its finalizers; the last one removed ends it.
        let finalized = new["metadata"].get("deletionTimestamp").is_some()
            && !has_finalizers(&new)
            && !self.waits_for_kubelet(resource, &new);
        let new = self.put_modified(resource, ns, name, new, old);
        if finalized {
            self.remove(resource, ns, name);
        }
        Ok(new)
    }

    /// Whether a terminating object is a pod that only its kubelet may remove.
    fn waits_for_kubelet(&self, resource: &ResourceKey, obj: &Value) -> bool {
        let is_pod = resource.prefix == "/api/v1" && resource.plural == "pods";
        let bound = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let finished = matches!(
            obj.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        is_pod && bound && !finished && self.pod_deletion == PodDeletion::WaitForKubelet
    }

    /// Deletes as the API server does: objects with finalizers, and pods bound to a
    /// node with a grace period, are marked (`deletionTimestamp`) and stay until their
    /// finalizers are gone or the kubelet (the test) says the pod is gone; everything
    /// else goes at once.
    pub fn delete(
        &mut self,
        resource: &ResourceKey,
        ns: &str,
        name: &str,
        options: &Value,
        grace_query: Option<i64>,
    ) -> Result<Arc<Value>, ApiError> {
        let plural = resource.plural.as_str();
        let old = self
            .get(resource, ns, name)
            .ok_or_else(|| ApiError::not_found(plural, name))?;
        for (field, key) in [("uid", "uid"), ("resourceVersion", "resourceVersion")] {
            if let Some(want) = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str)
            {
                if Some(want) != meta_str(&old, key) {
                    return Err(ApiError::conflict(
                        plural,
                        name,
                        &format!(
                            "Precondition failed: {field}: {want}, {field} in object meta: {}",
                            meta_str(&old, key).unwrap_or("")
                        ),
                    ));
                }
            }
        }
        let grace = grace_query
            .or_else(|| options.get("gracePeriodSeconds").and_then(Value::as_i64))
            .or_else(|| {
                old.pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
            })
            .unwrap_or(30);
        let kubelet = self.waits_for_kubelet(resource, &old) && grace > 0;
        if !kubelet && !has_finalizers(&old) {
            return Ok(self.remove(resource, ns, name).unwrap_or(old));
        }
        if old["metadata"].get("deletionTimestamp").is_some() {
            return Ok(old);
        }
        let mut new = (*old).clone();
        let at = self.now() + chrono::TimeDelta::seconds(if kubelet { grace } else { 0 });
        new["metadata"]["deletionTimestamp"] = json!(timestamp(at));
        new["metadata"]["deletionGracePeriodSeconds"] = json!(if kubelet { grace } else { 0 });
        let new = self.put_modified(resource, ns, name, new, old);
        if kubelet && self.pod_deletion == PodDeletion::Immediate && !has_finalizers(&new) {
            self.remove(resource, ns, name);
        }
        Ok(new)
    }

    /// Stores `new` in place of `old` under a new resourceVersion and publishes the
    /// MODIFIED change: an update and the start of a graceful deletion alike.
    fn put_modified(
        &mut self,
        resource: &ResourceKey,
        ns: &str,
        name: &str,
        mut new: Value,
        old: Arc<Value>,
    ) -> Arc<Value> {
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        let new = Arc::new(new);
        self.objects
            .entry(resource.clone())
            .or_default()
            .insert((ns.to_owned(), name.to_owned()), new.clone());
        self.publish(Change {
            rv,
            resource: resource.clone(),
            namespace: ns.to_owned(),
            kind: ChangeKind::Modified,
            object: new.clone(),
            old: Some(old),
        });
        new
    }

    /// Removes an object for good (a DELETED event), whatever marks it carries.
    pub fn remove(&mut self, resource: &ResourceKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        let old = self
            .objects
            .get_mut(resource)?
            .remove(&(ns.to_owned(), name.to_owned()))?;
        let rv = self.next_rv();
        let mut gone = (*old).clone();
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        let gone = Arc::new(gone);
        self.publish(Change {
            rv,
            resource: resource.clone(),
            namespace: ns.to_owned(),
            kind: ChangeKind::Deleted,
            object: gone.clone(),
            old: None,
        });
        Some(gone)
    }

    /// Terminating objects without finalizers (pods whose kubelet has not confirmed).
    pub fn terminating(&self) -> Vec<(ResourceKey, String, String)> {
        self.objects
            .iter()
            .flat_map(|(resource, objects)| {
                objects
                    .iter()
                    .filter(|(_, o)| {
                        o["metadata"].get("deletionTimestamp").is_some() && !has_finalizers(o)
                    })
                    .map(move |((ns, name), _)| (resource.clone(), ns.clone(), name.clone()))
            })
            .collect()
    }

    /// The first injected failure that matches, used up by one.
    pub fn take_failure(&mut self, verb: Verb, plural: &str, name: Option<&str>) -> Option<u16> {
        let at = self
            .failures
            .iter()
            .position(|f| f.matches(verb, plural, name))?;
        let failure = &mut self.failures[at];
        let code = failure.code;
        match &mut failure.times {
            Some(1) => {
                self.failures.remove(at);
            }
            Some(n) => *n -= 1,
            None => {}
        }
        Some(code)
    }
}

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}
