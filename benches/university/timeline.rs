//! Where a booked pod's wait went, from the controller's Events: the spawn to the
//! controller's round for the pod (its `PreemptingForBooking` Event) and that round
//! to Running; how many rounds each pod took; the slowest pods, Event by Event.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_booking_sim::spawner::pod_name;
use k8s_openapi::api::events::v1::Event;

use crate::cluster::{MODELS, NOTEBOOKS};
use crate::figures::{secs, spread};
use crate::lab::University;
use crate::spawns::{BurstResult, SpawnedPod};
use crate::verdict::{event_time, regarding};

const ROUND: &str = "PreemptingForBooking";

/// The lines that say where the burst's time went.
pub fn lines(u: &University, result: &BurstResult, events: &[Event]) -> Vec<String> {
    let mut out = rounds(result, events);
    let mut to_round = Vec::new();
    let mut round_to_running = Vec::new();
    for pod in &result.pods {
        let round = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(ROUND) && regarding(e) == Some(&pod.uid))
            .filter_map(event_time)
            .min();
        if let (Some(round), Some(ran)) = (round, pod.to_running) {
            let decided = (round - pod.wall).to_std().unwrap_or_default();
            to_round.push(decided);
            round_to_running.push(ran.saturating_sub(decided));
        }
    }
    out.push(format!(
        "  of which: spawn to the controller's round for the pod (its {ROUND} Event) {}; that round to Running {}",
        spread(&to_round),
        spread(&round_to_running)
    ));
    out.push("  the slowest booked pods:".into());
    let mut slowest: Vec<&SpawnedPod> = result.pods.iter().collect();
    slowest.sort_by_key(|p| std::cmp::Reverse(p.to_running.unwrap_or(Duration::MAX)));
    for pod in slowest.iter().take(3) {
        out.push(format!("    {}", story(u, pod, events)));
    }
    out
}

/// Rounds of preemption per booked pod, and those that ended more than one pod.
fn rounds(result: &BurstResult, events: &[Event]) -> Vec<String> {
    let booked: HashSet<&str> = result.pods.iter().map(|p| p.uid.as_str()).collect();
    let mut per_pod: BTreeMap<&str, usize> = BTreeMap::new();
    let mut several: Vec<&str> = Vec::new();
    let mut several_by_model: BTreeMap<&str, usize> = BTreeMap::new();
    for e in events {
        let Some(uid) = regarding(e) else {
            continue;
        };
        if e.reason.as_deref() != Some(ROUND) || !booked.contains(uid) {
            continue;
        }
        *per_pod.entry(uid).or_default() += 1;
        // "... ends the lent <model> pod(s) <a>, <b> on node ...".
        let note = e.note.as_deref().unwrap_or_default();
        let named = note
            .split_once("pod(s) ")
            .map(|(_, rest)| rest.split(" on node").next().unwrap_or_default())
            .unwrap_or_default();
        if named.contains(", ") {
            several.push(note);
            let model = note
                .split_once("ends the lent ")
                .and_then(|(_, rest)| rest.split(' ').next())
                .unwrap_or("?");
            *several_by_model.entry(model).or_default() += 1;
        }
    }
    let mut by_rounds: BTreeMap<usize, usize> = BTreeMap::new();
    for n in per_pod.values() {
        *by_rounds.entry(*n).or_default() += 1;
    }
    let mut out = vec![format!(
        "  rounds of preemption ({ROUND} Events) per booked pod: {}; booked pods with none (room on its way) {}; rounds ending more than one pod {} {several_by_model:?}",
        by_rounds
            .iter()
            .map(|(rounds, pods)| format!("{rounds}: {pods} pods"))
            .collect::<Vec<_>>()
            .join(", "),
        result.pods.len() - per_pod.len(),
        several.len(),
    )];
    out.extend(several.iter().take(3).map(|note| format!("    {note}")));
    out
}

/// One booked pod's Events in order, timed from its spawn.
fn story(u: &University, pod: &SpawnedPod, events: &[Event]) -> String {
    let mut said: Vec<(DateTime<Utc>, String)> = events
        .iter()
        .filter(|e| regarding(e) == Some(&pod.uid))
        .filter_map(|e| {
            let note: String = e
                .note
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(140)
                .collect();
            Some((event_time(e)?, format!("{}: {note}", e.reason.as_deref()?)))
        })
        .collect();
    said.sort();
    let node = u
        .server()
        .pod_node(NOTEBOOKS, &pod_name(&pod.user))
        .unwrap_or_else(|| "-".into());
    let steps: Vec<String> = said
        .into_iter()
        .map(|(at, what)| {
            format!(
                "+{:.1} s {what}",
                (at - pod.wall).num_milliseconds() as f64 / 1000.0
            )
        })
        .collect();
    format!(
        "{} ({}, on {node}): Running after {}; {}",
        pod.user,
        MODELS[pod.model].name,
        pod.to_running.map_or("never".into(), secs),
        if steps.is_empty() {
            "no Event".into()
        } else {
            steps.join("; ")
        }
    )
}
