"""The pure rules of a merge (spark_runtime.protocol.SkipRule, spark_runtime.snapshot.restore): where a merged
child starts, what it skips, and which parents it accepts. Checked against a brute-force model of which rows
each parent counted."""

from __future__ import annotations

import itertools

import pytest

from spark_runtime.protocol import SkipRule, lowest_positions
from spark_runtime.snapshot.manifest import RestoreError
from spark_runtime.snapshot.restore import ParentSlice, check_merge_ranges, counted_up_to, start_and_skip
from spark_runtime.sources.journal import JournalSource

CONFIG = {
    "task": "t",
    "shard": "t-0-16-m1",
    "maxKeyGroups": 16,
    "keyGroups": {"start": 0, "end": 16},
    "processor": {"builtin": "count"},
    "source": {"journal": {"path": "/j", "partitions": 2}},
    "sink": {"directory": {"path": "/o"}},
    "storage": {"path": "/s"},
}
"""A minimal shard config (``shard.json``)."""


def journal(partitions: int = 2, read: list[int] | None = None, nested: bool = False) -> JournalSource:
    return JournalSource("/nonexistent", partitions, read_partitions=read, nested=nested)


def parent(name: str, start: int, end: int, positions: dict, skip: list | None = None) -> ParentSlice:
    return ParentSlice(name, f"/m/{name}", {"positions": positions, "skip": skip}, start, end)


def test_lowest_positions_flat_and_nested():
    assert lowest_positions([{"p0.jsonl": 10, "p1.jsonl": 50}, {"p0.jsonl": 30, "p1.jsonl": 20}]) == {
        "p0.jsonl": 10,
        "p1.jsonl": 20,
    }
    assert lowest_positions([{"t": {"0": 5, "1": 9}}, {"t": {"0": 7, "2": 3}}]) == {"t": {"0": 5, "1": 9, "2": 3}}
    # names one parent lacks (nested partitions: each reads its own) come from the other
    assert lowest_positions([{"p0.jsonl": 10}, {"p1.jsonl": 4}]) == {"p0.jsonl": 10, "p1.jsonl": 4}


def test_skip_rule_keeps_exactly_what_the_owner_did_not_count():
    rule = SkipRule.of([(8, {0: 100, 1: 40}), (16, {0: 60, 1: 90})], {0: 60, 1: 40})
    assert not rule.skips_nothing
    assert rule.owners == ((8, ((0, 100),)), (16, ((1, 90),)))
    assert rule.keeps(3, 0, 99) is False and rule.keeps(3, 0, 100) is True
    assert rule.keeps(3, 1, 40) is True  # the left parent stopped where the child starts
    assert rule.keeps(12, 0, 60) is True and rule.keeps(12, 1, 89) is False and rule.keeps(12, 1, 90) is True
    assert rule.keeps(12, 7, 0) is True  # a partition no parent is ahead in: nothing skipped
    assert SkipRule.from_json(rule.to_json()) == rule
    assert SkipRule.of([(8, {0: 5}), (16, {0: 5})], {0: 5}).skips_nothing


def test_skip_rule_sql_spells_the_same_rule():
    rule = SkipRule.of([(8, {0: 100, 1: 40}), (16, {0: 60, 1: 90})], {0: 60, 1: 40})
    assert rule.sql("kg", "p", "o") == (
        "o >= CASE WHEN kg < 8 THEN CASE WHEN p = 0 THEN 100 ELSE -1 END "
        "WHEN kg < 16 THEN CASE WHEN p = 1 THEN 90 ELSE -1 END ELSE -1 END"
    )


def test_a_merge_starts_at_the_lower_position_and_skips_what_the_other_parent_counted():
    left = parent("t-0-8", 0, 8, {"p0.jsonl": 100, "p1.jsonl": 40})
    right = parent("t-8-16", 8, 16, {"p0.jsonl": 60, "p1.jsonl": 90})
    start, rule = start_and_skip(journal(), [left, right])
    assert start == {"p0.jsonl": 60, "p1.jsonl": 40}
    assert rule is not None and rule.owners == ((8, ((0, 100),)), (16, ((1, 90),)))
    # Parents that stopped at the same positions: nothing to skip.
    same = parent("t-8-16", 8, 16, {"p0.jsonl": 100, "p1.jsonl": 40})
    assert start_and_skip(journal(), [left, same]) == ({"p0.jsonl": 100, "p1.jsonl": 40}, None)


def test_a_split_child_inherits_its_parents_rule_only_for_its_range():
    """A child of a merged shard that drained before it passed its parents' positions: its own restore skips
    what the merged shard's state already has (C = max(final, inherited))."""
    merged_rule = [[8, [[0, 100]]], [16, [[1, 90]]]]
    merged = parent("t-0-16-m", 0, 16, {"p0.jsonl": 80, "p1.jsonl": 50}, merged_rule)
    left = ParentSlice("t-0-16-m", "/m", merged.manifest, 0, 8)
    right = ParentSlice("t-0-16-m", "/m", merged.manifest, 8, 16)
    start, rule = start_and_skip(journal(), [left])
    assert start == {"p0.jsonl": 80, "p1.jsonl": 50}
    assert rule is not None and rule.keeps(2, 0, 99) is False and rule.keeps(2, 0, 100) and rule.keeps(2, 1, 50)
    _, rule = start_and_skip(journal(), [right])
    assert rule is not None and rule.keeps(9, 1, 89) is False and rule.keeps(9, 1, 90) and rule.keeps(9, 0, 80)
    # Once the merged shard passed every inherited offset, its children skip nothing.
    passed = parent("t-0-16-m", 0, 16, {"p0.jsonl": 150, "p1.jsonl": 150}, merged_rule)
    assert start_and_skip(journal(), [passed])[1] is None


def test_counted_up_to_splits_a_parent_range_along_its_inherited_rule():
    inherited = SkipRule.of([(4, {0: 70}), (12, {0: 10, 1: 90})], {0: 10, 1: 10})
    assert counted_up_to(2, 10, {0: 50, 1: 50}, inherited) == [(4, {0: 70, 1: 50}), (10, {0: 50, 1: 90})]
    assert counted_up_to(2, 16, {0: 50, 1: 50}, inherited) == [
        (4, {0: 70, 1: 50}),
        (12, {0: 50, 1: 90}),
        (16, {0: 50, 1: 50}),
    ]
    assert counted_up_to(12, 16, {0: 50}, inherited) == [(16, {0: 50})]
    assert counted_up_to(0, 16, {0: 5}, None) == [(16, {0: 5})]


@pytest.mark.parametrize("seed", range(20))
def test_merge_of_merges_counts_every_row_once(seed):
    """Brute force: random positions of two generations of shards; every (key group, partition, offset) is
    counted exactly once by the last shard's state plus what it processes from its start on."""
    import random

    rng = random.Random(seed)
    offsets = range(0, 12)

    def counted(f: dict[int, int]) -> set[tuple[int, int]]:
        return {(p, o) for p in (0, 1) for o in offsets if o < f[p]}

    # Generation 1: [0, 8) and [8, 16) merge at positions F_L, F_R; the merged shard M runs on to G with its rule.
    fl = {p: rng.randrange(12) for p in (0, 1)}
    fr = {p: rng.randrange(12) for p in (0, 1)}
    left = parent("l", 0, 8, {f"p{p}.jsonl": o for p, o in fl.items()})
    right = parent("r", 8, 16, {f"p{p}.jsonl": o for p, o in fr.items()})
    start, rule = start_and_skip(journal(), [left, right])
    for kg, p, o in itertools.product(range(16), (0, 1), offsets):
        owner = fl if kg < 8 else fr
        in_state = o < owner[p]
        processed = o >= start[f"p{p}.jsonl"] and (rule is None or rule.keeps(kg, p, o))
        assert in_state + processed == 1, (kg, p, o, fl, fr, rule)
    # Generation 2: M drains at G (anywhere at or after its start) and a child [4, 12) restores from it.
    g = {p: rng.randrange(start[f"p{p}.jsonl"], 13) for p in (0, 1)}
    merged = parent("m", 4, 12, {f"p{p}.jsonl": o for p, o in g.items()}, rule.to_json() if rule else None)
    child_start, child_rule = start_and_skip(journal(), [merged])
    for kg, p, o in itertools.product(range(4, 12), (0, 1), offsets):
        owner = fl if kg < 8 else fr
        m_processed = start[f"p{p}.jsonl"] <= o < g[p] and (rule is None or rule.keeps(kg, p, o))
        in_state = o < owner[p] or m_processed
        processed = o >= child_start[f"p{p}.jsonl"] and (child_rule is None or child_rule.keeps(kg, p, o))
        assert in_state + processed == 1, (kg, p, o, fl, fr, g, child_rule)


def test_merge_ranges_must_be_adjacent_and_make_up_the_child():
    a, b = parent("t-0-8", 0, 8, {}), parent("t-8-16", 8, 16, {})
    check_merge_ranges([a, b], 0, 16)
    with pytest.raises(RestoreError, match=r"t-0-8 \[0, 8\), t-9-16 \[9, 16\).*key group 8 is missing") as gap:
        check_merge_ranges([a, parent("t-9-16", 9, 16, {})], 0, 16)
    assert gap.value.reason == "MergeRangesMismatch"
    with pytest.raises(RestoreError, match="key group 6 is in two parents"):
        check_merge_ranges([a, parent("t-6-16", 6, 16, {})], 0, 16)
    with pytest.raises(RestoreError, match="end at key group 16, not at keyGroups.end 12"):
        check_merge_ranges([a, b], 0, 12)


def test_nested_parents_name_only_their_partitions_and_skip_nothing():
    """With partitionedByKey each parent reads its own partitions: the child starts each from its reader."""
    child = journal(4, read=[0, 1, 2, 3], nested=True)
    left = parent("t-0-8", 0, 8, {"p0.jsonl": 10, "p1.jsonl": 20})
    right = parent("t-8-16", 8, 16, {"p2.jsonl": 30, "p3.jsonl": 40})
    start, rule = start_and_skip(child, [left, right])
    assert start == {"p0.jsonl": 10, "p1.jsonl": 20, "p2.jsonl": 30, "p3.jsonl": 40} and rule is None


def test_merge_config_names_two_distinct_parents_and_no_restore_from():
    from spark_runtime.config import ConfigError, parse_config

    base = CONFIG
    two = [{"parent": "t-0-8", "manifest": "/a"}, {"parent": "t-8-16", "manifest": "/b"}]
    cfg = parse_config({**base, "mergeFrom": two})
    assert [p.parent for p in cfg.parents] == ["t-0-8", "t-8-16"]
    with pytest.raises(ConfigError, match="mergeFrom"):
        parse_config({**base, "mergeFrom": two[:1]})
    with pytest.raises(ConfigError, match="names the same parent twice"):
        parse_config({**base, "mergeFrom": [two[0], two[0]]})
    with pytest.raises(ConfigError, match="restoreFrom and mergeFrom exclude each other"):
        parse_config({**base, "mergeFrom": two, "restoreFrom": two[0]})


def test_the_rehearsal_can_be_turned_off_and_a_bad_value_names_the_key():
    from spark_runtime.config import ConfigError, parse_config

    base = CONFIG
    assert parse_config(base).rehearse is True
    off = parse_config({**base, "spark": {"conf": {"spark.taskshard.rehearse": False}}})
    assert off.rehearse is False
    with pytest.raises(ConfigError, match=r"spark.conf.spark.taskshard.rehearse: 'maybe' is invalid: expected true or"):
        parse_config({**base, "spark": {"conf": {"spark.taskshard.rehearse": "maybe"}}})


def test_a_kafka_partition_only_one_parent_read_is_read_from_its_start_for_the_other():
    """Subscribe mode: partition 1 appeared during the merge gap and only the left parent read it (up to 7). The
    right parent counted nothing there, so the merged child starts partition 1 at 0 and skips only the left
    parent's rows below 7 (it once started at 7: the right parent's key groups' rows 0..6 were read by nobody).
    With key groups nested in partitions (assign) each parent names exactly its own partitions: unchanged."""
    from spark_runtime.sources.kafka import KafkaReader

    subscribed = KafkaReader("kafka:9092", "t")
    slices = [parent("L", 0, 8, {"t": {"0": 10, "1": 7}}), parent("R", 8, 16, {"t": {"0": 12}})]
    start, rule = start_and_skip(subscribed, slices)
    assert start == {"t": {"0": 10, "1": 0}}
    assert rule is not None
    for offset in range(12):
        assert rule.keeps(3, 1, offset) is (offset >= 7), "the left parent counted partition 1 below 7"
        assert rule.keeps(12, 1, offset), "the right parent counted nothing in partition 1"
    for offset in range(10, 20):  # partition 0 starts at 10, the lower final position
        assert rule.keeps(12, 0, offset) is (offset >= 12) and rule.keeps(3, 0, offset)
    assert subscribed.counted_nothing_filled([{"t": {"0": 4}}], partitions=3) == [{"t": {"0": 4, "1": 0, "2": 0}}], (
        "a split child of a parent that never read partitions 1 and 2 starts them at 0"
    )
    nested = KafkaReader("kafka:9092", "t", declared_partitions=2, read_partitions=[0, 1])
    own = [{"t": {"0": 10}}, {"t": {"1": 12}}]
    assert nested.counted_nothing_filled(own) == own
