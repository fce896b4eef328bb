"""The Grafana dashboard (charts/gpu-booking/dashboards/gpu-booking.json): rendered in a
ConfigMap with the sidecar's label only when asked, and every expression reads
metrics the components really export."""

import json
import shutil
import subprocess

import pytest
import yaml

import render
import test_chart
from metric_names import exported, metric_names

DASHBOARD = render.CHART / "dashboards" / "gpu-booking.json"


def targets(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_the_dashboard_configmap_carries_the_sidecar_label():
    assert [o for o in test_chart.objects("defaults", "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")] == []
    cm = test_chart.one("everything", "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert json.loads(cm["data"]["gpu-booking.json"]) == json.loads(DASHBOARD.read_text())
    moved = render.render(["tests/chart/values/everything.yaml"], set_values=["metrics.grafanaDashboard.namespace=monitoring"])
    (cm,) = [o for o in moved if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["namespace"] == "monitoring"


def test_the_dashboard_shows_what_the_issue_asks():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(e for _, e in targets(dashboard))
    for metric in ("gpu_booking_api_bookings", "gpu_booking_api_model_units_free", "gpu_booking_api_model_units_lent",
                   "gpu_booking_webhook_admissions_total", "gpu_booking_webhook_admission_duration_seconds_bucket",
                   "gpu_booking_controller_evictions_total", "gpu_booking_agent_reclaim_total",
                   "gpu_booking_agent_gpu_memory_free_bytes"):
        assert metric in exprs, metric
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_dashboard_expression_reads_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    checked = 0
    for title, expr in targets(dashboard):
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr}"
        for metric in names:
            assert exported(metric), f"{title}: {metric} is exported by no component"
            checked += 1
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert "gpu_booking_build_info" in var["definition"] and exported("gpu_booking_build_info")
    assert checked > 10


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_every_dashboard_expression_is_valid_promql(tmp_path):
    """promtool parses each expression (Grafana's variables given values) as a
    recording rule."""
    dashboard = json.loads(DASHBOARD.read_text())
    rules = []
    for i, (_, expr) in enumerate(targets(dashboard)):
        expr = expr.replace("$__rate_interval", "5m").replace("$namespace", "gpu-booking")
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
