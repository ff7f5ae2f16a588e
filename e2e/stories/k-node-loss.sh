#!/usr/bin/env bash
# Story k — node loss: a StatefulSet pod with a local claim runs on node B (lv-node2, a second
# VM). B loses power and its Node object is deleted, as a cluster autoscaler does. After the
# controller's grace period (nodeLossGrace, 30 s here) the PV is gone (none left Terminating),
# the claim that opted in with localvol.csi.dev/delete-on-node-loss is recreated, and the pod
# runs on node A with a fresh, empty volume. B then comes back on the same disks: the volume's
# data is still there (an orphan, kept and recorded, never reclaimed: docs/operations.md, "Node
# replaced or node lost").
# Adding, powering off and on node B are the infrastructure's actions; the rest is kubectl.
. "$(dirname "$0")/../lib.sh"
start_story
A=lv-node1 B=lv-node2
on_b() { E2E_NODE=2 "$E2E_CLUSTER" node "$@"; }
b_gone() { # whatever happens, node B does not outlive the story
    "$E2E_CLUSTER" node-off >/dev/null 2>&1 || true
    k delete node "$B" --wait=false >/dev/null 2>&1 || true
}
trap 'rc=$?; k uncordon "$A" >/dev/null 2>&1; b_gone; (exit $rc); story_cleanup' EXIT

"$E2E_CLUSTER" node-add >&2 || fail "the second node did not join the cluster"
plugin_on_b() {
    [ "$(k get csinode "$B" -o jsonpath='{.spec.drivers[?(@.name=="localvol.csi.dev")].name}')" = localvol.csi.dev ]
}
wait_for "localvol on $B" $((2 * E2E_TIMEOUT)) plugin_on_b ||
    fail "the node plugin never registered on $B: $(k -n "$E2E_NS" get pods -o wide 2>&1)"

# The pod lands on B: A is cordoned while it is scheduled.
k cordon "$A" >/dev/null
kn apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: c
          image: $E2E_IMAGE
          command: [sh, -c, "[ -e /data/born ] || hostname >/data/born; sync; exec sleep 100000"]
          volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
    - metadata:
        name: data
        annotations: {localvol.csi.dev/delete-on-node-loss: "true"}
      spec:
        storageClassName: localvol-quota
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 32Mi}}
YAML
wait_running web-0
expect_eq "node of web-0" "$(kn get pod web-0 -o jsonpath='{.spec.nodeName}')" "$B"
k uncordon "$A" >/dev/null
old_pv=$(pv_of data-web-0)
handle=$(k get pv "$old_pv" -o jsonpath='{.spec.csi.volumeHandle}')
kn exec web-0 -- sh -c 'echo from-node-b >/data/f && sync' || fail "web-0 could not write on $B"

# B is lost.
"$E2E_CLUSTER" node-off >&2 || fail "could not power off $B"
k delete node "$B" >/dev/null
moved() {
    [ "$(kn get pod web-0 -o jsonpath='{.spec.nodeName}')" = "$A" ] && pod_running web-0
}
wait_for "web-0 on $A" $((3 * E2E_TIMEOUT)) moved ||
    fail "web-0 did not come back on $A within $((3 * E2E_TIMEOUT))s of $B's deletion (on '$(kn get pod web-0 -o jsonpath='{.spec.nodeName}')', phase $(kn get pod web-0 -o jsonpath='{.status.phase}')); claim: $(kn get pvc data-web-0 -o jsonpath='{.status.phase} {.spec.volumeName}' 2>&1)
PV $old_pv: $(k get pv "$old_pv" -o jsonpath='{.status.phase} deletionTimestamp={.metadata.deletionTimestamp} finalizers={.metadata.finalizers}' 2>&1)
pod events:
$(events_of Pod web-0 | tail -6)
controller log:
$(k -n "$E2E_NS" logs deploy/localvol-controller --tail=15 2>&1)"
pv_gone "$old_pv" || fail "the lost node's PV $old_pv is still there: $(k get pv "$old_pv" -o jsonpath='{.status.phase} {.metadata.finalizers}')"
terminating=$(k get pv -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name} {end}')
expect_eq "PVs left Terminating" "$terminating" ""
[ "$(pv_of data-web-0)" != "$old_pv" ] || fail "the recreated claim is bound to the lost PV"
out=$(kn exec web-0 -- sh -c 'ls /data; cat /data/f 2>/dev/null || echo no-f')
echo "$out" | grep -q no-f || fail "the volume on $A is not fresh: $out"
record=$(k -n "$E2E_NS" get configmap "localvol-lost.$B" -o json 2>/dev/null) ||
    fail "no lost record localvol-lost.$B for the volume whose PV the controller deleted"
echo "$record" | grep -qF "$handle" || fail "the lost record does not name $handle: $record"

# B comes back on the same disks: its node plugin keeps the orphan (data and all).
"$E2E_CLUSTER" node-on >&2 || fail "$B did not come back"
wait_for "localvol on $B again" $((2 * E2E_TIMEOUT)) plugin_on_b ||
    fail "the node plugin did not register again on the returned $B"
kept=$(on_b sh -c 'cat /var/lib/localvol-dirpool/quota/volumes/*/f 2>/dev/null') || true
expect_eq "data of the lost volume on the returned $B" "$kept" from-node-b

kn delete statefulset web --wait=true >/dev/null
# Its pod may still be terminating (delete_pod would fail the story on one already gone).
kn delete pod web-0 --ignore-not-found --wait=true --timeout="${E2E_TIMEOUT}s" >/dev/null
delete_claim data-web-0
b_gone
k -n "$E2E_NS" delete configmap "localvol-lost.$B" >/dev/null 2>&1 || true
say "after $B's loss web-0 ran on $A with a fresh volume, no PV left Terminating; the returned $B kept the orphan's data"
