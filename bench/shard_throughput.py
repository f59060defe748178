"""Throughput of one TaskShard shard next to Spark's own streaming ``groupBy(key).count()``, same input, same run.

``--events`` JSON events over ``--keys`` keys, in a journal of ``--partitions`` files and, as ``--batches`` chunk
files per partition, for Spark's file source. In one SparkSession (RocksDB with changelog checkpointing,
``availableNow``, ``--batches`` micro-batches, fresh checkpoints) each kind runs once per round: Spark's
``groupBy(key).count()`` / ``.sum(amount)`` (text source, ``from_json``, update mode, ``noop`` sink), and a
whole-range ``ShardRunner`` with the builtin or Python count and sum (``(blob layout)``: the older layout, no target;
``(with key-group counts)``: the load map on, costing ``1 - wall(without) / wall(with)``). "wall": ``start()`` until
all is consumed (not the drain); "batch-time": the micro-batches' durations; "CPU": the process tree's. A warm-up
round, then ``--repeat`` measured rounds; the best is reported. Writes ``<out>/shard_throughput.{json,png}``.

    .venv/bin/python bench/shard_throughput.py --repeat 3
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    LoadSampler,
    bar_plot,
    options,
    parse,
    publish,
    rounds,
    runner_config,
    say,
    target,
    timed_query,
)

WITH_KEY_GROUP_COUNTS = "shard builtin count (with key-group counts)"
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
BASELINE, BASELINE_SUM = "spark groupBy(key).count()", "spark groupBy(key).sum(amount)"
BASELINES = {BASELINE: "count", BASELINE_SUM: "sum"}
TARGETS = {"builtin": 0.9, "python": 0.6}
TRANSIENT_ERRORS = ("Python worker failed to connect back", "CANNOT_OPEN_SOCKET")
"""Spark gives a new Python worker 10 s (fixed) to connect back; when the hypervisor steals most of this VM's
CPU for a while, a source's Python runner can miss that, and the query fails before reading anything."""
KEY_GROUP_COUNTS_WHY = (
    "the counts are Spark's observe() with one histogram_numeric over the bucket index; observe() sits between the "
    "source and the aggregation outside whole-stage code generation, so every input row is handed over one more "
    "time whatever it computes (64 conditional sums cost 33 %, a histogram over a random eighth of the rows was no "
    "cheaper); off by default"
)


def write_journal(path: Path, events: int, keys: int, partitions: int, seed: int, batches: int) -> int:
    """``events`` lines ``{"key": "k<j>", "amount": <0..99>, "seq": i}`` into ``path`` (the journal), and the
    same lines into ``<path>-baseline`` as ``batches`` chunk files per partition for Spark's file source
    (``maxFilesPerTrigger = partitions`` then gives it the same micro-batches). Returns the journal's bytes."""
    from spark_runtime.produce import append_lines, partition_for

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


def progress_facts(progress: list[dict[str, Any]]) -> dict[str, Any]:
    """Input rows, batches with input, and the sum of their ``triggerExecution`` seconds."""
    busy = [p for p in progress if p.get("numInputRows")]
    trigger = sum(p["durationMs"].get("triggerExecution", 0) for p in busy) / 1000
    return {"rows": sum(int(p["numInputRows"]) for p in progress), "batches": len(busy), "triggerSeconds": trigger}


def run_baseline(spark: Any, journal: Path, work: Path, partitions: int, kind: str = "count") -> dict[str, Any]:
    from pyspark.sql import functions as F

    ckpt = Path(tempfile.mkdtemp(prefix="baseline-", dir=work)) / "checkpoint"

    def start() -> Any:
        lines = spark.readStream.format("text").option("maxFilesPerTrigger", partitions).load(f"{journal}-baseline")
        if kind == "count":
            agg = lines.select(F.from_json("value", "key string").alias("e")).select("e.*").groupBy("key").count()
        else:
            events = lines.select(F.from_json("value", "key string, amount double").alias("e")).select("e.*")
            agg = events.groupBy("key").agg(F.sum("amount"))
        writer = agg.writeStream.outputMode("update").format("noop").option("checkpointLocation", str(ckpt))
        return writer.trigger(availableNow=True).start()

    seconds, cpu, progress = timed_query(start)
    return {"seconds": seconds, "cpuSeconds": cpu, **progress_facts(progress)}


def run_shard(
    spark: Any, work: Path, journal: Path, partitions: int, processor: dict, conf: dict, layout: str | None = None
) -> dict[str, Any]:
    from spark_runtime.shard import ShardRunner

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))  # Spark caches state stores by checkpoint path
    cfg = runner_config(run_dir, journal, partitions, "bench-0-128", 0, 128, processor, conf)
    runner = ShardRunner(cfg, spark, available_now=True)
    if layout is not None:
        runner.paths.state_layout.create_exclusive_json({"layout": layout})
    seconds, cpu, progress = timed_query(lambda: runner.start() or runner.query)
    runner.poll()
    t1 = time.perf_counter()
    summary = runner.drain()
    drain = time.perf_counter() - t1
    result = {"seconds": seconds, "cpuSeconds": cpu, **progress_facts(progress), "drainSeconds": drain}
    result |= {"stateRows": summary["stateRows"], "outputRows": runner.sink.rows_written if runner.sink else 0}
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def retry_transient(name: str, run: Any, *args: Any, attempts: int = 3) -> dict[str, Any]:
    """``run(*args)``, again (up to ``attempts`` times) when it failed with one of :data:`TRANSIENT_ERRORS`;
    the result records ``retries``. Any other failure, or the last one, is raised."""
    for attempt in range(1, attempts + 1):
        try:
            result = run(*args)
        except Exception as e:  # noqa: BLE001 - only the transient start-up failures are retried
            if attempt == attempts or not any(t in str(e) for t in TRANSIENT_ERRORS):
                raise
            say(f"{name}: a Python worker did not start in time, running it again ({str(e).strip()[:200]})")
            continue
        return result | {"retries": attempt - 1}
    raise AssertionError("unreachable")


def measure(args: Any, spark: Any, work: Path, conf: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """The warm-up round, then the measured rounds, each running every kind once (so a burst of load on the
    machine hits all kinds alike rather than one kind's repeats): the measured runs by kind."""
    journal, warm = work / "journal", work / "warm-journal"
    t0 = time.perf_counter()
    nbytes = write_journal(journal, args.events, args.keys, args.partitions, args.seed, args.batches)
    write_journal(warm, 20_000, 1_000, args.partitions, args.seed + 1, 2)
    say(f"input: {args.events:,} events, {args.keys:,} keys, {nbytes / 1e6:.1f} MB ({time.perf_counter() - t0:.1f}s)")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    runs: dict[str, list[dict[str, Any]]] = {}
    for measured, src, batch_bytes in rounds(args.repeat, journal, warm, args.batches, args.partitions):
        for name in [BASELINE, BASELINE_SUM, *kinds]:
            if name in BASELINES:
                r = retry_transient(name, run_baseline, spark, src, work, args.partitions, BASELINES[name])
            else:
                kind_conf = {**conf, "spark.taskshard.maxBytesPerTrigger": str(batch_bytes)}
                if name == WITH_KEY_GROUP_COUNTS:
                    kind_conf["spark.taskshard.keyGroupMetrics"] = "true"
                shard = (spark, work, src, args.partitions, KINDS[name], kind_conf, LAYOUTS.get(name))
                r = retry_transient(name, run_shard, *shard)
            if measured:
                runs.setdefault(name, []).append(r)
                times = f"{r['seconds']:.2f}s (batches {r['triggerSeconds']:.2f}s, cpu {r['cpuSeconds']:.2f}s)"
                say(f"{name}: {times}, rows={r['rows']:,}, batches={r['batches']}")
    return runs


def results(runs: dict[str, list[dict[str, Any]]], events: int) -> list[dict[str, Any]]:
    """Per kind its best round against its baseline's best (sum kinds against the sum baseline)."""

    def best(field: str) -> dict[str, float]:  # a dropped CPU sample (NaN) is skipped
        return {n: min((r[field] for r in rs if r[field] == r[field]), default=float("nan")) for n, rs in runs.items()}

    wall, trigger, cpu, out = best("seconds"), best("triggerSeconds"), best("cpuSeconds"), []
    for name, rs in runs.items():
        base = BASELINE_SUM if name.endswith(" sum") or name == BASELINE_SUM else BASELINE
        if rs[0]["rows"] != events:
            say(f"WARNING: {name} consumed {rs[0]['rows']:,} rows, expected {events:,}")
        entry = {"name": name, "baseline": base, "seconds": round(wall[name], 3)}
        entry |= {"medianSeconds": round(statistics.median(r["seconds"] for r in rs), 3)}
        entry |= {"eventsPerSecond": round(events / wall[name], 1), "ratio": round(wall[base] / wall[name], 3)}
        entry |= {"batchSeconds": round(trigger[name], 3), "batchRatio": round(trigger[base] / trigger[name], 3)}
        entry |= {"cpuSeconds": round(cpu[name], 3), "cpuRatio": round(cpu[base] / cpu[name], 3)}
        entry |= {"batches": rs[0]["batches"], "runs": rs}
        if name == WITH_KEY_GROUP_COUNTS and "shard builtin count" in wall:
            entry["keyGroupCountsCost"] = round(1 - wall["shard builtin count"] / wall[name], 4)
            entry["keyGroupCountsCpuCost"] = round(1 - cpu["shard builtin count"] / cpu[name], 4)
            entry["keyGroupCountsTarget"] = KEY_GROUP_COUNTS_TARGET
        elif name not in BASELINES and name not in LAYOUTS:
            entry["target"] = TARGETS["builtin" if "builtin" in name else "python"]
            entry["meetsTarget"] = entry["ratio"] >= entry["target"]
        out.append(entry)
    return out


def report(args: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The table (each kind against its baseline), the Targets rows, the notes and the raw results of ``rows``."""
    columns = ["run", "compared with", "wall s", "median s", "events/s", "ratio", "batch-time ratio", "CPU s"]
    columns += ["CPU ratio", "target (on the wall ratio)"]
    table, targets = [], []
    for r in rows:
        name, goal, met = r["name"], r.get("target"), r.get("meetsTarget")
        verdict = "baseline" if name in BASELINES else f">= {goal}x: {'met' if met else 'MISSED'}" if goal else "-"
        numbers = [r[k] for k in ("seconds", "medianSeconds", "eventsPerSecond", "ratio", "batchRatio", "cpuSeconds")]
        table.append([name, "-" if name in BASELINES else r["baseline"], *numbers, r["cpuRatio"], verdict])
        cost, cpu = r.get("keyGroupCountsCost"), r.get("keyGroupCountsCpuCost")
        if cost is not None:
            bound = float(r.get("keyGroupCountsTarget") or KEY_GROUP_COUNTS_TARGET)
            value = f"{cost:.1%} of the wall time" + (f" ({cpu:.1%} of the CPU time)" if cpu == cpu else "")
            what = "per-key-group row counts (the load map, opt-in): throughput cost, builtin count, one run"
            targets.append(target(what, f"<= {bound:.0%}", value, cost <= bound, KEY_GROUP_COUNTS_WHY))
        if goal is not None:
            targets.append(target(f"{name} vs {r['baseline']}", f">= {goal}x", f"{r['ratio']:.2f}x", bool(met)))
    env = (
        f"{args.events:,} events, {args.keys:,} keys, {args.partitions} journal partitions, {args.batches} "
        f"micro-batches, local[2], shuffle partitions {args.shuffle_partitions}, RocksDB + changelog checkpointing, "
        f"availableNow, best of {args.repeat} rounds; {platform.machine()}, {os.cpu_count()} cores"
    )
    note = (
        "One SparkSession, every kind once per round after a warm-up round; ratio = the baseline's wall time / the "
        "kind's wall time (count kinds against Spark's groupBy(key).count(), sum kinds against "
        "groupBy(key).sum(amount)); 'wall s' is the best round, 'median s' the median over rounds."
    )
    return {
        "title": "Per-shard stateful throughput",
        "tables": [(f"Shard throughput: {env}", columns, no_nan(table))],
        "targets": targets,
        "notes": [note],
        "raw": no_nan({"environment": env, "results": rows}),
    }


def no_nan(obj: Any) -> Any:
    """Strict JSON: a dropped CPU sample (NaN) is null."""
    return json.loads(json.dumps(obj), parse_constant=lambda _: None)


def summarize(data: dict[str, Any]) -> list[str]:
    rows = data["raw"]["results"]
    ratios = ", ".join(f"{r['name']} {r['ratio']:.2f}x" for r in rows if r["name"] not in BASELINES)
    return [f"Wall-time ratio against its baseline, best round: {ratios}."]


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=7)
    ap.add_argument("--events", type=int, default=2_000_000, help="input events (default 2,000,000)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions (default 4)")
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds (best reported; default 2)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of: " + ", ".join(KINDS))
    args = parse(ap, argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spark_runtime.session import spark_session

    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    conf = {"spark.sql.shuffle.partitions": str(args.shuffle_partitions), "spark.ui.enabled": "false"}
    spark = spark_session("local[2]", conf, app_name="taskshard-bench")
    with LoadSampler() as load:
        rows = results(measure(args, spark, work, conf), args.events)
    spark.stop()
    bars = {f"{r['name']} ({r['ratio']:.2f}x)": r["eventsPerSecond"] for r in rows}
    xlabel = "events/s (best round; in brackets the wall ratio against its baseline)"
    bar_plot(args.out / "shard_throughput.png", bars, xlabel=xlabel, title="Shard throughput and Spark's own")
    publish("shard_throughput", args, argv, load=load.summary(), plots=["shard_throughput.png"], **report(args, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
