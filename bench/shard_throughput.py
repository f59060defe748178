"""Throughput of one TaskShard shard next to Spark's own streaming ``groupBy(key).count()``, same input, same run.

A script, not a test. It writes ``--events`` JSON events over ``--keys`` keys into a journal of
``--partitions`` partition files (and the same lines as chunk files for Spark's file source), then runs, one
after another in one SparkSession (RocksDB state store with changelog checkpointing, the same shuffle
partitions, trigger ``availableNow``, the input cut into ``--batches`` micro-batches, a fresh checkpoint each):

- ``spark groupBy(key).count()`` and ``spark groupBy(key).sum(amount)`` (the baselines): Spark's text file
  source over the chunk files (``maxFilesPerTrigger`` = partitions), ``from_json``, ``groupBy("key")`` with
  ``count()`` / ``sum("amount")``, update mode, ``noop`` sink: Spark's native path and nothing else;
- ``shard builtin count`` / ``shard builtin sum``: :class:`spark_runtime.shard.ShardRunner` over the whole range
  (journal source with validation and dead letters, native key-group filter, native aggregation, the directory
  sink writing every updated key of every batch), ``spark.taskshard.maxBytesPerTrigger`` = input / batches;
- ``shard python count`` / ``shard python sum``: the same with the Python processor API
  (:class:`spark_runtime.engine.api.CountProcessor` / ``SumProcessor``) on the runs state layout every new shard
  uses; ``shard python count (blob layout)``: the same count on the blob layout (checkpoints written before the
  runs layout; reference, no target);
- ``shard builtin count (with key-group counts)``: ``shard builtin count`` with the per-key-group row counts on
  (the shard's load map, ``spark.taskshard.keyGroupMetrics=true``; off by default); its ``keyGroupCountsCost``
  is ``1 - wall(without) / wall(with)``: the share of throughput the counts cost (target <= 3 %).

"wall" is from ``start()`` until the query consumed everything (source start-up and planning included; the
drain's snapshot export excluded, reported in the JSON); "batch-time" sums the micro-batches' own durations;
"CPU" is the CPU time of the whole process tree (driver, JVM, Python workers) over the run, the measure that
stays meaningful when other jobs share the machine.
A warm-up round on a small journal runs first; then each measured round runs every kind once (so a burst of
machine load hits all kinds alike). The best of ``--repeat`` rounds is reported (interference only ever slows a
run down; the median is in the JSON). Sum runs are compared with ``spark groupBy(key).sum(amount)``, count
runs with ``spark groupBy(key).count()``. Prints a table and writes ``<out>/shard_throughput.{json,md,png}``.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/shard_throughput.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from spark_runtime.config import parse_config  # noqa: E402
from spark_runtime.produce import append_lines, partition_for  # noqa: E402
from spark_runtime.session import spark_session  # noqa: E402
from spark_runtime.shard import ShardRunner  # noqa: E402

WITH_KEY_GROUP_COUNTS = "shard builtin count (with key-group counts)"
"""``shard builtin count`` with the per-key-group row counts on (``spark.taskshard.keyGroupMetrics`` true; off by
default): the pair measures what the load map costs (target: at most 3 % of the throughput)."""
KEY_GROUP_COUNTS_TARGET = 0.03
KINDS = {
    "shard builtin count": {"builtin": "count"},
    WITH_KEY_GROUP_COUNTS: {"builtin": "count"},
    "shard builtin sum": {"builtin": "sum", "field": "amount"},
    "shard python count": {"python": "spark_runtime.processor:CountProcessor"},
    "shard python sum": {"python": "spark_runtime.processor:SumProcessor", "parameters": {"field": "amount"}},
    "shard python count (blob layout)": {"python": "spark_runtime.processor:CountProcessor"},
}
LAYOUTS = {"shard python count (blob layout)": "blob"}
"""Kinds that run on another state layout than a new shard's (recorded in the shard's ``state-layout.json``)."""
BASELINE = "spark groupBy(key).count()"
BASELINE_SUM = "spark groupBy(key).sum(amount)"
BASELINES = {BASELINE: "count", BASELINE_SUM: "sum"}
TARGETS = {"builtin": 0.9, "python": 0.6}


def write_journal(path: Path, events: int, keys: int, partitions: int, seed: int, batches: int) -> int:
    """``events`` lines ``{"key": "k<j>", "amount": <0..99>, "seq": i}`` into ``path`` (the journal), and the
    same lines into ``<path>-baseline`` as ``batches`` chunk files per partition for Spark's file source
    (``maxFilesPerTrigger = partitions`` then gives it the same micro-batches). Returns the journal's bytes."""
    import random

    rng = random.Random(seed)
    buckets: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in range(events):
        key = f"k{rng.randrange(keys)}"
        buckets[partition_for(key, partitions)].append(f'{{"key":"{key}","amount":{rng.randrange(100)},"seq":{i}}}')
    baseline = path.parent / f"{path.name}-baseline"
    baseline.mkdir(parents=True, exist_ok=True)
    for p, lines in buckets.items():
        append_lines(path, p, lines)
    for c in range(batches):  # chunk c of every partition, written in order (the file source orders by mtime)
        for p, lines in buckets.items():
            lo, hi = len(lines) * c // batches, len(lines) * (c + 1) // batches
            (baseline / f"c{c:04d}-p{p}.jsonl").write_text("".join(line + "\n" for line in lines[lo:hi]))
            time.sleep(0.002)
    return sum(f.stat().st_size for f in path.glob("p*.jsonl"))


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system) used so far by this process tree: the driver, the JVM, Spark's Python
    workers, including children they already reaped (``cutime``/``cstime``). Unlike wall time it barely moves
    when other jobs share the machine, so it is the robust measure on a busy host."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        stats[pid] = fields
        children.setdefault(int(fields[1]), []).append(pid)
    tick = os.sysconf("SC_CLK_TCK")
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        f = stats.get(pid)
        if f is not None:  # fields after the name: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
            total += sum(int(x) for x in f[11:15]) / tick
        stack.extend(children.get(pid, []))
    return total


def cpu_since(start: float) -> float:
    """CPU seconds of the process tree since ``start``; NaN when the tree lost a process that was not yet
    reaped (its time then shows up nowhere: the sample is dropped rather than reported wrong)."""
    time.sleep(0.5)  # let parents reap finished workers so their time moves into cutime
    used = tree_cpu_seconds() - start
    return used if used > 0 else float("nan")


def trigger_seconds(progress: list[dict[str, Any]]) -> float:
    """Sum of ``triggerExecution`` over the triggers that processed a batch."""
    return sum(p["durationMs"].get("triggerExecution", 0) for p in progress if p.get("numInputRows")) / 1000


def run_baseline(spark: Any, journal: Path, work: Path, partitions: int, kind: str = "count") -> dict[str, Any]:
    from pyspark.sql import functions as F

    ckpt = Path(tempfile.mkdtemp(prefix="baseline-", dir=work)) / "checkpoint"
    c0 = tree_cpu_seconds()
    t0 = time.perf_counter()
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", partitions).load(f"{journal}-baseline")
    if kind == "count":
        events = lines.select(F.from_json("value", "key string").alias("e")).select("e.*")
        agg = events.groupBy("key").count()
    else:
        events = lines.select(F.from_json("value", "key string, amount double").alias("e")).select("e.*")
        agg = events.groupBy("key").agg(F.sum("amount"))
    q = (
        agg.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    cpu = cpu_since(c0)
    progress = [json.loads(p.json) for p in q.recentProgress]
    rows = sum(int(p["numInputRows"]) for p in progress)
    return {
        "seconds": seconds,
        "cpuSeconds": cpu,
        "rows": rows,
        "batches": sum(1 for p in progress if p["numInputRows"]),
        "triggerSeconds": trigger_seconds(progress),
    }


def shard_config(work: Path, journal: Path, partitions: int, processor: dict[str, Any], conf: dict[str, str]) -> Any:
    return parse_config(
        {
            "task": "bench",
            "shard": "bench-0-128",
            "maxKeyGroups": 128,
            "keyGroups": {"start": 0, "end": 128},
            "processor": processor,
            "source": {"journal": {"path": str(journal), "partitions": partitions}},
            "sink": {"directory": {"path": str(work / "out"), "format": "jsonl"}},
            "storage": {"path": str(work / "state")},
            "spark": {"master": "local[2]", "conf": conf, "triggerInterval": "1 second"},
        }
    )


TRANSIENT_ERRORS = ("Python worker failed to connect back", "CANNOT_OPEN_SOCKET")
"""Spark gives a new Python worker 10 s (fixed) to connect back; when the hypervisor steals most of this VM's
CPU for a while, a source's Python runner can miss that, and the query fails before reading anything."""


def retry_transient(name: str, run: Any, *args: Any, attempts: int = 3) -> dict[str, Any]:
    """``run(*args)``, again (up to ``attempts`` times) when it failed with one of :data:`TRANSIENT_ERRORS`;
    the result records ``retries``. Any other failure, or the last one, is raised."""
    for attempt in range(1, attempts + 1):
        try:
            result = run(*args)
        except Exception as e:  # noqa: BLE001 - only the transient start-up failures are retried
            if attempt == attempts or not any(t in str(e) for t in TRANSIENT_ERRORS):
                raise
            first_line = str(e).strip().splitlines()[0][:200]
            print(f"  {name}: a Python worker did not start in time, running it again ({first_line})", flush=True)
            continue
        result["retries"] = attempt - 1
        return result
    raise AssertionError("unreachable")


def run_shard(
    spark: Any,
    work: Path,
    journal: Path,
    partitions: int,
    processor: dict,
    conf: dict,
    batch_bytes: int,
    layout: str | None = None,
) -> dict[str, Any]:
    # A fresh directory per run: Spark caches state-store providers by checkpoint path within a session.
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    conf = {**conf, "spark.taskshard.maxBytesPerTrigger": str(batch_bytes)}
    runner = ShardRunner(shard_config(run_dir, journal, partitions, processor, conf), spark, available_now=True)
    if layout is not None:
        runner.paths.state_layout.create_exclusive_json({"layout": layout})
    c0 = tree_cpu_seconds()
    t0 = time.perf_counter()
    runner.start()
    runner.query.awaitTermination()
    seconds = time.perf_counter() - t0
    cpu = cpu_since(c0)
    runner.poll()
    progress = [json.loads(p.json) for p in runner.query.recentProgress]
    rows = sum(int(p["numInputRows"]) for p in progress)
    t1 = time.perf_counter()
    summary = runner.drain()
    result = {
        "seconds": seconds,
        "cpuSeconds": cpu,
        "rows": rows,
        "batches": sum(1 for p in progress if p["numInputRows"]),
        "triggerSeconds": trigger_seconds(progress),
        "drainSeconds": time.perf_counter() - t1,
        "stateRows": summary["stateRows"],
        "outputRows": runner.sink.rows_written if runner.sink else 0,
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in results]
    rates = [r["eventsPerSecond"] for r in results]
    colors = [
        "#888888" if r["name"] in BASELINES else ("#1f77b4" if "builtin" in r["name"] else "#ff7f0e") for r in results
    ]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    bars = ax.barh(names[::-1], rates[::-1], color=colors[::-1])
    for bar, r in zip(bars, results[::-1], strict=True):
        label = f" {r['eventsPerSecond']:,.0f}/s"
        if "target" in r:
            label += f"  {r['ratio']:.2f}x of {r['baseline']} (target {r['target']}x)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8)
    ax.set_xlabel("events/s (higher is better); grey: Spark's own aggregation, blue: builtin, orange: Python")
    ax.set_title(title, fontsize=8, wrap=True)
    ax.set_xlim(0, max(rates) * 1.7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000, help="input events (default 2,000,000)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions (default 4)")
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds (best reported; default 2)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of: " + ", ".join(KINDS))
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "taskshard-bench"), help="output dir")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    out = Path(args.out).resolve()  # paths go into shard configs, which want absolute ones
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    journal, warm_journal = work / "journal", work / "warm-journal"
    t0 = time.perf_counter()
    nbytes = write_journal(journal, args.events, args.keys, args.partitions, args.seed, args.batches)
    write_journal(warm_journal, 20_000, 1_000, args.partitions, args.seed + 1, 2)
    print(
        f"input: {args.events:,} events, {args.keys:,} keys, {args.partitions} partitions, "
        f"{nbytes / 1e6:.1f} MB (written in {time.perf_counter() - t0:.1f}s)",
        flush=True,
    )

    conf = {"spark.sql.shuffle.partitions": str(args.shuffle_partitions), "spark.ui.enabled": "false"}
    spark = spark_session("local[2]", conf, app_name="taskshard-bench")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    runs: dict[str, list[dict[str, Any]]] = {}
    # Round 0 warms every kind up on a small journal; rounds 1..repeat are measured, each running every kind
    # once, so a burst of load on the machine hits all kinds alike rather than one kind's repeats.
    for attempt in range(args.repeat + 1):
        measured = attempt > 0
        src = journal if measured else warm_journal
        # The journal source's byte budget is split evenly over partitions: size it so the largest partition
        # takes exactly --batches micro-batches, like the baseline's chunk files.
        largest = max(f.stat().st_size for f in src.glob("p*.jsonl"))
        batch_bytes = (-(-largest // (args.batches if measured else 2)) + 256) * args.partitions
        for name in [BASELINE, BASELINE_SUM, *kinds]:
            if name in BASELINES:
                r = retry_transient(name, run_baseline, spark, src, work, args.partitions, BASELINES[name])
            else:
                kind_conf = {
                    **conf,
                    **({"spark.taskshard.keyGroupMetrics": "true"} if name == WITH_KEY_GROUP_COUNTS else {}),
                }
                r = retry_transient(
                    name,
                    run_shard,
                    spark,
                    work,
                    src,
                    args.partitions,
                    KINDS[name],
                    kind_conf,
                    batch_bytes,
                    LAYOUTS.get(name),
                )
            if measured:
                runs.setdefault(name, []).append(r)
                print(
                    f"  {name:32s} {r['seconds']:7.2f}s  (batches {r['triggerSeconds']:6.2f}s, cpu "
                    f"{r['cpuSeconds']:6.2f}s)  rows={r['rows']:,}  batches={r['batches']}",
                    flush=True,
                )

    # Best of the measured rounds: on a shared machine, interference only ever slows a run down, so the
    # fastest round is the least disturbed one (the median is in the JSON too).
    results = []
    best = {name: min(r["seconds"] for r in rs) for name, rs in runs.items()}
    best_trigger = {name: min(r["triggerSeconds"] for r in rs) for name, rs in runs.items()}
    best_cpu = {
        name: min((r["cpuSeconds"] for r in rs if r["cpuSeconds"] == r["cpuSeconds"]), default=float("nan"))
        for name, rs in runs.items()
    }
    for name, rs in runs.items():
        base = BASELINE_SUM if name.endswith(" sum") or name == BASELINE_SUM else BASELINE
        rows = rs[0]["rows"]
        if rows != args.events:
            print(f"WARNING: {name} consumed {rows:,} rows, expected {args.events:,}", flush=True)
        entry = {
            "name": name,
            "baseline": base,
            "seconds": round(best[name], 3),
            "medianSeconds": round(statistics.median(r["seconds"] for r in rs), 3),
            "eventsPerSecond": round(args.events / best[name], 1),
            "ratio": round(best[base] / best[name], 3),
            "batchSeconds": round(best_trigger[name], 3),
            "batchRatio": round(best_trigger[base] / best_trigger[name], 3),
            "cpuSeconds": round(best_cpu[name], 3),
            "cpuRatio": round(best_cpu[base] / best_cpu[name], 3),
            "batches": rs[0]["batches"],
            "runs": rs,
        }
        if name == WITH_KEY_GROUP_COUNTS and "shard builtin count" in best:
            # What the key-group counts cost: the throughput lost with them, from the best rounds of both.
            entry["keyGroupCountsCost"] = round(1 - best["shard builtin count"] / best[name], 4)
            entry["keyGroupCountsCpuCost"] = round(1 - best_cpu["shard builtin count"] / best_cpu[name], 4)
            entry["keyGroupCountsTarget"] = KEY_GROUP_COUNTS_TARGET
        elif name not in BASELINES and name not in LAYOUTS:
            kind = "builtin" if "builtin" in name else "python"
            entry["target"] = TARGETS[kind]
            entry["meetsTarget"] = entry["ratio"] >= TARGETS[kind]
        results.append(entry)

    header = (
        "| run | wall s (best) | median s | events/s | ratio vs its baseline | batch-time s | batch-time ratio "
        "| CPU s | CPU ratio | target (on wall ratio) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    rows_md = "".join(
        f"| {r['name']} | {r['seconds']:.2f} | {r['medianSeconds']:.2f} | {r['eventsPerSecond']:,.0f} | "
        f"{r['ratio']:.2f} | {r['batchSeconds']:.2f} | {r['batchRatio']:.2f} | {r['cpuSeconds']:.1f} | "
        f"{r['cpuRatio']:.2f} | "
        + (
            f"{r['target']}x {'met' if r['meetsTarget'] else 'MISSED'}"
            if "target" in r
            else (f"key-group counts cost {r['keyGroupCountsCost']:.1%}" if "keyGroupCountsCost" in r else "(baseline)")
        )
        + " |\n"
        for r in results
    )
    env = (
        f"{args.events:,} events, {args.keys:,} keys, {args.partitions} journal partitions, {args.batches} "
        f"micro-batches, local[2], shuffle partitions {args.shuffle_partitions}, RocksDB + changelog checkpointing, "
        f"availableNow, best of {args.repeat} rounds; {platform.machine()}, {os.cpu_count()} cores"
    )
    md = f"# Shard throughput\n\n{env}\n\n{header}{rows_md}"
    print()
    print(header + rows_md)
    (out / "shard_throughput.md").write_text(md)

    def no_nan(obj: Any) -> Any:  # strict JSON: a dropped CPU sample is null, not NaN
        if isinstance(obj, float) and obj != obj:
            return None
        if isinstance(obj, dict):
            return {k: no_nan(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [no_nan(v) for v in obj]
        return obj

    (out / "shard_throughput.json").write_text(
        json.dumps(no_nan({"environment": env, "results": results}), indent=2, allow_nan=False)
    )
    plot(results, out / "shard_throughput.png", env)
    print(f"wrote {out}/shard_throughput.md, .json, .png")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
