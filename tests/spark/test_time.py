"""Time in the processor on Spark: event-time sessions exact over a restart, a split and a merge with sessions
open and timers pending, late records in the dead letters once, the watermark never going back across a
hand-over; and a processing-time timer that fires with no new input.

One shared SparkSession; each test is one chain of shards over a 16-key-group task.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from .conftest import TaskEnv, wait_caught_up
from .time_processors import reference_sessions

pytestmark = pytest.mark.spark

GAP_MS = 5_000
EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": 1}


def session_events(n: int, start: int, rng: random.Random) -> list[dict]:
    """``n`` events over 24 keys whose event times move forward, each out of order by less than the 1 s bound."""
    out, t = [], start
    for _ in range(n):
        t += rng.randrange(0, 250)
        out.append({"key": f"u{rng.randrange(24)}", "ts": t + rng.randrange(0, 900)})
    return out


def emitted(env: TaskEnv) -> list[dict]:
    """Every output record of every shard's committed batches (sessions are not one value per key). Not the pending
    file of a batch in flight: a stop may interrupt that batch, and its successor redoes it."""
    from spark_runtime.results import read_committed, read_sink

    return read_sink(env.sink, read_committed(env.storage, env.task))


def late_letters(env: TaskEnv) -> list[dict]:
    rows = []
    for path in sorted(env.sink.glob("_dead_letters/shard=*/late-b*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def drained_manifest(summary: dict) -> dict:
    return json.loads(Path(summary["manifest"]).read_text())


def test_sessions_stay_exact_across_a_restart_a_split_and_a_merge(make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env = make_task(processor={"python": "tests.spark.time_processors:SessionWindow", "parameters": {"gapSeconds": 5}})
    rng = random.Random(3)
    events = session_events(1500, 1_000_000, rng)
    late = []

    def produce_late(n: int) -> None:  # far behind any watermark the earlier batches set
        batch = [{"key": f"u{rng.randrange(24)}", "ts": 1_000 + i} for i in range(n)]
        late.extend(batch)
        env.produce(batch)

    root = ShardRunner(env.config(0, 16, eventTime=EVENT_TIME), shard_spark)
    root.start()
    env.produce(events[:400])
    wait_caught_up(env, [root])
    produce_late(5)
    env.produce(events[400:500])
    wait_caught_up(env, [root])
    root.stop()  # a restart resumes the watermark and the pending timers from the checkpoint
    root = ShardRunner(env.config(0, 16, eventTime=EVENT_TIME), shard_spark)
    root.start()
    env.produce(events[500:700])
    wait_caught_up(env, [root])
    summary = root.drain()
    parent_watermark = drained_manifest(summary)["watermarkMs"]
    assert parent_watermark >= max(e["ts"] for e in events[:600]) - 1_000

    # The split children restore open sessions and their timers, and start at the parent's final watermark: a
    # record the parent would have called late is late in a child too.
    restore = {"parent": "orders-0-16", "manifest": summary["manifest"]}
    children = [ShardRunner(env.config(a, b, restore, eventTime=EVENT_TIME), shard_spark) for a, b in [(0, 8), (8, 16)]]
    assert all(c.handover_mode == "restore" for c in children)
    for c in children:
        c.start()
    produce_late(4)
    assert min(c.plan.watermark_floor_ms for c in children) == parent_watermark
    env.produce(events[700:1100])
    wait_caught_up(env, children)
    finals = [drained_manifest(c.drain())["watermarkMs"] for c in children]
    assert min(finals) >= parent_watermark

    parents = [
        {"parent": name, "manifest": str(env.storage / env.task / "shards" / name / "drained.json")}
        for name in ("orders-0-8", "orders-8-16")
    ]
    merged = ShardRunner(
        env.config(0, 16, shard="orders-0-16-m1", mergeFrom=parents, eventTime=EVENT_TIME), shard_spark
    )
    merged.start()
    assert merged.plan.watermark_floor_ms == max(finals)
    produce_late(3)
    env.produce(events[1100:] + [{"key": "end", "ts": 10**12}])
    wait_caught_up(env, [merged])
    deadline = time.monotonic() + 60
    expected = reference_sessions([(e["key"], e["ts"]) for e in events], GAP_MS)
    while time.monotonic() < deadline and len(emitted(env)) < len(expected):
        merged.poll()  # the batch after the "end" record closes every session (Spark runs it as the watermark moves)
        time.sleep(0.2)
    merged.stop()

    got = [(r["key"], r["start"], r["end"], r["count"]) for r in emitted(env)]
    assert len(got) == len(set(got)), "a session was emitted twice"
    assert set(got) == expected
    letters = late_letters(env)
    assert sorted((d["key"], json.loads(d["line"])["ts"]) for d in letters) == sorted((e["key"], e["ts"]) for e in late)
    assert {d["reason"] for d in letters} == {"late"}
    assert merged.late_letters is not None and merged.late_letters.total == 3  # its own: the last three


def test_a_processing_time_timer_fires_without_new_input_once_across_a_split(make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env = make_task(
        # 30 s of silence: the parent's catch-up and drain must end before any timer fires, and on a loaded 2-core
        # machine they took more than 10 s.
        processor={"python": "tests.spark.time_processors:SilenceAlert", "parameters": {"silenceSeconds": 30}},
        trigger="1 second",  # a batch every trigger, with room between them for the drain's batch boundary
    )
    keys = [f"s{i}" for i in range(8)]
    parent = ShardRunner(env.config(0, 16), shard_spark)
    parent.start()
    env.produce([{"key": k} for k in keys])
    wait_caught_up(env, [parent])
    summary = parent.drain()  # within the 30 s of silence: every timer is pending in the final snapshot
    assert emitted(env) == [], "the parent drained after the silence; the test needs it to drain before"
    restore = {"parent": "orders-0-16", "manifest": summary["manifest"]}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in [(0, 8), (8, 16)]]
    for c in children:
        c.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(emitted(env)) < len(keys):
        for c in children:
            c.poll()
        time.sleep(0.2)
    for c in children:
        c.stop()
        assert c.positions_at(c.last_committed) == summary["positions"], "no input after the parent's"
    alerts = emitted(env)
    assert sorted(r["key"] for r in alerts) == keys, "each silent key alerts once, by the child that owns it"
    assert {r["shard"] for r in alerts} <= {"orders-0-8", "orders-8-16"}


def test_declaring_timers_on_a_running_checkpoint_is_refused_before_anything_runs(make_task, shard_spark):
    from spark_runtime.checkpoint import last_committed_batch
    from spark_runtime.problems import TemplateRefused
    from spark_runtime.shard import ShardRunner

    env = make_task(processor={"python": "tests.spark.time_processors:LastSeen"})
    runner = ShardRunner(env.config(0, 16), shard_spark)
    runner.start()
    env.produce([{"key": "a"}])
    wait_caught_up(env, [runner])
    runner.stop()
    committed = runner.last_committed
    # The same state plus a timer column (a schema change the engine accepts), but another Spark timeMode.
    env.processor = {"python": "tests.spark.time_processors:SilenceAlert", "parameters": {"silenceSeconds": 5}}
    again = ShardRunner(env.config(0, 16), shard_spark)
    with pytest.raises(TemplateRefused) as refused:
        again.prepare()
    assert refused.value.reason == "TimeModeChanged"
    assert "timeMode None" in str(refused.value) and "ProcessingTime" in str(refused.value)
    assert last_committed_batch(again.paths.checkpoint) == committed, "nothing ran"
