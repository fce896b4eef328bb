//! Which field labels a `fieldSelector` may name, resource by resource, and what each
//! reads from an object, as kube-apiserver has them: the field label conversion
//! functions (`AddFieldLabelConversionFunc` in `pkg/apis/<group>/<version>/conversion.go`)
//! decide which labels a request may use, and the registry's selectable fields
//! (`ToSelectableFields`, `NodeToSelectableFields`, ... in
//! `pkg/registry/<group>/<resource>/strategy.go`) what each label's value is.
//!
//! A resource with no conversion function of its own takes
//! `runtime.DefaultMetaV1FieldSelectorConversion` (`metadata.name` and
//! `metadata.namespace` only); a custom resource takes apiextensions' converter,
//! which allows the same two (the fake has no CRDs, so neither their scope nor their
//! `selectableFields`: every custom resource is read as namespaced, with no extra
//! fields).

use serde_json::Value;

use crate::path::ResourceKey;

/// How one label reads an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// The string at a JSON pointer; when absent or empty, the value the API server
    /// would have stored by defaulting (`SetDefaults_PodSpec`, `SetDefaults_Secret`,
    /// the namespace strategy's `PrepareForCreate`), which the fake does not write.
    Str(&'static str, &'static str),
    /// A boolean as Go's `strconv.FormatBool` writes it; absent is `false`.
    Bool(&'static str),
    /// An integer as `strconv.Itoa` writes it; absent is `0`.
    Int(&'static str),
    /// The pod's first IP: `status.podIP`, which wins when set (the v1 conversion
    /// `Convert_v1_PodStatus_To_core_PodStatus`), else `status.podIPs[0].ip`.
    PodIp,
    /// An event's source component, else its reporting controller, as the event
    /// strategy's `ToSelectableFields` does (pointers to the two).
    Source(&'static str, &'static str),
    /// A label the conversion allows but the selectable fields lack, so it reads as
    /// `""` (a pod's `status.podIPs`).
    Nothing,
}

impl Read {
    pub(crate) fn read(self, obj: &Value) -> String {
        let text = |pointer: &str| {
            obj.pointer(pointer)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        match self {
            Read::Str(pointer, default) => text(pointer).unwrap_or(default).to_owned(),
            Read::Bool(pointer) => {
                let b = obj.pointer(pointer).and_then(Value::as_bool);
                b.unwrap_or(false).to_string()
            }
            Read::Int(pointer) => {
                let n = obj.pointer(pointer).and_then(Value::as_i64);
                n.unwrap_or(0).to_string()
            }
            Read::PodIp => text("/status/podIP")
                .or_else(|| text("/status/podIPs/0/ip"))
                .unwrap_or("")
                .to_owned(),
            Read::Source(source, reporting) => text(source)
                .or_else(|| text(reporting))
                .unwrap_or("")
                .to_owned(),
            Read::Nothing => String::new(),
        }
    }
}

type Labels = &'static [(&'static str, Read)];

const NAME: (&str, Read) = ("metadata.name", Read::Str("/metadata/name", ""));
const NAMESPACE: (&str, Read) = ("metadata.namespace", Read::Str("/metadata/namespace", ""));

/// core/v1 Pod. `spec.host` is the old name of `spec.nodeName`, still converted.
const POD: Labels = &[
    NAME,
    NAMESPACE,
    ("spec.nodeName", Read::Str("/spec/nodeName", "")),
    ("spec.host", Read::Str("/spec/nodeName", "")),
    (
        "spec.restartPolicy",
        Read::Str("/spec/restartPolicy", "Always"),
    ),
    (
        "spec.schedulerName",
        Read::Str("/spec/schedulerName", "default-scheduler"),
    ),
    (
        "spec.serviceAccountName",
        Read::Str("/spec/serviceAccountName", ""),
    ),
    ("spec.hostNetwork", Read::Bool("/spec/hostNetwork")),
    ("status.phase", Read::Str("/status/phase", "")),
    ("status.podIP", Read::PodIp),
    ("status.podIPs", Read::Nothing),
    (
        "status.nominatedNodeName",
        Read::Str("/status/nominatedNodeName", ""),
    ),
];

/// core/v1 Node: cluster scoped, so no `metadata.namespace`.
const NODE: Labels = &[
    NAME,
    ("spec.unschedulable", Read::Bool("/spec/unschedulable")),
];

const NAMESPACE_KIND: Labels = &[NAME, ("status.phase", Read::Str("/status/phase", "Active"))];

const SECRET: Labels = &[NAME, NAMESPACE, ("type", Read::Str("/type", "Opaque"))];

const SERVICE: Labels = &[
    NAME,
    NAMESPACE,
    ("spec.clusterIP", Read::Str("/spec/clusterIP", "")),
    ("spec.type", Read::Str("/spec/type", "ClusterIP")),
];

const REPLICATION_CONTROLLER: Labels = &[
    NAME,
    NAMESPACE,
    ("status.replicas", Read::Int("/status/replicas")),
];

/// core/v1 Event.
const EVENT: Labels = &[
    NAME,
    NAMESPACE,
    ("involvedObject.kind", Read::Str("/involvedObject/kind", "")),
    (
        "involvedObject.namespace",
        Read::Str("/involvedObject/namespace", ""),
    ),
    ("involvedObject.name", Read::Str("/involvedObject/name", "")),
    ("involvedObject.uid", Read::Str("/involvedObject/uid", "")),
    (
        "involvedObject.apiVersion",
        Read::Str("/involvedObject/apiVersion", ""),
    ),
    (
        "involvedObject.resourceVersion",
        Read::Str("/involvedObject/resourceVersion", ""),
    ),
    (
        "involvedObject.fieldPath",
        Read::Str("/involvedObject/fieldPath", ""),
    ),
    ("reason", Read::Str("/reason", "")),
    ("reportingComponent", Read::Str("/reportingComponent", "")),
    (
        "source",
        Read::Source("/source/component", "/reportingComponent"),
    ),
    ("type", Read::Str("/type", "")),
];

/// events.k8s.io/v1 Event: its own names (`regarding`, `reportingController`), which
/// its conversion maps onto the core event's selectable fields.
const EVENTS_V1: Labels = &[
    NAME,
    NAMESPACE,
    ("regarding.kind", Read::Str("/regarding/kind", "")),
    ("regarding.namespace", Read::Str("/regarding/namespace", "")),
    ("regarding.name", Read::Str("/regarding/name", "")),
    ("regarding.uid", Read::Str("/regarding/uid", "")),
    (
        "regarding.apiVersion",
        Read::Str("/regarding/apiVersion", ""),
    ),
    (
        "regarding.resourceVersion",
        Read::Str("/regarding/resourceVersion", ""),
    ),
    ("regarding.fieldPath", Read::Str("/regarding/fieldPath", "")),
    ("reason", Read::Str("/reason", "")),
    ("reportingController", Read::Str("/reportingController", "")),
    (
        "source",
        Read::Source("/deprecatedSource/component", "/reportingController"),
    ),
    ("type", Read::Str("/type", "")),
];

/// batch/v1 Job: `status.successful` is `status.succeeded`.
const JOB: Labels = &[
    NAME,
    NAMESPACE,
    ("status.successful", Read::Int("/status/succeeded")),
];

/// certificates.k8s.io CertificateSigningRequest: cluster scoped.
const CSR: Labels = &[NAME, ("spec.signerName", Read::Str("/spec/signerName", ""))];

/// `metadata.name` and `metadata.namespace`: the default conversion, and a namespaced
/// custom resource's. A cluster-scoped object has no namespace and reads `""`. This
/// covers apps/v1 ReplicaSets too: the field selectors page lists `status.replicas`
/// for them, but apps/v1 registers no conversion function, so the server refuses it.
const META: Labels = &[NAME, NAMESPACE];

/// How the API server words a refusal.
enum Refusal {
    /// The core group's, certificates', events.k8s.io's and apiextensions' wording.
    NotSupported,
    /// batch/v1's (`field label %q not supported for batchv1.Job`).
    Job,
    /// `DefaultMetaV1FieldSelectorConversion`'s.
    Default,
}

fn labels_of(resource: &ResourceKey) -> (Labels, Refusal) {
    use Refusal::*;
    match (resource.group(), resource.plural.as_str()) {
        ("", "pods") => (POD, NotSupported),
        ("", "nodes") => (NODE, NotSupported),
        ("", "namespaces") => (NAMESPACE_KIND, NotSupported),
        ("", "secrets") => (SECRET, NotSupported),
        ("", "services") => (SERVICE, NotSupported),
        ("", "replicationcontrollers") => (REPLICATION_CONTROLLER, NotSupported),
        ("", "events") => (EVENT, NotSupported),
        ("events.k8s.io", "events") => (EVENTS_V1, NotSupported),
        ("batch", "jobs") => (JOB, Job),
        ("certificates.k8s.io", "certificatesigningrequests") => (CSR, NotSupported),
        (group, _) if built_in(group) => (META, Default),
        _ => (META, NotSupported),
    }
}

/// A Kubernetes API group rather than a CRD's: the core group, a group with no dot (a
/// CRD's group must have one), or one under `k8s.io`.
fn built_in(group: &str) -> bool {
    !group.contains('.') || group.ends_with(".k8s.io")
}

/// How `label` reads objects of `resource`, or the API server's refusal of it.
pub(crate) fn field_label(resource: &ResourceKey, label: &str) -> Result<Read, String> {
    let (labels, refusal) = labels_of(resource);
    if let Some((_, read)) = labels.iter().find(|(name, _)| *name == label) {
        return Ok(*read);
    }
    Err(match refusal {
        Refusal::NotSupported => format!("field label not supported: {label}"),
        Refusal::Job => format!("field label {label:?} not supported for batchv1.Job"),
        Refusal::Default => format!(
            "{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn core(plural: &str) -> ResourceKey {
        ResourceKey::new("/api/v1", plural)
    }

    fn group(gv: &str, plural: &str) -> ResourceKey {
        ResourceKey::new(format!("/apis/{gv}"), plural)
    }

    #[test]
    fn supported_and_refused_per_resource() {
        let cases: [(ResourceKey, &[&str], &[&str]); 10] = [
            (
                core("pods"),
                &[
                    "metadata.name",
                    "metadata.namespace",
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "spec.hostNetwork",
                    "status.phase",
                    "status.podIP",
                    "status.podIPs",
                    "status.nominatedNodeName",
                ],
                &[
                    "spec.containers",
                    "metadata.labels",
                    "status.hostIP",
                    "foo.bar",
                ],
            ),
            (
                core("nodes"),
                &["metadata.name", "spec.unschedulable"],
                &["metadata.namespace", "spec.nodeName"],
            ),
            (
                core("namespaces"),
                &["metadata.name", "status.phase"],
                &["metadata.namespace", "name"],
            ),
            (
                core("secrets"),
                &["metadata.name", "metadata.namespace", "type"],
                &["data"],
            ),
            (
                core("events"),
                &[
                    "involvedObject.kind",
                    "involvedObject.uid",
                    "reason",
                    "reportingComponent",
                    "source",
                    "type",
                ],
                &["regarding.kind", "reportingController", "message"],
            ),
            (
                group("events.k8s.io/v1", "events"),
                &[
                    "regarding.kind",
                    "regarding.name",
                    "reportingController",
                    "source",
                    "type",
                ],
                &["involvedObject.kind", "reportingComponent", "note"],
            ),
            (
                group("batch/v1", "jobs"),
                &["metadata.namespace", "status.successful"],
                &["status.succeeded"],
            ),
            (
                group("apps/v1", "replicasets"),
                &["metadata.name", "metadata.namespace"],
                &["status.replicas"],
            ),
            (
                core("configmaps"),
                &["metadata.name", "metadata.namespace"],
                &["data"],
            ),
            (
                group("example.com/v1", "widgets"),
                &["metadata.name", "metadata.namespace"],
                &["spec.user", "status.phase"],
            ),
        ];
        for (resource, yes, no) in cases {
            for label in yes {
                assert!(
                    field_label(&resource, label).is_ok(),
                    "{resource:?} {label}"
                );
            }
            for label in no {
                assert!(
                    field_label(&resource, label).is_err(),
                    "{resource:?} {label}"
                );
            }
        }
    }

    #[test]
    fn refusals_are_worded_as_the_server_words_them() {
        let err = |r: &ResourceKey| field_label(r, "foo.bar").unwrap_err();
        assert_eq!(err(&core("pods")), "field label not supported: foo.bar");
        assert_eq!(
            err(&group("example.com/v1", "widgets")),
            "field label not supported: foo.bar"
        );
        assert_eq!(
            err(&group("batch/v1", "jobs")),
            "field label \"foo.bar\" not supported for batchv1.Job"
        );
        assert_eq!(
            err(&group("networking.k8s.io/v1", "ingresses")),
            "\"foo.bar\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
    }

    #[test]
    fn values_read_as_the_selectable_fields_give_them() {
        let read =
            |r: &ResourceKey, label: &str, obj: &Value| field_label(r, label).unwrap().read(obj);
        let pods = core("pods");
        let bare = json!({"metadata": {"name": "p", "namespace": "ns"}});
        assert_eq!(read(&pods, "spec.nodeName", &bare), "");
        assert_eq!(read(&pods, "spec.hostNetwork", &bare), "false");
        assert_eq!(read(&pods, "spec.restartPolicy", &bare), "Always");
        assert_eq!(
            read(&pods, "spec.schedulerName", &bare),
            "default-scheduler"
        );
        let pod = json!({"spec": {"hostNetwork": true, "nodeName": "n1"},
                         "status": {"podIPs": [{"ip": "10.0.0.2"}]}});
        assert_eq!(read(&pods, "spec.hostNetwork", &pod), "true");
        assert_eq!(read(&pods, "spec.host", &pod), "n1");
        assert_eq!(read(&pods, "status.podIP", &pod), "10.0.0.2");
        assert_eq!(read(&pods, "status.podIPs", &pod), "");
        assert_eq!(read(&core("nodes"), "spec.unschedulable", &bare), "false");
        assert_eq!(
            read(&group("batch/v1", "jobs"), "status.successful", &bare),
            "0"
        );
        let job = json!({"status": {"succeeded": 3}});
        assert_eq!(
            read(&group("batch/v1", "jobs"), "status.successful", &job),
            "3"
        );
        assert_eq!(read(&core("secrets"), "type", &bare), "Opaque");
        let event = json!({"reportingComponent": "kubelet"});
        assert_eq!(read(&core("events"), "source", &event), "kubelet");
        let event = json!({"reportingComponent": "x", "source": {"component": "kubelet"}});
        assert_eq!(read(&core("events"), "source", &event), "kubelet");
    }
}
