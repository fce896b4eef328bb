//! `--on-expiry hub-restart` against a real JupyterHub (tests/support/jupyterhub.rs;
//! skipped, saying so, where it is not installed): the controller's hub client with
//! the token of the role docs/controller.md documents stops and starts a default and a
//! named server (JupyterHub 6 takes only lowercase slugs as new server names, so
//! KubeSpawner's label and the name agree there; older names keep the annotation's
//! reading), also when the hub holds the start or the stop open past its 10 s and
//! answers 202; a user the hub does not know is "unknown"
//! (never "already stopped"); a token without the `servers` scope is found out at
//! start and refused, never taken for a stopped server. The hub's spawner is a
//! stand-in single-user server (tests/jupyterhub/jupyterhub_config.py).

use std::time::Duration;

use gpu_booking_client::TokenSource;
use gpu_booking_controller::hub::{Hub, HubError, ServerState};

#[path = "../../../tests/support/jupyterhub.rs"]
mod jupyterhub;
use jupyterhub::{RealHub, ADMIN_TOKEN, CONTROLLER_TOKEN, READ_ONLY_TOKEN};

/// The controller's default `--hub-timeout`.
const HUB_TIMEOUT: Duration = Duration::from_secs(30);

fn client(hub: &RealHub, token: &str) -> Hub {
    Hub::new(
        &hub.api_url(),
        TokenSource::Static(token.into()),
        HUB_TIMEOUT,
    )
    .unwrap()
}

/// Creates `user` (as the hub's admin: the controller's role may not) and starts
/// their server `server` ("" for the default), waiting until it runs.
async fn spawn(hub: &RealHub, controller: &Hub, user: &str, server: &str) {
    let created = reqwest::Client::new()
        .post(format!("{}/users/{user}", hub.api_url()))
        .header("Authorization", format!("token {ADMIN_TOKEN}"))
        .send()
        .await
        .unwrap();
    let status = created.status();
    assert!(
        status.is_success() || status == 409,
        "creating {user}: {status}"
    );
    controller
        .start(user, server, Duration::from_secs(60))
        .await
        .unwrap();
    wait_for(controller, user, server, ServerState::Running).await;
}

async fn wait_for(hub: &Hub, user: &str, server: &str, want: ServerState) {
    let mut last = None;
    for _ in 0..240 {
        let state = hub.state(user, server).await.unwrap();
        if state == want {
            return;
        }
        last = Some(state);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{user}/{server:?}: wanted {want:?}, the hub says {last:?}");
}

#[tokio::test]
async fn hub_restart_against_a_real_jupyterhub() {
    let Some(program) = jupyterhub::program() else {
        return;
    };
    // Starts and stops that outlast the 10 s the hub holds a request open: it then
    // answers 202 and finishes later, as KubeSpawner's pulls and deletes often do.
    let hub = RealHub::start_with(
        &program,
        None,
        &[("HUB_START_SECONDS", "11"), ("HUB_STOP_SECONDS", "11")],
    )
    .await;
    let controller = client(&hub, CONTROLLER_TOKEN);
    assert_eq!(
        controller.may_restart_servers().await.unwrap(),
        Some(true),
        "the documented role (scope `servers`) is enough"
    );

    // A default and a named server, stopped and started through the hub.
    spawn(&hub, &controller, "alice", "").await;
    spawn(&hub, &controller, "alice", "gpu-run").await;
    for server in ["", "gpu-run"] {
        controller.stop("alice", server).await.unwrap();
        controller
            .start("alice", server, Duration::from_secs(60))
            .await
            .unwrap();
        wait_for(&controller, "alice", server, ServerState::Running).await;
    }

    // A user the hub does not know: not "already stopped" (the pod would then be
    // deleted with nothing to start it again).
    assert!(matches!(
        controller.stop("nobody-here", "").await,
        Err(HubError::UnknownUser)
    ));
    assert_eq!(
        controller.state("nobody-here", "").await.unwrap(),
        ServerState::NoSuchUser
    );

    // A token without the `servers` scope: found out at start, and refused as such.
    let weak = client(&hub, READ_ONLY_TOKEN);
    assert_eq!(weak.may_restart_servers().await.unwrap(), Some(false));
    assert!(matches!(
        weak.stop("alice", "").await,
        Err(HubError::Forbidden(_))
    ));
    assert_eq!(
        controller.state("alice", "").await.unwrap(),
        ServerState::Running,
        "nothing stopped"
    );
}
