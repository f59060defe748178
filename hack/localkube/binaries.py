"""Where the control-plane binaries live, and building them when they are missing.

The binaries are built by ``hack/build-binaries.sh`` from Go modules into a cache directory keyed by version
(``$TASKSHARD_BIN_CACHE``, default ``~/.cache/taskshard/bin``). :func:`ensure_binaries` returns their paths,
running the build script first when a component is not cached yet (its progress goes to stderr).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HACK_DIR = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = HACK_DIR / "build-binaries.sh"
VERSIONS_FILE = HACK_DIR / "versions.env"


class BinariesUnavailable(RuntimeError):
    """The binaries are not cached and could not be built (no Go, no module proxy, or a failed build)."""


def versions() -> dict[str, str]:
    """The pinned versions from ``hack/versions.env`` (e.g. ``{"KUBERNETES_VERSION": "v1.34.4", ...}``)."""
    out = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("TASKSHARD_BIN_CACHE", Path.home() / ".cache" / "taskshard" / "bin"))


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every binary the local cluster runs."""

    etcd: str
    kube_apiserver: str
    kube_controller_manager: str
    kube_scheduler: str
    kubectl: str
    helm: str

    @property
    def path_dirs(self) -> list[str]:
        """Directories to put on ``PATH`` so that ``kubectl`` and ``helm`` resolve to these builds."""
        return sorted({str(Path(p).parent) for p in (self.kubectl, self.helm, self.etcd)})


def expected_binaries() -> Binaries:
    v = versions()
    root = cache_dir()
    kube = root / f"kubernetes-{v['KUBERNETES_VERSION']}" / "bin"
    return Binaries(
        etcd=str(root / f"etcd-{v['ETCD_VERSION']}" / "bin" / "etcd"),
        kube_apiserver=str(kube / "kube-apiserver"),
        kube_controller_manager=str(kube / "kube-controller-manager"),
        kube_scheduler=str(kube / "kube-scheduler"),
        kubectl=str(kube / "kubectl"),
        helm=str(root / f"helm-{v['HELM_VERSION']}" / "bin" / "helm"),
    )


def missing(binaries: Binaries | NodeBinaries) -> list[str]:
    return [p for p in vars(binaries).values() if not os.access(p, os.X_OK)]


def ensure_binaries(*, build: bool = True) -> Binaries:
    """Return the cached binaries, building the missing ones first when ``build`` is true.

    Raises :class:`BinariesUnavailable` with the build script's reason when they cannot be had.
    """
    binaries = expected_binaries()
    if not missing(binaries):
        return binaries
    if not build:
        raise BinariesUnavailable(
            f"control-plane binaries are not built: {', '.join(missing(binaries))}; run {BUILD_SCRIPT}"
        )
    print(
        f"[localkube] building control-plane binaries into {cache_dir()} (a cold build takes many minutes)",
        file=sys.stderr,
        flush=True,
    )
    result = subprocess.run(["bash", str(BUILD_SCRIPT), "all"], stdout=subprocess.DEVNULL, check=False)
    if result.returncode != 0 or missing(binaries):
        raise BinariesUnavailable(
            f"building the control-plane binaries failed (exit {result.returncode}); see the output above. "
            f"Still missing: {', '.join(missing(binaries)) or 'nothing'}"
        )
    return binaries


@dataclass(frozen=True)
class NodeBinaries:
    """The kubelet, kube-proxy and CoreDNS of the real-node tier (``hack/build-binaries.sh node``)."""

    kubelet: str
    kube_proxy: str
    coredns: str


def ensure_node_binaries() -> NodeBinaries:
    """Return the cached kubelet, kube-proxy and CoreDNS, building them first when missing (~15 min cold).

    Raises :class:`BinariesUnavailable` with the build script's exit status when they cannot be had.
    """
    v = versions()
    bin_dir = cache_dir() / f"kubernetes-node-{v['KUBERNETES_VERSION']}" / "bin"
    coredns = cache_dir() / f"coredns-{v['COREDNS_VERSION']}" / "bin" / "coredns"
    node = NodeBinaries(str(bin_dir / "kubelet"), str(bin_dir / "kube-proxy"), str(coredns))
    if not missing(node):
        return node
    print(f"[localkube] building kubelet, kube-proxy and CoreDNS into {cache_dir()}", file=sys.stderr, flush=True)
    result = subprocess.run(["bash", str(BUILD_SCRIPT), "node"], stdout=subprocess.DEVNULL, check=False)
    if result.returncode != 0 or missing(node):
        raise BinariesUnavailable(f"building the node's binaries failed (exit {result.returncode}); see above")
    return node
