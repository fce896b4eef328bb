//! `/api/v1/groups`: groups (courses, research groups), their members, policies and
//! quotas, and the admin's quota terms. The rules are `core::groups` and
//! `core::quota`; docs/booking-service.md, "Groups, policies and quotas".

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::booking_policy::Policy;
use gpu_booking_core::groups::{self, GroupPolicy, ModelRule, PolicyOverrides, Role};
use gpu_booking_core::quota::{self, PeriodKind, Quota, Term};
use gpu_booking_core::username::Username;
use gpu_booking_core::window::Window;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Json, Path};
use crate::state::AppState;
use crate::store::groups::{self as store, Group, MemberRow};

/// Settings of a policy; each one left out (or `null`) inherits: a group's from
/// the lab's (`GET /api/v1/policy`'s `lab`), a model's from its group's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    /// Shortest booking, seconds.
    #[schema(minimum = 1, maximum = 315360000)]
    pub min_duration_seconds: Option<i64>,
    /// Longest booking, seconds.
    #[schema(minimum = 1, maximum = 315360000)]
    pub max_duration_seconds: Option<i64>,
    /// Gap between a user's bookings, seconds.
    #[schema(minimum = 0, maximum = 315360000)]
    pub cooldown_seconds: Option<i64>,
    /// Refuse a new booking while the user has one running.
    pub no_booking_while_active: Option<bool>,
    /// Planned bookings a user may hold at once.
    #[schema(minimum = 0, maximum = 1000)]
    pub max_planned: Option<u32>,
    /// GPUs one booking may be for.
    #[schema(minimum = 1, maximum = 64)]
    pub max_units_per_booking: Option<u32>,
    /// How far ahead a booking may start, seconds (the booking horizon).
    #[schema(minimum = 0, maximum = 315360000)]
    pub max_ahead_seconds: Option<i64>,
}

impl PolicySettings {
    fn core(&self) -> PolicyOverrides {
        PolicyOverrides {
            min_duration: self.min_duration_seconds.map(TimeDelta::seconds),
            max_duration: self.max_duration_seconds.map(TimeDelta::seconds),
            cooldown: self.cooldown_seconds.map(TimeDelta::seconds),
            no_booking_while_active: self.no_booking_while_active,
            max_planned: self.max_planned,
            max_units_per_booking: self.max_units_per_booking,
            max_ahead: self.max_ahead_seconds.map(TimeDelta::seconds),
        }
    }

    fn of(o: &PolicyOverrides) -> Self {
        PolicySettings {
            min_duration_seconds: o.min_duration.map(|d| d.num_seconds()),
            max_duration_seconds: o.max_duration.map(|d| d.num_seconds()),
            cooldown_seconds: o.cooldown.map(|d| d.num_seconds()),
            no_booking_while_active: o.no_booking_while_active,
            max_planned: o.max_planned,
            max_units_per_booking: o.max_units_per_booking,
            max_ahead_seconds: o.max_ahead.map(|d| d.num_seconds()),
        }
    }
}

/// A group's rule for one model.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelPolicy {
    pub model: String,
    /// Whether the group's members may book it (default true).
    #[serde(default = "yes")]
    pub allowed: bool,
    /// Settings over the group's for this model.
    #[serde(default)]
    pub policy: PolicySettings,
}

fn yes() -> bool {
    true
}

/// A group's quotas; each left out limits nothing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaSettings {
    /// GPU-hours (unit-hours) the group's bookings may hold per period.
    #[schema(minimum = 0, maximum = 2147483647)]
    pub gpu_hours: Option<u32>,
    /// `month` (calendar months in the lab's time zone, the default) or `term` (the
    /// admin's terms, `PUT /api/v1/quota-terms`; outside every term hours are not
    /// limited).
    #[serde(default)]
    pub period: PeriodName,
    /// Units (GPUs) the group's bookings may hold at any one instant.
    #[schema(minimum = 0, maximum = 2147483647)]
    pub units: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PeriodName {
    #[default]
    Month,
    Term,
}

impl QuotaSettings {
    fn core(&self) -> Quota {
        Quota {
            gpu_hours: self.gpu_hours,
            period: match self.period {
                PeriodName::Month => PeriodKind::Month,
                PeriodName::Term => PeriodKind::Term,
            },
            units: self.units,
        }
    }

    fn of(q: &Quota) -> Self {
        QuotaSettings {
            gpu_hours: q.gpu_hours,
            period: match q.period {
                PeriodKind::Month => PeriodName::Month,
                PeriodKind::Term => PeriodName::Term,
            },
            units: q.units,
        }
    }
}

/// A group as an admin writes it (`POST` with `name`; `PUT` without).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupBody {
    /// `POST` only: the group's name, as tokens' groups claims and JupyterHub name
    /// it: 1 to 128 of `A-Z a-z 0-9 - . _ @`, starting and ending with a letter or
    /// digit.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[A-Za-z0-9]([-A-Za-z0-9._@]*[A-Za-z0-9])?$"
    )]
    pub name: Option<String>,
    /// The admin's order: a user in several groups gets the policy of the first
    /// (lowest position, then name). Default 0.
    #[serde(default)]
    pub position: i32,
    #[serde(default)]
    #[schema(max_length = 1024)]
    pub description: String,
    #[serde(default)]
    pub policy: PolicySettings,
    /// Only the models listed in `models` with `allowed` may be booked (default:
    /// every model but those listed with `allowed: false`).
    #[serde(default)]
    pub listed_models_only: bool,
    #[serde(default)]
    #[schema(max_items = 256)]
    pub models: Vec<ModelPolicy>,
    #[serde(default)]
    pub quota: QuotaSettings,
}

/// A member of a group.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Member {
    pub user: String,
    /// `member` or `owner` (owners manage the group's members and reservations).
    pub role: String,
    /// How they came to be a member: `admin` (the API), `oidc` (their token's groups
    /// claim) or `hub` (JupyterHub's groups).
    pub source: String,
    pub added_at: DateTime<Utc>,
}

impl From<MemberRow> for Member {
    fn from(m: MemberRow) -> Self {
        Member {
            user: m.user_name,
            role: m.role,
            source: m.source,
            added_at: m.added_at,
        }
    }
}

/// A group as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GroupView {
    pub id: i32,
    pub name: String,
    pub position: i32,
    pub description: String,
    pub policy: PolicySettings,
    pub listed_models_only: bool,
    pub models: Vec<ModelPolicy>,
    pub quota: QuotaSettings,
    /// Its members (to admins and the group's owners; others see none).
    pub members: Vec<Member>,
    pub updated_at: DateTime<Utc>,
}

fn view(g: &Group, members: Vec<Member>) -> GroupView {
    GroupView {
        id: g.row.id,
        name: g.row.name.clone(),
        position: g.row.position,
        description: g.row.description.clone(),
        policy: PolicySettings::of(&g.row.overrides()),
        listed_models_only: g.row.listed_models_only,
        models: g
            .models
            .iter()
            .map(|m| ModelPolicy {
                model: m.model.clone(),
                allowed: m.allowed,
                policy: PolicySettings::of(&m.rule().overrides),
            })
            .collect(),
        quota: QuotaSettings::of(&g.row.quota()),
        members,
        updated_at: g.row.updated_at,
    }
}

/// A group answered with its `ETag`.
pub struct TaggedGroup(String, GroupView);

impl IntoResponse for TaggedGroup {
    fn into_response(self) -> axum::response::Response {
        crate::routes::conditional::with_etag(&self.0, self.1)
    }
}

/// The body as `core` takes it, or why it is not acceptable.
fn spec_parts(body: &GroupBody, lab: &Policy) -> Result<(GroupPolicy, Quota), ApiError> {
    if body.description.len() > 1024 {
        return Err(ApiError::Invalid("description: at most 1024 bytes".into()));
    }
    if body.models.len() > 256 {
        return Err(ApiError::Invalid("models: at most 256".into()));
    }
    let mut models = BTreeMap::new();
    for m in &body.models {
        if models
            .insert(
                m.model.clone(),
                ModelRule {
                    allowed: m.allowed,
                    overrides: m.policy.core(),
                },
            )
            .is_some()
        {
            return Err(ApiError::Invalid(format!("models: {} twice", m.model)));
        }
    }
    let policy = GroupPolicy {
        overrides: body.policy.core(),
        listed_models_only: body.listed_models_only,
        models,
    };
    if let Some(problem) = policy.problem(lab) {
        return Err(ApiError::Invalid(format!("policy: {problem}")));
    }
    let quota = body.quota.core();
    let too_big = |n: Option<u32>| n.is_some_and(|n| i32::try_from(n).is_err());
    if too_big(quota.gpu_hours) || too_big(quota.units) {
        return Err(ApiError::Invalid("quota: at most 2147483647".into()));
    }
    Ok((policy, quota))
}

/// A model a policy names that does not exist: the database's foreign key.
fn unknown_model(e: sqlx::Error) -> ApiError {
    if let sqlx::Error::Database(db) = &e {
        if db.constraint() == Some("group_model_policy_model_fkey") {
            return ApiError::Invalid("models: a model named there does not exist".into());
        }
    }
    e.into()
}

async fn group_or_404(state: &AppState, name: &str) -> Result<Group, ApiError> {
    let mut conn = state.pool.acquire().await?;
    store::get(&mut conn, name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no group {name:?}")))
}

/// Records the caller's token groups (source `oidc`, or `hub` for the page's hub
/// sign-in) when this process has not lately: a token never creates a group, and
/// memberships from other sources stay. Called where the caller's groups matter
/// (creates, changes, the policy, the groups).
pub async fn seen(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    let Some(tg) = &caller.groups else {
        return Ok(());
    };
    let user = caller.user.as_str();
    if !state.auth.groups_changed(user, &tg.names) {
        return Ok(());
    }
    if let Err(e) =
        store::sync_user(&state.pool, user, tg.source, &tg.names, state.clock.now()).await
    {
        state.auth.forget_groups(user);
        return Err(e.into());
    }
    Ok(())
}

#[utoipa::path(get, path = "/api/v1/groups", tag = "groups",
    description = "Every group to admins, in the admin's order; to others the groups they belong to.",
    responses((status = 200, body = [GroupView]), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<Vec<GroupView>>, ApiError> {
    seen(&state, &caller).await?;
    if caller.admin {
        let groups = store::list(&state.pool).await?;
        let mut out = Vec::with_capacity(groups.len());
        for g in &groups {
            let members = store::members(&state.pool, g.row.id).await?;
            out.push(view(g, members.into_iter().map(Member::from).collect()));
        }
        return Ok(axum::Json(out));
    }
    let mut conn = state.pool.acquire().await?;
    let mine = store::of_user(&mut conn, caller.user.as_str()).await?;
    let mut out = Vec::with_capacity(mine.len());
    for (g, m) in &mine {
        let members = if m.role == Role::Owner.as_str() {
            store::members(&mut *conn, g.row.id).await?
        } else {
            Vec::new()
        };
        out.push(view(g, members.into_iter().map(Member::from).collect()));
    }
    Ok(axum::Json(out))
}

#[utoipa::path(post, path = "/api/v1/groups", tag = "groups", request_body = GroupBody,
    responses((status = 201, body = GroupView), (status = 403, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "`group_exists`"), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<GroupBody>,
) -> Result<(StatusCode, TaggedGroup), ApiError> {
    caller.require_admin()?;
    let name = body
        .name
        .clone()
        .ok_or_else(|| ApiError::Invalid("name: required".into()))?;
    if let Some(problem) = groups::name_problem(&name) {
        return Err(ApiError::Invalid(problem));
    }
    let (policy, quota) = spec_parts(&body, &state.policy)?;
    let now = state.clock.now();
    let mut tx = state.pool.begin().await?;
    let written = store::write(
        &mut tx,
        &store::GroupSpec {
            name: &name,
            position: body.position,
            description: &body.description,
            policy: &policy,
            quota,
        },
        false,
        now,
        caller.user.as_str(),
    )
    .await
    .map_err(unknown_model)?
    .ok_or_else(|| ApiError::Conflict("group_exists", format!("a group {name:?} exists")))?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        TaggedGroup(written.row.etag(), view(&written, Vec::new())),
    ))
}

#[utoipa::path(get, path = "/api/v1/groups/{name}", tag = "groups", params(("name" = String, Path)),
    description = "The group (admins, and its members; the members list to admins and owners).",
    responses((status = 200, body = GroupView, headers(("ETag" = String, description = "The group's stored state: send it in `If-Match` with `PUT` to change the group only in that state."))),
              (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<TaggedGroup, ApiError> {
    seen(&state, &caller).await?;
    let g = group_or_404(&state, &name).await?;
    let members = store::members(&state.pool, g.row.id).await?;
    let mine = members
        .iter()
        .find(|m| m.user_name == caller.user.as_str())
        .map(|m| m.role.clone());
    let shown = match (caller.admin, mine.as_deref()) {
        (true, _) | (false, Some("owner")) => members.into_iter().map(Member::from).collect(),
        (false, Some(_)) => Vec::new(),
        // Another group answers like a missing one.
        (false, None) => return Err(ApiError::NotFound(format!("no group {name:?}"))),
    };
    Ok(TaggedGroup(g.row.etag(), view(&g, shown)))
}

#[utoipa::path(put, path = "/api/v1/groups/{name}", tag = "groups", request_body = GroupBody,
    params(("name" = String, Path), ("If-Match" = Option<String>, Header, description = "An `ETag` of this group (or `*`): the change is made only while the group is in that state, else 412.")),
    description = "Replaces the group's position, description, policy and quotas (admins). Bookings already made stay; the new settings decide the next creates and changes.",
    responses((status = 200, body = GroupView), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 412, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    Json(body): Json<GroupBody>,
) -> Result<TaggedGroup, ApiError> {
    caller.require_admin()?;
    let condition = crate::routes::conditional::if_match(&headers)?;
    if body.name.as_deref().is_some_and(|n| n != name) {
        return Err(ApiError::Invalid(
            "name: a group cannot be renamed (its name is what tokens and JupyterHub name)".into(),
        ));
    }
    let (policy, quota) = spec_parts(&body, &state.policy)?;
    let now = state.clock.now();
    let mut tx = state.pool.begin().await?;
    let current = store::get(&mut tx, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no group {name:?}")))?;
    // Under the group's lock: no create of its members is decided by half of it,
    // and two writes with one tag cannot both pass.
    store::lock(&mut tx, current.row.id).await?;
    let current = store::get(&mut tx, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no group {name:?}")))?;
    if let Some(c) = &condition {
        if !c.matches(&current.row.etag()) {
            return Err(ApiError::PreconditionFailed(format!(
                "group {name:?} has changed since that ETag; read it again"
            )));
        }
    }
    let written = store::write(
        &mut tx,
        &store::GroupSpec {
            name: &name,
            position: body.position,
            description: &body.description,
            policy: &policy,
            quota,
        },
        true,
        now,
        caller.user.as_str(),
    )
    .await
    .map_err(unknown_model)?
    .ok_or_else(|| ApiError::NotFound(format!("no group {name:?}")))?;
    tx.commit().await?;
    let members = store::members(&state.pool, written.row.id).await?;
    Ok(TaggedGroup(
        written.row.etag(),
        view(&written, members.into_iter().map(Member::from).collect()),
    ))
}

#[utoipa::path(delete, path = "/api/v1/groups/{name}", tag = "groups", params(("name" = String, Path)),
    description = "Deletes the group with its memberships and policies (admins); its bookings stay and count against no group.",
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require_admin()?;
    if store::delete(&state.pool, &name, state.clock.now(), caller.user.as_str()).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!("no group {name:?}")))
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberBody {
    /// `member` (default) or `owner` (admins only).
    #[serde(default)]
    pub role: Option<String>,
}

/// The caller may manage `group`'s members: an admin, or one of its owners.
async fn require_manager(state: &AppState, caller: &Caller, group: &Group) -> Result<(), ApiError> {
    if caller.admin || store::is_owner(&state.pool, group.row.id, caller.user.as_str()).await? {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "this needs the admin role or ownership of the group".into(),
        ))
    }
}

#[utoipa::path(put, path = "/api/v1/groups/{name}/members/{user}", tag = "groups", request_body = MemberBody,
    params(("name" = String, Path), ("user" = String, Path)),
    description = "Adds the user to the group or changes their role (admins; owners for the role `member`). The membership is then an admin's: no sync from tokens or JupyterHub removes it.",
    responses((status = 200, body = Member), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_member(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, user)): Path<(String, String)>,
    Json(body): Json<MemberBody>,
) -> Result<axum::Json<Member>, ApiError> {
    let group = group_or_404(&state, &name).await?;
    require_manager(&state, &caller, &group).await?;
    let user = Username::normalised(&user, state.names)
        .map_err(|e| ApiError::Invalid(format!("user: {e}")))?;
    let role = match body.role.as_deref() {
        None => Role::Member,
        Some(r) => {
            Role::parse(r).ok_or_else(|| ApiError::Invalid("role: `member` or `owner`".into()))?
        }
    };
    if role == Role::Owner && !caller.admin {
        return Err(ApiError::Forbidden("only admins make owners".into()));
    }
    if !caller.admin && store::is_owner(&state.pool, group.row.id, user.as_str()).await? {
        return Err(ApiError::Forbidden(
            "only admins change an owner's role".into(),
        ));
    }
    let row = store::put_member(
        &state.pool,
        &group.row,
        user.as_str(),
        role,
        state.clock.now(),
        caller.user.as_str(),
    )
    .await?;
    Ok(axum::Json(row.into()))
}

#[utoipa::path(delete, path = "/api/v1/groups/{name}/members/{user}", tag = "groups",
    params(("name" = String, Path), ("user" = String, Path)),
    description = "Removes the user from the group (admins; owners for members who are not owners). A token's or JupyterHub's groups may add them again while they still name the group.",
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_member(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let group = group_or_404(&state, &name).await?;
    require_manager(&state, &caller, &group).await?;
    let user = Username::normalised(&user, state.names)
        .map_err(|e| ApiError::Invalid(format!("user: {e}")))?;
    if !caller.admin
        && user.as_str() != caller.user.as_str()
        && store::is_owner(&state.pool, group.row.id, user.as_str()).await?
    {
        return Err(ApiError::Forbidden("only admins remove an owner".into()));
    }
    if store::delete_member(
        &state.pool,
        &group.row,
        user.as_str(),
        state.clock.now(),
        caller.user.as_str(),
    )
    .await?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!("{user} is not in {name:?}")))
    }
}

/// A group's use against its quota now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GroupUsage {
    pub group: String,
    pub quota: QuotaSettings,
    /// The period now falls in (`2026-12`, or a term's name), whether or not the
    /// quota limits hours; absent between terms.
    pub period: Option<String>,
    pub period_start: Option<DateTime<Utc>>,
    pub period_end: Option<DateTime<Utc>>,
    /// GPU-hours the group's bookings hold in the period (planned ones included).
    pub used_gpu_hours: f64,
    /// GPU-hours left in the period (absent: not limited).
    pub left_gpu_hours: Option<f64>,
    /// Units the group's bookings hold now, and the most they hold at once from now on.
    pub units_now: u32,
    pub units_peak_ahead: u32,
    /// Per member: GPU-hours their bookings of the group hold in the period (to
    /// admins and owners).
    pub by_user: BTreeMap<String, f64>,
}

/// `unit_seconds` as GPU-hours, to the hundredth.
fn gpu_hours(unit_seconds: i64) -> f64 {
    (unit_seconds as f64 / 36.0).round() / 100.0
}

/// The group's use at `now` (`by_user` only when `detail`).
pub async fn usage_of(
    state: &AppState,
    g: &Group,
    now: DateTime<Utc>,
    detail: bool,
) -> Result<GroupUsage, ApiError> {
    let quota = g.row.quota();
    let terms: Vec<Term> = if quota.period == PeriodKind::Term {
        store::terms(&state.pool).await?
    } else {
        Vec::new()
    };
    let zone = state.policy.zone;
    let period = quota::period_at(quota.period, zone, &terms, now);
    let from = period.as_ref().map_or(now, |p| p.window.start().min(now));
    let span = Window::new(from, DateTime::<Utc>::MAX_UTC)
        .map_err(|_| ApiError::Internal(anyhow::anyhow!("no window from {from}")))?;
    let counted = store::counted(&state.pool, g.row.id, &span, None).await?;
    let u = quota::use_at(&quota, zone, &terms, &counted, now);
    let mut by_user = BTreeMap::new();
    if detail {
        if let Some(p) = &period {
            for (user, seconds) in store::used_by_user(&state.pool, g.row.id, &p.window).await? {
                by_user.insert(user, gpu_hours(seconds));
            }
        }
    }
    Ok(GroupUsage {
        group: g.row.name.clone(),
        quota: QuotaSettings::of(&quota),
        period: period.as_ref().map(|p| p.name.clone()),
        period_start: period.as_ref().map(|p| p.window.start()),
        period_end: period.as_ref().map(|p| p.window.end()),
        used_gpu_hours: gpu_hours(u.used_seconds),
        left_gpu_hours: u.left_seconds().map(gpu_hours),
        units_now: u.units_now,
        units_peak_ahead: u.units_peak_ahead,
        by_user,
    })
}

#[utoipa::path(get, path = "/api/v1/groups/{name}/usage", tag = "groups", params(("name" = String, Path)),
    description = "The group's use against its quota now (admins and members; per member to admins and owners).",
    responses((status = 200, body = GroupUsage), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn usage(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<axum::Json<GroupUsage>, ApiError> {
    let g = group_or_404(&state, &name).await?;
    let mine = store::members(&state.pool, g.row.id)
        .await?
        .into_iter()
        .find(|m| m.user_name == caller.user.as_str());
    let detail = match (caller.admin, &mine) {
        (true, _) => true,
        (false, Some(m)) => m.role == Role::Owner.as_str(),
        (false, None) => return Err(ApiError::NotFound(format!("no group {name:?}"))),
    };
    Ok(axum::Json(
        usage_of(&state, &g, state.clock.now(), detail).await?,
    ))
}

/// A term of `term` quotas.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TermView {
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

#[utoipa::path(get, path = "/api/v1/quota-terms", tag = "groups",
    responses((status = 200, body = [TermView])), security(("bearer" = [])))]
pub async fn terms(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<axum::Json<Vec<TermView>>, ApiError> {
    let terms = store::terms(&state.pool).await?;
    Ok(axum::Json(
        terms
            .into_iter()
            .map(|t| TermView {
                name: t.name,
                start: t.window.start(),
                end: t.window.end(),
            })
            .collect(),
    ))
}

#[utoipa::path(put, path = "/api/v1/quota-terms", tag = "groups", request_body = [TermView],
    description = "Replaces the admin's terms (for groups whose quota period is `term`); terms may not overlap.",
    responses((status = 200, body = [TermView]), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_terms(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<Vec<TermView>>,
) -> Result<axum::Json<Vec<TermView>>, ApiError> {
    caller.require_admin()?;
    if body.len() > 100 {
        return Err(ApiError::Invalid("at most 100 terms".into()));
    }
    let mut terms: Vec<Term> = Vec::with_capacity(body.len());
    for t in &body {
        if t.name.trim().is_empty() || t.name.len() > 128 {
            return Err(ApiError::Invalid("a term's name is 1 to 128 bytes".into()));
        }
        let window = Window::new(t.start, t.end).map_err(|_| {
            ApiError::Invalid(format!("term {:?} must end after it starts", t.name))
        })?;
        terms.push(Term {
            name: t.name.clone(),
            window,
        });
    }
    terms.sort_by_key(|t| t.window.start());
    if let Some(pair) = terms
        .windows(2)
        .find(|p| p[0].window.overlaps(&p[1].window))
    {
        return Err(ApiError::Invalid(format!(
            "terms {:?} and {:?} overlap",
            pair[0].name, pair[1].name
        )));
    }
    store::put_terms(&state.pool, &terms, state.clock.now(), caller.user.as_str())
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.constraint().is_some() => {
                ApiError::Invalid("terms: two share a name".into())
            }
            _ => e.into(),
        })?;
    Ok(axum::Json(body))
}
