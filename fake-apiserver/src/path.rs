//! What a request URL names: a group/version, a resource (plural), maybe a namespace,
//! an object name and a subresource, following the Kubernetes REST layout.

/// Which collection of objects a URL is about: `prefix` is `/api/v1` for the core
/// group or `/apis/<group>/<version>`, `plural` the resource (`pods`, `leases`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    pub prefix: String,
    pub plural: String,
}

impl ResourceKey {
    pub fn new(prefix: impl Into<String>, plural: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            plural: plural.into(),
        }
    }

    /// The API group (`""` for the core group, `coordination.k8s.io`).
    pub fn group(&self) -> &str {
        self.prefix
            .strip_prefix("/apis/")
            .and_then(|gv| gv.split('/').next())
            .unwrap_or("")
    }

    /// `pods`, `leases.coordination.k8s.io`: how the API server names the resource
    /// in its errors.
    pub fn qualified(&self) -> String {
        match self.group() {
            "" => self.plural.clone(),
            group => format!("{}.{group}", self.plural),
        }
    }

    /// The `apiVersion` of objects of this resource (`v1`, `coordination.k8s.io/v1`).
    pub fn api_version(&self) -> String {
        match self.prefix.strip_prefix("/apis/") {
            Some(gv) => gv.to_owned(),
            None => self.prefix.trim_start_matches("/api/").to_owned(),
        }
    }
}

/// A parsed request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub resource: ResourceKey,
    /// The namespace in the URL (`/namespaces/<ns>/...`); `None`: cluster scoped, or
    /// a list over all namespaces.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

/// Subresources of a namespace object (`/api/v1/namespaces/<ns>/status`), which would
/// otherwise read as a resource inside the namespace.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Parses `/api/v1/...` or `/apis/<group>/<version>/...`; `None` for anything else.
pub fn parse(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (format!("/api/{version}"), rest),
        ["apis", group, version, rest @ ..] => (format!("/apis/{group}/{version}"), rest),
        _ => return None,
    };
    if rest.iter().any(|s| s.is_empty()) {
        return None;
    }
    let target = |ns: Option<&str>, plural: &str, name: Option<&str>, sub: Option<&str>| {
        Some(Target {
            resource: ResourceKey::new(prefix.clone(), plural),
            namespace: ns.map(str::to_owned),
            name: name.map(str::to_owned),
            subresource: sub.map(str::to_owned),
        })
    };
    match rest {
        ["namespaces", ns, sub] if NAMESPACE_SUBRESOURCES.contains(sub) => {
            target(None, "namespaces", Some(ns), Some(sub))
        }
        ["namespaces", ns, plural] => target(Some(ns), plural, None, None),
        ["namespaces", ns, plural, name] => target(Some(ns), plural, Some(name), None),
        ["namespaces", ns, plural, name, sub] => target(Some(ns), plural, Some(name), Some(sub)),
        [plural] => target(None, plural, None, None),
        [plural, name] => target(None, plural, Some(name), None),
        [plural, name, sub] => target(None, plural, Some(name), Some(sub)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let t = parse("/api/v1/namespaces/jhub/pods/jupyter-a").unwrap();
        assert_eq!(t.resource, ResourceKey::new("/api/v1", "pods"));
        assert_eq!(t.namespace.as_deref(), Some("jhub"));
        assert_eq!(t.name.as_deref(), Some("jupyter-a"));
        let t = parse("/apis/coordination.k8s.io/v1/namespaces/x/leases").unwrap();
        assert_eq!(t.resource.api_version(), "coordination.k8s.io/v1");
        assert_eq!(t.name, None);
        let t = parse("/api/v1/nodes/n1/status").unwrap();
        assert_eq!(t.namespace, None);
        assert_eq!(t.subresource.as_deref(), Some("status"));
        let t = parse("/api/v1/namespaces/jhub").unwrap();
        assert_eq!(t.resource.plural, "namespaces");
        assert_eq!(t.name.as_deref(), Some("jhub"));
        let t = parse("/api/v1/namespaces/jhub/status").unwrap();
        assert_eq!(t.resource.plural, "namespaces");
        assert_eq!(t.subresource.as_deref(), Some("status"));
        let t = parse("/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1/approval")
            .unwrap();
        assert_eq!(t.subresource.as_deref(), Some("approval"));
        assert_eq!(parse("/version"), None);
        assert_eq!(parse("/api/v1//pods"), None);
    }
}
