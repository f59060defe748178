"""The Python processor's state layouts: per-batch time, CPU and changelog bytes against the size of the state.

For each layout and each state size N (``--keys``), one streaming query (local[2], RocksDB with changelog
checkpointing, 4 shuffle partitions, 128 key groups, ``spark_runtime.engine.api.CountProcessor``) reads one
Parquet file per micro-batch: batch 0 holds every key once (builds the state: reported, not compared), batches
1..``--batches`` hold ``--batch-events`` events over random existing keys. Per measured batch: Spark's
``triggerExecution``, the process tree's CPU between the ends of consecutive batches (sampled in ``foreachBatch``),
and the bytes of its changelog files (``state/0/<partition>/<batch + 1>.changelog``); medians over the batches.

Layouts: ``blob`` (one Arrow table per key group in ``applyInPandasWithState``, before the runs); ``runs`` (sorted
immutable runs per key group in ``transformWithStateInPandas`` with the local run cache: what shards run);
``tws-map`` (grouped by key group, a ``MapState`` keyed by the user's key: a round trip per touched key, run up to
``--per-key-max`` keys of state); ``tws-key`` (grouped by the user's key with a ``ValueState``: one call per key,
about 1.3 ms each here, run up to ``--key-call-max`` keys). Writes ``<out>/state_layouts.{json,png}``.

    .venv/bin/python bench/state_layouts.py --keys 100000,1000000,10000000
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas as pd  # noqa: E402
from common import (  # noqa: E402
    LoadSampler,
    method_notes,
    options,
    parse,
    publish,
    pyplot,
    runner_config,
    say,
    target,
    tree_cpu_seconds,
)
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle  # noqa: E402

MAX_KEY_GROUPS = 128
LAYOUTS = ("blob", "runs", "tws-map", "tws-key")
PER_KEY = ("tws-map", "tws-key")
TARGET_RATIO = 1.5
PROCESSOR = "spark_runtime.engine.api:CountProcessor"


def write_input(directory: Path, keys: int, batches: int, batch_events: int, seed: int) -> None:
    """``b000000.parquet`` with every key once, then ``batches`` files of ``batch_events`` random existing keys
    (columns ``key``, ``partition``, ``offset``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(ids: Any, offsets: Any) -> Any:
        zeros = pa.array(np.zeros(len(ids), np.int32))
        return pa.table({"key": pa.array([f"k{i}" for i in ids], pa.string()), "partition": zeros, "offset": offsets})

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    writer = None
    for lo in range(0, keys, 2_000_000):  # batch 0 in row groups, without holding 10M Python strings at once
        ids = np.arange(lo, min(keys, lo + 2_000_000))
        part = table(ids, ids.astype(np.int64))
        writer = writer or pq.ParquetWriter(directory / "b000000.parquet", part.schema)
        writer.write_table(part)
    assert writer is not None
    writer.close()
    for b in range(1, batches + 1):
        ids = rng.integers(0, keys, batch_events)
        path = directory / f"b{b:06d}.parquet"
        pq.write_table(table(ids, np.arange(len(ids), dtype=np.int64) + keys + b * batch_events), path)
        os.utime(path, (time.time() + b, time.time() + b))


def _proc() -> Any:
    from spark_runtime.engine.api import cached_processor

    return cached_processor(PROCESSOR, "{}")


class MapStateLayout(StatefulProcessor):
    """Grouped by key group; ``MapState<key, count>``: per touched key one getValue and one updateValue."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getMapState("state", "key string", "count bigint")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        from spark_runtime.engine.api import call_processor

        events = pd.concat(list(rows), ignore_index=True)
        found = [(k, v) for k in pd.unique(events["key"]) if (v := self.state.getValue((k,))) is not None]
        current = pd.DataFrame({"key": [k for k, _ in found], "count": [v[0] for _, v in found]})
        new_state, out = call_processor(_proc(), events, current, ["count"], ["result"])
        for k, n in zip(new_state["key"], new_state["count"], strict=True):
            self.state.updateValue((k,), (int(n),))
        result = out["result"].astype("int64")
        yield pd.DataFrame({"key": out["key"].astype(str), "key_group": int(key[0]), "result": result})


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


def stateful(layout: str, events: Any, cache_dir: str) -> Any:
    import dataclasses

    from pyspark.sql import functions as F

    from spark_runtime.pipeline import make_plan, python_state_frame

    ev = events.withColumn("key_group", F.expr(f"pmod(hash(key), {MAX_KEY_GROUPS})").cast("int"))
    if layout in ("blob", "runs"):
        nowhere = Path("/nonexistent")
        config = runner_config(nowhere, nowhere, 1, "bench-0-128", 0, MAX_KEY_GROUPS, {"python": PROCESSOR}, {})
        plan = dataclasses.replace(make_plan(config), layout=layout, cache_dir=cache_dir)
        return python_state_frame(plan, ev.withColumn("seed", F.lit(None).cast("binary")))
    if layout == "tws-map":
        schema = "key string, key_group int, result bigint"
        return ev.groupBy("key_group").transformWithStateInPandas(MapStateLayout(), schema, "Update", "None")
    schema = "key string, result bigint"
    return ev.groupBy("key").transformWithStateInPandas(ValueStateLayout(), schema, "Update", "None")


def run_layout(spark: Any, layout: str, data: Path, work: Path) -> dict[str, Any]:
    """One query over ``data``; per batch its seconds, CPU seconds, changelog bytes, rows and touched keys."""
    schema = spark.read.parquet(str(data / "b000000.parquet")).schema
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(data))
    checkpoint = Path(tempfile.mkdtemp(prefix=f"{layout}-", dir=work)) / "checkpoint"
    cache_dir = tempfile.mkdtemp(prefix="runs-cache-", dir=work)
    marks: list[tuple[int, float, float]] = []
    start = (tree_cpu_seconds(), time.perf_counter())

    def batch(df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()
        marks.append((int(batch_id), tree_cpu_seconds(), time.perf_counter()))

    writer = stateful(layout, events, cache_dir).writeStream.outputMode("update")
    query = writer.option("checkpointLocation", str(checkpoint)).foreachBatch(batch).trigger(availableNow=True).start()
    query.awaitTermination()
    progress = {int(p["batchId"]): p for p in (json.loads(q.json) for q in query.recentProgress if q.numInputRows)}
    batches = []
    prev_cpu, prev_t = start
    for batch_id, cpu, t in marks:
        p = progress.get(batch_id)
        changelog = sum(f.stat().st_size for f in (checkpoint / "state" / "0").glob(f"*/{batch_id + 1}.changelog"))
        seconds = p["durationMs"]["triggerExecution"] / 1000 if p else t - prev_t
        row = {"batch": batch_id, "seconds": seconds, "cpuSeconds": cpu - prev_cpu, "changelogBytes": changelog}
        batches.append(row | {"rows": int(p["numInputRows"]) if p else 0})
        prev_cpu, prev_t = cpu, t
    for row in batches:
        b = row["batch"]
        keys = spark.read.parquet(str(data / f"b{b:06d}.parquet")).select("key") if 0 < b < len(batches) else None
        row["touchedKeys"] = int(keys.distinct().count()) if keys is not None else None
    shutil.rmtree(checkpoint.parent, ignore_errors=True)
    shutil.rmtree(cache_dir, ignore_errors=True)
    return {"layout": layout, "batches": batches}


def batch_summary(result: dict[str, Any], keys: int) -> dict[str, Any]:
    """One run's medians over its measured batches (1..), and its build (batch 0) seconds."""
    measured = [b for b in result["batches"] if b["batch"] >= 1]
    first = next((b for b in result["batches"] if b["batch"] == 0), None)

    def med(field: str) -> float:
        return statistics.median(b[field] for b in measured) if measured else float("nan")

    per_key = [b["changelogBytes"] / b["touchedKeys"] for b in measured if b.get("touchedKeys")]
    mean_bytes = statistics.mean(b["changelogBytes"] for b in measured) if measured else None
    complete = measured and all(b.get("touchedKeys") for b in measured)
    touched = statistics.mean(b["touchedKeys"] for b in measured) if complete else None
    out = {"layout": result["layout"], "keys": keys, "buildSeconds": first["seconds"] if first else None}
    out |= {"medianSeconds": med("seconds"), "maxSeconds": max((b["seconds"] for b in measured), default=None)}
    out |= {"medianCpuSeconds": med("cpuSeconds"), "medianChangelogBytes": med("changelogBytes")}
    out |= {"meanChangelogBytes": mean_bytes, "bytesPerTouchedKey": statistics.median(per_key) if per_key else None}
    return out | {"meanBytesPerTouchedKey": mean_bytes / touched if touched else None}


def growth(rows: list[dict[str, Any]], keys: list[int], layouts: list[str]) -> list[list[Any]]:
    """Per layout: its median batch seconds at the smallest and the largest state, and their ratio."""
    by = {(r["layout"], r["keys"]): r for r in rows}
    out = []
    for layout in layouts:
        a, b = by.get((layout, min(keys))), by.get((layout, max(keys)))
        if a and b:
            out.append([layout, a["medianSeconds"], b["medianSeconds"], b["medianSeconds"] / a["medianSeconds"]])
    return out


def report(rows: list[dict[str, Any]], keys: list[int], layouts: list[str], skipped: list[tuple]) -> dict[str, Any]:
    fields = ("layout", "keys", "buildSeconds", "medianSeconds", "maxSeconds", "medianCpuSeconds")
    fields += ("medianChangelogBytes", "bytesPerTouchedKey", "meanBytesPerTouchedKey")
    table = [[r[f] for f in fields] for r in rows] + [[layout, k, *[None] * 7] for layout, k, _ in skipped]
    columns = ["layout", "state keys", "build (batch 0) s", "median batch s", "slowest batch s", "median CPU s / batch"]
    columns += ["median changelog bytes / batch", "median changelog bytes / touched key"]
    columns += ["mean changelog bytes / touched key (compactions included)"]
    lo, hi, ratios, targets = min(keys), max(keys), growth(rows, keys, layouts), []
    runs_ratio = next((r[3] for r in ratios if r[0] == "runs"), None)
    if runs_ratio is not None:
        what = f"Python processor: per-batch time at {hi:,} keys of state vs {lo:,} (runs layout; other layouts in "
        what += "the table)"
        why = "see the per-batch table: lookups per run grow with log(state); compactions add the slowest batches"
        targets.append(target(what, f"<= {TARGET_RATIO}x", f"{runs_ratio:.2f}x", runs_ratio <= TARGET_RATIO, why))
    runs_rows = [r for r in rows if r["layout"] == "runs" and r["bytesPerTouchedKey"]]
    if any(r["layout"] == "runs" for r in rows):
        per_key = [r["bytesPerTouchedKey"] for r in runs_rows]
        spread = max(per_key) / min(per_key) if per_key else float("nan")
        what = "changelog bytes per batch proportional to the touched keys (runs layout; median bytes per touched "
        what += "key at each state size, their spread)"
        value = ", ".join(f"{r['keys']:,}: {r['bytesPerTouchedKey']:.0f} B" for r in runs_rows)
        value += f" (spread {spread:.2f}x)"
        why = "compaction merges rewrite older runs: see the mean column"
        targets.append(target(what, "proportional (reported)", value, spread <= 1.5, why))
    runs_at = "; ".join(f"{layout} at {n:,} keys {why}" for layout, n, why in skipped)
    notes = [*method_notes(__doc__), f"Per-key layouts: {runs_at}" if skipped else "Every layout ran at every size."]
    growth_title = f"Growth of the median batch time from {lo:,} to {hi:,} keys of state"
    tables = [
        ("Per-batch cost by state layout and state size", columns, table),
        (growth_title, ["layout", f"{lo:,} keys s", f"{hi:,} keys s", "ratio"], ratios),
    ]
    return {"title": "Python processor state layouts", "tables": tables, "targets": targets, "notes": notes}


def summarize(data: dict[str, Any]) -> list[str]:
    rows = [batch_summary(r, int(k.rsplit("/", 1)[1])) for k, r in data["raw"].items()]
    keys = sorted({r["keys"] for r in rows})
    ratios = ", ".join(f"{layout} {ratio:.2f}x" for layout, _, _, ratio in growth(rows, keys, list(LAYOUTS)))
    return [f"Median batch time at {keys[-1]:,} keys of state against {keys[0]:,}: {ratios}."]


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
    ap = options(__doc__, seed=11)
    ap.add_argument("--keys", default="100000,1000000,10000000", help="state sizes (comma-separated)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"subset of {', '.join(LAYOUTS)}")
    ap.add_argument("--batches", type=int, default=6, help="measured batches per run (default 6)")
    ap.add_argument("--batch-events", type=int, default=20_000, help="events per measured batch (default 20,000)")
    ap.add_argument("--per-key-max", type=int, default=1_000_000, help="largest state tws-map builds")
    ap.add_argument("--key-call-max", type=int, default=100_000, help="largest state tws-key builds")
    args = parse(ap, argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    keys = [int(k) for k in args.keys.split(",") if k.strip()]
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    work = args.out / "work-state-layouts"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from spark_runtime.session import spark_session

    spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}, "bench")
    rows, skipped, raw = [], [], {}
    write_input(work / "input-warm-up", 2_000, 2, 500, args.seed)
    for layout in layouts:  # JIT and Python workers warm before anything is measured
        run_layout(spark, layout, work / "input-warm-up", work)
    say("warmed up")
    with LoadSampler() as load:
        for n in keys:
            data, t0 = work / f"input-{n}", time.perf_counter()
            write_input(data, n, args.batches, args.batch_events, args.seed)
            say(f"input for {n:,} keys written in {time.perf_counter() - t0:.0f} s")
            for layout in layouts:
                cap = args.key_call_max if layout == "tws-key" else args.per_key_max
                if layout in PER_KEY and n > cap:
                    skipped.append((layout, n, f"not run above {cap:,} keys (one round trip per key)"))
                    continue
                raw[f"{layout}/{n}"] = run_layout(spark, layout, data, work)
                rows.append(row := batch_summary(raw[f"{layout}/{n}"], n))
                say(f"{layout} at {n:,} keys: build {row['buildSeconds']:.1f} s, batch {row['medianSeconds']:.2f} s")
            shutil.rmtree(data, ignore_errors=True)
    plot(rows, layouts, args.out / "state_layouts.png")
    body = report(rows, keys, layouts, skipped)
    publish("state_layouts", args, argv, load=load.summary(), plots=["state_layouts.png"], raw=raw, **body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
