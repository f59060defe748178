"""Standby split children in restore mode (``HandoverMode.RESTORE``, what a Kafka child does; forced here on the
journal with ``catch_up=False``): a child whose ``restoreFrom.manifest`` names the parent's drain summary
(``drained.json``) starts while the parent still runs, warms up (Spark, preflight, a rehearsal of its restore
plan on a synthetic snapshot) and processes nothing until the parent's final drain wrote the summary; then it
restores from the manifest the summary names. The task's results equal the reference: no event lost, none
counted twice. A SIGTERM on standby stops without processing; a summary of another shard is refused.

All in the shared SparkSession (``shard_spark``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_runtime.produce import generate_events

from .conftest import TaskEnv, wait_caught_up
from .test_split import PROCESSORS, check_child_read_only_its_slice, task_with_reference

pytestmark = pytest.mark.spark

PARENT = "orders-0-16"
HALVES = [(0, 8), (8, 16)]


class InThread(threading.Thread):
    """Runs ``call()`` (a runner's ``start`` or ``run``) in a daemon thread; keeps its result or exception."""

    def __init__(self, call: Callable[[], Any], name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.call = call
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def finish(self, timeout: float) -> Any:
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not return within {timeout}s"
        if self.error is not None:
            raise AssertionError(f"{self.name} raised {self.error!r}") from self.error
        return self.result


def shard_dir(env: TaskEnv, shard: str) -> Path:
    return env.storage / env.task / "shards" / shard


def first_offsets(env: TaskEnv, shard: str) -> Path:
    """The first planned batch of a shard's query (Spark writes it before the batch runs)."""
    return shard_dir(env, shard) / "checkpoint" / "offsets" / "0"


def sink_files(env: TaskEnv, shard: str) -> list[Path]:
    return sorted((env.sink / f"shard={shard}").glob("**/*.*"))


def wait_rehearsed(runners: list[Any], threads: list[InThread], caplog, timeout: float = 240.0) -> None:
    """Wait until every standby runner finished its rehearsal (fail fast when one failed or a thread died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        failed = [r.getMessage() for r in caplog.records if "rehearsal failed" in r.getMessage()]
        assert not failed, f"the rehearsal failed: {failed}"
        for t in threads:
            assert t.is_alive() or t.error is None, f"{t.name} raised {t.error!r}"
        if all(r.rehearsal_seconds is not None for r in runners):
            return
        time.sleep(0.2)
    raise AssertionError(f"no rehearsal within {timeout}s: {[r.rehearsal_seconds for r in runners]}")


def release(runners: list[Any], threads: list[InThread]) -> None:
    """Teardown: end standby waits (a non-final drain request), join the threads, stop every query."""
    for r in runners:
        r.request_drain("test teardown", final=False)
    for t in threads:
        t.join(120)
    for r in runners:
        try:
            r.stop()
        except Exception:  # noqa: BLE001 - best effort
            pass


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_standby_child_waits_for_the_parent_drain_then_restores_exactly(kind, make_task, shard_spark, caplog):
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, kind)
    events = list(generate_events(600, 48, seed=11))

    parent = ShardRunner(env.config(0, 16), shard_spark)
    drained = shard_dir(env, PARENT) / "drained.json"
    restore = {"parent": PARENT, "manifest": str(drained)}  # what the operator sets: the (future) summary
    children = [ShardRunner(env.config(a, b, restore), shard_spark, catch_up=False) for a, b in HALVES]
    threads = [InThread(c.start, f"start {c.config.shard}") for c in children]
    try:
        produce(events[:250])
        parent.start()
        wait_caught_up(env, [parent])

        # Both children start while the parent runs: standby (warm up, rehearse, wait).
        for t in threads:
            t.start()
        wait_rehearsed(children, threads, caplog)
        produce(events[250:400])  # the parent keeps processing; the children must not
        time.sleep(1.0)  # a few standby polls and parent triggers
        parent.poll()
        assert parent.query.isActive and not drained.exists()
        for c, t in zip(children, threads, strict=True):
            shard = c.config.shard
            assert t.is_alive(), f"{shard} returned from start() before its parent drained"
            assert isinstance(c.rehearsal_seconds, float) and c.rehearsal_seconds > 0
            assert c.standby_seconds is None and c.query is None and c.restore is None
            assert not first_offsets(env, shard).exists(), f"{shard} planned a batch on standby"
            assert not sink_files(env, shard), f"{shard} wrote to the sink on standby"

        # The parent's final drain writes drained.json last; the children restore from its manifest.
        parent_summary = parent.drain()
        assert drained.exists() and parent_summary["event"] == "drained"
        assert parent_summary["manifest"].endswith("manifest.json")
        parent_manifest = json.loads(Path(parent_summary["manifest"]).read_text())
        for t in threads:
            t.finish(240)
        produce(events[400:])
        wait_caught_up(env, children, timeout=240)
        assert env.results() == ref.results, "no event lost, none counted twice"

        drained_mtime = drained.stat().st_mtime_ns
        for c, (a, b) in zip(children, HALVES, strict=True):
            shard = c.config.shard
            assert first_offsets(env, shard).stat().st_mtime_ns >= drained_mtime, f"{shard} planned before the drain"
            lineage = json.loads((shard_dir(env, shard) / "lineage.json").read_text())
            assert lineage["restoreManifest"] == parent_summary["manifest"]
            assert lineage["restoreManifest"].endswith("manifest.json")
            assert lineage["parent"] == PARENT and lineage["parentBatchId"] == parent_manifest["batchId"]
            assert c.standby_seconds is not None and c.standby_seconds > 0
            check_child_read_only_its_slice(env, parent_manifest, shard, a, b)
        summaries = [c.drain() for c in children]
        assert env.results() == ref.results
        assert sum(s["stateRows"] for s in summaries) == len(ref.results)
    finally:
        release(children, threads)
        parent.stop()


def test_sigterm_on_standby_stops_without_processing(make_task, shard_spark, caplog):
    from spark_runtime.shard import ShardRunner

    env = make_task(processor={"builtin": "count"}, max_key_groups=16)
    env.produce(list(generate_events(100, 10, seed=2)))  # input the child would process if it ran
    drained = shard_dir(env, PARENT) / "drained.json"  # the parent never drains
    child = ShardRunner(env.config(0, 8, {"parent": PARENT, "manifest": str(drained)}), shard_spark, catch_up=False)
    thread = InThread(child.run, f"run {child.config.shard}")
    try:
        thread.start()
        wait_rehearsed([child], [thread], caplog)
        assert thread.is_alive()
        child.request_drain("SIGTERM", final=False)
        summary = thread.finish(30)
    finally:
        release([child], [thread])
    shard = child.config.shard
    assert summary == {"event": "stopped", "task": env.task, "shard": shard, "batchId": -1, "standby": True}
    assert child.query is None and child.standby_seconds is None
    assert not (shard_dir(env, shard) / "checkpoint" / "offsets").exists() or not list(
        (shard_dir(env, shard) / "checkpoint" / "offsets").iterdir()
    ), "no batch planned"
    assert not sink_files(env, shard)
    assert not (shard_dir(env, shard) / "drained.json").exists(), "a standby stop is not a drain"
    assert not (shard_dir(env, shard) / "drain-requested").exists()


@pytest.mark.parametrize(
    "summary, why",
    [
        ({"event": "drained", "shard": "someone-else"}, "drain summary of shard 'someone-else'"),
        ({"event": "stopped", "shard": PARENT}, "not a drain summary"),
    ],
    ids=["other-shard", "not-drained"],
)
def test_drain_summary_of_another_shard_is_refused(summary, why, make_task, shard_spark):
    from spark_runtime.shard import ShardRunner
    from spark_runtime.snapshot import RestoreError

    env = make_task(processor={"builtin": "count"}, max_key_groups=16)
    drained = shard_dir(env, PARENT) / "drained.json"
    manifest = shard_dir(env, PARENT) / "snapshots" / "batch-3" / "manifest.json"
    drained.parent.mkdir(parents=True)
    drained.write_text(json.dumps({**summary, "task": env.task, "batchId": 3, "manifest": str(manifest)}))
    runner = ShardRunner(env.config(0, 8, {"parent": PARENT, "manifest": str(drained)}), shard_spark)
    try:
        with pytest.raises(RestoreError, match="restoreFrom.manifest") as err:
            runner.start()
        assert why in str(err.value)
        assert runner.query is None and runner.standby_seconds is None and runner.rehearsal_seconds is None
        assert not (shard_dir(env, runner.config.shard) / "checkpoint").exists()
    finally:
        runner.stop()
