//! Kubernetes resource quantities, as far as admission needs them: is a GPU count above
//! zero, and how many whole units is it.

use serde_json::Value;

/// The value of a Kubernetes quantity: a JSON string such as `"1"`, `"500m"`, `"2Ki"`,
/// `"1e3"`, or a JSON number (what a client may send before the API server re-encodes
/// it). `None` for anything else.
pub fn parse_quantity(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => parse_quantity_str(s),
        _ => None,
    }
}

fn parse_quantity_str(s: &str) -> Option<f64> {
    let s = s.trim();
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    if number.is_empty() || number.len() > 64 {
        return None;
    }
    let base: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp => {
            let rest = exp.strip_prefix(['e', 'E'])?;
            let exponent: i32 = rest.parse().ok()?;
            10f64.powi(exponent.clamp(-400, 400))
        }
    };
    let v = base * factor;
    v.is_finite().then_some(v)
}

/// How many whole units a GPU quantity asks for: 0 for zero, negative or absent values;
/// fractions round up; an unreadable value counts as 1, so that a pod cannot slip a GPU
/// past admission by writing its count in an odd way.
pub(crate) fn gpu_units(value: &Value) -> u64 {
    match value {
        Value::Null => 0,
        other => match parse_quantity(other) {
            Some(v) if v > 0.0 => {
                let units = v.ceil();
                if units >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    units as u64
                }
            }
            Some(_) => 0,
            None => 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity(&json!("1")), Some(1.0));
        assert_eq!(parse_quantity(&json!(2)), Some(2.0));
        assert_eq!(parse_quantity(&json!("500m")), Some(0.5));
        assert_eq!(parse_quantity(&json!("2Ki")), Some(2048.0));
        assert_eq!(parse_quantity(&json!("1e3")), Some(1000.0));
        assert_eq!(parse_quantity(&json!("1.5")), Some(1.5));
        assert_eq!(parse_quantity(&json!("abc")), None);
        assert_eq!(parse_quantity(&json!("")), None);
        assert_eq!(parse_quantity(&json!(null)), None);
        assert_eq!(parse_quantity(&json!("1Zi")), None);
    }

    #[test]
    fn units() {
        assert_eq!(gpu_units(&json!("1")), 1);
        assert_eq!(gpu_units(&json!("0")), 0);
        assert_eq!(gpu_units(&json!(0)), 0);
        assert_eq!(gpu_units(&json!("-1")), 0);
        assert_eq!(gpu_units(&json!("500m")), 1);
        assert_eq!(gpu_units(&json!("garbage")), 1);
        assert_eq!(gpu_units(&json!(null)), 0);
        assert_eq!(gpu_units(&json!("1e30")), u64::MAX);
    }
}
