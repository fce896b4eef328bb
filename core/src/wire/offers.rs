//! `PUT /api/v1/offers` and `GET /api/v1/offers`: GPUs offered back to users whose
//! notebooks run on CPU (stripped at spawn, or their lent GPU taken back). The
//! controller decides who is offered what ([`crate::offers`]) and reports the whole
//! list each round; the booking service tells each newly offered user (a notice)
//! and puts the offers in the admission state, so that the webhook holds each
//! offered unit for its user against other lending until the offer's `until`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The most offers one report may carry: one per free unit at most, and no lab has
/// this many free cards at once.
pub const MAX_OFFERS: usize = 1_000;
/// The longest user name, namespace, pod or model in an offer, in bytes.
pub const MAX_OFFER_NAME_LEN: usize = 256;
/// The most units one offer may hold.
pub const MAX_OFFER_UNITS: i32 = 64;

/// One offer: `units` of `model` held for `user` until `until`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Offer {
    /// The user it is for, as their notebook names them (`hub.jupyter.org/username`).
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub user: String,
    /// The model of the units held.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub model: String,
    /// Units held (a notebook that asked for two GPUs is offered two at once).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 64))]
    pub units: i32,
    /// The notebook on CPU it is offered for.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub namespace: String,
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub pod: String,
    /// When it was made: with the user and model, what makes it one offer (its
    /// user is told once).
    pub offered_at: DateTime<Utc>,
    /// Until when the units are held for the user (`--offer-hold` after
    /// `offered_at`); past it the webhook no longer holds them.
    pub until: DateTime<Utc>,
    /// The controller restarts the user's server through JupyterHub when it is idle
    /// (the user opted in and the controller runs `--on-expiry hub-restart`). Set by
    /// the service in its answer; ignored in a report.
    #[serde(default)]
    pub restart: bool,
}

impl Offer {
    /// Why this offer cannot be recorded, if it cannot.
    pub fn problem(&self) -> Option<String> {
        let names = [
            ("user", &self.user),
            ("model", &self.model),
            ("namespace", &self.namespace),
            ("pod", &self.pod),
        ];
        for (what, name) in names {
            if name.is_empty()
                || name.len() > MAX_OFFER_NAME_LEN
                || name.chars().any(char::is_control)
            {
                return Some(format!(
                    "offers: {what} must be 1 to {MAX_OFFER_NAME_LEN} bytes without a control \
                     character"
                ));
            }
        }
        if !(1..=MAX_OFFER_UNITS).contains(&self.units) {
            return Some(format!(
                "offers: units of the offer to {} must be between 1 and {MAX_OFFER_UNITS}",
                self.user
            ));
        }
        if self.until <= self.offered_at {
            return Some(format!(
                "offers: the offer to {} must end after it was made",
                self.user
            ));
        }
        None
    }

    /// Whether the units are still held at `now`.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        self.offered_at <= now && now < self.until
    }
}

/// The controller's report: every current offer (an offer left out is over).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OffersReport {
    #[cfg_attr(feature = "openapi", schema(max_items = 1000))]
    pub offers: Vec<Offer>,
}

impl OffersReport {
    /// Why the report cannot be recorded, if it cannot: too many offers, one that
    /// [`Offer::problem`] refuses, or two offers to one user (one at a time).
    pub fn problem(&self) -> Option<String> {
        if self.offers.len() > MAX_OFFERS {
            return Some(format!("offers: at most {MAX_OFFERS} per report"));
        }
        if let Some(p) = self.offers.iter().find_map(Offer::problem) {
            return Some(p);
        }
        let mut users: Vec<&str> = self.offers.iter().map(|o| o.user.as_str()).collect();
        users.sort_unstable();
        users
            .windows(2)
            .find(|w| w[0] == w[1])
            .map(|w| format!("offers: one offer per user at a time ({} has two)", w[0]))
    }
}

/// The service's answer to a report, and `GET /api/v1/offers`: the offers it keeps
/// (those to users with a booking now are dropped: their spawn is booked anyway),
/// each with `restart` set for a user who opted in; and the users dropped for their
/// booking.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Offers {
    pub offers: Vec<Offer>,
    /// Users of the report with a booking now, whose offers were not kept.
    #[serde(default)]
    pub booked: Vec<String>,
}

/// The units of `model` held at `now` for users other than `user` (all of them
/// when `user` is `None`): what a lend to `user` must leave free.
pub fn held_for_others<'a>(
    offers: impl IntoIterator<Item = &'a Offer>,
    model: &str,
    user: Option<&str>,
    now: DateTime<Utc>,
) -> u64 {
    offers
        .into_iter()
        .filter(|o| o.model == model && o.holds_at(now) && Some(o.user.as_str()) != user)
        .map(|o| u64::try_from(o.units).unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn offer(user: &str) -> Offer {
        Offer {
            user: user.into(),
            model: "a100".into(),
            units: 1,
            namespace: "jhub".into(),
            pod: format!("jupyter-{user}"),
            offered_at: t(0),
            until: t(300),
            restart: false,
        }
    }

    #[test]
    fn a_report_is_bounded_and_one_offer_per_user() {
        let ok = OffersReport {
            offers: vec![offer("alice"), offer("bob")],
        };
        assert_eq!(ok.problem(), None);
        let twice = OffersReport {
            offers: vec![offer("alice"), offer("alice")],
        };
        assert!(twice.problem().unwrap().contains("alice has two"));
        let with = |f: &dyn Fn(&mut Offer)| {
            let mut o = offer("alice");
            f(&mut o);
            o.problem()
        };
        assert!(with(&|o| o.user.clear()).is_some());
        assert!(with(&|o| o.pod = "a\nb".into()).is_some());
        assert!(with(&|o| o.model = "m".repeat(MAX_OFFER_NAME_LEN + 1)).is_some());
        assert!(with(&|o| o.units = 0).is_some());
        assert!(with(&|o| o.units = MAX_OFFER_UNITS + 1).is_some());
        assert!(with(&|o| o.until = o.offered_at).is_some());
        let many = OffersReport {
            offers: (0..=MAX_OFFERS).map(|i| offer(&format!("u{i}"))).collect(),
        };
        assert!(many.problem().is_some());
    }

    #[test]
    fn units_are_held_for_others_until_the_offer_ends() {
        let offers = [offer("alice"), {
            let mut o = offer("bob");
            o.units = 2;
            o
        }];
        assert_eq!(held_for_others(&offers, "a100", Some("carol"), t(10)), 3);
        assert_eq!(held_for_others(&offers, "a100", Some("alice"), t(10)), 2);
        assert_eq!(held_for_others(&offers, "a100", None, t(10)), 3);
        assert_eq!(held_for_others(&offers, "h100", Some("carol"), t(10)), 0);
        assert_eq!(held_for_others(&offers, "a100", Some("carol"), t(300)), 0);
        assert_eq!(held_for_others(&offers, "a100", Some("carol"), t(-1)), 0);
    }
}
