#!/usr/bin/env bash
# Image build check: build both targets of the Dockerfile from a locally made Debian base and run them.
#
#   1. a Docker daemon: the one the environment names, else a private dockerd this script starts (installing
#      Debian's docker.io when dockerd is missing) and stops at exit; host networking only
#   2. the base image: debootstrap --variant=minbase <suite> (tarball cached under the cache dir, keyed by suite
#      and architecture) and `docker import`; no registry is contacted for images
#   3. docker build --network host --build-arg BASE_IMAGE=<imported> --target operator, then --target shard
#   4. runs, each with `--read-only --tmpfs /tmp:exec` as the chart runs them (read-only root, writable /tmp):
#      `taskshard-operator --help`, `python -m spark_runtime --help`, uid 10001, no compilers in either image,
#      `python` on PATH is the venv's, and hack/image/smoke_shard.py (Spark, Python workers, RocksDB) in the shard
#   5. a summary: times and image sizes, as `check: key=value` lines on stdout
#
# Exit status: 0 all passed; 1 a build or check failed; 3 this host cannot build images (no daemon can start,
# no Debian mirror, not root): the printed `UNAVAILABLE: <reason>` line says why (the pytest wrapper skips).
#
# Usage: hack/image/check.sh [--no-smoke] [--rebuild-base]
#   --no-smoke      skip the Spark smoke run in the shard image (30-100 s on 2 cores)
#   --rebuild-base  debootstrap the base again (the cached rootfs never picks up Debian updates by itself)
# Environment: see hack/image/lib.sh; TASKSHARD_IMAGE_TAG (default "check") tags the two images.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/lib.sh
source "$here/lib.sh"

smoke=1
rebuild_base=0
for arg in "$@"; do
  case $arg in
    --no-smoke) smoke=0 ;;
    --rebuild-base) rebuild_base=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

tag=${TASKSHARD_IMAGE_TAG:-check}
operator_image=taskshard/operator:$tag
shard_image=taskshard/shard:$tag
failures=()
fail() { img_log "CHECK FAILED: $*"; failures+=("$*"); }

trap img_cleanup EXIT
trap 'exit 130' INT TERM
total_start=$(date +%s)

img_timed dockerd img_ensure_docker
if [[ $rebuild_base -eq 1 ]]; then
  img_log "--rebuild-base: dropping the cached rootfs and base image (a fresh debootstrap picks up Debian updates)"
  "$DOCKER" image rm "$(img_base_image_name)" >/dev/null 2>&1 || true
  rm -f "$(img_base_tarball)"
fi
img_ensure_base_image
img_timed build_operator img_build operator "$operator_image"
img_timed build_shard img_build shard "$shard_image"

# The chart's runtime conditions: read-only root filesystem, an emptyDir at /tmp (exec allowed, like emptyDir).
run() { "$DOCKER" run --rm --network host --read-only --tmpfs /tmp:rw,exec,nosuid,size=1g "$@"; }

# expect_output DESCRIPTION PATTERN CMD...: CMD exits 0 and its output matches the extended regex PATTERN.
expect_output() {
  local what=$1 pattern=$2 out; shift 2
  if ! out=$("$@" 2>&1); then
    fail "$what: exit status non-zero: $(printf '%s' "$out" | tail -n 5 | tr '\n' ' ')"
  elif ! grep -qE -- "$pattern" <<<"$out"; then
    fail "$what: output does not match /$pattern/: $(printf '%s' "$out" | head -n 5 | tr '\n' ' ')"
  else
    img_log "ok: $what"
    grep -E '^smoke: ' <<<"$out" | sed 's/^/    /' >&2 || true
  fi
}

expect_output "operator: taskshard-operator --help" '^usage: taskshard-operator' run "$operator_image" --help
expect_output "shard: python -m spark_runtime --help" '^usage: ' run "$shard_image" --help
# The operator's shard pods override the entrypoint with this command line; its `python` must be the venv's.
expect_output "shard: python on PATH is the venv's" '^/opt/taskshard/bin/python$' \
  run --entrypoint sh "$shard_image" -c 'command -v python'
for image in "$operator_image" "$shard_image"; do
  expect_output "$image: runs as uid 10001" '^10001:10001$' run --entrypoint sh "$image" -c 'echo "$(id -u):$(id -g)"'
  expect_output "$image: no compilers or build tools" '^none$' run --entrypoint sh "$image" -c \
    'found=$(for t in gcc cc c++ g++ make ld as python3-config; do command -v $t; done); echo "${found:-none}"'
  expect_output "$image: OCI labels" 'org.opencontainers.image.version=' \
    "$DOCKER" image inspect --format '{{range $k, $v := .Config.Labels}}{{$k}}={{$v}}{{"\n"}}{{end}}' "$image"
done
expect_output "operator: no pyspark, no java" '^ok$' run --entrypoint sh "$operator_image" -c \
  'python -c "import pyspark" 2>/dev/null && echo has-pyspark; command -v java || echo ok'
if [[ $smoke -eq 1 ]]; then
  smoke_start=$(date +%s)
  expect_output "shard: Spark smoke (JRE, venv Python workers, key groups, RocksDB state)" '^smoke: ok' \
    run -v "$here/smoke_shard.py:/opt/smoke_shard.py:ro" --entrypoint python "$shard_image" /opt/smoke_shard.py
  IMG_TIMES["smoke"]=$(( $(date +%s) - smoke_start ))
fi

IMG_TIMES["total"]=$(( $(date +%s) - total_start ))
echo "check: base_image=$IMG_BASE_IMAGE"
echo "check: operator_image=$operator_image operator_size_mb=$(img_size_mb "$operator_image")"
echo "check: shard_image=$shard_image shard_size_mb=$(img_size_mb "$shard_image")"
for k in dockerd debootstrap import build_operator build_shard smoke total; do
  [[ -n ${IMG_TIMES[$k]:-} ]] && echo "check: time_${k}_s=${IMG_TIMES[$k]}"
done
if [[ ${#failures[@]} -gt 0 ]]; then
  img_log "${#failures[@]} check(s) failed:"
  printf '  - %s\n' "${failures[@]}" >&2
  exit 1
fi
img_log "all image checks passed"
# Earlier builds' images (untagged now) would pile up in the private data root; the layer cache stays.
if "$DOCKER" image prune --force >/dev/null 2>&1; then img_log "pruned dangling images"; fi
