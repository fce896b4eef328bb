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

/// An incoming review, as far as we read it.
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

/// The parts of `request` that admission uses, each read on its own.
#[derive(Debug, Default)]
pub struct RequestIn {
    pub uid: String,
    pub kind: Option<String>,
    pub group: Option<String>,
    pub operation: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub dry_run: bool,
    /// Who asked the API server to create the object (`request.userInfo`).
    pub user_info: UserInfo,
    pub object: Option<Value>,
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
            object: map.remove("object").filter(|o| !o.is_null()),
        }
    }
}

/// The API version to answer with: the request's when we know it, else v1.
pub fn answer_version(review: &ReviewIn) -> &'static str {
    match review.api_version.as_ref().and_then(Value::as_str) {
        Some(API_VERSION_V1BETA1) => API_VERSION_V1BETA1,
        _ => API_VERSION_V1,
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
        let mut review = Self::allow(version, uid);
        review.response.allowed = false;
        review.response.status = Some(StatusOut {
            code: 400,
            message: message.into(),
            reason: Some("BadRequest".to_owned()),
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
}
