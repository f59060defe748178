"""The catch-up hand-over (spark_runtime.handover): a split's children restore a pre-copy snapshot and catch up
on their slices while the parent keeps processing and emitting; the parent stops once both are ready, and the
children emit the results of their input from exactly its final positions on (the batch that reaches them
emits only what lies past them).

Each test runs parent and children as real :class:`ShardRunner` loops (``run()``, in threads) on the shared
SparkSession, against a real journal, and compares the task's results with a plain-Python count.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from spark_runtime.produce import append_lines, generate_events

from .conftest import TaskEnv, wait_progress
from .test_split import PROCESSORS, task_with_reference
from .test_standby import HALVES, PARENT, InThread, release, shard_dir

pytestmark = pytest.mark.spark

BAD = ["{bad json", '{"key": null, "amount": 1}']
"""Two dead letters per wave (no key: they belong to the null key's key group, so to exactly one shard)."""


def caught_up(env: TaskEnv, shard: str, timeout: float = 240.0) -> dict:
    ends = env.journal_ends()
    return wait_progress(env, shard, lambda p: p["positions"] == ends, timeout)


def wait_live(env: TaskEnv, runner: Any, timeout: float = 60.0) -> Any:
    """Wait until catch-up child ``runner`` has switched to LIVE (its poll loop does so after the batch that reached
    F committed, so just after its progress shows that batch; in memory, then in ``catch-up.json``) and return its
    catch-up state."""

    saved = shard_dir(env, runner.config.shard) / "catch-up.json"

    def live(_: dict) -> bool:
        state = runner.as_child.state if runner.as_child is not None else None
        return state is not None and state.phase == "live" and json.loads(saved.read_text())["phase"] == "live"

    wait_progress(env, runner.config.shard, live, timeout)
    return runner.as_child.state


def checkpoint_positions(env: TaskEnv, shard: str, batch_id: int) -> dict[str, Any]:
    """The journal end positions of ``batch_id`` in ``shard``'s offset log (the seed's entry skipped)."""
    lines = (shard_dir(env, shard) / "checkpoint" / "offsets" / str(batch_id)).read_text().splitlines()
    for line in lines[2:]:
        entry = json.loads(line) if line.strip() not in ("", "-") else None
        if isinstance(entry, dict) and all(k.endswith(".jsonl") for k in entry):
            return entry
    raise AssertionError(f"no journal offsets in batch {batch_id} of {shard}: {lines}")


def committed(env: TaskEnv, shard: str) -> list[int]:
    return sorted(int(f.name) for f in (shard_dir(env, shard) / "checkpoint" / "commits").iterdir() if f.name.isdigit())


def emitted(env: TaskEnv, shard: str) -> list[int]:
    """The batches of ``shard`` that wrote results (published or pending)."""
    root = env.sink / f"shard={shard}"
    return sorted(int(f.name.split("-")[1].split(".")[0]) for f in root.glob("**/batch-*.*"))


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_children_catch_up_while_the_parent_runs_then_take_over_exactly(kind, make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, kind)
    events = list(generate_events(1200, 48, seed=21))
    produce(events[:400])
    append_lines(env.journal, 0, BAD)
    parent = ShardRunner(env.config(0, 16), shard_spark)
    restore = {"parent": PARENT, "manifest": str(shard_dir(env, PARENT) / "drained.json")}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in HALVES]
    threads = [InThread(parent.run, "run parent")] + [InThread(c.run, f"run {c.config.shard}") for c in children]
    try:
        threads[0].start()
        caught_up(env, PARENT)
        for t in threads[1:]:
            t.start()
        # Input keeps arriving during the hand-over; the parent processes it (and emits) until it stops.
        sent = 400
        while threads[0].is_alive() and sent < 1000:
            produce(events[sent : sent + 25])
            sent += 25
            target = env.journal_ends()
            wait_progress(env, PARENT, lambda p, t=target: p["positions"] == t or parent.already_drained, timeout=120)
        summary = threads[0].finish(240)
        append_lines(env.journal, 1, BAD)
        produce(events[sent:])
        for c in children:
            caught_up(env, c.config.shard)
        assert env.results() == ref.results, "no event lost, none counted twice"

        # The parent handed over without a final export, after committing batches past its pre-copy.
        precopy = json.loads((shard_dir(env, PARENT) / "handover" / "precopy.json").read_text())
        assert summary["event"] == "drained" and summary["handover"] == "catch-up"
        assert summary["snapshotBatchId"] == precopy["batchId"] < summary["batchId"], "the parent kept committing"
        final = summary["positions"]
        assert final == checkpoint_positions(env, PARENT, summary["batchId"])
        assert max(emitted(env, PARENT)) <= summary["batchId"]
        for child in children:
            shard = child.config.shard
            wait_live(env, child)
            state = json.loads((shard_dir(env, shard) / "catch-up.json").read_text())
            assert state["phase"] == "live" and state["final"] == final and state["ready"]
            out = emitted(env, shard)
            shadow = [b for b in committed(env, shard) if b not in out]
            assert 0 in shadow and out, f"{shard}: the restore batch emits nothing, later batches do"
            # One hand-over per key group: the parent emitted up to F, the child from F, never both.
            held = {b: own_records_past(env, child, b, final) for b in shadow[1:] if not _le(env, shard, b, final)}
            assert not any(held.values()), f"{shard} held its records past F in batches that emitted nothing: {held}"
            assert_emits_only_past(env, shard, final)
    finally:
        release(children, threads[1:])
        parent.stop()
    summaries = [summary] + [c.drain() for c in children]
    assert sum(s["deadLetters"] for s in summaries) == 2 * len(BAD), "each dead letter counted by one shard"
    assert env.results() == ref.results


def _le(env: TaskEnv, shard: str, batch_id: int, bound: dict[str, int]) -> bool:
    """Whether batch ``batch_id`` of ``shard`` ended at or before ``bound`` in every partition."""
    return all(v <= bound[k] for k, v in checkpoint_positions(env, shard, batch_id).items())


def own_records_past(env: TaskEnv, runner: Any, batch_id: int, bound: dict[str, int]) -> list[str]:
    """The keys of ``runner``'s own key groups that batch ``batch_id`` read past ``bound``: the journal lines
    between the previous batch's end (or ``bound``, if later) and this batch's end, read as a consumer of the
    journal would. A batch past F that read none of them (only dead letters, or only other shards' keys) has
    nothing to emit; one that read some and emitted nothing held its input."""
    from spark_runtime.keygroups import key_group

    start, end = runner.config.key_groups.start, runner.config.key_groups.end
    before = checkpoint_positions(env, runner.config.shard, batch_id - 1)
    keys = []
    for name, stop in checkpoint_positions(env, runner.config.shard, batch_id).items():
        first = max(before.get(name, 0), bound[name])
        for line in (env.journal / name).read_bytes()[first:stop].splitlines():
            try:
                key = json.loads(line).get("key")
            except ValueError:
                continue
            if key is not None and start <= key_group(key, env.max_key_groups) < end:
                keys.append(str(key))
    return keys


def assert_emits_only_past(env: TaskEnv, shard: str, final: dict[str, int]) -> list[int]:
    """One hand-over per key group: the parent emitted up to its final positions ``final``, the child ``shard``
    only batches that read past them (never its restore batch 0); returns the batches that emitted."""
    out = emitted(env, shard)
    assert out and 0 not in out, f"{shard}: the restore batch emits nothing, later batches do"
    assert not [b for b in out if _le(env, shard, b, final)], f"{shard}: a batch ending at or before F emitted"
    return out


def batch_keys(env: TaskEnv, shard: str, batch_id: int) -> set[str]:
    """The keys of the results batch ``batch_id`` of ``shard`` wrote (published or pending)."""
    import pyarrow.parquet as pq

    keys: set[str] = set()
    for f in (env.sink / f"shard={shard}").glob(f"**/batch-{batch_id}.*"):
        if f.suffix == ".parquet":
            keys |= {str(k) for k in pq.read_table(f).column("key").to_pylist()}
        else:
            keys |= {json.loads(line)["key"] for line in f.read_text().splitlines() if line.strip()}
    return keys


def assert_range_read_alike(runner: Any, batch_id: int, spark: Any, monkeypatch: Any) -> None:
    """Batch ``batch_id``'s range (it straddles F) read again in the driver (a short range:
    ``journal.read_range_here``) and by a Spark batch query (a long one): the same rows and held flags."""
    from spark_runtime.protocol import HELD_COLUMN
    from spark_runtime.sources import journal

    source, ctx = runner.output.io.source, runner.output.run.source_context
    start, end = runner.positions_at(batch_id - 1), runner.positions_at(batch_id)
    here = source.read_range(spark, ctx, start, end)
    monkeypatch.setattr(journal, "READ_HERE_MAX_BYTES", 0)
    by_spark = source.read_range(spark, ctx, start, end)
    assert here.schema == by_spark.schema
    assert here.count() == by_spark.count() > 0
    assert here.exceptAll(by_spark).count() == 0 and by_spark.exceptAll(here).count() == 0
    assert {r[0] for r in here.select(HELD_COLUMN).distinct().collect()} == {True, False}, "held on one side of F"


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_the_batch_that_reaches_the_fence_emits_only_what_lies_past_it(kind, make_task, shard_spark, monkeypatch):
    """The children lag their parent when it drains (held back here: once ready they stop following, and the
    parent drains only after one more wave), so each child's first batch after the drain reads records on both
    sides of the parent's final positions F: keys with records on both sides, keys only before F, keys only after
    it, dead letters on both sides. That one batch emits exactly the keys its records at or after F touched (no
    extra batch to reach F first); state stays exact and every dead letter is counted once."""
    from spark_runtime.keygroups import KeyGrouping
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, kind)
    events = list(generate_events(900, 24, seed=31))
    before = [{"key": f"before-{i}", "seq": 10_000 + i, "amount": i} for i in range(12)]
    after = [{"key": f"after-{i}", "seq": 20_000 + i, "amount": i} for i in range(12)]
    produce(events[:300])
    drain_now, follow_again = threading.Event(), threading.Event()
    parent = ShardRunner(env.config(0, 16), shard_spark)
    answer = parent.as_parent.tick
    parent.as_parent.tick = lambda: answer() if drain_now.is_set() else (answer(), None)[1]
    restore = {"parent": PARENT, "manifest": str(shard_dir(env, PARENT) / "drained.json")}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in HALVES]
    for c in children:
        hand, follow = c.as_child, c.as_child.tick  # once ready: keep the cap, do not see the drain yet

        def held_back(h: Any = hand, f: Any = follow) -> None:
            return None if h.state is not None and h.state.ready and not follow_again.is_set() else f()

        hand.tick = held_back
    threads = [InThread(parent.run, "run parent")] + [InThread(c.run, f"run {c.config.shard}") for c in children]
    try:
        threads[0].start()
        caught_up(env, PARENT)
        for t in threads[1:]:
            t.start()
        for c in children:
            wait_progress(env, c.config.shard, lambda p, c=c: bool(c.as_child.state and c.as_child.state.ready), 240)
        produce(events[300:600] + before)  # before F: the parent alone processes and emits it
        append_lines(env.journal, 0, BAD)
        caught_up(env, PARENT)
        drain_now.set()
        summary = threads[0].finish(240)
        final = summary["positions"]
        produce(events[600:] + after)  # after F: the same keys again, and keys of their own
        append_lines(env.journal, 1, BAD)
        follow_again.set()
        for c in children:
            caught_up(env, c.config.shard)
        assert env.results() == ref.results, "no event lost, none counted twice"
        grouping = KeyGrouping(16)
        for c in children:
            shard, r = c.config.shard, c.config.key_groups
            out = assert_emits_only_past(env, shard, final)
            first = out[0]
            start = checkpoint_positions(env, shard, first - 1)
            assert any(start[k] < final[k] for k in final), f"{shard}: its first emitting batch straddles F"
            past = {e["key"] for e in events[600:] + after if r.start <= grouping.of(e["key"], 0) < r.end}
            assert batch_keys(env, shard, first) == past, f"{shard}: exactly the keys its records past F touched"
            only_before = {e["key"] for e in before if r.start <= grouping.of(e["key"], 0) < r.end}
            assert only_before and not only_before & past, f"{shard}: keys only before F (none emitted by it)"
            if kind == "builtin-count" and c is children[0]:  # its fence batch read its range again
                assert_range_read_alike(c, first, shard_spark, monkeypatch)
    finally:
        release(children, threads[1:])
        parent.stop()
    summaries = [summary] + [c.drain() for c in children]
    assert sum(s["deadLetters"] for s in summaries) == 2 * len(BAD), "each dead letter counted by one shard"
    assert summary["deadLetters"] == len(BAD), "the parent counted those before F"


def test_a_child_killed_while_catching_up_resumes_its_catch_up(make_task, shard_spark):
    """A child whose runner dies mid-catch-up (its query stopped, as a SIGKILL leaves it) restarts from its own
    recovery log with the same ``catch-up.json``: it emits nothing it caught up on, and the results are exact."""
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, "builtin-count")
    events = list(generate_events(900, 40, seed=5))
    produce(events[:300])
    parent = ShardRunner(env.config(0, 16), shard_spark)
    restore = {"parent": PARENT, "manifest": str(shard_dir(env, PARENT) / "drained.json")}
    low = ShardRunner(env.config(*HALVES[0], restore), shard_spark)
    threads = [InThread(parent.run, "run parent"), InThread(low.run, "run low")]
    restarted: list[Any] = []
    try:
        threads[0].start()
        caught_up(env, PARENT)
        threads[1].start()
        low_dir = shard_dir(env, low.config.shard)
        wait_progress(env, low.config.shard, lambda p: p["batchId"] >= 0, timeout=240)
        # "Kill" the low child mid-catch-up: stop its query and loop without any drain step.
        low.stop()
        low.request_drain("test: simulated kill", final=False)
        threads[1].join(120)
        state = json.loads((low_dir / "catch-up.json").read_text())
        assert state["phase"] == "shadow", "killed while catching up"
        produce(events[300:600])  # the parent processes on; nobody else owns [0, 8) yet
        again = ShardRunner(env.config(*HALVES[0], restore), shard_spark)
        high = ShardRunner(env.config(*HALVES[1], restore), shard_spark)
        restarted += [again, high]
        threads += [InThread(again.run, "rerun low"), InThread(high.run, "run high")]
        for t in threads[2:]:
            t.start()
        summary = threads[0].finish(300)
        produce(events[600:])
        for c in restarted:
            caught_up(env, c.config.shard)
        assert summary["handover"] == "catch-up"
        assert env.results() == ref.results, "no event lost, none counted twice"
        assert again.as_child is not None and wait_live(env, again).phase == "live"
        assert_emits_only_past(env, again.config.shard, summary["positions"])
    finally:
        release([low, *restarted], threads[1:])
        parent.stop()


def test_a_parent_replaced_during_the_catch_up_hands_over_once_and_its_zombie_is_fenced(make_task, shard_spark):
    """The parent's pod is replaced while its children catch up (a node partition: the old pod keeps running but
    never gets to its final drain, here because its hand-over step stops asking for one). The replacement resumes
    from the recovery log, finds both ready notes and drains once; the old runtime (epoch 1) cannot drain or write
    anything once the replacement (epoch 2) started. Results exact."""
    from spark_runtime.fencing import WriterFenced
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, "builtin-count")
    events = list(generate_events(900, 40, seed=23))
    produce(events[:300])
    zombie = ShardRunner(env.config(0, 16), shard_spark)
    answer_only = zombie.as_parent.tick
    zombie.as_parent.tick = lambda: (answer_only(), None)[1]  # answers the children, never drains by itself
    restore = {"parent": PARENT, "manifest": str(shard_dir(env, PARENT) / "drained.json")}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in HALVES]
    threads = [InThread(zombie.run, "run zombie parent")] + [InThread(c.run, f"run {c.config.shard}") for c in children]
    replacement = ShardRunner(env.config(0, 16), shard_spark)
    try:
        threads[0].start()
        caught_up(env, PARENT)
        for t in threads[1:]:
            t.start()
        # The children restored the zombie's pre-copy and caught up with its progress: both ready notes are there.
        handover = shard_dir(env, PARENT) / "handover"
        for c in children:
            pattern = f"ready-{c.config.shard}.*.json"  # scoped to the child's writer epoch

            def ready(p: dict, pattern: str = pattern) -> bool:
                return p["batchId"] >= 0 and handover.exists() and any(handover.glob(pattern))

            wait_progress(env, c.config.shard, ready, 240)
        assert not (shard_dir(env, PARENT) / "drained.json").exists()
        produce(events[300:600])
        threads.append(InThread(replacement.run, "run replacement parent"))
        threads[-1].start()
        threads[0].join(300)
        assert not threads[0].is_alive(), "the replaced parent stops"
        assert isinstance(threads[0].error, WriterFenced), threads[0].error
        summary = threads[-1].finish(300)
        assert summary["event"] == "drained" and summary["handover"] == "catch-up"
        assert summary["writerEpoch"] == replacement.fence.epoch == 2
        assert json.loads((shard_dir(env, PARENT) / "drained.json").read_text()) == summary, "drained once"
        produce(events[600:])
        for c in children:
            caught_up(env, c.config.shard)
        assert env.results() == ref.results, "no event lost, none counted twice"
        for c in children:
            assert_emits_only_past(env, c.config.shard, summary["positions"])
        assert max(emitted(env, PARENT)) <= summary["batchId"]
    finally:
        release(children, threads[1:3])
        zombie.stop()
        replacement.stop()


EDGE = [(0, 1), (1, 16)]
"""A split at key group 1: the left child owns one key group."""


def _keys_in(group: int, count: int, prefix: str) -> list[str]:
    from spark_runtime.keygroups import KeyGrouping

    grouping, keys, i = KeyGrouping(16), [], 0
    while len(keys) < count:
        if grouping.of(f"{prefix}{i}", 0) == group:
            keys.append(f"{prefix}{i}")
        i += 1
    return keys


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_a_one_key_group_child_whose_fence_batch_has_no_record_past_the_fence_commits_its_state(
    kind, make_task, shard_spark
):
    """A split at key group 1 under load: the child ``[0, 1)`` lags its parent when it drains, and nothing of key
    group 0 arrives past the parent's final positions F, so the child's batch that reaches F keeps no result of
    its own. That batch still commits its state stores (the stateful plan runs in full whatever the sink keeps):
    the child's checkpoint holds a state version for every committed batch, a restart of the child resumes from
    it, and every key is exact, each dead letter counted once."""
    from spark_runtime.checkpoint import last_committed_batch, uncommitted_state
    from spark_runtime.keygroups import KeyGrouping
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, kind)
    grouping = KeyGrouping(16)
    events = list(generate_events(900, 24, seed=41))
    edge = [{"key": k, "seq": 30_000 + i, "amount": i + 1} for i, k in enumerate(_keys_in(0, 6, "edge-"))]
    produce(events[:300] + edge[:2])
    drain_now, follow_again = threading.Event(), threading.Event()
    parent = ShardRunner(env.config(0, 16), shard_spark)
    answer = parent.as_parent.tick
    parent.as_parent.tick = lambda: answer() if drain_now.is_set() else (answer(), None)[1]
    restore = {"parent": PARENT, "manifest": str(shard_dir(env, PARENT) / "drained.json")}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in EDGE]
    for c in children:
        hand, follow = c.as_child, c.as_child.tick  # once ready: keep the cap, do not see the drain yet

        def held_back(h: Any = hand, f: Any = follow) -> None:
            return None if h.state is not None and h.state.ready and not follow_again.is_set() else f()

        hand.tick = held_back
    threads = [InThread(parent.run, "run parent")] + [InThread(c.run, f"run {c.config.shard}") for c in children]
    again = None
    try:
        threads[0].start()
        caught_up(env, PARENT)
        for t in threads[1:]:
            t.start()
        for c in children:
            wait_progress(env, c.config.shard, lambda p, c=c: bool(c.as_child.state and c.as_child.state.ready), 240)
        produce(events[300:600] + edge[2:4])  # before F: key group 0 too, which the parent alone emits
        append_lines(env.journal, 0, BAD)
        caught_up(env, PARENT)
        drain_now.set()
        summary = threads[0].finish(240)
        final = summary["positions"]
        past = [e for e in events[600:] if grouping.of(e["key"], 0) != 0]
        produce(past)  # after F: nothing of key group 0
        follow_again.set()
        for c in children:
            caught_up(env, c.config.shard)
        edge_child = children[0]
        shard = edge_child.config.shard
        assert wait_live(env, edge_child).phase == "live"
        out = assert_emits_only_past(env, shard, final) if emitted(env, shard) else []
        assert all(not batch_keys(env, shard, b) for b in out), f"{shard}: nothing of its own past F"
        checkpoint = shard_dir(env, shard) / "checkpoint"
        assert last_committed_batch(checkpoint) >= 1 and uncommitted_state(checkpoint) is None
        assert env.results() == ref.results, "no event lost, none counted twice"

        # The child's next start (a template roll, a drain, an eviction) resumes from its own recovery log.
        release([edge_child], [threads[1]])
        again = ShardRunner(env.config(*EDGE[0], restore), shard_spark)
        threads.append(InThread(again.run, f"rerun {shard}"))
        threads[-1].start()
        produce(edge[4:])  # key group 0 again: the restarted child emits it
        for c in (again, children[1]):
            caught_up(env, c.config.shard)
        assert env.results() == ref.results, "exact after the restart"
        assert {e["key"] for e in edge[4:]} <= batch_keys(env, shard, last_committed_batch(checkpoint))
        if kind == "builtin-count":
            release([again], [threads[-1]])
            again = recover_a_commit_log_ahead_of_its_state(env, EDGE[0], restore, shard_spark)
            assert env.results() == ref.results, "exact after the documented recovery"
    finally:
        release([children[1], *([again] if again else [])], threads[2:])
        parent.stop()
    summaries = [summary, children[1].drain(), again.drain()]
    assert sum(s["deadLetters"] for s in summaries) == len(BAD), "each dead letter counted by one shard"


def recover_a_commit_log_ahead_of_its_state(env: TaskEnv, key_groups: tuple[int, int], restore: dict, spark: Any):
    """The state check and the recovery docs/design-contracts.md gives ("State check"): the last committed batch
    N's state version removed (what Spark leaves after ``STATE_STORE_COMMIT_VALIDATION_FAILED``), a start is
    refused with ``CheckpointInconsistent`` naming N; removing ``commits/N`` and the offsets past N replays N.
    Returns the recovered runner, caught up."""
    from spark_runtime.checkpoint import last_committed_batch, last_planned_batch
    from spark_runtime.problems import EnvironmentProblem
    from spark_runtime.shard import ShardRunner

    shard = env.shard_name(*key_groups)
    checkpoint = shard_dir(env, shard) / "checkpoint"
    n = last_committed_batch(checkpoint)
    for f in (checkpoint / "state").glob(f"*/*/*{n + 1}.*"):
        if f.name.lstrip(".").startswith(f"{n + 1}."):
            f.unlink()
    refused = ShardRunner(env.config(*key_groups, restore), spark)
    with pytest.raises(EnvironmentProblem) as err:
        refused.start()
    assert err.value.reason == "CheckpointInconsistent" and f"batch {n}" in str(err.value)
    refused.stop()
    for m in [n] + list(range(n + 1, last_planned_batch(checkpoint) + 1)):
        for log_dir in (("commits",) if m == n else ()) + ("offsets",) * (m > n):
            for name in (str(m), f".{m}.crc"):
                (checkpoint / log_dir / name).unlink(missing_ok=True)
    recovered = ShardRunner(env.config(*key_groups, restore), spark)
    thread = InThread(recovered.run, f"recovered {shard}")
    thread.start()
    deadline = time.monotonic() + 240
    while last_committed_batch(checkpoint) < n and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.25)  # polling the commit log: batch N committed again (progress.json may still say N)
    assert last_committed_batch(checkpoint) >= n, f"{shard}: batch {n} replayed and committed"
    caught_up(env, shard)
    return recovered
