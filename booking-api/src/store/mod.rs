//! Everything that talks to Postgres. Handlers call these; rules come from `core`.

pub mod audit;
pub mod bookings;
pub mod models;
pub mod preemptions;
pub mod users;

use sqlx::{Postgres, Transaction};

/// Serialises every change to one user's bookings and to one model's units: the
/// user's advisory lock first, then the model's row lock, always in that order, so
/// that two transactions never wait on each other in a cycle. One statement: the
/// row is locked only once the join has produced it, which needs the advisory lock.
/// Returns the model's units, `None` if there is no such model. Reads that depend
/// on the locks must come in later statements (READ COMMITTED takes a statement's
/// snapshot before it waits).
pub async fn lock_user_and_model(
    tx: &mut Transaction<'_, Postgres>,
    user: &str,
    model: &str,
) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar(
        "WITH user_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(7262, hashtext($1)))
         SELECT m.units FROM gpu_model m, user_lock WHERE m.name = $2 FOR UPDATE OF m",
    )
    .bind(user)
    .bind(model)
    .fetch_optional(&mut **tx)
    .await
}
