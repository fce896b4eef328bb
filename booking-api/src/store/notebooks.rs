//! Every user's running notebooks as the controller last reported them (it watches
//! the pods; the service does not): replaced whole with each report, read per user.

use chrono::{DateTime, Utc};
use gpu_booking_core::username::NameCase;

use super::users::owner;
use gpu_booking_core::wire::{NextStep, Notebook};
use sqlx::{PgExecutor, PgPool};

/// Replaces every notebook with `notebooks` (a notebook left out is not running)
/// and records when they were reported.
pub async fn replace(
    pool: &PgPool,
    notebooks: &[Notebook],
    names: NameCase,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let mut namespaces = Vec::with_capacity(notebooks.len());
    let mut pods = Vec::with_capacity(notebooks.len());
    let mut users = Vec::with_capacity(notebooks.len());
    let mut states = Vec::with_capacity(notebooks.len());
    for n in notebooks {
        namespaces.push(n.namespace.clone());
        pods.push(n.pod.clone());
        users.push(owner(&n.user, names));
        states.push(serde_json::to_string(n).map_err(|e| sqlx::Error::Encode(Box::new(e)))?);
    }
    let mut tx = pool.begin().await?;
    sqlx::query!("DELETE FROM notebook")
        .execute(&mut *tx)
        .await?;
    // A pod named twice in one report: the last one counts.
    sqlx::query!(
        "INSERT INTO notebook (namespace, pod, user_name, state, reported_at)
         SELECT n.namespace, n.pod, n.user_name, n.state::jsonb, $5
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
             AS n(namespace, pod, user_name, state)
         ON CONFLICT (namespace, pod) DO UPDATE SET user_name = excluded.user_name,
             state = excluded.state, reported_at = excluded.reported_at",
        &namespaces,
        &pods,
        &users,
        &states,
        now
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO notebook_report (id, reported_at) VALUES (true, $1)
         ON CONFLICT (id) DO UPDATE SET reported_at = excluded.reported_at",
        now
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// `user`'s notebooks by the last report, by namespace and pod, and when that report
/// came (`None`: never).
pub async fn of_user(
    pool: &PgPool,
    user: &str,
    names: NameCase,
) -> sqlx::Result<(Option<DateTime<Utc>>, Vec<Notebook>)> {
    let user = owner(user, names);
    let mut conn = pool.acquire().await?;
    let reported_at = reported_at(&mut *conn).await?;
    let rows = sqlx::query!(
        r#"SELECT namespace, pod, state::text AS "state!" FROM notebook
           WHERE user_name = $1 ORDER BY namespace, pod"#,
        user
    )
    .fetch_all(&mut *conn)
    .await?;
    // The GPU offered back to the user, on the notebook it was offered for: what
    // to do next, first.
    let offer = super::offers::list(&mut *conn, Some(&user), None)
        .await?
        .pop();
    let with_offer = |mut n: Notebook| {
        n.offer = None;
        n.next.retain(|s| *s != NextStep::Restart);
        if let Some(o) = offer
            .as_ref()
            .filter(|o| o.namespace == n.namespace && o.pod == n.pod)
        {
            n.offer = Some(o.clone());
            n.next.insert(0, NextStep::Restart);
        }
        n
    };
    let notebooks = rows
        .into_iter()
        .map(|r| {
            (
                serde_json::from_str::<Notebook>(&r.state).map(with_offer),
                r,
            )
        })
        .filter_map(|(n, r)| match n {
            Ok(n) => Some(n),
            Err(e) => {
                // Only a row written by other means (SQL by hand) can fail; one bad
                // row must not hide the others.
                tracing::warn!(namespace = %r.namespace, pod = %r.pod, error = %e,
                    "a stored notebook is unreadable; left out");
                None
            }
        })
        .collect();
    Ok((reported_at, notebooks))
}

async fn reported_at(db: impl PgExecutor<'_>) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar!("SELECT reported_at FROM notebook_report WHERE id")
        .fetch_optional(db)
        .await
}
