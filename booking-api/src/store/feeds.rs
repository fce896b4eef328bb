//! Calendar feed tokens and the bookings a feed shows.
//!
//! A token is 32 random bytes, given to its user once (hex, in the feed's URL) and
//! kept only as its SHA-256: the table holds nothing that opens a feed. One token per
//! user; issuing a new one replaces (and so revokes) the old.

use chrono::{DateTime, TimeDelta, Utc};
use rand::RngCore;
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::{PgExecutor, PgPool};

use super::audit;
use super::groups::delete_audited;
use super::StoreError;

/// Hex characters of a token.
const TOKEN_HEX_LEN: usize = 64;

/// Events in one feed at most, so that a feed's size is bounded whatever is booked.
pub const MAX_EVENTS: i64 = 1000;
/// A feed shows bookings that ended at most this long ago ...
pub const PAST: TimeDelta = TimeDelta::days(90);
/// ... and that start at most this far ahead.
pub const AHEAD: TimeDelta = TimeDelta::days(366);

fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A new token for `user`, replacing any old one.
pub async fn issue(pool: &PgPool, user: &str, now: DateTime<Utc>) -> Result<String, StoreError> {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "INSERT INTO feed_token (user_name, token_sha256, created_at) VALUES ($1, $2, $3)
         ON CONFLICT (user_name) DO UPDATE SET token_sha256 = $2, created_at = $3",
        user,
        digest(&token),
        now
    )
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut *tx,
        audit::NewEvent {
            at: now,
            actor: user,
            action: "feed_token.issue",
            subject: None,
            user: Some(user),
            booking_id: None,
            details: json!({}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(token)
}

/// Revokes the user's token; `false` if there was none.
pub async fn revoke(pool: &PgPool, user: &str, now: DateTime<Utc>) -> Result<bool, StoreError> {
    Ok(delete_audited(
        pool,
        sqlx::query!("DELETE FROM feed_token WHERE user_name = $1", user),
        audit::NewEvent {
            at: now,
            actor: user,
            action: "feed_token.revoke",
            subject: None,
            user: Some(user),
            booking_id: None,
            details: json!({}),
        },
    )
    .await?)
}

/// When the user's current token was issued, if they have one.
pub async fn issued_at(db: impl PgExecutor<'_>, user: &str) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar!(
        "SELECT created_at FROM feed_token WHERE user_name = $1",
        user
    )
    .fetch_optional(db)
    .await
}

/// The user a token belongs to; `None` for anything that is not a current token
/// (malformed ones are not even looked up).
pub async fn user_of(db: impl PgExecutor<'_>, token: &str) -> sqlx::Result<Option<String>> {
    if token.len() != TOKEN_HEX_LEN || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    sqlx::query_scalar!(
        "SELECT user_name FROM feed_token WHERE token_sha256 = $1",
        digest(&token.to_ascii_lowercase())
    )
    .fetch_optional(db)
    .await
}

/// A booking as a feed shows it.
#[derive(Debug, Clone)]
pub struct FeedBooking {
    pub id: i64,
    pub user_name: String,
    pub model: String,
    /// Every unit it holds (0-based, ascending).
    pub slots: Vec<i32>,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// A hold's row (`core::holds`): its kind, id and title.
    pub hold_kind: Option<String>,
    pub hold_id: Option<i64>,
    pub hold_title: Option<String>,
}

/// The user's bookings (cancelled ones too, so that calendars drop them) from
/// [`PAST`] before `now` to [`AHEAD`] after it, at most [`MAX_EVENTS`].
pub async fn own(
    db: impl PgExecutor<'_>,
    user: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<FeedBooking>> {
    sqlx::query_as!(
        FeedBooking,
        r#"SELECT id, user_name, model, slots, start_at, end_at, cancelled_at, created_at, updated_at,
                NULL::text AS "hold_kind?", NULL::bigint AS "hold_id?", NULL::text AS "hold_title?"
         FROM booking WHERE user_name = $1 AND end_at > $2 AND start_at < $3
         ORDER BY start_at, id LIMIT $4"#,
        user,
        now - PAST,
        now + AHEAD,
        MAX_EVENTS
    )
    .fetch_all(db)
    .await
}

/// The model's bookings that are not cancelled, over the same span, with the
/// maintenance windows and course occurrences among them named by their hold.
pub async fn occupancy(
    db: impl PgExecutor<'_>,
    model: &str,
    now: DateTime<Utc>,
) -> sqlx::Result<Vec<FeedBooking>> {
    sqlx::query_as!(
        FeedBooking,
        r#"SELECT b.id, b.user_name, b.model, b.slots, b.start_at, b.end_at, b.cancelled_at, b.created_at,
                b.updated_at, h.kind AS "hold_kind?", h.id AS "hold_id?", h.title AS "hold_title?"
         FROM booking b LEFT JOIN unit_hold h ON h.id = b.hold_id
         WHERE b.model = $1 AND b.cancelled_at IS NULL
           AND b.period && tstzrange($2, $3, '[)')
         ORDER BY b.start_at, b.id LIMIT $4"#,
        model,
        now - PAST,
        now + AHEAD,
        MAX_EVENTS
    )
    .fetch_all(db)
    .await
}
