//! The webhook's replica of what it decides on: the bookings that matter
//! now (running, planned, and each user's last ended one for the cooldown), the
//! users' label slugs, and the per-model figures (free units, VRAM budgets, when the
//! controller last reported usage), so that an admission is answered from memory.
//!
//! The booking service sends an [`AdmissionState`] (`GET /api/v1/admission-state`):
//! the whole of it at the start and after a lost resume point, its figures alone
//! every second or so; booking changes come through the change stream and are
//! applied with [`Replica::apply_booking`]. [`Replica::answer`] then gives exactly
//! the [`Schedulability`] that `GET /api/v1/schedulability` would: the same slug
//! resolution, the same active booking, the same earliest starts (by
//! [`crate::next_start::earliest_start`], as `/me/next-start` computes them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use chrono::{DateTime, TimeDelta, Utc};

use super::Schedulability;
use crate::booking_policy::Policy;
use crate::gpu_model::ModelName;
use crate::holds::{self, HoldRef};
use crate::next_start::{self, NextStart};
use crate::rules;
use crate::username::{slugs, NameCase, SlugMatch, Username};
use crate::window::Window;
pub use crate::wire::admission_state::{
    AdmissionState, BookingState, GroupMembers, KnownUser, ModelState, PolicyState,
};
use crate::wire::offers::Offer;
use crate::wire::ActiveBooking;

/// Whom an admission asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query<'a> {
    /// A raw user name (`?user=`).
    User(&'a str),
    /// A KubeSpawner label (`?slug=`).
    Slug(&'a str),
    /// Nobody: the free units only.
    Anonymous,
}

impl<'a> Query<'a> {
    /// From the `(kind, value)` of [`super::Identity::query`]; `("", "")`: anonymous.
    pub fn of(kind: &str, value: &'a str) -> Self {
        match kind {
            "user" => Query::User(value),
            "slug" => Query::Slug(value),
            _ => Query::Anonymous,
        }
    }
}

/// A query the service would refuse (HTTP 422).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// The answer, and the users of an ambiguous slug (the service audits those).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub schedulability: Schedulability,
    pub ambiguous: Option<Vec<String>>,
}

/// The replica. Pure: the webhook feeds it and asks it under a lock.
#[derive(Debug, Clone)]
pub struct Replica {
    names: NameCase,
    policy: Policy,
    models: Vec<ModelState>,
    held: BTreeMap<i64, u64>,
    /// GPUs offered back and held for their users (every answer carries those
    /// still held).
    offers: Vec<Offer>,
    /// Group -> its members, for the groups with a course occurrence running.
    groups: HashMap<i64, BTreeSet<String>>,
    bookings: BTreeMap<i64, BookingState>,
    /// User -> the ids of their bookings (an admission looks at one user's).
    by_user: HashMap<String, BTreeSet<i64>>,
    /// Lookup key (name, escape slug, safe slug) -> the users it names.
    keys: HashMap<String, BTreeSet<String>>,
    /// Model -> its bookings by start, for the capacity question of an unbooked
    /// user: it reads the bookings that can overlap a window, not all of them.
    by_model: HashMap<String, ModelBookings>,
    /// (end, id) of every booking: a prune reads only those that ended since the last.
    by_end: BTreeSet<(DateTime<Utc>, i64)>,
    /// The ids of the bookings that are holds' rows (maintenance windows, course
    /// occurrences): few, and read at every answer.
    holds: BTreeSet<i64>,
    /// The time of the last prune: every user's bookings that ended by then, but
    /// their last, are gone.
    pruned_through: Option<DateTime<Utc>>,
}

/// One model's bookings by (start, id), with their end and units (read without a
/// lookup of each booking), and the longest of them: a booking that overlaps a
/// window starts at most that long before the window does.
#[derive(Debug, Clone, Default)]
struct ModelBookings {
    by_start: BTreeMap<(DateTime<Utc>, i64), (DateTime<Utc>, u32)>,
    /// Only ever grows (a bound, not the exact longest): shrinking it would mean
    /// reading every booking of the model when the longest goes.
    longest: TimeDelta,
}

impl Replica {
    /// A replica from a full answer; `None` when the answer is not a full one.
    pub fn from_state(state: AdmissionState) -> Option<Self> {
        let mut replica = Replica {
            names: state.names,
            policy: state.policy.policy(),
            models: Vec::new(),
            held: BTreeMap::new(),
            offers: Vec::new(),
            groups: HashMap::new(),
            bookings: BTreeMap::new(),
            by_user: HashMap::new(),
            keys: HashMap::new(),
            by_model: HashMap::new(),
            by_end: BTreeSet::new(),
            holds: BTreeSet::new(),
            pruned_through: None,
        };
        replica.apply_figures(&state);
        for user in state.users? {
            for key in [&user.name, &user.escape_slug, &user.safe_slug] {
                replica
                    .keys
                    .entry(key.clone())
                    .or_default()
                    .insert(user.name.clone());
            }
        }
        for booking in state.bookings? {
            replica.apply_booking(booking);
        }
        Some(replica)
    }

    /// Takes the figures of an answer (full or not): rules, models, units held,
    /// offers.
    pub fn apply_figures(&mut self, state: &AdmissionState) {
        self.names = state.names;
        self.policy = state.policy.policy();
        self.models = state.models.clone();
        self.held = state.held.clone();
        self.offers = state.offers.clone();
        self.groups = state
            .groups
            .iter()
            .map(|g| (g.group, g.members.iter().cloned().collect()))
            .collect();
    }

    /// The user of the one offer held at `now` whose user's KubeSpawner slugs
    /// include `slug`.
    fn offered_by_slug(&self, slug: &str, now: DateTime<Utc>) -> Option<String> {
        let mut users = self
            .offers
            .iter()
            .filter(|o| o.holds_at(now))
            .filter(|o| {
                let s = slugs(&o.user);
                s.escape == slug || s.safe == slug
            })
            .map(|o| o.user.clone());
        match (users.next(), users.next()) {
            (Some(user), None) => Some(user),
            _ => None,
        }
    }

    /// The offers still holding units at `now`.
    fn offers_at(&self, now: DateTime<Utc>) -> Vec<Offer> {
        self.offers
            .iter()
            .filter(|o| o.holds_at(now))
            .cloned()
            .collect()
    }

    /// A booking created or changed (as it is now). The user becomes known by
    /// name and slugs, as the service records them with the first booking.
    pub fn apply_booking(&mut self, booking: BookingState) {
        if !self
            .keys
            .get(&booking.user)
            .is_some_and(|u| u.contains(&booking.user))
        {
            // A hold's user is recorded with its name as its slugs (a space, which
            // no pod label holds): no label finds it.
            let keys = if HoldRef::from_user(&booking.user).is_some() {
                vec![booking.user.clone()]
            } else {
                let s = slugs(&booking.user);
                vec![booking.user.clone(), s.escape, s.safe]
            };
            for key in keys {
                self.keys
                    .entry(key)
                    .or_default()
                    .insert(booking.user.clone());
            }
        }
        self.remove_booking(booking.id);
        self.by_user
            .entry(booking.user.clone())
            .or_default()
            .insert(booking.id);
        let model = self.by_model.entry(booking.model.clone()).or_default();
        model
            .by_start
            .insert((booking.start, booking.id), (booking.end, booking.units));
        model.longest = model.longest.max(booking.end - booking.start);
        self.by_end.insert((booking.end, booking.id));
        if HoldRef::from_user(&booking.user).is_some() {
            self.holds.insert(booking.id);
        }
        let user = booking.user.clone();
        self.bookings.insert(booking.id, booking);
        // A booking that ends later than the user's last ended one (or one that now
        // ends before the last prune) leaves an ended booking that a prune has
        // already walked past.
        if let Some(through) = self.pruned_through {
            self.prune_user(&user, through);
        }
    }

    /// A booking cancelled: it no longer counts anywhere.
    pub fn remove_booking(&mut self, id: i64) {
        let Some(old) = self.bookings.remove(&id) else {
            return;
        };
        if let Some(ids) = self.by_user.get_mut(&old.user) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_user.remove(&old.user);
            }
        }
        if let Some(model) = self.by_model.get_mut(&old.model) {
            model.by_start.remove(&(old.start, id));
            if model.by_start.is_empty() {
                self.by_model.remove(&old.model);
            }
        }
        self.by_end.remove(&(old.end, id));
        self.holds.remove(&id);
    }

    /// The course occurrence running at `now` (the earliest started) of a group
    /// that `user` is a member of.
    fn course_of(&self, user: &str, now: DateTime<Utc>) -> Option<&BookingState> {
        if self.groups.is_empty() {
            return None;
        }
        self.holds
            .iter()
            .filter_map(|id| self.bookings.get(id))
            .filter(|b| b.start <= now && now < b.end)
            .filter(|b| {
                HoldRef::from_user(&b.user).is_some_and(|h| {
                    h.kind == holds::HoldKind::Course
                        && h.group
                            .and_then(|g| self.groups.get(&g))
                            .is_some_and(|m| m.contains(user))
                })
            })
            .min_by_key(|b| (b.start, b.id))
    }

    /// The units each model's maintenance windows block at `now`.
    fn maintenance_at(&self, now: DateTime<Utc>) -> BTreeMap<String, u64> {
        holds::maintenance_at(
            self.holds
                .iter()
                .filter_map(|id| self.bookings.get(id))
                .map(BookingState::hold_row),
            now,
        )
    }

    /// The bookings of `user`.
    fn of_user<'a>(&'a self, user: &str) -> impl Iterator<Item = &'a BookingState> + 'a {
        self.by_user
            .get(user)
            .into_iter()
            .flatten()
            .filter_map(|id| self.bookings.get(id))
    }

    /// Forgets ended bookings that no rule can see any more: all but each user's
    /// last ended one. The cooldown counts from the latest end; while a planned
    /// booking ends later that one is it, but a cancellation hands the role back to
    /// the last ended booking (keeping only the latest booking of all would lose
    /// that cooldown; the proptest below fails with that rule). It reads only the
    /// bookings that ended since the last prune, so that it can run at every
    /// refresh without holding the replica for a walk over all of them, which every
    /// admission's read would wait for (docs/webhook.md, "Performance").
    pub fn prune(&mut self, now: DateTime<Utc>) {
        if self.pruned_through.is_some_and(|through| now <= through) {
            return;
        }
        let after = self.pruned_through.unwrap_or(DateTime::<Utc>::MIN_UTC);
        let ended = (
            Bound::Excluded((after, i64::MAX)),
            Bound::Included((now, i64::MAX)),
        );
        let users: BTreeSet<String> = self
            .by_end
            .range(ended)
            .filter_map(|(_, id)| self.bookings.get(id))
            .map(|b| b.user.clone())
            .collect();
        for user in &users {
            self.prune_user(user, now);
        }
        self.pruned_through = Some(now);
    }

    /// Forgets `user`'s bookings that ended by `through`, but the last of them.
    fn prune_user(&mut self, user: &str, through: DateTime<Utc>) {
        let Some(last) = self
            .of_user(user)
            .filter(|b| b.end <= through)
            .max_by_key(|b| (b.end, b.id))
        else {
            return;
        };
        let last = last.id;
        let gone: Vec<i64> = self
            .of_user(user)
            .filter(|b| b.end <= through && b.id != last)
            .map(|b| b.id)
            .collect();
        for id in gone {
            self.remove_booking(id);
        }
    }

    /// The booking with `id`, as the replica holds it.
    pub fn booking(&self, id: i64) -> Option<&BookingState> {
        self.bookings.get(&id)
    }

    pub fn bookings(&self) -> usize {
        self.bookings.len()
    }

    /// What `GET /api/v1/schedulability` answers for `query` at `now`.
    pub fn answer(&self, query: Query<'_>, now: DateTime<Utc>) -> Result<Answer, Invalid> {
        enum Owner {
            Anonymous,
            User(String),
            Unknown,
            Ambiguous,
        }
        let mut ambiguous = None;
        let owner = match query {
            Query::User(user) => {
                let user = Username::normalised(user, self.names)
                    .map_err(|e| Invalid(format!("user: {e}")))?;
                Owner::User(user.into_inner())
            }
            Query::Slug(slug) => {
                if slug.is_empty() || slug.len() > 256 || slug.chars().any(char::is_control) {
                    return Err(Invalid("slug must be 1 to 256 printable characters".into()));
                }
                let users = self
                    .keys
                    .get(slug)
                    .map(|u| u.iter().cloned().collect())
                    .unwrap_or_default();
                match SlugMatch::of(users) {
                    // A user the service does not know yet (no booking) may still be
                    // the one a GPU is offered back to: their spawn takes it.
                    SlugMatch::Nobody => match self.offered_by_slug(slug, now) {
                        Some(user) => Owner::User(user),
                        None => Owner::Unknown,
                    },
                    SlugMatch::One(user) => Owner::User(user),
                    SlugMatch::Ambiguous(users) => {
                        ambiguous = Some(users);
                        Owner::Ambiguous
                    }
                }
            }
            Query::Anonymous => Owner::Anonymous,
        };
        let active = match &owner {
            Owner::User(user) => self
                .of_user(user)
                .filter(|b| b.start <= now && b.end > now)
                .min_by_key(|b| (b.start, b.id)),
            _ => None,
        };
        // Without a booking of their own, a member of a course running now is
        // booked against its occurrence: the occurrence's units are theirs, shared
        // by all its members' pods.
        let course = match (&owner, active) {
            (Owner::User(user), None) => self.course_of(user, now),
            _ => None,
        };
        if let Some(b) = active.or(course) {
            let units_held = self.held.get(&b.id).copied().unwrap_or(0);
            let mut booking = active_booking(b, units_held);
            if let Owner::User(user) = &owner {
                booking.user = user.clone();
            }
            let mut answer = Schedulability::booked(&self.models, booking);
            answer.course = active.is_none();
            answer.offers = self.offers_at(now);
            holds::withhold(&mut answer.free, &self.maintenance_at(now));
            return Ok(Answer {
                schedulability: answer,
                ambiguous,
            });
        }
        let own: Option<Vec<Window>> = match &owner {
            Owner::User(user) => Some(
                self.of_user(user)
                    .filter_map(BookingState::window)
                    .collect(),
            ),
            Owner::Unknown => Some(Vec::new()),
            Owner::Anonymous | Owner::Ambiguous => None,
        };
        let mut earliest_booking_by_model = BTreeMap::new();
        if let Some(own) = own {
            for m in &self.models {
                if let Some(next) = self.earliest_start(m, now, &own) {
                    earliest_booking_by_model.insert(m.name.clone(), next.start);
                }
            }
        }
        let user = match owner {
            Owner::User(user) => Some(user),
            _ => None,
        };
        let mut answer = Schedulability::unbooked(&self.models, user, earliest_booking_by_model);
        answer.offers = self.offers_at(now);
        holds::withhold(&mut answer.free, &self.maintenance_at(now));
        Ok(Answer {
            schedulability: answer,
            ambiguous,
        })
    }

    /// The earliest start of a booking of the policy's shortest length on model `m`
    /// for a user whose bookings are `own`, reading the model's bookings up to a
    /// horizon that widens until the answer stands (as the service reads them for
    /// `/me/next-start`), not every booking the replica holds.
    fn earliest_start(
        &self,
        m: &ModelState,
        now: DateTime<Utc>,
        own: &[Window],
    ) -> Option<NextStart> {
        let duration = TimeDelta::days(next_start::default_days(&self.policy));
        let (from, _) = rules::earliest_start_for_user(&self.policy, now, own);
        let ask = |booked: &[Window]| {
            next_start::earliest_start(
                &self.policy,
                now,
                own,
                m.name.as_str(),
                m.units,
                1,
                booked,
                duration,
            )
            .ok()
        };
        // As the service does: when the bookings over the user's earliest window
        // leave a unit free even if all overlapped at once, no booking is in the way.
        let first = from
            .checked_add_signed(duration)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let overlapping = self.windows_between(m.name.as_str(), from, first).len();
        if next_start::free_throughout(m.units, 1, overlapping as u64) {
            return ask(&[]);
        }
        let mut horizon = next_start::first_horizon(from, duration);
        loop {
            let next = ask(&self.windows_between(m.name.as_str(), from, horizon))?;
            if next_start::settled_before(&next, duration, horizon) {
                return Some(next);
            }
            horizon = next_start::wider(from, horizon);
        }
    }

    /// The windows (one per unit) of `model`'s bookings that overlap
    /// `[from, horizon)`: those that start before `horizon`, no earlier than the
    /// model's longest booking before `from`, and end after `from`.
    fn windows_between(
        &self,
        model: &str,
        from: DateTime<Utc>,
        horizon: DateTime<Utc>,
    ) -> Vec<Window> {
        let Some(bookings) = self.by_model.get(model) else {
            return Vec::new();
        };
        let earliest = from
            .checked_sub_signed(bookings.longest)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let starts = (
            Bound::Included((earliest, i64::MIN)),
            Bound::Excluded((horizon, i64::MIN)),
        );
        let mut windows = Vec::new();
        for (&(start, _), &(end, units)) in bookings.by_start.range(starts) {
            if end > from {
                if let Ok(w) = Window::new(start, end) {
                    windows.extend(std::iter::repeat_n(w, units as usize));
                }
            }
        }
        windows
    }
}

/// `b` as the booking an admission is answered with.
fn active_booking(b: &BookingState, units_held: u64) -> ActiveBooking {
    ActiveBooking {
        id: b.id,
        until: b.end,
        model: ModelName::parse(&b.model).ok(),
        user: b.user.clone(),
        units: u64::from(b.units),
        units_held,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn now() -> DateTime<Utc> {
        t("2026-03-10T12:00:00Z")
    }

    fn model(name: &str, units: u32, free: u64) -> ModelState {
        ModelState {
            name: ModelName::parse(name).unwrap(),
            units,
            free,
            gpumem_mib: 40960,
            gpumem_advertised_mib: Some(81408),
            usage_reported_at: Some(now()),
        }
    }

    fn booking(id: i64, user: &str, start: &str, end: &str) -> BookingState {
        BookingState {
            id,
            user: user.into(),
            model: "a100".into(),
            units: 1,
            start: t(start),
            end: t(end),
        }
    }

    fn state(bookings: Vec<BookingState>, users: Vec<KnownUser>) -> AdmissionState {
        AdmissionState {
            at: now(),
            names: NameCase::Lowercase,
            policy: PolicyState::from(&Policy::default()),
            models: vec![model("a100", 2, 0)],
            held: BTreeMap::from([(1, 1)]),
            offers: Vec::new(),
            groups: Vec::new(),
            position: Some(10),
            bookings: Some(bookings),
            users: Some(users),
        }
    }

    fn user(name: &str) -> KnownUser {
        let s = slugs(name);
        KnownUser {
            name: name.into(),
            escape_slug: s.escape,
            safe_slug: s.safe,
        }
    }

    #[test]
    fn an_active_booking_answers_booked_by_name_and_by_either_slug() {
        let r = Replica::from_state(state(
            vec![booking(
                1,
                "alice@example.com",
                "2026-03-10T00:00:00Z",
                "2026-03-12T00:00:00Z",
            )],
            vec![user("alice@example.com")],
        ))
        .unwrap();
        for q in [
            Query::User("Alice@Example.com"),
            Query::Slug("alice-40example-2ecom"),
            Query::Slug("alice-example-com---ff8d9819"),
        ] {
            let a = r.answer(q, now()).unwrap().schedulability;
            assert!(a.schedulable, "{q:?}");
            assert_eq!(a.booking_id, Some(1));
            assert_eq!(a.units_held, Some(1));
            assert_eq!(a.until, Some(t("2026-03-12T00:00:00Z")));
        }
        // Before it starts and once it is over: not booked.
        let before = r.answer(Query::User("alice@example.com"), t("2026-03-09T00:00:00Z"));
        assert!(!before.unwrap().schedulability.schedulable);
        let after = r.answer(Query::User("alice@example.com"), t("2026-03-12T00:00:00Z"));
        let after = after.unwrap().schedulability;
        assert!(!after.schedulable);
        // In cooldown: the earliest start is 14 days after the end.
        assert_eq!(after.earliest_booking, Some(t("2026-03-26T00:00:00Z")));
    }

    #[test]
    fn answers_carry_the_offers_still_held() {
        let mut s = state(Vec::new(), Vec::new());
        let offer = |until: &str| Offer {
            user: "bob".into(),
            model: "a100".into(),
            units: 1,
            namespace: "jhub".into(),
            pod: "jupyter-bob".into(),
            offered_at: now() - TimeDelta::minutes(1),
            until: t(until),
            restart: false,
        };
        s.offers = vec![offer("2030-01-01T00:00:00Z")];
        let mut r = Replica::from_state(s.clone()).unwrap();
        let a = r
            .answer(Query::User("alice"), now())
            .unwrap()
            .schedulability;
        assert_eq!(a.offers, s.offers);
        // Bob, whom the service does not know, is found by his slug: his spawn takes
        // the unit held for him.
        let bob = r.answer(Query::Slug(&slugs("bob").escape), now()).unwrap();
        assert_eq!(bob.schedulability.user.as_deref(), Some("bob"));
        // The figures replace them; one past its hold is not answered.
        s.offers = vec![offer("2000-01-01T00:00:00Z")];
        r.apply_figures(&s);
        let a = r
            .answer(Query::User("alice"), now())
            .unwrap()
            .schedulability;
        assert!(a.offers.is_empty());
    }

    #[test]
    fn changes_apply_and_cancelled_bookings_vanish() {
        let mut r = Replica::from_state(state(vec![], vec![])).unwrap();
        assert!(
            !r.answer(Query::Slug("bob"), now())
                .unwrap()
                .schedulability
                .schedulable
        );
        assert_eq!(
            r.answer(Query::Slug("bob"), now())
                .unwrap()
                .schedulability
                .user,
            None
        );
        r.apply_booking(booking(
            2,
            "bob",
            "2026-03-10T00:00:00Z",
            "2026-03-11T00:00:00Z",
        ));
        let a = r.answer(Query::Slug("bob"), now()).unwrap().schedulability;
        assert!(a.schedulable);
        assert_eq!(a.user.as_deref(), Some("bob"));
        assert_eq!(a.units_held, Some(0));
        // Ended early: the effective end moves; the booking stays for the cooldown.
        r.apply_booking(booking(
            2,
            "bob",
            "2026-03-10T00:00:00Z",
            "2026-03-10T06:00:00Z",
        ));
        let a = r.answer(Query::User("bob"), now()).unwrap().schedulability;
        assert!(!a.schedulable);
        assert_eq!(a.earliest_booking, Some(t("2026-03-24T06:00:00Z")));
        r.remove_booking(2);
        let a = r.answer(Query::User("bob"), now()).unwrap().schedulability;
        assert_eq!(a.earliest_booking, Some(now()));
    }

    #[test]
    fn an_ambiguous_slug_resolves_to_nobody_and_says_whose_it_is() {
        let r = Replica::from_state(state(vec![], vec![user("a-b"), user("a-2db")])).unwrap();
        let a = r.answer(Query::Slug("a-2db"), now()).unwrap();
        assert_eq!(
            a.ambiguous,
            Some(vec!["a-2db".to_owned(), "a-b".to_owned()])
        );
        assert_eq!(a.schedulability.user, None);
        assert!(a.schedulability.earliest_booking_by_model.is_empty());
        assert!(r.answer(Query::Slug(""), now()).is_err());
        assert!(r.answer(Query::User(" x"), now()).is_err());
    }

    #[test]
    fn capacity_counts_every_unit_of_the_bookings_ahead() {
        let mut two = booking(3, "carol", "2026-03-11T00:00:00Z", "2026-03-13T00:00:00Z");
        two.units = 2;
        let r = Replica::from_state(state(vec![two], vec![])).unwrap();
        // Both a100 units are booked from tomorrow for two days: a one-day booking
        // fits today only if it ends by then; it does not (it starts now), so the
        // earliest start is after Carol's booking.
        let a = r.answer(Query::User("dave"), now()).unwrap().schedulability;
        assert_eq!(
            a.earliest_booking_by_model.values().next(),
            Some(&t("2026-03-13T00:00:00Z"))
        );
        assert!(r
            .answer(Query::Anonymous, now())
            .unwrap()
            .schedulability
            .earliest_booking
            .is_none());
    }

    #[test]
    fn prune_keeps_what_the_rules_can_see() {
        let mut r = Replica::from_state(state(
            vec![
                booking(1, "erin", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
                booking(2, "erin", "2026-03-04T00:00:00Z", "2026-03-05T00:00:00Z"),
                booking(3, "erin", "2026-04-01T00:00:00Z", "2026-04-02T00:00:00Z"),
                booking(4, "fred", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            ],
            vec![],
        ))
        .unwrap();
        let before = r.answer(Query::User("erin"), now()).unwrap();
        r.prune(now());
        // Erin's first booking can no longer matter; her last ended one can (below),
        // and so can her planned one. Fred's only (ended) booking stays for his
        // cooldown.
        assert_eq!(r.bookings(), 3);
        assert!(r.booking(1).is_none());
        assert_eq!(r.answer(Query::User("erin"), now()).unwrap(), before);
        // Her planned booking cancelled: the cooldown counts from her last ended one.
        r.remove_booking(3);
        let a = r.answer(Query::User("erin"), now()).unwrap().schedulability;
        assert_eq!(a.earliest_booking, Some(t("2026-03-19T00:00:00Z")));
    }

    #[test]
    fn a_maintenance_window_lends_none_of_its_units() {
        use crate::admission::{decide, AdmissionConfig, GpuRequest, Lookup};
        let mut s = state(vec![], vec![]);
        s.models = vec![model("a100", 2, 2)];
        let mut r = Replica::from_state(s).unwrap();
        let window = |id, units| BookingState {
            units,
            ..booking(
                id,
                " maintenance 7",
                "2026-03-10T11:00:00Z",
                "2026-03-10T13:00:00Z",
            )
        };
        let spawn = |r: &Replica, at: DateTime<Utc>| {
            let a = r.answer(Query::User("carol"), at).unwrap().schedulability;
            let gpu = GpuRequest {
                units: 1,
                models: BTreeSet::from([ModelName::parse("a100").unwrap()]),
            };
            let kind = decide(&gpu, Lookup::Answer(&a), &AdmissionConfig::default(), at).kind();
            (a.free[&ModelName::parse("a100").unwrap()], kind)
        };
        assert_eq!(spawn(&r, now()), (2, "low_priority"));
        // Over one of the two units: the other is still lent.
        r.apply_booking(window(5, 1));
        assert_eq!(spawn(&r, now()), (1, "low_priority"));
        // Over both: nothing is lent during the window, and the booked answer says
        // the same; before and after it the units are lent again.
        r.apply_booking(window(5, 2));
        assert_eq!(spawn(&r, now()), (0, "strip"));
        r.apply_booking(booking(
            6,
            "dave",
            "2026-03-10T00:00:00Z",
            "2026-03-11T00:00:00Z",
        ));
        let dave = r.answer(Query::User("dave"), now()).unwrap().schedulability;
        assert!(dave.schedulable);
        assert_eq!(dave.free[&ModelName::parse("a100").unwrap()], 0);
        assert_eq!(spawn(&r, t("2026-03-10T10:59:59Z")).1, "low_priority");
        assert_eq!(spawn(&r, t("2026-03-10T13:00:00Z")).1, "low_priority");
        // A window's user is no pod's: no label names it.
        assert_eq!(
            r.answer(Query::Slug(&slugs(" maintenance 7").escape), now())
                .unwrap()
                .schedulability
                .user,
            None
        );
        // Cancelled: its units are lent at once.
        r.remove_booking(5);
        assert_eq!(spawn(&r, now()), (2, "low_priority"));
    }

    #[test]
    fn course_members_are_booked_against_the_occurrence_up_to_its_units() {
        use crate::admission::{decide, AdmissionConfig, GpuRequest, Lookup};
        let mut s = state(vec![], vec![]);
        s.models = vec![model("a100", 4, 4)];
        s.held = BTreeMap::from([(40, 1)]);
        s.groups = vec![GroupMembers {
            group: 2,
            members: vec!["ann".into(), "ben".into()],
        }];
        let mut r = Replica::from_state(s.clone()).unwrap();
        r.apply_booking(BookingState {
            units: 2,
            ..booking(
                40,
                " course 3 group 2",
                "2026-03-10T11:00:00Z",
                "2026-03-10T13:00:00Z",
            )
        });
        let ann = r.answer(Query::User("Ann"), now()).unwrap().schedulability;
        assert!(ann.schedulable);
        assert_eq!(ann.booking_id, Some(40));
        assert_eq!(ann.user.as_deref(), Some("ann"));
        assert_eq!(ann.until, Some(t("2026-03-10T13:00:00Z")));
        assert_eq!((ann.units, ann.units_held), (Some(2), Some(1)));
        let gpu = GpuRequest {
            units: 1,
            models: BTreeSet::from([ModelName::parse("a100").unwrap()]),
        };
        let cfg = AdmissionConfig::default();
        assert_eq!(
            decide(&gpu, Lookup::Answer(&ann), &cfg, now()).kind(),
            "booked"
        );
        // Both units held: the next member's pod is lent, not booked.
        s.held = BTreeMap::from([(40, 2)]);
        r.apply_figures(&s);
        let ben = r.answer(Query::User("ben"), now()).unwrap().schedulability;
        assert!(
            ben.course,
            "a member's answer says the booking is a course's"
        );
        let lent = decide(&gpu, Lookup::Answer(&ben), &cfg, now());
        assert_eq!(lent.kind(), "low_priority");
        let warning = lent.warning().unwrap_or_default();
        assert!(
            warning.contains("the course's 2 GPUs are all in use"),
            "the warning should say the course's units are all in use: {warning}"
        );
        // Not a member, or after the occurrence: not booked.
        assert!(
            !r.answer(Query::User("cy"), now())
                .unwrap()
                .schedulability
                .schedulable
        );
        let after = r
            .answer(Query::User("ann"), t("2026-03-10T13:00:00Z"))
            .unwrap();
        assert!(!after.schedulability.schedulable);
        // A member's own booking comes first.
        r.apply_booking(booking(
            41,
            "ann",
            "2026-03-10T00:00:00Z",
            "2026-03-11T00:00:00Z",
        ));
        let ann = r.answer(Query::User("ann"), now()).unwrap().schedulability;
        assert_eq!(ann.booking_id, Some(41));
        assert!(!ann.course, "her own booking is no course's");
        // Membership follows the figures: removed, ben is no longer booked.
        s.groups[0].members = vec!["ann".into()];
        r.apply_figures(&s);
        assert!(
            !r.answer(Query::User("ben"), now())
                .unwrap()
                .schedulability
                .schedulable
        );
    }

    #[test]
    fn a_state_without_bookings_is_not_a_listing() {
        let mut s = state(vec![], vec![]);
        s.bookings = None;
        assert!(Replica::from_state(s).is_none());
    }

    /// The plain answer, walking every booking: every booking that has not ended
    /// counts. The indexed answers must be these, after any sequence of changes and
    /// prunes.
    fn answer_by_walking_all(
        bookings: &BTreeMap<i64, BookingState>,
        models: &[ModelState],
        user: &str,
        now: DateTime<Utc>,
    ) -> Schedulability {
        let policy = Policy::default();
        let of_user = || bookings.values().filter(|b| b.user == user);
        let active = of_user()
            .filter(|b| b.start <= now && b.end > now)
            .min_by_key(|b| (b.start, b.id));
        if let Some(b) = active {
            return Schedulability::booked(models, active_booking(b, 0));
        }
        let own: Vec<Window> = of_user().filter_map(BookingState::window).collect();
        let duration = TimeDelta::days(next_start::default_days(&policy));
        let mut by_model = BTreeMap::new();
        for m in models {
            let booked: Vec<Window> = bookings
                .values()
                .filter(|b| b.model == m.name.as_str() && b.end > now)
                .filter_map(|b| b.window().map(|w| (w, b.units)))
                .flat_map(|(w, units)| std::iter::repeat_n(w, units as usize))
                .collect();
            let name = m.name.as_str();
            if let Ok(next) =
                next_start::earliest_start(&policy, now, &own, name, m.units, 1, &booked, duration)
            {
                by_model.insert(m.name.clone(), next.start);
            }
        }
        Schedulability::unbooked(models, Some(user.to_owned()), by_model)
    }

    #[derive(Debug, Clone)]
    enum Step {
        Apply(i64, usize, usize, u32, i64, i64),
        Remove(i64),
        Prune(i64),
        Ask(usize, i64),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0i64..12, 0usize..4, 0usize..2, 1u32..3, -400i64..600, 1i64..200)
                .prop_map(|(id, u, m, n, s, len)| Step::Apply(id, u, m, n, s, len)),
            1 => (0i64..12).prop_map(Step::Remove),
            2 => (0i64..60).prop_map(Step::Prune),
            3 => (0usize..4, 0i64..60).prop_map(|(u, h)| Step::Ask(u, h)),
        ]
    }

    proptest::proptest! {
        /// The replica's indexes (bookings by model and start, by end, the
        /// incremental prune) change no answer: after any changes and prunes, every
        /// user's answer at or after the last prune is the one from walking every
        /// booking there is.
        #[test]
        fn indexed_answers_are_those_of_walking_every_booking(
            steps in proptest::collection::vec(step(), 1..40),
        ) {
            let users = ["ann", "ben", "cat", "dan"];
            let names = ["a100", "h100"];
            let models: Vec<ModelState> = vec![model("a100", 2, 0), model("h100", 1, 0)];
            let hour = |h: i64| now() + TimeDelta::hours(h);
            let mut s = state(vec![], vec![]);
            s.models = models.clone();
            s.held = BTreeMap::new();
            let mut r = Replica::from_state(s).unwrap();
            let mut all: BTreeMap<i64, BookingState> = BTreeMap::new();
            let mut clock = 0i64;
            for step in steps {
                match step {
                    // A change keeps the booking's user and model, and an ended
                    // booking cannot change (PATCH /bookings/{id}, core::cancel).
                    Step::Apply(id, ..) if all.get(&id).is_some_and(|b| b.end <= hour(clock)) => {}
                    Step::Apply(id, u, m, units, start, len) => {
                        let (user, model) = match all.get(&id) {
                            Some(b) => (b.user.clone(), b.model.clone()),
                            None => (users[u].to_owned(), names[m].to_owned()),
                        };
                        let b = BookingState {
                            id,
                            user,
                            model,
                            units,
                            start: hour(start),
                            end: hour(start + len),
                        };
                        all.insert(id, b.clone());
                        r.apply_booking(b);
                    }
                    // Only a booking that has not ended can be cancelled
                    // (core::cancel); an ended one's end stays the cooldown's.
                    Step::Remove(id) if all.get(&id).is_some_and(|b| b.end > hour(clock)) => {
                        all.remove(&id);
                        r.remove_booking(id);
                    }
                    Step::Remove(_) => {}
                    Step::Prune(h) => {
                        clock = clock.max(h);
                        r.prune(hour(clock));
                    }
                    Step::Ask(u, h) => {
                        let at = hour(clock.max(h));
                        let got = r.answer(Query::User(users[u]), at).unwrap().schedulability;
                        proptest::prop_assert_eq!(got, answer_by_walking_all(&all, &models, users[u], at));
                    }
                }
            }
        }
    }
}
