//! Booking changes reach pods: the leader follows the booking service's change
//! stream ([`gpu_booking_client::Follower`]) and re-times the pods of each changed
//! booking, by writing the booking's new end into the pod's `terminate-at`. The
//! expiry timer then does the rest, through the same path and `--on-expiry` mode as
//! a booking that ends on time: a booking cancelled or ended early gets an end in
//! the past, so its pods end at once; a booking whose end moved keeps its pods until
//! the new end. At the start and after each new election the follower lists the
//! current bookings, and every booked pod is checked against them (level-triggered):
//! a booked pod whose booking is no longer current ends.
//!
//! A pod's priority cannot change, so a booking that starts while its user runs a
//! lent pod of that model gets an Event on the pod (and an audit row) telling the
//! user to restart it to get the booked priority.

use std::collections::{BTreeMap, HashMap};

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use gpu_booking_client::{AuditReport, Booking, Followed, Follower};
use gpu_booking_core::booking_end::{self, Seen};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::actions::{self, Ctx, PodRef};
use crate::pods::{PodInfo, Priority};

/// Each long poll's wait: well under the service's cap of 30 s.
pub const WAIT: Duration = Duration::from_secs(25);

/// Starts following, if the booking service can be followed; the loop receives
/// each step on the returned channel (bounded: the follower waits for the loop).
/// While the stream says it is held back, the bookings are listed again every
/// `relist_after` (`--booking-relist-after`; zero: never).
pub fn spawn(
    ctx: Arc<Ctx>,
    relist_after: Duration,
) -> Option<(JoinHandle<()>, mpsc::Receiver<Followed>)> {
    ctx.booking.changes()?;
    let (tx, rx) = mpsc::channel(4);
    let task = tokio::spawn(async move {
        let Some(source) = ctx.booking.changes() else {
            return;
        };
        let behind = ctx.metrics.booking_changes_behind.clone();
        let mut follower = Follower::new(WAIT)
            .on_lag(Arc::new(move |lag| {
                behind.set(lag.map_or(f64::NAN, |d| d.as_secs_f64()));
            }))
            .relist_after(relist_after);
        loop {
            let step = follower.next(source).await;
            match &step {
                Followed::Failed(e) => {
                    ctx.metrics.error("booking");
                    tracing::warn!(error = %e, failures = follower.failures(), "could not follow booking changes; retrying");
                    continue;
                }
                Followed::Listed(b) => {
                    tracing::info!(
                        bookings = b.len(),
                        "booking changes: listed the current bookings"
                    )
                }
                Followed::Changed(c) => {
                    tracing::debug!(changes = c.len(), "booking changes")
                }
            }
            if tx.send(step).await.is_err() {
                return;
            }
        }
    });
    Some((task, rx))
}

/// A booked pod's new end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retime {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub booking_id: i64,
    pub from: Option<DateTime<Utc>>,
    pub to: DateTime<Utc>,
    /// The booking is over (cancelled, ended early, or no longer listed).
    pub ends_now: bool,
}

pub use gpu_booking_core::booking_end::LISTING_MARGIN;

/// The booked pods whose `terminate-at` no longer matches their booking.
/// `bookings` are the changed bookings, or, with `listed_at`, every current one
/// as listed then: a booked pod clearly older than the listing whose booking is not
/// among them ends `now`.
pub fn plan<'a>(
    pods: impl IntoIterator<Item = &'a PodInfo>,
    bookings: &[Booking],
    listed_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Vec<Retime> {
    let by_id: BTreeMap<i64, &Booking> = bookings.iter().map(|b| (b.id, b)).collect();
    let mut out = Vec::new();
    for pod in pods {
        let (Some(booking_id), Some(current)) = (pod.booking_id, pod.expiry()) else {
            continue;
        };
        // The decision is core's; here only what the controller read.
        let seen = match by_id.get(&booking_id) {
            Some(b) => Seen::Booking {
                over: b.is_over(),
                pods_end: b.pods_end(),
            },
            None => listed_at.map_or(Seen::Unchanged, |listed_at| Seen::NotListed { listed_at }),
        };
        let Some((to, ends_now)) = booking_end::new_end(current, pod.started, seen, now) else {
            continue;
        };
        out.push(Retime {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            booking_id,
            from: Some(current),
            to,
            ends_now,
        });
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The running lent pods of a booking's user on its model, while the booking runs
/// at `now`: they keep their low priority (a pod's priority cannot change).
/// `node_model` names a node's model (its model label).
pub fn lent_pods_of<'a>(
    pods: &'a HashMap<String, PodInfo>,
    booking: &Booking,
    now: DateTime<Utc>,
    node_model: &dyn Fn(&str) -> Option<String>,
) -> Vec<&'a PodInfo> {
    // By the clock, not the status it was sent with: a planned booking starts.
    if booking.is_over() || now < booking.start || booking.end <= now {
        return Vec::new();
    }
    let mut lent: Vec<&PodInfo> = pods
        .values()
        .filter(|p| {
            p.served
                && p.priority == Some(Priority::Low)
                && p.node.is_some()
                && !p.finished
                && !p.deleting
                && p.user
                    .as_deref()
                    .is_some_and(|u| u.eq_ignore_ascii_case(&booking.user))
                && p.model_label
                    .clone()
                    .or_else(|| p.gpu.as_ref().and_then(|g| g.model.clone()))
                    // A lent pod of a generic GPU request: its node's model.
                    .or_else(|| p.node.as_deref().and_then(node_model))
                    .as_deref()
                    == Some(booking.model.as_str())
        })
        .collect();
    lent.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    lent
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Writes the pod's new `terminate-at`, with an Event and an audit row. The pod
/// watch sees the new value and moves the expiry timer.
pub async fn retime(ctx: &Ctx, r: &Retime) {
    if !ctx.leadership.is_leader() {
        return;
    }
    let key = format!("{}/{}", r.namespace, r.name);
    if ctx.dry_run {
        tracing::info!(pod = %key, to = %rfc3339(r.to), "dry run: would re-time the booked pod");
        ctx.metrics.action("retime", "dry_run");
        return;
    }
    let api = actions::pods(ctx, &r.namespace);
    let annotation = ctx.cfg.current().terminate_at_annotation.clone();
    // The uid guards against a pod of the same name that replaced this one.
    let patch = json!({"metadata": {"uid": r.uid, "annotations": {annotation: rfc3339(r.to)}}});
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let written = actions::with_retries(|| api.patch(&r.name, &params, &patch)).await;
    if let Err(e) = written {
        ctx.metrics.action("retime", "error");
        ctx.metrics.error("kubernetes");
        tracing::warn!(pod = %key, error = %e, "could not re-time the booked pod");
        return;
    }
    ctx.metrics.action("retime", "done");
    let message = if r.ends_now {
        format!(
            "gpu-booking: booking {} is over (cancelled or ended early); this pod ends now",
            r.booking_id
        )
    } else {
        format!(
            "gpu-booking: booking {} now ends at {}; this pod ends then",
            r.booking_id,
            rfc3339(r.to)
        )
    };
    tracing::info!(pod = %key, booking = r.booking_id, to = %rfc3339(r.to), "booked pod re-timed");
    let at = PodRef {
        namespace: &r.namespace,
        name: &r.name,
        uid: &r.uid,
    };
    actions::note_pod(ctx, &at, "BookingChanged", &message, "Retime").await;
    let report = AuditReport {
        action: "controller.retime".into(),
        subject: Some(key),
        user: None,
        booking_id: Some(r.booking_id),
        details: json!({
            "from": r.from.map(rfc3339),
            "to": rfc3339(r.to),
            "ends_now": r.ends_now,
        }),
    };
    if let Err(e) = ctx.booking.audit(&report).await {
        ctx.metrics.error("booking");
        tracing::warn!(error = %e, "could not record the re-timing in the audit log");
    }
}

/// Tells the user of a lent pod that their booking started: restart to get it.
pub async fn tell_restart(ctx: &Ctx, pod: &PodInfo, booking: &Booking) {
    if ctx.dry_run || !ctx.leadership.is_leader() {
        return;
    }
    let message = format!(
        "gpu-booking: your booking {} of {} has started, but this pod was admitted as a lent \
         (low-priority) pod and a pod's priority cannot change: it may still be taken back. \
         Restart it (stop and start your server) to run on your booking until {}.",
        booking.id,
        booking.model,
        rfc3339(booking.end)
    );
    let at = PodRef {
        namespace: &pod.namespace,
        name: &pod.name,
        uid: &pod.uid,
    };
    actions::note_pod(ctx, &at, "BookingStartedRestart", &message, "Notify").await;
    ctx.metrics.action("booking_started_on_lent_pod", "done");
    let report = AuditReport {
        action: "controller.booking_started_on_lent_pod".into(),
        subject: Some(pod.key()),
        user: Some(booking.user.clone()),
        booking_id: Some(booking.id),
        details: json!({"model": booking.model, "booking_end": rfc3339(booking.end)}),
    };
    if let Err(e) = ctx.booking.audit(&report).await {
        ctx.metrics.error("booking");
        tracing::warn!(error = %e, "could not record the notice in the audit log");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::{GpuUse, Placement};
    use chrono::{TimeDelta, TimeZone};
    use gpu_booking_core::window::BookingStatus;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 7, 12, 0, 0).unwrap()
    }

    fn pod(
        name: &str,
        priority: Priority,
        booking: Option<i64>,
        end: Option<DateTime<Utc>>,
    ) -> PodInfo {
        PodInfo {
            namespace: "jhub".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            priority: Some(priority),
            booking_id: booking,
            booking_units: None,
            unschedulable_for_gpu: false,
            served: true,
            gpu_removed: None,
            model_label: Some("a100".into()),
            user: Some("Alice".into()),
            terminate_at: end,
            owned: false,
            node: Some("n1".into()),
            finished: false,
            deleting: false,
            placement: Placement::default(),
            gpu: Some(GpuUse {
                units: 1,
                model: None,
            }),
            started: Some(now() - TimeDelta::hours(1)),
            last_activity: None,
            preempt_at: None,
            preempt_for: None,
            preemption_rounds: 0,
            scheduler_preempted: false,
            unschedulable: false,
        }
    }

    fn booking(id: i64, status: BookingStatus, end: DateTime<Utc>) -> Booking {
        let start = now() - TimeDelta::hours(2);
        Booking {
            id,
            user: "alice".into(),
            model: "a100".into(),
            slot: 0,
            units: 1,
            slots: vec![0],
            start,
            end,
            booked_end: end,
            status,
            created_at: start,
            cancelled_at: None,
            ended_early_at: None,
            override_rules: false,
            waiting: None,
        }
    }

    #[test]
    fn pods_follow_their_booking_s_end() {
        let old_end = now() + TimeDelta::hours(2);
        let pods = [
            pod("a", Priority::High, Some(1), Some(old_end)),
            pod("b", Priority::High, Some(2), Some(old_end)),
            pod("c", Priority::High, Some(3), Some(old_end)),
            // Lent, or of another booking: untouched.
            pod("d", Priority::Low, Some(1), None),
            pod("e", Priority::High, Some(9), Some(old_end)),
        ];
        let later = now() + TimeDelta::hours(5);
        let mut cancelled = booking(3, BookingStatus::Cancelled, old_end);
        cancelled.cancelled_at = Some(now() - TimeDelta::seconds(2));
        let changed = [
            booking(1, BookingStatus::Active, later),
            booking(2, BookingStatus::Ended, now() - TimeDelta::seconds(1)),
            cancelled,
        ];
        let plan = plan(&pods, &changed, None, now());
        let got: Vec<(&str, DateTime<Utc>, bool)> = plan
            .iter()
            .map(|r| (r.name.as_str(), r.to, r.ends_now))
            .collect();
        assert_eq!(
            got,
            [
                ("a", later, false),
                ("b", now() - TimeDelta::seconds(1), true),
                ("c", now() - TimeDelta::seconds(2), true),
            ]
        );
        // Within a second is the same end (the webhook may write whole seconds).
        let same = [booking(
            1,
            BookingStatus::Active,
            old_end + TimeDelta::milliseconds(400),
        )];
        assert!(super::plan(&pods, &same, None, now()).is_empty());
    }

    #[test]
    fn after_a_listing_only_pods_clearly_older_than_it_end_for_a_missing_booking() {
        let end = now() + TimeDelta::hours(2);
        let mut young = pod("young", Priority::High, Some(7), Some(end));
        young.started = Some(now() - TimeDelta::seconds(5));
        let old = pod("old", Priority::High, Some(8), Some(end));
        let pods = [young, old];
        let plan = plan(&pods, &[], Some(now()), now());
        assert_eq!(plan.len(), 1);
        assert_eq!(
            (plan[0].name.as_str(), plan[0].to, plan[0].ends_now),
            ("old", now(), true)
        );
        // Without a listing, a booking the changes do not name is left alone.
        assert!(super::plan(&pods, &[], None, now()).is_empty());
    }

    #[test]
    fn a_started_booking_names_its_user_s_running_lent_pods_of_its_model() {
        let mut pods = HashMap::new();
        for p in [
            pod("lent", Priority::Low, None, None),
            pod("booked", Priority::High, Some(1), Some(now())),
        ] {
            pods.insert(p.uid.clone(), p);
        }
        let mut other = pod("other-model", Priority::Low, None, None);
        other.model_label = Some("t4".into());
        pods.insert(other.uid.clone(), other);
        // A generic GPU request's pod: the model of its node.
        let mut generic = pod("generic", Priority::Low, None, None);
        generic.model_label = None;
        generic.node = Some("a100-node".into());
        pods.insert(generic.uid.clone(), generic);
        let active = booking(1, BookingStatus::Active, now() + TimeDelta::hours(1));
        let node_model = |n: &str| (n == "a100-node").then(|| "a100".to_owned());
        let names: Vec<&str> = lent_pods_of(&pods, &active, now(), &node_model)
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["generic", "lent"]);
        // Not yet started, or over.
        let mut planned = booking(1, BookingStatus::Planned, now() + TimeDelta::hours(3));
        planned.start = now() + TimeDelta::hours(1);
        assert!(lent_pods_of(&pods, &planned, now(), &|_| None).is_empty());
        assert!(!lent_pods_of(&pods, &planned, planned.start, &|_| None).is_empty());
        assert!(lent_pods_of(
            &pods,
            &booking(1, BookingStatus::Active, now()),
            now(),
            &|_| None
        )
        .is_empty());
    }
}
