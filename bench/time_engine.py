"""Time in the processor: the event-time session processor's throughput next to the Python count on the same input,
and the exactness of a split and a merge in the middle of open sessions and pending timers.

A script, not a test. It writes ``--events`` JSON events ``{"key", "ts"}`` over ``--keys`` keys into a journal
(event times move forward, each out of order by less than the 1 s watermark bound) and, in one SparkSession
(local[2], RocksDB with changelog checkpointing, trigger ``availableNow``, the input cut into ``--batches``
micro-batches, a fresh checkpoint each):

1. **Throughput**: ``shard python count`` (:class:`spark_runtime.engine.api.CountProcessor`, no event time) and
   ``shard python sessions`` (``taskshard_examples.sessions:SessionWindow`` with ``spec.eventTime``: watermark,
   late filter, one event-time timer per key) over the same journal; a warm-up round on a small journal first, then
   ``--repeat`` measured rounds, each running both once; the best round is reported (the median is in the JSON).
   No target: the issue asks for the ratio to be reported.
2. **Exactness across hand-overs**: ``--exact-events`` events with late records mixed in, through a shard that is
   split (restore hand-over) and whose children are merged, each hand-over with sessions open and timers pending;
   the closed sessions every shard emitted must equal a plain-Python sessionization of the on-time events, each
   once, and the late records must be in the dead letters once. Target: exact.
(Builtin windows have their own benchmark: ``bench/windows_throughput.py``.)

Prints tables and writes ``<out>/time_engine.{json,png}``.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/time_engine.py
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench", REPO / "examples" / "processors"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from common import DEFAULT_OUT, LoadSampler, command_line, machine, print_table, pyplot, say, write_result  # noqa: E402
from shard_throughput import cpu_since, tree_cpu_seconds  # noqa: E402
from taskshard_examples.sessions import reference_sessions  # noqa: E402

from spark_runtime.config import parse_config  # noqa: E402
from spark_runtime.produce import append_lines, partition_for  # noqa: E402

GAP_SECONDS = 60
EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": 1}
COUNT = {"python": "spark_runtime.processor:CountProcessor"}
SESSIONS = {"python": "taskshard_examples.sessions:SessionWindow", "parameters": {"gapSeconds": GAP_SECONDS}}
PARTITIONS = 4
MAX_KEY_GROUPS = 128


def timed_events(n: int, keys: int, seed: int, start: int = 1_700_000_000_000) -> list[dict[str, Any]]:
    """``n`` events over ``keys`` keys; times move forward 2 ms per event on average, each late by < 1 s."""
    rng = random.Random(seed)
    out, t = [], start
    for _ in range(n):
        t += rng.randrange(0, 5)
        out.append({"key": f"k{rng.randrange(keys)}", "ts": t + rng.randrange(0, 900)})
    return out


def write_journal(journal: Path, events: list[dict[str, Any]]) -> int:
    by_partition: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for e in events:
        by_partition[partition_for(e["key"], PARTITIONS)].append(json.dumps(e, separators=(",", ":")))
    for p, lines in by_partition.items():
        append_lines(journal, p, lines)
    return sum(f.stat().st_size for f in journal.glob("p*.jsonl"))


def config(root: Path, journal: Path, shard: str, start: int, end: int, processor: dict, conf: dict, **extra: Any):
    return parse_config(
        {
            "task": "tb",
            "shard": shard,
            "maxKeyGroups": MAX_KEY_GROUPS,
            "keyGroups": {"start": start, "end": end},
            "processor": processor,
            "source": {"journal": {"path": str(journal), "partitions": PARTITIONS}},
            "sink": {"directory": {"path": str(root / "out"), "format": "jsonl"}},
            "storage": {"path": str(root / "state")},
            "spark": {"master": "local[2]", "conf": conf, "triggerInterval": "500 milliseconds"},
            "metricsPort": 0,
            **extra,
        }
    )


def run_throughput(spark: Any, work: Path, journal: Path, processor: dict, conf: dict, timed: bool) -> dict:
    from spark_runtime.shard import ShardRunner

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    extra = {"eventTime": EVENT_TIME} if timed else {}
    runner = ShardRunner(
        config(run_dir, journal, "tb-0-128", 0, MAX_KEY_GROUPS, processor, conf, **extra), spark, available_now=True
    )
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    runner.start()
    runner.query.awaitTermination()
    seconds, cpu = time.perf_counter() - t0, cpu_since(c0)
    progress = [json.loads(p.json) for p in runner.query.recentProgress]
    rows = sum(int(p["numInputRows"]) for p in progress)
    runner.stop()
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "seconds": seconds,
        "cpuSeconds": cpu,
        "rows": rows,
        "batches": sum(1 for p in progress if p["numInputRows"]),
    }


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
    summary = parent.drain()
    restore = {"parent": "tb-0-128", "manifest": summary["manifest"]}
    children = [shard(f"tb-{a}-{b}", a, b, restoreFrom=restore) for a, b in ((0, 64), (64, 128))]
    for c in children:
        c.start()
    write_journal(journal, thirds[1] + late_batch(20))
    catch_up(children, journal)
    for c in children:
        c.drain()
    parents = [
        {"parent": nm, "manifest": str(root / "state" / "tb" / "shards" / nm / "drained.json")}
        for nm in ("tb-0-64", "tb-64-128")
    ]
    merged = shard("tb-0-128-m1", 0, 128, mergeFrom=parents)
    merged.start()
    ends = [{"key": k, "ts": 10**13} for k in ("end",)]
    write_journal(journal, thirds[2] + late_batch(20) + ends)
    catch_up([merged], journal)
    expected = reference_sessions([(e["key"], e["ts"]) for e in events], GAP_SECONDS * 1000)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(emitted(root)) < len(expected):
        merged.poll()  # the batch after the "end" record closes every open session
        time.sleep(0.2)
    merged.stop()
    got = emitted(root)
    letters = late_letters(root)
    result = {
        "events": n,
        "keys": keys,
        "sessions": len(expected),
        "emitted": len(got),
        "duplicates": len(got) - len(set(got)),
        "missing": len(expected - set(got)),
        "extra": len(set(got) - expected),
        "late": len(late),
        "lateLetters": len(letters),
        "lateExact": sorted((d["key"], json.loads(d["line"])["ts"]) for d in letters)
        == sorted((e["key"], e["ts"]) for e in late),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    result["exact"] = result["duplicates"] == result["missing"] == result["extra"] == 0 and result["lateExact"]
    return result


def plot(rows: list[tuple[str, float]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=["#4c72b0", "#dd8452"])
    ax.set_xlabel("events/s (best round)")
    ax.set_title("Python processor: sessions (event time, timers) vs count")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="throughput input events (default 1,000,000)")
    ap.add_argument("--keys", type=int, default=100_000, help="throughput keys (default 100,000)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--repeat", type=int, default=2, help="measured rounds (default 2)")
    ap.add_argument("--exact-events", type=int, default=200_000, help="events of the exactness run (default 200,000)")
    ap.add_argument("--exact-keys", type=int, default=5_000, help="keys of the exactness run (default 5,000)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "examples" / "processors"), os.environ.get("PYTHONPATH", "")]
    )
    out = args.out.resolve()
    work = out / "time-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    from spark_runtime.session import spark_session

    conf = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}
    spark = spark_session("local[2]", conf, app_name="taskshard-bench-time")
    journal, warm = work / "journal", work / "warm-journal"
    nbytes = write_journal(journal, timed_events(args.events, args.keys, args.seed))
    write_journal(warm, timed_events(20_000, 1_000, args.seed + 1))
    say(f"input: {args.events:,} events, {args.keys:,} keys, {nbytes / 1e6:.1f} MB")
    kinds = {"shard python count": (COUNT, False), "shard python sessions": (SESSIONS, True)}
    runs: dict[str, list[dict]] = {}
    with LoadSampler() as load:
        for attempt in range(args.repeat + 1):
            measured = attempt > 0
            src = journal if measured else warm
            largest = max(f.stat().st_size for f in src.glob("p*.jsonl"))
            budget = (-(-largest // (args.batches if measured else 2)) + 256) * PARTITIONS
            kind_conf = {**conf, "spark.taskshard.maxBytesPerTrigger": str(budget)}
            for name, (processor, timed) in kinds.items():
                r = run_throughput(spark, work, src, processor, kind_conf, timed)
                if measured:
                    runs.setdefault(name, []).append(r)
                    say(f"{name}: {r['seconds']:.1f} s, cpu {r['cpuSeconds']:.1f} s, rows {r['rows']:,}")
        exact = run_exactness(spark, work, args.exact_events, args.exact_keys, args.seed + 2, conf)
        say(f"exactness: {exact}")
    load_summary = load.summary()

    best = {n: min(r["seconds"] for r in rs) for n, rs in runs.items()}
    count, sessions = best["shard python count"], best["shard python sessions"]
    table = [
        [
            n,
            round(best[n], 2),
            round(statistics.median(r["seconds"] for r in rs), 2),
            f"{args.events / best[n]:,.0f}",
            round(min(r["cpuSeconds"] for r in rs), 1),
            f"{count / best[n]:.2f}x",
        ]
        for n, rs in runs.items()
    ]
    columns = ["run", "wall s (best)", "median s", "events/s", "CPU s (best)", "vs python count"]
    print_table("Throughput", columns, table, load_summary)
    exact_rows = [[k, v] for k, v in exact.items()]
    print_table("Split and merge mid-sessions", ["measurement", "value"], exact_rows)
    targets = [
        {
            "name": "Python session processor (event time, timers) vs Python count, same input (reported)",
            "target": "reported",
            "value": f"{count / sessions:.2f}x ({args.events / sessions:,.0f} vs {args.events / count:,.0f} events/s)",
            "met": True,
        },
        {
            "name": "split and merge mid-sessions: closed sessions = plain-Python sessionization, late records once",
            "target": "exact",
            "value": (
                f"{'exact' if exact['exact'] else 'NOT exact'}: {exact['emitted']:,} of {exact['sessions']:,} "
                f"sessions, {exact['duplicates']} twice; {exact['lateLetters']} of {exact['late']} late records"
            ),
            "met": bool(exact["exact"]),
            "why": "see the exactness table" if not exact["exact"] else None,
        },
    ]
    plot([(n, args.events / best[n]) for n in runs], out / "time_engine.png")
    payload = {
        "title": "Time in the processor",
        "command": command_line(argv),
        "machine": machine(),
        "load": load_summary,
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tables": [
            {"title": "Throughput (same input; count without event time)", "columns": columns, "rows": table},
            {"title": "Split and merge mid-sessions", "columns": ["measurement", "value"], "rows": exact_rows},
        ],
        "targets": targets,
        "plots": ["time_engine.png"],
        "notes": [
            f"Sessions: `SessionWindow` with a {GAP_SECONDS} s gap and `spec.eventTime` (1 s out-of-orderness); the "
            "count is `CountProcessor` without event time. Both on the runs state layout, one SparkSession, "
            "availableNow, the best of the measured rounds.",
            "The exactness run hands over in restore mode (what a Task with time uses): a split of the whole "
            "range, then a merge of the two children; 20 late records are produced before each hand-over and "
            "after the merge.",
        ],
        "raw": {"runs": runs, "exactness": exact},
    }
    write_result(out, "time_engine", payload)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if exact["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
