//! Notebook pods as JupyterHub's KubeSpawner 7.1 writes them, and the identity it
//! creates them with.
//!
//! The body is the real KubeSpawner 7.1.0 manifest in
//! `tests/fixtures/kubespawner/7.1.0-alice-at-example.com-{gpu,nogpu}.json` with the
//! user's name, slugs and URL-encoded name put in place of alice's: pod name
//! `jupyter-<object slug>`, label `hub.jupyter.org/username` = the label slug,
//! annotation = the raw name, the `JUPYTERHUB_*` environment. Quantities stay JSON
//! numbers, as the hub sends them.

use gpu_booking_core::username::{safe_object_slug, safe_slug};
use serde_json::Value;

/// The hub's ServiceAccount (zero-to-jupyterhub's `hub` in namespace `jhub`): the
/// requester KubeSpawner's pod creations carry in the admission review's `userInfo`.
pub const HUB_USER: &str = "system:serviceaccount:jhub:hub";
/// The groups the API server gives that ServiceAccount.
pub const HUB_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:jhub",
    "system:authenticated",
];
/// The namespace the hub spawns into.
pub const NOTEBOOK_NAMESPACE: &str = "jhub";

const TEMPLATE_USER: &str = "alice@example.com";
const TEMPLATE_USER_URL: &str = "alice%40example.com";
const GPU_TEMPLATE: &str =
    include_str!("../../tests/fixtures/kubespawner/7.1.0-alice-at-example.com-gpu.json");
const CPU_TEMPLATE: &str =
    include_str!("../../tests/fixtures/kubespawner/7.1.0-alice-at-example.com-nogpu.json");

/// The pod name KubeSpawner 7.1 gives `user`'s default server.
pub fn pod_name(user: &str) -> String {
    format!("jupyter-{}", safe_object_slug(user))
}

/// `user`'s notebook pod as KubeSpawner 7.1 sends it, asking for `gpus` GPUs
/// (`extra_resource_limits`/`guarantees`; 0: the CPU-only profile).
pub fn notebook_pod(user: &str, gpus: u32) -> Value {
    let template = if gpus == 0 {
        CPU_TEMPLATE
    } else {
        GPU_TEMPLATE
    };
    // The fixture is checked in and parsed by this crate's tests: it is valid JSON.
    let mut pod: Value = serde_json::from_str(template).unwrap_or(Value::Null);
    let template_slug = safe_slug(TEMPLATE_USER);
    let template_name = pod_name(TEMPLATE_USER);
    let metadata = [
        (template_name.as_str(), pod_name(user)),
        (template_slug.as_str(), safe_slug(user)),
        (TEMPLATE_USER, user.to_owned()),
    ];
    replace_strings(&mut pod["metadata"], &metadata);
    for env in pod["spec"]["containers"][0]["env"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let name = env["name"].as_str().unwrap_or_default().to_owned();
        // Each variable carries the name as JupyterHub encodes it there.
        let (from, to) = if name == "JUPYTERHUB_CLIENT_ID" {
            (TEMPLATE_USER_URL, url_encode(user, ""))
        } else if name.ends_with("_URL") || name.ends_with("_PREFIX") {
            (TEMPLATE_USER, url_encode(user, "@"))
        } else if name.ends_with("_SCOPES") {
            (TEMPLATE_USER, json_ascii(user))
        } else {
            (TEMPLATE_USER, user.to_owned())
        };
        replace_strings(&mut env["value"], &[(from, to)]);
    }
    if gpus > 1 {
        for section in ["limits", "requests"] {
            pod["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu"] =
                Value::String(gpus.to_string());
        }
    }
    pod
}

/// Python's `urllib.parse.quote(s, safe=safe)`: the hub quotes names in URLs with
/// `safe='@'` and in OAuth client ids with `safe=''`.
fn url_encode(s: &str, safe: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || safe.as_bytes().contains(&b)
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inside of a JSON string as Python's `json.dumps` writes it (`ensure_ascii`):
/// the hub's scope lists are JSON text inside an environment variable.
fn json_ascii(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out
}

/// Replaces, in every string of `value` (keys are left alone), each `from` with its
/// `to`, in the order given.
fn replace_strings(value: &mut Value, replacements: &[(&str, String)]) {
    match value {
        Value::String(s) => {
            for (from, to) in replacements {
                if s.contains(from) {
                    *s = s.replace(from, to);
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| replace_strings(v, replacements)),
        Value::Object(map) => map
            .values_mut()
            .for_each(|v| replace_strings(v, replacements)),
        _ => {}
    }
}

/// The hub's Role and RoleBinding as zero-to-jupyterhub 4 renders them
/// (`jupyterhub/templates/hub/rbac.yaml`): what KubeSpawner may do in the namespace
/// it spawns into, and no more. Installed where the lab enforces RBAC.
pub fn hub_rbac() -> [(&'static str, Value); 2] {
    let meta = serde_json::json!({"name": "hub", "namespace": NOTEBOOK_NAMESPACE});
    [
        (
            "roles",
            serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": meta,
                "rules": [
                    {"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
                     "verbs": ["get", "watch", "list", "create", "delete"]},
                    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
                ],
            }),
        ),
        (
            "rolebindings",
            serde_json::json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": meta,
                "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": NOTEBOOK_NAMESPACE}],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hub"},
            }),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(file: &str) -> Value {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/kubespawner")
            .join(file);
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The fixture of another user, minus what differs per spawn (the API token).
    fn comparable(mut pod: Value) -> Value {
        for env in pod["spec"]["containers"][0]["env"].as_array_mut().unwrap() {
            if env["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("API_TOKEN"))
            {
                env["value"] = Value::Null;
            }
        }
        pod
    }

    #[test]
    fn builds_kubespawners_pod_for_any_user() {
        for (user, file) in [
            ("Bob.Smith", "7.1.0-Bob.Smith-gpu.json"),
            ("a-b", "7.1.0-a-b-gpu.json"),
            ("zoë@uni.example", "7.1.0-zoe-at-uni.example-gpu.json"),
            ("alice@example.com", "7.1.0-alice-at-example.com-gpu.json"),
        ] {
            assert_eq!(
                comparable(notebook_pod(user, 1)),
                comparable(fixture(file)),
                "{user}"
            );
        }
        assert_eq!(
            comparable(notebook_pod("alice@example.com", 0)),
            comparable(fixture("7.1.0-alice-at-example.com-nogpu.json"))
        );
    }

    #[test]
    fn more_gpus_change_only_the_gpu_quantity() {
        let pod = notebook_pod("a-b", 2);
        let res = &pod["spec"]["containers"][0]["resources"];
        assert_eq!(res["limits"]["nvidia.com/gpu"], "2");
        assert_eq!(res["requests"]["nvidia.com/gpu"], "2");
        assert_eq!(pod["metadata"]["name"], "jupyter-a-b");
    }
}
