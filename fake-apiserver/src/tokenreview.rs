//! `POST /apis/authentication.k8s.io/v1/tokenreviews`, as the API server answers it for
//! ServiceAccount tokens: the tokens the test issued ([`crate::FakeApiServer::
//! service_account_token`]) are authenticated as `system:serviceaccount:<ns>:<name>`
//! for the audiences they were issued for; anything else is not. Nothing is stored
//! (TokenReview is a create-only virtual resource).

use std::collections::HashMap;

use serde_json::{json, Value};

/// A token the fake issued: whom it names, for which audiences.
#[derive(Debug, Clone)]
pub(crate) struct Issued {
    pub namespace: String,
    pub name: String,
    pub audiences: Vec<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Tokens {
    pub issued: HashMap<String, Issued>,
}

/// The TokenReview the API server would return for `request`.
pub(crate) fn review(tokens: &Tokens, request: &Value) -> Value {
    let token = request["spec"]["token"].as_str().unwrap_or_default();
    let wanted: Vec<String> = request["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let status = match tokens.issued.get(token) {
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
        Some(issued) => {
            // The API server answers with the requested audiences the token has; none
            // in common is a failure ("token audiences ... is invalid for the target").
            let common: Vec<&String> = if wanted.is_empty() {
                issued.audiences.iter().collect()
            } else {
                wanted
                    .iter()
                    .filter(|a| issued.audiences.contains(a))
                    .collect()
            };
            if common.is_empty() {
                json!({"authenticated": false, "error": "token audiences are invalid for the target audiences"})
            } else {
                json!({
                    "authenticated": true,
                    "audiences": common,
                    "user": {
                        "username": format!("system:serviceaccount:{}:{}", issued.namespace, issued.name),
                        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", issued.namespace), "system:authenticated"],
                    },
                })
            }
        }
    };
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "metadata": {"creationTimestamp": null},
        "spec": request["spec"],
        "status": status,
    })
}
