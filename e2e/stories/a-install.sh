#!/usr/bin/env bash
# Story a — install with the chart, as a user does: the node plugin becomes Ready, the
# CSINode lists localvol with its topology key and the pools' storage identities, and
# every class gets CSIStorageCapacity objects for the scheduler.
. "$(dirname "$0")/../lib.sh"
install_driver

node=$(k get nodes -o jsonpath='{.items[0].metadata.name}')
csinode_driver() {
    k get csinode "$node" -o jsonpath='{.spec.drivers[?(@.name=="localvol.csi.dev")].name}' | grep -q .
}
wait_for "CSINode lists localvol" 60 csinode_driver ||
    fail "CSINode $node does not list localvol.csi.dev: $(k get csinode "$node" -o yaml)"
keys=$(k get csinode "$node" -o jsonpath='{.spec.drivers[?(@.name=="localvol.csi.dev")].topologyKeys}')
case "$keys" in *topology.localvol.csi.dev/node*) ;; *) fail "CSINode topology keys are $keys, want topology.localvol.csi.dev/node" ;; esac
ident=$(k get csinode "$node" -o json | python3 -c '
import json, sys
a = json.load(sys.stdin)["metadata"].get("annotations", {})
print(next((v for k, v in a.items() if "localvol.csi.dev" in k), ""))')
for pool in quota thick thin; do
    case "$ident" in *"\"$pool\""*) ;; *) fail "CSINode's storage identity annotation lacks pool $pool: '$ident'" ;; esac
done

# The node's topology label, set by kubelet from NodeGetInfo.
label=$(k get node "$node" -o jsonpath='{.metadata.labels.topology\.localvol\.csi\.dev/node}')
expect_eq "node label topology.localvol.csi.dev/node" "$label" "$node"

capacity_for() { # CLASS: a CSIStorageCapacity with a capacity > 0
    k -n "$E2E_NS" get csistoragecapacities -o json | python3 -c '
import json, sys
items = [i for i in json.load(sys.stdin)["items"] if i["storageClassName"] == sys.argv[1]]
sys.exit(0 if any(i.get("capacity", "0") not in ("0", "") for i in items) else 1)' "$1"
}
for class in localvol-quota localvol-thick localvol-thin localvol-encrypted; do
    wait_for "capacity of $class" 120 capacity_for "$class" ||
        fail "no CSIStorageCapacity with room for class $class after 120 s: $(k -n "$E2E_NS" get csistoragecapacities -o wide 2>&1)"
done
say "DaemonSet Ready; CSINode, topology label, storage identities and capacity per class present"
