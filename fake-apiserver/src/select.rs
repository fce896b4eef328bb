//! Label selectors (equality and set-based) and field selectors (`=`, `==`, `!=` on
//! any dotted path, e.g. `spec.nodeName`, `metadata.name`, `status.phase`).

use serde_json::Value;

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

/// A parsed `fieldSelector`: `path=value`, `path==value` or `path!=value`, comma
/// separated. A missing field reads as the empty string, as the API server's field
/// sets do (so `spec.nodeName=` selects unscheduled pods).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, equal, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid field selector {part:?}"));
            };
            reqs.push((path.trim().to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, equal, value)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            let field = match obj.pointer(&pointer) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (field == *value) == *equal
        })
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

    #[test]
    fn fields() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        assert!(FieldSelector::parse("spec.nodeName=n1,metadata.name=p")
            .unwrap()
            .matches(&pod));
        assert!(!FieldSelector::parse("spec.nodeName!=n1")
            .unwrap()
            .matches(&pod));
        assert!(FieldSelector::parse("status.phase=").unwrap().matches(&pod));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
