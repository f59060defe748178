"""Merge processing gap next to a split's, on the same state size: how long a range emits nothing while it is
handed over.

Every shard is ``python -m spark_runtime run`` in its own process (its own JVM, as in a pod), without Kubernetes:
the hand-over goes through storage only, so these are the runtime's timings minus pod scheduling. Per trial, in a
fresh directory: a journal of ``--keys`` distinct keys (one event each) and a producer appending ``--rate``
events/s over the same keys. ``split``: one shard ``[0, 128)``; once it consumed the pre-fill, its children
``[0, 64)`` and ``[64, 128)`` start with ``restoreFrom`` = its ``drained.json`` (the journal's catch-up hand-over).
``merge``: shards ``[0, 64)`` and ``[64, 128)``; then the merged shard starts with ``mergeFrom`` = both
``drained.json`` (on the journal a catch-up merge too: it restores both parents' pre-copies and follows both while
they run). Both hand over the same state at the same input rate. ``--chain``: in each split trial, once both children
emit, the child ``[0, 64)`` splits again into ``[0, 32)`` and ``[32, 64)`` (a chained split; its gap is measured alike).

The **processing gap** of a range: its child's first emitting commit (the first batch with a results file, its
``checkpoint/commits/<n>`` mtime) minus its parent's last commit (``commits/<batchId of drained.json>``); a
trial's gap is its worst range. ``--source kafka``: the same on a real Kafka broker and MinIO on loopback
(``bench/kafka_world.py``), where splits and merges catch up too (our Kafka data source ends batches at exact
offsets). ``--jvm-options``: one more split per trial, with those JVM options on every shard (C1-only JIT, say).

Targets: merge gap (median) <= the split's, on each source; with Kafka, the split's gap (median) <= 5 s. Writes
``<out>/merge_gap.{json,png}`` (journal) or ``<out>/merge_gap_kafka.{json,png}``.

    .venv/bin/python bench/merge_gap.py --keys 50000 --trials 2 [--source kafka] [--chain] [--jvm-options OPTS]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    LoadSampler,
    cpu_times,
    method_notes,
    mtime,
    options,
    parse,
    publish,
    pyplot,
    read_json,
    runner_config,
    say,
    spawn_runtime,
    target,
)
from proc_cpu import TreeCpu  # noqa: E402

TASK = "mg"
MAX_KEY_GROUPS = 128
HALF = MAX_KEY_GROUPS // 2
JIT = "split, JVM options"  # the kind of a split trial run with --jvm-options on every shard
CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
CPU_NOTE = (
    "CPU s = user + system seconds of the successors' process trees (JVM and Python workers; /proc, "
    "proc_cpu.TreeCpu) from the request until every successor emitted: the hand-over's own cost, since the parents "
    "would have run anyway. On this machine every process shares 2 cores; with a core "
    "per pod, a successor's request -> emit takes at least its own CPU seconds, the busiest successor's row."
)


class Producer(threading.Thread):
    """Appends ``rate`` events per second (keys ``u<i>`` of the pre-fill) until stopped."""

    def __init__(self, journal: Path, keys: int, partitions: int, rate: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.journal, self.keys, self.partitions, self.rate = journal, keys, partitions, rate
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.events = 0

    def run(self) -> None:
        from spark_runtime.produce import append_lines, partition_for

        while not self.stop_event.wait(0.25):
            buckets: dict[int, list[str]] = {}
            for _ in range(max(1, self.rate // 4)):
                key = f"u{self.rng.randrange(self.keys)}"
                buckets.setdefault(partition_for(key, self.partitions), []).append(f'{{"key":"{key}"}}')
            for p, lines in buckets.items():
                append_lines(self.journal, p, lines)
                self.events += len(lines)


class JournalTrial:
    """The journal world of a trial (local files under ``root``): the same questions as
    :class:`kafka_world.KafkaS3Trial` asks of Kafka and MinIO."""

    def __init__(self, root: Path, partitions: int) -> None:
        self.root, self.partitions, self.journal = root, partitions, root / "journal"
        self.journal.mkdir(parents=True)

    def blocks(self) -> dict[str, Any]:
        return {
            "source": {"journal": {"path": str(self.journal), "partitions": self.partitions}},
            "sink": {"directory": {"path": str(self.root / "out"), "format": "jsonl"}},
            "storage": {"path": str(self.root / "state")},
        }

    def shard_dir(self, shard: str) -> Path:
        return self.root / "state" / TASK / "shards" / shard

    def drained_pointer(self, shard: str) -> str:
        return str(self.shard_dir(shard) / "drained.json")

    def prefill(self, keys: int, seed: int) -> dict[str, int]:
        """Every key ``u<i>`` once, in a shuffled order; returns the partitions' ends."""
        from spark_runtime.produce import append_lines, partition_for

        order = list(range(keys))
        random.Random(seed).shuffle(order)
        buckets: dict[int, list[str]] = {p: [] for p in range(self.partitions)}
        for i in order:
            buckets[partition_for(f"u{i}", self.partitions)].append(f'{{"key":"u{i}"}}')
        for p, lines in buckets.items():
            append_lines(self.journal, p, lines)
        return {f"p{p}.jsonl": (self.journal / f"p{p}.jsonl").stat().st_size for p in range(self.partitions)}

    def producer(self, keys: int, rate: int, seed: int) -> Producer:
        return Producer(self.journal, keys, self.partitions, rate, seed)

    def consumed(self, shard: str, ends: dict[str, int]) -> bool:
        positions = read_json(self.shard_dir(shard) / "progress.json").get("positions")
        return positions is not None and all(positions.get(k, 0) >= v for k, v in ends.items())

    def commit_times(self, shard: str) -> dict[int, float]:
        commits = (self.shard_dir(shard) / "checkpoint" / "commits").glob("[0-9]*")
        return {int(f.name): t for f in commits if f.name.isdigit() and (t := mtime(f)) is not None}

    def first_emit(self, shard: str) -> float | None:
        """The commit time of the shard's first batch with a published results file (None: none yet)."""
        files, committed = (self.root / "out" / f"shard={shard}").glob("batch-*.jsonl"), self.commit_times(shard)
        batches = [b for b in (int(f.name.split("-")[1].split(".")[0]) for f in files) if b in committed]
        return committed[min(batches)] if batches else None

    def last_commit(self, shard: str) -> float | None:
        summary = json.loads((self.shard_dir(shard) / "drained.json").read_text())
        return self.commit_times(shard).get(int(summary["batchId"]))

    def drained_at(self, shard: str) -> float | None:
        return mtime(self.shard_dir(shard) / "drained.json")

    def close(self) -> None:
        return None


def wait(what: str, predicate: Any, timeout: float, procs: dict[str, subprocess.Popen]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        dead = {n: p.returncode for n, p in procs.items() if p.poll() not in (None, 0)}
        if dead:
            raise RuntimeError(f"waiting for {what}: shard processes failed: {dead}")
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")


def trial(kind: str, root: Path, args: argparse.Namespace, seed: int, kafka: Any = None) -> dict[str, Any]:
    """One split or merge trial (see the module docstring); returns its timings. ``kafka``: the
    :class:`kafka_world.KafkaS3World` (None: the journal and local storage)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    world = JournalTrial(root, args.partitions) if kafka is None else kafka.trial(args.partitions)
    ends = world.prefill(args.keys, seed)
    procs: dict[str, subprocess.Popen] = {}

    def start(start_kg: int, end_kg: int, suffix: str = "", **parents: Any) -> str:
        """Starts shard ``mg-<start>-<end><suffix>``; its name."""
        shard = f"{TASK}-{start_kg}-{end_kg}{suffix}"
        extra = {"task": TASK, "metricsPort": 0, "terminationMessagePath": str(root / f"termination-{shard}.log")}
        extra |= world.blocks() | parents  # the world's source, sink and storage
        conf = CONF | ({"spark.driver.extraJavaOptions": args.jvm_options} if kind == JIT else {})
        cfg = runner_config(root, root, args.partitions, shard, start_kg, end_kg, {"builtin": "count"}, conf, **extra)
        (root / f"{shard}.json").write_text(json.dumps(cfg.to_json_dict()))
        procs[shard] = spawn_runtime(root / f"{shard}.json", root / f"{shard}.log")
        return shard

    halves = [(0, HALF), (HALF, MAX_KEY_GROUPS)]
    split = kind != "merge"
    parents = [start(0, MAX_KEY_GROUPS)] if split else [start(a, b) for a, b in halves]
    producer = world.producer(args.keys, args.rate, seed + 1)
    producer.start()
    try:
        t0 = time.time()
        wait("the parents consume the pre-fill", lambda: all(world.consumed(p, ends) for p in parents), 900, procs)
        steady = time.time() - t0
        requested = time.time()
        if split:
            restore = {"parent": parents[0], "manifest": world.drained_pointer(parents[0])}
            children = [start(a, b, restoreFrom=restore) for a, b in halves]
        else:
            merge_from = [{"parent": p, "manifest": world.drained_pointer(p)} for p in parents]
            children = [start(0, MAX_KEY_GROUPS, "-m", mergeFrom=merge_from)]

        def emitted(shards: list[str]) -> list[float] | None:
            times = [world.first_emit(c) for c in shards]
            return times if all(t is not None for t in times) else None

        cpu = TreeCpu({c: procs[c].pid for c in children}, interval=1.0)  # the successors' process trees
        before = cpu.reading(threads=False)
        cpu.start()
        emits = wait("every child emits", lambda: emitted(children), args.timeout, procs)
        after = cpu.reading(threads=False)
        cpu.stop()
        successors = [round(cpu.seconds(before, after, c), 1) for c in children]
        stops = [world.last_commit(p) for p in parents]
        drained_at = [world.drained_at(p) for p in parents]
        commits = sum(requested <= t <= (stops[0] or 0) for t in world.commit_times(parents[0]).values())
        if kind == "split" and args.chain:  # the first child, once it emits, split again: a chained split
            first, restore = children[0], {"parent": children[0], "manifest": world.drained_pointer(children[0])}
            grand = [start(a, b, restoreFrom=restore) for a, b in ((0, HALF // 2), (HALF // 2, HALF))]
            chain = max(wait("every grandchild emits", lambda: emitted(grand), args.timeout, procs))
            chain -= world.last_commit(first) or 0
    finally:
        producer.stop_event.set()
        producer.join(timeout=5)
        world.close()
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs.values():
            p.wait(timeout=30)
    gap = max(emits) - stops[0] if split else emits[0] - min(s for s in stops if s is not None)
    out = {"kind": kind, "keys": args.keys, "steadySeconds": round(steady, 1), "gapSeconds": round(gap, 2)}
    out |= {"requestToEmitSeconds": round(max(emits) - requested, 1), "successorCpuSeconds": successors}
    out |= {"cpuSeconds": round(sum(successors), 1)}  # a parent that exits takes its CPU record with it
    out |= {"parentsStopSpreadSeconds": round(max(stops) - min(stops), 2) if len(stops) > 1 else 0.0}
    out |= {"lastDrainToEmitSeconds": round(max(emits) - max(d for d in drained_at if d is not None), 2)}
    out |= {"chainGapSeconds": round(chain, 2)} if kind == "split" and args.chain else {}
    out |= {"jvmOptions": args.jvm_options} if kind == JIT else {}
    out |= {"parentCommits": commits}  # the (first) parent's, from the request to its final drain
    return out | {"producedEvents": producer.events}


def report(results: list[dict[str, Any]], steal: float | None, kafka: bool) -> dict[str, Any]:
    """The tables, the Targets rows, the notes and the raw results of the trials ``results``."""
    by = {k: [r for r in results if r["kind"] == k] for k in ("split", "merge")}

    def median(field: Any) -> dict[str, float]:
        return {k: statistics.median(field(r) for r in rows) for k, rows in by.items()}

    def median_of(field: str) -> list[Any]:
        got = median(lambda r: max(r[field]) if isinstance(r[field], list) else r[field])
        return [round(got[k], 1) for k in by]

    med, emit = median(lambda r: r["gapSeconds"]), median(lambda r: r["requestToEmitSeconds"])
    drain = median(lambda r: r["lastDrainToEmitSeconds"])
    stop = median(lambda r: r["gapSeconds"] - r["lastDrainToEmitSeconds"])
    ratio = med["merge"] / med["split"] if med["split"] else None
    chained = [r["chainGapSeconds"] for r in by["split"] if "chainGapSeconds" in r]
    jit = [r for r in results if r["kind"] == JIT]
    jit_gap = round(statistics.median(r["gapSeconds"] for r in jit), 2) if jit else None
    parts = (  # where the gap goes: the parents' final export, then the successors' restore
        f"the (first) parent's last commit -> the (later) drain summary {stop['split']:.1f} s split, "
        f"{stop['merge']:.1f} s merge; the later drain summary -> the first emitting batch {drain['split']:.1f} s "
        f"split, {drain['merge']:.1f} s merge (medians)"
    )
    why = (
        f"both catch up on {'Kafka' if kafka else 'the journal'} (the successors restore their parents' "
        "pre-copies and follow them while they run; no parent exports in its final drain), so what remains is the "
        f"parents' drains and the successors' one batch across the final positions: {parts}. The last part is the "
        "successor's batch in flight when the parent drained (capped at its limit, it emits nothing), then the batch "
        "across the final positions, on a JVM that shares the 2 cores with its parent's and its sibling's"
    ) + (f"; the same run's splits with {jit[0]['jvmOptions']} on every shard: {jit_gap} s" if jit else "")
    where = ", Kafka + MinIO" if kafka else ""
    value = f"merge {med['merge']:.1f} s vs split {med['split']:.1f} s ({ratio:.2f}x)" if ratio is not None else None
    what = f"merge processing gap vs split (median, same state{where})"
    targets = [target(what, "merge <= split", value or "not measured", ratio is not None and ratio <= 1.0, why)]
    if kafka:
        split, what = f"{med['split']:.1f} s", "processing gap, split, Kafka + MinIO (median)"
        targets.insert(0, target(what, "<= 5 s", split, med["split"] <= 5, why))
    medians = [
        ["median (first) parent's last commit -> (later) drain summary (s)", *(round(stop[k], 2) for k in by)],
        ["median processing gap (s)", med["split"], med["merge"]],
        ["median child start -> every child emits (s)", emit["split"], emit["merge"]],
        ["median commits of the (first) parent from the request to its final drain", *median_of("parentCommits")],
        ["median later drain summary -> emit (s)", drain["split"], drain["merge"]],
        ["median CPU s of the successors, request -> every child emits", *median_of("cpuSeconds")],
        ["median CPU s of the busiest successor (the floor with a core per pod)", *median_of("successorCpuSeconds")],
        ["CPU steal during the run (/proc/stat)", f"{100 * steal:.1f} %" if steal is not None else "not recorded", ""],
    ]
    if chained:  # --chain
        medians.insert(3, ["median processing gap of a chained split (s)", statistics.median(chained), ""])
    if jit:  # --jvm-options
        what = f"median processing gap (s) and successors' CPU s, every shard with {jit[0]['jvmOptions']}"
        medians.insert(3, [what, f"{jit_gap} s, {statistics.median(r['cpuSeconds'] for r in jit):.1f} CPU s", ""])
    fields = ("kind", "keys", "gapSeconds", "requestToEmitSeconds", "lastDrainToEmitSeconds")
    columns = ["kind", "keys", "gap (s)", "child start -> emit (s)", "last drain -> emit (s)", "parents' stop spread"]
    trials = [[*(r[f] for f in fields), r["parentsStopSpreadSeconds"]] for r in results]
    source = (
        "Source and storage: a Kafka broker (KRaft) and MinIO on loopback, a topic pair and an S3 prefix per trial; "
        "commit times are the objects' LastModified, a child's first emitting batch the smallest batch id in the "
        "`taskshard-id` headers of its output records."
        if kafka
        else "Source and storage: the journal and a local directory; commit times are file mtimes."
    )
    return {
        "title": "Merge processing gap next to a split's" + (" on Kafka and MinIO" if kafka else ""),
        "tables": [
            ("Split vs merge (medians)", ["measurement", "split", "merge"], medians),
            ("Processing gap of a split and of a merge, each trial", columns, trials),
        ],
        "targets": targets,
        "notes": [*method_notes(__doc__), source, CPU_NOTE],
        "raw": {
            "results": results,
            "medianGapSeconds": med,
            "mergeOverSplit": round(ratio, 2) if ratio is not None else None,
            "stealPercent": round(100 * steal, 2) if steal is not None else None,
        },
    }


def summarize(data: dict[str, Any]) -> list[str]:
    raw = data["raw"]
    med, trials = raw["medianGapSeconds"], sum(r["kind"] == "merge" for r in raw["results"])
    return [
        f"Median processing gap over {trials} trial(s) of each: merge {med['merge']:.1f} s, split {med['split']:.1f} s "
        f"(merge / split {raw['mergeOverSplit']:.2f}x)."
    ]


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for kind, color in (("split", "#4c72b0"), ("merge", "#dd8452")):
        gaps = [r["gapSeconds"] for r in results if r["kind"] == kind]
        ax.bar([kind], [statistics.median(gaps)], color=color)
        ax.scatter([kind] * len(gaps), gaps, color="black", zorder=3, s=12)
    ax.set_ylabel("processing gap (s)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_trials(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any], float | None]:
    """The trials, alternating split and merge first: (results, load, steal)."""
    results, kafka = [], None
    if args.source == "kafka":
        from kafka_world import KafkaS3World

        shutil.rmtree(args.work, ignore_errors=True)
        kafka = KafkaS3World(args.work / "infra")
    stat0 = cpu_times()
    try:
        with LoadSampler() as load:
            for i in range(args.trials):
                kinds = ("merge", "split") if i % 2 else ("split", "merge")
                for kind in (*kinds, JIT) if args.jvm_options else kinds:
                    say(f"trial {i + 1}/{args.trials}: {kind} of {args.keys:,} keys ({args.source})")
                    r = trial(kind, args.work / f"{kind}-{i}", args, args.seed + i, kafka)
                    say(f"  gap {r['gapSeconds']} s, start -> emit {r['requestToEmitSeconds']} s")
                    results.append(r)
    finally:
        if kafka is not None:
            kafka.close()
    stat1 = cpu_times()
    steal = (stat1[7] - stat0[7]) / max(1, sum(stat1) - sum(stat0)) if len(stat0) > 7 else None
    shutil.rmtree(args.work, ignore_errors=True)
    return results, load.summary(), steal


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=7)
    ap.add_argument("--keys", type=int, default=50_000, help="distinct keys, the state size (default 50,000)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--rate", type=int, default=200, help="events per second appended meanwhile (default 200)")
    ap.add_argument("--trials", type=int, default=2, help="trials of each kind, alternating (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the children to emit (default 900)")
    sources = "journal with local storage (default), or Kafka with storage on MinIO (both started on loopback)"
    ap.add_argument("--source", choices=("journal", "kafka"), default="journal", help=sources)
    ap.add_argument("--work", type=Path, default=Path("/tmp/taskshard-merge-gap"))
    jit = "a third kind of trial: a split with these JVM options on every shard (spark.driver.extraJavaOptions)"
    ap.add_argument("--jvm-options", help=jit)
    ap.add_argument("--chain", action="store_true", help="in each split trial, then split its first child again")
    args = parse(ap, argv)
    result = "merge_gap_kafka" if args.source == "kafka" else "merge_gap"
    results, load, steal = run_trials(args)
    title = f"Hand-over gap, {args.keys:,} keys, {args.source} (median; trials as dots)"
    plot(results, args.out / f"{result}.png", title)
    publish(result, args, argv, load=load, plots=[f"{result}.png"], **report(results, steal, args.source == "kafka"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
