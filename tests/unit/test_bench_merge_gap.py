"""bench/merge_gap.py's summary: the Targets rows of the journal and of the Kafka + MinIO runs from recorded
trials (no Spark, no broker)."""

from __future__ import annotations

import pytest

from .test_bench_executors import load

pytestmark = pytest.mark.unit


def trials(split_gaps: list[float], merge_gaps: list[float]) -> list[dict]:
    def one(kind: str, gap: float) -> dict:
        return {
            "kind": kind,
            "keys": 50_000,
            "gapSeconds": gap,
            "requestToEmitSeconds": 60.0,
            "lastDrainToEmitSeconds": gap / 2,
            "parentsStopSpreadSeconds": 0.0,
            "cpuSeconds": gap * 3,
            "successorCpuSeconds": [gap, gap * 2] if kind == "split" else [gap * 3],
            "parentCommits": int(gap) * 2,
        }

    return [one("split", g) for g in split_gaps] + [one("merge", g) for g in merge_gaps]


@pytest.mark.parametrize("source", ["journal", "kafka"])
def test_targets_name_the_source_and_say_why_a_miss_is_a_miss(source):
    mg = load("bench_merge_gap", "merge_gap.py")
    kafka = source == "kafka"
    body = mg.report(trials([20.0, 30.0], [10.0, 12.0]), 0.0, kafka)
    rows = {t["name"]: t for t in body["targets"]}
    assert body["raw"]["medianGapSeconds"] == {"split": 25.0, "merge": 11.0}
    medians = {row[0]: row[1:] for row in body["tables"][0][2]}
    assert medians["median CPU s of the successors, request -> every child emits"] == [75.0, 33.0]
    busiest = medians["median CPU s of the busiest successor (the floor with a core per pod)"]
    assert busiest == [50.0, 33.0], "per trial the busiest successor, then the median over trials"
    assert medians["median commits of the (first) parent from the request to its final drain"] == [50.0, 22.0]
    chain_row = "median processing gap of a chained split (s)"
    assert chain_row not in medians, "no --chain, no row"
    more = [r | {"chainGapSeconds": r["gapSeconds"] + 1} if r["kind"] == "split" else r for r in trials([20, 30], [9])]
    more.append(trials([4.0], [])[0] | {"kind": mg.JIT, "jvmOptions": "-XX:TieredStopAtLevel=1"})
    more_body = mg.report(more, 0.0, kafka)
    more_rows = {row[0]: row[1:] for row in more_body["tables"][0][2]}
    assert more_rows[chain_row] == [26.0, ""], "the chained splits' median, beside the splits'"
    jit_row = "median processing gap (s) and successors' CPU s, every shard with -XX:TieredStopAtLevel=1"
    assert more_rows[jit_row] == ["4.0 s, 12.0 CPU s", ""]
    counted = mg.summarize({"raw": more_body["raw"]})[0]
    assert "over 1 trial(s) of each" in counted, "trials with other JVM options are not counted"
    assert more_body["raw"]["medianGapSeconds"]["split"] == 25.0, "a split with other JVM options is not a split"
    if kafka:
        assert "with -XX:TieredStopAtLevel=1 on every shard: 4.0 s" in more_body["targets"][0]["why"]
    if kafka:
        split = rows["processing gap, split, Kafka + MinIO (median)"]
        assert split["value"] == "25.0 s" and not split["met"] and "restore" in split["why"]
        merge = rows["merge processing gap vs split (median, same state, Kafka + MinIO)"]
    else:
        assert list(rows) == ["merge processing gap vs split (median, same state)"]
        merge = rows["merge processing gap vs split (median, same state)"]
    assert merge["met"] and merge["value"] == "merge 11.0 s vs split 25.0 s (0.44x)"
    slow = mg.report(trials([5.0], [9.0]), 0.0, kafka)["targets"][-1]
    assert not slow["met"] and "restore" in slow["why"], "a missed merge row says where the time goes"
    summary = mg.summarize({"raw": body["raw"]})
    assert summary and "merge 11.0 s, split 25.0 s" in summary[0] and "0.44x" in summary[0]
