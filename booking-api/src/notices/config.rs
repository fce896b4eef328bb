//! Options of the notices: reminder lead times, the SMTP server, the outgoing
//! webhook, retries. Part of `gpu-booking api`'s flags.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chrono::TimeDelta;
use clap::{Args, ValueEnum};
use gpu_booking_core::notice::WebhookFormat;
use gpu_booking_core::notice_text::Tz;

#[derive(Debug, Clone, Args)]
pub struct NoticeArgs {
    /// How long before a booking starts and before it ends its user is told
    /// (comma-separated durations; empty: no reminders).
    #[arg(long, env = "GPU_BOOKING_NOTICE_LEADS", default_value = "24h,1h", value_parser = parse_leads)]
    pub notice_leads: Leads,

    /// How often the outbox is filled from the audit log and the bookings, and due
    /// notices are sent.
    #[arg(long, env = "GPU_BOOKING_NOTICE_INTERVAL", default_value = "30s", value_parser = gpu_booking_process::duration::parse_duration)]
    pub notice_interval: Duration,

    /// Tries of one delivery before it is given up (and audited as failed); waits
    /// between tries double from 30 s up to 1 h.
    #[arg(long, env = "GPU_BOOKING_NOTICE_MAX_ATTEMPTS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub notice_max_attempts: u32,

    /// SMTP server for e-mail notices (unset: no e-mail).
    #[arg(long, env = "GPU_BOOKING_SMTP_HOST")]
    pub smtp_host: Option<String>,

    /// SMTP port (default: 465 with `--smtp-tls tls`, 587 with `starttls`, 25 with `none`).
    #[arg(long, env = "GPU_BOOKING_SMTP_PORT")]
    pub smtp_port: Option<u16>,

    /// `starttls` (required, not opportunistic), `tls` (implicit TLS, "SMTPS") or
    /// `none` (plain text: only for a relay on localhost or the same pod).
    #[arg(long, env = "GPU_BOOKING_SMTP_TLS", value_enum, default_value_t = SmtpTls::Starttls)]
    pub smtp_tls: SmtpTls,

    /// PEM file of a CA to trust besides the public roots (a lab's own mail server).
    #[arg(long, env = "GPU_BOOKING_SMTP_CA_FILE")]
    pub smtp_ca_file: Option<PathBuf>,

    /// SMTP user name (with --smtp-password-file).
    #[arg(
        long,
        env = "GPU_BOOKING_SMTP_USERNAME",
        requires = "smtp_password_file"
    )]
    pub smtp_username: Option<String>,

    /// File holding the SMTP password (a mounted Secret); never logged.
    #[arg(
        long,
        env = "GPU_BOOKING_SMTP_PASSWORD_FILE",
        requires = "smtp_username"
    )]
    pub smtp_password_file: Option<PathBuf>,

    /// Sender of e-mail notices, e.g. `GPU booking <gpu-booking@lab.example>`.
    #[arg(
        long,
        env = "GPU_BOOKING_SMTP_FROM",
        default_value = "gpu-booking <gpu-booking@localhost>"
    )]
    pub smtp_from: String,

    /// File holding the outgoing webhook's URL (a Slack or Mattermost incoming
    /// webhook URL is a secret; unset: no webhook). Every notice is POSTed there.
    #[arg(long, env = "GPU_BOOKING_NOTICE_WEBHOOK_URL_FILE")]
    pub notice_webhook_url_file: Option<PathBuf>,

    /// Body of the outgoing webhook: `json` (kind, user, title, text, booking_id,
    /// created_at, details) or `slack` (`{"text": ...}`, also Mattermost's).
    #[arg(long, env = "GPU_BOOKING_NOTICE_WEBHOOK_FORMAT", value_enum, default_value_t = Format::Json)]
    pub notice_webhook_format: Format,

    /// A running booking whose GPUs have been idle this long (or that was never used
    /// this long after it started) asks its user, once, to release it early (the
    /// `booking_idle` notice); `0` turns the nudge off. Not sent for a booking that
    /// ends within this time anyway.
    #[arg(long, env = "GPU_BOOKING_IDLE_NUDGE_AFTER", default_value = "8h", value_parser = gpu_booking_process::duration::parse_duration)]
    pub idle_nudge_after: Duration,

    /// The booking page's address as users reach it (e.g. `https://gpu.lab.example/`):
    /// every notice about a booking ends with its link (My bookings); unset: no link.
    #[arg(long, env = "GPU_BOOKING_PAGE_URL")]
    pub page_url: Option<String>,

    /// The lab's time zone (IANA, e.g. `Europe/Berlin`): notices show times in it
    /// ("Sun 29 Nov 2026, 09:12 CET").
    #[arg(long, env = "GPU_BOOKING_TIME_ZONE", default_value = "UTC", value_parser = parse_time_zone)]
    pub time_zone: Tz,

    /// How long the records of use behind the usage report (`GET
    /// /api/v1/admin/usage`) are kept; older ones are deleted by the notice rounds.
    #[arg(long, env = "GPU_BOOKING_USAGE_RETENTION", default_value = "400days", value_parser = gpu_booking_process::duration::parse_duration)]
    pub usage_retention: Duration,
}

impl Default for NoticeArgs {
    fn default() -> Self {
        NoticeArgs {
            notice_leads: parse_leads("24h,1h").unwrap_or_default(),
            notice_interval: Duration::from_secs(30),
            notice_max_attempts: 8,
            smtp_host: None,
            smtp_port: None,
            smtp_tls: SmtpTls::Starttls,
            smtp_ca_file: None,
            smtp_username: None,
            smtp_password_file: None,
            smtp_from: "gpu-booking <gpu-booking@localhost>".into(),
            notice_webhook_url_file: None,
            notice_webhook_format: Format::Json,
            idle_nudge_after: Duration::from_secs(8 * 3600),
            page_url: None,
            time_zone: Tz::UTC,
            usage_retention: Duration::from_secs(400 * 86400),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SmtpTls {
    Starttls,
    Tls,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Slack,
}

impl From<Format> for WebhookFormat {
    fn from(f: Format) -> Self {
        match f {
            Format::Json => WebhookFormat::Json,
            Format::Slack => WebhookFormat::Slack,
        }
    }
}

/// Reminder lead times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leads(pub Vec<TimeDelta>);

/// At most this many lead times (each is a reminder per booking and event).
const MAX_LEADS: usize = 8;

/// `24h,1h`: comma-separated durations, each more than zero and at most 60 days.
pub fn parse_leads(s: &str) -> Result<Leads, String> {
    let mut leads = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let lead = gpu_booking_process::duration::parse_time_delta(part)?;
        if lead <= TimeDelta::zero() || lead > TimeDelta::days(60) {
            return Err(format!(
                "{part:?}: a lead time is more than 0 and at most 60 days"
            ));
        }
        leads.push(lead);
    }
    if leads.len() > MAX_LEADS {
        return Err(format!("at most {MAX_LEADS} lead times"));
    }
    leads.sort();
    leads.dedup();
    Ok(Leads(leads))
}

/// An IANA time zone name (`Europe/Berlin`, `UTC`).
pub fn parse_time_zone(s: &str) -> Result<Tz, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is no IANA time zone (e.g. Europe/Berlin, UTC)"))
}

/// Reads a secret file's first line (trailing newline and spaces dropped).
pub fn read_secret(path: &std::path::Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let secret = text.trim().to_owned();
    anyhow::ensure!(!secret.is_empty(), "{} is empty", path.display());
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leads() {
        assert_eq!(
            parse_leads("1h, 24h,1h").unwrap(),
            Leads(vec![TimeDelta::hours(1), TimeDelta::hours(24)])
        );
        assert_eq!(parse_leads("").unwrap(), Leads(vec![]));
        for bad in ["0s", "61days", "soon", "1h,x", "1s,2s,3s,4s,5s,6s,7s,8s,9s"] {
            assert!(parse_leads(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn time_zones() {
        assert_eq!(
            parse_time_zone("Europe/Berlin"),
            Ok(chrono_tz::Europe::Berlin)
        );
        assert_eq!(parse_time_zone(" UTC "), Ok(Tz::UTC));
        for bad in ["", "CET+1", "Mars/Olympus"] {
            assert!(parse_time_zone(bad).is_err(), "{bad}");
        }
    }
}
