#!/usr/bin/env bash
# Story o — IO limits through VolumeAttributesClasses: a claim of the thick LVM class made
# with a "slow" class (writes held at 4 MiB/s) and a pod writing with O_DIRECT through it;
# the claim is then moved to a "fast" class (16 MiB/s) while the pod runs. The provisioner
# passes the slow class's parameters at CreateVolume, csi-resizer calls ControllerModifyVolume
# for the move, and the node puts both into the pod's cgroup (io.max): the pod's measured
# write rate follows, with no restart and no remount. A class asking a dir volume for limits
# is refused, and the claim says why.
. "$(dirname "$0")/../lib.sh"
start_story
slow=e2e-io-slow fast=e2e-io-fast dirclass=e2e-io-dir
# A class in use is kept (kubernetes.io/vac-protection) until its last claim goes: the delete
# is asked without waiting, and completes when story_cleanup deletes the namespace.
classes() { k delete volumeattributesclass "$slow" "$fast" "$dirclass" --ignore-not-found --wait=false >/dev/null 2>&1 || true; }
trap 'rc=$?; classes; (exit $rc); story_cleanup' EXIT
gone() { ! k get volumeattributesclass "$slow" "$fast" "$dirclass" >/dev/null 2>&1; }
classes
wait_for "VolumeAttributesClasses of an earlier run gone" "$E2E_TIMEOUT" gone ||
    fail "VolumeAttributesClasses $slow/$fast/$dirclass of an earlier run are still there"

k apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: $slow}
driverName: localvol.csi.dev
parameters: {writeBytesPerSecond: 4Mi}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: $fast}
driverName: localvol.csi.dev
parameters: {writeBytesPerSecond: 16Mi}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: $dirclass}
driverName: localvol.csi.dev
parameters: {writeIOPS: "100"}
EOF

claim() { # NAME STORAGECLASS ATTRIBUTESCLASS
    kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec:
  storageClassName: $2
  volumeAttributesClassName: $3
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 128Mi}}
EOF
}

# MiB/s of 32 MiB written with O_DIRECT over a file allocated beforehand (the pod's own
# clock: busybox time).
rate() {
    local secs
    # time's own report goes to stderr: only dd's is dropped (in the inner shell).
    secs=$(kn exec io -- time -f %e sh -c 'dd if=/dev/zero of=/data/f bs=1M count=32 oflag=direct conv=notrunc 2>/dev/null' 2>&1 | tail -1)
    python3 -c "import sys; print(round(32 / float(sys.argv[1]), 2))" "$secs" 2>/dev/null ||
        fail "could not time a write in the pod: $secs"
}
within() { python3 -c "import sys; m, l = map(float, sys.argv[1:]); sys.exit(0 if 0.85 * l <= m <= 1.1 * l else 1)" "$1" "$2"; }
current() { kn get pvc "$1" -o jsonpath='{.status.currentVolumeAttributesClassName}'; }

claim data localvol-thick "$slow"
sleeper_pod io data
kn exec io -- dd if=/dev/zero of=/data/f bs=1M count=32 2>/dev/null
kn exec io -- sync
expect_eq "the claim's current VolumeAttributesClass" "$(current data)" "$slow"
r1=$(rate)
say "slow class (4 MiB/s): the pod writes $r1 MiB/s"
within "$r1" 4 || fail "with writeBytesPerSecond 4Mi the pod wrote $r1 MiB/s (want 4 MiB/s within -15%/+10%)"

kn patch pvc data --type merge -p "{\"spec\":{\"volumeAttributesClassName\":\"$fast\"}}" >/dev/null
moved() { [ "$(current data)" = "$fast" ]; }
wait_for "claim moved to $fast" "$E2E_TIMEOUT" moved ||
    fail "the claim still reports class '$(current data)' ${E2E_TIMEOUT}s after moving it to $fast; conditions: $(kn get pvc data -o jsonpath='{.status.conditions}') events:
$(events_of PersistentVolumeClaim data)"
r2=$(rate)
say "fast class (16 MiB/s), same pod: it writes $r2 MiB/s"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 2.5 * float(sys.argv[2]) else 1)" "$r2" "$r1" ||
    fail "after moving the claim to $fast (16 MiB/s) the running pod writes $r2 MiB/s, was $r1"
restarts=$(kn get pod io -o jsonpath='{.status.containerStatuses[0].restartCount}')
expect_eq "the pod's restarts across the class change" "$restarts" 0
delete_pod io
delete_claim data

# A dir (quota) volume takes no limits: its I/O is the shared filesystem's.
claim dirdata localvol-quota "$dirclass"
apply_sleeper dir-io dirdata
refused() { events_of PersistentVolumeClaim dirdata | grep -q "apply to LVM volumes"; }
wait_for "refusal on the claim" "$E2E_TIMEOUT" refused ||
    fail "a quota claim with IO limits got no refusal; its events:
$(events_of PersistentVolumeClaim dirdata)"
delete_pod dir-io
delete_claim dirdata
say "IO limits followed the claim's VolumeAttributesClass in a running pod ($r1 -> $r2 MiB/s); a dir claim with limits was refused with the reason"
