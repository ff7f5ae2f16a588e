#!/usr/bin/env bash
# Story f — encryption at rest: a pod on the encrypted class reads and writes; the LV on the
# node holds no plaintext. The same marker written to a plain volume IS found on its LV,
# which shows the check can see plaintext when it is there.
. "$(dirname "$0")/../lib.sh"
start_story
marker=LOCALVOL-E2E-PLAINTEXT-$RANDOM$RANDOM

# How many of the VG's volume LVs (lv-*) hold the marker, read on the node. Only volumes: a
# thin pool with no thin volume yet shows as /dev/lvvg/tp0, and grep -a over its 8 GiB of
# zeros (one "line") was OOM-killed in the node when this story ran right after a-install.
lvs_with_marker() {
    on_node sh -c "n=0; for d in /dev/lvvg/lv-*; do [ -e \"\$d\" ] || continue; grep -aq '$marker' \"\$d\" && n=\$((n+1)); done; echo \$n"
}

pvc secret localvol-encrypted 64Mi
out=$(run_pod w-enc secret "for i in \$(seq 200); do echo $marker; done >/data/m && sync && grep -c $marker /data/m")
echo "$out" | grep -q '^200$' || fail "the pod could not write and read back its encrypted volume: $out"
delete_pod w-enc
n=$(lvs_with_marker)
expect_eq "LVs holding the plaintext with only the encrypted volume written" "$n" 0

pvc plain localvol-thick 64Mi
run_pod w-plain plain "for i in \$(seq 200); do echo $marker; done >/data/m && sync" >/dev/null
delete_pod w-plain
n=$(lvs_with_marker)
expect_eq "LVs holding the plaintext once a plain volume has it (the check sees plaintext)" "$n" 1

delete_claim secret
delete_claim plain
say "the encrypted volume served the pod and its LV held no plaintext"
