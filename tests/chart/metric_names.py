"""The metric names a PromQL expression reads, and whether a gpu-booking component
exports each (its name registered in that component's metrics.rs, or in the shared
families of process/src/metrics.rs). Used by the alert and dashboard tests."""

import re

import render

SOURCES = {
    "api": render.ROOT / "booking-api/src/metrics.rs",
    "webhook": render.ROOT / "webhook/src/metrics.rs",
    "controller": render.ROOT / "controller/src/metrics.rs",
    "agent": render.ROOT / "agent/src/metrics.rs",
    "process": render.ROOT / "process/src/metrics.rs",
}

PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "irate", "absent", "or",
    "and", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "histogram_quantile", "vector", "scalar", "time", "bool", "le", "offset",
    "topk", "bottomk", "clamp_min", "clamp_max", "label_replace", "delta", "deriv",
}


def metric_names(expr):
    """The metric names of a PromQL expression: identifiers outside braces, brackets
    and strings that are no keyword, function or grouping label."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    # Grouping clauses: by (a, b), without (...), on (...), ignoring (...), group_left (...).
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text))
    return {n for n in names - PROMQL_WORDS if not re.fullmatch(r"[0-9a-fA-Fe]+", n)}


def exported(metric):
    """Whether a component registers `metric`: prometheus-client names are
    <prefix>_<name>[_<unit>][_total|_bucket|_sum|_count|_info]."""
    sources = {k: p.read_text() for k, p in SOURCES.items()}
    base = re.sub(r"_(total|bucket|sum|count|info)$", "", metric)
    if any(f'"{c}"' in sources["process"] for c in (base, re.sub(r"_(seconds|bytes)$", "", base))):
        return True
    # A family a component registers without its component's prefix
    # (`registry.unprefixed()`): gpu_booking_<name>.
    short = base.removeprefix("gpu_booking_")
    if any(".unprefixed()" in src and f'"{short}"' in src for src in sources.values()):
        return True
    prefixes = {"gpu_booking_api_": "api", "gpu_booking_webhook_": "webhook",
                "gpu_booking_controller_": "controller", "gpu_booking_agent_": "agent"}
    for prefix, component in prefixes.items():
        if base.startswith(prefix):
            name = base[len(prefix):]
            candidates = {name, re.sub(r"_(seconds|bytes|ratios)$", "", name)}
            return any(f'"{c}"' in sources[component] for c in candidates)
    return False
