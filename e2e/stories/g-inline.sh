#!/usr/bin/env bash
# Story g — a CSI ephemeral inline volume: the pod gets a sized scratch volume without a
# claim, and it is gone from the node once the pod is.
. "$(dirname "$0")/../lib.sh"
start_story

kn apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: scratch}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $E2E_IMAGE
      command: [sh, -c, "dd if=/dev/zero of=/scratch/f bs=1M count=8 conv=fsync && df -kP /scratch | tail -1 && exec sleep 100000"]
      volumeMounts: [{name: s, mountPath: /scratch}]
  volumes:
    - name: s
      csi: {driver: localvol.csi.dev, volumeAttributes: {size: 32Mi, pool: quota}}
YAML
wait_running scratch
wrote() { kn logs scratch 2>/dev/null | grep -q /scratch; }
wait_for "the pod's write" "$E2E_TIMEOUT" wrote || fail "the pod wrote nothing to its inline volume: $(kn logs scratch 2>&1)"
out=$(kn logs scratch)
size=$(echo "$out" | awk 'END {print $2}')
[ "${size:-0}" -gt 0 ] && [ "$size" -le 33000 ] || fail "the inline volume is not 32Mi in the pod: $out"
# The volume's record names its target path, under the pod's own directory (other stories'
# volumes may share the pool).
uid=$(kn get pod scratch -o jsonpath='{.metadata.uid}')
records() { on_node sh -c "grep -l -F '/pods/$uid/' /var/lib/localvol-dirpool/quota/volumes/*.json 2>/dev/null || true"; }
[ -n "$(records)" ] || fail "no inline volume of pod $uid in the quota pool while it runs: $(on_node ls /var/lib/localvol-dirpool/quota/volumes)"
delete_pod scratch
gone() { [ -z "$(records)" ]; }
wait_for "inline volume removed" 60 gone ||
    fail "the inline volume's directory is still on the node after its pod was deleted: $(records)"
say "inline volume of 32Mi served the pod and went with it"
