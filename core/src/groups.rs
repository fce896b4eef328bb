//! Groups (a course, a research group) and the booking policy each gives its
//! members: which policy applies to a user, and for which model.
//!
//! - A group's policy overrides the lab's settings one by one ([`PolicyOverrides`]:
//!   `None` inherits), and a group's policy for one model overrides the group's
//!   ([`ModelRule`]); which models a group may book is [`GroupPolicy::allows`].
//! - A user in several groups gets the policy of the first of them in the admin's
//!   order (`position` ascending, then the name: [`applying`]); that group is also
//!   the one whose quota the user's new bookings count against (`crate::quota`).
//!   One group decides, not a merge of all: a merge ("the most generous of each
//!   setting") would give a student in a course and a research group limits that
//!   neither group has, and make the quota a booking counts against ambiguous.
//! - A user in no group gets the lab's policy.

use std::collections::BTreeMap;

use chrono::TimeDelta;

use crate::booking_policy::{human_duration, Policy, MAX_UNITS_PER_BOOKING_LIMIT};
use crate::rules::{Refusal, RuleCode};

/// Longest group name (bytes), as the database's check says.
pub const MAX_GROUP_NAME: usize = 128;

/// Longest setting a group may give (durations), as the database's checks say.
pub const MAX_POLICY_SECONDS: i64 = 315_360_000;

/// Most planned bookings a group may allow, as the database's check says.
pub const MAX_PLANNED_LIMIT: u32 = 1000;

/// Why a group name is not one (`None`: it is): 1 to 128 of `A-Z a-z 0-9 - . _ @`,
/// starting and ending with a letter or digit (a name from a token's claim or from
/// JupyterHub that is not such a name is never a group here).
pub fn name_problem(name: &str) -> Option<String> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok_inner = |c: char| alnum(c) || matches!(c, '-' | '.' | '_' | '@');
    if name.is_empty() || name.len() > MAX_GROUP_NAME {
        return Some(format!(
            "a group name is 1 to {MAX_GROUP_NAME} characters long"
        ));
    }
    let first_last_ok = name.starts_with(alnum) && name.ends_with(alnum);
    if !first_last_ok || !name.chars().all(ok_inner) {
        return Some(format!(
            "group name {name:?}: letters, digits, '-', '.', '_' and '@', starting and ending with a letter or digit"
        ));
    }
    None
}

/// A member's role: owners manage their group's members (and reservations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Role {
    #[default]
    Member,
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Owner => "owner",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "member" => Some(Role::Member),
            "owner" => Some(Role::Owner),
            _ => None,
        }
    }
}

/// Where a membership comes from. A sync from a source replaces only that source's
/// memberships; an admin's (`Admin`) is never removed by a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    Admin,
    Oidc,
    Hub,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Admin => "admin",
            Source::Oidc => "oidc",
            Source::Hub => "hub",
        }
    }

    pub fn parse(s: &str) -> Option<Source> {
        match s {
            "admin" => Some(Source::Admin),
            "oidc" => Some(Source::Oidc),
            "hub" => Some(Source::Hub),
            _ => None,
        }
    }
}

/// The settings a group (or a group for one model) changes; `None` inherits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyOverrides {
    pub min_duration: Option<TimeDelta>,
    pub max_duration: Option<TimeDelta>,
    pub cooldown: Option<TimeDelta>,
    pub no_booking_while_active: Option<bool>,
    pub max_planned: Option<u32>,
    pub max_units_per_booking: Option<u32>,
    pub max_ahead: Option<TimeDelta>,
}

impl PolicyOverrides {
    /// `base` with these settings over it.
    pub fn over(&self, base: &Policy) -> Policy {
        Policy {
            min_duration: self.min_duration.unwrap_or(base.min_duration),
            max_duration: self.max_duration.unwrap_or(base.max_duration),
            cooldown: self.cooldown.unwrap_or(base.cooldown),
            no_booking_while_active: self
                .no_booking_while_active
                .unwrap_or(base.no_booking_while_active),
            max_planned: self.max_planned.unwrap_or(base.max_planned),
            max_units_per_booking: self
                .max_units_per_booking
                .unwrap_or(base.max_units_per_booking)
                .min(MAX_UNITS_PER_BOOKING_LIMIT),
            max_ahead: self.max_ahead.unwrap_or(base.max_ahead),
            feed_show_names: base.feed_show_names,
            zone: base.zone,
        }
    }

    /// Why one of the settings is out of range (`None`: all are in range); the
    /// ranges are the database's checks.
    pub fn problem(&self) -> Option<String> {
        let secs = |d: Option<TimeDelta>| d.map(|d| d.num_seconds());
        let durations = [
            ("min_duration", secs(self.min_duration), 1),
            ("max_duration", secs(self.max_duration), 1),
            ("cooldown", secs(self.cooldown), 0),
            ("max_ahead", secs(self.max_ahead), 0),
        ];
        for (name, value, least) in durations {
            if let Some(v) = value {
                if !(least..=MAX_POLICY_SECONDS).contains(&v) {
                    return Some(format!(
                        "{name}: {v} seconds is outside {least}..={MAX_POLICY_SECONDS}"
                    ));
                }
            }
        }
        if let Some(n) = self.max_planned {
            if n > MAX_PLANNED_LIMIT {
                return Some(format!("max_planned: at most {MAX_PLANNED_LIMIT}"));
            }
        }
        if let Some(n) = self.max_units_per_booking {
            if !(1..=MAX_UNITS_PER_BOOKING_LIMIT).contains(&n) {
                return Some(format!(
                    "max_units_per_booking: 1 to {MAX_UNITS_PER_BOOKING_LIMIT}"
                ));
            }
        }
        None
    }
}

/// A group's rule for one model: whether its members may book it, and settings
/// over the group's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRule {
    pub allowed: bool,
    pub overrides: PolicyOverrides,
}

impl Default for ModelRule {
    fn default() -> Self {
        ModelRule {
            allowed: true,
            overrides: PolicyOverrides::default(),
        }
    }
}

/// A group's booking policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupPolicy {
    pub overrides: PolicyOverrides,
    /// Only the models of `models` whose rule allows them (otherwise every model
    /// but those whose rule forbids them).
    pub listed_models_only: bool,
    pub models: BTreeMap<String, ModelRule>,
}

impl GroupPolicy {
    /// Whether the group's members may book `model`.
    pub fn allows(&self, model: &str) -> bool {
        match self.models.get(model) {
            Some(rule) => rule.allowed,
            None => !self.listed_models_only,
        }
    }

    /// The policy for `model`: the lab's, under the group's, under the group's for
    /// the model. `None`: the group may not book it.
    pub fn for_model(&self, lab: &Policy, model: &str) -> Option<Policy> {
        if !self.allows(model) {
            return None;
        }
        let group = self.overrides.over(lab);
        Some(match self.models.get(model) {
            Some(rule) => rule.overrides.over(&group),
            None => group,
        })
    }

    /// Why this policy cannot be saved over `lab` (`None`: it can): a setting out
    /// of range, or a shortest booking longer than the longest, for the group or for
    /// one of its models.
    pub fn problem(&self, lab: &Policy) -> Option<String> {
        if let Some(p) = self.overrides.problem() {
            return Some(p);
        }
        let group = self.overrides.over(lab);
        if group.min_duration > group.max_duration {
            return Some(format!(
                "the shortest booking ({}) would be longer than the longest ({})",
                human_duration(group.min_duration),
                human_duration(group.max_duration)
            ));
        }
        for (model, rule) in &self.models {
            if let Some(p) = rule.overrides.problem() {
                return Some(format!("model {model}: {p}"));
            }
            let p = rule.overrides.over(&group);
            if p.min_duration > p.max_duration {
                return Some(format!(
                    "model {model}: the shortest booking ({}) would be longer than the longest ({})",
                    human_duration(p.min_duration),
                    human_duration(p.max_duration)
                ));
            }
        }
        None
    }
}

/// What places a group in the admin's order.
pub trait Ranked {
    fn position(&self) -> i32;
    fn name(&self) -> &str;
}

/// The group whose policy applies to a member of `groups`: the first in the
/// admin's order (`position`, then name). `None` for no group: the lab's policy.
pub fn applying<T: Ranked>(groups: &[T]) -> Option<&T> {
    groups
        .iter()
        .min_by(|a, b| (a.position(), a.name()).cmp(&(b.position(), b.name())))
}

/// The refusal of a model the caller's group may not book.
pub fn model_not_allowed(group: &str, model: &str) -> Refusal {
    Refusal::new(
        RuleCode::ModelNotAllowed,
        format!(
            "As a member of {group} you may not book {model}; ask the group's owner or an admin."
        ),
    )
}

/// The policy a user gets for `model`: the lab's (no group) or their applying
/// group's; the refusal when that group may not book the model.
pub fn resolve(
    lab: &Policy,
    group: Option<(&str, &GroupPolicy)>,
    model: &str,
) -> Result<Policy, Refusal> {
    match group {
        None => Ok(lab.clone()),
        Some((name, policy)) => policy
            .for_model(lab, model)
            .ok_or_else(|| model_not_allowed(name, model)),
    }
}

/// The sentence the page shows for one model: "As a member of ml-lab you may book
/// up to 7 days of an a100, starting at most 30 days ahead, with 14 days between
/// bookings."
pub fn sentence(group: Option<&str>, model: &str, policy: &Policy) -> String {
    let who = match group {
        Some(g) => format!("As a member of {g} you"),
        None => "You".to_string(),
    };
    let units = match policy.max_units_per_booking {
        1 => String::new(),
        n => format!(" (up to {n} GPUs at once)"),
    };
    let article = if model.starts_with(['a', 'e', 'i', 'o', 'u', 'A', 'E', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    };
    let gap = if policy.cooldown > TimeDelta::zero() {
        format!(
            ", with {} between bookings",
            human_duration(policy.cooldown)
        )
    } else {
        String::new()
    };
    format!(
        "{who} may book up to {} of {article} {model}{units}, starting at most {} ahead{gap}.",
        human_duration(policy.max_duration),
        human_duration(policy.max_ahead),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    struct G {
        position: i32,
        name: String,
    }

    impl Ranked for G {
        fn position(&self) -> i32 {
            self.position
        }
        fn name(&self) -> &str {
            &self.name
        }
    }

    fn g(position: i32, name: &str) -> G {
        G {
            position,
            name: name.into(),
        }
    }

    #[test]
    fn the_first_group_in_the_admins_order_applies() {
        let groups = [g(2, "a-course"), g(1, "ml-lab"), g(1, "b-lab")];
        assert_eq!(applying(&groups).map(|g| g.name.as_str()), Some("b-lab"));
        assert!(applying::<G>(&[]).is_none());
    }

    #[test]
    fn settings_inherit_model_over_group_over_lab() {
        let lab = Policy::default();
        let mut group = GroupPolicy {
            overrides: PolicyOverrides {
                max_duration: Some(TimeDelta::days(7)),
                cooldown: Some(TimeDelta::days(1)),
                ..Default::default()
            },
            ..Default::default()
        };
        group.models.insert(
            "a100".into(),
            ModelRule {
                allowed: true,
                overrides: PolicyOverrides {
                    max_duration: Some(TimeDelta::days(2)),
                    ..Default::default()
                },
            },
        );
        let t4 = group.for_model(&lab, "t4").unwrap();
        assert_eq!(t4.max_duration, TimeDelta::days(7));
        assert_eq!(t4.cooldown, TimeDelta::days(1));
        assert_eq!(t4.min_duration, lab.min_duration);
        let a100 = group.for_model(&lab, "a100").unwrap();
        assert_eq!(a100.max_duration, TimeDelta::days(2));
        assert_eq!(a100.cooldown, TimeDelta::days(1));
    }

    #[test]
    fn which_models_a_group_may_book() {
        let lab = Policy::default();
        let mut group = GroupPolicy::default();
        group.models.insert(
            "h100".into(),
            ModelRule {
                allowed: false,
                ..Default::default()
            },
        );
        assert!(group.allows("t4"));
        assert!(!group.allows("h100"));
        let refusal = resolve(&lab, Some(("course", &group)), "h100").unwrap_err();
        assert_eq!(refusal.code, RuleCode::ModelNotAllowed);
        assert!(refusal.message.contains("course"), "{}", refusal.message);
        group.listed_models_only = true;
        group.models.insert("t4".into(), ModelRule::default());
        assert!(group.allows("t4"));
        assert!(!group.allows("a100"));
        assert_eq!(resolve(&lab, None, "h100"), Ok(lab.clone()));
    }

    #[test]
    fn a_policy_that_cannot_hold_is_refused() {
        let lab = Policy::default();
        let bad = GroupPolicy {
            overrides: PolicyOverrides {
                min_duration: Some(TimeDelta::days(20)),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(bad.problem(&lab).is_some());
        let zero_units = GroupPolicy {
            overrides: PolicyOverrides {
                max_units_per_booking: Some(0),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(zero_units.problem(&lab).is_some());
        assert_eq!(GroupPolicy::default().problem(&lab), None);
    }

    #[test]
    fn group_names() {
        for ok in ["ml-lab", "CS101", "a", "course.2026_ws", "x@y"] {
            assert_eq!(name_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "-lab",
            "lab-",
            "ml lab",
            "/ml-lab",
            "ä",
            &"a".repeat(129),
        ] {
            assert!(name_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn the_sentence_names_group_model_and_limits() {
        let policy = Policy {
            max_duration: TimeDelta::days(7),
            max_ahead: TimeDelta::days(30),
            ..Policy::default()
        };
        assert_eq!(
            sentence(Some("ml-lab"), "a100", &policy),
            "As a member of ml-lab you may book up to 7 days of an a100, starting at most 30 days ahead, with 14 days between bookings."
        );
        assert!(sentence(None, "t4", &policy).starts_with("You may book up to 7 days of a t4"));
    }

    fn overrides() -> impl Strategy<Value = PolicyOverrides> {
        let d = proptest::option::of((1i64..100).prop_map(TimeDelta::hours));
        (
            d.clone(),
            d.clone(),
            d.clone(),
            proptest::option::of(any::<bool>()),
            proptest::option::of(0u32..5),
            proptest::option::of(1u32..8),
            d,
        )
            .prop_map(|(a, b, c, e, f, u, h)| PolicyOverrides {
                min_duration: a,
                max_duration: b,
                cooldown: c,
                no_booking_while_active: e,
                max_planned: f,
                max_units_per_booking: u,
                max_ahead: h,
            })
    }

    proptest! {
        /// Against a reference: each setting is the model's if it sets it, else the
        /// group's if it sets it, else the lab's; and the group that applies is the
        /// smallest (position, name).
        #[test]
        fn resolution_follows_the_order(
            group in overrides(),
            model in overrides(),
            ranks in proptest::collection::vec((0i32..4, "[a-d]{1,2}"), 0..6),
        ) {
            let lab = Policy::default();
            let mut gp = GroupPolicy { overrides: group.clone(), ..Default::default() };
            gp.models.insert("m".into(), ModelRule { allowed: true, overrides: model.clone() });
            let got = gp.for_model(&lab, "m").unwrap();
            let pick = |m: Option<TimeDelta>, g: Option<TimeDelta>, l: TimeDelta| m.or(g).unwrap_or(l);
            prop_assert_eq!(got.min_duration, pick(model.min_duration, group.min_duration, lab.min_duration));
            prop_assert_eq!(got.max_duration, pick(model.max_duration, group.max_duration, lab.max_duration));
            prop_assert_eq!(got.cooldown, pick(model.cooldown, group.cooldown, lab.cooldown));
            prop_assert_eq!(got.max_ahead, pick(model.max_ahead, group.max_ahead, lab.max_ahead));
            prop_assert_eq!(got.max_planned, model.max_planned.or(group.max_planned).unwrap_or(lab.max_planned));
            prop_assert_eq!(
                got.max_units_per_booking,
                model.max_units_per_booking.or(group.max_units_per_booking).unwrap_or(lab.max_units_per_booking)
            );
            prop_assert_eq!(
                got.no_booking_while_active,
                model.no_booking_while_active.or(group.no_booking_while_active).unwrap_or(lab.no_booking_while_active)
            );
            let groups: Vec<G> = ranks.iter().map(|(p, n)| g(*p, n)).collect();
            let expected = ranks.iter().min().map(|(_, n)| n.clone());
            prop_assert_eq!(applying(&groups).map(|g| g.name.clone()), expected);
        }
    }
}
