#!/usr/bin/env python3
"""The checks behind deploy/validate (run that script, not this file).

Input: the rendered kustomize builds and Helm renders that deploy/validate
wrote to --renders (one multi-document YAML file per render, named
kustomize-*.yaml or helm-*.yaml), the raw manifests under deploy/kubernetes,
and the localvol binary: `localvol serve --help` and `controller --help` for
the flags, `localvol config check` for every driver config (the config rules
live in src/config/ only; this script has none of its own) and, with
--storage-class and --snapshot-class, for the parameters of every class of
the driver (CreateVolume's and CreateSnapshot's own decoding,
src/service/classes.rs: no copy of a parameter rule here either).

Its own tests: deploy/tools/test_validate.py.

Every check prints PASS or FAIL; the last line is "N passed, N failed" and the
exit status is 1 when anything failed.
"""

import argparse
import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DRIVER = "localvol.csi.dev"
# Oldest Kubernetes the deployment supports (chart kubeVersion) and the newest
# schemas kubernetes-validate ships.
K8S_VERSIONS = ["1.27", "1.37"]

# ---------------------------------------------------------------------------
# What the sidecars accept and what this deployment requires of them.
#
# Accepted flags: from each sidecar's own documentation for the pinned release
# (README "Command line options" of kubernetes-csi/external-provisioner,
# external-resizer, external-snapshotter, node-driver-registrar;
# klog's -v stays after KEP-2845, csi-provisioner v5.2.0 CHANGELOG adds
# --logging-format; v6.4.0 and csi-resizer v2.3.0 add --automaxprocs). Deprecated flags (--metrics-address, --master, ...) are
# left out on purpose.
SIDECARS = {
    "csi-provisioner": {
        "tag": "v6.4.0",
        "flags": {
            "csi-address", "leader-election", "leader-election-namespace",
            "leader-election-lease-duration", "leader-election-renew-deadline",
            "leader-election-retry-period", "timeout", "retry-interval-start",
            "retry-interval-max", "worker-threads", "kube-api-qps", "kube-api-burst",
            "cloning-protection-threads", "http-endpoint", "metrics-path",
            "extra-create-metadata", "enable-capacity", "capacity-ownerref-level",
            "capacity-threads", "capacity-poll-interval",
            "capacity-for-immediate-binding", "node-deployment",
            "node-deployment-immediate-binding", "node-deployment-base-delay",
            "node-deployment-max-delay", "feature-gates", "strict-topology",
            "immediate-topology", "kubeconfig", "volume-name-prefix",
            "volume-name-uuid-length", "version", "v", "vmodule", "logging-format",
            "automaxprocs", "prevent-volume-mode-conversion", "snapshot-orphan-sweep-interval",
            "enable-pprof",
        },
        "feature_gates": {"Topology", "VolumeAttributesClass"},
        "required": {
            "csi-address": "/csi/csi.sock", "node-deployment": None,
            "feature-gates": "Topology=true", "strict-topology": None,
            "immediate-topology": "false", "enable-capacity": None,
            # 0: the objects are owned by the provisioner's own pod (POD_NAME,
            # NAMESPACE), so they go when a node loses its plugin pod.
            "capacity-ownerref-level": "0", "extra-create-metadata": None,
        },
        "forbidden": {"leader-election"},  # node deployment: every instance works
        "env": {"NODE_NAME": "spec.nodeName", "NAMESPACE": "metadata.namespace",
                "POD_NAME": "metadata.name"},
    },
    "csi-resizer": {
        "tag": "v2.3.0",
        "flags": {
            "csi-address", "leader-election", "leader-election-namespace",
            "leader-election-lease-duration", "leader-election-renew-deadline",
            "leader-election-retry-period", "timeout", "kube-api-burst",
            "kube-api-qps", "retry-interval-start", "retry-interval-max", "workers",
            "http-endpoint", "metrics-path", "handle-volume-inuse-error",
            "feature-gates", "kubeconfig", "version", "v", "automaxprocs",
        },
        "feature_gates": {"AnnotateFsResize", "VolumeAttributesClass", "ReleaseLeaderElectionOnExit"},
        "required": {
            "csi-address": "/csi/csi.sock", "leader-election": None,
            "handle-volume-inuse-error": "false",
        },
        "forbidden": set(),
        "env": {},
    },
    "csi-snapshotter": {
        "tag": "v8.2.0",
        "flags": {
            "csi-address", "leader-election", "leader-election-namespace",
            "leader-election-lease-duration", "leader-election-renew-deadline",
            "leader-election-retry-period", "kube-api-qps", "kube-api-burst",
            "timeout", "snapshot-name-prefix", "snapshot-name-uuid-length",
            "worker-threads", "node-deployment", "retry-interval-start",
            "retry-interval-max", "feature-gates", "kubeconfig", "resync-period",
            "version", "http-endpoint", "metrics-path", "v",
        },
        "feature_gates": {"CSIVolumeGroupSnapshot"},
        "required": {"csi-address": "/csi/csi.sock", "node-deployment": None},
        "forbidden": {"leader-election"},
        "env": {"NODE_NAME": "spec.nodeName"},
    },
    "csi-node-driver-registrar": {
        "tag": "v2.13.0",
        "flags": {"csi-address", "kubelet-registration-path", "http-endpoint",
                  "timeout", "mode", "enable-pprof", "v"},
        "feature_gates": set(),
        "required": {"csi-address": "/csi/csi.sock", "kubelet-registration-path": None},
        "forbidden": set(),
        "env": {},
    },
}

# What each pinned sidecar's own RBAC grants upstream, per release:
# (kind, apiGroup, resource) -> verbs. Written down from
# kubernetes-csi/external-provisioner deploy/kubernetes/rbac.yaml,
# external-resizer deploy/kubernetes/rbac.yaml and external-snapshotter
# deploy/kubernetes/csi-snapshotter/rbac-csi-snapshotter.yaml (rules that are
# commented out there, such as secrets, are not grants). node-driver-registrar
# does not call the API server. A sidecar tag that is not the
# one written here fails the check: bump the table with the image.
UPSTREAM_RBAC = {
    "csi-provisioner": ("v6.4.0", "provisioner", {
        ("ClusterRole", "", "persistentvolumes"): {"get", "list", "watch", "create", "patch", "delete"},
        ("ClusterRole", "", "persistentvolumeclaims"): {"get", "list", "watch", "update"},
        ("ClusterRole", "storage.k8s.io", "storageclasses"): {"get", "list", "watch"},
        ("ClusterRole", "", "events"): {"list", "watch", "create", "update", "patch"},
        ("ClusterRole", "snapshot.storage.k8s.io", "volumesnapshots"): {"get", "list", "watch", "update"},
        ("ClusterRole", "snapshot.storage.k8s.io", "volumesnapshotcontents"): {"get", "list"},
        ("ClusterRole", "storage.k8s.io", "csinodes"): {"get", "list", "watch"},
        ("ClusterRole", "", "nodes"): {"get", "list", "watch"},
        ("ClusterRole", "storage.k8s.io", "volumeattachments"): {"get", "list", "watch"},
        ("Role", "coordination.k8s.io", "leases"): {"get", "watch", "list", "delete", "update", "create"},
        ("Role", "storage.k8s.io", "csistoragecapacities"): {"get", "list", "watch", "create", "update", "patch", "delete"},
        ("Role", "", "pods"): {"get"},
        ("Role", "apps", "replicasets"): {"get"},
    }),
    "csi-resizer": ("v2.3.0", "resizer", {
        ("ClusterRole", "", "persistentvolumes"): {"get", "list", "watch", "patch"},
        ("ClusterRole", "", "persistentvolumeclaims"): {"get", "list", "watch"},
        ("ClusterRole", "", "pods"): {"get", "list", "watch"},
        ("ClusterRole", "", "persistentvolumeclaims/status"): {"patch"},
        ("ClusterRole", "", "events"): {"list", "watch", "create", "update", "patch"},
        ("ClusterRole", "storage.k8s.io", "volumeattributesclasses"): {"get", "list", "watch"},
        ("Role", "coordination.k8s.io", "leases"): {"get", "watch", "list", "delete", "update", "create"},
    }),
    "csi-snapshotter": ("v8.2.0", "snapshotter", {
        ("ClusterRole", "", "events"): {"list", "watch", "create", "update", "patch"},
        ("ClusterRole", "snapshot.storage.k8s.io", "volumesnapshotclasses"): {"get", "list", "watch"},
        ("ClusterRole", "snapshot.storage.k8s.io", "volumesnapshotcontents"): {"create", "get", "list", "watch", "update", "patch"},
        ("ClusterRole", "snapshot.storage.k8s.io", "volumesnapshotcontents/status"): {"update", "patch"},
        ("ClusterRole", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses"): {"get", "list", "watch"},
        ("ClusterRole", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents"): {"get", "list", "watch", "update", "patch"},
        ("ClusterRole", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status"): {"update", "patch"},
        ("Role", "coordination.k8s.io", "leases"): {"get", "watch", "list", "delete", "update", "create"},
    }),
}
# Upstream grants this deployment leaves out, each because the sidecar, as
# run here, never makes that call (deploy/README.md, "RBAC"): (sidecar, kind,
# apiGroup, resource) -> (verbs left out, None for all; why).
NOT_GRANTED = {
    ("csi-provisioner", "ClusterRole", "storage.k8s.io", "volumeattachments"):
        (None, "watched only for drivers with PUBLISH_UNPUBLISH_VOLUME; localvol attaches nothing"),
    ("csi-provisioner", "Role", "coordination.k8s.io", "leases"):
        (None, "no leader election with --node-deployment"),
    ("csi-provisioner", "Role", "apps", "replicasets"):
        (None, "only for --capacity-ownerref-level=2 (a Deployment); level 0 reads the pod alone"),
    ("csi-resizer", "ClusterRole", "", "pods"):
        (None, "watched only with --handle-volume-inuse-error=true"),
    ("csi-snapshotter", "ClusterRole", "snapshot.storage.k8s.io", "volumesnapshotcontents"):
        ({"create"}, "the sidecar created contents only for group-snapshot members (the "
                     "CSIVolumeGroupSnapshot gate, off here); since v8.2.0 the snapshot-controller does"),
    ("csi-snapshotter", "ClusterRole", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses"):
        (None, "only with --feature-gates=CSIVolumeGroupSnapshot=true"),
    ("csi-snapshotter", "ClusterRole", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents"):
        (None, "only with --feature-gates=CSIVolumeGroupSnapshot=true"),
    ("csi-snapshotter", "ClusterRole", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status"):
        (None, "only with --feature-gates=CSIVolumeGroupSnapshot=true"),
    ("csi-snapshotter", "Role", "coordination.k8s.io", "leases"):
        (None, "no leader election with --node-deployment"),
}


# Grants upstream's rbac.yaml lacks although the sidecar, as run here, makes
# the call: (sidecar, kind, apiGroup, resource) -> (verbs, where it is made).
ADDED = {
    ("csi-provisioner", "ClusterRole", "storage.k8s.io", "volumeattributesclasses"):
        ({"get"}, "pkg/controller/controller.go: StorageV1().VolumeAttributesClasses().Get of a "
                  "claim's class at CreateVolume (VolumeAttributesClass, GA and on in v6)"),
}


def sidecar_rbac():
    """(kind, role) -> {(apiGroup, resource): verbs}: upstream minus NOT_GRANTED, plus ADDED."""
    out = {}
    for sidecar, (_, role, rules) in UPSTREAM_RBAC.items():
        for (kind, group, resource), verbs in rules.items():
            drop = NOT_GRANTED.get((sidecar, kind, group, resource))
            keep = set(verbs) if drop is None else (set() if drop[0] is None else set(verbs) - drop[0])
            if keep:
                out.setdefault((kind, role), {})[(group, resource)] = keep
    for key in NOT_GRANTED:
        if (key[1], key[2], key[3]) not in UPSTREAM_RBAC[key[0]][2]:
            raise SystemExit(f"validate.py: NOT_GRANTED {key} is not an upstream rule")
    for (sidecar, kind, group, resource), (verbs, _) in ADDED.items():
        if (kind, group, resource) in UPSTREAM_RBAC[sidecar][2]:
            raise SystemExit(f"validate.py: ADDED {(sidecar, kind, group, resource)} is an upstream rule")
        role = UPSTREAM_RBAC[sidecar][1]
        out.setdefault((kind, role), {}).setdefault((group, resource), set()).update(verbs)
    return out


RBAC = sidecar_rbac()

# localvol's own roles (controller, discovery, expansion, attributes,
# storage): the RBAC needs its components' kube clients showed the fake API
# server in the unit tests (src/k8s/fake/needs.rs), written to
# deploy/rbac-needs.txt by `make rbac-needs`: one line per role, ClusterRole
# or Role (the release namespace), apiGroup ("core" for ""), resource and verb.
NEEDS_FILE = os.path.join(REPO, "deploy", "rbac-needs.txt")


def read_needs(text):
    """(kind, role) -> {(apiGroup, resource): verbs} from the record's text,
    and the lines it could not read (each a failure)."""
    out, bad = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 5 or fields[1] not in ("ClusterRole", "Role"):
            bad.append(f"line {n}: {line!r}")
            continue
        role, kind, group, resource, verb = fields
        group = "" if group == "core" else group
        out.setdefault((kind, role), {}).setdefault((group, resource), set()).add(verb)
    return out, bad


with open(NEEDS_FILE) as f:
    CODE_RBAC, CODE_RBAC_UNKNOWN = read_needs(f.read())
RBAC.update(CODE_RBAC)

# Which role a sidecar container needs.
ROLE_OF_SIDECAR = {"csi-provisioner": "provisioner", "csi-resizer": "resizer",
                   "csi-snapshotter": "snapshotter"}

# VolumeSnapshotClass is a CRD, not in the Kubernetes OpenAPI: its schema from
# kubernetes-csi/external-snapshotter client/config/crd/
# snapshot.storage.k8s.io_volumesnapshotclasses.yaml (v1).
VSC_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "driver", "deletionPolicy"],
    "properties": {
        "apiVersion": {"const": "snapshot.storage.k8s.io/v1"},
        "kind": {"const": "VolumeSnapshotClass"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "driver": {"type": "string"},
        "deletionPolicy": {"enum": ["Delete", "Retain"]},
        "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

# /sys/fs/cgroup: the node's cgroup v2 tree, where LVM volumes' IO limits go.
LVM_HOST_PATHS = ["/dev", "/etc/lvm", "/run/lvm", "/run/lock/lvm", "/run/udev", "/sys/fs/cgroup"]
# kubelet's probes judge liveness, not latency (a loaded node once
# restarted containers whose probes gave up after one slow answer): every
# probe needs MIN_FAILURES failures in a row spanning MIN_FAILURE_SECONDS, a
# livenessProbe LIVENESS_MIN_SECONDS (at load 70 on 2 vCPUs every probe on the
# node went unanswered for 60-90 s at a time), and a container with a
# livenessProbe a startupProbe for its start.
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
MIN_FAILURES, MIN_FAILURE_SECONDS, LIVENESS_MIN_SECONDS = 3, 60, 180
# Kubernetes' defaults of the fields a probe leaves out.
PROBE_DEFAULTS = {"periodSeconds": 10, "failureThreshold": 3}
# client-go leaderelection.JitterFactor: NewLeaderElector refuses a
# renewDeadline not above it times retryPeriod.
LE_JITTER = 1.2


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.missing_driver_flags = {}   # flag -> set of renders
        self.block_only = set()          # renders: Block discovery, no LVM pool

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
            print(f"  PASS {what}")
        else:
            self.failed += 1
            print(f"  FAIL {what}" + (f": {detail}" if detail else ""))
        return ok

    def section(self, title):
        print(f"\n== {title}")


R = Report()


# ---------------------------------------------------------------------------
# Helpers

def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def parse_flag(arg):
    """'--a=b' -> ('a', 'b'); '--a' -> ('a', None); anything else -> None."""
    m = re.match(r"^--?([a-zA-Z0-9][a-zA-Z0-9-]*)(?:=(.*))?$", arg, re.S)
    if not m:
        return None
    return m.group(1), m.group(2)


def serve_help(binary, sub="serve"):
    """Flags, env names and possible values of `localvol <sub> --help`."""
    text = subprocess.run([binary, sub, "--help"], check=True,
                          capture_output=True, text=True).stdout
    flags, envs, values = set(), set(), {}
    flag = None   # clap puts long help on the lines after the flag
    for line in text.splitlines():
        m = re.match(r"^\s+(?:-\w, )?--([a-z0-9-]+)", line)
        if m:
            flag = m.group(1)
            flags.add(flag)
        elif flag is None or not line.startswith(" "):
            flag = None
            continue
        for e in re.findall(r"\[env: ([A-Z0-9_]+)=", line):
            envs.add(e)
        pv = re.search(r"\[possible values: ([^\]]+)\]", line)
        if pv:
            values[flag] = {v.strip() for v in pv.group(1).split(",")}
    return text, flags, envs, values


def log_env(help_text):
    """RUST_LOG when the --help text says the command reads it (the log
    filter: tracing's EnvFilter, not a clap argument, so no [env: ...])."""
    return {"RUST_LOG"} if re.search(r"\bRUST_LOG\b", help_text) else set()


def addr_port(addr):
    """The port of a listen address such as ':9809' or '[::]:9809', or None."""
    try:
        return int((addr or "").rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def go_duration(text):
    """Seconds of a Go duration such as '137s' or '2m17s', or None."""
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def image_parts(image):
    repo, _, tag = image.rpartition(":")
    if "/" in tag or not repo:
        return image, ""
    return repo, tag


def strip_hash(name):
    """kustomize's configMapGenerator suffix: localvol-config-447tkdtt5c."""
    return re.sub(r"-[a-z0-9]{10}$", "", name)


# ---------------------------------------------------------------------------
# Checks on one render (a list of documents)

def check_schemas(render, docs):
    bad = []
    for d in docs:
        kind, name = d.get("kind"), d.get("metadata", {}).get("name")
        if kind == "VolumeSnapshotClass":
            try:
                jsonschema.validate(d, VSC_SCHEMA)
            except jsonschema.ValidationError as e:
                bad.append(f"{kind}/{name}: {e.message}")
            continue
        for v in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(d, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                bad.append(f"{kind}/{name} (k8s {v}) at {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                bad.append(f"{kind}/{name} (k8s {v}): {e.message}")
    R.check(not bad, f"{render}: {len(docs)} objects valid against the Kubernetes "
            f"{' and '.join(K8S_VERSIONS)} OpenAPI schemas (strict)", "; ".join(bad[:8]))


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def container_mounts(pod, container):
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    return [(m, vols.get(m["name"])) for m in container.get("volumeMounts", [])]


def config_check(binary, render, text):
    """`localvol config check` on a config the render ships: the driver's own
    parsing and validation (src/config/), the same `localvol serve --config`
    applies at start. Returns whether it passed."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"{render}-") as f:
        f.write(text)
        f.flush()
        r = subprocess.run([binary, "config", "check", f.name], capture_output=True, text=True)
    out = (r.stdout.strip() or r.stderr.strip()).replace(f.name, "config.yaml")
    return R.check(r.returncode == 0, f"{render}: `localvol config check` accepts its config.yaml"
                   + (f" ({out.split(': ok, ', 1)[-1]})" if r.returncode == 0 else ""), out)


CLASS_LINE = re.compile(r"(StorageClass|VolumeSnapshotClass) (\S+): (?:ok, .*|refused: (.*))$")


def class_check(binary, render_path, cfg_text):
    """`localvol config check --storage-class --snapshot-class` on a render:
    its classes of DRIVER decoded as CreateVolume and CreateSnapshot decode
    them, on the pools of the render's config (src/service/classes.rs; this
    script has no parameter rules of its own). Returns ({(kind, name):
    problems} for each class the binary checked, None), or (None, why) when
    it could not check them."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="config-") as f:
        f.write(cfg_text)
        f.flush()
        r = subprocess.run([binary, "config", "check", f.name, "--driver-name", DRIVER,
                            "--storage-class", render_path, "--snapshot-class", render_path],
                           capture_output=True, text=True)
    if r.returncode not in (0, 1):   # 2: clap's usage error, e.g. a binary without the flags
        raise SystemExit(f"validate.py: {binary} config check --storage-class: exit "
                         f"{r.returncode}: {r.stderr.strip()}")
    verdicts = {}
    for line in r.stdout.splitlines():
        m = CLASS_LINE.match(line[len(render_path) + 2:]) if line.startswith(render_path + ": ") else None
        if m:
            problems = verdicts.setdefault((m[1], m[2]), [])
            if m[3] is not None:
                problems.append(m[3])
    if r.returncode == 1 and not any(verdicts.values()):
        return None, r.stderr.strip() or r.stdout.strip()
    return verdicts, None


def check_pool_mounts(render, cfg, pod, localvol):
    """What the pods must mount for the pools of a config the driver accepted:
    each dir pool's path (a hostPath at the same path; a pool with a device:
    Bidirectional, and the host's /dev), and for LVM pools hostIPC and lvm's
    host paths. Returns the pools by name."""
    pools = [p for p in cfg.get("pools") or [] if isinstance(p, dict)]
    problems = []
    mounts = container_mounts(pod, localvol) if localvol else []
    for p in pools:
        n, path = p.get("name"), str(p.get("path", ""))
        if p.get("type") != "dir" or not localvol:
            continue
        covering = [(m, v) for m, v in mounts
                    if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
        host = [(m, v) for m, v in covering if v and "hostPath" in v
                and v["hostPath"]["path"].rstrip("/") == m["mountPath"].rstrip("/")]
        if not host:
            problems.append(f"pool {n}: {path} is not below a hostPath mounted at the same path")
        if p.get("device") is not None:
            # The driver mounts the disk at path: that mount must reach the
            # host (and outlive the container), and /dev be the host's.
            own = [m for m, v in mounts if m["mountPath"].rstrip("/") == path.rstrip("/")
                   and v and "hostPath" in v]
            if not own or own[0].get("mountPropagation") != "Bidirectional":
                problems.append(f"pool {n}: a pool with a device needs its path as a "
                                "hostPath mounted with mountPropagation: Bidirectional")
            if not any(m["mountPath"] == "/dev" for m, v in mounts):
                problems.append(f"pool {n}: a pool with a device needs the host's /dev")
    R.check(not problems, f"{render}: the pods mount what the pools use "
            f"({len(pools)} pools: {', '.join(str(p.get('name')) for p in pools)})", "; ".join(problems))
    if localvol and any(p.get("type") == "lvm" for p in pools):
        have = {m["mountPath"]: v for m, v in mounts}
        miss = [h for h in LVM_HOST_PATHS
                if not (h in have and have[h] and have[h].get("hostPath", {}).get("path") == h)]
        R.check(pod.get("hostIPC") is True and not miss,
                f"{render}: LVM pools get hostIPC and the host's {', '.join(LVM_HOST_PATHS)}",
                f"hostIPC={pod.get('hostIPC')}, missing {miss}")
    return {p.get("name"): p for p in pools}


def check_discovery(render, cfg, pod, localvol):
    """The mounts `discovery:` of a config the driver accepted needs: its
    stateDir and each class's hostDir at the same path (with propagation), the
    host's /dev for Block classes, never the host's root. Returns the
    discovery StorageClass names."""
    mounts = container_mounts(pod, localvol) if localvol else []
    host_root = [m["mountPath"] for m, v in mounts
                 if v and "hostPath" in v and v["hostPath"].get("path", "").rstrip("/") == ""]
    R.check(not host_root, f"{render}: the host's root is not mounted into localvol "
            "(a second view of the disks makes cleanup refuse)", f"mounted at {host_root}")
    d = cfg.get("discovery")
    if not isinstance(d, dict):
        return set()
    problems = []

    def host_mount(path, props):
        """The hostPath mount covering path at the same path, with one of props."""
        for m, v in mounts:
            mp = m["mountPath"].rstrip("/")
            if (path.rstrip("/") == mp or path.startswith(mp + "/")) and v and "hostPath" in v \
                    and v["hostPath"]["path"].rstrip("/") == mp:
                return m.get("mountPropagation") in props
        return None
    state = d.get("stateDir", "/var/lib/localvol/state")
    if localvol and not host_mount(state, {"HostToContainer", "Bidirectional", None}):
        problems.append(f"stateDir {state} is not below a hostPath mounted at the same path")
    classes = [c for c in d.get("classes") or [] if isinstance(c, dict)]
    names = {c.get("storageClass") for c in classes}
    for c in classes:
        tag, hd = f"class {c.get('storageClass')}", str(c.get("hostDir"))
        if localvol:
            ok = host_mount(hd, {"HostToContainer", "Bidirectional"})
            if ok is None:
                problems.append(f"{tag}: hostDir {hd} is not below a hostPath mounted at the same path")
            elif not ok:
                problems.append(f"{tag}: hostDir {hd} mounted without HostToContainer/Bidirectional propagation")
    R.check(not problems, f"{render}: discovery's stateDir and "
            f"hostDirs are mounted at the same path with propagation ({len(classes)} classes)",
            "; ".join(problems))
    block = sorted(str(c.get("storageClass")) for c in classes
                   if isinstance(c, dict) and c.get("volumeMode") == "Block")
    if block and localvol:
        # A Block class's entries are device nodes or links into the host's
        # /dev (/dev/disk/by-id/...): the container's own /dev has neither the
        # links nor disks added after it started.
        dev = [v["hostPath"].get("path") for m, v in mounts
               if m["mountPath"].rstrip("/") == "/dev" and v and "hostPath" in v]
        R.check(dev == ["/dev"], f"{render}: Block discovery classes ({', '.join(block)}) "
                "get the host's /dev at /dev", f"/dev mounts from host paths {dev}")
    return {n for n in names if n}


def check_controller(render, docs, chelp):
    """The node-loss controller Deployment against `localvol controller --help`."""
    deps = by_kind(docs, "Deployment")
    R.check(len(deps) <= 1, f"{render}: at most one Deployment (the controller)")
    if not deps:
        return None
    dep = deps[0]
    _, flags, envs, values = chelp
    pod = dep["spec"]["template"]["spec"]
    cs = pod["containers"]
    c = cs[0]
    R.check(len(cs) == 1 and c.get("args", [None])[0] == "controller",
            f"{render}: Deployment {dep['metadata']['name']} runs `localvol controller` alone")
    R.check(1 <= dep["spec"].get("replicas", 1) <= 2,
            f"{render}: controller replicas {dep['spec'].get('replicas', 1)} in 1..2")
    given, unknown, badval, malformed = {}, [], [], []
    for a in c.get("args", [])[1:]:
        pf = parse_flag(a)
        if pf is None or pf[1] is None or not a.startswith("--"):
            malformed.append(a)
            continue
        given[pf[0]] = pf[1]
        if pf[0] not in flags:
            unknown.append("--" + pf[0])
            R.missing_driver_flags.setdefault("--" + pf[0], set()).add(render + " (controller)")
        elif pf[0] in values and pf[1] not in values[pf[0]]:
            badval.append(a)
    R.check(not malformed and not unknown and not badval,
            f"{render}: every controller flag is accepted by `localvol controller --help`",
            f"malformed {malformed}, not accepted {unknown}, bad values {badval}")
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c.get("env", [])}
    accepted = set(envs) | log_env(chelp[0])
    R.check(set(env) <= accepted, f"{render}: every controller env name is read ({', '.join(env)})",
            f"not read: {sorted(set(env) - accepted)}")
    refs = set(re.findall(r"\$\((\w+)\)", " ".join(c.get("args", []))))
    want_env = {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    R.check(all(env.get(k) == v for k, v in want_env.items()) and refs <= set(env)
            and given.get("lease-namespace") in ("$(POD_NAMESPACE)", None)
            and given.get("identity") in ("$(POD_NAME)", None)
            and "node-loss-grace" in given,
            f"{render}: controller leader-elects in its namespace as its pod "
            "(POD_NAMESPACE, POD_NAME from the downward API) with --node-loss-grace",
            f"env {env}, args {given}")
    psc, sc = pod.get("securityContext", {}), c.get("securityContext", {})
    uid = sc.get("runAsUser", psc.get("runAsUser"))
    ok = (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True and isinstance(uid, int) and uid > 0
          and sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
          and not sc.get("privileged") and "ALL" in sc.get("capabilities", {}).get("drop", [])
          and not sc.get("capabilities", {}).get("add")
          and not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
          and not any("hostPath" in v for v in pod.get("volumes", [])))
    R.check(ok, f"{render}: controller runs as non-root uid {uid}, read-only root, no privileges, no host access",
            json.dumps({"pod": psc, "container": sc}))
    return dep


def check_localvol(render, ds, docs, help_info):
    _, flags, envs, values = help_info
    pod = ds["spec"]["template"]["spec"]
    c = next((c for c in pod["containers"] if c["name"] == "localvol"), None)
    if not R.check(c is not None, f"{render}: DaemonSet has a localvol container"):
        return None, None, None
    args = c.get("args", [])
    R.check(bool(args) and args[0] == "serve", f"{render}: localvol runs `serve`",
            f"args start with {args[:1]}")
    given = {}
    unknown, malformed, badval = [], [], []
    for a in args[1:]:
        pf = parse_flag(a)
        if pf is None or pf[1] is None or not a.startswith("--"):
            malformed.append(a)
            continue
        k, v = pf
        given[k] = v
        if k not in flags:
            unknown.append("--" + k)
            R.missing_driver_flags.setdefault("--" + k, set()).add(render)
        elif k in values and v not in values[k]:
            badval.append(f"--{k}={v} (possible: {sorted(values[k])})")
    R.check(not malformed, f"{render}: localvol args are --flag=value", ", ".join(malformed))
    R.check(not unknown, f"{render}: every localvol flag is accepted by `localvol serve --help`",
            "not accepted: " + ", ".join(unknown))
    R.check(not badval, f"{render}: localvol flag values are among the possible values", "; ".join(badval))
    env_names = [e["name"] for e in c.get("env", [])]
    accepted_env = set(envs) | log_env(help_info[0])
    R.check(set(env_names) <= accepted_env,
            f"{render}: every localvol env name is read by the driver ({', '.join(env_names)})",
            f"not read: {sorted(set(env_names) - accepted_env)}; accepted: {sorted(accepted_env)}")
    refs = set(re.findall(r"\$\((\w+)\)", " ".join(args)))
    R.check(refs <= set(env_names), f"{render}: $(VAR) references in localvol args are defined",
            f"undefined: {sorted(refs - set(env_names))}")
    R.check(c.get("securityContext", {}).get("privileged") is True,
            f"{render}: localvol container is privileged")
    mounts = container_mounts(pod, c)
    by_path = {m["mountPath"].rstrip("/"): (m, v) for m, v in mounts}
    # Endpoint and socket directory.
    ep = given.get("endpoint", "")
    sock = ep[len("unix://"):] if ep.startswith("unix://") else None
    sock_dir = os.path.dirname(sock) if sock else None
    R.check(sock_dir in by_path, f"{render}: --endpoint {ep} is in a mounted socket directory")
    socket_vol = by_path.get(sock_dir, (None, None))[0]
    # kubelet directory.
    kdir = (given.get("kubelet-dir") or "/var/lib/kubelet").rstrip("/")
    km = by_path.get(kdir)
    R.check(km is not None and km[0].get("mountPropagation") == "Bidirectional"
            and km[1] and km[1].get("hostPath", {}).get("path", "").rstrip("/") == kdir,
            f"{render}: --kubelet-dir {kdir} is the host's, mounted with Bidirectional propagation")
    # Config file from a ConfigMap.
    cfg_path = given.get("config")
    cfg = None
    cm_mount = by_path.get(os.path.dirname(cfg_path or "").rstrip("/"))
    if R.check(cfg_path is not None and cm_mount is not None and cm_mount[1]
               and "configMap" in cm_mount[1],
               f"{render}: --config {cfg_path} comes from a mounted ConfigMap"):
        cm_name = cm_mount[1]["configMap"]["name"]
        ns = ds["metadata"].get("namespace")
        cm = next((d for d in by_kind(docs, "ConfigMap")
                   if d["metadata"]["name"] == cm_name and d["metadata"].get("namespace") == ns), None)
        key = os.path.basename(cfg_path)
        if R.check(cm is not None and key in cm.get("data", {}),
                   f"{render}: ConfigMap {cm_name} holds {key}"):
            cfg = cm["data"][key]
    # Metrics address and probes.
    maddr = given.get("metrics-addr")
    if maddr is not None:
        port = addr_port(maddr)
        rp = c.get("readinessProbe", {})
        R.check(container_port(c, "metrics") == port and probe_port(c, "readinessProbe") == port
                and rp.get("httpGet", {}).get("path") == "/readyz",
                f"{render}: metrics port {port} is the container port 'metrics' and "
                f"serves the readiness probe (/readyz)")
    R.check(not liveness_problems(c, given), f"{render}: localvol's startup and liveness probes ask "
            f"/healthz on its --liveness-addr ({given.get('liveness-addr')}), not the metrics port",
            "; ".join(liveness_problems(c, given)))
    return c, cfg, socket_vol


def container_port(c, port):
    """A probe's port as a number: a named port is looked up in c's ports."""
    if isinstance(port, str):
        return next((p["containerPort"] for p in c.get("ports", []) if p.get("name") == port), None)
    return port


def probe_port(c, probe):
    return container_port(c, ((c.get(probe) or {}).get("httpGet") or {}).get("port"))


def liveness_problems(c, given):
    """The localvol container's liveness is its own --liveness-addr (a thread
    of its own that fails only when the driver is dead), never the metrics
    port, whose /healthz answers as long as the process runs. given: its
    flags."""
    lport, mport = addr_port(given.get("liveness-addr")), addr_port(given.get("metrics-addr"))
    out = []
    if lport is None:
        out.append(f"--liveness-addr {given.get('liveness-addr')!r} names no port")
    elif lport == mport:
        out.append(f"--liveness-addr is the metrics port {mport}")
    for probe in ("startupProbe", "livenessProbe"):
        hg = (c.get(probe) or {}).get("httpGet") or {}
        if lport is None or hg.get("path") != "/healthz" or probe_port(c, probe) != lport:
            out.append(f"{probe} asks {hg.get('path')} on port {hg.get('port')}")
    return out


def probe_problems(container):
    """What one container's probes break of the rules above."""
    out = []
    for kind in PROBES:
        p = container.get(kind)
        if p is None:
            continue
        period = p.get("periodSeconds", PROBE_DEFAULTS["periodSeconds"])
        failures = p.get("failureThreshold", PROBE_DEFAULTS["failureThreshold"])
        if failures < MIN_FAILURES:
            out.append(f"{kind} failureThreshold {failures} < {MIN_FAILURES}")
        least = LIVENESS_MIN_SECONDS if kind == "livenessProbe" else MIN_FAILURE_SECONDS
        if failures * period < least:
            out.append(f"{kind} failureThreshold x periodSeconds {failures} x {period} "
                       f"< {least} s")
    if container.get("livenessProbe") is not None and container.get("startupProbe") is None:
        out.append("livenessProbe without a startupProbe")
    return out


def check_probes(render, what, pod):
    """Every probe of every container of a pod template against the rules above."""
    cs = pod.get("initContainers", []) + pod.get("containers", [])
    bad = [f"{c['name']}: {p}" for c in cs for p in probe_problems(c)]
    n = sum(1 for c in cs for k in PROBES if c.get(k) is not None)
    R.check(not bad, f"{render}: {what}'s {n} probes need {MIN_FAILURES}+ failures in a row over "
            f"{MIN_FAILURE_SECONDS}+ s ({LIVENESS_MIN_SECONDS}+ s for liveness), and a "
            f"livenessProbe a startupProbe", "; ".join(bad))


def leader_election_problems(given):
    """What client-go's NewLeaderElector refuses (and the sidecar exits on)
    in a sidecar's --leader-election-* flags; upstream's defaults (15s, 10s,
    5s) where one is left out."""
    t = {k: given.get(f"leader-election-{k}") or d for k, d in
         (("lease-duration", "15s"), ("renew-deadline", "10s"), ("retry-period", "5s"))}
    lease, renew, retry = (go_duration(t[k]) for k in ("lease-duration", "renew-deadline", "retry-period"))
    if None in (lease, renew, retry):
        return [f"not Go durations: {t}"]
    out = []
    if not lease > renew:
        out.append(f"lease-duration {t['lease-duration']} is not above renew-deadline {t['renew-deadline']}")
    if not renew > LE_JITTER * retry:
        out.append(f"renew-deadline {t['renew-deadline']} is not above {LE_JITTER} x "
                   f"retry-period {t['retry-period']}")
    return out


def check_sidecars(render, ds, socket_vol, kubelet_dir):
    pod = ds["spec"]["template"]["spec"]
    seen = {}
    for c in pod["containers"]:
        if c["name"] == "localvol":
            continue
        repo, tag = image_parts(c["image"])
        name = repo.rsplit("/", 1)[-1]
        spec = SIDECARS.get(name)
        if not R.check(spec is not None and repo == f"registry.k8s.io/sig-storage/{name}",
                       f"{render}: container {c['name']} is a known sidecar image", c["image"]):
            continue
        seen[name] = c
        R.check(tag == spec["tag"], f"{render}: {name} pinned to {spec['tag']}", f"tag {tag!r}")
        given, bad = {}, []
        for a in c.get("args", []):
            pf = parse_flag(a)
            if pf is None:
                bad.append(a)
                continue
            given[pf[0]] = pf[1]
            if pf[0] not in spec["flags"]:
                bad.append(a)
        gates = [g.split("=")[0] for g in (given.get("feature-gates") or "").split(",") if g]
        bad += [f"feature gate {g}" for g in gates if g not in spec["feature_gates"]]
        R.check(not bad, f"{render}: {name} flags are documented for {spec['tag']}", ", ".join(bad))
        def has(k, v):
            if k not in given:
                return False
            if v is None:
                return True
            if k == "feature-gates":  # the required gates among others
                return set(v.split(",")) <= set((given[k] or "").split(","))
            return given[k] == v
        miss = [f"--{k}" + (f"={v}" if v else "") for k, v in spec["required"].items()
                if not has(k, v)]
        miss += [f"no --{k}" for k in spec["forbidden"] if k in given]
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
               for e in c.get("env", [])}
        miss += [f"env {k} from {v}" for k, v in spec["env"].items() if env.get(k) != v]
        refs = set(re.findall(r"\$\((\w+)\)", " ".join(c.get("args", []))))
        miss += [f"env {r} (referenced)" for r in refs if r not in env]
        if socket_vol:
            vm = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
            if vm.get(socket_vol["name"]) != socket_vol["mountPath"]:
                miss.append(f"socket volume {socket_vol['name']} at {socket_vol['mountPath']}")
        R.check(not miss, f"{render}: {name} has what this deployment needs", ", ".join(miss))
        if name == "csi-node-driver-registrar":
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            want = f"{kubelet_dir}/plugins/{DRIVER}/csi.sock"
            sockhost = vols.get(socket_vol["name"], {}).get("hostPath", {}).get("path") if socket_vol else None
            reg = [vols.get(m["name"], {}).get("hostPath", {}).get("path")
                   for m in c.get("volumeMounts", []) if m["mountPath"] == "/registration"]
            R.check(given.get("kubelet-registration-path") == want
                    and sockhost == os.path.dirname(want)
                    and reg == [f"{kubelet_dir}/plugins_registry"],
                    f"{render}: registrar registers {want} (the socket directory's host path) "
                    f"through {kubelet_dir}/plugins_registry",
                    f"path={given.get('kubelet-registration-path')}, socket dir={sockhost}, registration={reg}")
        if name == "csi-resizer" and "leader-election" in given:
            R.check(not leader_election_problems(given),
                    f"{render}: csi-resizer's leader-election timings are ones client-go accepts "
                    f"(lease-duration > renew-deadline > {LE_JITTER} x retry-period)",
                    "; ".join(leader_election_problems(given)))
    if socket_vol:
        # On SELinux nodes the privileged driver runs as spc_t and its socket
        # is out of reach of a confined (container_t) sidecar: every
        # unprivileged container on the socket runs as spc_t too.
        bad = [c["name"] for c in pod["containers"]
               if any(m["name"] == socket_vol["name"] for m in c.get("volumeMounts", []))
               and not (c.get("securityContext") or {}).get("privileged")
               and ((c.get("securityContext") or {}).get("seLinuxOptions") or {}).get("type") != "spc_t"]
        R.check(not bad, f"{render}: every unprivileged container on the socket runs as SELinux "
                "type spc_t", f"not: {', '.join(bad)}")
    for required in ("csi-provisioner", "csi-resizer", "csi-node-driver-registrar"):
        R.check(required in seen, f"{render}: DaemonSet runs {required}")
    ports = [p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])]
    R.check(len(ports) == len(set(ports)), f"{render}: container ports are distinct ({sorted(ports)})")
    return seen


def check_rbac(render, docs, ds, sidecars, api_user=False, controller=None, lvm=False, orphans=False):
    sa = ds["spec"]["template"]["spec"].get("serviceAccountName")
    ns = ds["metadata"].get("namespace")
    R.check(any(d["metadata"]["name"] == sa and d["metadata"].get("namespace") == ns
                for d in by_kind(docs, "ServiceAccount")),
            f"{render}: ServiceAccount {ns}/{sa} exists")
    csa = None
    if controller is not None:
        csa = controller["spec"]["template"]["spec"].get("serviceAccountName")
        R.check(csa != sa and controller["metadata"].get("namespace") == ns and any(
                    d["metadata"]["name"] == csa and d["metadata"].get("namespace") == ns
                    for d in by_kind(docs, "ServiceAccount")),
                f"{render}: the controller has its own ServiceAccount {ns}/{csa}")
    roles = {}
    for d in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        m = re.search(r"-(provisioner|resizer|snapshotter|controller|discovery|expansion|attributes|storage)$", d["metadata"]["name"])
        if not R.check(m is not None, f"{render}: {d['kind']} {d['metadata']['name']} is a known role"):
            continue
        key = (d["kind"], m.group(1))
        roles[key] = d
        got = {}
        for rule in d.get("rules", []):
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    got.setdefault((g, r), set()).update(rule.get("verbs", []))
        want = RBAC.get(key, {})
        diff = []
        for gr in sorted(set(got) | set(want)):
            if got.get(gr, set()) != want.get(gr, set()):
                diff.append(f"{gr[0] or 'core'}/{gr[1]}: has {sorted(got.get(gr, []))}, "
                            f"expected {sorted(want.get(gr, []))}")
        if d["kind"] == "Role":
            diff += [] if d["metadata"].get("namespace") == ns else [f"namespace {d['metadata'].get('namespace')}"]
        R.check(not diff, f"{render}: {d['kind']} {d['metadata']['name']} grants exactly what its callers use (upstream sidecar RBAC less NOT_GRANTED; deploy/rbac-needs.txt)",
                "; ".join(diff))
    for name, c in sidecars.items():
        if name in UPSTREAM_RBAC:
            tag, role, _ = UPSTREAM_RBAC[name]
            R.check(image_parts(c["image"])[1] == tag,
                    f"{render}: {name}'s RBAC table is for the pinned {tag}",
                    f"image {c['image']}: write down that release's upstream RBAC in UPSTREAM_RBAC")
    needed = {("ClusterRole", ROLE_OF_SIDECAR[s]) for s in sidecars if s in ROLE_OF_SIDECAR}
    needed |= {("Role", "provisioner")} if "csi-provisioner" in sidecars else set()
    leader = "csi-resizer" in sidecars and any(
        a.startswith("--leader-election") for a in sidecars["csi-resizer"].get("args", []))
    needed |= {("Role", "resizer")} if leader else set()
    # The resizer is what calls ControllerExpandVolume, which reads for the
    # room check.
    needed |= {("ClusterRole", "expansion"), ("Role", "expansion")} if "csi-resizer" in sidecars else set()
    needed |= {("ClusterRole", "discovery")} if api_user else set()
    # The orphan pass reads its node's lost record in the release namespace.
    needed |= {("Role", "discovery")} if orphans else set()
    # An LVM pool's node applies the VolumeAttributesClass its PVs move to.
    needed |= {("ClusterRole", "attributes")} if lvm else set()
    # Every node plugin publishes its storage identity and its pools' Events.
    needed |= {("ClusterRole", "storage")}
    needed |= {("ClusterRole", "controller"), ("Role", "controller")} if controller is not None else set()
    R.check(set(roles) == needed, f"{render}: roles match the sidecars present ({len(needed)})",
            f"present {sorted(roles)}, needed {sorted(needed)}")
    bound = set()
    for b in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding"):
        ref = b["roleRef"]
        key = next((k for k, r in roles.items() if r["kind"] == ref["kind"]
                    and r["metadata"]["name"] == ref["name"]), None)
        target = roles.get(key)
        who = csa if key and key[1] == "controller" else sa
        subj_ok = b.get("subjects") == [{"kind": "ServiceAccount", "name": who, "namespace": ns}]
        ns_ok = b["kind"] == "ClusterRoleBinding" or b["metadata"].get("namespace") == ns
        if R.check(target is not None and subj_ok and ns_ok,
                   f"{render}: {b['kind']} {b['metadata']['name']} binds {ref['kind']} {ref['name']} "
                   f"to {ns}/{who}"):
            bound.add((ref["kind"], ref["name"]))
    unbound = [f"{r['kind']} {r['metadata']['name']}" for r in roles.values()
               if (r["kind"], r["metadata"]["name"]) not in bound]
    R.check(not unbound, f"{render}: every role is bound", ", ".join(unbound))


def check_cluster_defaults(render, docs, ds, controller, shipped):
    """Defaults that hold up on clusters other than the authors'."""
    pod = ds["spec"]["template"]["spec"]
    # Own PriorityClass: the system-* classes are admitted only in kube-system
    # on some managed clusters (a quota scoped to them elsewhere).
    pcn = pod.get("priorityClassName")
    classes = {d["metadata"]["name"]: d for d in by_kind(docs, "PriorityClass")}
    ok = (pcn is None or not pcn.startswith("system-")) and (not shipped or pcn in classes)
    R.check(ok and set(classes) <= ({pcn} if pcn else set()),
            f"{render}: the node plugin's PriorityClass is its own ({pcn}), not a system-* class",
            f"priorityClassName {pcn!r}, PriorityClasses rendered {sorted(classes)}")
    for pc in classes.values():
        v = pc.get("value")
        R.check(pc.get("globalDefault") is not True and isinstance(v, int) and 0 < v <= 1000000000,
                f"{render}: PriorityClass {pc['metadata']['name']} is no global default, "
                f"value {pc.get('value')} in 1..1e9 (user classes)")
    # Linux nodes only: the images are linux binaries.
    for what, spec in (("DaemonSet", pod),
                       ("controller Deployment", controller["spec"]["template"]["spec"] if controller else None)):
        if spec is not None:
            sel = spec.get("nodeSelector") or {}
            R.check(sel.get("kubernetes.io/os") == "linux",
                    f"{render}: {what} selects kubernetes.io/os=linux nodes", f"nodeSelector {sel}")
    if shipped:
        # The dir pool sits on the node's root filesystem: a claim naming no
        # class must not land there unless the admin says so.
        defaults = [d["metadata"]["name"] for d in by_kind(docs, "StorageClass")
                    if (d["metadata"].get("annotations") or {}).get(
                        "storageclass.kubernetes.io/is-default-class") == "true"]
        R.check(not defaults, f"{render}: no StorageClass is made the cluster's default",
                f"default: {defaults}")


def immediate_binding_problems(sidecars):
    """What an Immediate class needs of the node-deployment provisioners
    (external-provisioner README, "Deployment on each node"): each instance
    checks GetCapacity for the claim's class on its own node, then tries to
    claim the PVC by writing its node into the volume.kubernetes.io/selected-node
    annotation (PVC update: its RBAC, checked with the sidecar's upstream
    rules); --node-deployment-immediate-binding=false turns that off, and no
    instance would ever take the claim."""
    p = sidecars.get("csi-provisioner")
    if p is None:
        return ["no csi-provisioner to provision it"]
    given = dict(pf for pf in map(parse_flag, p.get("args", [])) if pf)
    out = []
    if "node-deployment" not in given:
        out.append("Immediate binding here needs --node-deployment")
    if (given.get("node-deployment-immediate-binding") or "true").lower() == "false":
        out.append("volumeBindingMode Immediate with --node-deployment-immediate-binding=false: "
                   "no provisioner would claim the PVC")
    return out


def class_problems(verdicts, why, kind, name):
    """The driver's verdict on one class of a render (see class_check)."""
    if verdicts is None:
        return [f"parameters not checked: {why}"]
    if (kind, name) not in verdicts:
        return [f"`localvol config check` did not check {kind} {name}"]
    return verdicts[(kind, name)]


def check_classes(render, docs, sidecars, shipped, verdicts, why, static_classes=frozenset()):
    """The render's CSIDriver and classes: what the deployment requires of
    them here, and each class's parameters as the driver judges them
    (`verdicts`, `why`: class_check's answer)."""
    d = by_kind(docs, "CSIDriver")
    # Ephemeral (inline volumes) needs podInfoOnMount: kubelet passes
    # csi.storage.k8s.io/ephemeral, which tells the two modes apart, only then.
    want = {"attachRequired": False, "podInfoOnMount": True, "storageCapacity": True,
            "fsGroupPolicy": "File", "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            "requiresRepublish": False}
    R.check(len(d) == 1 and d[0]["metadata"]["name"] == DRIVER and d[0]["spec"] == want,
            f"{render}: CSIDriver {DRIVER} {json.dumps(want)}",
            json.dumps(d[0]["spec"]) if d else "missing")
    scs = by_kind(docs, "StorageClass")
    defaults = [s["metadata"]["name"] for s in scs
                if s["metadata"].get("annotations", {}).get("storageclass.kubernetes.io/is-default-class") == "true"]
    R.check(len(defaults) <= 1, f"{render}: at most one default StorageClass ({defaults})")
    R.check(static_classes <= {s["metadata"]["name"] for s in scs},
            f"{render}: every discovery class has its StorageClass ({sorted(static_classes)})")
    for s in scs:
        n, params = s["metadata"]["name"], s.get("parameters", {})
        problems = []
        if n in static_classes:
            # Static PVs: created by the node plugin; the class only names them.
            # No dynamic provisioner may serve it, or a claim with no free disk
            # would get a dynamic volume from the default pool instead of waiting.
            if s.get("provisioner") != "kubernetes.io/no-provisioner":
                problems.append(f"provisioner {s.get('provisioner')} (must be kubernetes.io/no-provisioner)")
            if params:
                problems.append("static classes take no parameters")
            if s.get("volumeBindingMode") != "WaitForFirstConsumer":
                problems.append("volumeBindingMode is not WaitForFirstConsumer")
            if s.get("reclaimPolicy", "Delete") != "Delete":
                problems.append("reclaimPolicy is not Delete (the deleter cleans Released PVs)")
            R.check(not problems, f"{render}: discovery StorageClass {n}", "; ".join(problems))
            continue
        if s.get("provisioner") != DRIVER:
            problems.append(f"provisioner {s.get('provisioner')}")
        else:
            problems += class_problems(verdicts, why, "StorageClass", n)
        if s.get("volumeBindingMode", "Immediate") == "Immediate":
            problems += immediate_binding_problems(sidecars)
        if shipped:
            if s.get("volumeBindingMode") != "WaitForFirstConsumer":
                problems.append("volumeBindingMode is not WaitForFirstConsumer")
            if s.get("allowVolumeExpansion") is not True:
                problems.append("allowVolumeExpansion is not true")
        R.check(not problems, f"{render}: StorageClass {n} (pool {params.get('pool')})", "; ".join(problems))
    vscs = by_kind(docs, "VolumeSnapshotClass")
    R.check(bool(vscs) == ("csi-snapshotter" in sidecars),
            f"{render}: VolumeSnapshotClasses only with the csi-snapshotter sidecar "
            f"({len(vscs)} classes, snapshotter {'csi-snapshotter' in sidecars})")
    for v in vscs:
        n = v["metadata"]["name"]
        problems = ([f"driver {v.get('driver')}"] if v.get("driver") != DRIVER
                    else class_problems(verdicts, why, "VolumeSnapshotClass", n))
        R.check(not problems, f"{render}: VolumeSnapshotClass {n} is for {DRIVER} and the driver "
                "takes its parameters (and some pool takes snapshots)", "; ".join(problems))


def check_render(render, path, help_info, shipped, chelp, binary):
    R.section(render)
    docs = load_docs(path)
    check_schemas(render, docs)
    dss = by_kind(docs, "DaemonSet")
    if not R.check(len(dss) == 1, f"{render}: one DaemonSet"):
        return docs
    ds = dss[0]
    localvol, cfg_text, socket_vol = check_localvol(render, ds, docs, help_info)
    cfg, pools = None, None
    verdicts, why = None, "the render has no driver config the driver accepts"
    if cfg_text is not None and config_check(binary, render, cfg_text):
        cfg = yaml.safe_load(cfg_text)
        pools = check_pool_mounts(render, cfg, ds["spec"]["template"]["spec"], localvol)
        verdicts, why = class_check(binary, path, cfg_text)
    kdir = "/var/lib/kubelet"
    if localvol:
        for a in localvol.get("args", []):
            if a.startswith("--kubelet-dir="):
                kdir = a.split("=", 1)[1].rstrip("/")
    sidecars = check_sidecars(render, ds, socket_vol, kdir)
    pod = ds["spec"]["template"]["spec"]
    check_probes(render, "DaemonSet", pod)
    static = check_discovery(render, cfg, pod, localvol) if localvol and cfg else set()
    classes = ((cfg.get("discovery") or {}).get("classes") or []) if isinstance(cfg, dict) else []
    if any(isinstance(c, dict) and c.get("volumeMode") == "Block" for c in classes) \
            and not any(p.get("type") == "lvm" for p in (pools or {}).values()):
        R.block_only.add(render)
    api_user = isinstance(cfg, dict) and (cfg.get("discovery") is not None or cfg.get("orphans") is not None)
    controller = check_controller(render, docs, chelp)
    if controller is not None:
        check_probes(render, "controller Deployment", controller["spec"]["template"]["spec"])
    R.check(controller is not None or not shipped, f"{render}: the controller Deployment is deployed")
    lvm = any(p.get("type") == "lvm" for p in (pools or {}).values())
    orphans = isinstance(cfg, dict) and cfg.get("orphans") is not None
    check_rbac(render, docs, ds, sidecars, api_user, controller, lvm, orphans)
    check_cluster_defaults(render, docs, ds, controller, shipped)
    check_classes(render, docs, sidecars, shipped, verdicts, why, static)
    return docs


# ---------------------------------------------------------------------------
# The kustomize base and the chart must deploy the same thing.

def normalize(docs):
    out = {}
    for d in docs:
        d = copy.deepcopy(d)
        if d["kind"] == "Namespace":   # Helm installs into an existing namespace
            continue
        md = d["metadata"]
        md.pop("labels", None)
        ann = md.get("annotations", {})
        md["annotations"] = {k: v for k, v in ann.items() if "is-default-class" in k}
        if not md["annotations"]:
            del md["annotations"]
        if d["kind"] == "ConfigMap":
            md["name"] = strip_hash(md["name"])
            d["data"] = {k: yaml.safe_load(v) for k, v in d["data"].items()}
        if d["kind"] == "DaemonSet":
            t = d["spec"]["template"]
            t["metadata"]["annotations"].pop("checksum/config", None)
            pod = t["spec"]
            for v in pod.get("volumes", []):
                if "configMap" in v:
                    v["configMap"]["name"] = strip_hash(v["configMap"]["name"])
            pod["containers"].sort(key=lambda c: c["name"])
            pod["volumes"].sort(key=lambda v: v["name"])
            for c in pod["containers"]:
                c.get("volumeMounts", []).sort(key=lambda m: m["mountPath"])
        out[(d["kind"], md.get("namespace"), md["name"])] = d
    return out


def diff(a, b, path=""):
    if type(a) != type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'kustomize' if k in a else 'helm'}")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        return [x for i, (p, q) in enumerate(zip(a, b)) for x in diff(p, q, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def check_parity(kname, kdocs, hname, hdocs):
    R.section(f"{kname} == {hname}")
    k, h = normalize(kdocs), normalize(hdocs)
    R.check(set(k) == set(h), f"{kname} and {hname} create the same objects ({len(k)})",
            f"only kustomize: {sorted(set(k) - set(h))}; only helm: {sorted(set(h) - set(k))}")
    for key in sorted(set(k) & set(h), key=str):
        dd = diff(k[key], h[key])
        R.check(not dd, f"{key[0]} {key[2]} is the same in both", "; ".join(dd[:6]))


# ---------------------------------------------------------------------------
# The files themselves.

def check_sources(binary):
    R.section("deploy/kubernetes sources")
    kroot = os.path.join(REPO, "deploy", "kubernetes")
    for kfile in sorted(glob.glob(os.path.join(kroot, "**", "kustomization.yaml"), recursive=True)):
        d = os.path.dirname(kfile)
        rel = os.path.relpath(d, REPO)
        k = yaml.safe_load(open(kfile))
        used = set(k.get("resources", []))
        patches = {p["path"] for p in k.get("patches", []) if "path" in p}
        used |= patches
        for g in k.get("configMapGenerator", []):
            used |= {f.split("=")[-1] for f in g.get("files", [])}
        files = {os.path.basename(f) for f in glob.glob(os.path.join(d, "*.yaml"))} - {"kustomization.yaml"}
        orphans = sorted(files - used)
        R.check(not orphans, f"{rel}: every YAML file is used by its kustomization", ", ".join(orphans))
        for f in sorted(files & used):
            path = os.path.join(d, f)
            if f in patches or f == "config.yaml":
                continue
            bad = []
            for doc in load_docs(path):
                if doc.get("kind") == "VolumeSnapshotClass":
                    try:
                        jsonschema.validate(doc, VSC_SCHEMA)
                    except jsonschema.ValidationError as e:
                        bad.append(e.message)
                    continue
                for v in K8S_VERSIONS:
                    try:
                        kubernetes_validate.validate(doc, v, strict=True)
                    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as e:
                        bad.append(f"{doc.get('kind')} (k8s {v}): {getattr(e, 'message', e)}")
            R.check(not bad, f"{rel}/{f} alone is valid", "; ".join(bad[:5]))
    # The chart's pool keys are the driver's: src/config/mod.rs's test
    # chart_pool_keys_are_the_configs reads values.schema.json.
    check_name_patterns(binary, json.load(open(os.path.join(REPO, "deploy", "helm", "localvol",
                                                            "values.schema.json"))))
    # Versions: the image the manifests deploy is this binary's (`--version`).
    out = subprocess.run([binary, "--version"], check=True, capture_output=True, text=True).stdout
    version = out.split()[-1]
    chart = yaml.safe_load(open(os.path.join(REPO, "deploy", "helm", "localvol", "Chart.yaml")))
    base = yaml.safe_load(open(os.path.join(kroot, "base", "kustomization.yaml")))
    tags = [i.get("newTag") for i in base.get("images", []) if i.get("name") == "localvol"]
    R.check(chart.get("appVersion") == version and tags == [version],
            f"chart appVersion and the kustomize image tag are the crate version {version}",
            f"appVersion {chart.get('appVersion')}, kustomize {tags}")


# Names on both sides of the driver's rules (src/ids.rs PoolName,
# src/config/mod.rs is_lvm_name): the chart's schema patterns must agree with
# `localvol config check` on each.
NAME_SAMPLES = ["a", "0", "default", "lvm-thin", "a-b-c", "-a", "a-", "-", "A", "a_b", "a.b",
                "a b", "", ".", "..", "...", ".a", "..a", "+x", "_x", "x+y.z_w-v", "-x",
                "é", "x" * 32, "x" * 33, "x" * 127, "x" * 128]


def config_check_many(binary, configs):
    """`localvol config check` of each config (a dict): which it accepted."""
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, c in enumerate(configs):
            paths.append(os.path.join(d, f"{i}.yaml"))
            with open(paths[-1], "w") as f:
                json.dump(c, f)   # JSON is YAML: no quoting to get wrong
        r = subprocess.run([binary, "config", "check", *paths], capture_output=True, text=True)
    if r.returncode not in (0, 1):   # 2: clap's usage error, e.g. a binary without the subcommand
        raise SystemExit(f"validate.py: {binary} config check: exit {r.returncode}: {r.stderr.strip()}")
    ok = {line.split(": ok, ")[0] for line in r.stdout.splitlines() if ": ok, " in line}
    return [p in ok for p in paths]


def check_name_patterns(binary, schema):
    """The chart's values schema refuses names at `helm install` that the
    driver would refuse on the nodes, and only those: its poolName and
    lvmName patterns against `localvol config check` on NAME_SAMPLES."""
    for what, pattern, config in (
            ("poolName", schema["definitions"]["poolName"]["pattern"],
             lambda n: {"pools": [{"name": n, "type": "dir", "path": "/p"}]}),
            ("lvmName (volumeGroup)", schema["definitions"]["lvmName"]["pattern"],
             lambda n: {"pools": [{"name": "a", "type": "lvm", "volumeGroup": n}]}),
            ("lvmName (thinPool)", schema["definitions"]["lvmName"]["pattern"],
             lambda n: {"pools": [{"name": "a", "type": "lvm", "volumeGroup": "vg", "thinPool": n}]})):
        driver = config_check_many(binary, [config(n) for n in NAME_SAMPLES])
        chart = [re.search(pattern, n) is not None for n in NAME_SAMPLES]
        differ = [f"{n!r}: chart {'accepts' if c else 'refuses'}, driver {'accepts' if d else 'refuses'}"
                  for n, c, d in zip(NAME_SAMPLES, chart, driver) if c != d]
        R.check(not differ and any(driver) and not all(driver),
                f"chart values.schema.json {what} pattern agrees with `localvol config check` "
                f"on {len(NAME_SAMPLES)} names", "; ".join(differ))


def cargo_words(cmd):
    """A cargo build command as (words without --locked, has --locked)."""
    words = cmd.replace("$(CARGO)", "cargo").split()
    return [w for w in words if w != "--locked"], "--locked" in words


def check_dockerfile(dockerfile, makefile):
    """The image builds the binary the tests use: the Dockerfile's
    `RUN cargo build ...` against the Makefile's build target. Nothing is built."""
    R.section(f"{dockerfile} vs {makefile} (no build is run)")
    df = open(os.path.join(REPO, dockerfile)).read().replace("\\\n", " ")
    runs = re.findall(r"^RUN\s+(.*\bcargo\s+build\b.*)$", df, re.M)
    if not R.check(len(runs) == 1, f"{dockerfile}: one RUN cargo build", f"found {runs}"):
        return
    cmd = runs[0].strip()
    words, locked = cargo_words(cmd)
    R.check(words[:2] == ["cargo", "build"] and "&&" not in words and ";" not in cmd,
            f"{dockerfile}: `{cmd}` is a plain cargo build")
    R.check(locked, f"{dockerfile}: the build uses --locked (Cargo.lock as committed)")
    R.check("--bin" in words and words[words.index("--bin") + 1:][:1] == ["localvol"]
            or "--bin=localvol" in words, f"{dockerfile}: the build is --bin localvol")
    bad = [w for w in words if w.startswith(("--manifest-path", "--target-dir", "--package", "-p",
                                             "--features", "--no-default-features", "--all-features"))]
    workdir = re.findall(r"^WORKDIR\s+(\S+)", df.split(runs[0])[0], re.M)
    copies = re.findall(r"^COPY\s+(?!--from)(.*)$", df, re.M)
    copied = {w for c in copies for w in c.split()[:-1]}
    R.check(not bad and {"Cargo.toml", "Cargo.lock", "src", "cli"} <= copied and workdir,
            f"{dockerfile}: it builds this workspace (Cargo.toml, Cargo.lock, src, cli copied to "
            f"WORKDIR {workdir[-1] if workdir else '?'}; no other manifest, package or features)",
            f"flags {bad}, copied {sorted(copied)}")
    mk = open(os.path.join(REPO, makefile)).read()
    m = re.search(r"^build:[^\n]*\n((?:\t[^\n]*\n)+)", mk, re.M)
    mcmds = [l.strip() for l in (m.group(1).splitlines() if m else [])
             if "cargo" in l.lower() and " build" in l]
    if not R.check(len(mcmds) == 1, f"{makefile}: the build target runs one cargo build", f"{mcmds}"):
        return
    mwords, mlocked = cargo_words(mcmds[0])
    R.check(mwords == words, f"{dockerfile} and {makefile} build the same way "
            f"(`{' '.join(words)}`, --locked aside)", f"Dockerfile {words}, Makefile {mwords}")
    if not mlocked:
        print(f"  NOTE {makefile}'s build target has no --locked (the Dockerfile has); not a failure")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the localvol binary")
    ap.add_argument("--renders", required=True, help="directory of kustomize-*.yaml and helm-*.yaml")
    ap.add_argument("--parity", action="append", default=[],
                    help="KUSTOMIZE_RENDER=HELM_RENDER pairs that must match")
    ap.add_argument("--custom", action="append", default=[],
                    help="renders with non-default values (class policy not enforced)")
    ap.add_argument("--dockerfile", help="check this Dockerfile's cargo build (relative to the repo)")
    ap.add_argument("--makefile", default="Makefile", help="whose build target it must match")
    a = ap.parse_args()

    help_info = serve_help(a.bin)
    print(f"localvol serve flags: {', '.join('--' + f for f in sorted(help_info[1]))}")
    print(f"localvol serve env:   {', '.join(sorted(help_info[2]))}")
    chelp = serve_help(a.bin, "controller")
    print(f"localvol controller flags: {', '.join('--' + f for f in sorted(chelp[1]))}")
    print(f"localvol controller env:   {', '.join(sorted(chelp[2]))}")
    if a.dockerfile:
        check_dockerfile(a.dockerfile, a.makefile)
    check_sources(a.bin)
    docs = {}
    for path in sorted(glob.glob(os.path.join(a.renders, "*.yaml"))):
        name = os.path.basename(path)[:-len(".yaml")]
        docs[name] = check_render(name, path, help_info, name not in a.custom, chelp, a.bin)
    for pair in a.parity:
        kname, hname = pair.split("=")
        check_parity(kname, docs[kname], hname, docs[hname])
    R.section("RBAC from the unit tests")
    R.check(not CODE_RBAC_UNKNOWN, "deploy/rbac-needs.txt (the kube API calls the unit tests saw) reads: " + "; ".join(
                f"{k[0]} {k[1]}: " + ", ".join(f"{g or 'core'}/{r} {sorted(v)}" for (g, r), v in sorted(rules.items()))
                for k, rules in sorted(CODE_RBAC.items())),
            "; ".join(CODE_RBAC_UNKNOWN))
    R.section("coverage")
    # The /dev mount of Block discovery must be checked where no LVM pool
    # brings /dev in anyway.
    R.check(bool(R.block_only), "a render has Block discovery classes and no LVM pool "
            f"({', '.join(sorted(R.block_only))})", "none: add one (e.g. helm ci/discovery-block-values.yaml)")

    if R.missing_driver_flags:
        print("\nlocalvol serve does not accept these flags the manifests use (add them to the driver):")
        for flag, renders in sorted(R.missing_driver_flags.items()):
            print(f"  {flag}  (used by {', '.join(sorted(renders))})")
    print(f"\n{R.passed} passed, {R.failed} failed")
    return 1 if R.failed else 0


if __name__ == "__main__":
    sys.exit(main())
