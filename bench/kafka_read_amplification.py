"""Kafka read amplification and CPU per event: every shard reading the whole topic vs key groups nested in the
topic's partitions (issue 7's measurement, issue 15's mode).

A script, not a test. A Kafka broker (KRaft, loopback, jars from Maven Central via ``hack/testinfra``) gets a
topic of ``--partitions`` partitions with ``--events`` JSON events over ``--keys`` keys, keyed by the event's key
field (``hack/testinfra/kafka.py produce()``; Kafka's default partitioner then keeps one key in one partition).
For each shard count n in ``--shards`` and each mode in ``--modes``, n shards tile ``[0, 128)`` and each runs the
shard runtime (``ShardRunner``, builtin count, Kafka source, directory sink, local storage) with the
``availableNow`` trigger over the whole topic, one after another in one SparkSession (with the Kafka connector on
its class path):

- ``everything``: ``source.kafka`` without ``partitionedByKey``: every shard subscribes to the whole topic and
  keeps its key groups ``pmod(hash(key), 128)`` natively, so amplification = n;
- ``partitioned``: ``partitionedByKey: true, partitions: <P>``: partition p holds key groups
  ``[p*128/P, (p+1)*128/P)`` and a shard ``assign``s only the partitions whose block meets its range; with 8 shards
  over 4 partitions two shards read each partition.

Measured per mode and shard count, from the shards' own observed metrics (``rowsRead``, ``bytesRead`` = key +
value bytes the connector fetched, summed over batches):

- read amplification (rows) = rows read by all shards / input events;
- read amplification (bytes) = bytes read by all shards / key + value bytes produced;
- owned rows: records counted by the shards (the per-key counts summed over all shards: equals the input
  when every record passed exactly one shard's key-group filter);
- seconds per shard (wall, JVM already warm);
- CPU seconds of this process tree without the broker (the Spark JVM, its Python workers and this Python driver,
  ``/proc``) from the first shard's start to the last shard's end, per million input events, by kind (JIT
  compiler threads, GC, the rest of the JVM, Python); and per shard run;
- CPU steal of the machine meanwhile (``/proc/stat``);
- a result check: the per-key counts across the n shards equal the input's.

The runs are interleaved (for each n: every mode), after a warm-up of one shard in each mode.

    .venv/bin/python bench/kafka_read_amplification.py --events 200000 --shards 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_OUT,
    LoadSampler,
    command_line,
    machine,
    print_table,
    pyplot,
    say,
    write_result,
)
from proc_cpu import CPU_KINDS, MachineCpu, TreeCpu, machine_between  # noqa: E402

MAX_KEY_GROUPS = 128
MODES = {"everything": "read everything", "partitioned": "partition-nested"}
"""``--modes`` values and their labels in the tables."""
TARGETS = {"amp4": 1.05, "amp8": 2.1, "cpu4": 1.3}
"""Issue 15's targets for the partition-nested mode (as in bench/scaling.py, the Kafka twins)."""


def tiling(n: int) -> list[tuple[int, int]]:
    step = MAX_KEY_GROUPS // n
    return [(i * step, MAX_KEY_GROUPS if i == n - 1 else (i + 1) * step) for i in range(n)]


def spark_with_connector(jars: list[Path]) -> Any:
    from pyspark.sql import SparkSession

    from spark_runtime.session import DEFAULT_CONF

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("taskshard-bench-kafka")
    conf = {**DEFAULT_CONF, "spark.driver.extraClassPath": os.pathsep.join(map(str, jars)), "spark.ui.enabled": "false"}
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def owned_per_shard(events: list[dict], placed: list[tuple[int, int]], n: int, partitions: int, nested: bool) -> list:
    """The input events each of the ``n`` shards owns, by the Task's key-group mapping (nested: in the partition
    the producer put each record)."""
    from spark_runtime.keygroups import KeyGrouping

    grouping = KeyGrouping(MAX_KEY_GROUPS, partitions if nested else None)
    step = MAX_KEY_GROUPS // n
    groups: dict[tuple[str, int], int] = {}
    out = [0] * n
    for e, (p, _) in zip(events, placed, strict=True):
        kg = groups.get((e["key"], p))
        if kg is None:
            kg = groups[(e["key"], p)] = grouping.of(e["key"], p)
        out[min(kg // step, n - 1)] += 1
    return out


def run_shards(
    spark: Any, broker: Any, topic: str, n: int, mode: str, partitions: int, work: Path, cpu: TreeCpu
) -> dict[str, Any]:
    from spark_runtime.config import parse_config
    from spark_runtime.results import final_results
    from spark_runtime.shard import ShardRunner

    task = f"{mode[:4]}{n}-{uuid.uuid4().hex[:6]}"
    source: dict[str, Any] = {"bootstrapServers": broker.bootstrap_servers, "topic": topic}
    if mode == "partitioned":
        source |= {"partitionedByKey": True, "partitions": partitions}
    shards = []
    machine0, before = MachineCpu(), cpu.reading()
    for start, end in tiling(n):
        cfg = parse_config(
            {
                "task": task,
                "shard": f"{task}-{start}-{end}",
                "maxKeyGroups": MAX_KEY_GROUPS,
                "keyGroups": {"start": start, "end": end},
                "processor": {"builtin": "count"},
                "source": {"kafka": source},
                "sink": {"directory": {"path": str(work / "out" / task)}},
                "storage": {"path": str(work / "state")},
                "terminationMessagePath": str(work / "termination"),
                "metricsPort": 0,  # several runtimes share this host: no metrics endpoint
            }
        )
        runner = ShardRunner(cfg, spark, available_now=True)
        r0, t0 = cpu.reading(threads=False), time.monotonic()
        runner.run(poll_interval=0.2)
        shards.append(
            {
                "shard": cfg.shard,
                "partitions": cfg.partitions_to_read or list(range(partitions)),
                "seconds": round(time.monotonic() - t0, 2),
                "cpuSeconds": round(cpu.seconds(r0, cpu.reading(threads=False)), 2),
                "rowsRead": runner.progress.source_metrics["rowsRead"],
                "bytesRead": runner.progress.source_metrics["bytesRead"],
            }
        )
    after = cpu.reading()
    kinds = cpu.kinds(before, after)
    total = cpu.seconds(before, after)
    steal = machine_between(machine0, MachineCpu())
    results = final_results(work / "out" / task, work / "state", task)
    owned = sum(int(v) for v in results.values())  # builtin count: every owned record counted once
    return {
        "mode": mode,
        "shards": n,
        "rowsRead": sum(s["rowsRead"] for s in shards),
        "bytesRead": sum(s["bytesRead"] for s in shards),
        "ownedRows": owned,
        "secondsPerShard": [s["seconds"] for s in shards],
        "cpuSeconds": round(total, 2),
        "cpuKinds": kinds,
        "machine": steal,
        "stealPercent": steal["stealPercent"],
        "perShard": shards,
        "results": results,
    }


def fit_fixed_cost(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Least squares ``CPU seconds = shared + n * perShard`` over the shard counts of one mode (nested: at most one
    shard per partition, so the topic is read once in total and ``perShard`` is what each shard run adds)."""
    pts = [(r["shards"], r["cpuSeconds"]) for r in rows]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return {"perShard": round(slope, 2), "shared": round(my - slope * mx, 2)}


def targets(measured: list[dict[str, Any]], partitions: int, input_bytes: int) -> list[dict[str, Any]]:
    """Issue 15's Kafka targets (partition-nested rows), and the read-everything amplification (reported)."""
    nested = {m["shards"]: m for m in measured if m["mode"] == "partitioned"}
    every = {m["shards"]: m for m in measured if m["mode"] == "everything"}
    out = []
    four = every.get(4)
    out.append(
        {
            "name": "read amplification with 4 shards, read everything (Kafka; reported, no target)",
            "target": "reported",
            "value": f"{four['bytesRead'] / input_bytes:.2f}x bytes" if four else "not measured",
            "met": bool(four and four["correct"]),
            "why": "every shard reads every partition and filters its key groups natively",
        }
    )

    def amp(n: int, name: str, limit: float) -> None:
        m = nested.get(n)
        if m is None:
            out.append({"name": name, "target": f"<= {limit}", "value": "not measured", "met": False})
            return
        value = m["bytesRead"] / input_bytes
        reads = ", ".join(f"{s['shard']} assigned {s['partitions']}" for s in m["perShard"])
        out.append(
            {
                "name": name,
                "target": f"<= {limit}",
                "value": f"{value:.2f} (bytes)",
                "met": value <= limit and m["correct"],
                "why": f"{reads}; {m['bytesRead']:,} bytes fetched of {input_bytes:,}",
            }
        )

    amp(4, "read amplification with 4 shards, partition-nested (Kafka)", TARGETS["amp4"])
    amp(8, f"read amplification with 8 shards over {partitions} partitions, partition-nested (Kafka)", TARGETS["amp8"])
    name = "CPU per million events, 4 shards vs 1, partition-nested (Kafka)"
    one, four = nested.get(1), nested.get(4)
    if one is None or four is None:
        out.append({"name": name, "target": f"<= {TARGETS['cpu4']}x", "value": "not measured", "met": False})
        return out
    ratio = four["cpuSeconds"] / one["cpuSeconds"]
    extra = {k: four["cpuKinds"][k] - one["cpuKinds"][k] for k in CPU_KINDS}
    parts = ", ".join(f"{k} {v:+.1f}" for k, v in sorted(extra.items(), key=lambda kv: -kv[1]))
    per_run = [s["cpuSeconds"] for s in four["perShard"]]
    out.append(
        {
            "name": name,
            "target": f"<= {TARGETS['cpu4']}x",
            "value": f"{ratio:.2f}x ({four['cpuSecondsPerMillion']:.1f} vs {one['cpuSecondsPerMillion']:.1f} "
            "CPU s / 1M events)",
            "met": ratio <= TARGETS["cpu4"],
            "why": (
                f"4 shards used {four['cpuSeconds']:.1f} CPU s vs {one['cpuSeconds']:.1f} for 1 "
                f"({four['cpuSeconds'] - one['cpuSeconds']:+.1f} s: {parts}); each of the 4 shard runs cost "
                f"{min(per_run):.1f}-{max(per_run):.1f} CPU s for a quarter of the topic, the 1-shard run "
                f"{one['perShard'][0]['cpuSeconds']:.1f} s for all of it: a shard run's fixed part (preflight and "
                "Kafka metadata, start offsets, query start and planning, the commit and the stop) is paid per shard"
            ),
        }
    )
    return out


def plot(measured: list[dict[str, Any]], path: Path, partitions: int) -> None:
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ns = sorted({m["shards"] for m in measured})
    modes = [mode for mode in MODES if any(m["mode"] == mode for m in measured)]
    colors = {"everything": "#4878a8", "partitioned": "#2ca02c"}
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        rows = {m["shards"]: m for m in measured if m["mode"] == mode}
        xs = [i + (j - (len(modes) - 1) / 2) * width for i, n in enumerate(ns) if n in rows]
        a1.bar(xs, [rows[n]["ampBytes"] for n in ns if n in rows], width, color=colors[mode], label=MODES[mode])
        a2.bar(xs, [rows[n]["cpuSecondsPerMillion"] for n in ns if n in rows], width, color=colors[mode])
        for x, n in zip(xs, [n for n in ns if n in rows], strict=True):
            a1.text(x, rows[n]["ampBytes"], f"{rows[n]['ampBytes']:.2f}", ha="center", va="bottom", fontsize=7)
            a2.text(
                x,
                rows[n]["cpuSecondsPerMillion"],
                f"{rows[n]['cpuSecondsPerMillion']:.0f}",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    a1.plot(range(len(ns)), ns, "k:", label="= shards")
    a1.plot(range(len(ns)), [max(1.0, n / partitions) for n in ns], "k--", lw=0.8, label="= shards per partition")
    for ax in (a1, a2):
        ax.set_xticks(range(len(ns)), [str(n) for n in ns])
        ax.set_xlabel("shards")
    a1.set_ylabel("bytes read / input bytes")
    a1.set_title(f"Kafka read amplification ({partitions} partitions)", fontsize=10)
    a1.legend(fontsize=8)
    a2.set_ylabel("CPU s per 1M input events")
    a2.set_title("CPU (Spark JVM + Python workers + driver)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="input events (default 200000)")
    p.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20000)")
    p.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    p.add_argument("--shards", default="1,2,4,8", help="shard counts (default 1,2,4,8)")
    p.add_argument(
        "--modes",
        default="everything,partitioned",
        help="comma-separated: everything (every shard reads the topic), partitioned (partitionedByKey: true); "
        "default both",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="result directory")
    args = p.parse_args(argv)
    args.out = args.out.absolute()
    counts = [int(x) for x in args.shards.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if [m for m in modes if m not in MODES]:
        p.error(f"--modes: {args.modes!r}; choose from {list(MODES)}")
    if "partitioned" in modes and MAX_KEY_GROUPS % args.partitions:
        p.error(f"--partitions: {args.partitions} must divide maxKeyGroups {MAX_KEY_GROUPS} with partitionedByKey")

    from testinfra.jars import spark_jars
    from testinfra.kafka import KafkaBroker

    jars = spark_jars(kafka=True, s3=False)
    work = Path(tempfile.mkdtemp(prefix="taskshard-bench-kafka-"))
    broker = KafkaBroker(work / "kafka").start()
    try:
        topic = f"bench-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, args.partitions)
        rng = random.Random(42)
        events = [{"key": f"k{rng.randrange(args.keys)}", "n": i} for i in range(args.events)]
        say(f"producing {args.events} events to {topic} ({args.partitions} partitions, keyed by the key field)")
        placed = broker.produce(topic, events)
        input_bytes = sum(len(e["key"]) + len(json.dumps(e, separators=(",", ":"))) for e in events)
        expected = Counter(e["key"] for e in events)
        key_partitions = Counter(len(ps) for ps in _partitions_per_key(events, placed).values())
        spark = spark_with_connector(jars)
        cpu = TreeCpu({"spark": os.getpid()}, exclude=broker.process.pid, interval=1.0)
        cpu.start()
        measured: list[dict[str, Any]] = []
        with LoadSampler() as load:
            for mode in modes:  # JVM, connector and planning warm-up, once per mode
                run_shards(spark, broker, topic, 1, mode, args.partitions, work / "warmup", cpu)
            for n in counts:
                for mode in modes:
                    say(f"{MODES[mode]}, {n} shard(s)")
                    m = run_shards(spark, broker, topic, n, mode, args.partitions, work / f"{mode}-{n}", cpu)
                    m["correct"] = m.pop("results") == dict(expected)
                    owned = owned_per_shard(events, placed, n, args.partitions, mode == "partitioned")
                    for s, o in zip(m["perShard"], owned, strict=True):
                        s["ownedEvents"] = o
                    measured.append(m)
                    say(
                        f"{MODES[mode]}, {n} shard(s): amplification {m['bytesRead'] / input_bytes:.2f} (bytes), "
                        f"{m['cpuSeconds']:.1f} CPU s, steal {m['stealPercent']}%, exact={m['correct']}"
                    )
        cpu.stop()
        spark.stop()
    finally:
        broker.stop()

    measured.sort(key=lambda m: (list(MODES).index(m["mode"]), m["shards"]))
    for m in measured:
        m["ampRows"] = round(m["rowsRead"] / args.events, 3)
        m["ampBytes"] = round(m["bytesRead"] / input_bytes, 3)
        m["cpuSecondsPerMillion"] = round(m["cpuSeconds"] / args.events * 1e6, 2)
    for m in measured:
        one = next((o for o in measured if o["mode"] == m["mode"] and o["shards"] == 1), None)
        m["cpuRatio"] = round(m["cpuSeconds"] / one["cpuSeconds"], 3) if one else None
    # Nested, only the counts with at most one shard per partition: beyond, partitions are read more than once.
    fits = {
        mode: fit_fixed_cost(
            [m for m in measured if m["mode"] == mode and (mode == "everything" or m["shards"] <= args.partitions)]
        )
        for mode in modes
    }
    columns = [
        "mode",
        "shards",
        "rows read",
        "bytes read",
        "amplification (rows)",
        "amplification (bytes)",
        "owned rows",
        "s per shard",
        "CPU s",
        "CPU s / 1M events",
        "CPU vs 1 shard",
        "CPU s per shard run (min-max)",
        "CPU steal %",
        "results exact",
    ]
    rows = []
    for m in measured:
        per_run = [s["cpuSeconds"] for s in m["perShard"]]
        rows.append(
            [
                MODES[m["mode"]],
                m["shards"],
                m["rowsRead"],
                m["bytesRead"],
                m["ampRows"],
                m["ampBytes"],
                m["ownedRows"],
                round(sum(m["secondsPerShard"]) / len(m["secondsPerShard"]), 1),
                m["cpuSeconds"],
                m["cpuSecondsPerMillion"],
                m["cpuRatio"],
                f"{min(per_run):.1f}-{max(per_run):.1f}",
                m["stealPercent"],
                "yes" if m["correct"] else "NO",
            ]
        )
    kind_columns = ["mode", "shards", *[f"{k} s" for k in CPU_KINDS], "total CPU s"]
    kind_rows = [
        [MODES[m["mode"]], m["shards"], *[m["cpuKinds"][k] for k in CPU_KINDS], m["cpuSeconds"]] for m in measured
    ]
    summary = load.summary()
    title = f"Kafka read amplification ({args.events} events, {args.partitions} partitions, {input_bytes} bytes)"
    print_table(title, columns, rows, summary)
    kinds_title = f"{title}: where the CPU went (Spark JVM, Python workers and driver; broker excluded)"
    print_table(kinds_title, kind_columns, kind_rows)
    goals = targets(measured, args.partitions, input_bytes)
    for g in goals:
        say(f"target {g['name']}: {g['value']} ({g['target']}): {'met' if g['met'] else 'MISSED'}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot(measured, args.out / "kafka_read_amplification.png", args.partitions)
    write_result(
        args.out,
        "kafka_read_amplification",
        {
            "title": "Kafka read amplification",
            "command": command_line(argv),
            "parameters": vars(args) | {"out": str(args.out)},
            "machine": machine(),
            "load": summary,
            "tables": [
                {"title": title, "columns": columns, "rows": rows},
                {"title": kinds_title, "columns": kind_columns, "rows": kind_rows},
            ],
            "targets": goals,
            "plots": ["kafka_read_amplification.png"],
            "notes": [
                "Modes: 'read everything' subscribes every shard to the whole topic; 'partition-nested' declares "
                f"partitionedByKey: true, partitions: {args.partitions} (maxKeyGroups {MAX_KEY_GROUPS}), and each "
                "shard assigns only the partitions whose key-group block meets its range. The topic is keyed by "
                "the key field (Kafka's default partitioner): "
                + ", ".join(f"{c:,} keys in {k} partition(s)" for k, c in sorted(key_partitions.items()))
                + ".",
                "rows/bytes read: the shards' observed metrics (rowsRead, bytesRead = key + value bytes the Kafka "
                "connector delivered, before the key-group filter), summed over batches and shards.",
                "owned rows: the per-key counts of all shards' final results summed: equals the input when every "
                "record passed exactly one shard's key-group filter.",
                "Shards run one after another with the availableNow trigger in one warm SparkSession; a warm-up "
                "run with 1 shard in each mode comes first, and the runs are interleaved (for each n, every mode).",
                "CPU = user+system seconds (/proc) of this benchmark's process tree without the broker's: the Spark "
                "JVM, its Python workers and the Python driver that runs each ShardRunner, from the first shard's "
                "start to the last shard's end (final results not included), sampled every second by proc_cpu.TreeCpu "
                "(a process that exits counts through its parent's reaped-children time, or by its last sample "
                "where the parent ignores SIGCHLD, as Spark's Python daemon does). The shards run "
                "one after another, so "
                "'CPU s per shard run' is each shard's own start-to-end cost.",
                "CPU steal % = the share of this VM's CPU time the hypervisor gave to other guests meanwhile "
                "(/proc/stat).",
            ],
            "raw": {
                "inputBytes": input_bytes,
                "partitions": args.partitions,
                "keysByPartitionCount": dict(key_partitions),
                "fixedCostFit": fits,
                "results": measured,
            },
        },
    )
    return 0 if all(m["correct"] for m in measured) else 1


def _partitions_per_key(events: list[dict], placed: list[tuple[int, int]]) -> dict[str, set[int]]:
    """The partitions each key was produced to (one per key when the topic is keyed by the key field)."""
    out: dict[str, set[int]] = {}
    for e, (p, _) in zip(events, placed, strict=True):
        out.setdefault(e["key"], set()).add(p)
    return out


if __name__ == "__main__":
    sys.exit(main())
