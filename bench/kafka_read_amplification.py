"""Kafka read amplification: how much each shard count reads from a real Kafka topic (issue 7's measurement).

A script, not a test. A Kafka broker (KRaft, loopback, jars from Maven Central via ``hack/testinfra``) gets a
topic of ``--partitions`` partitions with ``--events`` JSON events over ``--keys`` keys (keyed by the event
key, Kafka's default partitioner). For each shard count n in ``--shards``, n shards tile ``[0, 128)`` and each
runs the shard runtime (``ShardRunner``, builtin count, Kafka source, directory sink, local storage) with the
``availableNow`` trigger over the whole topic, one after another in one SparkSession (with the Kafka connector
on its class path). Measured per shard count, from the shards' own observed metrics (``rowsRead``,
``bytesRead`` = key + value bytes the connector fetched, summed over batches):

- read amplification (rows) = rows read by all shards / input events;
- read amplification (bytes) = bytes read by all shards / key + value bytes produced;
- owned rows: records counted by the shards (the per-key counts summed over all shards: equals the input
  when every record passed exactly one shard's key-group filter);
- seconds per shard (wall, JVM already warm);
- a result check: the per-key counts across the n shards equal the input's.

Every shard reads every partition (the design, see spark_runtime/README.md "Kafka"), so amplification = n.

    .venv/bin/python bench/kafka_read_amplification.py --events 200000 --shards 1,2,4
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

MAX_KEY_GROUPS = 128


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


def run_shards(spark: Any, broker: Any, topic: str, n: int, work: Path) -> dict[str, Any]:
    from spark_runtime.config import parse_config
    from spark_runtime.results import final_results
    from spark_runtime.shard import ShardRunner

    task = f"amp{n}-{uuid.uuid4().hex[:6]}"
    rows = bytes_read = 0
    seconds: list[float] = []
    for start, end in tiling(n):
        cfg = parse_config(
            {
                "task": task,
                "shard": f"{task}-{start}-{end}",
                "maxKeyGroups": MAX_KEY_GROUPS,
                "keyGroups": {"start": start, "end": end},
                "processor": {"builtin": "count"},
                "source": {"kafka": {"bootstrapServers": broker.bootstrap_servers, "topic": topic}},
                "sink": {"directory": {"path": str(work / "out" / task)}},
                "storage": {"path": str(work / "state")},
                "terminationMessagePath": str(work / "termination"),
            }
        )
        runner = ShardRunner(cfg, spark, available_now=True)
        t0 = time.monotonic()
        runner.run(poll_interval=0.2)
        seconds.append(time.monotonic() - t0)
        rows += runner.source_metrics["rowsRead"]
        bytes_read += runner.source_metrics["bytesRead"]
    results = final_results(work / "out" / task, work / "state", task)
    owned = sum(int(v) for v in results.values())  # builtin count: every owned record counted once
    return {
        "rowsRead": rows,
        "bytesRead": bytes_read,
        "ownedRows": owned,
        "secondsPerShard": seconds,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="input events (default 200000)")
    p.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20000)")
    p.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    p.add_argument("--shards", default="1,2,4", help="shard counts (default 1,2,4)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="result directory")
    args = p.parse_args(argv)
    args.out = args.out.absolute()
    counts = [int(x) for x in args.shards.split(",")]

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
        say(f"producing {args.events} events to {topic} ({args.partitions} partitions)")
        broker.produce(topic, events)
        input_bytes = sum(len(e["key"]) + len(json.dumps(e, separators=(",", ":"))) for e in events)
        expected = Counter(e["key"] for e in events)
        spark = spark_with_connector(jars)
        measured: dict[int, dict[str, Any]] = {}
        with LoadSampler() as load:
            run_shards(spark, broker, topic, 1, work / "warmup")  # JVM, connector and planning warm-up
            for n in counts:
                say(f"{n} shard(s)")
                m = run_shards(spark, broker, topic, n, work / f"n{n}")
                m["correct"] = m.pop("results") == dict(expected)
                measured[n] = m
        spark.stop()
    finally:
        broker.stop()

    columns = [
        "shards",
        "rows read",
        "bytes read",
        "amplification (rows)",
        "amplification (bytes)",
        "owned rows",
        "s per shard",
        "results exact",
    ]
    rows = []
    for n, m in measured.items():
        rows.append(
            [
                n,
                m["rowsRead"],
                m["bytesRead"],
                round(m["rowsRead"] / args.events, 3),
                round(m["bytesRead"] / input_bytes, 3),
                m["ownedRows"],
                round(sum(m["secondsPerShard"]) / len(m["secondsPerShard"]), 1),
                "yes" if m["correct"] else "NO",
            ]
        )
    summary = load.summary()
    title = f"Kafka read amplification ({args.events} events, {args.partitions} partitions, {input_bytes} bytes)"
    print_table(title, columns, rows, summary)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([str(n) for n in measured], [m["bytesRead"] / input_bytes for m in measured.values()], color="#4878a8")
    ax.plot([str(n) for n in measured], list(measured), "k--", label="= shards (every shard reads all)")
    ax.set_xlabel("shards")
    ax.set_ylabel("bytes read / input bytes")
    ax.set_title("Kafka read amplification")
    ax.legend()
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "kafka_read_amplification.png", dpi=110)
    four = measured.get(4)
    write_result(
        args.out,
        "kafka_read_amplification",
        {
            "title": "Kafka read amplification",
            "command": command_line(argv),
            "parameters": vars(args) | {"out": str(args.out)},
            "machine": machine(),
            "load": summary,
            "tables": [{"title": title, "columns": columns, "rows": rows}],
            "targets": [
                {
                    "name": "read amplification with 4 shards (reported, no target)",
                    "target": "reported",
                    "value": f"{four['bytesRead'] / input_bytes:.2f}x bytes" if four else "not measured",
                    "met": bool(four and four["correct"]),
                    "why": "every shard reads every partition and filters its key groups natively",
                }
            ],
            "plots": ["kafka_read_amplification.png"],
            "notes": [
                "rows/bytes read: the shards' observed metrics (rowsRead, bytesRead = key + value bytes the Kafka "
                "connector delivered, before the key-group filter), summed over batches and shards.",
                "owned rows: the per-key counts of all shards' final results summed: equals the input when every "
                "record passed exactly one shard's key-group filter.",
                "Shards run one after another with the availableNow trigger in one warm SparkSession; a warm-up "
                "run with 1 shard comes first.",
            ],
            "raw": {str(n): {k: v for k, v in m.items()} for n, m in measured.items()} | {"inputBytes": input_bytes},
        },
    )
    return 0 if all(m["correct"] for m in measured.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
