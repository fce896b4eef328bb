//! Who made a request: the user the AdmissionReview's `userInfo` names.
//!
//! The fake reads the standard impersonation headers (`Impersonate-User`,
//! `Impersonate-Group`), which a client built with
//! [`crate::FakeApiServer::client_as`] sets on every request. Without them the
//! requester is the cluster admin (`system:admin` in `system:masters`), as a kubeconfig
//! with the admin certificate would be.

use http::HeaderMap;
use serde::Serialize;

const USER_HEADER: &str = "impersonate-user";
const GROUP_HEADER: &str = "impersonate-group";

/// Every authenticated user is in this group (Kubernetes "Authenticating").
const AUTHENTICATED: &str = "system:authenticated";

/// The requester, as `authentication.k8s.io/v1` `UserInfo` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// `username` in `groups`, plus `system:authenticated` as the API server adds it to
    /// an impersonated user ("User impersonation", Authenticating page).
    pub fn new(username: &str, groups: &[&str]) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        if !groups
            .iter()
            .any(|g| g == AUTHENTICATED || g == "system:unauthenticated")
        {
            groups.push(AUTHENTICATED.to_owned());
        }
        Self {
            username: username.to_owned(),
            groups,
        }
    }

    /// The default requester: the cluster admin.
    pub fn admin() -> Self {
        Self::new("system:admin", &["system:masters"])
    }

    /// The requester a request's impersonation headers name, or the admin.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let Some(user) = headers.get(USER_HEADER).and_then(|v| v.to_str().ok()) else {
            return Self::admin();
        };
        let groups: Vec<&str> = headers
            .get_all(GROUP_HEADER)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        Self::new(user, &groups)
    }

    /// Sets the impersonation headers that [`Self::from_headers`] reads back; a request
    /// that already names a user keeps it.
    pub fn stamp(&self, headers: &mut HeaderMap) {
        if headers.contains_key(USER_HEADER) {
            return;
        }
        let Ok(user) = http::HeaderValue::from_str(&self.username) else {
            return;
        };
        headers.insert(USER_HEADER, user);
        for group in &self.groups {
            if let Ok(value) = http::HeaderValue::from_str(group) {
                headers.append(GROUP_HEADER, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_default_to_admin() {
        assert_eq!(UserInfo::from_headers(&HeaderMap::new()), UserInfo::admin());
        let hub = UserInfo::new(
            "system:serviceaccount:jhub:hub",
            &["system:serviceaccounts"],
        );
        assert_eq!(
            hub.groups,
            ["system:serviceaccounts", "system:authenticated"]
        );
        let mut headers = HeaderMap::new();
        hub.stamp(&mut headers);
        assert_eq!(UserInfo::from_headers(&headers), hub);
    }
}
