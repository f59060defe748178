# shellcheck shell=bash
# Functions shared by hack/image/check.sh and hack/kind/e2e.sh (source this file; it defines, never runs).
#
#   img_use_docker         use the Docker daemon the environment names (DOCKER_HOST or the default socket)
#   img_ensure_docker      ...or, when none answers, install Debian's docker.io if dockerd is missing and start
#                          a private dockerd (host networking only, its own data root under the cache); it is
#                          stopped by img_cleanup when this script started it
#   img_ensure_base_image  a Debian base image: a debootstrap --variant=minbase rootfs (cached as a tarball,
#                          keyed by suite and architecture) imported with `docker import`
#   img_build TARGET TAG   docker build --network host --target TARGET of the repository's Dockerfile
#
# Exit codes: 3 (IMG_UNAVAILABLE) means "this host cannot do it" (no daemon possible, no mirror, not root):
# callers turn it into a skip. Any other failure exits 1.
#
# Environment:
#   TASKSHARD_IMAGE_CACHE   cache root (default ~/.cache/taskshard/image): rootfs tarballs, dockerd data root, logs
#   TASKSHARD_DEBIAN_SUITE  Debian suite of the base image (default bookworm)
#   TASKSHARD_DEBIAN_MIRROR mirror for debootstrap (default http://deb.debian.org/debian)
#   TASKSHARD_OWN_DOCKERD=1 always start the private dockerd, even when another daemon answers
#   TASKSHARD_KEEP_DOCKERD=1 leave the private dockerd running at exit (stop it: kill $(cat <cache>/dockerd/pid))
#   DOCKER                  the docker client (default: docker on PATH)

IMG_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMG_CACHE=${TASKSHARD_IMAGE_CACHE:-$HOME/.cache/taskshard/image}
IMG_SUITE=${TASKSHARD_DEBIAN_SUITE:-bookworm}
IMG_MIRROR=${TASKSHARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMG_UNAVAILABLE=3
DOCKER=${DOCKER:-docker}
IMG_DOCKERD_DIR=$IMG_CACHE/dockerd
IMG_DOCKERD_EXEC_ROOT=/run/taskshard-dockerd   # short: containerd's socket path lives under it (108-byte limit)
IMG_STARTED_DOCKERD_PID=""
# One revision for every image of a run (others may commit while it builds): the commit and its time.
IMG_REVISION=$(git -C "$IMG_REPO" rev-parse HEAD 2>/dev/null || echo unknown)
IMG_CREATED=$(git -C "$IMG_REPO" log -1 --format=%cI "$IMG_REVISION" 2>/dev/null || echo unknown)
# shellcheck disable=SC2034 # read by the scripts that source this file
declare -A IMG_TIMES=()

img_log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
img_die() { img_log "ERROR: $*"; exit 1; }
# The one line a caller (the pytest wrapper) reads as the skip reason.
img_unavailable() { img_log "UNAVAILABLE: $*"; printf 'UNAVAILABLE: %s\n' "$*"; exit "$IMG_UNAVAILABLE"; }

# img_timed NAME CMD...: run CMD, record its wall time in IMG_TIMES[NAME] (seconds); returns CMD's status.
img_timed() {
  local name=$1 start rc; shift
  start=$(date +%s)
  "$@"; rc=$?
  # shellcheck disable=SC2034
  IMG_TIMES[$name]=$(( $(date +%s) - start ))
  return $rc
}

# The last lines of a log that say why something failed (errors first, else the plain tail).
img_log_reason() {
  local file=$1 lines
  lines=$(grep -aiE 'level=(error|fatal)|error|failed|cannot|denied' "$file" 2>/dev/null | tail -n 3)
  [[ -n $lines ]] || lines=$(tail -n 3 "$file" 2>/dev/null)
  printf '%s' "$lines" | tr '\n' ' ' | cut -c1-600
}

img_docker_answers() { "$DOCKER" info --format '{{.ServerVersion}}' >/dev/null 2>&1; }

img_use_docker() {
  command -v "$DOCKER" >/dev/null 2>&1 || return 1
  img_docker_answers
}

img_ensure_docker() {
  if [[ ${TASKSHARD_OWN_DOCKERD:-0} != 1 ]] && img_use_docker; then
    img_log "using the Docker daemon at ${DOCKER_HOST:-the default socket} ($("$DOCKER" info --format '{{.ServerVersion}}'))"
    return 0
  fi
  local sock=$IMG_DOCKERD_DIR/docker.sock
  export DOCKER_HOST=unix://$sock
  if command -v "$DOCKER" >/dev/null 2>&1 && img_docker_answers; then
    img_log "reusing the private dockerd at $sock, left running by an earlier run (stop: kill \$(cat $IMG_DOCKERD_DIR/pid))"
    return 0
  fi
  [[ $(id -u) -eq 0 ]] || img_unavailable "no Docker daemon answers and starting one needs root (running as uid $(id -u))"
  if ! command -v dockerd >/dev/null 2>&1; then
    img_log "dockerd is not installed: apt-get install -y docker.io"
    mkdir -p "$IMG_CACHE/logs"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io \
        > "$IMG_CACHE/logs/apt-docker.log" 2>&1; then
      img_unavailable "apt-get install docker.io failed: $(img_log_reason "$IMG_CACHE/logs/apt-docker.log")"
    fi
  fi
  command -v "$DOCKER" >/dev/null 2>&1 || DOCKER=/usr/bin/docker
  mkdir -p "$IMG_DOCKERD_DIR/data" "$IMG_DOCKERD_EXEC_ROOT"
  local log=$IMG_DOCKERD_DIR/dockerd.log
  : > "$log"
  img_log "starting a private dockerd (data root $IMG_DOCKERD_DIR/data, socket $sock, log $log)"
  # Host networking only: no default bridge, no iptables or NAT rules on the host.
  dockerd --host "unix://$sock" --data-root "$IMG_DOCKERD_DIR/data" --exec-root "$IMG_DOCKERD_EXEC_ROOT" \
    --pidfile "$IMG_DOCKERD_EXEC_ROOT/dockerd.pid" --bridge=none --iptables=false --ip-masq=false \
    --userland-proxy=false >> "$log" 2>&1 &
  IMG_STARTED_DOCKERD_PID=$!
  echo "$IMG_STARTED_DOCKERD_PID" > "$IMG_DOCKERD_DIR/pid"
  for _ in $(seq 1 120); do
    if img_docker_answers; then
      img_log "dockerd $("$DOCKER" info --format '{{.ServerVersion}}') is up (pid $IMG_STARTED_DOCKERD_PID, storage driver $("$DOCKER" info --format '{{.Driver}}'), cgroup $("$DOCKER" info --format '{{.CgroupVersion}}'))"
      return 0
    fi
    if ! kill -0 "$IMG_STARTED_DOCKERD_PID" 2>/dev/null; then
      IMG_STARTED_DOCKERD_PID=""
      img_unavailable "dockerd exited at start: $(img_log_reason "$log")"
    fi
    sleep 0.5
  done
  img_unavailable "dockerd did not answer within 60s: $(img_log_reason "$log")"
}

# Stop the dockerd this script started (and only that one), unless TASKSHARD_KEEP_DOCKERD=1.
img_cleanup() {
  local pid=$IMG_STARTED_DOCKERD_PID
  [[ -n $pid ]] || return 0
  if [[ ${TASKSHARD_KEEP_DOCKERD:-0} == 1 ]]; then
    img_log "leaving dockerd running (pid $pid; DOCKER_HOST=$DOCKER_HOST)"
    return 0
  fi
  img_log "stopping the dockerd this run started (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$IMG_DOCKERD_DIR/pid"; return 0; }
    sleep 0.5
  done
  img_log "dockerd (pid $pid) ignored SIGTERM for 30s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$IMG_DOCKERD_DIR/pid"
}

# The base image's name for the current suite and architecture.
img_base_image_name() { echo "taskshard-base/debian:$IMG_SUITE-minbase-$(dpkg --print-architecture 2>/dev/null || uname -m)"; }

img_base_tarball() { echo "$IMG_CACHE/rootfs/debian-$IMG_SUITE-minbase-$(dpkg --print-architecture).tar"; }

# debootstrap a minbase rootfs into a tarball (cached); its apt sources match debian:<suite>-slim
# (main, -updates, -security) and, like the slim images, it leaves out documentation and manual pages.
img_debootstrap_tarball() {
  local tarball=$1 arch work log=$IMG_CACHE/logs/debootstrap-$IMG_SUITE.log
  arch=$(dpkg --print-architecture)
  [[ $(id -u) -eq 0 ]] || img_unavailable "debootstrap needs root (running as uid $(id -u))"
  if ! command -v debootstrap >/dev/null 2>&1; then
    img_log "debootstrap is not installed: apt-get install -y debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap \
      > "$IMG_CACHE/logs/apt-debootstrap.log" 2>&1 \
      || img_unavailable "apt-get install debootstrap failed: $(img_log_reason "$IMG_CACHE/logs/apt-debootstrap.log")"
  fi
  work=$(mktemp -d "$IMG_CACHE/rootfs/.build-$IMG_SUITE.XXXXXX")
  img_log "debootstrap --variant=minbase $IMG_SUITE ($arch) from $IMG_MIRROR into $work (log $log)"
  if ! debootstrap --variant=minbase --arch="$arch" "$IMG_SUITE" "$work/root" "$IMG_MIRROR" > "$log" 2>&1; then
    rm -rf "$work"
    img_unavailable "debootstrap of $IMG_SUITE failed: $(img_log_reason "$log")"
  fi
  local root=$work/root
  rm -f "$root/etc/apt/sources.list"
  cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $IMG_MIRROR
Suites: $IMG_SUITE $IMG_SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $IMG_SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat > "$root/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
EOF
  printf 'APT::Install-Recommends "false";\n' > "$root/etc/apt/apt.conf.d/docker-no-recommends"
  # What the excludes would have left out had they been in place during debootstrap.
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
  rm -rf "${root:?}"/usr/share/man/* "${root:?}"/usr/share/info/* "${root:?}"/usr/share/locale/* \
    "${root:?}"/usr/share/groff/* "${root:?}"/usr/share/lintian/* "${root:?}"/usr/share/linda/*
  rm -rf "${root:?}"/var/lib/apt/lists/* "${root:?}"/var/cache/apt/*.bin "${root:?}"/var/cache/apt/archives/*.deb \
    "${root:?}"/var/log/* "${root:?}"/tmp/* "${root:?}"/dev/* "${root:?}"/proc/* "${root:?}"/sys/* "${root:?}"/run/*
  echo "debian" > "$root/etc/hostname"
  tar --numeric-owner --xattrs -C "$root" -cf "$work/rootfs.tar" . || { rm -rf "$work"; img_die "tar of the rootfs failed"; }
  mv "$work/rootfs.tar" "$tarball"
  rm -rf "$work"
  img_log "rootfs cached: $tarball ($(du -h "$tarball" | cut -f1))"
}

# Sets IMG_BASE_IMAGE: the imported base image (reused when the daemon has it, else from the cached tarball,
# else debootstrap'ed first).
img_ensure_base_image() {
  IMG_BASE_IMAGE=$(img_base_image_name)
  if "$DOCKER" image inspect "$IMG_BASE_IMAGE" >/dev/null 2>&1; then
    img_log "base image $IMG_BASE_IMAGE: present"
    return 0
  fi
  mkdir -p "$IMG_CACHE/rootfs" "$IMG_CACHE/logs"
  local tarball; tarball=$(img_base_tarball)
  if [[ -s $tarball ]]; then
    img_log "rootfs: cached at $tarball"
  else
    img_timed debootstrap img_debootstrap_tarball "$tarball"
  fi
  img_log "docker import $tarball as $IMG_BASE_IMAGE"
  img_timed import "$DOCKER" import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --message "debootstrap --variant=minbase $IMG_SUITE" \
    "$tarball" "$IMG_BASE_IMAGE" >/dev/null || img_die "docker import of $tarball failed"
}

# img_build TARGET TAG [BASE_IMAGE]: build one target of the Dockerfile; the build log goes to stderr and to
# <cache>/logs/build-TARGET.log.
img_build() {
  local target=$1 tag=$2 base=${3:-${IMG_BASE_IMAGE:-}} log=$IMG_CACHE/logs/build-$1.log
  local -a args=(--network host --target "$target" --tag "$tag"
    --build-arg "VERSION=$(img_project_version)"
    --build-arg "REVISION=$IMG_REVISION" --build-arg "CREATED=$IMG_CREATED")
  [[ -n $base ]] && args+=(--build-arg "BASE_IMAGE=$base")
  # Pass the host's PyPI mirror and its extra CA certificates (a TLS-inspecting egress proxy) to the builder
  # stages; the final images never contain them.
  local var certs
  for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
    [[ -n ${!var:-} ]] && args+=(--build-arg "$var=${!var}")
  done
  certs=$(img_extra_ca_certs)
  [[ -n $certs ]] && args+=(--build-arg "BUILD_CA_CERTS=$certs")
  mkdir -p "$IMG_CACHE/logs"
  local shown=("${args[@]}")
  [[ -n $certs ]] && shown[-1]="BUILD_CA_CERTS=<$(grep -c 'BEGIN CERTIFICATE' <<<"$certs") PEM certificates>"
  img_log "docker build ${shown[*]} $IMG_REPO (log $log)"
  set -o pipefail
  if ! "$DOCKER" build "${args[@]}" "$IMG_REPO" 2>&1 | tee "$log" >&2; then
    img_die "docker build --target $target failed (log $log)"
  fi
}

# PEM text of the CA certificates this host trusts beyond Debian's bundle (TASKSHARD_BUILD_CA_CERTS names a
# file to use instead; set it to /dev/null to pass none).
img_extra_ca_certs() {
  if [[ -n ${TASKSHARD_BUILD_CA_CERTS:-} ]]; then
    cat "$TASKSHARD_BUILD_CA_CERTS"
    return
  fi
  local f
  for f in /usr/local/share/ca-certificates/*.crt /usr/local/share/ca-certificates/*/*.crt; do
    [[ -f $f ]] && cat "$f"
  done
  return 0
}

img_project_version() {
  sed -n 's/^version *= *"\(.*\)"/\1/p' "$IMG_REPO/pyproject.toml" | head -n 1
}

img_size_mb() { "$DOCKER" image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f", $1 / 1000000}'; }
