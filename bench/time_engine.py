"""Time in the processor: the event-time session processor's throughput next to the Python count on the same input,
and the exactness of a split and a merge in the middle of open sessions and pending timers.

Throughput (reported, no target): ``--events`` JSON events ``{"key", "ts"}`` over ``--keys`` keys (event times move
forward, each out of order by less than the 1 s watermark bound) through ``CountProcessor`` without event time and
``taskshard_examples.sessions:SessionWindow`` (60 s gap) with ``spec.eventTime`` (watermark, late filter, one timer
per key), on the runs layout in one SparkSession (local[2], RocksDB with changelog checkpointing, ``availableNow``,
``--batches`` micro-batches, fresh checkpoints): a warm-up round, then ``--repeat`` rounds; the best is reported.

Exactness (target: exact): ``--exact-events`` events through a shard that is split and whose children are merged, in
restore mode (what a Task with time uses), each hand-over with sessions open and timers pending; 20 late records come
before each hand-over and after the merge. The closed sessions must equal a plain-Python sessionization of the
on-time events, each once, and the late records be in the dead letters once. Writes ``<out>/time_engine.{json,png}``.

    .venv/bin/python bench/time_engine.py
"""

from __future__ import annotations

import json
import os
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
    REPO,
    LoadSampler,
    bar_plot,
    method_notes,
    options,
    parse,
    publish,
    rounds,
    runner_config,
    say,
    target,
    timed_query,
)

sys.path.insert(0, str(REPO / "examples" / "processors"))

GAP_SECONDS = 60
EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": 1}
COUNT = {"python": "spark_runtime.processor:CountProcessor"}
SESSIONS = {"python": "taskshard_examples.sessions:SessionWindow", "parameters": {"gapSeconds": GAP_SECONDS}}
PARTITIONS = 4
MAX_KEY_GROUPS = 128
SPARK_CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}
BEST_COLUMNS = ["run", "wall s (best)", "median s", "events/s", "CPU s (best)"]


def timed_events(n: int, keys: int, seed: int, start: int = 1_700_000_000_000) -> list[dict[str, Any]]:
    """``n`` events over ``keys`` keys; times move forward 2 ms per event on average, each late by < 1 s."""
    rng = random.Random(seed)
    out, t = [], start
    for _ in range(n):
        t += rng.randrange(0, 5)
        out.append({"key": f"k{rng.randrange(keys)}", "ts": t + rng.randrange(0, 900)})
    return out


def write_journal(journal: Path, events: list[dict[str, Any]]) -> int:
    from spark_runtime.produce import append_lines, partition_for

    by_partition: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for e in events:
        by_partition[partition_for(e["key"], PARTITIONS)].append(json.dumps(e, separators=(",", ":")))
    for p, lines in by_partition.items():
        append_lines(journal, p, lines)
    return sum(f.stat().st_size for f in journal.glob("p*.jsonl"))


def config(root: Path, journal: Path, shard: str, start: int, end: int, processor: dict, conf: dict, **extra: Any):
    """A shard of task ``tb`` on the journal (4 partitions), a 500 ms trigger, its metrics on a free port."""
    extra = {"task": "tb", "trigger": "500 milliseconds", "metricsPort": 0, **extra}
    return runner_config(root, journal, PARTITIONS, shard, start, end, processor, conf, **extra)


def start_work(args: Any, name: str, warm_events: int, warm_keys: int) -> tuple[Any, Path, Path, Path]:
    """The environment, a fresh ``<out>/<name>``, a SparkSession and the journals (measured and warm-up) of a
    throughput comparison: (spark, work, journal, warm journal)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [str(REPO), str(REPO / "examples" / "processors"), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    work = args.out / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from spark_runtime.session import spark_session

    spark = spark_session("local[2]", SPARK_CONF, app_name=f"taskshard-bench-{name.split('-')[0]}")
    journal, warm = work / "journal", work / "warm-journal"
    nbytes = write_journal(journal, timed_events(args.events, args.keys, args.seed))
    write_journal(warm, timed_events(warm_events, warm_keys, args.seed + 1))
    say(f"input: {args.events:,} events, {args.keys:,} keys, {nbytes / 1e6:.1f} MB")
    return spark, work, journal, warm


def best_table(runs: dict[str, list[dict[str, Any]]], events: int, ref: str) -> list[list[Any]]:
    """Per run: the best and median wall seconds, events/s of the best, the least CPU, the speed against ``ref``."""
    best = {n: min(r["seconds"] for r in rs) for n, rs in runs.items()}
    table = []
    for n, rs in runs.items():
        median, cpu = statistics.median(r["seconds"] for r in rs), min(r["cpuSeconds"] for r in rs)
        table.append([n, round(best[n], 2), round(median, 2), f"{events / best[n]:,.0f}", round(cpu, 1)])
        table[-1].append(f"{best[ref] / best[n]:.2f}x")
    return table


def run_throughput(spark: Any, work: Path, journal: Path, processor: dict, conf: dict, timed: bool) -> dict:
    from spark_runtime.shard import ShardRunner

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    extra = {"eventTime": EVENT_TIME} if timed else {}
    cfg = config(run_dir, journal, "tb-0-128", 0, MAX_KEY_GROUPS, processor, conf, **extra)
    runner = ShardRunner(cfg, spark, available_now=True)
    seconds, cpu, progress = timed_query(lambda: runner.start() or runner.query)
    runner.stop()
    shutil.rmtree(run_dir, ignore_errors=True)
    rows, batches = sum(int(p["numInputRows"]) for p in progress), sum(1 for p in progress if p["numInputRows"])
    return {"seconds": seconds, "cpuSeconds": cpu, "rows": rows, "batches": batches}


def emitted(root: Path) -> list[tuple[str, int, int, int]]:
    """The sessions of every shard's committed batches (not a batch in flight, which a stop may interrupt)."""
    from spark_runtime.results import read_committed, read_sink

    records = read_sink(root / "out", read_committed(root / "state", "tb"))
    return [(r["key"], r["start"], r["end"], r["count"]) for r in records]


def late_letters(root: Path) -> list[dict]:
    rows = []
    for path in sorted((root / "out").glob("_dead_letters/shard=*/late-b*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def catch_up(runners: list[Any], journal: Path, timeout: float = 600) -> None:
    """Poll ``runners`` until each committed the journal's end (every partition file's size)."""
    ends = {f.name: f.stat().st_size for f in journal.glob("p*.jsonl")}
    deadline = time.monotonic() + timeout
    pending = list(runners)
    while pending and time.monotonic() < deadline:
        for r in list(pending):
            r.poll()
            if r.last_committed >= 0 and r.positions_at(r.last_committed) == ends:
                pending.remove(r)
        time.sleep(0.2)
    if pending:
        raise RuntimeError(f"{[r.config.shard for r in pending]} did not reach {ends} in {timeout:.0f}s")


def run_exactness(spark: Any, work: Path, n: int, keys: int, seed: int, conf: dict) -> dict[str, Any]:
    """Split and merge mid-sessions (see the module docstring); returns what was compared."""
    from taskshard_examples.sessions import reference_sessions

    from spark_runtime.shard import ShardRunner

    root = work / "exact"
    shutil.rmtree(root, ignore_errors=True)
    journal = root / "journal"
    events = timed_events(n, keys, seed)
    rng = random.Random(seed + 1)
    late: list[dict] = []
    thirds = [events[: n // 3], events[n // 3 : 2 * n // 3], events[2 * n // 3 :]]

    def late_batch(count: int) -> list[dict]:
        batch = [{"key": f"k{rng.randrange(keys)}", "ts": 1_000 + i} for i in range(count)]
        late.extend(batch)
        return batch

    def shard(name: str, start: int, end: int, **extra: Any) -> Any:
        cfg = config(root, journal, name, start, end, SESSIONS, conf, eventTime=EVENT_TIME, **extra)
        return ShardRunner(cfg, spark)

    t0 = time.perf_counter()
    write_journal(journal, thirds[0])
    parent = shard("tb-0-128", 0, 128)
    parent.start()
    catch_up([parent], journal)
    write_journal(journal, late_batch(20))
    catch_up([parent], journal)
    restore = {"parent": "tb-0-128", "manifest": parent.drain()["manifest"]}
    children = [shard(f"tb-{a}-{b}", a, b, restoreFrom=restore) for a, b in ((0, 64), (64, 128))]
    for c in children:
        c.start()
    write_journal(journal, thirds[1] + late_batch(20))
    catch_up(children, journal)
    for c in children:
        c.drain()
    drained = [(nm, root / "state" / "tb" / "shards" / nm / "drained.json") for nm in ("tb-0-64", "tb-64-128")]
    merged = shard("tb-0-128-m1", 0, 128, mergeFrom=[{"parent": nm, "manifest": str(p)} for nm, p in drained])
    merged.start()
    write_journal(journal, thirds[2] + late_batch(20) + [{"key": "end", "ts": 10**13}])
    catch_up([merged], journal)
    expected = reference_sessions([(e["key"], e["ts"]) for e in events], GAP_SECONDS * 1000)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(emitted(root)) < len(expected):
        merged.poll()  # the batch after the "end" record closes every open session
        time.sleep(0.2)
    merged.stop()
    got, letters = emitted(root), late_letters(root)
    lettered = sorted((d["key"], json.loads(d["line"])["ts"]) for d in letters)
    result = {"events": n, "keys": keys, "sessions": len(expected), "emitted": len(got)}
    result |= {"duplicates": len(got) - len(set(got)), "missing": len(expected - set(got))}
    result |= {"extra": len(set(got) - expected), "late": len(late), "lateLetters": len(letters)}
    result["lateExact"] = lettered == sorted((e["key"], e["ts"]) for e in late)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["exact"] = result["duplicates"] == result["missing"] == result["extra"] == 0 and result["lateExact"]
    return result


def summarize(data: dict[str, Any]) -> list[str]:
    events, runs, exact = data["parameters"]["events"], data["raw"]["runs"], data["raw"]["exactness"]
    rate = {n: events / min(r["seconds"] for r in rs) for n, rs in runs.items()}
    count, sessions, verdict = rate["shard python count"], rate["shard python sessions"], exact["exact"]
    return [
        f"Sessions (event time, timers) ran at {sessions:,.0f} events/s against {count:,.0f} for the count "
        f"({sessions / count:.2f}x, best rounds); a split and a merge mid-sessions were "
        f"{'exact' if verdict else 'NOT exact'}."
    ]


def report(args: Any, runs: dict[str, list[dict]], exact: dict[str, Any]) -> dict[str, Any]:
    count, sessions = (min(r["seconds"] for r in runs[n]) for n in ("shard python count", "shard python sessions"))
    rate = f"{count / sessions:.2f}x ({args.events / sessions:,.0f} vs {args.events / count:,.0f} events/s)"
    exact_value = (
        f"{'exact' if exact['exact'] else 'NOT exact'}: {exact['emitted']:,} of {exact['sessions']:,} sessions, "
        f"{exact['duplicates']} twice; {exact['lateLetters']} of {exact['late']} late records"
    )
    speed = "Python session processor (event time, timers) vs Python count, same input (reported)"
    what = "split and merge mid-sessions: closed sessions = plain-Python sessionization, late records once"
    exactness = target(what, "exact", exact_value, exact["exact"], "see the exactness table")
    best = best_table(runs, args.events, "shard python count")
    tables = [
        ("Throughput (same input; count without event time)", [*BEST_COLUMNS, "vs python count"], best),
        ("Split and merge mid-sessions", ["measurement", "value"], [[k, v] for k, v in exact.items()]),
    ]
    targets, raw = [target(speed, "reported", rate, True), exactness], {"runs": runs, "exactness": exact}
    return {"title": "Time in the processor", "tables": tables, "targets": targets, "raw": raw}


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=7)
    ap.add_argument("--events", type=int, default=1_000_000, help="throughput input events (default 1,000,000)")
    ap.add_argument("--keys", type=int, default=100_000, help="throughput keys (default 100,000)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds (default 2)")
    ap.add_argument("--exact-events", type=int, default=200_000, help="events of the exactness run (default 200,000)")
    ap.add_argument("--exact-keys", type=int, default=5_000, help="keys of the exactness run (default 5,000)")
    args = parse(ap, argv)
    spark, work, journal, warm = start_work(args, "time-work", 20_000, 1_000)
    kinds = {"shard python count": (COUNT, False), "shard python sessions": (SESSIONS, True)}
    runs: dict[str, list[dict]] = {}
    with LoadSampler() as load:
        for measured, src, budget in rounds(args.repeat, journal, warm, args.batches, PARTITIONS):
            conf = {**SPARK_CONF, "spark.taskshard.maxBytesPerTrigger": str(budget)}
            for name, (processor, timed) in kinds.items():
                r = run_throughput(spark, work, src, processor, conf, timed)
                if measured:
                    runs.setdefault(name, []).append(r)
                    say(f"{name}: {r['seconds']:.1f} s, cpu {r['cpuSeconds']:.1f} s, rows {r['rows']:,}")
        exact = run_exactness(spark, work, args.exact_events, args.exact_keys, args.seed + 2, SPARK_CONF)
        say(f"exactness: {exact}")
    rates = {n: args.events / min(r["seconds"] for r in rs) for n, rs in runs.items()}
    title = "Python processor: sessions (event time, timers) vs count"
    bar_plot(args.out / "time_engine.png", rates, xlabel="events/s (best round)", title=title)
    plots, notes = ["time_engine.png"], method_notes(__doc__)
    publish("time_engine", args, argv, load=load.summary(), plots=plots, notes=notes, **report(args, runs, exact))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if exact["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
