//! Which pods holding a GPU may give way to a booked pod, and what a booked pod that
//! cannot get a card is told.
//!
//! The controller counts every pod that holds a GPU, in every namespace: a card a
//! training Job holds is not free, whoever made the Job. It acts only where it is
//! allowed to (`--namespace`). The policy:
//!
//! - **Lent pods** (our low class, set by our webhook) give way where the controller
//!   may act on them: the namespace it serves (re-created CPU-only as the mode says)
//!   and the namespaces an admin made preemptible (`--preemptible-namespaces`:
//!   deleted, never re-created there); least recently GPU-active first, exactly as
//!   many as needed. The webhook lends only in those namespaces
//!   (`--lend-namespaces`, which the chart sets to them): a GPU pod without a
//!   user elsewhere is another workload, admitted as written. A pod lent elsewhere
//!   (before that, or by a webhook configured otherwise) stays, since the controller
//!   may not touch it.
//! - **Other workloads** (GPU pods our webhook did not admit as booked or lent)
//!   give way only in the namespaces an admin made preemptible, and only where lent
//!   pods cannot make room (deleted).
//! - **Booked pods** never give way.
//!
//! The cards held by pods that never give way (and are not booked) are what
//! bookings cannot get: the controller reports them per model (`others_in_use`).
//!
//! A booked pod that waits because the cards are held by pods that may not give way
//! is told so, with the namespaces that hold them ([`waiting_reason`]).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use crate::admission::PodStanding;

/// What a pod holding a GPU is to the bookings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// Admitted as booked: holds its booking's units.
    Booked,
    /// Admitted as lent: holds a card nobody booked.
    Lent,
    /// Anything else: a workload our webhook did not admit as booked or lent.
    Other,
}

impl Holder {
    /// From the pod's standing as far as it is believed (our class and label).
    pub fn of(standing: Option<PodStanding>) -> Self {
        match standing {
            Some(PodStanding::High) => Self::Booked,
            Some(PodStanding::Low) => Self::Lent,
            None => Self::Other,
        }
    }
}

/// Whether a pod holding a GPU may give way to a booked pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A lent pod where the controller may act on it: among the first to give way.
    Lent,
    /// Another workload in a namespace an admin made preemptible: gives way only
    /// where lent pods cannot make room.
    OptedIn,
    /// Never: a booked pod, a pod where the controller may not act, or another
    /// workload nobody made preemptible.
    Kept,
}

/// Where the controller acts and which other workloads may give way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreemptionPolicy {
    /// The one namespace the controller acts in; `None`: every namespace.
    acts_in: Option<String>,
    /// Namespaces whose other workloads may give way to booked pods.
    preemptible: BTreeSet<String>,
}

impl PreemptionPolicy {
    /// `acts_in`: `--namespace` (`None` or `*`: every namespace);
    /// `preemptible`: `--preemptible-namespaces`.
    pub fn new(acts_in: Option<&str>, preemptible: impl IntoIterator<Item = String>) -> Self {
        Self {
            acts_in: acts_in.filter(|ns| *ns != "*").map(str::to_owned),
            preemptible: preemptible
                .into_iter()
                .map(|ns| ns.trim().to_owned())
                .filter(|ns| !ns.is_empty())
                .collect(),
        }
    }

    /// Whether the controller may end, re-create or annotate pods in `namespace`:
    /// the one it serves, and the namespaces whose workloads an admin made
    /// preemptible (deleting there only).
    pub fn acts_in(&self, namespace: &str) -> bool {
        self.serves(namespace) || self.preemptible.contains(namespace)
    }

    /// Whether `namespace` is the one (or one of those) the controller serves:
    /// where booked pods end at their `terminate-at` and lent pods give way.
    pub fn serves(&self, namespace: &str) -> bool {
        self.acts_in.as_deref().is_none_or(|ns| ns == namespace)
    }

    /// Whether a pod of `standing` in `namespace` may give way to a booked pod.
    pub fn verdict(&self, standing: Option<PodStanding>, namespace: &str) -> Verdict {
        match Holder::of(standing) {
            Holder::Lent if self.acts_in(namespace) => Verdict::Lent,
            Holder::Other if self.preemptible.contains(namespace) => Verdict::OptedIn,
            _ => Verdict::Kept,
        }
    }

    /// Whether a pod ending for a booked pod in `namespace` is only deleted: the
    /// controller does not serve it, it may only delete there.
    pub fn delete_only(&self, namespace: &str) -> bool {
        !self.serves(namespace) && self.preemptible.contains(namespace)
    }

    /// Whether the cards a pod of `standing` in `namespace` holds are lost to
    /// bookings while it runs: not booked, and never giving way.
    pub fn held_from_bookings(&self, standing: Option<PodStanding>, namespace: &str) -> bool {
        Holder::of(standing) != Holder::Booked && self.verdict(standing, namespace) == Verdict::Kept
    }

    /// The namespaces whose other workloads may give way, in order.
    pub fn preemptible_namespaces(&self) -> impl Iterator<Item = &str> {
        self.preemptible.iter().map(String::as_str)
    }
}

/// What becomes of a lent pod marked to give way at a deadline (after the warning
/// of `--preemption-grace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// Its user has until the deadline.
    Wait,
    /// The deadline passed and a booked pod still waits for its room: it ends now.
    End,
    /// No booked pod waits for its room any more (bound elsewhere, stopped, ended):
    /// the pod keeps its GPU, and its user is told.
    Unmark,
}

/// The fate of a pod marked to end at `deadline` while a booked pod still waits for
/// its room (`booked_waits`: the one it was marked for, or another the controller
/// counts on its room for) or not, at `now`. Only a booked pod still waiting ends
/// anyone, however late.
pub fn marked(deadline: DateTime<Utc>, now: DateTime<Utc>, booked_waits: bool) -> Marked {
    match (booked_waits, now >= deadline) {
        (false, _) => Marked::Unmark,
        (true, true) => Marked::End,
        (true, false) => Marked::Wait,
    }
}

/// What a booked pod whose room is being freed is told: when the lent pod marked for
/// it ends (its user was warned), in UTC as the pod's Events are.
pub fn freeing_reason(model: &str, ends_at: DateTime<Utc>) -> String {
    format!(
        "waiting: a lent {model} notebook gives its GPU back at {} UTC (its user was warned); \
         this pod starts then",
        ends_at.format("%H:%M:%S")
    )
}

/// What a booked pod is told while the room it waits for is a pod on its way out
/// (terminating: its user stopped it, or it gives way to this pod), not a pod that
/// bookings do not preempt: the unit comes once that pod is gone.
pub fn ending_reason(model: &str) -> String {
    format!(
        "waiting: the {model} GPU for this pod is held by a pod that is ending (its grace period); this pod starts once it is gone"
    )
}

/// Where a waiting booked pod's model stands on the nodes it may run on, in units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shortfall {
    /// Units of the model on those nodes.
    pub units: u64,
    /// Units held there (by anyone).
    pub held: u64,
    /// ... by booked pods.
    pub booked: u64,
    /// ... by pods that may not give way, by namespace (lent pods where the
    /// controller does not act, other workloads nobody made preemptible).
    pub kept: BTreeMap<String, u64>,
}

/// The most namespaces a waiting sentence names (the rest are counted).
pub const NAMED_NAMESPACES: usize = 3;

/// Why a booked pod waits for a unit of `model`, in one sentence for its Event, its
/// booking's page and the API: "waiting: 3 of 3 a100 held, 1 by pods in namespace
/// research that bookings do not preempt".
pub fn waiting_reason(model: &str, s: &Shortfall) -> String {
    if s.units == 0 {
        return format!("waiting: no node this pod may run on has {model} cards");
    }
    let mut out = format!("waiting: {} of {} {model} held", s.held, s.units);
    if s.booked > 0 {
        out.push_str(&format!(", {} by bookings", s.booked));
    }
    let kept: u64 = s.kept.values().sum();
    if kept > 0 {
        let mut names: Vec<&str> = s
            .kept
            .keys()
            .take(NAMED_NAMESPACES)
            .map(String::as_str)
            .collect();
        let more = s.kept.len().saturating_sub(NAMED_NAMESPACES);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        let noun = if s.kept.len() == 1 {
            "namespace"
        } else {
            "namespaces"
        };
        names.sort_unstable();
        out.push_str(&format!(
            ", {kept} by pods in {noun} {}{more} that bookings do not preempt",
            names.join(", ")
        ));
    }
    if s.held < s.units {
        // Free units, but not enough of them (or of the VRAM budget) on one node.
        out.push_str("; the free ones cannot hold this pod on one node");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_pods_give_way_only_where_the_controller_acts() {
        let p = PreemptionPolicy::new(Some("jhub"), ["research".to_owned()]);
        assert_eq!(p.verdict(Some(PodStanding::Low), "jhub"), Verdict::Lent);
        assert_eq!(p.verdict(Some(PodStanding::Low), "other"), Verdict::Kept);
        assert_eq!(p.verdict(Some(PodStanding::High), "jhub"), Verdict::Kept);
        assert_eq!(p.verdict(None, "jhub"), Verdict::Kept);
        assert_eq!(p.verdict(None, "batch"), Verdict::Kept);
        assert_eq!(p.verdict(None, "research"), Verdict::OptedIn);
        // Lent by our webhook in an opted-in namespace: a lent pod, only deleted.
        assert_eq!(p.verdict(Some(PodStanding::Low), "research"), Verdict::Lent);
        assert!(p.delete_only("research") && !p.delete_only("jhub") && !p.delete_only("batch"));
        assert!(p.acts_in("jhub") && p.acts_in("research") && !p.acts_in("batch"));
        assert!(p.serves("jhub") && !p.serves("research"));
        // What bookings cannot get: pods that stay, booked ones aside.
        assert!(p.held_from_bookings(Some(PodStanding::Low), "other"));
        assert!(p.held_from_bookings(None, "batch"));
        assert!(!p.held_from_bookings(None, "research"));
        assert!(!p.held_from_bookings(Some(PodStanding::Low), "jhub"));
        assert!(!p.held_from_bookings(Some(PodStanding::High), "other"));
    }

    #[test]
    fn a_marked_pod_ends_at_its_deadline_only_while_the_booked_pod_waits() {
        let t0: DateTime<Utc> = "2026-11-29T10:00:00Z".parse().unwrap();
        let deadline = t0 + chrono::TimeDelta::minutes(2);
        assert_eq!(marked(deadline, t0, true), Marked::Wait);
        assert_eq!(marked(deadline, deadline, true), Marked::End);
        assert_eq!(
            marked(deadline, deadline + chrono::TimeDelta::hours(1), true),
            Marked::End,
            "a pod that keeps the card past the deadline is ended as before"
        );
        for now in [t0, deadline, deadline + chrono::TimeDelta::seconds(1)] {
            assert_eq!(marked(deadline, now, false), Marked::Unmark);
        }
    }

    #[test]
    fn the_freeing_sentence_says_when() {
        let at: DateTime<Utc> = "2026-11-29T10:32:05Z".parse().unwrap();
        assert_eq!(
            freeing_reason("a100", at),
            "waiting: a lent a100 notebook gives its GPU back at 10:32:05 UTC (its user was \
             warned); this pod starts then"
        );
    }

    #[test]
    fn the_ending_sentence_blames_nobody() {
        let said = ending_reason("a100");
        assert_eq!(
            said,
            "waiting: the a100 GPU for this pod is held by a pod that is ending (its grace period); this pod starts once it is gone"
        );
        assert!(!said.contains("do not preempt"));
    }

    #[test]
    fn every_namespace() {
        for all in [None, Some("*")] {
            let p = PreemptionPolicy::new(all, Vec::new());
            assert!(p.serves("anything") && p.acts_in("anything"));
            assert_eq!(p.verdict(Some(PodStanding::Low), "x"), Verdict::Lent);
            assert_eq!(p.verdict(None, "x"), Verdict::Kept);
        }
        let blank = PreemptionPolicy::new(None, [" ".to_owned(), String::new()]);
        assert_eq!(blank.preemptible_namespaces().count(), 0);
    }

    #[test]
    fn waiting_sentences() {
        let one = Shortfall {
            units: 3,
            held: 3,
            booked: 0,
            kept: [("research".to_owned(), 1)].into(),
        };
        assert_eq!(
            waiting_reason("a100", &one),
            "waiting: 3 of 3 a100 held, 1 by pods in namespace research that bookings do not preempt"
        );
        let many = Shortfall {
            units: 8,
            held: 8,
            booked: 2,
            kept: [("a", 1), ("b", 2), ("c", 1), ("d", 2)]
                .map(|(k, v)| (k.to_owned(), v))
                .into(),
        };
        assert_eq!(
            waiting_reason("t4", &many),
            "waiting: 8 of 8 t4 held, 2 by bookings, 6 by pods in namespaces a, b, c and 1 more that bookings do not preempt"
        );
        assert_eq!(
            waiting_reason("a100", &Shortfall::default()),
            "waiting: no node this pod may run on has a100 cards"
        );
        let coming = Shortfall {
            units: 2,
            held: 1,
            booked: 1,
            kept: BTreeMap::new(),
        };
        assert_eq!(
            waiting_reason("a100", &coming),
            "waiting: 1 of 2 a100 held, 1 by bookings; the free ones cannot hold this pod on one node"
        );
    }
}
