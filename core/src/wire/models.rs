//! `GET /api/v1/models` (the catalog the controller and the agent read) and
//! `PUT /api/v1/models/{name}/usage` (what the controller counted of one model).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A bookable model as the service shows it. Read leniently (every field but the
/// name may be absent) so that a client keeps working beside an older service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Model {
    pub name: String,
    /// Order among models when matching product names (first match wins; an
    /// admin's choice, which may be negative).
    #[serde(default)]
    pub position: i32,
    /// Units (GPUs) of this model the admin declared: the bookable capacity.
    #[serde(default)]
    pub units: u64,
    /// Ordered wildcard patterns over `nvidia.com/gpu.product` values.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// Extended resource naming this model, when the device plugin exposes one
    /// (e.g. `nvidia.com/a100`); `nvidia.com/gpu` otherwise.
    #[serde(default)]
    pub resource: Option<String>,
    /// Default VRAM budget of a pod on this model, MiB.
    #[serde(default)]
    pub gpumem_mib: u64,
    /// Units in use right now, as last reported by the controller.
    #[serde(default)]
    pub in_use: u64,
    /// When the controller's last usage report was received.
    #[serde(default)]
    pub usage_reported_at: Option<DateTime<Utc>>,
    /// Physical cards (MIG devices for a MIG profile) the controller counts on the
    /// nodes; informational, beside the declared `units` and never in their place.
    #[serde(default)]
    pub cards: Option<u64>,
    /// Whether every node with cards of this model advertises the VRAM budget
    /// resource (the webhook budgets pods of the model only then).
    #[serde(default)]
    pub gpumem_advertised: bool,
    /// The VRAM budget one unit can hold, MiB, when advertised.
    #[serde(default)]
    pub gpumem_unit_mib: Option<u64>,
    /// Units not in use right now.
    #[serde(default)]
    pub free: u64,
    /// The cards counted on the nodes disagree with the declared units (a card
    /// missing or added, or units declared per time-slicing replica).
    #[serde(default)]
    pub mismatch: bool,
    /// Cards of this model that pods of other workloads use (GPU pods our webhook did
    /// not admit as booked or lent), as last reported; null until reported. Bookings
    /// never preempt them. Already counted in `in_use`.
    #[serde(default)]
    pub others_in_use: Option<u64>,
    /// The namespaces of those pods, sorted.
    #[serde(default)]
    pub other_namespaces: Vec<String>,
    /// The cards bookings can really get: `cards` less `others_in_use`, when both are
    /// known; null otherwise.
    #[serde(default)]
    pub bookable: Option<u64>,
    /// The declared `units` exceed `bookable`: bookings were promised cards that the
    /// nodes lack or that other workloads hold, so a booking may wait for a card; a
    /// warning for admins.
    #[serde(default)]
    pub over_declared: bool,
}

/// The cards bookings can really get: those counted on the nodes less those that
/// other workloads use (which bookings never preempt); unknown until both are
/// reported.
pub fn bookable(cards: Option<u64>, others_in_use: Option<u64>) -> Option<u64> {
    Some(cards?.saturating_sub(others_in_use?))
}

/// Whether the declared units exceed what bookings can really get: then a booking
/// may wait for a card however it was accepted. Nothing known yet is no warning.
pub fn over_declared(declared_units: u64, bookable: Option<u64>) -> bool {
    bookable.is_some_and(|b| declared_units > b)
}

/// The most cards a [`UsageReport`] may count (`cards`, `others_in_use`).
pub const MAX_REPORTED_CARDS: i32 = 100_000;
/// The most namespaces a [`UsageReport`] may name in `other_namespaces`: enough to
/// say who holds the cards; a lab with more is summarised by the count.
pub const MAX_OTHER_NAMESPACES: usize = 16;
/// The longest namespace name (a DNS-1123 label).
pub const MAX_NAMESPACE_LEN: usize = 63;

/// What the controller counted of one model: recorded beside the admin's declared
/// units, never in their place. `i32`: see the module [`crate::wire`] on integers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct UsageReport {
    /// Units (cards) in use now.
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub in_use: i32,
    /// Physical cards the cluster has, when the reporter counts them (the controller
    /// does). `units` is read as its old name.
    #[serde(alias = "units", default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 100000))]
    pub cards: Option<i32>,
    /// Whether every node with cards of the model advertises the VRAM budget resource.
    #[serde(default)]
    pub gpumem_advertised: Option<bool>,
    /// The VRAM budget one unit can hold, MiB (with `gpumem_advertised`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub gpumem_unit_mib: Option<i32>,
    /// Cards of the model that pods of other workloads use: GPU pods our webhook did
    /// not admit as booked or lent (a training Job in another namespace, ...), which
    /// bookings never preempt. Counted in `in_use` too. Absent: not counted.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 100000))]
    pub others_in_use: Option<i32>,
    /// The namespaces of those pods (the service sorts them and drops repeats); each
    /// a namespace name (a DNS-1123 label), at most 16 of them
    /// ([`MAX_OTHER_NAMESPACES`]). Only with `others_in_use`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "openapi",
        schema(
            max_items = 16,
            min_length = 1,
            max_length = 63,
            pattern = r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$"
        )
    )]
    pub other_namespaces: Vec<String>,
    /// When the controller counted: the time of the pod view the counts are of (the
    /// start of its reporting round), not when it sent them. The service records
    /// the earlier of this and the report's receipt as the model's
    /// `usage_reported_at`, so the webhook's lend ledger keeps a unit it admitted
    /// until a count that began after it. Absent (an older controller): the
    /// receipt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_at: Option<DateTime<Utc>>,
}

impl UsageReport {
    /// The time the service records as the report's (`usage_reported_at`), given
    /// when it `received` it: the count's time, never later than the receipt (a
    /// controller's clock ahead of the service's, or a forged time, cannot make a
    /// count look newer than it can be); the receipt when the report does not say.
    pub fn reported_at(&self, received: DateTime<Utc>) -> DateTime<Utc> {
        self.counted_at.map_or(received, |c| c.min(received))
    }

    /// Why the report's account of other workloads cannot be recorded, if it cannot:
    /// a count out of range, too many namespaces, or one that is no namespace name.
    pub fn others_problem(&self) -> Option<String> {
        if self
            .others_in_use
            .is_some_and(|n| !(0..=MAX_REPORTED_CARDS).contains(&n))
        {
            return Some(format!(
                "others_in_use must be between 0 and {MAX_REPORTED_CARDS}"
            ));
        }
        if self.other_namespaces.len() > MAX_OTHER_NAMESPACES {
            return Some(format!(
                "other_namespaces: at most {MAX_OTHER_NAMESPACES} namespaces"
            ));
        }
        self.other_namespaces
            .iter()
            .find(|ns| !is_namespace_name(ns))
            .map(|ns| {
                format!(
                    "other_namespaces: {ns:?} is no namespace name (lowercase letters, \
                     digits and '-', at most {MAX_NAMESPACE_LEN}, a letter or digit at \
                     both ends)"
                )
            })
    }
}

/// Whether `s` is a Kubernetes namespace name: a DNS-1123 label, lowercase
/// `[a-z0-9-]`, 1 to 63 characters, a letter or digit at both ends.
pub fn is_namespace_name(s: &str) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAMESPACE_LEN
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bookable_is_the_cards_other_workloads_leave() {
        assert_eq!(bookable(None, Some(1)), None);
        assert_eq!(bookable(Some(4), None), None);
        assert_eq!(bookable(Some(4), Some(1)), Some(3));
        assert_eq!(bookable(Some(1), Some(3)), Some(0), "never below zero");
        assert!(!over_declared(4, None), "nothing known, no warning");
        assert!(!over_declared(3, Some(3)));
        assert!(over_declared(4, Some(3)));
    }

    #[test]
    fn namespace_names_are_dns_labels() {
        for ok in ["research", "a", "team-7", &"n".repeat(63)] {
            assert!(is_namespace_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Research",
            "-a",
            "a-",
            "a.b",
            "a_b",
            "a b",
            "ä",
            &"n".repeat(64),
        ] {
            assert!(!is_namespace_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_report_of_other_workloads_is_bounded() {
        let report = |others: Option<i32>, ns: &[&str]| UsageReport {
            others_in_use: others,
            other_namespaces: ns.iter().map(|s| s.to_string()).collect(),
            ..UsageReport::default()
        };
        assert_eq!(report(Some(1), &["research"]).others_problem(), None);
        assert_eq!(report(None, &[]).others_problem(), None);
        assert!(report(Some(-1), &[]).others_problem().is_some());
        assert!(report(Some(MAX_REPORTED_CARDS + 1), &[])
            .others_problem()
            .is_some());
        assert!(report(Some(1), &["Bad"]).others_problem().is_some());
        let many: Vec<String> = (0..=MAX_OTHER_NAMESPACES)
            .map(|i| format!("n{i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(report(Some(1), &many).others_problem().is_some());
        assert_eq!(report(Some(1), &many[1..]).others_problem(), None);
    }

    #[test]
    fn a_report_is_of_its_count_never_later_than_its_receipt() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        let report = |counted_at| UsageReport {
            counted_at,
            ..UsageReport::default()
        };
        // Counted at 10, received at 14 (a slow send): the count's time.
        assert_eq!(report(Some(t(10))).reported_at(t(14)), t(10));
        // A count stamped after its receipt (a clock ahead): the receipt.
        assert_eq!(report(Some(t(20))).reported_at(t(14)), t(14));
        // An older controller says nothing: the receipt.
        assert_eq!(report(None).reported_at(t(14)), t(14));
        // On the wire: an RFC 3339 time, left out when absent.
        let v = serde_json::to_value(report(Some(t(10)))).unwrap();
        let back: UsageReport = serde_json::from_value(v).unwrap();
        assert_eq!(back.counted_at, Some(t(10)));
        let v = serde_json::to_value(report(None)).unwrap();
        assert!(v.get("counted_at").is_none(), "{v}");
    }

    #[test]
    fn an_older_report_reads_and_an_empty_list_is_left_out() {
        let r: UsageReport = serde_json::from_value(json!({"in_use": 1, "cards": 2})).unwrap();
        assert_eq!((r.others_in_use, r.other_namespaces.len()), (None, 0));
        let v = serde_json::to_value(UsageReport {
            in_use: 1,
            others_in_use: Some(0),
            ..UsageReport::default()
        })
        .unwrap();
        assert!(v.get("other_namespaces").is_none(), "{v}");
        // A model from an older service reads with nothing of other workloads known.
        let m: Model = serde_json::from_value(json!({"name": "a100"})).unwrap();
        assert_eq!(
            (m.others_in_use, m.bookable, m.over_declared),
            (None, None, false)
        );
    }
}
