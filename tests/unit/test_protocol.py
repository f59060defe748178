"""The split protocol's shared contract (spark_runtime.protocol): pure rules both sides rely on."""

from __future__ import annotations

import pytest

from spark_runtime.protocol import (
    CatchUpPhase,
    CatchUpState,
    DrainSummary,
    HandoverMode,
    HandoverNote,
    SummaryEvent,
    at_or_after,
    clamp,
    covers,
    drain_summary_uri,
)

pytestmark = pytest.mark.unit


def note(start: int, end: int, mode: HandoverMode = HandoverMode.CATCH_UP) -> HandoverNote:
    return HandoverNote(f"t-{start}-{end}", start, end, mode)


@pytest.mark.parametrize(
    "ranges, covered",
    [
        ([(0, 8), (8, 16)], True),
        ([(8, 16), (0, 8)], True),
        ([(0, 8)], False),
        ([(0, 7), (8, 16)], False),
        ([(0, 12), (4, 16)], True),
        ([], False),
    ],
)
def test_ready_notes_must_cover_the_parent_range(ranges, covered):
    assert covers([note(a, b) for a, b in ranges], 0, 16) is covered


def test_positions_compare_per_partition_for_journal_and_kafka():
    assert at_or_after({"p0.jsonl": 10, "p1.jsonl": 5}, {"p0.jsonl": 10, "p1.jsonl": 5})
    assert not at_or_after({"p0.jsonl": 11, "p1.jsonl": 4}, {"p0.jsonl": 10, "p1.jsonl": 5})
    assert at_or_after({"t": {"0": 7, "1": 3}}, {"t": {"0": 7, "1": 2}})
    assert not at_or_after({"t": {"0": 6}}, {"t": {"0": 7, "1": 2}})
    assert at_or_after({"p1.jsonl": 5}, {"p0.jsonl": 99, "p1.jsonl": 5}), "a nested child compares its own files"


def test_clamp_caps_at_the_limit_and_never_goes_below_the_start():
    assert clamp(
        {"p0.jsonl": 100, "p1.jsonl": 50}, {"p0.jsonl": 10, "p1.jsonl": 40}, {"p0.jsonl": 60, "p1.jsonl": 30}
    ) == {
        "p0.jsonl": 60,
        "p1.jsonl": 40,
    }
    assert clamp({"p0.jsonl": 100}, {"p0.jsonl": 0}, {}) == {"p0.jsonl": 100}, "no limit named: unchanged"


def test_a_batch_emits_only_once_the_final_positions_are_known_and_it_starts_there():
    shadow = CatchUpState("p", "/m", CatchUpPhase.SHADOW, limit={"p0.jsonl": 50})
    assert not shadow.emits_from({"p0.jsonl": 50}), "the parent has not drained: nothing emits"
    final = CatchUpState("p", "/m", CatchUpPhase.FINAL, limit={"p0.jsonl": 80}, final={"p0.jsonl": 80})
    assert not final.emits_from({"p0.jsonl": 79})
    assert final.emits_from({"p0.jsonl": 80})
    live = CatchUpState.from_json(CatchUpState("p", "/m", CatchUpPhase.LIVE, final={"p0.jsonl": 80}).to_json())
    assert live.phase == CatchUpPhase.LIVE and live.emits_from({"p0.jsonl": 95})


def test_notes_and_summaries_round_trip_through_json():
    n = note(0, 8, HandoverMode.RESTORE)
    assert HandoverNote.from_json(n.to_json()) == n
    summary = DrainSummary(
        event=SummaryEvent.DRAINED,
        task="t",
        shard="t-0-16",
        batch_id=9,
        manifest="/s/t/shards/t-0-16/snapshots/batch-7/manifest.json",
        positions={"p0.jsonl": 120},
        handover=HandoverMode.CATCH_UP,
        snapshot_batch_id=7,
    )
    data = summary.to_json()
    assert data["event"] == "drained" and data["handover"] == "catch-up" and data["snapshotBatchId"] == 7
    assert DrainSummary.from_json(data) == summary
    stop = DrainSummary(SummaryEvent.STOPPED, "t", "t-0-16", 3, "/m").to_json()
    assert "handover" not in stop, "a stop is no hand-over"


def test_the_operator_and_the_runtime_name_the_drain_summary_alike():
    from spark_runtime.layout import ShardPaths

    assert (
        drain_summary_uri("/data/state/orders/", "orders-0-64")
        == ShardPaths.of("/data/state", "orders", "orders-0-64").drained.uri()
    )
