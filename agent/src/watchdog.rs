//! The VRAM watchdog's choice (ADR "VRAM budget"): only when a GPU's free memory is
//! under the floor, the biggest tenant on that GPU that uses more than its declared
//! budget. Tenants without a budget are never chosen. Pure; the order is
//! `gpu_booking_core::eviction`'s.

use gpu_booking_core::eviction::{biggest_over_budget, VramTenant};

/// A pod on the GPU under pressure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub uid: String,
    /// Device memory of all its GPU processes, on every GPU.
    pub used_bytes: u64,
    /// Its declared budget (the `gpumem` resource), if any.
    pub budget_mib: Option<u64>,
}

/// The tenant to recycle and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub uid: String,
    pub used_mib: u64,
    pub budget_mib: u64,
    pub over_mib: u64,
}

const MIB: u64 = 1024 * 1024;

/// Whether the GPU is under the floor.
pub fn under_floor(free_bytes: u64, floor_mib: u64) -> bool {
    free_bytes < floor_mib.saturating_mul(MIB)
}

/// The biggest over-budget tenant (by memory used; the larger overage, then the UID,
/// break ties) when `free_bytes` is under `floor_mib`; else nobody. The order is
/// core's eviction module, the one the controller's preemption also uses.
pub fn pick(free_bytes: u64, floor_mib: u64, tenants: &[Tenant]) -> Option<Choice> {
    if !under_floor(free_bytes, floor_mib) {
        return None;
    }
    let tenants: Vec<VramTenant> = tenants
        .iter()
        .map(|t| VramTenant {
            id: t.uid.clone(),
            used_bytes: t.used_bytes,
            budget_mib: t.budget_mib,
        })
        .collect();
    biggest_over_budget(&tenants).map(|c| Choice {
        uid: c.id,
        used_mib: c.used_mib,
        budget_mib: c.budget_mib,
        over_mib: c.over_mib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(uid: &str, used_mib: u64, budget: Option<u64>) -> Tenant {
        Tenant {
            uid: uid.into(),
            used_bytes: used_mib * MIB,
            budget_mib: budget,
        }
    }

    #[test]
    fn acts_only_under_the_floor() {
        let tenants = [t("a", 9000, Some(3000))];
        assert_eq!(pick(1536 * MIB, 1536, &tenants), None);
        assert_eq!(pick(1535 * MIB, 1536, &tenants).unwrap().uid, "a");
    }

    #[test]
    fn biggest_over_budget_tenant() {
        let tenants = [
            t("within", 12_000, Some(12_000)),
            t("small-over", 2_500, Some(2_000)),
            t("big-over", 6_000, Some(3_000)),
            t("no-budget", 20_000, None),
        ];
        let c = pick(100 * MIB, 1536, &tenants).unwrap();
        assert_eq!(
            c,
            Choice {
                uid: "big-over".into(),
                used_mib: 6000,
                budget_mib: 3000,
                over_mib: 3000
            }
        );
        assert_eq!(pick(0, 1536, &tenants[..1]), None);
        assert_eq!(pick(0, 1536, &[]), None);
    }

    #[test]
    fn ties_are_deterministic() {
        let tenants = [
            t("b", 5000, Some(1000)),
            t("a", 5000, Some(1000)),
            t("c", 5000, Some(2000)),
        ];
        assert_eq!(pick(0, 1536, &tenants).unwrap().uid, "a");
    }
}
