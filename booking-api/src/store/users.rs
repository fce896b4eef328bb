//! Users the service has seen, with their KubeSpawner slugs (written with their
//! first booking, see `bookings::create`).

use gpu_booking_core::username::{NameCase, Username};
use sqlx::PgExecutor;

/// Users whose name, escape slug or safe slug is `slug`. Usually one; a slug
/// collision between two users can give more.
pub async fn by_slug(db: impl PgExecutor<'_>, slug: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        "SELECT name FROM app_user WHERE name = $1 OR escape_slug = $1 OR safe_slug = $1 ORDER BY name",
        slug
    )
    .fetch_all(db)
    .await
}

/// The name a user's notebooks and offers are kept under: the name as reported,
/// normalised as the service compares names (a name the service would refuse is
/// kept as written: nobody signs in as it, and an admin may still read it).
pub(crate) fn owner(user: &str, names: NameCase) -> String {
    Username::normalised(user, names)
        .map(Username::into_inner)
        .unwrap_or_else(|_| user.to_owned())
}
