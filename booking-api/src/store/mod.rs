//! Everything that talks to Postgres. Handlers call these; rules come from `core`.

pub mod audit;
pub mod bookings;
pub mod models;
pub mod preemptions;
pub mod users;

use sqlx::{Postgres, Transaction};

/// Serialises every change to one user's bookings. Taken before the model lock,
/// always in that order, so that two transactions never wait on each other in a
/// cycle.
pub async fn lock_user(tx: &mut Transaction<'_, Postgres>, user: &str) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(7262, hashtext($1))")
        .bind(user)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
