//! "Sign in with JupyterHub" against a real JupyterHub (PyPI `jupyterhub`, run with
//! tests/jupyterhub/jupyterhub_config.py on 127.0.0.1, no proxy): users log in at the
//! hub, the page's sign-in goes through the hub's OAuth, and the token the page gets
//! names the user as the hub does (the name KubeSpawner writes on their pods), with
//! the booking admin role for members of the admin group only. Forged callbacks and
//! codes are refused and sign nobody in.
//!
//! The hub: tests/support/jupyterhub.rs (skipped, saying so, where it is not installed).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_booking_api::clock::SystemClock;
use gpu_booking_api::config::HubLoginArgs;
use gpu_booking_api::hub_login::{HubLogin, HubLoginContext};
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::jwt::JwtClaimArgs;
use gpu_booking_core::username::NameCase;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::redirect::Policy as Redirects;
use serde_json::{json, Value};
use sqlx::PgPool;

#[path = "../../../tests/support/jupyterhub.rs"]
mod jupyterhub;
use jupyterhub::{RealHub as Hub, BOOKING_SECRET as CLIENT_SECRET, PASSWORD};

const SECRET: &[u8] = b"hub-login-test-secret-0123456789abcdef";

/// A browser: cookies by name (the hub's and ours live on different ports, and
/// each is sent only where it came from), redirects followed by the test.
struct Browser {
    http: reqwest::Client,
    jars: BTreeMap<String, BTreeMap<String, String>>,
}

impl Browser {
    fn new() -> Self {
        Self {
            http: reqwest::Client::builder()
                .redirect(Redirects::none())
                .build()
                .unwrap(),
            jars: BTreeMap::new(),
        }
    }

    fn origin(url: &str) -> String {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        rest.split('/').next().unwrap_or_default().to_owned()
    }

    async fn request(&mut self, req: reqwest::RequestBuilder, url: &str) -> reqwest::Response {
        let jar = self.jars.entry(Self::origin(url)).or_default();
        let cookies = jar
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ");
        let req = if cookies.is_empty() {
            req
        } else {
            req.header(COOKIE, cookies)
        };
        let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        for c in resp.headers().get_all(SET_COOKIE) {
            let first = c.to_str().unwrap().split(';').next().unwrap();
            if let Some((k, v)) = first.split_once('=') {
                if v.is_empty() {
                    jar.remove(k);
                } else {
                    jar.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        resp
    }

    async fn get(&mut self, url: &str) -> reqwest::Response {
        let req = self.http.get(url);
        self.request(req, url).await
    }

    /// Logs in at the hub's login form.
    async fn hub_login(&mut self, hub: &Hub, user: &str) {
        self.get(&format!("{}/hub/login", hub.url)).await;
        let xsrf = self.jars[&Self::origin(&hub.url)]["_xsrf"].clone();
        let url = format!("{}/hub/login", hub.url);
        let req = self.http.post(&url).form(&[
            ("username", user),
            ("password", PASSWORD),
            ("_xsrf", &xsrf),
        ]);
        let resp = self.request(req, &url).await;
        assert_eq!(resp.status(), 302, "the hub's login of {user}");
    }

    /// Follows redirects from `url` until one leaves for `stop_at`'s page fragment;
    /// returns the final Location.
    async fn sign_in(&mut self, url: &str) -> String {
        let mut url = url.to_owned();
        for _ in 0..10 {
            let resp = self.get(&url).await;
            assert_eq!(
                resp.status(),
                302,
                "{url} answered {}: {:?}",
                resp.status(),
                resp.text().await
            );
            let next = resp.headers()[LOCATION].to_str().unwrap().to_owned();
            if next.contains('#') {
                return next;
            }
            url = if next.starts_with('/') {
                format!("http://{}{next}", Self::origin(&url))
            } else {
                next
            };
        }
        panic!("the sign-in did not end");
    }
}

/// The value of `key` in the fragment, decoded as the page's URLSearchParams does.
fn fragment(location: &str, key: &str) -> Option<String> {
    let frag = location.split_once('#')?.1;
    form_urlencoded::parse(frag.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

async fn api_get(url: &str, token: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[sqlx::test(migrations = "../migrations")]
async fn people_sign_in_through_a_real_jupyterhub(pool: PgPool) {
    let Some(program) = jupyterhub::program() else {
        return;
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page = format!("http://{}", listener.local_addr().unwrap());
    let hub = Hub::start(&program, Some(&page)).await;

    let login = HubLogin::from_args(
        &HubLoginArgs {
            hub_login_url: Some(hub.url.clone()),
            hub_login_secret: Some(CLIENT_SECRET.into()),
            hub_login_admin_group: Some("gpu-admins".into()),
            ..HubLoginArgs::default()
        },
        HubLoginContext {
            hs256_secret: Some(SECRET),
            page_url: Some(&page),
            claims: &JwtClaimArgs::default(),
            max_token_lifetime: Duration::from_secs(24 * 3600),
            names: NameCase::default(),
        },
    )
    .unwrap()
    .unwrap();
    let mut state = test_state(pool, Policy::default(), Arc::new(SystemClock), SECRET);
    state.page = state.page.with_hub_login(login);
    let app = gpu_booking_api::app::router(state);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // The page offers the hub's button.
    let html = reqwest::get(format!("{page}/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        html.contains(r#"<meta name="gpu-booking-hub-login" content="/login/hub">"#),
        "the page does not offer JupyterHub sign-in"
    );

    // alice signs in at the hub, then on the page: the hub asks nothing more.
    let mut alice = Browser::new();
    alice.hub_login(&hub, "Alice").await;
    let landed = alice.sign_in(&format!("{page}/login/hub")).await;
    assert!(
        landed.starts_with(&format!("{page}/#")),
        "landed on {landed}"
    );
    let token = fragment(&landed, "hub-token").unwrap_or_else(|| panic!("no token: {landed}"));

    // The API takes it: a booking made with it is alice's, under the hub's name.
    let admin = gpu_booking_api::testing::token_for(SECRET, "admin", Some("admin"));
    let r = reqwest::Client::new()
        .put(format!("{page}/api/v1/models/a100"))
        .bearer_auth(&admin)
        .json(&json!({"units": 2, "patterns": ["*A100*"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let start = chrono::Utc::now() + chrono::TimeDelta::hours(1);
    let r = reqwest::Client::new()
        .post(format!("{page}/api/v1/bookings"))
        .bearer_auth(&token)
        .json(&json!({"model": "a100", "start": start.to_rfc3339(), "end": (start + chrono::TimeDelta::days(1)).to_rfc3339()}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let booking: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "alice's booking: {booking}");
    assert_eq!(
        booking["user"], "alice",
        "the hub's name, normalised as KubeSpawner's is"
    );
    // She is no admin.
    let (status, _) = api_get(&format!("{page}/api/v1/audit?limit=1"), &token).await;
    assert_eq!(
        status, 403,
        "a hub user without the admin group is no booking admin"
    );

    // carol is in the admin group: an admin of the booking service.
    let mut carol = Browser::new();
    carol.hub_login(&hub, "carol").await;
    let landed = carol.sign_in(&format!("{page}/login/hub")).await;
    let carol_token = fragment(&landed, "hub-token").expect("carol's token");
    let (status, _) = api_get(&format!("{page}/api/v1/audit?limit=1"), &carol_token).await;
    assert_eq!(status, 200, "members of --hub-login-admin-group are admins");

    // The hub lists the page in its Services menu; the menu's link comes back to us
    // through the hub's proxy and is sent on to the sign-in.
    let home = alice
        .get(&format!("{}/hub/home", hub.url))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        home.contains("/services/gpu-booking/"),
        "the hub's Services menu lacks the page"
    );
    let r = Browser::new()
        .get(&format!("{page}/services/gpu-booking/"))
        .await;
    assert_eq!(r.status(), 302);
    assert_eq!(r.headers()[LOCATION], format!("{page}/login/hub").as_str());

    // A callback this browser did not start (no state cookie, or another state) and
    // a forged code sign nobody in.
    let mut mallory = Browser::new();
    let landed = mallory
        .sign_in(&format!("{page}/login/hub/callback?code=x&state=y"))
        .await;
    assert!(
        fragment(&landed, "hub-token").is_none() && fragment(&landed, "signin-error").is_some(),
        "{landed}"
    );
    let started = mallory.get(&format!("{page}/login/hub")).await;
    let authorize = started.headers()[LOCATION].to_str().unwrap().to_owned();
    let state = authorize.split("state=").nth(1).unwrap().to_owned();
    let landed = mallory
        .sign_in(&format!(
            "{page}/login/hub/callback?code=forged&state={state}"
        ))
        .await;
    assert!(
        fragment(&landed, "hub-token").is_none(),
        "a forged code signed someone in: {landed}"
    );
    assert!(
        fragment(&landed, "signin-error")
            .unwrap()
            .contains("did not accept"),
        "{landed}"
    );
    // The hub's refusal ("access denied") comes back as a problem, not a token.
    let landed = mallory
        .sign_in(&format!(
            "{page}/login/hub/callback?error=access_denied&state={state}"
        ))
        .await;
    assert!(fragment(&landed, "hub-token").is_none(), "{landed}");

    server.abort();
}

#[sqlx::test(migrations = "../migrations")]
async fn without_hub_login_its_routes_are_not_found(pool: PgPool) {
    let state = test_state(pool, Policy::default(), Arc::new(SystemClock), SECRET);
    let app = gpu_booking_api::app::router(state);
    for uri in [
        "/login/hub",
        "/login/hub/callback?code=x&state=y",
        "/services/gpu-booking/",
    ] {
        let r = crate::common::call(&app, axum::http::Method::GET, uri, None, None).await;
        assert_eq!(r.status, 404, "{uri}");
    }
}

/// The periodic refresh of hub groups against a real hub, with the token the chart
/// gives it (the service's own, granted `list:groups` and `read:groups` as
/// examples/jupyterhub/jupyterhub-values.yaml does): the hub's `ml-lab` members
/// become members of the group an admin created here; a token without those scopes
/// is refused by the hub and changes nothing.
#[sqlx::test(migrations = "../migrations")]
async fn a_real_hubs_groups_are_read_with_the_services_token(pool: PgPool) {
    use gpu_booking_api::hub_groups::HubGroups;
    let Some(program) = jupyterhub::program() else {
        return;
    };
    // The page is never visited: the service only needs an address in the hub's config.
    let hub = Hub::start(&program, Some("http://127.0.0.1:9")).await;
    sqlx::query("INSERT INTO lab_group (name) VALUES ('ml-lab')")
        .execute(&pool)
        .await
        .unwrap();
    let members = || async {
        sqlx::query_as::<_, (String, String)>(
            "SELECT m.user_name, m.source FROM group_member m ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };

    let without_scope = HubGroups::new(
        &hub.api_url(),
        jupyterhub::READ_ONLY_TOKEN,
        NameCase::default(),
    )
    .unwrap();
    let refused = without_scope.refresh(&pool).await.unwrap_err();
    assert!(
        format!("{refused:#}").contains("403"),
        "a token with only read:users should be refused by the hub: {refused:#}"
    );
    assert_eq!(members().await, vec![]);

    let service = HubGroups::new(&hub.api_url(), CLIENT_SECRET, NameCase::default()).unwrap();
    service.refresh(&pool).await.unwrap();
    let hub_source = |u: &str| (u.to_owned(), "hub".to_owned());
    assert_eq!(
        members().await,
        vec![hub_source("alice"), hub_source("carol")],
        "the hub's ml-lab (alice, carol) should be the group's members; gpu-admins has no group here"
    );
}
