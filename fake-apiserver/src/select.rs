//! Label selectors (equality and set-based) and field selectors (`=`, `==`, `!=` on
//! the field labels each resource supports, [`crate::field_labels`]).

use serde_json::Value;

use crate::field_labels::{field_label, Read};
use crate::path::ResourceKey;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`; every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits at commas that are not inside parentheses (`a in (x,y),b=c`).
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set_values(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                let values = set_values(v).ok_or_else(|| format!("bad set in {part:?}"))?;
                LabelReq::NotIn(k.trim().into(), values)
            } else if let Some((k, v)) = part.split_once(" in ") {
                let values = set_values(v).ok_or_else(|| format!("bad set in {part:?}"))?;
                LabelReq::In(k.trim().into(), values)
            } else if let Some(k) = part.strip_prefix('!') {
                LabelReq::NotExists(k.trim().into())
            } else if part.contains(char::is_whitespace) {
                return Err(format!("unable to parse requirement {part:?}"));
            } else {
                LabelReq::Exists(part.into())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `label=value`, `label==value` or `label!=value`, comma
/// separated, each label one the resource supports ([`field_label`]). A label the
/// object lacks reads as its selectable fields would give it (`spec.nodeName=`
/// selects unscheduled pods).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(Read, bool, String)>);

/// Splits at commas not escaped by a backslash, keeping escapes for [`unescape`]
/// (apimachinery's `fields.splitTerms`).
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms
}

/// `(label, equal, raw value)` split at the first operator, `!=`, `==` or `=` tried
/// in that order at each position (`fields.splitTerm`); nothing is trimmed.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    term.char_indices().find_map(|(i, _)| {
        let rest = &term[i..];
        ["!=", "==", "="]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .map(|op| (&term[..i], op != "!=", &rest[op.len()..]))
    })
}

/// A value with `\\`, `\,` and `\=` unescaped; a bare `,` or `=`, or any other escape,
/// is an error (`fields.UnescapeValue`, whose errors these are, the rune printed as
/// Go's `%v` prints one: a number).
fn unescape(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut escaped = false;
    for c in raw.chars() {
        match c {
            '\\' | ',' | '=' if escaped => {
                out.push(c);
                escaped = false;
            }
            _ if escaped => {
                return Err(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                ))
            }
            '\\' => escaped = true,
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                ))
            }
            _ => out.push(c),
        }
    }
    if escaped {
        return Err("invalid field selector: invalid escape sequence: \\".into());
    }
    Ok(out)
}

impl FieldSelector {
    /// As kube-apiserver reads `fieldSelector` for a list, watch or deletecollection
    /// of `resource`: `fields.ParseSelector` (terms sorted, so the first bad one in
    /// that order is the one reported), then the resource's field label conversion,
    /// whose refusal the handler answers as 400 BadRequest.
    pub fn parse(s: &str, resource: &ResourceKey) -> Result<Self, String> {
        let mut terms = split_terms(s);
        terms.sort_unstable();
        let mut parsed = Vec::new();
        for term in terms.into_iter().filter(|t| !t.is_empty()) {
            let (label, equal, raw) = split_term(term)
                .ok_or_else(|| format!("invalid selector: '{s}'; can't understand '{term}'"))?;
            parsed.push((label, equal, unescape(raw)?));
        }
        let reqs = parsed
            .into_iter()
            .map(|(label, equal, value)| Ok((field_label(resource, label)?, equal, value)))
            .collect::<Result<_, String>>()?;
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(read, equal, value)| (read.read(obj) == *value) == *equal)
    }
}

/// Both selectors of a list or watch.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selector {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels() {
        let pod = json!({"metadata": {"labels": {"a": "1", "b": "x"}}});
        let yes = [
            "a=1",
            "a==1",
            "b!=y",
            "a in (1,2)",
            "c notin (1)",
            "a",
            "!c",
            "a=1,b",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&pod), "{s}");
        }
        let no = [
            "a=2",
            "b!=x",
            "a in (2, 3)",
            "b notin (x)",
            "c",
            "!a",
            "a=1,c",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&pod), "{s}");
        }
        assert!(LabelSelector::parse("a b").is_err());
    }

    fn pods() -> ResourceKey {
        ResourceKey::new("/api/v1", "pods")
    }

    #[test]
    fn fields() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        let parse = |s: &str| FieldSelector::parse(s, &pods()).unwrap();
        assert!(parse("spec.nodeName=n1,metadata.name=p").matches(&pod));
        assert!(parse("spec.nodeName==n1").matches(&pod));
        assert!(!parse("spec.nodeName!=n1").matches(&pod));
        assert!(parse("status.phase=").matches(&pod));
        assert!(parse("").matches(&pod));
        assert!(parse(",").matches(&pod));
        let running = json!({"status": {"phase": "Running"}});
        let done = json!({"status": {"phase": "Succeeded"}});
        let unfinished = parse("status.phase!=Succeeded,status.phase!=Failed");
        assert!(unfinished.matches(&running));
        assert!(!unfinished.matches(&done));
        assert!(parse("spec.nodeName=").matches(&running));
    }

    #[test]
    fn field_syntax_is_apimachinerys() {
        let err = |s: &str| FieldSelector::parse(s, &pods()).unwrap_err();
        assert_eq!(
            err("nonsense"),
            "invalid selector: 'nonsense'; can't understand 'nonsense'"
        );
        assert_eq!(
            err("spec.nodeName=a=b"),
            "invalid field selector: unescaped character in value: 61"
        );
        assert_eq!(
            err("spec.nodeName=a\\x"),
            "invalid field selector: invalid escape sequence: \\x"
        );
        assert_eq!(
            err("spec.nodeName=a\\"),
            "invalid field selector: invalid escape sequence: \\"
        );
        // Nothing is trimmed: the label is `spec.nodeName `.
        assert_eq!(
            err("spec.nodeName = a"),
            "field label not supported: spec.nodeName "
        );
        // Terms are sorted before their labels are checked.
        assert_eq!(err("zzz=1,foo.bar=x"), "field label not supported: foo.bar");
        // A syntax error wins over an unsupported label.
        assert_eq!(
            err("aaa=1,spec.nodeName"),
            "invalid selector: 'aaa=1,spec.nodeName'; can't understand 'spec.nodeName'"
        );
    }

    #[test]
    fn escaped_values() {
        let pod = json!({"metadata": {"name": "a,b=c\\d"}});
        let sel = FieldSelector::parse("metadata.name=a\\,b\\=c\\\\d", &pods()).unwrap();
        assert!(sel.matches(&pod));
        let sel = FieldSelector::parse("metadata.name!=a\\,b", &pods()).unwrap();
        assert!(sel.matches(&pod));
    }
}
