//! Input that no field of the service accepts, found before it reaches the database.
//!
//! Postgres stores no NUL character (U+0000) in `text` or `jsonb` and answers one
//! with an error of its own; a request holding one is refused up front, in our words
//! (the database's text names its encoding and internals, and is not the caller's to
//! read).

/// Whether a request target (its path and query, as sent) holds a NUL character: a
/// percent-encoded `%00` (a raw NUL cannot be part of an HTTP request line).
pub fn target_holds_nul(target: &str) -> bool {
    target.contains("%00")
}

/// Whether a JSON text holds a NUL character: a raw 0x00 byte, or the escape
/// `\u0000` where its backslash starts an escape, that is
/// where it follows an even number of backslashes (`\\u0000` is a backslash and the
/// text `u0000`).
pub fn json_holds_nul(body: &[u8]) -> bool {
    if body.contains(&0) {
        return true;
    }
    let mut backslashes = 0usize;
    for (i, &byte) in body.iter().enumerate() {
        if byte == b'\\' {
            backslashes += 1;
            continue;
        }
        if byte == b'u'
            && backslashes % 2 == 1
            && body.get(i + 1..i + 5).is_some_and(|hex| hex == b"0000")
        {
            return true;
        }
        backslashes = 0;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percent_encoded_nul_is_found_in_a_target() {
        assert!(target_holds_nul("/api/v1/bookings?model=a%00b"));
        assert!(target_holds_nul("/api/v1/models/a%00/availability"));
        assert!(!target_holds_nul("/api/v1/bookings?model=a%2500b"));
        assert!(!target_holds_nul("/api/v1/bookings?limit=100"));
    }

    #[test]
    fn only_a_real_nul_escape_is_found_in_json() {
        assert!(json_holds_nul(br#"{"model": "a\u0000"}"#));
        assert!(json_holds_nul(br#"{"a\u0000": 1}"#));
        assert!(json_holds_nul(br#"{"model": "\\\u0000"}"#));
        assert!(json_holds_nul(b"{\"model\": \"a\0\"}"));
        // An escaped backslash followed by the text u0000 is no NUL.
        assert!(!json_holds_nul(br#"{"model": "\\u0000"}"#));
        assert!(json_holds_nul(br#"{"model": "\u0001\u00000"}"#));
        assert!(!json_holds_nul(br#"{"model": "\u00a0", "n": 10000}"#));
        assert!(!json_holds_nul(br#"{"model": "u0000"}"#));
        assert!(!json_holds_nul(br#"{"model": "\u000"}"#));
    }
}
