"""The Python processor's state layouts: per-batch time, CPU and changelog bytes against the size of the state.

A script, not a test. For each layout and each state size N (``--keys``), one streaming query (one SparkSession,
``local[2]``, RocksDB with changelog checkpointing, 4 shuffle partitions, 128 key groups, the user's
:class:`~spark_runtime.engine.api.CountProcessor`) reads Parquet files, one per micro-batch:

- batch 0: every one of the N keys once (builds the state; its time is reported, not compared);
- batches 1..``--batches``: ``--batch-events`` events (20,000 by default) over random existing keys.

Per measured batch: its wall time (Spark's ``triggerExecution``), the CPU seconds of the whole process tree (driver,
JVM, Python workers) between the ends of consecutive batches (sampled in ``foreachBatch``), and the bytes its
state-store changelog files hold (``state/0/<partition>/<batch + 1>.changelog``). Medians over the measured batches.

Layouts:

``blob``
    one Arrow table per key group in ``applyInPandasWithState`` (the layout before the runs);
``runs``
    sorted immutable runs per key group in ``transformWithStateInPandas`` with the local run cache
    (:mod:`spark_runtime.engine`): what shards run;
``tws-map``
    ``transformWithStateInPandas`` grouped by key group with a ``MapState`` keyed by the user's key: one
    ``getValue`` and one ``updateValue`` per touched key (round trips to the JVM);
``tws-key``
    ``transformWithStateInPandas`` grouped by the user's key with a ``ValueState``: one call per key.

The per-key layouts build their state one round trip per key, so ``tws-map`` runs only up to ``--per-key-max``
keys of state (default 1,000,000) and ``tws-key``, which also pays Spark's fixed cost of one grouping-key call per
key (about 1.3 ms here: 133 s to build 100,000 keys, 20 s per batch of 20,000 events), up to ``--key-call-max``
(default 100,000); above that the table says so. Prints tables and writes
``<out>/state_layouts.{json,png}``.

    .venv/bin/python bench/state_layouts.py --keys 100000,1000000,10000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import pandas as pd  # noqa: E402
from common import LoadSampler, command_line, machine, print_table, pyplot, say, write_result  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle  # noqa: E402
from shard_throughput import tree_cpu_seconds  # noqa: E402

MAX_KEY_GROUPS = 128
LAYOUTS = ("blob", "runs", "tws-map", "tws-key")
PER_KEY = ("tws-map", "tws-key")
TARGET_RATIO = 1.5
PROCESSOR = "spark_runtime.engine.api:CountProcessor"


# ---------------------------------------------------------------- input


def write_input(directory: Path, keys: int, batches: int, batch_events: int, seed: int) -> None:
    """``b000000.parquet`` with every key once, then ``batches`` files of ``batch_events`` random existing keys
    (columns ``key``, ``partition``, ``offset``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    step = 2_000_000
    writer = None
    for lo in range(0, keys, step):  # batch 0 in row groups, without holding 10M Python strings at once
        ids = np.arange(lo, min(keys, lo + step))
        table = pa.table(
            {
                "key": pa.array([f"k{i}" for i in ids], pa.string()),
                "partition": pa.array(np.zeros(len(ids), np.int32)),
                "offset": pa.array(ids.astype(np.int64)),
            }
        )
        if writer is None:
            writer = pq.ParquetWriter(directory / "b000000.parquet", table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()
    for b in range(1, batches + 1):
        ids = rng.integers(0, keys, batch_events)
        table = pa.table(
            {
                "key": pa.array([f"k{i}" for i in ids], pa.string()),
                "partition": pa.array(np.zeros(len(ids), np.int32)),
                "offset": pa.array(np.arange(len(ids), dtype=np.int64) + keys + b * batch_events),
            }
        )
        pq.write_table(table, directory / f"b{b:06d}.parquet")
        os.utime(directory / f"b{b:06d}.parquet", (time.time() + b, time.time() + b))


# ---------------------------------------------------------------- the per-key layouts (benchmark only)


def _proc() -> Any:
    from spark_runtime.engine.api import cached_processor

    return cached_processor(PROCESSOR, "{}")


def _outputs(out: pd.DataFrame, group: int) -> pd.DataFrame:
    return pd.DataFrame({"key": out["key"].astype(str), "key_group": group, "result": out["result"].astype("int64")})


class MapStateLayout(StatefulProcessor):
    """Grouped by key group; ``MapState<key, count>``: per touched key one getValue and one updateValue."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getMapState("state", "key string", "count bigint")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        from spark_runtime.engine.api import call_processor

        events = pd.concat(list(rows), ignore_index=True)
        keys = pd.unique(events["key"])
        found = [(k, self.state.getValue((k,))) for k in keys]
        current = pd.DataFrame(
            {"key": [k for k, v in found if v is not None], "count": [v[0] for _, v in found if v is not None]}
        )
        new_state, out = call_processor(_proc(), events, current, ["count"], ["result"])
        for k, n in zip(new_state["key"], new_state["count"], strict=True):
            self.state.updateValue((k,), (int(n),))
        yield _outputs(out, int(key[0]))

    def close(self) -> None:
        pass


class ValueStateLayout(StatefulProcessor):
    """Grouped by the user's key; ``ValueState<count>``: one call and two round trips per key."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("state", "count bigint")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        from spark_runtime.engine.api import call_processor

        events = pd.concat(list(rows), ignore_index=True)
        value = self.state.get()
        current = pd.DataFrame({"key": [key[0]] if value else [], "count": [value[0]] if value else []})
        new_state, out = call_processor(_proc(), events, current, ["count"], ["result"])
        if len(new_state):
            self.state.update((int(new_state["count"].iloc[0]),))
        yield pd.DataFrame({"key": out["key"].astype(str), "result": out["result"].astype("int64")})

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- one run


def stateful(layout: str, events: Any, cache_dir: str) -> Any:
    from pyspark.sql import functions as F

    from spark_runtime.config import parse_config
    from spark_runtime.pipeline import make_plan, python_state_frame

    ev = events.withColumn("key_group", F.expr(f"pmod(hash(key), {MAX_KEY_GROUPS})").cast("int"))
    if layout in ("blob", "runs"):
        config = parse_config(
            {
                "task": "bench",
                "shard": "bench-0-128",
                "maxKeyGroups": MAX_KEY_GROUPS,
                "keyGroups": {"start": 0, "end": MAX_KEY_GROUPS},
                "processor": {"python": PROCESSOR},
                "source": {"journal": {"path": "/nonexistent", "partitions": 1}},
                "sink": {"directory": {"path": "/nonexistent", "format": "jsonl"}},
                "storage": {"path": "/nonexistent"},
                "spark": {"master": "local[2]"},
            }
        )
        import dataclasses

        plan = dataclasses.replace(make_plan(config), layout=layout, cache_dir=cache_dir)
        return python_state_frame(plan, ev.withColumn("seed", F.lit(None).cast("binary")))
    if layout == "tws-map":
        return ev.groupBy("key_group").transformWithStateInPandas(
            MapStateLayout(), "key string, key_group int, result bigint", "Update", "None"
        )
    return ev.groupBy("key").transformWithStateInPandas(
        ValueStateLayout(), "key string, result bigint", "Update", "None"
    )


def changelog_bytes(checkpoint: Path, version: int) -> int:
    return sum(p.stat().st_size for p in (checkpoint / "state" / "0").glob(f"*/{version}.changelog"))


def run_layout(spark: Any, layout: str, data: Path, work: Path, batch_events: int) -> dict[str, Any]:
    """One query over ``data``; per batch its seconds, CPU seconds and changelog bytes."""
    import json

    schema = spark.read.parquet(str(data / "b000000.parquet")).schema
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(data))
    checkpoint = Path(tempfile.mkdtemp(prefix=f"{layout}-", dir=work)) / "checkpoint"
    cache_dir = tempfile.mkdtemp(prefix="runs-cache-", dir=work)
    marks: list[tuple[int, float, float]] = []
    start = (tree_cpu_seconds(), time.perf_counter())

    def batch(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()
        marks.append((int(batch_id), tree_cpu_seconds(), time.perf_counter()))

    query = (
        stateful(layout, events, cache_dir)
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(batch)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    progress = [json.loads(p.json) for p in query.recentProgress if p.numInputRows]
    wall = {int(p["batchId"]): p["durationMs"]["triggerExecution"] / 1000 for p in progress}
    batches = []
    prev_cpu, prev_t = start
    for batch_id, cpu, t in marks:
        batches.append(
            {
                "batch": batch_id,
                "seconds": wall.get(batch_id, t - prev_t),
                "cpuSeconds": cpu - prev_cpu,
                "changelogBytes": changelog_bytes(checkpoint, batch_id + 1),
                "rows": next((int(p["numInputRows"]) for p in progress if int(p["batchId"]) == batch_id), 0),
            }
        )
        prev_cpu, prev_t = cpu, t
    distinct = {}
    for b in range(1, len(batches)):
        keys = spark.read.parquet(str(data / f"b{b:06d}.parquet")).select("key").distinct().count()
        distinct[b] = int(keys)
    for row in batches:
        row["touchedKeys"] = distinct.get(row["batch"])
    shutil.rmtree(checkpoint.parent, ignore_errors=True)
    shutil.rmtree(cache_dir, ignore_errors=True)
    return {"layout": layout, "batches": batches}


def summarize(result: dict[str, Any], keys: int) -> dict[str, Any]:
    measured = [b for b in result["batches"] if b["batch"] >= 1]
    first = next((b for b in result["batches"] if b["batch"] == 0), None)

    def med(field: str) -> float:
        return statistics.median(b[field] for b in measured) if measured else float("nan")

    per_key = [b["changelogBytes"] / b["touchedKeys"] for b in measured if b.get("touchedKeys")]
    secs = sorted(b["seconds"] for b in measured)
    return {
        "layout": result["layout"],
        "keys": keys,
        "buildSeconds": first["seconds"] if first else None,
        "medianSeconds": med("seconds"),
        "maxSeconds": secs[-1] if secs else None,
        "medianCpuSeconds": med("cpuSeconds"),
        "medianChangelogBytes": med("changelogBytes"),
        "meanChangelogBytes": statistics.mean(b["changelogBytes"] for b in measured) if measured else None,
        "bytesPerTouchedKey": statistics.median(per_key) if per_key else None,
        "meanBytesPerTouchedKey": (
            statistics.mean(b["changelogBytes"] for b in measured) / statistics.mean(b["touchedKeys"] for b in measured)
            if measured and all(b.get("touchedKeys") for b in measured)
            else None
        ),
    }


# ---------------------------------------------------------------- report


def report(
    rows: list[dict[str, Any]], keys: list[int], layouts: list[str], skipped: list[tuple[str, int, str]]
) -> dict:
    table = [
        [
            r["layout"],
            r["keys"],
            r["buildSeconds"],
            r["medianSeconds"],
            r["maxSeconds"],
            r["medianCpuSeconds"],
            r["medianChangelogBytes"],
            r["bytesPerTouchedKey"],
            r["meanBytesPerTouchedKey"],
        ]
        for r in rows
    ]
    table += [[layout, k, None, None, None, None, None, None, None] for layout, k, _ in skipped]
    columns = [
        "layout",
        "state keys",
        "build (batch 0) s",
        "median batch s",
        "slowest batch s",
        "median CPU s / batch",
        "median changelog bytes / batch",
        "median changelog bytes / touched key",
        "mean changelog bytes / touched key (compactions included)",
    ]
    by = {(r["layout"], r["keys"]): r for r in rows}
    targets = []
    lo, hi = min(keys), max(keys)
    ratio_rows = []
    for layout in layouts:
        a, b = by.get((layout, lo)), by.get((layout, hi))
        if a and b:
            ratio_rows.append([layout, a["medianSeconds"], b["medianSeconds"], b["medianSeconds"] / a["medianSeconds"]])
    runs_ratio = next((r[3] for r in ratio_rows if r[0] == "runs"), None)
    if runs_ratio is not None:
        targets.append(
            {
                "name": f"Python processor: per-batch time at {hi:,} keys of state vs {lo:,} (runs layout; other "
                "layouts in the table)",
                "target": f"<= {TARGET_RATIO}x",
                "value": f"{runs_ratio:.2f}x",
                "met": runs_ratio <= TARGET_RATIO,
                "why": "see the per-batch table: lookups per run grow with log(state); compactions add the slowest "
                "batches",
            }
        )
    runs_rows = [by[("runs", k)] for k in keys if ("runs", k) in by]
    if runs_rows:
        per_key = [r["bytesPerTouchedKey"] for r in runs_rows if r["bytesPerTouchedKey"]]
        spread = max(per_key) / min(per_key) if per_key else float("nan")
        targets.append(
            {
                "name": "changelog bytes per batch proportional to the touched keys (runs layout; median bytes per "
                "touched key at each state size, their spread)",
                "target": "proportional (reported)",
                "value": ", ".join(
                    f"{r['keys']:,}: {r['bytesPerTouchedKey']:.0f} B" for r in runs_rows if r["bytesPerTouchedKey"]
                )
                + f" (spread {spread:.2f}x)",
                "met": spread <= 1.5,
                "why": "compaction merges rewrite older runs: see the mean column",
            }
        )
    return {
        "tables": [
            {"title": "Per-batch cost by state layout and state size", "columns": columns, "rows": table},
            {
                "title": f"Growth of the median batch time from {lo:,} to {hi:,} keys of state",
                "columns": ["layout", f"{lo:,} keys s", f"{hi:,} keys s", "ratio"],
                "rows": ratio_rows,
            },
        ],
        "targets": targets,
    }


def plot(rows: list[dict[str, Any]], layouts: list[str], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for layout in layouts:
        pts = sorted((r["keys"], r["medianSeconds"]) for r in rows if r["layout"] == layout)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=layout)
    ax.set_xscale("log")
    ax.set_xlabel("keys of state")
    ax.set_ylabel("median seconds per batch (20,000 events)")
    ax.set_title("Python CountProcessor: batch time against state size, by state layout", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="100000,1000000,10000000", help="state sizes (comma-separated)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"subset of {', '.join(LAYOUTS)}")
    ap.add_argument("--batches", type=int, default=6, help="measured batches per run (default 6)")
    ap.add_argument("--batch-events", type=int, default=20_000, help="events per measured batch (default 20,000)")
    ap.add_argument("--per-key-max", type=int, default=1_000_000, help="largest state tws-map builds")
    ap.add_argument("--key-call-max", type=int, default=100_000, help="largest state tws-key builds")
    ap.add_argument("--out", default=str(REPO / ".run" / "bench"), help="output directory")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    keys = [int(k) for k in args.keys.split(",") if k.strip()]
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    out = Path(args.out).resolve()
    work = out / "work-state-layouts"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    from spark_runtime.session import spark_session

    spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}, "bench")
    rows: list[dict[str, Any]] = []
    skipped: list[tuple[str, int, str]] = []
    raw: dict[str, Any] = {}
    warm = work / "input-warm-up"
    write_input(warm, 2_000, 2, 500, args.seed)
    for layout in layouts:  # JIT and Python workers warm before anything is measured
        run_layout(spark, layout, warm, work, 500)
    say("warmed up")
    with LoadSampler() as load:
        for n in keys:
            data = work / f"input-{n}"
            t0 = time.perf_counter()
            write_input(data, n, args.batches, args.batch_events, args.seed)
            say(f"input for {n:,} keys written in {time.perf_counter() - t0:.0f} s")
            for layout in layouts:
                cap = args.key_call_max if layout == "tws-key" else args.per_key_max
                if layout in PER_KEY and n > cap:
                    skipped.append((layout, n, f"not run above {cap:,} keys (one round trip per key)"))
                    continue
                say(f"{layout} at {n:,} keys")
                result = run_layout(spark, layout, data, work, args.batch_events)
                raw[f"{layout}/{n}"] = result
                row = summarize(result, n)
                rows.append(row)
                say(
                    f"  build {row['buildSeconds']:.1f} s, median batch {row['medianSeconds']:.2f} s, CPU "
                    f"{row['medianCpuSeconds']:.2f} s, changelog {row['medianChangelogBytes']:,.0f} B"
                )
            shutil.rmtree(data, ignore_errors=True)
    body = report(rows, keys, layouts, skipped)
    for t in body["tables"]:
        print_table(t["title"], t["columns"], t["rows"], load.summary())
    plot(rows, layouts, out / "state_layouts.png")
    notes = [
        "Per batch: Spark's triggerExecution (wall), the CPU of the process tree between the ends of consecutive "
        "batches (sampled in foreachBatch), and the bytes of the batch's changelog files in the checkpoint.",
        "Per-key layouts: " + "; ".join(f"{layout} at {n:,} keys {why}" for layout, n, why in skipped)
        if skipped
        else "Every layout ran at every size.",
    ]
    write_result(
        out,
        "state_layouts",
        {
            "title": "Python processor state layouts",
            "command": command_line(argv),
            "parameters": vars(args),
            "machine": machine(),
            "load": load.summary(),
            **body,
            "plots": ["state_layouts.png"],
            "notes": notes,
            "raw": raw,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
