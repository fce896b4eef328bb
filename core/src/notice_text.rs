//! How notices put things into words: a time in the lab's zone, a number of GPUs of a
//! model, and the booking page's link. One format for every notice, so that a user
//! never reads the same moment two ways.

use chrono::{DateTime, Utc};

pub use chrono_tz::Tz;

/// What a notice's words depend on besides its event: the lab's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Style {
    /// The zone notices show times in (the service knows no user's own zone: the
    /// page shows times in the browser's, which the service never learns).
    pub zone: Tz,
    /// The booking page's address as users reach it; `None`: no link.
    pub page_url: Option<String>,
}

impl Default for Style {
    fn default() -> Self {
        Style {
            zone: Tz::UTC,
            page_url: None,
        }
    }
}

impl Style {
    /// A time as every notice shows it: weekday, day, month, year, 24-hour clock and
    /// the zone's abbreviation ("Sun 29 Nov 2026, 09:12 CET"). Both sides of the
    /// Atlantic read it the same way, unlike 11/29 or 29/11; the abbreviation says
    /// which zone, and summer time, it is in (a zone without one shows its offset,
    /// "-03").
    pub fn time(&self, t: DateTime<Utc>) -> String {
        t.with_timezone(&self.zone)
            .format("%a %-d %b %Y, %H:%M %Z")
            .to_string()
    }

    /// `text` ending with the page's link (My bookings) on a line of its own, for a
    /// notice about one of the user's bookings; `text` as it is when the page's
    /// address is not known.
    pub fn with_link(&self, text: String) -> String {
        match self.page_url.as_deref().and_then(bookings_link) {
            Some(link) => format!("{text}\n\nYour bookings: {link}"),
            None => text,
        }
    }
}

/// The page's view of the user's bookings (`#mine`: My bookings, which lists each
/// booking with its number and its controls); the page has no address for one
/// booking. `None` for an address that is blank. Any fragment the address had is
/// replaced.
pub fn bookings_link(page_url: &str) -> Option<String> {
    let base = page_url.trim().split('#').next().unwrap_or_default();
    (!base.is_empty()).then(|| format!("{base}#mine"))
}

/// "one a100 GPU", "2 a100 GPUs" ("one GPU" for no model). No article stands before
/// a model's name: how a name is spoken cannot be read from its letters ("an H100"
/// says "aitch", "a hopper" does not), so the count does the article's work.
pub fn gpus(units: u32, model: &str) -> String {
    let count = match units {
        1 => "one".to_owned(),
        n => n.to_string(),
    };
    match model {
        "" => format!("{count} {}", gpu_word(units)),
        model => format!("{count} {model} {}", gpu_word(units)),
    }
}

/// "GPU" or "GPUs", for `units` of them.
pub fn gpu_word(units: u32) -> &'static str {
    if units == 1 {
        "GPU"
    } else {
        "GPUs"
    }
}

/// `s` with its first letter in capitals, to start a sentence.
pub fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn style(zone: Tz) -> Style {
        Style {
            zone,
            page_url: None,
        }
    }

    #[test]
    fn times_in_the_labs_zone_with_its_abbreviation() {
        let t = Utc.with_ymd_and_hms(2026, 11, 29, 8, 12, 40).unwrap();
        assert_eq!(
            style(chrono_tz::Europe::Berlin).time(t),
            "Sun 29 Nov 2026, 09:12 CET"
        );
        assert_eq!(style(Tz::UTC).time(t), "Sun 29 Nov 2026, 08:12 UTC");
        assert_eq!(
            style(chrono_tz::America::New_York).time(t),
            "Sun 29 Nov 2026, 03:12 EST"
        );
        // Summer time has its own abbreviation; a single-digit day has no zero.
        let summer = Utc.with_ymd_and_hms(2026, 7, 3, 22, 5, 0).unwrap();
        assert_eq!(
            style(chrono_tz::Europe::Berlin).time(summer),
            "Sat 4 Jul 2026, 00:05 CEST"
        );
        // A zone with no abbreviation shows its offset.
        assert_eq!(
            style(chrono_tz::America::Sao_Paulo).time(t),
            "Sun 29 Nov 2026, 05:12 -03"
        );
        assert_eq!(Style::default().zone, Tz::UTC);
    }

    #[test]
    fn the_link_ends_the_text_only_when_the_page_is_known() {
        let none = Style::default();
        assert_eq!(none.with_link("Hello.".into()), "Hello.");
        let page = Style {
            page_url: Some("https://gpu.lab.example/".into()),
            ..Style::default()
        };
        assert_eq!(
            page.with_link("Hello.".into()),
            "Hello.\n\nYour bookings: https://gpu.lab.example/#mine"
        );
        assert_eq!(
            bookings_link(" https://gpu.lab.example/page#book "),
            Some("https://gpu.lab.example/page#mine".into())
        );
        assert_eq!(bookings_link("  "), None);
        assert_eq!(bookings_link("#x"), None);
    }

    #[test]
    fn counts_of_gpus_never_put_an_article_before_a_model() {
        assert_eq!(gpus(1, "a100"), "one a100 GPU");
        assert_eq!(gpus(1, "H100"), "one H100 GPU");
        assert_eq!(gpus(2, "a100"), "2 a100 GPUs");
        assert_eq!(gpus(0, "t4"), "0 t4 GPUs");
        assert_eq!(
            (gpus(1, ""), gpus(3, "")),
            ("one GPU".into(), "3 GPUs".into())
        );
        assert_eq!((gpu_word(1), gpu_word(3)), ("GPU", "GPUs"));
        assert_eq!(capitalised(&gpus(1, "a100")), "One a100 GPU");
        assert_eq!(capitalised("ébène"), "Ébène");
        assert_eq!(capitalised(""), "");
    }
}
