"""Aborting a split before the hand-over (:func:`spark_runtime.handover.abort_split`, what the parent's pod runs
with ``--abort-split`` once the request was withdrawn): the children caught up and were ready, the parent never
drained; after the abort the children's storage holds only their fencing epochs, the parent resumes alone from its
recovery log, a zombie child cannot write, and a later split with the same child names starts afresh and hands
over exactly. A parent that drained first makes the abort report the drain instead.
"""

from __future__ import annotations

import json

import pytest

from spark_runtime.produce import generate_events

from .conftest import wait_progress
from .test_handover import caught_up
from .test_split import task_with_reference
from .test_standby import HALVES, PARENT, InThread, release, shard_dir

pytestmark = pytest.mark.spark

LOW, HIGH = "orders-0-8", "orders-8-16"


def test_an_aborted_split_resumes_the_parent_and_a_later_split_hands_over_exactly(make_task, shard_spark):
    from spark_runtime.checkpoint import last_committed_batch
    from spark_runtime.fencing import WriterFenced
    from spark_runtime.handover import abort_split
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, "builtin-count")
    events = list(generate_events(1000, 40, seed=43))
    produce(events[:300])
    restore = {"parent": PARENT, "manifest": str(shard_dir(env, PARENT) / "drained.json")}
    parent = ShardRunner(env.config(0, 16), shard_spark)
    answer_only = parent.as_parent.tick
    parent.as_parent.tick = lambda: (answer_only(), None)[1]  # the withdrawal comes before its final drain
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in HALVES]
    threads = [InThread(parent.run, "run parent")] + [InThread(c.run, f"run {c.config.shard}") for c in children]
    later: list = []
    try:
        threads[0].start()
        caught_up(env, PARENT)
        for t in threads[1:]:
            t.start()
        handover = shard_dir(env, PARENT) / "handover"
        for c in children:
            pattern = f"ready-{c.config.shard}.*.json"  # scoped to the child's writer epoch

            def ready(p: dict, pattern: str = pattern) -> bool:
                return p["batchId"] >= 0 and handover.exists() and any(handover.glob(pattern))

            wait_progress(env, c.config.shard, ready, 240)
        produce(events[300:500])
        # The operator's abort: the children's pods go, the parent's pod is stopped (SIGTERM: non-final) ...
        release(children, threads[1:])
        parent.request_drain("SIGTERM", final=False)
        stopped = threads[0].finish(180)
        assert stopped["event"] == "stopped"
        # ... and the parent's pod runs once more with --abort-split.
        summary = abort_split(ShardRunner(env.config(0, 16), shard_spark).io, [LOW, HIGH])
        assert summary["event"] == "aborted" and summary["children"] == [LOW, HIGH]
        assert summary["batchId"] == last_committed_batch(shard_dir(env, PARENT) / "checkpoint") >= 0
        for child in (LOW, HIGH):
            assert {f.name for f in shard_dir(env, child).iterdir()} == {"epochs"}, "only the fence is left"
            assert len(list((shard_dir(env, child) / "epochs").iterdir())) == 2, "the child's epoch, the abort's"
        assert not handover.exists() and not (shard_dir(env, PARENT) / "drain-requested").exists()
        for c in children:
            with pytest.raises(WriterFenced):
                c.fence.check("a zombie child's next write")
        assert not list(env.sink.glob(f"shard={LOW}/**/batch-*")), "the children never emitted"
        assert abort_split(ShardRunner(env.config(0, 16), shard_spark).io, [LOW, HIGH])["event"] == "aborted"

        # The parent resumes alone and counts everything once.
        resumed = ShardRunner(env.config(0, 16), shard_spark)
        threads.append(InThread(resumed.run, "run resumed parent"))
        threads[-1].start()
        produce(events[500:700])
        caught_up(env, PARENT)
        assert env.results() == ref.results, "nothing lost, nothing counted twice after the abort"

        # A later split with the same child names starts afresh and hands over exactly.
        later = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in HALVES]
        threads += [InThread(c.run, f"rerun {c.config.shard}") for c in later]
        for t in threads[-2:]:
            t.start()
        produce(events[700:850])
        final = threads[3].finish(300)
        assert final["event"] == "drained" and final["handover"] == "catch-up"
        produce(events[850:])
        for c in later:
            caught_up(env, c.config.shard)
            state = json.loads((shard_dir(env, c.config.shard) / "catch-up.json").read_text())
            assert state["phase"] == "live" and state["final"] == final["positions"]
            assert c.fence.epoch == 4, "epochs go on after the two aborts"
        assert env.results() == ref.results
        # Too late now: the abort reports the drain summary and clears nothing.
        assert abort_split(ShardRunner(env.config(0, 16), shard_spark).io, [LOW, HIGH]) == final
        assert (shard_dir(env, LOW) / "catch-up.json").exists()
    finally:
        release(later, threads[4:])
        for r in (parent, *children):
            r.stop()
