//! The loop's booking follower: the leader follows the booking service's change
//! stream, keeps the current bookings, re-times booked pods whose booking's end
//! moved, and tells users of lent pods when a booking of that model starts, or the
//! members of a course when its occurrence runs. The plans are [`crate::follow`]'s.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_client::{Booking, Followed};
use gpu_booking_core::holds::{HoldKind, HoldRef};
use gpu_booking_core::username::NameCase;
use tokio::sync::mpsc;

use crate::actions::Ctx;
use crate::follow;
use crate::pods::PodInfo;

/// (booking, pod) notices remembered; past this the memory starts over (an Event
/// may then repeat).
const MAX_TOLD: usize = 10_000;
/// While a course's occurrence runs, its group's members are read again this
/// often (a member added during the session is told too).
const MEMBERS_REFRESH: TimeDelta = TimeDelta::seconds(60);
/// ... and this soon when a running occurrence's group or title is not among what
/// was read (read just before the service saw it start, or a failed read).
const MEMBERS_RETRY: TimeDelta = TimeDelta::seconds(5);

/// The courses' members and titles, as last read from the booking service on a
/// task of their own (the loop never waits on the network).
#[derive(Debug, Default)]
struct Courses {
    /// Group -> its members (normalised as `names` says), for the groups with an
    /// occurrence running when read.
    members: HashMap<i64, BTreeSet<String>>,
    names: NameCase,
    /// When the members were last read, or a read of them failed.
    read_at: Option<DateTime<Utc>>,
    reading: bool,
    /// Reservation (hold id) -> its title (`None`: it could not be read; the
    /// notices go without it until the next read).
    titles: HashMap<i64, Option<String>>,
}

/// What the follower reads of the other parts: the pods, whether they are all
/// listed, and the nodes' labels (the model of a lent pod's node).
pub(super) struct Cluster<'a> {
    pub(super) pods: &'a HashMap<String, PodInfo>,
    pub(super) pods_synced: bool,
    pub(super) node_labels: &'a HashMap<String, BTreeMap<String, String>>,
}

pub(super) struct Follower {
    ctx: Arc<Ctx>,
    /// The node label that names a node's model.
    model_node_label: String,
    /// `--booking-relist-after`.
    relist_after: std::time::Duration,
    /// Following the booking change stream (the leader only).
    following: Option<(tokio::task::JoinHandle<()>, mpsc::Receiver<Followed>)>,
    /// The current bookings as the stream last said, once listed (pods are checked
    /// against it as they change too).
    bookings: Option<HashMap<i64, Booking>>,
    /// A listing that came before the pods were read: applied once they are.
    listed_at: Option<chrono::DateTime<chrono::Utc>>,
    /// (booking, pod) pairs whose user was told to restart a lent pod.
    told: HashSet<(i64, String)>,
    /// Current bookings already seen running (their lent pods looked at).
    started_seen: HashSet<i64>,
    /// Course occurrence -> the lent pods whose members were told of it.
    course_told: HashMap<i64, Vec<follow::Told>>,
    /// Pods whose `terminate-at` is being written, and to what.
    retiming: Arc<std::sync::Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>>,
    /// The running courses' members and titles.
    courses: Arc<Mutex<Courses>>,
}

impl Follower {
    pub(super) fn new(
        ctx: Arc<Ctx>,
        model_node_label: String,
        relist_after: std::time::Duration,
    ) -> Self {
        Self {
            ctx,
            model_node_label,
            relist_after,
            following: None,
            bookings: None,
            listed_at: None,
            told: HashSet::new(),
            started_seen: HashSet::new(),
            course_told: HashMap::new(),
            retiming: Arc::default(),
            courses: Arc::default(),
        }
    }

    fn leader(&self) -> bool {
        self.ctx.leadership.is_leader()
    }

    pub(super) fn start_following(&mut self) {
        if self.following.is_none() {
            self.bookings = None;
            self.following = follow::spawn(self.ctx.clone(), self.relist_after);
        }
    }

    /// Stops following (leadership lost). What was told is forgotten too: each pod
    /// told carries its mark ([`follow::restart_told_value`]), which whoever leads
    /// next reads, and a notice this replica dropped when it stopped leading (its
    /// mark unwritten) is given when it leads again.
    pub(super) fn stop_following(&mut self) {
        if let Some((task, _)) = self.following.take() {
            task.abort();
        }
        self.bookings = None;
        self.listed_at = None;
        self.told.clear();
        self.started_seen.clear();
        self.course_told.clear();
    }

    /// The follower's next step, or never when not following.
    pub(super) async fn next_step(&mut self) -> Option<Followed> {
        match &mut self.following {
            Some((_, rx)) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    pub(super) fn on_followed(&mut self, step: Followed, cluster: &Cluster<'_>) {
        let now = self.ctx.clock.now();
        let changed = match step {
            Followed::Listed(bookings) => {
                // A listing holds the bookings that ended lately too: they go to the
                // plan as changed (over), so that their pods end at once whatever
                // their age, as if the stream had brought their end.
                let (over, current): (Vec<_>, Vec<_>) =
                    bookings.into_iter().partition(Booking::is_over);
                self.bookings = Some(current.into_iter().map(|b| (b.id, b)).collect());
                self.listed_at = Some(now);
                over
            }
            Followed::Changed(changes) => {
                let changed: Vec<_> = changes.into_iter().map(|c| c.booking).collect();
                if let Some(current) = &mut self.bookings {
                    for b in &changed {
                        if b.is_over() {
                            current.remove(&b.id);
                        } else {
                            current.insert(b.id, b.clone());
                        }
                    }
                }
                changed
            }
            Followed::Failed(_) => return,
        };
        self.reconcile_bookings(changed, cluster);
    }

    /// Re-times booked pods against the bookings (after a listing, every booked pod;
    /// else those of `changed`), and tells users of lent pods whose booking started.
    pub(super) fn reconcile_bookings(&mut self, changed: Vec<Booking>, cluster: &Cluster<'_>) {
        if !self.leader() || !cluster.pods_synced {
            return;
        }
        let Some(current) = &self.bookings else {
            return;
        };
        let now = self.ctx.clock.now();
        let (bookings, listed_at): (Vec<_>, _) = match self.listed_at.take() {
            Some(at) => (current.values().cloned().chain(changed).collect(), Some(at)),
            None => (changed, None),
        };
        let retimes = follow::plan(cluster.pods.values(), &bookings, listed_at, now);
        for r in retimes {
            self.spawn_retime(r);
        }
        self.tell_lent(&bookings, now, cluster);
    }

    /// Tells the users of lent pods whose booking of that model runs now, once per
    /// booking and pod.
    fn tell_lent(
        &mut self,
        bookings: &[Booking],
        now: chrono::DateTime<chrono::Utc>,
        cluster: &Cluster<'_>,
    ) {
        let mut notices = Vec::new();
        let (labels, key) = (cluster.node_labels, &self.model_node_label);
        let node_model = |node: &str| labels.get(node).and_then(|l| l.get(key)).cloned();
        for b in bookings {
            for pod in follow::lent_pods_of(cluster.pods, b, now, &node_model) {
                if self.told.len() >= MAX_TOLD {
                    self.told.clear();
                }
                // A pod an earlier leader told is marked so.
                let new = self.told.insert((b.id, pod.uid.clone()));
                if new && !pod.restart_told.contains(&b.id) {
                    notices.push((pod.clone(), b.clone()));
                }
            }
        }
        for (pod, booking) in notices {
            let ctx = self.ctx.clone();
            tokio::spawn(async move { follow::tell_restart(&ctx, &pod, &booking).await });
        }
    }

    /// Planned bookings that have started by the clock since the last look: their
    /// users' lent pods (the stream says nothing when a booking starts). And every
    /// course occurrence running: its members' lent pods, as places free up.
    pub(super) fn notice_started_bookings(&mut self, cluster: &Cluster<'_>) {
        if !self.leader() || !cluster.pods_synced {
            return;
        }
        let Some(current) = &self.bookings else {
            return;
        };
        let now = self.ctx.clock.now();
        self.started_seen.retain(|id| current.contains_key(id));
        let started: Vec<_> = current
            .values()
            .filter(|b| b.start <= now && now < b.end && !self.started_seen.contains(&b.id))
            .cloned()
            .collect();
        self.tell_course_members(now, cluster);
        if started.is_empty() {
            return;
        }
        self.started_seen.extend(started.iter().map(|b| b.id));
        self.tell_lent(&started, now, cluster);
    }

    /// Tells the members of each course whose occurrence runs at `now` with a lent
    /// pod of its model, at most as many as the occurrence has places left
    /// ([`follow::course_pods_to_tell`]), once per occurrence and pod. Looked at
    /// every second (level-triggered: a place given back is offered to the next
    /// member), from the members and titles last read.
    fn tell_course_members(&mut self, now: DateTime<Utc>, cluster: &Cluster<'_>) {
        let Some(current) = &self.bookings else {
            return;
        };
        let sessions: Vec<(Booking, HoldRef)> = current
            .values()
            .filter(|b| b.start <= now && now < b.end && !b.is_over())
            .filter_map(|b| {
                let hold = HoldRef::from_user(&b.user)?;
                (hold.kind == HoldKind::Course && hold.group.is_some()).then(|| (b.clone(), hold))
            })
            .collect();
        // What was told of occurrences no longer running, or of pods gone for good,
        // is forgotten (a pod's uid never comes back).
        self.course_told
            .retain(|id, _| sessions.iter().any(|(b, _)| b.id == *id));
        for told in self.course_told.values_mut() {
            follow::mark_gone(told, cluster.pods, now);
            told.retain(|t| t.gone_at.is_none_or(|at| now - at < follow::RESTART_GRACE));
        }
        if sessions.is_empty() {
            return;
        }
        // A member with a running booking of their own is admitted against it.
        let own: HashSet<&str> = current
            .values()
            .filter(|b| b.start <= now && now < b.end && HoldRef::from_user(&b.user).is_none())
            .map(|b| b.user.as_str())
            .collect();
        let (labels, key) = (cluster.node_labels, &self.model_node_label);
        let node_model = |node: &str| labels.get(node).and_then(|l| l.get(key)).cloned();
        let mut notices = Vec::new();
        {
            let mut courses = self.courses.lock().unwrap_or_else(|e| e.into_inner());
            let missing = sessions.iter().any(|(_, h)| {
                h.group.is_some_and(|g| !courses.members.contains_key(&g))
                    || !courses.titles.contains_key(&h.id)
            });
            let wait = if missing {
                MEMBERS_RETRY
            } else {
                MEMBERS_REFRESH
            };
            if !courses.reading && courses.read_at.is_none_or(|at| now - at >= wait) {
                courses.reading = true;
                let holds: Vec<i64> = sessions
                    .iter()
                    .map(|(_, h)| h.id)
                    .filter(|id| courses.titles.get(id).is_none_or(Option::is_none))
                    .collect();
                self.spawn_read_courses(holds);
            }
            for (occurrence, hold) in &sessions {
                let Some(members) = hold.group.and_then(|g| courses.members.get(&g)) else {
                    continue;
                };
                let session = follow::Session {
                    occurrence,
                    members,
                    names: courses.names,
                };
                let told = self.course_told.entry(occurrence.id).or_default();
                follow::recall_told(told, cluster.pods, occurrence.id, courses.names);
                let pods = follow::course_pods_to_tell(
                    cluster.pods,
                    &session,
                    &|user| own.contains(user),
                    told,
                    now,
                    &node_model,
                );
                let course = follow::CourseNotice {
                    hold: *hold,
                    title: courses.titles.get(&hold.id).cloned().flatten(),
                };
                for pod in pods {
                    let record = follow::told_of(pod, courses.names);
                    notices.push((record, pod.clone(), occurrence.clone(), course.clone()));
                }
            }
            // Titles of reservations no longer running are read again if they run.
            let running: HashSet<i64> = sessions.iter().map(|(_, h)| h.id).collect();
            courses.titles.retain(|id, _| running.contains(id));
        }
        for (record, pod, occurrence, course) in notices {
            self.course_told
                .entry(occurrence.id)
                .or_default()
                .push(record);
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                follow::tell_course_restart(&ctx, &pod, &occurrence, &course).await
            });
        }
    }

    /// Reads the running courses' members (the admission state's figures) and the
    /// titles of reservations `holds`, into [`Courses`].
    fn spawn_read_courses(&self, holds: Vec<i64>) {
        let (ctx, courses) = (self.ctx.clone(), self.courses.clone());
        tokio::spawn(async move {
            let figures = ctx.booking.admission_figures().await;
            let mut titles = Vec::new();
            for id in holds {
                match ctx.booking.course_title(id).await {
                    Ok(t) => titles.push((id, Some(t.title))),
                    Err(e) => {
                        titles.push((id, None));
                        ctx.metrics.error("booking");
                        tracing::warn!(reservation = id, error = %e, "could not read the course's title");
                    }
                }
            }
            let mut courses = courses.lock().unwrap_or_else(|e| e.into_inner());
            courses.reading = false;
            courses.read_at = Some(ctx.clock.now());
            courses.titles.extend(titles);
            match figures {
                Ok(state) => {
                    courses.names = state.names;
                    courses.members = state
                        .groups
                        .into_iter()
                        .map(|g| (g.group, g.members.into_iter().collect()))
                        .collect();
                }
                Err(e) => {
                    ctx.metrics.error("booking");
                    tracing::warn!(error = %e, "could not read the courses' members");
                }
            }
        });
    }

    /// A booked pod that changed: its end against its booking's, if known (a pod
    /// admitted on a stale answer, or re-timed out of order, is put right).
    pub(super) fn check_booking_of(&self, info: &PodInfo, pods_synced: bool) {
        if !self.leader() || !pods_synced {
            return;
        }
        let (Some(current), Some(id)) = (&self.bookings, info.booking_id) else {
            return;
        };
        let Some(booking) = current.get(&id) else {
            return;
        };
        let now = self.ctx.clock.now();
        for r in follow::plan([info], std::slice::from_ref(booking), None, now) {
            self.spawn_retime(r);
        }
    }

    /// Re-times a pod on its own task, unless the same is on its way already (pod
    /// events keep coming while the patch is written).
    fn spawn_retime(&self, r: follow::Retime) {
        {
            let mut going = self.retiming.lock().unwrap_or_else(|e| e.into_inner());
            if going.get(&r.uid) == Some(&r.to) {
                return;
            }
            going.insert(r.uid.clone(), r.to);
        }
        let (ctx, going) = (self.ctx.clone(), self.retiming.clone());
        tokio::spawn(async move {
            follow::retime(&ctx, &r).await;
            let mut going = going.lock().unwrap_or_else(|e| e.into_inner());
            if going.get(&r.uid) == Some(&r.to) {
                going.remove(&r.uid);
            }
        });
    }
}
