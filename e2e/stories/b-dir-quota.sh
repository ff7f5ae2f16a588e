#!/usr/bin/env bash
# Story b — a dir volume with an enforced size: WaitForFirstConsumer binds it when its pod
# is scheduled, the pod writes, a write past the size fails inside the pod, and deleting
# the pod and claim removes the directory from the node.
. "$(dirname "$0")/../lib.sh"
start_story

pvc data localvol-quota 32Mi
phase=$(kn get pvc data -o jsonpath='{.status.phase}')
expect_eq "claim phase before any pod (WaitForFirstConsumer)" "$phase" Pending

out=$(run_pod writer data '
dd if=/dev/zero of=/data/fits bs=1M count=16 conv=fsync 2>&1 && echo FITS
if err=$(dd if=/dev/zero of=/data/past bs=1M count=64 conv=fsync 2>&1); then echo PAST-WRITTEN; fi
echo "$err"; df -kP /data | tail -1')
echo "$out" | grep -q FITS || fail "writing 16 MiB into a 32 MiB volume failed: $out"
echo "$out" | grep -q PAST-WRITTEN && fail "writing 80 MiB into a 32 MiB volume succeeded (the size is not enforced): $out"
echo "$out" | grep -qi "quota exceeded\|no space" || fail "the write past the size failed, but not with EDQUOT/ENOSPC: $out"

pv=$(pv_of data)
handle=$(k get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
[ -n "$handle" ] || fail "PV $pv has no CSI volume handle"
node=$(k get pv "$pv" -o jsonpath='{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}')
[ -n "$node" ] || fail "PV $pv has no node affinity: a local volume must be pinned to its node"
# The volume's directory is named by the id in its handle (quota.<id>); other stories'
# volumes may share the pool.
dir=/var/lib/localvol-dirpool/quota/volumes/${handle#*.}
dir_is() { [ "$(on_node sh -c "test -e '$dir' && echo present || echo absent")" = "$1" ]; }
dir_is present || fail "no volume directory $dir on the node while the claim is bound"

delete_pod writer
delete_claim data
wait_for "directory removed" 60 dir_is absent ||
    fail "the volume's directory is still on the node after its claim was deleted: $(on_node ls -la "$dir")"
say "bound on first consumer, 16 MiB written, the write past 32 MiB refused, directory removed"
