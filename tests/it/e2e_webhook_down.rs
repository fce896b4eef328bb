//! End to end, on the simulated lab: the webhook is down, and the configuration's
//! `failurePolicy` decides ("Dynamic Admission Control", failure policy): `Ignore`
//! admits GPU pods unchanged, `Fail` refuses them. Pods without a GPU never reach the
//! webhook (matchConditions) and are admitted either way.

use crate::common;

use common::*;
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::SimCluster;
use sqlx::PgPool;

#[sqlx::test(migrations = "./migrations")]
async fn failure_policy_ignore_admits_gpu_pods_unchanged(pool: PgPool) {
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().rendered_chart(chart(&["webhook.failurePolicy=Ignore"])),
    )
    .await;
    lab.sim.stop_webhook().await;
    let pod = lab
        .sim
        .spawn("bob@example.com", 1)
        .await
        .expect("with failurePolicy Ignore the API server admits the pod");
    assert_eq!(
        gpus(&pod),
        1,
        "the pod should keep its GPU request unchanged"
    );
    assert_eq!(
        label(&pod, PRIORITY_LABEL),
        None,
        "nobody decided a priority"
    );
    lab.expect("the unchanged GPU pod never ran", |s| {
        running(s, "bob@example.com").is_some()
    })
    .await;
    lab.shutdown().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn failure_policy_fail_refuses_gpu_pods_but_not_cpu_pods(pool: PgPool) {
    let lab = Lab::start_with(
        pool,
        SimCluster::builder().rendered_chart(chart(&["webhook.failurePolicy=Fail"])),
    )
    .await;
    lab.sim.stop_webhook().await;
    let refused = lab.sim.spawn("bob@example.com", 1).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code >= 400),
        "with failurePolicy Fail a GPU pod must be refused while the webhook is down: {refused:?}"
    );
    assert!(
        lab.notebook("bob@example.com").is_none(),
        "a refused pod was stored"
    );
    lab.sim
        .spawn("carol@example.com", 0)
        .await
        .expect("a CPU pod never reaches the webhook, so it is admitted");
    lab.shutdown().await;
}
