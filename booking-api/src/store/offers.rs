//! GPUs offered back to users on CPU, as the controller last reported them
//! (`PUT /api/v1/offers`, the whole list each round): kept for the webhook's
//! replica (the units each offer holds), the notices (one per offer) and the
//! notebook card; and each user's opt-in to be restarted on a GPU.

use chrono::{DateTime, Utc};
use gpu_booking_core::username::NameCase;
use gpu_booking_core::wire::{Offer, Offers};
use sqlx::{PgExecutor, PgPool};

use super::users::owner;

/// Replaces every offer with `offers`, but those to users with a booking active at
/// `now` (their spawn is booked anyway). Answers the offers kept, as reported with
/// `restart` set for users who opted in, and the users left out for their booking.
pub async fn replace(
    pool: &PgPool,
    offers: &[Offer],
    names: NameCase,
    now: DateTime<Utc>,
) -> sqlx::Result<Offers> {
    let users: Vec<String> = offers.iter().map(|o| owner(&o.user, names)).collect();
    let mut tx = pool.begin().await?;
    let booked: Vec<String> = sqlx::query_scalar!(
        r#"SELECT DISTINCT user_name AS "user_name!" FROM booking
           WHERE user_name = ANY($1) AND cancelled_at IS NULL AND start_at <= $2 AND end_at > $2"#,
        &users,
        now
    )
    .fetch_all(&mut *tx)
    .await?;
    let opted: Vec<String> = sqlx::query_scalar!(
        "SELECT user_name FROM notice_pref WHERE user_name = ANY($1) AND restart_on_offer",
        &users
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut answer = Offers::default();
    let (mut keys, mut models, mut units, mut offered, mut untils, mut states) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (offer, user) in offers.iter().zip(users) {
        if booked.contains(&user) {
            answer.booked.push(offer.user.clone());
            continue;
        }
        let offer = Offer {
            restart: opted.contains(&user),
            ..offer.clone()
        };
        states.push(serde_json::to_string(&offer).map_err(|e| sqlx::Error::Encode(Box::new(e)))?);
        keys.push(user);
        models.push(offer.model.clone());
        units.push(offer.units);
        offered.push(offer.offered_at);
        untils.push(offer.until);
        answer.offers.push(offer);
    }
    sqlx::query!("DELETE FROM offer").execute(&mut *tx).await?;
    // Two offers to users whose names compare equal: the last one counts.
    sqlx::query!(
        "INSERT INTO offer (user_name, model, units, offered_at, until, state)
         SELECT o.user_name, o.model, o.units, o.offered_at, o.until, o.state::jsonb
         FROM unnest($1::text[], $2::text[], $3::int[], $4::timestamptz[], $5::timestamptz[],
                     $6::text[]) AS o(user_name, model, units, offered_at, until, state)
         ON CONFLICT (user_name) DO UPDATE SET model = excluded.model, units = excluded.units,
             offered_at = excluded.offered_at, until = excluded.until, state = excluded.state",
        &keys,
        &models,
        &units,
        &offered,
        &untils,
        &states
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(answer)
}

/// Every offer as reported (`None`: every user's), by user, those held at `now`
/// (for the admission state: the units held) or all (`None`: the controller takes
/// them back when it is elected, the page shows one that just expired as such).
pub async fn list(
    db: impl PgExecutor<'_>,
    user: Option<&str>,
    held_at: Option<DateTime<Utc>>,
) -> sqlx::Result<Vec<Offer>> {
    Ok(with_users(db, user, held_at)
        .await?
        .into_iter()
        .map(|(_, o)| o)
        .collect())
}

/// [`list`], each offer with its user as the service compares names (whom its
/// notice goes to).
pub async fn with_users(
    db: impl PgExecutor<'_>,
    user: Option<&str>,
    held_at: Option<DateTime<Utc>>,
) -> sqlx::Result<Vec<(String, Offer)>> {
    let rows = sqlx::query!(
        r#"SELECT user_name, state::text AS "state!" FROM offer
           WHERE ($1::text IS NULL OR user_name = $1)
             AND ($2::timestamptz IS NULL OR (offered_at <= $2 AND until > $2))
           ORDER BY user_name"#,
        user,
        held_at
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| match serde_json::from_str::<Offer>(&r.state) {
            Ok(o) => Some((r.user_name, o)),
            Err(e) => {
                // Only a row written by other means (SQL by hand) can fail.
                tracing::warn!(error = %e, "a stored offer is unreadable; left out");
                None
            }
        })
        .collect())
}

/// Whether `user` asked to be restarted on a GPU when one is offered.
pub async fn restart_on_offer(db: impl PgExecutor<'_>, user: &str) -> sqlx::Result<bool> {
    Ok(sqlx::query_scalar!(
        "SELECT restart_on_offer FROM notice_pref WHERE user_name = $1",
        user
    )
    .fetch_optional(db)
    .await?
    .unwrap_or(false))
}

/// Records `user`'s choice (a user who never saved notice settings gets the
/// defaults beside it).
pub async fn set_restart_on_offer(
    db: impl PgExecutor<'_>,
    user: &str,
    on: bool,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO notice_pref (user_name, restart_on_offer, updated_at) VALUES ($1, $2, $3)
         ON CONFLICT (user_name) DO UPDATE SET restart_on_offer = $2, updated_at = $3",
        user,
        on,
        now
    )
    .execute(db)
    .await?;
    Ok(())
}
