"""Kafka read amplification and CPU per event (issue 7; partition-nested, issue 15): ``bench/scaling.py``'s
measurement on a topic of a local broker (``hack/testinfra``) keyed by the key field. For each shard count and mode
(interleaved, after a 1-shard warm-up per mode) the shards run one after another in one SparkSession
(``ShardRunner``, builtin count, ``availableNow``); their observed metrics give rows and bytes read.

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

import scaling as sc  # noqa: E402
from common import LoadSampler, publish, say, target  # noqa: E402
from proc_cpu import MachineCpu, TreeCpu, machine_between  # noqa: E402
from scaling import MODES  # noqa: E402


def run_shards(spark: Any, broker: Any, topic: str, n: int, mode: str, partitions: int, work: Path, cpu: TreeCpu):
    """n shards in ``mode``, one after another: what each read, its seconds and CPU, and the final results."""
    from spark_runtime.config import parse_config
    from spark_runtime.results import final_results
    from spark_runtime.shard import ShardRunner

    task = f"{mode[:4]}{n}-{uuid.uuid4().hex[:6]}"
    source: dict[str, Any] = {"bootstrapServers": broker.bootstrap_servers, "topic": topic}
    if mode == "partitioned":
        source |= {"partitionedByKey": True, "partitions": partitions}
    sink = {"directory": {"path": str(work / "out" / task)}}
    shards = []
    machine0, before = MachineCpu(), cpu.reading()
    for start, end in sc.tiling(n):
        cfg = parse_config(
            sc.shard_config(work, task, f"{task}-{start}-{end}", (start, end), {"kafka": source}, sink=sink)
        )
        runner = ShardRunner(cfg, spark, available_now=True)
        r0, t0 = cpu.reading(threads=False), time.monotonic()
        runner.run(poll_interval=0.2)
        seconds, cpu_s = round(time.monotonic() - t0, 2), round(cpu.seconds(r0, cpu.reading(threads=False)), 2)
        read = {k: runner.progress.source_metrics[k] for k in ("rowsRead", "bytesRead")}
        parts = cfg.partitions_to_read or list(range(partitions))
        shards.append({"shard": cfg.shard, "partitions": parts, "seconds": seconds, "cpuSeconds": cpu_s} | read)
    after = cpu.reading()
    steal = machine_between(machine0, MachineCpu())
    results = final_results(work / "out" / task, work / "state", task)
    return (
        {"mode": mode, "shards": n}
        | {k: sum(s[k] for s in shards) for k in ("rowsRead", "bytesRead")}
        | {"ownedRows": sum(int(v) for v in results.values())}  # builtin count: each owned record counted once
        | {"secondsPerShard": [s["seconds"] for s in shards], "cpuSeconds": round(cpu.seconds(before, after), 2)}
        | {"cpuKinds": cpu.kinds(before, after), "machine": steal, "stealPercent": steal["stealPercent"]}
        | {"perShard": shards, "results": results}
    )


def measure(args: argparse.Namespace, counts: list[int], modes: list[str]) -> tuple[list[dict], dict[str, Any]]:
    """A broker and a topic, then every run; the runs and the input's facts (bytes, keys per partition count)."""
    from spark_runtime.session import spark_session
    from testinfra.jars import spark_jars
    from testinfra.kafka import KafkaBroker

    jars = os.pathsep.join(map(str, spark_jars(kafka=True, s3=False)))
    work = Path(tempfile.mkdtemp(prefix="taskshard-bench-kafka-"))
    broker = KafkaBroker(work / "kafka").start()
    try:
        topic = f"bench-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, args.partitions)
        rng = random.Random(args.seed)
        events = [{"key": f"k{rng.randrange(args.keys)}", "n": i} for i in range(args.events)]
        say(f"producing {args.events} events to {topic} ({args.partitions} partitions, keyed by the key field)")
        placed = Counter((e["key"], p) for e, (p, _) in zip(events, broker.produce(topic, events), strict=True))
        input_bytes = sum(len(e["key"]) + len(json.dumps(e, separators=(",", ":"))) for e in events)
        expected = Counter(e["key"] for e in events)
        spark = spark_session("local[2]", {"spark.driver.extraClassPath": jars}, app_name="taskshard-bench-kafka")
        spark.sparkContext.setLogLevel("ERROR")
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
                    m["correct"], m["inputBytes"] = m.pop("results") == dict(expected), input_bytes
                    owned = sc.owned_events(placed, n, args.partitions, mode == "partitioned")
                    for s, o in zip(m["perShard"], owned, strict=True):
                        s["ownedEvents"] = o
                    measured.append(m)
                    say(f"{m['bytesRead'] / input_bytes:.2f}x bytes, {m['cpuSeconds']:.1f} CPU s, exact={m['correct']}")
        cpu.stop()
        spark.stop()
    finally:
        broker.stop()
    keys = Counter(Counter(k for k, _ in placed).values())  # how many keys were produced to 1, 2, ... partitions
    return measured, {"inputBytes": input_bytes, "keysByPartitionCount": dict(keys), "load": load.summary()}


COLUMNS = (
    "mode|shards|rows read|bytes read|amplification (rows)|amplification (bytes)|owned rows|s per shard|CPU s|"
    "CPU s / 1M events|CPU vs 1 shard|CPU s per shard run (min-max)|CPU steal %|results exact"
)


def row(m: dict[str, Any]) -> list[Any]:
    seconds, ok = round(sum(m["secondsPerShard"]) / len(m["secondsPerShard"]), 1), "yes" if m["correct"] else "NO"
    read = [m[k] for k in ("shards", "rowsRead", "bytesRead", "ampRows", "ampBytes", "ownedRows")]
    cpu = [m[k] for k in ("cpuSeconds", "cpuSecondsPerMillion", "cpuRatio")]
    return [MODES[m["mode"]], *read, seconds, *cpu, "{:.1f}-{:.1f}".format(*runs(m)), m["stealPercent"], ok]


def runs(m: dict[str, Any]) -> tuple[float, float]:  # the least and the most CPU s one shard run cost
    per_run = [s["cpuSeconds"] for s in m["perShard"]]
    return min(per_run), max(per_run)


def goals(measured: list[dict[str, Any]], partitions: int) -> list[dict[str, Any]]:
    """Issue 15's Kafka targets (partition-nested rows), after the read-everything amplification (reported)."""
    four = next((m for m in measured if m["mode"] == "everything" and m["shards"] == 4), None)
    value = f"{four['bytesRead'] / four['inputBytes']:.2f}x bytes" if four else "not measured"
    name = "read amplification with 4 shards, read everything (Kafka; reported, no target)"
    every = target(name, "reported", value, bool(four and four["correct"]))

    def cpu_why(one: dict[str, Any], four: dict[str, Any]) -> str:
        return (
            "each of the 4 shard runs cost {:.1f}-{:.1f} CPU s for a quarter of the topic, ".format(*runs(four))
            + f"the 1-shard run {one['perShard'][0]['cpuSeconds']:.1f} s for all of it: a shard run's fixed part "
            "(preflight and Kafka metadata, start offsets, query start and planning, the commit and the stop) is "
            "paid per shard"
        )

    amp = lambda m: m["bytesRead"] / m["inputBytes"]  # noqa: E731
    return [every, *sc.nested_targets(measured, partitions, amp, cpu_why, " (Kafka)")]


def notes(args: argparse.Namespace, keys: dict[int, int]) -> list[str]:
    produced = ", ".join(f"{c:,} keys in {k} partition(s)" for k, c in sorted(keys.items()))
    return [
        f"'partition-nested' declares partitionedByKey: true, partitions: {args.partitions}: a shard assigns only the "
        f"partitions whose key-group block meets its range. {produced}. Rows/bytes read: the shards' observed "
        "metrics (bytesRead = key + value bytes), summed; owned rows: their per-key counts summed.",
        "CPU = user+system seconds (/proc, proc_cpu.TreeCpu) of this process tree without the broker, from the first "
        "shard's start to the last one's end (shards run one after another, availableNow, one warm JVM). Steal % = "
        "the hypervisor's share of this VM's CPU time (/proc/stat).",
    ]


def main(argv: list[str] | None = None) -> int:
    args, counts, modes = sc.parse_modes(sc.mode_options(__doc__, events=200_000, keys=20_000, seed=42), argv)
    measured, facts = measure(args, counts, modes)
    measured.sort(key=lambda m: (list(MODES).index(m["mode"]), m["shards"]))
    for m in measured:
        m["ampRows"] = round(m["rowsRead"] / args.events, 3)
        m["ampBytes"] = round(m["bytesRead"] / facts["inputBytes"], 3)
        m["cpuSecondsPerMillion"] = round(m["cpuSeconds"] / args.events * 1e6, 2)
        one = next((o for o in measured if o["mode"] == m["mode"] and o["shards"] == 1), None)
        m["cpuRatio"] = round(m["cpuSeconds"] / one["cpuSeconds"], 3) if one else None
    fits = {m: sc.fit_fixed_cost(sc.read_once(measured, m, args.partitions)) for m in modes}
    title = (
        f"Kafka read amplification ({args.events} events, {args.partitions} partitions, {facts['inputBytes']} bytes)"
    )
    sc.plot_amplification(measured, args.out / "kafka_read_amplification.png", "ampBytes", title)
    publish(
        "kafka_read_amplification",
        args,
        argv,
        title="Kafka read amplification",
        load=facts.pop("load"),
        tables=[
            (title, COLUMNS.split("|"), [row(m) for m in measured]),
            sc.kinds_table(f"{title}: where the CPU went (JVM, Python workers and driver; not the broker)", measured),
        ],
        targets=goals(measured, args.partitions),
        plots=["kafka_read_amplification.png"],
        notes=notes(args, facts["keysByPartitionCount"]),
        raw=facts | {"partitions": args.partitions, "fixedCostFit": fits, "results": measured},
    )
    return 0 if all(m["correct"] for m in measured) else 1


def summarize(data: dict[str, Any]) -> list[str]:
    """The page's findings for ``kafka_read_amplification.json``."""
    results, partitions = data["raw"]["results"], (data.get("parameters") or {}).get("partitions") or 4
    if not isinstance(results, list):  # before issue 15: {"1": {...}, ..., "inputBytes": n}
        return []
    modes = sc.by_mode(results)
    out = sc.mode_lines(modes, "ampBytes", 0)
    every, nested = ({r["shards"]: r for r in modes.get(m, [])} for m in MODES)
    once = sc.read_once(modes.get("partitioned", []), "partitioned", partitions)
    if fit := sc.fit_fixed_cost(once):
        text = (
            f"Partition-nested with at most one shard per partition ({', '.join(str(r['shards']) for r in once)} "
            f"shards: the topic read once), the CPU fits {fit['shared']:.1f} s shared + {fit['perShard']:.1f} s per "
            "shard run (least squares): run one after another with availableNow, every shard run pays its start and "
            "stop (preflight and Kafka metadata, start offsets, query start and planning, the commit), which a "
            "long-running shard pays once in its life."
        )
        if 1 in nested and 4 in nested:
            net1, net4 = nested[1]["cpuSeconds"] - fit["perShard"], nested[4]["cpuSeconds"] - 4 * fit["perShard"]
            text += f" Net of it (arithmetic on the fit), 4 shards vs 1: {net4:.1f} vs {net1:.1f} CPU s "
            text += f"({net4 / net1:.2f}x)."
        out.append(text)
    if every and nested:
        both = sorted(set(every) & set(nested))
        ratios = ", ".join(f"{n}: {nested[n]['cpuSeconds'] / every[n]['cpuSeconds']:.2f}x" for n in both)
        out.append(f"Partition-nested vs read everything, CPU per event at the same shard count: {ratios}.")
    out.append(f"CPU steal during the runs: {sc.steal_text(results)} of this VM's CPU time (/proc/stat).")
    return out


if __name__ == "__main__":
    sys.exit(main())
