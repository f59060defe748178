"""A split child is safe to crash in at every stage of the catch-up hand-over: the low child runs as a subprocess
(its own process group, like a pod) and is SIGKILLed on standby (its request written, the parent not answering
yet), during its first batch (the restore of the pre-copy: planned, not committed) and right after it took over
(its first emitting batch committed); each restart resumes from its own storage. The parent and the high child
run in this process. The results equal the reference, and the low child emits only batches that read past the
parent's final positions: nothing lost, nothing counted twice, no key group emitted by two shards.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from spark_runtime.produce import generate_events

from .conftest import ShardProcess, wait_progress
from .test_handover import assert_emits_only_past, caught_up, emitted
from .test_split import task_with_reference
from .test_standby import HALVES, PARENT, InThread, release, shard_dir

pytestmark = pytest.mark.spark

LOW = "orders-0-8"


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def test_a_child_sigkilled_on_standby_in_its_first_batch_and_after_taking_over_stays_exact(make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, "builtin-count")
    events = list(generate_events(1000, 40, seed=47))
    produce(events[:300])
    restore = {"parent": PARENT, "manifest": str(shard_dir(env, PARENT) / "drained.json")}
    parent = ShardRunner(env.config(0, 16), shard_spark)
    answer = threading.Event()  # the parent answers catch-up requests only once this is set
    start_precopy = parent.as_parent._start_precopy
    parent.as_parent._start_precopy = lambda: start_precopy() if answer.is_set() else None
    high = ShardRunner(env.config(*HALVES[1], restore), shard_spark)
    threads = [InThread(parent.run, "run parent"), InThread(high.run, "run high")]
    low_config = env.root / "low.json"
    low_config.write_text(json.dumps(env.config_dict(*HALVES[0], restore)))
    low_dir = shard_dir(env, LOW)
    runs: list[ShardProcess] = []

    def run_low(name: str) -> ShardProcess:
        runs.append(ShardProcess(env, low_config, name))
        return runs[-1]

    def kill(run: ShardProcess) -> None:
        run.kill_group()
        assert run.wait(timeout=60) != 0

    try:
        threads[0].start()
        caught_up(env, PARENT)
        threads[1].start()

        # 1. On standby: the request is written, the parent has not answered.
        first = run_low("low-1")
        handover = shard_dir(env, PARENT) / "handover"
        wait_until(lambda: handover.exists() and any(handover.glob(f"request-{LOW}.*.json")), 240, "low's request")
        assert not (low_dir / "catch-up.json").exists() and not (low_dir / "checkpoint").exists()
        kill(first)

        # 2. During its first batch: the restore of the pre-copy is planned, not committed.
        answer.set()
        second = run_low("low-2")
        wait_until((low_dir / "checkpoint" / "offsets" / "0").exists, 240, "low's first batch planned")
        assert not (low_dir / "checkpoint" / "commits" / "0").exists(), "killed before its first commit"
        kill(second)
        state = json.loads((low_dir / "catch-up.json").read_text())
        assert state["phase"] == "shadow"
        produce(events[300:500])  # the parent keeps processing and emitting meanwhile

        # 3. Right after taking over: its first emitting batch is committed.
        third = run_low("low-3")
        summary = threads[0].finish(300)  # both children caught up: the parent handed over
        assert summary["event"] == "drained" and summary["handover"] == "catch-up"
        produce(events[500:700])
        wait_until(lambda: bool(emitted(env, LOW)), 240, "low's first emitting batch")
        wait_until((low_dir / "checkpoint" / "commits" / str(emitted(env, LOW)[0])).exists, 120, "its commit")
        kill(third)

        # The last restart resumes live and counts the rest once.
        run_low("low-4")
        produce(events[700:])
        caught_up(env, LOW)
        caught_up(env, high.config.shard)
        assert env.results() == ref.results, "nothing lost, nothing counted twice"
        out = assert_emits_only_past(env, LOW, summary["positions"])
        assert json.loads((low_dir / "catch-up.json").read_text())["phase"] == "live"
        assert max(emitted(env, PARENT)) <= summary["batchId"]
        assert wait_progress(env, LOW, lambda p: p["batchId"] >= out[0])
    finally:
        for run in runs:
            run.kill_group()
        release([high], threads[1:])
        parent.stop()
