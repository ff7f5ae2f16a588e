# e2e/lib.sh — sourced by every story (e2e/stories/*.sh). A story drives Kubernetes only:
# kubectl against the cluster, pods doing the I/O. The node is looked at (lvs, mounts) only
# to check what a story leaves behind, never to act. Each failure says what a user would
# have seen (a Pending claim and its events, a pod's error), so a red run reads as a report.
#
# Environment (set by e2e/run):
#   E2E_CLUSTER   the cluster script (e2e/cluster): `kubectl ARGS`, `node CMD`
#   E2E_NS        the release namespace of the driver (default localvol)
#   E2E_IMAGE     the image application pods run (busybox with its applets)
#   E2E_TIMEOUT   default seconds a wait may take (default 360: the node is TCG-slow, and
#                 under make test it shares the cores with the VM suites)
set -euo pipefail

E2E_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E2E_CLUSTER=${E2E_CLUSTER:-$E2E_ROOT/cluster}
E2E_NS=${E2E_NS:-localvol}
E2E_IMAGE=${E2E_IMAGE:-localvol-e2e/busybox:1}
E2E_TIMEOUT=${E2E_TIMEOUT:-360}
STORY=${STORY:-$(basename "$0" .sh)}
# Each story works in a namespace of its own, deleted when it ends (e2e/run checks that
# nothing of it is left on the node).
NS=${NS:-e2e-${STORY//[^a-z0-9]/-}}

k() { "$E2E_CLUSTER" kubectl "$@"; }
kn() { k -n "$NS" "$@"; }
# A command on the node, for leftover checks only.
on_node() { "$E2E_CLUSTER" node "$@"; }

say() { echo "[$STORY] $*" >&2; }
fail() {
    echo "[$STORY] FAILED: $*" >&2
    exit 1
}

# wait_for DESC SECONDS CMD... — runs CMD every 2 s until it succeeds; fails with DESC.
wait_for() {
    local desc=$1 secs=$2 deadline
    shift 2
    deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 2
    done
}

# The events of one object, oldest first, as a user reads them with kubectl describe.
events_of() { # KIND NAME
    kn get events --field-selector "involvedObject.kind=$1,involvedObject.name=$2" \
        -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message --no-headers 2>/dev/null || true
}

# A namespace of the story's own; removed by story_cleanup (trap'd by start_story).
start_story() {
    k create namespace "$NS" >/dev/null
    trap story_cleanup EXIT
}
story_cleanup() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        say "state at failure:"
        kn get pvc,pod -o wide 2>&1 | sed 's/^/    /' >&2 || true
    fi
    # Pods first, so kubelet unpublishes before the claims go; then wait for the PVs.
    kn delete pod --all --wait=false >/dev/null 2>&1 || true
    k delete namespace "$NS" --timeout=300s >/dev/null 2>&1 || true
    exit "$rc"
}

# pvc NAME CLASS SIZE [Block] — a claim in the story's namespace.
pvc() {
    local mode=${4:-Filesystem}
    kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec:
  storageClassName: $2
  accessModes: [ReadWriteOnce]
  volumeMode: $mode
  resources: {requests: {storage: $3}}
EOF
}

# run_pod NAME CLAIM SCRIPT [Block] — a pod that mounts CLAIM at /data (a Block claim: the
# device at /dev/xvda), runs SCRIPT with sh and ends. Prints the pod's output; fails with the
# output when the script fails, or with the claim's and pod's events when it never ran.
run_pod() {
    local name=$1 claim=$2 script=$3 vol="volumeMounts: [{name: d, mountPath: /data}]"
    [ "${4:-}" = Block ] && vol="volumeDevices: [{name: d, devicePath: /dev/xvda}]"
    kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $E2E_IMAGE
      command: [sh, -c, $(printf '%s' "$script" | json_string)]
      $vol
  volumes: [{name: d, persistentVolumeClaim: {claimName: $claim}}]
EOF
    pod_finish "$name"
}

# pod_finish NAME — waits for a run-to-completion pod and prints its log.
pod_finish() {
    local name=$1 phase
    if ! wait_for "pod $name finished" "$E2E_TIMEOUT" pod_done "$name"; then
        fail "pod $name did not finish in ${E2E_TIMEOUT}s (phase $(kn get pod "$name" -o jsonpath='{.status.phase}' 2>/dev/null)); pod events:
$(events_of Pod "$name")
claim events:
$(pod_claim_events "$name")"
    fi
    phase=$(pod_result "$name")
    kn logs "$name" 2>/dev/null || true
    [ "$phase" = Succeeded ] || fail "pod $name ended $phase; its output:
$(kn logs "$name" 2>&1 | tail -20)
pod events:
$(events_of Pod "$name")"
}
pod_done() { [ -n "$(pod_result "$1")" ]; }
# pod_result NAME: Succeeded or Failed once the pod's one container has ended, else nothing.
# The container's own end counts: a busy kubelet reports the pod's terminal phase only after
# it tore the pod's sandbox down, which can take minutes more (the user already sees
# "Completed").
pod_result() {
    local out
    out=$(kn get pod "$1" -o jsonpath='{.status.phase} {.status.containerStatuses[0].state.terminated.exitCode}')
    case "$out" in
    Succeeded* | "Running 0" | "Pending 0") echo Succeeded ;;
    Failed* | "Running "[0-9]* | "Pending "[0-9]*) echo Failed ;;
    esac
}
pod_claim_events() {
    local c
    for c in $(kn get pod "$1" -o jsonpath='{.spec.volumes[*].persistentVolumeClaim.claimName}' 2>/dev/null); do
        echo "  $c:"
        events_of PersistentVolumeClaim "$c" | sed 's/^/    /'
    done
}

# A long-running pod (sleeps) for stories that look inside while it runs (kubectl exec).
sleeper_pod() { # NAME CLAIM [Block]: apply_sleeper, then wait for it to run
    apply_sleeper "$@"
    wait_running "$1"
}
apply_sleeper() { # NAME CLAIM [Block]: a pod that sleeps with the claim mounted (or its device), not waited for
    local vol="volumeMounts: [{name: d, mountPath: /data}]"
    [ "${3:-}" = Block ] && vol="volumeDevices: [{name: d, devicePath: /dev/xvda}]"
    kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $E2E_IMAGE
      command: [sleep, "100000"]
      $vol
  volumes: [{name: d, persistentVolumeClaim: {claimName: $2}}]
EOF
}
wait_running() {
    wait_for "pod $1 Running" "$E2E_TIMEOUT" pod_running "$1" ||
        fail "pod $1 is not Running after ${E2E_TIMEOUT}s (phase $(kn get pod "$1" -o jsonpath='{.status.phase}')); pod events:
$(events_of Pod "$1")
claim events:
$(pod_claim_events "$1")"
}
pod_running() { [ "$(kn get pod "$1" -o jsonpath='{.status.phase}')" = Running ]; }

# Deletes a pod and waits until it is gone (kubelet has unpublished its volumes).
delete_pod() { delete_pods "$1"; }
# delete_pods NAME... — the pods deleted together (kubelet tears them down together).
delete_pods() {
    local p why=
    kn delete pod "$@" --wait=true --timeout="${E2E_TIMEOUT}s" >/dev/null && return 0
    for p in "$@"; do why+=$'\n'"$p: $(events_of Pod "$p")"; done
    fail "pods $* were not all deleted in ${E2E_TIMEOUT}s:$why"
}

# The PV a claim is bound to.
pv_of() { kn get pvc "$1" -o jsonpath='{.spec.volumeName}'; }

# Deletes a claim and waits until its PV is gone too (reclaim policy Delete).
delete_claim() { delete_claims "$1"; }
# delete_claims NAME... — the claims deleted together, then every one's PV waited for.
delete_claims() {
    local c pv pvs=()
    for c in "$@"; do pvs+=("$c=$(pv_of "$c")"); done
    kn delete pvc "$@" --wait=true --timeout="${E2E_TIMEOUT}s" >/dev/null
    for c in "${pvs[@]}"; do
        pv=${c#*=}
        [ -n "$pv" ] || continue
        wait_for "PV $pv deleted" "$E2E_TIMEOUT" pv_gone "$pv" ||
            fail "PV $pv of claim ${c%%=*} is still there ${E2E_TIMEOUT}s after the claim was deleted (phase $(k get pv "$pv" -o jsonpath='{.status.phase}')); its events:
$(k get events -A --field-selector "involvedObject.name=$pv" -o custom-columns=REASON:.reason,MESSAGE:.message --no-headers)"
    done
}
pv_gone() { ! k get pv "$1" >/dev/null 2>&1; }

# install_driver: the chart installed (or upgraded) as a user does, with e2e/values.yaml and
# this build's image; returns once the node plugin and the node-loss controller are Ready.
install_driver() {
    : "${E2E_DRIVER_IMAGE:?e2e/run sets the driver image reference}"
    "$E2E_CLUSTER" exec helm upgrade --install localvol "$E2E_ROOT/../deploy/helm/localvol" \
        --namespace "$E2E_NS" --create-namespace -f "$E2E_ROOT/values.yaml" \
        --set image.repository="${E2E_DRIVER_IMAGE%:*}" --set image.tag="${E2E_DRIVER_IMAGE##*:}" \
        --wait=false >/dev/null || fail "helm install failed"
    k -n "$E2E_NS" rollout status daemonset/localvol-node --timeout="${E2E_TIMEOUT}s" >&2 ||
        fail "the DaemonSet localvol-node did not become Ready in ${E2E_TIMEOUT}s: $(k -n "$E2E_NS" get pods -o wide 2>&1)
$(k -n "$E2E_NS" get events --field-selector type=Warning -o custom-columns=OBJ:.involvedObject.name,REASON:.reason,MSG:.message --no-headers | tail -15)"
    k -n "$E2E_NS" rollout status deployment/localvol-controller --timeout="${E2E_TIMEOUT}s" >&2 ||
        fail "the node-loss controller did not become Ready: $(k -n "$E2E_NS" get pods -o wide 2>&1)"
}
# driver_installed: the chart's release runs this build's image, rolled out and Ready on
# every node (what story a leaves; i, k, l, n and z may leave something else).
driver_installed() {
    local ds ctl
    ds=$(k -n "$E2E_NS" get daemonset localvol-node -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by} {.spec.template.spec.containers[?(@.name=="localvol")].image} {.status.desiredNumberScheduled} {.status.updatedNumberScheduled} {.status.numberReady}' 2>/dev/null) || return 1
    ctl=$(k -n "$E2E_NS" get deployment localvol-controller -o jsonpath='{.spec.replicas} {.status.updatedReplicas} {.status.readyReplicas}' 2>/dev/null) || return 1
    read -r by image want updated ready <<<"$ds"
    [ "$by" = Helm ] && [ "$image" = "$E2E_DRIVER_IMAGE" ] && [ "${want:-0}" -gt 0 ] &&
        [ "$updated" = "$want" ] && [ "$ready" = "$want" ] || return 1
    read -r want updated ready <<<"$ctl"
    [ "${want:-0}" -gt 0 ] && [ "$updated" = "$want" ] && [ "$ready" = "$want" ]
}

# JSON string literal of stdin (for a script inside a YAML flow sequence).
json_string() { python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))'; }

# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; }
