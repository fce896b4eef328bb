//! What the controller does to a pod it was asked to act on: a pure plan from why
//! it was asked ([`Trigger`]), what the pod is now ([`PodFacts`], read again just
//! before acting: the watch that asked may be behind) and the on-expiry mode.
//!
//! The controller carries the plan out (deletes, copies, asks the hub); this
//! module only decides, so that every rule of which pods give way and how is
//! tested here without a cluster.

use chrono::{DateTime, Utc};

use crate::admission::PodStanding;

/// What happens to a booked pod at its `terminate-at` (`--on-expiry`, the chart's
/// `controller.onExpiry`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum OnExpiry {
    /// Delete it, wait until it is gone, create it again without GPU (pods owned by
    /// another controller are only deleted: their owner recreates them).
    #[default]
    RecreateCpu,
    /// Delete it.
    Delete,
    /// Recreate it as a lent pod: same name, the low priority class and label, no
    /// booking, no `terminate-at`, its GPU kept (a pod's priority cannot change, so
    /// the pod is deleted and created again; pods owned by another controller are
    /// only deleted). It keeps the GPU until a booked pod needs the unit.
    Demote,
    /// Stop the user's server through JupyterHub's REST API and start it again
    /// (`--hub-api-url`, `--hub-token-file`): the hub's KubeSpawner deletes the pod
    /// and spawns a new one, which the webhook admits as it admits any spawn (no
    /// booking: lent if a unit is free, else CPU-only). Deleting and re-creating the
    /// pod behind the hub's back loses the notebook when the hub polls in between
    /// (docs/controller.md). Also used for preempted lent pods; pods without a hub
    /// user are recreated CPU-only.
    HubRestart,
}

/// Why the controller acts on a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A booked pod reached its `terminate-at`.
    Expired,
    /// A lent pod gives its unit to a booked pod that waits for one.
    Preempted,
    /// kube-scheduler is evicting a pod of ours for a pod of higher priority.
    SchedulerPreempted,
    /// A lent pod waited longer than the grace for a GPU the scheduler has no room
    /// for.
    LentPending,
    /// A booked pod beyond its booking's units: it goes on as a lent pod.
    BeyondBooking { booking_id: i64 },
}

/// The pod as read just before acting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// Its standing as far as it is believed (our class and label together).
    pub standing: Option<PodStanding>,
    /// Marked for deletion already.
    pub deleting: bool,
    /// Its `terminate-at`, if it has a readable one.
    pub terminate_at: Option<DateTime<Utc>>,
    /// The booking its label names.
    pub booking_id: Option<i64>,
    /// Unbound and refused by the scheduler for want of a GPU.
    pub waiting_for_gpu: bool,
    /// Owned by another controller (a StatefulSet, a Job ...), which recreates it.
    pub owned: bool,
    /// JupyterHub runs it (its user and server are on it).
    pub hub_server: bool,
    /// In a namespace the controller does not serve but an admin made preemptible
    /// ([`crate::preemption_policy`]): lent pods and other workloads there give way
    /// to booked pods, and are only deleted.
    pub delete_only: bool,
}

/// What is done to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Deleted, then created again without a GPU.
    RecreateCpu,
    /// Deleted.
    Delete,
    /// Deleted, then created again as a lent pod with its GPU.
    Demote,
    /// Stopped and started again by JupyterHub.
    HubRestart,
}

/// The plan: act in a mode, or leave the pod (why, for the log and the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Act(Mode),
    Skip(&'static str),
}

/// The plan for a pod the controller was asked to act on for `trigger`, at `now`,
/// under `on_expiry`; `hub` says whether the hub's API is configured.
pub fn plan(
    trigger: Trigger,
    pod: &PodFacts,
    on_expiry: OnExpiry,
    hub: bool,
    now: DateTime<Utc>,
) -> Plan {
    let mode = match trigger {
        Trigger::Expired => {
            // The booking may have been extended, or the pod demoted, since the
            // timer was set: the watch re-arms it.
            if pod.standing != Some(PodStanding::High)
                || pod.deleting
                || pod.terminate_at.is_none_or(|end| end > now)
            {
                return Plan::Skip("no longer due");
            }
            match on_expiry {
                // Becomes the hub's restart below where the hub runs the pod.
                OnExpiry::RecreateCpu | OnExpiry::HubRestart => Mode::RecreateCpu,
                OnExpiry::Delete => Mode::Delete,
                OnExpiry::Demote => Mode::Demote,
            }
        }
        Trigger::Preempted => {
            if pod.deleting {
                return Plan::Skip("already going");
            }
            // Where it does not serve, the controller only deletes: neither the pod
            // nor its replacement is its to make.
            let yields = match pod.standing {
                Some(PodStanding::Low) => true,
                None => pod.delete_only,
                Some(PodStanding::High) => false,
            };
            if !yields {
                return Plan::Skip("no longer a low-priority pod");
            }
            if pod.delete_only {
                return Plan::Act(Mode::Delete);
            }
            match on_expiry {
                OnExpiry::Delete => Mode::Delete,
                _ => Mode::RecreateCpu,
            }
        }
        Trigger::SchedulerPreempted => Mode::RecreateCpu,
        Trigger::LentPending => {
            // Still lent and still refused for want of a GPU; the delete is
            // conditional on the version read, so a pod bound since is not touched.
            if pod.standing != Some(PodStanding::Low) || !pod.waiting_for_gpu || pod.deleting {
                return Plan::Skip("no longer a lent pod waiting for a GPU");
            }
            Mode::RecreateCpu
        }
        Trigger::BeyondBooking { booking_id } => {
            // The watch may be behind: act only on a pod that still claims the booking.
            if pod.standing != Some(PodStanding::High)
                || pod.booking_id != Some(booking_id)
                || pod.deleting
            {
                return Plan::Skip("no longer a pod of that booking");
            }
            Mode::Demote
        }
    };
    // Through the hub where the hub runs the pod.
    let mode = match mode {
        Mode::RecreateCpu if on_expiry == OnExpiry::HubRestart && pod.hub_server && hub => {
            Mode::HubRestart
        }
        mode => mode,
    };
    // A pod another controller owns is only deleted (its owner recreates it); in
    // `delete` mode nothing is ever recreated.
    if pod.owned || on_expiry == OnExpiry::Delete {
        return Plan::Act(Mode::Delete);
    }
    Plan::Act(mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_900_000_000, 0).unwrap()
    }

    fn booked(ended: bool) -> PodFacts {
        PodFacts {
            standing: Some(PodStanding::High),
            terminate_at: Some(now() + TimeDelta::seconds(if ended { -1 } else { 60 })),
            booking_id: Some(7),
            hub_server: true,
            ..PodFacts::default()
        }
    }

    fn lent() -> PodFacts {
        PodFacts {
            standing: Some(PodStanding::Low),
            hub_server: true,
            ..PodFacts::default()
        }
    }

    #[test]
    fn an_expired_booked_pod_follows_the_mode() {
        let at = |mode, hub| plan(Trigger::Expired, &booked(true), mode, hub, now());
        assert_eq!(
            at(OnExpiry::RecreateCpu, false),
            Plan::Act(Mode::RecreateCpu)
        );
        assert_eq!(at(OnExpiry::Delete, false), Plan::Act(Mode::Delete));
        assert_eq!(at(OnExpiry::Demote, false), Plan::Act(Mode::Demote));
        assert_eq!(at(OnExpiry::HubRestart, true), Plan::Act(Mode::HubRestart));
        // The mode asks for the hub, but no hub is configured.
        assert_eq!(
            at(OnExpiry::HubRestart, false),
            Plan::Act(Mode::RecreateCpu)
        );
    }

    #[test]
    fn a_pod_no_longer_due_is_left() {
        let skip =
            |pod: &PodFacts| plan(Trigger::Expired, pod, OnExpiry::RecreateCpu, false, now());
        assert_eq!(
            skip(&booked(false)),
            Plan::Skip("no longer due"),
            "extended"
        );
        let demoted = PodFacts {
            standing: Some(PodStanding::Low),
            ..booked(true)
        };
        assert_eq!(skip(&demoted), Plan::Skip("no longer due"));
        let going = PodFacts {
            deleting: true,
            ..booked(true)
        };
        assert_eq!(skip(&going), Plan::Skip("no longer due"));
        let unreadable = PodFacts {
            terminate_at: None,
            ..booked(true)
        };
        assert_eq!(skip(&unreadable), Plan::Skip("no longer due"));
    }

    #[test]
    fn preemption_takes_only_lent_pods_and_recreates_them_on_cpu() {
        let at = |pod: &PodFacts, mode| plan(Trigger::Preempted, pod, mode, true, now());
        assert_eq!(
            at(&lent(), OnExpiry::RecreateCpu),
            Plan::Act(Mode::RecreateCpu)
        );
        assert_eq!(at(&lent(), OnExpiry::Demote), Plan::Act(Mode::RecreateCpu));
        assert_eq!(
            at(&lent(), OnExpiry::HubRestart),
            Plan::Act(Mode::HubRestart)
        );
        assert_eq!(at(&lent(), OnExpiry::Delete), Plan::Act(Mode::Delete));
        assert_eq!(
            at(&booked(false), OnExpiry::RecreateCpu),
            Plan::Skip("no longer a low-priority pod")
        );
        // Another workload: kept unless an admin made its namespace preemptible,
        // then only deleted, whatever the mode.
        let other = PodFacts::default();
        assert_eq!(
            at(&other, OnExpiry::RecreateCpu),
            Plan::Skip("no longer a low-priority pod")
        );
        let opted_in = PodFacts {
            delete_only: true,
            ..PodFacts::default()
        };
        let lent_there = PodFacts {
            delete_only: true,
            ..lent()
        };
        for mode in [
            OnExpiry::RecreateCpu,
            OnExpiry::HubRestart,
            OnExpiry::Demote,
        ] {
            assert_eq!(at(&opted_in, mode), Plan::Act(Mode::Delete));
            assert_eq!(at(&lent_there, mode), Plan::Act(Mode::Delete));
        }
        // A booked pod in such a namespace is still never preempted.
        let booked_there = PodFacts {
            delete_only: true,
            ..booked(false)
        };
        assert_eq!(
            at(&booked_there, OnExpiry::RecreateCpu),
            Plan::Skip("no longer a low-priority pod")
        );
    }

    #[test]
    fn owned_pods_are_only_deleted() {
        let owned = PodFacts {
            owned: true,
            ..booked(true)
        };
        for mode in [
            OnExpiry::RecreateCpu,
            OnExpiry::Demote,
            OnExpiry::HubRestart,
        ] {
            assert_eq!(
                plan(Trigger::Expired, &owned, mode, true, now()),
                Plan::Act(Mode::Delete)
            );
        }
    }

    #[test]
    fn lent_pending_and_beyond_booking_check_the_pod_again() {
        let waiting = PodFacts {
            waiting_for_gpu: true,
            ..lent()
        };
        let at = |trigger, pod: &PodFacts| plan(trigger, pod, OnExpiry::RecreateCpu, false, now());
        assert_eq!(
            at(Trigger::LentPending, &waiting),
            Plan::Act(Mode::RecreateCpu)
        );
        assert_eq!(
            at(Trigger::LentPending, &lent()),
            Plan::Skip("no longer a lent pod waiting for a GPU"),
            "bound meanwhile"
        );
        let beyond = Trigger::BeyondBooking { booking_id: 7 };
        assert_eq!(at(beyond, &booked(false)), Plan::Act(Mode::Demote));
        let other = Trigger::BeyondBooking { booking_id: 8 };
        assert_eq!(
            at(other, &booked(false)),
            Plan::Skip("no longer a pod of that booking")
        );
        assert_eq!(
            at(Trigger::SchedulerPreempted, &lent()),
            Plan::Act(Mode::RecreateCpu)
        );
    }
}
