//! HTTP handlers, one module per resource.

pub mod admission;
pub mod audit;
pub mod availability;
pub mod bookings;
pub mod changes;
pub mod conditional;
pub mod feeds;
pub mod groups;
pub mod health;
pub mod maintenance;
pub mod me;
pub mod models;
pub mod notebooks;
pub mod notices;
pub mod offers;
pub mod reservations;
pub mod schedulability;
pub mod units;
pub mod usage;
pub mod waitlist;

/// A user name as the service accepts it ([`gpu_booking_core::username::Username`]),
/// as an ECMA-262 pattern: no control character (Unicode `Cc`) and no invisible
/// character ([`gpu_booking_core::username::is_invisible`]: `Cf`, `Zl`, `Zp`, `Co`;
/// those of the Basic Multilingual Plane, as a pattern without the `u` flag can
/// name no other) anywhere, and no white space (Unicode `White_Space`) at either
/// end. A test holds its classes to `Username`'s rules, character by character. Its length, 1 to
/// [`MAX_USERNAME_BYTES`](gpu_booking_core::username::MAX_USERNAME_BYTES) bytes of
/// UTF-8, is each field's `minLength` and `maxLength`. Every `user` input states
/// this as its `pattern` (utoipa takes only a literal there); a contract test holds
/// each to this constant.
pub const USER_NAME_PATTERN: &str = r"^[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000](?:[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb]*[^\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ue000-\uf8ff\ufeff\ufff9-\ufffb \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000])?$";

/// Text without a control character (Unicode `Cc`), as an ECMA-262 pattern: what
/// the audit report's strings and the schedulability `slug` must be. Stated, like
/// [`USER_NAME_PATTERN`], as a literal in each attribute and held to this constant
/// by a contract test.
pub const NO_CONTROL_PATTERN: &str = r"^[^\u0000-\u001f\u007f-\u009f]*$";

/// The years a day or time of a report may fall in (`from` and `to` of a model's
/// availability and of the usage report; each states them in its description).
pub const REPORT_YEARS: std::ops::RangeInclusive<i32> = 1970..=9998;

/// The most entries one listing answers (`limit` of the bookings, waitlist and
/// audit listings; each documents it as its `maximum`).
pub const MAX_PAGE_LIMIT: i64 = 1000;

#[cfg(test)]
mod tests {
    use super::USER_NAME_PATTERN;
    use gpu_booking_core::username::is_invisible;

    /// The ranges of a negated class `[^...]` written with `\uXXXX` escapes and
    /// plain characters.
    fn class(body: &str) -> Vec<(u32, u32)> {
        let mut points = Vec::new();
        let mut rest = body;
        while let Some(c) = rest.chars().next() {
            if let Some(hex) = rest.strip_prefix("\\u") {
                points.push(u32::from_str_radix(&hex[..4], 16).unwrap());
                rest = &hex[4..];
            } else if c == '-' {
                points.push(u32::MAX);
                rest = &rest[1..];
            } else {
                points.push(u32::from(c));
                rest = &rest[c.len_utf8()..];
            }
        }
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < points.len() {
            if points.get(i + 1) == Some(&u32::MAX) {
                ranges.push((points[i], points[i + 2]));
                i += 3;
            } else {
                ranges.push((points[i], points[i]));
                i += 1;
            }
        }
        ranges
    }

    #[test]
    fn the_user_name_pattern_refuses_what_username_refuses() {
        let classes: Vec<Vec<(u32, u32)>> = USER_NAME_PATTERN
            .split("[^")
            .skip(1)
            .map(|c| class(&c[..c.find(']').unwrap()]))
            .collect();
        let [edge, inner, last] = classes.as_slice() else {
            panic!("three classes in {USER_NAME_PATTERN}");
        };
        assert_eq!(edge, last);
        let holds =
            |ranges: &[(u32, u32)], c: u32| ranges.iter().any(|(a, b)| (*a..=*b).contains(&c));
        for c in (0..=0xffff_u32).filter_map(char::from_u32) {
            let refused = c.is_control() || is_invisible(c);
            let code = u32::from(c);
            assert_eq!(holds(inner, code), refused, "U+{code:04X} inside a name");
            assert_eq!(
                holds(edge, code),
                refused || c.is_whitespace(),
                "U+{code:04X} at an end"
            );
        }
    }
}
