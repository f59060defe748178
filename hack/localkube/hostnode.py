"""What a real node changes on this host, and undoing it: packages, sysctls, iptables chains, the bridge, cgroups,
mounts and stray runtime processes.

:mod:`localkube.realnode` runs the node; this module holds the host-level chores around it, each a small function
that does one thing and tolerates finding nothing to do (a cleanup runs after a partial start, or twice).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

# Debian packages the node needs, and a file each one provides.
HOST_PACKAGES = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iptables": "/usr/sbin/iptables",
}
CNI_BIN_DIR = "/usr/lib/cni"

# Sysctls the node changes: ip_forward (pod traffic through the bridge), route_localnet (kube-proxy), and the kernel
# tunables a kubelet with protectKernelDefaults=false sets. Saved at start, restored at stop.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


class NodeUnavailable(RuntimeError):
    """This host cannot run a real node; the message says which requirement failed."""


def ensure_host_packages() -> None:
    """Install the missing Debian packages of :data:`HOST_PACKAGES` (apt-get; ~30 s the first time)."""
    if os.geteuid() != 0:
        raise NodeUnavailable(f"a real node needs root (running as uid {os.geteuid()})")
    wanted = [name for name, path in HOST_PACKAGES.items() if not os.path.exists(path)]
    if not wanted:
        return
    if shutil.which("apt-get") is None:
        raise NodeUnavailable(f"missing {', '.join(wanted)} and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *wanted]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:  # stale package lists: refresh once
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NodeUnavailable(f"apt-get install {' '.join(wanted)} failed: {result.stderr.strip()[-400:]}")


def node_ip() -> str:
    """The host's primary IPv4 address (the source of its default route): the node's InternalIP."""
    out = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.255"], capture_output=True, text=True).stdout
    match = re.search(r"\bsrc (\d+\.\d+\.\d+\.\d+)", out)
    if match and not match.group(1).startswith("127."):
        return match.group(1)
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
    if not match:
        raise NodeUnavailable("the host has no global IPv4 address for the node (ip -4 addr show scope global)")
    return match.group(1)


def read_sysctls(names: Iterable[str] = SYSCTLS) -> dict[str, str]:
    """The current values of ``names`` that exist on this kernel."""
    values = {}
    for name in names:
        path = Path("/proc/sys") / name
        if path.exists():
            values[name] = path.read_text().strip()
    return values


def write_sysctls(values: dict[str, str]) -> None:
    for name, value in values.items():
        try:
            (Path("/proc/sys") / name).write_text(value)
        except OSError:  # read-only in this sandbox: the value stays what it is
            pass


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, check=False)


def remove_cni_chains(network: str) -> None:
    """Delete the nat-table rules and ``CNI-*`` chains the bridge plugin left for ``network`` (its DEL removes them
    per pod; this catches pods whose DEL never ran)."""
    rules = _iptables("-t", "nat", "-S").stdout.splitlines()
    chains = set()
    for rule in rules:
        if rule.startswith("-A ") and network in rule:
            target = re.search(r" -j (CNI-[0-9a-f]+)", rule)
            if target:
                chains.add(target.group(1))
            _iptables("-t", "nat", *_delete_args(rule))
    for chain in chains:
        _iptables("-t", "nat", "-F", chain)
        _iptables("-t", "nat", "-X", chain)


def _delete_args(rule: str) -> list[str]:
    """``-A CHAIN spec...`` as printed by ``iptables -S`` -> the arguments that delete it."""
    parts = shlex.split(rule)
    return ["-D", *parts[1:]]


def delete_link(name: str) -> None:
    subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


def unmount_under(*roots: Path) -> None:
    """Lazily unmount every mount point under ``roots``, deepest first (volumes, secrets, rootfs, netns)."""
    prefixes = tuple(str(root.resolve()) + "/" for root in roots)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefixes) or point in {p.rstrip("/") for p in prefixes}:
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def kill_processes_mentioning(needle: str) -> int:
    """SIGKILL every process whose command line contains ``needle`` (the runtime's shims); returns how many."""
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def remove_cgroups(name: str = "kubepods") -> None:
    """Remove the kubelet's cgroup tree ``name`` in every hierarchy (v1 controllers and v2), leaves first."""
    base = Path("/sys/fs/cgroup")
    roots = [base / name, *(d / name for d in base.iterdir() if d.is_dir())] if base.exists() else []
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda item: len(item[0]), reverse=True):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
