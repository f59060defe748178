"""A catch-up merge is safe to crash in at every step. Both parents and the merged shard run as subprocesses (each
its own process group, like a pod) and are SIGKILLed in turn:

- the merged shard while it follows both parents (pre-copies restored, batches committed, its ready notes written
  into both parents' hand-overs; a plain restart does not void them, only an abort's barrier would);
- each parent at two of the four steps of its catch-up final drain (the left one at ``marker`` and ``manifest``,
  the right one at ``stopped`` and ``summary``: together every step once), each restart resuming the final drain
  from its marker, which names the merged shard as the successor;
- the merged shard right after its first emitting batch committed.

The results equal the reference, both drain summaries name the merged shard as the successor (no final export),
and no key group is emitted by two shards (the parents' last emitted batch is their final one, the merged shard
emits only past both parents' final positions): nothing lost, nothing counted twice.
"""

from __future__ import annotations

import json
import time

import pytest

from spark_runtime.faults import CRASH_EXIT_CODE, KILL_AT_DRAIN_STEP_ENV
from spark_runtime.produce import generate_events

from .conftest import ShardProcess, wait_progress
from .test_handover import caught_up, emitted
from .test_merge import merge_from
from .test_split import task_with_reference
from .test_standby import shard_dir

pytestmark = pytest.mark.spark

LEFT, RIGHT, MERGED = "orders-0-8", "orders-8-16", "orders-0-16-m1"


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_merge_stays_exact_when_its_parents_and_its_merged_shard_are_killed_at_every_step(make_task):
    env, ref, produce = task_with_reference(make_task, "builtin-count")
    env.trigger = "200 milliseconds"
    env.conf = {"spark.taskshard.rehearse": "false"}
    events = list(generate_events(1200, 48, seed=53))
    env.journal.mkdir(parents=True)
    configs = {}
    for name, (a, b), extra in (
        (LEFT, (0, 8), {}),
        (RIGHT, (8, 16), {}),
        (MERGED, (0, 16), {"shard": MERGED, "mergeFrom": merge_from(env, (0, 8), (8, 16))}),
    ):
        configs[name] = env.root / f"{name}.json"
        configs[name].write_text(
            json.dumps(env.config_dict(a, b, terminationMessagePath=str(env.root / f"{name}.log"), **extra))
        )
    runs: list[ShardProcess] = []

    def run(shard: str, label: str, step: str | None = None) -> ShardProcess:
        runs.append(
            ShardProcess(env, configs[shard], f"{shard}-{label}", {KILL_AT_DRAIN_STEP_ENV: step} if step else None)
        )
        return runs[-1]

    def killed_at(proc: ShardProcess, step: str) -> None:
        assert proc.wait(timeout=300) == CRASH_EXIT_CODE, proc.tail()
        assert f"killed at drain step '{step}'" in proc.log_path.read_text(errors="replace"), proc.tail()

    def ready_notes(parent: str) -> list[str]:
        handover = shard_dir(env, parent) / "handover"
        return sorted(f.name for f in handover.glob(f"ready-{MERGED}.*.json")) if handover.exists() else []

    chunks = iter([events[300:530], events[530:760]])
    try:
        produce(events[:300])
        left, right = run(LEFT, "1", "marker"), run(RIGHT, "1", "stopped")
        caught_up(env, LEFT)
        caught_up(env, RIGHT)

        # 1. The merged shard follows both parents and says ready; killed before either parent drained (each dies
        # at its first step, before drained.json).
        merged = run(MERGED, "following")
        m_dir = shard_dir(env, MERGED)
        wait_until(lambda: ready_notes(LEFT) and ready_notes(RIGHT), 300, "the merged shard's ready notes")
        merged.kill_group()
        assert merged.wait(timeout=60) != 0
        state = json.loads((m_dir / "catch-up.json").read_text())
        # (its catch-up.json may not say ready yet: the notes are written first, then the state)
        assert state["kind"] == "merge" and state["phase"] == "shadow", state
        assert (m_dir / "checkpoint" / "commits" / "0").exists(), "it restored both pre-copies while they ran"
        assert not emitted(env, MERGED), "it emitted nothing while following"

        # 2. Each parent drains for it (its notes stay valid: a plain restart is no abort) and dies at a step;
        # every restart resumes the final drain from its marker and dies one step later.
        for (lstep, rstep), nxt in zip(
            (("marker", "stopped"), ("manifest", "summary")),
            (("manifest", "summary"), (None, None)),
            strict=True,
        ):
            killed_at(left, lstep)
            killed_at(right, rstep)
            for parent in (LEFT, RIGHT):
                marker = json.loads((shard_dir(env, parent) / "drain-requested").read_text().split(" ", 2)[2])
                assert [n["child"] for n in marker] == [MERGED], "the final drain names its successor"
            produce(next(chunks))  # past the parents' final positions: the merged shard's input
            left = run(LEFT, f"after-{lstep}", nxt[0])
            right = run(RIGHT, f"after-{rstep}", nxt[1])
        assert left.wait(timeout=300) == 0 and right.wait(timeout=300) == 0, left.tail() + right.tail()
        summaries = {p: json.loads((shard_dir(env, p) / "drained.json").read_text()) for p in (LEFT, RIGHT)}
        for parent in (LEFT, RIGHT):
            assert summaries[parent]["successors"] == [{"shard": MERGED, "keyGroups": {"start": 0, "end": 16}}]
            assert summaries[parent]["handover"] == "catch-up", "no final export: the merged shard has the state"
            assert json.loads((env.root / f"{parent}.log").read_text())["event"] == "drained"

        # 3. Restarted, it resumes its catch-up, takes both final positions and is killed right after its first
        # emitting batch committed.
        merged = run(MERGED, "emitted")
        produce(events[760:1000])
        wait_until(lambda: bool(emitted(env, MERGED)), 300, "its first emitting batch")
        first = emitted(env, MERGED)[0]
        wait_until((m_dir / "checkpoint" / "commits" / str(first)).exists, 120, "its commit")
        merged.kill_group()
        assert merged.wait(timeout=60) != 0

        # The last restart resumes from its recovery log and counts the rest once.
        run(MERGED, "last")
        produce(events[1000:])
        caught_up(env, MERGED)
        assert env.results() == ref.results, "nothing lost, nothing counted twice"
        for parent in (LEFT, RIGHT):
            assert max(emitted(env, parent)) <= summaries[parent]["batchId"], f"{parent} emitted after its drain"
        finals = [summaries[LEFT]["positions"], summaries[RIGHT]["positions"]]
        assert json.loads((m_dir / "catch-up.json").read_text())["finals"] == finals
        assert wait_progress(env, MERGED, lambda p: p["batchId"] >= first)
    finally:
        for proc in runs:
            proc.kill_group()
