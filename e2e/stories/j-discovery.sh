#!/usr/bin/env bash
# Story j — static discovery: a disk the operator mounts below /mnt/disks becomes a PV, a
# claim binds to it and a pod writes; once released it is cleaned and offered again, empty.
# The only node-side action is the operator's own: making and mounting the disk.
. "$(dirname "$0")/../lib.sh"
start_story
disk=e2e-disk-$$
on_node sh -c "set -e; mkdir -p /var/lib/e2e-disks /mnt/disks/$disk
truncate -s 64M /var/lib/e2e-disks/$disk.img
mkfs.ext4 -q /var/lib/e2e-disks/$disk.img
mount -o loop /var/lib/e2e-disks/$disk.img /mnt/disks/$disk" || fail "could not make the test disk on the node"
unmount_disk() { # as an operator takes a disk out: unmount it, then delete its PV
    on_node sh -c "umount /mnt/disks/$disk; rmdir /mnt/disks/$disk; rm -f /var/lib/e2e-disks/$disk.img" || true
    local p
    for p in $(pv_for_disk); do k delete pv "$p" --wait=false >/dev/null 2>&1 || true; done
}
trap 'rc=$?; unmount_disk; (exit $rc); story_cleanup' EXIT

pv_for_disk() { k get pv -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    path = p["metadata"].get("annotations", {}).get("localvol.csi.dev/path")
    if p["spec"].get("storageClassName") == "local-disks" and path == "/mnt/disks/" + sys.argv[1] \
       and p["status"].get("phase") == "Available":
        print(p["metadata"]["name"])' "$disk"; }
offered() { [ -n "$(pv_for_disk)" ]; }
wait_for "PV for the disk" "$E2E_TIMEOUT" offered ||
    fail "no Available PV of class local-disks for /mnt/disks/$disk after ${E2E_TIMEOUT}s: $(k get pv 2>&1)"
first=$(pv_for_disk)

pvc data local-disks 32Mi
out=$(run_pod w data 'echo secret >/data/f && sync && cat /data/f')
echo "$out" | grep -q secret || fail "the pod could not write to the discovered disk: $out"
bound=$(pv_of data)
expect_eq "PV the claim bound to" "$bound" "$first"
delete_pod w
kn delete pvc data --wait=true >/dev/null
# Released, cleaned, then Available again (pv_for_disk lists Available PVs only).
wait_for "disk offered again" "$E2E_TIMEOUT" offered ||
    fail "the released disk was not cleaned and offered again in ${E2E_TIMEOUT}s: $(k get pv 2>&1)
events: $(k get events -A --field-selector involvedObject.name="$first" -o custom-columns=R:.reason,M:.message --no-headers)"

pvc again local-disks 32Mi
out=$(run_pod r again 'ls -A /data | grep -v lost+found | wc -l')
expect_eq "files left on the disk after cleanup" "$(echo "$out" | tail -1)" 0
delete_pod r
kn delete pvc again --wait=true >/dev/null
# Let the cleanup finish before the disk is taken away.
wait_for "disk offered again" "$E2E_TIMEOUT" offered || true
say "discovered disk bound, written, cleaned and offered again empty"
