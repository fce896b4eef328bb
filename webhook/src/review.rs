//! `admission.k8s.io/v1` AdmissionReview, read leniently and answered strictly.
//!
//! Reading: only what admission needs, every field optional, so that a review with a
//! missing or odd field still yields its `uid` to echo. (kube-core's typed review
//! refuses a whole review for one missing field, and sends the patch as a JSON array of
//! bytes; the API documents a base64 string, which is what we send. Measured, with its
//! cost per review: `examples/review_cost.rs`, docs/webhook.md "Why our own
//! AdmissionReview types".)

use base64::Engine as _;
use gpu_booking_core::admission::UserInfo;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
pub const API_VERSION_V1BETA1: &str = "admission.k8s.io/v1beta1";

/// An incoming review read leniently (every field any JSON), for reviews the typed
/// pass ([`read_typed`]) cannot read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewIn {
    #[serde(default)]
    pub api_version: Option<Value>,
    #[serde(default)]
    pub kind: Option<Value>,
    #[serde(default)]
    pub request: Option<Value>,
}

/// A review as far as admission reads it, whichever way it was read.
#[derive(Debug, PartialEq)]
pub struct Envelope<O = Value> {
    /// The API version to answer with: the request's when we know it, else v1.
    pub version: &'static str,
    /// False when `kind` names anything but `AdmissionReview`.
    pub is_review: bool,
    pub request: RequestIn<O>,
}

/// The parts of `request` that admission uses. `O` is the object: a [`Value`], or
/// [`serde::de::IgnoredAny`] where only its presence counts.
#[derive(Debug, PartialEq)]
pub struct RequestIn<O = Value> {
    pub uid: String,
    pub kind: Option<String>,
    pub group: Option<String>,
    pub operation: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub dry_run: bool,
    /// Who asked the API server to create the object (`request.userInfo`).
    pub user_info: UserInfo,
    /// The object, when it is a JSON object.
    pub object: Option<O>,
}

impl<O> Default for RequestIn<O> {
    fn default() -> Self {
        Self {
            uid: String::new(),
            kind: None,
            group: None,
            operation: None,
            namespace: None,
            name: None,
            dry_run: false,
            user_info: UserInfo::default(),
            object: None,
        }
    }
}

impl<O> RequestIn<O> {
    /// Whether the request creates a pod (core group).
    pub fn is_pod_creation(&self) -> bool {
        self.kind.as_deref() == Some("Pod")
            && self.group.as_deref().unwrap_or("").is_empty()
            && self.operation.as_deref() == Some("CREATE")
    }
}

impl RequestIn {
    /// Takes the request apart; never fails (a missing or odd field stays `None`).
    pub fn from_value(request: Value) -> Self {
        let Value::Object(mut map) = request else {
            return Self::default();
        };
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let kind = map.get("kind");
        Self {
            uid: text(map.get("uid")).unwrap_or_default(),
            kind: text(kind.and_then(|k| k.get("kind"))),
            group: text(kind.and_then(|k| k.get("group"))),
            operation: text(map.get("operation")),
            namespace: text(map.get("namespace")),
            name: text(map.get("name")),
            dry_run: map.get("dryRun").and_then(Value::as_bool).unwrap_or(false),
            user_info: UserInfo::from_review(map.get("userInfo")),
            object: map.remove("object").filter(Value::is_object),
        }
    }
}

/// Reads `body` leniently: any JSON object is a review, a field of the wrong type is
/// absent. `Err`: the body is not a JSON object (the message says why).
pub fn read_lenient(body: &[u8]) -> Result<Envelope, String> {
    let MapOnly(review): MapOnly<ReviewIn> =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    Ok(Envelope {
        version: answer_version(&review),
        is_review: review
            .kind
            .as_ref()
            .is_none_or(|k| k.as_str() == Some("AdmissionReview")),
        request: RequestIn::from_value(review.request.unwrap_or(Value::Null)),
    })
}

/// Reads `body` in one typed pass, the object as `O` (skipped unbuilt with
/// [`serde::de::IgnoredAny`]). `None` where a field has an unexpected type, a key
/// repeats, or the object is not a JSON object: [`read_lenient`] reads those, and
/// agrees with this wherever this reads a review (tested), so that the way a review
/// was read never changes its answer.
pub fn read_typed<'a, O: Deserialize<'a>>(body: &'a [u8]) -> Option<Envelope<O>> {
    let MapOnly(review): MapOnly<typed::Review<'a, O>> = serde_json::from_slice(body).ok()?;
    Some(review.into_envelope())
}

/// The API version to answer with: the request's when we know it, else v1.
pub fn answer_version(review: &ReviewIn) -> &'static str {
    version_of(review.api_version.as_ref().and_then(Value::as_str))
}

fn version_of(api_version: Option<&str>) -> &'static str {
    match api_version {
        Some(API_VERSION_V1BETA1) => API_VERSION_V1BETA1,
        _ => API_VERSION_V1,
    }
}

/// `T` read from a JSON object only: serde reads a struct from an array too (its
/// fields in order), which no review is.
struct MapOnly<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for MapOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = MapOnly<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(MapOnly)
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// Borrowed views of a review for [`read_typed`]: only the fields admission reads;
/// serde skips everything else without building it.
mod typed {
    use std::borrow::Cow;

    use gpu_booking_core::admission::UserInfo;
    use serde::Deserialize;

    use super::MapOnly;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[serde(bound(deserialize = "O: Deserialize<'de>"))]
    pub struct Review<'a, O> {
        #[serde(borrow, default)]
        api_version: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        request: Option<MapOnly<Request<'a, O>>>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[serde(bound(deserialize = "O: Deserialize<'de>"))]
    struct Request<'a, O> {
        #[serde(borrow, default)]
        uid: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        kind: Option<MapOnly<Kind<'a>>>,
        #[serde(borrow, default)]
        operation: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        namespace: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
        #[serde(default)]
        dry_run: Option<bool>,
        #[serde(borrow, default)]
        user_info: Option<MapOnly<RequestUser<'a>>>,
        #[serde(default)]
        object: Option<MapOnly<O>>,
    }

    #[derive(Deserialize, Default)]
    struct Kind<'a> {
        #[serde(borrow, default)]
        group: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        kind: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize)]
    struct RequestUser<'a> {
        #[serde(borrow, default)]
        username: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        groups: Option<Vec<Cow<'a, str>>>,
    }

    impl<O> Review<'_, O> {
        pub fn into_envelope(self) -> super::Envelope<O> {
            let owned = |s: Option<Cow<'_, str>>| s.map(Cow::into_owned);
            let request = self.request.map(|MapOnly(r)| {
                let kind = r.kind.map(|MapOnly(k)| k).unwrap_or_default();
                let user_info = r.user_info.map(|MapOnly(u)| UserInfo {
                    username: owned(u.username),
                    groups: u
                        .groups
                        .unwrap_or_default()
                        .into_iter()
                        .map(Cow::into_owned)
                        .collect(),
                });
                super::RequestIn {
                    uid: owned(r.uid).unwrap_or_default(),
                    kind: owned(kind.kind),
                    group: owned(kind.group),
                    operation: owned(r.operation),
                    namespace: owned(r.namespace),
                    name: owned(r.name),
                    dry_run: r.dry_run.unwrap_or(false),
                    user_info: user_info.unwrap_or_default(),
                    object: r.object.map(|MapOnly(o)| o),
                }
            });
            super::Envelope {
                version: super::version_of(self.api_version.as_deref()),
                is_review: self.kind.as_deref().is_none_or(|k| k == "AdmissionReview"),
                request: request.unwrap_or_default(),
            }
        }
    }
}

/// An outgoing review.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    pub api_version: String,
    pub kind: String,
    pub response: ResponseOut,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResponseOut {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusOut>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Base64 of the JSON Patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `metav1.Status`, as much as an admission answer uses.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatusOut {
    pub code: u16,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ReviewOut {
    /// Allowed, unchanged.
    pub fn allow(version: &str, uid: &str) -> Self {
        Self {
            api_version: version.to_owned(),
            kind: "AdmissionReview".to_owned(),
            response: ResponseOut {
                uid: uid.to_owned(),
                allowed: true,
                ..ResponseOut::default()
            },
        }
    }

    /// Refused as malformed (HTTP-style 400 inside the review, never as the status).
    pub fn invalid(version: &str, uid: &str, message: impl Into<String>) -> Self {
        Self::refused(version, uid, 400, "BadRequest", message.into())
    }

    /// Refused for now: the client sends too many reviews (429 inside the review).
    pub fn too_many(version: &str, uid: &str, message: impl Into<String>) -> Self {
        Self::refused(version, uid, 429, "TooManyRequests", message.into())
    }

    fn refused(version: &str, uid: &str, code: u16, reason: &str, message: String) -> Self {
        let mut review = Self::allow(version, uid);
        review.response.allowed = false;
        review.response.status = Some(StatusOut {
            code,
            message,
            reason: Some(reason.to_owned()),
        });
        review
    }

    /// Adds `patch` unless it is empty.
    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Self {
        if !patch.0.is_empty() {
            // Serialising a Patch (strings and JSON values) cannot fail.
            let json = serde_json::to_vec(patch).unwrap_or_default();
            self.response.patch = Some(base64::engine::general_purpose::STANDARD.encode(json));
            self.response.patch_type = Some("JSONPatch".to_owned());
        }
        self
    }

    pub fn with_warning(mut self, warning: Option<String>) -> Self {
        self.response.warnings.extend(warning);
        self
    }

    /// The patch, decoded (for tests and tools).
    pub fn decoded_patch(&self) -> Option<json_patch::Patch> {
        let b64 = self.response.patch.as_ref()?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn request_fields_are_read_one_by_one() {
        let r = RequestIn::from_value(json!({
            "uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "namespace": "jhub", "dryRun": true, "object": {"a": 1},
            "userInfo": 7
        }));
        assert_eq!(r.uid, "u1");
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert!(r.dry_run);
        assert_eq!(r.object, Some(json!({"a": 1})));
        assert_eq!(r.user_info, UserInfo::default());
        let r = RequestIn::from_value(
            json!({"userInfo": {"username": "system:serviceaccount:jhub:hub",
            "groups": ["system:serviceaccounts"]}}),
        );
        assert_eq!(
            r.user_info.username.as_deref(),
            Some("system:serviceaccount:jhub:hub")
        );
        assert_eq!(r.user_info.groups, ["system:serviceaccounts"]);
        let odd = RequestIn::from_value(json!({"uid": 5, "object": null}));
        assert_eq!(odd.uid, "");
        assert_eq!(odd.object, None);
        assert_eq!(RequestIn::from_value(json!("x")).uid, "");
    }

    #[test]
    fn answers_carry_base64_patches() {
        let patch: json_patch::Patch =
            serde_json::from_value(json!([{"op": "add", "path": "/a", "value": 1}])).unwrap();
        let out = ReviewOut::allow(API_VERSION_V1, "u").with_patch(&patch);
        let text = serde_json::to_value(&out).unwrap();
        assert_eq!(text["response"]["patchType"], "JSONPatch");
        assert_eq!(
            text["response"]["patch"],
            "W3sib3AiOiJhZGQiLCJwYXRoIjoiL2EiLCJ2YWx1ZSI6MX1d"
        );
        assert_eq!(out.decoded_patch(), Some(patch));
        let empty = ReviewOut::allow(API_VERSION_V1, "u").with_patch(&json_patch::Patch(vec![]));
        assert!(empty.response.patch.is_none());
        let bad = serde_json::to_value(ReviewOut::invalid(API_VERSION_V1, "u", "no")).unwrap();
        assert_eq!(bad["response"]["allowed"], false);
        assert_eq!(bad["response"]["status"]["code"], 400);
    }

    /// A field of the review: absent, or a value of any JSON type.
    fn any_field() -> impl Strategy<Value = Option<Value>> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-zA-Z:\\\\\"é/-]{0,8}".prop_map(Value::String),
            Just(json!("AdmissionReview")),
            Just(json!("Pod")),
            Just(json!("CREATE")),
            Just(json!(API_VERSION_V1BETA1)),
        ];
        let value = leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,3}|kind|group|username|groups", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        proptest::option::weighted(0.8, value)
    }

    fn object_of(fields: Vec<(&str, Option<Value>)>) -> Value {
        Value::Object(
            fields
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
                .collect(),
        )
    }

    /// Reviews that are mostly well-formed: each field usually of its right type,
    /// sometimes of any type.
    fn reviews() -> impl Strategy<Value = Value> {
        let text = |right: Value| prop_oneof![6 => Just(Some(right)), 1 => any_field()];
        let request = (
            text(json!("u-1")),
            prop_oneof![
                3 => Just(Some(json!({"group": "", "version": "v1", "kind": "Pod"}))),
                1 => any_field(),
            ],
            text(json!("CREATE")),
            text(json!("jhub")),
            text(json!("jupyter-a")),
            prop_oneof![2 => Just(Some(json!(true))), 1 => any_field()],
            prop_oneof![
                2 => Just(Some(json!({"username": "system:serviceaccount:jhub:hub",
                    "groups": ["system:serviceaccounts", "system:authenticated"]}))),
                1 => any_field(),
            ],
            prop_oneof![
                2 => Just(Some(json!({"metadata": {"name": "p"}, "spec": {}}))),
                1 => any_field(),
            ],
        )
            .prop_map(|(uid, kind, op, ns, name, dry, user, object)| {
                Some(object_of(vec![
                    ("uid", uid),
                    ("kind", kind),
                    ("operation", op),
                    ("namespace", ns),
                    ("name", name),
                    ("dryRun", dry),
                    ("userInfo", user),
                    ("object", object),
                ]))
            });
        (
            text(json!(API_VERSION_V1)),
            text(json!("AdmissionReview")),
            prop_oneof![4 => request, 1 => any_field()],
        )
            .prop_map(|(version, kind, request)| {
                object_of(vec![
                    ("apiVersion", version),
                    ("kind", kind),
                    ("request", request),
                ])
            })
    }

    proptest! {
        /// Wherever the typed pass reads a review, it reads what the lenient one does
        /// (so the fast path never changes an answer), and skipping the object changes
        /// nothing but the object.
        #[test]
        fn typed_reading_agrees_with_lenient(review in reviews()) {
            let body = serde_json::to_vec(&review).unwrap();
            let lenient = read_lenient(&body).unwrap();
            if let Some(typed) = read_typed::<Value>(&body) {
                prop_assert_eq!(&typed, &lenient);
            }
            if let Some(skipped) = read_typed::<serde::de::IgnoredAny>(&body) {
                prop_assert_eq!(skipped.request.object.is_some(), lenient.request.object.is_some());
                prop_assert_eq!(skipped.version, lenient.version);
                prop_assert_eq!(skipped.is_review, lenient.is_review);
                prop_assert_eq!(&skipped.request.uid, &lenient.request.uid);
                prop_assert_eq!(&skipped.request.user_info, &lenient.request.user_info);
                prop_assert_eq!(skipped.request.is_pod_creation(), lenient.request.is_pod_creation());
            }
        }
    }

    #[test]
    fn the_typed_pass_reads_real_reviews_and_leaves_odd_ones_to_the_lenient_one() {
        let review = json!({
            "apiVersion": API_VERSION_V1BETA1, "kind": "AdmissionReview",
            "request": {"uid": "u-é", "kind": {"group": "", "kind": "Pod"},
                "operation": "CREATE", "namespace": "jhub", "dryRun": false,
                "userInfo": {"username": "hub", "groups": ["a"], "extra": {"x": ["y"]}},
                "object": {"metadata": {"name": "p"}}}
        });
        let body = serde_json::to_vec(&review).unwrap();
        let typed = read_typed::<Value>(&body).expect("a well-formed review");
        assert_eq!(typed, read_lenient(&body).unwrap());
        assert_eq!(typed.version, API_VERSION_V1BETA1);
        assert!(typed.request.is_pod_creation());
        assert_eq!(typed.request.user_info.groups, ["a"]);
        // A field of another type, an object that is an array, a repeated key: the
        // typed pass gives up, the lenient one still finds the uid.
        for body in [
            r#"{"request": {"uid": "u-1", "dryRun": "yes"}}"#,
            r#"{"request": {"uid": "u-1", "object": [1]}}"#,
            r#"{"request": {"uid": "u-1", "uid": "u-2"}}"#,
        ] {
            assert!(read_typed::<Value>(body.as_bytes()).is_none(), "{body}");
            assert!(read_lenient(body.as_bytes())
                .unwrap()
                .request
                .uid
                .starts_with("u-"));
        }
        assert!(read_lenient(b"[1]").is_err());
        assert!(read_lenient(b"{").is_err());
    }
}
