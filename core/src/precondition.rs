//! Conditional writes of a booking (RFC 9110, 8.8.3 and 13.1.1): `GET` names the
//! booking's state with an entity tag, and a `PATCH` or `DELETE` that sends it back in
//! `If-Match` is applied only while the booking still has that state, so that two
//! people editing one booking cannot overwrite each other's change unseen.
//!
//! The tag names what is stored, not the answer's bytes: `status` (which moves from
//! planned to active as time passes) and `waiting` (the cluster's report) are left
//! out, so a tag stays valid until the booking itself is written.

use sha2::{Digest, Sha256};

use crate::wire::Booking;

/// The strong entity tag of `booking`, quoted as the `ETag` header carries it: a
/// digest of every stored field (its window, units and slots, and when it was
/// cancelled or ended).
pub fn booking_etag(booking: &Booking) -> String {
    let stored = (
        booking.id,
        &booking.user,
        &booking.model,
        booking.units,
        &booking.slots,
        booking.start,
        booking.end,
        booking.booked_end,
        booking.created_at,
        booking.cancelled_at,
        booking.ended_early_at,
        booking.override_rules,
    );
    // A tuple of plain values always serialises.
    let bytes = serde_json::to_vec(&stored).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    format!("\"{}\"", hex::encode(&digest[..16]))
}

/// An `If-Match` header's condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: any current state.
    Any,
    /// One of these entity tags, each with its quotes; a weak one (`W/"..."`) is
    /// kept and never matches (If-Match compares strongly).
    Tags(Vec<String>),
}

/// An `If-Match` value that is neither `*` nor a list of entity tags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("If-Match must be * or a comma-separated list of quoted entity tags, as the ETag header gives them")]
pub struct MalformedIfMatch;

impl IfMatch {
    /// Parses `*` or `#entity-tag` (RFC 9110, 13.1.1): `"tag"` or `W/"tag"`, separated
    /// by commas and optional white space.
    pub fn parse(value: &str) -> Result<Self, MalformedIfMatch> {
        let value = value.trim();
        if value == "*" {
            return Ok(Self::Any);
        }
        let mut tags = Vec::new();
        for part in value.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let opaque = part.strip_prefix("W/").unwrap_or(part);
            let inner = opaque
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .ok_or(MalformedIfMatch)?;
            // etagc: %x21 / %x23-7E / obs-text (no quote, no space, no control).
            if inner.bytes().any(|b| b == b'"' || b <= 0x20 || b == 0x7f) {
                return Err(MalformedIfMatch);
            }
            tags.push(part.to_owned());
        }
        if tags.is_empty() {
            return Err(MalformedIfMatch);
        }
        Ok(Self::Tags(tags))
    }

    /// Whether a resource whose current tag is `current` (strong, quoted) meets the
    /// condition: strong comparison, so a weak tag never matches.
    pub fn matches(&self, current: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Tags(tags) => tags.iter().any(|t| t == current),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::BookingStatus;
    use chrono::{DateTime, Utc};

    fn booking() -> Booking {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        Booking {
            id: 7,
            user: "alice".into(),
            model: "a100".into(),
            slot: 0,
            units: 1,
            slots: vec![0],
            start: t("2026-03-01T00:00:00Z"),
            end: t("2026-03-03T00:00:00Z"),
            booked_end: t("2026-03-03T00:00:00Z"),
            status: BookingStatus::Planned,
            created_at: t("2026-02-01T00:00:00Z"),
            cancelled_at: None,
            ended_early_at: None,
            override_rules: false,
            waiting: None,
        }
    }

    #[test]
    fn the_tag_follows_what_is_stored_and_nothing_else() {
        let b = booking();
        let tag = booking_etag(&b);
        assert!(tag.starts_with('"') && tag.ends_with('"') && tag.len() == 34);
        // What time and the cluster change leaves the tag as it is.
        let mut later = b.clone();
        later.status = BookingStatus::Active;
        later.waiting = Some("no card free".into());
        assert_eq!(booking_etag(&later), tag);
        // Every write changes it.
        let mut moved = b.clone();
        moved.end += chrono::TimeDelta::hours(1);
        let mut cancelled = b.clone();
        cancelled.cancelled_at = Some(b.created_at);
        let mut reslotted = b.clone();
        reslotted.slots = vec![1];
        for other in [moved, cancelled, reslotted] {
            assert_ne!(booking_etag(&other), tag);
        }
    }

    #[test]
    fn if_match_compares_strongly() {
        let tag = booking_etag(&booking());
        assert!(IfMatch::parse("*").unwrap().matches(&tag));
        assert!(IfMatch::parse(&tag).unwrap().matches(&tag));
        assert!(IfMatch::parse(&format!("\"old\", {tag}"))
            .unwrap()
            .matches(&tag));
        assert!(!IfMatch::parse("\"old\"").unwrap().matches(&tag));
        // A weak tag never matches under If-Match.
        assert!(!IfMatch::parse(&format!("W/{tag}")).unwrap().matches(&tag));
        for bad in ["", "abc", "\"a", "\"a b\"", "\"a\"\"b\"", ","] {
            assert_eq!(IfMatch::parse(bad), Err(MalformedIfMatch), "{bad:?}");
        }
    }
}
