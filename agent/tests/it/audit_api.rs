//! The audit row of an action lands in the booking service's log: the agent's
//! `HttpAudit` against the real API on the real Postgres, with a service token.

use std::time::Duration;

use gpu_booking_agent::audit::{AuditRecord, AuditSink, HttpAudit};
use gpu_booking_api::testing::TestApi;
use gpu_booking_client::TokenSource;
use serde_json::{json, Value};
use sqlx::PgPool;

#[sqlx::test(migrations = "../migrations")]
async fn an_action_is_recorded_in_the_audit_log(pool: PgPool) {
    let api = TestApi::start(pool).await.unwrap();
    let service = api.token("gpu-node-1", Some("service"));
    let audit = HttpAudit::new(
        &api.url,
        TokenSource::Static(service),
        Duration::from_secs(5),
    )
    .unwrap();
    let details = json!({
        "node": "gpu-node-1", "reason": "idle", "idle_minutes": 30.0,
        "util_samples": vec![0; 30],
        "processes": [{"pid": 4242, "cmdline": "python3 -m ipykernel_launcher", "container": "notebook"}],
        "result": "success", "signals": [{"pid": 4242, "signals": ["TERM"], "exited": true}]
    });
    audit
        .report(AuditRecord {
            action: "agent.reclaim".into(),
            subject: Some("jhub/jupyter-alice".into()),
            user: Some("alice@example.com".into()),
            details: details.clone(),
        })
        .await
        .unwrap();

    let admin = api.token("admin@example.com", Some("admin"));
    let rows: Vec<Value> = reqwest::Client::new()
        .get(format!("{}/api/v1/audit?action=agent.reclaim", api.url))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["actor"], "gpu-node-1");
    assert_eq!(row["subject"], "jhub/jupyter-alice");
    assert_eq!(row["user"], "alice@example.com");
    assert_eq!(row["details"], details);

    // A user token is refused, and the agent says so instead of pretending.
    let user = api.token("mallory", None);
    let refused = HttpAudit::new(&api.url, TokenSource::Static(user), Duration::from_secs(5))
        .unwrap()
        .report(AuditRecord {
            action: "agent.reclaim".into(),
            subject: None,
            user: None,
            details: Value::Null,
        })
        .await;
    assert!(refused.unwrap_err().contains("403"));
}
