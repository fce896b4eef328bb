//! A GPU offered back: who is offered a freed unit of a model, in what order, and
//! for how long it is held for them.
//!
//! Who waits: a user whose notebook runs on CPU because the webhook stripped its GPU
//! at spawn (no free unit), or because its lent GPU was taken back and the
//! controller re-created it on CPU. Both carry [`GPU_WANTED_ANNOTATION`] (what the
//! pod asked for: units and model, or any model), written by the webhook's strip
//! and by the CPU-only copy of a lent pod; a booked pod's copy at its booking's end
//! does not get it (its user's GPU time is over, not taken). The webhook removes
//! the annotation from what a pod's creator wrote, so only our copies and strips
//! carry it.
//!
//! The rules, decided by [`OfferBook::round`] on every round of the controller:
//!
//! - only notebooks stripped less than `window` ago (`--offer-window`) wait;
//! - in order of waiting: the notebook stripped earliest first; a user is offered
//!   one offer at a time (their earliest notebook's);
//! - a user with a booking now is not offered (their spawn is booked anyway);
//! - the units outstanding on a model never exceed its free units: when the free
//!   count drops below them, the newest offers go first;
//! - a model's free units are offered only once none of them was taken for `quiet`
//!   (`--offer-quiet`): while spawns are being lent a model's cards, its free count
//!   runs ahead of what the webhook may lend (the pods admitted in the last seconds
//!   are not counted yet), and what the webhook strips in that time is a user who
//!   would take a card from a spawn just behind them. An offer then held the cards a
//!   burst was filling for users who had to restart to use them, and the spawns
//!   after them went to CPU beside idle cards; a card nobody took for `quiet` is one
//!   no spawn is on its way to;
//! - an offer holds its units for `hold` (`--offer-hold`); unused, it expires and
//!   the next in line is offered. A user who let one expire goes behind everyone
//!   who has not, and is offered again no sooner than [`OFFER_AGAIN_AFTER`] later
//!   (so that one absent user is not mailed every few minutes);
//! - an offer ends when its user has a GPU notebook again (they took it, or got
//!   another); it stays while their notebook is gone without a GPU notebook in its
//!   place (a restart: the new pod is on its way through the webhook);
//! - a notebook that asked for several units is offered them only when as many are
//!   free; it does not hold back the users behind it (a smaller request that fits
//!   is offered first).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};

use crate::gpu_model::ModelName;
use crate::notice::Message;
use crate::notice_text::{capitalised, gpu_word, gpus, Style};
use crate::wire::offers::Offer;

/// Annotation on a pod running on CPU in place of a GPU: what it asked for,
/// `"<units> <model>"` or `"<units> any"` (a pod that asked for the generic
/// resource). Under our key domain (`crate::admission::KEY_DOMAIN`, checked by a
/// test): the webhook removes it from what a creator wrote.
pub const GPU_WANTED_ANNOTATION: &str = "gpu-booking.io/gpu-wanted";

/// A user who let an offer expire is offered again no sooner than this after it
/// expired, and only after everyone else waiting.
pub const OFFER_AGAIN_AFTER: TimeDelta = TimeDelta::hours(1);

/// What a stripped notebook asked for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Wanted {
    /// GPUs (at least 1).
    pub units: u64,
    /// The model; `None`: any model.
    pub model: Option<ModelName>,
}

impl Wanted {
    /// The annotation's value.
    pub fn annotation(&self) -> String {
        match &self.model {
            Some(model) => format!("{} {model}", self.units.max(1)),
            None => format!("{} any", self.units.max(1)),
        }
    }

    /// Reads [`Wanted::annotation`]; `None` for anything else.
    pub fn parse(value: &str) -> Option<Wanted> {
        let (units, model) = value.trim().split_once(' ')?;
        let units: u64 = units.parse().ok().filter(|u| (1..=64).contains(u))?;
        let model = match model.trim() {
            "any" => None,
            name => Some(ModelName::parse(name).ok()?),
        };
        Some(Wanted { units, model })
    }
}

/// A notebook on CPU whose user waits for a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub user: String,
    pub namespace: String,
    pub pod: String,
    pub wanted: Wanted,
    /// When it started on CPU (the pod's start, or creation).
    pub since: DateTime<Utc>,
}

/// The options of the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfferSettings {
    /// `--offer-window`: notebooks stripped longer ago wait no more.
    pub window: TimeDelta,
    /// `--offer-hold`: how long an offer holds its units.
    pub hold: TimeDelta,
    /// `--offer-quiet`: a model's free units are offered only once none of them was
    /// taken for this long.
    pub quiet: TimeDelta,
}

impl Default for OfferSettings {
    fn default() -> Self {
        Self {
            window: TimeDelta::hours(8),
            hold: TimeDelta::minutes(5),
            quiet: TimeDelta::seconds(30),
        }
    }
}

/// What a round reads of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Round<'a> {
    pub now: DateTime<Utc>,
    /// Every notebook on CPU that wants a GPU.
    pub waiting: &'a [Waiting],
    /// Users with a notebook on a GPU now (booked or lent).
    pub on_gpu: &'a BTreeSet<String>,
    /// Users with a booking now.
    pub booked: &'a BTreeSet<String>,
    /// Free units per model (units not in use).
    pub free: &'a BTreeMap<String, u64>,
}

/// The offers outstanding and who let one expire: the state kept between rounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OfferBook {
    offers: Vec<Offer>,
    /// User -> when their last offer expired unused.
    passed: BTreeMap<String, DateTime<Utc>>,
    /// Model -> its free units at the last round and when a unit of it was last
    /// taken (its free count dropped, or it was first seen: a new leader does not
    /// know what is being lent).
    taken: BTreeMap<String, (u64, DateTime<Utc>)>,
}

fn units(offer: &Offer) -> u64 {
    u64::try_from(offer.units).unwrap_or(0)
}

impl OfferBook {
    /// The offers outstanding, by user.
    pub fn offers(&self) -> &[Offer] {
        &self.offers
    }

    /// Takes the offers as the booking service keeps them (a new leader starts from
    /// the service's; the service drops offers to booked users and marks those it
    /// restarts). Offers to one user twice keep the first.
    pub fn adopt(&mut self, offers: Vec<Offer>) {
        let mut seen = BTreeSet::new();
        self.offers = offers
            .into_iter()
            .filter(|o| seen.insert(o.user.clone()))
            .collect();
        self.offers.sort_by(|a, b| a.user.cmp(&b.user));
    }

    /// One round: offers that ended go, then the free units are offered in order of
    /// waiting. Returns whether the offers changed.
    pub fn round(&mut self, r: &Round<'_>, settings: &OfferSettings) -> bool {
        let before = self.offers.clone();
        let now = r.now;
        // Ended: expired (the next is offered), taken (a GPU notebook again), or a
        // booking now.
        let mut kept = Vec::with_capacity(self.offers.len());
        for offer in std::mem::take(&mut self.offers) {
            if r.on_gpu.contains(&offer.user) || r.booked.contains(&offer.user) {
                self.passed.remove(&offer.user);
            } else if now >= offer.until {
                self.passed.insert(offer.user.clone(), offer.until);
            } else {
                kept.push(offer);
            }
        }
        // Never more outstanding than free: the newest give way.
        kept.sort_by(|a, b| (a.offered_at, &a.user).cmp(&(b.offered_at, &b.user)));
        let mut remaining: BTreeMap<String, u64> = r.free.clone();
        kept.retain(|o| match remaining.get_mut(&o.model) {
            Some(free) if *free >= units(o) => {
                *free -= units(o);
                true
            }
            _ => false,
        });
        // Units are being taken on a model that is not quiet: none is offered anew.
        self.note_taken(r.free, now);
        for (model, free) in remaining.iter_mut() {
            let quiet = self
                .taken
                .get(model)
                .is_some_and(|&(_, at)| now - at >= settings.quiet);
            if !quiet {
                *free = 0;
            }
        }
        // Who waits, one notebook per user (their earliest), in order.
        let offered: BTreeSet<String> = kept.iter().map(|o| o.user.clone()).collect();
        let mut first: BTreeMap<&str, &Waiting> = BTreeMap::new();
        for w in r.waiting {
            let eligible = w.since <= now
                && now - w.since < settings.window
                && !r.on_gpu.contains(&w.user)
                && !r.booked.contains(&w.user)
                && !offered.contains(&w.user)
                && self
                    .passed
                    .get(&w.user)
                    .is_none_or(|at| now - *at >= OFFER_AGAIN_AFTER);
            if !eligible {
                continue;
            }
            let earlier = first
                .get(w.user.as_str())
                .is_none_or(|f| (w.since, &w.namespace, &w.pod) < (f.since, &f.namespace, &f.pod));
            if earlier {
                first.insert(&w.user, w);
            }
        }
        let mut line: Vec<&Waiting> = first.into_values().collect();
        line.sort_by_key(|w| (self.passed.get(&w.user).copied(), w.since, w.user.clone()));
        for w in line {
            let Some(model) = pick(&remaining, &w.wanted) else {
                continue;
            };
            if let Some(free) = remaining.get_mut(&model) {
                *free -= w.wanted.units;
            }
            kept.push(Offer {
                user: w.user.clone(),
                model,
                units: crate::wire::reported(w.wanted.units),
                namespace: w.namespace.clone(),
                pod: w.pod.clone(),
                offered_at: now,
                until: now + settings.hold,
                restart: false,
            });
        }
        kept.sort_by(|a, b| a.user.cmp(&b.user));
        self.offers = kept;
        // Forget those who wait no more.
        let waiting: BTreeSet<&str> = r.waiting.iter().map(|w| w.user.as_str()).collect();
        self.passed
            .retain(|user, at| waiting.contains(user.as_str()) && now - *at < settings.window);
        self.offers != before
    }

    /// Notes, per model of `free`, when a unit was last taken; forgets models gone.
    fn note_taken(&mut self, free: &BTreeMap<String, u64>, now: DateTime<Utc>) {
        self.taken.retain(|model, _| free.contains_key(model));
        for (model, &units) in free {
            let entry = self.taken.entry(model.clone()).or_insert((units, now));
            if units < entry.0 {
                entry.1 = now;
            }
            entry.0 = units;
        }
    }
}

/// The notice to an offer's user: what is free, what to do, until when, and the
/// page's link.
pub fn offer_message(offer: &Offer, style: &Style) -> Message {
    let units = u32::try_from(offer.units).unwrap_or(1);
    let what = gpus(units, &offer.model);
    let restart = if offer.restart {
        " You asked for your server to be restarted on a GPU when one frees: it is \
         restarted for you as soon as it is idle."
    } else {
        ""
    };
    let verb = if units == 1 { "is" } else { "are" };
    Message {
        title: format!("{} free for you", capitalised(&what)),
        text: style.with_link(format!(
            "{} {verb} free: restart your server to get it. Your notebook {}/{} runs on \
             CPU; the {} {verb} held for you until {}, then offered to the next in line.\
             {restart}",
            capitalised(&what),
            offer.namespace,
            offer.pod,
            gpu_word(units),
            style.time(offer.until),
        )),
    }
}

/// The once-only key of an offer's notice: one notice per offer.
pub fn offer_key(offer: &Offer) -> String {
    format!(
        "offer:{}:{}:{}",
        offer.user,
        offer.model,
        offer.offered_at.timestamp_millis()
    )
}

/// The model `wanted` is offered from `remaining`: its own when enough of it is
/// free; for any model, the one with the most free units (the first by name among
/// equals, as the webhook lends one).
fn pick(remaining: &BTreeMap<String, u64>, wanted: &Wanted) -> Option<String> {
    let units = wanted.units.max(1);
    match &wanted.model {
        Some(model) => remaining
            .get(model.as_str())
            .is_some_and(|&free| free >= units)
            .then(|| model.as_str().to_owned()),
        None => remaining
            .iter()
            .filter(|(_, &free)| free >= units)
            .max_by(|(a, n), (b, m)| n.cmp(m).then_with(|| b.cmp(a)))
            .map(|(model, _)| model.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn wants(units: u64, model: Option<&str>) -> Wanted {
        Wanted {
            units,
            model: model.map(|m| ModelName::parse(m).unwrap()),
        }
    }

    fn waiting(user: &str, since: i64, model: Option<&str>) -> Waiting {
        Waiting {
            user: user.into(),
            namespace: "jhub".into(),
            pod: format!("jupyter-{user}"),
            wanted: wants(1, model),
            since: t(since),
        }
    }

    fn free(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(m, n)| (m.to_string(), *n)).collect()
    }

    struct Lab {
        book: OfferBook,
        waiting: Vec<Waiting>,
        on_gpu: BTreeSet<String>,
        booked: BTreeSet<String>,
        free: BTreeMap<String, u64>,
        settings: OfferSettings,
    }

    impl Lab {
        /// A lab whose models are quiet at once: the other rules, alone.
        fn new(waiting: Vec<Waiting>, free: BTreeMap<String, u64>) -> Self {
            Lab {
                book: OfferBook::default(),
                waiting,
                on_gpu: BTreeSet::new(),
                booked: BTreeSet::new(),
                free,
                settings: OfferSettings {
                    quiet: TimeDelta::zero(),
                    ..OfferSettings::default()
                },
            }
        }

        fn round(&mut self, at: i64) -> Vec<(String, String)> {
            let r = Round {
                now: t(at),
                waiting: &self.waiting,
                on_gpu: &self.on_gpu,
                booked: &self.booked,
                free: &self.free,
            };
            self.book.round(&r, &self.settings);
            self.book
                .offers()
                .iter()
                .map(|o| (o.user.clone(), o.model.clone()))
                .collect()
        }
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(u, m)| (u.to_string(), m.to_string()))
            .collect()
    }

    #[test]
    fn the_annotation_reads_back() {
        for w in [wants(1, Some("a100")), wants(2, None)] {
            assert_eq!(Wanted::parse(&w.annotation()), Some(w));
        }
        assert_eq!(wants(1, None).annotation(), "1 any");
        for bad in ["", "a100", "0 a100", "1", "x any", "65 any", "1 A B"] {
            assert_eq!(Wanted::parse(bad), None, "{bad}");
        }
        assert!(GPU_WANTED_ANNOTATION.starts_with(crate::admission::KEY_DOMAIN));
    }

    #[test]
    fn the_earliest_stripped_is_offered_first_one_offer_a_user() {
        let mut lab = Lab::new(
            vec![
                waiting("carol", 30, Some("a100")),
                waiting("alice", 10, Some("a100")),
                waiting("bob", 20, None),
                // Alice's second notebook, later: one offer for her.
                Waiting {
                    pod: "jupyter-alice-2".into(),
                    ..waiting("alice", 15, Some("a100"))
                },
            ],
            free(&[("a100", 0)]),
        );
        assert!(lab.round(100).is_empty(), "nothing free, nothing offered");
        lab.free = free(&[("a100", 2)]);
        assert_eq!(lab.round(101), pairs(&[("alice", "a100"), ("bob", "a100")]));
        let alice = &lab.book.offers()[0];
        assert_eq!(alice.pod, "jupyter-alice");
        assert_eq!((alice.offered_at, alice.until), (t(101), t(101 + 300)));
        // A round later nothing moves: the same offers, made at the same time.
        let before = lab.book.clone();
        lab.round(102);
        assert_eq!(lab.book, before);
    }

    #[test]
    fn an_offer_expires_and_moves_to_the_next() {
        let mut lab = Lab::new(
            vec![
                waiting("alice", 10, Some("a100")),
                waiting("bob", 20, Some("a100")),
            ],
            free(&[("a100", 1)]),
        );
        assert_eq!(lab.round(100), pairs(&[("alice", "a100")]));
        assert_eq!(lab.round(399), pairs(&[("alice", "a100")]));
        assert_eq!(lab.round(400), pairs(&[("bob", "a100")]), "expired: next");
        // Bob lets his expire too: alice is not offered again within the hour.
        assert!(lab.round(700).is_empty());
        assert!(lab.round(400 + 3599).is_empty());
        // After the hour, alice (who passed first) comes before bob.
        assert_eq!(lab.round(400 + 3600), pairs(&[("alice", "a100")]));
    }

    #[test]
    fn a_taken_or_booked_offer_ends_and_a_restart_keeps_it() {
        let mut lab = Lab::new(
            vec![
                waiting("alice", 10, Some("a100")),
                waiting("bob", 20, Some("a100")),
            ],
            free(&[("a100", 1)]),
        );
        assert_eq!(lab.round(100), pairs(&[("alice", "a100")]));
        // Alice restarts: her CPU pod is gone, the new one not yet admitted.
        lab.waiting.remove(0);
        assert_eq!(lab.round(110), pairs(&[("alice", "a100")]));
        // Her new pod got the GPU: the unit is in use, her offer ends.
        lab.on_gpu.insert("alice".into());
        lab.free = free(&[("a100", 0)]);
        assert!(lab.round(120).is_empty());
        // A booking now ends an offer, and keeps its user from one.
        lab.free = free(&[("a100", 1)]);
        assert_eq!(lab.round(130), pairs(&[("bob", "a100")]));
        lab.booked.insert("bob".into());
        assert!(lab.round(131).is_empty());
    }

    #[test]
    fn outside_the_window_nobody_waits_and_fewer_free_drops_the_newest() {
        let mut lab = Lab::new(
            vec![
                waiting("old", -8 * 3600, Some("a100")),
                waiting("alice", 10, Some("a100")),
                waiting("bob", 20, None),
            ],
            free(&[("a100", 1), ("h100", 0)]),
        );
        assert_eq!(lab.round(100), pairs(&[("alice", "a100")]));
        lab.free = free(&[("a100", 2), ("h100", 0)]);
        assert_eq!(lab.round(110), pairs(&[("alice", "a100"), ("bob", "a100")]));
        // A lent pod took one: bob's (the newest) goes, alice's stays.
        lab.free = free(&[("a100", 1), ("h100", 0)]);
        assert_eq!(lab.round(120), pairs(&[("alice", "a100")]));
        // Bob wants any model: an h100 frees.
        lab.free = free(&[("a100", 1), ("h100", 1)]);
        assert_eq!(lab.round(130), pairs(&[("alice", "a100"), ("bob", "h100")]));
    }

    #[test]
    fn units_being_taken_are_not_offered_until_the_model_is_quiet() {
        // A burst is being lent the a100s: each round the count drops, and the
        // webhook strips alice while the pods it lent are not counted yet.
        let mut lab = Lab::new(
            vec![waiting("alice", 100, Some("a100"))],
            free(&[("a100", 6), ("h100", 1)]),
        );
        lab.settings = OfferSettings::default();
        let quiet = lab.settings.quiet.num_seconds();
        assert!(lab.round(100).is_empty(), "a model first seen is not quiet");
        lab.free = free(&[("a100", 4), ("h100", 1)]);
        assert!(lab.round(101).is_empty());
        lab.free = free(&[("a100", 3), ("h100", 1)]);
        assert!(lab.round(102).is_empty());
        // Nothing taken since: still not quiet a moment before the wait is over.
        assert!(lab.round(102 + quiet - 1).is_empty());
        assert_eq!(lab.round(102 + quiet), pairs(&[("alice", "a100")]));
        // A unit freeing (a count rising) is no taking: bob, who waits for any
        // model, is offered one at once.
        lab.waiting.push(waiting("bob", 110, None));
        lab.free = free(&[("a100", 4), ("h100", 1)]);
        assert_eq!(
            lab.round(103 + quiet),
            pairs(&[("alice", "a100"), ("bob", "a100")])
        );
        // A unit taken keeps the offers that still fit, and offers none anew
        // until the model is quiet again.
        lab.waiting.push(waiting("carol", 120, Some("a100")));
        lab.free = free(&[("a100", 3), ("h100", 1)]);
        let at = 104 + quiet;
        let two = pairs(&[("alice", "a100"), ("bob", "a100")]);
        assert_eq!(lab.round(at), two);
        assert_eq!(lab.round(at + quiet - 1), two);
        assert_eq!(
            lab.round(at + quiet),
            pairs(&[("alice", "a100"), ("bob", "a100"), ("carol", "a100")])
        );
    }

    #[test]
    fn a_large_request_does_not_hold_back_the_line() {
        let mut lab = Lab::new(
            vec![
                Waiting {
                    wanted: wants(2, Some("a100")),
                    ..waiting("big", 10, None)
                },
                waiting("small", 20, Some("a100")),
            ],
            free(&[("a100", 1)]),
        );
        assert_eq!(lab.round(100), pairs(&[("small", "a100")]));
        lab.on_gpu.insert("small".into());
        lab.free = free(&[("a100", 2)]);
        assert_eq!(lab.round(110), pairs(&[("big", "a100")]));
        assert_eq!(lab.book.offers()[0].units, 2);
    }

    #[test]
    fn the_notice_says_what_is_free_what_to_do_and_until_when() {
        let offer = Offer {
            user: "alice".into(),
            model: "a100".into(),
            units: 1,
            namespace: "jhub".into(),
            pod: "jupyter-alice".into(),
            offered_at: "2026-11-29T09:07:00Z".parse().unwrap(),
            until: "2026-11-29T09:12:00Z".parse().unwrap(),
            restart: false,
        };
        let style = Style {
            zone: chrono_tz::Europe::Berlin,
            page_url: Some("https://gpu.lab.example/".into()),
        };
        let m = offer_message(&offer, &style);
        assert_eq!(m.title, "One a100 GPU free for you");
        assert!(
            m.text
                .starts_with("One a100 GPU is free: restart your server to get it."),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("until Sun 29 Nov 2026, 10:12 CET"),
            "{}",
            m.text
        );
        assert!(m
            .text
            .ends_with("Your bookings: https://gpu.lab.example/#mine"));
        assert!(!m.text.contains("restarted for you"));
        let m = offer_message(
            &Offer {
                restart: true,
                units: 2,
                ..offer.clone()
            },
            &style,
        );
        assert!(m.text.starts_with("2 a100 GPUs are free"), "{}", m.text);
        assert!(m.text.contains("the GPUs are held"), "{}", m.text);
        assert!(m.text.contains("restarted for you as soon as it is idle"));
        assert_ne!(
            offer_key(&offer),
            offer_key(&Offer {
                offered_at: offer.until,
                ..offer.clone()
            })
        );
    }

    proptest! {
        /// Over any run of rounds: never more units outstanding on a model than are
        /// free, one offer per user, only to users who wait, are not booked and
        /// hold no GPU; no offer outlives its hold; and nobody fresh waits behind
        /// a later notebook offered the same model.
        #[test]
        fn offers_keep_the_rules(
            notebooks in proptest::collection::vec((0usize..6, 0i64..600, 0usize..3, 1u64..3), 0..10),
            rounds in proptest::collection::vec(
                (0i64..400, proptest::collection::vec(0u64..4, 2), 0u8..64, 0u8..64), 1..12),
            quiet in prop_oneof![Just(0i64), Just(30), Just(300)],
        ) {
            let settings = OfferSettings { quiet: TimeDelta::seconds(quiet), ..OfferSettings::default() };
            // Model -> its last free count and when it last dropped (or was first seen).
            let mut last_taken: BTreeMap<&str, (u64, i64)> = BTreeMap::new();
            let users = ["u0", "u1", "u2", "u3", "u4", "u5"];
            let models = [Some("a100"), Some("h100"), None];
            let waiting: Vec<Waiting> = notebooks
                .iter()
                .enumerate()
                .map(|(i, (u, since, m, units))| Waiting {
                    pod: format!("p{i}"),
                    wanted: wants(*units, models[*m]),
                    ..waiting(users[*u], *since, None)
                })
                .collect();
            let mut book = OfferBook::default();
            let mut now = 600;
            for (step, free_units, gpu_mask, booked_mask) in rounds {
                now += step;
                let free = free(&[("a100", free_units[0]), ("h100", free_units[1])]);
                let pick = |mask: u8| -> BTreeSet<String> {
                    (0..6).filter(|i| mask & (1 << i) != 0).map(|i| users[i].to_string()).collect()
                };
                let (on_gpu, booked) = (pick(gpu_mask), pick(booked_mask));
                let r = Round { now: t(now), waiting: &waiting, on_gpu: &on_gpu, booked: &booked, free: &free };
                let passed_before = book.passed.clone();
                let offered_before: BTreeSet<(String, String, i64)> = book
                    .offers()
                    .iter()
                    .map(|o| (o.user.clone(), o.model.clone(), o.offered_at.timestamp()))
                    .collect();
                book.round(&r, &settings);
                let offers = book.offers();
                for model in ["a100", "h100"] {
                    let entry = last_taken.entry(model).or_insert((free[model], now));
                    if free[model] < entry.0 {
                        entry.1 = now;
                    }
                    entry.0 = free[model];
                    // Made by this round (one of an earlier round at the same instant
                    // is not).
                    let new = offers.iter().any(|o| {
                        o.model == model
                            && o.offered_at == t(now)
                            && !offered_before.contains(&(
                                o.user.clone(),
                                o.model.clone(),
                                o.offered_at.timestamp(),
                            ))
                    });
                    prop_assert!(!new || now - entry.1 >= quiet,
                        "{model} offered {}s after a unit of it was taken", now - entry.1);
                }
                for model in ["a100", "h100"] {
                    let out: u64 = offers.iter().filter(|o| o.model == model).map(units).sum();
                    prop_assert!(out <= free[model], "{model}: {out} > {}", free[model]);
                }
                let mut seen = BTreeSet::new();
                for o in offers {
                    prop_assert!(seen.insert(o.user.clone()), "two offers to {}", o.user);
                    prop_assert!(!on_gpu.contains(&o.user) && !booked.contains(&o.user));
                    prop_assert!(o.holds_at(t(now)), "an offer past its hold");
                    prop_assert!(o.until - o.offered_at == settings.hold);
                    let fits = waiting.iter().any(|w| w.user == o.user
                        && w.wanted.units == units(o)
                        && w.wanted.model.as_ref().is_none_or(|m| m.as_str() == o.model));
                    prop_assert!(fits, "offered what nobody asked for");
                }
                // Order: an eligible user never passed, wanting exactly a model that
                // was offered this round to someone who waited less long, has one.
                for o in offers.iter().filter(|o| o.offered_at == t(now)) {
                    let later = waiting.iter().filter(|w| w.user == o.user).map(|w| w.since).min();
                    for w in &waiting {
                        let same = w.wanted.model.as_ref().is_some_and(|m| m.as_str() == o.model)
                            && w.wanted.units <= units(o);
                        let fresh = !passed_before.contains_key(&w.user) && !book.passed.contains_key(&w.user);
                        let eligible = !on_gpu.contains(&w.user) && !booked.contains(&w.user);
                        // Its user's first notebook (the one the user waits with).
                        let first = waiting.iter().filter(|x| x.user == w.user)
                            .all(|x| (x.since, &x.pod) >= (w.since, &w.pod));
                        if same && fresh && eligible && first && later.is_some_and(|l| w.since < l) {
                            prop_assert!(offers.iter().any(|x| x.user == w.user),
                                "{} waited longer than {} and got nothing", w.user, o.user);
                        }
                    }
                }
            }
        }
    }
}
