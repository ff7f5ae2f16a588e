#!/usr/bin/env bash
# Story n — one broken disk never takes the plugin down: a pod on the thick LVM pool runs
# while the quota dir pool's storage disappears on the same node (its volumes/ directory
# renamed away: to the driver, a lost or unmounted disk looks the same). The Node gets a
# PoolUnusable Event, the quota class's CSIStorageCapacity drops to 0, a pod with a claim of
# that class stays Pending saying why, the node plugin is neither restarted nor unready for
# longer than its liveness probe would take to restart it, and the thick pool serves old and
# new pods. Once the directory is back: a PoolUsable Event, capacity again, and the Pending
# pod runs, still without a restart. Breaking and mending the disk are the operator's (the
# hardware's) actions on the node; the rest is kubectl.
. "$(dirname "$0")/../lib.sh"
start_story
pool=/var/lib/localvol-dirpool/quota # the quota pool's path (e2e/values.yaml)
away=$pool/volumes.e2e-broken-pool   # same filesystem: a rename, the inode the driver opened kept
# Puts volumes/ back, once this story took it away (never a stale copy of an earlier run),
# so the pool serves again and its claims can be deleted.
broken=
restore() { [ -z "$broken" ] || { on_node mv -T "$away" "$pool/volumes" && broken=; }; }
trap 'rc=$?; restore >/dev/null || { say "could not put $pool/volumes back on the node"; rc=1; }; (exit $rc); story_cleanup' EXIT

plugin_of() { k -n "$E2E_NS" get pods -l app.kubernetes.io/component=node --field-selector "spec.nodeName=$1" -o jsonpath='{.items[0].metadata.name}'; }
restarts() { k -n "$E2E_NS" get pod "$plugin" -o jsonpath='{range .status.containerStatuses[*]}{.name}={.restartCount} {end}'; }
ready() { k -n "$E2E_NS" get pod "$plugin" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'; }
plugin_log() { k -n "$E2E_NS" logs "$plugin" -c localvol --tail=8 2>&1; }
node_events() {
    k get events -A --field-selector "involvedObject.kind=Node,involvedObject.name=$node" \
        -o custom-columns=REASON:.reason,MESSAGE:.message --no-headers 2>&1 | tail -6
}
pool_events() { # REASON: "uid:resourceVersion" of each of the node's REASON Events about pool quota
    k get events -A --field-selector "involvedObject.kind=Node,involvedObject.name=$node,reason=$1" \
        -o jsonpath='{range .items[*]}{.metadata.uid}:{.metadata.resourceVersion} {.message}{"\n"}{end}' |
        { grep -F "pool quota is" || true; } | cut -d' ' -f1 | sort
}
# An Event, or a repeat of an earlier one (the recorder counts repeats in one object), since BEFORE.
new_event() { [ -n "$(comm -13 <(echo "$2") <(pool_events "$1"))" ]; }
capacity() { # CLASS: its CSIStorageCapacity on this node ("" when it has none)
    k -n "$E2E_NS" get csistoragecapacities -o json | python3 -c '
import json, sys
for i in json.load(sys.stdin)["items"]:
    t = (i.get("nodeTopology") or {}).get("matchLabels") or {}
    if i["storageClassName"] == sys.argv[1] and t.get("topology.localvol.csi.dev/node") == sys.argv[2]:
        print(i.get("capacity", "0"))' "$1" "$node"
}
cap_zero() { [ "$(capacity localvol-quota)" = 0 ]; }
cap_some() { local c; c=$(capacity localvol-quota); [ -n "$c" ] && [ "$c" != 0 ]; }

# 1. An application on the thick pool; the node plugin serving it.
pvc keep localvol-thick 64Mi
sleeper_pod p-keep keep
kn exec p-keep -- sh -c 'echo kept >/data/keep && sync' || fail "pod p-keep could not write to its thick volume"
node=$(kn get pod p-keep -o jsonpath='{.spec.nodeName}')
plugin=$(plugin_of "$node")
[ -n "$plugin" ] || fail "no localvol-node pod on $node, where p-keep runs"
# on_node acts on lv-node1 (the only node once story k has removed its second one).
expect_eq "node p-keep runs on (the node this story breaks a pool on)" "$node" lv-node1
before=$(restarts)
wait_for "quota capacity" 120 cap_some ||
    fail "class localvol-quota offers no capacity on $node before anything broke: '$(capacity localvol-quota)'"
unusable_before=$(pool_events PoolUnusable) || fail "could not list the Events of Node $node"
usable_before=$(pool_events PoolUsable) || fail "could not list the Events of Node $node"

# 2. The quota pool's disk goes (on the node, as a failed or unmounted disk would).
on_node sh -c "set -e; [ ! -e '$away' ]; mv -T '$pool/volumes' '$away'" ||
    fail "could not take $pool/volumes away on the node"
broken=1
wait_for "PoolUnusable" 90 new_event PoolUnusable "$unusable_before" ||
    fail "no PoolUnusable Event for pool quota on Node $node within 90 s of its directory going away: an operator sees nothing saying why; the Node's events:
$(node_events)
driver log:
$(plugin_log)"
seen=$SECONDS
wait_for "quota capacity 0" "$E2E_TIMEOUT" cap_zero ||
    fail "class localvol-quota still offers '$(capacity localvol-quota)' on $node ${E2E_TIMEOUT}s after its pool became unusable: the scheduler keeps sending claims to a broken disk"

# 3. A claim of the broken class waits, saying why (the scheduler: capacity 0; or, had it
# raced the capacity update, the provisioner: the pool is unusable).
pvc waits localvol-quota 16Mi
apply_sleeper p-waits waits
told() { events_of Pod p-waits | grep -qi "enough free storage\|storage capacity" || pod_claim_events p-waits | grep -qi "unusable"; }
wait_for "a reason for p-waits" 120 told ||
    fail "the pod of a localvol-quota claim, with its pool unusable, says neither capacity nor unusable; its events:
$(events_of Pod p-waits)
claim events:
$(pod_claim_events p-waits)"

# 4. The thick pool serves on: the running pod's data, a new claim and pod.
got=$(kn exec p-keep -- cat /data/keep 2>&1) || true
expect_eq "p-keep's data with the quota pool broken" "$got" kept
pvc fresh localvol-thick 32Mi
out=$(run_pod p-fresh fresh 'echo fresh >/data/f && sync && cat /data/f')
echo "$out" | grep -q fresh || fail "a new pod on a new thick claim could not write and read while the quota pool was broken: $out"
delete_pod p-fresh

# 5. No restart: a liveness that failed for the pool would have had kubelet restart the driver
# within ~120 s of the pool going bad (the driver's 60 s deadline, then 6 failures 10 s apart:
# e2e/values.yaml keeps the chart's probes), cutting every pool's volumes off their plugin.
quiet=$((seen + 130 - SECONDS))
[ "$quiet" -le 0 ] || sleep "$quiet"
expect_eq "the localvol-node pod on $node 130 s into the broken pool (another name: the pod was replaced)" "$(plugin_of "$node")" "$plugin"
expect_eq "restarts of $plugin's containers, 130 s into the broken pool (kubelet restarted the driver for a disk)" "$(restarts)" "$before"
expect_eq "Ready of $plugin with one pool broken" "$(ready)" True
expect_eq "phase of p-waits while its pool is broken" "$(kn get pod p-waits -o jsonpath='{.status.phase}')" Pending

# 6. The disk is back: the pool serves again without a restart.
restore || fail "could not put $pool/volumes back on the node"
wait_for "PoolUsable" 90 new_event PoolUsable "$usable_before" ||
    fail "no PoolUsable Event for pool quota on Node $node within 90 s of its directory coming back; the Node's events:
$(node_events)
driver log:
$(plugin_log)"
wait_for "quota capacity back" "$E2E_TIMEOUT" cap_some ||
    fail "class localvol-quota offers '$(capacity localvol-quota)' on $node ${E2E_TIMEOUT}s after its pool came back: new claims of it still cannot be scheduled"
wait_running p-waits
out=$(kn exec p-waits -- sh -c 'echo late >/data/f && sync && cat /data/f' 2>&1) || true
expect_eq "what p-waits wrote to its quota volume once the pool was back" "$out" late
expect_eq "restarts of $plugin's containers after the pool came back" "$(restarts)" "$before"

delete_pod p-waits
delete_pod p-keep
for c in waits fresh keep; do delete_claim "$c"; done
say "pool quota broken: PoolUnusable, capacity 0, its pod Pending, thick pods served, driver not restarted; restored: PoolUsable, capacity back, the pod ran"
