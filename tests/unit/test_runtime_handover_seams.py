"""Where two hand-overs meet, the runtime's side (no Spark session: the hand-over talks through storage only):
a parent honours only its successors' current notes and hands over to one set of them, never two; a final drain
backs out when an abort fenced a successor before its marker; a successor its parent's drain summary does not
name refuses to restore; a merge's abort fences the merged shard and says whether a parent drained; files a
fenced runtime writes late are void (its drain summary, its snapshot directory)."""

from __future__ import annotations

import pytest

from spark_runtime.config import parse_config
from spark_runtime.fencing import WriterFence, barrier_after, is_current
from spark_runtime.handover import abort_split, own_drain_summary
from spark_runtime.layout import ShardPaths
from spark_runtime.merge import abort_merge
from spark_runtime.protocol import (
    DrainSummary,
    HandoverMode,
    HandoverNote,
    MergeAbortOutcome,
    SummaryEvent,
)
from spark_runtime.shard import ShardRunner
from spark_runtime.snapshot import RestoreError
from spark_runtime.storage import location

pytestmark = pytest.mark.unit

TASK = "orders"


def config(tmp_path, start: int, end: int, name: str | None = None, **extra) -> dict:
    return {
        "task": TASK,
        "shard": name or f"{TASK}-{start}-{end}",
        "maxKeyGroups": 16,
        "keyGroups": {"start": start, "end": end},
        "processor": {"builtin": "count"},
        "source": {"journal": {"path": str(tmp_path / "journal"), "partitions": 2}},
        "sink": {"directory": {"path": str(tmp_path / "out")}},
        "storage": {"path": str(tmp_path / "state")},
        "metricsPort": 0,
        **extra,
    }


def runner(tmp_path, start: int, end: int, name: str | None = None, **extra) -> ShardRunner:
    return ShardRunner(parse_config(config(tmp_path, start, end, name, **extra)))


def paths(tmp_path, shard: str) -> ShardPaths:
    return ShardPaths.of(location(tmp_path / "state"), TASK, shard)


def announce(tmp_path, parent: str, child: str, start: int, end: int, mode: HandoverMode = HandoverMode.RESTORE):
    """A successor runtime starts (claims its epoch) and writes its ready note into ``parent``'s hand-over."""
    fence = WriterFence(paths(tmp_path, child))
    epoch = fence.claim()
    note = HandoverNote(child, start, end, mode, "now", epoch)
    parent_paths = paths(tmp_path, parent)
    parent_paths.handover_ready(child, epoch).write_json(note.to_json())
    return note


def test_a_parent_hands_over_to_one_hand_overs_successors_never_to_two(tmp_path, caplog):
    parent = runner(tmp_path, 0, 16)
    low = announce(tmp_path, "orders-0-16", "orders-0-8", 0, 8)
    assert parent.as_parent.tick() is None, "one child of two: not covered"
    merged = announce(tmp_path, "orders-0-16", "orders-0-32-m1", 0, 32)
    high = announce(tmp_path, "orders-0-16", "orders-8-16", 8, 16)
    assert parent.as_parent.tick() is None, "a split's children and a merged shard: a conflict, no drain"
    assert "ready notes of two hand-overs overlap" in caplog.text and "orders-0-32-m1 [0, 32)" in caplog.text
    WriterFence(paths(tmp_path, "orders-0-32-m1")).claim(barrier=True)  # the merge was aborted: its note is void
    assert "successors ready" in (parent.as_parent.tick() or "")
    assert parent.as_parent.successors == [low, high]
    assert not is_current(paths(tmp_path, "orders-0-32-m1"), merged.epoch)


def test_a_final_drain_backs_out_when_an_abort_fenced_a_successor_before_its_marker(tmp_path):
    parent = runner(tmp_path, 0, 16)
    parent.fence.claim()
    announce(tmp_path, "orders-0-16", "orders-0-8", 0, 8)
    announce(tmp_path, "orders-0-16", "orders-8-16", 8, 16)
    reason = parent.as_parent.tick()
    assert reason is not None
    parent.request_drain(reason, final=True)
    WriterFence(paths(tmp_path, "orders-8-16")).claim(barrier=True)  # the abort's barrier, before the marker
    assert parent.drain() is None, "backed out: no summary"
    assert not parent.paths.drain_marker.exists() and not parent.drain_requested()
    assert not parent.paths.drained.exists()

    # A restart that finds a final marker an earlier run wrote for successors fenced since backs out too.
    note = announce(tmp_path, "orders-0-16", "orders-0-8", 0, 8)
    from spark_runtime.drain import marker_text

    parent.paths.drain_marker.write_text(marker_text("final", [note]))
    assert parent.drainer.back_out_of_earlier() is False, "its successor is still current: the drain goes on"
    WriterFence(paths(tmp_path, "orders-0-8")).claim(barrier=True)
    assert parent.drainer.back_out_of_earlier() is True and not parent.paths.drain_marker.exists()


def drained(tmp_path, shard: str, start: int, end: int, successors, *, epoch: int | None = None) -> None:
    shard_paths = paths(tmp_path, shard)
    epoch = epoch if epoch is not None else WriterFence(shard_paths).claim()
    summary = DrainSummary(
        SummaryEvent.DRAINED,
        TASK,
        shard,
        7,
        f"/m/{shard}",
        key_groups={"start": start, "end": end},
        writer_epoch=epoch,
        successors=successors,
    )
    shard_paths.drained.write_json(summary.to_json())


def merged_runner(tmp_path) -> ShardRunner:
    root = tmp_path / "state" / TASK / "shards"
    merge_from = [
        {"parent": "orders-0-8", "manifest": str(root / "orders-0-8" / "drained.json")},
        {"parent": "orders-8-16", "manifest": str(root / "orders-8-16" / "drained.json")},
    ]
    return runner(tmp_path, 0, 16, "orders-0-16-m1", mergeFrom=merge_from)


def test_a_successor_its_parents_summary_does_not_name_refuses_to_restore(tmp_path):
    merged = merged_runner(tmp_path)
    drained(tmp_path, "orders-0-8", 0, 8, (("orders-0-16-m1", 0, 16),))
    drained(tmp_path, "orders-8-16", 8, 16, (("orders-8-12", 8, 12), ("orders-12-16", 12, 16)))
    with pytest.raises(RestoreError) as refused:
        merged.as_child.manifests()
    assert refused.value.reason == "HandedToAnother"
    assert "orders-8-16 handed its range over to orders-8-12 [8, 12), orders-12-16 [12, 16)" in str(refused.value)


def test_a_drain_summary_written_late_by_a_superseded_runtime_is_void(tmp_path):
    merged = merged_runner(tmp_path)
    drained(tmp_path, "orders-0-8", 0, 8, (("orders-0-16-m1", 0, 16),))
    drained(tmp_path, "orders-8-16", 8, 16, (("orders-0-16-m1", 0, 16),))
    assert merged.as_child._answered()
    WriterFence(paths(tmp_path, "orders-8-16")).claim()  # a newer runtime of the right parent started since
    assert not merged.as_child._answered(), "the superseded runtime's summary does not count"
    right = paths(tmp_path, "orders-8-16")
    assert own_drain_summary(right) is None and not right.drained.exists(), "the current runtime removes it"


def test_a_merge_abort_fences_the_merged_shard_and_says_whether_a_parent_drained(tmp_path):
    merged = merged_runner(tmp_path)
    notes = [announce(tmp_path, p, "orders-0-16-m1", 0, 16) for p in ("orders-0-8", "orders-8-16")]
    (merged.paths.shard_dir / "standby.json").write_json({})
    summary = abort_merge(merged.io)
    assert summary["outcome"] == MergeAbortOutcome.ABORTED and summary["drained"] == []
    assert barrier_after(merged.paths, notes[0].epoch) == summary["writerEpoch"], "its notes are void from here on"
    for parent in ("orders-0-8", "orders-8-16"):
        assert not any(f.name.startswith("ready-") for f in paths(tmp_path, parent).handover_dir.iterdir())
    assert [d.name for d in merged.paths.shard_dir.iterdir()] == ["epochs"], "its storage cleared but the epochs"

    again = merged_runner(tmp_path)
    paths(tmp_path, "orders-8-16").drain_marker.write_text("final 2026-01-01T00:00:00Z []\n")  # draining already
    late = abort_merge(again.io)
    assert late["outcome"] == MergeAbortOutcome.TOO_LATE and late["drained"] == ["orders-8-16"]


def test_an_aborted_split_voids_a_drain_summary_its_parent_wrote_late(tmp_path):
    parent = runner(tmp_path, 0, 16)
    parent.fence.claim()
    late_epoch = parent.fence.epoch
    children = ["orders-0-8", "orders-8-16"]
    for child, (a, b) in zip(children, ((0, 8), (8, 16)), strict=True):
        announce(tmp_path, "orders-0-16", child, a, b)
    aborting = runner(tmp_path, 0, 16)
    summary = abort_split(aborting.io, children)
    assert summary["event"] == SummaryEvent.ABORTED
    # The old parent runtime, paused across the abort, writes its drain summary now: void, never honoured.
    drained(tmp_path, "orders-0-16", 0, 16, (("orders-0-8", 0, 8), ("orders-8-16", 8, 16)), epoch=late_epoch)
    assert own_drain_summary(parent.paths) is None and not parent.paths.drained.exists()
    for child in children:
        assert barrier_after(paths(tmp_path, child), 1) is not None, "each child fenced by a barrier"


def test_a_snapshot_export_only_ever_touches_its_own_epochs_directory(tmp_path):
    stale, current = runner(tmp_path, 0, 16), runner(tmp_path, 0, 16)
    stale.fence.claim()
    current.fence.claim()
    manifest, where = current.snapshots.write(-1)
    assert where == current.paths.manifest(-1, current.fence.epoch)
    again, found = stale.snapshots.write(-1)
    assert found == where and again == manifest, "a complete snapshot of the batch is reused, not exported again"
    stale.snapshots._export(-1, stale.paths.snapshot_dir(-1, 1), stale.paths.state_dir(-1, 1), in_drain=False)
    assert where.exists() and current.paths.state_dir(-1, current.fence.epoch).exists(), (
        "a stale export removes only its own epoch's directory"
    )
