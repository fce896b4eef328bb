//! The webhook's replica of what it decides on (issue 17): the bookings that matter
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

use chrono::{DateTime, TimeDelta, Utc};

use super::Schedulability;
use crate::booking_policy::Policy;
use crate::gpu_model::ModelName;
use crate::next_start;
use crate::username::{slugs, NameCase, SlugMatch, Username};
use crate::window::Window;
pub use crate::wire::admission_state::{
    AdmissionState, BookingState, KnownUser, ModelState, PolicyState,
};
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
    bookings: BTreeMap<i64, BookingState>,
    /// User -> the ids of their bookings (an admission looks at one user's).
    by_user: HashMap<String, BTreeSet<i64>>,
    /// Lookup key (name, escape slug, safe slug) -> the users it names.
    keys: HashMap<String, BTreeSet<String>>,
}

impl Replica {
    /// A replica from a full answer; `None` when the answer is not a full one.
    pub fn from_state(state: AdmissionState) -> Option<Self> {
        let mut replica = Replica {
            names: state.names,
            policy: state.policy.policy(),
            models: Vec::new(),
            held: BTreeMap::new(),
            bookings: BTreeMap::new(),
            by_user: HashMap::new(),
            keys: HashMap::new(),
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

    /// Takes the figures of an answer (full or not): rules, models, units held.
    pub fn apply_figures(&mut self, state: &AdmissionState) {
        self.names = state.names;
        self.policy = state.policy.policy();
        self.models = state.models.clone();
        self.held = state.held.clone();
    }

    /// A booking created or changed (as it is now). The user becomes known by
    /// name and slugs, as the service records them with the first booking.
    pub fn apply_booking(&mut self, booking: BookingState) {
        if !self
            .keys
            .get(&booking.user)
            .is_some_and(|u| u.contains(&booking.user))
        {
            let s = slugs(&booking.user);
            for key in [booking.user.clone(), s.escape, s.safe] {
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
        self.bookings.insert(booking.id, booking);
    }

    /// A booking cancelled: it no longer counts anywhere.
    pub fn remove_booking(&mut self, id: i64) {
        if let Some(old) = self.bookings.remove(&id) {
            if let Some(ids) = self.by_user.get_mut(&old.user) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.by_user.remove(&old.user);
                }
            }
        }
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
    /// last one (the cooldown counts from the latest end).
    pub fn prune(&mut self, now: DateTime<Utc>) {
        let mut last: HashMap<&str, (DateTime<Utc>, i64)> = HashMap::new();
        for b in self.bookings.values() {
            let e = last.entry(b.user.as_str()).or_insert((b.end, b.id));
            if b.end > e.0 {
                *e = (b.end, b.id);
            }
        }
        let keep: BTreeSet<i64> = last.values().map(|(_, id)| *id).collect();
        let gone: Vec<i64> = self
            .bookings
            .iter()
            .filter(|(id, b)| b.end <= now && !keep.contains(id))
            .map(|(id, _)| *id)
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
                    SlugMatch::Nobody => Owner::Unknown,
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
        if let Some(b) = active {
            let answer = Schedulability::booked(
                &self.models,
                ActiveBooking {
                    id: b.id,
                    until: b.end,
                    model: ModelName::parse(&b.model).ok(),
                    user: b.user.clone(),
                    units: u64::from(b.units),
                    units_held: self.held.get(&b.id).copied().unwrap_or(0),
                },
            );
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
            let mut ahead: BTreeMap<&str, Vec<Window>> = BTreeMap::new();
            for b in self.bookings.values().filter(|b| b.end > now) {
                if let Some(w) = b.window() {
                    let list = ahead.entry(b.model.as_str()).or_default();
                    list.extend(std::iter::repeat_n(w, b.units as usize));
                }
            }
            let duration = TimeDelta::days(next_start::default_days(&self.policy));
            for m in &self.models {
                let booked = ahead
                    .get(m.name.as_str())
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                if let Ok(next) = next_start::earliest_start(
                    &self.policy,
                    now,
                    &own,
                    m.name.as_str(),
                    m.units,
                    1,
                    booked,
                    duration,
                ) {
                    earliest_booking_by_model.insert(m.name.clone(), next.start);
                }
            }
        }
        let user = match owner {
            Owner::User(user) => Some(user),
            _ => None,
        };
        let answer = Schedulability::unbooked(&self.models, user, earliest_booking_by_model);
        Ok(Answer {
            schedulability: answer,
            ambiguous,
        })
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
                booking(2, "erin", "2026-02-01T00:00:00Z", "2026-02-02T00:00:00Z"),
                booking(3, "erin", "2026-04-01T00:00:00Z", "2026-04-02T00:00:00Z"),
                booking(4, "fred", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            ],
            vec![],
        ))
        .unwrap();
        let before = r.answer(Query::User("erin"), now()).unwrap();
        r.prune(now());
        // Erin's planned booking ends last, so her ended ones cannot matter; Fred's
        // only (ended) booking stays for his cooldown.
        assert_eq!(r.bookings(), 2);
        assert_eq!(r.answer(Query::User("erin"), now()).unwrap(), before);
    }

    #[test]
    fn a_state_without_bookings_is_not_a_listing() {
        let mut s = state(vec![], vec![]);
        s.bookings = None;
        assert!(Replica::from_state(s).is_none());
    }
}
