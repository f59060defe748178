"""Builtin windows: a shard's tumbling-window count next to Spark's own streaming
``groupBy(window(ts, "1 minute"), key).count()`` with the same watermark, over the same input.

A script, not a test. It writes ``--events`` JSON events ``{"key", "ts"}`` over ``--keys`` keys into a journal
(event times move forward 2 ms per event on average, each out of order by less than 1 s) and runs, in one
SparkSession (local[2], RocksDB with changelog checkpointing, trigger ``availableNow``, the input cut into
``--batches`` micro-batches by the same byte budget, a fresh checkpoint each):

- ``shard builtin tumbling count``: a whole-range shard with ``processor: {builtin: count, window: {type: tumbling,
  sizeSeconds: 60}}`` and ``eventTime`` (10 s out-of-orderness): the key-group filter, the native windowed
  aggregation, the sink's exactly-once files, the late-record check per batch;
- ``spark groupBy(window, key).count()``: the same journal source (so the same parsing and batches), then Spark's
  own ``withWatermark("ts", "10 seconds").groupBy(window("ts", "1 minute"), "key").count()`` in append mode,
  written by ``foreachBatch`` as JSON files.

A warm-up round on a small journal first, then ``--repeat`` measured rounds, each running both once; the best
round is reported (the median is in the JSON). Both write the windows the final watermark closed; the script checks
that they wrote the same windows with the same counts.

Prints a table and writes ``<out>/windows_throughput.{json,png}``.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/windows_throughput.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from common import DEFAULT_OUT, LoadSampler, command_line, machine, print_table, pyplot, say, write_result  # noqa: E402
from shard_throughput import cpu_since, tree_cpu_seconds  # noqa: E402
from time_engine import MAX_KEY_GROUPS, PARTITIONS, config, timed_events, write_journal  # noqa: E402

DELAY_SECONDS = 10
WINDOW_SECONDS = 60
EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": DELAY_SECONDS}
WINDOWED_COUNT = {"builtin": "count", "window": {"type": "tumbling", "sizeSeconds": WINDOW_SECONDS}}
SHARD, SPARK = "shard builtin tumbling count", "spark groupBy(window, key).count()"


def run_shard(spark: Any, run_dir: Path, journal: Path, conf: dict) -> dict[str, Any]:
    from spark_runtime.shard import ShardRunner

    cfg = config(run_dir, journal, "tb-0-128", 0, MAX_KEY_GROUPS, WINDOWED_COUNT, conf, eventTime=EVENT_TIME)
    runner = ShardRunner(cfg, spark, available_now=True)
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    runner.start()
    runner.query.awaitTermination()
    seconds, cpu = time.perf_counter() - t0, cpu_since(c0)
    progress = [p.json for p in runner.query.recentProgress]
    runner.stop()
    return {"seconds": seconds, "cpuSeconds": cpu, "batches": len(progress)}


def run_spark(spark: Any, run_dir: Path, journal: Path, conf: dict) -> dict[str, Any]:
    """Spark's own windowed count over the shard's source (the same parsing and micro-batches)."""
    from pyspark.sql import functions as F

    from spark_runtime.pipeline import make_plan
    from spark_runtime.sources.base import SourceContext
    from spark_runtime.sources.journal import JournalSource
    from spark_runtime.storage import location

    cfg = config(run_dir, journal, "tb-0-128", 0, MAX_KEY_GROUPS, WINDOWED_COUNT, conf, eventTime=EVENT_TIME)
    ctx = SourceContext(
        shard=cfg.shard,
        max_key_groups=MAX_KEY_GROUPS,
        range_start=0,
        range_end=MAX_KEY_GROUPS,
        record_spec=make_plan(cfg).record_spec,
        dead_letter_dir=run_dir / "dead-letters",
        drain_marker=location(str(run_dir / "no-drain")),
        max_bytes_per_trigger=int(conf["spark.taskshard.maxBytesPerTrigger"]),
    )
    events = JournalSource(str(journal), PARTITIONS).stream(spark, ctx)
    counts = (
        events.withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", f"{DELAY_SECONDS} seconds")
        .groupBy(F.window("t", f"{WINDOW_SECONDS} seconds"), "key")
        .count()
        .select(
            "key",
            F.unix_millis(F.col("window.start")).alias("window_start"),
            F.unix_millis(F.col("window.end")).alias("window_end"),
            F.col("count").alias("result"),
        )
    )
    out = run_dir / "spark-out"

    def write(df: Any, batch_id: int) -> None:
        df.write.mode("append").json(str(out / f"batch={batch_id}"))

    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    query = (
        counts.writeStream.outputMode("append")
        .option("checkpointLocation", str(run_dir / "spark-checkpoint"))
        .foreachBatch(write)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds, cpu = time.perf_counter() - t0, cpu_since(c0)
    return {"seconds": seconds, "cpuSeconds": cpu, "batches": len(query.recentProgress)}


def shard_totals(run_dir: Path) -> dict[int, tuple[int, int]]:
    """``{window_start: (windows, events)}`` of the shard's committed output."""
    from spark_runtime.results import read_committed, read_sink

    totals: dict[int, list[int]] = {}
    for r in read_sink(run_dir / "out", read_committed(run_dir / "state", "tb")):
        t = totals.setdefault(int(r["window_start"]), [0, 0])
        t[0], t[1] = t[0] + 1, t[1] + int(r["result"])
    return {k: (n, s) for k, (n, s) in totals.items()}


def spark_totals(spark: Any, run_dir: Path) -> dict[int, tuple[int, int]]:
    """``{window_start: (windows, events)}`` of Spark's output files."""
    from pyspark.sql import functions as F

    files = spark.read.json(str(run_dir / "spark-out"))
    rows = files.groupBy("window_start").agg(F.count("*").alias("n"), F.sum("result").alias("s")).collect()
    return {int(r["window_start"]): (int(r["n"]), int(r["s"])) for r in rows}


def plot(rows: list[tuple[str, float]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=["#4c72b0", "#dd8452"])
    ax.set_xlabel("events/s (best round)")
    ax.set_title("1-minute tumbling-window count, 10 s watermark delay")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000, help="input events (default 2,000,000)")
    ap.add_argument("--keys", type=int, default=100_000, help="keys (default 100,000)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds (default 2)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    out = args.out.resolve()
    work = out / "windows-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    from spark_runtime.session import spark_session

    conf = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}
    spark = spark_session("local[2]", conf, app_name="taskshard-bench-windows")
    journal, warm = work / "journal", work / "warm-journal"
    nbytes = write_journal(journal, timed_events(args.events, args.keys, args.seed))
    write_journal(warm, timed_events(50_000, 2_000, args.seed + 1))
    say(f"input: {args.events:,} events, {args.keys:,} keys, {nbytes / 1e6:.1f} MB")
    runs: dict[str, list[dict]] = {}
    same: bool | None = None
    with LoadSampler() as load:
        for attempt in range(args.repeat + 1):
            measured = attempt > 0
            src = journal if measured else warm
            largest = max(f.stat().st_size for f in src.glob("p*.jsonl"))
            budget = (-(-largest // (args.batches if measured else 2)) + 256) * PARTITIONS
            round_conf = {**conf, "spark.taskshard.maxBytesPerTrigger": str(budget)}
            dirs = {}
            for name, run in ((SHARD, run_shard), (SPARK, run_spark)):
                dirs[name] = Path(tempfile.mkdtemp(prefix="run-", dir=work))
                r = run(spark, dirs[name], src, round_conf)
                if measured:
                    runs.setdefault(name, []).append(r)
                    say(f"{name}: {r['seconds']:.1f} s, cpu {r['cpuSeconds']:.1f} s, {r['batches']} batches")
            if attempt == args.repeat:  # the last round's outputs: the same windows, the same counts
                ours, theirs = shard_totals(dirs[SHARD]), spark_totals(spark, dirs[SPARK])
                same = ours == theirs and bool(ours)
                say(f"same windows and counts: {same} ({len(ours)} window starts)")
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)
    load_summary = load.summary()

    best = {n: min(r["seconds"] for r in rs) for n, rs in runs.items()}
    ratio = best[SPARK] / best[SHARD]
    table = [
        [
            n,
            round(best[n], 2),
            round(statistics.median(r["seconds"] for r in rs), 2),
            f"{args.events / best[n]:,.0f}",
            round(min(r["cpuSeconds"] for r in rs), 1),
            f"{best[SPARK] / best[n]:.2f}x",
        ]
        for n, rs in runs.items()
    ]
    columns = ["run", "wall s (best)", "median s", "events/s", "CPU s (best)", "vs spark"]
    print_table("1-minute tumbling-window count", columns, table, load_summary)
    targets = [
        {
            "name": f"builtin tumbling-window count (1-minute windows, {args.keys // 1000}k keys, "
            f"{args.events / 1e6:g}M events, delay {DELAY_SECONDS} s) vs Spark's groupBy(window, key).count()",
            "target": ">= 0.9x",
            "value": f"{ratio:.2f}x ({args.events / best[SHARD]:,.0f} vs {args.events / best[SPARK]:,.0f} events/s)"
            + ("" if same else "; the outputs DIFFER"),
            "met": ratio >= 0.9 and bool(same),
            "why": None if ratio >= 0.9 and same else "see the table",
        },
    ]
    plot([(n, args.events / best[n]) for n in runs], out / "windows_throughput.png")
    payload = {
        "title": "Builtin windows",
        "command": command_line(argv),
        "machine": machine(),
        "load": load_summary,
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tables": [{"title": "1-minute tumbling-window count (same input)", "columns": columns, "rows": table}],
        "targets": targets,
        "plots": ["windows_throughput.png"],
        "notes": [
            "Both read the journal with the shard's source (same parsing, same micro-batches: a byte budget of a "
            f"{args.batches}th of the input), in one SparkSession, availableNow, fresh checkpoints; the best of the "
            "measured rounds.",
            f"Same output: {same} (per window start, the number of windows and the sum of their counts).",
        ],
        "raw": {"runs": runs, "sameOutput": same},
    }
    write_result(out, "windows_throughput", payload)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
