"""A split can always finish: a shard whose query fails on every attempt of a batch (a poison record; here the
fault hook ``TASKSHARD_FAULT_FAIL_BATCH``) still drains, exporting its last committed batch, and a pod restarted
in the middle of its final drain drains without starting its query again (before, both crash-looped forever).
The children restore from that snapshot and, without the fault (a fixed template), count every event once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from spark_runtime.produce import generate_events

from .conftest import Reference, wait_caught_up, wait_progress

pytestmark = pytest.mark.spark


def _failing_root(env, shard_spark, monkeypatch, ref: Reference, events: list):
    """A root shard that committed batch 0 and whose batch 1 fails on every attempt."""
    from spark_runtime.faults import FAIL_BATCH_ENV
    from spark_runtime.shard import ShardRunner

    monkeypatch.setenv(FAIL_BATCH_ENV, "1")
    root = ShardRunner(env.config(0, 16), shard_spark)
    monkeypatch.delenv(FAIL_BATCH_ENV)
    env.produce(events[:300])
    ref.add_all(events[:300])
    root.start()
    wait_caught_up(env, [root])
    assert env.progress(root.config.shard)["batchId"] == 0
    env.produce(events[300:600])  # batch 1: it fails, every attempt
    ref.add_all(events[300:600])
    deadline = time.monotonic() + 90
    while root.query.exception() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert root.query.exception() is not None and "fault injection: batch 1 fails" in str(root.query.exception())
    return root


def _children_finish_exactly(env, shard_spark, summary: dict, ref: Reference, rest: list) -> list[dict]:
    """Both children restore the parent's drain, read ``rest`` too and count every event once; returns their
    drain summaries."""
    from spark_runtime.shard import ShardRunner

    restore = {"parent": "orders-0-16", "manifest": summary["manifest"]}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in ((0, 8), (8, 16))]
    for child in children:
        child.start()
    env.produce(rest)
    ref.add_all(rest)
    wait_caught_up(env, children)
    assert env.results() == ref.results
    return [child.drain() for child in children]


def test_a_drain_exports_the_last_committed_batch_when_the_query_failed(make_task, shard_spark, monkeypatch):
    env = make_task(processor={"builtin": "count"}, max_key_groups=16)
    ref, events = Reference("count"), list(generate_events(800, 80, seed=31))
    root = _failing_root(env, shard_spark, monkeypatch, ref, events)
    root.request_drain("split")
    summary = root.drain()  # used to raise ShardFailed: the pod exited 1, restarted, failed again, forever
    assert summary["event"] == "drained" and summary["batchId"] == 0
    assert not list((env.sink / "shard=orders-0-16").glob("batch-1.*")), "the failed batch wrote nothing visible"
    _children_finish_exactly(env, shard_spark, summary, ref, events[600:])


def test_a_restart_during_a_final_drain_drains_without_processing(make_task, shard_spark, monkeypatch):
    from spark_runtime.faults import FAIL_BATCH_ENV
    from spark_runtime.shard import ShardRunner

    env = make_task(processor={"builtin": "count"}, max_key_groups=16)
    ref, events = Reference("count"), list(generate_events(800, 80, seed=37))
    root = _failing_root(env, shard_spark, monkeypatch, ref, events)
    # The drain began (its marker is step 1), then the pod died on the failing query, before the summary.
    root.paths.drain_marker.write_text("final 2026-11-22T00:00:00Z\n")
    root.stop()
    monkeypatch.setenv(FAIL_BATCH_ENV, "1")  # the poison record is still there
    restarted = ShardRunner(env.config(0, 16), shard_spark)
    restarted.request_drain("SIGTERM", final=False)  # the pod is deleted as it restarts: the drain stays final
    summary = restarted.run(poll_interval=0.1)
    assert restarted.query is None, "the restarted pod did not start its query"
    assert summary["event"] == "drained" and summary["batchId"] == 0
    assert json.loads(Path(summary["manifest"]).read_text())["batchId"] == 0
    assert wait_progress(env, "orders-0-16", lambda p: p["batchId"] == 0)
    monkeypatch.delenv(FAIL_BATCH_ENV)
    _children_finish_exactly(env, shard_spark, summary, ref, events[600:])


BAD = ["{bad json", '{"key": null, "amount": 1}', '{"key": "k3", "amount": "lots"}']
"""Three malformed records per partition: the batch that reads them writes their dead letters."""


def consumer_dead_letters(env) -> list[dict]:
    """Every dead letter of the Task, read as its consumer reads them: each line of each file under the sink's
    ``_dead_letters/`` (every shard's directory, published files only)."""
    return [
        json.loads(line)
        for f in sorted((env.sink / "_dead_letters").glob("shard=*/*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]


def test_a_batch_that_failed_after_its_read_leaves_its_dead_letters_once_across_the_split(
    make_task, shard_spark, monkeypatch
):
    """A poison record fails batch 1 after the journal read wrote that batch's dead letters; the split's drain
    exports batch 0, the children (the template fixed) redo batch 1's input and write its dead letters
    themselves. Each malformed record is a dead letter once, for the consumer and in the shards' counts (the
    drain used to leave the failed batch's files: each one counted twice)."""
    from spark_runtime.produce import append_lines
    from spark_runtime.shard import ShardRunner

    poison = {"python": "tests.spark.engine_processors:Poison", "parameters": {"failKey": "k7", "failValue": -1.0}}
    env = make_task(processor=poison, max_key_groups=16)
    ref, events = Reference("count"), list(generate_events(700, 40, seed=43))
    root = ShardRunner(env.config(0, 16), shard_spark)
    env.produce(events[:300])
    ref.add_all(events[:300])
    root.start()
    try:
        wait_caught_up(env, [root])
        assert env.progress(root.config.shard)["batchId"] == 0
        for p in range(env.partitions):
            append_lines(env.journal, p, BAD)
        env.produce(events[300:500] + [{"key": "k7", "amount": -1.0, "seq": 500}])
        ref.add_all(events[300:500] + [{"key": "k7", "amount": -1.0, "seq": 500}])
        deadline = time.monotonic() + 120
        while root.query.exception() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert root.query.exception() is not None and "cannot process key 'k7'" in str(root.query.exception())
        assert len(consumer_dead_letters(env)) == len(BAD) * env.partitions, "the failed batch's read wrote them"
        assert last_committed(env, root) == 0
        root.request_drain("split")
        summary = root.drain()
    finally:
        root.stop()
    assert summary["event"] == "drained" and summary["batchId"] == 0 and summary["deadLetters"] == 0
    assert consumer_dead_letters(env) == [], "the drain removed the dead letters of the batch that never committed"

    env.processor = {"python": "tests.spark.engine_processors:Poison", "parameters": {}}  # the user's fix
    summaries = _children_finish_exactly(env, shard_spark, summary, ref, events[501:])
    letters = consumer_dead_letters(env)
    assert len(letters) == len(BAD) * env.partitions, f"each malformed record once: {letters}"
    assert len({(d["partition"], d["offset"]) for d in letters}) == len(letters)
    assert sum(s["deadLetters"] for s in summaries) + summary["deadLetters"] == len(BAD) * env.partitions


def last_committed(env, runner) -> int:
    return int(env.progress(runner.config.shard)["batchId"])
