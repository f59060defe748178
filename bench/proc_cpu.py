"""Where a machine's CPU time went during a measurement: per-process CPU seconds, grouped, from ``/proc``.

:class:`ProcessCpuSampler` reads ``utime + stime`` of every process every ``interval`` seconds and charges each
process's growth since the sampler started (or since the process appeared) to a group chosen by a classifier
(for example, "the parent shard's pod" for a process whose environment says ``TASKSHARD_SHARD=<parent>``).
It also reads the machine's total busy and idle time from ``/proc/stat``, so the table shows how much of the
machine the groups account for. A process that exits between two samples loses at most ``interval`` seconds of
its CPU time; that loss shows as the difference between the machine's busy time and the groups' sum.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from common import cpu_times

__all__ = ["JIT_THREADS", "MachineCpu", "ProcessCpuSampler", "cmdline", "proc_stat", "process_env", "shard_classifier"]

CLK_TCK = os.sysconf("SC_CLK_TCK")


class MachineCpu:
    """``/proc/stat`` totals in seconds: busy (user, nice, system, irq, softirq), idle (+ iowait), steal."""

    def __init__(self) -> None:
        f = cpu_times() + [0] * 8
        self.busy = (f[0] + f[1] + f[2] + f[5] + f[6]) / CLK_TCK
        self.idle = (f[3] + f[4]) / CLK_TCK
        self.steal = f[7] / CLK_TCK


JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
"""HotSpot's JIT compiler threads, by their (truncated) thread names."""


def proc_stat(path: str) -> tuple[str, float] | None:
    """``(comm, utime + stime seconds)`` of a ``/proc/.../stat`` file (None when it is gone)."""
    try:
        raw = Path(path).read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return raw[raw.index("(") + 1 : raw.rindex(")")], (int(fields[11]) + int(fields[12])) / CLK_TCK


def _jit_cpu(pid: int) -> float:
    """CPU seconds of a JVM's JIT compiler threads."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        st = proc_stat(f"/proc/{pid}/task/{tid}/stat")
        if st is not None and st[0].startswith(JIT_THREADS):
            total += st[1]
    return total


def process_env(pid: int) -> dict[str, str]:
    """The environment a process started with (empty when it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def shard_classifier(shards: dict[str, str]) -> Callable[[int, str], str]:
    """A classifier for shard benchmarks: ``shards`` maps a shard name to its group label; a process whose
    environment has ``TASKSHARD_SHARD`` in it is charged to that label plus `` JVM`` (its command is ``java``)
    or `` Python``; the control plane (etcd, kube-*), the node agent, the operator and the rest get their own
    groups."""

    def classify(pid: int, comm: str) -> str:
        cmd = cmdline(pid)
        shard = process_env(pid).get("TASKSHARD_SHARD")
        if shard is not None:
            label = shards.get(shard, "other shards")
            return f"{label} {'JVM' if comm == 'java' else 'Python'}"
        if any(name in cmd for name in ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")):
            return "control plane"
        if "localkube" in cmd or "podshim" in cmd or "podworker" in cmd:
            return "node agent"
        if "taskshard_operator" in cmd:
            return "operator"
        return "other (benchmark, kernel threads, ...)"

    return classify


class ProcessCpuSampler(threading.Thread):
    """Samples every process's CPU time until :meth:`finish`; :attr:`groups` then holds seconds per group, and
    :attr:`jit_groups` the part of each JVM group spent in its JIT compiler threads.

    ``classify(pid, comm)`` names a process's group; it is asked again when the process's command changes
    (a shell script that ``exec``s ``java``)."""

    def __init__(self, classify: Callable[[int, str], str], interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.classify, self.interval = classify, interval
        self.halt = threading.Event()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.jit_first: dict[int, float] = {}
        self.jit_last: dict[int, float] = {}
        self.comm: dict[int, str] = {}
        self.group_of: dict[int, str] = {}
        self.machine_before = MachineCpu()
        self.machine_after: MachineCpu | None = None
        self._sample(initial=True)

    def _sample(self, initial: bool = False) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            st = proc_stat(f"/proc/{pid}/stat")
            if st is None:
                continue
            comm, cpu = st
            if pid not in self.first:
                self.first[pid] = cpu if initial else 0.0
            if self.comm.get(pid) != comm:
                self.comm[pid] = comm
                self.group_of[pid] = self.classify(pid, comm)
            self.last[pid] = cpu
            if comm == "java":
                jit = _jit_cpu(pid)
                self.jit_first.setdefault(pid, jit if initial else 0.0)
                self.jit_last[pid] = jit

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            self._sample()

    def finish(self) -> dict[str, float]:
        """Stop sampling (one last sample) and return :attr:`groups`."""
        self.halt.set()
        self.join(timeout=5)
        self._sample()
        self.machine_after = MachineCpu()
        return self.groups

    def _by_group(self, first: dict[int, float], last: dict[int, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, value in last.items():
            grown = value - first[pid]
            if grown > 0:
                out[self.group_of[pid]] = out.get(self.group_of[pid], 0.0) + grown
        return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    @property
    def groups(self) -> dict[str, float]:
        """CPU seconds per group, largest first."""
        return self._by_group(self.first, self.last)

    @property
    def jit_groups(self) -> dict[str, float]:
        """Seconds of JIT compiler threads per (JVM) group."""
        return self._by_group(self.jit_first, self.jit_last)

    def machine(self) -> dict[str, float]:
        """Busy, idle and steal seconds of the whole machine between the start and :meth:`finish`, and the
        stolen share of all three in percent (``stealPercent``, None when no time passed)."""
        after = self.machine_after or MachineCpu()
        busy = after.busy - self.machine_before.busy
        idle = after.idle - self.machine_before.idle
        steal = after.steal - self.machine_before.steal
        total = busy + idle + steal
        return {
            "busy": round(busy, 2),
            "idle": round(idle, 2),
            "steal": round(steal, 2),
            "stealPercent": round(100.0 * steal / total, 1) if total > 0 else None,
        }
