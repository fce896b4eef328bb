//! Who calls over HTTP ([`crate::HttpService`]): as kube-apiserver authenticates a
//! request ("Authenticating"), with anonymous requests switched off
//! (`--anonymous-auth=false`), so that no request goes unauthenticated.
//!
//! - `Authorization: Bearer <token>`: a token of the static token file
//!   (`--token-auth-file`; [`crate::FakeApiServer::user_token`]), or a ServiceAccount
//!   token the fake issued ([`crate::FakeApiServer::service_account_token`]) for the
//!   API server's audience [`API_AUDIENCE`] (a token for another audience, e.g. the
//!   booking API's, is refused here as kube-apiserver refuses it);
//! - none, or any other: 401 `Unauthorized`.
//!
//! Impersonation headers (`Impersonate-User`, `Impersonate-Group`) are honoured when
//! the caller may `impersonate` the user (`users`, or `serviceaccounts` for a
//! ServiceAccount's name) and each group (`groups`), as RBAC decides it (a member of
//! `system:masters` may); else 403 in the API server's words. Without RBAC switched on
//! every request is allowed, impersonation included.

use std::collections::HashMap;

use http::HeaderMap;

use crate::admission::UserInfo;
use crate::status::ApiError;
use crate::Shared;

/// The audience ServiceAccount tokens must have to authenticate to the API server
/// (its `--api-audiences`, by default its issuer).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// The static token file: token to user.
#[derive(Debug, Default)]
pub(crate) struct StaticTokens(pub HashMap<String, UserInfo>);

fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized", serde_json::Value::Null)
}

/// The bearer token of `headers`, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user a request authenticates as, impersonation applied; a 401 or 403 else.
pub(crate) fn authenticate(shared: &Shared, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
    let token = bearer(headers).ok_or_else(unauthorized)?;
    let caller = shared
        .users
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .0
        .get(token)
        .cloned();
    let caller = match caller {
        Some(user) => user,
        None => {
            let tokens = shared.tokens.lock().unwrap_or_else(|e| e.into_inner());
            let issued = tokens
                .issued
                .get(token)
                .filter(|issued| issued.audiences.iter().any(|a| a == API_AUDIENCE))
                .ok_or_else(unauthorized)?;
            let ns_group = format!("system:serviceaccounts:{}", issued.namespace);
            UserInfo::new(
                &format!("system:serviceaccount:{}:{}", issued.namespace, issued.name),
                &["system:serviceaccounts", &ns_group],
            )
        }
    };
    impersonate(shared, caller, headers)
}

fn impersonate(
    shared: &Shared,
    caller: UserInfo,
    headers: &HeaderMap,
) -> Result<UserInfo, ApiError> {
    let named = |header: &str| -> Vec<&str> {
        headers
            .get_all(header)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    };
    let users = named("impersonate-user");
    let groups = named("impersonate-group");
    let Some(&user) = users.first() else {
        if groups.is_empty() {
            return Ok(caller);
        }
        return Err(ApiError::bad_request(
            "requested impersonation of groups without impersonating a user",
        ));
    };
    if shared.rbac.load(std::sync::atomic::Ordering::SeqCst) {
        let store = shared.lock();
        let may = |resource: &str, namespace: Option<&str>, name: &str| {
            crate::rbac::allows(
                &store,
                &caller,
                "impersonate",
                "",
                resource,
                namespace,
                Some(name),
            )
        };
        let refuse = |resource: &str, name: &str| {
            ApiError::forbidden(
                resource,
                name,
                &format!(
                    "User {:?} cannot impersonate resource {resource:?} in API group \"\" at the cluster scope",
                    caller.username
                ),
            )
        };
        let account = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'));
        let user_allowed = match account {
            Some((ns, name)) => may("serviceaccounts", Some(ns), name),
            None => may("users", None, user),
        };
        if !user_allowed {
            return Err(refuse("users", user));
        }
        if let Some(group) = groups.iter().find(|g| !may("groups", None, g)) {
            return Err(refuse("groups", group));
        }
    }
    Ok(UserInfo::new(user, &groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bearer_tokens_count() {
        let headers = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
            h
        };
        assert_eq!(bearer(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&headers("bearer abc")), Some("abc"));
        assert_eq!(bearer(&headers("Basic abc")), None);
        assert_eq!(bearer(&headers("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
