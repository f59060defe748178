"""Smoke test run INSIDE the shard image by hack/image/check.sh (as uid 10001, read-only root, /tmp writable).

It proves what `--help` cannot: the JRE starts, Spark's Python workers start the venv's interpreter
(``PYSPARK_PYTHON``) and import pandas/pyarrow, the key-group SQL expression equals its Python twin, and a
streaming aggregation with the RocksDB state store (whose native library is unpacked under /tmp) commits.
Prints one ``smoke: ...`` line per check; any failure raises (non-zero exit).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time


def main() -> int:
    start = time.monotonic()
    from pyspark.sql import SparkSession

    from spark_runtime.keygroups import key_group, key_group_sql

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("taskshard-image-smoke")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .getOrCreate()
    )
    print(f"smoke: spark {spark.version} up in {time.monotonic() - start:.1f}s (python {sys.version.split()[0]})")

    # Python workers run PYSPARK_PYTHON (the venv), where pandas and pyarrow (the stateful APIs) import.
    def probe(_):
        import pandas
        import pyarrow

        return (sys.executable, pandas.__version__, pyarrow.__version__)

    workers = spark.range(4).rdd.map(probe).distinct().collect()
    assert len(workers) == 1 and workers[0][0] == os.environ["PYSPARK_PYTHON"], workers
    print(f"smoke: python workers run {workers[0][0]} (pandas {workers[0][1]}, pyarrow {workers[0][2]})")

    keys = ["a", "orders-17", "ключ", "", "7"]
    df = spark.createDataFrame([(k,) for k in keys], "key string")
    got = {r["key"]: r["kg"] for r in df.selectExpr("key", f"{key_group_sql('key', 128)} AS kg").collect()}
    want = {k: key_group(k, 128) for k in keys}
    assert got == want, (got, want)
    print(f"smoke: key_group_sql == key_group on {len(keys)} keys")

    work = tempfile.mkdtemp(prefix="smoke-", dir="/tmp")
    source = os.path.join(work, "in")
    os.makedirs(source)
    with open(os.path.join(source, "p0.jsonl"), "w") as f:
        for i in range(100):
            f.write(json.dumps({"key": f"k{i % 7}"}) + "\n")
    counts = (
        spark.readStream.schema("key string")
        .json(source)
        .groupBy("key")
        .count()
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName("smoke_counts")
        .option("checkpointLocation", os.path.join(work, "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    counts.awaitTermination(120)
    rows = {r["key"]: r["count"] for r in spark.table("smoke_counts").collect()}
    assert sum(rows.values()) == 100 and len(rows) == 7, rows
    print("smoke: streaming count with the RocksDB state store committed (7 keys, 100 events)")
    spark.stop()
    print(f"smoke: ok in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
