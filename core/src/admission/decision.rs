//! The admission decision for a GPU pod, from the booking service's answer.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{AdmissionConfig, GpuRequest, Identity};
use crate::gpu_model::ModelName;
pub use crate::wire::Schedulability;

/// Kubernetes shows warnings to the user; it asks for at most 120 characters.
pub const MAX_WARNING_CHARS: usize = 120;

/// What to do with a GPU pod when the booking service cannot answer in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BookingErrorPolicy {
    /// Let the pod through unchanged (with a warning).
    #[default]
    Allow,
    /// Remove its GPU, as for an unbooked user when nothing is free.
    Strip,
}

impl FromStr for BookingErrorPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(Self::Allow),
            "strip" => Ok(Self::Strip),
            other => Err(format!("expected allow or strip, not {other:?}")),
        }
    }
}

impl fmt::Display for BookingErrorPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allow => "allow",
            Self::Strip => "strip",
        })
    }
}

/// What a pod that asks for no GPU resource but sets `NVIDIA_VISIBLE_DEVICES` gets
/// (the NVIDIA container runtime reads the variable: `all` would hand it every card
/// of its node, seen by no scheduler, booking or count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum VisibleDevicesWithoutGpu {
    /// The variable set to `none` in every container that sets it, with a warning.
    #[default]
    Strip,
    /// Left as the pod's creator wrote it.
    Allow,
}

impl FromStr for VisibleDevicesWithoutGpu {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "strip" => Ok(Self::Strip),
            "allow" => Ok(Self::Allow),
            other => Err(format!("expected strip or allow, not {other:?}")),
        }
    }
}

/// The warning a pod gets when its `NVIDIA_VISIBLE_DEVICES` was set to `none`.
pub const VISIBLE_DEVICES_STRIPPED: &str = "NVIDIA_VISIBLE_DEVICES set to none: this pod asks for no GPU resource, and a GPU comes only with one (ask for nvidia.com/gpu, or book one)";

/// What a GPU pod without a trusted identity gets: never a card lent where the
/// controller cannot take it back ([`super::LendNamespaces`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnidentifiedGpuPods {
    /// Where the controller can take a card back: treated as an unbooked user's pod,
    /// a free unit at low priority (preemptible for a booked user), else no GPU.
    /// Elsewhere: another workload, admitted as its creator wrote it
    /// ([`Decision::OtherWorkload`]).
    #[default]
    Lent,
    /// Always runs without its GPU, with a warning that says why.
    Strip,
}

impl FromStr for UnidentifiedGpuPods {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lent" => Ok(Self::Lent),
            "strip" => Ok(Self::Strip),
            other => Err(format!("expected lent or strip, not {other:?}")),
        }
    }
}

impl fmt::Display for UnidentifiedGpuPods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Lent => "lent",
            Self::Strip => "strip",
        })
    }
}

/// What the webhook asks the booking service about a GPU pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask<'a> {
    /// The owner's active booking and the free units (`?user=` or `?slug=`).
    Owner(&'a Identity),
    /// Only the free units, for a pod without identity that may be lent (no query).
    FreeUnits,
}

/// What to ask for a GPU pod with `identity` (trusted, see
/// [`super::trusted_identity`]) created in `namespace`; `Err`: nobody is asked, and
/// the pod is decided with that lookup ([`Lookup::NoIdentity`],
/// [`Lookup::OtherWorkload`]).
pub fn what_to_ask<'a>(
    identity: Option<&'a Identity>,
    namespace: Option<&str>,
    cfg: &AdmissionConfig,
) -> Result<Ask<'a>, Lookup<'static>> {
    match (identity, cfg.unidentified_gpu_pods) {
        (Some(owner), _) => Ok(Ask::Owner(owner)),
        (None, UnidentifiedGpuPods::Strip) => Err(Lookup::NoIdentity),
        (None, UnidentifiedGpuPods::Lent) if cfg.lend_namespaces.contains(namespace) => {
            Ok(Ask::FreeUnits)
        }
        (None, UnidentifiedGpuPods::Lent) => Err(Lookup::OtherWorkload),
    }
}

impl Schedulability {
    /// The budget due to a pod on `model` (per unit), before the nodes are asked:
    /// the service's declared one, else the configured one.
    fn budget_due(&self, model: &ModelName, cfg: &AdmissionConfig) -> Option<u64> {
        self.gpumem_mib
            .get(model)
            .copied()
            .or_else(|| cfg.gpumem_for(Some(model)))
    }

    /// The VRAM budget per unit a pod on `model` gets: the one due, capped at what one
    /// unit of the model can hold, and none when the model's nodes do not advertise
    /// the budget resource.
    pub fn budget_for(&self, model: &ModelName, cfg: &AdmissionConfig) -> Option<u64> {
        let due = self.budget_due(model, cfg)?;
        match &self.gpumem_advertised_mib {
            None => Some(due),
            Some(advertised) => advertised.get(model).map(|&unit| due.min(unit)),
        }
    }

    /// Whether a budget is due on `model` but withheld because its nodes do not
    /// advertise the budget resource (the webhook logs and counts it).
    pub fn budget_withheld(&self, model: &ModelName, cfg: &AdmissionConfig) -> bool {
        self.budget_due(model, cfg).is_some() && self.budget_for(model, cfg).is_none()
    }

    /// When the user could book `model` (any model, when `None`).
    pub fn earliest_booking_of(&self, model: Option<&ModelName>) -> Option<DateTime<Utc>> {
        model
            .and_then(|m| self.earliest_booking_by_model.get(m).copied())
            .or(self.earliest_booking)
    }
}

/// A booked user's pod that asks for more GPUs than the booking has free: the
/// booking covers `units`, its pods already hold `held`, this pod asks for `asked`.
/// The pod is treated as unbooked (lent or stripped), and the warning says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeyondBooking {
    pub booking_id: i64,
    pub units: u64,
    pub held: u64,
    pub asked: u64,
    /// The booking is a course's session, shared by its group's members.
    pub course: bool,
}

impl BeyondBooking {
    /// Whether a pod asking for `asked` GPUs goes past a booking of `units` whose
    /// pods hold `held`: a booking gives high priority to at most its units at once.
    pub fn check(booking_id: i64, units: u64, held: u64, asked: u64) -> Option<BeyondBooking> {
        (held.saturating_add(asked) > units).then_some(BeyondBooking {
            booking_id,
            units,
            held,
            asked,
            course: false,
        })
    }

    /// What the pod went beyond, for a lent pod's warning: "beyond your booking: 1
    /// GPU, 1 in use", or "the course's 2 GPUs are all in use".
    fn beyond_what(&self) -> String {
        if self.course {
            self.describe()
        } else {
            format!("beyond your {}", self.describe())
        }
    }

    /// "booking: 1 GPU, 1 in use" (a course's session: "the course's 2 GPUs are all
    /// in use"), for the warnings.
    fn describe(&self) -> String {
        let gpus = if self.units == 1 { "GPU" } else { "GPUs" };
        match (self.course, self.held >= self.units) {
            (true, true) => format!("the course's {} {gpus} are all in use", self.units),
            (true, false) => format!(
                "course session: {} {gpus}, {} in use",
                self.units, self.held
            ),
            (false, _) => format!("booking: {} {gpus}, {} in use", self.units, self.held),
        }
    }
}

/// What the webhook learned about the pod's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The pod has no trusted identity and such pods are stripped
    /// ([`UnidentifiedGpuPods::Strip`]); nobody was asked. (A pod without identity that
    /// may be lent is asked about as [`Ask::FreeUnits`] and comes as an answer.)
    NoIdentity,
    /// The pod has no trusted identity and its namespace is not one where the
    /// controller could take a lent card back ([`super::LendNamespaces`]); nobody
    /// was asked.
    OtherWorkload,
    /// The booking service answered.
    Answer(&'a Schedulability),
    /// The booking service failed (error status, timeout, unreadable body).
    Failed(&'a str),
}

/// Why a GPU is taken from a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StripReason {
    /// No booking and no free unit of the model (of any model, when `None`).
    NothingFree { model: Option<ModelName> },
    /// The pod names several GPU models at once; no node has them all.
    SeveralModels,
    /// The booking service failed and the policy is [`BookingErrorPolicy::Strip`].
    BookingServiceError,
    /// No trusted spawner vouches for the pod's owner and the policy is
    /// [`UnidentifiedGpuPods::Strip`].
    NoIdentity,
    /// The owner's booking has no GPU left for this pod (all in use by their other
    /// pods, or the pod asks for more than it is for) and no other unit is free.
    BeyondBooking {
        model: ModelName,
        beyond: BeyondBooking,
    },
}

/// What happens to a GPU pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The owner has an active booking: high priority on the booked model until it ends.
    Booked {
        booking_id: i64,
        model: ModelName,
        until: DateTime<Utc>,
        /// Budget per GPU unit.
        gpumem_mib: Option<u64>,
        /// No unit of the model was free at admission (for the audit row; the
        /// controller preempts only if the pod then stays Pending).
        preempt: bool,
        /// The GPUs the booking is for (`None`: a service that does not say).
        booking_units: Option<u64>,
    },
    /// No booking, but a unit is free: the pod gets it at low priority (preemptible).
    LowPriority {
        model: ModelName,
        gpumem_mib: Option<u64>,
        /// Set when the owner is booked but the pod goes past the booking's units.
        beyond_booking: Option<BeyondBooking>,
    },
    /// The pod runs without its GPU.
    Strip {
        reason: StripReason,
        earliest_booking: Option<DateTime<Utc>>,
    },
    /// The booking service failed and the policy is [`BookingErrorPolicy::Allow`]:
    /// the pod goes through unchanged.
    Unchecked { message: String },
    /// Not a pod of the bookings ([`Lookup::OtherWorkload`]): its GPU kept as its
    /// creator wrote it, not lent (no low class, no model, not in the lend ledger:
    /// the controller could never take the card back), and counted by the
    /// controller as another workload holding its card.
    OtherWorkload,
}

/// The decision for a pod that asks for `gpu`, given what is known about its owner.
/// `now` decides whether a booking that the service calls active has already ended.
pub fn decide(
    gpu: &GpuRequest,
    lookup: Lookup<'_>,
    cfg: &AdmissionConfig,
    now: DateTime<Utc>,
) -> Decision {
    let answer = match lookup {
        Lookup::NoIdentity => {
            return Decision::Strip {
                reason: StripReason::NoIdentity,
                earliest_booking: None,
            }
        }
        Lookup::OtherWorkload => return Decision::OtherWorkload,
        Lookup::Failed(message) => return on_booking_error(message, cfg),
        Lookup::Answer(answer) => answer,
    };
    let budget = |model: &ModelName| answer.budget_for(model, cfg);
    if gpu.models.len() > 1 {
        return Decision::Strip {
            reason: StripReason::SeveralModels,
            earliest_booking: None,
        };
    }
    let mut beyond_booking = None;
    if answer.schedulable {
        let (Some(booking_id), Some(model), Some(until)) =
            (answer.booking_id, answer.model.as_ref(), answer.until)
        else {
            return on_booking_error(
                "the booking service called the user booked but named no booking",
                cfg,
            );
        };
        let same_model = gpu.model().is_none_or(|asked| asked == model);
        if until > now && same_model {
            // A booking covers its units and no more: what is
            // left of it after its other pods, by the controller's last count.
            beyond_booking = answer.units.and_then(|units| {
                BeyondBooking::check(booking_id, units, answer.units_held.unwrap_or(0), gpu.units)
                    .map(|beyond| BeyondBooking {
                        course: answer.course,
                        ..beyond
                    })
            });
            if beyond_booking.is_none() {
                return Decision::Booked {
                    booking_id,
                    model: model.clone(),
                    until,
                    gpumem_mib: budget(model),
                    preempt: answer.free.get(model).is_none_or(|&free| free == 0),
                    booking_units: answer.units,
                };
            }
        }
    }
    // Not booked (for this model, or any more): a free unit, else no GPU. A unit
    // offered back to another user is not free to this one while it is held.
    let free = |model: &ModelName| {
        let held = crate::wire::offers::held_for_others(
            &answer.offers,
            model.as_str(),
            answer.user.as_deref(),
            now,
        );
        answer
            .free
            .get(model)
            .copied()
            .unwrap_or(0)
            .saturating_sub(held)
    };
    let lend = match gpu.model() {
        Some(asked) => (free(asked) > 0).then_some(asked),
        // The model with the most free units; the first by name among equals.
        None => answer
            .free
            .keys()
            .map(|model| (model, free(model)))
            .filter(|(_, n)| *n > 0)
            .max_by(|(a, n), (b, m)| n.cmp(m).then_with(|| b.cmp(a)))
            .map(|(model, _)| model),
    };
    match (lend, beyond_booking, answer.model.as_ref()) {
        (Some(model), _, _) => Decision::LowPriority {
            model: model.clone(),
            gpumem_mib: budget(model),
            beyond_booking,
        },
        (None, Some(beyond), Some(booked)) => Decision::Strip {
            reason: StripReason::BeyondBooking {
                model: booked.clone(),
                beyond,
            },
            earliest_booking: None,
        },
        (None, _, _) => Decision::Strip {
            reason: StripReason::NothingFree {
                model: gpu.model().cloned(),
            },
            earliest_booking: answer.earliest_booking_of(gpu.model()),
        },
    }
}

fn on_booking_error(message: &str, cfg: &AdmissionConfig) -> Decision {
    match cfg.on_booking_error {
        BookingErrorPolicy::Allow => Decision::Unchecked {
            message: message.to_owned(),
        },
        BookingErrorPolicy::Strip => Decision::Strip {
            reason: StripReason::BookingServiceError,
            earliest_booking: None,
        },
    }
}

impl Decision {
    /// A short stable name, for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::Booked { .. } => "booked",
            Decision::LowPriority { .. } => "low_priority",
            Decision::Strip {
                reason: StripReason::BookingServiceError,
                ..
            } => "booking_error_strip",
            Decision::Strip {
                reason: StripReason::NoIdentity,
                ..
            } => "no_identity_strip",
            Decision::Strip { .. } => "strip",
            Decision::Unchecked { .. } => "booking_error_allow",
            Decision::OtherWorkload => "other_workload",
        }
    }

    /// The audit action the webhook reports, if any.
    pub fn audit_action(&self) -> Option<&'static str> {
        match self {
            Decision::Booked { .. } => Some("webhook.booked"),
            Decision::LowPriority { .. } => Some("webhook.low-priority"),
            Decision::Strip { .. } => Some("webhook.strip"),
            Decision::Unchecked { .. } => Some("webhook.unchecked"),
            // Not the bookings' business: logged and counted, no audit row.
            Decision::OtherWorkload => None,
        }
    }

    /// The model whose GPU the pod gets (booked or lent).
    pub fn model(&self) -> Option<&ModelName> {
        match self {
            Decision::Booked { model, .. } | Decision::LowPriority { model, .. } => Some(model),
            _ => None,
        }
    }

    /// The booking and model that had no free unit at admission (the webhook only
    /// reports it; the controller decides from the Pending pod).
    pub fn preemption(&self) -> Option<(i64, &ModelName)> {
        match self {
            Decision::Booked {
                booking_id,
                model,
                preempt: true,
                ..
            } => Some((*booking_id, model)),
            _ => None,
        }
    }

    /// Why the GPU was removed, for the pod annotation; `None` unless stripped.
    pub fn removal_reason(&self) -> Option<String> {
        let Decision::Strip { reason, .. } = self else {
            return None;
        };
        Some(match reason {
            StripReason::NothingFree { model: Some(model) } => {
                format!("no free {model} GPU and no active booking")
            }
            StripReason::NothingFree { model: None } => {
                "no free GPU and no active booking".to_owned()
            }
            StripReason::SeveralModels => "the pod asks for several GPU models at once".to_owned(),
            StripReason::BookingServiceError => {
                "the booking service could not be asked (policy: strip)".to_owned()
            }
            StripReason::NoIdentity => "the pod was not created by JupyterHub".to_owned(),
            StripReason::BeyondBooking { model, beyond } => {
                format!("{}; no other free {model} GPU", beyond.describe())
            }
        })
    }

    /// The admission warning shown to the user (at most [`MAX_WARNING_CHARS`]).
    pub fn warning(&self) -> Option<String> {
        let text = match self {
            // Admitted as written: nothing to tell its creator.
            Decision::OtherWorkload => return None,
            Decision::Booked { model, until, .. } => format!(
                "gpu-booking: booked {model} GPU until {}",
                until.format("%Y-%m-%d %H:%M UTC")
            ),
            Decision::LowPriority {
                model,
                beyond_booking: None,
                ..
            } => format!(
                "gpu-booking: {model} GPU lent without a booking; it may be reclaimed for a booked user"
            ),
            Decision::LowPriority {
                model,
                beyond_booking: Some(beyond),
                ..
            } => {
                let text = format!(
                    "gpu-booking: {}: {model} GPU lent, it may be reclaimed",
                    beyond.beyond_what()
                );
                if text.chars().count() <= MAX_WARNING_CHARS {
                    text
                } else {
                    format!(
                        "gpu-booking: {}: GPU lent, it may be reclaimed",
                        beyond.beyond_what()
                    )
                }
            }
            Decision::Strip {
                reason,
                earliest_booking,
            } => {
                let say = |why: &str| match earliest_booking {
                    Some(t) => format!(
                        "gpu-booking: GPU removed ({why}); you can book from {}",
                        t.format("%Y-%m-%d %H:%M UTC")
                    ),
                    None => format!("gpu-booking: GPU removed ({why}); running on CPU"),
                };
                let text = say(&self.removal_reason().unwrap_or_default());
                if text.chars().count() <= MAX_WARNING_CHARS {
                    text
                } else {
                    // A long model name must not push the date out of the message.
                    say(&match reason {
                        StripReason::NothingFree { .. } => {
                            "no free GPU and no active booking".to_owned()
                        }
                        StripReason::BeyondBooking { beyond, .. } => {
                            format!("{}; no other free GPU", beyond.describe())
                        }
                        _ => "see the pod's annotations".to_owned(),
                    })
                }
            }
            Decision::Unchecked { .. } => {
                "gpu-booking: booking service unavailable; GPU admitted without a check".to_owned()
            }
        };
        Some(truncate_chars(&text, MAX_WARNING_CHARS))
    }
}

/// `text` cut to at most `max` characters, with an ellipsis when cut.
fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn model(name: &str) -> ModelName {
        ModelName::parse(name).unwrap()
    }

    fn now() -> DateTime<Utc> {
        "2026-11-01T00:00:00Z".parse().unwrap()
    }

    fn generic() -> GpuRequest {
        GpuRequest {
            units: 1,
            models: BTreeSet::new(),
        }
    }

    fn answer(booked: Option<&str>, free: &[(&str, u64)]) -> Schedulability {
        Schedulability {
            schedulable: booked.is_some(),
            until: booked.map(|_| "2026-11-30T00:00:00Z".parse().unwrap()),
            model: booked.map(model),
            booking_id: booked.map(|_| 17),
            user: Some("alice@example.com".into()),
            free: free.iter().map(|(m, n)| (model(m), *n)).collect(),
            gpumem_mib: [(model("a100"), 40960)].into_iter().collect(),
            earliest_booking: Some("2026-12-01T09:00:00Z".parse().unwrap()),
            gpumem_advertised_mib: None,
            earliest_booking_by_model: BTreeMap::new(),
            units: None,
            units_held: None,
            usage_reported_at: BTreeMap::new(),
            offers: Vec::new(),
            course: false,
        }
    }

    #[test]
    fn a_unit_offered_back_is_held_for_its_user_only() {
        let cfg = AdmissionConfig::default();
        let offer = |user: &str, until: &str| crate::wire::offers::Offer {
            user: user.into(),
            model: "a100".into(),
            units: 1,
            namespace: "jhub".into(),
            pod: format!("jupyter-{user}"),
            offered_at: "2026-10-31T23:58:00Z".parse().unwrap(),
            until: until.parse().unwrap(),
            restart: false,
        };
        let mut a = answer(None, &[("a100", 1), ("h100", 0)]);
        a.offers = vec![offer("bob", "2026-11-01T00:03:00Z")];
        // Alice may not take the unit held for bob, on that model or as any model.
        let d = decide(&gpus(1, Some("a100")), Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.kind(), "strip");
        assert_eq!(
            decide(&generic(), Lookup::Answer(&a), &cfg, now()).kind(),
            "strip"
        );
        // Bob's spawn gets it.
        a.user = Some("bob".into());
        let d = decide(&gpus(1, Some("a100")), Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.model(), Some(&model("a100")));
        // A second free unit is anyone's.
        let mut two = answer(None, &[("a100", 2)]);
        two.offers = a.offers.clone();
        assert_eq!(
            decide(&generic(), Lookup::Answer(&two), &cfg, now()).kind(),
            "low_priority"
        );
        // Past its hold the unit is free to all.
        a.user = Some("alice@example.com".into());
        a.offers = vec![offer("bob", "2026-11-01T00:00:00Z")];
        assert_eq!(
            decide(&generic(), Lookup::Answer(&a), &cfg, now()).kind(),
            "low_priority"
        );
        // A booked user's pod is booked whatever is held.
        let mut booked = answer(Some("a100"), &[("a100", 1)]);
        booked.offers = vec![offer("bob", "2026-11-01T00:03:00Z")];
        assert_eq!(
            decide(&generic(), Lookup::Answer(&booked), &cfg, now()).kind(),
            "booked"
        );
    }

    #[test]
    fn no_budget_for_a_model_whose_nodes_do_not_advertise_it() {
        let cfg = AdmissionConfig {
            default_gpumem_mib: Some(8192),
            ..AdmissionConfig::default()
        };
        let mut a = answer(Some("a100"), &[("a100", 1), ("t4", 2)]);
        // The inventory report says: only t4's nodes advertise, 14848 MiB per card.
        a.gpumem_advertised_mib = Some([(model("t4"), 14848)].into_iter().collect());
        let d = decide(&generic(), Lookup::Answer(&a), &cfg, now());
        assert!(
            matches!(
                d,
                Decision::Booked {
                    gpumem_mib: None,
                    ..
                }
            ),
            "{d:?}"
        );
        assert!(a.budget_withheld(&model("a100"), &cfg));
        // Lent on t4: budgeted, and never above what one card holds.
        let t4 = GpuRequest {
            units: 1,
            models: [model("t4")].into_iter().collect(),
        };
        let d = decide(&t4, Lookup::Answer(&a), &cfg, now());
        assert_eq!(
            d,
            Decision::LowPriority {
                model: model("t4"),
                gpumem_mib: Some(8192),
                beyond_booking: None,
            }
        );
        assert!(!a.budget_withheld(&model("t4"), &cfg));
        a.gpumem_mib.insert(model("t4"), 40960);
        assert_eq!(a.budget_for(&model("t4"), &cfg), Some(14848));
        // Nothing advertised anywhere: no budget at all.
        a.gpumem_advertised_mib = Some(BTreeMap::new());
        let d = decide(&t4, Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.model(), Some(&model("t4")));
        assert!(matches!(
            d,
            Decision::LowPriority {
                gpumem_mib: None,
                ..
            }
        ));
        // No budget due: nothing withheld.
        assert!(!a.budget_withheld(&model("x"), &AdmissionConfig::default()));
    }

    #[test]
    fn booked_with_a_free_unit_and_full() {
        let cfg = AdmissionConfig::default();
        let a = answer(Some("a100"), &[("a100", 1)]);
        let d = decide(&generic(), Lookup::Answer(&a), &cfg, now());
        assert!(matches!(
            d,
            Decision::Booked {
                preempt: false,
                gpumem_mib: Some(40960),
                ..
            }
        ));
        assert_eq!(d.preemption(), None);
        let a = answer(Some("a100"), &[("a100", 0), ("a6000", 3)]);
        let d = decide(&generic(), Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.preemption(), Some((17, &model("a100"))));
    }

    fn gpus(units: u64, asked: Option<&str>) -> GpuRequest {
        GpuRequest {
            units,
            models: asked.map(model).into_iter().collect(),
        }
    }

    #[test]
    fn a_booking_gives_high_priority_to_its_units_only() {
        let cfg = AdmissionConfig::default();
        let mut a = answer(Some("a100"), &[("a100", 2), ("a6000", 0)]);
        a.units = Some(2);
        a.units_held = Some(0);
        // Two GPUs of a 2-unit booking: booked, and the pod says so.
        let d = decide(&gpus(2, None), Lookup::Answer(&a), &cfg, now());
        assert!(
            matches!(
                d,
                Decision::Booked {
                    booking_units: Some(2),
                    ..
                }
            ),
            "{d:?}"
        );
        // One held already: a second single-GPU pod still fits, a 2-GPU one does not.
        a.units_held = Some(1);
        assert_eq!(
            decide(&gpus(1, None), Lookup::Answer(&a), &cfg, now()).kind(),
            "booked"
        );
        let d = decide(&gpus(2, Some("a100")), Lookup::Answer(&a), &cfg, now());
        assert_eq!(
            d,
            Decision::LowPriority {
                model: model("a100"),
                gpumem_mib: Some(40960),
                beyond_booking: BeyondBooking::check(17, 2, 1, 2),
            }
        );
        let w = d.warning().unwrap();
        assert!(
            w.contains("beyond your booking: 2 GPUs, 1 in use") && w.contains("lent"),
            "{w}"
        );
        // Both held: the next pod is lent while a unit is free ...
        a.units_held = Some(2);
        let d = decide(&gpus(1, None), Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.kind(), "low_priority");
        assert_eq!(d.audit_action(), Some("webhook.low-priority"));
        // ... and stripped when none is, saying why (no date: the user is booked).
        a.free.insert(model("a100"), 0);
        let d = decide(&gpus(1, None), Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.kind(), "strip");
        let w = d.warning().unwrap();
        assert!(
            w.contains("booking: 2 GPUs, 2 in use; no other free a100 GPU") && w.contains("CPU"),
            "{w}"
        );
        assert!(d.removal_reason().unwrap().contains("2 in use"));
    }

    #[test]
    fn a_four_gpu_pod_against_a_one_unit_booking_is_not_high() {
        let cfg = AdmissionConfig::default();
        let mut a = answer(Some("a100"), &[("a100", 4)]);
        a.units = Some(1);
        let d = decide(&gpus(4, None), Lookup::Answer(&a), &cfg, now());
        assert!(
            matches!(d, Decision::LowPriority { beyond_booking: Some(b), .. } if b.asked == 4 && b.units == 1),
            "{d:?}"
        );
        assert!(d.warning().unwrap().contains("booking: 1 GPU, 0 in use"));
        // A service that does not say the units: the booking covers the pod, as before.
        a.units = None;
        let d = decide(&gpus(4, None), Lookup::Answer(&a), &cfg, now());
        assert!(
            matches!(
                d,
                Decision::Booked {
                    booking_units: None,
                    ..
                }
            ),
            "{d:?}"
        );
        assert_eq!(BeyondBooking::check(1, 1, 0, 1), None);
        assert!(BeyondBooking::check(1, 1, u64::MAX, 1).is_some());
    }

    #[test]
    fn ended_booking_is_not_a_booking() {
        let cfg = AdmissionConfig::default();
        let a = answer(Some("a100"), &[]);
        let later = "2026-12-01T00:00:00Z".parse().unwrap();
        let d = decide(&generic(), Lookup::Answer(&a), &cfg, later);
        assert!(matches!(d, Decision::Strip { .. }), "{d:?}");
    }

    #[test]
    fn unbooked_takes_the_model_with_most_free_units() {
        let cfg = AdmissionConfig::default();
        let a = answer(None, &[("a100", 1), ("a6000", 3), ("v100", 3)]);
        let d = decide(&generic(), Lookup::Answer(&a), &cfg, now());
        assert_eq!(
            d,
            Decision::LowPriority {
                model: model("a6000"),
                gpumem_mib: None,
                beyond_booking: None,
            }
        );
    }

    #[test]
    fn unbooked_per_model_request_needs_that_model_free() {
        let cfg = AdmissionConfig::default();
        let gpu = GpuRequest {
            units: 1,
            models: [model("a100")].into_iter().collect(),
        };
        let a = answer(None, &[("a100", 0), ("a6000", 3)]);
        let d = decide(&gpu, Lookup::Answer(&a), &cfg, now());
        assert!(matches!(d, Decision::Strip { .. }));
        let w = d.warning().unwrap();
        assert!(
            w.contains("no free a100 GPU") && w.contains("2026-12-01 09:00 UTC"),
            "{w}"
        );
        assert!(w.chars().count() <= MAX_WARNING_CHARS);
    }

    #[test]
    fn booked_on_another_model_than_asked_is_unbooked() {
        let cfg = AdmissionConfig::default();
        let gpu = GpuRequest {
            units: 1,
            models: [model("a6000")].into_iter().collect(),
        };
        let a = answer(Some("a100"), &[("a6000", 1)]);
        let d = decide(&gpu, Lookup::Answer(&a), &cfg, now());
        assert!(matches!(d, Decision::LowPriority { .. }), "{d:?}");
    }

    #[test]
    fn booking_errors_follow_the_policy() {
        let mut cfg = AdmissionConfig::default();
        let d = decide(&generic(), Lookup::Failed("timeout"), &cfg, now());
        assert!(matches!(d, Decision::Unchecked { .. }));
        cfg.on_booking_error = BookingErrorPolicy::Strip;
        let d = decide(&generic(), Lookup::Failed("timeout"), &cfg, now());
        assert_eq!(d.kind(), "booking_error_strip");
        // A "booked" answer without its booking is a service error too.
        let mut a = answer(Some("a100"), &[]);
        a.booking_id = None;
        let d = decide(&generic(), Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.kind(), "booking_error_strip");
    }

    #[test]
    fn unidentified_pods_are_lent_or_stripped_by_the_setting() {
        let id = Identity::User(crate::username::Username::parse("alice").unwrap());
        let mut cfg = AdmissionConfig::default();
        assert_eq!(cfg.unidentified_gpu_pods, UnidentifiedGpuPods::Lent);
        let jhub = Some("jhub");
        assert_eq!(what_to_ask(Some(&id), jhub, &cfg), Ok(Ask::Owner(&id)));
        assert_eq!(what_to_ask(None, jhub, &cfg), Ok(Ask::FreeUnits));
        // Lent: the free-units answer (no user) decides as for an unbooked user.
        let mut a = answer(None, &[("a6000", 2)]);
        a.user = None;
        a.earliest_booking = None;
        let d = decide(&generic(), Lookup::Answer(&a), &cfg, now());
        assert_eq!(d.kind(), "low_priority");
        let full = answer(None, &[("a6000", 0)]);
        let d = decide(&generic(), Lookup::Answer(&full), &cfg, now());
        assert_eq!(d.kind(), "strip");
        // Strip: nothing asked, the GPU goes, and the warning says why.
        cfg.unidentified_gpu_pods = UnidentifiedGpuPods::Strip;
        assert_eq!(what_to_ask(Some(&id), jhub, &cfg), Ok(Ask::Owner(&id)));
        assert!(matches!(
            what_to_ask(None, jhub, &cfg),
            Err(Lookup::NoIdentity)
        ));
        let d = decide(&generic(), Lookup::NoIdentity, &cfg, now());
        assert_eq!(d.kind(), "no_identity_strip");
        assert_eq!(d.audit_action(), Some("webhook.strip"));
        let w = d.warning().unwrap();
        assert!(w.contains("not created by JupyterHub"), "{w}");
        assert_eq!("strip".parse(), Ok(UnidentifiedGpuPods::Strip));
        assert_eq!(UnidentifiedGpuPods::Lent.to_string(), "lent");
        assert!("budget".parse::<UnidentifiedGpuPods>().is_err());
    }

    /// A pod without identity is lent only where the controller can take the card
    /// back; elsewhere it is another workload, whatever is free, and its GPU stays as
    /// written. Stripping stays everywhere, and a hub's pod is asked about anywhere.
    #[test]
    fn an_unidentified_pod_where_no_lent_card_comes_back_is_another_workload() {
        let id = Identity::User(crate::username::Username::parse("alice").unwrap());
        let mut cfg = AdmissionConfig {
            lend_namespaces: super::super::LendNamespaces::from_names(["jhub", "research"])
                .unwrap(),
            ..AdmissionConfig::default()
        };
        assert_eq!(what_to_ask(None, Some("jhub"), &cfg), Ok(Ask::FreeUnits));
        assert_eq!(
            what_to_ask(None, Some("research"), &cfg),
            Ok(Ask::FreeUnits)
        );
        for elsewhere in [Some("batch"), None] {
            assert_eq!(
                what_to_ask(None, elsewhere, &cfg),
                Err(Lookup::OtherWorkload),
                "{elsewhere:?}"
            );
        }
        assert_eq!(
            what_to_ask(Some(&id), Some("batch"), &cfg),
            Ok(Ask::Owner(&id))
        );
        let d = decide(&generic(), Lookup::OtherWorkload, &cfg, now());
        assert_eq!(d, Decision::OtherWorkload);
        assert_eq!(d.kind(), "other_workload");
        assert_eq!(
            (d.model(), d.warning(), d.removal_reason(), d.audit_action()),
            (None, None, None, None)
        );
        assert_eq!(d.preemption(), None);
        // Its patch: the GPU as written, no mark of ours, not our low class; our
        // high class and the notes a creator wrote gone.
        let pod = serde_json::json!({
            "metadata": {
                "name": "train-0",
                "labels": {"app": "train", "gpu-booking.io/priority": "high"},
                "annotations": {
                    "terminate-at": "2030-01-01T00:00:00Z",
                    "gpu-booking.io/gpu-removed": "forged",
                    "gpu-booking.io/gpu-wanted": "1",
                },
            },
            "spec": {
                "priorityClassName": "gpu-booking-high",
                "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
            },
        });
        let mut admitted = pod.clone();
        json_patch::patch(&mut admitted, &super::super::plan(&pod, &d, &cfg)).unwrap();
        assert_eq!(
            admitted,
            serde_json::json!({
                "metadata": {
                    "name": "train-0",
                    "labels": {"app": "train"},
                    "annotations": {},
                },
                "spec": {
                    "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                },
            })
        );
        let unmarked = serde_json::json!({
            "metadata": {"name": "train-1"},
            "spec": {"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        });
        assert!(super::super::plan(&unmarked, &d, &cfg).0.is_empty());
        // Strip: stripped in every namespace, nobody asked.
        cfg.unidentified_gpu_pods = UnidentifiedGpuPods::Strip;
        for anywhere in [Some("jhub"), Some("batch")] {
            assert_eq!(what_to_ask(None, anywhere, &cfg), Err(Lookup::NoIdentity));
        }
        // Every namespace (the default): lent anywhere, as before.
        let cfg = AdmissionConfig::default();
        assert_eq!(what_to_ask(None, Some("batch"), &cfg), Ok(Ask::FreeUnits));
    }

    #[test]
    fn the_strip_date_is_the_models_own() {
        let cfg = AdmissionConfig::default();
        let mut a = answer(None, &[("a100", 0), ("a6000", 0)]);
        a.earliest_booking = Some("2026-11-20T00:00:00Z".parse().unwrap());
        a.earliest_booking_by_model = [
            (model("a100"), "2026-12-24T00:00:00Z".parse().unwrap()),
            (model("a6000"), "2026-11-20T00:00:00Z".parse().unwrap()),
        ]
        .into_iter()
        .collect();
        let a100 = GpuRequest {
            units: 1,
            models: [model("a100")].into_iter().collect(),
        };
        let w = decide(&a100, Lookup::Answer(&a), &cfg, now())
            .warning()
            .unwrap();
        assert!(w.contains("2026-12-24 00:00 UTC"), "{w}");
        // Any model: the earliest of all.
        let w = decide(&generic(), Lookup::Answer(&a), &cfg, now())
            .warning()
            .unwrap();
        assert!(w.contains("2026-11-20 00:00 UTC"), "{w}");
    }

    #[test]
    fn warnings_fit() {
        let long = model(&"m".repeat(63));
        let d = Decision::Strip {
            reason: StripReason::NothingFree {
                model: Some(long.clone()),
            },
            earliest_booking: Some(now()),
        };
        let w = d.warning().unwrap();
        assert!(
            w.chars().count() <= MAX_WARNING_CHARS && w.contains("2026-11-01 00:00 UTC"),
            "{w}"
        );
        let d = Decision::LowPriority {
            model: long.clone(),
            gpumem_mib: None,
            beyond_booking: None,
        };
        assert!(d.warning().unwrap().chars().count() <= MAX_WARNING_CHARS);
        let beyond = BeyondBooking::check(17, 64, 64, 64).unwrap();
        let d = Decision::LowPriority {
            model: long.clone(),
            gpumem_mib: None,
            beyond_booking: Some(beyond),
        };
        let w = d.warning().unwrap();
        assert!(
            w.chars().count() <= MAX_WARNING_CHARS && w.contains("64 GPUs, 64 in use"),
            "{w}"
        );
        let d = Decision::Strip {
            reason: StripReason::BeyondBooking {
                model: long,
                beyond,
            },
            earliest_booking: None,
        };
        let w = d.warning().unwrap();
        assert!(
            w.chars().count() <= MAX_WARNING_CHARS && w.contains("64 GPUs, 64 in use"),
            "{w}"
        );
    }

    #[test]
    fn answer_parses_the_service_contract() {
        let body = r#"{"schedulable": true, "until": "2026-11-30T00:00:00Z", "model": "a100",
            "booking_id": 17, "user": "alice@example.com", "free": {"a100": 0, "a6000": 3},
            "gpumem_mib": {"a100": 40960, "a6000": 12288}, "earliest_booking": null,
            "earliest_booking_by_model": {"a6000": "2026-12-01T00:00:00Z"}}"#;
        let a: Schedulability = serde_json::from_str(body).unwrap();
        assert_eq!(a.free.get(&model("a6000")), Some(&3));
        assert_eq!(a.gpumem_advertised_mib, None);
        let with: Schedulability = serde_json::from_str(&body.replace(
            "\"earliest_booking\"",
            "\"gpumem_advertised_mib\": {\"a100\": 40448}, \"earliest_booking\"",
        ))
        .unwrap();
        assert_eq!(
            with.gpumem_advertised_mib,
            Some([(model("a100"), 40448)].into_iter().collect())
        );
        assert_eq!(
            a.earliest_booking_of(Some(&model("a6000")))
                .map(|t| t.to_rfc3339()),
            Some("2026-12-01T00:00:00+00:00".into())
        );
        let unbooked = r#"{"schedulable": false, "until": null, "model": null, "booking_id": null,
            "user": null, "free": {}, "gpumem_mib": {}, "earliest_booking": "2026-12-01T00:00:00+01:00"}"#;
        let a: Schedulability = serde_json::from_str(unbooked).unwrap();
        assert_eq!(
            a.earliest_booking.unwrap().to_rfc3339(),
            "2026-11-30T23:00:00+00:00"
        );
    }
}
