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
//! user to restart it to get the booked priority. A course's occurrence is a
//! booking of the course's own user, so its members are told apart
//! ([`course_pods_to_tell`]): at most as many as the occurrence has places.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use gpu_booking_client::{AuditReport, Booking, Followed, Follower};
use gpu_booking_core::admission::{RESTART_TOLD_ANNOTATION, RESTART_TOLD_KEPT};
use gpu_booking_core::booking_end::{self, Seen};
use gpu_booking_core::booking_units::held_by_booking;
use gpu_booking_core::holds::HoldRef;
use gpu_booking_core::username::{NameCase, Username};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::actions::{self, Annotated, Ctx, PodRef};
use crate::booking_units::booked_pods;
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

/// Whether the booking runs at `now`, by the clock, not the status it was sent
/// with: a planned booking starts.
fn runs_at(booking: &Booking, now: DateTime<Utc>) -> bool {
    !booking.is_over() && booking.start <= now && now < booking.end
}

/// A running lent pod of `model` (its model label, its GPU resource's model, or for
/// a lent pod of a generic GPU request its node's: `node_model`).
fn is_lent_on(p: &PodInfo, model: &str, node_model: &dyn Fn(&str) -> Option<String>) -> bool {
    p.served
        && p.priority == Some(Priority::Low)
        && p.node.is_some()
        && !p.finished
        && !p.deleting
        && p.model_label
            .clone()
            .or_else(|| p.gpu.as_ref().and_then(|g| g.model.clone()))
            .or_else(|| p.node.as_deref().and_then(node_model))
            .as_deref()
            == Some(model)
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
    if !runs_at(booking, now) {
        return Vec::new();
    }
    let mut lent: Vec<&PodInfo> = pods
        .values()
        .filter(|p| {
            p.user
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(&booking.user))
                && is_lent_on(p, &booking.model, node_model)
        })
        .collect();
    lent.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    lent
}

/// A course's occurrence as the course notices see it.
#[derive(Debug, Clone, Copy)]
pub struct Session<'a> {
    /// The occurrence's booking row (its user is the hold's, [`HoldRef::user_name`]).
    pub occurrence: &'a Booking,
    /// The course's group's members, normalised as the service does (`names`).
    pub members: &'a BTreeSet<String>,
    pub names: NameCase,
}

/// How long a told member's place stays theirs once their lent pod has gone (or
/// is going): the time to start the server again (KubeSpawner deletes the pod,
/// waits for it to go, then creates the new one; the user may pick a profile
/// meanwhile). Without it, the next member would be told of a place that the
/// restarting member's new pod takes a moment later.
pub const RESTART_GRACE: TimeDelta = TimeDelta::minutes(2);

/// A lent pod whose member was told of a course's occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    pub uid: String,
    /// The member, normalised.
    pub user: String,
    /// The units the pod asked for (what its restart asks for).
    pub units: u64,
    /// When the pod was first seen gone or going (`None`: it still runs lent).
    pub gone_at: Option<DateTime<Utc>>,
}

/// A pod's GPUs, as a place on a course's occurrence counts them.
fn units_of(p: &PodInfo) -> u64 {
    p.gpu.as_ref().map_or(1, |g| g.units.max(1))
}

/// `user` of a pod, normalised as the service does.
fn member_name(p: &PodInfo, names: NameCase) -> Option<String> {
    let user = p.user.as_deref()?;
    Username::normalised(user, names)
        .ok()
        .map(Username::into_inner)
}

/// Whether `p` still runs lent: what keeps a told member's place.
fn runs_lent(p: &PodInfo) -> bool {
    p.priority == Some(Priority::Low) && !p.finished && !p.deleting
}

/// Marks the told pods that are no longer running lent as gone, from `now`.
pub fn mark_gone(told: &mut [Told], pods: &HashMap<String, PodInfo>, now: DateTime<Utc>) {
    for t in told.iter_mut().filter(|t| t.gone_at.is_none()) {
        if !pods.get(&t.uid).is_some_and(runs_lent) {
            t.gone_at = Some(now);
        }
    }
}

/// The lent pods of a course's members to tell that its occurrence runs (at `now`):
/// restarted, such a pod is admitted against the occurrence, as booked, while the
/// occurrence's units last, first come first served. So that no member is told to
/// restart onto units already taken, at most the places still free are told of:
/// the occurrence's units less those its booked pods hold, less those claimed by
/// the members already told (`told`, this occurrence's): a told pod that still runs
/// lent keeps its place, and one that has gone keeps it for [`RESTART_GRACE`] unless
/// its member already has a pod booked on the occurrence (counted as booked); past
/// that the place goes to the next member. Members' pods are told in the order they
/// started (then by name), each once; one needing more units than are left is
/// passed over for a smaller one. A member with a booking of their own running now
/// (`own_booking`, by normalised name) is admitted against it, not the course, and
/// is left out (their booking's own notice is [`lent_pods_of`]'s).
pub fn course_pods_to_tell<'a>(
    pods: &'a HashMap<String, PodInfo>,
    session: &Session<'_>,
    own_booking: &dyn Fn(&str) -> bool,
    told: &[Told],
    now: DateTime<Utc>,
    node_model: &dyn Fn(&str) -> Option<String>,
) -> Vec<&'a PodInfo> {
    let occurrence = session.occurrence;
    if !runs_at(occurrence, now) {
        return Vec::new();
    }
    let on_session: BTreeSet<String> = pods
        .values()
        .filter(|p| {
            p.booking_id == Some(occurrence.id)
                && p.priority == Some(Priority::High)
                && !p.finished
                && !p.deleting
        })
        .filter_map(|p| member_name(p, session.names))
        .collect();
    let claimed = told
        .iter()
        .filter(|t| match t.gone_at {
            None => true,
            Some(gone) => now - gone < RESTART_GRACE && !on_session.contains(&t.user),
        })
        .map(|t| t.units)
        .fold(0u64, u64::saturating_add);
    let booked = held_by_booking(&booked_pods(pods))
        .get(&occurrence.id)
        .copied()
        .unwrap_or(0);
    let mut places = u64::from(occurrence.units)
        .saturating_sub(booked)
        .saturating_sub(claimed);
    let mut lent: Vec<&PodInfo> = pods
        .values()
        .filter(|p| {
            member_name(p, session.names)
                .is_some_and(|u| session.members.contains(&u) && !own_booking(&u))
                && is_lent_on(p, &occurrence.model, node_model)
                && !told.iter().any(|t| t.uid == p.uid)
        })
        .collect();
    lent.sort_by(|a, b| {
        (a.started.is_none(), a.started, &a.namespace, &a.name).cmp(&(
            b.started.is_none(),
            b.started,
            &b.namespace,
            &b.name,
        ))
    });
    let mut out = Vec::new();
    for p in lent {
        if places == 0 {
            break;
        }
        if units_of(p) <= places {
            places -= units_of(p);
            out.push(p);
        }
    }
    out
}

/// The record of telling `pod`'s member (its uid, normalised user and units).
pub fn told_of(pod: &PodInfo, names: NameCase) -> Told {
    Told {
        uid: pod.uid.clone(),
        user: member_name(pod, names).unwrap_or_default(),
        units: units_of(pod),
        gone_at: None,
    }
}

/// Adds to `told` (occurrence `occurrence`'s) the lent pods still running whose
/// member was told of it by an earlier leader ([`RESTART_TOLD_ANNOTATION`]): each
/// keeps its place, and is not told again. A pod already gone left no mark to read;
/// its place went with the leader that told it.
pub fn recall_told(
    told: &mut Vec<Told>,
    pods: &HashMap<String, PodInfo>,
    occurrence: i64,
    names: NameCase,
) {
    for p in pods.values() {
        if runs_lent(p)
            && p.restart_told.contains(&occurrence)
            && !told.iter().any(|t| t.uid == p.uid)
        {
            told.push(told_of(p, names));
        }
    }
}

/// [`RESTART_TOLD_ANNOTATION`]'s value once `pod`'s user is told of `booking` too:
/// the ids it had, this one last, the newest [`RESTART_TOLD_KEPT`].
pub fn restart_told_value(pod: &PodInfo, booking: i64) -> String {
    let mut ids: Vec<i64> = pod
        .restart_told
        .iter()
        .copied()
        .filter(|id| *id != booking)
        .collect();
    ids.push(booking);
    let first = ids.len().saturating_sub(RESTART_TOLD_KEPT);
    ids[first..]
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",")
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
    let at = PodRef {
        namespace: &r.namespace,
        name: &r.name,
        uid: &r.uid,
    };
    let annotation = ctx.cfg.current().terminate_at_annotation.clone();
    match actions::annotate(ctx, &at, json!({annotation: rfc3339(r.to)})).await {
        Annotated::Written => {}
        Annotated::Halted => return,
        Annotated::Failed(e) => {
            ctx.metrics.action("retime", "error");
            ctx.metrics.error("kubernetes");
            tracing::warn!(pod = %key, error = %e, "could not re-time the booked pod");
            return;
        }
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

/// What a lent pod's user is told when a booking that is theirs starts.
const LENT_WHEN_STARTED: &str = "but this pod was admitted as a lent (low-priority) pod and \
     a pod's priority cannot change: it may still be taken back. Restart it (stop and start \
     your server)";

/// Tells the user of a lent pod that their booking started: restart to get it.
pub async fn tell_restart(ctx: &Ctx, pod: &PodInfo, booking: &Booking) {
    let message = format!(
        "gpu-booking: your booking {} of {} has started, {LENT_WHEN_STARTED} to run on your \
         booking until {}.",
        booking.id,
        booking.model,
        rfc3339(booking.end)
    );
    let details = json!({"model": booking.model, "booking_end": rfc3339(booking.end)});
    notify_restart(ctx, pod, booking, booking.user.clone(), &message, details).await;
}

/// A course as its notices name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CourseNotice {
    pub hold: HoldRef,
    /// The reservation's title, if it could be read.
    pub title: Option<String>,
}

/// The notice to a course member whose lent pod runs when the course's occurrence
/// starts.
pub fn course_message(course: &CourseNotice, occurrence: &Booking) -> String {
    let course_name = match &course.title {
        Some(title) => format!("your course {title}'s session"),
        None => "your course's session".to_owned(),
    };
    let share = match occurrence.units {
        1 => "the course's GPU goes to the first member's pod that starts on it".to_owned(),
        n => format!("the course's {n} GPUs go to the first {n} members' pods that start on them"),
    };
    format!(
        "gpu-booking: {course_name} on {} has started, {LENT_WHEN_STARTED} to run on the \
         course's GPUs until {} ({share}).",
        occurrence.model,
        rfc3339(occurrence.end)
    )
}

/// Tells a course member with a lent pod that the course's occurrence started.
pub async fn tell_course_restart(
    ctx: &Ctx,
    pod: &PodInfo,
    occurrence: &Booking,
    course: &CourseNotice,
) {
    let message = course_message(course, occurrence);
    let details = json!({
        "model": occurrence.model,
        "booking_end": rfc3339(occurrence.end),
        "course": course.hold.id,
        "group": course.hold.group,
        "title": course.title,
    });
    let user = pod.user.clone().unwrap_or_default();
    notify_restart(ctx, pod, occurrence, user, &message, details).await;
}

/// The Event on the lent pod and the audit row of a restart notice, after the mark
/// that says it was told ([`RESTART_TOLD_ANNOTATION`]: a later leader reads it).
/// Without the mark (a failed write) it is told all the same: this leader remembers
/// it, and a later one may tell again.
async fn notify_restart(
    ctx: &Ctx,
    pod: &PodInfo,
    booking: &Booking,
    user: String,
    message: &str,
    details: serde_json::Value,
) {
    if ctx.dry_run || !ctx.leadership.is_leader() {
        return;
    }
    let at = PodRef::from(pod);
    let told = json!({RESTART_TOLD_ANNOTATION: restart_told_value(pod, booking.id)});
    match actions::annotate(ctx, &at, told).await {
        Annotated::Written => {}
        Annotated::Halted => return,
        Annotated::Failed(e) => {
            ctx.metrics.error("kubernetes");
            tracing::warn!(pod = %pod.key(), error = %e, "could not mark the lent pod as told; telling its user all the same");
        }
    }
    actions::note_pod(ctx, &at, "BookingStartedRestart", message, "Notify").await;
    ctx.metrics.action("booking_started_on_lent_pod", "done");
    let report = AuditReport {
        action: "controller.booking_started_on_lent_pod".into(),
        subject: Some(pod.key()),
        user: Some(user),
        booking_id: Some(booking.id),
        details,
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
            restart_told: Vec::new(),
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

    /// A course member's lent pod of `name`, started `minutes_ago`.
    fn member_pod(name: &str, user: &str, minutes_ago: i64) -> PodInfo {
        let mut p = pod(name, Priority::Low, None, None);
        p.user = Some(user.into());
        p.started = Some(now() - TimeDelta::minutes(minutes_ago));
        p
    }

    fn occurrence(units: u32) -> Booking {
        let mut b = booking(40, BookingStatus::Active, now() + TimeDelta::hours(1));
        b.user = " course 3 group 2".into();
        b.units = units;
        b.start = now() - TimeDelta::seconds(1);
        b
    }

    fn tell<'a>(
        pods: &'a HashMap<String, PodInfo>,
        occurrence: &Booking,
        told: &[Told],
    ) -> Vec<&'a str> {
        let members: BTreeSet<String> = ["ann", "ben", "cy", "dee"].map(String::from).into();
        let session = Session {
            occurrence,
            members: &members,
            names: NameCase::Lowercase,
        };
        course_pods_to_tell(pods, &session, &|user| user == "dee", told, now(), &|_| {
            None
        })
        .into_iter()
        .map(|p| p.name.as_str())
        .collect()
    }

    fn by_uid(pods: impl IntoIterator<Item = PodInfo>) -> HashMap<String, PodInfo> {
        pods.into_iter().map(|p| (p.uid.clone(), p)).collect()
    }

    #[test]
    fn a_course_s_members_are_told_up_to_its_free_places_first_come_first() {
        let mut other_model = member_pod("cy-t4", "cy", 50);
        other_model.model_label = Some("t4".into());
        let pods = by_uid([
            member_pod("ben", "Ben", 10),
            member_pod("ann", "ann", 30),
            member_pod("cy", "cy", 5),
            // Not a member; a member with a booking of her own; another model.
            member_pod("eve", "eve", 60),
            member_pod("dee", "dee", 60),
            other_model,
        ]);
        // Two places: the two members whose pods started first (names compared as
        // the service normalises them: `Ben` is `ben`).
        assert_eq!(tell(&pods, &occurrence(2), &[]), ["ann", "ben"]);
        assert_eq!(tell(&pods, &occurrence(5), &[]), ["ann", "ben", "cy"]);
        // Nobody before the occurrence starts, or after it ends.
        let mut later = occurrence(2);
        later.start = now() + TimeDelta::minutes(1);
        assert!(tell(&pods, &later, &[]).is_empty());
        let mut ended = occurrence(2);
        ended.end = now();
        assert!(tell(&pods, &ended, &[]).is_empty());
    }

    #[test]
    fn places_taken_by_booked_pods_and_told_members_are_not_offered_again() {
        let mut pods = by_uid([
            member_pod("ann", "ann", 30),
            member_pod("ben", "ben", 10),
            member_pod("cy", "cy", 5),
        ]);
        // A pod already booked on the occurrence holds one of its 2 units.
        let mut on_session = pod("dan-booked", Priority::High, Some(40), Some(now()));
        on_session.user = Some("dan".into());
        on_session.booking_units = Some(2);
        pods.insert(on_session.uid.clone(), on_session);
        assert_eq!(tell(&pods, &occurrence(2), &[]), ["ann"]);
        // Ann was told and has not restarted yet: her place stays hers, and she is
        // not told twice.
        let mut told = vec![told_of(&pods["uid-ann"], NameCase::Lowercase)];
        assert!(tell(&pods, &occurrence(2), &told).is_empty());
        // She restarts: while her lent pod goes and her new one is not there yet,
        // the place is still hers.
        pods.get_mut("uid-ann").unwrap().deleting = true;
        mark_gone(&mut told, &pods, now());
        assert_eq!(told[0].gone_at, Some(now()));
        pods.remove("uid-ann");
        assert!(tell(&pods, &occurrence(2), &told).is_empty());
        // Her pod came back booked on the occurrence: every place is booked.
        let mut back = pod("ann-booked", Priority::High, Some(40), Some(now()));
        back.user = Some("ann".into());
        back.booking_units = Some(2);
        pods.insert(back.uid.clone(), back);
        assert!(tell(&pods, &occurrence(2), &told).is_empty());
        // Her booked pod ends: the place goes to the next member.
        pods.remove("uid-ann-booked");
        let mut later = told.clone();
        later[0].gone_at = Some(now() - RESTART_GRACE);
        assert_eq!(tell(&pods, &occurrence(2), &later), ["ben"]);
        // Gone without coming back: hers for the grace, then the next member's.
        assert!(tell(&pods, &occurrence(2), &told).is_empty());
    }

    #[test]
    fn a_pod_needing_more_units_than_are_left_is_passed_over_for_a_smaller_one() {
        let mut big = member_pod("ann", "ann", 30);
        big.gpu = Some(GpuUse {
            units: 2,
            model: None,
        });
        let pods = by_uid([big, member_pod("ben", "ben", 10)]);
        assert_eq!(tell(&pods, &occurrence(1), &[]), ["ben"]);
        assert_eq!(tell(&pods, &occurrence(3), &[]), ["ann", "ben"]);
    }

    #[test]
    fn a_member_an_earlier_leader_told_keeps_the_place_and_is_not_told_again() {
        // Occurrence 40's one place: ann was told by the leader before (her pod
        // carries the mark); ben's pod carries a mark of another booking, and cy's
        // pod, marked too, has ended.
        let mut ann = member_pod("ann", "ann", 30);
        ann.restart_told = vec![7, 40];
        let mut ben = member_pod("ben", "ben", 40);
        ben.restart_told = vec![7];
        let mut cy = member_pod("cy", "cy", 50);
        cy.restart_told = vec![40];
        cy.finished = true;
        let pods = by_uid([ann, ben, cy]);
        let mut told = Vec::new();
        recall_told(&mut told, &pods, 40, NameCase::Lowercase);
        assert_eq!(told, [told_of(&pods["uid-ann"], NameCase::Lowercase)]);
        assert!(tell(&pods, &occurrence(1), &told).is_empty());
        // Recalled once, whatever the rounds.
        recall_told(&mut told, &pods, 40, NameCase::Lowercase);
        assert_eq!(told.len(), 1);
        // Without the mark, ben (whose pod started first) would have been told.
        let mut unmarked = Vec::new();
        recall_told(&mut unmarked, &pods, 41, NameCase::Lowercase);
        assert!(unmarked.is_empty());
        assert_eq!(tell(&pods, &occurrence(1), &unmarked), ["ben"]);
    }

    #[test]
    fn the_told_mark_keeps_the_newest_bookings_once_each() {
        let mut p = member_pod("ann", "ann", 30);
        assert_eq!(restart_told_value(&p, 40), "40");
        p.restart_told = vec![40, 3];
        assert_eq!(restart_told_value(&p, 40), "3,40");
        p.restart_told = (1..=RESTART_TOLD_KEPT as i64).collect();
        let value = restart_told_value(&p, 99);
        assert_eq!(value.split(',').count(), RESTART_TOLD_KEPT, "{value}");
        assert!(value.starts_with("2,") && value.ends_with(",99"), "{value}");
    }

    #[test]
    fn the_course_notice_names_the_course_its_end_and_how_its_gpus_are_shared() {
        let course = CourseNotice {
            hold: HoldRef::from_user(" course 3 group 2").unwrap(),
            title: Some("ML101".into()),
        };
        let mut occ = occurrence(2);
        occ.model = "a6000".into();
        let text = course_message(&course, &occ);
        assert!(
            text.contains("your course ML101's session on a6000 has started"),
            "{text}"
        );
        assert!(
            text.contains("Restart it (stop and start your server) to run on the course's GPUs until 2030-01-07T13:00:00Z"),
            "{text}"
        );
        assert!(
            text.contains("the course's 2 GPUs go to the first 2 members' pods"),
            "{text}"
        );
        let untitled = CourseNotice {
            title: None,
            ..course
        };
        let text = course_message(&untitled, &occurrence(1));
        assert!(
            text.contains("your course's session on a100 has started"),
            "{text}"
        );
        assert!(
            text.contains("the course's GPU goes to the first member's pod"),
            "{text}"
        );
        assert!(text.chars().count() <= 1000, "an Event's note holds 1000");
    }
}
