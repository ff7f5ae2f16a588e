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
  restartPolicy: Never
  containers:
    - name: c
      image: $E2E_IMAGE
      command: [sh, -c, "dd if=/dev/zero of=/scratch/f bs=1M count=8 conv=fsync && df -kP /scratch | tail -1"]
      volumeMounts: [{name: s, mountPath: /scratch}]
  volumes:
    - name: s
      csi: {driver: localvol.csi.dev, volumeAttributes: {size: 32Mi, pool: quota}}
YAML
out=$(pod_finish scratch)
size=$(echo "$out" | awk 'END {print $2}')
[ "${size:-0}" -gt 0 ] && [ "$size" -le 33000 ] || fail "the inline volume is not 32Mi in the pod: $out"
delete_pod scratch
gone() { [ -z "$(on_node ls /var/lib/localvol-dirpool/quota/volumes)" ]; }
wait_for "inline volume removed" 60 gone ||
    fail "the inline volume's directory is still on the node after its pod was deleted"
say "inline volume of 32Mi served the pod and went with it"
