#!/usr/bin/env bash
# Story e — snapshot and restore with the snapshot-controller: the restored claim holds the
# data as it was at the snapshot; snapshot and origin can be deleted in either order.
. "$(dirname "$0")/../lib.sh"
start_story

snapshot() { # NAME CLAIM
    kn apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: $1}
spec:
  volumeSnapshotClassName: localvol-lvm
  source: {persistentVolumeClaimName: $2}
YAML
    ready() { [ "$(kn get volumesnapshot "$1" -o jsonpath='{.status.readyToUse}')" = true ]; }
    wait_for "snapshot $1 ready" "$E2E_TIMEOUT" ready "$1" ||
        fail "VolumeSnapshot $1 is not readyToUse after ${E2E_TIMEOUT}s: $(kn get volumesnapshot "$1" -o jsonpath='{.status}')
events: $(events_of VolumeSnapshot "$1")"
}
restore() { # NAME CLASS SNAPSHOT SIZE
    kn apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec:
  storageClassName: $2
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: $4}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: $3}
YAML
}
delete_snapshot() {
    kn delete volumesnapshot "$1" --wait=true --timeout="${E2E_TIMEOUT}s" >/dev/null ||
        fail "VolumeSnapshot $1 was not deleted: $(kn get volumesnapshot "$1" -o jsonpath='{.status}')"
}

# The thin class makes XFS, whose smallest volume is 300Mi: a restore asks at least the
# snapshot's size (the provisioner refuses less).
for spec in "localvol-thick 64Mi" "localvol-thin 300Mi"; do
    read -r class size <<<"$spec"
    pvc origin "$class" "$size"
    run_pod w1 origin 'echo before-snapshot >/data/v && sync' >/dev/null
    snapshot snap origin
    run_pod w2 origin 'echo after-snapshot >/data/v && sync' >/dev/null
    restore copy "$class" snap "$size"
    out=$(run_pod r copy 'cat /data/v')
    echo "$out" | grep -q before-snapshot || fail "$class: the restored claim does not hold the data at the snapshot: '$out'"
    for p in w1 w2 r; do delete_pod "$p"; done
    delete_claim copy
    if [ "$class" = localvol-thick ]; then
        # the snapshot first, then its origin
        delete_snapshot snap
        delete_claim origin
    else
        # the origin first, then its snapshot
        delete_claim origin
        delete_snapshot snap
    fi
    gone() { [ -z "$(k get volumesnapshotcontents -o name)" ]; }
    wait_for "snapshot contents gone" "$E2E_TIMEOUT" gone ||
        fail "$class: VolumeSnapshotContents left after deleting the snapshot: $(k get volumesnapshotcontents)"
done
say "thick and thin snapshots restored with their data; deleted snapshot-first and origin-first"
