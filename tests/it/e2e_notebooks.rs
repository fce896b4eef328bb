//! End to end, on the simulated lab: notebooks that answer. Each running pod has its
//! own loopback address, and each notebook a stand-in single-user server there on its
//! port, as JupyterHub reaches a real one; it stops when the pod goes.

use std::net::SocketAddr;

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use sqlx::PgPool;

/// `status.podIP` of a running pod.
fn pod_ip(pod: &Pod) -> std::net::IpAddr {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap_or_else(|| panic!("no podIP: {:?}", pod.status))
        .parse()
        .expect("an IP address")
}

#[sqlx::test(migrations = "./migrations")]
async fn a_running_notebook_answers_at_its_own_address_until_it_goes(pool: PgPool) {
    let lab = Lab::start(pool).await;
    for user in ["bob@example.com", "carol@example.com"] {
        lab.sim.spawn(user, 1).await.expect("spawned");
        lab.expect("the notebook never ran", |s| running(s, user).is_some())
            .await;
    }
    let bob = lab.notebook("bob@example.com").expect("bob's notebook");
    let carol = lab.notebook("carol@example.com").expect("carol's notebook");
    let (ip, other) = (pod_ip(&bob), pod_ip(&carol));
    assert!(ip.is_loopback() && other.is_loopback(), "{ip}, {other}");
    assert_ne!(ip, other, "each pod has its own address");

    // At the notebook's port, under the user's prefix, as the hub and its proxy ask.
    let addr = SocketAddr::new(ip, 8888);
    let prefix = "/user/bob@example.com";
    let http = reqwest::Client::new();
    let answer = eventually(|| async {
        http.get(format!("http://{addr}{prefix}/api"))
            .send()
            .await
            .map_err(|e| format!("bob's notebook never answered at {addr}: {e}"))
    })
    .await;
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer
            .headers()
            .get("x-jupyterhub-version")
            .and_then(|v| v.to_str().ok()),
        Some("6.1.1"),
        "the version of the hub that spawned it, as jupyterhub-singleuser sends it"
    );
    let version: serde_json::Value = answer.json().await.expect("JSON");
    assert!(version["version"].is_string(), "{version}");
    let page = http
        .get(format!("http://{addr}{prefix}/lab"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(page.status(), 200);

    lab.sim
        .stop_notebook("bob@example.com")
        .await
        .expect("stopped");
    lab.expect("bob's notebook never went", |s| {
        s.get::<Pod>(Some("jhub"), bob.metadata.name.as_deref().unwrap_or(""))
            .is_none()
    })
    .await;
    eventually(|| async {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => Err(format!("the server at {addr} outlived its pod")),
            Err(_) => Ok(()),
        }
    })
    .await;
    lab.shutdown().await;
}
