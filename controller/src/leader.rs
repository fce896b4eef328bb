//! Leader election with a `coordination.k8s.io/v1` Lease: any number of replicas, one
//! acts. The holder renews every `renew`; a Lease not renewed for its duration may be
//! taken over. The leader stops acting at once when it learns it lost the Lease, and in
//! any case when no renewal succeeded for two thirds of the duration (so it has
//! stopped before another replica may take over, even if its renewals hang).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::SharedClock;
use crate::metrics::Metrics;

/// Whether this replica may act now. Cheap to check before every write.
pub struct Leadership {
    tx: watch::Sender<bool>,
    /// Acting is allowed until then (`None`: for good, without election).
    valid_until: Mutex<Option<Instant>>,
    metrics: Arc<Metrics>,
}

impl Leadership {
    /// Not the leader (yet).
    pub fn follower(metrics: Arc<Metrics>) -> Arc<Self> {
        metrics.is_leader.set(0);
        Arc::new(Self {
            tx: watch::channel(false).0,
            valid_until: Mutex::new(Some(Instant::now())),
            metrics,
        })
    }

    /// The leader for good: no election (a single replica).
    pub fn always(metrics: Arc<Metrics>) -> Arc<Self> {
        metrics.is_leader.set(1);
        Arc::new(Self {
            tx: watch::channel(true).0,
            valid_until: Mutex::new(None),
            metrics,
        })
    }

    pub fn is_leader(&self) -> bool {
        let valid = self
            .valid_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none_or(|until| Instant::now() < until);
        *self.tx.borrow() && valid
    }

    /// Changes of leadership (true: became leader).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    fn renewed(&self, until: Instant) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
        if !*self.tx.borrow() {
            tracing::info!("became the leader");
            self.metrics.is_leader.set(1);
            self.tx.send_replace(true);
        }
    }

    fn lost(&self, why: &str) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        if *self.tx.borrow() {
            tracing::warn!(why, "lost the lease; acting stops");
            self.metrics.is_leader.set(0);
            self.tx.send_replace(false);
        }
    }
}

/// The Lease and this replica's part in it.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    pub renew: Duration,
}

/// Takes part in the election until the task is dropped.
pub async fn run(
    api: Api<Lease>,
    cfg: LeaseConfig,
    clock: SharedClock,
    leadership: Arc<Leadership>,
) {
    let deadline = cfg.duration * 2 / 3;
    loop {
        let started = Instant::now();
        let attempt = tokio::time::timeout(cfg.renew, try_acquire(&api, &cfg, clock.now())).await;
        match attempt {
            Ok(Ok(true)) => leadership.renewed(started + deadline),
            Ok(Ok(false)) => leadership.lost("held by another replica"),
            Ok(Err(e)) => {
                leadership.metrics.error("kubernetes");
                tracing::warn!(error = %e, "lease renewal failed");
            }
            Err(_) => {
                leadership.metrics.error("kubernetes");
                tracing::warn!("lease renewal timed out");
            }
        }
        // Wake up at the next renewal, or when leadership runs out, whichever is first.
        let next = started + cfg.renew;
        let until = *leadership
            .valid_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match until {
            Some(until) if until < next && *leadership.tx.borrow() => {
                tokio::time::sleep_until(until).await;
                if !leadership.is_leader() {
                    leadership.lost("no renewal within the deadline");
                }
                tokio::time::sleep_until(next).await;
            }
            _ => tokio::time::sleep_until(next).await,
        }
    }
}

fn micro(t: DateTime<Utc>) -> MicroTime {
    MicroTime(t)
}

/// One round: create, renew or take over the Lease. `Ok(true)`: we hold it now.
async fn try_acquire(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    now: DateTime<Utc>,
) -> kube::Result<bool> {
    let seconds = i32::try_from(cfg.duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(cfg.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(micro(now)),
                renew_time: Some(micro(now)),
                lease_transitions: Some(0),
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    if holder.as_deref() != Some(cfg.identity.as_str()) {
        let held_for =
            TimeDelta::seconds(i64::from(spec.lease_duration_seconds.unwrap_or(seconds)));
        let expired = spec
            .renew_time
            .as_ref()
            .is_none_or(|r| r.0 + held_for <= now);
        if holder.is_some() && !expired {
            return Ok(false);
        }
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(micro(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(micro(now));
    spec.lease_duration_seconds = Some(seconds);
    // The resource version makes this a compare-and-swap: a concurrent writer wins
    // or we do, never both.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
