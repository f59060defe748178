"""Merges: two adjacent shards hand their ranges to one child (``mergeFrom``, :mod:`spark_runtime.merge`).

The parents stop at different positions of the same partitions (the right one drains first, the left one goes on
reading), so the merged child starts each partition at the lower position and skips, per key group, the rows its
left parent already counted. The task's results equal the reference after the merge: no event lost, none counted
twice; every dead letter is written once. The child reads each key group's files from its own parent's snapshot.

The protocol end to end: the child starts on standby while both parents run, writes its notes into both
parents' hand-over directories, both parents drain by themselves, and the child restores both.

A merged child drained before its first batch hands its skip rule on: its own child skips the same rows.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from spark_runtime.drain import wait_until
from spark_runtime.produce import generate_events

from .conftest import TaskEnv, wait_caught_up
from .test_split import PROCESSORS, restart_after_pruning, restore_report, snapshot_files, task_with_reference
from .test_standby import InThread, release, shard_dir

pytestmark = pytest.mark.spark

LEFT, RIGHT = (0, 8), (8, 16)


def with_bad_amounts(events: list[dict], every: int) -> list[dict]:
    """``events`` with every ``every``-th one's amount made a string: a dead letter for ``sum`` (a key, so a key
    group), a plain event for ``count``."""
    return [{**e, "amount": "x"} if i % every == 0 else e for i, e in enumerate(events)]


def dead_letters(env: TaskEnv) -> list[tuple[str, int, int]]:
    """Every dead-letter record of every shard as ``(shard, partition, offset)``."""
    out = []
    for f in sorted((env.sink / "_dead_letters").glob("shard=*/*.jsonl")):
        shard = f.parent.name.partition("=")[2]
        out += [(shard, r["partition"], r["offset"]) for r in map(json.loads, f.read_text().splitlines())]
    return out


def merge_from(env: TaskEnv, *parents: tuple[int, int]) -> list[dict[str, str]]:
    """``mergeFrom`` as the operator sets it: each parent's (future) drain summary."""
    return [
        {"parent": env.shard_name(a, b), "manifest": str(shard_dir(env, env.shard_name(a, b)) / "drained.json")}
        for a, b in parents
    ]


def merged_config(env: TaskEnv, name: str, parents: list[dict[str, str]]):
    return env.config(0, 16, shard=name, mergeFrom=parents)


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_a_merge_of_parents_stopped_at_different_positions_is_exact(kind, make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, kind)
    events = with_bad_amounts(list(generate_events(1000, 64, seed=17)), every=37)
    left, right = (ShardRunner(env.config(a, b), shard_spark) for a, b in (LEFT, RIGHT))
    produce(events[:400])
    left.start()
    right.start()
    wait_caught_up(env, [left, right])
    right_summary = right.drain()  # the right parent stops here ...
    produce(events[400:700])
    wait_caught_up(env, [left])
    left_summary = left.drain()  # ... the left one 300 events later
    f_left, f_right = left_summary["positions"], right_summary["positions"]
    assert all(f_left[p] > f_right[p] for p in f_right), "the parents stopped at different positions"

    merged = ShardRunner(merged_config(env, "orders-0-16-m1", merge_from(env, LEFT, RIGHT)), shard_spark)
    merged.start()
    restore = merged.restore
    assert restore is not None and [s.parent for s in restore.slices] == ["orders-0-8", "orders-8-16"]
    assert restore.start_positions == f_right, "each partition from the lower of the two final positions"
    assert restore.skip is not None and restore.skip.owners == (
        (8, tuple(sorted((int(p[1:].split(".")[0]), o) for p, o in f_left.items()))),
        (16, ()),
    ), "the left parent's key groups skip what it counted; the right parent's skip nothing"
    produce(events[700:850])
    wait_caught_up(env, [merged])
    assert env.results() == ref.results, "no event lost, none counted twice"

    # Each key group restored from its own parent's snapshot, and nothing else opened.
    report = restore_report(env, merged.config.shard)
    opened = {f for r in report.values() for f in r["files"]}
    manifests = [json.loads(Path(s["manifest"]).read_text()) for s in (left_summary, right_summary)]
    assert opened == snapshot_files(manifests[0], 0, 8) | snapshot_files(manifests[1], 8, 16)
    lineage = json.loads((shard_dir(env, merged.config.shard) / "lineage.json").read_text())
    assert lineage["parents"] == ["orders-0-8", "orders-8-16"] and lineage["parent"] is None

    if kind == "python-sum":  # every invalid record's dead letter exactly once, by the shard that owned it then
        letters = dead_letters(env)
        positions = [(p, o) for _, p, o in letters]
        assert len(positions) == len(set(positions)), "a dead letter written twice"
        assert len(letters) == len(range(0, 850, 37)), "the events produced so far"
        assert {s for s, _, _ in letters} >= {"orders-0-8", "orders-8-16", "orders-0-16-m1"}
    # History retention prunes both parents; a restart of the merged shard resumes from its own recovery log and
    # the plan (start positions, skip rule) it recorded, never from the pruned snapshots.
    merged = restart_after_pruning(env, merged, ["orders-0-8", "orders-8-16"], shard_spark)
    assert merged.restore.skip == restore.skip, "the recorded skip rule"
    produce(events[850:])
    wait_caught_up(env, [merged])
    assert env.results() == ref.results, "the merged shard restarted after its parents were pruned is exact"
    summary = merged.drain()
    assert summary["event"] == "drained"
    manifest = json.loads(Path(summary["manifest"]).read_text())
    assert [p["shard"] for p in manifest["parents"]] == ["orders-0-8", "orders-8-16"]
    assert manifest["skip"] == restore.skip.to_json(), "its children inherit the rule"

    # The merged shard's own successor (over its whole range) inherits the rule, commits, and resumes exactly
    # after the merged shard is pruned too.
    successor_restore = {"parent": "orders-0-16-m1", "manifest": summary["manifest"]}
    successor = ShardRunner(env.config(0, 16, successor_restore), shard_spark)
    successor.start()
    more = with_bad_amounts(list(generate_events(300, 64, seed=18)), every=37)
    produce(more[:150])
    wait_caught_up(env, [successor])
    successor = restart_after_pruning(env, successor, ["orders-0-16-m1"], shard_spark)
    produce(more[150:])
    wait_caught_up(env, [successor])
    assert env.results() == ref.results, "the merged shard's successor restarted after its pruning is exact"
    successor.stop()


def test_a_merged_child_drained_before_its_first_batch_hands_its_rule_on(make_task, shard_spark):
    """The merged child drains at its start positions (the lower ones) with both slices as its state; its own
    child restores that state and skips, by the inherited rule, what the left parent counted."""
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, "builtin-count")
    events = list(generate_events(700, 48, seed=23))
    left, right = (ShardRunner(env.config(a, b), shard_spark) for a, b in (LEFT, RIGHT))
    produce(events[:300])
    left.start()
    right.start()
    wait_caught_up(env, [left, right])
    left.drain()  # this time the left parent stops first
    produce(events[300:500])
    wait_caught_up(env, [right])
    right.drain()

    merged = ShardRunner(merged_config(env, "orders-0-16-m1", merge_from(env, LEFT, RIGHT)), shard_spark)
    assert merged.prepare()
    summary = merged.drain()  # never started a query
    assert summary["batchId"] == -1
    manifest = json.loads(Path(summary["manifest"]).read_text())
    assert manifest["skip"] is not None and manifest["skip"][0][1] == [], "the left side skips nothing"

    child = ShardRunner(
        env.config(0, 16, {"parent": "orders-0-16-m1", "manifest": summary["manifest"]}, shard="orders-0-16-c"),
        shard_spark,
    )
    child.start()
    assert child.restore is not None and child.restore.skip is not None
    produce(events[500:])
    wait_caught_up(env, [child])
    assert env.results() == ref.results, "the inherited rule skipped exactly what the right parent counted"
    child.drain()


def test_the_merged_child_announces_itself_to_both_parents_and_they_drain(make_task, shard_spark, caplog):
    """The protocol: the child starts on standby while both parents run; its request and ready notes cover each
    parent's range, so each parent drains at its next batch boundary; then the child restores both."""
    from spark_runtime.layout import ShardPaths
    from spark_runtime.protocol import HandoverNote
    from spark_runtime.shard import ShardRunner

    from .test_handover import caught_up

    env, ref, produce = task_with_reference(make_task, "builtin-count")
    events = list(generate_events(600, 48, seed=29))
    parents = [ShardRunner(env.config(a, b), shard_spark) for a, b in (LEFT, RIGHT)]
    merged = ShardRunner(merged_config(env, "orders-0-16-m1", merge_from(env, LEFT, RIGHT)), shard_spark)
    produce(events[:300])
    threads = [InThread(p.run, f"run {p.config.shard}") for p in parents]
    child = InThread(merged.run, "run merged")
    try:
        for t in threads:
            t.start()
        for p in parents:  # by their progress: the runners poll themselves in their threads
            caught_up(env, p.config.shard)
        child.start()
        summaries = [t.finish(240) for t in threads]  # each parent drains by itself once the notes cover it
        assert [s["event"] for s in summaries] == ["drained", "drained"]
        for p in parents:
            paths = ShardPaths.of(env.storage, env.task, p.config.shard)
            (ready,) = [f for f in paths.handover_dir.iterdir() if f.name.startswith("ready-orders-0-16-m1.")]
            note = HandoverNote.from_json(ready.read_json())
            assert (note.child, note.start, note.end, str(note.mode)) == ("orders-0-16-m1", 0, 16, "catch-up")
            assert (
                ready.name
                == f"ready-orders-0-16-m1.{merged.fence.epoch}.json"
                == f"ready-{note.child}.{note.epoch}.json"
            )
            assert summaries[parents.index(p)]["successors"] == [
                {"shard": "orders-0-16-m1", "keyGroups": {"start": 0, "end": 16}}
            ]
        assert wait_until(lambda: merged.query is not None, 240), "the merged child never started its query"
        produce(events[300:])
        deadline_ok = wait_until(
            lambda: (env.progress("orders-0-16-m1") or {}).get("positions") == env.journal_ends(), 240
        )
        assert deadline_ok, f"the merged child did not catch up: {env.progress('orders-0-16-m1')}"
        assert env.results() == ref.results
        standby = json.loads((shard_dir(env, "orders-0-16-m1") / "standby.json").read_text())
        assert standby["parent"] == ["orders-0-8", "orders-8-16"] and standby["mode"] == "catch-up"
        merged.request_drain("test: done")
        assert child.finish(240)["event"] == "drained"
    finally:
        release([*parents, merged], [*threads, child])


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_a_merged_catch_up_emits_each_record_past_its_own_parents_fence_once(kind, make_task, shard_spark):
    """Catch-up merge (the journal): the merged child restores both parents' pre-copies and follows both while
    they run. The right parent drains first at ``F_R``, the left one a wave later at ``F_L``; the child, held back
    meanwhile, then reads one batch across both fences: records before ``F_R`` are held for everyone, those
    between the fences are held for the left parent's key groups only (it emitted them), and the rest emit. That
    batch emits exactly the keys whose records lie past their own parent's fence; state stays exact, no parent
    emits after its drain, and every dead letter is counted once."""
    from spark_runtime.keygroups import KeyGrouping
    from spark_runtime.produce import append_lines
    from spark_runtime.shard import ShardRunner

    from .test_handover import BAD, _le, batch_keys, caught_up, checkpoint_positions, emitted

    env, ref, produce = task_with_reference(make_task, kind)
    events = list(generate_events(900, 24, seed=41))
    mid = [{"key": f"mid-{i}", "seq": 10_000 + i, "amount": i} for i in range(16)]
    after = [{"key": f"after-{i}", "seq": 20_000 + i, "amount": i} for i in range(16)]
    produce(events[:300])
    drain = {side: threading.Event() for side in ("left", "right")}
    follow_again = threading.Event()
    parents = [ShardRunner(env.config(a, b), shard_spark) for a, b in (LEFT, RIGHT)]
    for p, side in zip(parents, ("left", "right"), strict=True):
        answer = p.as_parent.tick
        p.as_parent.tick = lambda a=answer, s=side: a() if drain[s].is_set() else (a(), None)[1]
    merged = ShardRunner(merged_config(env, "orders-0-16-m1", merge_from(env, LEFT, RIGHT)), shard_spark)
    hand, follow = merged.as_child, merged.as_child.tick
    hand.tick = lambda: None if hand.state is not None and hand.state.ready and not follow_again.is_set() else follow()
    threads = [InThread(p.run, f"run {p.config.shard}") for p in parents] + [InThread(merged.run, "run merged")]
    try:
        for t in threads[:2]:
            t.start()
        for p in parents:
            caught_up(env, p.config.shard)
        threads[2].start()
        assert wait_until(lambda: bool(hand.state and hand.state.ready), 240), "the merged child never got ready"
        produce(events[300:600])
        append_lines(env.journal, 0, BAD)  # before both fences: the parents count these
        for p in parents:
            caught_up(env, p.config.shard)
        drain["right"].set()
        f_right = threads[1].finish(240)["positions"]
        produce(events[600:750] + mid)  # between the fences: the left parent emits its part, the child the rest
        caught_up(env, parents[0].config.shard)
        drain["left"].set()
        f_left = threads[0].finish(240)["positions"]
        assert all(f_left[k] >= f_right[k] for k in f_right) and f_left != f_right
        produce(events[750:] + after)
        append_lines(env.journal, 1, BAD)
        follow_again.set()
        caught_up(env, "orders-0-16-m1")
        assert env.results() == ref.results, "no event lost, none counted twice"

        state = json.loads((shard_dir(env, "orders-0-16-m1") / "catch-up.json").read_text())
        assert state["kind"] == "merge" and state["phase"] == "live" and state["finals"] == [f_left, f_right]
        for p, summary_final in zip(parents, (f_left, f_right), strict=True):
            summary = json.loads((shard_dir(env, p.config.shard) / "drained.json").read_text())
            assert summary["handover"] == "catch-up" and summary["positions"] == summary_final
            assert max(emitted(env, p.config.shard)) <= summary["batchId"], "no parent emits after its drain"
        out = emitted(env, "orders-0-16-m1")
        assert out and 0 not in out
        assert not [b for b in out if _le(env, "orders-0-16-m1", b, f_right)], "nothing emitted before both fences"
        first = out[0]
        start = checkpoint_positions(env, "orders-0-16-m1", first - 1)
        assert all(start[k] <= f_right[k] for k in f_right), "its first emitting batch crosses both fences"
        grouping = KeyGrouping(16)

        def keys(chunk: list[dict], lo: int, hi: int) -> set[str]:
            return {e["key"] for e in chunk if lo <= grouping.of(e["key"], 0) < hi}

        between, past = events[600:750] + mid, events[750:] + after
        want = keys(between + past, *RIGHT) | keys(past, *LEFT)
        assert keys(mid, *LEFT) and keys(mid, *RIGHT), "keys of both parents between the fences"
        assert batch_keys(env, "orders-0-16-m1", first) == want, "exactly the keys past their own parent's fence"
    finally:
        release([*parents, merged], threads)
    total = sum(
        json.loads((shard_dir(env, p.config.shard) / "drained.json").read_text())["deadLetters"] for p in parents
    )
    assert total + merged.drain()["deadLetters"] == 2 * len(BAD), "each dead letter counted by one shard"
    assert env.results() == ref.results


def test_a_merged_catch_up_whose_fence_batch_has_no_record_past_either_fence_commits_its_state(make_task, shard_spark):
    """Catch-up merge, builtin: the merged child lags both parents when they drain and nothing arrives past their
    fences but a dead letter, so the batch that reaches them holds every record of a key it reads and keeps no
    result. It still commits its
    state stores (the stateful plan runs in full whatever the sink keeps): the checkpoint holds a state version for
    every committed batch, and the child's later input is exact."""
    from spark_runtime.checkpoint import last_committed_batch, uncommitted_state
    from spark_runtime.produce import append_lines
    from spark_runtime.shard import ShardRunner

    from .test_handover import caught_up, emitted

    env, ref, produce = task_with_reference(make_task, "builtin-count")
    events = list(generate_events(600, 24, seed=43))
    produce(events[:200])
    drain, follow_again = threading.Event(), threading.Event()
    parents = [ShardRunner(env.config(a, b), shard_spark) for a, b in (LEFT, RIGHT)]
    for p in parents:
        answer = p.as_parent.tick
        p.as_parent.tick = lambda a=answer: a() if drain.is_set() else (a(), None)[1]
    merged = ShardRunner(merged_config(env, "orders-0-16-m1", merge_from(env, LEFT, RIGHT)), shard_spark)
    hand, follow = merged.as_child, merged.as_child.tick
    hand.tick = lambda: None if hand.state is not None and hand.state.ready and not follow_again.is_set() else follow()
    threads = [InThread(p.run, f"run {p.config.shard}") for p in parents] + [InThread(merged.run, "run merged")]
    try:
        for t in threads[:2]:
            t.start()
        for p in parents:
            caught_up(env, p.config.shard)
        threads[2].start()
        assert wait_until(lambda: bool(hand.state and hand.state.ready), 240), "the merged child never got ready"
        produce(events[200:400])  # before both fences: the parents alone emit it
        for p in parents:
            caught_up(env, p.config.shard)
        drain.set()
        for t in threads[:2]:
            assert t.finish(240)["event"] == "drained"
        append_lines(env.journal, 1, ["{bad json"])  # past both fences: a dead letter, no record of a key
        follow_again.set()
        caught_up(env, "orders-0-16-m1")
        checkpoint = shard_dir(env, "orders-0-16-m1") / "checkpoint"
        assert hand.state is not None and hand.state.phase == "live"
        assert last_committed_batch(checkpoint) >= 1 and uncommitted_state(checkpoint) is None
        assert env.results() == ref.results, "no event lost, none counted twice"
        produce(events[400:])  # past both fences: the merged child emits it
        caught_up(env, "orders-0-16-m1")
        assert uncommitted_state(checkpoint) is None and emitted(env, "orders-0-16-m1")
        assert env.results() == ref.results
    finally:
        release([*parents, merged], threads)
