//! How long each pod's GPU processes have been idle. Pure: the agent feeds one
//! observation per pod per sample, with the sample's time.
//!
//! A pod is active in a sample when one of its GPU processes reaches the utilisation
//! threshold, when the set of its GPU processes changed (a process started or
//! ended), or when its device memory grew or shrank by [`MEMORY_ACTIVITY_BYTES`] or
//! more (allocating is using the GPU). Otherwise the sample is idle. A pod is
//! reclaimable when both hold: its last activity is at least the idle window ago, and
//! the agent has seen at least the configured number of consecutive idle samples
//! (jitter guard; it also means a restarted agent waits a whole window again).

use std::collections::{BTreeSet, HashMap, VecDeque};

use chrono::{DateTime, TimeDelta, Utc};

use crate::reclaim_policy::IdleRule;

/// A change of a pod's device memory that counts as activity.
pub const MEMORY_ACTIVITY_BYTES: u64 = 16 * 1024 * 1024;
/// Utilisation samples kept per pod for the evidence.
const MAX_HISTORY: usize = 1440;

/// One pod in one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The highest utilisation among its processes (see `GpuSample::process_util`).
    pub util_percent: u32,
    /// Device memory of all its GPU processes.
    pub used_bytes: u64,
    /// Its GPU processes, as (PID, start time).
    pub processes: BTreeSet<(u32, u64)>,
}

/// What the agent knows of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    pub last_activity: DateTime<Utc>,
    pub idle_samples: u32,
    /// Utilisation of the latest samples, oldest first.
    pub history: VecDeque<u32>,
    used_bytes: u64,
    processes: BTreeSet<(u32, u64)>,
    /// The last-activity time the pod's annotation holds (as far as we know).
    pub annotated: Option<DateTime<Utc>>,
}

impl Track {
    /// Idle time since the last activity.
    pub fn idle_for(&self, now: DateTime<Utc>) -> TimeDelta {
        (now - self.last_activity).max(TimeDelta::zero())
    }

    /// Whether the pod's processes have been idle for the whole window of `rule`.
    pub fn reclaimable(&self, rule: &IdleRule, now: DateTime<Utc>) -> bool {
        self.idle_samples >= rule.idle_samples
            && self.idle_for(now) >= TimeDelta::minutes(i64::from(rule.idle_minutes))
    }

    /// The utilisation samples of the current idle run.
    pub fn idle_run(&self) -> Vec<u32> {
        let n = (self.idle_samples as usize).min(self.history.len());
        self.history
            .iter()
            .skip(self.history.len() - n)
            .copied()
            .collect()
    }
}

/// Every pod with GPU processes, by UID.
#[derive(Debug, Default)]
pub struct IdleTracker {
    pods: HashMap<String, Track>,
}

impl IdleTracker {
    /// Records one sample of a pod. `annotated` is the last-activity time the pod
    /// carries (from an earlier run of the agent, or another node's); it stands for
    /// the last activity of a pod seen for the first time, so that a restart does not
    /// make every pod look fresh to the controller.
    pub fn observe(
        &mut self,
        uid: &str,
        now: DateTime<Utc>,
        obs: Observation,
        threshold_percent: u32,
        annotated: Option<DateTime<Utc>>,
    ) -> &Track {
        let busy = obs.util_percent >= threshold_percent;
        // A pod seen for the first time without an annotation: its processes just
        // appeared, which is activity.
        let fresh = !self.pods.contains_key(uid) && annotated.filter(|t| *t <= now).is_none();
        let track = self.pods.entry(uid.to_owned()).or_insert_with(|| Track {
            last_activity: annotated.filter(|t| *t <= now).unwrap_or(now),
            idle_samples: 0,
            history: VecDeque::new(),
            used_bytes: obs.used_bytes,
            processes: obs.processes.clone(),
            annotated,
        });
        let changed = track.processes != obs.processes
            || track.used_bytes.abs_diff(obs.used_bytes) >= MEMORY_ACTIVITY_BYTES;
        if busy || changed || fresh {
            track.last_activity = now.max(track.last_activity);
            track.idle_samples = 0;
        } else {
            track.idle_samples = track.idle_samples.saturating_add(1);
        }
        track.used_bytes = obs.used_bytes;
        track.processes = obs.processes;
        if track.history.len() >= MAX_HISTORY {
            track.history.pop_front();
        }
        track.history.push_back(obs.util_percent);
        track
    }

    pub fn get(&self, uid: &str) -> Option<&Track> {
        self.pods.get(uid)
    }

    /// Notes that the pod's annotation now holds `at`.
    pub fn set_annotated(&mut self, uid: &str, at: DateTime<Utc>) {
        if let Some(t) = self.pods.get_mut(uid) {
            t.annotated = Some(at);
        }
    }

    /// Forgets pods that no longer have GPU processes.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.pods.retain(|uid, _| live(uid));
    }

    /// Starts the pod's count again (after an action, or a dry run of one).
    pub fn restart(&mut self, uid: &str) {
        if let Some(t) = self.pods.get_mut(uid) {
            t.idle_samples = 0;
            t.history.clear();
        }
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn rule(minutes: u32, samples: u32) -> IdleRule {
        IdleRule {
            enabled: true,
            idle_minutes: minutes,
            idle_samples: samples,
            util_threshold_percent: 1,
            dry_run: false,
        }
    }

    fn obs(util: u32, mib: u64, pids: &[u32]) -> Observation {
        Observation {
            util_percent: util,
            used_bytes: mib * MIB,
            processes: pids.iter().map(|&p| (p, 1)).collect(),
        }
    }

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap() + TimeDelta::minutes(minute)
    }

    #[test]
    fn idle_after_the_window_and_the_samples() {
        let mut t = IdleTracker::default();
        let r = rule(30, 30);
        t.observe("a", at(0), obs(0, 2000, &[1]), 1, None);
        for m in 1..30 {
            assert!(!t
                .observe("a", at(m), obs(0, 2000, &[1]), 1, None)
                .reclaimable(&r, at(m)));
        }
        let track = t.observe("a", at(30), obs(0, 2000, &[1]), 1, None);
        assert!(track.reclaimable(&r, at(30)));
        assert_eq!(track.idle_run().len(), 30);
        assert_eq!(track.idle_for(at(30)), TimeDelta::minutes(30));
    }

    #[test]
    fn activity_restarts_the_count() {
        let mut t = IdleTracker::default();
        let r = rule(3, 3);
        t.observe("a", at(0), obs(0, 2000, &[1]), 1, None);
        t.observe("a", at(1), obs(0, 2000, &[1]), 1, None);
        t.observe("a", at(2), obs(5, 2000, &[1]), 1, None);
        let track = t.get("a").unwrap();
        assert_eq!((track.idle_samples, track.last_activity), (0, at(2)));
        // Memory growth is activity.
        t.observe("a", at(3), obs(0, 2100, &[1]), 1, None);
        assert_eq!(t.get("a").unwrap().last_activity, at(3));
        // So is a new process.
        t.observe("a", at(4), obs(0, 2100, &[1, 2]), 1, None);
        assert_eq!(t.get("a").unwrap().last_activity, at(4));
        // A few MiB of drift is not.
        t.observe("a", at(5), obs(0, 2104, &[1, 2]), 1, None);
        assert_eq!(t.get("a").unwrap().idle_samples, 1);
        for m in 6..=7 {
            t.observe("a", at(m), obs(0, 2104, &[1, 2]), 1, None);
        }
        assert!(t.get("a").unwrap().reclaimable(&r, at(7)));
    }

    #[test]
    fn the_annotation_survives_a_restart_but_the_samples_do_not() {
        let mut t = IdleTracker::default();
        let r = rule(30, 30);
        let track = t.observe("a", at(120), obs(0, 10, &[1]), 1, Some(at(0)));
        assert_eq!(track.last_activity, at(0));
        assert!(!track.reclaimable(&r, at(120)));
        // An annotation from the future (clock skew) is not believed.
        let track = t.observe("b", at(0), obs(0, 10, &[1]), 1, Some(at(60)));
        assert_eq!(track.last_activity, at(0));
    }

    #[test]
    fn retain_and_restart() {
        let mut t = IdleTracker::default();
        t.observe("a", at(0), obs(0, 10, &[1]), 1, None);
        t.observe("a", at(1), obs(0, 10, &[1]), 1, None);
        t.observe("b", at(0), obs(0, 10, &[2]), 1, None);
        t.restart("a");
        assert_eq!(t.get("a").unwrap().idle_samples, 0);
        t.retain(|uid| uid == "a");
        assert_eq!(t.len(), 1);
    }
}
