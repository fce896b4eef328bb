//! Notices to users: an outbox in Postgres, filled from the audit log (preemptions,
//! stripped spawns, idle reclaims), from the bookings (reminders before start and
//! end) and by [`enqueue`] (e.g. a waitlist promotion), and sent by e-mail and the
//! outgoing webhook.
//!
//! Once only: every notice has a unique key, so whoever inserts it twice (two
//! replicas, a restart, a re-read of the audit log) inserts it once. Deliveries are
//! claimed with `FOR UPDATE SKIP LOCKED` and a lease, so two replicas never send the
//! same one; a replica that dies after sending and before recording it leaves it to be
//! sent again when the lease runs out (at least once: no SMTP server or webhook can be
//! told "exactly once"), which is the only way a user gets one twice.
//! Each sent or given-up delivery leaves an audit row (`notice.sent`, `notice.failed`).

pub mod config;
pub mod send;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::notice::{self as rules, Channel, Message, Notice, NoticeKind, Prefs};
use gpu_booking_core::notice_text::Style;
use gpu_booking_core::usage;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};

use crate::clock::Clock;
use crate::store::audit;
use config::NoticeArgs;
use send::Senders;

/// Which channels this installation sends on (the notice preferences show them; a
/// notice gets deliveries only on these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Channels {
    pub email: bool,
    pub webhook: bool,
}

/// A notice to put in the outbox.
#[derive(Debug, Clone)]
pub struct NewNotice<'a> {
    /// Once-only key: a second notice with the same key is not added. E.g.
    /// `waitlist:<entry id>`; [`rules::reminder_key`] and [`rules::audit_key`] make the
    /// others.
    pub key: &'a str,
    pub user: &'a str,
    pub kind: NoticeKind,
    pub booking_id: Option<i64>,
    pub audit_id: Option<i64>,
    pub message: Message,
    pub details: Value,
}

/// Adds a notice and its deliveries (by the user's preferences and the configured
/// channels) to the outbox, in the caller's transaction: a waitlist promotion and its
/// notice commit together. Returns the notice's id, `None` when its key was there.
pub async fn enqueue(
    conn: &mut PgConnection,
    channels: Channels,
    notice: NewNotice<'_>,
    now: DateTime<Utc>,
) -> sqlx::Result<Option<i64>> {
    let id: Option<i64> = sqlx::query_scalar!(
        "INSERT INTO notice (key, user_name, kind, booking_id, audit_id, title, body, details, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (key) DO NOTHING RETURNING id",
        notice.key,
        notice.user,
        notice.kind.as_str(),
        notice.booking_id,
        notice.audit_id,
        &notice.message.title,
        &notice.message.text,
        &notice.details,
        now
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(id) = id else { return Ok(None) };
    let prefs = prefs(&mut *conn, notice.user).await?;
    for d in rules::deliveries(
        notice.user,
        &prefs,
        notice.kind,
        channels.email,
        channels.webhook,
    ) {
        sqlx::query!(
            "INSERT INTO notice_delivery (notice_id, channel, address, next_at) VALUES ($1, $2, $3, $4)",
            id,
            d.channel.as_str(),
            d.address,
            now
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(Some(id))
}

/// A user's preferences (the defaults when they never chose).
pub async fn prefs(conn: &mut PgConnection, user: &str) -> sqlx::Result<Prefs> {
    let row = sqlx::query!(
        "SELECT email, email_enabled, webhook_enabled, muted FROM notice_pref WHERE user_name = $1",
        user
    )
    .fetch_optional(conn)
    .await?;
    Ok(match row {
        None => Prefs::default(),
        Some(p) => Prefs {
            email: p.email,
            email_enabled: p.email_enabled,
            webhook_enabled: p.webhook_enabled,
            muted: p
                .muted
                .iter()
                .filter_map(|k| NoticeKind::parse(k))
                .collect(),
        },
    })
}

pub async fn set_prefs(
    conn: &mut PgConnection,
    user: &str,
    p: &Prefs,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let muted: Vec<&str> = p.muted.iter().map(|k| k.as_str()).collect();
    // `as _`: sqlx's macros take a text[] only as `String`s, so an array of `&str`
    // goes unchecked (here and in the two reads below).
    sqlx::query!(
        "INSERT INTO notice_pref (user_name, email, email_enabled, webhook_enabled, muted, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (user_name) DO UPDATE SET email = $2, email_enabled = $3,
             webhook_enabled = $4, muted = $5, updated_at = $6",
        user,
        p.email.as_deref(),
        p.email_enabled,
        p.webhook_enabled,
        &muted as _,
        now
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// One of a user's notices, as the page lists them.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct SentNotice {
    pub id: i64,
    pub kind: String,
    pub title: String,
    pub text: String,
    pub booking_id: Option<i64>,
    pub created_at: DateTime<Utc>,
    /// Each delivery as `channel:state` (`email:sent`, `webhook:pending`, ...).
    pub deliveries: Vec<String>,
}

/// The user's newest notices.
pub async fn recent(pool: &PgPool, user: &str, limit: i64) -> sqlx::Result<Vec<SentNotice>> {
    sqlx::query_as!(
        SentNotice,
        r#"SELECT n.id, n.kind, n.title, n.body AS text, n.booking_id, n.created_at,
                coalesce(array_agg(d.channel || ':' || d.state ORDER BY d.channel)
                         FILTER (WHERE d.channel IS NOT NULL), '{}') AS "deliveries!"
         FROM notice n LEFT JOIN notice_delivery d ON d.notice_id = n.id
         WHERE n.user_name = $1 GROUP BY n.id ORDER BY n.id DESC LIMIT $2"#,
        user,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The outbox's limits and timings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Reminder lead times.
    pub leads: Vec<TimeDelta>,
    pub interval: Duration,
    pub max_attempts: u32,
    /// Wait after the first failed try; it doubles up to `backoff_max`.
    pub backoff_base: TimeDelta,
    pub backoff_max: TimeDelta,
    /// How long a claimed delivery is another replica's; longer than a send can take.
    pub lease: TimeDelta,
    /// Deliveries sent per round.
    pub batch: i64,
    /// Notices older than this are deleted (their audit rows stay).
    pub retention: TimeDelta,
    /// The idle nudge's threshold (`None`: no nudges; the default here, for tests;
    /// `--idle-nudge-after` defaults to 8 h).
    pub idle_nudge_after: Option<TimeDelta>,
    /// The lab's time zone and the page's address: how notices show times and where
    /// they link.
    pub style: Style,
    /// Records of use older than this are deleted.
    pub usage_retention: TimeDelta,
}

impl Settings {
    pub fn from_args(args: &NoticeArgs) -> Settings {
        Settings {
            leads: args.notice_leads.0.clone(),
            interval: args.notice_interval,
            max_attempts: args.notice_max_attempts,
            idle_nudge_after: TimeDelta::from_std(args.idle_nudge_after)
                .ok()
                .filter(|d| *d > TimeDelta::zero()),
            style: Style {
                zone: args.time_zone,
                page_url: args
                    .page_url
                    .as_deref()
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(str::to_owned),
            },
            usage_retention: TimeDelta::from_std(args.usage_retention)
                .unwrap_or(TimeDelta::days(400)),
            ..Settings::default()
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            leads: vec![TimeDelta::hours(24), TimeDelta::hours(1)],
            interval: Duration::from_secs(30),
            max_attempts: 8,
            backoff_base: TimeDelta::seconds(30),
            backoff_max: TimeDelta::hours(1),
            lease: TimeDelta::seconds(120),
            batch: 256,
            retention: TimeDelta::days(90),
            idle_nudge_after: None,
            style: Style::default(),
            usage_retention: TimeDelta::days(400),
        }
    }
}

/// Audit rows before the cursor that are read again each round: rows whose ids were
/// taken before the cursor moved but that committed after (identity ids are handed
/// out in order, commits are not). Rows already turned into notices are skipped by
/// their key.
const AUDIT_LOOKBACK: i64 = 128;

/// Audit rows read per round: more than [`AUDIT_LOOKBACK`], so that the rows read
/// again never fill a round.
const AUDIT_BATCH: i64 = 512;

/// What one round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    pub queued: usize,
    pub sent: usize,
    pub retried: usize,
    pub failed: usize,
}

/// Fills the outbox and sends from it. Every replica runs one.
#[derive(Clone)]
pub struct Worker {
    pub pool: PgPool,
    pub clock: Arc<dyn Clock>,
    pub senders: Senders,
    pub settings: Settings,
    /// The actor of the audit rows it writes.
    pub actor: String,
}

impl Worker {
    pub fn new(
        pool: PgPool,
        clock: Arc<dyn Clock>,
        senders: Senders,
        settings: Settings,
    ) -> Worker {
        Worker {
            pool,
            clock,
            senders,
            settings,
            actor: "notices".into(),
        }
    }

    /// Rounds every `interval` until the task is dropped; a failed round is logged and
    /// the next one tries again.
    pub async fn run(self) {
        let mut ticker = tokio::time::interval(self.settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "notice round failed; trying again next round");
            }
        }
    }

    /// One round: new notices from the audit log and the bookings, then the due
    /// deliveries, then old notices pruned.
    pub async fn round(&self) -> sqlx::Result<Round> {
        let mut round = Round {
            queued: self.queue_audit_notices().await?
                + self.reminders().await?
                + self.idle_nudges().await?
                + self.offers().await?,
            ..Round::default()
        };
        self.dispatch(&mut round).await?;
        sqlx::query!(
            "DELETE FROM notice WHERE created_at < $1",
            self.clock.now() - self.settings.retention
        )
        .execute(&self.pool)
        .await?;
        crate::store::usage::prune(&self.pool, self.clock.now() - self.settings.usage_retention)
            .await?;
        Ok(round)
    }

    fn channels(&self) -> Channels {
        self.senders.channels()
    }

    /// Notices from new audit rows; the cursor row's lock makes replicas take turns.
    async fn queue_audit_notices(&self) -> sqlx::Result<usize> {
        let mut tx = self.pool.begin().await?;
        let cursor: i64 = sqlx::query_scalar!("SELECT audit_id FROM notice_cursor FOR UPDATE")
            .fetch_one(&mut *tx)
            .await?;
        // `user_name` and the details' text are not null here.
        let rows = sqlx::query!(
            r#"SELECT a.id, a.action, a.subject, a.user_name AS "user_name!", a.booking_id,
                      a.details::text AS "details!"
                 FROM audit_event a
                 WHERE a.id > $1 AND a.action = ANY($2) AND a.user_name IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM notice n WHERE n.key = 'audit:' || a.id)
                 ORDER BY a.id LIMIT $3"#,
            cursor - AUDIT_LOOKBACK,
            rules::SOURCE_ACTIONS.as_slice() as _,
            AUDIT_BATCH
        )
        .fetch_all(&mut *tx)
        .await?;
        let now = self.clock.now();
        let mut queued = 0;
        let mut last = cursor;
        let read = rows.len();
        for row in rows {
            let (id, action, subject, user, booking_id, details) = (
                row.id,
                row.action,
                row.subject,
                row.user_name,
                row.booking_id,
                row.details,
            );
            last = last.max(id);
            let details = audit::read_details(id, &details);
            let Some(kind) = rules::from_audit(&action, &details) else {
                continue;
            };
            let message = rules::audit_message(
                kind,
                subject.as_deref(),
                &details,
                booking_id,
                &self.settings.style,
            );
            let key = rules::audit_key(id);
            let notice = NewNotice {
                key: &key,
                user: &user,
                kind,
                booking_id,
                audit_id: Some(id),
                message,
                // Only plain text from the reporter's details: they may hold anything
                // (a number jsonb keeps but serde cannot read, deep nesting).
                details: json!({
                    "action": action,
                    "subject": subject,
                    "model": details["model"].as_str(),
                }),
            };
            if enqueue(&mut tx, self.channels(), notice, now)
                .await?
                .is_some()
            {
                queued += 1;
            }
        }
        // A full batch: the next round goes on from the last row read. Otherwise
        // every row up to the log's end was read: the cursor moves there (rows of
        // other actions are not read again), and rows still uncommitted below it are
        // within the lookback of the next round.
        let cursor_to = if read as i64 >= AUDIT_BATCH {
            last
        } else {
            sqlx::query_scalar!(r#"SELECT coalesce(max(id), 0) AS "newest!" FROM audit_event"#)
                .fetch_one(&mut *tx)
                .await?
                .max(cursor)
        };
        sqlx::query!("UPDATE notice_cursor SET audit_id = $1", cursor_to)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(queued)
    }

    /// Reminders before bookings start and end.
    async fn reminders(&self) -> sqlx::Result<usize> {
        let Some(longest) = self.settings.leads.iter().max().copied() else {
            return Ok(0);
        };
        let now = self.clock.now();
        let rows = sqlx::query!(
            "SELECT id, user_name, model, units, start_at, end_at FROM booking
             WHERE cancelled_at IS NULL AND hold_id IS NULL
               AND ((start_at > $1 AND start_at <= $2) OR (end_at > $1 AND end_at <= $2))",
            now,
            now + longest
        )
        .fetch_all(&self.pool)
        .await?;
        let mut queued = 0;
        let mut conn = self.pool.acquire().await?;
        for row in rows {
            let (id, user, model, start, end) =
                (row.id, row.user_name, row.model, row.start_at, row.end_at);
            let units = u32::try_from(row.units).unwrap_or(1);
            for (kind, at) in [
                (NoticeKind::BookingStarts, start),
                (NoticeKind::BookingEnds, end),
            ] {
                let Some(lead) = rules::due_reminder(&self.settings.leads, now, at) else {
                    continue;
                };
                let key = rules::reminder_key(kind, id, lead, at);
                let notice = NewNotice {
                    key: &key,
                    user: &user,
                    kind,
                    booking_id: Some(id),
                    audit_id: None,
                    message: rules::reminder_message(
                        kind,
                        id,
                        &model,
                        units,
                        at,
                        now,
                        &self.settings.style,
                    ),
                    details: json!({ "model": model, "at": at, "lead_seconds": lead.num_seconds() }),
                };
                // One transaction per notice: the notice and its deliveries together.
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                if enqueue(&mut tx, self.channels(), notice, now)
                    .await?
                    .is_some()
                {
                    queued += 1;
                }
                tx.commit().await?;
            }
        }
        Ok(queued)
    }

    /// A GPU offered back: each offer still held, once (the notice's key is the
    /// offer's, [`gpu_booking_core::offers::offer_key`]).
    async fn offers(&self) -> sqlx::Result<usize> {
        let now = self.clock.now();
        let mut conn = self.pool.acquire().await?;
        let mut queued = 0;
        for (user, offer) in crate::store::offers::with_users(&mut *conn, None, Some(now)).await? {
            let key = gpu_booking_core::offers::offer_key(&offer);
            let notice = NewNotice {
                key: &key,
                user: &user,
                kind: NoticeKind::GpuOffered,
                booking_id: None,
                audit_id: None,
                message: gpu_booking_core::offers::offer_message(&offer, &self.settings.style),
                details: json!({
                    "model": offer.model, "units": offer.units, "until": offer.until,
                    "namespace": offer.namespace, "pod": offer.pod,
                }),
            };
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            if enqueue(&mut tx, self.channels(), notice, now)
                .await?
                .is_some()
            {
                queued += 1;
            }
            tx.commit().await?;
        }
        Ok(queued)
    }

    /// The idle nudge: running bookings idle for `idle_nudge_after`, once each (the
    /// notice's key is the booking's).
    async fn idle_nudges(&self) -> sqlx::Result<usize> {
        let Some(after) = self.settings.idle_nudge_after else {
            return Ok(0);
        };
        let now = self.clock.now();
        let mut queued = 0;
        let mut conn = self.pool.acquire().await?;
        for b in crate::store::usage::idle(&mut *conn, now, after).await? {
            let u = usage::Use {
                start: b.start_at,
                end: b.end_at,
                ever_held: true,
                last_active: b.last_active,
            };
            if !usage::nudge_due(&u, now, after) {
                continue;
            }
            let idle_for = now - u.idle_since();
            let key = usage::nudge_key(b.id);
            let notice = NewNotice {
                key: &key,
                user: &b.user_name,
                kind: NoticeKind::BookingIdle,
                booking_id: Some(b.id),
                audit_id: None,
                message: usage::nudge_message(
                    b.id,
                    &b.model,
                    idle_for,
                    b.end_at,
                    now,
                    &self.settings.style,
                ),
                details: json!({
                    "model": b.model,
                    "idle_since": u.idle_since(),
                    "idle_seconds": idle_for.num_seconds(),
                    "end_at": b.end_at,
                }),
            };
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            if enqueue(&mut tx, self.channels(), notice, now)
                .await?
                .is_some()
            {
                queued += 1;
            }
            tx.commit().await?;
        }
        Ok(queued)
    }

    /// Claims due deliveries of the configured channels, sends them, records each.
    async fn dispatch(&self, round: &mut Round) -> sqlx::Result<()> {
        let channels: Vec<&str> = [
            (self.senders.email.is_some(), Channel::Email),
            (self.senders.webhook.is_some(), Channel::Webhook),
        ]
        .into_iter()
        .filter_map(|(on, c)| on.then_some(c.as_str()))
        .collect();
        if channels.is_empty() {
            return Ok(());
        }
        let now = self.clock.now();
        let lease_until = now + self.settings.lease;
        let claimed: Vec<Claimed> = sqlx::query_as!(
            Claimed,
            r#"UPDATE notice_delivery d SET claimed_until = $2, attempts = d.attempts + 1
             FROM (SELECT notice_id, channel FROM notice_delivery
                   WHERE state = 'pending' AND channel = ANY($3) AND next_at <= $1
                     AND (claimed_until IS NULL OR claimed_until <= $1)
                   ORDER BY next_at LIMIT $4 FOR UPDATE SKIP LOCKED) c,
                  notice n
             WHERE d.notice_id = c.notice_id AND d.channel = c.channel AND n.id = d.notice_id
             RETURNING d.notice_id, d.channel, d.address, d.attempts, n.user_name, n.kind,
                       n.booking_id, n.title, n.body, n.details::text AS "details!", n.created_at"#,
            now,
            lease_until,
            &channels as _,
            self.settings.batch
        )
        .fetch_all(&self.pool)
        .await?;
        // Sending stops while the claims are safely within their lease: the rest are
        // handed back untried, not sent late beside another replica that took them.
        let started = std::time::Instant::now();
        let budget = self
            .settings
            .lease
            .to_std()
            .unwrap_or_default()
            .saturating_sub(send::SEND_TIMEOUT * 2);
        let mut claimed = claimed.into_iter();
        for c in claimed.by_ref() {
            if started.elapsed() > budget {
                self.release(&c, lease_until).await?;
                break;
            }
            let (Some(channel), Some(kind)) =
                (Channel::parse(&c.channel), NoticeKind::parse(&c.kind))
            else {
                continue;
            };
            let details = audit::read_details(c.notice_id, &c.details);
            let notice = Notice {
                id: c.notice_id,
                kind,
                user: &c.user_name,
                title: &c.title,
                text: &c.body,
                booking_id: c.booking_id,
                created_at: c.created_at,
                details: &details,
            };
            let result = self
                .senders
                .send(channel, c.address.as_deref(), &notice)
                .await;
            self.record(&c, kind, lease_until, result, round).await?;
        }
        for c in claimed {
            self.release(&c, lease_until).await?;
        }
        Ok(())
    }

    /// Hands an untried claim back (its try is not counted).
    async fn release(&self, c: &Claimed, lease_until: DateTime<Utc>) -> sqlx::Result<()> {
        sqlx::query!(
            "UPDATE notice_delivery SET claimed_until = NULL, attempts = attempts - 1
             WHERE notice_id = $1 AND channel = $2 AND claimed_until = $3 AND state = 'pending'",
            c.notice_id,
            &c.channel,
            lease_until
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a try's outcome, if the claim is still ours (a lease that ran out may
    /// have been taken by another replica, whose outcome then counts).
    async fn record(
        &self,
        c: &Claimed,
        kind: NoticeKind,
        lease_until: DateTime<Utc>,
        result: Result<(), String>,
        round: &mut Round,
    ) -> sqlx::Result<()> {
        let now = self.clock.now();
        let mut tx = self.pool.begin().await?;
        let (state, action) = match &result {
            Ok(()) => ("sent", Some("notice.sent")),
            Err(_) if c.attempts >= self.settings.max_attempts as i32 => {
                ("failed", Some("notice.failed"))
            }
            Err(_) => ("pending", None),
        };
        let error = result
            .as_ref()
            .err()
            .map(|e| e.chars().take(500).collect::<String>());
        let next_at = now
            + rules::backoff(
                u32::try_from(c.attempts).unwrap_or(u32::MAX),
                self.settings.backoff_base,
                self.settings.backoff_max,
            );
        let updated = sqlx::query!(
            "UPDATE notice_delivery SET state = $3, claimed_until = NULL, last_error = $4,
                 sent_at = CASE WHEN $3 = 'sent' THEN $5::timestamptz END, next_at = $6
             WHERE notice_id = $1 AND channel = $2 AND claimed_until = $7 AND state = 'pending'",
            c.notice_id,
            &c.channel,
            state,
            error.as_deref(),
            now,
            next_at,
            lease_until
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated == 0 {
            tracing::warn!(notice = c.notice_id, channel = %c.channel, "a delivery's lease ran out before its outcome was recorded");
            return Ok(());
        }
        match &result {
            Ok(()) => round.sent += 1,
            Err(e) if action.is_some() => {
                round.failed += 1;
                tracing::warn!(notice = c.notice_id, channel = %c.channel, error = %e, "notice given up");
            }
            Err(e) => {
                round.retried += 1;
                tracing::info!(notice = c.notice_id, channel = %c.channel, attempt = c.attempts, error = %e, "notice not sent; will retry");
            }
        }
        if let Some(action) = action {
            let subject = format!("notice:{}", c.notice_id);
            audit::record(
                &mut *tx,
                audit::NewEvent {
                    at: now,
                    actor: &self.actor,
                    action,
                    subject: Some(&subject),
                    user: Some(&c.user_name),
                    booking_id: c.booking_id,
                    details: json!({
                        "kind": kind,
                        "channel": c.channel,
                        "attempts": c.attempts,
                        "error": error,
                    }),
                },
            )
            .await?;
        }
        tx.commit().await
    }
}

struct Claimed {
    notice_id: i64,
    channel: String,
    address: Option<String>,
    attempts: i32,
    user_name: String,
    kind: String,
    booking_id: Option<i64>,
    title: String,
    body: String,
    details: String,
    created_at: DateTime<Utc>,
}
