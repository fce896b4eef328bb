//! The models declared in the chart's values, written into the store when the API
//! starts (after the migrations, before it serves): `helm install` and `helm upgrade`
//! reconcile them, since a changed models file rolls the API's pods. Which models are
//! written is core's decision ([`gpu_booking_core::declared_models`]); each write is
//! audited like an admin's `PUT /api/v1/models/{name}`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use chrono::{DateTime, Utc};
use gpu_booking_core::declared_models::{self, Authority, DeclaredModel};
use sqlx::PgPool;

use crate::store::models::{self, ModelSpec};

/// The actor named in the audit rows of these writes.
pub const ACTOR: &str = "helm-values";

/// Reads and checks the models file; a bad file stops the API before it serves.
pub fn read(path: &Path) -> anyhow::Result<Vec<DeclaredModel>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the models file {}", path.display()))?;
    declared_models::parse(&text).with_context(|| format!("in {}", path.display()))
}

/// Writes the declared models that `authority` says must be written; returns their
/// names. One transaction, serialised with other replicas doing the same at start-up.
pub async fn reconcile(
    pool: &PgPool,
    declared: &[DeclaredModel],
    authority: Authority,
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<String>> {
    let mut tx = pool.begin().await?;
    // Replicas starting together take turns (the key is arbitrary but fixed).
    sqlx::query!("SELECT pg_advisory_xact_lock(7141400004)")
        .execute(&mut *tx)
        .await?;
    let stored: BTreeMap<String, DeclaredModel> = models::list(&mut *tx)
        .await?
        .into_iter()
        .map(|m| {
            (
                m.name.clone(),
                DeclaredModel {
                    name: m.name,
                    units: m.units,
                    patterns: m.patterns,
                    gpumem_mib: m.gpumem_mib,
                    resource: m.resource,
                    position: m.position,
                },
            )
        })
        .collect();
    let mut written = Vec::new();
    for m in declared_models::to_write(declared, &stored, authority) {
        // Values that lower a model below what its bookings hold keep the units
        // stored (a start cannot ask the admin what to do with the bookings): said
        // in the log, and refused with the bookings named when asked by the API.
        let in_the_way = models::bookings_beyond(&mut tx, &m.name, m.units, now).await?;
        let units =
            match gpu_booking_core::model_units::lowering_refusal(&m.name, m.units, &in_the_way) {
                Some(why) => {
                    tracing::warn!(model = %m.name, declared = m.units, "{why}");
                    stored.get(&m.name).map_or(m.units, |s| s.units)
                }
                None => m.units,
            };
        models::put(
            &mut tx,
            ModelSpec {
                name: &m.name,
                units,
                patterns: &m.patterns,
                resource: m.resource.as_deref(),
                gpumem_mib: m.gpumem_mib,
                position: Some(m.position),
            },
            now,
            ACTOR,
            Some("values"),
        )
        .await?;
        written.push(m.name.clone());
    }
    tx.commit().await?;
    Ok(written)
}
