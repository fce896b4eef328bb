//! The bookable models of the simulated lab, declared in the booking service as an
//! admin would: one per GPU product the lab has, with its card count.

use chrono::Utc;
use gpu_booking_api::store::models::{self, ModelSpec};
use gpu_booking_core::gpu_model::ModelPattern;
use sqlx::PgPool;

use crate::lab::GpuNode;

/// A model as the lab declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabModel {
    pub name: &'static str,
    pub pattern: &'static str,
    /// The VRAM budget each pod of this model gets.
    pub gpumem_mib: i32,
    /// Its own resource, when its cards are reached through one
    /// ([`GpuNode::with_cards`]).
    pub resource: Option<&'static str>,
}

/// The demo's models (the booking page's seeds): `a100` and `a6000`.
pub const DEMO_MODELS: [LabModel; 2] = [
    LabModel {
        name: "a100",
        pattern: "*A100*",
        gpumem_mib: 40960,
        resource: None,
    },
    LabModel {
        name: "a6000",
        pattern: "*A6000*",
        gpumem_mib: 49152,
        resource: None,
    },
];

/// Physical cards of `model` in `nodes` (a time-sliced card counts once).
pub fn cards(model: &LabModel, nodes: &[GpuNode]) -> anyhow::Result<u32> {
    let pattern = ModelPattern::parse(model.pattern)?;
    let generic: u32 = nodes
        .iter()
        .filter(|n| n.product.as_deref().is_some_and(|p| pattern.matches(p)))
        .map(|n| n.gpus)
        .sum();
    let own: u32 = nodes
        .iter()
        .flat_map(|n| &n.own_resource_cards)
        .filter(|c| model.resource == Some(c.resource.as_str()))
        .map(|c| c.count)
        .sum();
    Ok(generic + own)
}

/// Declares `wanted` with the card counts of `nodes`, unless the database already has
/// models (what an admin declared is never overwritten).
pub async fn declare(pool: &PgPool, wanted: &[LabModel], nodes: &[GpuNode]) -> anyhow::Result<()> {
    if !models::list(pool).await?.is_empty() {
        return Ok(());
    }
    for (position, model) in wanted.iter().enumerate() {
        let patterns = vec![model.pattern.to_owned()];
        let spec = ModelSpec {
            name: model.name,
            units: i32::try_from(cards(model, nodes)?)?,
            patterns: &patterns,
            resource: model.resource,
            gpumem_mib: model.gpumem_mib,
            position: Some(i32::try_from(position)?),
        };
        models::upsert(pool, spec, Utc::now()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_physical_cards_per_model() {
        let mut lab = crate::lab::demo_lab();
        assert_eq!(cards(&DEMO_MODELS[0], &lab).unwrap(), 2);
        assert_eq!(cards(&DEMO_MODELS[1], &lab).unwrap(), 4);
        lab.push(GpuNode::gpu("shared", "NVIDIA-RTX-A6000", 1, 49152).time_sliced(4));
        assert_eq!(cards(&DEMO_MODELS[1], &lab).unwrap(), 5);
    }
}
