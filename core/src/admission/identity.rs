//! Whose pod is it: the JupyterHub user behind a pod, from what KubeSpawner wrote.

use serde_json::Value;

use super::USERNAME_KEY;
use crate::username::{escape_decode, NameCase, Username};

/// Longest label we look up as a slug. Valid label values have at most 63 characters,
/// but KubeSpawner 6.x writes longer (invalid) ones for long names, and the API server
/// only rejects them after mutating admission, so they reach us.
const MAX_SLUG_LEN: usize = 256;

/// Who a pod belongs to, and how to ask the booking service about them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The raw user name from the `hub.jupyter.org/username` annotation.
    User(Username),
    /// The `hub.jupyter.org/username` label: an escape-scheme slug (then `decoded` is
    /// the user name it stands for) or a safe-scheme slug, which only the booking
    /// service can resolve. Looked up as a slug either way.
    Slug {
        slug: String,
        decoded: Option<Username>,
    },
}

impl Identity {
    /// The query parameter for the booking service's schedulability lookup:
    /// `("user", name)` or `("slug", label)`.
    pub fn query(&self) -> (&'static str, &str) {
        match self {
            Identity::User(user) => ("user", user.as_str()),
            Identity::Slug { slug, .. } => ("slug", slug),
        }
    }

    /// The best user name we know without asking: the raw name, or the decoded slug.
    pub fn username(&self) -> Option<&Username> {
        match self {
            Identity::User(user) => Some(user),
            Identity::Slug { decoded, .. } => decoded.as_ref(),
        }
    }

    /// A short text for logs and audit rows (`user alice@example.com`, `slug a-2db`).
    pub fn describe(&self) -> String {
        let (kind, value) = self.query();
        format!("{kind} {value}")
    }
}

/// The identity of `pod`, as the pod says, with names compared as `case` says.
///
/// The `hub.jupyter.org/username` annotation, when the pod has it, is the only word:
/// a value that is no acceptable user name (control characters, over
/// [`MAX_USERNAME_BYTES`](crate::username::MAX_USERNAME_BYTES), ...) gives no identity
/// rather than a fall back to the label, because the label of a long or odd name is a
/// lossy slug that can name someone else (a name over the bound, dropped from the
/// annotation, would fall back to a safe slug another user can share). Without the annotation, the
/// label when it can be a KubeSpawner slug. `None` for pods without either.
///
/// Only trust this for pods the spawner created: see [`super::trusted_identity`].
pub fn identify(pod: &Value, case: NameCase) -> Option<Identity> {
    let metadata = pod.get("metadata")?;
    if let Some(annotation) = metadata
        .get("annotations")
        .and_then(|a| a.get(USERNAME_KEY))
    {
        let user = annotation
            .as_str()
            .and_then(|name| Username::normalised(name, case).ok())?;
        return Some(Identity::User(user));
    }
    let label = metadata
        .get("labels")
        .and_then(|l| l.get(USERNAME_KEY))
        .and_then(Value::as_str)?;
    if !is_slug(label) {
        return None;
    }
    let decoded = escape_decode(label)
        .ok()
        .and_then(|name| Username::normalised(&name, case).ok());
    Some(Identity::Slug {
        slug: label.to_owned(),
        decoded,
    })
}

/// The user a pod names, as written, for logs, audit rows and Events: the
/// `hub.jupyter.org/username` annotation (KubeSpawner's raw name), else the label of
/// that key (its slug). `annotation` and `label` look a key up in the pod's
/// annotations and labels, whatever form the caller holds the pod in.
///
/// Not a trust decision and not a checked name: whoever can create a pod can write
/// either key, and a present but unacceptable annotation is still returned. Deciding
/// whose pod it is takes [`identify`] behind [`super::trusted_identity`].
pub fn named_user<'a>(
    annotation: impl FnOnce(&str) -> Option<&'a str>,
    label: impl FnOnce(&str) -> Option<&'a str>,
) -> Option<&'a str> {
    annotation(USERNAME_KEY).or_else(|| label(USERNAME_KEY))
}

/// Whether `label` can be a slug of either KubeSpawner scheme: non-empty, bounded, and
/// only the characters a label value may hold.
fn is_slug(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= MAX_SLUG_LEN
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotation: Option<&str>, label: Option<&str>) -> Value {
        let mut meta = json!({"name": "p"});
        if let Some(a) = annotation {
            meta["annotations"] = json!({ USERNAME_KEY: a });
        }
        if let Some(l) = label {
            meta["labels"] = json!({ USERNAME_KEY: l });
        }
        json!({ "metadata": meta })
    }

    fn identify(pod: &Value) -> Option<Identity> {
        super::identify(pod, NameCase::Lowercase)
    }

    #[test]
    fn annotation_first() {
        let id = identify(&pod(
            Some("alice@example.com"),
            Some("alice-40example-2ecom"),
        ))
        .unwrap();
        assert_eq!(id.query(), ("user", "alice@example.com"));
    }

    #[test]
    fn escape_label_decodes_in_one_pass() {
        let id = identify(&pod(None, Some("a-2d40b"))).unwrap();
        assert_eq!(id.query(), ("slug", "a-2d40b"));
        assert_eq!(id.username().map(Username::as_str), Some("a-40b"));
    }

    #[test]
    fn names_are_normalised_as_jupyterhub_does() {
        let id = identify(&pod(Some("Alice@Example.com"), None)).unwrap();
        assert_eq!(id.query(), ("user", "alice@example.com"));
        let id = super::identify(&pod(Some("Alice@Example.com"), None), NameCase::Sensitive);
        assert_eq!(id.unwrap().query(), ("user", "Alice@Example.com"));
        // An escape label decodes to the name it stands for, normalised the same way.
        let id = identify(&pod(None, Some("-42ob"))).unwrap();
        assert_eq!(id.query(), ("slug", "-42ob"));
        assert_eq!(id.username().map(Username::as_str), Some("bob"));
    }

    #[test]
    fn safe_label_is_a_slug_without_decoding() {
        let id = identify(&pod(None, Some("alice-example-com---ff8d9819"))).unwrap();
        assert_eq!(id.query(), ("slug", "alice-example-com---ff8d9819"));
        assert_eq!(id.username(), None);
    }

    #[test]
    fn hostile_values() {
        // An annotation that is no user name: no identity, never the label instead.
        assert_eq!(identify(&pod(Some("eve\n"), Some("eve"))), None);
        assert_eq!(identify(&pod(Some(""), Some("eve"))), None);
        assert_eq!(
            identify(
                &json!({"metadata": {"annotations": {USERNAME_KEY: 7}, "labels": {USERNAME_KEY: "eve"}}})
            ),
            None
        );
        // A name over the bound is refused, not replaced by its safe slug
        // (which another user can share).
        let long = format!("{}@example.com", "m".repeat(260));
        let safe = crate::username::safe_slug(&long);
        assert_eq!(identify(&pod(Some(&long), Some(&safe))), None);
        assert_eq!(identify(&pod(Some(""), None)), None);
        assert_eq!(identify(&pod(None, Some("a&b=c"))), None);
        assert_eq!(identify(&pod(None, Some(&"a".repeat(300)))), None);
        assert_eq!(identify(&json!({"metadata": {"annotations": null}})), None);
        assert_eq!(
            identify(&json!({"metadata": {"labels": {USERNAME_KEY: 3}}})),
            None
        );
        assert_eq!(identify(&json!(null)), None);
    }

    #[test]
    fn named_user_is_the_annotation_else_the_label_as_written() {
        let named = |pod: &Value| {
            named_user(
                |k| pod["metadata"]["annotations"][k].as_str(),
                |k| pod["metadata"]["labels"][k].as_str(),
            )
            .map(str::to_owned)
        };
        let both = pod(Some("Alice@Example.com"), Some("alice-40example-2ecom"));
        assert_eq!(named(&both).as_deref(), Some("Alice@Example.com"));
        let label_only = pod(None, Some("alice-40example-2ecom"));
        assert_eq!(named(&label_only).as_deref(), Some("alice-40example-2ecom"));
        // Not a checked name: what identify refuses is still reported as written.
        let odd = pod(Some("bad\u{7}name"), Some("alice"));
        assert_eq!(identify(&odd), None);
        assert_eq!(named(&odd).as_deref(), Some("bad\u{7}name"));
        assert_eq!(named(&pod(None, None)), None);
    }
}
