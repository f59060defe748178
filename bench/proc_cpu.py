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
from typing import Any

from common import _ppid_map, cpu_times

__all__ = [
    "CPU_KINDS",
    "GC_THREADS",
    "JIT_THREADS",
    "MachineCpu",
    "ProcessCpuSampler",
    "TreeCpu",
    "cmdline",
    "machine_between",
    "proc_stat",
    "process_env",
    "shard_classifier",
]

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
        return machine_between(self.machine_before, self.machine_after or MachineCpu())


GC_THREADS = ("GC Thread", "G1 ", "VM Thread", "VM Periodic")
"""HotSpot's garbage collector and VM threads, by their (truncated) thread names."""
CPU_KINDS = ("JIT compilers", "GC", "other JVM", "Python")


def _tree(root: int, children: dict[int, list[int]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _jvm_threads(pid: int) -> tuple[float, float]:
    """CPU seconds of a JVM's JIT compiler threads and of its GC and VM threads."""
    jit = gc = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0
    for tid in tids:
        st = proc_stat(f"/proc/{pid}/task/{tid}/stat")
        if st is None:
            continue
        if st[0].startswith(JIT_THREADS):
            jit += st[1]
        elif st[0].startswith(GC_THREADS):
            gc += st[1]
    return jit, gc


def _times(pid: int) -> tuple[str, int, float, float] | None:
    """``(comm, ppid, own utime + stime, reaped children's cutime + cstime)`` in seconds; None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = raw[raw.rindex(")") + 2 :].split()
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    return comm, int(f[1]), (int(f[11]) + int(f[12])) / CLK_TCK, (int(f[13]) + int(f[14])) / CLK_TCK


def _ignores_sigchld(pid: int) -> bool:
    """Whether ``pid`` ignores SIGCHLD: its children are then reaped by the kernel, and their CPU time is never
    added to its ``cutime`` (Spark's Python daemon does this)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << 16))  # SIGCHLD = 17
    except (OSError, ValueError):
        pass
    return False


class TreeCpu(threading.Thread):
    """CPU seconds of process trees over windows, including the processes that start or exit inside a window.

    ``roots`` maps a label to a root pid (a shard's process). Every ``interval`` seconds (and at each
    :meth:`reading`) the sampler reads, for every process in each tree (minus the tree of ``exclude``, a broker
    the benchmark started), its own ``utime + stime`` and its reaped children's ``cutime + cstime``, and keeps the
    last values it saw of each process, also after it is gone. Between two readings a process counts:

    - alive at the end: its growth (own + reaped) since the first reading (from 0 if it started in the window);
    - exited, its parent waits for its children: minus what it had at the first reading, because the parent's
      reaped time grew by its whole life (so short-lived processes count exactly);
    - exited, its parent ignores SIGCHLD (Spark's Python daemon, whose workers the kernel reaps without adding
      their time to anyone): its last sampled values minus the first (it loses at most its last ``interval``).

    The sampler thread's own CPU is subtracted when it runs inside a measured tree (the benchmark's process)."""

    def __init__(self, roots: dict[str, int], *, exclude: int | None = None, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.roots = dict(roots)
        self.exclude = exclude
        self.interval = interval
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.last: dict[str, dict[int, tuple[float, float]]] = {label: {} for label in roots}
        self.comm: dict[int, str] = {}
        self.unaccounted: dict[int, bool] = {}
        """Per process: its parent ignores SIGCHLD (its time never reaches the parent's reaped time)."""
        self.alive: set[int] = set()
        self.tid: int | None = None
        self._sample()

    def _own_thread_cpu(self) -> float:
        st = proc_stat(f"/proc/{os.getpid()}/task/{self.tid}/stat") if self.tid else None
        return st[1] if st else 0.0

    def _sample(self) -> None:
        with self.lock:
            children: dict[int, list[int]] = {}
            for p, pp in _ppid_map().items():
                children.setdefault(pp, []).append(p)
            skip = set(_tree(self.exclude, children)) if self.exclude else set()
            me = os.getpid()
            alive = set()
            for label, root in self.roots.items():
                for pid in _tree(root, children):
                    if pid in skip:
                        continue
                    t = _times(pid)
                    if t is None:
                        continue
                    comm, ppid, own, reaped = t
                    if pid not in self.unaccounted:
                        self.unaccounted[pid] = _ignores_sigchld(ppid)
                    self.comm[pid] = comm
                    self.last[label][pid] = (own - (self._own_thread_cpu() if pid == me else 0.0), reaped)
                    alive.add(pid)
            self.alive = alive

    def run(self) -> None:
        self.tid = threading.get_native_id()
        while not self.halt.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def reading(self, threads: bool = True) -> dict[str, Any]:
        """A fresh sample: ``{"cpu": {label: {pid: (own, reaped)}}, "alive": pids, "jvm": {pid: (jit, gc)}}``
        (``jvm`` only with ``threads``: the JIT and GC thread times of the live JVMs)."""
        self._sample()
        with self.lock:
            cpu = {label: dict(v) for label, v in self.last.items()}
            alive = set(self.alive)
        jvm = {}
        if threads:
            for pid in alive:
                if self.comm.get(pid) == "java":
                    jvm[pid] = _jvm_threads(pid)
        return {"cpu": cpu, "alive": alive, "jvm": jvm}

    def _grown(self, before: dict[str, Any], after: dict[str, Any], label: str) -> dict[int, tuple[float, float]]:
        """Per process of ``label``: (own, reaped) seconds it counts for between the readings (see the class)."""
        out = {}
        for pid, (own, reaped) in after["cpu"][label].items():
            seen_before = before["cpu"].get(label, {}).get(pid)
            if seen_before is not None and pid not in before["alive"]:
                continue  # gone before the window
            own0, reaped0 = seen_before or (0.0, 0.0)
            if pid in after["alive"] or self.unaccounted.get(pid):
                out[pid] = (own - own0, reaped - reaped0)
            else:  # its parent's reaped time holds its whole life
                out[pid] = (-own0, -reaped0)
        return out

    def seconds(self, before: dict[str, Any], after: dict[str, Any], label: str | None = None) -> float:
        """CPU seconds between two readings, of one tree (``label``) or of all."""
        labels = [label] if label is not None else list(after["cpu"])
        return sum(o + r for lb in labels for o, r in self._grown(before, after, lb).values())

    def kinds(self, before: dict[str, Any], after: dict[str, Any], label: str | None = None) -> dict[str, float]:
        """:meth:`seconds` by kind (``CPU_KINDS``): the JVMs' JIT threads, their GC and VM threads, the rest of the
        JVMs, and every other process (Python: the runtime, Spark's Python workers and source runners; a JVM's
        reaped children are Python processes)."""
        labels = [label] if label is not None else list(after["cpu"])
        out = dict.fromkeys(CPU_KINDS, 0.0)
        for lb in labels:
            for pid, (own, reaped) in self._grown(before, after, lb).items():
                out["Python"] += reaped
                if self.comm.get(pid) != "java":
                    out["Python"] += own
                    continue
                jit = gc = 0.0
                if pid in after["jvm"]:  # a live JVM (one that exited in the window counts as 'other JVM')
                    jit = after["jvm"][pid][0] - before["jvm"].get(pid, (0.0, 0.0))[0]
                    gc = after["jvm"][pid][1] - before["jvm"].get(pid, (0.0, 0.0))[1]
                out["JIT compilers"] += jit
                out["GC"] += gc
                out["other JVM"] += own - jit - gc
        return {k: round(v, 2) for k, v in out.items()}


def machine_between(before: MachineCpu, after: MachineCpu) -> dict[str, float | None]:
    """The machine's busy, idle and steal seconds between two readings, and ``stealPercent``: the share of all
    three the hypervisor gave to other guests (None when no time passed)."""
    busy, idle, steal = after.busy - before.busy, after.idle - before.idle, after.steal - before.steal
    total = busy + idle + steal
    return {
        "busy": round(busy, 2),
        "idle": round(idle, 2),
        "steal": round(steal, 2),
        "stealPercent": round(100.0 * steal / total, 1) if total > 0 else None,
    }
