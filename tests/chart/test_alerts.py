"""The chart's alerts checked by Prometheus' own tool: `promtool check rules` on the
rendered PrometheusRule of every scenario (the rules switched on), and `promtool test rules` with
one test file per alert group (tests/chart/alerts/<group>.test.yaml, against the rules
of tests/chart/values/everything.yaml).

In a test file, each expected alert gives its labels and the annotations that hold a
template ({{ $labels.* }}, {{ $value }}); the annotations without one (summary,
runbook_url, constant descriptions) are filled in here from the rendered rule, so that
the files say what varies and nothing else.

promtool comes from Debian's `prometheus` package (scripts/chart-tools.sh installs it
when it runs as root); without it these tests are skipped and say so."""

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import render
from metric_names import exported, metric_names

ALERTS = Path(__file__).resolve().parent / "alerts"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package prometheus; scripts/chart-tools.sh installs it as root)",
)

# Metrics the rules read that no gpu-booking component exports: Prometheus' own `up`,
# kube-state-metrics' Job metrics, and kube-apiserver's webhook metrics.
EXTERNAL_METRICS = {
    "up",
    "kube_job_status_failed",
    "kube_job_status_start_time",
    "kube_job_status_succeeded",
    "apiserver_admission_webhook_fail_open_count",
    "apiserver_admission_webhook_rejection_count",
}


def rule_spec(scenario_files, set_values=()):
    objs = render.render(scenario_files, set_values=set_values)
    rules = [o for o in objs if o["kind"] == "PrometheusRule"]
    return rules[0]["spec"] if rules else None


EVERYTHING = rule_spec([render.VALUES / "everything.yaml"])


def alerts(spec):
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"] if "alert" in r}


@needs_promtool
@pytest.mark.parametrize("scenario", sorted(render.scenarios()))
def test_promtool_checks_the_rules_of_every_scenario(scenario, tmp_path):
    # Every scenario with the rules on: each changes which alerts render and how.
    spec = rule_spec(render.scenarios()[scenario], ["metrics.prometheusRule.enabled=true"])
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_group_has_a_test_file_and_every_alert_a_test():
    files = {p.name.removesuffix(".test.yaml") for p in ALERTS.glob("*.test.yaml")}
    groups = {g["name"] for g in EVERYTHING["groups"]}
    assert files == groups
    tested = set()
    for p in ALERTS.glob("*.test.yaml"):
        for case in yaml.safe_load(p.read_text())["tests"]:
            for a in case.get("alert_rule_test", []):
                # An alert counts as tested when some case expects it to fire.
                if a.get("exp_alerts"):
                    tested.add(a["alertname"])
    assert set(alerts(EVERYTHING)) - tested == set()


def test_alerts_read_metrics_that_exist():
    """Every metric an expression names is exported by a component (its name appears
    in that component's metrics.rs) or is one of the known external ones."""
    for name, rule in alerts(EVERYTHING).items():
        for metric in metric_names(rule["expr"]):
            if metric in EXTERNAL_METRICS:
                continue
            assert exported(metric), f"{name}: {metric} is exported by no component"


@needs_promtool
@pytest.mark.parametrize("test_file", sorted(p.name for p in ALERTS.glob("*.test.yaml")))
def test_promtool_unit_tests(test_file, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(EVERYTHING))
    constant = {
        name: {k: v for k, v in r["annotations"].items() if "{{" not in v}
        for name, r in alerts(EVERYTHING).items()
    }
    tests = yaml.safe_load((ALERTS / test_file).read_text())
    tests = copy.deepcopy(tests)
    tests["rule_files"] = [str(rules)]
    for case in tests["tests"]:
        for a in case.get("alert_rule_test", []):
            assert a["alertname"] in constant, f"{test_file}: no alert {a['alertname']}"
            for expected in a.get("exp_alerts") or []:
                given = expected.get("exp_annotations") or {}
                expected["exp_annotations"] = {**constant[a["alertname"]], **given}
    path = tmp_path / test_file
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


MONITORING = ["metrics.prometheusRule.enabled=true", "metrics.serviceMonitor.enabled=true"]


def monitoring_kinds(apis):
    return sorted({o["kind"] for o in render.render(set_values=MONITORING, apis=apis)
                   if o["apiVersion"].startswith("monitoring.coreos.com/")})


def test_the_monitoring_objects_render_only_where_their_apis_are_served():
    """Where the Prometheus Operator's CRDs are missing, a PrometheusRule or a
    ServiceMonitor would fail the whole install: each renders only with its API."""
    assert monitoring_kinds(render.MONITORING_APIS) == ["PrometheusRule", "ServiceMonitor"]
    assert monitoring_kinds(()) == []
    assert monitoring_kinds(["monitoring.coreos.com/v1/ServiceMonitor"]) == ["ServiceMonitor"]
    assert monitoring_kinds(["monitoring.coreos.com/v1/PrometheusRule"]) == ["PrometheusRule"]


def install_notes(*set_values):
    """The notes of a client-side dry run, which models a cluster without the
    Prometheus Operator's CRDs."""
    cmd = [render.helm(), "install", render.RELEASE, str(render.CHART), "--namespace", render.NAMESPACE,
           "--dry-run=client"]
    for s in set_values:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "kind: PrometheusRule" not in out and "kind: ServiceMonitor" not in out
    return out[out.index("NOTES:"):]


def test_the_install_notes_say_which_monitoring_objects_were_skipped():
    text = install_notes(*MONITORING)
    assert "Monitoring: no PrometheusRule or ServiceMonitor installed" in text
    assert "Prometheus Operator's CRDs" in text
    text = install_notes("metrics.serviceMonitor.enabled=true")
    assert "Monitoring: no ServiceMonitor installed" in text
    assert "Monitoring:" not in install_notes()


def test_the_webhook_latency_threshold_follows_the_timeout_within_the_histogram():
    def threshold(*set_values):
        spec = rule_spec([render.VALUES / "everything.yaml"], set_values)
        return alerts(spec)["GpuBookingWebhookSlow"]["expr"].split(">")[-1].strip()

    assert threshold() == "2.5"
    assert threshold("webhook.timeoutSeconds=7") == "3.5"
    # Past the histogram's largest finite bucket (6.55 s) a p99 reads as that bound:
    # the threshold stays under it.
    assert threshold("webhook.timeoutSeconds=30") == "6.5"
