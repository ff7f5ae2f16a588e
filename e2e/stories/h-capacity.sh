#!/usr/bin/env bash
# Story h — a claim larger than any pool: the pod stays Pending with the scheduler saying
# there is not enough storage, and the provisioner is not asked again and again.
. "$(dirname "$0")/../lib.sh"
start_story

creates() { # CreateVolume calls the node plugin has served (its /metrics, through the API server)
    local pod
    pod=$(k -n "$E2E_NS" get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}')
    k get --raw "/api/v1/namespaces/$E2E_NS/pods/$pod:9808/proxy/metrics" |
        awk '/^localvol_rpc_requests_total/ && /CreateVolume/ {s += $NF} END {print s + 0}'
}
before=$(creates)
pvc huge localvol-thick 1Ti
apply_sleeper wants-huge huge
told() { events_of Pod wants-huge | grep -qi "enough free storage\|storage capacity"; }
wait_for "scheduler event about capacity" 120 told ||
    fail "the pod of a 1Ti claim shows no capacity reason; its events:
$(events_of Pod wants-huge)"
sleep 30
expect_eq "claim phase" "$(kn get pvc huge -o jsonpath='{.status.phase}')" Pending
expect_eq "pod phase" "$(kn get pod wants-huge -o jsonpath='{.status.phase}')" Pending
after=$(creates)
[ $((after - before)) -le 2 ] || fail "the node plugin served $((after - before)) CreateVolume calls for a claim that fits nowhere (a retry storm)"
say "1Ti claim stays Pending: $(events_of Pod wants-huge | tail -1)"
