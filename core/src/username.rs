//! Who a pod belongs to: JupyterHub user names and the two slugs KubeSpawner derives
//! from them for the `hub.jupyter.org/username` label.
//!
//! KubeSpawner writes the raw name into the `hub.jupyter.org/username` *annotation*
//! (prefer it), and a slug of it into the *label* of the same name:
//!
//! - 0.16 to 6.x: the reversible "escape" scheme ([`escape_encode`], [`escape_decode`]);
//! - 7.x: the lossy "safe" scheme ([`safe_slug`]), which cannot be reversed, so the
//!   booking service keeps both slugs ([`slugs`]) of every user it knows and answers
//!   lookups by slug.
//!
//! Both slug functions reproduce KubeSpawner byte for byte (checked against real pod
//! bodies in `tests/fixtures/kubespawner`), including its quirks, because their only
//! purpose is to compute the label KubeSpawner *did* write; see each function.

use std::collections::BTreeSet;
use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Longest user name accepted, in bytes. JupyterHub has no limit of its own; 256 bytes
/// covers any real login (an e-mail address is at most 254) and bounds what one claim
/// or annotation can make us store and hash.
pub const MAX_USERNAME_BYTES: usize = 256;

/// Everything that can be wrong with a user name or an escaped slug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsernameError {
    #[error("user name is empty")]
    Empty,
    #[error("user name is {len} bytes long; at most {max} bytes are allowed")]
    TooLong { len: usize, max: usize },
    #[error("user name contains the control character U+{code:04X} at byte {at}")]
    ControlCharacter { code: u32, at: usize },
    /// An invisible character (a format character such as U+200B ZERO WIDTH SPACE,
    /// a line or paragraph separator, a private-use character): it would make two
    /// names that look the same two users.
    #[error("user name contains the invisible character U+{code:04X} at byte {at} (format characters, line and paragraph separators and private-use characters are not allowed)")]
    InvisibleCharacter { code: u32, at: usize },
    #[error("user name starts or ends with whitespace")]
    SurroundingWhitespace,
    #[error("escaped slug has an invalid escape at byte {at}: '-' must be followed by two lowercase hex digits")]
    InvalidEscape { at: usize },
    #[error("escaped slug contains {ch:?} at byte {at}; only a-z, 0-9 and '-' can occur")]
    InvalidSlugCharacter { ch: char, at: usize },
    #[error("escaped slug decodes to bytes that are not valid UTF-8")]
    InvalidUtf8,
    #[error("escaped slug {slug:?} is not how KubeSpawner escapes {decoded:?} (it writes {canonical:?})")]
    NonCanonical {
        slug: String,
        decoded: String,
        canonical: String,
    },
}

/// KubeSpawner's "escape" slug (0.16 to 6.x; `kubespawner.slugs.escape_slug` in 7.x):
/// `escapism.escape(name, safe=[a-z0-9], escape_char='-').lower()`.
///
/// Each character outside `[a-z0-9]` becomes, for each of its UTF-8 bytes, `-` and the
/// byte in hex; then the whole string is lowercased (only the hex digits change, the
/// rest is already lowercase).
///
/// Quirk kept on purpose: escapism formats each byte with `{:X}`, *not zero-padded*, so
/// bytes below 0x10 (the control characters U+0000..U+000F) get one hex digit (`"\t"` ->
/// `-9`). Such escapes are ambiguous and [`escape_decode`] cannot reverse them; it does
/// not matter in practice because [`Username::parse`] refuses control characters.
pub fn escape_encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        if ch.is_ascii_lowercase() || ch.is_ascii_digit() {
            out.push(ch);
        } else {
            let mut buf = [0u8; 4];
            for byte in ch.encode_utf8(&mut buf).bytes() {
                // Writing into a String cannot fail.
                let _ = write!(out, "-{byte:x}");
            }
        }
    }
    out
}

/// Reverses [`escape_encode`] in one left-to-right pass.
///
/// The predecessor ran three sequential `replace` calls, so an escaped `-` (`-2d`)
/// followed by `40` was decoded again (`-2d40` -> `-40` -> `@`). Here each escape is
/// consumed exactly once: `-2d40` -> `-40`.
///
/// Strict: only `[a-z0-9]` and `-` followed by two lowercase hex digits are accepted,
/// the bytes must form UTF-8, and the result must escape back to exactly `slug` (so
/// `-61` is refused although it decodes to `a`: KubeSpawner writes `a`). Hence every
/// slug names at most one user, and `escape_decode(&escape_encode(s)) == Ok(s)` for
/// every `s` without characters U+0000..U+000F (see [`escape_encode`]).
pub fn escape_decode(slug: &str) -> Result<String, UsernameError> {
    let bytes = slug.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b'a'..=b'z' | b'0'..=b'9' => {
                out.push(byte);
                i += 1;
            }
            b'-' => {
                let hi = bytes.get(i + 1).copied().and_then(hex_digit);
                let lo = bytes.get(i + 2).copied().and_then(hex_digit);
                match (hi, lo) {
                    (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                    _ => return Err(UsernameError::InvalidEscape { at: i }),
                }
                i += 3;
            }
            _ => {
                // Only ASCII bytes were consumed so far, so `i` is a char boundary.
                let ch = slug
                    .get(i..)
                    .and_then(|rest| rest.chars().next())
                    .unwrap_or(char::REPLACEMENT_CHARACTER);
                return Err(UsernameError::InvalidSlugCharacter { ch, at: i });
            }
        }
    }
    let decoded = String::from_utf8(out).map_err(|_| UsernameError::InvalidUtf8)?;
    let canonical = escape_encode(&decoded);
    if canonical != slug {
        return Err(UsernameError::NonCanonical {
            slug: slug.to_owned(),
            decoded,
            canonical,
        });
    }
    Ok(decoded)
}

/// Value of one lowercase hex digit (the escape scheme lowercases its output).
fn hex_digit(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    }
}

/// Length of the sha256 prefix (hex digits) that ends a hashed safe slug.
const SAFE_SLUG_HASH_LEN: usize = 8;
/// Default `max_length` of kubespawner's `safe_slug`, used for the username label.
const SAFE_SLUG_MAX_LEN: usize = 32;

/// KubeSpawner 7.x "safe" slug for the username label:
/// `kubespawner.slugs.safe_slug(name, is_valid=is_valid_label)`.
///
/// - a name without `--` that passes kubespawner's `is_valid_label` is kept as it is
///   (so `Bob.Smith` and the empty string survive unchanged);
/// - any other name becomes `<safe part>---<first 8 hex digits of sha256(name)>`, at
///   most 32 characters: the safe part is the name lowercased, each run of characters
///   outside `[a-z0-9]` turned into one `-`, leading `-` stripped, cut to 21 characters,
///   trailing `-` stripped, `x-` put in front when it starts with a digit (then cut to
///   21 again) and `x` when nothing is left.
///
/// Quirks kept on purpose, because the point is to match the label KubeSpawner wrote:
/// - `is_valid_label` uses Python's `re.IGNORECASE`, under which `[a-z]` also matches
///   `İ` (U+0130), `ı` (U+0131), `ſ` (U+017F) and `K` (U+212A); a name like `aſb` is
///   therefore kept as is, although it is not a valid Kubernetes label value;
/// - after the `x-` prefix the safe part can end in `-`, giving `----` before the hash.
///
/// Use [`is_label_value`] where a value must really be a valid label.
pub fn safe_slug(name: &str) -> String {
    if !name.contains("--") && is_valid_label_kubespawner(name) {
        return name.to_owned();
    }
    strip_and_hash(name)
}

/// KubeSpawner 7.x's slug for *object names* (the `{user_server}` part of the pod name
/// `jupyter-{user_server}`): `safe_slug(name, is_valid=is_valid_object_name)`, so a
/// name is kept only when it already is a DNS-1123 label (lowercase `[a-z0-9-]`, at
/// most 63 characters, alphanumeric at both ends) without `--`; `Bob.Smith` becomes
/// `bob-smith---274c9d19` although its label slug keeps `Bob.Smith`.
pub fn safe_object_slug(name: &str) -> String {
    let dns_label = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if dns_label && !name.contains("--") {
        return name.to_owned();
    }
    strip_and_hash(name)
}

/// kubespawner's `is_valid_label`: empty, or at most 63 code points of `[a-z0-9._-]`
/// (case-insensitively, in Python's sense) that start and end with an ASCII
/// letter or digit.
fn is_valid_label_kubespawner(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    // Python's len() counts code points.
    if s.chars().count() > 63 {
        return false;
    }
    let starts_ok = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    let ends_ok = s
        .chars()
        .next_back()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    starts_ok
        && ends_ok
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    '.' | '-' | '_' | '\u{130}' | '\u{131}' | '\u{17F}' | '\u{212A}'
                )
        })
}

/// Whether `s` is a valid Kubernetes label value: empty, or at most 63 characters of
/// `[A-Za-z0-9._-]` that start and end with a letter or digit.
pub fn is_label_value(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let bytes = s.as_bytes();
    bytes.len() <= 63
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// kubespawner's `_strip_and_hash(name, max_length=32)`.
fn strip_and_hash(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let hash = hex::encode(&digest[..SAFE_SLUG_HASH_LEN / 2]);
    let safe = extract_safe_name(name, SAFE_SLUG_MAX_LEN - (SAFE_SLUG_HASH_LEN + 3));
    format!("{safe}---{hash}")
}

/// kubespawner's `_extract_safe_name(name, max_length)`.
fn extract_safe_name(name: &str, max_len: usize) -> String {
    // Python's str.lower() and Rust's to_lowercase() both apply the full Unicode
    // mapping; what matters is which characters become ASCII (A-Z, 'K' U+212A -> k,
    // 'İ' U+0130 -> i + U+0307), and there they agree.
    let mut replaced = String::with_capacity(name.len());
    let mut in_run = false;
    for ch in name.to_lowercase().chars() {
        if ch.is_ascii_lowercase() || ch.is_ascii_digit() {
            replaced.push(ch);
            in_run = false;
        } else if !in_run {
            replaced.push('-');
            in_run = true;
        }
    }
    // `replaced` is ASCII from here on, so counting chars is counting bytes.
    let cut: String = replaced
        .trim_start_matches('-')
        .chars()
        .take(max_len)
        .collect();
    let mut safe = cut.trim_end_matches('-').to_owned();
    if !safe.is_empty() && !safe.starts_with(|c: char| c.is_ascii_lowercase()) {
        // kubespawner does not strip '-' again here (its "always exactly '---'" comment
        // notwithstanding): `safe_name[:max_length - 2]` may end in '-'.
        safe = format!("x-{}", safe.chars().take(max_len - 2).collect::<String>());
    }
    if safe.is_empty() {
        safe.push('x');
    }
    safe
}

/// Both label slugs of one user name, as KubeSpawner 6.x (`escape`) and 7.x (`safe`)
/// would write them; the booking service stores them to answer lookups by label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UserSlugs {
    pub escape: String,
    pub safe: String,
}

/// The `escape` and `safe` slugs of `name`.
pub fn slugs(name: &str) -> UserSlugs {
    UserSlugs {
        escape: escape_encode(name),
        safe: safe_slug(name),
    }
}

/// How user names are compared, which must be how the JupyterHub in front of us
/// compares them: its `Authenticator.normalize_username` lowercases by default, so
/// `Alice@Example.com` signing in to the booking page and the `alice@example.com` that
/// KubeSpawner writes into the pod are one user. [`Username::normalised`] is the one
/// place that applies it, on the booking side and on the webhook side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum NameCase {
    /// Lowercase (Unicode, as Python's `str.lower()`): JupyterHub's default.
    #[default]
    Lowercase,
    /// Compared as written: for a JupyterHub whose authenticator keeps case.
    Sensitive,
}

/// `--case-sensitive-names` (with the `clap` feature): declared once, flattened into the
/// booking service's and the webhook's options, which must agree on it.
#[cfg(feature = "clap")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct NameCaseArgs {
    /// Compare user names as written. Default: lowercased, as JupyterHub's
    /// authenticators normalise them (so a token's `Alice@Example.com` and the
    /// `alice@example.com` of a JupyterHub pod are one user); set it on the API and the
    /// webhook alike when JupyterHub's authenticator keeps case.
    #[arg(long, env = "GPU_BOOKING_CASE_SENSITIVE_NAMES")]
    pub case_sensitive_names: bool,
}

#[cfg(feature = "clap")]
impl NameCaseArgs {
    /// The comparison the switch asks for.
    pub fn name_case(&self) -> NameCase {
        NameCase::from_switch(self.case_sensitive_names)
    }
}

impl NameCase {
    /// `Sensitive` when `case_sensitive`, as a command-line switch says it.
    pub fn from_switch(case_sensitive: bool) -> Self {
        if case_sensitive {
            Self::Sensitive
        } else {
            Self::Lowercase
        }
    }
}

/// What a label lookup matched among the users the booking service knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlugMatch {
    /// Nobody has this slug.
    Nobody,
    /// Exactly one user: the slug is theirs.
    One(String),
    /// Several users share the slug (a hash collision, or users known from before
    /// collisions were refused): it resolves to nobody, so that no pod ever gets
    /// another user's booking.
    Ambiguous(Vec<String>),
}

impl SlugMatch {
    /// The match for the (distinct) users whose lookup keys hold the slug.
    pub fn of(mut users: Vec<String>) -> Self {
        users.sort();
        users.dedup();
        match users.len() {
            0 => Self::Nobody,
            1 => Self::One(users.remove(0)),
            _ => Self::Ambiguous(users),
        }
    }
}

/// Characters that show nothing, or nothing of their own, in a name: the Unicode
/// general categories Cf (format: zero-width space and joiners, bidirectional
/// controls, the byte order mark, soft hyphen, tags), Zl and Zp (line and paragraph
/// separators), Co (private use) and Cs (surrogates, which a `char` never is). Cc
/// (controls) has its own error. JupyterHub itself refuses none of them (its
/// `validate_username` refuses only `/`, empty names, names of dots and surrounding
/// white space), but a name holding one looks like another user's name.
pub fn is_invisible(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    matches!(
        c.general_category(),
        GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
            | GeneralCategory::PrivateUse
            | GeneralCategory::Surrogate
    )
}

/// A JupyterHub user name, as it arrives from a JWT claim, an admin's request or a pod
/// annotation. Every user name passes through [`Username::parse`].
///
/// Permissive on purpose: real logins are e-mail addresses, dotted names, `+` tags,
/// non-Latin letters, even inner spaces, and refusing one would lock a real user out.
/// What is refused cannot be a real login and only causes harm downstream: empty
/// names, more than [`MAX_USERNAME_BYTES`], control characters (they forge log lines
/// and headers), leading/trailing whitespace (it makes two names look alike) and
/// invisible characters ([`is_invisible`]: `alice` and `alice` + U+200B would be
/// two users that no one can tell apart).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Username(String);

impl Username {
    pub fn parse(name: &str) -> Result<Self, UsernameError> {
        Self::validate(name)?;
        Ok(Self(name.to_owned()))
    }

    fn validate(name: &str) -> Result<(), UsernameError> {
        if name.is_empty() {
            return Err(UsernameError::Empty);
        }
        if name.len() > MAX_USERNAME_BYTES {
            return Err(UsernameError::TooLong {
                len: name.len(),
                max: MAX_USERNAME_BYTES,
            });
        }
        // char::is_control is exactly the Unicode category Cc (C0, DEL and C1).
        if let Some((at, ch)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(UsernameError::ControlCharacter {
                code: u32::from(ch),
                at,
            });
        }
        if let Some((at, ch)) = name.char_indices().find(|(_, c)| is_invisible(*c)) {
            return Err(UsernameError::InvisibleCharacter {
                code: u32::from(ch),
                at,
            });
        }
        if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
            return Err(UsernameError::SurroundingWhitespace);
        }
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_inner(self) -> String {
        self.0
    }

    /// Both label slugs KubeSpawner derives from this name.
    pub fn slugs(&self) -> UserSlugs {
        slugs(&self.0)
    }

    /// `name` checked by [`Username::parse`] and then normalised as JupyterHub does
    /// (see [`NameCase`]). Lowercasing can lengthen a name (`İ` becomes two code
    /// points), so the result is checked again.
    pub fn normalised(name: &str, case: NameCase) -> Result<Self, UsernameError> {
        let name = Self::parse(name)?;
        match case {
            NameCase::Sensitive => Ok(name),
            NameCase::Lowercase => Self::try_from(name.0.to_lowercase()),
        }
    }

    /// Every value by which a pod label can name this user: the name itself and both
    /// slugs, without repeats. Two users whose keys meet would make a label ambiguous,
    /// so the booking service refuses the second one (`a-b` and `a-2db`: the 6.x label
    /// of the first is the 7.x label of the second).
    pub fn lookup_keys(&self) -> BTreeSet<String> {
        let UserSlugs { escape, safe } = self.slugs();
        BTreeSet::from([self.0.clone(), escape, safe])
    }
}

impl fmt::Display for Username {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Username {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Username {
    type Error = UsernameError;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        Self::validate(&name)?;
        Ok(Self(name))
    }
}

impl TryFrom<&str> for Username {
    type Error = UsernameError;

    fn try_from(name: &str) -> Result<Self, Self::Error> {
        Self::parse(name)
    }
}

impl FromStr for Username {
    type Err = UsernameError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::parse(name)
    }
}

impl From<Username> for String {
    fn from(name: Username) -> Self {
        name.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escape_encode_matches_kubespawner_examples() {
        assert_eq!(escape_encode("alice@example.com"), "alice-40example-2ecom");
        assert_eq!(escape_encode("a-b"), "a-2db");
        assert_eq!(escape_encode("Bob.Smith"), "-42ob-2e-53mith");
        assert_eq!(escape_encode("Bob"), "-42ob");
        assert_eq!(escape_encode("zoë@uni.example"), "zo-c3-ab-40uni-2eexample");
        assert_eq!(escape_encode("gpu-run"), "gpu-2drun");
        assert_eq!(escape_encode(""), "");
        // Four-byte character: every byte escaped.
        assert_eq!(escape_encode("🙂"), "-f0-9f-99-82");
    }

    #[test]
    fn escape_encode_keeps_escapisms_unpadded_hex() {
        // escapism formats bytes with `{:X}`: one digit below 0x10.
        assert_eq!(escape_encode("a\tb"), "a-9b");
        assert_eq!(escape_encode("\0"), "-0");
        assert_eq!(escape_encode("\u{10}"), "-10");
    }

    #[test]
    fn escape_decode_is_one_pass() {
        assert_eq!(escape_decode("-2d40").as_deref(), Ok("-40"));
        assert_eq!(escape_decode("-2d-2d40").as_deref(), Ok("--40"));
        // After an escape, the next characters are literal again.
        assert_eq!(escape_decode("-2d2d40").as_deref(), Ok("-2d40"));
        assert_eq!(escape_decode("a-2db").as_deref(), Ok("a-b"));
        assert_eq!(
            escape_decode("alice-40example-2ecom").as_deref(),
            Ok("alice@example.com")
        );
        assert_eq!(escape_decode("-42ob-2e-53mith").as_deref(), Ok("Bob.Smith"));
        assert_eq!(
            escape_decode("zo-c3-ab-40uni-2eexample").as_deref(),
            Ok("zoë@uni.example")
        );
        assert_eq!(escape_decode("").as_deref(), Ok(""));
    }

    #[test]
    fn escape_decode_rejects_bad_input() {
        assert_eq!(
            escape_decode("-"),
            Err(UsernameError::InvalidEscape { at: 0 })
        );
        assert_eq!(
            escape_decode("ab-4"),
            Err(UsernameError::InvalidEscape { at: 2 })
        );
        assert_eq!(
            escape_decode("-4g"),
            Err(UsernameError::InvalidEscape { at: 0 })
        );
        // Upper-case hex is never produced (the scheme lowercases).
        assert_eq!(
            escape_decode("-4A"),
            Err(UsernameError::InvalidEscape { at: 0 })
        );
        assert_eq!(
            escape_decode("Bob"),
            Err(UsernameError::InvalidSlugCharacter { ch: 'B', at: 0 })
        );
        assert_eq!(
            escape_decode("zoë"),
            Err(UsernameError::InvalidSlugCharacter { ch: 'ë', at: 2 })
        );
        assert_eq!(
            escape_decode("a.b"),
            Err(UsernameError::InvalidSlugCharacter { ch: '.', at: 1 })
        );
        // A lone continuation byte, a truncated sequence.
        assert_eq!(escape_decode("-80"), Err(UsernameError::InvalidUtf8));
        assert_eq!(escape_decode("zo-c3"), Err(UsernameError::InvalidUtf8));
        // Decodes, but KubeSpawner would never have written it.
        assert!(matches!(
            escape_decode("-61lice"),
            Err(UsernameError::NonCanonical { .. })
        ));
        assert!(matches!(
            escape_decode("-09"),
            Err(UsernameError::NonCanonical { .. })
        ));
    }

    #[test]
    fn safe_slug_matches_kubespawner_examples() {
        // From the fixtures' README.
        assert_eq!(
            safe_slug("alice@example.com"),
            "alice-example-com---ff8d9819"
        );
        assert_eq!(safe_slug("zoë@uni.example"), "zo-uni-example---99eefb17");
        assert_eq!(safe_slug("Bob.Smith"), "Bob.Smith");
        assert_eq!(safe_slug("a-b"), "a-b");
        assert_eq!(safe_slug("gpu-run"), "gpu-run");
    }

    #[test]
    fn safe_slug_matches_kubespawner_test_suite() {
        // kubespawner tests/test_slugs.py, cases with is_valid=is_valid_label, and the
        // default-validity cases whose names are not valid labels either.
        let cases = [
            ("", ""),
            ("x", "x"),
            ("a-b", "a-b"),
            ("9a", "9a"),
            ("9.", "x-9---99a1b84b"),
            ("AbC", "AbC"),
            ("AbC.", "abc---dbe8c5d1"),
            ("ab.c", "ab.c"),
            ("a@b.c", "a-b-c---d648b243"),
            ("-x", "x---a4209624"),
            ("x-", "x---c8b60efc"),
            ("jupyter-üni", "jupyter-ni---a5aaf5dd"),
            ("endswith-", "endswith---165f1166"),
            ("-start", "start---f587e2dc"),
            ("username--servername", "username-servername---d957f1de"),
            ("start---f587e2dc", "start-f587e2dc---cc5bb9c9"),
            ("user@email.com", "user-email-com---0925f997"),
            ("user-_@_emailß.com", "user-email-com---7e3a7efd"),
            ("üser", "ser---73506260"),
        ];
        for (name, expected) in cases {
            assert_eq!(safe_slug(name), expected, "safe_slug({name:?})");
        }
        let x63 = "x".repeat(63);
        assert_eq!(safe_slug(&x63), x63);
        assert_eq!(
            safe_slug(&"x".repeat(64)),
            "xxxxxxxxxxxxxxxxxxxxx---7ce10097"
        );
        assert_eq!(
            safe_slug(&"x".repeat(65)),
            "xxxxxxxxxxxxxxxxxxxxx---9537c5fd"
        );
    }

    #[test]
    fn safe_object_slug_matches_kubespawner_pod_names() {
        // Pod names of tests/fixtures/kubespawner/7.1.0-*.json: `jupyter-` + this.
        assert_eq!(
            safe_object_slug("alice@example.com"),
            "alice-example-com---ff8d9819"
        );
        assert_eq!(safe_object_slug("Bob.Smith"), "bob-smith---274c9d19");
        assert_eq!(safe_object_slug("a-b"), "a-b");
        assert_eq!(
            safe_object_slug("zoë@uni.example"),
            "zo-uni-example---99eefb17"
        );
        assert_eq!(safe_slug("Bob.Smith"), "Bob.Smith");
    }

    #[test]
    fn safe_slug_edge_cases() {
        // Only separators: the safe part is empty and becomes "x".
        let slug = safe_slug("@@@");
        assert!(slug.starts_with("x---") && slug.len() == 12, "{slug}");
        // Starts with a digit after stripping: "x-" prefix, then cut to 19 characters,
        // which here leaves a trailing '-' before the '---' (kubespawner does the same).
        let slug = safe_slug("123456789012345678.ab!");
        assert!(slug.starts_with("x-123456789012345678----"), "{slug}");
        assert!(slug.len() <= 32);
        // Very long: the whole slug is at most 32 characters.
        let long = format!("{}@example.com", "a".repeat(300));
        let slug = safe_slug(&long);
        assert_eq!(slug.len(), 32);
        assert!(slug.starts_with(&"a".repeat(21)));
        // Python IGNORECASE quirk: kept as is, though not a valid label value.
        assert_eq!(safe_slug("aſb"), "aſb");
        assert!(!is_label_value("aſb"));
        // Kelvin sign lowercases to ASCII 'k' when hashed.
        assert!(safe_slug("K@x").starts_with("k-x---"));
    }

    #[test]
    fn is_label_value_follows_kubernetes() {
        assert!(is_label_value(""));
        assert!(is_label_value("Bob.Smith"));
        assert!(is_label_value("a_b-c.d9"));
        assert!(!is_label_value("-42ob-2e-53mith"));
        assert!(!is_label_value("a-"));
        assert!(!is_label_value("a@b"));
        assert!(is_label_value(&"x".repeat(63)));
        assert!(!is_label_value(&"x".repeat(64)));
    }

    #[test]
    fn slugs_hold_both_schemes() {
        assert_eq!(
            slugs("alice@example.com"),
            UserSlugs {
                escape: "alice-40example-2ecom".into(),
                safe: "alice-example-com---ff8d9819".into(),
            }
        );
    }

    #[test]
    fn username_accepts_real_logins() {
        for name in [
            "alice",
            "alice@example.com",
            "Bob.Smith",
            "a-b",
            "zoë@uni.example",
            "user+tag@example.org",
            "Jean Luc",
            "山田太郎",
            "o'brien",
        ] {
            let parsed = Username::parse(name);
            assert_eq!(parsed.as_ref().map(Username::as_str), Ok(name));
        }
        assert!(Username::parse(&"a".repeat(MAX_USERNAME_BYTES)).is_ok());
    }

    #[test]
    fn username_refuses_garbage() {
        assert_eq!(Username::parse(""), Err(UsernameError::Empty));
        assert_eq!(
            Username::parse(&"a".repeat(MAX_USERNAME_BYTES + 1)),
            Err(UsernameError::TooLong {
                len: MAX_USERNAME_BYTES + 1,
                max: MAX_USERNAME_BYTES
            })
        );
        // 86 three-byte characters: 258 bytes, though only 86 characters.
        assert!(matches!(
            Username::parse(&"€".repeat(86)),
            Err(UsernameError::TooLong { len: 258, .. })
        ));
        for (name, code, at) in [
            ("alice\n", 0x0A, 5),
            ("ali\rce", 0x0D, 3),
            ("a\0b", 0, 1),
            ("a\u{7f}", 0x7F, 1),
            ("a\u{85}b", 0x85, 1),
            ("\tbob", 0x09, 0),
        ] {
            assert_eq!(
                Username::parse(name),
                Err(UsernameError::ControlCharacter { code, at }),
                "{name:?}"
            );
        }
        for name in [" alice", "alice ", "\u{a0}alice", "alice\u{3000}"] {
            assert_eq!(
                Username::parse(name),
                Err(UsernameError::SurroundingWhitespace),
                "{name:?}"
            );
        }
    }

    #[test]
    fn username_conversions_and_serde() {
        let name = Username::parse("zoë@uni.example").expect("valid");
        assert_eq!(name.to_string(), "zoë@uni.example");
        assert_eq!(
            serde_json::to_value(&name).expect("serializes"),
            serde_json::json!("zoë@uni.example")
        );
        let back: Username = serde_json::from_str("\"zoë@uni.example\"").expect("parses");
        assert_eq!(back, name);
        assert!(serde_json::from_str::<Username>("\"\"").is_err());
        assert!(serde_json::from_str::<Username>("\"a\\nb\"").is_err());
        assert_eq!(
            Username::try_from(String::from("bob")).map(String::from),
            Ok("bob".into())
        );
        assert!(Username::try_from(String::from(" bob")).is_err());
        assert_eq!(
            "bob".parse::<Username>().map(Username::into_inner),
            Ok("bob".into())
        );
        assert_eq!(name.slugs().safe, "zo-uni-example---99eefb17");
    }

    #[test]
    fn invisible_characters_are_refused() {
        for (name, code, at) in [
            ("alice\u{200b}", 0x200b, 5),
            ("\u{feff}alice", 0xfeff, 0),
            ("al\u{200d}ice", 0x200d, 2),
            ("al\u{00ad}ice", 0x00ad, 2),
            ("alice\u{202e}moc.evil", 0x202e, 5),
            ("a\u{2028}b", 0x2028, 1),
            ("a\u{e000}b", 0xe000, 1),
            ("a\u{e0041}b", 0xe0041, 1),
        ] {
            assert_eq!(
                Username::parse(name),
                Err(UsernameError::InvisibleCharacter { code, at }),
                "{name:?}"
            );
        }
        // Visible letters, marks and inner spaces of real logins stay accepted.
        for name in [
            "zoë@uni.example",
            "José María",
            "李小龙",
            "a\u{0301}b",
            "x+tag@lab.example",
        ] {
            assert!(Username::parse(name).is_ok(), "{name:?}");
        }
        // Lowercasing never brings one in: the normalised name is checked again.
        assert!(Username::normalised("Alice\u{200b}", NameCase::Lowercase).is_err());
    }

    #[test]
    fn normalised_as_jupyterhub_does() {
        let lower = |n| Username::normalised(n, NameCase::Lowercase).map(String::from);
        assert_eq!(lower("Alice@Example.COM"), Ok("alice@example.com".into()));
        assert_eq!(lower("ZOË@uni.example"), Ok("zoë@uni.example".into()));
        // Final sigma, as Python's str.lower() writes it.
        assert_eq!(lower("ΟΔΥΣΣΕΥΣ"), Ok("οδυσσευς".into()));
        assert_eq!(
            Username::normalised("Alice", NameCase::Sensitive).map(String::from),
            Ok("Alice".into())
        );
        assert_eq!(lower(" alice"), Err(UsernameError::SurroundingWhitespace));
        // 'İ' (2 bytes) lowercases to 3 bytes: the longer result is checked too.
        let long = "İ".repeat(MAX_USERNAME_BYTES / 2);
        assert!(Username::parse(&long).is_ok());
        assert!(matches!(lower(&long), Err(UsernameError::TooLong { .. })));
        assert_eq!(NameCase::from_switch(true), NameCase::Sensitive);
        assert_eq!(NameCase::default(), NameCase::Lowercase);
    }

    #[test]
    fn lookup_keys_hold_name_and_both_slugs() {
        let keys = |n: &str| Username::parse(n).expect("valid").lookup_keys();
        assert_eq!(
            keys("alice@example.com"),
            BTreeSet::from([
                "alice@example.com".to_owned(),
                "alice-40example-2ecom".to_owned(),
                "alice-example-com---ff8d9819".to_owned(),
            ])
        );
        assert_eq!(keys("bob"), BTreeSet::from(["bob".to_owned()]));
        // The raw name of one user is the escape slug of another.
        assert!(keys("alice-40example-2ecom").contains("alice-40example-2ecom"));
        assert!(!keys("a-b").is_disjoint(&keys("a-2db")));
    }

    /// Two names with one safe slug: the slug keeps 32 bits of sha256, and both names
    /// share the 21 characters before the hash (found by a birthday search over the
    /// suffix, about 80,000 hashes).
    pub const SAFE_COLLISION: [&str; 2] = [
        "collision.test.user.x@example.org+80885",
        "collision.test.user.x@example.org+83606",
    ];

    #[test]
    fn safe_slugs_can_collide() {
        let [a, b] = SAFE_COLLISION;
        assert_eq!(safe_slug(a), "collision-test-user-x---a7f36e85");
        assert_eq!(safe_slug(a), safe_slug(b));
        assert_ne!(escape_encode(a), escape_encode(b));
    }

    #[test]
    fn slug_matches() {
        assert_eq!(SlugMatch::of(vec![]), SlugMatch::Nobody);
        assert_eq!(
            SlugMatch::of(vec!["a".into(), "a".into()]),
            SlugMatch::One("a".into())
        );
        assert_eq!(
            SlugMatch::of(vec!["b".into(), "a".into()]),
            SlugMatch::Ambiguous(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn errors_read_well() {
        assert_eq!(
            UsernameError::ControlCharacter { code: 10, at: 5 }.to_string(),
            "user name contains the control character U+000A at byte 5"
        );
        assert_eq!(
            UsernameError::InvalidEscape { at: 2 }.to_string(),
            "escaped slug has an invalid escape at byte 2: '-' must be followed by two lowercase hex digits"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any Unicode string without U+0000..U+000F (which escapism writes with one
        /// hex digit, see escape_encode) survives encode + decode.
        #[test]
        fn escape_round_trips(name in "\\PC*|[a-z0-9@.\\-ë]{0,12}|.*") {
            prop_assume!(!name.chars().any(|c| c < '\u{10}'));
            prop_assert_eq!(escape_decode(&escape_encode(&name)), Ok(name));
        }

        #[test]
        fn escape_round_trips_any_char(chars in prop::collection::vec(any::<char>(), 0..16)) {
            let name: String = chars.into_iter().filter(|c| *c >= '\u{10}').collect();
            let slug = escape_encode(&name);
            prop_assert!(slug.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
            prop_assert_eq!(escape_decode(&slug), Ok(name));
        }

        #[test]
        fn escape_decode_never_panics(slug in ".*|[a-z0-9\\-]{0,24}|[0-9a-f\\-]{0,24}") {
            if let Ok(name) = escape_decode(&slug) {
                // Whatever decodes is exactly what KubeSpawner would have written.
                prop_assert_eq!(escape_encode(&name), slug);
            }
        }

        #[test]
        fn safe_slug_is_a_label(name in ".*|[a-zA-Z0-9@._\\-]{0,80}|[-.@]{0,4}[0-9]{0,30}[a-z.\\-]{0,6}") {
            // Names containing the four characters Python's IGNORECASE lets through
            // are KubeSpawner's own bug (see safe_slug).
            prop_assume!(!name.chars().any(|c| matches!(c, '\u{130}' | '\u{131}' | '\u{17F}' | '\u{212A}')));
            let slug = safe_slug(&name);
            prop_assert!(is_label_value(&slug), "{:?} -> {:?}", name, slug);
            prop_assert!(slug.len() <= 63);
            if slug != name {
                prop_assert!(slug.len() <= 32);
                prop_assert!(slug.contains("---"));
            } else {
                prop_assert!(!name.contains("--"));
            }
        }
    }
}
