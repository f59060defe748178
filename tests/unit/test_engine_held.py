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
