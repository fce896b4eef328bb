//! The booking change stream: reads of `booking_change` (written by a trigger in the
//! transaction of each change, migration 20261124000010), retention, and the
//! process-wide watch that wakes long polls.
//!
//! Positions are transaction ids, not `seq`: see the migration for why a reader
//! serves only transactions below the oldest one still in flight.

use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use gpu_booking_core::booking_end::LISTED_AFTER_END;
use sqlx::PgPool;
use tokio::sync::{watch, Semaphore};

use super::bookings::BookingRow;

/// How often each process looks whether changes became servable, while anyone
/// waits. Polled rather than woken by `NOTIFY`: a notifying transaction takes a lock,
/// database-wide, that it holds until it commits and that every other notifying
/// transaction waits for, so every booking transaction would commit one at a time.
/// A look is one index probe at each end of `booking_change`, and a change reaches
/// a follower within this of becoming servable, across API replicas too.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);

/// What a look reads: the newest change, and the oldest transaction whose changes
/// are not servable yet. Changes become servable in transaction order (below the
/// horizon, [`elsewhere`]), so the ones not servable yet are those from that
/// transaction on: the pair changes exactly when a change is written or becomes
/// servable.
async fn look(pool: &PgPool) -> sqlx::Result<(Option<i64>, Option<i64>)> {
    let elsewhere = elsewhere(pool).await?;
    let found = sqlx::query!(
        "SELECT (SELECT max(seq) FROM booking_change) AS newest,
        (SELECT min(txid) FROM booking_change
          WHERE txid >= booking_change_settled_below($1)) AS oldest_pending",
        &elsewhere
    )
    .fetch_one(pool)
    .await?;
    Ok((found.newest, found.oldest_pending))
}

/// The transactions in flight in the Postgres server's other databases, which never
/// write a change: the horizon (`booking_change_settled_below`, migration
/// 20261203000100) passes them, so that a long transaction elsewhere on the server
/// does not hold back the stream. Read before the snapshot that the horizon is taken
/// from, in a statement of its own (the migration says why).
pub(crate) async fn elsewhere(pool: &PgPool) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(r#"SELECT booking_change_elsewhere() AS "xids!""#)
        .fetch_one(pool)
        .await
}

/// At most this many transactions' changes per answer (each transaction's changes
/// come whole, so an answer may hold more changes than this).
pub const MAX_TRANSACTIONS: i64 = 500;

/// One change with the booking's state at the time of the read.
#[derive(Debug, Clone)]
pub struct Change {
    pub seq: i64,
    pub kind: String,
    pub at: DateTime<Utc>,
    pub booking: BookingRow,
}

/// What a read found.
#[derive(Debug)]
pub enum Read {
    /// The changes after the position, in commit-safe order, and where to resume.
    Changes {
        changes: Vec<Change>,
        next: i64,
        /// How far the stream lags the database: every change committed more than
        /// this before the read is in this answer or an earlier one (unless `more`).
        /// Zero while every transaction finishes quickly; a transaction of this
        /// database that runs long holds back every change after it (the
        /// horizon), and this grows from the oldest change so held.
        behind: TimeDelta,
        /// The answer holds [`MAX_TRANSACTIONS`]: more changes wait beyond it (read
        /// again at once); `behind` speaks only of those past the horizon.
        more: bool,
    },
    /// The position is older than what retention kept (or not from this log): the
    /// follower must re-list.
    Gone { oldest: i64 },
}

struct ChangeMeta {
    c_seq: i64,
    c_txid: i64,
    c_kind: String,
    c_at: DateTime<Utc>,
}

/// The changes of the transactions after `after` (their ids above it) that have
/// all finished; `after = None` reads the current bookings (planned or running,
/// and those that ended within [`LISTED_AFTER_END`]) instead, as `kind =
/// "current"`, with the position from which the stream goes on: a follower lists
/// with it, then follows from `next` without a gap.
pub async fn read(pool: &PgPool, after: Option<i64>, now: DateTime<Utc>) -> sqlx::Result<Read> {
    let elsewhere = elsewhere(pool).await?;
    let mut tx = pool.begin().await?;
    // One snapshot for the position and the rows: every transaction of this
    // database below its horizon has finished, and those that committed are visible
    // in it.
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    // How long the changes committed in the snapshot but held back by the horizon
    // have waited, at most: from `at` (its transaction's start) of the held change
    // with the lowest transaction id. Every other held change's transaction took
    // its id later, hence began or committed later too, so none of them committed
    // before that (one index probe, however many are held). Measured from the
    // changes, not from the transaction that holds the horizon: one that runs long
    // while no booking changes holds nothing back (and its start is hidden from
    // roles without `pg_read_all_stats`).
    let position = sqlx::query!(
        r#"SELECT s.below AS "below!", h.txid AS horizon, statement_timestamp() AS "read_at!",
                  (SELECT c.at FROM booking_change c WHERE c.txid >= s.below
                    ORDER BY c.txid, c.seq LIMIT 1) AS held_since
           FROM booking_change_horizon h,
                LATERAL (SELECT booking_change_settled_below($1) AS below) s"#,
        &elsewhere
    )
    .fetch_one(&mut *tx)
    .await?;
    let (below, horizon) = (position.below, position.horizon);
    let behind = position
        .held_since
        .map_or(TimeDelta::zero(), |since| position.read_at - since)
        .max(TimeDelta::zero());
    // Everything below that is settled: the position to resume from when this
    // answer holds all that is settled.
    let settled = below - 1;
    let Some(after) = after else {
        let rows: Vec<BookingRow> = sqlx::query_as!(
            BookingRow,
            r#"SELECT id, user_name, model, slot AS "slot!", units, slots, start_at, end_at, booked_end_at,
                      cancelled_at, ended_early_at, override AS override_rules, created_at
             FROM booking WHERE cancelled_at IS NULL AND NOT archived AND end_at > $1 ORDER BY id"#,
            // Archived bookings ended at least `--archive-after` ago: the
            // condition lets the archive job's index (by end) serve the listing.
            now - LISTED_AFTER_END
        )
        .fetch_all(&mut *tx)
        .await?;
        let changes = rows
            .into_iter()
            .map(|booking| Change {
                seq: 0,
                kind: "current".into(),
                at: now,
                booking,
            })
            .collect();
        tx.commit().await?;
        // The listing reads the bookings themselves, not the changes: it is as
        // current as its snapshot, whatever holds the horizon.
        return Ok(Read::Changes {
            changes,
            next: settled,
            behind: TimeDelta::zero(),
            more: false,
        });
    };
    if after < horizon || after > settled {
        tx.commit().await?;
        return Ok(Read::Gone { oldest: horizon });
    }
    let rows: Vec<(ChangeMeta, BookingRow)> = sqlx::query!(
        r#"WITH t AS (
            SELECT DISTINCT txid FROM booking_change WHERE txid > $1 AND txid < $2 ORDER BY txid LIMIT $3
         )
         SELECT c.seq AS c_seq, c.txid AS c_txid, c.kind AS c_kind, c.at AS c_at,
                b.id, b.user_name, b.model, b.slot AS "slot!", b.units, b.slots, b.start_at, b.end_at,
                b.booked_end_at, b.cancelled_at, b.ended_early_at, b.override AS override_rules,
                b.created_at
         FROM booking_change c JOIN t USING (txid) JOIN booking b ON b.id = c.booking_id
         ORDER BY c.txid, c.seq"#,
        after,
        below,
        MAX_TRANSACTIONS
    )
    .map(|row| {
        let meta = ChangeMeta {
            c_seq: row.c_seq,
            c_txid: row.c_txid,
            c_kind: row.c_kind,
            c_at: row.c_at,
        };
        let booking = BookingRow {
            id: row.id,
            user_name: row.user_name,
            model: row.model,
            slot: row.slot,
            units: row.units,
            slots: row.slots,
            start_at: row.start_at,
            end_at: row.end_at,
            booked_end_at: row.booked_end_at,
            cancelled_at: row.cancelled_at,
            ended_early_at: row.ended_early_at,
            override_rules: row.override_rules,
            created_at: row.created_at,
        };
        (meta, booking)
    })
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut transactions = 0i64;
    let mut last = None;
    for (meta, _) in &rows {
        if last != Some(meta.c_txid) {
            transactions += 1;
            last = Some(meta.c_txid);
        }
    }
    // A full answer resumes after its last transaction; otherwise everything
    // settled has been served.
    let (next, more) = match last {
        Some(txid) if transactions >= MAX_TRANSACTIONS => (txid, true),
        _ => (settled, false),
    };
    let changes = rows
        .into_iter()
        .map(|(meta, booking)| Change {
            seq: meta.c_seq,
            kind: meta.c_kind,
            at: meta.c_at,
            booking,
        })
        .collect();
    Ok(Read::Changes {
        changes,
        next,
        behind,
        more,
    })
}

/// Deletes the changes recorded before `before` and moves the horizon past them;
/// the number deleted.
pub async fn prune(pool: &PgPool, before: DateTime<Utc>) -> sqlx::Result<u64> {
    let deleted = sqlx::query_scalar!(
        r#"WITH gone AS (DELETE FROM booking_change WHERE at < $1 RETURNING txid),
              moved AS (
                UPDATE booking_change_horizon SET txid = GREATEST(txid, (SELECT max(txid) FROM gone))
                WHERE EXISTS (SELECT 1 FROM gone)
              )
         SELECT count(*) AS "deleted!" FROM gone"#,
        before
    )
    .fetch_one(pool)
    .await?;
    Ok(u64::try_from(deleted).unwrap_or_default())
}

/// Prunes every `every` what is older than `retention`, until the pool closes.
pub fn spawn_pruner(pool: PgPool, retention: Duration, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if pool.is_closed() {
                return;
            }
            let Ok(retention) = chrono::TimeDelta::from_std(retention) else {
                return;
            };
            match prune(&pool, Utc::now() - retention).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "booking changes past retention pruned"),
                Err(e) => tracing::warn!(error = %e, "could not prune booking changes"),
            }
        }
    });
}

/// Wakes long polls: one watch per process ([`WATCH_EVERY`]), shared by every waiter,
/// started on the first wait and stopped when nobody has waited for a while; a
/// bounded number of waiters.
#[derive(Clone)]
pub struct ChangeFeed {
    inner: Arc<Inner>,
}

struct Inner {
    /// Bumped whenever a look finds something new (and when the watch starts).
    version: watch::Sender<u64>,
    /// Set when the server shuts down: every long poll answers at once, so that a
    /// graceful shutdown does not wait out the followers' waits (up to
    /// `MAX_WAIT_SECS`).
    closed: watch::Sender<bool>,
    watching: std::sync::Mutex<bool>,
    waiters: Arc<Semaphore>,
    /// The waiters' places in all (free when nobody waits).
    capacity: usize,
}

/// Long polls waiting at once per process; more answer at once (no wait).
pub const MAX_WAITERS: usize = 256;

/// The watch stops after this long without a waiter.
const IDLE_STOP: Duration = Duration::from_secs(30);

impl Default for ChangeFeed {
    fn default() -> Self {
        ChangeFeed::new(MAX_WAITERS)
    }
}

impl ChangeFeed {
    pub fn new(max_waiters: usize) -> Self {
        ChangeFeed {
            inner: Arc::new(Inner {
                version: watch::channel(0).0,
                closed: watch::channel(false).0,
                watching: std::sync::Mutex::new(false),
                waiters: Arc::new(Semaphore::new(max_waiters)),
                capacity: max_waiters,
            }),
        }
    }

    /// The server is shutting down: waiting long polls answer now, new ones at once.
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
    }

    /// Whether [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// A place among the waiters, if one is free and the server is not shutting
    /// down.
    pub fn waiter(&self, pool: &PgPool) -> Option<Waiter> {
        if self.is_closed() {
            return None;
        }
        let permit = self.inner.waiters.clone().try_acquire_owned().ok()?;
        self.watch(pool);
        Some(Waiter {
            _permit: permit,
            rx: self.inner.version.subscribe(),
            closed: self.inner.closed.subscribe(),
        })
    }

    fn watch(&self, pool: &PgPool) {
        let mut watching = self
            .inner
            .watching
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *watching {
            return;
        }
        *watching = true;
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(watch_loop(pool.clone(), weak));
    }
}

/// Looks every [`WATCH_EVERY`] until the pool closes, the feed is dropped, or no
/// waiter has been there for [`IDLE_STOP`] (the next waiter starts it again).
async fn watch_loop(pool: PgPool, feed: Weak<Inner>) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<(Option<i64>, Option<i64>)> = None;
    let mut failing = false;
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        tick.tick().await;
        let Some(inner) = feed.upgrade() else { return };
        if pool.is_closed() {
            break;
        }
        if inner.waiters.available_permits() == inner.capacity {
            let since = *idle_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= IDLE_STOP {
                // Decided under the lock a new waiter takes (after its place) to
                // start the watch: it either sees this one running or starts its own.
                let mut watching = inner.watching.lock().unwrap_or_else(|e| e.into_inner());
                if inner.waiters.available_permits() == inner.capacity {
                    *watching = false;
                    return;
                }
                idle_since = None;
            }
        } else {
            idle_since = None;
        }
        match look(&pool).await {
            Ok(now) => {
                failing = false;
                if seen != Some(now) {
                    seen = Some(now);
                    inner.version.send_modify(|v| *v = v.wrapping_add(1));
                }
            }
            Err(sqlx::Error::PoolClosed) => break,
            Err(e) => {
                // Once per outage; waiters look again on their own within a second.
                if !failing {
                    tracing::warn!(error = %e, "cannot look for booking changes; retrying");
                }
                failing = true;
                seen = None;
            }
        }
    }
    if let Some(inner) = feed.upgrade() {
        *inner.watching.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }
}

/// One long poll's place among the waiters.
pub struct Waiter {
    _permit: tokio::sync::OwnedSemaphorePermit,
    rx: watch::Receiver<u64>,
    closed: watch::Receiver<bool>,
}

impl Waiter {
    /// Returns on the next notification after this waiter last looked, or after
    /// `at_most`, whichever is first; false once the server is shutting down (the
    /// poll should answer now).
    pub async fn changed(&mut self, at_most: Duration) -> bool {
        if *self.closed.borrow() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::timeout(at_most, self.rx.changed()) => true,
            _ = self.closed.wait_for(|closed| *closed) => false,
        }
    }
}
