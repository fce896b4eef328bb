//! Users the service has seen, with their KubeSpawner slugs.

use gpu_booking_core::username::{slugs, Username};
use sqlx::PgExecutor;

/// Records a user (idempotent), so that bookings can reference it and the webhook
/// can find it by either label slug.
pub async fn remember(db: impl PgExecutor<'_>, user: &Username) -> sqlx::Result<()> {
    let s = slugs(user.as_str());
    sqlx::query(
        "INSERT INTO app_user (name, escape_slug, safe_slug) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(user.as_str())
    .bind(&s.escape)
    .bind(&s.safe)
    .execute(db)
    .await?;
    Ok(())
}

/// Users whose name, escape slug or safe slug is `slug`. Usually one; a slug
/// collision between two users can give more.
pub async fn by_slug(db: impl PgExecutor<'_>, slug: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        "SELECT name FROM app_user WHERE name = $1 OR escape_slug = $1 OR safe_slug = $1 ORDER BY name",
    )
    .bind(slug)
    .fetch_all(db)
    .await
}
