"""Split latency on the local control plane: from the split request until both children emit results.

A script, not a test. It starts the local control plane **with** the node agent (shard pods really run, as
``python -m spark_runtime run`` processes with their own JVM), installs the CRDs, runs the operator
(``python -m taskshard_operator``, production defaults), pre-fills a journal (``--prefill`` events over ``--keys``
keys; the first ``--keys`` events name every key once, so the parent holds all of them) and applies a Task
(builtin count, 128 key groups, one initial shard) while a producer appends ``--rate`` events per second. Once
the shard has caught up with the pre-fill it is split (``spec.split.requested: true``, the edit
``kubectl edit taskshard`` makes). ``--mode independent`` (default) repeats this ``--splits`` times with a fresh
Task each (the previous one deleted first), so every trial splits one shard on an otherwise idle machine;
``--mode chain`` splits the left child again and again while the other children keep running.

The protocol measured is the catch-up hand-over of a journal source (``spark_runtime/handover.py``): the operator
creates both children and leaves the parent's pod alone, so the parent **keeps processing and emitting** while

1. each child warms up (pod, JVM, SparkSession, preflight) and writes ``<parent>/handover/request-<child>.json``;
2. the parent, still running, exports a pre-copy snapshot of its latest committed batch K and writes
   ``<parent>/handover/precopy.json``;
3. the child restores its slice of K (its batch 0, which emits nothing) and follows the parent in shadow
   (processes its slice up to the parent's committed positions, emits nothing), then writes
   ``<parent>/handover/ready-<child>.json``;
4. once both children are ready the parent drains finally: ``drain-requested``, its last batch N
   (``checkpoint/commits/<N>``), ``drained.json`` (no export: it names the pre-copy manifest);
5. each child catches up to the parent's final positions (``catch-up.json`` turns ``live``) and its next
   batches emit: the first batch with a results file (``/data/output/<task>/shard=<child>/batch-<n>.jsonl``,
   or ``_pending/``) is its first emitting batch.

The headline is the **processing gap**: the parent's last commit (``commits/<drained.batchId>``) -> the later
child's first emitting commit, while no shard emits for the split range. Each split is timed on one
clock (this machine's wall clock) from Kubernetes watches on TaskShards and Pods (stamped on arrival: phases,
children created, pods created, containers running or terminated) and from the runtime's files on the shared
volume (nanosecond mtimes, or the epoch times recorded in ``standby.json``). The critical path runs through the
child that emitted last and is cut into consecutive segments, grouped as

    accept           request -> parent phase Draining seen (the operator accepted and created both children)
    child warm-up    -> the child's standby began (pod, container, runtime start), -> standby warm (JVM,
                     SparkSession, preflight), -> its request note written
    pre-copy         request note -> precopy.json (the parent exports batch K while it runs; 0 when the other
                     child asked first and the pre-copy was there already)
    restore          precopy.json -> the child's commits/0 (pre-copy seen, query start, seed slice restored)
    catch-up         commits/0 -> the child's ready note (shadow batches up to the parent's positions), then the
                     wait for the other child's ready note
    parent stop      last ready note -> drain-requested (the parent notices) -> drained.json (its last batch
                     finishes, the query stops)
    take-over        drained.json -> the child's first emitting batch committed (it saw the summary; that batch
                     reads up to the final positions and past them, and emits what lies past them)

A point that is missing (None) leaves its time to the next segment; a point earlier than the one before it
counts 0 (noted). Further tables: the children's own timelines (with their shadow batches against the parent's
commit interval); the parent during the hand-over (its commit times from ``checkpoint/commits/*`` mtimes, listed
every 0.5 s while the split runs since Spark keeps only the last 100 entries: it kept processing; the pre-copy;
its stop); CPU seconds by
process group until both children emit; and, for the default parameters, this run next to the previous protocol
(drain at once, then restore) as last measured. Prints the tables, writes ``<out>/split_latency*.{json,png}``.
Targets: processing gap (median) <= 5 s with 50,000 keys and with 1,000,000; request -> both
children emit (median) <= 90 s. ``--mode chain`` reports the same numbers without targets.

    .venv/bin/python bench/split_latency.py --splits 3
    .venv/bin/python bench/split_latency.py --keys 1000000 --prefill 3000000 --splits 2 \
        --steady-timeout 1800 --split-timeout 1800      # bench/run_all.py's split-1m: split_latency_1m.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_OUT,
    REPO,
    VENV_BIN,
    LoadSampler,
    command_line,
    kubectl_retry,
    machine,
    mtime,
    print_table,
    pyplot,
    say,
    wait_served,
    write_result,
)
from proc_cpu import ProcessCpuSampler, shard_classifier  # noqa: E402

NAMESPACE = "bench-split"
TASK = "split"
MAX_KEY_GROUPS = 128
PARTITIONS = 2
GROUP, VERSION = "taskshard.io", "v1alpha1"
DEFAULT_KEYS = 50_000
TARGET_GAP = 5.0
"""Processing gap (median), seconds, with up to ``DEFAULT_KEYS`` keys of state."""
TARGET_GAP_LARGE = 5.0
"""The same with more keys of state (1,000,000): the gap no longer grows with the state (the successor's
first batch past the parent's final positions emits)."""
TARGET_TOTAL = 90.0
"""Split request -> both children emit (median), seconds."""

PREVIOUS_LABEL = "previous protocol (drain, then restore), measured 2026-11-22 on this machine"
PREVIOUS = {"gap": 37.67, "total": 39.32, "busy": 78.58, "load": 4.54}
"""The drain-then-restore protocol's medians (docs/benchmarks.md, section 2, run 2026-11-22T11:10:21Z, 3 independent
splits, 50,000 keys, 400 events/s, trigger 1 second): processing gap, request -> both children's first committed
batch (their first batch after the restore), machine busy CPU seconds per split; and the mean 1-minute load
average during that run. The code that measured them is gone with that protocol, so they are constants here."""

SEGMENTS = [
    # (key, label, group)
    ("accept", "operator accepts, creates both children (parent phase Draining)", "accept"),
    ("podStart", "child pod and runtime start (standby began)", "child warm-up"),
    ("warm", "JVM, SparkSession, preflight (standby warm)", "child warm-up"),
    ("ask", "request note written to the parent", "child warm-up"),
    ("precopy", "parent exports the pre-copy of batch K while running (precopy.json)", "pre-copy"),
    ("restore", "child restores its slice of K: batch 0 committed (emits nothing)", "restore"),
    ("shadow", "child follows the parent's positions without emitting (ready note)", "catch-up"),
    ("sibling", "waits for the other child's ready note", "catch-up"),
    ("notice", "parent sees both ready notes (drain-requested)", "parent stop"),
    ("stop", "parent's last batch finishes, query stops (drained.json)", "parent stop"),
    ("emit", "child's first emitting batch committed (it read up to and past the final positions)", "take-over"),
]
GROUPS = ["accept", "child warm-up", "pre-copy", "restore", "catch-up", "parent stop", "take-over"]
GROUP_COLORS = {
    "accept": "#7f7f7f",
    "child warm-up": "#1f77b4",
    "pre-copy": "#ff7f0e",
    "restore": "#d62728",
    "catch-up": "#9467bd",
    "parent stop": "#8c564b",
    "take-over": "#2ca02c",
}
CHILD_COLUMNS = [
    # (key in the per-child times, column)
    ("created", "child created"),
    ("podCreated", "pod created"),
    ("running", "container running"),
    ("standbyBegan", "standby began"),
    ("warm", "warm"),
    ("request", "request note"),
    ("answered", "pre-copy seen"),
    ("batch0", "batch 0 committed"),
    ("ready", "ready note"),
    ("live", "caught up (live)"),
    ("phaseRunning", "phase Running"),
    ("emitted", "first emitting batch committed"),
]
"""The children's own timelines (seconds after the split request)."""


def keys_tag(keys: int) -> str:
    """``1m`` for 1,000,000 keys, ``200k`` for 200,000: the suffix of a non-default run's result name."""
    if keys % 1_000_000 == 0:
        return f"{keys // 1_000_000}m"
    if keys % 1_000 == 0:
        return f"{keys // 1_000}k"
    return str(keys)


def result_name(mode: str, keys: int) -> str:
    """``split_latency`` (independent, 50,000 keys), ``split_latency_chain``, ``split_latency_1m``, ..."""
    name = "split_latency" if mode == "independent" else "split_latency_chain"
    return name if keys == DEFAULT_KEYS else f"{name}_{keys_tag(keys)}"


def gap_target(keys: int) -> tuple[str, float]:
    """The processing-gap target row's name and bound: its name depends on ``--keys``, so the 50,000- and the
    1,000,000-key rows coexist in the docs' Targets table."""
    if keys == DEFAULT_KEYS:
        return "processing gap, split range without output (median)", TARGET_GAP
    bound = TARGET_GAP if keys < DEFAULT_KEYS else TARGET_GAP_LARGE
    return f"processing gap with {keys:,} keys of state (median)", bound


def total_target_name(keys: int) -> str:
    if keys == DEFAULT_KEYS:
        return "split request -> both children emit (median)"
    return f"split request -> both children emit with {keys:,} keys of state (median)"


def median(values: list[float | None]) -> float | None:
    """The median of the values that were measured (None when none was)."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def since(t: float | None, t0: float) -> float | None:
    return round(t - t0, 3) if t is not None else None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, ``{}`` when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def chain(t0: float, points: list[tuple[str, float | None]]) -> tuple[dict[str, float | None], list[str]]:
    """Consecutive segments from ``t0`` through ``points``: each is its point minus the previous point present.
    A missing point gives None (its time goes to the next segment); a point earlier than the previous one
    counts 0 (so the segments always add up to the last point minus ``t0``). Returns the segments and notes."""
    segments: dict[str, float | None] = {}
    notes = []
    prev = t0
    for key, t in points:
        if t is None:
            segments[key] = None
            notes.append(f"segment {key}: its end point is missing (its time is in the next segment)")
            continue
        if t < prev - 0.001:
            notes.append(
                f"segment {key}: its end point ({t - t0:.2f} s) came before the previous one ({prev - t0:.2f} s), "
                "counted as 0"
            )
        segments[key] = round(max(0.0, t - prev), 3)
        prev = max(prev, t)
    return segments, notes


SHADOW_KEYS = ("shadowBatches", "shadowInterval", "parentIntervalInShadow")


def shadow(child: dict[int, float], parent: dict[int, float], start: float | None, end: float | None) -> dict[str, Any]:
    """A child in shadow (its batch 0 committed -> its ready note): how many batches it committed, their median
    interval, and the parent's median commit interval meanwhile. The child is ready once one of its batches ends at
    the parent's committed positions as it last read them, so it needs batches quicker than the parent's."""
    if start is None or end is None:
        return dict.fromkeys(SHADOW_KEYS)

    def intervals(times: dict[int, float]) -> list[float]:
        inside = sorted(t for t in times.values() if start <= t <= end)
        return [b - a for a, b in zip(inside, inside[1:], strict=False)]

    mine, theirs = intervals(child), intervals(parent)
    return {
        "shadowBatches": sum(1 for t in child.values() if start < t <= end),
        "shadowInterval": round(statistics.median(mine), 3) if mine else None,
        "parentIntervalInShadow": round(statistics.median(theirs), 3) if theirs else None,
    }


class Timeline:
    """Watches on TaskShards and Pods; the first time each fact was seen (this machine's wall clock)."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, ...], float] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.errors: list[str] = []

    def start(self) -> Timeline:
        for fn in (self._watch_shards, self._watch_pods):
            threading.Thread(target=self._loop, args=(fn,), daemon=True).start()
        return self

    def first(self, *key: str) -> float | None:
        with self.lock:
            return self.seen.get(key)

    def _mark(self, *key: str) -> None:
        self.seen.setdefault(key, time.time())

    def _loop(self, fn: Any) -> None:
        while not self.stop.is_set():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a broken watch is restarted
                self.errors.append(repr(e))
                time.sleep(0.2)

    def _watch_shards(self) -> None:
        from kubernetes import watch

        w = watch.Watch()
        for ev in w.stream(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, "taskshards", timeout_seconds=60
        ):
            obj = ev["object"]
            name = obj["metadata"]["name"]
            with self.lock:
                self._mark("shard", name)
                phase = (obj.get("status") or {}).get("phase")
                if phase:
                    self._mark("phase", name, phase)
                self.shards[name] = obj
            if self.stop.is_set():
                return

    def _watch_pods(self) -> None:
        from kubernetes import watch

        w = watch.Watch()
        for ev in w.stream(self.core.list_namespaced_pod, NAMESPACE, timeout_seconds=60):
            pod = self.api.sanitize_for_serialization(ev["object"])
            name = pod["metadata"]["name"]
            with self.lock:
                self._mark("pod", name)
                if ev["type"] == "DELETED":
                    self._mark("pod-deleted", name)
                for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                    state = cs.get("state") or {}
                    if "running" in state:
                        self._mark("running", name)
                    if "terminated" in state:
                        self._mark("terminated", name)
                self.pods[name] = pod
            if self.stop.is_set():
                return


class Producer(threading.Thread):
    """Appends ``rate`` events per second (in ticks of 0.25 s) over ``keys`` keys until stopped."""

    def __init__(self, journal: Path, rate: int, keys: int, seed: int, start_seq: int) -> None:
        super().__init__(daemon=True)
        self.journal, self.rate, self.keys = journal, rate, keys
        self.rng = random.Random(seed)
        self.seq = start_seq
        self.halt = threading.Event()

    def run(self) -> None:
        from spark_runtime.produce import append_events

        per_tick = max(1, self.rate // 4)
        while not self.halt.wait(0.25):
            events = [{"key": f"k{self.rng.randrange(self.keys)}", "seq": self.seq + i} for i in range(per_tick)]
            append_events(self.journal, PARTITIONS, events)
            self.seq += per_tick


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from localkube.binaries import ensure_binaries

        self.args = args
        self.run_dir = (args.out / "work" / "split_latency" / time.strftime("%Y%m%d-%H%M%S")).resolve()
        self.data = self.run_dir / "data"
        self.task = TASK
        self.binaries = ensure_binaries()
        self.cluster: Any = None
        self.operator: subprocess.Popen | None = None
        self.timeline: Timeline | None = None
        self.producer: Producer | None = None

    # ------------------------------------------------------------ plumbing
    @property
    def journal(self) -> Path:
        return self.data / "journal" / self.task

    def shard_dir(self, shard: str) -> Path:
        return self.data / "state" / self.task / "shards" / shard

    def results_dir(self, shard: str) -> Path:
        """The shard's directory in the Task's sink (``/data/output/<task>/shard=<shard>`` in the pods)."""
        return self.data / "output" / self.task / f"shard={shard}"

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, input=input, namespace=NAMESPACE).stdout

    def phase(self, shard: str) -> str | None:
        assert self.timeline is not None
        with self.timeline.lock:
            return ((self.timeline.shards.get(shard) or {}).get("status") or {}).get("phase")

    def check_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is not None:
            log = (self.run_dir / "operator.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the operator exited with {self.operator.returncode}:\n{log}")

    def wait(self, what: str, probe: Any, timeout: float, interval: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if probe():
                return
            self.check_operator()
            time.sleep(interval)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (run dir {self.run_dir})")

    def progress(self, shard: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.shard_dir(shard) / "progress.json").read_text())
        except (OSError, ValueError):
            return None

    def first_emitting_batch(self, shard: str) -> tuple[int, float] | None:
        """The shard's first batch that wrote results and its commit time (mtime of ``commits/<n>``), once that
        batch is committed; None before. The smallest ``n`` with ``batch-<n>.*`` published or in ``_pending/``
        (listed in that order: a file moves only from ``_pending/`` to published, so none is missed)."""
        from spark_runtime.layout import parse_batch_file_name

        ids: set[int] = set()
        for d in (self.results_dir(shard) / "_pending", self.results_dir(shard)):
            try:
                names = os.listdir(d)
            except OSError:
                continue
            ids.update(parsed[0] for parsed in map(parse_batch_file_name, names) if parsed is not None)
        if not ids:
            return None
        first = min(ids)
        committed = mtime(self.shard_dir(shard) / "checkpoint" / "commits" / str(first))
        return (first, committed) if committed is not None else None

    def commit_times(self, shard: str) -> dict[int, float]:
        """Batch id -> commit time (mtime of ``checkpoint/commits/<id>``) of every batch the log still holds."""
        out = {}
        try:
            files = list((self.shard_dir(shard) / "checkpoint" / "commits").iterdir())
        except OSError:
            return out
        for f in files:
            if f.name.isdigit():
                t = mtime(f)
                if t is not None:
                    out[int(f.name)] = t
        return out

    def handover_state(self, parent: str, children: list[str]) -> str:
        """Where a hand-over stands, from the files (for a timeout's message)."""
        pdir = self.shard_dir(parent)
        hdir = pdir / "handover"
        parts = [
            f"parent phase {self.phase(parent)}, last commit {(self.progress(parent) or {}).get('batchId')}",
            f"precopy.json {'yes' if (hdir / 'precopy.json').exists() else 'no'}",
            f"drain-requested {'yes' if (pdir / 'drain-requested').exists() else 'no'}",
            f"drained.json {'yes' if (pdir / 'drained.json').exists() else 'no'}",
        ]
        for c in children:
            cdir = self.shard_dir(c)
            parts.append(
                f"{c}: phase {self.phase(c)}, request {'yes' if (hdir / f'request-{c}.json').exists() else 'no'}, "
                f"commits/0 {'yes' if (cdir / 'checkpoint' / 'commits' / '0').exists() else 'no'}, "
                f"ready {'yes' if (hdir / f'ready-{c}.json').exists() else 'no'}, "
                f"catch-up {read_json(cdir / 'catch-up.json').get('phase')}, "
                f"last commit {(self.progress(c) or {}).get('batchId')}, emitted {self.first_emitting_batch(c)}"
            )
        return "; ".join(parts)

    # ------------------------------------------------------------ steps
    def start(self) -> None:
        from localkube.cluster import LocalCluster

        say("starting the local control plane with the node agent")
        self.cluster = LocalCluster(self.run_dir / "cluster", binaries=self.binaries, agent_env_path=[VENV_BIN])
        self.cluster.start()
        self.cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        self.cluster.kubectl(
            "wait", "--for=condition=Established", "crd/tasks.taskshard.io", "crd/taskshards.taskshard.io"
        )
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        wait_served(self.cluster, NAMESPACE, "tasks.taskshard.io", "taskshards.taskshard.io")
        log = open(self.run_dir / "operator.log", "wb")  # noqa: SIM115 - owned by the child
        cmd = [sys.executable, "-m", "taskshard_operator", "--namespace", NAMESPACE, "--standalone", "--liveness", ""]
        self.operator = subprocess.Popen(cmd, env=self.cluster.env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.timeline = Timeline(self.cluster.kubeconfig).start()

    def prefill(self) -> int:
        """``--prefill`` events: the first ``--keys`` of them name every key once (so the parent holds every key,
        not the ~95 % that 3 random draws per key reach), the rest random keys."""
        from spark_runtime.produce import append_events

        rng = random.Random(self.args.seed)
        n, keys = self.args.prefill, self.args.keys
        t0 = time.monotonic()
        for lo in range(0, n, 100_000):
            events = [
                {"key": f"k{i if i < keys else rng.randrange(keys)}", "seq": i} for i in range(lo, min(n, lo + 100_000))
            ]
            append_events(self.journal, PARTITIONS, events)
        say(f"pre-filled {n:,} events over {min(n, keys):,} keys in {time.monotonic() - t0:.0f}s")
        return n

    def apply_task(self) -> None:
        import yaml

        self.journal.mkdir(parents=True, exist_ok=True)
        task = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Task",
            "metadata": {"name": self.task, "namespace": NAMESPACE},
            "spec": {
                "maxKeyGroups": MAX_KEY_GROUPS,
                "initialShards": 1,
                "keyField": "key",
                "processor": {"builtin": "count"},
                "source": {"journal": {"path": f"/data/journal/{self.task}", "partitions": PARTITIONS}},
                "sink": {"directory": {"path": f"/data/output/{self.task}", "format": "jsonl"}},
                "storage": {"path": "/data/state", "volume": {"hostPath": str(self.data), "mountPath": "/data"}},
                "spark": {
                    "image": "taskshard/shard:0.1.0",
                    "conf": {
                        "spark.sql.shuffle.partitions": str(self.args.shuffle_partitions),
                        "spark.ui.enabled": "false",
                    },
                    "triggerInterval": self.args.trigger,
                },
            },
        }
        kubectl_retry(self.cluster, "apply", "-f", "-", input=yaml.safe_dump(task), namespace=NAMESPACE)

    def wait_steady(self, shard: str, min_batches: int) -> None:
        """Running, and ``min_batches`` batches committed after the first one it committed (the first batch of a
        fresh Task holds the whole pre-fill: ``--steady-timeout`` bounds each wait)."""
        timeout = self.args.steady_timeout
        t0 = time.monotonic()
        self.wait(f"{shard} Running", lambda: self.phase(shard) == "Running", timeout, 0.2)
        self.wait(f"{shard} committing", lambda: (self.progress(shard) or {}).get("batchId", -1) >= 0, timeout, 0.2)
        first = self.progress(shard)["batchId"]
        self.wait(
            f"{shard} {min_batches} more batches",
            lambda: (self.progress(shard) or {}).get("batchId", -1) >= first + min_batches,
            timeout,
            0.2,
        )
        say(f"{shard} steady after {time.monotonic() - t0:.0f}s (batch {self.progress(shard)['batchId']})")

    def split(self, parent: str) -> dict[str, Any]:
        from taskshard_operator.naming import pod_name

        spec = self.timeline.shards[parent]["spec"]["keyGroups"]
        start, end = spec["start"], spec["end"]
        mid = start + (end - start) // 2
        children = [f"{self.task}-{start}-{mid}", f"{self.task}-{mid}-{end}"]
        say(f"splitting {parent} [{start}, {end}) -> {children[0]} + {children[1]}")
        labels = {parent: "parent", children[0]: "child 1", children[1]: "child 2"}
        sampler = ProcessCpuSampler(shard_classifier(labels))
        sampler.start()
        # Spark keeps only the last 100 entries of a commit log: the shards' commit times are collected while
        # the hand-over runs (every 0.5 s), so a long one loses none.
        commits: dict[str, dict[int, float]] = {s: self.commit_times(s) for s in (parent, *children)}
        looked = told = time.monotonic()
        t_req = time.time()
        self.timeline.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            NAMESPACE,
            "taskshards",
            parent,
            {"spec": {"split": {"requested": True}}},
            _content_type="application/merge-patch+json",
        )
        emitted: dict[str, tuple[int, float]] = {}

        def both_emitted() -> bool:
            nonlocal looked, told
            if time.monotonic() - looked >= 0.5:
                looked = time.monotonic()
                for shard, seen in commits.items():
                    seen.update(self.commit_times(shard))
            if time.monotonic() - told >= 60:
                told = time.monotonic()
                say(f"{time.time() - t_req:.0f}s after the request: {self.handover_state(parent, children)}")
            for c in children:
                if c not in emitted:
                    found = self.first_emitting_batch(c)
                    if found is not None:
                        emitted[c] = found
                        say(f"{c} emits: batch {found[0]} committed {found[1] - t_req:.1f}s after the request")
            return len(emitted) == len(children)

        try:
            self.wait("both children's first emitting batch", both_emitted, self.args.split_timeout, 0.1)
        except RuntimeError as e:
            sampler.finish()
            raise RuntimeError(f"{e}\nhand-over state: {self.handover_state(parent, children)}") from None
        cpu_groups = sampler.finish()
        cpu_machine = sampler.machine()
        time.sleep(0.5)  # the watch events of that moment arrive
        for shard, seen in commits.items():
            seen.update(self.commit_times(shard))
        return self.measure(parent, children, t_req, emitted, commits, sampler, cpu_groups, cpu_machine, pod_name)

    def measure(
        self,
        parent: str,
        children: list[str],
        t_req: float,
        emitted: dict[str, tuple[int, float]],
        all_commits: dict[str, dict[int, float]],
        sampler: ProcessCpuSampler,
        cpu_groups: dict[str, float],
        cpu_machine: dict[str, Any],
        pod_name: Any,
    ) -> dict[str, Any]:
        """Everything about one split, from the watches and the files (see the module docstring)."""
        tl = self.timeline
        pdir = self.shard_dir(parent)
        hdir = pdir / "handover"
        drained = read_json(pdir / "drained.json")
        precopy = read_json(hdir / "precopy.json")
        commits = all_commits[parent]
        last_batch = drained.get("batchId")
        t: dict[str, float | None] = {
            "request": t_req,
            "accepted": tl.first("phase", parent, "SplitRequested"),
            "draining": tl.first("phase", parent, "Draining"),
            "precopy": mtime(hdir / "precopy.json"),
            "marker": mtime(pdir / "drain-requested"),
            "lastCommit": commits.get(last_batch) if last_batch is not None else None,
            "drainedJson": mtime(pdir / "drained.json"),
            "exited": tl.first("terminated", pod_name(parent)),
            "drained": tl.first("phase", parent, "Drained"),
            "childrenCreated": tl.first("phase", parent, "ChildrenCreated"),
            "split": tl.first("phase", parent, "Split"),
        }
        notes = []
        if drained.get("handover") != "catch-up":
            notes.append(
                f"the parent's drained.json says handover={drained.get('handover')!r}, not 'catch-up': this split "
                "did not use the catch-up hand-over"
            )
        per_child = {}
        for c in children:
            cdir = self.shard_dir(c)
            standby = read_json(cdir / "standby.json")
            if not standby:
                notes.append(f"{c}: no standby.json (the child was not on standby)")
            elif standby.get("mode") != "catch-up":
                notes.append(f"{c}: standby mode {standby.get('mode')!r}, not catch-up")
            catch_up = read_json(cdir / "catch-up.json")
            if catch_up.get("phase") != "live":
                notes.append(f"{c}: catch-up.json phase {catch_up.get('phase')!r} after it emitted (expected live)")
            per_child[c] = {
                "created": tl.first("shard", c),
                "podCreated": tl.first("pod", pod_name(c)),
                "running": tl.first("running", pod_name(c)),
                "standbyBegan": standby.get("began"),
                "warm": standby.get("warm"),
                "request": mtime(hdir / f"request-{c}.json"),
                "answered": standby.get("parentAnswered"),
                "batch0": mtime(cdir / "checkpoint" / "commits" / "0"),
                "ready": mtime(hdir / f"ready-{c}.json"),
                "live": mtime(cdir / "catch-up.json") if catch_up.get("phase") == "live" else None,
                "phaseRunning": tl.first("phase", c, "Running"),
                "emitted": emitted[c][1],
                "emitBatch": emitted[c][0],
                "mode": standby.get("mode"),
                "standbySeconds": standby.get("standbySeconds"),
                "restoredRows": sum(
                    read_json(f).get("rows") or 0 for f in (cdir / "restore").glob("kg-*.json") if f.is_file()
                ),
            }
            per_child[c] |= shadow(all_commits[c], commits, per_child[c]["batch0"], per_child[c]["ready"])
        critical = max(children, key=lambda c: per_child[c]["emitted"])
        c = per_child[critical]
        ready_times = [per_child[x]["ready"] for x in children]
        last_ready = max(ready_times) if all(r is not None for r in ready_times) else None
        segments, chain_notes = chain(
            t_req,
            [
                ("accept", t["draining"]),
                ("podStart", c["standbyBegan"]),
                ("warm", c["warm"]),
                ("ask", c["request"]),
                ("precopy", t["precopy"]),
                ("restore", c["batch0"]),
                ("shadow", c["ready"]),
                ("sibling", last_ready),
                ("notice", t["marker"]),
                ("stop", t["drainedJson"]),
                ("emit", c["emitted"]),
            ],
        )
        notes += [f"critical path ({critical}): {n}" for n in chain_notes]
        groups = {g: round(sum(segments[k] or 0 for k, _, grp in SEGMENTS if grp == g), 3) for g in GROUPS}
        total = round(c["emitted"] - t_req, 3)
        gap = round(c["emitted"] - t["lastCommit"], 3) if t["lastCommit"] is not None else None
        if gap is None:
            notes.append(f"no commit time of the parent's last batch {last_batch}: no processing gap")
        handover = self.parent_during_handover(commits, t_req, t, precopy, drained, last_batch, notes)
        handover["gapParts"] = {
            "lastCommitToDrained": since(t["drainedJson"], t["lastCommit"]) if t["lastCommit"] else None,
            "drainedToEmit": since(c["emitted"], t["drainedJson"]) if t["drainedJson"] else None,
        }
        result = {
            "parent": parent,
            "children": children,
            "criticalChild": critical,
            "total": total,
            "processingGap": gap,
            "segments": segments,
            "groups": groups,
            "handover": handover,
            "childTimes": {
                name: {key: since(pc[key], t_req) for key, _ in CHILD_COLUMNS}
                | {k: pc[k] for k in ("emitBatch", "restoredRows", "mode", *SHADOW_KEYS)}
                for name, pc in per_child.items()
            },
            "stealPercent": cpu_machine["stealPercent"],
            "cpu": {"groups": cpu_groups, "jit": sampler.jit_groups, "machine": cpu_machine},
            "parentExited": since(t["exited"], t_req),
            "parentBatchId": last_batch,
            "parentStateRows": drained.get("stateRows", precopy.get("stateRows")),
            "runtimeDrainSeconds": drained.get("drainSeconds"),
            "times": t,
            "children_times": per_child,
            "notes": notes,
        }
        return result

    @staticmethod
    def parent_during_handover(
        commits: dict[int, float],
        t_req: float,
        t: dict[str, float | None],
        precopy: dict[str, Any],
        drained: dict[str, Any],
        last_batch: int | None,
        notes: list[str],
    ) -> dict[str, Any]:
        """The parent's commits between the request and its final drain (it keeps processing), its pre-copy and
        its stop."""
        times = sorted(commits.values())
        end = t["drainedJson"] or t["marker"] or (max(times) if times else t_req)
        before = [x for x in times if x < t_req]
        inside = [x for x in times if t_req <= x <= end]
        series = before[-1:] + inside
        gaps = [b - a for a, b in zip(series, series[1:], strict=False)]
        recent = before[-6:]  # the commit interval before the request: the last 5 intervals (fewer at first)
        cadence = [b - a for a, b in zip(recent, recent[1:], strict=False)]
        export_s = precopy.get("exportSeconds")
        export_end = t["precopy"]
        export_start = export_end - export_s if export_end is not None and export_s is not None else None
        during_export = sum(1 for x in times if export_start <= x <= export_end) if export_start is not None else None
        if not inside:
            notes.append("the parent committed no batch between the request and its final drain")
        k = precopy.get("batchId")
        return {
            "precopyBatch": k,
            "precopyStateRows": precopy.get("stateRows"),
            "precopyExportSeconds": export_s,
            "commitIntervalBefore": round(statistics.median(cadence), 3) if cadence else None,
            "commitsInWindow": len(inside),
            "windowSeconds": round(end - t_req, 3),
            "longestCommitGap": round(max(gaps), 3) if gaps else None,
            "longestCommitGapAt": round(series[gaps.index(max(gaps)) + 1] - t_req, 3) if gaps else None,
            "commitsDuringExport": during_export,
            "commitTimes": [round(x - t_req, 3) for x in inside],
            "precopyAt": since(t["precopy"], t_req),
            "drainRequestedAt": since(t["marker"], t_req),
            "lastCommitAt": since(t["lastCommit"], t_req),
            "drainedAt": since(t["drainedJson"], t_req),
            "finalBatch": last_batch,
            "batchesAfterPrecopy": last_batch - k if last_batch is not None and k is not None else None,
            "snapshotBatchId": drained.get("snapshotBatchId"),
            "handoverMode": drained.get("handover"),
            "runtimeDrainSeconds": drained.get("drainSeconds"),
            "phaseDrainedAt": since(t["drained"], t_req),
            "podExitedAt": since(t["exited"], t_req),
        }

    def run(self) -> list[dict[str, Any]]:
        self.start()
        if self.args.mode == "chain":
            return self.run_chain()
        results = []
        for i in range(self.args.splits):
            self.task = f"{TASK}{i + 1}"
            self.begin_task()
            r = self.split(f"{self.task}-0-{MAX_KEY_GROUPS}")
            r["otherShards"] = 0
            results.append(r)
            self.end_task()
        return results

    def run_chain(self) -> list[dict[str, Any]]:
        """Split k splits the left child of split k-1; the shards earlier splits left keep running."""
        self.begin_task()
        results = []
        shard = f"{self.task}-0-{MAX_KEY_GROUPS}"
        for i in range(self.args.splits):
            r = self.split(shard)
            r["otherShards"] = i
            results.append(r)
            shard = r["children"][0]
            if i + 1 < self.args.splits:
                self.wait_steady(shard, self.args.min_batches)
        return results

    def begin_task(self) -> None:
        """Pre-fill the task's journal, apply the Task, start the producer, wait until its shard is steady."""
        self.prefill()
        self.apply_task()
        self.producer = Producer(self.journal, self.args.rate, self.args.keys, self.args.seed + 1, self.args.prefill)
        self.producer.start()
        self.wait_steady(f"{self.task}-0-{MAX_KEY_GROUPS}", self.args.min_batches)

    def end_task(self) -> None:
        """Stop the producer and delete the Task (its pods stop), so the next trial starts on an idle machine."""
        if self.producer is not None:
            self.producer.halt.set()
            self.producer = None
        say(f"deleting Task {self.task}")
        self.cluster.kubectl(
            "delete", "task", self.task, "--wait=true", "--timeout=300s", namespace=NAMESPACE, check=False, timeout=330
        )
        self.wait(
            f"the pods of {self.task} gone",
            lambda: not self.kubectl("get", "pods", "-l", f"taskshard.io/task={self.task}", "-o", "name").strip(),
            300,
            0.5,
        )

    def stop(self) -> None:
        if self.producer is not None:
            self.producer.halt.set()
        try:
            if self.cluster is not None and self.operator is not None and self.operator.poll() is None:
                say("deleting the Task (its shard pods drain and stop)")
                self.cluster.kubectl(
                    "delete",
                    "task",
                    self.task,
                    "--wait=true",
                    "--timeout=300s",
                    namespace=NAMESPACE,
                    check=False,
                    timeout=330,
                )
        finally:
            if self.timeline is not None:
                self.timeline.stop.set()
            if self.operator is not None and self.operator.poll() is None:
                self.operator.terminate()
                try:
                    self.operator.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.operator.kill()
            if self.cluster is not None:
                self.cluster.stop()


CPU_GROUPS = [
    "parent JVM",
    "parent Python",
    "child 1 JVM",
    "child 1 Python",
    "child 2 JVM",
    "child 2 Python",
    "control plane",
    "node agent",
    "operator",
]
JIT_COLUMNS = {"child 1 JVM": "child 1 JIT", "child 2 JVM": "child 2 JIT"}
"""The part of a child JVM's CPU time spent by HotSpot's JIT compiler threads, shown next to it."""


def cpu_table(results: list[dict[str, Any]]) -> tuple[str, list[str], list[list[Any]]]:
    """The CPU work of each split, by process group, next to the machine's busy, idle and stolen time."""
    cores = os.cpu_count() or 1
    title = "CPU seconds spent from the split request until both children emitted (all processes, /proc)"
    group_cols = [c for g in CPU_GROUPS for c in ([g, f"({JIT_COLUMNS[g]})"] if g in JIT_COLUMNS else [g])]
    columns = ["split", "wall s", *group_cols, "other", "machine busy", "idle", "stolen", f"busy / {cores} cores s"]
    rows = []
    for i, r in enumerate(results):
        groups, jit, mach = r["cpu"]["groups"], r["cpu"].get("jit", {}), r["cpu"]["machine"]
        known = [
            v
            for g in CPU_GROUPS
            for v in ([groups.get(g, 0.0), jit.get(g, 0.0)] if g in JIT_COLUMNS else [groups.get(g, 0.0)])
        ]
        other = round(sum(v for k, v in groups.items() if k not in CPU_GROUPS), 2)
        floor = round(mach["busy"] / cores, 2)
        rows.append([i + 1, r["total"], *known, other, mach["busy"], mach["idle"], mach["steal"], floor])
    return title, columns, rows


def targets(results: list[dict[str, Any]], mode: str, keys: int) -> list[dict[str, Any]]:
    """The Targets rows: measured medians against their bounds (``--mode chain``: reported, no bound)."""
    gap = median([r["processingGap"] for r in results])
    total = median([r["total"] for r in results])
    med_groups = {g: median([r["groups"][g] for r in results]) or 0.0 for g in GROUPS}
    parts = {
        k: median([r["handover"]["gapParts"][k] for r in results]) for k in ("lastCommitToDrained", "drainedToEmit")
    }

    def s(v: float | None) -> str:
        return f"{v:.1f} s" if v is not None else "-"

    gap_why = (
        f"Medians: the parent's last commit -> its drained.json {s(parts['lastCommitToDrained'])}, drained.json -> "
        f"the later child's first emitting batch committed (the batch that reads up to and past the final "
        f"positions) {s(parts['drainedToEmit'])}"
    )
    total_why = "Critical path by group (medians): " + ", ".join(
        f"{g} {v:.1f} s" for g, v in sorted(med_groups.items(), key=lambda kv: -kv[1]) if v
    )
    gap_value = f"{gap:.1f} s" if gap is not None else "not measured"
    total_value = f"{total:.1f} s" if total is not None else "not measured"
    if mode == "chain":
        suffix = "" if keys == DEFAULT_KEYS else f", {keys:,} keys of state"
        return [
            {
                "name": f"processing gap with chained splits, k-1 other shards running{suffix} (median; informational)",
                "target": "reported",
                "value": gap_value,
                "met": True,
            },
            {
                "name": f"split request -> both children emit with chained splits{suffix} (median; informational)",
                "target": "reported",
                "value": total_value,
                "met": True,
            },
        ]
    gap_name, gap_bound = gap_target(keys)
    return [
        {
            "name": gap_name,
            "target": f"<= {gap_bound:.0f} s",
            "value": gap_value,
            "met": gap is not None and gap <= gap_bound,
            "why": gap_why,
        },
        {
            "name": total_target_name(keys),
            "target": f"<= {TARGET_TOTAL:.0f} s",
            "value": total_value,
            "met": total is not None and total <= TARGET_TOTAL,
            "why": total_why,
        },
    ]


def comparison(results: list[dict[str, Any]], load_mean: float) -> tuple[str, list[str], list[list[Any]]]:
    """This run's medians next to the previous protocol's (constants: its code is gone)."""
    gap = median([r["processingGap"] for r in results])
    total = median([r["total"] for r in results])
    busy = median([r["cpu"]["machine"]["busy"] for r in results])

    def change(old: float, new: float | None) -> str:
        return f"{new - old:+.1f} s ({new / old:.2f}x)" if new is not None else "-"

    title = "Before and after: the previous split protocol against the catch-up hand-over (medians)"
    splits = f"{len(results)} split{'s' if len(results) != 1 else ''}"
    columns = ["measurement", PREVIOUS_LABEL, f"this run: catch-up hand-over ({splits})", "change"]
    rows = [
        ["processing gap s (the split range without output)", PREVIOUS["gap"], gap, change(PREVIOUS["gap"], gap)],
        [
            "split request -> both children took over s (before: first batch committed; now: first emitting batch)",
            PREVIOUS["total"],
            total,
            change(PREVIOUS["total"], total),
        ],
        ["machine busy CPU s per split (until both took over)", PREVIOUS["busy"], busy, change(PREVIOUS["busy"], busy)],
        [
            "load average (1 min) during the run, mean (2 cores; other work on the machine)",
            PREVIOUS["load"],
            load_mean,
            "-",
        ],
    ]
    return title, columns, rows


def plot(results: list[dict[str, Any]], path: Path, title: str, target: float | None) -> None:
    """One bar per split (the critical path's segments), the parent's commits above it, the processing gap below."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.3 * len(results)))
    labels = [f"split {i + 1}:\n{r['parent']}" for i, r in enumerate(results)]
    for i, r in enumerate(results):
        left = 0.0
        for key, label, group in SEGMENTS:
            width = max(0.0, r["segments"].get(key) or 0.0)
            alpha = 1.0 - 0.22 * [k for k, _, g in SEGMENTS if g == group].index(key)
            ax.barh(
                i,
                width,
                left=left,
                height=0.5,
                color=GROUP_COLORS[group],
                alpha=max(0.3, alpha),
                edgecolor="white",
                label=f"{group}: {label}" if i == 0 else None,
            )
            if width >= 0.04 * max(r["total"], 1.0):
                ax.text(left + width / 2, i, f"{width:.1f}", ha="center", va="center", fontsize=7, color="white")
            left += width
        ax.text(left + 0.01 * left, i, f"{r['total']:.1f}s", va="center", fontsize=9)
        commits = r["handover"].get("commitTimes") or []
        ax.plot(
            commits,
            [i - 0.36] * len(commits),
            "|",
            color="black",
            ms=5,
            label="parent commits (request -> its drain)" if i == 0 else None,
        )
        last = r["handover"].get("lastCommitAt")
        if last is not None and r.get("processingGap") is not None:
            ax.plot(
                [last, r["total"]],
                [i + 0.36] * 2,
                color="black",
                lw=3,
                solid_capstyle="butt",
                label="processing gap (parent's last commit -> later child's first emitting commit)"
                if i == 0
                else None,
            )
            ax.text(r["total"] + 0.01 * r["total"], i + 0.36, f"gap {r['processingGap']:.1f}s", va="center", fontsize=8)
    if target is not None:
        ax.axvline(target, color="red", ls="--", lw=1, label=f"target {target:.0f}s (request -> both emit)")
    ax.set_yticks(range(len(results)), labels, fontsize=8)
    ax.set_ylim(len(results) - 0.4, -0.6)
    ax.set_xlabel("seconds from the split request (critical path: the child that emitted last)")
    ax.set_xlim(0, max(max(r["total"] for r in results), target or 0) * 1.12)
    ax.set_title(title, fontsize=9)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--splits", type=int, default=3, help="splits (trials) to time (default 3)")
    ap.add_argument(
        "--mode",
        choices=("independent", "chain"),
        default="independent",
        help="independent (default): each split is of a fresh one-shard Task on an otherwise idle machine (the "
        "Task of the previous trial is deleted first); chain: split the previous split's left child, the other "
        "shards keep running (split k competes with k-1 more shard JVMs for the same cores)",
    )
    ap.add_argument("--prefill", type=int, default=200_000, help="events in the journal before the Task (default 200k)")
    ap.add_argument("--keys", type=int, default=DEFAULT_KEYS, help=f"distinct keys (default {DEFAULT_KEYS:,})")
    ap.add_argument("--rate", type=int, default=400, help="events per second appended during the run (default 400)")
    ap.add_argument("--min-batches", type=int, default=2, help="batches a shard commits before its split (default 2)")
    ap.add_argument("--trigger", default="1 second", help="the Task's triggerInterval (default '1 second')")
    ap.add_argument("--shuffle-partitions", default="2", help="spark.sql.shuffle.partitions (default 2)")
    ap.add_argument(
        "--steady-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for each step of a shard getting steady before its split: Running, its first batch "
        "(a fresh Task's holds the whole pre-fill), the next batches (default 900)",
    )
    ap.add_argument(
        "--split-timeout",
        type=float,
        default=900.0,
        help="seconds to wait from the split request until both children emit (default 900)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # paths go into configs and hostPath volumes

    bench = Bench(args)
    bench.run_dir.mkdir(parents=True)
    with LoadSampler() as load:
        try:
            results = bench.run()
        finally:
            bench.stop()
    summary = load.summary()
    independent = args.mode == "independent"
    goals = targets(results, args.mode, args.keys)
    gap_goal, total_goal = goals

    gap_bound = gap_target(args.keys)[1]

    def verdict(bound: float, value: float | None) -> str:
        if not independent:
            return "reported"
        return "met" if value is not None and value <= bound else "MISSED"

    columns = [
        "split",
        "parent keys",
        "other shards running",
        "CPU steal %",
        "processing gap s",
        "request -> both emit s",
        *GROUPS,
        f"gap target ({gap_goal['target']})",
        f"total target ({total_goal['target']})",
    ]
    rows = [
        [
            f"{i + 1}: {r['parent']} -> {' + '.join(r['children'])}",
            r["parentStateRows"],
            r["otherShards"],
            r.get("stealPercent"),
            r.get("processingGap"),
            r["total"],
            *(r["groups"][g] for g in GROUPS),
            verdict(gap_bound, r.get("processingGap")),
            verdict(TARGET_TOTAL, r["total"]),
        ]
        for i, r in enumerate(results)
    ]
    med_gap = median([r.get("processingGap") for r in results])
    med_total = median([r["total"] for r in results])
    rows.append(
        [
            "median",
            None,
            None,
            median([r.get("stealPercent") for r in results]),
            med_gap,
            med_total,
            *(median([r["groups"][g] for r in results]) for g in GROUPS),
            verdict(gap_bound, med_gap),
            verdict(TARGET_TOTAL, med_total),
        ]
    )
    seg_title = "Where the time goes (critical path: the child that emitted last)"
    seg_cols = ["segment", "group", *[f"split {i + 1} s" for i in range(len(results))], "median s"]
    seg_rows = [
        [label, group, *(r["segments"].get(key) for r in results), median([r["segments"].get(key) for r in results])]
        for key, label, group in SEGMENTS
    ]
    title = (
        f"Split latency ({args.mode} splits, catch-up hand-over), local control plane + node agent, builtin count, "
        f"{args.keys:,} keys, {args.rate} events/s arriving, trigger {args.trigger}"
    )
    parent_title = (
        "The parent during the hand-over: it keeps processing until both children are ready (times in seconds "
        "after the split request)"
    )
    parent_cols = [
        "split",
        "pre-copy of batch K",
        "keys in the pre-copy",
        "pre-copy export s",
        "parent commit interval before the request s",
        "parent commits between request and its final drain",
        "longest gap between parent commits in that window s",
        "that gap ended at",
        "parent commits during the pre-copy export",
        "pre-copy written",
        "drain requested",
        "last commit (batch N)",
        "drained.json",
        "final batch N",
        "batches after K",
        "last commit -> drained.json s",
        "drained.json -> first emitting commit s",
    ]
    parent_rows = []
    for i, r in enumerate(results):
        h = r["handover"]
        parts = h["gapParts"]
        parent_rows.append(
            [
                i + 1,
                h["precopyBatch"],
                h["precopyStateRows"],
                h["precopyExportSeconds"],
                h["commitIntervalBefore"],
                h["commitsInWindow"],
                h["longestCommitGap"],
                h["longestCommitGapAt"],
                h["commitsDuringExport"],
                h["precopyAt"],
                h["drainRequestedAt"],
                h["lastCommitAt"],
                h["drainedAt"],
                h["finalBatch"],
                h["batchesAfterPrecopy"],
                parts["lastCommitToDrained"],
                parts["drainedToEmit"],
            ]
        )
    child_title = "The children's timelines (seconds after the split request)"
    child_cols = [
        "split",
        "child",
        *(col for _, col in CHILD_COLUMNS),
        "first emitting batch",
        "restored keys",
        "shadow batches (batch 0 -> ready)",
        "child commit interval in shadow s",
        "parent commit interval meanwhile s",
    ]
    child_rows = [
        [
            i + 1,
            child,
            *(r["childTimes"][child][key] for key, _ in CHILD_COLUMNS),
            r["childTimes"][child]["emitBatch"],
            r["childTimes"][child]["restoredRows"],
            *(r["childTimes"][child].get(key) for key in SHADOW_KEYS),
        ]
        for i, r in enumerate(results)
        for child in r["children"]
    ]
    cpu_title, cpu_cols, cpu_rows = cpu_table(results)
    tables = [
        (title, columns, rows),
        (seg_title, seg_cols, seg_rows),
        (parent_title, parent_cols, parent_rows),
        (child_title, child_cols, child_rows),
        (cpu_title, cpu_cols, cpu_rows),
    ]
    comparable = independent and args.keys == DEFAULT_KEYS
    if comparable:
        tables.append(comparison(results, summary["during"]["mean"]))
    for i, (t, c, r) in enumerate(tables):
        print_table(t, c, r, summary if i == 0 else None)
    for g in goals:
        say(f"target {g['name']}: {g['value']} ({g['target']}): {'met' if g['met'] else 'MISSED'}")
    args.out.mkdir(parents=True, exist_ok=True)
    name = result_name(args.mode, args.keys)
    plot(results, args.out / f"{name}.png", title, TARGET_TOTAL if independent else None)
    notes = [
        "The protocol: the children warm up, ask the running parent for a pre-copy snapshot of its latest committed "
        "batch K, restore it (batch 0, no output) and follow the parent without emitting until they have caught "
        "up; then the parent drains at a batch boundary (no export) and the children continue from its final "
        "positions and emit. See the docstring of bench/split_latency.py and spark_runtime/handover.py.",
        "'processing gap' is the parent's last commit (mtime of its checkpoint/commits/<N>, N = drained.json's "
        "batchId) -> the later child's first emitting batch committed (mtime of its commits/<n>, n = the smallest "
        "batch with a results file in the sink, published or _pending): the only time no shard emits for the "
        "split range. 'request -> both emit' is the split request -> that same commit.",
        "Times are on this machine's wall clock: Kubernetes watch events stamped on arrival (tens of ms) and the "
        "runtime's files on the shared volume (mtimes; standby.json's epoch times for standby began and warm).",
        "The critical path follows the child that emitted last; both children and the parent run in parallel "
        "(three JVMs on the same 2 cores)"
        + (
            ", next to the shards earlier splits left running (split k: k-1 of them)."
            if args.mode == "chain"
            else "; each split is of a fresh one-shard Task (the previous trial's Task is deleted first)."
        ),
        "A segment whose end point is missing is shown as '-' (its time goes to the next segment); one whose end "
        "came before the previous point counts 0: 'pre-copy' is 0 when the other child asked first and the "
        "pre-copy was written before this child's request.",
        "'catch-up' ends with the child's ready note: the child writes it once one of its batches has ended at "
        "the parent's committed positions as it last read them (the parent's progress.json, re-read every 0.25 s: "
        "its cap); each parent commit moves the cap, so a child whose batches take longer than the parent's commit "
        "interval may need many batches for that (children's table: shadow batches and both intervals; "
        "spark_runtime/handover.py, ChildHandover._follow).",
        "The parent table's commit counts come from the mtimes of the parent's checkpoint/commits/* files between "
        "the request and its drained.json; 'longest gap' includes the interval from its last commit before the "
        "request. 'parent commits during the pre-copy export' counts commits within the export's exportSeconds "
        "before precopy.json was written: the parent's query keeps running while its poll loop exports.",
        f"The pre-fill names every key once, then random keys: the parent holds all {args.keys:,} keys "
        f"({args.prefill:,} events before the Task, then {args.rate} events/s over the same keys).",
        "CPU steal % is the share of this VM's CPU time the hypervisor gave to other guests during the split "
        "(/proc/stat); at tens of percent the same split takes several times longer, so compare splits with "
        "similar steal.",
        "CPU seconds are each process's user + system time from /proc/<pid>/stat, sampled every 0.25 s from the "
        "request until both children emitted, grouped by the pod (the TASKSHARD_SHARD in the process's environment) "
        "and JVM or Python; 'machine busy' is all of this VM's busy time from /proc/stat (processes that exited "
        "between samples lose up to 0.25 s each, so the groups sum to a little less). '(child N JIT)' is the part "
        "of child N's JVM time spent in HotSpot's C1/C2 compiler threads; 'other' is every other process on this VM "
        "(this script and its samplers, and other work on a shared machine). The parent now runs for most of the "
        "window (it processes until the children are ready), so its CPU is larger than under the old protocol.",
    ]
    if comparable:
        notes.append(
            f"The 'before' column is the {PREVIOUS_LABEL}: the parent drained at once (stopped, exported its "
            "state, wrote drained.json) and the standby children restored the snapshot; its 'total' ended at both "
            "children's first committed batch (their first batch after the restore) and its CPU window too. Those "
            "numbers are constants in bench/split_latency.py: the code that measured them went with that protocol."
        )
    else:
        notes.append(
            "No before/after table: the previous protocol's numbers (drain, then restore; measured 2026-11-22 on "
            f"this machine) are for independent splits with {DEFAULT_KEYS:,} keys only."
        )
    for r in results:
        notes.extend(f"{r['parent']}: {n}" for n in r["notes"])
    write_result(
        args.out,
        name,
        {
            "title": "Split latency"
            + (" with chained splits" if args.mode == "chain" else "")
            + ("" if args.keys == DEFAULT_KEYS else f" with {args.keys:,} keys of state"),
            "command": command_line(argv),
            "parameters": vars(args) | {"out": str(args.out)},
            "machine": machine(),
            "load": summary,
            "tables": [{"title": t, "columns": c, "rows": r} for t, c, r in tables],
            "targets": goals,
            "plots": [f"{name}.png"],
            "notes": notes,
            "raw": {
                "results": results,
                "runDir": str(bench.run_dir),
                "previous": {"label": PREVIOUS_LABEL, **PREVIOUS} if comparable else None,
            },
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
