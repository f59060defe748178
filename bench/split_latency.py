"""Split latency on the local control plane: from the split request until both children emit results.

On the bed (``hack/operator_bed.py``), a journal pre-filled with ``--prefill`` events (the first ``--keys`` name
every key once) and a one-shard Task (builtin count) while ``--rate`` events/s arrive; once steady its shard is
split (``spec.split.requested: true``): ``--splits`` fresh Tasks in turn (``--mode independent``) or the left child
again and again, the others running (``--mode chain``). The catch-up hand-over's steps are the ``SEGMENTS`` of the
critical path; the headline is the **processing gap**, the parent's last commit -> the later child's first emitting
commit (measured as ``NOTES`` say). Targets: gap (median) <= 5 s with 50,000 and with 1,000,000 keys; request ->
both emit (median) <= 90 s (``--mode chain``: reported). Writes ``<out>/split_latency*.{json,png}``.

    .venv/bin/python bench/split_latency.py --splits 3
    .venv/bin/python bench/split_latency.py --keys 1000000 --prefill 3000000 --splits 2 \
        --steady-timeout 1800 --split-timeout 1800      # bench/run_all.py's split-1m: split_latency_1m.json
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LoadSampler, bed_task, median, mtime, options, parse, publish, pyplot, read_json, say, target  # noqa: E402
from operator_bed import OperatorBed  # noqa: E402
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
"""The same with more keys (1,000,000): the first batch past the parent's final positions emits, whatever the state."""
TARGET_TOTAL = 90.0
"""Split request -> both children emit (median), seconds."""

SEGMENTS = [  # (key, label, group): the critical path (the child that emitted last), in order
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
COLORS = dict(zip(GROUPS, ["#7f7f7f", "#1f77b4", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#2ca02c"], strict=True))
CHILD_COLUMNS = [  # (key in the per-child times, column): seconds after the split request
    ("created", "child created"), ("podCreated", "pod created"), ("running", "container running"),
    ("standbyBegan", "standby began"), ("warm", "warm"), ("request", "request note"),
    ("answered", "pre-copy seen"), ("batch0", "batch 0 committed"), ("ready", "ready note"),
    ("live", "caught up (live)"), ("phaseRunning", "phase Running"), ("emitted", "first emitting batch committed"),
]  # fmt: skip
PARENT_COLUMNS = [  # (key in a result's "handover", column)
    ("precopyBatch", "pre-copy of batch K"), ("precopyStateRows", "keys in the pre-copy"),
    ("precopyExportSeconds", "pre-copy export s"),
    ("commitIntervalBefore", "parent commit interval before the request s"),
    ("commitsInWindow", "parent commits between request and its final drain"),
    ("longestCommitGap", "longest gap between parent commits in that window s"),
    ("longestCommitGapAt", "that gap ended at"), ("commitsDuringExport", "parent commits during the pre-copy export"),
    ("precopyAt", "pre-copy written"), ("drainRequestedAt", "drain requested"),
    ("lastCommitAt", "last commit (batch N)"), ("drainedAt", "drained.json"), ("finalBatch", "final batch N"),
    ("batchesAfterPrecopy", "batches after K"), ("lastCommitToDrained", "last commit -> drained.json s"),
    ("drainedToEmit", "drained.json -> first emitting commit s"),
]  # fmt: skip
SHADOW_KEYS = ("shadowBatches", "shadowInterval", "parentIntervalInShadow")
CPU_GROUPS = ["parent JVM", "parent Python", "child 1 JVM", "child 1 Python", "child 2 JVM", "child 2 Python"]
CPU_GROUPS += ["control plane", "node agent", "operator"]
JIT_COLUMNS = {"child 1 JVM": "child 1 JIT", "child 2 JVM": "child 2 JIT"}
"""The part of a child JVM's CPU time spent by HotSpot's JIT compiler threads, shown next to it."""


def result_name(mode: str, keys: int) -> str:
    """``split_latency`` (independent, 50,000 keys), ``split_latency_chain``, ``split_latency_1m``, ``..._200k``."""
    name = "split_latency" if mode == "independent" else "split_latency_chain"
    if keys == DEFAULT_KEYS:
        return name
    tag = f"{keys // 1_000_000}m" if keys % 1_000_000 == 0 else f"{keys // 1_000}k" if keys % 1_000 == 0 else keys
    return f"{name}_{tag}"


def since(t: float | None, t0: float | None) -> float | None:
    return round(t - t0, 3) if t is not None and t0 is not None else None


def chain(t0: float, points: list[tuple[str, float | None]]) -> tuple[dict[str, float | None], list[str]]:
    """Consecutive segments from ``t0`` through ``points``: each is its point minus the previous point present.
    A missing point gives None (its time goes to the next segment); a point earlier than the previous one counts
    0 (so the segments add up to the last point minus ``t0``). Returns the segments and notes."""
    segments: dict[str, float | None] = {}
    notes, prev = [], t0
    for key, t in points:
        if t is None:
            segments[key] = None
            notes.append(f"segment {key}: its end point is missing (its time is in the next segment)")
            continue
        if t < prev - 0.001:
            notes.append(f"segment {key}: ends ({t - t0:.2f} s) before the previous point ({prev - t0:.2f} s): 0")
        segments[key] = round(max(0.0, t - prev), 3)
        prev = max(prev, t)
    return segments, notes


def shadow(child: dict[int, float], parent: dict[int, float], start: float | None, end: float | None) -> dict[str, Any]:
    """A child in shadow (its batch 0 -> its ready note): its batches, their median interval, and the parent's
    median commit interval meanwhile (the child is ready once a batch ends at the parent's positions as it last
    read them, so it needs batches quicker than the parent's)."""
    if start is None or end is None:
        return dict.fromkeys(SHADOW_KEYS)

    def interval(times: dict[int, float]) -> float | None:
        inside = sorted(t for t in times.values() if start <= t <= end)
        steps = [b - a for a, b in zip(inside, inside[1:], strict=False)]
        return round(statistics.median(steps), 3) if steps else None

    batches = sum(1 for t in child.values() if start < t <= end)
    return dict(zip(SHADOW_KEYS, (batches, interval(child), interval(parent)), strict=True))


class Timeline:
    """Watches on TaskShards and Pods; the first time each fact was seen (this machine's wall clock)."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.custom, core = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api)
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.seen: dict[tuple[str, ...], float] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        shards = (self.custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, "taskshards")
        for args, on_event in ((shards, self._shard), ((core.list_namespaced_pod, NAMESPACE), self._pod)):
            threading.Thread(target=self._loop, args=(args, on_event), daemon=True).start()

    def first(self, *key: str) -> float | None:
        with self.lock:
            return self.seen.get(key)

    def _mark(self, *key: str) -> None:
        self.seen.setdefault(key, time.time())

    def _loop(self, args: tuple[Any, ...], on_event: Any) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            try:
                for ev in watch.Watch().stream(*args, timeout_seconds=60):
                    with self.lock:
                        on_event(ev)
                    if self.stop.is_set():
                        return
            except Exception as e:  # noqa: BLE001 - a broken watch is restarted
                self.errors.append(repr(e))
                time.sleep(0.2)

    def _shard(self, ev: dict[str, Any]) -> None:
        name = ev["object"]["metadata"]["name"]
        self._mark("shard", name)
        if phase := (ev["object"].get("status") or {}).get("phase"):
            self._mark("phase", name, phase)
        self.shards[name] = ev["object"]

    def _pod(self, ev: dict[str, Any]) -> None:
        pod = self.api.sanitize_for_serialization(ev["object"])
        name = pod["metadata"]["name"]
        self._mark("pod", name)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in ("running", "terminated"):
                if state in (cs.get("state") or {}):
                    self._mark(state, name)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_dir = args.out / "work" / "split_latency" / time.strftime("%Y%m%d-%H%M%S")
        self.data = self.run_dir / "data"
        self.task = TASK
        self.bed = OperatorBed(self.run_dir, NAMESPACE)
        self.timeline: Timeline | None = None
        self.producer: threading.Event | None = None

    @property
    def journal(self) -> Path:
        return self.data / "journal" / self.task

    def shard_dir(self, shard: str) -> Path:
        return self.data / "state" / self.task / "shards" / shard

    def phase(self, shard: str) -> str | None:
        with self.timeline.lock:
            return ((self.timeline.shards.get(shard) or {}).get("status") or {}).get("phase")

    def batch_id(self, shard: str) -> int:
        """The shard's last committed batch (``progress.json``), -1 before its first."""
        return read_json(self.shard_dir(shard) / "progress.json").get("batchId", -1)

    def first_emitting_batch(self, shard: str) -> tuple[int, float] | None:
        """The shard's first batch with results (the smallest ``n`` with ``batch-<n>.*`` in ``_pending/`` or
        published, listed in that order: a file only moves from ``_pending/``) and its commit time (mtime of
        ``commits/<n>``), once committed; None before."""
        from spark_runtime.layout import parse_batch_file_name

        sink, ids = self.data / "output" / self.task / f"shard={shard}", set()
        for d in (sink / "_pending", sink):
            try:
                ids.update(p[0] for p in map(parse_batch_file_name, os.listdir(d)) if p is not None)
            except OSError:
                continue
        committed = mtime(self.shard_dir(shard) / "checkpoint" / "commits" / str(min(ids))) if ids else None
        return (min(ids), committed) if committed is not None else None

    def commit_times(self, shard: str) -> dict[int, float]:
        """Batch id -> commit time (mtime of ``checkpoint/commits/<id>``) of every batch the log still holds."""
        try:
            files = [f for f in (self.shard_dir(shard) / "checkpoint" / "commits").iterdir() if f.name.isdigit()]
        except OSError:
            return {}
        return {int(f.name): t for f in files if (t := mtime(f)) is not None}

    def handover_state(self, parent: str, children: list[str]) -> str:
        """Where a hand-over stands (for progress and timeout messages): phases, last commits, the files there."""
        names = ["handover/precopy.json", "drain-requested", "drained.json"]
        names += [f"handover/{k}-{c}.json" for c in children for k in ("request", "ready")]
        there = [n for n in names if (self.shard_dir(parent) / n).exists()]
        shards = [f"{s} phase {self.phase(s)}, last commit {self.batch_id(s)}" for s in (parent, *children)]
        shards += [f"{c} catch-up {read_json(self.shard_dir(c) / 'catch-up.json').get('phase')}" for c in children]
        return "; ".join([*shards, f"parent's files: {', '.join(there) or 'none'}"])

    def prefill(self) -> None:
        """``--prefill`` events: the first ``--keys`` name every key once (so the parent holds every key, not the
        ~95 % that 3 random draws per key reach), the rest random keys."""
        from spark_runtime.produce import append_events

        rng, n, keys, t0 = random.Random(self.args.seed), self.args.prefill, self.args.keys, time.monotonic()
        for lo in range(0, n, 100_000):
            events = [
                {"key": f"k{i if i < keys else rng.randrange(keys)}", "seq": i} for i in range(lo, min(n, lo + 100_000))
            ]
            append_events(self.journal, PARTITIONS, events)
        say(f"pre-filled {n:,} events over {min(n, keys):,} keys in {time.monotonic() - t0:.0f}s")

    def produce(self, halt: threading.Event, seq: int) -> None:
        """Append ``--rate`` events per second (in ticks of 0.25 s) over ``--keys`` keys to the journal until halted."""
        from spark_runtime.produce import append_events

        rng, per_tick, journal = random.Random(self.args.seed + 1), max(1, self.args.rate // 4), self.journal
        while not halt.wait(0.25):
            events = [{"key": f"k{rng.randrange(self.args.keys)}", "seq": seq + i} for i in range(per_tick)]
            append_events(journal, PARTITIONS, events)
            seq += per_tick

    def apply_task(self) -> None:
        import yaml

        self.journal.mkdir(parents=True, exist_ok=True)
        conf = {"spark.sql.shuffle.partitions": str(self.args.shuffle_partitions), "spark.ui.enabled": "false"}
        spark = {"conf": conf, "triggerInterval": self.args.trigger}
        task = bed_task(self.task, NAMESPACE, self.data, PARTITIONS, spark, maxKeyGroups=MAX_KEY_GROUPS)
        self.bed.kubectl_retry("apply", "-f", "-", input=yaml.safe_dump(task))

    def wait_steady(self, shard: str) -> None:
        """Running, and ``--min-batches`` batches committed after its first (a fresh Task's first batch holds the
        whole pre-fill: ``--steady-timeout`` bounds each wait)."""
        timeout, more, t0 = self.args.steady_timeout, self.args.min_batches, time.monotonic()
        self.bed.wait(f"{shard} Running", lambda: self.phase(shard) == "Running", timeout, 0.2)
        self.bed.wait(f"{shard} committing", lambda: self.batch_id(shard) >= 0, timeout, 0.2)
        first = self.batch_id(shard)
        self.bed.wait(f"{shard} {more} more batches", lambda: self.batch_id(shard) >= first + more, timeout, 0.2)
        say(f"{shard} steady after {time.monotonic() - t0:.0f}s (batch {self.batch_id(shard)})")

    def split(self, parent: str) -> dict[str, Any]:
        """Request the split of ``parent``, wait until both children emit, and measure it (:meth:`measure`)."""
        key_groups = self.timeline.shards[parent]["spec"]["keyGroups"]
        start, end = key_groups["start"], key_groups["end"]
        mid = start + (end - start) // 2
        children = [f"{self.task}-{start}-{mid}", f"{self.task}-{mid}-{end}"]
        say(f"splitting {parent} [{start}, {end}) -> {children[0]} + {children[1]}")
        labels = {parent: "parent", children[0]: "child 1", children[1]: "child 2"}
        sampler = ProcessCpuSampler(shard_classifier(labels))
        sampler.start()
        # Spark keeps only the last 100 entries of a commit log: commit times are collected every 0.5 s meanwhile.
        commits: dict[str, dict[int, float]] = {s: self.commit_times(s) for s in (parent, *children)}
        looked = told = time.monotonic()
        t_req = time.time()
        patch = {"spec": {"split": {"requested": True}}}
        self.timeline.custom.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "taskshards", parent, patch, _content_type="application/merge-patch+json"
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
                if c not in emitted and (found := self.first_emitting_batch(c)) is not None:
                    emitted[c] = found
                    say(f"{c} emits: batch {found[0]} committed {found[1] - t_req:.1f}s after the request")
            return len(emitted) == len(children)

        try:
            self.bed.wait("both children's first emitting batch", both_emitted, self.args.split_timeout, 0.1)
        except RuntimeError as e:
            sampler.finish()
            raise RuntimeError(f"{e}\nhand-over state: {self.handover_state(parent, children)}") from None
        cpu = {"groups": sampler.finish(), "jit": sampler.jit_groups, "machine": sampler.machine()}
        time.sleep(0.5)  # the watch events of that moment arrive
        for shard, seen in commits.items():
            seen.update(self.commit_times(shard))
        return self.measure(parent, children, t_req, emitted, commits, cpu)

    def child_times(self, child: str, hdir: Path, emitted: tuple[int, float], notes: list[str]) -> dict[str, Any]:
        """A child's own timeline (epoch times) and its standby facts."""
        from taskshard_operator.naming import pod_name

        tl, cdir, pod = self.timeline, self.shard_dir(child), pod_name(child)
        standby, catch_up = read_json(cdir / "standby.json"), read_json(cdir / "catch-up.json")
        if standby.get("mode") != "catch-up":
            notes.append(f"{child}: standby mode {standby.get('mode')!r}, not catch-up (None: no standby.json)")
        if catch_up.get("phase") != "live":
            notes.append(f"{child}: catch-up.json phase {catch_up.get('phase')!r} after it emitted (expected live)")
        restored = sum(read_json(f).get("rows") or 0 for f in (cdir / "restore").glob("kg-*.json") if f.is_file())
        return {
            "created": tl.first("shard", child),
            "podCreated": tl.first("pod", pod),
            "running": tl.first("running", pod),
            "standbyBegan": standby.get("began"),
            "warm": standby.get("warm"),
            "request": mtime(hdir / f"request-{child}.json"),
            "answered": standby.get("parentAnswered"),
            "batch0": mtime(cdir / "checkpoint" / "commits" / "0"),
            "ready": mtime(hdir / f"ready-{child}.json"),
            "live": mtime(cdir / "catch-up.json") if catch_up.get("phase") == "live" else None,
            "phaseRunning": tl.first("phase", child, "Running"),
            "emitted": emitted[1],
            "emitBatch": emitted[0],
            "mode": standby.get("mode"),
            "standbySeconds": standby.get("standbySeconds"),
            "restoredRows": restored,
        }

    def measure(self, parent: str, children: list, t_req: float, emitted: dict, all_commits: dict, cpu: dict) -> dict:
        """Everything about one split, from the watches and the files (see the module docstring)."""
        from taskshard_operator.naming import pod_name

        tl, pdir = self.timeline, self.shard_dir(parent)
        hdir = pdir / "handover"
        drained, precopy = read_json(pdir / "drained.json"), read_json(hdir / "precopy.json")
        commits, last_batch = all_commits[parent], drained.get("batchId")
        phases = {"accepted": "SplitRequested", "draining": "Draining", "drained": "Drained", "split": "Split"}
        t = {
            k: tl.first("phase", parent, phase)
            for k, phase in (phases | {"childrenCreated": "ChildrenCreated"}).items()
        }
        t |= {"request": t_req, "precopy": mtime(hdir / "precopy.json"), "marker": mtime(pdir / "drain-requested")}
        t |= {"drainedJson": mtime(pdir / "drained.json"), "exited": tl.first("terminated", pod_name(parent))}
        t["lastCommit"] = commits.get(last_batch) if last_batch is not None else None
        notes = []
        if drained.get("handover") != "catch-up":
            notes.append(f"the parent's drained.json says handover={drained.get('handover')!r}, not 'catch-up'")
        per_child = {c: self.child_times(c, hdir, emitted[c], notes) for c in children}
        for c, pc in per_child.items():
            pc |= shadow(all_commits[c], commits, pc["batch0"], pc["ready"])
        critical = max(children, key=lambda x: per_child[x]["emitted"])
        c, ready = per_child[critical], [per_child[x]["ready"] for x in children]
        ends = [t["draining"], c["standbyBegan"], c["warm"], c["request"], t["precopy"], c["batch0"], c["ready"]]
        ends += [None if None in ready else max(ready), t["marker"], t["drainedJson"], c["emitted"]]
        segments, chain_notes = chain(t_req, list(zip((key for key, _, _ in SEGMENTS), ends, strict=True)))
        notes += [f"critical path ({critical}): {n}" for n in chain_notes]
        if (gap := since(c["emitted"], t["lastCommit"])) is None:
            notes.append(f"no commit time of the parent's last batch {last_batch}: no processing gap")
        handover = parent_during_handover(commits, t_req, t, precopy, drained, notes)
        handover["gapParts"] = {
            "lastCommitToDrained": since(t["drainedJson"], t["lastCommit"]),
            "drainedToEmit": since(c["emitted"], t["drainedJson"]),
        }
        groups = {g: round(sum(segments[k] or 0 for k, _, grp in SEGMENTS if grp == g), 3) for g in GROUPS}
        child_keys = ("emitBatch", "restoredRows", "mode", *SHADOW_KEYS)
        out = {
            "parent": parent,
            "children": children,
            "criticalChild": critical,
            "total": round(c["emitted"] - t_req, 3),
        }
        out |= {"processingGap": gap, "segments": segments, "groups": groups, "handover": handover}
        out["childTimes"] = {
            name: {key: since(pc[key], t_req) for key, _ in CHILD_COLUMNS} | {k: pc[k] for k in child_keys}
            for name, pc in per_child.items()
        }
        out |= {"stealPercent": cpu["machine"]["stealPercent"], "cpu": cpu, "parentExited": since(t["exited"], t_req)}
        out |= {"parentBatchId": last_batch, "parentStateRows": drained.get("stateRows", precopy.get("stateRows"))}
        out |= {"runtimeDrainSeconds": drained.get("drainSeconds"), "times": t, "children_times": per_child}
        return out | {"notes": notes}

    def run(self) -> list[dict[str, Any]]:
        self.bed.start()
        self.timeline = Timeline(self.bed.kubeconfig)
        results = []
        if self.args.mode == "chain":  # split k splits the left child of split k-1; the other shards keep running
            self.begin_task()
            shard = f"{self.task}-0-{MAX_KEY_GROUPS}"
            for i in range(self.args.splits):
                results.append(self.split(shard) | {"otherShards": i})
                shard = results[-1]["children"][0]
                if i + 1 < self.args.splits:
                    self.wait_steady(shard)
            return results
        for i in range(self.args.splits):
            self.task = f"{TASK}{i + 1}"
            self.begin_task()
            results.append(self.split(f"{self.task}-0-{MAX_KEY_GROUPS}") | {"otherShards": 0})
            self.end_task()
        return results

    def begin_task(self) -> None:
        """Pre-fill the task's journal, apply the Task, start the producer, wait until its shard is steady."""
        self.prefill()
        self.apply_task()
        self.producer = threading.Event()
        threading.Thread(target=self.produce, args=(self.producer, self.args.prefill), daemon=True).start()
        self.wait_steady(f"{self.task}-0-{MAX_KEY_GROUPS}")

    def end_task(self) -> None:
        """Stop the producer and delete the Task (its pods stop), so the next trial starts on an idle machine."""
        if self.producer is not None:
            self.producer.set()
            self.producer = None
        say(f"deleting Task {self.task}")
        self.bed.delete_task(self.task)

    def stop(self) -> None:
        try:
            if self.bed.operator is not None and self.bed.operator.poll() is None:
                self.end_task()
        finally:
            if self.producer is not None:
                self.producer.set()
            if self.timeline is not None:
                self.timeline.stop.set()
            self.bed.stop()


def parent_during_handover(commits: dict, t_req: float, t: dict, precopy: dict, drained: dict, notes: list) -> dict:
    """The parent between the request and its final drain (it keeps processing): its commits, pre-copy, stop."""
    times = sorted(commits.values())
    end = t["drainedJson"] or t["marker"] or (max(times) if times else t_req)
    before, inside = [x for x in times if x < t_req], [x for x in times if t_req <= x <= end]
    series = before[-1:] + inside
    gaps = [b - a for a, b in zip(series, series[1:], strict=False)]
    recent = before[-6:]  # the commit interval before the request: the last 5 intervals (fewer at first)
    cadence = [b - a for a, b in zip(recent, recent[1:], strict=False)]
    export_s, export_end = precopy.get("exportSeconds"), t["precopy"]
    during_export = None
    if export_end is not None and export_s is not None:
        during_export = sum(1 for x in times if export_end - export_s <= x <= export_end)
    if not inside:
        notes.append("the parent committed no batch between the request and its final drain")
    k, last = precopy.get("batchId"), drained.get("batchId")
    out = {"precopyBatch": k, "precopyStateRows": precopy.get("stateRows"), "precopyExportSeconds": export_s}
    out |= {
        "commitIntervalBefore": round(statistics.median(cadence), 3) if cadence else None,
        "commitsInWindow": len(inside),
        "windowSeconds": round(end - t_req, 3),
        "longestCommitGap": round(max(gaps), 3) if gaps else None,
        "longestCommitGapAt": round(series[gaps.index(max(gaps)) + 1] - t_req, 3) if gaps else None,
        "commitsDuringExport": during_export,
        "commitTimes": [round(x - t_req, 3) for x in inside],
    }
    at = ("precopy", "precopy"), ("drainRequested", "marker"), ("lastCommit", "lastCommit"), ("drained", "drainedJson")
    at += ("phaseDrained", "drained"), ("podExited", "exited")
    out |= {f"{name}At": since(t[key], t_req) for name, key in at}
    out |= {"finalBatch": last, "batchesAfterPrecopy": last - k if last is not None and k is not None else None}
    out |= {"snapshotBatchId": drained.get("snapshotBatchId"), "handoverMode": drained.get("handover")}
    return out | {"runtimeDrainSeconds": drained.get("drainSeconds")}


def targets(results: list[dict[str, Any]], mode: str, keys: int) -> list[dict[str, Any]]:
    """The Targets rows: measured medians against their bounds (``--mode chain``: reported, no bound)."""
    gap, total = median([r["processingGap"] for r in results]), median([r["total"] for r in results])
    gap_value, total_value = (f"{v:.1f} s" if v is not None else "not measured" for v in (gap, total))
    if mode == "chain":
        suffix = "" if keys == DEFAULT_KEYS else f", {keys:,} keys of state"
        return [
            target(f"processing gap with chained splits, k-1 other shards running{suffix} (median; informational)",
                   "reported", gap_value, True),
            target(f"split request -> both children emit with chained splits{suffix} (median; informational)",
                   "reported", total_value, True),
        ]  # fmt: skip
    parts = [median([r["handover"]["gapParts"][k] for r in results]) for k in ("lastCommitToDrained", "drainedToEmit")]
    before, after = (f"{v:.1f} s" if v is not None else "-" for v in parts)
    gap_why = f"Medians: the parent's last commit -> its drained.json {before}, drained.json -> the later child's "
    gap_why += f"first emitting batch committed (the batch that reads up to and past the final positions) {after}"
    groups = sorted(((g, median([r["groups"][g] for r in results]) or 0.0) for g in GROUPS), key=lambda kv: -kv[1])
    total_why = "Critical path by group (medians): " + ", ".join(f"{g} {v:.1f} s" for g, v in groups if v)
    bound = TARGET_GAP if keys <= DEFAULT_KEYS else TARGET_GAP_LARGE
    with_keys = "" if keys == DEFAULT_KEYS else f" with {keys:,} keys of state"
    gap_name = (
        f"processing gap{with_keys} (median)" if with_keys else "processing gap, split range without output (median)"
    )
    return [
        target(gap_name, f"<= {bound:.0f} s", gap_value, gap is not None and gap <= bound, gap_why),
        target(f"split request -> both children emit{with_keys} (median)", f"<= {TARGET_TOTAL:.0f} s", total_value,
               total is not None and total <= TARGET_TOTAL, total_why),
    ]  # fmt: skip


def tables(results: list[dict[str, Any]], args: argparse.Namespace, goals: list[dict], title: str) -> list[tuple]:
    """The splits (with the targets), where the time goes, the parent, the children, CPU by process group."""

    def verdict(bound: float, value: float | None) -> str:
        if args.mode != "independent":
            return "reported"
        return "met" if value is not None and value <= bound else "MISSED"

    bound = TARGET_GAP if args.keys <= DEFAULT_KEYS else TARGET_GAP_LARGE
    rows = [
        [f"{i + 1}: {r['parent']} -> {' + '.join(r['children'])}", r["parentStateRows"], r["otherShards"]]
        + [r.get("stealPercent"), r.get("processingGap"), r["total"], *(r["groups"][g] for g in GROUPS)]
        + [verdict(bound, r.get("processingGap")), verdict(TARGET_TOTAL, r["total"])]
        for i, r in enumerate(results)
    ]
    med = [median([r.get(k) for r in results]) for k in ("stealPercent", "processingGap", "total")]
    med += [median([r["groups"][g] for r in results]) for g in GROUPS]
    rows.append(["median", None, None, *med, verdict(bound, med[1]), verdict(TARGET_TOTAL, med[2])])
    columns = ["split", "parent keys", "other shards running", "CPU steal %", "processing gap s"]
    columns += ["request -> both emit s", *GROUPS, f"gap target ({goals[0]['target']})"]
    columns.append(f"total target ({goals[1]['target']})")
    seg_rows = [
        [label, group, *(r["segments"].get(key) for r in results), median([r["segments"].get(key) for r in results])]
        for key, label, group in SEGMENTS
    ]
    seg_cols = ["segment", "group", *[f"split {i + 1} s" for i in range(len(results))], "median s"]
    parent_rows = [
        [i + 1, *((r["handover"] | r["handover"]["gapParts"])[k] for k, _ in PARENT_COLUMNS)]
        for i, r in enumerate(results)
    ]
    child_cols = ["split", "child", *(col for _, col in CHILD_COLUMNS), "first emitting batch", "restored keys"]
    child_cols += ["shadow batches (batch 0 -> ready)", "child commit interval in shadow s"]
    child_cols.append("parent commit interval meanwhile s")
    keys = [k for k, _ in CHILD_COLUMNS] + ["emitBatch", "restoredRows", *SHADOW_KEYS]
    child_rows = [
        [i + 1, c, *(r["childTimes"][c].get(k) for k in keys)] for i, r in enumerate(results) for c in r["children"]
    ]
    parent_title = "The parent during the hand-over: it keeps processing until both children are ready (times in "
    return [
        (title, columns, rows),
        ("Where the time goes (critical path: the child that emitted last)", seg_cols, seg_rows),
        (
            parent_title + "seconds after the split request)",
            ["split", *(col for _, col in PARENT_COLUMNS)],
            parent_rows,
        ),
        ("The children's timelines (seconds after the split request)", child_cols, child_rows),
        cpu_table(results),
    ]


def cpu_table(results: list[dict[str, Any]]) -> tuple[str, list[str], list[list[Any]]]:
    """The CPU work of each split, by process group, next to the machine's busy, idle and stolen time."""
    cores = os.cpu_count() or 1
    group_cols = [c for g in CPU_GROUPS for c in ([g, f"({JIT_COLUMNS[g]})"] if g in JIT_COLUMNS else [g])]
    columns = ["split", "wall s", *group_cols, "other", "machine busy", "idle", "stolen", f"busy / {cores} cores s"]
    rows = []
    for i, r in enumerate(results):
        groups, jit, mach = r["cpu"]["groups"], r["cpu"].get("jit", {}), r["cpu"]["machine"]
        known = [v for g in CPU_GROUPS for v in [groups.get(g, 0.0)] + ([jit.get(g, 0.0)] if g in JIT_COLUMNS else [])]
        other = round(sum(v for k, v in groups.items() if k not in CPU_GROUPS), 2)
        rows.append([i + 1, r["total"], *known, other, mach["busy"], mach["idle"], mach["steal"]])
        rows[-1].append(round(mach["busy"] / cores, 2))
    return "CPU seconds spent from the split request until both children emitted (all processes, /proc)", columns, rows


def plot(results: list[dict[str, Any]], path: Path, title: str, target: float | None) -> None:
    """One bar per split (the critical path's segments), the parent's commits above it, the processing gap below."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.3 * len(results)))
    for i, r in enumerate(results):
        left = 0.0
        for key, what, group in SEGMENTS:
            width = max(0.0, r["segments"].get(key) or 0.0)
            alpha = max(0.3, 1.0 - 0.22 * [k for k, _, g in SEGMENTS if g == group].index(key))
            label = f"{group}: {what}" if i == 0 else None
            ax.barh(i, width, left=left, height=0.5, color=COLORS[group], alpha=alpha, edgecolor="white", label=label)
            if width >= 0.04 * max(r["total"], 1.0):
                ax.text(left + width / 2, i, f"{width:.1f}", ha="center", va="center", fontsize=7, color="white")
            left += width
        ax.text(left + 0.01 * left, i, f"{r['total']:.1f}s", va="center", fontsize=9)
        commits = r["handover"].get("commitTimes") or []
        label = "parent commits (request -> its drain)" if i == 0 else None
        ax.plot(commits, [i - 0.36] * len(commits), "|", color="black", ms=5, label=label)
        if (last := r["handover"].get("lastCommitAt")) is not None and r.get("processingGap") is not None:
            label = "processing gap (parent's last commit -> later child's first emitting commit)" if i == 0 else None
            ax.plot([last, r["total"]], [i + 0.36] * 2, color="black", lw=3, solid_capstyle="butt", label=label)
            ax.text(r["total"] * 1.01, i + 0.36, f"gap {r['processingGap']:.1f}s", va="center", fontsize=8)
    if target is not None:
        ax.axvline(target, color="red", ls="--", lw=1, label=f"target {target:.0f}s (request -> both emit)")
    ax.set_yticks(range(len(results)), [f"split {i + 1}:\n{r['parent']}" for i, r in enumerate(results)], fontsize=8)
    ax.set_ylim(len(results) - 0.4, -0.6)
    ax.set_xlabel("seconds from the split request (critical path: the child that emitted last)")
    ax.set_xlim(0, max(max(r["total"] for r in results), target or 0) * 1.12)
    ax.set_title(title, fontsize=9)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


NOTES = [
    "'processing gap': the parent's last commit (mtime of checkpoint/commits/<N>, N = drained.json's batchId) -> the "
    "later child's first emitting batch committed (mtime of its commits/<n>, n = the smallest batch with a results "
    "file, published or _pending): the only time no shard emits for the split range. 'request -> both emit' ends at "
    "that commit. Times: watch events stamped on arrival (tens of ms), file mtimes, standby.json's epoch times.",
    "A segment whose end point is missing shows '-' (its time goes to the next one); one that ended before the "
    "previous point counts 0 ('pre-copy' is 0 when the other child asked first). 'catch-up' ends with the ready note, "
    "written once a child's batch ended at the parent's committed positions as it last read them (progress.json, "
    "every 0.25 s): a child slower than the parent's commit interval needs many batches (children's table).",
    "Parent table: commits from the mtimes of its checkpoint/commits/* (listed every 0.5 s: Spark keeps 100) between "
    "the request and drained.json; 'longest gap' includes the interval from its last commit before the request; "
    "commits 'during the pre-copy export' fall within exportSeconds before precopy.json (its query runs on).",
    "CPU steal % is the share of this VM's CPU time the hypervisor gave to other guests during the split "
    "(/proc/stat): compare splits with similar steal. CPU seconds: each process's user + system time (/proc, every "
    "0.25 s from the request until both children emitted) by pod (TASKSHARD_SHARD) and JVM or Python; '(child N "
    "JIT)' is the part in HotSpot's compiler threads; 'other' is every other process; 'machine busy' is the VM's "
    "busy time (processes that exit between samples lose up to 0.25 s each).",
]


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=3)
    ap.add_argument("--splits", type=int, default=3, help="splits (trials) to time (default 3)")
    modes = "independent (default): a fresh one-shard Task per split; chain: split the last left child again"
    ap.add_argument("--mode", choices=("independent", "chain"), default="independent", help=modes)
    ap.add_argument("--prefill", type=int, default=200_000, help="events in the journal before the Task (default 200k)")
    ap.add_argument("--keys", type=int, default=DEFAULT_KEYS, help=f"distinct keys (default {DEFAULT_KEYS:,})")
    ap.add_argument("--rate", type=int, default=400, help="events per second appended during the run (default 400)")
    ap.add_argument("--min-batches", type=int, default=2, help="batches a shard commits before its split (default 2)")
    ap.add_argument("--trigger", default="1 second", help="the Task's triggerInterval (default '1 second')")
    ap.add_argument("--shuffle-partitions", default="2", help="spark.sql.shuffle.partitions (default 2)")
    ap.add_argument("--steady-timeout", type=float, default=900.0, help="seconds for each step of getting steady")
    ap.add_argument("--split-timeout", type=float, default=900.0, help="seconds from the request until both emit")
    args = parse(ap, argv)
    bench = Bench(args)
    with LoadSampler() as load:
        try:
            results = bench.run()
        finally:
            bench.stop()
    goals = targets(results, args.mode, args.keys)
    for g in goals:
        say(f"target {g['name']}: {g['value']} ({g['target']}): {'met' if g['met'] else 'MISSED'}")
    name, chained = result_name(args.mode, args.keys), args.mode == "chain"
    title = f"Split latency ({args.mode} splits, catch-up hand-over), local control plane + node agent, builtin count, "
    title += f"{args.keys:,} keys, {args.rate} events/s arriving, trigger {args.trigger}"
    plot(results, args.out / f"{name}.png", title, None if chained else TARGET_TOTAL)
    notes = [*NOTES, f"The pre-fill names every key once, then random keys: the parent holds all {args.keys:,}."]
    notes.append("Split k runs next to the k-1 shards earlier splits left." if chained else "A fresh Task per split.")
    what = "Split latency" + (" with chained splits" if chained else "")
    what += "" if args.keys == DEFAULT_KEYS else f" with {args.keys:,} keys of state"
    publish(
        name,
        args,
        argv,
        title=what,
        load=load.summary(),
        tables=tables(results, args, goals, title),
        targets=goals,
        plots=[f"{name}.png"],
        notes=notes + [f"{r['parent']}: {n}" for r in results for n in r["notes"]],
        raw={"results": results, "runDir": str(bench.run_dir)},
    )
    return 0


def summarize(data: dict[str, Any]) -> list[str]:
    """The findings of ``split_latency``, ``split_latency_chain`` and ``split_latency_1m`` (any ``--keys``)."""
    results, goals = data["raw"]["results"], data.get("targets") or []

    def verdict(i: int) -> str:
        if i >= len(goals) or goals[i].get("target") == "reported":
            return "reported, no target"
        return f"target {goals[i]['target']}: {'met' if goals[i].get('met') else 'missed'}"

    gap, total = median([r["processingGap"] for r in results]), median([r["total"] for r in results])
    out = [
        f"Median processing gap {f'{gap:.1f} s' if gap is not None else 'not measured'} ({verdict(0)}): the parent's "
        f"last commit -> the later child's first emitting commit, no output for the split range meanwhile. Request "
        f"-> both children emit: {total:.1f} s ({verdict(1)})."
    ]
    h = [r["handover"] for r in results]
    keys = ("commitsInWindow", "windowSeconds", "longestCommitGap", "commitIntervalBefore")
    commits, window, longest, cadence = (median([x[k] for x in h]) for k in keys)
    if commits is not None and window is not None:
        out.append(
            f"The parent kept processing: a median {commits:.0f} batches committed in the {window:.1f} s from the "
            "request to its drained.json"
            + (f", its longest pause between commits {longest:.1f} s" if longest is not None else "")
            + (f" (one commit every {cadence:.1f} s before the request)." if cadence is not None else ".")
        )
    groups = sorted(((g, median([r["groups"][g] for r in results])) for g in results[0]["groups"]), key=lambda x: -x[1])
    out.append(
        "Critical path (the child that emitted last) by group: "
        + ", ".join(f"{g} {v:.1f} s ({v / total:.0%})" for g, v in groups if v)
        + ". All up to 'parent stop' overlaps with the parent's processing; only the end of 'parent stop' and "
        "'take-over' fall in the gap."
    )
    slow = [max(r["childTimes"].values(), key=lambda c: c.get("ready") or 0) for r in results]
    batches, mine, theirs = (median([c.get(k) for c in slow]) for k in SHADOW_KEYS)
    if None not in (batches, mine, theirs):
        out.append(
            f"Catch-up: the child ready last followed the parent for a median {batches:.0f} batches (one every "
            f"{mine:.1f} s; the parent one every {theirs:.1f} s) until a batch ended at the parent's latest committed "
            "positions as it had read them (its ready note)."
        )
    parts = [median([x["gapParts"].get(k) for x in h]) for k in ("lastCommitToDrained", "drainedToEmit")]
    if None not in parts:
        out.append(
            f"The gap in pieces (medians): last commit -> drained.json {parts[0]:.1f} s, drained.json -> the later "
            f"child's first emitting commit {parts[1]:.1f} s (one batch, reading up to the final positions and past)."
        )
    by_split = [
        f"split {i + 1}: gap {'-' if r.get('processingGap') is None else format(r['processingGap'], '.1f') + ' s'}, "
        f"total {r['total']:.1f} s ({r.get('otherShards', i)} other shards running)"
        for i, r in enumerate(results)
    ]
    out.append(f"By split: {', '.join(by_split)}.")
    if steal := [f"{r['stealPercent']:.0f}%" for r in results if r.get("stealPercent") is not None]:
        out.append(f"CPU steal during the splits: {', '.join(steal)} of this VM's CPU time (/proc/stat), which "
                   "stretches every segment.")  # fmt: skip
    return out + _cpu_findings(data, [r["cpu"] for r in results if r.get("cpu")])


def _cpu_findings(data: dict[str, Any], cpu: list[dict[str, Any]]) -> list[str]:
    if not cpu:
        return []

    def pod(c: dict[str, Any], who: str) -> float:
        return c["groups"].get(f"{who} JVM", 0.0) + c["groups"].get(f"{who} Python", 0.0)

    busy, idle = (median([c["machine"][k] for c in cpu]) for k in ("busy", "idle"))
    parent, child = median([pod(c, "parent") for c in cpu]), median([pod(c, f"child {n}") for c in cpu for n in (1, 2)])
    named = ("parent", "child 1", "child 2", "control plane", "node agent", "operator")
    other = median([sum(v for k, v in c["groups"].items() if not k.startswith(named)) for c in cpu])
    cores = (data.get("machine") or {}).get("cores") or os.cpu_count() or 1
    return [
        f"CPU work until both children emit: a median {busy:.0f} machine-busy CPU seconds per split (idle {idle:.1f} "
        f"s), {parent:.0f} in the parent (it processes until the children are ready), about {child:.0f} in each "
        f"child (JVM, JIT, Python workers), {other:.0f} outside the split (the samplers, other work). On {cores} "
        f"cores that takes at least {busy / cores:.0f} s with no CPU stolen."
    ]


if __name__ == "__main__":
    sys.exit(main())
