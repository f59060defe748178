"""Where a machine's CPU time went during a measurement: per-process CPU seconds, grouped, from ``/proc``.

:class:`ProcessCpuSampler` charges every process's ``utime + stime`` growth (sampled every ``interval`` seconds)
to a group named by a classifier, next to the machine's busy and idle time from ``/proc/stat`` (a process that
exits between two samples loses at most ``interval`` seconds). :class:`TreeCpu` measures process trees over
windows, including the processes that start or exit inside them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import children_map, cpu_times, descendants, stat_fields

CLK_TCK = os.sysconf("SC_CLK_TCK")
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
"""HotSpot's JIT compiler threads, by their (truncated) thread names."""
GC_THREADS = ("GC Thread", "G1 ", "VM Thread", "VM Periodic")
"""HotSpot's garbage collector and VM threads, by their (truncated) thread names."""
CPU_KINDS = ("JIT compilers", "GC", "other JVM", "Python")


class MachineCpu:
    """``/proc/stat`` totals in seconds: busy (user, nice, system, irq, softirq), idle (+ iowait), steal."""

    def __init__(self) -> None:
        f = cpu_times() + [0] * 8
        self.busy = (f[0] + f[1] + f[2] + f[5] + f[6]) / CLK_TCK
        self.idle = (f[3] + f[4]) / CLK_TCK
        self.steal = f[7] / CLK_TCK


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


def proc_stat(path: str) -> tuple[str, float] | None:
    """``(comm, utime + stime seconds)`` of a ``/proc/.../stat`` file (None when it is gone)."""
    st = stat_fields(path)
    return None if st is None else (st[0], (int(st[1][11]) + int(st[1][12])) / CLK_TCK)


def _times(pid: int) -> tuple[str, int, float, float] | None:
    """``(comm, ppid, own utime + stime, reaped children's cutime + cstime)`` in seconds; None when gone."""
    st = stat_fields(f"/proc/{pid}/stat")
    if st is None:
        return None
    comm, f = st
    return comm, int(f[1]), (int(f[11]) + int(f[12])) / CLK_TCK, (int(f[13]) + int(f[14])) / CLK_TCK


def _jvm_threads(pid: int) -> tuple[float, float]:
    """CPU seconds of a JVM's JIT compiler threads and of its GC and VM threads."""
    jit = gc = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0
    for tid in tids:
        st = proc_stat(f"/proc/{pid}/task/{tid}/stat")
        if st is not None and st[0].startswith(JIT_THREADS):
            jit += st[1]
        elif st is not None and st[0].startswith(GC_THREADS):
            gc += st[1]
    return jit, gc


def process_env(pid: int) -> dict[str, str]:
    """The environment a process started with (empty when it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def shard_classifier(shards: dict[str, str]) -> Callable[[int, str], str]:
    """A classifier for shard benchmarks: ``shards`` maps a shard name to its group label; a process whose
    environment has ``TASKSHARD_SHARD`` is charged to that label plus `` JVM`` (command ``java``) or `` Python``;
    the control plane, the node agent, the operator and the rest get their own groups."""

    def classify(pid: int, comm: str) -> str:
        cmd = cmdline(pid)
        shard = process_env(pid).get("TASKSHARD_SHARD")
        if shard is not None:
            return f"{shards.get(shard, 'other shards')} {'JVM' if comm == 'java' else 'Python'}"
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
    :attr:`jit_groups` the part of each JVM group spent in its JIT compiler threads. ``classify(pid, comm)`` is
    asked again when a process's command changes (a shell script that ``exec``s ``java``)."""

    def __init__(self, classify: Callable[[int, str], str], interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.classify, self.interval, self.halt = classify, interval, threading.Event()
        self.cpu: dict[int, list[float]] = {}
        """pid -> [CPU seconds at the start (0 if it started later), now, the same of its JIT threads]."""
        self.comm: dict[int, str] = {}
        self.group_of: dict[int, str] = {}
        self.machine_before, self.machine_after = MachineCpu(), None
        self._sample(initial=True)

    def _sample(self, initial: bool = False) -> None:
        for entry in os.listdir("/proc"):
            st = proc_stat(f"/proc/{entry}/stat") if entry.isdigit() else None
            if st is None:
                continue
            pid, (comm, cpu) = int(entry), st
            if self.comm.get(pid) != comm:
                self.comm[pid], self.group_of[pid] = comm, self.classify(pid, comm)
            jit = _jvm_threads(pid)[0] if comm == "java" else 0.0
            seen = self.cpu.setdefault(pid, [cpu, cpu, jit, jit] if initial else [0.0, cpu, 0.0, jit])
            seen[1], seen[3] = cpu, jit

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

    def _by_group(self, first: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, seen in self.cpu.items():
            if seen[first + 1] - seen[first] > 0:
                out[self.group_of[pid]] = out.get(self.group_of[pid], 0.0) + seen[first + 1] - seen[first]
        return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    @property
    def groups(self) -> dict[str, float]:
        """CPU seconds per group, largest first."""
        return self._by_group(0)

    @property
    def jit_groups(self) -> dict[str, float]:
        """Seconds of JIT compiler threads per (JVM) group."""
        return self._by_group(2)

    def machine(self) -> dict[str, float | None]:
        """:func:`machine_between` the start and :meth:`finish`."""
        return machine_between(self.machine_before, self.machine_after or MachineCpu())


def _ignores_sigchld(pid: int) -> bool:
    """Whether ``pid`` ignores SIGCHLD: the kernel then reaps its children, whose CPU time never reaches its
    ``cutime`` (Spark's Python daemon does this)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << 16))  # SIGCHLD = 17
    except (OSError, ValueError):
        pass
    return False


class TreeCpu(threading.Thread):
    """CPU seconds of process trees over windows, including the processes that start or exit inside a window.

    ``roots`` maps a label to a root pid. Every ``interval`` seconds (and at each :meth:`reading`) it keeps, for each
    process in each tree (minus the tree of ``exclude``), its own ``utime + stime`` and its reaped children's
    ``cutime + cstime``, also after it is gone. Between two readings a process counts its growth (from 0 if it
    started in the window) if alive at the end or if its parent ignores SIGCHLD (Spark's Python daemon: it loses at
    most its last ``interval``); minus what it had at the first reading if it exited and its parent waits for it
    (the parent's reaped time grew by its whole life). The sampler thread's own CPU is not counted."""

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
            children = children_map()
            skip = set(descendants(self.exclude, children)) if self.exclude else set()
            alive = set()
            for label, root in self.roots.items():
                for pid in descendants(root, children):
                    t = _times(pid) if pid not in skip else None
                    if t is None:
                        continue
                    comm, ppid, own, reaped = t
                    if pid not in self.unaccounted:
                        self.unaccounted[pid] = _ignores_sigchld(ppid)
                    self.comm[pid] = comm
                    self.last[label][pid] = (own - (self._own_thread_cpu() if pid == os.getpid() else 0.0), reaped)
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
        jvm = {pid: _jvm_threads(pid) for pid in alive if threads and self.comm.get(pid) == "java"}
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
        JVMs, and every other process (Python; a JVM's reaped children are Python processes)."""
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
                    jit0, gc0 = before["jvm"].get(pid, (0.0, 0.0))
                    jit, gc = after["jvm"][pid][0] - jit0, after["jvm"][pid][1] - gc0
                out["JIT compilers"] += jit
                out["GC"] += gc
                out["other JVM"] += own - jit - gc
        return {k: round(v, 2) for k, v in out.items()}
