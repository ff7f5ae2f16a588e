#!/usr/bin/env python3
"""promtool unit tests of localvol's alerts, on series the driver really exports.

deploy/prometheus/localvol-alerts.yaml (rendered from the chart's
PrometheusRule by render_alerts.py) is tested with `promtool test rules`. The
test's input series are not typed here: this script

  1. starts the real driver (`localvol serve`, a dir pool in a temporary
     directory, /metrics on a free local port), creates a volume, asks
     NodeGetVolumeStats about it at a directory that is not its mount (the
     driver reports that condition abnormal: a real
     localvol_volume_condition_abnormal series), asks about a volume that does
     not exist (a real NotFound), scrapes /metrics; then removes the pool's
     volumes/ directory behind the driver (the pool turns unusable: a real
     localvol_pool_ready 0) and creates another volume (a real Internal
     answer), and scrapes again;
  2. takes each series the rules need from those scrapes, with its full label
     set, plus the job/instance labels Prometheus adds to a scraped target.
     The thin pool and wipe series, which a dir pool never exports (an LVM
     pool needs the VM), come from deploy/prometheus/lvm-sample.prom, whose
     lines the Rust test
     metrics::tests::lvm_sample_for_the_alert_tests_is_what_the_driver_prints
     holds to the driver's encoder;
  3. writes one promtool test group per scenario (healthy; thin data at 95%;
     thin metadata at 90%; 2% free; pool unusable; a wipe backlog stuck, and
     one growing; an abnormal volume; a burst of Internal errors; orphans;
     and the cases that must stay quiet: routine NotFound errors, a backlog
     that drains, short blips, an empty pool), each asserting for EVERY alert
     of the rules file whether it fires, with its labels and its rendered
     summary and description, and runs promtool on it.

Every metric name the rules use must be in the scrapes or in the sample.
promtool comes from $PROMTOOL or PATH (Debian: apt-get install prometheus);
missing, it is a failure under CI=true and one SKIPPED line elsewhere.

  alert_tests.py --bin target/debug/localvol
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RULES = os.path.join(REPO, "deploy", "prometheus", "localvol-alerts.yaml")
SAMPLE = os.path.join(REPO, "deploy", "prometheus", "lvm-sample.prom")
WORK = os.path.join(REPO, "target", "alert-tests")
# What Prometheus adds to every series of a scraped target.
TARGET = {"job": "localvol-node", "instance": "10.0.0.7:9808"}
MINUTES = 180   # each series' length, one sample a minute
EVAL = 150      # when every alert is checked, in minutes
GIB = 1 << 30
# Each alert's severity: what the rules must say (an alert missing here fails).
SEVERITY = {
    "LocalvolThinPoolDataHigh": "warning",
    "LocalvolThinPoolMetadataHigh": "warning",
    "LocalvolPoolFreeSpaceLow": "warning",
    "LocalvolWipeBacklogNotDraining": "warning",
    "LocalvolVolumeConditionAbnormal": "warning",
    "LocalvolPoolUnusable": "critical",
    "LocalvolRpcErrors": "warning",
    "LocalvolOrphanVolumes": "warning",
}
LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def say(msg):
    print(f"alert_tests: {msg}", flush=True)


def parse(text):
    """Exposition text -> {(name, frozenset(labels)): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            raise SystemExit(f"alert_tests: cannot parse the metrics line {line!r}")
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def client(binary, endpoint, *args, ok=True):
    p = subprocess.run([binary, "client", *args], env={**os.environ, "CSI_ENDPOINT": endpoint},
                       capture_output=True, text=True, timeout=60)
    if ok and p.returncode != 0:
        raise SystemExit(f"alert_tests: localvol client {' '.join(args)} failed: {p.stderr}")
    return p.stdout


def driver_scrapes(binary):
    """Runs the driver through the steps of the module docstring; returns the
    two scrapes, parsed."""
    d = tempfile.mkdtemp(prefix="localvol-alerts.")
    port, endpoint = free_port(), f"unix://{d}/csi.sock"
    os.makedirs(f"{d}/kubelet/pods/not-a-mount")
    log = open(f"{d}/driver.log", "w")
    proc = subprocess.Popen([binary, "serve", "--data-dir", f"{d}/data", "--kubelet-dir", f"{d}/kubelet",
                             "--endpoint", endpoint, "--metrics-addr", f"127.0.0.1:{port}",
                             "--node-id", "alerts-test",
                             # The pool monitor looks once, at start: the create below then
                             # reaches the pool (an Internal error) before the monitor could
                             # mark it unusable (which refuses with ResourceExhausted).
                             "--pool-check-interval", "86400"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                scrape(port)
                if os.path.exists(f"{d}/csi.sock"):
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"alert_tests: the driver exited: {open(f'{d}/driver.log').read()}")
            time.sleep(0.1)
        out = client(binary, endpoint, "create", "alerts-a", "--size", "10Mi")
        vid = re.search(r"^volume_id\s+(\S+)", out, re.M).group(1)
        out = client(binary, endpoint, "stats", vid, "--volume-path", f"{d}/kubelet/pods/not-a-mount")
        if "ABNORMAL" not in out:
            raise SystemExit(f"alert_tests: expected an abnormal condition, got: {out}")
        client(binary, endpoint, "stats", vid.split(".")[0] + "." + "0" * 32,
               "--volume-path", f"{d}/kubelet/pods/not-a-mount", ok=False)
        healthy = parse(scrape(port))
        pools = os.path.join(d, "data", "pool")
        os.rename(os.path.join(pools, "volumes"), os.path.join(pools, "volumes.gone"))
        client(binary, endpoint, "create", "alerts-b", "--size", "10Mi", ok=False)
        broken = parse(scrape(port))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(d, ignore_errors=True)
    return healthy, broken


def pick(scraped, name, **want):
    """The one scraped series `name` whose labels include `want`, as its
    full label dict (plus the target's labels)."""
    found = [dict(labels) for (n, labels) in scraped
             if n == name and all(dict(labels).get(k) == v for k, v in want.items())]
    if len(found) != 1:
        have = sorted(n for n, _ in scraped)
        raise SystemExit(f"alert_tests: expected one {name} {want or ''} in the scrape, found "
                         f"{len(found)} (metrics scraped: {sorted(set(have))})")
    return {"__name__": name, **found[0], **TARGET}


def scraped_value(scraped, series):
    """The value `scraped` holds for a series `pick` made."""
    labels = frozenset((k, v) for k, v in series.items() if k != "__name__" and k not in TARGET)
    return scraped[(series["__name__"], labels)]


def series_of(healthy, broken, sample):
    both = {**healthy, **broken}
    if scraped_value(broken, pick(broken, "localvol_pool_ready")) != 0:
        raise SystemExit("alert_tests: the pool did not turn unusable when its volumes/ went")
    return {
        "ready": pick(broken, "localvol_pool_ready"),
        "capacity": pick(healthy, "localvol_pool_capacity_bytes"),
        "free": pick(healthy, "localvol_pool_free_bytes"),
        "abnormal": pick(healthy, "localvol_volume_condition_abnormal"),
        "orphans": pick(healthy, "localvol_orphan_volumes"),
        "create_ok": pick(both, "localvol_rpc_requests_total", method="CreateVolume", code="Ok"),
        "create_internal": pick(broken, "localvol_rpc_requests_total", method="CreateVolume", code="Internal"),
        "stats_ok": pick(healthy, "localvol_rpc_requests_total", method="NodeGetVolumeStats", code="Ok"),
        "stats_notfound": pick(healthy, "localvol_rpc_requests_total", method="NodeGetVolumeStats",
                               code="NotFound"),
        "thin_data": pick(sample, "localvol_pool_thin_data_percent"),
        "thin_meta": pick(sample, "localvol_pool_thin_metadata_percent"),
        "wipe": pick(sample, "localvol_wipe_pending_bytes"),
    }


def scenarios(capacity):
    """name -> ({series key: value at minute t}, [(alert, series key, $value)]):
    each scenario's departures from the healthy values, and the alerts that
    must fire at EVAL (every other alert must not)."""
    def after(t0, v, before=0):
        return lambda t: v if t >= t0 else before
    return {
        "healthy": ({}, []),
        "thin data at 95%": ({"thin_data": lambda t: 95}, [("LocalvolThinPoolDataHigh", "thin_data", 95)]),
        "thin metadata at 90%": ({"thin_meta": lambda t: 90},
                                 [("LocalvolThinPoolMetadataHigh", "thin_meta", 90)]),
        "2% free": ({"free": lambda t: round(capacity * 0.02)},
                    [("LocalvolPoolFreeSpaceLow", "free", round(capacity * 0.02))]),
        # A dir pool with no volumes on a full filesystem: nothing allocated,
        # nothing free.
        "full pool, no volumes": ({"capacity": lambda t: 0, "free": lambda t: 0},
                                  [("LocalvolPoolFreeSpaceLow", "free", 0)]),
        "pool unusable": ({"ready": after(100, 0, 1)}, [("LocalvolPoolUnusable", "ready", 0)]),
        "wipe backlog stuck": ({"wipe": after(20, 5 * GIB)}, [("LocalvolWipeBacklogNotDraining", "wipe", 5 * GIB)]),
        "wipe backlog growing": ({"wipe": lambda t: 0 if t < 20 else 2 * GIB if t < 100 else 3 * GIB},
                                 [("LocalvolWipeBacklogNotDraining", "wipe", 2 * GIB)]),
        "volume abnormal": ({"abnormal": after(100, 1)}, [("LocalvolVolumeConditionAbnormal", "abnormal", 1)]),
        "Internal errors": ({"create_internal": lambda t: 10 * (t - 100) if t > 100 else 0},
                            [("LocalvolRpcErrors", "create_internal", 0.5)]),
        "orphans": ({"orphans": after(60, 3)}, [("LocalvolOrphanVolumes", "orphans", 3)]),
        # Quiet ones.
        "routine NotFound answers": ({"stats_notfound": lambda t: 30 * t}, []),
        "wipe backlog draining": ({"wipe": lambda t: 0 if t < 20 else 20 * GIB - (t - 20) * 50 * (1 << 20)}, []),
        "short blips": ({"ready": lambda t: 0 if EVAL - 3 <= t <= EVAL else 1,
                         "abnormal": lambda t: 1 if EVAL - 3 <= t <= EVAL else 0,
                         "orphans": lambda t: 3 if t >= EVAL - 30 else 0,
                         "thin_data": lambda t: 95 if t >= EVAL - 5 else 40}, []),
        "10% free and more": ({"free": lambda t: capacity // 10 + 1}, []),
    }


def healthy_values(capacity):
    return {
        "ready": lambda t: 1, "capacity": lambda t: capacity, "free": lambda t: capacity // 2,
        "abnormal": lambda t: 0, "orphans": lambda t: 0,
        "create_ok": lambda t: 10 * t, "create_internal": lambda t: 0,
        "stats_ok": lambda t: 5 * t, "stats_notfound": lambda t: 0,
        "thin_data": lambda t: 40, "thin_meta": lambda t: 20, "wipe": lambda t: 0,
    }


def go_g(v, prec=4):
    s = f"%.{prec}g" % v
    return re.sub(r"e([+-])(\d)$", r"e\g<1>0\2", s)   # Go pads the exponent to 2 digits, as Python


def humanize1024(v):
    if abs(v) <= 1:
        return go_g(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return go_g(v) + prefix


def expand(template, labels, value):
    """Prometheus' rendering of the few template forms the rules use; any
    other `{{` fails here, so that a new one is taught rather than guessed."""
    forms = {
        r"\$value": lambda: str(int(value)) if float(value).is_integer() else repr(float(value)),
        r'\$value \| printf "%\.1f"': lambda: "%.1f" % value,
        r"\$value \| humanizePercentage": lambda: go_g(value * 100) + "%",
        r"\$value \| humanize1024": lambda: humanize1024(value),
    }

    def one(m):
        body = m.group(1).strip()
        lm = re.fullmatch(r"\$labels\.([a-zA-Z_]+)", body)
        if lm:
            return labels.get(lm.group(1), "")
        for pat, f in forms.items():
            if re.fullmatch(pat, body):
                return f()
        raise SystemExit(f"alert_tests: teach expand() the template {{{{ {body} }}}}")
    return re.sub(r"\{\{(.*?)\}\}", one, template)


def series_text(labels):
    name = labels["__name__"]
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def test_file(rules, series, capacity):
    by_name = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    if set(by_name) != set(SEVERITY):
        raise SystemExit(f"alert_tests: the rules' alerts {sorted(by_name)} are not SEVERITY's {sorted(SEVERITY)}")
    dropped = {"LocalvolRpcErrors": {"__name__", "code"}}
    groups, fired = [], set()
    for name, (changes, firing) in scenarios(capacity).items():
        values = {**healthy_values(capacity), **changes}
        inputs = [{"series": series_text(series[k]),
                   "values": " ".join(str(values[k](t)) for t in range(MINUTES + 1))}
                  for k in sorted(series)]
        want = {alert: (key, v) for alert, key, v in firing}
        tests = []
        for alert, rule in sorted(by_name.items()):
            exp = []
            if alert in want:
                key, value = want[alert]
                labels = {k: v for k, v in series[key].items()
                          if k not in dropped.get(alert, {"__name__"})}
                labels["severity"] = SEVERITY[alert]
                exp.append({"exp_labels": labels,
                            "exp_annotations": {k: expand(v, labels, value)
                                                for k, v in rule.get("annotations", {}).items()}})
                fired.add(alert)
            tests.append({"eval_time": f"{EVAL}m", "alertname": alert, "exp_alerts": exp})
        groups.append({"name": name, "interval": "1m", "input_series": inputs, "alert_rule_test": tests})
    untested = sorted(set(by_name) - fired)
    if untested:
        raise SystemExit(f"alert_tests: no scenario makes these alerts fire: {untested}")
    return {"rule_files": [RULES], "evaluation_interval": "1m", "tests": groups}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "debug", "localvol"))
    a = ap.parse_args()
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not promtool:
        if os.environ.get("CI") == "true":
            say("FAIL: promtool not found (Debian: apt-get install prometheus; or set PROMTOOL)")
            return 1
        print("alert_tests: SKIPPED: promtool not found, the alert rules are NOT tested "
              "(Debian: apt-get install prometheus)")
        return 0
    rules = yaml.safe_load(open(RULES))
    healthy, broken = driver_scrapes(a.bin)
    sample = parse(open(SAMPLE).read())
    known = {n for n, _ in {**healthy, **broken, **sample}}
    used = {m for g in rules["groups"] for r in g["rules"] for m in re.findall(r"\blocalvol_[a-z_]+", r["expr"])}
    unknown = sorted(used - known)
    if unknown:
        say(f"FAIL: the rules use metrics the driver does not export: {unknown}")
        return 1
    series = series_of(healthy, broken, sample)
    capacity = int(scraped_value(healthy, series["capacity"]))
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, "localvol-alerts.test.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(test_file(rules, series, capacity), f, sort_keys=False, width=1 << 16)
    check = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True)
    if check.returncode != 0:
        say(f"FAIL: promtool check rules:\n{check.stdout}{check.stderr}")
        return 1
    run = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True)
    if run.returncode != 0:
        say(f"FAIL: promtool test rules {os.path.relpath(path, REPO)}:\n{run.stdout}{run.stderr}")
        return 1
    n = len(scenarios(capacity))
    say(f"PASS: {len(used)} metrics of the rules found in the driver's /metrics "
        f"(LVM-only ones in {os.path.relpath(SAMPLE, REPO)}); {n} scenarios, every alert checked in each "
        f"(promtool test rules {os.path.relpath(path, REPO)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
