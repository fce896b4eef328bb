//! Authorization as kube-apiserver's RBAC authorizer decides it ("Using RBAC
//! Authorization"), opt-in with [`crate::FakeApiServer::enable_rbac`].
//!
//! A request is allowed when the requester is in `system:masters` (the privileged
//! group that the real server lets through before any authorizer), or when a rule of
//! a role bound to it covers the request's attributes:
//!
//! - a **ClusterRoleBinding** grants its ClusterRole everywhere: in every namespace
//!   and at the cluster scope (nodes, cluster-wide lists);
//! - a **RoleBinding** grants its Role (of its own namespace) or its ClusterRole only
//!   in the binding's namespace;
//! - subjects: `User` by name, `Group` by name, `ServiceAccount` by namespace and name
//!   (the user `system:serviceaccount:<ns>:<name>`);
//! - a rule covers a request when its `verbs`, `apiGroups` and `resources` each list
//!   the request's (or `*`), a subresource request naming `<resource>/<subresource>`
//!   (or `*/<subresource>`: `pods` alone does not cover `pods/status`), and its
//!   `resourceNames`, when set, the object's name (so never a create, a list or a
//!   watch, which name none);
//! - ClusterRoles with an `aggregationRule` gather the rules of the ClusterRoles
//!   their selectors pick, as the aggregation controller does.
//!
//! Enabling RBAC stores the bootstrap roles the chart's bindings may reference
//! (`system:auth-delegator`, `system:basic-user`, `system:discovery`, `view`,
//! `edit`, `admin`, `cluster-admin`) and the default bindings of the first three.
//!
//! A refusal is a 403 `Forbidden` with the API server's words (`pods "x" is forbidden:
//! User "..." cannot patch resource "pods" in API group "" in the namespace "jhub"`),
//! and is kept in [`crate::FakeApiServer::denials`] so that a scenario can fail naming
//! every request that was refused.

use serde_json::{json, Value};

use crate::admission::UserInfo;
use crate::path::{ResourceKey, Target};
use crate::select::Selector;
use crate::status::ApiError;
use crate::store::Store;
use crate::Verb;

/// The group whose members bypass authorization (kube-apiserver's privileged group).
const MASTERS: &str = "system:masters";
const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

/// A request refused by RBAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub user: String,
    pub verb: Verb,
    /// `pods`, `pods/status`, `leases`.
    pub resource: String,
    pub api_group: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The `Status` message the client got.
    pub message: String,
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Verb {
    /// The verb as RBAC rules write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

/// What the authorizer decides on: RBAC's request attributes.
struct Attributes<'a> {
    verb: &'a str,
    group: String,
    resource: &'a str,
    subresource: Option<&'a str>,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

impl Attributes<'_> {
    /// `pods` or `pods/status`.
    fn combined_resource(&self) -> String {
        match self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.to_owned(),
        }
    }
}

/// A refused request: what the fake keeps, and what the client gets.
pub(crate) struct Refusal {
    pub denial: Denial,
    pub error: ApiError,
}

/// Allows or refuses `verb` on `target` by `user`, reading the roles and bindings in
/// `store`.
pub(crate) fn authorize(
    store: &Store,
    user: &UserInfo,
    verb: Verb,
    target: &Target,
) -> Result<(), Box<Refusal>> {
    if user.groups.iter().any(|g| g == MASTERS) {
        return Ok(());
    }
    let attrs = Attributes {
        verb: verb.as_str(),
        group: target.resource.group().to_owned(),
        resource: &target.resource.plural,
        subresource: target.subresource.as_deref(),
        namespace: target.namespace.as_deref(),
        name: target.name.as_deref(),
    };
    if rules_for(store, user, attrs.namespace)
        .iter()
        .any(|rule| rule_allows(rule, &attrs))
    {
        return Ok(());
    }
    let resource = attrs.combined_resource();
    let why = match attrs.namespace {
        Some(ns) => format!(
            "User {:?} cannot {} resource {resource:?} in API group {:?} in the namespace {ns:?}",
            user.username, attrs.verb, attrs.group
        ),
        None => format!(
            "User {:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            user.username, attrs.verb, attrs.group
        ),
    };
    let error = ApiError::forbidden(&target.resource.qualified(), attrs.name.unwrap_or(""), &why);
    let denial = Denial {
        user: user.username.clone(),
        verb,
        resource,
        api_group: attrs.group,
        namespace: attrs.namespace.map(str::to_owned),
        name: attrs.name.map(str::to_owned),
        message: error.message(),
    };
    Err(Box::new(Refusal { denial, error }))
}

/// Whether `user` may `verb` (any verb RBAC names, `impersonate` included) the
/// `resource` of API group `group` named `name` in `namespace` (`None`: the cluster
/// scope): the same decision as [`authorize`], for requests that are not a URL.
pub(crate) fn allows(
    store: &Store,
    user: &UserInfo,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    if user.groups.iter().any(|g| g == MASTERS) {
        return true;
    }
    let attrs = Attributes {
        verb,
        group: group.to_owned(),
        resource,
        subresource: None,
        namespace,
        name,
    };
    rules_for(store, user, namespace)
        .iter()
        .any(|rule| rule_allows(rule, &attrs))
}

/// Allows or refuses a `get` of a path that names no resource (`/api`, `/version`):
/// a ClusterRole's `nonResourceURLs`, exact or ending in `*` (a prefix), bound by a
/// ClusterRoleBinding, covers it ("Using RBAC Authorization", non-resource URLs).
pub(crate) fn authorize_path(store: &Store, user: &UserInfo, path: &str) -> Result<(), ApiError> {
    if user.groups.iter().any(|g| g == MASTERS) {
        return Ok(());
    }
    let all = Selector::default();
    let allowed = store
        .list(&rbac("clusterrolebindings"), None, &all)
        .iter()
        .filter(|binding| binds(binding, user))
        .flat_map(|binding| role_rules(store, binding, None))
        .any(|rule| {
            let verbs = strings(&rule, "verbs");
            verbs.iter().any(|v| *v == "*" || *v == "get")
                && strings(&rule, "nonResourceURLs").iter().any(|url| {
                    *url == path || url.strip_suffix('*').is_some_and(|p| path.starts_with(p))
                })
        });
    if allowed {
        return Ok(());
    }
    Err(ApiError::new(
        403,
        "Forbidden",
        format!(
            "forbidden: User {:?} cannot get path {path:?}",
            user.username
        ),
        json!({}),
    ))
}

/// The rules of every role bound to `user` that apply in `namespace` (`None`: the
/// cluster scope, where only ClusterRoleBindings count).
fn rules_for(store: &Store, user: &UserInfo, namespace: Option<&str>) -> Vec<Value> {
    let all = Selector::default();
    let mut rules = Vec::new();
    for binding in store.list(&rbac("clusterrolebindings"), None, &all) {
        if binds(&binding, user) {
            rules.extend(role_rules(store, &binding, None));
        }
    }
    if let Some(ns) = namespace {
        for binding in store.list(&rbac("rolebindings"), Some(ns), &all) {
            if binds(&binding, user) {
                rules.extend(role_rules(store, &binding, Some(ns)));
            }
        }
    }
    rules
}

fn rbac(plural: &str) -> ResourceKey {
    ResourceKey::new(RBAC, plural)
}

/// Whether `binding` names `user` among its subjects.
fn binds(binding: &Value, user: &UserInfo) -> bool {
    let Some(subjects) = binding.get("subjects").and_then(Value::as_array) else {
        return false;
    };
    subjects.iter().any(|s| {
        let field = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("");
        match field("kind") {
            "User" => field("name") == user.username,
            "Group" => user.groups.iter().any(|g| g == field("name")),
            "ServiceAccount" => {
                user.username
                    == format!(
                        "system:serviceaccount:{}:{}",
                        field("namespace"),
                        field("name")
                    )
            }
            _ => false,
        }
    })
}

/// The rules of the role `binding` refers to (a RoleBinding's Role is looked up in
/// the binding's namespace).
fn role_rules(store: &Store, binding: &Value, namespace: Option<&str>) -> Vec<Value> {
    let role_ref = &binding["roleRef"];
    let name = role_ref["name"].as_str().unwrap_or("");
    let role = match (role_ref["kind"].as_str(), namespace) {
        (Some("ClusterRole"), _) => store.get(&rbac("clusterroles"), "", name),
        (Some("Role"), Some(ns)) => store.get(&rbac("roles"), ns, name),
        _ => None,
    };
    let Some(role) = role else {
        return Vec::new();
    };
    let mut rules = rules_of(&role);
    if let Some(selectors) = role
        .pointer("/aggregationRule/clusterRoleSelectors")
        .and_then(Value::as_array)
    {
        for other in store.list(&rbac("clusterroles"), None, &Selector::default()) {
            let labels = other
                .pointer("/metadata/labels")
                .cloned()
                .unwrap_or(json!({}));
            if selectors.iter().any(|s| {
                s.get("matchLabels")
                    .and_then(Value::as_object)
                    .is_some_and(|want| {
                        want.iter()
                            .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
                    })
            }) {
                rules.extend(rules_of(&other));
            }
        }
    }
    rules
}

fn rules_of(role: &Value) -> Vec<Value> {
    role.get("rules")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn strings<'a>(rule: &'a Value, key: &str) -> Vec<&'a str> {
    rule.get(key)
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether one policy rule covers the request (RBAC's `RuleAllows`).
fn rule_allows(rule: &Value, attrs: &Attributes<'_>) -> bool {
    let verbs = strings(rule, "verbs");
    if !verbs.iter().any(|v| *v == "*" || *v == attrs.verb) {
        return false;
    }
    let groups = strings(rule, "apiGroups");
    if !groups.iter().any(|g| *g == "*" || *g == attrs.group) {
        return false;
    }
    let combined = attrs.combined_resource();
    let resources = strings(rule, "resources");
    let resource_ok = resources.iter().any(|r| {
        *r == "*"
            || *r == combined
            || r.strip_prefix("*/")
                .is_some_and(|sub| attrs.subresource == Some(sub))
    });
    if !resource_ok {
        return false;
    }
    let names = strings(rule, "resourceNames");
    names.is_empty() || attrs.name.is_some_and(|n| names.contains(&n))
}

/// The bootstrap ClusterRoles and ClusterRoleBindings a cluster starts with that the
/// chart may reference (kube-apiserver's `bootstrappolicy`), as far as the fake
/// serves their resources.
pub(crate) fn bootstrap_objects() -> Vec<(&'static str, Value)> {
    let role = |name: &str, rules: Value| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": rules,
        })
    };
    let read = json!(["get", "list", "watch"]);
    let write = json!(["create", "delete", "deletecollection", "patch", "update"]);
    let namespaced = json!([
        "pods",
        "services",
        "configmaps",
        "secrets",
        "events",
        "persistentvolumeclaims",
        "serviceaccounts",
        "endpoints"
    ]);
    let binding = |name: &str, group: &str| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        })
    };
    vec![
        (
            "clusterroles",
            role(
                "cluster-admin",
                json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                       {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "system:auth-delegator",
                json!([
                    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
                ]),
            ),
        ),
        (
            "clusterroles",
            role(
                "system:basic-user",
                json!([{"apiGroups": ["authorization.k8s.io"],
                        "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                        "verbs": ["create"]}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "system:discovery",
                json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                        "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
                        "verbs": ["get"]}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "view",
                json!([{"apiGroups": [""], "resources": namespaced.clone(), "verbs": read.clone()}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "edit",
                json!([{"apiGroups": [""], "resources": namespaced.clone(), "verbs": read.clone()},
                       {"apiGroups": [""], "resources": namespaced.clone(), "verbs": write.clone()}]),
            ),
        ),
        (
            "clusterroles",
            role(
                "admin",
                json!([{"apiGroups": ["", "rbac.authorization.k8s.io"], "resources": ["*"], "verbs": ["*"]}]),
            ),
        ),
        (
            "clusterrolebindings",
            binding("system:basic-user", "system:authenticated"),
        ),
        (
            "clusterrolebindings",
            binding("system:discovery", "system:authenticated"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path;

    fn store_with(objects: Vec<(&str, Value)>) -> Store {
        let mut store = Store::new();
        for (plural, obj) in bootstrap_objects().into_iter().chain(objects) {
            let ns = obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_owned);
            store
                .create(&rbac(plural), ns.as_deref(), obj)
                .expect("stored");
        }
        store
    }

    fn sa(name: &str) -> UserInfo {
        UserInfo::new(
            &format!("system:serviceaccount:gpu-booking:{name}"),
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:gpu-booking",
            ],
        )
    }

    fn check(store: &Store, user: &UserInfo, verb: Verb, path: &str) -> Result<(), Box<Denial>> {
        authorize(store, user, verb, &path::parse(path).expect("a path")).map_err(|r| {
            assert_eq!(r.error.code, 403);
            assert_eq!(r.error.message(), r.denial.message);
            Box::new(r.denial)
        })
    }

    fn lab() -> Store {
        store_with(vec![
            (
                "roles",
                json!({"metadata": {"name": "pods", "namespace": "jhub"}, "rules": [
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
                    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
                    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                     "resourceNames": ["lock"], "verbs": ["get", "update"]},
                ]}),
            ),
            (
                "rolebindings",
                json!({"metadata": {"name": "pods", "namespace": "jhub"},
                       "roleRef": {"kind": "Role", "name": "pods", "apiGroup": "rbac.authorization.k8s.io"},
                       "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": "gpu-booking"}]}),
            ),
            (
                "clusterroles",
                json!({"metadata": {"name": "nodes"}, "rules": [
                    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                ]}),
            ),
            (
                "clusterrolebindings",
                json!({"metadata": {"name": "nodes"},
                       "roleRef": {"kind": "ClusterRole", "name": "nodes", "apiGroup": "rbac.authorization.k8s.io"},
                       "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": "gpu-booking"}]}),
            ),
            (
                "rolebindings",
                json!({"metadata": {"name": "view", "namespace": "research"},
                       "roleRef": {"kind": "ClusterRole", "name": "view", "apiGroup": "rbac.authorization.k8s.io"},
                       "subjects": [{"kind": "Group", "name": "system:serviceaccounts:gpu-booking"}]}),
            ),
        ])
    }

    #[test]
    fn namespaced_roles_grant_only_their_namespace() {
        let store = lab();
        let ctl = sa("ctl");
        assert!(check(&store, &ctl, Verb::Get, "/api/v1/namespaces/jhub/pods/a").is_ok());
        assert!(check(&store, &ctl, Verb::Get, "/api/v1/namespaces/other/pods/a").is_err());
        // A list across namespaces is a cluster-scope request: only a
        // ClusterRoleBinding grants it.
        assert!(check(&store, &ctl, Verb::List, "/api/v1/pods").is_err());
        assert!(check(&store, &ctl, Verb::List, "/api/v1/nodes").is_ok());
        assert!(check(&store, &ctl, Verb::Patch, "/api/v1/nodes/n1").is_err());
    }

    #[test]
    fn verbs_and_subresources_are_separate() {
        let store = lab();
        let ctl = sa("ctl");
        let denied = check(&store, &ctl, Verb::Patch, "/api/v1/namespaces/jhub/pods/a")
            .expect_err("patch is not granted");
        assert_eq!(
            denied.message,
            "pods \"a\" is forbidden: User \"system:serviceaccount:gpu-booking:ctl\" cannot patch resource \"pods\" in API group \"\" in the namespace \"jhub\""
        );
        assert!(check(
            &store,
            &ctl,
            Verb::Patch,
            "/api/v1/namespaces/jhub/pods/a/status"
        )
        .is_ok());
        assert!(check(
            &store,
            &ctl,
            Verb::Get,
            "/api/v1/namespaces/jhub/pods/a/status"
        )
        .is_err());
        let denied = check(
            &store,
            &ctl,
            Verb::Create,
            "/api/v1/namespaces/jhub/pods/a/eviction",
        )
        .expect_err("pods does not cover pods/eviction");
        assert_eq!(denied.resource, "pods/eviction");
    }

    #[test]
    fn resource_names_restrict_named_requests_only() {
        let store = lab();
        let ctl = sa("ctl");
        let lease = "/apis/coordination.k8s.io/v1/namespaces/jhub/leases";
        assert!(check(&store, &ctl, Verb::Get, &format!("{lease}/lock")).is_ok());
        assert!(check(&store, &ctl, Verb::Get, &format!("{lease}/other")).is_err());
        let denied = check(&store, &ctl, Verb::Create, lease).expect_err("a create names nothing");
        assert!(denied.message.starts_with(
            "leases.coordination.k8s.io is forbidden: User \"system:serviceaccount:gpu-booking:ctl\" cannot create resource \"leases\" in API group \"coordination.k8s.io\""
        ));
    }

    #[test]
    fn groups_cluster_roles_in_role_bindings_and_masters() {
        let store = lab();
        let other = sa("other");
        // Bound by its group, to the bootstrap `view` ClusterRole, in research only.
        assert!(check(
            &store,
            &other,
            Verb::Watch,
            "/api/v1/namespaces/research/pods"
        )
        .is_ok());
        assert!(check(&store, &other, Verb::Watch, "/api/v1/namespaces/jhub/pods").is_err());
        assert!(check(
            &store,
            &other,
            Verb::Delete,
            "/api/v1/namespaces/research/pods/x"
        )
        .is_err());
        let nobody = UserInfo::new("mallory", &[]);
        assert!(check(&store, &nobody, Verb::Get, "/api/v1/namespaces/jhub/pods/a").is_err());
        assert!(check(
            &store,
            &nobody,
            Verb::Create,
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        )
        .is_ok());
        assert!(check(&store, &UserInfo::admin(), Verb::Delete, "/api/v1/nodes/n1").is_ok());
    }

    #[test]
    fn aggregated_cluster_roles_gather_their_parts() {
        let store = store_with(vec![
            (
                "clusterroles",
                json!({"metadata": {"name": "agg"}, "aggregationRule": {"clusterRoleSelectors": [
                    {"matchLabels": {"part-of": "agg"}}]}, "rules": []}),
            ),
            (
                "clusterroles",
                json!({"metadata": {"name": "part", "labels": {"part-of": "agg"}}, "rules": [
                    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]}),
            ),
            (
                "clusterrolebindings",
                json!({"metadata": {"name": "agg"},
                       "roleRef": {"kind": "ClusterRole", "name": "agg", "apiGroup": "rbac.authorization.k8s.io"},
                       "subjects": [{"kind": "User", "name": "u"}]}),
            ),
        ]);
        let u = UserInfo::new("u", &[]);
        assert!(check(&store, &u, Verb::Get, "/api/v1/nodes/n").is_ok());
        assert!(check(&store, &u, Verb::List, "/api/v1/nodes").is_err());
    }
}
