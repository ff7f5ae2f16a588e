#!/usr/bin/env bash
# Story i — the driver restarts under running applications: the node plugin pod deleted
# while pods do I/O (they keep running and keep their data; pods created after it returns
# mount fine), then `helm upgrade` to a new image tag and `helm rollback`, volumes in use.
. "$(dirname "$0")/../lib.sh"
: "${E2E_DRIVER_IMAGE:?e2e/run sets the driver image reference}"
: "${E2E_DRIVER_IMAGE_2:?e2e/run sets a second tag of the driver image}"
start_story

node_pod() { k -n "$E2E_NS" get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}'; }
writer() { # NAME CLAIM: appends a line a second to /data/log (not waited for)
    kn apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $E2E_IMAGE
      command: [sh, -c, "i=0; while true; do i=\$((i+1)); echo \$i >>/data/log; sync; sleep 1; done"]
      volumeMounts: [{name: d, mountPath: /data}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: $2}}]
YAML
}
lines() { kn exec "$1" -- sh -c 'wc -l </data/log'; }
still_writing() { # NAME: the log grows and the pod never restarted
    local a b
    a=$(lines "$1"); sleep 3; b=$(lines "$1")
    [ "$b" -gt "$a" ] || fail "pod $1 stopped writing to its volume ($a then $b lines)"
    expect_eq "restarts of pod $1" "$(kn get pod "$1" -o jsonpath='{.status.containerStatuses[0].restartCount}')" 0
}
driver_ready() { k -n "$E2E_NS" rollout status daemonset/localvol-node --timeout="${E2E_TIMEOUT}s" >&2; }
fresh_pod_mounts() { # TAG: a new claim and pod after the driver came back
    pvc "new-$1" localvol-thin 32Mi
    run_pod "new-$1" "new-$1" 'echo ok >/data/f && cat /data/f' | grep -q ok ||
        fail "a pod created after the driver restart ($1) could not use a new volume"
    delete_pod "new-$1"
    delete_claim "new-$1"
}

pvc a localvol-thick 64Mi
pvc b localvol-quota 32Mi
writer wa a
writer wb b
wait_running wa
wait_running wb

old=$(node_pod)
k -n "$E2E_NS" delete pod "$old" --wait=false >/dev/null
replaced() { p=$(node_pod); [ -n "$p" ] && [ "$p" != "$old" ]; }
wait_for "node plugin replaced" "$E2E_TIMEOUT" replaced || fail "the node plugin pod was not recreated"
driver_ready || fail "the node plugin did not become Ready again after its pod was deleted"
still_writing wa
still_writing wb
fresh_pod_mounts restart

helm() { "$E2E_CLUSTER" exec helm "$@"; }
helm upgrade localvol "$E2E_ROOT/../deploy/helm/localvol" -n "$E2E_NS" --reuse-values \
    --set image.tag="${E2E_DRIVER_IMAGE_2##*:}" >/dev/null || fail "helm upgrade failed"
driver_ready || fail "the node plugin did not roll out the upgraded image"
img=$(k -n "$E2E_NS" get pod "$(node_pod)" -o jsonpath='{.spec.containers[0].image}')
expect_eq "driver image after helm upgrade" "$img" "$E2E_DRIVER_IMAGE_2"
still_writing wa
still_writing wb
fresh_pod_mounts upgrade

helm rollback localvol -n "$E2E_NS" >/dev/null || fail "helm rollback failed"
back() { [ "$(k -n "$E2E_NS" get pod "$(node_pod)" -o jsonpath='{.spec.containers[0].image}')" = "$E2E_DRIVER_IMAGE" ]; }
wait_for "rolled back" "$E2E_TIMEOUT" back || fail "helm rollback did not bring back $E2E_DRIVER_IMAGE"
driver_ready || fail "the node plugin did not become Ready after helm rollback"
still_writing wa
still_writing wb
fresh_pod_mounts rollback

delete_pods wa wb
delete_claims a b
say "applications kept writing through a node plugin restart, helm upgrade and helm rollback"
