#!/usr/bin/env bash
# Story d — online expansion: patching the claim grows the filesystem the running pod sees;
# an expansion past the node's free space leaves the PV as it was and tells the user why.
. "$(dirname "$0")/../lib.sh"
start_story

size_kib() { kn exec grow -- df -kP /data | awk 'NR==2 {print $2}'; }
kib() { echo $(( ${1%Mi} * 1024 )); }
# Half-way between the two sizes: what df shows once the filesystem has grown.
grown() { [ "$(size_kib)" -gt $(( ($(kib "$1") + $(kib "$2")) / 2 )) ]; }

# The thin class makes XFS, which mkfs.xfs cannot make under 300 MiB: it starts at 320Mi.
for spec in "localvol-thin 320Mi 512Mi" "localvol-thick 64Mi 128Mi" "localvol-quota 64Mi 128Mi"; do
    read -r class from to <<<"$spec"
    pvc data "$class" "$from"
    sleeper_pod grow data
    before=$(size_kib)
    [ "$before" -le "$(kib "$from")" ] || fail "$class: a $from volume shows ${before} KiB in the pod"
    kn patch pvc data --type merge -p "{\"spec\":{\"resources\":{\"requests\":{\"storage\":\"$to\"}}}}" >/dev/null
    wait_for "filesystem grown" "$E2E_TIMEOUT" grown "$from" "$to" ||
        fail "$class: the pod still sees $(size_kib) KiB ${E2E_TIMEOUT}s after the claim asked for $to; claim events:
$(events_of PersistentVolumeClaim data)
conditions: $(kn get pvc data -o jsonpath='{.status.conditions}')"
    cap=$(kn get pvc data -o jsonpath='{.status.capacity.storage}')
    expect_eq "$class: claim's capacity after expansion" "$cap" "$to"
    delete_pod grow
    delete_claim data
done

# Too large: the node's VG cannot hold 64Gi. The PV keeps its size and the claim says why.
pvc big localvol-thick 64Mi
sleeper_pod big-pod big
pv=$(pv_of big)
kn patch pvc big --type merge -p '{"spec":{"resources":{"requests":{"storage":"64Gi"}}}}' >/dev/null
told() { events_of PersistentVolumeClaim big | grep -q "VolumeResizeFailed"; }
wait_for "resize failure event" "$E2E_TIMEOUT" told ||
    fail "no VolumeResizeFailed event on the claim ${E2E_TIMEOUT}s after asking for more than the node has; events:
$(events_of PersistentVolumeClaim big)"
why=$(events_of PersistentVolumeClaim big | grep VolumeResizeFailed | tail -1)
echo "$why" | grep -qiE "space|room|exhausted|free" || fail "the resize failure does not say there is no room: $why"
expect_eq "PV capacity after a refused expansion" "$(k get pv "$pv" -o jsonpath='{.spec.capacity.storage}')" 64Mi
# Recovery (RecoverVolumeExpansionFailure, GA in 1.34): the user lowers the request to a size that fits.
kn patch pvc big --type merge -p '{"spec":{"resources":{"requests":{"storage":"96Mi"}}}}' >/dev/null
recovered() { [ "$(kn get pvc big -o jsonpath='{.status.capacity.storage}')" = 96Mi ]; }
wait_for "recovered at 96Mi" "$E2E_TIMEOUT" recovered ||
    fail "after lowering a failed expansion to 96Mi the claim shows $(kn get pvc big -o jsonpath='{.status.capacity.storage}'); events:
$(events_of PersistentVolumeClaim big | tail -5)"
delete_pod big-pod
delete_claim big
say "thin, thick and quota volumes grew online; a too-large expansion was refused with its reason and recovered at a smaller size"
