//! Everything that talks to Postgres. Handlers call these; rules come from `core`.

pub mod admission;
pub mod archive;
pub mod audit;
pub mod bookings;
pub mod changes;
pub mod error;
pub mod feeds;
pub mod groups;
pub mod held;
pub mod holds;
pub mod models;
pub mod notebooks;
pub mod offers;
pub mod usage;
pub mod users;
pub mod waitlist;

pub use error::StoreError;

use sqlx::{Postgres, Transaction};

/// Serialises every change to one user's bookings and to the whole of one model's:
/// the user's advisory lock first, then the model's lock exclusive, always in that
/// order (the SQL function `booking_lock` of the migrations holds the order; a create
/// takes the model's lock shared and then its days' locks instead, in
/// `booking_lock_and_read`, migration 20261125000200). Returns the model's units, `None` if there
/// is no such model. Reads that depend on the locks must come in later statements
/// (READ COMMITTED takes a statement's snapshot before it waits).
pub async fn lock_user_and_model(
    tx: &mut Transaction<'_, Postgres>,
    user: &str,
    model: &str,
) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar!("SELECT booking_lock($1, $2)", user, model)
        .fetch_one(&mut **tx)
        .await
}
