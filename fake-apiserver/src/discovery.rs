//! Discovery, as kube-apiserver serves it to clients that map a resource name to its
//! URL (`kubectl get pods`): `/version`, `/api` (APIVersions), `/apis` (APIGroupList),
//! `/apis/<group>` (APIGroup), `/api/v1` and `/apis/<group>/<version>`
//! (APIResourceList). These are the unaggregated documents ("Discovery API"): a client
//! that asks for the aggregated `apidiscovery.k8s.io/v2` form lists `application/json`
//! as its fallback and gets them, as from a server without aggregated discovery.
//!
//! The lists name the resources the lab uses, with the kinds, scopes, verbs, short
//! names and subresources kube-apiserver gives them; the fake serves other resources
//! by URL shape too, but does not advertise them.

use serde_json::{json, Value};

/// Every verb of a full REST resource.
const ALL: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Namespaces and the like: no deletecollection.
const NO_COLLECTION: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];
const CREATE: &[&str] = &["create"];
const STATUS: &[&str] = &["get", "patch", "update"];

/// One advertised resource.
struct Resource {
    /// `pods`, or `pods/status` for a subresource.
    name: &'static str,
    kind: &'static str,
    namespaced: bool,
    verbs: &'static [&'static str],
    short_names: &'static [&'static str],
    /// `all` for what `kubectl get all` shows.
    categories: &'static [&'static str],
}

const fn resource(
    name: &'static str,
    kind: &'static str,
    namespaced: bool,
    verbs: &'static [&'static str],
) -> Resource {
    Resource {
        name,
        kind,
        namespaced,
        verbs,
        short_names: &[],
        categories: &[],
    }
}

const fn short(mut r: Resource, names: &'static [&'static str]) -> Resource {
    r.short_names = names;
    r
}

/// A group version and its resources; the first version of a group is preferred.
struct GroupVersion {
    group: &'static str,
    version: &'static str,
    resources: &'static [Resource],
}

const CORE: &[Resource] = &[
    short(resource("configmaps", "ConfigMap", true, ALL), &["cm"]),
    short(resource("endpoints", "Endpoints", true, ALL), &["ep"]),
    short(resource("events", "Event", true, ALL), &["ev"]),
    short(
        resource("namespaces", "Namespace", false, NO_COLLECTION),
        &["ns"],
    ),
    resource("namespaces/finalize", "Namespace", false, &["update"]),
    resource("namespaces/status", "Namespace", false, STATUS),
    short(resource("nodes", "Node", false, ALL), &["no"]),
    resource("nodes/status", "Node", false, STATUS),
    short(
        resource("persistentvolumeclaims", "PersistentVolumeClaim", true, ALL),
        &["pvc"],
    ),
    Resource {
        categories: &["all"],
        ..short(resource("pods", "Pod", true, ALL), &["po"])
    },
    resource("pods/binding", "Binding", true, CREATE),
    resource("pods/eviction", "Eviction", true, CREATE),
    resource("pods/status", "Pod", true, STATUS),
    resource("secrets", "Secret", true, ALL),
    short(
        resource("serviceaccounts", "ServiceAccount", true, ALL),
        &["sa"],
    ),
    resource("serviceaccounts/token", "TokenRequest", true, CREATE),
    Resource {
        categories: &["all"],
        ..short(
            resource("services", "Service", true, NO_COLLECTION),
            &["svc"],
        )
    },
];

const GROUPS: &[GroupVersion] = &[
    GroupVersion {
        group: "admissionregistration.k8s.io",
        version: "v1",
        resources: &[
            resource(
                "mutatingwebhookconfigurations",
                "MutatingWebhookConfiguration",
                false,
                ALL,
            ),
            resource(
                "validatingadmissionpolicies",
                "ValidatingAdmissionPolicy",
                false,
                ALL,
            ),
            resource(
                "validatingadmissionpolicies/status",
                "ValidatingAdmissionPolicy",
                false,
                STATUS,
            ),
            resource(
                "validatingadmissionpolicybindings",
                "ValidatingAdmissionPolicyBinding",
                false,
                ALL,
            ),
            resource(
                "validatingwebhookconfigurations",
                "ValidatingWebhookConfiguration",
                false,
                ALL,
            ),
        ],
    },
    GroupVersion {
        group: "authentication.k8s.io",
        version: "v1",
        resources: &[resource("tokenreviews", "TokenReview", false, CREATE)],
    },
    GroupVersion {
        group: "certificates.k8s.io",
        version: "v1",
        resources: &[
            short(
                resource(
                    "certificatesigningrequests",
                    "CertificateSigningRequest",
                    false,
                    ALL,
                ),
                &["csr"],
            ),
            resource(
                "certificatesigningrequests/approval",
                "CertificateSigningRequest",
                false,
                STATUS,
            ),
            resource(
                "certificatesigningrequests/status",
                "CertificateSigningRequest",
                false,
                STATUS,
            ),
        ],
    },
    GroupVersion {
        group: "coordination.k8s.io",
        version: "v1",
        resources: &[resource("leases", "Lease", true, ALL)],
    },
    GroupVersion {
        group: "events.k8s.io",
        version: "v1",
        resources: &[short(resource("events", "Event", true, ALL), &["ev"])],
    },
    GroupVersion {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        resources: &[
            resource("clusterrolebindings", "ClusterRoleBinding", false, ALL),
            resource("clusterroles", "ClusterRole", false, ALL),
            resource("rolebindings", "RoleBinding", true, ALL),
            resource("roles", "Role", true, ALL),
        ],
    },
    GroupVersion {
        group: "scheduling.k8s.io",
        version: "v1",
        resources: &[short(
            resource("priorityclasses", "PriorityClass", false, ALL),
            &["pc"],
        )],
    },
];

/// The Kubernetes version the fake answers as.
fn version() -> Value {
    json!({
        "major": "1",
        "minor": "30",
        "gitVersion": "v1.30.0-fake",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn version_of(gv: &GroupVersion) -> Value {
    json!({"groupVersion": format!("{}/{}", gv.group, gv.version), "version": gv.version})
}

fn group(gv: &GroupVersion) -> Value {
    json!({
        "name": gv.group,
        "versions": [version_of(gv)],
        "preferredVersion": version_of(gv),
    })
}

fn resource_list(group_version: &str, resources: &[Resource]) -> Value {
    let items: Vec<Value> = resources
        .iter()
        .map(|r| {
            let singular = if r.name.contains('/') {
                String::new()
            } else {
                r.kind.to_lowercase()
            };
            let mut item = json!({
                "name": r.name,
                "singularName": singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": r.verbs,
            });
            if !r.short_names.is_empty() {
                item["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                item["categories"] = json!(r.categories);
            }
            item
        })
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": items,
    })
}

/// The kind of the advertised `resource`, if it is one.
pub(crate) fn kind_of(resource: &crate::path::ResourceKey) -> Option<&'static str> {
    let resources = match resource.group() {
        "" => CORE,
        group => {
            GROUPS
                .iter()
                .find(|gv| {
                    gv.group == group && resource.api_version() == format!("{group}/{}", gv.version)
                })?
                .resources
        }
    };
    resources
        .iter()
        .find(|r| r.name == resource.plural)
        .map(|r| r.kind)
}

/// The discovery document at `path`, if `path` is one.
pub(crate) fn document(path: &str) -> Option<Value> {
    let path = path.trim_end_matches('/');
    match path {
        "/version" => return Some(version()),
        "/api" => {
            return Some(json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [],
            }))
        }
        "/api/v1" => return Some(resource_list("v1", CORE)),
        "/apis" => {
            return Some(json!({
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": GROUPS.iter().map(group).collect::<Vec<_>>(),
            }))
        }
        _ => {}
    }
    let rest = path.strip_prefix("/apis/")?;
    let gv = match rest.split_once('/') {
        Some((name, version)) => GROUPS
            .iter()
            .find(|gv| gv.group == name && gv.version == version)?,
        None => {
            let gv = GROUPS.iter().find(|gv| gv.group == rest)?;
            let mut doc = group(gv);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            return Some(doc);
        }
    };
    Some(resource_list(
        &format!("{}/{}", gv.group, gv.version),
        gv.resources,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_name_the_lab_resources() {
        let core = document("/api/v1").expect("the core resource list");
        let pods = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .expect("pods");
        assert_eq!(pods["kind"], "Pod");
        assert_eq!(pods["namespaced"], true);
        assert_eq!(pods["shortNames"], json!(["po"]));
        let groups = document("/apis").expect("the group list");
        assert!(groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["preferredVersion"]["groupVersion"] == "events.k8s.io/v1"));
        let leases = document("/apis/coordination.k8s.io/v1").expect("a group version");
        assert_eq!(leases["groupVersion"], "coordination.k8s.io/v1");
        assert_eq!(
            document("/apis/coordination.k8s.io").unwrap()["kind"],
            "APIGroup"
        );
        assert_eq!(document("/version").unwrap()["major"], "1");
        // Not discovery: resource URLs and unknown groups.
        assert!(document("/api/v1/pods").is_none());
        assert!(document("/apis/apps/v1").is_none());
        assert!(document("/apis/coordination.k8s.io/v1/leases").is_none());
    }
}
