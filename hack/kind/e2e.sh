#!/usr/bin/env bash
# kind end-to-end: TaskShard from the built images on a kind cluster, through one split.
#
# For hosts with Docker and image pulls (the kind node image comes from a registry). Steps:
#   1. preflight: a Docker daemon answers, a `kind` binary (PATH, cache, else `go install sigs.k8s.io/kind@$KIND_VERSION`
#      through the module proxy), the node image (present or pulled), kubectl and helm (PATH or the project cache,
#      else hack/build-binaries.sh)
#   2. kind create cluster; docker build --target operator|shard (hack/image/lib.sh); kind load docker-image both
#   3. helm install charts/taskshard-operator with image.*, clusterWide: true (and shardImage.* when the chart
#      declares it)
#   4. a producer pod appends events to the journal (hostPath /srv/taskshard on the node, owned by uid 10001)
#   5. kubectl apply the Task from examples/task-count-journal.yaml (image -> the loaded shard image, small
#      requests so that three shard pods fit a small node); wait until its shards are Running (TaskShard phase
#      and driver pod)
#   6. kubectl patch taskshard <the [0, 64) shard> --type merge -p '{"spec":{"split":{"requested":true}}}';
#      wait for the parent's phase Split and its two children Running (phase and pod)
#   7. on failure: TaskShards, pods, operator and shard logs, `kind export logs`; always: delete the cluster
#      (TASKSHARD_KIND_KEEP=1 keeps it)
#
# Exit status: 0 passed; 1 failed; 3 this host cannot run it (no Docker, no kind, node image not pullable): the
# printed `UNAVAILABLE: <reason>` line says why (the pytest wrapper skips).
#
# Usage: hack/kind/e2e.sh [--preflight]       (--preflight: step 1 only)
# Environment:
#   KIND_VERSION                kind to build when none is found (default v0.33.0)
#   KIND                        a kind binary to use
#   TASKSHARD_KIND_NODE_IMAGE   node image (default: the one kind $KIND_VERSION pins, by digest)
#   TASKSHARD_KIND_CLUSTER      cluster name (default taskshard-e2e)
#   TASKSHARD_KIND_KEEP=1       keep the cluster (and print its KUBECONFIG) after the run
#   TASKSHARD_KIND_TIMEOUT      seconds to wait for each of "shards Running" and "split done" (default 900)
#   TASKSHARD_BASE_IMAGE        BASE_IMAGE for the build (default: the Dockerfile's, debian:bookworm-slim);
#                               `debootstrap` builds one locally as hack/image/check.sh does
#   TASKSHARD_IMAGE_TAG         tag of both images (default e2e)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=SCRIPTDIR/../image/lib.sh
source "$repo/hack/image/lib.sh"
# shellcheck source=SCRIPTDIR/../versions.env
source "$repo/hack/versions.env"

KIND_VERSION=${KIND_VERSION:-v0.33.0}
# kind v0.33.0's default node image (sigs.k8s.io/kind pkg/apis/config/defaults/image.go).
DEFAULT_NODE_IMAGE=kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5
NODE_IMAGE=${TASKSHARD_KIND_NODE_IMAGE:-$DEFAULT_NODE_IMAGE}
CLUSTER=${TASKSHARD_KIND_CLUSTER:-taskshard-e2e}
TAG=${TASKSHARD_IMAGE_TAG:-e2e}
TIMEOUT=${TASKSHARD_KIND_TIMEOUT:-900}
BIN_CACHE=${TASKSHARD_BIN_CACHE:-$HOME/.cache/taskshard/bin}
OPERATOR_IMAGE=taskshard/operator:$TAG
SHARD_IMAGE=taskshard/shard:$TAG
OP_NS=taskshard-system
NS=taskshard-e2e
RELEASE=taskshard
TASK_FILE=$repo/examples/task-count-journal.yaml
TASK=orders-count
NODE_DATA=/srv/taskshard

log() { printf '[kind-e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
unavailable() { log "UNAVAILABLE: $*"; printf 'UNAVAILABLE: %s\n' "$*"; exit "$IMG_UNAVAILABLE"; }

# ---------------------------------------------------------------- step 1: preflight

find_kind() {
  if [[ -n ${KIND:-} ]]; then
    [[ -x $KIND ]] || unavailable "KIND=$KIND is not an executable"
    return
  fi
  local cached=$BIN_CACHE/kind-$KIND_VERSION/bin/kind
  if command -v kind >/dev/null 2>&1; then KIND=$(command -v kind); return; fi
  if [[ -x $cached ]]; then KIND=$cached; return; fi
  command -v go >/dev/null 2>&1 || unavailable "no kind binary (PATH, $cached) and no Go to build sigs.k8s.io/kind@$KIND_VERSION"
  log "building kind $KIND_VERSION: go install sigs.k8s.io/kind@$KIND_VERSION (into $BIN_CACHE/kind-$KIND_VERSION)"
  local work; mkdir -p "$BIN_CACHE"; work=$(mktemp -d "$BIN_CACHE/.build-kind.XXXXXX")
  if ! GOBIN=$work/bin GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
      "sigs.k8s.io/kind@$KIND_VERSION" > "$work/build.log" 2>&1; then
    local reason; reason=$(tail -n 3 "$work/build.log" | tr '\n' ' ')
    rm -rf "$work"
    unavailable "kind is not installed and go install sigs.k8s.io/kind@$KIND_VERSION failed: $reason"
  fi
  rm -rf "$BIN_CACHE/kind-$KIND_VERSION"; mkdir -p "$BIN_CACHE/kind-$KIND_VERSION"
  mv "$work/bin" "$BIN_CACHE/kind-$KIND_VERSION/bin"; rm -rf "$work"
  KIND=$cached
}

# find_tool NAME COMPONENT DIR: the project's cached binary, else PATH, else build it with hack/build-binaries.sh.
find_tool() {
  local name=$1 component=$2 dir=$3
  if [[ -x $dir/$name ]]; then echo "$dir/$name"; return; fi
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return; fi
  log "$name: building it (hack/build-binaries.sh $component)"
  bash "$repo/hack/build-binaries.sh" "$component" >&2 || die "could not build $name (hack/build-binaries.sh $component)"
  echo "$dir/$name"
}

preflight() {
  command -v "$DOCKER" >/dev/null 2>&1 || unavailable "no docker client on PATH"
  local info
  if ! info=$("$DOCKER" info --format '{{.ServerVersion}}' 2>&1); then
    unavailable "no Docker daemon answers at ${DOCKER_HOST:-the default socket}: $(tail -n 1 <<<"$info")"
  fi
  log "docker: daemon $info at ${DOCKER_HOST:-the default socket}"
  find_kind
  log "kind: $KIND ($("$KIND" version 2>/dev/null || echo '?'))"
  if "$DOCKER" image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
    log "node image: $NODE_IMAGE (present)"
  else
    log "node image: docker pull $NODE_IMAGE"
    local out
    if ! out=$("$DOCKER" pull "$NODE_IMAGE" 2>&1); then
      unavailable "the kind node image $NODE_IMAGE cannot be pulled: $(tail -n 1 <<<"$out" | cut -c1-300)"
    fi
  fi
  KUBECTL=${KUBECTL:-$(find_tool kubectl kubernetes "$BIN_CACHE/kubernetes-$KUBERNETES_VERSION/bin")}
  HELM=${HELM:-$(find_tool helm helm "$BIN_CACHE/helm-$HELM_VERSION/bin")}
  log "kubectl: $KUBECTL; helm: $HELM"
}

# ---------------------------------------------------------------- helpers

k() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# wait_for SECONDS DESCRIPTION CMD...: until CMD succeeds (exit 0); fails with DESCRIPTION and CMD's last output
# on timeout, or at once when CMD exits 99 (a state it cannot leave, e.g. a pod that Failed).
GIVE_UP=99
wait_for() {
  local timeout=$1 what=$2 deadline out="" rc; shift 2
  deadline=$(( $(date +%s) + timeout ))
  log "waiting (up to ${timeout}s) for $what"
  while true; do
    rc=0; out=$("$@" 2>&1) || rc=$?
    if [[ $rc -eq 0 ]]; then
      log "done: $what"
      return 0
    fi
    [[ $rc -eq $GIVE_UP ]] && die "gave up waiting for $what: $out"
    (( $(date +%s) > deadline )) && die "timed out after ${timeout}s waiting for $what; last: $out"
    sleep 3
  done
}

phase_of() { k -n "$NS" get taskshard "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
pod_phase_of() { k -n "$NS" get pods -l "taskshard.io/shard=$1" -o jsonpath='{.items[*].status.phase}' 2>/dev/null; }

# shard_running NAME: the TaskShard's phase is Running and its driver pod runs.
shard_running() {
  local phase pod
  phase=$(phase_of "$1"); pod=$(pod_phase_of "$1")
  echo "$1: phase=${phase:-none} pod=${pod:-none}"
  [[ $phase == Failed ]] && return $GIVE_UP
  [[ $phase == Running && $pod == Running ]]
}

initial_shards_running() {
  local names n name ok=0
  names=$(k -n "$NS" get taskshards -l "taskshard.io/task=$TASK" -o jsonpath='{.items[*].metadata.name}')
  n=$(wc -w <<<"$names")
  echo "shards: ${names:-none}"
  [[ $n -eq $INITIAL_SHARDS ]] || return 1
  for name in $names; do
    shard_running "$name" || { local rc=$?; [[ $rc -eq $GIVE_UP ]] && return $GIVE_UP; ok=1; }
  done
  return $ok
}

split_done() {
  local phase children child ok=0
  phase=$(phase_of "$PARENT")
  children=$(k -n "$NS" get taskshard "$PARENT" -o jsonpath='{.status.lineage.children[*]}')
  echo "$PARENT: phase=${phase:-none} children=${children:-none}"
  [[ $(wc -w <<<"$children") -eq 2 ]] || return 1
  for child in $children; do
    shard_running "$child" || { local rc=$?; [[ $rc -eq $GIVE_UP ]] && return $GIVE_UP; ok=1; }
  done
  [[ $phase == Failed ]] && return $GIVE_UP
  [[ $phase == Split ]] || return 1
  return $ok
}

# produce NAME N SEED: a pod of the shard image appends N generated events to the Task's journal.
produce() {
  local name=$1 n=$2 seed=$3
  k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name, labels: {app.kubernetes.io/name: taskshard-e2e-producer}}
spec:
  restartPolicy: Never
  securityContext: {runAsUser: 10001, runAsGroup: 10001, runAsNonRoot: true}
  containers:
    - name: produce
      image: $SHARD_IMAGE
      imagePullPolicy: IfNotPresent
      command: [python, -m, spark_runtime, produce, --journal, /data/journal/orders, --partitions, "4",
                --generate, "$n", --keys, "200", --field, "", --seed, "$seed"]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, hostPath: {path: $NODE_DATA, type: DirectoryOrCreate}}]
EOF
  wait_for 300 "producer pod $name to succeed" pod_succeeded "$name"
}

pod_succeeded() {
  local phase
  phase=$(k -n "$NS" get pod "$1" -o jsonpath='{.status.phase}')
  echo "$1: ${phase:-none}"
  if [[ $phase == Failed ]]; then
    k -n "$NS" logs "$1" --tail=20 || true
    return $GIVE_UP
  fi
  [[ $phase == Succeeded ]]
}

diagnostics() {
  log "---- diagnostics (cluster $CLUSTER) ----"
  k get tasks,taskshards -A -o wide >&2 || true
  k get pods -A -o wide >&2 || true
  k -n "$NS" get taskshards -o yaml 2>/dev/null | grep -A 12 '^  status:' | head -n 120 >&2 || true
  local deploy pod
  deploy=$(k -n "$OP_NS" get deploy -o name 2>/dev/null | head -n 1)
  if [[ -n $deploy ]]; then
    log "---- operator logs ($deploy) ----"
    k -n "$OP_NS" logs "$deploy" --tail=200 >&2 || true
  fi
  for pod in $(k -n "$NS" get pods -o name 2>/dev/null); do
    log "---- $pod ----"
    k -n "$NS" describe "$pod" 2>/dev/null | sed -n '/^Events:/,$p' | tail -n 15 >&2 || true
    k -n "$NS" logs "$pod" --all-containers --tail=60 >&2 || true
  done
  "$KIND" export logs --name "$CLUSTER" "$WORK/kind-logs" >/dev/null 2>&1 && log "kind logs: $WORK/kind-logs"
}

cleanup() {
  local rc=$?
  if [[ -n ${CLUSTER_CREATED:-} ]]; then
    [[ $rc -ne 0 ]] && diagnostics
    if [[ ${TASKSHARD_KIND_KEEP:-0} == 1 ]]; then
      log "keeping cluster $CLUSTER: export KUBECONFIG=$KUBECONFIG_FILE   (delete: $KIND delete cluster --name $CLUSTER)"
    else
      log "deleting cluster $CLUSTER"
      "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    fi
  fi
  exit $rc
}

# ---------------------------------------------------------------- main

mode=run
for arg in "$@"; do
  case $arg in
    --preflight) mode=preflight ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

preflight
[[ $mode == preflight ]] && { log "preflight passed"; exit 0; }

start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskshard-kind.XXXXXX")
KUBECONFIG_FILE=$WORK/kubeconfig
trap cleanup EXIT
trap 'exit 130' INT TERM

# Step 2: cluster and images.
if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "deleting the stale cluster $CLUSTER"
  "$KIND" delete cluster --name "$CLUSTER"
fi
log "kind create cluster --name $CLUSTER --image $NODE_IMAGE"
CLUSTER_CREATED=1
"$KIND" create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --kubeconfig "$KUBECONFIG_FILE" --wait 300s

base=${TASKSHARD_BASE_IMAGE:-}
if [[ $base == debootstrap ]]; then img_ensure_base_image; base=$IMG_BASE_IMAGE; fi
img_build operator "$OPERATOR_IMAGE" "$base"
img_build shard "$SHARD_IMAGE" "$base"
log "kind load docker-image $OPERATOR_IMAGE $SHARD_IMAGE"
"$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$SHARD_IMAGE"

# The shard pods run as uid 10001 and mount the node's $NODE_DATA (hostPath): make it theirs.
for node in $("$KIND" get nodes --name "$CLUSTER"); do
  "$DOCKER" exec "$node" sh -c "mkdir -p $NODE_DATA && chown 10001:10001 $NODE_DATA"
done

# Step 3: the chart.
chart=$repo/charts/taskshard-operator
values=(--set image.repository=taskshard/operator --set "image.tag=$TAG" --set clusterWide=true)
# shardImage.* only where the chart declares it (its schema refuses unknown keys); Tasks name their image anyway.
if grep -q '^shardImage:' "$chart/values.yaml"; then
  values+=(--set shardImage.repository=taskshard/shard --set "shardImage.tag=$TAG")
fi
log "helm install $RELEASE charts/taskshard-operator (namespace $OP_NS) ${values[*]}"
"$HELM" --kubeconfig "$KUBECONFIG_FILE" install "$RELEASE" "$chart" --namespace "$OP_NS" --create-namespace \
  "${values[@]}" --wait --timeout 5m
k -n "$OP_NS" get pods -o wide >&2

# Step 4: events, then step 5: the Task.
k create namespace "$NS" >/dev/null
produce produce-1 2000 1
INITIAL_SHARDS=$(sed -n 's/^ *initialShards: *\([0-9]*\).*/\1/p' "$TASK_FILE")
[[ -n $INITIAL_SHARDS ]] || die "$TASK_FILE names no spec.initialShards"
patch=$(printf '{"spec":{"spark":{"image":"%s","imagePullPolicy":"IfNotPresent","resources":{"requests":{"cpu":"250m","memory":"1Gi"},"limits":{"memory":"1536Mi"}}}}}' "$SHARD_IMAGE")
log "kubectl apply -f $TASK_FILE (spark.image=$SHARD_IMAGE, requests cpu 250m / memory 1Gi)"
k patch --local -f "$TASK_FILE" --type merge -p "$patch" -o yaml | k -n "$NS" apply -f -
wait_for "$TIMEOUT" "the $INITIAL_SHARDS initial shards of $TASK to run" initial_shards_running
k -n "$NS" get taskshards -o wide >&2

# Step 6: split the shard that owns key group 0.
PARENT=$(k -n "$NS" get taskshards -l "taskshard.io/task=$TASK" -o jsonpath='{.items[?(@.spec.keyGroups.start==0)].metadata.name}')
[[ -n $PARENT ]] || die "no shard of $TASK owns key group 0"
log "kubectl patch taskshard $PARENT --type merge -p '{\"spec\":{\"split\":{\"requested\":true}}}'"
k -n "$NS" patch taskshard "$PARENT" --type merge -p '{"spec":{"split":{"requested":true}}}'
wait_for "$TIMEOUT" "$PARENT to split into two running children" split_done
produce produce-2 1000 2
k -n "$NS" get tasks,taskshards -o wide >&2

log "PASSED in $(( $(date +%s) - start ))s"
echo "e2e: passed seconds=$(( $(date +%s) - start )) parent=$PARENT children=$(k -n "$NS" get taskshard "$PARENT" -o jsonpath='{.status.lineage.children[*]}' | tr ' ' ',')"
