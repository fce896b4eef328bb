//! Groups, their members, policies and quotas (migration 20261213000100); the rules
//! are `core::groups` and `core::quota`.
//!
//! Statements here are checked when they run, not when the crate compiles (the
//! tests of `tests/it/groups.rs` and `tests/it/quota.rs` run each).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::groups::{GroupPolicy, ModelRule, PolicyOverrides, Ranked, Role, Source};
use gpu_booking_core::quota::{Counted, PeriodKind, Quota, Term};
use gpu_booking_core::window::Window;
use serde_json::json;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, PgExecutor, PgPool, Postgres, Transaction};

use super::audit;

/// The advisory lock space of groups: `(7266, group id)`, taken before every other
/// lock of a create (migration 20261213000100, `booking_lock_and_read_grouped`).
pub const GROUP_LOCK_SPACE: i32 = 7266;

/// The policy columns that `lab_group` and `group_model_policy` share (`None`
/// inherits).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PolicyColumns {
    pub min_duration_s: Option<i64>,
    pub max_duration_s: Option<i64>,
    pub cooldown_s: Option<i64>,
    pub no_booking_while_active: Option<bool>,
    pub max_planned: Option<i32>,
    pub max_units_per_booking: Option<i32>,
    pub max_ahead_s: Option<i64>,
}

/// A group's row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GroupRow {
    pub id: i32,
    pub name: String,
    pub position: i32,
    pub description: String,
    #[sqlx(flatten)]
    pub policy: PolicyColumns,
    pub listed_models_only: bool,
    pub quota_gpu_hours: Option<i32>,
    pub quota_period: String,
    pub quota_units: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A group's policy for one model.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ModelPolicyRow {
    pub group_id: i32,
    pub model: String,
    pub allowed: bool,
    #[sqlx(flatten)]
    pub policy: PolicyColumns,
}

/// A member of a group.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MemberRow {
    pub group_id: i32,
    pub user_name: String,
    pub role: String,
    pub source: String,
    pub added_at: DateTime<Utc>,
}

/// A group with its per-model policies.
#[derive(Debug, Clone)]
pub struct Group {
    pub row: GroupRow,
    pub models: Vec<ModelPolicyRow>,
}

/// The columns of [`PolicyColumns`], in its order (a macro, so that the other
/// lists can be `concat!`ed from it).
macro_rules! policy_columns {
    () => {
        "min_duration_s, max_duration_s, cooldown_s, no_booking_while_active, max_planned, \
        max_units_per_booking, max_ahead_s"
    };
}

const GROUP_COLUMNS: &str = concat!(
    "id, name, position, description, ",
    policy_columns!(),
    ", listed_models_only, quota_gpu_hours, quota_period, quota_units, created_at, updated_at"
);

const MODEL_COLUMNS: &str = concat!("group_id, model, allowed, ", policy_columns!());

const POLICY_COLUMNS: &str = policy_columns!();

fn seconds(s: Option<i64>) -> Option<TimeDelta> {
    s.map(TimeDelta::seconds)
}

fn count(n: Option<i32>) -> Option<u32> {
    n.and_then(|n| u32::try_from(n).ok())
}

impl PolicyColumns {
    /// Binds the columns, in their order, as the next seven parameters of `q`.
    fn bind<'q>(self, q: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        q.bind(self.min_duration_s)
            .bind(self.max_duration_s)
            .bind(self.cooldown_s)
            .bind(self.no_booking_while_active)
            .bind(self.max_planned)
            .bind(self.max_units_per_booking)
            .bind(self.max_ahead_s)
    }

    /// The columns that store `o`.
    fn of(o: &PolicyOverrides) -> Self {
        PolicyColumns {
            min_duration_s: secs(o.min_duration),
            max_duration_s: secs(o.max_duration),
            cooldown_s: secs(o.cooldown),
            no_booking_while_active: o.no_booking_while_active,
            max_planned: int(o.max_planned),
            max_units_per_booking: int(o.max_units_per_booking),
            max_ahead_s: secs(o.max_ahead),
        }
    }

    /// The columns as `core` reads them.
    pub fn overrides(&self) -> PolicyOverrides {
        PolicyOverrides {
            min_duration: seconds(self.min_duration_s),
            max_duration: seconds(self.max_duration_s),
            cooldown: seconds(self.cooldown_s),
            no_booking_while_active: self.no_booking_while_active,
            max_planned: count(self.max_planned),
            max_units_per_booking: count(self.max_units_per_booking),
            max_ahead: seconds(self.max_ahead_s),
        }
    }
}

impl GroupRow {
    pub fn overrides(&self) -> PolicyOverrides {
        self.policy.overrides()
    }

    pub fn quota(&self) -> Quota {
        Quota {
            gpu_hours: count(self.quota_gpu_hours),
            period: PeriodKind::parse(&self.quota_period).unwrap_or_default(),
            units: count(self.quota_units),
        }
    }

    /// The group's entity tag: what an admin's `PUT` with `If-Match` must name (its
    /// last write, to the microsecond).
    pub fn etag(&self) -> String {
        format!("\"g{}-{}\"", self.id, self.updated_at.timestamp_micros())
    }
}

impl ModelPolicyRow {
    pub fn rule(&self) -> ModelRule {
        ModelRule {
            allowed: self.allowed,
            overrides: self.policy.overrides(),
        }
    }
}

impl Group {
    pub fn policy(&self) -> GroupPolicy {
        GroupPolicy {
            overrides: self.row.overrides(),
            listed_models_only: self.row.listed_models_only,
            models: self
                .models
                .iter()
                .map(|m| (m.model.clone(), m.rule()))
                .collect(),
        }
    }
}

impl Ranked for GroupRow {
    fn position(&self) -> i32 {
        self.position
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// Groups with their models' policies, in the admin's order.
async fn with_models(db: &mut sqlx::PgConnection, rows: Vec<GroupRow>) -> sqlx::Result<Vec<Group>> {
    let ids: Vec<i32> = rows.iter().map(|r| r.id).collect();
    let models: Vec<ModelPolicyRow> = sqlx::query_as(&format!(
        "SELECT {MODEL_COLUMNS} FROM group_model_policy WHERE group_id = ANY($1) ORDER BY model"
    ))
    .bind(&ids)
    .fetch_all(&mut *db)
    .await?;
    let mut by_group: BTreeMap<i32, Vec<ModelPolicyRow>> = BTreeMap::new();
    for m in models {
        by_group.entry(m.group_id).or_default().push(m);
    }
    Ok(rows
        .into_iter()
        .map(|row| Group {
            models: by_group.remove(&row.id).unwrap_or_default(),
            row,
        })
        .collect())
}

/// Every group, in the admin's order.
pub async fn list(pool: &PgPool) -> sqlx::Result<Vec<Group>> {
    let mut conn = pool.acquire().await?;
    let rows: Vec<GroupRow> = sqlx::query_as(&format!(
        "SELECT {GROUP_COLUMNS} FROM lab_group ORDER BY position, name"
    ))
    .fetch_all(&mut *conn)
    .await?;
    with_models(&mut conn, rows).await
}

/// The group called `name`.
pub async fn get(db: &mut sqlx::PgConnection, name: &str) -> sqlx::Result<Option<Group>> {
    let row: Option<GroupRow> = sqlx::query_as(&format!(
        "SELECT {GROUP_COLUMNS} FROM lab_group WHERE name = $1"
    ))
    .bind(name)
    .fetch_optional(&mut *db)
    .await?;
    match row {
        Some(row) => Ok(with_models(db, vec![row]).await?.pop()),
        None => Ok(None),
    }
}

/// The groups of these ids.
pub async fn by_ids(db: &mut sqlx::PgConnection, ids: &[i32]) -> sqlx::Result<Vec<Group>> {
    let rows: Vec<GroupRow> = sqlx::query_as(&format!(
        "SELECT {GROUP_COLUMNS} FROM lab_group WHERE id = ANY($1) ORDER BY position, name"
    ))
    .bind(ids)
    .fetch_all(&mut *db)
    .await?;
    with_models(db, rows).await
}

/// The groups `user` belongs to, in the admin's order (the first decides their
/// policy), with the user's role and how they came to be in it.
pub async fn of_user(
    db: &mut sqlx::PgConnection,
    user: &str,
) -> sqlx::Result<Vec<(Group, MemberRow)>> {
    let members: Vec<MemberRow> = sqlx::query_as(
        "SELECT m.group_id, m.user_name, m.role, m.source, m.added_at
         FROM group_member m JOIN lab_group g ON g.id = m.group_id
         WHERE m.user_name = $1 ORDER BY g.position, g.name",
    )
    .bind(user)
    .fetch_all(&mut *db)
    .await?;
    let ids: Vec<i32> = members.iter().map(|m| m.group_id).collect();
    let mut groups: BTreeMap<i32, Group> = by_ids(db, &ids)
        .await?
        .into_iter()
        .map(|g| (g.row.id, g))
        .collect();
    Ok(members
        .into_iter()
        .filter_map(|m| groups.remove(&m.group_id).map(|g| (g, m)))
        .collect())
}

/// What an admin sets of a group (`POST` and `PUT`).
#[derive(Debug, Clone)]
pub struct GroupSpec<'a> {
    pub name: &'a str,
    pub position: i32,
    pub description: &'a str,
    pub policy: &'a GroupPolicy,
    pub quota: Quota,
}

fn secs(d: Option<TimeDelta>) -> Option<i64> {
    d.map(|d| d.num_seconds())
}

fn int(n: Option<u32>) -> Option<i32> {
    n.map(|n| i32::try_from(n).unwrap_or(i32::MAX))
}

/// Creates the group (`Ok(None)`: one of that name exists), or replaces its
/// settings (`replace`), with its models' policies, in the caller's transaction.
pub async fn write(
    tx: &mut Transaction<'_, Postgres>,
    spec: &GroupSpec<'_>,
    replace: bool,
    now: DateTime<Utc>,
    actor: &str,
) -> sqlx::Result<Option<Group>> {
    // Both statements take the policy columns as $4 to $10.
    let sql = if replace {
        format!(
            "UPDATE lab_group SET position = $2, description = $3,
                ({POLICY_COLUMNS}) = ($4, $5, $6, $7, $8, $9, $10),
                listed_models_only = $11, quota_gpu_hours = $12, quota_period = $13,
                quota_units = $14, updated_at = $15
             WHERE name = $1 RETURNING {GROUP_COLUMNS}"
        )
    } else {
        format!(
            "INSERT INTO lab_group (name, position, description, {POLICY_COLUMNS}, listed_models_only,
                quota_gpu_hours, quota_period, quota_units, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $15)
             ON CONFLICT (name) DO NOTHING RETURNING {GROUP_COLUMNS}"
        )
    };
    let head = sqlx::query(&sql)
        .bind(spec.name)
        .bind(spec.position)
        .bind(spec.description);
    let written = PolicyColumns::of(&spec.policy.overrides)
        .bind(head)
        .bind(spec.policy.listed_models_only)
        .bind(int(spec.quota.gpu_hours))
        .bind(spec.quota.period.as_str())
        .bind(int(spec.quota.units))
        .bind(now)
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = written.map(|r| GroupRow::from_row(&r)).transpose()? else {
        return Ok(None);
    };
    sqlx::query("DELETE FROM group_model_policy WHERE group_id = $1")
        .bind(row.id)
        .execute(&mut **tx)
        .await?;
    let insert = format!(
        "INSERT INTO group_model_policy ({MODEL_COLUMNS})
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
    );
    for (model, rule) in &spec.policy.models {
        let head = sqlx::query(&insert)
            .bind(row.id)
            .bind(model)
            .bind(rule.allowed);
        PolicyColumns::of(&rule.overrides)
            .bind(head)
            .execute(&mut **tx)
            .await?;
    }
    audit::record(
        &mut **tx,
        audit::NewEvent {
            at: now,
            actor,
            action: if replace {
                "group.update"
            } else {
                "group.create"
            },
            subject: Some(spec.name),
            user: None,
            booking_id: None,
            details: json!({
                "position": spec.position,
                "quota_gpu_hours": spec.quota.gpu_hours,
                "quota_period": spec.quota.period.as_str(),
                "quota_units": spec.quota.units,
            }),
        },
    )
    .await?;
    Ok(with_models(&mut *tx, vec![row]).await?.pop())
}

/// Takes the group's lock (the one creates of its members take first), so that a
/// change of its quota or policy is not decided against half of a create.
pub async fn lock(tx: &mut Transaction<'_, Postgres>, group_id: i32) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
        .bind(GROUP_LOCK_SPACE)
        .bind(group_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Runs `delete` and, when it deleted a row, records `event`, in one transaction;
/// `false` (and no event): there was nothing to delete.
pub async fn delete_audited(
    pool: &PgPool,
    delete: Query<'_, Postgres, PgArguments>,
    event: audit::NewEvent<'_>,
) -> sqlx::Result<bool> {
    let mut tx = pool.begin().await?;
    let gone = delete.execute(&mut *tx).await?.rows_affected() > 0;
    if gone {
        audit::record(&mut *tx, event).await?;
    }
    tx.commit().await?;
    Ok(gone)
}

/// Deletes the group: its members and policies go with it; its bookings stay, and
/// count against no group from now on. `false`: no such group.
pub async fn delete(
    pool: &PgPool,
    name: &str,
    now: DateTime<Utc>,
    actor: &str,
) -> sqlx::Result<bool> {
    delete_audited(
        pool,
        sqlx::query("DELETE FROM lab_group WHERE name = $1").bind(name),
        audit::NewEvent {
            at: now,
            actor,
            action: "group.delete",
            subject: Some(name),
            user: None,
            booking_id: None,
            details: json!({}),
        },
    )
    .await
}

/// The group's members, owners first.
pub async fn members(db: impl PgExecutor<'_>, group_id: i32) -> sqlx::Result<Vec<MemberRow>> {
    sqlx::query_as(
        "SELECT group_id, user_name, role, source, added_at FROM group_member
         WHERE group_id = $1 ORDER BY role DESC, user_name",
    )
    .bind(group_id)
    .fetch_all(db)
    .await
}

/// Whether `user` owns the group (owners manage its members and reservations).
pub async fn is_owner(db: impl PgExecutor<'_>, group_id: i32, user: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM group_member WHERE group_id = $1 AND user_name = $2 AND role = 'owner')",
    )
    .bind(group_id)
    .bind(user)
    .fetch_one(db)
    .await
}

/// Adds `user` to the group or changes their role; the membership becomes an
/// admin's (`Source::Admin`: no sync removes it).
pub async fn put_member(
    pool: &PgPool,
    group: &GroupRow,
    user: &str,
    role: Role,
    now: DateTime<Utc>,
    actor: &str,
) -> sqlx::Result<MemberRow> {
    let mut tx = pool.begin().await?;
    let row: MemberRow = sqlx::query_as(
        "INSERT INTO group_member (group_id, user_name, role, source, added_at) VALUES ($1, $2, $3, 'admin', $4)
         ON CONFLICT (group_id, user_name) DO UPDATE SET role = excluded.role, source = 'admin'
         RETURNING group_id, user_name, role, source, added_at",
    )
    .bind(group.id)
    .bind(user)
    .bind(role.as_str())
    .bind(now)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut *tx,
        audit::NewEvent {
            at: now,
            actor,
            action: "group.member_put",
            subject: Some(&group.name),
            user: Some(user),
            booking_id: None,
            details: json!({ "role": role.as_str() }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// Removes `user` from the group (whatever the source; a sync may add them again
/// while their token or JupyterHub still says so). `false`: not a member.
pub async fn delete_member(
    pool: &PgPool,
    group: &GroupRow,
    user: &str,
    now: DateTime<Utc>,
    actor: &str,
) -> sqlx::Result<bool> {
    delete_audited(
        pool,
        sqlx::query("DELETE FROM group_member WHERE group_id = $1 AND user_name = $2")
            .bind(group.id)
            .bind(user),
        audit::NewEvent {
            at: now,
            actor,
            action: "group.member_delete",
            subject: Some(&group.name),
            user: Some(user),
            booking_id: None,
            details: json!({}),
        },
    )
    .await
}

/// Makes `user`'s memberships from `source` exactly the groups of `names` that an
/// admin created (a token or JupyterHub never creates a group); memberships from
/// other sources stay. Nothing is written when they are that already.
pub async fn sync_user(
    pool: &PgPool,
    user: &str,
    source: Source,
    names: &[String],
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    sqlx::query(
        "WITH wanted AS (SELECT id FROM lab_group WHERE name = ANY($2)),
              gone AS (DELETE FROM group_member m WHERE m.user_name = $1 AND m.source = $3
                       AND m.group_id NOT IN (SELECT id FROM wanted))
         INSERT INTO group_member (group_id, user_name, role, source, added_at)
         SELECT id, $1, 'member', $3, $4 FROM wanted
         ON CONFLICT (group_id, user_name) DO NOTHING",
    )
    .bind(user)
    .bind(&names)
    .bind(source.as_str())
    .bind(now)
    .execute(pool)
    .await?;
    Ok(())
}

/// Makes the memberships from `source` of the groups `members` names (group name
/// -> its users) exactly those users, for the groups an admin created; groups
/// `members` does not name lose their memberships from `source`. Returns how many
/// memberships were added and removed.
pub async fn sync_all(
    pool: &PgPool,
    source: Source,
    members: &BTreeMap<String, BTreeSet<String>>,
    now: DateTime<Utc>,
) -> sqlx::Result<(u64, u64)> {
    let mut groups = Vec::new();
    let mut users = Vec::new();
    for (group, names) in members {
        for user in names {
            groups.push(group.as_str());
            users.push(user.as_str());
        }
    }
    let mut tx = pool.begin().await?;
    let removed = sqlx::query(
        "DELETE FROM group_member m USING lab_group g
         WHERE g.id = m.group_id AND m.source = $3
           AND (g.name, m.user_name) NOT IN (SELECT * FROM unnest($1::text[], $2::text[]))",
    )
    .bind(&groups)
    .bind(&users)
    .bind(source.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let added = sqlx::query(
        "INSERT INTO group_member (group_id, user_name, role, source, added_at)
         SELECT g.id, w.user_name, 'member', $3, $4
         FROM unnest($1::text[], $2::text[]) AS w(group_name, user_name) JOIN lab_group g ON g.name = w.group_name
         ON CONFLICT (group_id, user_name) DO NOTHING",
    )
    .bind(&groups)
    .bind(&users)
    .bind(source.as_str())
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok((added, removed))
}

/// The admin's terms, in order.
pub async fn terms(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Term>> {
    let rows: Vec<(String, DateTime<Utc>, DateTime<Utc>)> =
        sqlx::query_as("SELECT name, start_at, end_at FROM quota_term ORDER BY start_at")
            .fetch_all(db)
            .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(name, s, e)| Window::new(s, e).ok().map(|window| Term { name, window }))
        .collect())
}

/// Replaces the admin's terms (refused by the database if two overlap).
pub async fn put_terms(
    pool: &PgPool,
    terms: &[Term],
    now: DateTime<Utc>,
    actor: &str,
) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM quota_term")
        .execute(&mut *tx)
        .await?;
    for t in terms {
        sqlx::query("INSERT INTO quota_term (name, start_at, end_at) VALUES ($1, $2, $3)")
            .bind(&t.name)
            .bind(t.window.start())
            .bind(t.window.end())
            .execute(&mut *tx)
            .await?;
    }
    audit::record(
        &mut *tx,
        audit::NewEvent {
            at: now,
            actor,
            action: "group.terms_put",
            subject: None,
            user: None,
            booking_id: None,
            details: json!({ "terms": terms.iter().map(|t| json!({
                "name": t.name, "start": t.window.start(), "end": t.window.end()
            })).collect::<Vec<_>>() }),
        },
    )
    .await?;
    tx.commit().await
}

/// The bookings (not cancelled) counted against `group_id` that overlap `window`,
/// but `except` (a booking being changed).
pub async fn counted(
    db: impl PgExecutor<'_>,
    group_id: i32,
    window: &Window,
    except: Option<i64>,
) -> sqlx::Result<Vec<Counted>> {
    let rows: Vec<(DateTime<Utc>, DateTime<Utc>, i32)> = sqlx::query_as(
        "SELECT start_at, end_at, units FROM booking
         WHERE group_id = $1 AND cancelled_at IS NULL AND end_at > $2 AND start_at < $3
           AND id IS DISTINCT FROM $4",
    )
    .bind(group_id)
    .bind(window.start())
    .bind(window.end())
    .bind(except)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(s, e, units)| {
            Window::new(s, e).ok().map(|window| Counted {
                window,
                units: u32::try_from(units).unwrap_or(0),
            })
        })
        .collect())
}

/// Per user, the unit-seconds their bookings counted against `group_id` hold in
/// `period`.
pub async fn used_by_user(
    db: impl PgExecutor<'_>,
    group_id: i32,
    period: &Window,
) -> sqlx::Result<Vec<(String, i64)>> {
    sqlx::query_as(
        "SELECT user_name,
                sum(units * extract(epoch FROM least(end_at, $3) - greatest(start_at, $2)))::bigint
         FROM booking
         WHERE group_id = $1 AND cancelled_at IS NULL AND end_at > $2 AND start_at < $3
         GROUP BY user_name ORDER BY user_name",
    )
    .bind(group_id)
    .bind(period.start())
    .bind(period.end())
    .fetch_all(db)
    .await
}
