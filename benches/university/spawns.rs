//! Users spawning notebooks as JupyterHub does, many at once: unbooked users (lent
//! a card or on CPU) and booked ones (timed from the spawn to Running).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use futures::stream::{self, StreamExt};
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::spawner::pod_name;
use k8s_openapi::api::core::v1::Pod;

use crate::booking::Booked;
use crate::cluster::{self, label, MODELS, NOTEBOOKS};
use crate::lab::University;

/// JupyterHub's default `concurrent_spawn_limit` (`UNIVERSITY_SPAWNS_AT_ONCE`).
const SPAWNS_AT_ONCE: usize = 100;

/// Unbooked spawns in flight at once while filling the cards
/// (`UNIVERSITY_FILL_AT_ONCE`): fewer than JupyterHub allows, so that the lab's API
/// server, whose answer to a create grows with the pods, answers within the
/// webhook's timeout. The fill sets the stage; its pace is not a figure.
const FILL_AT_ONCE: usize = 20;

/// Booked spawns in flight at once.
pub fn spawns_at_once() -> usize {
    crate::env_usize("UNIVERSITY_SPAWNS_AT_ONCE", SPAWNS_AT_ONCE).max(1)
}

/// Unbooked spawns in flight at once.
pub fn fill_at_once() -> usize {
    crate::env_usize("UNIVERSITY_FILL_AT_ONCE", FILL_AT_ONCE).max(1)
}

/// What a burst of booked spawns measured.
pub struct BurstResult {
    /// Spawn to Running of each pod that ran.
    pub times: Vec<Duration>,
    /// Users whose pod never ran within the wait.
    pub never: Vec<usize>,
    /// Booked pods the scheduler could not place when they were created (each
    /// needs a victim), per model.
    pub unplaced: [u64; MODELS.len()],
    /// The scheduler's reasons for those, by model.
    pub unplaced_why: BTreeMap<String, usize>,
    /// Pods admitted as booked, per model.
    pub admitted: [u64; MODELS.len()],
    /// Pods admitted as something else than booked.
    pub not_booked: Vec<String>,
    pub spawn_errors: Vec<String>,
    /// From the first spawn to the last pod Running.
    pub span: Duration,
    /// Each pod created.
    pub pods: Vec<SpawnedPod>,
    /// How long each create of a booked pod took the API server to answer.
    pub answered: Vec<Duration>,
}

struct Spawned {
    i: usize,
    at: Instant,
    wall: DateTime<Utc>,
    /// How long the API server took to answer the create (admission, scheduling).
    answered: Duration,
    created: Result<Pod, kube::Error>,
    /// The scheduler's reason when it could not place the pod as it was created.
    unplaced: Option<String>,
}

pub struct SpawnedPod {
    pub user: String,
    pub model: usize,
    pub uid: String,
    /// When its spawn began.
    pub wall: DateTime<Utc>,
    pub to_running: Option<Duration>,
}

/// The booked users spawn together (100 at a time); waits until each pod runs or
/// `wait` has passed.
pub async fn burst(u: &University, booked: &[Booked], wait: Duration) -> BurstResult {
    let server = u.server().clone();
    let names: Vec<String> = booked.iter().map(|b| pod_name(&b.user)).collect();
    // Bound (the fake kubelet starts a bound pod at once) noted at every change.
    let watch = {
        let names = names.clone();
        tokio::spawn(async move {
            let mut running: Vec<Option<Instant>> = vec![None; names.len()];
            let mut seen_rv = 0;
            let deadline = tokio::time::Instant::now() + wait;
            let _ = tokio::time::timeout_at(
                deadline,
                server.wait_until(|s| {
                    let rv = s.resource_version();
                    if rv != seen_rv {
                        seen_rv = rv;
                        let now = Instant::now();
                        for (i, name) in names.iter().enumerate() {
                            if running[i].is_none() && s.pod_node(NOTEBOOKS, name).is_some() {
                                running[i] = Some(now);
                            }
                        }
                    }
                    running.iter().all(Option::is_some)
                }),
            )
            .await;
            running
        })
    };
    let first = Instant::now();
    let spawned: Vec<Spawned> = stream::iter(booked.iter().enumerate().map(|(i, b)| async move {
        let at = Instant::now();
        let wall = Utc::now();
        let (created, unplaced) = spawn_one(u, &b.user).await;
        Spawned {
            i,
            at,
            wall,
            answered: at.elapsed(),
            created,
            unplaced,
        }
    }))
    .buffer_unordered(spawns_at_once())
    .collect()
    .await;
    let running = watch.await.unwrap_or_default();
    let mut result = BurstResult {
        times: Vec::new(),
        never: Vec::new(),
        unplaced: [0; MODELS.len()],
        unplaced_why: BTreeMap::new(),
        admitted: [0; MODELS.len()],
        not_booked: Vec::new(),
        spawn_errors: Vec::new(),
        span: Duration::ZERO,
        pods: Vec::new(),
        answered: Vec::new(),
    };
    let mut last = first;
    for Spawned {
        i,
        at,
        wall,
        answered,
        created,
        unplaced,
    } in spawned
    {
        let model = booked[i].model;
        match created {
            Ok(pod) => {
                if label(&pod, PRIORITY_LABEL) != Some("high") {
                    // Not a booked pod (the webhook call failed and the pod went in
                    // unchanged): apart from the figures.
                    result.not_booked.push(format!(
                        "{} ({})",
                        booked[i].user,
                        if running.get(i).copied().flatten().is_some() {
                            "ran"
                        } else {
                            "never ran"
                        }
                    ));
                    continue;
                }
                result.admitted[model] += 1;
                if let Some(why) = &unplaced {
                    result.unplaced[model] += 1;
                    *result
                        .unplaced_why
                        .entry(format!("{}: {why}", MODELS[model].name))
                        .or_default() += 1;
                }
                let ran = running.get(i).copied().flatten();
                result.answered.push(answered);
                result.pods.push(SpawnedPod {
                    user: booked[i].user.clone(),
                    model,
                    uid: pod.metadata.uid.clone().unwrap_or_default(),
                    wall,
                    to_running: ran.map(|r| r.saturating_duration_since(at)),
                });
            }
            Err(e) => result.spawn_errors.push(format!("{}: {e}", booked[i].user)),
        }
        match running.get(i).copied().flatten() {
            Some(ran) => {
                result.times.push(ran.saturating_duration_since(at));
                last = last.max(ran);
            }
            None => result.never.push(i),
        }
    }
    result.span = last - first;
    result
}

/// `user` spawns a notebook asking for a GPU, as JupyterHub does: the pod as
/// created and, when the scheduler found no room for it (the fake API server
/// schedules before it answers), its reason. Polled by the bench's thread, as the
/// lab's tests do: the fake serves a create, its admission and its scheduling inside
/// the request, under its store's lock, so creates are served one after another
/// whichever threads send them; on the bench's thread the lab's own threads stay free
/// for the connections to the webhook and the components' requests.
async fn spawn_one(u: &University, user: &str) -> (Result<Pod, kube::Error>, Option<String>) {
    let created = u.sim.spawn(user, 1).await;
    let name = pod_name(user);
    let unplaced = match &created {
        Ok(_) if u.server().pod_node(NOTEBOOKS, &name).is_none() => Some(
            u.server()
                .unschedulable_reason(NOTEBOOKS, &name)
                .unwrap_or_default(),
        ),
        _ => None,
    };
    (created, unplaced)
}

/// Unbooked users spawn ([`fill_at_once`] at a time): lent a card or run on CPU.
pub async fn fill(u: &University, users: &[String]) -> anyhow::Result<Filled> {
    let began = Instant::now();
    let created: Vec<(Result<Pod, kube::Error>, Option<String>)> =
        stream::iter(users.iter().map(|user| spawn_one(u, user)))
            .buffer_unordered(fill_at_once())
            .collect()
            .await;
    let took = began.elapsed();
    let mut out = Filled {
        took,
        ..Filled::default()
    };
    for (pod, unplaced) in created {
        let pod = pod.context("an unbooked notebook was refused")?;
        if cluster::gpu_request(&pod).is_none() {
            out.on_cpu += 1;
            continue;
        }
        if label(&pod, PRIORITY_LABEL) != Some("low") {
            // The webhook call failed and the pod went in unchanged.
            out.unmarked += 1;
            continue;
        }
        out.lent += 1;
        if let Some(why) = unplaced {
            *out.unplaced
                .entry(format!("{}: {why}", cluster::pod_model(&pod)))
                .or_default() += 1;
        }
    }
    Ok(out)
}

#[derive(Default)]
pub struct Filled {
    pub took: Duration,
    pub lent: usize,
    pub on_cpu: usize,
    /// GPU pods admitted without the webhook's decision.
    pub unmarked: usize,
    /// Lent pods the scheduler could not place once their spawn returned: lent a
    /// card that was not free. By model and the scheduler's reason.
    pub unplaced: BTreeMap<String, usize>,
}

/// Waits until every pod of `users` is Running (or `within` passed); how many are
/// not.
pub async fn all_running(u: &University, users: &[String], within: Duration) -> usize {
    let names: Vec<String> = users.iter().map(|u| pod_name(u)).collect();
    let server = u.server().clone();
    let mut left = names.clone();
    let _ = tokio::time::timeout(within, async {
        loop {
            // Bound is Running: the fake kubelet starts a bound pod at once (and the
            // look costs the lab nothing, unlike reading every pod).
            left.retain(|n| server.pod_node(NOTEBOOKS, n).is_none());
            if left.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    left.len()
}
