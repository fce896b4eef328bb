//! Eviction order (seed 004: least recently used first, never a tenant that may
//! coexist with the one that needs room, a VRAM cushion). One module for both
//! evictions in gpu-booking: the controller's preemption for a booked pod
//! ([`plan`]) and the node agent's VRAM watchdog ([`watchdog_pick`]). Pure.
//!
//! Terms, as [`plan`] uses them:
//!
//! - A **node** is a place the pod that needs room could run (its model, and its
//!   `nodeSelector` and required node affinity, [`NodeConstraints`]: a lent pod on a
//!   node where the booked pod cannot be scheduled is never its victim), with what is free there now as the scheduler counts it: GPU units of
//!   the pod's resource and, where the node advertises one, the VRAM budget resource
//!   (`gpumem`, MiB). Room that pods already terminating will give back counts as
//!   free: a victim on its way out is not replaced by a second one.
//! - A **tenant** is a pod that may give way (the caller filters: lent, of the model,
//!   not already going). It holds GPU units and a declared VRAM budget on one node.
//! - A tenant **may coexist** with the pod that needs room, and is never a victim,
//!   when the pod fits without evicting it: it is on another node than the one
//!   chosen, or on a time-sliced card where what the others free already leaves room
//!   for the pod's units and VRAM plus the cushion.
//! - The victims are the fewest tenants of one node that make room, taken in least
//!   recently used order: tenants are walked from least to most recently GPU-active
//!   (unknown activity is least recent; the id breaks ties, so the result does not
//!   depend on input order), and the first node that would have room decides; then
//!   every tenant whose eviction that room does not need is spared (it coexists).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// Where a pod may be scheduled, as kube-scheduler's NodeAffinity filter reads it
/// ("Assigning Pods to Nodes"): every `nodeSelector` label, and, when the pod has a
/// required node affinity, one of its `nodeSelectorTerms` (terms ORed, the
/// requirements of a term ANDed, a term with none matches nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeConstraints {
    pub node_selector: BTreeMap<String, String>,
    /// `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`; `None`: the
    /// pod has no required node affinity.
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
}

/// One `nodeSelectorTerm`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSelectorTerm {
    /// On node labels.
    pub match_expressions: Vec<Requirement>,
    /// On node fields (only `metadata.name` exists).
    pub match_fields: Vec<Requirement>,
}

/// One `NodeSelectorRequirement`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`; any other matches nothing.
    pub operator: String,
    pub values: Vec<String>,
}

impl NodeConstraints {
    /// Read leniently from a pod's `spec` (JSON): what is missing or malformed is
    /// absent, never an error (a pod the API server stored is well-formed anyway). A
    /// `nodeSelectorTerms` that is not a list reads as no terms (nothing matches).
    pub fn from_pod_spec(spec: &Value) -> Self {
        let node_selector = spec
            .get("nodeSelector")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let required =
            spec.pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution");
        let required_terms = required.filter(|r| !r.is_null()).map(|r| {
            r.get("nodeSelectorTerms")
                .and_then(Value::as_array)
                .map(|terms| terms.iter().map(NodeSelectorTerm::from_value).collect())
                .unwrap_or_default()
        });
        Self {
            node_selector,
            required_terms,
        }
    }

    /// Whether the pod may be scheduled on the node `name` with `labels`.
    pub fn allows(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let selector_ok = self
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        selector_ok
            && self
                .required_terms
                .as_ref()
                .is_none_or(|terms| terms.iter().any(|t| t.matches(name, labels)))
    }
}

impl NodeSelectorTerm {
    fn from_value(term: &Value) -> Self {
        let list = |key: &str| {
            term.get(key)
                .and_then(Value::as_array)
                .map(|l| l.iter().map(Requirement::from_value).collect())
                .unwrap_or_default()
        };
        Self {
            match_expressions: list("matchExpressions"),
            match_fields: list("matchFields"),
        }
    }

    fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let some = !self.match_expressions.is_empty() || !self.match_fields.is_empty();
        some && self
            .match_expressions
            .iter()
            .all(|r| r.matches(labels.get(&r.key).map(String::as_str)))
            && self.match_fields.iter().all(|r| {
                let field = (r.key == "metadata.name").then_some(name);
                r.matches(field)
            })
    }
}

impl Requirement {
    fn from_value(req: &Value) -> Self {
        let text = |k: &str| req.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Self {
            key: text("key"),
            operator: text("operator"),
            values: req
                .get("values")
                .and_then(Value::as_array)
                .map(|vs| {
                    vs.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Against the node's value for the key (`None`: the node has none). `Gt` and
    /// `Lt` compare integers and need exactly one value.
    fn matches(&self, value: Option<&str>) -> bool {
        let int = |s: &str| s.trim().parse::<i64>().ok();
        let compare =
            |wanted: std::cmp::Ordering| match (value.and_then(int), self.values.as_slice()) {
                (Some(have), [bound]) => int(bound).is_some_and(|b| have.cmp(&b) == wanted),
                _ => false,
            };
        let listed = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator.as_str() {
            "In" => value.is_some_and(listed),
            "NotIn" => value.is_none_or(|v| !listed(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" => compare(std::cmp::Ordering::Greater),
            "Lt" => compare(std::cmp::Ordering::Less),
            _ => false,
        }
    }
}

/// The room one pod needs on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// GPU units (cards, replicas of a time-sliced card, or MIG devices).
    pub units: u64,
    /// Its VRAM budget in MiB (0: none declared).
    pub vram_mib: u64,
}

/// A node where the pod could run and what is free on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    pub node: String,
    pub free_units: u64,
    /// Free VRAM budget in MiB; `None` when the node advertises no budget resource
    /// (VRAM is then no constraint the scheduler knows of).
    pub free_vram_mib: Option<u64>,
}

/// A pod that may give way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Stable and unique (`namespace/name`): breaks ties.
    pub id: String,
    pub node: String,
    pub units: u64,
    /// Its declared VRAM budget in MiB (0: none).
    pub vram_mib: u64,
    /// Its last GPU activity as the node agent reported it (else its start).
    pub last_active: Option<DateTime<Utc>>,
}

/// What it takes to make room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The pod fits on this node as things are: evict nobody.
    Fits { node: String },
    /// Evict these tenants (ids, least recently used first), all on `node`.
    Evict { node: String, victims: Vec<String> },
    /// Even evicting every tenant would not make room on any node.
    NoRoom,
}

/// The least recently used first; unknown activity before any known one; ids break
/// ties. The one order of tenants in this module.
pub fn lru_order(a: &Tenant, b: &Tenant) -> std::cmp::Ordering {
    (a.last_active, &a.id).cmp(&(b.last_active, &b.id))
}

/// Whether `need` fits in `units` and `vram` free, with `cushion_mib` of VRAM to spare.
fn fits(need: &Need, units: u64, vram: Option<u64>, cushion_mib: u64) -> bool {
    units >= need.units
        && vram.is_none_or(|v| need.vram_mib == 0 || v >= need.vram_mib.saturating_add(cushion_mib))
}

/// The eviction plan for `need` (see the module documentation). `Fits` is judged as
/// the scheduler does (no cushion): a pod that would fit is left to it. Victims are
/// chosen so that, once they are gone, the node has the VRAM plus `cushion_mib`.
pub fn plan(need: &Need, cushion_mib: u64, rooms: &[Room], tenants: &[Tenant]) -> Plan {
    let mut rooms: Vec<&Room> = rooms.iter().collect();
    rooms.sort_by(|a, b| a.node.cmp(&b.node));
    if let Some(room) = rooms
        .iter()
        .find(|r| fits(need, r.free_units, r.free_vram_mib, 0))
    {
        return Plan::Fits {
            node: room.node.clone(),
        };
    }
    let by_node: BTreeMap<&str, &Room> = rooms.iter().map(|r| (r.node.as_str(), *r)).collect();
    let mut order: Vec<&Tenant> = tenants
        .iter()
        .filter(|t| by_node.contains_key(t.node.as_str()))
        .collect();
    order.sort_by(|a, b| lru_order(a, b));
    let mut taken: BTreeMap<&str, Vec<&Tenant>> = BTreeMap::new();
    for tenant in order {
        let room = by_node[tenant.node.as_str()];
        let set = taken.entry(room.node.as_str()).or_default();
        set.push(tenant);
        if room_with(room, set, need, cushion_mib) {
            let victims = spare_coexisting(room, set.clone(), need, cushion_mib);
            return Plan::Evict {
                node: room.node.clone(),
                victims: victims.into_iter().map(|t| t.id.clone()).collect(),
            };
        }
    }
    Plan::NoRoom
}

/// Whether `room` with `victims` gone has room for `need` plus the cushion.
fn room_with(room: &Room, victims: &[&Tenant], need: &Need, cushion_mib: u64) -> bool {
    let units = victims.iter().map(|t| t.units).sum::<u64>();
    let vram = victims.iter().map(|t| t.vram_mib).sum::<u64>();
    fits(
        need,
        room.free_units.saturating_add(units),
        room.free_vram_mib.map(|v| v.saturating_add(vram)),
        cushion_mib,
    )
}

/// Drops, most recently used first, every victim whose eviction the room does not
/// need: it may coexist with the pod.
fn spare_coexisting<'a>(
    room: &Room,
    mut victims: Vec<&'a Tenant>,
    need: &Need,
    cushion_mib: u64,
) -> Vec<&'a Tenant> {
    let mut i = victims.len();
    while i > 0 {
        i -= 1;
        let without: Vec<&Tenant> = victims
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, t)| *t)
            .collect();
        if room_with(room, &without, need, cushion_mib) {
            victims.remove(i);
        }
    }
    victims
}

/// A tenant of one GPU as the VRAM watchdog sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VramTenant {
    pub id: String,
    /// Device memory of all its GPU processes.
    pub used_bytes: u64,
    /// Its declared budget, if any.
    pub budget_mib: Option<u64>,
}

/// The watchdog's victim and by how much it is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverBudget {
    pub id: String,
    pub used_mib: u64,
    pub budget_mib: u64,
    pub over_mib: u64,
}

const MIB: u64 = 1024 * 1024;

/// The biggest tenant over its declared budget (by memory used, then the larger
/// overage; the smaller id breaks ties, as in [`lru_order`]). Tenants without a
/// budget are never chosen: they declared nothing to be over.
pub fn biggest_over_budget(tenants: &[VramTenant]) -> Option<OverBudget> {
    tenants
        .iter()
        .filter_map(|t| {
            let budget_mib = t.budget_mib?;
            let used_mib = t.used_bytes / MIB;
            (t.used_bytes > budget_mib.saturating_mul(MIB)).then(|| OverBudget {
                id: t.id.clone(),
                used_mib,
                budget_mib,
                over_mib: used_mib.saturating_sub(budget_mib),
            })
        })
        .max_by(|a, b| {
            a.used_mib
                .cmp(&b.used_mib)
                .then(a.over_mib.cmp(&b.over_mib))
                .then(b.id.cmp(&a.id))
        })
}

/// Whether a GPU with `free_bytes` free is under the watchdog's floor.
pub fn under_vram_floor(free_bytes: u64, floor_mib: u64) -> bool {
    free_bytes < floor_mib.saturating_mul(MIB)
}

/// The VRAM watchdog's choice on one GPU (ADR "VRAM budget"): only when its free
/// memory is under the floor, [`biggest_over_budget`] of its tenants; else nobody.
pub fn watchdog_pick(
    free_bytes: u64,
    floor_mib: u64,
    tenants: &[VramTenant],
) -> Option<OverBudget> {
    if !under_vram_floor(free_bytes, floor_mib) {
        return None;
    }
    biggest_over_budget(tenants)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vram_tenant(id: &str, used_mib: u64, budget: Option<u64>) -> VramTenant {
        VramTenant {
            id: id.into(),
            used_bytes: used_mib * MIB,
            budget_mib: budget,
        }
    }

    #[test]
    fn watchdog_acts_only_under_the_floor() {
        let tenants = [vram_tenant("a", 9000, Some(3000))];
        assert_eq!(watchdog_pick(1536 * MIB, 1536, &tenants), None);
        assert_eq!(watchdog_pick(1535 * MIB, 1536, &tenants).unwrap().id, "a");
    }

    #[test]
    fn watchdog_picks_the_biggest_over_budget_tenant() {
        let tenants = [
            vram_tenant("within", 12_000, Some(12_000)),
            vram_tenant("small-over", 2_500, Some(2_000)),
            vram_tenant("big-over", 6_000, Some(3_000)),
            vram_tenant("no-budget", 20_000, None),
        ];
        let c = watchdog_pick(100 * MIB, 1536, &tenants).unwrap();
        assert_eq!(
            c,
            OverBudget {
                id: "big-over".into(),
                used_mib: 6000,
                budget_mib: 3000,
                over_mib: 3000
            }
        );
        assert_eq!(watchdog_pick(0, 1536, &tenants[..1]), None);
        assert_eq!(watchdog_pick(0, 1536, &[]), None);
    }

    #[test]
    fn watchdog_ties_are_deterministic() {
        let tenants = [
            vram_tenant("b", 5000, Some(1000)),
            vram_tenant("a", 5000, Some(1000)),
            vram_tenant("c", 5000, Some(2000)),
        ];
        assert_eq!(watchdog_pick(0, 1536, &tenants).unwrap().id, "a");
    }
    use proptest::prelude::*;

    fn at(hour: i64) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(1_800_000_000 + hour * 3600, 0)
    }

    fn tenant(id: &str, node: &str, units: u64, vram: u64, hour: Option<i64>) -> Tenant {
        Tenant {
            id: id.into(),
            node: node.into(),
            units,
            vram_mib: vram,
            last_active: hour.and_then(at),
        }
    }

    fn room(node: &str, units: u64, vram: Option<u64>) -> Room {
        Room {
            node: node.into(),
            free_units: units,
            free_vram_mib: vram,
        }
    }

    fn one(units: u64) -> Need {
        Need { units, vram_mib: 0 }
    }

    #[test]
    fn whole_cards_least_recently_used_first() {
        let tenants = [
            tenant("busy", "a", 1, 0, Some(5)),
            tenant("idle", "a", 1, 0, Some(1)),
            tenant("elsewhere", "b", 1, 0, None),
        ];
        let rooms = [room("a", 0, None)];
        assert_eq!(
            plan(&one(1), 256, &rooms, &tenants),
            Plan::Evict {
                node: "a".into(),
                victims: vec!["idle".into()]
            }
        );
        // Two units: the two least recent of one node.
        assert_eq!(
            plan(&one(2), 256, &rooms, &tenants),
            Plan::Evict {
                node: "a".into(),
                victims: vec!["idle".into(), "busy".into()]
            }
        );
        assert_eq!(plan(&one(3), 256, &rooms, &tenants), Plan::NoRoom);
    }

    #[test]
    fn unknown_activity_is_least_recent() {
        let tenants = [
            tenant("known", "a", 1, 0, Some(0)),
            tenant("never-reported", "a", 1, 0, None),
        ];
        let plan = plan(&one(1), 0, &[room("a", 0, None)], &tenants);
        assert_eq!(
            plan,
            Plan::Evict {
                node: "a".into(),
                victims: vec!["never-reported".into()]
            }
        );
    }

    #[test]
    fn room_already_there_or_coming_means_no_victim() {
        let tenants = [tenant("x", "a", 1, 0, Some(0))];
        assert_eq!(
            plan(
                &one(1),
                0,
                &[room("b", 0, None), room("a", 1, None)],
                &tenants
            ),
            Plan::Fits { node: "a".into() }
        );
    }

    #[test]
    fn a_small_tenant_on_a_time_sliced_card_coexists() {
        // A time-sliced card with replicas free but 2 GiB of its 48 GiB budget free:
        // the booked pod wants 16 GiB. The least recent tenant holds 4 GiB (not
        // enough, and the big one must go anyway): it stays beside the booked pod.
        let tenants = [
            tenant("small-idle", "a", 1, 4_096, Some(0)),
            tenant("big", "a", 1, 20_480, Some(3)),
        ];
        let need = Need {
            units: 1,
            vram_mib: 16_384,
        };
        assert_eq!(
            plan(&need, 256, &[room("a", 2, Some(2_048))], &tenants),
            Plan::Evict {
                node: "a".into(),
                victims: vec!["big".into()]
            }
        );
        // The cushion counts: 2 + 14 GiB is the budget exactly, not enough with it.
        let tenants = [
            tenant("small-idle", "a", 1, 14_336, Some(0)),
            tenant("big", "a", 1, 20_480, Some(3)),
        ];
        assert_eq!(
            plan(&need, 256, &[room("a", 2, Some(2_048))], &tenants),
            Plan::Evict {
                node: "a".into(),
                victims: vec!["big".into()]
            }
        );
        assert_eq!(
            plan(&need, 0, &[room("a", 2, Some(2_048))], &tenants),
            Plan::Evict {
                node: "a".into(),
                victims: vec!["small-idle".into()]
            }
        );
    }

    #[test]
    fn watchdog_biggest_over_budget() {
        let t = |id: &str, used_mib: u64, budget: Option<u64>| VramTenant {
            id: id.into(),
            used_bytes: used_mib * MIB,
            budget_mib: budget,
        };
        let tenants = [
            t("within", 12_000, Some(12_000)),
            t("big-over", 6_000, Some(3_000)),
            t("no-budget", 20_000, None),
            t("b", 6_000, Some(3_000)),
        ];
        let c = biggest_over_budget(&tenants).unwrap();
        assert_eq!((c.id.as_str(), c.over_mib), ("b", 3_000));
        assert_eq!(biggest_over_budget(&tenants[..1]), None);
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn constraints(spec: Value) -> NodeConstraints {
        NodeConstraints::from_pod_spec(&spec)
    }

    #[test]
    fn node_selector_and_required_affinity_as_the_scheduler_reads_them() {
        use serde_json::json;
        let a = labels(&[
            ("gpu-booking.io/model", "a100"),
            ("zone", "x"),
            ("cards", "4"),
        ]);
        let terms = |terms: Value| {
            constraints(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
        };
        let expr = |key: &str, op: &str, values: &[&str]| {
            terms(json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]))
        };
        // Nothing asked: anywhere.
        assert!(NodeConstraints::default().allows("a", &a));
        assert!(constraints(json!({})).allows("a", &a));
        // nodeSelector: every label, exactly.
        let sel =
            constraints(json!({"nodeSelector": {"zone": "x", "gpu-booking.io/model": "a100"}}));
        assert!(sel.allows("a", &a));
        assert!(!sel.allows("a", &labels(&[("zone", "x")])));
        assert!(!constraints(json!({"nodeSelector": {"zone": "y"}})).allows("a", &a));
        let cases = [
            (expr("zone", "In", &["x", "y"]), true),
            (expr("zone", "In", &["y"]), false),
            (expr("zone", "NotIn", &["y"]), true),
            (expr("rack", "NotIn", &["y"]), true),
            (expr("zone", "NotIn", &["x"]), false),
            (expr("zone", "Exists", &[]), true),
            (expr("rack", "Exists", &[]), false),
            (expr("rack", "DoesNotExist", &[]), true),
            (expr("cards", "Gt", &["2"]), true),
            (expr("cards", "Gt", &["4"]), false),
            (expr("cards", "Lt", &["5"]), true),
            (expr("cards", "Lt", &["x"]), false),
            (expr("zone", "Gt", &["1"]), false),
            (expr("zone", "Near", &["x"]), false),
            // Terms ORed, requirements ANDed; an empty term matches nothing.
            (
                terms(
                    json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["y"]}]},
                           {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]}]}]),
                ),
                true,
            ),
            (
                terms(
                    json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]},
                                                {"key": "rack", "operator": "Exists"}]}]),
                ),
                false,
            ),
            (terms(json!([{}])), false),
            (terms(json!([])), false),
            (terms(json!("nonsense")), false),
            // Fields: only the node's name.
            (
                terms(
                    json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]),
                ),
                true,
            ),
            (
                terms(
                    json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["a"]}]}]),
                ),
                false,
            ),
            (
                terms(json!([{"matchFields": [{"key": "metadata.uid", "operator": "Exists"}]}])),
                false,
            ),
        ];
        for (i, (c, expected)) in cases.iter().enumerate() {
            assert_eq!(c.allows("a", &a), *expected, "case {i}: {c:?}");
        }
        // Both: the selector and a term.
        let both = constraints(
            json!({"nodeSelector": {"zone": "x"}, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "cards", "operator": "In", "values": ["8"]}]}]}}}}),
        );
        assert!(!both.allows("a", &a));
        // A preferred affinity constrains nothing.
        let preferred = constraints(json!({"affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["y"]}]}}]}}}));
        assert!(preferred.allows("a", &a));
    }

    /// The rooms a caller builds from the nodes a booked pod may use: a tenant on a
    /// node the pod cannot be scheduled on is never a victim, even the least recently
    /// used one.
    #[test]
    fn victims_only_where_the_booked_pod_may_run() {
        use serde_json::json;
        let nodes = [
            ("a", labels(&[("zone", "x")])),
            ("b", labels(&[("zone", "y")])),
        ];
        let pinned = constraints(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["y"]}]}]}}}}));
        let rooms: Vec<Room> = nodes
            .iter()
            .filter(|(name, l)| pinned.allows(name, l))
            .map(|(name, _)| room(name, 0, None))
            .collect();
        let tenants = [
            tenant("idlest-on-a", "a", 1, 0, Some(0)),
            tenant("busy-on-b", "b", 1, 0, Some(5)),
        ];
        assert_eq!(
            plan(&one(1), 0, &rooms, &tenants),
            Plan::Evict {
                node: "b".into(),
                victims: vec!["busy-on-b".into()]
            }
        );
    }

    // ---- properties -----------------------------------------------------------------

    const NODES: [&str; 3] = ["n0", "n1", "n2"];

    fn world() -> impl Strategy<Value = (Need, u64, Vec<Room>, Vec<Tenant>)> {
        let need = (1u64..3, prop_oneof![Just(0u64), 1u64..40_000])
            .prop_map(|(units, vram_mib)| Need { units, vram_mib });
        let rooms = proptest::collection::btree_map(
            0usize..3,
            (0u64..2, proptest::option::of(0u64..20_000)),
            0..3,
        )
        .prop_map(|m| {
            m.into_iter()
                .map(|(n, (u, v))| room(NODES[n], u, v))
                .collect::<Vec<_>>()
        });
        let tenants = proptest::collection::vec(
            (
                0usize..3,
                1u64..3,
                0u64..30_000,
                proptest::option::of(0i64..6),
            ),
            0..8,
        )
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (n, u, vram, h))| tenant(&format!("t{i}"), NODES[n], u, vram, h))
                .collect::<Vec<_>>()
        });
        (need, 0u64..1024, rooms, tenants)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Victims are tenants of one node where the pod may run; gone, they make
        /// room; each one is needed (no tenant that could coexist is evicted); and a
        /// plan evicts only when nothing fits as it is.
        #[test]
        fn victims_make_room_and_each_is_needed((need, cushion, rooms, tenants) in world()) {
            let fits_now = rooms.iter().any(|r| fits(&need, r.free_units, r.free_vram_mib, 0));
            match plan(&need, cushion, &rooms, &tenants) {
                Plan::Fits { node } => {
                    prop_assert!(fits_now);
                    prop_assert!(rooms.iter().any(|r| r.node == node));
                }
                Plan::Evict { node, victims } => {
                    prop_assert!(!fits_now);
                    let room = rooms.iter().find(|r| r.node == node).unwrap();
                    let chosen: Vec<&Tenant> = victims
                        .iter()
                        .map(|id| tenants.iter().find(|t| &t.id == id).unwrap())
                        .collect();
                    prop_assert!(!chosen.is_empty());
                    prop_assert!(chosen.iter().all(|t| t.node == node));
                    prop_assert!(room_with(room, &chosen, &need, cushion));
                    for skip in 0..chosen.len() {
                        let fewer: Vec<&Tenant> = chosen.iter().enumerate()
                            .filter(|(i, _)| *i != skip).map(|(_, t)| *t).collect();
                        prop_assert!(!room_with(room, &fewer, &need, cushion));
                    }
                    // Listed least recently used first.
                    prop_assert!(chosen.windows(2).all(|w| lru_order(w[0], w[1]).is_lt()));
                }
                Plan::NoRoom => {
                    prop_assert!(!fits_now);
                    for room in &rooms {
                        let all: Vec<&Tenant> = tenants.iter().filter(|t| t.node == room.node).collect();
                        prop_assert!(!room_with(room, &all, &need, cushion));
                    }
                }
            }
        }

        /// A tenant on a node that is not one of the rooms (the booked pod cannot be
        /// scheduled there) is never a victim, whatever its activity.
        #[test]
        fn no_victim_outside_the_rooms((need, cushion, rooms, tenants) in world()) {
            if let Plan::Evict { victims, .. } = plan(&need, cushion, &rooms, &tenants) {
                for id in victims {
                    let t = tenants.iter().find(|t| t.id == id).unwrap();
                    prop_assert!(rooms.iter().any(|r| r.node == t.node), "{} on {}", id, t.node);
                }
            }
        }

        /// The order tenants and nodes arrive in changes nothing.
        #[test]
        fn stable_under_input_order((need, cushion, rooms, tenants) in world(), seed in any::<u64>()) {
            let mut shuffled_t = tenants.clone();
            let mut shuffled_r = rooms.clone();
            let n = shuffled_t.len().max(1) as u64;
            shuffled_t.rotate_left((seed % n) as usize);
            shuffled_t.reverse();
            shuffled_r.reverse();
            prop_assert_eq!(
                plan(&need, cushion, &rooms, &tenants),
                plan(&need, cushion, &shuffled_r, &shuffled_t)
            );
        }

        /// Whole cards (one unit each, no VRAM budget): one victim per needed unit,
        /// and the first one is the least recently used tenant on any node that needs
        /// room.
        #[test]
        fn whole_cards_take_the_least_recently_used(
            hours in proptest::collection::vec((0usize..3, proptest::option::of(0i64..6)), 1..8),
        ) {
            let tenants: Vec<Tenant> = hours.iter().enumerate()
                .map(|(i, (n, h))| tenant(&format!("t{i}"), NODES[*n], 1, 0, *h)).collect();
            let rooms: Vec<Room> = NODES.iter().map(|n| room(n, 0, None)).collect();
            let lru = tenants.iter().min_by(|a, b| lru_order(a, b)).unwrap();
            prop_assert_eq!(
                plan(&one(1), 256, &rooms, &tenants),
                Plan::Evict { node: lru.node.clone(), victims: vec![lru.id.clone()] }
            );
        }
    }
}
