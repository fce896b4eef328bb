//! Bookable GPU models, named by ordered wildcard patterns over product names.
//!
//! The NVIDIA stack names a card by its product string (node label
//! `nvidia.com/gpu.product`, e.g. `NVIDIA-RTX-A6000`, `A100-SXM4-40GB`; with the mixed
//! MIG strategy `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`; MIG profiles alone as `1g.5gb`).
//! Following NVIDIA's resource-naming proposal, a lab maps those strings to the models
//! users book with ordered patterns where `*` matches any run of characters, and the
//! first model (in catalog order) with a matching pattern wins, so a specific pattern
//! (`A100-*-40GB`) placed before a broad one (`*A100*`) takes precedence.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest accepted pattern, in characters (product strings are far shorter).
pub const MAX_PATTERN_LEN: usize = 128;
/// Longest model name: model names become Kubernetes label values (limit 63).
pub const MAX_MODEL_NAME_LEN: usize = 63;

/// What is wrong with a pattern or a model name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuModelError {
    #[error("GPU product pattern is empty")]
    EmptyPattern,
    #[error("GPU product pattern is {len} characters long; at most {max} are allowed")]
    PatternTooLong { len: usize, max: usize },
    #[error("GPU product pattern {pattern:?} contains {ch:?} at byte {at}; only printable ASCII is allowed")]
    PatternNotPrintableAscii {
        pattern: String,
        ch: char,
        at: usize,
    },
    #[error("invalid GPU model name {name:?}: {reason}")]
    InvalidModelName { name: String, reason: &'static str },
}

/// One wildcard pattern over product names: `*` matches any run of characters
/// (possibly empty), every other character matches itself, and the pattern must match
/// the whole product string.
///
/// Matching ignores ASCII case. Product strings are not stable in case: they come from
/// the driver (`nvidia-smi --query-gpu=name`) through GFD, and spellings have changed
/// between driver and GFD versions (`GeForce`/`GEFORCE`, `Tesla`/`TESLA`, MIG profile
/// names written `1g.5gb` or `1G.5GB` by different tools), while an admin types
/// patterns by eye. No two real products differ only in case, so ignoring it costs
/// nothing and keeps a driver upgrade from silently moving cards out of their model.
///
/// Matching also takes a space and a `-` as the same character: `nvidia-smi` prints
/// `Tesla V100-SXM2-16GB` where GPU feature discovery's label has
/// `Tesla-V100-SXM2-16GB` (a label value has no spaces), so a pattern copied from
/// either matches both.
///
/// Patterns are printable ASCII only (product strings are ASCII; the space is allowed
/// because `nvidia-smi` names such as `Tesla V100-SXM2-16GB` contain one).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct ModelPattern {
    /// As written, for display and serialization.
    source: String,
    /// `source` folded ([`fold`]), what matching uses.
    folded: String,
}

impl ModelPattern {
    pub fn parse(pattern: &str) -> Result<Self, GpuModelError> {
        if pattern.is_empty() {
            return Err(GpuModelError::EmptyPattern);
        }
        if let Some((at, ch)) = pattern
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_graphic() || *c == ' '))
        {
            return Err(GpuModelError::PatternNotPrintableAscii {
                pattern: pattern.to_owned(),
                ch,
                at,
            });
        }
        // ASCII only from here: bytes are characters.
        if pattern.len() > MAX_PATTERN_LEN {
            return Err(GpuModelError::PatternTooLong {
                len: pattern.len(),
                max: MAX_PATTERN_LEN,
            });
        }
        Ok(Self {
            source: pattern.to_owned(),
            folded: fold(pattern),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the whole of `product` matches this pattern, ignoring ASCII case and
    /// the difference between a space and a `-`.
    pub fn matches(&self, product: &str) -> bool {
        glob_match(&self.folded, &fold(product))
    }
}

/// ASCII-lowercased, spaces as `-`: what a pattern and a product are compared as.
fn fold(text: &str) -> String {
    text.to_ascii_lowercase().replace(' ', "-")
}

/// Glob match of a folded pattern against a folded text, in time linear in their
/// lengths, by construction rather than by backtracking.
///
/// With `*` as the only wildcard, `p0*p1*...*pn` matches iff the text starts with `p0`,
/// ends with `pn`, and `p1..pn-1` occur in order, without overlap, in between; taking
/// the leftmost occurrence of each middle piece is always safe (it leaves the most
/// room for the rest). `str::find` uses the Two-Way algorithm (linear worst case) and
/// each search starts where the previous one ended, so a pathological pattern such as
/// `*a*a*a*a*a*a*b` against `aaaa...` costs one pass over the text, not an exponential
/// (or even quadratic) number of steps. Pieces are ASCII, so every match position is a
/// char boundary of the text, whatever the text contains.
fn glob_match(pattern: &str, text: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or("");
    let Some(last) = pieces.next_back() else {
        // No '*': a literal.
        return pattern == text;
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    for piece in pieces {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    // `last` must fit in what the middle pieces left, so it cannot reuse their text.
    rest.ends_with(last)
}

impl fmt::Display for ModelPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl FromStr for ModelPattern {
    type Err = GpuModelError;

    fn from_str(pattern: &str) -> Result<Self, Self::Err> {
        Self::parse(pattern)
    }
}

impl TryFrom<String> for ModelPattern {
    type Error = GpuModelError;

    fn try_from(pattern: String) -> Result<Self, Self::Error> {
        Self::parse(&pattern)
    }
}

impl From<ModelPattern> for String {
    fn from(pattern: ModelPattern) -> Self {
        pattern.source
    }
}

/// The name of a bookable GPU model (`a100-40gb`, `rtx-a6000`, `mig-1g.5gb`): 1 to 63
/// characters of `[a-z0-9]([-a-z0-9.]*[a-z0-9])?`, because it is used as a Kubernetes
/// label value and as a URL path segment, and lowercase-only so that two spellings can
/// never name two models.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct ModelName(String);

impl ModelName {
    pub fn parse(name: &str) -> Result<Self, GpuModelError> {
        let invalid = |reason| GpuModelError::InvalidModelName {
            name: name.to_owned(),
            reason,
        };
        let bytes = name.as_bytes();
        let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
            return Err(invalid("it is empty"));
        };
        if bytes.len() > MAX_MODEL_NAME_LEN {
            return Err(invalid("it is longer than 63 characters"));
        }
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if !bytes.iter().all(|b| alnum(b) || matches!(b, b'-' | b'.')) {
            return Err(invalid(
                "only lowercase letters a-z, digits, '-' and '.' are allowed",
            ));
        }
        if !alnum(first) || !alnum(last) {
            return Err(invalid(
                "it must start and end with a lowercase letter or digit",
            ));
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ModelName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for ModelName {
    type Err = GpuModelError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::parse(name)
    }
}

impl TryFrom<String> for ModelName {
    type Error = GpuModelError;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        Self::parse(&name)
    }
}

impl From<ModelName> for String {
    fn from(name: ModelName) -> Self {
        name.0
    }
}

/// One model and its patterns, in order; the serialized form of a catalog entry:
/// `{"name": "a100-40gb", "patterns": ["A100-*-40GB"]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub name: ModelName,
    pub patterns: Vec<ModelPattern>,
}

/// Ordered mapping from product strings to models: the first model (in order) that has
/// a matching pattern wins. A name may appear in more than one entry (NVIDIA's proposal
/// maps `3g.*` and `4g.*` to one name), which lets a model catch products both before
/// and after another one. A model with no patterns never matches. To give products
/// that match nothing a model, end the catalog with an entry whose pattern is `*`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelCatalog {
    entries: Vec<ModelEntry>,
}

impl ModelCatalog {
    /// Builds a catalog from models in order, each with its patterns in order.
    pub fn new(entries: impl IntoIterator<Item = (ModelName, Vec<ModelPattern>)>) -> Self {
        Self {
            entries: entries
                .into_iter()
                .map(|(name, patterns)| ModelEntry { name, patterns })
                .collect(),
        }
    }

    /// Parses and builds a catalog from plain strings, e.g. from configuration.
    pub fn parse<'a, P>(
        entries: impl IntoIterator<Item = (&'a str, P)>,
    ) -> Result<Self, GpuModelError>
    where
        P: IntoIterator<Item = &'a str>,
    {
        let entries = entries
            .into_iter()
            .map(|(name, patterns)| {
                Ok((
                    ModelName::parse(name)?,
                    patterns
                        .into_iter()
                        .map(ModelPattern::parse)
                        .collect::<Result<Vec<_>, _>>()?,
                ))
            })
            .collect::<Result<Vec<_>, GpuModelError>>()?;
        Ok(Self::new(entries))
    }

    /// The model `product` belongs to: the first model with a matching pattern.
    pub fn model_for(&self, product: &str) -> Option<&str> {
        self.model_name_for(product).map(ModelName::as_str)
    }

    /// Like [`model_for`](Self::model_for), as a [`ModelName`].
    pub fn model_name_for(&self, product: &str) -> Option<&ModelName> {
        // Fold the product once, not once per pattern.
        let folded = fold(product);
        self.entries
            .iter()
            .find(|entry| {
                entry
                    .patterns
                    .iter()
                    .any(|p| glob_match(&p.folded, &folded))
            })
            .map(|entry| &entry.name)
    }

    /// The model of a MIG device named in GFD's `<card>-MIG-<profile>` form: like
    /// [`model_name_for`](Self::model_name_for), but only patterns that mention MIG
    /// take part, so that a card pattern such as `*A100*` never claims the card's MIG
    /// devices (NVIDIA's proposal matches MIG devices against MIG entries only).
    pub fn mig_model_name_for(&self, product: &str) -> Option<&ModelName> {
        let folded = fold(product);
        self.entries
            .iter()
            .find(|entry| {
                entry
                    .patterns
                    .iter()
                    .any(|p| p.folded.contains("mig") && glob_match(&p.folded, &folded))
            })
            .map(|entry| &entry.name)
    }

    /// The entries, in matching order.
    pub fn entries(&self) -> &[ModelEntry] {
        &self.entries
    }

    /// Each model name once, in order of first appearance.
    pub fn models(&self) -> Vec<&ModelName> {
        let mut names: Vec<&ModelName> = Vec::with_capacity(self.entries.len());
        for entry in &self.entries {
            if !names.contains(&&entry.name) {
                names.push(&entry.name);
            }
        }
        names
    }

    /// Whether `name` is a model of this catalog.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|entry| entry.name.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pattern(s: &str) -> ModelPattern {
        ModelPattern::parse(s).expect("valid pattern")
    }

    fn catalog(entries: &[(&str, &[&str])]) -> ModelCatalog {
        ModelCatalog::parse(entries.iter().map(|(n, ps)| (*n, ps.iter().copied())))
            .expect("valid catalog")
    }

    #[test]
    fn literal_and_wildcards() {
        assert!(pattern("A100-SXM4-40GB").matches("A100-SXM4-40GB"));
        assert!(!pattern("A100-SXM4-40GB").matches("NVIDIA-A100-SXM4-40GB"));
        assert!(
            !pattern("A100").matches("A100-SXM4-40GB"),
            "whole string only"
        );
        assert!(pattern("*A100*").matches("NVIDIA-A100-SXM4-80GB"));
        assert!(pattern("*A100*").matches("A100"), "'*' may be empty");
        assert!(pattern("A100-*-40GB").matches("A100-SXM4-40GB"));
        assert!(!pattern("A100-*-40GB").matches("A100-SXM4-80GB"));
        assert!(pattern("*").matches(""));
        assert!(pattern("*").matches("anything at all"));
        assert!(pattern("**").matches("x"));
        assert!(pattern("a*a").matches("aa"));
        assert!(
            !pattern("a*a").matches("a"),
            "prefix and suffix must not overlap"
        );
        assert!(pattern("*ab*ab").matches("abab"));
        assert!(!pattern("*ab*ab").matches("aba"));
        assert!(pattern("Tesla V100-SXM2-16GB").matches("tesla v100-sxm2-16gb"));
    }

    #[test]
    fn a_pattern_copied_from_nvidia_smi_or_from_gfd_matches_both() {
        // nvidia-smi prints spaces; GFD's label value has `-` in their place.
        for p in [
            "Tesla V100-SXM2-16GB",
            "Tesla-V100-SXM2-16GB",
            "*V100 SXM2*",
        ] {
            for product in ["Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"] {
                assert!(pattern(p).matches(product), "{p} vs {product}");
            }
        }
        assert!(!pattern("Tesla V100").matches("Tesla-V100-SXM2-16GB"));
        // The pattern is shown as written.
        assert_eq!(pattern("Tesla V100*").as_str(), "Tesla V100*");
    }

    #[test]
    fn matching_ignores_ascii_case() {
        assert!(pattern("nvidia-rtx-a6000").matches("NVIDIA-RTX-A6000"));
        assert!(pattern("*GEFORCE*").matches("NVIDIA-GeForce-RTX-3090"));
        assert!(pattern("1G.5GB").matches("1g.5gb"));
        // Non-ASCII in the product never matches an ASCII literal, and does not panic.
        assert!(!pattern("*a100*").matches("ä100"));
        assert!(pattern("*100*").matches("ä100ß"));
    }

    #[test]
    fn pathological_pattern_is_linear() {
        let p = pattern("*a*a*a*a*a*a*a*a*a*a*a*a*b");
        let text = "a".repeat(200_000);
        assert!(!p.matches(&text));
        assert!(p.matches(&format!("{text}b")));
    }

    #[test]
    fn first_match_wins() {
        let c = catalog(&[("a100-40gb", &["A100-*-40GB"]), ("a100", &["*A100*"])]);
        assert_eq!(c.model_for("A100-SXM4-40GB"), Some("a100-40gb"));
        assert_eq!(c.model_for("A100-SXM4-80GB"), Some("a100"));
        assert_eq!(c.model_for("NVIDIA-A100-SXM4-80GB"), Some("a100"));
        // The same patterns in the other order: the broad one swallows everything.
        let c = catalog(&[("a100", &["*A100*"]), ("a100-40gb", &["A100-*-40GB"])]);
        assert_eq!(c.model_for("A100-SXM4-40GB"), Some("a100"));
    }

    #[test]
    fn patterns_within_a_model_are_alternatives() {
        let c = catalog(&[
            ("rtx-a6000", &["NVIDIA-RTX-A6000", "*RTX A6000*"]),
            ("a100-40gb", &["A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"]),
        ]);
        assert_eq!(c.model_for("NVIDIA-RTX-A6000"), Some("rtx-a6000"));
        assert_eq!(c.model_for("NVIDIA RTX A6000"), Some("rtx-a6000"));
        assert_eq!(c.model_for("NVIDIA-A100-SXM4-40GB"), Some("a100-40gb"));
        assert_eq!(c.model_for("A100-SXM4-40GB"), Some("a100-40gb"));
    }

    #[test]
    fn mig_profiles() {
        let c = catalog(&[
            ("mig-small", &["1g.*", "*-MIG-1g.*"]),
            ("mig-medium", &["2g.*", "*-MIG-2g.*"]),
            ("mig-large", &["3g.*", "*-MIG-3g.*"]),
            ("mig-large", &["4g.*", "*-MIG-4g.*"]),
            ("a100", &["*A100*"]),
        ]);
        assert_eq!(c.model_for("1g.5gb"), Some("mig-small"));
        assert_eq!(c.model_for("1g.10gb"), Some("mig-small"));
        assert_eq!(c.model_for("2g.10gb"), Some("mig-medium"));
        assert_eq!(c.model_for("3g.20gb"), Some("mig-large"));
        assert_eq!(c.model_for("4g.20gb"), Some("mig-large"));
        // GFD's mixed-strategy product: the MIG entry comes first, so it wins over *A100*.
        assert_eq!(
            c.model_for("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
            Some("mig-small")
        );
        assert_eq!(c.model_for("NVIDIA-A100-SXM4-40GB"), Some("a100"));
        assert_eq!(c.model_for("7g.40gb"), None);
        // In the MIG form only MIG patterns count: `*A100*` does not claim a device.
        assert_eq!(
            c.mig_model_name_for("NVIDIA-A100-SXM4-40GB-MIG-2g.10gb")
                .map(ModelName::as_str),
            Some("mig-medium")
        );
        assert_eq!(
            c.mig_model_name_for("NVIDIA-A100-SXM4-40GB-MIG-7g.40gb"),
            None
        );
        let names: Vec<&str> = c.models().into_iter().map(ModelName::as_str).collect();
        assert_eq!(names, ["mig-small", "mig-medium", "mig-large", "a100"]);
    }

    #[test]
    fn fallback_and_no_match() {
        let c = catalog(&[("a6000", &["*A6000*"])]);
        assert_eq!(c.model_for("Tesla-T4"), None);
        assert_eq!(c.model_for(""), None);
        let c = catalog(&[("a6000", &["*A6000*"]), ("gpu", &["*"])]);
        assert_eq!(c.model_for("Tesla-T4"), Some("gpu"));
        assert_eq!(c.model_for(""), Some("gpu"));
        assert_eq!(c.model_for("NVIDIA-RTX-A6000"), Some("a6000"));
        assert_eq!(ModelCatalog::default().model_for("A100"), None);
        let c = catalog(&[("unplaced", &[]), ("gpu", &["*"])]);
        assert_eq!(c.model_for("A100"), Some("gpu"));
        assert!(c.contains("unplaced"));
        assert!(!c.contains("a100"));
    }

    #[test]
    fn invalid_patterns() {
        assert_eq!(ModelPattern::parse(""), Err(GpuModelError::EmptyPattern));
        assert_eq!(
            ModelPattern::parse(&"x".repeat(MAX_PATTERN_LEN + 1)),
            Err(GpuModelError::PatternTooLong {
                len: MAX_PATTERN_LEN + 1,
                max: MAX_PATTERN_LEN
            })
        );
        assert!(ModelPattern::parse(&"x".repeat(MAX_PATTERN_LEN)).is_ok());
        for (bad, ch) in [
            ("A100\n", '\n'),
            ("A100\t*", '\t'),
            ("Ä100", 'Ä'),
            ("a\u{7f}", '\u{7f}'),
        ] {
            assert!(
                matches!(
                    ModelPattern::parse(bad),
                    Err(GpuModelError::PatternNotPrintableAscii { ch: c, .. }) if c == ch
                ),
                "{bad:?}"
            );
        }
        assert!(ModelCatalog::parse([("a100", ["*A100*", ""])]).is_err());
    }

    #[test]
    fn model_names() {
        for good in ["a100", "a100-40gb", "mig-1g.5gb", "x", "9", &"a".repeat(63)] {
            assert_eq!(
                ModelName::parse(good).map(String::from),
                Ok(good.to_owned())
            );
        }
        for bad in [
            "",
            "A100",
            "-a100",
            "a100-",
            "a100.",
            ".a",
            "a_b",
            "a b",
            "a/b",
            "ä100",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(
                    ModelName::parse(bad),
                    Err(GpuModelError::InvalidModelName { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(ModelCatalog::parse([("A100", ["*A100*"])]).is_err());
        assert_eq!(
            ModelName::parse("").map_err(|e| e.to_string()),
            Err("invalid GPU model name \"\": it is empty".to_owned())
        );
    }

    #[test]
    fn serde_forms() {
        let c = catalog(&[("a100-40gb", &["A100-*-40GB"]), ("gpu", &["*"])]);
        let json = serde_json::to_value(&c).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!([
                {"name": "a100-40gb", "patterns": ["A100-*-40GB"]},
                {"name": "gpu", "patterns": ["*"]}
            ])
        );
        let back: ModelCatalog = serde_json::from_value(json).expect("parses");
        assert_eq!(back, c);
        assert!(serde_json::from_value::<ModelCatalog>(
            serde_json::json!([{"name": "A100", "patterns": ["*"]}])
        )
        .is_err());
        assert!(serde_json::from_value::<ModelPattern>(serde_json::json!("")).is_err());
        assert_eq!(
            serde_json::to_value(ModelName::parse("a100").expect("valid")).expect("serializes"),
            serde_json::json!("a100")
        );
    }

    /// Reference matcher: the textbook recursive definition, exponential in the worst
    /// case but obviously right.
    fn reference(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|i| reference(rest, &text[i..])),
            Some((p, rest)) => text
                .split_first()
                .is_some_and(|(t, text)| p.eq_ignore_ascii_case(t) && reference(rest, text)),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn matches_agrees_with_reference(p in "[abAB*]{1,8}", text in "[abAB]{0,10}") {
            let expected = reference(p.as_bytes(), text.as_bytes());
            prop_assert_eq!(pattern(&p).matches(&text), expected, "{:?} vs {:?}", p, text);
        }

        #[test]
        fn never_panics_on_any_product(p in "[ -~]{1,12}", text in ".{0,16}") {
            let _ = pattern(&p).matches(&text);
        }
    }
}
