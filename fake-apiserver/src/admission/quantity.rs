//! What the API server's decoding does to a pod's resource quantities before any
//! admission plugin sees them: a JSON number (`4.0`, `17179869184`, as KubeSpawner
//! sends them) becomes the canonical quantity string (`"4"`, `"17179869184"`, `0.5` ->
//! `"500m"`, `2000` -> `"2k"`), so that typed clients can read the stored pod
//! ("Resource Management for Pods and Containers"; `resource.Quantity`'s canonical
//! form: decimal SI, the exponent a multiple of 3, at most nano precision, rounded up).

use serde_json::Value;

/// The decimal SI suffix of an exponent of ten (a multiple of 3).
fn suffix(exponent: i32) -> String {
    match exponent {
        -9 => "n".into(),
        -6 => "u".into(),
        -3 => "m".into(),
        0 => String::new(),
        3 => "k".into(),
        6 => "M".into(),
        9 => "G".into(),
        12 => "T".into(),
        15 => "P".into(),
        18 => "E".into(),
        e => format!("e{e}"),
    }
}

/// The canonical string of a JSON number; `None` when it does not fit (left alone).
fn canonical(number: &str) -> Option<String> {
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number),
    };
    let (digits_part, exp_part) = match number.split_once(['e', 'E']) {
        Some((d, e)) => (d, e.parse::<i32>().ok()?),
        None => (number, 0),
    };
    let (int, frac) = digits_part.split_once('.').unwrap_or((digits_part, ""));
    let digits = format!("{int}{frac}");
    let mut mantissa: u128 = digits.parse().ok()?;
    let mut exponent = exp_part.checked_sub(i32::try_from(frac.len()).ok()?)?;
    // At most nano precision, rounded up.
    while exponent < -9 {
        let rest = mantissa % 10;
        mantissa /= 10;
        if rest != 0 {
            mantissa += 1;
        }
        exponent += 1;
    }
    if mantissa == 0 {
        return Some("0".into());
    }
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exponent += 1;
    }
    while exponent.rem_euclid(3) != 0 {
        mantissa = mantissa.checked_mul(10)?;
        exponent -= 1;
    }
    let sign = if negative { "-" } else { "" };
    Some(format!("{sign}{mantissa}{}", suffix(exponent)))
}

fn canonicalize_map(map: Option<&mut Value>) {
    let Some(map) = map.and_then(Value::as_object_mut) else {
        return;
    };
    for q in map.values_mut() {
        if let Value::Number(n) = q {
            if let Some(text) = canonical(&n.to_string()) {
                *q = Value::String(text);
            }
        }
    }
}

/// Rewrites the numeric quantities of a pod (every container's requests and limits,
/// and the pod's overhead) as the API server stores them.
pub fn canonicalize_pod(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec") else {
        return;
    };
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            for section in ["requests", "limits"] {
                canonicalize_map(c.pointer_mut(&format!("/resources/{section}")));
            }
        }
    }
    canonicalize_map(spec.get_mut("overhead"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_become_canonical_quantities() {
        let cases = [
            ("4.0", "4"),
            ("1", "1"),
            ("0.5", "500m"),
            ("1.5", "1500m"),
            ("2000", "2k"),
            ("17179869184", "17179869184"),
            ("1000000000", "1G"),
            ("0.25", "250m"),
            ("1e-10", "1n"),
            ("0", "0"),
            ("-2", "-2"),
            ("1e21", "1e21"),
        ];
        for (number, want) in cases {
            assert_eq!(canonical(number).as_deref(), Some(want), "{number}");
        }
    }

    #[test]
    fn only_numbers_in_resources_change() {
        let mut pod = json!({"spec": {
            "containers": [{"name": "a", "resources": {"limits": {"cpu": 4.0, "memory": "4Gi"}, "requests": {"cpu": 0.5}}}],
            "initContainers": [{"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "overhead": {"cpu": 0.1}
        }});
        canonicalize_pod(&mut pod);
        assert_eq!(
            pod,
            json!({"spec": {
                "containers": [{"name": "a", "resources": {"limits": {"cpu": "4", "memory": "4Gi"}, "requests": {"cpu": "500m"}}}],
                "initContainers": [{"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "overhead": {"cpu": "100m"}
            }})
        );
    }
}
