"""Key groups nested in partitions (``partitionedByKey``): with the journal's own producer (one key, one
partition), 4 shards over 4 partitions each read only their partition file (read amplification 1.0, measured
from the positions they commit), results equal the reference, every output record's key group is the nested
one, dead letters are counted once; a split inside one partition's block makes both children read that one
partition, exactly; a partition file beyond the declared count stops the shard (``PartitionCountChanged``)
before the batch that would process it is written.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from spark_runtime.drain import wait_until
from spark_runtime.produce import append_lines, generate_events, partition_for

from .conftest import Reference, wait_caught_up, wait_progress
from .test_split import PROCESSORS

pytestmark = pytest.mark.spark

MAX_KEY_GROUPS = 16
PARTITIONS = 4
INVALID = ['{"nokey": 1}', "not json", '{"key": 1.5}', '{"key": ["a"]}']


def _invalid_lines(env) -> int:
    """Invalid lines in every partition: each is a dead letter of exactly one shard (its key's group, or the
    null key's group in the partition's block)."""
    for p in range(PARTITIONS):
        append_lines(env.journal, p, INVALID)
    return PARTITIONS * len(INVALID)


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_four_shards_over_four_partitions_read_only_their_own_and_split_inside_a_block(kind, make_task, shard_spark):
    from spark_runtime.keygroups import nested_key_group
    from spark_runtime.shard import ShardRunner

    processor, template, sink_format = PROCESSORS[kind]
    env = make_task(
        processor=processor,
        max_key_groups=MAX_KEY_GROUPS,
        partitions=PARTITIONS,
        partitioned_by_key=True,
        sink_format=sink_format,
    )
    ref = Reference(template.kind, template.field)

    def produce(chunk: list) -> None:
        env.produce(chunk)
        ref.add_all(chunk)

    events = list(generate_events(3000, 300, seed=17))
    produce(events[:2000])
    invalid = _invalid_lines(env)
    shards = [ShardRunner(env.config(a, a + 4), shard_spark) for a in range(0, MAX_KEY_GROUPS, 4)]
    for s in shards:
        s.start()
    wait_caught_up(env, shards)

    # Each shard read exactly its own partition file: its committed positions name that file alone, at its end.
    ends = env.journal_ends()
    bytes_read = 0
    for index, s in enumerate(shards):
        positions = env.progress(s.config.shard)["positions"]
        assert positions == {f"p{index}.jsonl": ends[f"p{index}.jsonl"]}
        bytes_read += sum(positions.values())
    assert bytes_read == sum(ends.values()), "read amplification 1.0: every byte read once"
    assert env.results() == ref.results

    # Split [0, 4) inside partition 0's block: both children read partition 0 only, from the parent's position.
    parent_summary = shards[0].drain()
    restore = {"parent": shards[0].config.shard, "manifest": parent_summary["manifest"]}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in ((0, 2), (2, 4))]
    for child in children:
        child.start()
        assert child.source.positions_names() == ["p0.jsonl"]
        assert child.start_positions == {"p0.jsonl": parent_summary["positions"]["p0.jsonl"]}
    produce(events[2000:])
    active = [*children, *shards[1:]]
    wait_caught_up(env, active)
    assert env.results() == ref.results
    summaries = [parent_summary] + [s.drain() for s in active]
    assert sum(s["deadLetters"] for s in summaries) == invalid, "each dead letter counted by one shard"

    # Every output record carries the nested key group of its key's partition.
    for rec in _sink_records(env.sink, sink_format):
        p = partition_for(rec["key"], PARTITIONS)
        assert rec["key_group"] == nested_key_group(rec["key"], p, MAX_KEY_GROUPS, PARTITIONS)
        assert p * 4 <= rec["key_group"] < (p + 1) * 4
    assert sum(s["stateRows"] for s in summaries[1:]) == len(ref.results)


def _sink_records(sink, sink_format: str) -> list[dict]:
    import pyarrow.parquet as pq

    records: list[dict] = []
    for f in sink.glob(f"shard=*/batch-*.{sink_format}"):
        if sink_format == "jsonl":
            records += [json.loads(line) for line in f.read_text().splitlines()]
        else:
            records += pq.read_table(f).to_pylist()
    assert records
    return records


def test_a_partition_beyond_the_declared_count_stops_the_shard(make_task, shard_spark):
    from spark_runtime.problems import EnvironmentProblem
    from spark_runtime.shard import ShardRunner

    env = make_task(
        processor={"builtin": "count"},
        max_key_groups=MAX_KEY_GROUPS,
        partitions=PARTITIONS,
        partitioned_by_key=True,
    )
    env.produce(list(generate_events(400, 40, seed=3)))
    shard = ShardRunner(env.config(0, 8), shard_spark)
    shard.start()
    wait_caught_up(env, [shard])
    committed = env.progress(shard.config.shard)["batchId"]
    # A producer now writes with 5 partitions: keys move between partitions, so the mapping no longer holds.
    append_lines(env.journal, PARTITIONS, ['{"key": "k1"}'])
    env.produce(list(generate_events(200, 40, seed=4, start=400)))
    with pytest.raises(EnvironmentProblem) as stopped:
        wait_until(lambda: shard.poll() or False, timeout=60)
    problem = stopped.value
    assert problem.reason == "PartitionCountChanged" and problem.field == "source.journal.partitions"
    assert "p4.jsonl" in str(problem) and "nested in 4" in str(problem)
    assert not shard.query.isActive
    from spark_runtime.checkpoint import last_committed_batch

    assert last_committed_batch(shard.paths.checkpoint) == committed, "nothing processed under the new mapping"
    # A restart refuses at its preflight, before any batch.
    again = ShardRunner(env.config(0, 8), shard_spark)
    with pytest.raises(EnvironmentProblem, match="PartitionCountChanged|partition files up to p4"):
        again.start()


def test_a_catch_up_merge_of_two_nested_shards_reads_both_blocks_exactly(make_task, shard_spark):
    """``partitionedByKey``: the left parent reads partitions 0-1, the right one 2-3; the merged shard reads all
    four. It restores both pre-copies and follows both (its cap names each file at its own parent's position),
    both parents drain for it without exporting, and it takes over from each parent's final positions: results
    equal the reference with events arriving throughout, and every dead letter is counted once."""
    from spark_runtime.shard import ShardRunner

    from .test_merge import merge_from
    from .test_standby import InThread, release, shard_dir

    env = make_task(
        processor={"builtin": "count"}, max_key_groups=MAX_KEY_GROUPS, partitions=PARTITIONS, partitioned_by_key=True
    )
    ref = Reference("count")

    def produce(chunk: list) -> None:
        env.produce(chunk)
        ref.add_all(chunk)

    events = list(generate_events(2400, 200, seed=19))
    produce(events[:800])
    invalid = _invalid_lines(env)
    parents = [ShardRunner(env.config(a, a + 8), shard_spark) for a in (0, 8)]
    merged = ShardRunner(env.config(0, 16, shard="nested-m1", mergeFrom=merge_from(env, (0, 8), (8, 16))), shard_spark)
    threads = [InThread(p.run, f"run {p.config.shard}") for p in parents] + [InThread(merged.run, "run merged")]

    def caught_up(shard: str, done: Any = lambda: False) -> None:
        """``shard`` committed the journal's ends of the files it reads (or ``done()``)."""
        ends = env.journal_ends()
        wait_progress(env, shard, lambda p: done() or all(p["positions"][k] == ends[k] for k in p["positions"]), 240)

    try:
        for t in threads[:2]:
            t.start()
        for p in parents:
            caught_up(p.config.shard)
        threads[2].start()
        sent = 800
        while any(t.is_alive() for t in threads[:2]) and sent < 2000:  # input arrives during the hand-over
            produce(events[sent : sent + 50])
            sent += 50
            ends = env.journal_ends()
            for p in parents:
                wait_progress(
                    env,
                    p.config.shard,
                    lambda pr, p=p, e=ends: (
                        p.already_drained or all(pr["positions"][k] == e[k] for k in pr["positions"])
                    ),
                    timeout=120,
                )
        summaries = [t.finish(240) for t in threads[:2]]
        invalid += _invalid_lines(env)
        produce(events[sent:])
        caught_up("nested-m1")
        assert env.results() == ref.results, "no event lost, none counted twice"
        assert [s["handover"] for s in summaries] == ["catch-up", "catch-up"]
        assert [sorted(s["positions"]) for s in summaries] == [["p0.jsonl", "p1.jsonl"], ["p2.jsonl", "p3.jsonl"]]
        state = json.loads((shard_dir(env, "nested-m1") / "catch-up.json").read_text())
        assert state["phase"] == "live" and state["finals"] == [s["positions"] for s in summaries]
    finally:
        release([*parents, merged], threads)
    assert sum(s["deadLetters"] for s in summaries) + merged.drain()["deadLetters"] == invalid
    assert env.results() == ref.results
