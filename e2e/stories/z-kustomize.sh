#!/usr/bin/env bash
# Story z — the other way to install: the Helm release is uninstalled and the kustomize base
# (deploy/kubernetes/base) applied instead, with only the image pointed at this build, as its
# kustomization.yaml tells a user to. A claim of its class `localvol-dir` binds and serves a
# pod; `kubectl delete -k` removes the install. Runs last (hence z: e2e/run runs the stories
# in name order): it leaves no driver behind for a story after it.
. "$(dirname "$0")/../lib.sh"
: "${E2E_DRIVER_IMAGE:?e2e/run sets the driver image reference}"
start_story
overlay=$(mktemp -d /var/tmp/e2e-kustomize.XXXXXX)
trap 'rc=$?; rm -rf "$overlay"; (exit $rc); story_cleanup' EXIT

"$E2E_CLUSTER" exec helm uninstall localvol -n "$E2E_NS" --wait >/dev/null || fail "helm uninstall failed"
no_plugin() { [ -z "$(k -n "$E2E_NS" get pods -o name)" ]; }
wait_for "the chart's pods gone" "$E2E_TIMEOUT" no_plugin ||
    fail "pods of the uninstalled release are still there: $(k -n "$E2E_NS" get pods 2>&1)"

# What a user writes: an overlay of the base that only sets the image (kustomize takes the
# base by a relative path only).
cat >"$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$overlay" "$E2E_ROOT/../deploy/kubernetes/base")
images:
  - name: localvol
    newName: ${E2E_DRIVER_IMAGE%:*}
    newTag: ${E2E_DRIVER_IMAGE##*:}
YAML
k apply -k "$overlay" >/dev/null || fail "kubectl apply -k of the base failed"
k -n localvol rollout status daemonset/localvol-node --timeout="${E2E_TIMEOUT}s" >&2 ||
    fail "the base's DaemonSet did not become Ready: $(k -n localvol get pods -o wide 2>&1)
$(k -n localvol get events --field-selector type=Warning -o custom-columns=OBJ:.involvedObject.name,REASON:.reason,MSG:.message --no-headers | tail -10)"

pvc data localvol-dir 16Mi
out=$(run_pod w data 'echo from-kustomize >/data/f && sync && cat /data/f')
echo "$out" | grep -q from-kustomize || fail "a pod could not use a volume of the base's class: $out"
delete_pod w
delete_claim data

k delete -k "$overlay" --wait=true --timeout="${E2E_TIMEOUT}s" >/dev/null 2>&1 ||
    fail "kubectl delete -k did not remove the install: $(k get ns localvol 2>&1)"
say "the kustomize base installed, served a claim and was removed"
