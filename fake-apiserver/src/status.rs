//! `Status` error bodies as the API server writes them.

use serde_json::{json, Value};

/// A failed request: the HTTP code and the `Status` object that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub body: Value,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>, details: Value) -> Self {
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message.into(),
            "reason": reason,
            "code": code,
        });
        if !details.is_null() {
            body["details"] = details;
        }
        Self { code, body }
    }

    /// The `Status` message.
    pub fn message(&self) -> String {
        self.body["message"].as_str().unwrap_or("").to_owned()
    }

    pub fn not_found(plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{plural} \"{name}\" not found"),
            json!({"name": name, "kind": plural}),
        )
    }

    pub fn already_exists(plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{plural} \"{name}\" already exists"),
            json!({"name": name, "kind": plural}),
        )
    }

    pub fn conflict(plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {plural} \"{name}\": {why}"),
            json!({"name": name, "kind": plural}),
        )
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message, Value::Null)
    }

    pub fn invalid(plural: &str, name: &str, message: impl Into<String>) -> Self {
        Self::new(
            422,
            "Invalid",
            message,
            json!({"name": name, "kind": plural}),
        )
    }

    /// `pods "name" is forbidden: why` (403), as `apierrors.NewForbidden` writes it;
    /// `group_resource` is `pods` or `deployments.apps`.
    pub fn forbidden(group_resource: &str, name: &str, why: &str) -> Self {
        let message = if name.is_empty() {
            format!("{group_resource} is forbidden: {why}")
        } else {
            format!("{group_resource} \"{name}\" is forbidden: {why}")
        };
        Self::new(
            403,
            "Forbidden",
            message,
            json!({"name": name, "kind": group_resource}),
        )
    }

    /// `Internal error occurred: message` (500), as `apierrors.NewInternalError`
    /// writes it.
    pub fn internal(message: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            json!({"causes": [{"message": message}]}),
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message, Value::Null)
    }

    /// An injected failure: the reason that goes with the code.
    pub fn injected(code: u16) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        Self::new(
            code,
            reason,
            format!("injected failure (HTTP {code})"),
            Value::Null,
        )
    }
}
