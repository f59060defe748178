"""A catch-up child's held records in the engine (spark_runtime.engine.step.split_held): they reach the processor
before the others, in source order, and only the others' outputs are emitted."""

from __future__ import annotations

import pandas as pd
import pytest

from spark_runtime.engine.step import split_held
from spark_runtime.protocol import HELD_COLUMN

pytestmark = pytest.mark.unit


def test_held_records_are_split_off_in_order_and_a_frame_without_the_column_holds_nothing():
    events = pd.DataFrame(
        {
            "key": ["a", "b", "a", "c", "a"],
            "partition": [0, 1, 0, 1, 0],
            "offset": [0, 0, 10, 10, 20],
            HELD_COLUMN: [True, True, True, False, None],
        }
    )
    held, rest = split_held(events)
    assert list(zip(held["key"], held["offset"], strict=True)) == [("a", 0), ("b", 0), ("a", 10)]
    assert list(zip(rest["key"], rest["offset"], strict=True)) == [("c", 10), ("a", 20)], "null: not held"
    none_held, everything = split_held(events.drop(columns=[HELD_COLUMN]))
    assert none_held.empty and everything.equals(events.drop(columns=[HELD_COLUMN]))


class _GroupState:
    """The three calls the blob layout's group function makes on Spark's GroupState."""

    def __init__(self) -> None:
        self.value: tuple | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple:
        assert self.value is not None
        return self.value

    def update(self, value: tuple) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = None


def test_the_blob_layout_updates_state_with_held_records_and_emits_only_the_others():
    from spark_runtime.engine.blob import decode_state_table, make_group_function
    from spark_runtime.engine.schema import StateSchema

    fn = make_group_function(
        "spark_runtime.engine.api:SumProcessor", '{"field": "amount"}', StateSchema.parse("sum double"),
        ["key", "amount", "partition", "offset"], ["result"],
    )  # fmt: skip
    events = pd.DataFrame(
        {
            "key": ["a", "b", "a"],
            "amount": [1.0, 2.0, 3.0],
            "partition": [0, 0, 0],
            "offset": [0, 10, 20],
            "seed": [None, None, None],
            HELD_COLUMN: [True, True, False],  # the parent emitted a's and b's first results
        }
    )
    state = _GroupState()
    out = pd.concat(list(fn((5,), iter([events]), state)))
    assert out[["key", "result"]].values.tolist() == [["a", 4.0]], "b's only record was held: no output for it"
    stored = decode_state_table(state.get[0]).to_pydict()
    assert dict(zip(stored["key"], stored["sum"], strict=True)) == {"a": 4.0, "b": 2.0}, "held records count in state"
