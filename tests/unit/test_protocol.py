"""The split protocol's shared contract (spark_runtime.protocol): pure rules both sides rely on."""

from __future__ import annotations

import pytest

from spark_runtime.protocol import (
    CatchUpPhase,
    CatchUpState,
    DrainSummary,
    Emission,
    HandoverMode,
    HandoverNote,
    MergeCatchUpState,
    SummaryEvent,
    WriterEpoch,
    at_or_after,
    clamp,
    covers,
    drain_summary_uri,
    read_catch_up,
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
    unnamed = clamp({"p0.jsonl": 100, "p1.jsonl": 70}, {"p0.jsonl": 0, "p1.jsonl": 20}, {"p0.jsonl": 60})
    assert unnamed == {"p0.jsonl": 60, "p1.jsonl": 20}, "a file the limit does not name is not read past its start"


def test_a_batch_emits_only_past_the_final_positions_and_a_straddling_one_only_from_them():
    shadow = CatchUpState("p", "/m", CatchUpPhase.SHADOW, limit={"p0.jsonl": 50})
    assert shadow.emission({"p0.jsonl": 40}, {"p0.jsonl": 50}) == Emission.NONE, "the parent has not drained"
    assert shadow.holds("p0.jsonl", 10_000), "every record is held while the final positions are unknown"
    final = CatchUpState("p", "/m", CatchUpPhase.FINAL, final={"p0.jsonl": 80, "p1.jsonl": 30})
    assert final.emission({"p0.jsonl": 60, "p1.jsonl": 10}, {"p0.jsonl": 80, "p1.jsonl": 30}) == Emission.NONE
    straddles = final.emission({"p0.jsonl": 60, "p1.jsonl": 30}, {"p0.jsonl": 95, "p1.jsonl": 30})
    assert straddles == Emission.FROM_FENCE, "reaches the fence in one partition and passes it: results past it only"
    one_side = final.emission({"p0.jsonl": 80, "p1.jsonl": 20}, {"p0.jsonl": 95, "p1.jsonl": 40})
    assert one_side == Emission.FROM_FENCE, "past the fence in p0 but not yet in p1"
    assert final.emission({"p0.jsonl": 80, "p1.jsonl": 30}, {"p0.jsonl": 95, "p1.jsonl": 30}) == Emission.ALL
    assert final.holds("p0.jsonl", 79) and not final.holds("p0.jsonl", 80) and not final.holds("p1.jsonl", 31)
    live = CatchUpState.from_json(CatchUpState("p", "/m", CatchUpPhase.LIVE, final={"p0.jsonl": 80}).to_json())
    assert live.phase == CatchUpPhase.LIVE and live.emission({"p0.jsonl": 95}, {"p0.jsonl": 99}) == Emission.ALL


def test_a_merged_child_is_capped_by_both_parents_and_holds_each_key_group_by_its_own_parent():
    k_left, k_right = {"p0.jsonl": 40, "p1.jsonl": 10}, {"p0.jsonl": 30, "p1.jsonl": 25}
    shadow = MergeCatchUpState(("l", "r"), ("/ml", "/mr"), 8, CatchUpPhase.SHADOW, limits=(k_left, k_right))
    assert shadow.limit == {"p0.jsonl": 30, "p1.jsonl": 10}, "the lower parent's position, per file"
    assert shadow.final is None and shadow.held_by("p0.jsonl", 10_000) == (True, True)
    assert shadow.emission({"p0.jsonl": 0}, {"p0.jsonl": 30}) == Emission.NONE
    left_drained = MergeCatchUpState(
        ("l", "r"),
        ("/ml", "/mr"),
        8,
        CatchUpPhase.SHADOW,
        limits=(k_left, {"p0.jsonl": 90, "p1.jsonl": 90}),
        finals=({"p0.jsonl": 60, "p1.jsonl": 20}, None),
    )
    assert left_drained.limit == {"p0.jsonl": 60, "p1.jsonl": 20}, "a drained parent caps at its final positions"
    assert left_drained.emission({"p0.jsonl": 0}, {"p0.jsonl": 60}) == Emission.NONE, "the right one still emits"
    final = MergeCatchUpState(
        ("l", "r"),
        ("/ml", "/mr"),
        8,
        CatchUpPhase.FINAL,
        finals=({"p0.jsonl": 60, "p1.jsonl": 20}, {"p0.jsonl": 80, "p1.jsonl": 20}),
    )
    assert final.limit is None and final.final == {"p0.jsonl": 60, "p1.jsonl": 20}
    assert final.cuts("p0.jsonl") == [60, 80] and final.cuts("p1.jsonl") == [20]
    assert final.held_by("p0.jsonl", 59) == (True, True)
    assert final.held_by("p0.jsonl", 60) == (False, True), "past the left parent's fence, not the right one's"
    assert final.held_by("p0.jsonl", 80) == (False, False)
    assert final.emission({"p0.jsonl": 30, "p1.jsonl": 20}, {"p0.jsonl": 60, "p1.jsonl": 20}) == Emission.NONE
    straddle = final.emission({"p0.jsonl": 60, "p1.jsonl": 20}, {"p0.jsonl": 70, "p1.jsonl": 20})
    assert straddle == Emission.FROM_FENCE, "past the left fence only: the right parent emitted its records"
    assert final.emission({"p0.jsonl": 80, "p1.jsonl": 20}, {"p0.jsonl": 90, "p1.jsonl": 25}) == Emission.ALL
    again = read_catch_up(final.to_json())
    assert again == final and isinstance(
        read_catch_up(CatchUpState("p", "/m", CatchUpPhase.LIVE).to_json()), CatchUpState
    )
    nested = MergeCatchUpState(
        ("l", "r"), ("/ml", "/mr"), 8, CatchUpPhase.FINAL, finals=({"p0.jsonl": 60}, {"p1.jsonl": 20})
    )
    assert nested.held_by("p1.jsonl", 5) == (False, True), "a file a parent does not read holds nothing for it"
    assert nested.emission({"p0.jsonl": 60, "p1.jsonl": 20}, {"p0.jsonl": 70, "p1.jsonl": 30}) == Emission.ALL


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


def test_a_parent_hands_over_to_one_set_of_successors_that_tiles_its_range():
    from spark_runtime.protocol import HandoverConflict, choose_successors

    split = [note(0, 8, HandoverMode.RESTORE), note(8, 16, HandoverMode.RESTORE)]
    assert choose_successors(split, 0, 16) == split
    assert choose_successors(split[:1], 0, 16) is None, "not covered yet"
    merged = HandoverNote("t-0-32-m1", 0, 32, HandoverMode.RESTORE, epoch=2)
    assert choose_successors([merged], 0, 16) == [merged], "a merged shard covers more than this parent"
    assert choose_successors([merged], 16, 32) == [merged]
    conflict = choose_successors([*split, merged], 0, 16)
    assert isinstance(conflict, HandoverConflict) and "t-0-32-m1 [0, 32)" in conflict.describe()
    assert isinstance(choose_successors([split[0], merged], 0, 16), HandoverConflict), "even before it covers"
    older = HandoverNote("t-0-8", 0, 8, HandoverMode.RESTORE, epoch=1)
    newer = HandoverNote("t-0-8", 0, 8, HandoverMode.CATCH_UP, epoch=3)
    assert choose_successors([older, newer, split[1]], 0, 16) == [newer, split[1]], "one note per successor"
    assert choose_successors([HandoverNote("x", 20, 30, HandoverMode.RESTORE)], 0, 16) is None, "outside"


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("ready-t-0-8.json", ("ready", "t-0-8", None)),
        ("ready-t-0-8.7.json", ("ready", "t-0-8", 7)),
        ("request-t-0-32-m1a2b3c.12.json", ("request", "t-0-32-m1a2b3c", 12)),
        ("precopy.json", None),
        ("ready-t-0-8.json.tmp-1-abc", None),
        (".ready-t-0-8.7.json.tmp-9", None),
    ],
)
def test_note_names_carry_the_writer_epoch(name, parsed):
    from spark_runtime.protocol import parse_note_name, ready_name, request_name

    assert parse_note_name(name) == parsed
    if parsed is not None:
        kind, child, epoch = parsed
        assert (ready_name if kind == "ready" else request_name)(child, epoch) == name


def test_a_drain_summary_names_its_successors_and_the_summaries_round_trip():
    from spark_runtime.protocol import (
        FailureSummary,
        MergeAbortOutcome,
        MergeAbortSummary,
        StandbyStopSummary,
    )

    summary = DrainSummary(
        SummaryEvent.DRAINED, "t", "t-0-16", 4, "/m", successors=(("t-0-8", 0, 8), ("t-8-16", 8, 16))
    )
    back = DrainSummary.from_json(summary.to_json())
    assert back == summary
    assert back.hands_to("t-0-8", 0, 8) and not back.hands_to("t-0-16-m1", 0, 16)
    assert not back.hands_to("t-0-8", 0, 16), "the range too"
    legacy = DrainSummary.from_json({k: v for k, v in summary.to_json().items() if k != "successors"})
    assert legacy.successors is None and legacy.hands_to("anyone", 0, 16), "an older runtime named none"
    fenced = FailureSummary("s", "superseded", reason="WriterFenced", event=SummaryEvent.FENCED, pod_uid="u1")
    assert FailureSummary.from_json(fenced.to_json()) == fenced
    with pytest.raises(ValueError):
        FailureSummary.from_json({"event": "failed", "error": " "})
    aborted = MergeAbortSummary("t", "m", MergeAbortOutcome.TOO_LATE, ("l",), 5, "now")
    assert MergeAbortSummary.from_json(aborted.to_json()) == aborted
    assert StandbyStopSummary("t", "s").to_json()["standby"] is True
    epoch = WriterEpoch(3, "s", "pod", 1, "now", barrier=True)
    assert (
        WriterEpoch.from_json(epoch.to_json()) == epoch and "barrier" not in WriterEpoch(1, "s", "p", 1, "n").to_json()
    )
