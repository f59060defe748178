"""Restore cost against slice size: a child restoring part of a parent's state of ``--keys`` keys vs all of it.

Children over ``[0, fraction * 128)`` restore from a parent's drained snapshot (built by the runtime), ``--repeat``
times per fraction in one SparkSession (warm), and with ``--cold`` as fresh processes. Target (issue 8): <= 0.6.

    .venv/bin/python bench/restore_cost.py --keys 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import LoadSampler, bar_plot, cpu_seconds, descendants, mtime, options, parse, publish, say, target  # noqa: E402
from scaling import MAX_KEY_GROUPS, linear_fit, shard_config  # noqa: E402

TASK = "restore"
PARENT = f"{TASK}-0-{MAX_KEY_GROUPS}"
TARGET = 0.6


def write_journal(journal: Path, keys: int, partitions: int, seed: int) -> int:
    """``keys`` events with distinct keys ``u<i>`` (shuffled), partitioned like the producer. Returns bytes."""
    from spark_runtime.produce import append_lines, partition_for

    order = list(range(keys))
    random.Random(seed).shuffle(order)
    buckets: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in order:
        buckets[partition_for(f"u{i}", partitions)].append(f'{{"key":"u{i}","seq":{i}}}')
    return sum(append_lines(journal, p, lines) for p, lines in buckets.items())


def config(root: Path, shard: str, end: int, partitions: int, conf: dict[str, str], restore: dict | None) -> Any:
    from spark_runtime.config import parse_config

    source = {"journal": {"path": str(root / "journal"), "partitions": partitions}}
    spark = {"master": "local[2]", "conf": conf, "triggerInterval": "1 second"}
    return parse_config(shard_config(root, TASK, shard, (0, end), source, restoreFrom=restore, spark=spark))


def build_parent(spark: Any, root: Path, partitions: int, conf: dict[str, str]) -> dict[str, Any]:
    """The parent over ``[0, 128)`` until it consumed the journal, its drain, and one state map count."""
    from spark_runtime.shard import ShardRunner
    from spark_runtime.snapshot.export import count_state_rows

    runner = ShardRunner(config(root, PARENT, MAX_KEY_GROUPS, partitions, conf, None), spark)
    ends = {f"p{p}.jsonl": (root / "journal" / f"p{p}.jsonl").stat().st_size for p in range(partitions)}
    t0 = time.perf_counter()
    runner.start()
    progress = runner.paths.progress
    while True:
        runner.poll()
        if progress.exists() and json.loads(progress.read_text())["positions"] == ends:
            break
        time.sleep(0.2)
    t1 = time.perf_counter()
    summary = runner.drain()
    t2 = time.perf_counter()
    # What a state map (spec.split.by: state) costs at this state size: one count of the drained batch's state.
    counted = count_state_rows(spark, runner.config, runner.plan, runner.paths.checkpoint, summary["batchId"])
    state_map = {"seconds": time.perf_counter() - t2, "rows": sum(counted.values()), "keyGroups": len(counted)}
    return {"consumeSeconds": t1 - t0, "drainSeconds": t2 - t1, "stateMap": state_map, **summary}


def restore_report(shard_dir: Path) -> dict[str, Any]:
    """What the seed reader reports it opened (``restore/kg-<n>.json``): key groups, files, bytes, rows."""
    reports = [json.loads(p.read_text()) for p in sorted((shard_dir / "restore").glob("kg-*.json"))]
    out = {"keyGroups": len(reports), "files": sum(len(r["files"]) for r in reports)}
    return out | {k: sum(r[k] for r in reports) for k in ("bytes", "rows")}


def sink_rows(root: Path, shard: str) -> int:
    """Rows of the child's batch 0 output, published or still pending (published on the next batch or the stop)."""
    from spark_runtime.layout import SinkPaths

    paths = SinkPaths.of(root / "out", shard)
    for f in (paths.batch_file(0, "jsonl"), paths.pending_file(0, "jsonl")):
        if f.exists():
            with open(f, "rb") as fh:
                return sum(1 for _ in fh)
    return 0


def cleanup_child(root: Path, shard: str) -> None:
    shutil.rmtree(root / "state" / TASK / "shards" / shard, ignore_errors=True)
    shutil.rmtree(root / "out" / f"shard={shard}", ignore_errors=True)


def restore_warm(spark: Any, root: Path, partitions: int, conf: dict, end: int, shard: str, manifest: str) -> dict:
    """One child in the running SparkSession: start() -> commits/0, and Spark's duration of batch 0."""
    from spark_runtime.shard import ShardRunner

    runner = ShardRunner(config(root, shard, end, partitions, conf, {"parent": PARENT, "manifest": manifest}), spark)
    commit0 = runner.paths.checkpoint.local_path() / "commits" / "0"
    spark_cpu = lambda: cpu_seconds([p for p in descendants(os.getpid()) if p != os.getpid()])  # noqa: E731 - the JVM
    cpu0, t0 = spark_cpu(), time.time()
    runner.start()
    while not commit0.exists():
        if (exc := runner.query.exception()) is not None:
            raise RuntimeError(f"child {shard} failed: {exc}")
        time.sleep(0.02)
    cpu, seconds = spark_cpu() - cpu0, (mtime(commit0) or time.time()) - t0
    batch0: dict[str, Any] = {}
    deadline = time.monotonic() + 10
    while not batch0 and time.monotonic() < deadline:  # the progress event follows the commit closely
        batch0 = next((d for p in runner.query.recentProgress if (d := json.loads(p.json)).get("batchId") == 0), {})
        time.sleep(0.05)
    runner.stop()
    ms = batch0.get("durationMs")
    b0 = (ms or {}).get("triggerExecution", 0) / 1000
    out = {"seconds": seconds, "cpuSeconds": round(cpu, 2), "batch0Seconds": b0, "batch0DurationMs": ms}
    return out | {"sinkRows": sink_rows(root, shard)} | restore_report(runner.paths.shard_dir.local_path())


def restore_cold(root: Path, partitions: int, conf: dict, end: int, shard: str, manifest: str) -> dict:
    """One child as a fresh ``python -m spark_runtime run`` process: spawn -> commits/0 (JVM start included)."""
    cfg_path, shard_dir = root / f"{shard}.json", root / "state" / TASK / "shards" / shard
    cfg = config(root, shard, end, partitions, conf, {"parent": PARENT, "manifest": manifest})
    cfg_path.write_text(json.dumps(cfg.to_json_dict()))
    commit0 = shard_dir / "checkpoint" / "commits" / "0"
    t0, deadline = time.time(), time.monotonic() + 600
    proc = common.spawn_runtime(cfg_path, root / f"{shard}.log")
    try:
        while not commit0.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"child process {shard} exited with {proc.returncode}; see {root / shard}.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"child process {shard} did not commit batch 0 in 600 s")
            time.sleep(0.05)
        t_commit, cpu = mtime(commit0) or time.time(), cpu_seconds(descendants(proc.pid))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this script started; no drain (nothing to export)
        proc.wait(timeout=60)
    t_python, t_planned = mtime(shard_dir / "lineage.json"), mtime(shard_dir / "checkpoint" / "offsets" / "0")
    out = {"seconds": t_commit - t0, "cpuSeconds": round(cpu, 2)}
    out["pythonStartSeconds"] = (t_python - t0) if t_python else None
    out["sparkStartSeconds"] = (t_planned - t_python) if t_planned and t_python else None
    out["batch0Seconds"] = (t_commit - t_planned) if t_planned else None
    return out | restore_report(shard_dir)


def measure(args: argparse.Namespace, fractions: list[float], root: Path, conf: dict) -> dict[str, Any]:
    """The journal, the parent, a warm-up child, the warm children (by fraction) and the cold ones."""
    from spark_runtime.session import spark_session

    nbytes = write_journal(root / "journal", args.keys, args.partitions, args.seed)
    spark = spark_session("local[2]", conf, app_name="taskshard-bench-restore")
    parent = build_parent(spark, root, args.partitions, conf)
    manifest = parent["manifest"]
    snap = json.loads(Path(manifest).read_text())["snapshot"]
    say(f"parent: {parent['stateRows']:,} keys ({args.keys:,} written), {snap['files']} files, {snap['bytes']:,} bytes")

    def child(f: float, name: str, warm: bool = True) -> dict[str, Any]:
        end = max(1, round(f * MAX_KEY_GROUPS))
        shard = f"{TASK}-{name}-{int(f * 1000)}-0-{end}"
        if warm:
            r = restore_warm(spark, root, args.partitions, conf, end, shard, manifest)
        else:
            r = restore_cold(root, args.partitions, conf, end, shard, manifest)
        cleanup_child(root, shard)
        say(f"{name} [0, {end:3d}): {r['seconds']:6.2f}s (batch 0 {r['batch0Seconds'] or 0:5.2f}s) rows={r['rows']:,}")
        return r

    child(8 / MAX_KEY_GROUPS, "warmup")  # so the first measured child does not pay for first-use class loading
    warm: dict[float, list[dict[str, Any]]] = {f: [] for f in fractions}
    for rep in range(args.repeat):
        for f in fractions if rep % 2 == 0 else fractions[::-1]:
            warm[f].append(child(f, f"w{rep}"))
    spark.stop()
    cold = {f: child(f, "cold", warm=False) for f in ((0.5, 1.0) if args.cold else ())}
    return {"parent": parent, "snapshot": snap, "journalBytes": nbytes, "warm": warm, "cold": cold}


def slices(fractions: list[float], warm: dict[float, list[dict]], cold: dict[float, dict]) -> list[dict[str, Any]]:
    """Per fraction: what the child read, the warm medians and the cold seconds, each also vs restoring all."""

    def med(f: float, key: str) -> float:
        return statistics.median(r[key] for r in warm[f])

    full, full_cpu, full_b0 = med(1.0, "seconds"), med(1.0, "cpuSeconds"), med(1.0, "batch0Seconds")
    rows = []
    for f in fractions:
        rs, wall, cpu, b0, c = warm[f], med(f, "seconds"), med(f, "cpuSeconds"), med(f, "batch0Seconds"), cold.get(f)
        rows.append(
            {"fraction": f, "keyGroups": f"[0, {max(1, round(f * MAX_KEY_GROUPS))})"}
            | {k: rs[0][k] for k in ("rows", "bytes", "files", "sinkRows")}
            | {"warmMedian": round(wall, 3), "warmMin": round(min(r["seconds"] for r in rs), 3)}
            | {"warmMax": round(max(r["seconds"] for r in rs), 3), "warmRatio": round(wall / full, 3)}
            | {"cpuMedian": round(cpu, 2), "cpuRatio": common.ratio(cpu, full_cpu)}
            | {"batch0Median": round(b0, 3), "batch0Ratio": common.ratio(b0, full_b0)}
            | {"coldSeconds": round(c["seconds"], 3) if c else None}
            | {"coldRatio": common.ratio(c["seconds"], cold.get(1.0, {}).get("seconds")) if c else None}
        )
    return rows


def notes(parent: dict[str, Any]) -> list[str]:
    return [
        "The parent's state is built by the runtime (distinct keys, builtin count, drain). Warm: in its SparkSession, "
        "from ShardRunner.start() to the mtime of the child's checkpoint/commits/0; 'batch 0 alone': Spark's "
        "triggerExecution of it (seed read, state, sink write of every restored key). CPU s: the JVM and its Python "
        "workers (/proc). Fresh process: python -m spark_runtime run, spawn to commits/0. Keys, files, bytes: what "
        "the seed reader opened (restore/kg-<n>.json).",
        "The fit splits a restore into a fixed part and a part proportional to the slice; half <= 0.6x all needs the "
        f"fixed part <= 1/4 of the proportional one. A state map (split.by: state) of this state took "
        f"{parent['stateMap']['seconds']:.1f} s (the drain's export: {parent['drainSeconds']:.1f} s with the stop).",
    ]


def report(rows: list[dict[str, Any]], parent: dict[str, Any]) -> tuple[list, list, dict]:
    """The tables, the Targets rows and the fits (fixed part + part proportional to the slice)."""
    fits = {}
    for label, key in (("wall s (warm JVM)", "warmMedian"), ("CPU s (JVM + workers)", "cpuMedian")):
        fixed, slope = linear_fit([r["fraction"] for r in rows], [r[key] for r in rows])
        half_all = round((fixed + slope / 2) / (fixed + slope), 3) if fixed + slope else None
        fits[label] = {"fixed": round(fixed, 2), "perFullState": round(slope, 2), "halfOverAll": half_all}
    half, keys = next(r for r in rows if r["fraction"] == 0.5), f"{parent['stateRows']:,} keys"
    goals = [
        target(name, f"<= {TARGET}x", f"{half[key]:.2f}x", half[key] <= TARGET)
        for name, key in (
            (f"restore half of {keys} vs all (warm JVM: start -> first batch committed)", "warmRatio"),
            ("the same in CPU seconds (less sensitive to other load on the machine; informational)", "cpuRatio"),
            ("the same as fresh processes (JVM start included; informational)", "coldRatio"),
        )
        if half.get(key) is not None
    ]
    table = [
        [f"{r['fraction']:g}", r["keyGroups"], r["rows"], round(r["bytes"] / 1e6, 1), r["warmMedian"]]
        + [f"{r['warmMin']:.2f}-{r['warmMax']:.2f}", r["warmRatio"], r["cpuMedian"], r["cpuRatio"], r["batch0Median"]]
        + [r["batch0Ratio"], r["coldSeconds"], r["coldRatio"]]
        for r in rows
    ]
    cols = (
        "slice|key groups|keys restored|snapshot MB read|start -> batch 0 committed s (warm JVM, median)|min-max s|"
        "ratio vs all|CPU s (JVM + workers)|ratio|batch 0 alone s|ratio|fresh process s|ratio"
    )
    fit_cols = ["measure", "fixed part s", "part proportional to the slice s (whole state)", "half / all by the fit"]
    fit_rows = [[k, v["fixed"], v["perFullState"], v["halfOverAll"]] for k, v in fits.items()]
    fit_title = "Restore time = fixed part + part proportional to the slice (least squares over the slices)"
    title = f"Restore cost, state of {keys} (builtin count), local[2]"
    return [(title, cols.split("|"), table), (fit_title, fit_cols, fit_rows)], goals, fits


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=11)
    ap.add_argument("--keys", type=int, default=1_000_000, help="distinct keys in the parent's state (default 1M)")
    ap.add_argument("--fractions", default="0.25,0.5,1", help="slices, fractions of [0, 128)")
    ap.add_argument("--repeat", type=int, default=3, help="warm restores per fraction (median reported; default 3)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions (default 4)")
    ap.add_argument("--cold", action=argparse.BooleanOptionalAction, default=True, help="also time fresh processes")
    args = parse(ap, argv)
    logging.basicConfig(level=logging.WARNING)
    fractions = sorted({float(f) for f in args.fractions.split(",") if f.strip()})
    if 1.0 not in fractions or 0.5 not in fractions:
        ap.error("--fractions must include 0.5 and 1 (the target compares them)")
    root = args.out / "work" / "restore_cost"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    conf = {"spark.sql.shuffle.partitions": str(args.shuffle_partitions), "spark.ui.enabled": "false"}
    with LoadSampler() as load:
        raw = measure(args, fractions, root, conf)
    rows = slices(fractions, raw["warm"], raw["cold"])
    tables, goals, fits = report(rows, raw["parent"])
    bars = {f"{r['keyGroups']} warm": r["warmMedian"] for r in rows}
    bars |= {f"{r['keyGroups']} fresh process": r["coldSeconds"] for r in rows if r["coldSeconds"]}
    bar_plot(args.out / "restore_cost.png", bars, xlabel="seconds to the first batch committed", title=tables[0][0])
    publish(
        "restore_cost",
        args,
        argv,
        title="Restore cost against slice size",
        load=load.summary(),
        tables=tables,
        targets=goals,
        plots=["restore_cost.png"],
        notes=notes(raw["parent"]),
        raw={k: raw[k] for k in ("parent", "snapshot", "journalBytes")}
        | {"rows": rows, "fits": fits}
        | {k: {str(f): v for f, v in raw[k].items()} for k in ("warm", "cold")},
    )
    return 0


def summarize(data: dict[str, Any]) -> list[str]:
    """The page's findings for ``restore_cost.json``."""
    raw = data["raw"]
    half, full = (next(r for r in raw["rows"] if r["fraction"] == f) for f in (0.5, 1))
    cpu = f" and {half['cpuRatio']:.2f}x in CPU time" if half.get("cpuRatio") is not None else ""
    out = [
        f"Restoring half of the state costs {half['warmRatio']:.2f}x restoring all of it in wall time "
        f"({half['warmMedian']:.1f} s vs {full['warmMedian']:.1f} s){cpu}; target {TARGET}x: "
        f"{'met' if half['warmRatio'] <= TARGET else 'missed'}."
    ]
    for label, f in (raw.get("fits") or {}).items():
        out.append(
            f"Fit for {label}: a fixed {f['fixed']:.1f} s plus {f['perFullState']:.1f} s for the whole state, so "
            f"half / all = {f['halfOverAll']:.2f} by the fit; the fixed part does not shrink with the slice."
        )
    return [
        *out,
        f"A child reads only its key groups: {half['rows']:,} keys and {half['bytes'] / 1e6:.1f} MB for half the "
        f"range ({half['keyGroups']}).",
    ]


if __name__ == "__main__":
    sys.exit(main())
