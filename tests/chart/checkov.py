"""Runs checkov on the rendered manifests with the checks of
charts/gpu-booking/checkov-skips.yaml skipped, and fails when a check fails or a
skipped check would have failed on an object its entry does not name.

    python tests/chart/checkov.py CHECKOV_BINARY RENDERED_DIR
"""

import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import yaml

SKIPS = Path(__file__).resolve().parents[2] / "charts" / "gpu-booking" / "checkov-skips.yaml"


def run(checkov, directory, skip):
    cmd = [checkov, "-d", str(directory), "--framework", "kubernetes", "--compact", "-o", "json"]
    if skip:
        cmd += ["--skip-check", ",".join(skip)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode not in (0, 1) or not result.stdout.strip():
        sys.stderr.write(result.stderr)
        raise SystemExit(f"checkov did not run ({result.returncode})")
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    summary = {"passed": 0, "failed": []}
    for report in reports:
        if "results" not in report:
            continue
        summary["passed"] += len(report["results"].get("passed_checks", []))
        summary["failed"] += report["results"].get("failed_checks", [])
    return summary


def kind_name(resource):
    """checkov's `Kind.namespace.name` as `Kind/name`."""
    parts = resource.split(".")
    return f"{parts[0]}/{parts[-1]}"


def main(checkov, directory):
    skips = yaml.safe_load(SKIPS.read_text())
    checked = run(checkov, directory, sorted(skips))
    problems = [f"{f['check_id']} {f['check_name']}: {f['resource']} ({f['file_path']})" for f in checked["failed"]]
    # The skipped checks alone, to see where they would fail.
    unskipped = run(checkov, directory, [])
    for f in unskipped["failed"]:
        entry = skips.get(f["check_id"])
        if entry and not any(fnmatch.fnmatch(kind_name(f["resource"]), p) for p in entry["only"]):
            problems.append(f"{f['check_id']} is skipped, but also fails on {f['resource']} ({f['file_path']}), "
                            f"which checkov-skips.yaml does not name")
    used = {f["check_id"] for f in unskipped["failed"]}
    for check in sorted(set(skips) - used):
        problems.append(f"{check} is skipped in checkov-skips.yaml but fails nowhere: remove it")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"checkov: {checked['passed']} checks passed, none failed; "
          f"{len(skips)} skipped with their reasons (charts/gpu-booking/checkov-skips.yaml)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
