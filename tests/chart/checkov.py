"""Runs checkov on each rendered scenario on its own and fails when a check fails, or a
check skipped in charts/gpu-booking/checkov-skips.yaml fails on an object its entry
does not name (or on none at all, in every scenario).

    python tests/chart/checkov.py CHECKOV_BINARY RENDERED_DIR

RENDERED_DIR holds one `<scenario>.yaml` per scenario (tests/chart/render.py). Each is
checked in a directory of its own: checkov's graph checks (CKV2_K8S_6, a NetworkPolicy
for every pod) connect objects across every file of a directory, so one scenario's
policies would otherwise cover the pods of another that has none.
"""

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

SKIPS = Path(__file__).resolve().parents[2] / "charts" / "gpu-booking" / "checkov-skips.yaml"


def run(checkov, directory):
    """Every check on `directory`, none skipped: (passed, failed) results. The skips
    are applied by the caller, which must see where a skipped check would fail."""
    cmd = [checkov, "-d", str(directory), "--framework", "kubernetes", "--compact", "-o", "json"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode not in (0, 1) or not result.stdout.strip():
        sys.stderr.write(result.stderr)
        raise SystemExit(f"checkov did not run on {directory} ({result.returncode})")
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    passed, failed = [], []
    for report in reports:
        if "results" not in report:
            continue
        passed += report["results"].get("passed_checks", [])
        failed += report["results"].get("failed_checks", [])
    return passed, failed


def kind_name(resource):
    """checkov's `Kind.namespace.name` as `Kind/name` (its graph checks' pods have their
    labels appended, dots and all, after the name)."""
    parts = resource.split(".")
    return f"{parts[0]}/{parts[2] if len(parts) > 2 else parts[-1]}"


def split(directory):
    """RENDERED_DIR/checkov/<scenario>/<scenario>.yaml for each scenario."""
    root = Path(directory) / "checkov"
    shutil.rmtree(root, ignore_errors=True)
    out = {}
    for rendered in sorted(Path(directory).glob("*.yaml")):
        scenario = root / rendered.stem
        scenario.mkdir(parents=True)
        shutil.copy(rendered, scenario / rendered.name)
        out[rendered.stem] = scenario
    if not out:
        raise SystemExit(f"no rendered scenario (*.yaml) in {directory}")
    return out


def main(checkov, directory):
    skips = yaml.safe_load(SKIPS.read_text())
    scenarios = split(directory)
    with ThreadPoolExecutor(max_workers=min(len(scenarios), os.cpu_count() or 1)) as pool:
        results = dict(zip(scenarios, pool.map(lambda d: run(checkov, d), scenarios.values())))
    problems, used, passed = [], set(), 0
    for scenario, (ok, failed) in results.items():
        passed += sum(1 for p in ok if p["check_id"] not in skips)
        for f in failed:
            entry = skips.get(f["check_id"])
            where = f"{kind_name(f['resource'])} (scenario {scenario})"
            if entry is None:
                problems.append(f"{f['check_id']} {f['check_name']}: {where}")
            elif not any(fnmatch.fnmatch(kind_name(f["resource"]), p) for p in entry["only"]):
                problems.append(f"{f['check_id']} is skipped, but also fails on {where}, "
                                f"which checkov-skips.yaml does not name")
            else:
                used.add(f["check_id"])
    for check in sorted(set(skips) - used):
        problems.append(f"{check} is skipped in checkov-skips.yaml but fails in no scenario: remove it")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"checkov: {len(scenarios)} scenarios, each on its own: {passed} checks passed, none failed; "
          f"{len(skips)} skipped with their reasons (charts/gpu-booking/checkov-skips.yaml)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
