#!/usr/bin/env bash
# Story m — a loaded node, as a noisy neighbour or a backup window makes it (issue #38): CPU-
# and IO-hog pods bring the node's load average above 4 per vCPU; then claims of the quota
# dir, thick and thin classes (E2E_LOAD_CLAIMS each, default 10) are created with their pods,
# used and deleted, and the node plugin's pod is deleted once meanwhile (a forced restart).
# The bar:
#   - every pod runs to its end and every claim is cleaned up (its PV gone);
#   - no container of the node plugin restarts, except by that one deletion;
#   - no pool is marked unusable (no PoolUnusable event, localvol_pool_ready 1 throughout);
#   - kubelet never meets a refused or missing driver socket outside the forced restart.
# It reports the load average, every container's restarts, the slowest lvm run and the RPC
# answers other than OK.
. "$(dirname "$0")/../lib.sh"
start_story
per_class=${E2E_LOAD_CLAIMS:-10}
t_start=$(date -u +%s)
samples=$(mktemp /var/tmp/e2e-load.XXXXXX)
sampler=
trap 'rc=$?; [ -z "$sampler" ] || kill "$sampler" 2>/dev/null; rm -f "$samples" "$samples.yaml"; (exit $rc); story_cleanup' EXIT

node_pod() { k -n "$E2E_NS" get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}'; }
restarts_of() { # POD: "CONTAINER COUNT" lines
    k -n "$E2E_NS" get pod "$1" -o jsonpath='{range .status.containerStatuses[*]}{.name}{" "}{.restartCount}{"\n"}{end}'
}
metrics_of() { k get --raw "/api/v1/namespaces/$E2E_NS/pods/$1:9808/proxy/metrics" --request-timeout=60s; }
# pools_not_ready METRICS: the pools whose localvol_pool_ready is not 1.
pools_not_ready() { awk '/^localvol_pool_ready\{/ && $2 != 1 {print $1}' <<<"$1"; }
# report METRICS: the slowest lvm run per subcommand, health-check timeouts, non-OK answers.
report() {
    awk '/^localvol_lvm_run_seconds_max\{/ {split($1, a, "\""); if ($2 > m) {m = $2; c = a[2]}}
        END {printf "slowest lvm run %.1f s (%s); ", m, c ? c : "none"}' <<<"$1"
    awk '/^localvol_pool_health_check_timeouts_total\{/ {n += $2} END {printf "health-check timeouts %d; ", n}' <<<"$1"
    awk '/^localvol_rpc_requests_total\{/ && $1 !~ /code="Ok"/ {split($1, a, "\""); w = w (w ? ", " : "") a[2] " " a[4] " " $2}
        END {printf "answers other than OK: %s", w ? w : "none"}' <<<"$1"
}

# 1. The hogs: busy loops and direct writes, with a CPU request as a real neighbour has (a
# BestEffort pod's cgroup weight is next to nothing). The load target is 4 per vCPU.
vcpus=$(on_node nproc)
target=$((4 * vcpus))
hog() { # NAME SCRIPT
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {role: hog}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $E2E_IMAGE
      command: [sh, -c, $(printf '%s' "$2" | json_string)]
      resources: {requests: {cpu: 50m}}
      volumeMounts: [{name: s, mountPath: /scratch}]
  volumes: [{name: s, emptyDir: {}}]
EOF
}
{
    for i in $(seq $((3 * vcpus))); do hog "cpu$i" 'while :; do :; done'; done
    for i in $(seq "$vcpus"); do
        hog "io$i" 'while :; do dd if=/dev/zero of=/scratch/f bs=1M count=64 oflag=direct 2>/dev/null; rm -f /scratch/f; done'
    done
} | kn apply -f - >/dev/null
load1() { on_node cut -d' ' -f1 /proc/loadavg; }
(while :; do echo "$(date -u +%s) $(load1 2>/dev/null)" >>"$samples"; sleep 10; done) &
sampler=$!
above() { awk -v l="$(load1)" -v t="$target" 'BEGIN {exit !(l > t)}'; }
wait_for "load average above $target" 600 above ||
    fail "the hogs did not bring the load average above $target in 600 s (it is $(load1)); hogs: $(kn get pods -l role=hog -o wide 2>&1)"
say "load average $(load1) on $vcpus vCPUs: loaded"

# 2. Claims with their pods, all at once; each pod writes, syncs and reads back. They request
# CPU too: a BestEffort pod's cgroup weight is 1 against the hogs' 16, and on the saturated
# node its container's runc init stayed runnable for 8 minutes without a tick of CPU, so
# the pods never started (StartError after kubelet's 2-minute deadline).

plugin=$(node_pod)
before=$(restarts_of "$plugin")
claims=() pods=()
{
    for class in localvol-quota:32Mi localvol-thick:64Mi localvol-thin:300Mi; do
        for i in $(seq "$per_class"); do
            c=${class%%:*}-$i
            claims+=("$c") pods+=("p-$c")
            cat <<EOF
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $c}
spec: {storageClassName: ${class%%:*}, accessModes: [ReadWriteOnce], resources: {requests: {storage: ${class#*:}}}}
---
apiVersion: v1
kind: Pod
metadata: {name: p-$c, labels: {role: user}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $E2E_IMAGE
      command: [sh, -c, 'dd if=/dev/urandom of=/data/f bs=64k count=16 && sync && md5sum /data/f >/data/sum && md5sum -c /data/sum']
      resources: {requests: {cpu: 10m}}
      volumeMounts: [{name: d, mountPath: /data}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: $c}}]
EOF
        done
    done
} >"$samples.yaml"
# (the arrays are filled in this shell: the heredocs above went to a file, not a pipe)
kn apply -f "$samples.yaml" >/dev/null
rm -f "$samples.yaml"
n=${#claims[@]}

# 3. The forced restart, once a few claims are bound: the plugin's pod deleted, as an
# operator or an eviction does. Its metrics are read first (the pod's own are gone after).
bound() { [ "$(kn get pvc -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c Bound)" -ge "$1" ]; }
wait_for "3 claims bound" "$E2E_TIMEOUT" bound 3 ||
    fail "not 3 of $n claims bound in ${E2E_TIMEOUT}s under load: $(kn get pvc 2>&1 | head -12)"
expect_eq "restarts of the node plugin's containers before the forced restart" "$(restarts_of "$plugin")" "$before"
m_old=$(metrics_of "$plugin") || fail "no metrics from $plugin"
[ -z "$(pools_not_ready "$m_old")" ] || fail "pools not ready before the forced restart: $(pools_not_ready "$m_old")"
t_kill=$(date -u +%s)
k -n "$E2E_NS" delete pod "$plugin" --wait=false >/dev/null
gone() { [ "$(node_pod)" != "$plugin" ]; }
wait_for "a new node plugin pod" "$E2E_TIMEOUT" gone || fail "the node plugin's pod $plugin was not replaced"
k -n "$E2E_NS" rollout status daemonset/localvol-node --timeout="${E2E_TIMEOUT}s" >&2 ||
    fail "the node plugin did not become Ready again under load: $(k -n "$E2E_NS" get pods -o wide 2>&1)"
t_back=$(date -u +%s)
plugin=$(node_pod)
say "node plugin restarted by deleting its pod: Ready again after $((t_back - t_kill)) s"

# 4. Every pod to its end, then everything deleted while the node is still loaded.
# (one list a poll: the pods' own container end counts, as pod_result reads it)
ended() {
    kn get pods -l role=user -o jsonpath='{range .items[*]}{.status.phase} {.status.containerStatuses[0].state.terminated.exitCode}{"\n"}{end}' |
        grep -cE '^(Succeeded|Failed)|^(Running|Pending) [0-9]'
}
all_done() { [ "$(ended)" = "$n" ]; }
wait_for "$n pods finished" 1800 all_done ||
    fail "$(ended) of $n pods finished in 1800 s under load; the others: $(kn get pods -l role=user --no-headers 2>&1 | grep -v Completed | head -10)"
for p in "${pods[@]}"; do
    [ "$(pod_result "$p")" = Succeeded ] || fail "pod $p failed: $(kn logs "$p" 2>&1 | tail -5); events: $(events_of Pod "$p")"
done
delete_pods "${pods[@]}"
delete_claims "${claims[@]}"
peak=$(awk -v s="$t_start" '$1 >= s && $2 > m {m = $2} END {print m + 0}' "$samples")
kn delete pod -l role=hog --wait=false >/dev/null

# 5. The bar.
m_new=$(metrics_of "$plugin") || fail "no metrics from $plugin"
[ -z "$(pools_not_ready "$m_new")" ] || fail "pools not ready after the load: $(pools_not_ready "$m_new")"
unusable=$(k get events -A --field-selector reason=PoolUnusable \
    -o jsonpath='{range .items[*]}{.lastTimestamp}{" "}{.message}{"\n"}{end}' |
    awk -v s="$(date -u -d "@$t_start" +%Y-%m-%dT%H:%M:%SZ)" '$1 >= s')
[ -z "$unusable" ] || fail "a pool was marked unusable under load: $unusable"
after=$(restarts_of "$plugin")
[ -z "$(awk '$2 != 0' <<<"$after")" ] || fail "the node plugin's containers restarted after the forced restart: $after"
# kubelet's own log (its stderr): socket errors of localvol's outside [kill, Ready + 10 s].
refused=$(on_node sh -c 'grep -a "localvol.csi.dev" /proc/$(pgrep -xo kubelet)/fd/2 | grep -aE "connection refused|no such file or directory"' |
    python3 -c '
import sys, time, calendar
start, kill, back = (int(a) for a in sys.argv[1:])
year = time.gmtime().tm_year
for line in sys.stdin:
    try: t = calendar.timegm(time.strptime(f"{year}{line[1:5]} {line[6:14]}", "%Y%m%d %H:%M:%S"))
    except ValueError: continue
    if t >= start and not kill <= t <= back + 10: print(line.strip()[:300])' "$t_start" "$t_kill" "$t_back")
[ -z "$refused" ] || fail "kubelet met a refused or missing driver socket outside the forced restart:
$refused"
say "load average peak $peak on $vcpus vCPUs (target above $target); $n claims bound, used and deleted"
say "restarts: before the forced restart $(echo $before | tr '\n' ' '), after it $(echo $after | tr '\n' ' ')"
say "before the restart: $(report "$m_old")"
say "after it: $(report "$m_new")"
