#!/usr/bin/env python3
"""Unit tests of deploy/tools/validate.py and render_base.py (run by
deploy/validate with the venv that has their modules; LOCALVOL_BIN, when set,
is the localvol binary the config tests ask).

    python -m unittest discover -s deploy/tools -p 'test_*.py'
"""

import contextlib
import io
import os
import stat
import sys
import tempfile
import textwrap
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render_base  # noqa: E402
import validate  # noqa: E402


def quiet(fn, *args, **kw):
    """Runs fn with a fresh Report and its PASS/FAIL lines swallowed; returns
    (its result, the Report)."""
    validate.R = validate.Report()
    with contextlib.redirect_stdout(io.StringIO()):
        out = fn(*args, **kw)
    return out, validate.R


class CodeRbac(unittest.TestCase):
    """The RBAC of localvol's own roles: deploy/rbac-needs.txt, the needs the
    unit tests' fake API server recorded."""

    def test_lines_become_roles_and_verbs(self):
        rbac, bad = validate.read_needs(textwrap.dedent("""\
            # a comment
            controller ClusterRole core persistentvolumes list

            controller ClusterRole core persistentvolumes watch
            controller Role coordination.k8s.io leases create
            expansion ClusterRole core persistentvolumeclaims/status patch
            """))
        self.assertEqual(bad, [])
        self.assertEqual(rbac, {
            ("ClusterRole", "controller"): {("", "persistentvolumes"): {"list", "watch"}},
            ("Role", "controller"): {("coordination.k8s.io", "leases"): {"create"}},
            ("ClusterRole", "expansion"): {("", "persistentvolumeclaims/status"): {"patch"}},
        })

    def test_what_it_cannot_read_fails(self):
        rbac, bad = validate.read_needs("controller ClusterRole core nodes\n"
                                        "controller Binding core nodes list\n"
                                        "storage ClusterRole storage.k8s.io csinodes patch\n")
        self.assertEqual(bad, ["line 1: 'controller ClusterRole core nodes'",
                               "line 2: 'controller Binding core nodes list'"])
        self.assertEqual(rbac, {("ClusterRole", "storage"): {("storage.k8s.io", "csinodes"): {"patch"}}})

    def test_the_repository_record_reads_cleanly(self):
        self.assertEqual(validate.CODE_RBAC_UNKNOWN, [])
        for role in ("controller", "discovery", "expansion", "attributes", "storage"):
            self.assertIn(("ClusterRole", role), validate.CODE_RBAC)


class SidecarRbac(unittest.TestCase):
    def test_not_granted_is_taken_off_upstream(self):
        rbac = validate.sidecar_rbac()
        self.assertNotIn(("Role", "snapshotter"), rbac)          # leases only, all dropped
        self.assertNotIn(("storage.k8s.io", "volumeattachments"), rbac[("ClusterRole", "provisioner")])
        self.assertEqual(rbac[("Role", "provisioner")],
                         {("storage.k8s.io", "csistoragecapacities"):
                          {"get", "list", "watch", "create", "update", "patch", "delete"},
                          ("", "pods"): {"get"}})
        self.assertNotIn("create", rbac[("ClusterRole", "snapshotter")][
            ("snapshot.storage.k8s.io", "volumesnapshotcontents")])

    def test_every_not_granted_row_is_an_upstream_rule(self):
        for sidecar, kind, group, resource in validate.NOT_GRANTED:
            self.assertIn((kind, group, resource), validate.UPSTREAM_RBAC[sidecar][2])


class CheckRbac(unittest.TestCase):
    def docs(self, record_verbs):
        """A node plugin with orphans: the storage and discovery roles as the
        record has them, but the discovery Role (the lost record's
        configmaps) granting `record_verbs`."""
        ns, sa = "localvol", "localvol-node"
        ds = {"kind": "DaemonSet", "metadata": {"name": "n", "namespace": ns},
              "spec": {"template": {"spec": {"serviceAccountName": sa}}}}
        role = lambda kind, name, rules: {"kind": kind, "metadata": {"name": f"localvol-{name}", "namespace": ns},
                                          "rules": rules}
        bind = lambda kind, rk, name: {"kind": kind, "metadata": {"name": f"b-{name}", "namespace": ns},
                                       "roleRef": {"kind": rk, "name": f"localvol-{name}"},
                                       "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}
        rules = lambda key: [{"apiGroups": [g], "resources": [r], "verbs": sorted(v)}
                             for (g, r), v in validate.RBAC[key].items()]
        docs = [ds, {"kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}]
        for name in ("storage", "discovery"):
            docs += [role("ClusterRole", name, rules(("ClusterRole", name))),
                     bind("ClusterRoleBinding", "ClusterRole", name)]
        docs += [role("Role", "discovery", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": record_verbs}]),
                 bind("RoleBinding", "Role", "discovery")]
        return ds, docs

    def test_exact_verbs_pass(self):
        ds, docs = self.docs(["get"])
        _, r = quiet(validate.check_rbac, "t", docs, ds, {}, api_user=True, orphans=True)
        self.assertEqual(r.failed, 0)

    def test_an_extra_verb_fails(self):
        ds, docs = self.docs(["get", "list"])
        _, r = quiet(validate.check_rbac, "t", docs, ds, {}, api_user=True, orphans=True)
        self.assertEqual(r.failed, 1)

    def test_a_role_nothing_needs_fails(self):
        ds, docs = self.docs(["get"])
        _, r = quiet(validate.check_rbac, "t", docs, ds, {}, api_user=True, orphans=False)
        self.assertEqual(r.failed, 1)


class Helpers(unittest.TestCase):
    def test_parse_flag(self):
        self.assertEqual(validate.parse_flag("--a=b=c"), ("a", "b=c"))
        self.assertEqual(validate.parse_flag("--node-deployment"), ("node-deployment", None))
        self.assertEqual(validate.parse_flag("-v=5"), ("v", "5"))
        self.assertIsNone(validate.parse_flag("serve"))

    def test_image_and_hash(self):
        self.assertEqual(validate.image_parts("registry:5000/a/b:v1"), ("registry:5000/a/b", "v1"))
        self.assertEqual(validate.image_parts("registry:5000/a/b"), ("registry:5000/a/b", ""))
        self.assertEqual(validate.strip_hash("localvol-config-447tkdtt5c"), "localvol-config")

    def test_help_parsing_and_log_env(self):
        help_text = textwrap.dedent("""\
            Run the CSI driver

            Usage: localvol serve [OPTIONS]

            Options:
                  --endpoint <ENDPOINT>
                      Where to listen [env: CSI_ENDPOINT=] [default: unix:///run/localvol/csi.sock]
                  --log-format <LOG_FORMAT>
                      Log format [default: text] [possible values: text, json]

            Environment: RUST_LOG, the log filter (default: info).
            """)
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "localvol")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\ncat <<'EOF'\n" + help_text + "EOF\n")
            os.chmod(fake, stat.S_IRWXU)
            text, flags, envs, values = validate.serve_help(fake)
        self.assertEqual(flags, {"endpoint", "log-format"})
        self.assertEqual(envs, {"CSI_ENDPOINT"})
        self.assertEqual(values, {"log-format": {"text", "json"}})
        self.assertEqual(validate.log_env(text), {"RUST_LOG"})
        self.assertEqual(validate.log_env("Options:\n  --x\n"), set())


class Parity(unittest.TestCase):
    def test_normalize_ignores_what_each_tool_adds(self):
        cm = lambda name, text: {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "n", "labels": {"x": "y"}},
                                 "data": {"config.yaml": text}}
        k = validate.normalize([cm("localvol-config-447tkdtt5c", "a: 1\nb: 2\n"),
                                {"kind": "Namespace", "metadata": {"name": "n"}}])
        h = validate.normalize([cm("localvol-config", "b: 2\na: 1\n")])
        self.assertEqual(k, h)

    def test_diff_names_the_path(self):
        self.assertEqual(validate.diff({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}), [".a[1].b: 2 != 3"])
        self.assertEqual(validate.diff({"a": 1}, {}), [".a: only in kustomize"])


class PoolMounts(unittest.TestCase):
    def pod(self, mounts, volumes, **extra):
        c = {"name": "localvol", "volumeMounts": mounts}
        return {"containers": [c], "volumes": volumes, **extra}, c

    def test_dir_pool_below_a_same_path_host_mount(self):
        pod, c = self.pod([{"name": "data", "mountPath": "/var/lib/localvol"}],
                          [{"name": "data", "hostPath": {"path": "/var/lib/localvol"}}])
        cfg = {"pools": [{"name": "a", "type": "dir", "path": "/var/lib/localvol/a"}]}
        pools, r = quiet(validate.check_pool_mounts, "t", cfg, pod, c)
        self.assertEqual((r.passed, r.failed, list(pools)), (1, 0, ["a"]))
        cfg = {"pools": [{"name": "b", "type": "dir", "path": "/srv/b"}]}
        _, r = quiet(validate.check_pool_mounts, "t", cfg, pod, c)
        self.assertEqual(r.failed, 1)

    def test_device_pool_needs_bidirectional_and_dev(self):
        pod, c = self.pod([{"name": "p", "mountPath": "/srv/p"}], [{"name": "p", "hostPath": {"path": "/srv/p"}}])
        cfg = {"pools": [{"name": "p", "type": "dir", "path": "/srv/p", "device": "/dev/sdb"}]}
        _, r = quiet(validate.check_pool_mounts, "t", cfg, pod, c)
        self.assertEqual(r.failed, 1)

    def test_lvm_pools_need_host_ipc_and_paths(self):
        paths = validate.LVM_HOST_PATHS
        pod, c = self.pod([{"name": f"v{i}", "mountPath": p} for i, p in enumerate(paths)],
                          [{"name": f"v{i}", "hostPath": {"path": p}} for i, p in enumerate(paths)],
                          hostIPC=True)
        cfg = {"pools": [{"name": "l", "type": "lvm", "volumeGroup": "vg"}]}
        _, r = quiet(validate.check_pool_mounts, "t", cfg, pod, c)
        self.assertEqual((r.passed, r.failed), (2, 0))
        pod["hostIPC"] = False
        _, r = quiet(validate.check_pool_mounts, "t", cfg, pod, c)
        self.assertEqual(r.failed, 1)


class Probes(unittest.TestCase):
    """Probes judge liveness, not latency."""
    GOOD = {"periodSeconds": 20, "failureThreshold": 9}

    def container(self, **probes):
        return {"name": "c", **probes}

    def test_several_failures_over_a_minute(self):
        ok = self.container(startupProbe={"periodSeconds": 5, "failureThreshold": 120},
                            livenessProbe=self.GOOD, readinessProbe={"periodSeconds": 20, "failureThreshold": 3})
        self.assertEqual(validate.probe_problems(ok), [])
        for kind in validate.PROBES:
            for probe, says in [({"periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 1}, "1 < 3"),
                                ({"periodSeconds": 2, "failureThreshold": 20}, "20 x 2 < "),
                                ({}, "3 x 10 < ")]:   # Kubernetes' defaults
                c = self.container(**{"startupProbe": self.GOOD, kind: probe})
                problems = validate.probe_problems(c)
                self.assertTrue(any(p.startswith(kind) and says in p for p in problems), (kind, problems))

    def test_liveness_spans_three_minutes(self):
        # 6 x 10 s restarted a live driver on a node at load 70; enough for readiness.
        minute = {"periodSeconds": 10, "failureThreshold": 6}
        self.assertEqual(validate.probe_problems(self.container(startupProbe=self.GOOD, readinessProbe=minute)), [])
        self.assertEqual(validate.probe_problems(self.container(startupProbe=self.GOOD, livenessProbe=minute)),
                         ["livenessProbe failureThreshold x periodSeconds 6 x 10 < 180 s"])

    def test_liveness_needs_a_startup_probe(self):
        self.assertEqual(validate.probe_problems(self.container(livenessProbe=self.GOOD)),
                         ["livenessProbe without a startupProbe"])
        self.assertEqual(validate.probe_problems(self.container(readinessProbe=self.GOOD)), [])

    def test_check_probes_names_the_container(self):
        pod = {"containers": [self.container(startupProbe=self.GOOD, livenessProbe=self.GOOD),
                              {"name": "csi-resizer", "livenessProbe": {"periodSeconds": 20, "failureThreshold": 1}}]}
        _, r = quiet(validate.check_probes, "t", "DaemonSet", pod)
        self.assertEqual((r.passed, r.failed), (0, 1))
        pod["containers"].pop()
        _, r = quiet(validate.check_probes, "t", "DaemonSet", pod)
        self.assertEqual((r.passed, r.failed), (1, 0))

    def test_localvol_liveness_is_its_own_listener(self):
        given = {"metrics-addr": ":9808", "liveness-addr": ":9809"}
        probe = lambda port, path="/healthz": {"httpGet": {"path": path, "port": port}}
        c = {"ports": [{"name": "metrics", "containerPort": 9808}, {"name": "health", "containerPort": 9809}],
             "startupProbe": probe("health"), "livenessProbe": probe(9809)}
        self.assertEqual(validate.liveness_problems(c, given), [])
        # The metrics port's /healthz answers while the driver hangs.
        bad = dict(c, livenessProbe=probe("metrics"))
        self.assertEqual(validate.liveness_problems(bad, given), ["livenessProbe asks /healthz on port metrics"])
        self.assertEqual(validate.liveness_problems(dict(c, startupProbe=probe("health", "/readyz")), given),
                         ["startupProbe asks /readyz on port health"])
        self.assertIn("--liveness-addr is the metrics port 9808",
                      validate.liveness_problems(c, dict(given, **{"liveness-addr": ":9808"})))
        # The old wiring: no --liveness-addr, probes on a sidecar's port.
        self.assertEqual(len(validate.liveness_problems(c, {"metrics-addr": ":9808"})), 3)

    def test_leader_election_timings(self):
        self.assertEqual(validate.go_duration("2m17s"), 137)
        self.assertIsNone(validate.go_duration("137"))
        le = lambda lease, renew, retry: {"leader-election-lease-duration": lease,
                                          "leader-election-renew-deadline": renew,
                                          "leader-election-retry-period": retry}
        self.assertEqual(validate.leader_election_problems(le("137s", "107s", "26s")), [])
        self.assertEqual(validate.leader_election_problems({}), [])   # upstream's 15s, 10s, 5s
        self.assertEqual(len(validate.leader_election_problems(le("60s", "60s", "10s"))), 1)
        self.assertEqual(len(validate.leader_election_problems(le("137s", "30s", "26s"))), 1)
        self.assertEqual(len(validate.leader_election_problems(le("137", "107s", "26s"))), 1)

    def test_the_livenessprobe_sidecar_is_gone(self):
        self.assertNotIn("livenessprobe", validate.SIDECARS)


@unittest.skipUnless(os.environ.get("LOCALVOL_BIN"), "LOCALVOL_BIN not set: no binary to ask")
class ClassParams(unittest.TestCase):
    """Class parameters are the binary's to judge (`localvol config check
    --storage-class`): these run its rules through validate.py's wiring."""
    CONFIG = textwrap.dedent("""\
        pools:
        - {name: quota, type: dir, path: /var/lib/localvol/quota}
        - {name: plain, type: dir, path: /var/lib/localvol/plain, quota: "off"}
        - {name: thick, type: lvm, volumeGroup: vg}
        - {name: thin, type: lvm, volumeGroup: vg, thinPool: tp, defaultFsType: xfs}
        """)
    SECRET = {"csi.storage.k8s.io/node-stage-secret-name": "key",
              "csi.storage.k8s.io/node-stage-secret-namespace": "ns"}

    def verdicts(self, *docs, config=None):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump_all(docs, f)
            f.flush()
            return validate.class_check(os.environ["LOCALVOL_BIN"], f.name, config or self.CONFIG)

    def sc(self, name, **params):
        return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
                "provisioner": validate.DRIVER, "parameters": params}

    def vsc(self, name, **params):
        return {"kind": "VolumeSnapshotClass", "metadata": {"name": name},
                "driver": validate.DRIVER, "parameters": params}

    def test_what_create_volume_takes_passes(self):
        classes = [
            self.sc("a"),
            self.sc("b", pool="quota", inodeLimit="1000"),
            self.sc("c", pool="thin", **{"format.xfs.nrext64": "false", "format.xfs.reflink": "true"}),
            self.sc("d", pool="thick", **{"format.ext4.features": "^orphan_file,64bit"}),
            self.sc("e", pool="thick", encryption="luks2", **self.SECRET),
            self.vsc("s", snapshotSize="1Gi"),
        ]
        verdicts, why = self.verdicts(*classes)
        self.assertIsNone(why)
        self.assertEqual(verdicts, {(c["kind"], c["metadata"]["name"]): [] for c in classes})

    def test_what_create_volume_refuses_is_reported_by_parameter(self):
        for params, says in [
            ({"pool": "thin", "format.xfs.nrext64": "0"}, "format.xfs.nrext64: "),
            ({"pool": "thin", "format.xfs.nrext64": "false", "csi.storage.k8s.io/fstype": "ext4"},
             "format.xfs.nrext64: "),
            ({"pool": "quota", "format.xfs.nrext64": "false"}, "format.xfs.nrext64: "),
            ({"pool": "thick", "format.ext4.features": "has_journal"}, "format.ext4.features: "),
            ({"pool": "thick", "format.ext4.features": "64bit,^64bit"}, "format.ext4.features: "),
            ({"pool": "thick", "inodeLimit": "10"}, "inodeLimit: "),
            ({"pool": "plain", "inodeLimit": "10"}, "inodeLimit: "),
            ({"pool": "quota", "encryption": "luks2", **self.SECRET}, "encryption: "),
            ({"pool": "thick", "encryption": "luks2"}, "encryption: "),
            ({"pool": "thick", "colour": "blue"}, "colour: "),
            ({"pool": "thick", "csi.storage.k8s.io/fstype": "btrfs"}, "btrfs"),
            ({"pool": "elsewhere"}, "elsewhere"),
        ]:
            verdicts, why = self.verdicts(self.sc("x", **params))
            problems = verdicts[("StorageClass", "x")]
            self.assertTrue(len(problems) == 1 and says in problems[0], (params, problems))

    def test_the_secret_in_the_render_must_hold_the_key(self):
        secret = {"kind": "Secret", "metadata": {"name": "key", "namespace": "ns"},
                  "stringData": {"not-the-key": "x"}}
        verdicts, _ = self.verdicts(self.sc("x", pool="thick", encryption="luks2", **self.SECRET), secret)
        self.assertEqual(len(verdicts[("StorageClass", "x")]), 1)
        self.assertIn("has no encryptionKey", verdicts[("StorageClass", "x")][0])

    def test_snapshot_classes_need_their_parameters_and_a_pool_that_snapshots(self):
        verdicts, _ = self.verdicts(self.vsc("s", snapshotSize="0", other="1"))
        self.assertEqual([p.split(":")[0] for p in verdicts[("VolumeSnapshotClass", "s")]],
                         ["other", "snapshotSize"])
        dir_only = "pools: [{name: quota, type: dir, path: /var/lib/localvol/quota}]\n"
        verdicts, _ = self.verdicts(self.vsc("s"), config=dir_only)
        self.assertTrue(any("snapshots" in p for p in verdicts[("VolumeSnapshotClass", "s")]))

    def test_other_drivers_classes_and_a_refused_render(self):
        other = dict(self.sc("local"), provisioner="kubernetes.io/no-provisioner")
        verdicts, why = self.verdicts(self.sc("mine"), other)
        self.assertEqual(verdicts, {("StorageClass", "mine"): []})
        verdicts, why = self.verdicts(self.sc("x"), config="pools: []\n")
        self.assertIsNone(verdicts)
        self.assertIn("no pools", why)


class Classes(unittest.TestCase):
    """check_classes reports the driver's verdicts; it judges no parameter."""

    def render(self):
        sc = {"kind": "StorageClass", "metadata": {"name": "x"}, "provisioner": validate.DRIVER,
              "parameters": {"anything": "at all"}, "volumeBindingMode": "WaitForFirstConsumer"}
        csidriver = {"kind": "CSIDriver", "metadata": {"name": validate.DRIVER}, "spec": {}}
        return [csidriver, sc]

    def failed_checks(self, verdicts, why=None):
        out = io.StringIO()
        validate.R = validate.Report()
        with contextlib.redirect_stdout(out):
            validate.check_classes("t", self.render(), {}, False, verdicts, why)
        return [l for l in out.getvalue().splitlines() if "FAIL" in l and "StorageClass" in l]

    def test_the_drivers_verdict_is_the_check(self):
        self.assertEqual(self.failed_checks({("StorageClass", "x"): []}), [])
        failed = self.failed_checks({("StorageClass", "x"): ["anything: unknown parameter"]})
        self.assertTrue(len(failed) == 1 and "anything: unknown parameter" in failed[0], failed)
        self.assertEqual(len(self.failed_checks({})), 1)              # the driver did not check it
        self.assertEqual(len(self.failed_checks(None, "config refused")), 1)

    def test_no_copy_of_a_driver_rule_is_left(self):
        for name in ("SC_PARAMS", "EXT4_FEATURES", "format_problems", "VSC_PARAMS", "KEY_FIELD"):
            self.assertFalse(hasattr(validate, name), name)


class ConfigCheck(unittest.TestCase):
    """The config rules are the binary's; these only check the wiring, and
    that the names this script once let through are refused."""

    def test_the_drifted_names_are_refused(self):
        ok = validate.config_check_many(os.environ["LOCALVOL_BIN"], [
            {"pools": [{"name": "a", "type": "dir", "path": "/a"}]},
            {"pools": [{"name": "-a", "type": "dir", "path": "/a"}]},
            {"pools": [{"name": "a", "type": "lvm", "volumeGroup": "."}]},
            {"pools": [{"name": "a", "type": "lvm", "volumeGroup": "vg", "thinPool": ".."}]},
        ])
        self.assertEqual(ok, [True, False, False, False])

    def test_config_check_reports_the_drivers_error(self):
        out, r = quiet(validate.config_check, os.environ["LOCALVOL_BIN"], "t",
                       "pools: [{name: a, type: dir, path: relative}]\n")
        self.assertFalse(out)
        self.assertEqual(r.failed, 1)


class RenderBase(unittest.TestCase):
    HELM = textwrap.dedent("""\
        ---
        # Source: localvol/templates/configmap.yaml
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: localvol-config
          labels:
            app.kubernetes.io/managed-by: Helm
        data:
          config.yaml: |
            pools:
            - name: default
        ---
        # Source: localvol/templates/daemonset.yaml
        apiVersion: apps/v1
        kind: DaemonSet
        metadata:
          name: localvol-node
          labels:
            app.kubernetes.io/name: localvol
            app.kubernetes.io/managed-by: Helm
            helm.sh/chart: localvol-0.1.0
        spec:
          template:
            metadata:
              annotations:
                # Roll the pods when the pool config changes.
                checksum/config: 0123
                kubectl.kubernetes.io/default-container: localvol
        """)

    def test_render_splits_config_and_drops_helm_only_lines(self):
        files = render_base.render(self.HELM)
        self.assertEqual(files["config.yaml"], render_base.header(None) + "pools:\n- name: default\n")
        body = files["localvol.yaml"]
        self.assertTrue(body.startswith(render_base.header(None) + "---\n# Source: localvol/templates/daemonset.yaml\n"))
        for gone in ("managed-by", "helm.sh/chart", "checksum/config", "Roll the pods", "kind: ConfigMap"):
            self.assertNotIn(gone, body)
        self.assertIn("kubectl.kubernetes.io/default-container: localvol", body)

    def test_render_needs_the_config_map(self):
        with self.assertRaises(SystemExit):
            render_base.render(self.HELM.split("---\n# Source: localvol/templates/daemonset.yaml")[0]
                               .replace("localvol-config", "other"))


if __name__ == "__main__":
    unittest.main()
