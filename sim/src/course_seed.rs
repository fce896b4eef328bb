//! The demo's course: a group (`ml101`, with the demo's user as a member) and its
//! weekly lab session on an a100, in session when the demo starts, so that the
//! booking page's calendar, course schedule and "My groups" show one from the start.

use chrono::{DateTime, Datelike, TimeDelta, Timelike, Utc, Weekday};
use gpu_booking_api::store::groups::{self, GroupSpec};
use gpu_booking_api::store::holds::{self, Made, NewHold};
use gpu_booking_core::groups::{GroupPolicy, Role};
use gpu_booking_core::holds::HoldKind;
use gpu_booking_core::notice_text::Tz;
use gpu_booking_core::quota::Quota;
use gpu_booking_core::recurrence::{self, Schedule};
use sqlx::PgPool;

/// The course's group, as tokens and JupyterHub would name it.
pub const GROUP: &str = "ml101";
/// The course's title on the page and in calendar feeds.
pub const TITLE: &str = "ML101 lab session";
/// The model and units each session holds.
// The a6000s: the demo's two a100s are its booked and lent examples.
pub const MODEL: &str = "a6000";
pub const UNITS: u32 = 1;
/// Weekly sessions of two hours, this many weeks.
pub const WEEKS: u32 = 4;

/// Who made it, in the audit log.
const ACTOR: &str = "demo";

/// The first session's wall-clock start and end in `zone`: from the last full hour
/// before `now`, two hours long, so that it runs at `now` and for an hour at least
/// (the browser tests look for it minutes after the demo starts).
pub fn first_session(
    zone: Tz,
    now: DateTime<Utc>,
) -> (chrono::NaiveDateTime, chrono::NaiveDateTime) {
    let local = now.with_timezone(&zone).naive_local();
    let hour = local
        .with_minute(0)
        .and_then(|t| t.with_second(0))
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(local);
    (hour, hour + TimeDelta::hours(2))
}

/// The RFC 5545 rule of `WEEKS` weekly sessions on `start`'s weekday.
pub fn rule(start: chrono::NaiveDateTime) -> String {
    let day = match start.weekday() {
        Weekday::Mon => "MO",
        Weekday::Tue => "TU",
        Weekday::Wed => "WE",
        Weekday::Thu => "TH",
        Weekday::Fri => "FR",
        Weekday::Sat => "SA",
        Weekday::Sun => "SU",
    };
    format!("FREQ=WEEKLY;BYDAY={day};COUNT={WEEKS}")
}

/// Seeds the course once (nothing when its group exists): the group, `member` in it,
/// and the reservation in the lab's time zone `zone`. The models must be declared.
pub async fn seed(pool: &PgPool, zone: Tz, member: &str, now: DateTime<Utc>) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    let Some(group) = groups::write(
        &mut tx,
        &GroupSpec {
            name: GROUP,
            position: 0,
            description: "Machine learning 101 (the demo's course)",
            policy: &GroupPolicy::default(),
            quota: Quota::default(),
        },
        false,
        now,
        ACTOR,
    )
    .await?
    else {
        // Seeded by an earlier run.
        return Ok(());
    };
    tx.commit().await?;
    groups::put_member(pool, &group.row, member, Role::Member, now, ACTOR).await?;
    let (local_start, local_end) = first_session(zone, now);
    let schedule = Schedule {
        rule: rule(local_start),
        zone,
        local_start,
        local_end,
    };
    let windows = recurrence::occurrences(&schedule)?;
    let made = holds::create(
        pool,
        now,
        NewHold {
            kind: HoldKind::Course,
            model: MODEL,
            units: Some(UNITS),
            title: TITLE,
            group_id: Some(group.row.id),
            windows,
            schedule: Some(&schedule),
            skipped: Vec::new(),
            // A session that does not fit (the lab's a100s booked) is left out.
            skip_conflicts: true,
            actor: ACTOR,
        },
    )
    .await?;
    if let Made::InTheWay(_) = made {
        // Only maintenance windows list bookings in their way.
        tracing::warn!("the demo's course was not seeded");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_first_session_runs_now_on_its_rules_weekday() {
        // 00:59 in Berlin on a Monday: the session starts Monday 00:00 and runs for
        // an hour more at least.
        let now = Utc.with_ymd_and_hms(2027, 3, 7, 23, 59, 0).unwrap();
        let zone: Tz = "Europe/Berlin".parse().unwrap();
        let (start, end) = first_session(zone, now);
        assert_eq!(start.to_string(), "2027-03-08 00:00:00");
        assert_eq!(end - start, TimeDelta::hours(2));
        assert_eq!(rule(start), "FREQ=WEEKLY;BYDAY=MO;COUNT=4");
        let schedule = Schedule {
            rule: rule(start),
            zone,
            local_start: start,
            local_end: end,
        };
        let first = recurrence::occurrences(&schedule).unwrap()[0];
        assert!(
            first.start() <= now && now + TimeDelta::hours(1) <= first.end(),
            "{first:?} runs at {now} and an hour after"
        );
    }

    #[sqlx::test(migrations = "../migrations")]
    async fn seeds_a_course_in_session_once(pool: PgPool) {
        crate::models::declare(&pool, &crate::models::DEMO_MODELS, &crate::lab::demo_lab())
            .await
            .unwrap();
        let zone: Tz = "Europe/Berlin".parse().unwrap();
        let now = Utc::now();
        seed(&pool, zone, "alice@example.com", now).await.unwrap();
        // A second start of the demo on the same database adds nothing.
        seed(&pool, zone, "alice@example.com", now).await.unwrap();
        let held = holds::list(&pool, HoldKind::Course, now).await.unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].title, TITLE);
        let sessions = holds::occurrences(&pool, held[0].id).await.unwrap();
        assert_eq!(sessions.len(), WEEKS as usize);
        assert!(
            sessions[0].start_at <= now && now < sessions[0].end_at,
            "in session now"
        );
        let mut conn = pool.acquire().await.unwrap();
        let mine = groups::of_user(&mut conn, "alice@example.com")
            .await
            .unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].0.row.name, GROUP);
    }
}
