//! End to end, on the simulated lab: service identity without a shared token (issue
//! 14, item 3). The webhook, the controller and the node agent authenticate to the
//! booking API with their own projected ServiceAccount tokens, verified by TokenReview
//! against the lab's API server:
//!
//! - every audit row a component writes names that component's ServiceAccount (a
//!   lent admission by the webhook, the agent's idle reclaim, the controller's
//!   preemption for a booked user), so each authenticated as itself;
//! - a genuine token for another audience is refused (401), and a genuine token of a
//!   ServiceAccount with no role is authenticated but not a service (403).
//!
//! Runs on the real Postgres (`DATABASE_URL`), each test on a fresh database.

mod common;

use std::time::Duration;

use chrono::TimeDelta;
use common::*;
use gpu_booking_sim::service_accounts::{self, AGENT, CONTROLLER, NAMESPACE, WEBHOOK};
use gpu_booking_sim::{GpuNode, SimCluster};
use reqwest::StatusCode;
use sqlx::PgPool;

const BOB: &str = "bob@example.com";
const ALICE: &str = "alice@example.com";

/// The actors of the audit rows whose action starts with `prefix`, once there is one
/// (rows are posted on the components' own tasks).
async fn actors_of(pool: &PgPool, prefix: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let actors: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT actor FROM audit_event WHERE action LIKE $1 || '%' ORDER BY actor",
        )
        .bind(prefix)
        .fetch_all(pool)
        .await
        .expect("the audit log answers");
        if !actors.is_empty() {
            return actors;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no audit row {prefix}* within {SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrations = "./migrations")]
async fn each_component_authenticates_as_its_own_service_account(pool: PgPool) {
    // One A100, so that alice's booking takes it back from bob's lent notebook; an
    // idle window of five samples, so that the agent reclaims bob's idle kernel.
    let builder = SimCluster::builder()
        .nodes(vec![
            GpuNode::gpu("gpu-a100-0", "NVIDIA-A100-SXM4-40GB", 1, 40960),
            GpuNode::cpu_only("cpu-0"),
        ])
        .agent_interval(Duration::from_millis(200))
        .agent(|cfg| {
            cfg.policy.idle.idle_minutes = 0;
            cfg.policy.idle.idle_samples = 5;
        });
    let lab = Lab::start_with(pool.clone(), builder).await;

    lab.sim
        .spawn(BOB, 1)
        .await
        .expect("bob's notebook is admitted");
    lab.expect("bob's lent notebook never ran on the A100", |s| {
        running(s, BOB).is_some_and(|p| gpus(&p) > 0)
    })
    .await;
    // The agent ends bob's idle kernel (the pod keeps the card) ...
    let agent_actors = actors_of(&pool, "agent.").await;
    // ... and alice's booking takes the card back: the controller preempts bob.
    lab.book(ALICE, "a100", TimeDelta::hours(2)).await;
    lab.sim
        .spawn(ALICE, 1)
        .await
        .expect("alice's notebook is admitted");
    lab.expect("alice's booked notebook never got the A100 back", |s| {
        running(s, ALICE).is_some_and(|p| gpus(&p) > 0)
    })
    .await;

    assert_eq!(
        agent_actors,
        [service_accounts::username(AGENT)],
        "the agent's audit rows were not written as its ServiceAccount"
    );
    for (prefix, component) in [("webhook.", WEBHOOK), ("controller.", CONTROLLER)] {
        assert_eq!(
            actors_of(&pool, prefix).await,
            [service_accounts::username(component)],
            "the {prefix}* audit rows were not written as the {component} ServiceAccount"
        );
    }

    let http = reqwest::Client::new();
    let ask = |token: String| {
        http.get(format!("{}/api/v1/schedulability?user={BOB}", lab.api.url))
            .bearer_auth(token)
            .send()
    };
    let server = &lab.sim.server;
    let status = |res: reqwest::Result<reqwest::Response>| res.expect("the API answers").status();
    assert_eq!(
        status(
            ask(server.service_account_token(NAMESPACE, CONTROLLER, &[service_accounts::AUDIENCE]))
                .await
        ),
        StatusCode::OK,
        "the controller's own token is a service's"
    );
    assert_eq!(
        status(ask(server.service_account_token(NAMESPACE, CONTROLLER, &["someone-else"])).await),
        StatusCode::UNAUTHORIZED,
        "a token bound to another audience must be refused"
    );
    assert_eq!(
        status(
            ask(server.service_account_token("jupyterhub", "hub", &[service_accounts::AUDIENCE]))
                .await
        ),
        StatusCode::FORBIDDEN,
        "a ServiceAccount the chart gives no role is no service"
    );
    lab.shutdown().await;
}
