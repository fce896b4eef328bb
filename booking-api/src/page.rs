//! The booking page: static assets compiled into the binary, so that nothing is
//! fetched at run time. The page only calls the REST API.
//!
//! `index.html` is the one asset with server settings in it: the OIDC login's
//! issuer, client id, scope and token kind, and whether JupyterHub sign-in is set up
//! (`crate::hub_login`), written into its `<meta>` tags once at start-up
//! (HTML-escaped: they come from flags, but a page must never trust them).

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::config::OidcArgs;

const INDEX_HTML: &str = include_str!("../assets/index.html");
/// The page's scripts (`/assets/<name>`): one file per part of the page, so that a
/// feature's script is added by one line here and one `<script>` tag.
const SCRIPTS: &[(&str, &str)] = &[
    ("dom.js", include_str!("../assets/dom.js")),
    ("calendar.js", include_str!("../assets/calendar.js")),
    ("policy.js", include_str!("../assets/policy.js")),
    ("groups.js", include_str!("../assets/groups.js")),
    ("reservations.js", include_str!("../assets/reservations.js")),
    ("maintenance.js", include_str!("../assets/maintenance.js")),
    ("app.js", include_str!("../assets/app.js")),
    ("cluster.js", include_str!("../assets/cluster.js")),
    ("demo-signin.js", include_str!("../assets/demo-signin.js")),
    ("units.js", include_str!("../assets/units.js")),
    ("waitlist.js", include_str!("../assets/waitlist.js")),
    ("notices.js", include_str!("../assets/notices.js")),
    ("extend.js", include_str!("../assets/extend.js")),
    ("notebooks.js", include_str!("../assets/notebooks.js")),
    // Chart.js (MIT, its licence header kept; licence text beside it), for the
    // admin's usage plots: served from here, nothing fetched at run time.
    (
        "chart.umd.min.js",
        include_str!("../assets/chart.umd.min.js"),
    ),
    ("usage.js", include_str!("../assets/usage.js")),
];
const STYLE_CSS: &str = include_str!("../assets/style.css");
const FAVICON_SVG: &str = include_str!("../assets/favicon.svg");

/// The page as served, with this server's settings in it.
#[derive(Debug, Clone)]
pub struct Page {
    index_html: Arc<str>,
    hub_login: Option<Arc<crate::hub_login::HubLogin>>,
}

impl Page {
    pub fn new(oidc: &OidcArgs) -> Self {
        let metas = [
            ("issuer", oidc.oidc_issuer.as_deref().unwrap_or("")),
            ("client-id", oidc.oidc_client_id.as_deref().unwrap_or("")),
            ("scope", oidc.oidc_scope.as_str()),
            ("token", oidc.oidc_token.as_str()),
        ];
        let mut html = INDEX_HTML.to_owned();
        for (name, value) in metas {
            html = fill_meta(&html, &format!("oidc-{name}"), value);
        }
        Self {
            index_html: html.into(),
            hub_login: None,
        }
    }

    /// The page with its "Sign in with JupyterHub" button and routes.
    pub fn with_hub_login(self, hub_login: crate::hub_login::HubLogin) -> Self {
        Self {
            index_html: fill_meta(&self.index_html, "hub-login", crate::hub_login::START_PATH)
                .into(),
            hub_login: Some(Arc::new(hub_login)),
        }
    }

    /// The page with the lab's time zone (`--time-zone`): its calendar's days are the
    /// lab's.
    pub fn with_time_zone(self, zone: chrono_tz::Tz) -> Self {
        Self {
            index_html: fill_meta(&self.index_html, "time-zone", zone.name()).into(),
            ..self
        }
    }

    /// The sign-in's routes' view of it.
    pub fn hub_login(&self) -> crate::hub_login::HubLoginState {
        crate::hub_login::HubLoginState(self.hub_login.clone())
    }
}

impl Default for Page {
    fn default() -> Self {
        Self::new(&OidcArgs::default())
    }
}

/// Sets the content of `<meta name="gpu-booking-NAME" content="...">`.
fn fill_meta(html: &str, name: &str, value: &str) -> String {
    let prefix = format!("<meta name=\"gpu-booking-{name}\" content=\"");
    let Some(start) = html.find(&prefix).map(|i| i + prefix.len()) else {
        // The template is ours and a unit test pins every tag; never reached.
        return html.to_owned();
    };
    let end = start + html[start..].find('"').unwrap_or(0);
    format!(
        "{}{}{}",
        &html[..start],
        escape_attribute(value),
        &html[end..]
    )
}

fn escape_attribute(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's routes, for any state that holds the [`Page`].
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Page: FromRef<S>,
    crate::hub_login::HubLoginState: FromRef<S>,
{
    let scripts = SCRIPTS.iter().fold(Router::new(), |router, &(name, body)| {
        router.route(
            &format!("/assets/{name}"),
            get(move || async move { asset("text/javascript; charset=utf-8", body) }),
        )
    });
    scripts
        .merge(crate::hub_login::routes())
        .route(
            "/",
            get(|State(page): State<Page>| async move {
                asset("text/html; charset=utf-8", page.index_html.to_string())
            }),
        )
        .route(
            "/assets/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        // Browsers ask for /favicon.ico whatever the page links; both get the SVG.
        .route(
            "/assets/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON_SVG) }),
        )
        .route(
            "/favicon.ico",
            get(|| async { asset("image/svg+xml", FAVICON_SVG) }),
        )
}

fn asset(content_type: &'static str, body: impl Into<axum::body::Body>) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; connect-src 'self' https:; frame-ancestors 'none'",
            ),
        ],
        body.into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OidcToken;

    fn meta(html: &str, name: &str) -> String {
        let prefix = format!("<meta name=\"gpu-booking-oidc-{name}\" content=\"");
        let start = html.find(&prefix).expect("tag present") + prefix.len();
        html[start..start + html[start..].find('"').unwrap()].to_owned()
    }

    #[test]
    fn default_page_offers_no_oidc_login() {
        let page = Page::default();
        assert_eq!(meta(&page.index_html, "issuer"), "");
        assert_eq!(meta(&page.index_html, "client-id"), "");
        assert_eq!(meta(&page.index_html, "scope"), "openid email profile");
        assert_eq!(meta(&page.index_html, "token"), "access_token");
    }

    #[test]
    fn settings_are_written_into_every_tag() {
        let page = Page::new(&OidcArgs {
            oidc_issuer: Some("https://sso.example/realms/lab".into()),
            oidc_client_id: Some("gpu-booking".into()),
            oidc_scope: "openid email".into(),
            oidc_token: OidcToken::IdToken,
        });
        assert_eq!(
            meta(&page.index_html, "issuer"),
            "https://sso.example/realms/lab"
        );
        assert_eq!(meta(&page.index_html, "client-id"), "gpu-booking");
        assert_eq!(meta(&page.index_html, "scope"), "openid email");
        assert_eq!(meta(&page.index_html, "token"), "id_token");
        // Nothing else of the template changed.
        assert_eq!(
            page.index_html.len(),
            INDEX_HTML.len() + "https://sso.example/realms/lab".len() + "gpu-booking".len()
                - "openid email profile".len()
                + "openid email".len()
                + "id_token".len()
                - "access_token".len()
        );
    }

    #[test]
    fn hostile_values_cannot_leave_the_attribute() {
        let page = Page::new(&OidcArgs {
            oidc_client_id: Some("x\"><script>alert(1)</script>&'".into()),
            ..OidcArgs::default()
        });
        assert_eq!(
            meta(&page.index_html, "client-id"),
            "x&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;&amp;&#39;"
        );
        assert!(!page.index_html.contains("<script>alert"));
    }
}
