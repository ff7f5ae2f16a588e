#!/usr/bin/env python3
"""Render the kustomize base and overlays (deploy/kubernetes/) from the Helm chart.

The chart is the one source of the manifests. The base is its default render
(`helm template localvol deploy/helm/localvol --namespace localvol
--set createNamespace=true`); each overlay is its render with one of the
chart's own test values, `ci/<overlay>-values.yaml` (OVERLAYS below). Each
directory gets two files next to its hand-written kustomization.yaml:

  localvol.yaml  every object but the pool ConfigMap, as Helm renders it
                 (comments of the templates kept), less what only Helm means:
                 the `helm.sh/chart` and `app.kubernetes.io/managed-by: Helm`
                 labels and the DaemonSet's `checksum/config` annotation (the
                 base's configMapGenerator names the ConfigMap after a hash of
                 its content instead, which rolls the pods the same way);
  config.yaml    the ConfigMap's config.yaml, which kustomization.yaml turns
                 into that generated ConfigMap (and overlays replace).

An overlay is a whole render, not a patch of the base: what an operator
applies is exactly what `helm install -f ci/<overlay>-values.yaml` would
install, and no manifest in deploy/kubernetes is kept by hand.

Run by deploy/validate: `--check` renders to a temporary directory and fails
when the checked-in files differ; `--write` (make deploy-base) rewrites them.
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
KUSTOMIZE = os.path.join(REPO, "deploy", "kubernetes")
# directory under deploy/kubernetes -> the chart's values file it renders
# (None: the chart's defaults).
DIRS = {
    "base": None,
    "overlays/lvm": "ci/lvm-values.yaml",
    "overlays/lvm-snapshots": "ci/lvm-snapshots-values.yaml",
    "overlays/discovery": "ci/discovery-values.yaml",
}
RELEASE, NAMESPACE = "localvol", "localvol"
FILES = ("localvol.yaml", "config.yaml")



def header(values):
    src = f"with {values}" if values else "(default values)"
    return f"""\
# GENERATED from the Helm chart deploy/helm/localvol {src} by
# deploy/tools/render_base.py: do not edit; change the chart, then run
# `make deploy-base`. `make validate-deploy` fails while this file and the
# chart disagree.
"""
# Label lines that say Helm manages the object: wrong for `kubectl apply -k`.
HELM_ONLY_LABELS = ("helm.sh/chart:", "app.kubernetes.io/managed-by: Helm")
CHECKSUM = "checksum/config:"


def split_docs(text):
    """A multi-document YAML text -> the documents' texts (without `---`)."""
    docs, cur = [], []
    for line in text.splitlines():
        if line.rstrip() == "---":
            docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    docs.append("\n".join(cur))
    return [d.strip("\n") for d in docs if yaml.safe_load(d) is not None]


def plain(doc):
    """One rendered document without the Helm-only lines. The comment right
    above the checksum annotation explains it, so it goes with it."""
    out = []
    for line in doc.splitlines():
        s = line.strip()
        if s.startswith(HELM_ONLY_LABELS):
            continue
        if s.startswith(CHECKSUM):
            if out and out[-1].strip().startswith("#"):
                out.pop()
            continue
        out.append(line)
    return "\n".join(out)


def render(rendered, values=None):
    """`helm template` output -> {file name: text} of one directory."""
    objects, config = [], None
    for doc in split_docs(rendered):
        obj = yaml.safe_load(doc)
        if obj.get("kind") == "ConfigMap" and obj["metadata"]["name"] == f"{RELEASE}-config":
            if config is not None:
                raise SystemExit("render_base: two pool ConfigMaps in the render")
            config = obj["data"]["config.yaml"]
            continue
        objects.append(plain(doc))
    if config is None:
        raise SystemExit("render_base: the render has no ConfigMap localvol-config")
    localvol = header(values) + "".join(f"---\n{d}\n" for d in objects)
    for bad in HELM_ONLY_LABELS + (CHECKSUM,):
        if bad in localvol:
            raise SystemExit(f"render_base: {bad!r} is still in the render: teach plain() its new form")
    return {"localvol.yaml": localvol, "config.yaml": header(values) + config.rstrip("\n") + "\n"}


def helm_template(helm, values=None):
    cmd = [helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, "--set", "createNamespace=true"]
    if values:
        cmd += ["-f", os.path.join(CHART, values)]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--helm", required=True)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail if a directory is not the chart's render")
    mode.add_argument("--write", action="store_true", help="rewrite the directories' rendered files")
    a = ap.parse_args()
    bad = 0
    for rel, values in DIRS.items():
        where = os.path.join(KUSTOMIZE, rel)
        files = render(helm_template(a.helm, values), values)
        for name, text in files.items():
            path = os.path.join(where, name)
            if a.write:
                with tempfile.NamedTemporaryFile("w", dir=where, delete=False) as f:
                    f.write(text)
                os.replace(f.name, path)
                print(f"render_base: wrote deploy/kubernetes/{rel}/{name}")
                continue
            have = open(path).read() if os.path.exists(path) else ""
            if have != text:
                bad += 1
                sys.stdout.writelines(difflib.unified_diff(
                    have.splitlines(True), text.splitlines(True),
                    f"deploy/kubernetes/{rel}/{name} (checked in)", f"{name} (rendered from the chart)"))
        # Nothing else is kept by hand: the directory holds its kustomization and the render.
        extra = sorted(set(os.listdir(where)) - set(FILES) - {"kustomization.yaml"})
        if extra and not a.write:
            bad += len(extra)
            print(f"render_base: deploy/kubernetes/{rel} holds files that are not rendered: {', '.join(extra)}")
    if a.write:
        return 0
    if bad:
        print(f"render_base: FAIL {bad} file(s) of deploy/kubernetes differ from the chart's "
              "render: run `make deploy-base` and commit the result")
        return 1
    print(f"render_base: PASS {', '.join(DIRS)} of deploy/kubernetes are the chart's render")
    return 0


if __name__ == "__main__":
    sys.exit(main())
