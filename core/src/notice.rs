//! Notices to users: which events make one, when a reminder is due, what it says,
//! which channels carry it, and how often a failed delivery is tried again.
//!
//! The booking service keeps the outbox in Postgres and sends; every decision about
//! a notice is made here.

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::booking_policy::human_duration;
use crate::notice_text::{capitalised, gpu_word, gpus, Style};

/// What a notice is about. The names are the API's and the outbox's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// A planned booking starts soon.
    BookingStarts,
    /// A booking ends soon.
    BookingEnds,
    /// A lent GPU is to be taken back for a booked user at a deadline (the
    /// controller's warning before preemption).
    GpuTakenBackSoon,
    /// A lent GPU was taken back for a booked user (the controller's preemption).
    GpuTakenBack,
    /// A spawn asked for a GPU and got none (the webhook stripped it).
    SpawnStripped,
    /// The node agent ended idle GPU processes.
    ProcessesReclaimed,
    /// A waitlist entry became a booking.
    WaitlistPromoted,
    /// A running booking has been idle for a while: release it early?
    BookingIdle,
    /// An admin shortened or cancelled the booking to make room for a maintenance
    /// window or fewer units (`core::holds`).
    BookingChangedByAdmin,
    /// A GPU freed and is held for the user, whose notebook runs on CPU (stripped at
    /// spawn, or its lent GPU taken back): restart the server to get it
    /// (`core::offers`).
    GpuOffered,
}

impl NoticeKind {
    pub const ALL: [NoticeKind; 10] = [
        NoticeKind::BookingStarts,
        NoticeKind::BookingEnds,
        NoticeKind::GpuTakenBackSoon,
        NoticeKind::GpuTakenBack,
        NoticeKind::SpawnStripped,
        NoticeKind::ProcessesReclaimed,
        NoticeKind::WaitlistPromoted,
        NoticeKind::BookingIdle,
        NoticeKind::BookingChangedByAdmin,
        NoticeKind::GpuOffered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::BookingStarts => "booking_starts",
            NoticeKind::BookingEnds => "booking_ends",
            NoticeKind::GpuTakenBackSoon => "gpu_taken_back_soon",
            NoticeKind::GpuTakenBack => "gpu_taken_back",
            NoticeKind::SpawnStripped => "spawn_stripped",
            NoticeKind::ProcessesReclaimed => "processes_reclaimed",
            NoticeKind::WaitlistPromoted => "waitlist_promoted",
            NoticeKind::BookingIdle => "booking_idle",
            NoticeKind::BookingChangedByAdmin => "booking_changed_by_admin",
            NoticeKind::GpuOffered => "gpu_offered",
        }
    }

    pub fn parse(s: &str) -> Option<NoticeKind> {
        NoticeKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// Audit actions that can make a notice ([`from_audit`] decides each row).
pub const SOURCE_ACTIONS: [&str; 5] = [
    "controller.preempt_warned",
    "controller.preempt",
    "webhook.strip",
    "agent.reclaim",
    "waitlist.booked",
];

/// The notice an audit row makes, if any. Dry runs have their own actions and make
/// none; a preemption makes one only when the pod was really ended.
pub fn from_audit(action: &str, details: &Value) -> Option<NoticeKind> {
    match action {
        "controller.preempt_warned" => Some(NoticeKind::GpuTakenBackSoon),
        "controller.preempt" => match details["result"].as_str() {
            Some("recreated" | "deleted" | "demoted") => Some(NoticeKind::GpuTakenBack),
            _ => None,
        },
        "webhook.strip" => Some(NoticeKind::SpawnStripped),
        "agent.reclaim" => Some(NoticeKind::ProcessesReclaimed),
        // The waitlist's promotion (`store::waitlist::notify` writes the row in the
        // transaction that books the entry, so it is noticed once).
        "waitlist.booked" => Some(NoticeKind::WaitlistPromoted),
        _ => None,
    }
}

/// A notice's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub title: String,
    pub text: String,
}

/// The text of an audit row's notice. `subject` is the pod (`namespace/name`);
/// `booking_id` the row's booking (the waitlist's new booking).
pub fn audit_message(
    kind: NoticeKind,
    subject: Option<&str>,
    details: &Value,
    booking_id: Option<i64>,
    style: &Style,
) -> Message {
    let pod = subject.unwrap_or("your notebook");
    let text_of = |key: &str| details[key].as_str().map(str::to_owned);
    match kind {
        NoticeKind::GpuTakenBackSoon => {
            // The deadline is RFC 3339 text, kept only if it parses as such (details
            // are not trusted as words).
            let at = text_of("ends_at")
                .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .map(|t| style.time(t.with_timezone(&Utc)));
            Message {
                title: "Your lent GPU is about to be taken back".into(),
                text: format!(
                    "The GPU{} lent to {pod} is needed by a user who booked it. {} unless \
                     that user gets a GPU elsewhere first: save your work now. Book a GPU \
                     to keep one.",
                    text_of("model")
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default(),
                    match at {
                        Some(at) => format!("The notebook ends at {at}"),
                        None => "The notebook ends in a few minutes".to_owned(),
                    }
                ),
            }
        }
        NoticeKind::GpuTakenBack => Message {
            title: "Your lent GPU was taken back".into(),
            text: format!(
                "The GPU{} lent to {pod} was needed by a user who booked it, so the pod was \
                 ended{}. Book a GPU to keep one.",
                text_of("model")
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default(),
                match details["result"].as_str() {
                    Some("recreated") => " and started again without a GPU",
                    _ => "",
                }
            ),
        },
        NoticeKind::SpawnStripped => Message {
            title: "Your notebook started without a GPU".into(),
            text: format!(
                "{pod} asked for a GPU, but none was free for you, so it runs on CPU only.{}",
                text_of("warning")
                    .map(|w| format!(" {w}"))
                    .unwrap_or_default()
            ),
        },
        NoticeKind::ProcessesReclaimed => Message {
            title: "Idle GPU processes were ended".into(),
            text: format!(
                "The GPU processes of {pod} showed no activity{}, so they were ended to free \
                 the GPU. The pod keeps running; restart your kernel to use the GPU again.",
                details["idle_minutes"]
                    .as_f64()
                    .map(|m| format!(" for {m:.0} minutes"))
                    .unwrap_or_default()
            ),
        },
        NoticeKind::WaitlistPromoted => {
            // The row's subject is the model; its start and end are RFC 3339 text,
            // kept only if they parse as such (details are not trusted as words).
            let model = subject.unwrap_or_default();
            let time = |key: &str| {
                text_of(key)
                    .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                    .map(|t| style.time(t.with_timezone(&Utc)))
            };
            // A waitlist entry asks for one GPU; a row that says otherwise is believed.
            let units = details["units"]
                .as_u64()
                .and_then(|u| u32::try_from(u).ok())
                .unwrap_or(1);
            let came_free = capitalised(&gpus(units, model));
            let booking = booking_id
                .map(|id| format!(" (booking {id})"))
                .unwrap_or_default();
            Message {
                title: "Your waitlist entry was booked".into(),
                text: style.with_link(match (time("start"), time("end")) {
                    (Some(start), Some(end)) => format!(
                        "{came_free} came free: you are booked from {start} to {end}{booking}."
                    ),
                    _ => format!(
                        "{came_free} came free: your waitlist entry is now a booking{booking}."
                    ),
                }),
            }
        }
        _ => Message {
            title: "gpu-booking notice".into(),
            text: format!("Something happened to {pod}."),
        },
    }
}

/// The text of a reminder: `kind` is [`NoticeKind::BookingStarts`] or
/// [`NoticeKind::BookingEnds`], `at` the booking's start or end, `units` its GPUs.
pub fn reminder_message(
    kind: NoticeKind,
    booking_id: i64,
    model: &str,
    units: u32,
    at: DateTime<Utc>,
    now: DateTime<Utc>,
    style: &Style,
) -> Message {
    let what = gpus(units, model);
    let when = format!("{} (in {})", style.time(at), human_duration(at - now));
    let gpu = gpu_word(units);
    match kind {
        NoticeKind::BookingEnds => Message {
            title: format!("Your {model} booking ends in {}", human_duration(at - now)),
            text: style.with_link(format!(
                "Booking {booking_id} of {what} ends {when}. Save your work: the notebook \
                 loses its {gpu} then."
            )),
        },
        _ => Message {
            title: format!(
                "Your {model} booking starts in {}",
                human_duration(at - now)
            ),
            text: style.with_link(format!(
                "Booking {booking_id} of {what} starts {when}. Spawn your notebook from then \
                 on to get the {gpu}."
            )),
        },
    }
}

/// The reminder due at `now` for an event at `at`, given the lead times (e.g. 24 h
/// and 1 h): the smallest lead whose moment has come while the event has not. So a
/// booking made 30 minutes before it starts gets the 1 h reminder only, and one
/// whose reminders fell while the service was down gets the one still relevant.
pub fn due_reminder(
    leads: &[TimeDelta],
    now: DateTime<Utc>,
    at: DateTime<Utc>,
) -> Option<TimeDelta> {
    if now >= at {
        return None;
    }
    leads
        .iter()
        .copied()
        .filter(|lead| *lead > TimeDelta::zero() && at - *lead <= now)
        .min()
}

/// The once-only key of a reminder. The event's time is part of it: a booking whose
/// end moves gets its reminders again for the new end.
pub fn reminder_key(
    kind: NoticeKind,
    booking_id: i64,
    lead: TimeDelta,
    at: DateTime<Utc>,
) -> String {
    format!(
        "{}:{booking_id}:{}s:{}",
        kind.as_str(),
        lead.num_seconds(),
        at.timestamp_micros()
    )
}

/// The once-only key of an audit row's notice.
pub fn audit_key(audit_id: i64) -> String {
    format!("audit:{audit_id}")
}

/// A way a notice reaches its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    Email,
    Webhook,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Email => "email",
            Channel::Webhook => "webhook",
        }
    }

    pub fn parse(s: &str) -> Option<Channel> {
        match s {
            "email" => Some(Channel::Email),
            "webhook" => Some(Channel::Webhook),
            _ => None,
        }
    }
}

/// A user's choices. `Default` is what a user who never chose gets: both channels,
/// every kind, the e-mail address their name is if it is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prefs {
    /// Where e-mail goes; `None`: the user name, when it is an address.
    pub email: Option<String>,
    pub email_enabled: bool,
    pub webhook_enabled: bool,
    /// Kinds the user does not want.
    pub muted: Vec<NoticeKind>,
}

impl Default for Prefs {
    fn default() -> Self {
        Prefs {
            email: None,
            email_enabled: true,
            webhook_enabled: true,
            muted: Vec::new(),
        }
    }
}

/// Longest e-mail address accepted (RFC 5321's path limit).
pub const MAX_ADDRESS_LEN: usize = 254;

/// Whether `s` is a plausible mailbox (`local@domain`): one `@`, both sides
/// non-empty, no spaces, control characters or angle brackets. The mailer checks
/// the full syntax when it sends.
pub fn is_address(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    s.len() <= MAX_ADDRESS_LEN
        && !local.is_empty()
        && !domain.is_empty()
        && !domain.contains('@')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | ',' | ';'))
}

/// A delivery to make: the channel and, for e-mail, the address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub channel: Channel,
    pub address: Option<String>,
}

/// The deliveries of a notice of `kind` to `user`: each channel that is configured,
/// that the user keeps on, for a kind they did not mute; e-mail only to an address.
pub fn deliveries(
    user: &str,
    prefs: &Prefs,
    kind: NoticeKind,
    email_configured: bool,
    webhook_configured: bool,
) -> Vec<Delivery> {
    if prefs.muted.contains(&kind) {
        return Vec::new();
    }
    let mut out = Vec::new();
    if email_configured && prefs.email_enabled {
        let address = prefs.email.as_deref().unwrap_or(user);
        if is_address(address) {
            out.push(Delivery {
                channel: Channel::Email,
                address: Some(address.to_owned()),
            });
        }
    }
    if webhook_configured && prefs.webhook_enabled {
        out.push(Delivery {
            channel: Channel::Webhook,
            address: None,
        });
    }
    out
}

/// How long to wait before try `attempt + 1` after `attempt` failed tries (1-based):
/// `base`, doubling, at most `max`.
pub fn backoff(attempt: u32, base: TimeDelta, max: TimeDelta) -> TimeDelta {
    let factor = 1i32 << attempt.saturating_sub(1).min(20);
    base.checked_mul(factor).map_or(max, |d| d.min(max))
}

/// The body of the outgoing webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    /// `{kind, user, title, text, booking_id, created_at, details}`.
    #[default]
    Json,
    /// `{"text": ...}`: what Slack and Mattermost incoming webhooks take.
    Slack,
}

/// What a notice holds when it is sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice<'a> {
    /// The outbox's id of the notice.
    pub id: i64,
    pub kind: NoticeKind,
    pub user: &'a str,
    pub title: &'a str,
    pub text: &'a str,
    pub booking_id: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub details: &'a Value,
}

/// The `Message-ID` of a notice's e-mail (RFC 5322, 3.6.4): the same for every try
/// of it, so that a mail sent twice (a replica that died between the server's
/// "accepted" and recording it) is one message to the reader's mail program; the
/// notice's creation time beside its id keeps two installations that send from one
/// domain (a lab's test and production) from sharing ids. `domain` is the sender's
/// (`localhost` if it is none that an id may hold).
pub fn message_id(notice: &Notice<'_>, domain: &str) -> String {
    let fits = !domain.is_empty()
        && domain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'));
    format!(
        "<gpu-booking.notice-{}.{}@{}>",
        notice.id,
        notice.created_at.timestamp_micros(),
        if fits { domain } else { "localhost" }
    )
}

/// The outgoing webhook's body for `notice`.
pub fn webhook_body(format: WebhookFormat, notice: &Notice<'_>) -> Value {
    match format {
        WebhookFormat::Json => json!({
            "kind": notice.kind,
            "user": notice.user,
            "title": notice.title,
            "text": notice.text,
            "booking_id": notice.booking_id,
            "created_at": notice.created_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            "details": notice.details,
        }),
        WebhookFormat::Slack => json!({
            "text": format!("*{}* ({})\n{}", notice.title, notice.user, notice.text),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(h: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 10, 0, 0, 0).unwrap() + TimeDelta::hours(h)
    }

    #[test]
    fn the_smallest_lead_that_has_come_is_due() {
        let leads = [TimeDelta::hours(24), TimeDelta::hours(1)];
        let at = t(48);
        assert_eq!(due_reminder(&leads, t(0), at), None);
        assert_eq!(
            due_reminder(&leads, t(24) - TimeDelta::seconds(1), at),
            None
        );
        assert_eq!(due_reminder(&leads, t(24), at), Some(TimeDelta::hours(24)));
        assert_eq!(due_reminder(&leads, t(46), at), Some(TimeDelta::hours(24)));
        assert_eq!(due_reminder(&leads, t(47), at), Some(TimeDelta::hours(1)));
        assert_eq!(
            due_reminder(&leads, at - TimeDelta::seconds(1), at),
            Some(TimeDelta::hours(1))
        );
        assert_eq!(due_reminder(&leads, at, at), None);
        assert_eq!(due_reminder(&[], t(47), at), None);
        assert_eq!(due_reminder(&[TimeDelta::zero()], t(47), at), None);
    }

    #[test]
    fn keys_change_with_the_event_time() {
        let a = reminder_key(NoticeKind::BookingEnds, 7, TimeDelta::hours(1), t(5));
        let b = reminder_key(NoticeKind::BookingEnds, 7, TimeDelta::hours(1), t(6));
        assert_ne!(a, b);
        assert_eq!(
            a,
            reminder_key(NoticeKind::BookingEnds, 7, TimeDelta::hours(1), t(5))
        );
    }

    #[test]
    fn audit_rows_that_make_notices() {
        let ended = json!({"result": "recreated", "model": "a100"});
        assert_eq!(
            from_audit("controller.preempt", &ended),
            Some(NoticeKind::GpuTakenBack)
        );
        assert_eq!(
            from_audit("controller.preempt", &json!({"result": "dry_run"})),
            None
        );
        assert_eq!(
            from_audit("controller.preempt", &json!({"result": "error"})),
            None
        );
        assert_eq!(
            from_audit("webhook.strip", &json!({})),
            Some(NoticeKind::SpawnStripped)
        );
        assert_eq!(
            from_audit("agent.reclaim", &json!({})),
            Some(NoticeKind::ProcessesReclaimed)
        );
        assert_eq!(from_audit("agent.reclaim_dry_run", &json!({})), None);
        assert_eq!(
            from_audit("waitlist.booked", &json!({})),
            Some(NoticeKind::WaitlistPromoted)
        );
        let berlin = Style {
            zone: chrono_tz::Europe::Berlin,
            page_url: Some("https://gpu.lab.example/".into()),
        };
        let m = audit_message(
            NoticeKind::WaitlistPromoted,
            Some("a100"),
            &json!({"start": "2026-12-01T09:00:00Z", "end": "2026-12-02T09:00:00Z"}),
            Some(12),
            &berlin,
        );
        assert_eq!(
            m.text,
            "One a100 GPU came free: you are booked from Tue 1 Dec 2026, 10:00 CET to \
             Wed 2 Dec 2026, 10:00 CET (booking 12).\n\n\
             Your bookings: https://gpu.lab.example/#mine"
        );
        // Times that are not RFC 3339 are left out, not shown as they came.
        let m = audit_message(
            NoticeKind::WaitlistPromoted,
            Some("a100"),
            &json!({"start": "soon", "end": "2026-12-02T09:00:00Z"}),
            None,
            &Style::default(),
        );
        assert_eq!(
            m.text,
            "One a100 GPU came free: your waitlist entry is now a booking."
        );
        let m = audit_message(
            NoticeKind::WaitlistPromoted,
            None,
            &json!({}),
            None,
            &Style::default(),
        );
        assert_eq!(
            m.text,
            "One GPU came free: your waitlist entry is now a booking."
        );
        assert_eq!(from_audit("controller.expire", &ended), None);
        for action in SOURCE_ACTIONS {
            assert!(from_audit(action, &ended).is_some() || action == "controller.preempt");
        }
        let m = audit_message(
            NoticeKind::GpuTakenBack,
            Some("jhub/jupyter-bob"),
            &ended,
            None,
            &berlin,
        );
        assert!(
            m.text.contains("jhub/jupyter-bob") && m.text.contains("a100"),
            "{m:?}"
        );
        // The warning before: its deadline in the lab's zone; a deadline that is not
        // RFC 3339 is not shown as it came.
        let warned = json!({"model": "a100", "ends_at": "2026-12-01T09:02:00Z"});
        assert_eq!(
            from_audit("controller.preempt_warned", &warned),
            Some(NoticeKind::GpuTakenBackSoon)
        );
        let m = audit_message(
            NoticeKind::GpuTakenBackSoon,
            Some("jhub/jupyter-bob"),
            &warned,
            None,
            &berlin,
        );
        assert_eq!(
            m.text,
            "The GPU (a100) lent to jhub/jupyter-bob is needed by a user who booked it. The \
             notebook ends at Tue 1 Dec 2026, 10:02 CET unless that user gets a GPU elsewhere \
             first: save your work now. Book a GPU to keep one."
        );
        let m = audit_message(
            NoticeKind::GpuTakenBackSoon,
            None,
            &json!({"ends_at": "<script>"}),
            None,
            &berlin,
        );
        assert!(m.text.contains("ends in a few minutes") && !m.text.contains("<script>"));
    }

    #[test]
    fn reminders_name_the_gpus_the_zones_time_and_the_link() {
        let at = Utc.with_ymd_and_hms(2026, 11, 29, 8, 12, 0).unwrap();
        let berlin = Style {
            zone: chrono_tz::Europe::Berlin,
            page_url: Some("https://gpu.lab.example".into()),
        };
        let m = reminder_message(
            NoticeKind::BookingEnds,
            7,
            "a100",
            1,
            at,
            at - TimeDelta::hours(1),
            &berlin,
        );
        assert_eq!(m.title, "Your a100 booking ends in 1 h");
        assert_eq!(
            m.text,
            "Booking 7 of one a100 GPU ends Sun 29 Nov 2026, 09:12 CET (in 1 h). Save your \
             work: the notebook loses its GPU then.\n\n\
             Your bookings: https://gpu.lab.example#mine"
        );
        let m = reminder_message(
            NoticeKind::BookingStarts,
            8,
            "a100",
            2,
            at,
            at - TimeDelta::days(1),
            &Style::default(),
        );
        assert_eq!(m.title, "Your a100 booking starts in 1 day");
        assert_eq!(
            m.text,
            "Booking 8 of 2 a100 GPUs starts Sun 29 Nov 2026, 08:12 UTC (in 1 day). Spawn \
             your notebook from then on to get the GPUs."
        );
    }

    #[test]
    fn message_ids_are_the_notices_whatever_the_try() {
        let details = json!({});
        let n = Notice {
            id: 42,
            kind: NoticeKind::BookingEnds,
            user: "a@b",
            title: "T",
            text: "X",
            booking_id: Some(3),
            created_at: t(0),
            details: &details,
        };
        let id = message_id(&n, "lab.example");
        assert_eq!(id, message_id(&n, "lab.example"));
        assert!(
            id.starts_with("<gpu-booking.notice-42.") && id.ends_with("@lab.example>"),
            "{id}"
        );
        let later = Notice {
            created_at: t(1),
            ..n.clone()
        };
        assert_ne!(message_id(&later, "lab.example"), id);
        assert!(message_id(&n, "bad domain>").ends_with("@localhost>"));
        assert!(message_id(&n, "").ends_with("@localhost>"));
    }

    #[test]
    fn deliveries_follow_prefs_and_configuration() {
        let d = |user: &str, p: &Prefs, e, w| deliveries(user, p, NoticeKind::BookingStarts, e, w);
        let all = Prefs::default();
        assert_eq!(d("a@x.org", &all, true, true).len(), 2);
        // A user name that is no address gets no e-mail unless they give one.
        assert_eq!(d("alice", &all, true, false), vec![]);
        let with = Prefs {
            email: Some("al@x.org".into()),
            ..Prefs::default()
        };
        assert_eq!(
            d("alice", &with, true, false)[0].address.as_deref(),
            Some("al@x.org")
        );
        assert_eq!(d("a@x.org", &all, false, false), vec![]);
        let muted = Prefs {
            muted: vec![NoticeKind::BookingStarts],
            ..Prefs::default()
        };
        assert_eq!(d("a@x.org", &muted, true, true), vec![]);
        let no_mail = Prefs {
            email_enabled: false,
            ..Prefs::default()
        };
        assert_eq!(
            d("a@x.org", &no_mail, true, true)[0].channel,
            Channel::Webhook
        );
    }

    #[test]
    fn addresses() {
        for ok in ["a@b", "zoë@uni.example", "first.last+tag@lab.example.org"] {
            assert!(is_address(ok), "{ok}");
        }
        for bad in [
            "", "a", "@b", "a@", "a@@b", "a b@c", "a@b.", "<a@b>", "a@b,c@d", "a\n@b",
        ] {
            assert!(!is_address(bad), "{bad:?}");
        }
        assert!(!is_address(&format!("{}@b", "a".repeat(300))));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let (base, max) = (TimeDelta::seconds(30), TimeDelta::hours(1));
        assert_eq!(backoff(1, base, max), TimeDelta::seconds(30));
        assert_eq!(backoff(2, base, max), TimeDelta::seconds(60));
        assert_eq!(backoff(4, base, max), TimeDelta::seconds(240));
        assert_eq!(backoff(30, base, max), max);
        assert_eq!(backoff(u32::MAX, base, max), max);
    }

    #[test]
    fn webhook_bodies() {
        let details = json!({"model": "a100"});
        let n = Notice {
            id: 1,
            kind: NoticeKind::BookingEnds,
            user: "a@b",
            title: "T",
            text: "X",
            booking_id: Some(3),
            created_at: t(0),
            details: &details,
        };
        let j = webhook_body(WebhookFormat::Json, &n);
        assert_eq!(j["kind"], "booking_ends");
        assert_eq!(j["booking_id"], 3);
        let s = webhook_body(WebhookFormat::Slack, &n);
        assert_eq!(s.as_object().unwrap().len(), 1);
        assert!(s["text"].as_str().unwrap().contains("*T*"));
        for k in NoticeKind::ALL {
            assert_eq!(NoticeKind::parse(k.as_str()), Some(k));
        }
    }
}
