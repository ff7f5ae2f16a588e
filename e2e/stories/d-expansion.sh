#!/usr/bin/env bash
# Story d — online expansion: patching the claim grows the filesystem the running pod sees;
# an expansion past the node's free space leaves the PV as it was and tells the user why.
. "$(dirname "$0")/../lib.sh"
start_story

size_kib() { kn exec "$1" -- df -kP /data | awk 'NR==2 {print $2}'; }
kib() { echo $(( ${1%Mi} * 1024 )); }
# Half-way between the two sizes: what df shows once the filesystem has grown.
grown() { [ "$(size_kib "$1")" -gt $(( ($(kib "$2") + $(kib "$3")) / 2 )) ]; }

# grow CLASS FROM TO: a running pod's claim of CLASS patched from FROM to TO.
grow() {
    local class=$1 from=$2 to=$3 c=data-$1 p=grow-$1 before cap
    pvc "$c" "$class" "$from"
    sleeper_pod "$p" "$c"
    before=$(size_kib "$p")
    [ "$before" -le "$(kib "$from")" ] || fail "$class: a $from volume shows ${before} KiB in the pod"
    kn patch pvc "$c" --type merge -p "{\"spec\":{\"resources\":{\"requests\":{\"storage\":\"$to\"}}}}" >/dev/null
    wait_for "filesystem grown" "$E2E_TIMEOUT" grown "$p" "$from" "$to" ||
        fail "$class: the pod still sees $(size_kib "$p") KiB ${E2E_TIMEOUT}s after the claim asked for $to; claim events:
$(events_of PersistentVolumeClaim "$c")
conditions: $(kn get pvc "$c" -o jsonpath='{.status.conditions}')"
    # The claim's status follows the filesystem: kubelet reports the node expansion done.
    at_size() { [ "$(kn get pvc "$c" -o jsonpath='{.status.capacity.storage}')" = "$to" ]; }
    wait_for "claim capacity $to" "$E2E_TIMEOUT" at_size || true
    cap=$(kn get pvc "$c" -o jsonpath='{.status.capacity.storage}')
    expect_eq "$class: claim's capacity after expansion" "$cap" "$to"
    delete_pod "$p"
    delete_claim "$c"
}

# The three classes at once (each in a subshell: its failure is its exit), beside the
# refused expansion below. The thin class makes XFS, which mkfs.xfs cannot make under
# 300 MiB: it starts at 320Mi.
growers=()
for spec in "localvol-thin 320Mi 512Mi" "localvol-thick 64Mi 128Mi" "localvol-quota 64Mi 128Mi"; do
    # shellcheck disable=SC2086
    (trap - EXIT; grow $spec) &
    growers+=("$!:${spec%% *}")
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
for g in "${growers[@]}"; do
    wait "${g%%:*}" || fail "${g#*:}: online expansion failed (see above)"
done
say "thin, thick and quota volumes grew online; a too-large expansion was refused with its reason and recovered at a smaller size"
