//! What a pod asks for and what a node offers, as kube-scheduler counts them
//! ("Resource Management for Pods and Containers", extended resources included).
//!
//! Amounts are integers in thousandths of a unit, so that `500m` of CPU and `64Gi` of
//! memory add up exactly; quantities are read with core's parser (the one admission
//! uses), never a second one.

use std::collections::BTreeMap;

use gpu_booking_core::admission::parse_quantity;
use serde_json::{Map, Value};

/// Resource name to amount, in thousandths of a unit.
pub(crate) type Amounts = BTreeMap<String, i128>;

/// Thousandths per unit.
pub(crate) const MILLI: i128 = 1000;

/// A quantity in thousandths: CPU rounds up to a millicore (`MilliValue`), everything
/// else to a whole unit (`Value`), as the scheduler's `Resource.Add` does. `None` for a
/// value that is not a quantity.
pub(crate) fn amount(resource: &str, quantity: &Value) -> Option<i128> {
    let v = parse_quantity(quantity)?;
    // Floats carry decimal quantities such as `0.1` a hair above or below the exact
    // value; snap to the nearest thousandth before rounding up.
    let ceil = |x: f64| {
        let nearest = x.round();
        if (x - nearest).abs() <= 1e-6 * nearest.abs().max(1.0) {
            nearest
        } else {
            x.ceil()
        }
    };
    let milli = if resource == "cpu" {
        ceil(v * 1000.0)
    } else {
        ceil(v) * 1000.0
    };
    // Far beyond any real node; keeps the conversion below exact and overflow-free.
    (milli.abs() < 1e30).then_some(milli as i128)
}

fn add(into: &mut Amounts, from: &Amounts) {
    for (name, v) in from {
        *into.entry(name.clone()).or_default() += v;
    }
}

fn max_into(into: &mut Amounts, from: &Amounts) {
    for (name, v) in from {
        let slot = into.entry(name.clone()).or_default();
        *slot = (*slot).max(*v);
    }
}

/// A map of quantities (`requests`, `limits`, `overhead`, `allocatable`).
fn amounts_of(map: Option<&Map<String, Value>>, what: &str) -> Result<Amounts, String> {
    let mut out = Amounts::new();
    for (name, q) in map.into_iter().flatten() {
        let v = amount(name, q).ok_or_else(|| format!("{what}: {name} is not a quantity: {q}"))?;
        out.insert(name.clone(), v);
    }
    Ok(out)
}

/// One container's request. A resource with a limit and no request is requested at
/// its limit: the API server's defaulting copies the limit ("If you specify a limit
/// for a resource, but do not specify any request ... Kubernetes copies the limit"),
/// for CPU and memory as for extended resources. The fake computes this here instead
/// of writing it into the stored pod.
fn container_request(container: &Value) -> Result<Amounts, String> {
    let name = container.get("name").and_then(Value::as_str).unwrap_or("?");
    let resources = container.get("resources");
    let of = |key: &str| {
        resources
            .and_then(|r| r.get(key))
            .and_then(Value::as_object)
    };
    let mut request = amounts_of(of("limits"), &format!("container {name} limits"))?;
    request.extend(amounts_of(
        of("requests"),
        &format!("container {name} requests"),
    )?);
    Ok(request)
}

/// The pod's effective request, as kube-scheduler's `PodRequests` computes it: the
/// sum over containers, or the largest init container if that is more (an init
/// container runs alone, before the others), resource by resource; restartable init
/// containers (sidecars, `restartPolicy: Always`) keep running, so they add to the sum
/// and to every init container started after them; plus `spec.overhead`.
pub(crate) fn pod_request(pod: &Value) -> Result<Amounts, String> {
    let list = |key: &str| {
        pod.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut total = Amounts::new();
    for c in list("containers") {
        add(&mut total, &container_request(&c)?);
    }
    let mut sidecars = Amounts::new();
    let mut init_peak = Amounts::new();
    for c in list("initContainers") {
        let mut request = container_request(&c)?;
        if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            add(&mut total, &request);
            add(&mut sidecars, &request);
            request = sidecars.clone();
        } else {
            add(&mut request, &sidecars);
        }
        max_into(&mut init_peak, &request);
    }
    max_into(&mut total, &init_peak);
    let overhead = pod.pointer("/spec/overhead").and_then(Value::as_object);
    add(&mut total, &amounts_of(overhead, "overhead")?);
    total.remove("pods");
    Ok(total)
}

/// What a node offers (`status.allocatable`); an unreadable quantity counts as not
/// offered.
pub(crate) fn allocatable(node: &Value) -> Amounts {
    node.pointer("/status/allocatable")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, q)| Some((name.clone(), amount(name, q)?)))
        .collect()
}

/// NodeResourcesFit's verdict: one reason per resource the node cannot give (empty:
/// it fits). `used` is what the node's pods already hold and `pods` how many there
/// are. A resource the node does not advertise has nothing free, so any request for
/// it is insufficient. Order as kube-scheduler's `fitsRequest` checks them.
pub(crate) fn insufficient(
    request: &Amounts,
    allocatable: &Amounts,
    used: &Amounts,
    pods: i128,
) -> Vec<String> {
    let mut reasons = Vec::new();
    let allowed_pods = allocatable.get("pods").copied().unwrap_or(0) / MILLI;
    if pods + 1 > allowed_pods {
        reasons.push("Too many pods".to_owned());
    }
    let first = ["cpu", "memory", "ephemeral-storage"];
    let rest = request.keys().filter(|k| !first.contains(&k.as_str()));
    for name in first.iter().copied().chain(rest.map(String::as_str)) {
        let want = request.get(name).copied().unwrap_or(0);
        if want <= 0 {
            continue;
        }
        let free =
            allocatable.get(name).copied().unwrap_or(0) - used.get(name).copied().unwrap_or(0);
        if want > free {
            reasons.push(format!("Insufficient {name}"));
        }
    }
    reasons
}

/// `into += from` (a pod placed on a node).
pub(crate) fn add_to(into: &mut Amounts, from: &Amounts) {
    add(into, from);
}

/// `into -= from` (a pod taken off a node).
pub(crate) fn sub_from(into: &mut Amounts, from: &Amounts) {
    for (name, v) in from {
        *into.entry(name.clone()).or_default() -= v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn amounts_round_like_the_scheduler() {
        assert_eq!(amount("cpu", &json!("100m")), Some(100));
        assert_eq!(amount("cpu", &json!("0.1")), Some(100));
        assert_eq!(amount("cpu", &json!("1.0001")), Some(1001));
        assert_eq!(
            amount("memory", &json!("64Gi")),
            Some(64 * 1024 * 1024 * 1024 * 1000)
        );
        assert_eq!(amount("memory", &json!("1.5")), Some(2000));
        assert_eq!(amount("nvidia.com/gpu", &json!(2)), Some(2000));
        assert_eq!(amount("nvidia.com/gpu", &json!("x")), None);
    }

    #[test]
    fn limits_stand_in_for_requests_and_init_containers_peak() {
        let pod = json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"cpu": "1"}}},
                {"name": "b", "resources": {"requests": {"gpu-booking.io/gpumem": "4000"}}}
            ],
            "initContainers": [
                {"name": "i", "resources": {"requests": {"cpu": "3", "gpu-booking.io/gpumem": "1000"}}}
            ],
            "overhead": {"cpu": "250m"}
        }});
        let r = pod_request(&pod).unwrap();
        assert_eq!(r["nvidia.com/gpu"], 1000);
        assert_eq!(
            r["cpu"], 3250,
            "init container's 3 CPUs beat the sum of 1, plus overhead"
        );
        assert_eq!(r["gpu-booking.io/gpumem"], 4_000_000);
    }

    #[test]
    fn sidecars_add_to_the_sum_and_to_later_init_containers() {
        let pod = json!({"spec": {
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"name": "init", "resources": {"requests": {"cpu": "2"}}}
            ]
        }});
        assert_eq!(pod_request(&pod).unwrap()["cpu"], 3000);
    }

    #[test]
    fn unreadable_request_is_an_error() {
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "lots"}}}]}});
        assert!(pod_request(&pod).unwrap_err().contains("cpu"));
    }

    #[test]
    fn unadvertised_resources_are_insufficient() {
        let alloc = Amounts::from([("pods".into(), 110_000), ("cpu".into(), 4000)]);
        let req = Amounts::from([("cpu".into(), 1000), ("gpu-booking.io/gpumem".into(), 1000)]);
        assert_eq!(
            insufficient(&req, &alloc, &Amounts::new(), 0),
            ["Insufficient gpu-booking.io/gpumem"]
        );
        let used = Amounts::from([("cpu".into(), 3500)]);
        assert_eq!(
            insufficient(&req, &alloc, &used, 110),
            [
                "Too many pods",
                "Insufficient cpu",
                "Insufficient gpu-booking.io/gpumem"
            ]
        );
    }
}
