"""Builtin windows on Spark: tumbling, sliding and session windows exact against a plain-Python reference over a
restart, an aborted split, a split and a merge with windows open; late records in the dead letters once; the
watermark never going back across a hand-over.

One shared SparkSession; each test is one chain of shards (root, restart, two split children, a merged shard)
over a 16-key-group task.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from .conftest import TaskEnv, wait_caught_up
from .test_time import emitted, late_letters
from .window_reference import reference_windows

pytestmark = pytest.mark.spark

EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": 1}
END_TS = 10**12
"""The last record's event time: its watermark closes every window of the test."""


def window_events(n: int, start: int, rng: random.Random) -> list[dict]:
    """``n`` events over 24 keys and ``hot`` (every fourth event: one session for the whole run, so a hand-over
    restores a session many gaps long) whose event times move forward, each out of order by less than the 1 s bound
    (so none is late), with a value ``v``."""
    out, t = [], start
    for i in range(n):
        t += rng.randrange(0, 250)
        key = "hot" if i % 4 == 0 else f"u{rng.randrange(24)}"
        out.append({"key": key, "ts": t + rng.randrange(0, 900), "v": rng.randrange(1, 100)})
    return out


def watermark_of(summary: dict) -> int:
    return json.loads(Path(summary["manifest"]).read_text())["watermarkMs"]


def open_windows(summary: dict) -> int:
    """The windows a drained shard handed over (its snapshot's rows)."""
    return json.loads(Path(summary["manifest"]).read_text())["snapshot"]["rows"]


def abort_a_split(env: TaskEnv, spark) -> None:
    """A split of the stopped root withdrawn: its children start on standby (restore mode: they wait for the root's
    drain), the operator's abort deletes them and runs the root once with ``--abort-split``; only their fences
    are left."""
    from spark_runtime.handover import abort_split
    from spark_runtime.shard import ShardRunner

    from .test_standby import InThread, release, shard_dir

    restore = {"parent": "orders-0-16", "manifest": str(shard_dir(env, "orders-0-16") / "drained.json")}
    standby = [ShardRunner(env.config(a, b, restore, eventTime=EVENT_TIME), spark) for a, b in [(0, 8), (8, 16)]]
    threads = [InThread(c.run, f"standby {c.config.shard}") for c in standby]
    # One after the other: two threads starting streaming queries at the same moment on one SparkSession can make
    # a task's closure fail to deserialize (java.io.OptionalDataException, seen once in CI); a pod has one runtime.
    for runner, thread in zip(standby, threads, strict=True):
        thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and runner.rehearsal_seconds is None and thread.is_alive():
            time.sleep(0.2)  # until it rehearsed the window plan on standby
        assert runner.rehearsal_seconds is not None, f"{runner.config.shard} did not rehearse its window plan"
    release(standby, threads)
    summary = abort_split(ShardRunner(env.config(0, 16, eventTime=EVENT_TIME), spark).io, ["orders-0-8", "orders-8-16"])
    assert summary["event"] == "aborted"
    for child in ("orders-0-8", "orders-8-16"):
        assert {f.name for f in shard_dir(env, child).iterdir()} == {"epochs"}, "only the fence is left"
    assert not list(env.sink.glob("shard=orders-0-8/**/batch-*")), "the standby children never emitted"


def run_chain(
    env: TaskEnv, spark, events: list[dict], expected: int, abort: bool = False, split_at: int = 8
) -> tuple[list[dict], list[dict]]:
    """Root, restart (with ``abort``: and a split withdrawn meanwhile), split into two at ``split_at``, merge back;
    late records between the steps. Returns the emitted records (once ``expected`` windows, or more, were written
    after the closing record) and the late records produced."""
    from spark_runtime.shard import ShardRunner

    rng = random.Random(5)
    late: list[dict] = []

    def produce_late(n: int) -> None:  # far behind any watermark the earlier batches set
        batch = [{"key": f"u{rng.randrange(24)}", "ts": 1_000 + i, "v": 1} for i in range(n)]
        late.extend(batch)
        env.produce(batch)

    q = len(events) // 5
    root = ShardRunner(env.config(0, 16, eventTime=EVENT_TIME), spark)
    root.start()
    env.produce(events[:q])
    wait_caught_up(env, [root])
    produce_late(5)
    env.produce(events[q : 2 * q])
    wait_caught_up(env, [root])
    root.stop()  # a restart resumes the open windows and the watermark from the checkpoint
    if abort:
        abort_a_split(env, spark)
    root = ShardRunner(env.config(0, 16, eventTime=EVENT_TIME), spark)
    root.start()
    env.produce(events[2 * q : 3 * q])
    wait_caught_up(env, [root])
    summary = root.drain()
    assert open_windows(summary) > 0, "the split hands over no open window"
    parent_watermark = watermark_of(summary)
    assert parent_watermark >= max(e["ts"] for e in events[: 3 * q]) - 1_000

    restore = {"parent": "orders-0-16", "manifest": summary["manifest"]}
    halves = [(0, split_at), (split_at, 16)]
    children = [ShardRunner(env.config(a, b, restore, eventTime=EVENT_TIME), spark) for a, b in halves]
    assert all(c.handover_mode == "restore" for c in children)
    for c in children:
        c.start()
    produce_late(4)  # late for the children too: they start at the parent's watermark
    assert min(c.plan.watermark_floor_ms for c in children) == parent_watermark
    env.produce(events[3 * q : 4 * q])
    wait_caught_up(env, children)
    drained = [c.drain() for c in children]
    assert sum(open_windows(d) for d in drained) > 0, "the merge takes over no open window"
    finals = [watermark_of(d) for d in drained]
    assert min(finals) >= parent_watermark

    parents = [
        {"parent": name, "manifest": str(env.storage / env.task / "shards" / name / "drained.json")}
        for name in (env.shard_name(*halves[0]), env.shard_name(*halves[1]))
    ]
    merged = ShardRunner(env.config(0, 16, shard="orders-0-16-m1", mergeFrom=parents, eventTime=EVENT_TIME), spark)
    merged.start()
    assert merged.plan.watermark_floor_ms == max(finals)
    produce_late(3)
    env.produce(events[4 * q :] + [{"key": "end", "ts": END_TS, "v": 0}])
    wait_caught_up(env, [merged])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len([r for r in emitted(env) if r["key"] != "end"]) < expected:
        merged.poll()  # the batch after the closing record writes the last windows (run as the watermark moves)
        time.sleep(0.2)
    merged.stop()
    return [r for r in emitted(env) if r["key"] != "end"], late


def assert_late_once(env: TaskEnv, late: list[dict]) -> None:
    letters = late_letters(env)
    assert sorted((d["key"], json.loads(d["line"])["ts"]) for d in letters) == sorted((e["key"], e["ts"]) for e in late)
    assert {d["reason"] for d in letters} == {"late"}


@pytest.mark.parametrize(
    ("window", "builtin", "nested"),
    [
        ({"type": "tumbling", "sizeSeconds": 2}, {"builtin": "count"}, False),
        # key groups nested in the journal's partitions: the state key carries the key group
        ({"type": "session", "gapSeconds": 1.5}, {"builtin": "sum", "field": "v"}, True),
    ],
    ids=["tumbling-count", "session-sum-partitioned-by-key"],
)
def test_final_windows_stay_exact_across_a_restart_a_split_and_a_merge(make_task, shard_spark, window, builtin, nested):
    env = make_task(processor={**builtin, "window": window}, partitioned_by_key=nested)
    events = window_events(1500, 1_000_000, random.Random(3))
    kind, aggregate = window["type"], builtin["builtin"]
    expected = reference_windows(
        kind,
        aggregate,
        [(e["key"], e["ts"], e["v"]) for e in events],
        size_ms=int(window.get("sizeSeconds", 0) * 1000),
        gap_ms=int(window.get("gapSeconds", 0) * 1000),
    )
    # The tumbling run splits at key group 1 (a one-key-group child: its batches keep little or nothing).
    tumbling = kind == "tumbling"
    got, late = run_chain(env, shard_spark, events, len(expected), abort=tumbling, split_at=1 if tumbling else 8)
    windows = [(r["key"], r["window_start"], r["window_end"]) for r in got]
    assert len(windows) == len(set(windows)), "a window was written twice"
    assert {(r["key"], r["window_start"], r["window_end"]): r["result"] for r in got} == expected
    assert_late_once(env, late)


def test_sliding_updates_end_at_the_exact_values_across_a_split_and_a_merge(make_task, shard_spark):
    window = {"type": "sliding", "sizeSeconds": 3, "slideSeconds": 1, "emit": "updates"}
    env = make_task(processor={"builtin": "max", "field": "v", "window": window})
    events = window_events(1000, 2_000_000, random.Random(4))
    expected = reference_windows(
        "sliding", "max", [(e["key"], e["ts"], e["v"]) for e in events], size_ms=3_000, slide_ms=1_000
    )
    got, late = run_chain(env, shard_spark, events, len(expected))
    last: dict[tuple, float] = {}
    for r in sorted(got, key=lambda r: r["batch"]):  # updates only grow a max: the largest is the last
        k = (r["key"], r["window_start"], r["window_end"])
        last[k] = max(last.get(k, r["result"]), r["result"])
    assert last == expected
    assert_late_once(env, late)
