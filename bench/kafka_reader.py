"""Our Kafka reader against Spark's: records/s of one streaming query over one topic, read by our PySpark data source
``taskshard_kafka`` (``spark_runtime.sources.kafka_stream.KafkaDataSource``, confluent-kafka) and by Spark's
built-in Kafka source (``format("kafka")``).

A local broker (``hack/testinfra``) holds ``--records`` JSON records over ``--keys`` keys (``k<i>``, record key =
the key field) in a topic of ``--partitions`` partitions, produced once. Both readers run the same query in one
SparkSession (``spark_runtime.session.spark_session``, local[2], Spark's Kafka connector on the driver's class path):
``groupBy(key cast to string).count()`` into a memory sink (complete mode), ``trigger(availableNow=True)``, a fresh
checkpoint per run, from each partition's first offset. Ours: ``topic``, ``kafkaClientSecret`` (bootstrap servers,
``isolation.level=read_uncommitted``), no ``startPositions`` (each partition's first offset), a drain marker that
never exists. Spark's: ``kafka.bootstrap.servers``, ``subscribe``, ``startingOffsets=earliest``,
``failOnDataLoss=true``. Both read one Spark task per partition.

An untimed warm-up runs both readers on a small topic; then ``--reps`` rounds alternate the order ABBA-style (round
0: Spark's, ours; round 1: ours, Spark's; ...). Each run's per-key counts must equal what was produced (else the
benchmark fails). Wall seconds = ``start()`` to ``awaitTermination()``; records/s = input rows (the query's
progress) / wall seconds; the target compares the medians. "addBatch s": the progress' addBatch (the read, the
aggregation, the state commit); "outside triggers s": wall seconds minus every trigger's triggerExecution (the
query's start, its source's initial offsets, and its stop). CPU = user + system seconds (/proc,
``proc_cpu.TreeCpu``) of this process tree (driver Python, the JVM, Spark's Python workers) without the broker,
and separately the broker's, over each run. Steal % = the hypervisor's share of this VM's CPU time (/proc/stat).
Writes ``<out>/kafka_reader.{json,png}``.

    .venv/bin/python bench/kafka_reader.py --records 1000000 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LoadSampler, fmt, median, method_notes, options, parse, publish, pyplot, ratio, say, target  # noqa: E402
from proc_cpu import CPU_KINDS, MachineCpu, TreeCpu, machine_between, proc_stat  # noqa: E402

OURS, SPARK = "ours", "spark"
LABELS = {OURS: "taskshard_kafka (ours)", SPARK: 'Spark\'s format("kafka")'}
WARMUP_RECORDS = 20_000
TARGET = 0.95
COLORS = {OURS: "#4c72b0", SPARK: "#dd8452"}
BROKER_COLOR = "#999999"


def produce(bootstrap: str, topic: str, n: int, keys: int, seed: int) -> Counter:
    """``n`` small JSON records keyed ``k<i>`` (``keys`` keys, drawn at random), batched; the per-key counts."""
    from testinfra.kafka import _confluent

    errors: list[str] = []
    producer = _confluent().Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "acks": "all",
            "error_cb": lambda e: errors.append(str(e)),
        }
    )
    rng = random.Random(seed)
    counts: Counter = Counter()
    t0 = time.monotonic()
    for i in range(n):
        k = rng.randrange(keys)
        counts[f"k{k}"] += 1
        value = b'{"key":"k%d","seq":%d,"amount":%d,"note":"bench"}' % (k, i, i % 997)
        while True:
            try:
                producer.produce(topic, value, b"k%d" % k)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 20_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"producing {topic}: {left} undelivered, errors {errors[:3]}")
    say(f"produced {n:,} records over {keys:,} keys to {topic} in {time.monotonic() - t0:.1f} s")
    return counts


def reader(spark: Any, side: str, bootstrap: str, topic: str, work: Path) -> Any:
    """The raw stream of ``topic`` through our data source or Spark's."""
    if side == SPARK:
        r = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
        return r.option("startingOffsets", "earliest").option("failOnDataLoss", "true").load()
    from spark_runtime.sources.kafka_stream import FORMAT

    secret = {"bootstrap.servers": bootstrap, "isolation.level": "read_uncommitted", "log_level": 3}
    opts = {"topic": topic, "kafkaClientSecret": json.dumps(secret), "startPositions": ""}
    opts["drainMarker"] = str(work / "no-drain")  # never created: no drain holds a batch back
    return spark.readStream.format(FORMAT).options(**opts).load()


def broker_cpu(pid: int) -> float | None:
    st = proc_stat(f"/proc/{pid}/stat")
    return None if st is None else st[1]


def run_query(spark: Any, side: str, bootstrap: str, topic: str, work: Path, cpu: TreeCpu, broker_pid: int) -> dict:
    """One availableNow run of ``groupBy(key).count()``: its measurements and its per-key counts (``counts``)."""
    from pyspark.sql import functions as F

    name = f"q_{side}_{uuid.uuid4().hex[:8]}"
    checkpoint = work / "checkpoints" / name
    counts = reader(spark, side, bootstrap, topic, work).select(F.col("key").cast("string").alias("key"))
    writer = counts.groupBy("key").count().writeStream.format("memory").queryName(name).outputMode("complete")
    writer = writer.trigger(availableNow=True).option("checkpointLocation", str(checkpoint))
    machine0, before, broker0 = MachineCpu(), cpu.reading(), broker_cpu(broker_pid)
    t0 = time.perf_counter()
    query = writer.start()
    started = time.perf_counter() - t0
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    after, broker1, steal = cpu.reading(), broker_cpu(broker_pid), machine_between(machine0, MachineCpu())
    if query.exception() is not None:
        raise RuntimeError(f"{LABELS[side]}: the query failed: {query.exception()}")
    progress = [json.loads(p.json) for p in query.recentProgress]
    triggers = sum(int((p.get("durationMs") or {}).get("triggerExecution", 0)) for p in progress) / 1000
    progress = [p for p in progress if p["numInputRows"] > 0]
    durations: Counter = Counter()
    for p in progress:
        durations.update({k: int(v) for k, v in (p.get("durationMs") or {}).items()})
    rows = sum(int(p["numInputRows"]) for p in progress)
    result = {str(r["key"]): int(r["count"]) for r in spark.table(name).collect()}
    spark.catalog.dropTempView(name)
    shutil.rmtree(checkpoint, ignore_errors=True)
    cpu_s = cpu.seconds(before, after)
    return {
        "reader": side,
        "records": rows,
        "seconds": round(seconds, 3),
        "recordsPerSecond": round(rows / seconds, 1) if seconds > 0 else None,
        "cpuSeconds": round(cpu_s, 2),
        "cpuKinds": cpu.kinds(before, after),
        "brokerCpuSeconds": round(broker1 - broker0, 2) if broker0 is not None and broker1 is not None else None,
        "stealPercent": steal["stealPercent"],
        "machine": steal,
        "batches": len(progress),
        "durationMs": dict(durations),
        "startSeconds": round(started, 3),
        "outsideTriggersSeconds": round(seconds - triggers, 3),
        "counts": result,
    }


def check(run: dict[str, Any], expected: Counter, produced: int) -> None:
    """Fail loudly unless the run read every record and counted each key exactly as produced."""
    got = run.pop("counts")
    wrong = {k: (got.get(k), expected.get(k)) for k in set(got) | set(expected) if got.get(k) != expected.get(k)}
    run["countsExact"] = not wrong and run["records"] == produced
    if not run["countsExact"]:
        sample = dict(sorted(wrong.items())[:5])
        raise RuntimeError(
            f"{LABELS[run['reader']]}: {run['records']:,} input rows for {produced:,} produced; {len(wrong):,} keys "
            f"counted wrong (key: (counted, produced), first 5: {sample})"
        )


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A broker and the topics, the warm-up, then the ABBA rounds; the measured runs and the facts."""
    from spark_runtime.session import spark_session
    from spark_runtime.sources.kafka_stream import KafkaDataSource
    from testinfra.jars import spark_jars
    from testinfra.kafka import KafkaBroker

    jars = os.pathsep.join(map(str, spark_jars(kafka=True, s3=False)))
    work = Path(tempfile.mkdtemp(prefix="taskshard-bench-kafka-reader-"))
    broker = KafkaBroker(work / "kafka").start()
    ok = False
    try:
        bootstrap, broker_pid = broker.bootstrap_servers, broker.process.pid
        tag = uuid.uuid4().hex[:6]
        topic, warm = f"bench-{tag}", f"bench-warm-{tag}"
        broker.create_topic(topic, args.partitions)
        expected = produce(bootstrap, topic, args.records, args.keys, args.seed)
        warm_records = min(WARMUP_RECORDS, args.records)
        broker.create_topic(warm, args.partitions)
        warm_expected = produce(bootstrap, warm, warm_records, min(args.keys, warm_records), args.seed + 1)
        conf = {"spark.driver.extraClassPath": jars}
        spark = spark_session("local[2]", conf, app_name="taskshard-bench-kafka-reader")
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(KafkaDataSource)
        cpu = TreeCpu({"spark": os.getpid()}, exclude=broker_pid, interval=0.5)
        cpu.start()
        runs: list[dict[str, Any]] = []
        with LoadSampler() as load:
            for side in (SPARK, OURS):  # JVM, connector, Python workers and planning: untimed
                r = run_query(spark, side, bootstrap, warm, work, cpu, broker_pid)
                check(r, warm_expected, warm_records)
                say(f"warm-up {LABELS[side]}: {r['records']:,} records in {r['seconds']:.2f} s")
            for rep in range(args.reps):
                for side in (SPARK, OURS) if rep % 2 == 0 else (OURS, SPARK):
                    r = run_query(spark, side, bootstrap, topic, work, cpu, broker_pid)
                    check(r, expected, args.records)
                    r["rep"] = rep
                    runs.append(r)
                    say(
                        f"round {rep} {LABELS[side]}: {r['records']:,} records in {r['seconds']:.2f} s "
                        f"({r['recordsPerSecond']:,.0f}/s), CPU {r['cpuSeconds']:.1f} s, broker CPU "
                        f"{r['brokerCpuSeconds']} s, {r['batches']} batch(es), per-key counts exact"
                    )
        cpu.stop()
        spark.stop()
        ok = True
    finally:
        broker.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work} for inspection (the broker's log: {broker.process.log_path})")
    facts = {"topic": topic, "warmupRecords": warm_records, "load": load.summary()}
    return runs, facts


# ---------------------------------------------------------------- the report


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per reader: the medians of its runs (records/s, seconds, CPU, broker CPU, addBatch, CPU by kind)."""
    out: dict[str, dict[str, Any]] = {}
    for side in (OURS, SPARK):
        rs = [r for r in runs if r["reader"] == side]
        if not rs:
            continue
        out[side] = {k: median([r[k] for r in rs]) for k in ("recordsPerSecond", "seconds", "cpuSeconds")}
        out[side]["brokerCpuSeconds"] = median([r["brokerCpuSeconds"] for r in rs])
        out[side]["addBatchSeconds"] = median([r["durationMs"].get("addBatch", 0) / 1000 for r in rs])
        out[side]["outsideTriggersSeconds"] = median([r.get("outsideTriggersSeconds") for r in rs])
        out[side]["cpuKinds"] = {k: median([r["cpuKinds"][k] for r in rs]) for k in CPU_KINDS}
        out[side]["runs"] = len(rs)
    return out


RUN_COLUMNS = [
    "round",
    "reader",
    "records",
    "seconds",
    "records/s",
    "vs Spark's (same round)",
    "CPU s (Spark, not the broker)",
    "CPU s / 1M records",
    "broker CPU s",
    "batches",
    "CPU steal %",
    "per-key counts",
]


def run_rows(runs: list[dict[str, Any]], med: dict[str, dict[str, Any]], records: int) -> list[list[Any]]:
    rows = []
    for r in runs:
        base = next((o for o in runs if o["rep"] == r["rep"] and o["reader"] == SPARK), None)
        vs = ratio(r["recordsPerSecond"], base["recordsPerSecond"] if base else None)
        per_m = round(r["cpuSeconds"] / r["records"] * 1e6, 2) if r["records"] else None
        cells = [r["seconds"], r["recordsPerSecond"], vs, r["cpuSeconds"], per_m, r["brokerCpuSeconds"]]
        exact = "exact" if r["countsExact"] else "WRONG"
        rows.append([r["rep"], LABELS[r["reader"]], r["records"], *cells, r["batches"], r["stealPercent"], exact])
    spark_rate = med.get(SPARK, {}).get("recordsPerSecond")
    for side, m in med.items():
        per_m = round(m["cpuSeconds"] / records * 1e6, 2) if m["cpuSeconds"] is not None else None
        vs = ratio(m["recordsPerSecond"], spark_rate)
        cells = [m["seconds"], m["recordsPerSecond"], vs, m["cpuSeconds"], per_m, m["brokerCpuSeconds"]]
        rows.append([f"median of {m['runs']}", LABELS[side], records, *cells, None, None, None])
    return rows


def kinds_rows(med: dict[str, dict[str, Any]]) -> list[list[Any]]:
    return [
        [LABELS[side], m["seconds"], m["addBatchSeconds"], m["outsideTriggersSeconds"]]
        + [*(m["cpuKinds"][k] for k in CPU_KINDS), m["cpuSeconds"]]
        + [m["brokerCpuSeconds"]]
        for side, m in med.items()
    ]


KINDS_COLUMNS = [
    "reader",
    "seconds",
    "addBatch s",
    "outside triggers s",
    *(f"{k} CPU s" for k in CPU_KINDS),
    "CPU s (Spark)",
    "broker CPU s",
]


def spent_on(med: dict[str, dict[str, Any]]) -> str:
    """What a run's time and CPU go to, per reader (the medians), for the target's note."""
    parts = []
    for side, m in med.items():
        kinds = ", ".join(f"{k} {m['cpuKinds'][k]:.1f}" for k in CPU_KINDS)
        parts.append(
            f"{LABELS[side]}: {m['seconds']:.2f} s wall of which addBatch (the read, the aggregation, the state "
            f"commit) {m['addBatchSeconds']:.2f} s and outside any trigger (query start and stop) "
            f"{fmt(m['outsideTriggersSeconds'])} s; {m['cpuSeconds']:.1f} CPU s in Spark ({kinds}), "
            f"{fmt(m['brokerCpuSeconds'])} s in the broker"
        )
    return "per run (medians) " + "; ".join(parts)


def goals(args: argparse.Namespace, med: dict[str, dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict]:
    ours, spark = med[OURS]["recordsPerSecond"], med[SPARK]["recordsPerSecond"]
    r = ratio(ours, spark)
    value = f"{r:.2f}x ({ours:,.0f} vs {spark:,.0f} records/s, medians)"
    exact = all(x["countsExact"] for x in runs)
    name = "records/s, our Kafka reader vs Spark's Kafka source (same query)"
    return [target(name, f">= {TARGET}x", value, bool(r is not None and r >= TARGET and exact), spent_on(med))]


def plot(path: Path, runs: list[dict[str, Any]], title: str) -> None:
    """Records/s and CPU seconds (this process tree, and the broker's) of each run, in the order they ran."""
    plt = pyplot()
    from matplotlib.patches import Patch

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [f"{r['rep']}: {'ours' if r['reader'] == OURS else 'Spark'}" for r in runs]
    colors = [COLORS[r["reader"]] for r in runs]
    left.bar(names, [r["recordsPerSecond"] for r in runs], color=colors)
    left.set_ylabel("records/s")
    left.set_title("throughput per run (round: reader)")
    spark_cpu = [r["cpuSeconds"] for r in runs]
    broker = [r["brokerCpuSeconds"] or 0.0 for r in runs]
    right.bar(names, spark_cpu, color=colors)
    right.bar(names, broker, bottom=spark_cpu, color=BROKER_COLOR)
    right.set_ylabel("CPU seconds")
    right.set_title("CPU per run: this process tree (driver, JVM, Python workers), then the broker")
    right.title.set_fontsize(9)
    handles = [Patch(color=COLORS[side], label=LABELS[side]) for side in (OURS, SPARK)]
    left.legend(handles=handles, fontsize=8, loc="lower right")
    right.legend(handles=[*handles, Patch(color=BROKER_COLOR, label="broker")], fontsize=8, loc="lower right")
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(data: dict[str, Any]) -> list[str]:
    """The page's findings for ``kafka_reader.json``."""
    runs = data["raw"]["runs"]
    med = medians(runs)
    ours, spark = med[OURS], med[SPARK]
    exact = "exact" if all(r["countsExact"] for r in runs) else "WRONG"
    out = [
        f"Our reader ran `groupBy(key).count()` at {ours['recordsPerSecond']:,.0f} records/s against "
        f"{spark['recordsPerSecond']:,.0f} for Spark's Kafka source "
        f"({ratio(ours['recordsPerSecond'], spark['recordsPerSecond']):.2f}x, medians of {ours['runs']} run(s) each, "
        f"ABBA order), per-key counts {exact} in every run.",
        f"CPU per run (this process tree, medians): ours {ours['cpuSeconds']:.1f} s vs {spark['cpuSeconds']:.1f} s "
        f"({ratio(ours['cpuSeconds'], spark['cpuSeconds']):.2f}x); the broker's: {fmt(ours['brokerCpuSeconds'])} s "
        f"vs {fmt(spark['brokerCpuSeconds'])} s.",
    ]
    py = ours["cpuKinds"]["Python"], spark["cpuKinds"]["Python"]
    out.append(
        f"Python processes' CPU (driver and workers): ours {py[0]:.1f} s vs {py[1]:.1f} s: our reader decodes "
        "records in Spark's Python workers (librdkafka into Arrow batches), Spark's in the JVM."
    )
    if ours.get("outsideTriggersSeconds") is not None and spark.get("outsideTriggersSeconds") is not None:
        out.append(
            f"Outside the micro-batches (the query's start and stop) a run spent "
            f"{ours['outsideTriggersSeconds']:.2f} s "
            f"with ours vs {spark['outsideTriggersSeconds']:.2f} s with Spark's: a Python data source starts a Python "
            "process on the driver per query to plan it (initial offsets, availableNow's end), a fixed cost per query "
            "that weighs more the fewer records a run reads."
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=7)
    ap.add_argument("--records", type=int, default=1_000_000, help="records in the topic (default 1,000,000)")
    ap.add_argument("--partitions", type=int, default=4, help="the topic's partitions (default 4)")
    ap.add_argument("--keys", type=int, default=50_000, help="distinct keys (default 50,000)")
    ap.add_argument("--reps", type=int, default=2, help="measured rounds, each runs both readers, ABBA (default 2)")
    args = parse(ap, argv)
    runs, facts = measure(args)
    med = medians(runs)
    title = f"{args.records:,} records, {args.partitions} partitions, {args.keys:,} keys: groupBy(key).count()"
    plot(args.out / "kafka_reader.png", runs, title)
    publish(
        "kafka_reader",
        args,
        argv,
        title="Our Kafka reader against Spark's Kafka source",
        load=facts.pop("load"),
        tables=[
            (f"{title}, availableNow, local[2]", RUN_COLUMNS, run_rows(runs, med, args.records)),
            (f"{title}: where a run's time and CPU go (medians)", KINDS_COLUMNS, kinds_rows(med)),
        ],
        targets=goals(args, med, runs),
        plots=["kafka_reader.png"],
        notes=method_notes(__doc__),
        raw=facts | {"runs": runs, "medians": med},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
