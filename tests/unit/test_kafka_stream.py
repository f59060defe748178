"""Our Kafka data source's planning without a broker (spark_runtime.sources.kafka_stream): a catching-up shard's
ranges are cut at its parents' final offsets per partition and carry their held flags; records become Arrow
batches with Spark's Kafka columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_runtime.protocol import HELD_COLUMN, HELD_RIGHT_COLUMN, CatchUpPhase, CatchUpState, MergeCatchUpState
from spark_runtime.records import MAX_RECORD_BYTES
from spark_runtime.sources.kafka_stream import (
    CONSUME_BATCH,
    KafkaRange,
    KafkaStreamReader,
    _record_batch,
    _schema,
    consume_count,
    topic_state,
)

pytestmark = pytest.mark.unit

TOPIC = "orders"


def reader(tmp_path: Path, state: CatchUpState | MergeCatchUpState | None, merged: bool = False) -> KafkaStreamReader:
    options = {
        "topic": TOPIC,
        "kafkaclientsecret": json.dumps({"bootstrap.servers": "127.0.0.1:1"}),
        "drainmarker": str(tmp_path / "drain"),
    }
    if state is not None:
        (tmp_path / "catch-up.json").write_text(json.dumps(state.to_json()))
        options["catchupstate"] = str(tmp_path / "catch-up.json")
    if merged:
        options["heldboundary"] = "8"
    return KafkaStreamReader(options)


def ranges(r: KafkaStreamReader, start: dict[str, int], end: dict[str, int]) -> list[tuple[int, int, int, bool, bool]]:
    planned = r.partitions({TOPIC: start}, {TOPIC: end})
    return [(x.partition, x.start, x.end, x.held, x.held_right) for x in planned]  # type: ignore[attr-defined]


def test_a_split_childs_ranges_are_cut_at_the_parents_final_offsets(tmp_path):
    final = {TOPIC: {"0": 50, "1": 10}}
    state = CatchUpState("p", "m", CatchUpPhase.FINAL, final=final, ready=True)
    got = ranges(reader(tmp_path, state), {"0": 40, "1": 10, "2": 0}, {"0": 60, "1": 20, "2": 5})
    assert got == [
        (0, 40, 50, True, False),  # before the parent's final offset: held (the parent emitted it)
        (0, 50, 60, False, False),
        (1, 10, 20, False, False),  # starts at the final offset: emitted
        (2, 0, 5, False, False),  # a partition the parent never read: nobody emitted it
    ]
    following = CatchUpState("p", "m", CatchUpPhase.SHADOW, limit=final)
    assert ranges(reader(tmp_path, following), {"0": 0}, {"0": 50}) == [(0, 0, 50, True, False)], "unknown: held"
    assert ranges(reader(tmp_path, None), {"0": 0}, {"0": 50}) == [(0, 0, 50, False, False)]


def test_a_merged_shards_ranges_are_held_per_parent(tmp_path):
    state = MergeCatchUpState(
        ("l", "r"),
        ("ml", "mr"),
        8,
        CatchUpPhase.FINAL,
        finals=({TOPIC: {"0": 30}}, {TOPIC: {"0": 20}}),
        ready=True,
    )
    got = ranges(reader(tmp_path, state, merged=True), {"0": 10}, {"0": 40})
    assert got == [(0, 10, 20, True, True), (0, 20, 30, True, False), (0, 30, 40, False, False)]
    flat = topic_state(state, TOPIC)
    assert isinstance(flat, MergeCatchUpState) and flat.finals == ({"0": 30}, {"0": 20})


def test_records_become_sparks_kafka_columns_with_the_ranges_held_flags():
    class Message:
        def __init__(self, offset: int) -> None:
            self._offset = offset

        def key(self) -> bytes:
            return b"k%d" % self._offset

        def value(self) -> bytes:
            return b'{"n": %d}' % self._offset

        def timestamp(self) -> tuple[int, int]:
            return (1, 1_700_000_000_000 + self._offset)

    part = KafkaRange(3, 5, 7, held=True, held_right=False)
    batch = _record_batch([Message(5), Message(6)], [5, 6], part, TOPIC, _schema([HELD_COLUMN, HELD_RIGHT_COLUMN]))
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [5, 6] and {r["partition"] for r in rows} == {3}
    assert rows[0]["key"] == b"k5" and rows[0]["topic"] == TOPIC and rows[0]["timestampType"] == 0
    assert int(rows[1]["timestamp"].timestamp() * 1000) == 1_700_000_000_006
    assert [(r[HELD_COLUMN], r[HELD_RIGHT_COLUMN]) for r in rows] == [(True, False), (True, False)]


def test_a_byte_budget_bounds_each_consume_by_the_largest_record_seen():
    """Without a budget a consume asks for the range's rest (at most CONSUME_BATCH); with one, for what fits it at
    the largest record seen so far, or at the largest valid record before any, and never for none."""
    assert consume_count(50_000, None, None) == CONSUME_BATCH
    assert consume_count(7, None, 10) == 7
    assert consume_count(50_000, 8 << 20, None) == (8 << 20) // MAX_RECORD_BYTES == 8
    assert consume_count(50_000, 8 << 20, 100) == CONSUME_BATCH
    assert consume_count(50_000, 512, 40) == 12
    assert consume_count(50_000, 512, 4096) == 1
    assert consume_count(3, 512, 1) == 3
