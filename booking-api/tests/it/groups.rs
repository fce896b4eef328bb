//! Groups over the API: admins create them with policies, members come from admins,
//! owners and tokens' groups claims; a user in several groups gets the first
//! group's policy in the admin's order, per model; `GET /api/v1/policy` says so.

use crate::common;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use chrono::TimeDelta;
use common::{days, t0};
use gpu_booking_api::clock::ManualClock;
use gpu_booking_api::testing::test_state;
use gpu_booking_core::booking_policy::Policy;
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &[u8] = b"groups-api-test-secret-0123456789abcdef";

pub struct Api {
    pub app: axum::Router,
}

impl Api {
    pub async fn new(pool: PgPool, policy: Policy) -> Api {
        let mut state = test_state(pool, policy, Arc::new(ManualClock::new(t0())), SECRET);
        state.auth = state.auth.clone().with_groups_claim("groups");
        let api = Api {
            app: gpu_booking_api::app::router(state),
        };
        for (model, units) in [("a100", 8), ("t4", 8)] {
            let (s, _) = api
                .admin(
                    Method::PUT,
                    &format!("/api/v1/models/{model}"),
                    Some(json!({"units": units})),
                )
                .await;
            assert_eq!(s, StatusCode::OK);
        }
        api
    }

    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        who: &str,
        role: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        common::call_as(&self.app, SECRET, method, uri, (who, role), body.as_ref()).await
    }

    pub async fn admin(
        &self,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call(method, uri, "root@lab", Some("admin"), body)
            .await
    }

    pub async fn group(&self, body: Value) {
        let (s, v) = self.admin(Method::POST, "/api/v1/groups", Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }

    pub async fn member(&self, group: &str, user: &str, role: &str) {
        let (s, v) = self
            .admin(
                Method::PUT,
                &format!("/api/v1/groups/{group}/members/{user}"),
                Some(json!({"role": role})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }

    pub async fn book(
        &self,
        who: &str,
        model: &str,
        from: TimeDelta,
        to: TimeDelta,
    ) -> (StatusCode, Value) {
        self.call(
            Method::POST,
            "/api/v1/bookings",
            who,
            None,
            Some(json!({"model": model, "start": t0() + from, "end": t0() + to})),
        )
        .await
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn the_first_group_in_the_admins_order_decides_per_model(pool: PgPool) {
    let api = Api::new(pool.clone(), Policy::default()).await;
    // ml-lab: 7 days of anything but t4s, 2 days of an a100 at most... at position 2;
    // cs101 at position 1: at most 1 day ahead, no h100 rules.
    api.group(json!({
        "name": "ml-lab", "position": 2,
        "policy": {"max_duration_seconds": 7 * 86400, "cooldown_seconds": 0, "max_ahead_seconds": 60 * 86400},
        "models": [{"model": "t4", "allowed": false}]
    }))
    .await;
    api.group(json!({
        "name": "cs101", "position": 1,
        "policy": {"max_duration_seconds": 2 * 86400, "max_ahead_seconds": 86400},
        "listed_models_only": true,
        "models": [{"model": "t4", "policy": {"max_duration_seconds": 3 * 86400}}]
    }))
    .await;
    api.member("ml-lab", "ann", "member").await;
    api.member("ml-lab", "bob", "member").await;
    api.member("cs101", "bob", "member").await;

    // Ann (ml-lab only): 7 days of an a100 where the lab allows 14... and refuses 8.
    let (s, v) = api.book("ann", "a100", days(1), days(9)).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"], "duration_too_long");
    let (s, v) = api.book("ann", "a100", days(1), days(8)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // ml-lab may not book t4s.
    let (s, v) = api.book("ann", "t4", days(30), days(31)).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("model_not_allowed")),
        "{v}"
    );
    // Its horizon is 60 days, the lab's 365: 61 days ahead is refused.
    let (s, v) = api.book("ann", "a100", days(61), days(62)).await;
    assert_eq!(v["error"], "too_far_ahead", "{s} {v}");

    // Bob is in both: cs101 comes first (position 1). Only t4s (listed), up to 3 days,
    // starting at most 1 day ahead.
    let (s, v) = api
        .book("bob", "a100", days(0) + TimeDelta::hours(1), days(2))
        .await;
    assert_eq!(v["error"], "model_not_allowed", "{s} {v}");
    let (s, v) = api
        .book(
            "bob",
            "t4",
            TimeDelta::hours(2),
            days(3) + TimeDelta::hours(2),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // The booking counts against the group whose policy applied.
    let groups: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT b.user_name, g.name FROM booking b LEFT JOIN lab_group g ON g.id = b.group_id ORDER BY b.user_name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        groups,
        vec![
            ("ann".into(), Some("ml-lab".into())),
            ("bob".into(), Some("cs101".into()))
        ]
    );

    // What the page shows Bob.
    let (s, p) = api
        .call(Method::GET, "/api/v1/policy", "bob", None, None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(p["group"], "cs101");
    assert_eq!(p["groups"].as_array().unwrap().len(), 2);
    assert_eq!(p["max_duration_seconds"], 2 * 86400);
    assert_eq!(p["lab"]["max_duration_seconds"], 14 * 86400);
    let t4 = p["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == "t4")
        .unwrap();
    assert_eq!(t4["policy"]["max_duration_seconds"], 3 * 86400);
    assert!(
        t4["sentence"]
            .as_str()
            .unwrap()
            .starts_with("As a member of cs101 you may book up to 3 days of a t4"),
        "{t4}"
    );
    let a100 = p["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == "a100")
        .unwrap();
    assert_eq!(a100["allowed"], false);

    // An admin moves ml-lab first: Bob now gets ml-lab's policy.
    let (s, g) = api.admin(Method::GET, "/api/v1/groups/ml-lab", None).await;
    assert_eq!(s, StatusCode::OK);
    let mut body = json!({
        "position": 0, "policy": g["policy"], "models": g["models"], "quota": g["quota"]
    });
    body["listed_models_only"] = g["listed_models_only"].clone();
    let (s, v) = api
        .admin(Method::PUT, "/api/v1/groups/ml-lab", Some(body))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, p) = api
        .call(Method::GET, "/api/v1/policy", "bob", None, None)
        .await;
    assert_eq!(p["group"], "ml-lab");

    // A user in no group: the lab's policy, as before.
    let (_, p) = api
        .call(Method::GET, "/api/v1/policy", "cy", None, None)
        .await;
    assert_eq!(p["group"], Value::Null);
    assert_eq!(p["max_duration_seconds"], 14 * 86400);
}

#[sqlx::test(migrations = "../migrations")]
async fn owners_manage_members_and_admins_everything_else(pool: PgPool) {
    let api = Api::new(pool.clone(), Policy::default()).await;
    api.group(json!({"name": "ml-lab"})).await;
    // Not an admin: no group is created.
    let (s, _) = api
        .call(
            Method::POST,
            "/api/v1/groups",
            "ann",
            None,
            Some(json!({"name": "mine"})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // A name that cannot be one, a duplicate, a policy that cannot hold.
    let (s, _) = api
        .admin(
            Method::POST,
            "/api/v1/groups",
            Some(json!({"name": "ml lab"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, v) = api
        .admin(
            Method::POST,
            "/api/v1/groups",
            Some(json!({"name": "ml-lab"})),
        )
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::CONFLICT, Some("group_exists"))
    );
    let (s, _) = api
        .admin(
            Method::POST,
            "/api/v1/groups",
            Some(json!({"name": "odd", "policy": {"min_duration_seconds": 30 * 86400}})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = api
        .admin(
            Method::POST,
            "/api/v1/groups",
            Some(json!({"name": "odd", "models": [{"model": "nope"}]})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);

    api.member("ml-lab", "Olga", "owner").await;
    // The owner (names compare lowercased) adds a member, not an owner.
    let (s, v) = api
        .call(
            Method::PUT,
            "/api/v1/groups/ml-lab/members/ann",
            "olga",
            None,
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/groups/ml-lab/members/bob",
            "olga",
            None,
            Some(json!({"role": "owner"})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // A member manages nobody.
    let (s, _) = api
        .call(
            Method::DELETE,
            "/api/v1/groups/ml-lab/members/olga",
            "ann",
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // The owner sees the members; a member sees the group without them; others see nothing.
    let (_, g) = api
        .call(Method::GET, "/api/v1/groups/ml-lab", "olga", None, None)
        .await;
    assert_eq!(g["members"].as_array().unwrap().len(), 2);
    let (s, g) = api
        .call(Method::GET, "/api/v1/groups/ml-lab", "ann", None, None)
        .await;
    assert_eq!(
        (s, g["members"].as_array().unwrap().len()),
        (StatusCode::OK, 0)
    );
    let (s, _) = api
        .call(Method::GET, "/api/v1/groups/ml-lab", "eve", None, None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api
        .call(
            Method::DELETE,
            "/api/v1/groups/ml-lab/members/ann",
            "olga",
            None,
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let owners: i64 = sqlx::query_scalar("SELECT count(*) FROM group_member")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(owners, 1);

    // If-Match: a stale tag changes nothing.
    let (_, g) = api.admin(Method::GET, "/api/v1/groups/ml-lab", None).await;
    let stale = format!("\"g{}-1\"", g["id"]);
    let req = common::request(
        Method::PUT,
        "/api/v1/groups/ml-lab",
        Some(&gpu_booking_api::testing::token_for(
            SECRET,
            "root@lab",
            Some("admin"),
        )),
        Some(&json!({"position": 5})),
    );
    let mut req = req;
    req.headers_mut()
        .insert(axum::http::header::IF_MATCH, stale.parse().unwrap());
    let r = common::send(&api.app, req).await;
    assert_eq!(r.status, StatusCode::PRECONDITION_FAILED);
    let position: i32 = sqlx::query_scalar("SELECT position FROM lab_group WHERE name = 'ml-lab'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(position, 0);
    // Every change is audited.
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_event WHERE action LIKE 'group.%'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(audited >= 4, "{audited}");
    let (s, _) = api
        .admin(Method::DELETE, "/api/v1/groups/ml-lab", None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_tokens_groups_claim_makes_members_of_existing_groups_only(pool: PgPool) {
    let api = Api::new(pool.clone(), Policy::default()).await;
    api.group(json!({"name": "ml-lab", "policy": {"max_duration_seconds": 3 * 86400}}))
        .await;
    let token = |groups: Value| {
        let mut extra = serde_json::Map::new();
        extra.insert("groups".into(), groups);
        gpu_booking_api::auth::mint_token_with(
            SECRET,
            "Dana",
            None,
            TimeDelta::hours(1),
            None,
            None,
            extra,
        )
        .unwrap()
    };
    let policy = |t: String| {
        let app = api.app.clone();
        async move {
            common::call(&app, Method::GET, "/api/v1/policy", Some(&t), None)
                .await
                .json_or_null()
        }
    };
    // `/ml-lab` (Keycloak's full path) is ml-lab; `nope` is no group and is not created.
    let p = policy(token(json!(["/ml-lab", "nope"]))).await;
    assert_eq!(p["group"], "ml-lab");
    assert_eq!(p["groups"][0]["source"], "oidc");
    assert_eq!(p["max_duration_seconds"], 3 * 86400);
    let groups: i64 = sqlx::query_scalar("SELECT count(*) FROM lab_group")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(groups, 1);
    // The token no longer names it: the membership from the token goes.
    let p = policy(token(json!([]))).await;
    assert_eq!(p["group"], Value::Null);
    let members: i64 = sqlx::query_scalar("SELECT count(*) FROM group_member")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(members, 0);
    // An admin's membership stays whatever the token says.
    api.member("ml-lab", "dana", "member").await;
    let p = policy(token(json!("other"))).await;
    assert_eq!(p["group"], "ml-lab");
    assert_eq!(p["groups"][0]["source"], "admin");
}

/// A stand-in for JupyterHub's `GET /hub/api/groups`, two pages, checking the token.
async fn stand_in_hub(groups: Value) -> String {
    use axum::extract::Query;
    use axum::http::HeaderMap;
    let app = axum::Router::new().route(
        "/hub/api/groups",
        axum::routing::get(move |headers: HeaderMap, Query(q): Query<std::collections::HashMap<String, usize>>| {
            let groups = groups.clone();
            async move {
                if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("token read-groups") {
                    return (StatusCode::FORBIDDEN, axum::Json(json!({}))).into_response();
                }
                let offset = q.get("offset").copied().unwrap_or(0);
                let all = groups.as_array().unwrap();
                let items: Vec<Value> = all.iter().skip(offset).take(1).cloned().collect();
                let next = (offset + 1 < all.len()).then(|| json!({"offset": offset + 1}));
                axum::Json(json!({"items": items, "_pagination": {"offset": offset, "limit": 1, "total": all.len(), "next": next}}))
                    .into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/hub/api")
}

use axum::response::IntoResponse;

#[sqlx::test(migrations = "../migrations")]
async fn the_hubs_groups_are_refreshed_into_existing_groups(pool: PgPool) {
    use gpu_booking_api::hub_groups::HubGroups;
    use gpu_booking_core::username::NameCase;
    let api = Api::new(pool.clone(), Policy::default()).await;
    api.group(json!({"name": "ml-lab"})).await;
    api.group(json!({"name": "cs101"})).await;
    api.member("ml-lab", "olga", "owner").await;
    let url = stand_in_hub(json!([
        {"name": "ml-lab", "users": ["Ann", "bob"]},
        {"name": "not-here", "users": ["cy"]},
        {"name": "cs101", "users": ["bob", "olga"]},
    ]))
    .await;
    let hub = HubGroups::new(&url, "read-groups", NameCase::Lowercase).unwrap();
    let (added, removed) = hub.refresh(&pool).await.unwrap();
    assert_eq!((added, removed), (4, 0));
    let rows = || async {
        sqlx::query_as::<_, (String, String, String)>(
            "SELECT g.name, m.user_name, m.source FROM group_member m JOIN lab_group g ON g.id = m.group_id
             ORDER BY 1, 2",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let s = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());
    assert_eq!(
        rows().await,
        vec![
            s("cs101", "bob", "hub"),
            s("cs101", "olga", "hub"),
            s("ml-lab", "ann", "hub"),
            s("ml-lab", "bob", "hub"),
            s("ml-lab", "olga", "admin"),
        ]
    );
    // The hub drops Bob from ml-lab: only that hub membership goes; the admin's stays.
    let url = stand_in_hub(json!([{"name": "ml-lab", "users": ["ann"]}])).await;
    let hub = HubGroups::new(&url, "read-groups", NameCase::Lowercase).unwrap();
    assert_eq!(hub.refresh(&pool).await.unwrap(), (0, 3));
    assert_eq!(
        rows().await,
        vec![s("ml-lab", "ann", "hub"), s("ml-lab", "olga", "admin")]
    );
    // A hub that refuses the token changes nothing.
    let hub = HubGroups::new(&url, "wrong", NameCase::Lowercase).unwrap();
    assert!(hub.refresh(&pool).await.is_err());
    assert_eq!(rows().await.len(), 2);
}
