"""Throughput of one TaskShard shard next to Spark's own streaming ``groupBy(key).count()``, same input, same run.

A script, not a test. It writes a journal of ``--events`` JSON events over ``--keys`` keys in ``--partitions``
partition files, then runs, one after another in one SparkSession (RocksDB state store with changelog
checkpointing and the same shuffle partitions for every run; trigger ``availableNow``; a fresh checkpoint
each):

- ``spark groupBy(key).count()``: Spark's text file source on the same files, ``from_json(value, 'key
  string')``, ``groupBy("key").count()``, update mode, ``noop`` sink (Spark's native path, no runtime code);
- ``shard builtin count`` / ``shard builtin sum``: :class:`spark_runtime.shard.ShardRunner` over the whole range
  (journal source with validation and dead letters, native key-group filter, native aggregation, the directory
  sink writing every updated key);
- ``shard python count`` / ``shard python sum``: the same with the Python processor API
  (:class:`spark_runtime.processor.CountProcessor` / ``SumProcessor``).

The time of a run is from ``start()`` until the query has consumed everything (planning and the first batch's
warm-up included, the drain's snapshot export excluded and reported separately). Each measured run is
preceded by one small warm-up run of the same kind so JIT and Python-worker start-up do not favour whoever
runs last. Prints a table and writes ``<out>/shard_throughput.{json,md,png}``.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/shard_throughput.py --events 1000000
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

KINDS = {
    "shard builtin count": {"builtin": "count"},
    "shard builtin sum": {"builtin": "sum", "field": "amount"},
    "shard python count": {"python": "spark_runtime.processor:CountProcessor"},
    "shard python sum": {"python": "spark_runtime.processor:SumProcessor", "parameters": {"field": "amount"}},
}
BASELINE = "spark groupBy(key).count()"
TARGETS = {"builtin": 0.9, "python": 0.3}


def write_journal(path: Path, events: int, keys: int, partitions: int, seed: int) -> int:
    """``events`` lines ``{"key": "k<j>", "amount": <0..99>, "seq": i}``; returns the journal's bytes."""
    import random

    rng = random.Random(seed)
    buckets: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in range(events):
        key = f"k{rng.randrange(keys)}"
        buckets[partition_for(key, partitions)].append(f'{{"key":"{key}","amount":{rng.randrange(100)},"seq":{i}}}')
        if i % 200_000 == 199_999:
            for p, lines in buckets.items():
                append_lines(path, p, lines)
                lines.clear()
    for p, lines in buckets.items():
        append_lines(path, p, lines)
    return sum(f.stat().st_size for f in path.glob("p*.jsonl"))


def run_baseline(spark: Any, journal: Path, work: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    ckpt = work / "baseline-ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    t0 = time.perf_counter()
    lines = spark.readStream.format("text").load(str(journal))
    counts = lines.select(F.from_json("value", "key string").alias("e")).groupBy("e.key").count()
    q = (
        counts.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    rows = sum(int(json.loads(p.json)["numInputRows"]) for p in q.recentProgress)
    return {"seconds": seconds, "rows": rows, "batches": len(q.recentProgress)}


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


def run_shard(spark: Any, work: Path, journal: Path, partitions: int, processor: dict, conf: dict) -> dict[str, Any]:
    shutil.rmtree(work / "state", ignore_errors=True)
    shutil.rmtree(work / "out", ignore_errors=True)
    runner = ShardRunner(shard_config(work, journal, partitions, processor, conf), spark, available_now=True)
    t0 = time.perf_counter()
    runner.start()
    runner.query.awaitTermination()
    seconds = time.perf_counter() - t0
    runner.poll()
    progress = [json.loads(p.json) for p in runner.query.recentProgress]
    rows = sum(int(p["numInputRows"]) for p in progress)
    t1 = time.perf_counter()
    summary = runner.drain()
    return {
        "seconds": seconds,
        "rows": rows,
        "batches": len(progress),
        "drainSeconds": time.perf_counter() - t1,
        "stateRows": summary["stateRows"],
        "outputRows": runner.sink.rows_written if runner.sink else 0,
    }


def plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in results]
    rates = [r["eventsPerSecond"] for r in results]
    colors = [
        "#888888" if r["name"] == BASELINE else ("#1f77b4" if "builtin" in r["name"] else "#ff7f0e") for r in results
    ]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.barh(names[::-1], rates[::-1], color=colors[::-1])
    base = next(r["eventsPerSecond"] for r in results if r["name"] == BASELINE)
    for kind, ratio in TARGETS.items():
        ax.axvline(
            base * ratio,
            color="#1f77b4" if kind == "builtin" else "#ff7f0e",
            ls="--",
            lw=1,
            label=f"{kind} target {ratio}x",
        )
    for bar, r in zip(bars, results[::-1], strict=True):
        label = f" {r['eventsPerSecond']:,.0f}/s ({r['ratio']:.2f}x)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=9)
    ax.set_xlabel("events per second (higher is better)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max(rates) * 1.35)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="input events (default 1,000,000)")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions (default 4)")
    ap.add_argument("--repeat", type=int, default=1, help="measured runs per kind (median reported)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of: " + ", ".join(KINDS))
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "taskshard-bench"), help="output dir")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    out = Path(args.out)
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    journal, warm_journal = work / "journal", work / "warm-journal"
    t0 = time.perf_counter()
    nbytes = write_journal(journal, args.events, args.keys, args.partitions, args.seed)
    write_journal(warm_journal, 20_000, 1_000, args.partitions, args.seed + 1)
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
        for name in [BASELINE, *kinds]:
            if name == BASELINE:
                r = run_baseline(spark, src, work)
            else:
                r = run_shard(spark, work, src, args.partitions, KINDS[name], conf)
            if measured:
                runs.setdefault(name, []).append(r)
                print(f"  {name:28s} {r['seconds']:7.2f}s  rows={r['rows']:,}  batches={r['batches']}", flush=True)

    results = []
    base_seconds = statistics.median(r["seconds"] for r in runs[BASELINE])
    for name, rs in runs.items():
        seconds = statistics.median(r["seconds"] for r in rs)
        rows = rs[0]["rows"]
        if rows != args.events:
            print(f"WARNING: {name} consumed {rows:,} rows, expected {args.events:,}", flush=True)
        entry = {
            "name": name,
            "seconds": round(seconds, 3),
            "eventsPerSecond": round(args.events / seconds, 1),
            "ratio": round(base_seconds / seconds, 3),
            "runs": rs,
        }
        if name != BASELINE:
            kind = "builtin" if "builtin" in name else "python"
            entry["target"] = TARGETS[kind]
            entry["meetsTarget"] = entry["ratio"] >= TARGETS[kind]
        results.append(entry)

    header = f"| run | seconds | events/s | ratio vs {BASELINE} | target |\n|---|---:|---:|---:|---|\n"
    rows_md = "".join(
        f"| {r['name']} | {r['seconds']:.2f} | {r['eventsPerSecond']:,.0f} | {r['ratio']:.2f} | "
        + (f"{r['target']}x {'met' if r['meetsTarget'] else 'MISSED'}" if "target" in r else "-")
        + " |\n"
        for r in results
    )
    env = (
        f"{args.events:,} events, {args.keys:,} keys, {args.partitions} journal partitions, local[2], "
        f"shuffle partitions {args.shuffle_partitions}, RocksDB + changelog checkpointing, availableNow, "
        f"median of {args.repeat}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    md = f"# Shard throughput\n\n{env}\n\n{header}{rows_md}"
    print()
    print(header + rows_md)
    (out / "shard_throughput.md").write_text(md)
    (out / "shard_throughput.json").write_text(json.dumps({"environment": env, "results": results}, indent=2))
    plot(results, out / "shard_throughput.png", env)
    print(f"wrote {out}/shard_throughput.md, .json, .png")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
