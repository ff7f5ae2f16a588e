#!/usr/bin/env bash
# Story l — kubelet restart and node reboot: pods on every kind of volume (thin xfs, thick
# ext4, encrypted, quota dir, raw block) keep their data. A kubelet restart leaves the running
# pods alone; after a reboot (the VM powered down and up again on the same disks) kubelet
# stages and publishes every volume again and the pods come back with their data.
# Restarting kubelet and rebooting are the operator's actions; the rest is kubectl.
. "$(dirname "$0")/../lib.sh"
start_story

vols="thin:localvol-thin:300Mi thick:localvol-thick:64Mi enc:localvol-encrypted:64Mi dir:localvol-quota:32Mi"
# All claims and pods at once, as a user's manifests arrive; then each one waited for.
for v in $vols; do
    IFS=: read -r name class size <<<"$v"
    pvc "$name" "$class" "$size"
    apply_sleeper "p-$name" "$name"
done
pvc raw localvol-thick 16Mi Block
apply_sleeper p-raw raw Block
for v in $vols raw; do wait_running "p-${v%%:*}"; done
for v in $vols; do
    IFS=: read -r name class size <<<"$v"
    kn exec "p-$name" -- sh -c "echo $name-kept >/data/keep && sync" ||
        fail "pod p-$name could not write to its $class volume"
done
kn exec p-raw -- sh -c 'echo raw-kept | dd of=/dev/xvda conv=fsync 2>/dev/null' ||
    fail "pod p-raw could not write to its block device"

data_kept() { # WHEN: every pod reads back what it wrote
    local v name got
    for v in $vols; do
        name=${v%%:*}
        got=$(kn exec "p-$name" -- cat /data/keep 2>&1) || true
        expect_eq "$1: data of the $name volume" "$got" "$name-kept"
    done
    got=$(kn exec p-raw -- sh -c 'dd if=/dev/xvda bs=9 count=1 2>/dev/null' 2>&1) || true
    expect_eq "$1: first bytes of the raw block volume" "$got" raw-kept
}
restarts() { kn get pod "$1" -o jsonpath='{.status.containerStatuses[0].restartCount}'; }
node_name() { k get nodes -o jsonpath='{.items[0].metadata.name}'; }
heartbeat_after() { # the node's Ready heartbeat is newer than $1 (RFC 3339 sorts as text)
    [[ "$(k get node "$(node_name)" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}')" > "$1" ]] &&
        [ "$(k get node "$(node_name)" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
new_claim_mounts() { # TAG WHEN
    pvc "after-$1" localvol-thick 32Mi
    run_pod "after-$1" "after-$1" 'echo ok >/data/f && cat /data/f' | grep -q ok ||
        fail "a pod created after the $2 could not use a new volume"
    delete_pod "after-$1"
    delete_claim "after-$1"
}

# 1. kubelet restarts (as `systemctl restart kubelet` does): running pods are not touched.
t=$(date -u +%Y-%m-%dT%H:%M:%SZ)
sleep 1
on_node pkill -x kubelet || fail "no kubelet to restart on the node"
wait_for "kubelet back" "$E2E_TIMEOUT" heartbeat_after "$t" ||
    fail "the node did not report Ready again within ${E2E_TIMEOUT}s of a kubelet restart"
data_kept "after a kubelet restart"
for v in $vols raw; do
    expect_eq "restarts of pod p-${v%%:*} after a kubelet restart" "$(restarts "p-${v%%:*}")" 0
done
new_claim_mounts kubelet "kubelet restart"

# 2. The node reboots: every mount and dm device is gone; kubelet brings the pods back.
"$E2E_CLUSTER" node-restart >/dev/null || fail "the node did not come back from a reboot"
back() { # POD: running again after the reboot (its container restarted) and Ready
    [ "$(restarts "$1")" -ge 1 ] &&
        [ "$(kn get pod "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
for v in $vols raw; do
    p=p-${v%%:*}
    wait_for "pod $p back" $((2 * E2E_TIMEOUT)) back "$p" ||
        fail "pod $p did not come back within $((2 * E2E_TIMEOUT))s of the node's reboot (restarts $(restarts "$p"), phase $(kn get pod "$p" -o jsonpath='{.status.phase}')); pod events:
$(events_of Pod "$p" | tail -8)"
done
data_kept "after the node rebooted"
new_claim_mounts reboot "node reboot"

pods=() claims=()
for v in $vols raw; do pods+=("p-${v%%:*}"); claims+=("${v%%:*}"); done
delete_pods "${pods[@]}"
delete_claims "${claims[@]}"
say "pods on thin, thick, encrypted, quota and raw volumes kept their data through a kubelet restart (not restarted) and a node reboot (restarted, volumes staged again)"
