"""Builtin windows: a shard's tumbling-window count next to Spark's own streaming
``groupBy(window(ts, "1 minute"), key).count()`` with the same watermark, over the same input.

``--events`` JSON events ``{"key", "ts"}`` over ``--keys`` keys in a journal (event times move forward 2 ms per event
on average, each out of order by less than 1 s), read by both with the shard's journal source (the same parsing and
``--batches`` micro-batches by the same byte budget), in one SparkSession (local[2], RocksDB with changelog
checkpointing, ``availableNow``, fresh checkpoints). ``shard builtin tumbling count``: a whole-range shard with
``processor: {builtin: count, window: {type: tumbling, sizeSeconds: 60}}`` and ``eventTime`` (10 s
out-of-orderness). ``spark groupBy(window, key).count()``: Spark's ``withWatermark("ts", "10 seconds")
.groupBy(window("ts", "1 minute"), "key").count()`` in append mode, written by ``foreachBatch`` as JSON files.

A warm-up round, then ``--repeat`` measured rounds running both; the best round is reported (the median is in the
JSON). Both write the windows the final watermark closed: the last round's outputs must be the same windows with
the same counts. Writes ``<out>/windows_throughput.{json,png}``.

    .venv/bin/python bench/windows_throughput.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    LoadSampler,
    bar_plot,
    method_notes,
    options,
    parse,
    publish,
    rounds,
    say,
    target,
    timed_query,
)
from time_engine import BEST_COLUMNS, MAX_KEY_GROUPS, PARTITIONS, SPARK_CONF, best_table, config, start_work  # noqa: E402

DELAY_SECONDS = 10
WINDOW_SECONDS = 60
EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": DELAY_SECONDS}
WINDOWED_COUNT = {"builtin": "count", "window": {"type": "tumbling", "sizeSeconds": WINDOW_SECONDS}}
SHARD, SPARK = "shard builtin tumbling count", "spark groupBy(window, key).count()"


def run_shard(spark: Any, run_dir: Path, journal: Path, conf: dict) -> dict[str, Any]:
    from spark_runtime.shard import ShardRunner

    cfg = config(run_dir, journal, "tb-0-128", 0, MAX_KEY_GROUPS, WINDOWED_COUNT, conf, eventTime=EVENT_TIME)
    runner = ShardRunner(cfg, spark, available_now=True)
    seconds, cpu, progress = timed_query(lambda: runner.start() or runner.query)
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
    ctx = dict(shard=cfg.shard, max_key_groups=MAX_KEY_GROUPS, range_start=0, range_end=MAX_KEY_GROUPS)
    ctx |= dict(record_spec=make_plan(cfg).record_spec, dead_letter_dir=run_dir / "dead-letters")
    ctx |= dict(drain_marker=location(str(run_dir / "no-drain")))
    ctx["max_bytes_per_trigger"] = int(conf["spark.taskshard.maxBytesPerTrigger"])
    events = JournalSource(str(journal), PARTITIONS).stream(spark, SourceContext(**ctx))
    events = events.withColumn("t", F.timestamp_millis("ts")).withWatermark("t", f"{DELAY_SECONDS} seconds")
    counts = events.groupBy(F.window("t", f"{WINDOW_SECONDS} seconds"), "key").count()
    start, end = F.unix_millis(F.col("window.start")), F.unix_millis(F.col("window.end"))
    counts = counts.select("key", start.alias("window_start"), end.alias("window_end"), F.col("count").alias("result"))

    def write(df: Any, batch_id: int) -> None:
        df.write.mode("append").json(str(run_dir / "spark-out" / f"batch={batch_id}"))

    checkpoint = str(run_dir / "spark-checkpoint")
    writer = counts.writeStream.outputMode("append").option("checkpointLocation", checkpoint).foreachBatch(write)
    seconds, cpu, progress = timed_query(lambda: writer.trigger(availableNow=True).start())
    return {"seconds": seconds, "cpuSeconds": cpu, "batches": len(progress)}


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


def summarize(data: dict[str, Any]) -> list[str]:
    events, runs = data["parameters"]["events"], data["raw"]["runs"]
    rate = {n: events / min(r["seconds"] for r in rs) for n, rs in runs.items()}
    same = "the same windows and counts" if data["raw"]["sameOutput"] else "outputs that DIFFER"
    return [
        f"The builtin tumbling-window count ran at {rate[SHARD]:,.0f} events/s against {rate[SPARK]:,.0f} for Spark's "
        f"own ({rate[SHARD] / rate[SPARK]:.2f}x, best rounds), with {same}."
    ]


def report(args: Any, runs: dict[str, list[dict]], same: bool | None) -> dict[str, Any]:
    best = {n: min(r["seconds"] for r in rs) for n, rs in runs.items()}
    ratio = best[SPARK] / best[SHARD]
    what = (
        f"builtin tumbling-window count (1-minute windows, {args.keys // 1000}k keys, {args.events / 1e6:g}M events, "
        f"delay {DELAY_SECONDS} s) vs Spark's groupBy(window, key).count()"
    )
    value = f"{ratio:.2f}x ({args.events / best[SHARD]:,.0f} vs {args.events / best[SPARK]:,.0f} events/s)"
    value += "" if same else "; the outputs DIFFER"
    notes = [*method_notes(__doc__), f"Same output: {same} (per window start: the windows and their counts' sum)."]
    best_rows = best_table(runs, args.events, SPARK)
    table = [("1-minute tumbling-window count (same input)", [*BEST_COLUMNS, "vs spark"], best_rows)]
    targets = [target(what, ">= 0.9x", value, ratio >= 0.9 and bool(same), "see the table")]
    raw = {"runs": runs, "sameOutput": same}
    return {"title": "Builtin windows", "tables": table, "targets": targets, "notes": notes, "raw": raw}


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=11)
    ap.add_argument("--events", type=int, default=2_000_000, help="input events (default 2,000,000)")
    ap.add_argument("--keys", type=int, default=100_000, help="keys (default 100,000)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds (default 2)")
    args = parse(ap, argv)
    spark, work, journal, warm = start_work(args, "windows-work", 50_000, 2_000)
    runs: dict[str, list[dict]] = {}
    same: bool | None = None
    with LoadSampler() as load:
        for i, (measured, src, budget) in enumerate(rounds(args.repeat, journal, warm, args.batches, PARTITIONS)):
            conf = {**SPARK_CONF, "spark.taskshard.maxBytesPerTrigger": str(budget)}
            dirs = {}
            for name, run in ((SHARD, run_shard), (SPARK, run_spark)):
                dirs[name] = Path(tempfile.mkdtemp(prefix="run-", dir=work))
                r = run(spark, dirs[name], src, conf)
                if measured:
                    runs.setdefault(name, []).append(r)
                    say(f"{name}: {r['seconds']:.1f} s, cpu {r['cpuSeconds']:.1f} s, {r['batches']} batches")
            if i == args.repeat:  # the last round's outputs: the same windows, the same counts
                ours, theirs = shard_totals(dirs[SHARD]), spark_totals(spark, dirs[SPARK])
                same = ours == theirs and bool(ours)
                say(f"same windows and counts: {same} ({len(ours)} window starts)")
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)
    rates = {n: args.events / min(r["seconds"] for r in rs) for n, rs in runs.items()}
    title = "1-minute tumbling-window count, 10 s watermark delay"
    bar_plot(args.out / "windows_throughput.png", rates, xlabel="events/s (best round)", title=title)
    plots = ["windows_throughput.png"]
    publish("windows_throughput", args, argv, load=load.summary(), plots=plots, **report(args, runs, same))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
