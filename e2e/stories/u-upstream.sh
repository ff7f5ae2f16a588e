#!/usr/bin/env bash
# Story u — Kubernetes' own judge: the External Storage tests of Kubernetes' e2e suite
# (k8s.io/kubernetes/test/e2e/storage/external in e2e.test, built by e2e/build from the cluster's
# pinned module set), once per localvol class, each described by its driver definition
# e2e/upstream/CLASS.yaml: what the class can do, its sizes and file systems.
#
#   E2E_UPSTREAM=quick (the default; a whole run, so make test): the specs of
#                e2e/upstream/quick.txt, every declared capability at least once across the
#                classes (14 specs);
#   E2E_UPSTREAM=subset: the specs of e2e/upstream/subset.txt, every capability a class
#                declares at least once for that class (51 specs, about half an hour);
#   E2E_UPSTREAM=full (make e2e-upstream): every External Storage spec, those neither
#                [Disruptive] nor [Serial] in ginkgo's parallel mode, then those serially.
#   E2E_UPSTREAM_CLASSES  the classes (default: quota thick thin encrypted)
#   E2E_UPSTREAM_PROCS    ginkgo's parallel processes per class (default: the node's CPUs; a
#                         spec mostly waits on its pods)
# The classes' parallel parts run at the same time, one ginkgo each: a node serves every class
# at once, and one class's slowest spec no longer holds up the next class. The serial parts
# ([Disruptive] specs restart kubelet or the driver) run afterwards, one class at a time.
# Prints one line per class and part: `upstream CLASS PART: P passed, F failed, S skipped`
# (skipped: specs that skipped themselves, their reasons counted in skips.txt); ginkgo's log and
# JUnit report go to $E2E_LOGS/upstream-CLASS-PART/. Fails when any spec failed.
. "$(dirname "$0")/../lib.sh"

mode=${E2E_UPSTREAM:-quick}
classes=${E2E_UPSTREAM_CLASSES:-quota thick thin encrypted}
logs=${E2E_LOGS:-/var/tmp/localvol-e2e/logs}
defs=$E2E_ROOT/upstream
bin=${E2E_BUILD:?e2e/run sets E2E_BUILD}/bin
[ -x "$bin/e2e.test" ] && [ -x "$bin/ginkgo" ] || fail "no e2e.test or ginkgo in $bin (e2e/build)"
cpus=$(k get nodes -o jsonpath='{.items[0].status.capacity.cpu}')
procs=${E2E_UPSTREAM_PROCS:-${cpus:-1}}
# Within e2e/run's limit for the story (two hours but for the whole suite), so that ginkgo
# reports.
ginkgo_timeout=$(case $mode in full) echo 4h ;; subset) echo 100m ;; *) echo 40m ;; esac)

# The regular expression of the spec names a list gives CLASS (e2e/upstream/quick.txt or
# subset.txt: lines `CLASSES: NAME`, CLASSES `all` or names; ` * ` any text), each anchored at
# the name's end.
list_focus() {
    python3 - "$1" "$2" <<'PY'
import re, sys
names = []
for line in open(sys.argv[1]):
    if not line.strip() or line.startswith("#"):
        continue
    classes, _, name = line.partition(": ")
    if classes == "all" or sys.argv[2] in classes.split():
        names.append(".*".join(re.escape(part) for part in name.strip().split(" * ")) + "$")
print("|".join(names))
PY
}

# run_part CLASS PART [ginkgo args...]: one ginkgo run of e2e.test for CLASS; a part with a
# failure leaves $logs/upstream-CLASS-PART/failed (parts run concurrently, in subshells).
run_part() {
    local class=$1 part=$2 out rc=0 summary
    shift 2
    out=$logs/upstream-$class-$part
    rm -rf "$out"
    mkdir -p "$out"
    say "$class $part: ginkgo (focus and reports: $out)"
    KUBE_TEST_REPO_LIST=$defs/repo-list.yaml "$E2E_CLUSTER" exec "$bin/ginkgo" --no-color --timeout="$ginkgo_timeout" \
        --output-dir="$out" --junit-report=junit.xml "$@" "$bin/e2e.test" -- \
        -storage.testdriver="$defs/$class.yaml" -report-dir="$out" >"$out/ginkgo.log" 2>&1 || rc=$?
    # Counts from ginkgo's JUnit report: specs the focus left out are "skipped" with the bare
    # message "skipped"; a spec that skipped itself says why (skips.txt lists the reasons).
    summary=$(python3 - "$out/junit.xml" "$out/skips.txt" <<'PY'
import collections, sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as e:
    print("no report (%s)" % e); sys.exit(0)
p = f = s = 0
why = collections.Counter()
for tc in root.iter("testcase"):
    name = tc.get("name", "")
    bad = tc.find("failure") is not None or tc.find("error") is not None
    if not name.startswith("[It]"):
        f += bad  # a suite-level node (BeforeSuite, AfterSuite, reports)
        continue
    skipped = tc.find("skipped")
    if skipped is not None or tc.get("status") == "skipped":
        msg = (skipped.get("message", "") if skipped is not None else "").strip()
        if msg in ("", "skipped"):
            continue  # not selected
        s += 1
        why[msg.removeprefix("skipped - ").splitlines()[0][:200]] += 1
    elif bad:
        f += 1
    else:
        p += 1
with open(sys.argv[2], "w") as out:
    for msg, n in why.most_common():
        out.write("%4d %s\n" % (n, msg))
print("%d passed, %d failed, %d skipped" % (p, f, s))
PY
)
    echo "upstream $class $part: $summary (ginkgo exit $rc; $out)"
    case $summary in
    *" 0 failed"*) [ "$rc" -eq 0 ] || touch "$out/failed" ;;
    *) touch "$out/failed" ;;
    esac
    grep -E '^\s*\[FAIL\]' "$out/ginkgo.log" | sed "s/^/    $class: /" | sort -u | head -40 >&2 || true
}

for class in $classes; do
    [ -f "$defs/$class.yaml" ] || fail "no driver definition $defs/$class.yaml"
done
for class in $classes; do
    case $mode in
    quick | subset)
        focus=$(list_focus "$defs/$mode.txt" "$class")
        # A class the quick list gives nothing runs nothing (every class has some today).
        [ -n "$focus" ] || { [ "$mode" = quick ] && continue; fail "e2e/upstream/$mode.txt names no spec for class $class"; }
        run_part "$class" "$mode" -p --procs="$procs" --focus="External Storage \\[Driver: localvol\\.csi\\.dev\\] ($focus)" &
        ;;
    full)
        run_part "$class" parallel -p --procs="$procs" --focus='External.Storage' --skip='\[Disruptive\]|\[Serial\]' &
        ;;
    *) fail "E2E_UPSTREAM is quick, subset or full, not $mode" ;;
    esac
done
wait
if [ "$mode" = full ]; then
    for class in $classes; do
        run_part "$class" serial --focus='External.Storage.*(\[Disruptive\]|\[Serial\])'
    done
fi
failed=$(find "$logs" -path "$logs/upstream-*/failed" | wc -l)
[ "$failed" -eq 0 ] || fail "$failed of the suite's runs had failures (above; reports in $logs/upstream-*)"
