//! What the burst left, against what the system promises: as many victims as the
//! booked pods needed, every booked pod Running (or told which workloads that
//! bookings do not preempt hold its cards), and no lent pod beyond the cards.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use gpu_booking_core::admission::PRIORITY_LABEL;
use gpu_booking_sim::spawner::pod_name;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;

use crate::booking::Booked;
use crate::cluster::{self, label, MODELS, NOTEBOOKS};
use crate::figures::per_model;
use crate::lab::University;
use crate::spawns::BurstResult;

/// What a booked pod's Event and its booking say when workloads that bookings do
/// not preempt hold the cards it waits for (`core::preemption_policy`).
const NOT_PREEMPTED: &str = "that bookings do not preempt";

/// The Events' time (an Event made by an older client has only its creation's).
pub fn event_time(e: &Event) -> Option<DateTime<Utc>> {
    e.event_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The uid of the object an Event is about.
pub fn regarding(e: &Event) -> Option<&str> {
    e.regarding.as_ref()?.uid.as_deref()
}

pub struct Verdict {
    /// Lent pods (before the burst) gone from their card at the end, per model:
    /// nothing but preemption ends a lent pod bound to a card during the burst.
    pub victims: [u64; MODELS.len()],
    /// Of the lent pods before the burst, those with the controller's
    /// `PreemptedForBooking` Event, per model (an Event the controller could not
    /// write is logged, not retried: the count above does not rest on it).
    victims_with_event: [u64; MODELS.len()],
    /// Booked pods beyond the room that was free when the bookings started, as many
    /// as lent pods could make room for, per model.
    pub needed: [u64; MODELS.len()],
    /// Lent pods before the burst, per model.
    lent: [u64; MODELS.len()],
    admitted: [u64; MODELS.len()],
    room: [u64; MODELS.len()],
    /// The controller's evictions metric (`booked_pod_pending`), per model.
    metric: [u64; MODELS.len()],
    /// Lent pods warned that their GPU is taken back, and those that kept it after
    /// all.
    warned: usize,
    kept: usize,
    preempt_actions: String,
    /// Booked pods that never ran, by what their pod's last Event and their booking
    /// say.
    pub never: BTreeMap<String, usize>,
    /// Of those, the ones told that workloads bookings do not preempt hold the cards.
    pub never_excused: usize,
    pub booked_running: usize,
    /// Pods bound beyond a node's allocatable.
    pub beyond: Vec<String>,
    /// Lent pods admitted that the scheduler could not place (while filling).
    pub lent_unplaced: usize,
    /// Lent pods Pending for a GPU at the end.
    pub lent_pending: usize,
    /// Lent pods recreated CPU-only for want of a GPU (`NoFreeGpu`).
    no_free_gpu: usize,
}

impl Verdict {
    pub fn victims_total(&self) -> u64 {
        self.victims.iter().sum()
    }

    pub fn needed_total(&self) -> u64 {
        self.needed.iter().sum()
    }

    /// Lent pods beyond the cards: admitted with no card for them, or bound beyond
    /// a node's allocatable.
    pub fn lent_beyond(&self) -> usize {
        self.lent_unplaced + self.lent_pending + self.beyond.len()
    }

    /// Booked pods that never ran although no workload bookings do not preempt
    /// held their cards.
    pub fn never_unexcused(&self) -> usize {
        self.never.values().sum::<usize>() - self.never_excused
    }
}

/// What the cluster and the controller show once the burst is over.
pub struct Judged<'a> {
    pub u: &'a University,
    pub booked: &'a [Booked],
    pub result: &'a BurstResult,
    /// The lent pods before the burst, by uid: their model.
    pub lent_before: &'a HashMap<String, String>,
    /// Per model, the booked pods the cluster had room for before the burst.
    pub room: [u64; MODELS.len()],
    pub lent_unplaced: usize,
}

pub async fn judge(j: Judged<'_>, events: &[Event]) -> Verdict {
    let u = j.u;
    // The Event is on the lent pod and on its CPU-only copy: the lent ones count.
    let mut victims_by_uid: BTreeMap<&str, &str> = BTreeMap::new();
    for e in events {
        if e.reason.as_deref() != Some("PreemptedForBooking") {
            continue;
        }
        if let Some((uid, model)) = regarding(e).and_then(|uid| j.lent_before.get_key_value(uid)) {
            victims_by_uid.insert(uid, model);
        }
    }
    let distinct = |reason: &str| {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(regarding)
            .collect::<BTreeSet<&str>>()
            .len()
    };
    let metrics = &u.controller.metrics;
    let preempt_actions = ["recreated", "deleted", "skipped", "error", "dry_run"]
        .iter()
        .map(|o| format!("{o} {}", metrics.action_count("preempt", o)))
        .collect::<Vec<_>>()
        .join(", ");

    let mut never: BTreeMap<String, usize> = BTreeMap::new();
    let mut never_excused = 0;
    for &i in &j.result.never {
        let b = &j.booked[i];
        let (said, waiting) = why_not_running(u, b, events).await;
        if said.contains(NOT_PREEMPTED) || waiting.contains(NOT_PREEMPTED) {
            never_excused += 1;
        }
        *never
            .entry(format!(
                "{} (the pod: {said}; the booking: {waiting})",
                MODELS[b.model].name
            ))
            .or_default() += 1;
    }

    let lent: [u64; MODELS.len()] = std::array::from_fn(|i| {
        j.lent_before
            .values()
            .filter(|m| **m == MODELS[i].name)
            .count() as u64
    });
    let pods = u.pods();
    let nodes = u.server().list::<Node>(None);
    // The lent pods before the burst still on their card at the end.
    let kept_card: BTreeSet<&str> = pods
        .iter()
        .filter(|p| cluster::node_of(p).is_some() && cluster::gpu_request(p).is_some())
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    Verdict {
        victims: std::array::from_fn(|i| {
            j.lent_before
                .iter()
                .filter(|(uid, m)| **m == MODELS[i].name && !kept_card.contains(uid.as_str()))
                .count() as u64
        }),
        victims_with_event: std::array::from_fn(|i| {
            victims_by_uid
                .values()
                .filter(|m| **m == MODELS[i].name)
                .count() as u64
        }),
        needed: std::array::from_fn(|i| {
            j.result.admitted[i].saturating_sub(j.room[i]).min(lent[i])
        }),
        admitted: j.result.admitted,
        room: j.room,
        lent,
        metric: std::array::from_fn(|i| {
            metrics.eviction_count(MODELS[i].name, "booked_pod_pending")
        }),
        warned: distinct("GpuTakenBackSoon"),
        kept: distinct("GpuKept"),
        preempt_actions,
        never,
        never_excused,
        booked_running: booked_running(j.booked, &pods),
        beyond: cluster::beyond_allocatable(&nodes, &pods),
        lent_unplaced: j.lent_unplaced,
        lent_pending: pods.iter().filter(|p| lent_pending(p)).count(),
        no_free_gpu: events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("NoFreeGpu"))
            .count(),
    }
}

/// What a booked pod that never ran was told: its last Event, and its booking's
/// `waiting`.
async fn why_not_running(u: &University, b: &Booked, events: &[Event]) -> (String, String) {
    let pod = u.server().get::<Pod>(Some(NOTEBOOKS), &pod_name(&b.user));
    let uid = pod.as_ref().and_then(|p| p.metadata.uid.as_deref());
    let said = events
        .iter()
        .filter(|e| uid.is_some() && regarding(e) == uid)
        .filter_map(|e| {
            Some((
                event_time(e)?,
                format!("{}: {}", e.reason.as_deref()?, e.note.as_deref()?),
            ))
        })
        .max()
        .map_or_else(
            || if pod.is_some() { "no Event" } else { "no pod" }.to_owned(),
            |(_, said)| said,
        );
    let waiting = u
        .booking
        .shown(&b.user, b.booking)
        .await
        .ok()
        .and_then(|v| v["waiting"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "-".into());
    (said, waiting)
}

/// Booked users whose booked pod runs on a card.
fn booked_running(booked: &[Booked], pods: &[Pod]) -> usize {
    let running: BTreeSet<&str> = pods
        .iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(NOTEBOOKS)
                && label(p, PRIORITY_LABEL) == Some("high")
                && cluster::running(p)
                && cluster::gpu_request(p).is_some()
        })
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    booked
        .iter()
        .filter(|b| running.contains(pod_name(&b.user).as_str()))
        .count()
}

/// A lent pod that asks for a GPU and waits for a node.
fn lent_pending(p: &Pod) -> bool {
    p.metadata.namespace.as_deref() == Some(NOTEBOOKS)
        && label(p, PRIORITY_LABEL) == Some("low")
        && cluster::node_of(p).is_none()
        && p.metadata.deletion_timestamp.is_none()
        && cluster::gpu_request(p).is_some()
}

impl std::fmt::Display for Verdict {
    /// The details behind the summary's figures.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "  victims needed {} (booked pods beyond the room free when the bookings started, at most the lent pods, per model: admitted as booked {} / room {} / lent {} -> {})",
            self.needed_total(),
            per_model(&self.admitted),
            per_model(&self.room),
            per_model(&self.lent),
            per_model(&self.needed),
        )?;
        writeln!(
            f,
            "  victims {} (lent pods gone from their card: {}; with a PreemptedForBooking Event: {}; {} warned with GpuTakenBackSoon, {} kept their GPU with GpuKept); the controller's evictions metric {}: {}; its preempt actions: {}",
            self.victims_total(),
            per_model(&self.victims),
            per_model(&self.victims_with_event),
            self.warned,
            self.kept,
            self.metric.iter().sum::<u64>(),
            per_model(&self.metric),
            self.preempt_actions,
        )?;
        writeln!(
            f,
            "  booked pods never Running: {} ({} told that workloads bookings do not preempt hold the cards){}",
            self.never.values().sum::<usize>(),
            self.never_excused,
            if self.never.is_empty() { "" } else { ":" }
        )?;
        for (reason, n) in &self.never {
            writeln!(f, "    {n} x {reason}")?;
        }
        write!(
            f,
            "  lent pods beyond the cards {}: admitted while filling with no card the scheduler could place {}, Pending for a GPU at the end {}, pods bound beyond a node's allocatable {} {:?}; lent pods recreated CPU-only for want of a GPU (NoFreeGpu Events) {}",
            self.lent_beyond(),
            self.lent_unplaced,
            self.lent_pending,
            self.beyond.len(),
            self.beyond,
            self.no_free_gpu,
        )
    }
}
