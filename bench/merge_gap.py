"""Merge processing gap next to a split's, on the same state size: how long a range emits nothing while it is
handed over.

A script, not a test. Every shard runs as ``python -m spark_runtime run`` in its own process (its own JVM, as in a
pod), without Kubernetes: the hand-over goes through storage only, so the runtime's timings are what a cluster
sees minus pod scheduling. Per trial, in a fresh directory:

1. A journal of ``--keys`` distinct keys (one event each, ``--partitions`` partitions), and a producer appending
   ``--rate`` events per second over the same keys for the whole trial.
2. ``split``: one shard ``[0, 128)``; once it has consumed the pre-fill, its two children ``[0, 64)`` and
   ``[64, 128)`` start with ``restoreFrom`` = its ``drained.json`` (the journal's hand-over: catch-up, the
   parent keeps processing until both children caught up).
   ``merge``: two shards ``[0, 64)`` and ``[64, 128)``; once both have consumed the pre-fill, the merged shard
   ``[0, 128)`` starts with ``mergeFrom`` = both ``drained.json`` (a merge hands over by restore: each parent
   drains and exports once the merged shard is warm, and it restores both slices).
   So both hand over the same state (``--keys`` keys) at the same input rate.
3. From the runtime's files (mtimes on one clock): each parent's last commit (``checkpoint/commits/<batchId of
   drained.json>``), each child's first emitting commit (its first batch with a results file). The **processing
   gap** of a range is its child's first emitting commit minus its parent's last commit; a trial's gap is its worst
   range (a split: the later child against the parent; a merge: the merged shard against the parent that stopped
   first). Also: child start -> every child emits.

``--source kafka``: the same trials on a real Kafka broker and MinIO started on loopback (``bench/kafka_world.py``:
Kafka source and sink, storage on S3), where a split hands over by restore like a merge.

Targets: merge processing gap (median) <= the split's on the same state size, on each source; with Kafka, the
split's processing gap (median) <= 5 s. Prints tables, writes ``<out>/merge_gap.{json,png}`` (journal) or
``<out>/merge_gap_kafka.{json,png}``.

    .venv/bin/python bench/merge_gap.py --keys 50000 --trials 2
    .venv/bin/python bench/merge_gap.py --keys 50000 --trials 2 --source kafka
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
    DEFAULT_OUT,
    LoadSampler,
    command_line,
    cpu_times,
    machine,
    mtime,
    print_table,
    pyplot,
    say,
    spawn_runtime,
    write_result,
)

TASK = "mg"
MAX_KEY_GROUPS = 128
HALF = MAX_KEY_GROUPS // 2


def name(start: int, end: int, suffix: str = "") -> str:
    return f"{TASK}-{start}-{end}{suffix}"


def shard_config(
    root: Path, shard: str, start: int, end: int, blocks: dict[str, Any], **parents: Any
) -> dict[str, Any]:
    """A shard's config; ``blocks``: its ``source``, ``sink`` and ``storage`` (the world's)."""
    from spark_runtime.config import parse_config

    cfg = {
        "task": TASK,
        "shard": shard,
        "maxKeyGroups": MAX_KEY_GROUPS,
        "keyGroups": {"start": start, "end": end},
        "processor": {"builtin": "count"},
        **blocks,
        "spark": {
            "master": "local[2]",
            "conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
            "triggerInterval": "1 second",
        },
        "terminationMessagePath": str(root / f"termination-{shard}.log"),
        "metricsPort": 0,
        **parents,
    }
    return parse_config(cfg).to_json_dict()


def drained(root: Path, shard: str) -> Path:
    return root / "state" / TASK / "shards" / shard / "drained.json"


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


def prefill(journal: Path, keys: int, partitions: int, seed: int) -> dict[str, int]:
    from spark_runtime.produce import append_lines, partition_for

    order = list(range(keys))
    random.Random(seed).shuffle(order)
    buckets: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in order:
        buckets[partition_for(f"u{i}", partitions)].append(f'{{"key":"u{i}"}}')
    for p, lines in buckets.items():
        append_lines(journal, p, lines)
    return {f"p{p}.jsonl": (journal / f"p{p}.jsonl").stat().st_size for p in range(partitions)}


def consumed(root: Path, shard: str, ends: dict[str, int]) -> bool:
    try:
        positions = json.loads((root / "state" / TASK / "shards" / shard / "progress.json").read_text())["positions"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return False
    return all(positions.get(k, 0) >= v for k, v in ends.items())


def first_emit(root: Path, shard: str) -> float | None:
    """The commit time of the shard's first batch that wrote a results file (None: none yet)."""
    out = root / "out" / f"shard={shard}"
    ids = sorted(int(f.name.split("-")[1].split(".")[0]) for f in out.glob("**/batch-*.jsonl"))
    for batch in ids:
        t = mtime(root / "state" / TASK / "shards" / shard / "checkpoint" / "commits" / str(batch))
        if t is not None:
            return t
    return None


def last_commit(root: Path, shard: str) -> float | None:
    summary = json.loads(drained(root, shard).read_text())
    return mtime(root / "state" / TASK / "shards" / shard / "checkpoint" / "commits" / str(summary["batchId"]))


class JournalTrial:
    """The journal world of a trial (local files under ``root``): the same questions as
    :class:`kafka_world.KafkaS3Trial` asks of Kafka and MinIO."""

    def __init__(self, root: Path, partitions: int) -> None:
        self.root, self.partitions = root, partitions
        (root / "journal").mkdir(parents=True)

    def blocks(self) -> dict[str, Any]:
        return {
            "source": {"journal": {"path": str(self.root / "journal"), "partitions": self.partitions}},
            "sink": {"directory": {"path": str(self.root / "out"), "format": "jsonl"}},
            "storage": {"path": str(self.root / "state")},
        }

    def drained_pointer(self, shard: str) -> str:
        return str(drained(self.root, shard))

    def prefill(self, keys: int, seed: int) -> dict[str, int]:
        return prefill(self.root / "journal", keys, self.partitions, seed)

    def producer(self, keys: int, rate: int, seed: int) -> Producer:
        return Producer(self.root / "journal", keys, self.partitions, rate, seed)

    def consumed(self, shard: str, ends: dict[str, int]) -> bool:
        return consumed(self.root, shard, ends)

    def first_emit(self, shard: str) -> float | None:
        return first_emit(self.root, shard)

    def last_commit(self, shard: str) -> float | None:
        return last_commit(self.root, shard)

    def drained_at(self, shard: str) -> float | None:
        return mtime(drained(self.root, shard))

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

    def start(shard: str, start_kg: int, end_kg: int, **parents: Any) -> None:
        path = root / f"{shard}.json"
        path.write_text(json.dumps(shard_config(root, shard, start_kg, end_kg, world.blocks(), **parents)))
        procs[shard] = spawn_runtime(path, root / f"{shard}.log")

    if kind == "split":
        parents = [name(0, MAX_KEY_GROUPS)]
        start(parents[0], 0, MAX_KEY_GROUPS)
    else:
        parents = [name(0, HALF), name(HALF, MAX_KEY_GROUPS)]
        start(parents[0], 0, HALF)
        start(parents[1], HALF, MAX_KEY_GROUPS)
    producer = world.producer(args.keys, args.rate, seed + 1)
    producer.start()
    try:
        t0 = time.time()
        wait("the parents consume the pre-fill", lambda: all(world.consumed(p, ends) for p in parents), 900, procs)
        steady = time.time() - t0
        requested = time.time()
        if kind == "split":
            restore = {"parent": parents[0], "manifest": world.drained_pointer(parents[0])}
            children = [name(0, HALF), name(HALF, MAX_KEY_GROUPS)]
            start(children[0], 0, HALF, restoreFrom=restore)
            start(children[1], HALF, MAX_KEY_GROUPS, restoreFrom=restore)
        else:
            merge_from = [{"parent": p, "manifest": world.drained_pointer(p)} for p in parents]
            children = [name(0, MAX_KEY_GROUPS, "-m")]
            start(children[0], 0, MAX_KEY_GROUPS, mergeFrom=merge_from)
        emits = wait(
            "every child emits",
            lambda: (lambda ts: ts if all(t is not None for t in ts) else None)(
                [world.first_emit(c) for c in children]
            ),
            args.timeout,
            procs,
        )
        stops = [world.last_commit(p) for p in parents]
        drained_at = [world.drained_at(p) for p in parents]
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
    if kind == "split":
        gap = max(emits) - stops[0]
    else:
        gap = emits[0] - min(s for s in stops if s is not None)
    return {
        "kind": kind,
        "keys": args.keys,
        "steadySeconds": round(steady, 1),
        "gapSeconds": round(gap, 2),
        "requestToEmitSeconds": round(max(emits) - requested, 1),
        "parentsStopSpreadSeconds": round(max(stops) - min(stops), 2) if len(stops) > 1 else 0.0,
        "lastDrainToEmitSeconds": round(max(emits) - max(d for d in drained_at if d is not None), 2),
        "producedEvents": producer.events,
    }


def summarize(
    results: list[dict[str, Any]],
    load_summary: dict[str, Any],
    steal: float | None,
    args: argparse.Namespace,
    argv: Any,
) -> tuple[dict[str, Any], dict[str, float], dict[str, list[dict[str, Any]]]]:
    """The tables, the target row and the notes of ``results`` (the trials); prints the tables."""
    by = {k: [r for r in results if r["kind"] == k] for k in ("split", "merge")}
    med = {k: statistics.median(r["gapSeconds"] for r in rows) for k, rows in by.items()}
    emit = {k: statistics.median(r["requestToEmitSeconds"] for r in rows) for k, rows in by.items()}
    drain = {k: statistics.median(r["lastDrainToEmitSeconds"] for r in rows) for k, rows in by.items()}
    title = "Processing gap of a split and of a merge, each trial"
    columns = ["kind", "keys", "gap (s)", "child start -> emit (s)", "last drain -> emit (s)", "parents' stop spread"]
    rows = [
        [r["kind"], r["keys"], r["gapSeconds"], r["requestToEmitSeconds"], r["lastDrainToEmitSeconds"],
         r["parentsStopSpreadSeconds"]]
        for r in results
    ]  # fmt: skip
    print_table(title, columns, rows, load_summary)
    ratio = med["merge"] / med["split"] if med["split"] else None
    met = ratio is not None and ratio <= 1.0
    stop = {k: statistics.median(r["gapSeconds"] - r["lastDrainToEmitSeconds"] for r in rows) for k, rows in by.items()}
    kafka = args.source == "kafka"
    where = ", Kafka + MinIO" if kafka else ""
    restore_kafka = (
        "both hand over by restore on Kafka (Spark's Kafka source cannot stop a streaming query at given offsets, "
        "so no successor catches up while its parent runs): the parents export their final state in the final drain "
        f"({stop['split']:.1f} s split, {stop['merge']:.1f} s merge from the (first) parent's last commit to the "
        f"(later) drain summary, medians) and the successors restore it before their first batch "
        f"({drain['split']:.1f} s split, {drain['merge']:.1f} s merge from the later drain summary to the first "
        "emitting batch)"
    )
    restore_merge = (
        "a merge hands over by restore (a shard cannot follow two parents' commits): its parents export their final "
        f"state in the final drain ({stop['merge']:.1f} s from the first parent's last commit to the later drain "
        f"summary, against {stop['split']:.1f} s for a split, whose parent exported a pre-copy while it ran) and the "
        f"merged shard restores it before its first batch ({drain['merge']:.1f} s from the later drain summary to "
        f"its first emitting batch, against {drain['split']:.1f} s for a split, whose children caught up while the "
        "parent ran and whose first batch after the drain emits); medians"
    )
    why = restore_kafka if kafka else restore_merge
    targets = []
    if kafka:
        targets.append(
            {
                "name": "processing gap, split, Kafka + MinIO (median)",
                "target": "<= 5 s",
                "value": f"{med['split']:.1f} s",
                "met": med["split"] <= 5.0,
                "why": None if med["split"] <= 5.0 else why,
            }
        )
    targets += [
        {
            "name": f"merge processing gap vs split (median, same state{where})",
            "target": "merge <= split",
            "value": f"merge {med['merge']:.1f} s vs split {med['split']:.1f} s ({ratio:.2f}x)"
            if ratio is not None
            else "not measured",
            "met": met,
            "why": None if met else why,
        }
    ]
    summary_rows = [
        [
            "median (first) parent's last commit -> (later) drain summary (s)",
            round(stop["split"], 2),
            round(stop["merge"], 2),
        ],
        ["median processing gap (s)", med["split"], med["merge"]],
        ["median child start -> every child emits (s)", emit["split"], emit["merge"]],
        ["median later drain summary -> emit (s)", drain["split"], drain["merge"]],
        ["CPU steal during the run (/proc/stat)", f"{100 * steal:.1f} %" if steal is not None else "not recorded", ""],
    ]
    print_table("Split vs merge (medians)", ["measurement", "split", "merge"], summary_rows)
    source_note = (
        "Source and storage: a real Kafka broker (KRaft) and a real MinIO on loopback; each trial has its own input "
        "and output topic and S3 prefix. Commit times are the objects' LastModified in a listing of the bucket "
        "(milliseconds, this machine's clock); a child's first emitting batch is the smallest batch id in the "
        "`taskshard-id` headers of its records in the output topic."
        if kafka
        else "Source and storage: the journal and a local directory; commit times are file mtimes."
    )
    notes = [
        source_note,
        "Every shard is a `python -m spark_runtime run` process with its own JVM (local[2]), as in a pod, without "
        "Kubernetes: parents and children hand over through storage only, so these are the runtime's timings "
        "(no pod scheduling).",
        "Processing gap of a range = its child's first emitting commit (the first batch with a results file, its "
        "`checkpoint/commits/<n>` mtime) - its parent's last commit (`commits/<batchId of drained.json>`); a trial's "
        "gap is its worst range: the later child for a split, the parent that stopped first for a merge.",
        "Both kinds hand over the same state (the pre-fill's distinct keys, builtin count) while the producer "
        "appends the same rate; "
        + (
            "on Kafka both hand over by restore."
            if kafka
            else "the split is the journal's default catch-up hand-over, the merge the restore hand-over (the only "
            "one a merge has)."
        ),
    ]
    payload = {
        "title": "Merge processing gap next to a split's" + (" on Kafka and MinIO" if kafka else ""),
        "command": command_line(argv),
        "machine": machine(),
        "load": load_summary,
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tables": [
            {"title": "Split vs merge (medians)", "columns": ["measurement", "split", "merge"], "rows": summary_rows},
            {"title": title, "columns": columns, "rows": rows},
        ],
        "targets": targets,
        "plots": [f"{result_name(args)}.png"],
        "notes": notes,
        "raw": {
            "results": results,
            "medianGapSeconds": med,
            "mergeOverSplit": round(ratio, 2) if ratio is not None else None,
            "stealPercent": round(100 * steal, 2) if steal is not None else None,
        },
    }
    return payload, med, by


def result_name(args: argparse.Namespace) -> str:
    return "merge_gap_kafka" if args.source == "kafka" else "merge_gap"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=50_000, help="distinct keys, the state size (default 50,000)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--rate", type=int, default=200, help="events per second appended meanwhile (default 200)")
    ap.add_argument("--trials", type=int, default=2, help="trials of each kind, alternating (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the children to emit (default 900)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--source",
        choices=("journal", "kafka"),
        default="journal",
        help="journal with local storage (default), or Kafka with storage on MinIO (both started on loopback)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--work", type=Path, default=Path("/tmp/taskshard-merge-gap"))
    ap.add_argument("--quick", action="store_true", help="5,000 keys, one trial each")
    ap.add_argument(
        "--summarize", action="store_true", help="rebuild the tables and the target from <out>/merge_gap.json"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.keys, args.trials = 5_000, 1
    if args.summarize:
        recorded = json.loads((args.out / f"{result_name(args)}.json").read_text())
        results, load_summary = recorded["raw"]["results"], recorded["load"]
        steal = (recorded["raw"].get("stealPercent") or 0) / 100
        argv = recorded["command"].split()[2:] if argv is None else argv
    else:
        results = []
        kafka = None
        if args.source == "kafka":
            from kafka_world import KafkaS3World

            shutil.rmtree(args.work, ignore_errors=True)
            kafka = KafkaS3World(args.work / "infra")
        stat0 = cpu_times()
        try:
            with LoadSampler() as load:
                for i in range(args.trials):
                    for kind in ("merge", "split") if i % 2 else ("split", "merge"):
                        say(f"trial {i + 1}/{args.trials}: {kind} of {args.keys:,} keys ({args.source})")
                        r = trial(kind, args.work / f"{kind}-{i}", args, args.seed + i, kafka)
                        say(f"  gap {r['gapSeconds']} s, start -> emit {r['requestToEmitSeconds']} s")
                        results.append(r)
        finally:
            if kafka is not None:
                kafka.close()
        stat1 = cpu_times()
        steal = (stat1[7] - stat0[7]) / max(1, sum(stat1) - sum(stat0)) if len(stat0) > 7 else None
        load_summary = load.summary()
        shutil.rmtree(args.work, ignore_errors=True)
    payload, med, by = summarize(results, load_summary, steal, args, argv)
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        kinds = ["split", "merge"]
        ax.bar(kinds, [med[k] for k in kinds], color=["#4c72b0", "#dd8452"])
        for k in kinds:
            ax.scatter([k] * len(by[k]), [r["gapSeconds"] for r in by[k]], color="black", zorder=3, s=12)
        ax.set_ylabel("processing gap (s)")
        ax.set_title(f"Hand-over gap, {args.keys:,} keys, {args.source} (median; trials as dots)")
        fig.tight_layout()
        args.out.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out / f"{result_name(args)}.png", dpi=120)
    write_result(args.out, result_name(args), payload)
    met = all(t["met"] for t in payload["targets"])
    say(f"median gap: split {med['split']:.1f} s, merge {med['merge']:.1f} s: {'met' if met else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
