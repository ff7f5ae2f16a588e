#!/usr/bin/env python3
"""Render deploy/prometheus/localvol-alerts.yaml from the Helm chart.

The chart's PrometheusRule (templates/prometheusrule.yaml, on with
`prometheusRule.enabled`) is the one source of localvol's alerts. For a
Prometheus without the operator the same rules are a `rule_files` file: the
rule's `spec` (its `groups:`), rendered with the chart's default values
(`helm template ... --set prometheusRule.enabled=true`), the template's
comments kept, under a header saying where it comes from.

Run by deploy/validate: `--check` fails with a diff when the checked-in file
differs from the render; `--write` (make deploy-base) rewrites it. Both also
check the chart's side: no PrometheusRule unless enabled, the values'
`labels` on the object, and each threshold value reaching its rule.
"""

import argparse
import difflib
import os
import subprocess
import sys
import tempfile

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(REPO, "deploy", "helm", "localvol")
TEMPLATE = "templates/prometheusrule.yaml"
OUT = os.path.join(REPO, "deploy", "prometheus", "localvol-alerts.yaml")
REL = os.path.relpath(OUT, REPO)

HEADER = """\
# GENERATED from the Helm chart deploy/helm/localvol (the PrometheusRule of
# templates/prometheusrule.yaml, default values) by deploy/tools/render_alerts.py:
# do not edit; change the chart, then run `make deploy-base`.
# `make validate-deploy` fails while this file and the chart disagree, and
# runs deploy/tools/alert_tests.py (promtool) on it.
#
# localvol's alerts for a Prometheus without the operator: list this file under
# rule_files. The thresholds are the chart's defaults (docs/operations.md,
# "Alerts"); to change one, edit your copy, or render your own with
#   helm template localvol deploy/helm/localvol --set prometheusRule.enabled=true \\
#     --set-json prometheusRule.freeRatio=0.2 --show-only templates/prometheusrule.yaml
# and take its spec.
"""

# A value changed from its default -> a text its rule's expression must hold.
THRESHOLDS = {
    "thinDataPercent": ("71", "localvol_pool_thin_data_percent > 71"),
    "thinMetadataPercent": ("72", "localvol_pool_thin_metadata_percent > 72"),
    "freeRatio": ("0.25", "localvol_pool_free_bytes <= 0.25 * localvol_pool_capacity_bytes"),
    "wipeBacklogMinutes": ("90", "localvol_wipe_pending_bytes[90m]"),
    "rpcErrorRatio": ("0.2", "> 0.2"),
}


def helm_template(helm, *sets, only=True):
    """`--set-json` each of `sets` (`--set` would make 0.25 a string)."""
    args = [helm, "template", "localvol", CHART, "--namespace", "localvol"]
    for s in sets:
        args += ["--set-json", s]
    if only:
        args += ["--show-only", TEMPLATE]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def spec_text(rendered):
    """The PrometheusRule's `spec:` block, dedented to the top level, from the
    rendered template (one document whose last key is spec)."""
    lines = rendered.splitlines()
    start = lines.index("spec:")
    body = lines[start + 1:]
    bad = [l for l in body if l.strip() and not l.startswith("  ")]
    if bad:
        raise SystemExit(f"render_alerts: a line after spec: is not inside it: {bad[0]!r}")
    return "\n".join(l[2:] for l in body).strip("\n") + "\n"


def render(helm):
    rendered = helm_template(helm, "prometheusRule.enabled=true")
    obj = yaml.safe_load(rendered)
    text = spec_text(rendered)
    if yaml.safe_load(text) != obj["spec"]:
        raise SystemExit("render_alerts: the extracted spec text does not parse to the object's spec")
    return obj, HEADER + text


def check_chart(helm, obj):
    """What the chart must do besides the rules' text; a list of problems."""
    bad = []
    if (obj.get("apiVersion"), obj.get("kind")) != ("monitoring.coreos.com/v1", "PrometheusRule"):
        bad.append(f"the template renders {obj.get('apiVersion')} {obj.get('kind')}")
    rules = [r for g in obj["spec"]["groups"] for r in g["rules"]]
    for r in rules:
        a = r.get("annotations", {})
        if not (r.get("labels", {}).get("severity") and a.get("summary") and a.get("description")):
            bad.append(f"{r.get('alert')}: needs a severity label, a summary and a description")
        elif "docs/troubleshooting.md" not in a["description"]:
            bad.append(f"{r.get('alert')}: its description must point to the troubleshooting table (docs/troubleshooting.md)")
    if "PrometheusRule" in helm_template(helm, only=False):
        bad.append("the default values render a PrometheusRule (it must be opt-in)")
    custom = yaml.safe_load(helm_template(helm, "prometheusRule.enabled=true",
                                          'prometheusRule.labels={"release":"kube-prometheus-stack"}',
                                          *(f"prometheusRule.{k}={v}" for k, (v, _) in THRESHOLDS.items())))
    if custom["metadata"]["labels"].get("release") != "kube-prometheus-stack":
        bad.append("prometheusRule.labels do not reach the PrometheusRule's labels")
    exprs = " ".join(" ".join(r["expr"].split()) for g in custom["spec"]["groups"] for r in g["rules"])
    for key, (_, want) in THRESHOLDS.items():
        if want not in exprs:
            bad.append(f"prometheusRule.{key} does not reach its rule (no {want!r})")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--helm", required=True)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail if the file is not the chart's render")
    mode.add_argument("--write", action="store_true", help="rewrite the file")
    a = ap.parse_args()
    obj, text = render(a.helm)
    bad = check_chart(a.helm, obj)
    for b in bad:
        print(f"render_alerts: FAIL {b}")
    if a.write:
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(OUT), delete=False) as f:
            f.write(text)
        os.replace(f.name, OUT)
        print(f"render_alerts: wrote {REL}")
        return 1 if bad else 0
    have = open(OUT).read() if os.path.exists(OUT) else ""
    if have != text:
        sys.stdout.writelines(difflib.unified_diff(
            have.splitlines(True), text.splitlines(True),
            f"{REL} (checked in)", "rules (rendered from the chart)"))
        print(f"render_alerts: FAIL {REL} differs from the chart's PrometheusRule: "
              "run `make deploy-base` and commit the result")
        return 1
    if bad:
        return 1
    print(f"render_alerts: PASS {REL} is the chart's PrometheusRule; "
          "opt-in, its labels and thresholds from the values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
