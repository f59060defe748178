"""Builtin windows without Spark: window and session assignment, the seed rows that rebuild a session, the late
rule, the plan a windowed builtin gets, and the config's checks."""

from __future__ import annotations

import random

import pytest

from spark_runtime.config import ConfigError, WindowSpec
from spark_runtime.pipeline import make_plan
from spark_runtime.windows import last_window_end_ms, output_mode, session_seed_points
from tests.spark.window_reference import reference_windows, window_starts

from .test_time import shard_config

pytestmark = pytest.mark.unit

EVENT_TIME = {"field": "ts", "maxOutOfOrdernessSeconds": 10}


def spec(**fields) -> WindowSpec:
    return WindowSpec.model_validate(fields)


@pytest.mark.parametrize(
    "window",
    [
        {"type": "tumbling", "sizeSeconds": 60},
        {"type": "sliding", "sizeSeconds": 60, "slideSeconds": 20},
        {"type": "sliding", "sizeSeconds": 50, "slideSeconds": 20},
        {"type": "session", "gapSeconds": 30},
    ],
)
def test_a_record_is_late_exactly_when_its_last_window_has_ended(window):
    w = spec(**window)
    rng = random.Random(1)
    for t in [0, 1, 19_999, 20_000, 59_999, 60_000] + [rng.randrange(0, 10**9) for _ in range(500)]:
        end = last_window_end_ms(w, t)
        if w.type == "session":
            assert end == t + 30_000
            continue
        starts = window_starts(w.type, t, w.size_ms, w.slide_ms)
        assert starts and all(s <= t < s + w.size_ms for s in starts)
        assert end == max(starts) + w.size_ms  # the last window holding t


def test_session_seed_points_rebuild_the_same_session():
    w = spec(type="session", gapSeconds=3)
    for start, end in [(1_000, 4_000), (1_000, 4_001), (1_000, 30_500), (0, 3_000_000)]:
        points = session_seed_points(w, start, end)
        assert points[0] == start and points[-1] == end - w.gap_ms
        assert all(b - a < w.gap_ms for a, b in zip(points, points[1:], strict=False))
        rebuilt = reference_windows("session", "count", [("k", p, 1) for p in points], gap_ms=w.gap_ms)
        assert list(rebuilt) == [("k", start, end)]


def test_the_reference_merges_a_record_at_a_session_end_into_it():
    got = reference_windows("session", "sum", [("k", 0, 1), ("k", 5, 2), ("k", 10, 4), ("k", 21, 8)], gap_ms=5)
    assert got == {("k", 0, 15): 7, ("k", 21, 26): 8}


def test_a_windowed_builtin_plans_its_state_format_columns_and_output_mode():
    cfg = shard_config(
        processor={
            "builtin": "max",
            "field": "amount",
            "window": {"type": "sliding", "sizeSeconds": 60, "slideSeconds": 15},
        },
        eventTime=EVENT_TIME,
    )
    plan = make_plan(cfg)
    assert plan.state_format == "builtin-max-sliding-60000ms-15000ms/v1"
    assert plan.state_schema == "key string, window_start bigint, window_end bigint, value double"
    assert [n for n, _ in plan.result_columns] == ["window_start", "window_end", "result"]
    assert {f.name: f.type for f in plan.record_spec.fields} == {"amount": "double", "ts": "long"}
    assert plan.uses_time and output_mode(plan.window) == "append"
    updates = {"type": "session", "gapSeconds": 30, "emit": "updates"}
    plan = make_plan(shard_config(processor={"builtin": "count", "window": updates}, eventTime=EVENT_TIME))
    assert (plan.state_format, plan.result_type, output_mode(plan.window)) == (
        "builtin-count-session-30000ms/v1",
        "bigint",
        "update",
    )
    assert (
        make_plan(shard_config(processor={"builtin": "count"})).state_format == "builtin-count/v1"
    )  # unchanged without a window
    assert output_mode(None) == "update"


def test_windows_and_event_time_are_checked_together():
    window = {"type": "tumbling", "sizeSeconds": 60}
    with pytest.raises(ConfigError, match="processor.window needs eventTime"):
        shard_config(processor={"builtin": "count", "window": window})
    with pytest.raises(ConfigError, match="allowedLatenessSeconds must be 0 with processor.window"):
        shard_config(
            processor={"builtin": "count", "window": window}, eventTime={**EVENT_TIME, "allowedLatenessSeconds": 1}
        )
    with pytest.raises(ConfigError, match="or a builtin with processor.window"):
        shard_config(processor={"builtin": "count"}, eventTime=EVENT_TIME)
    with pytest.raises(ConfigError, match="slideSeconds"):
        shard_config(
            processor={"builtin": "count", "window": {"type": "sliding", "sizeSeconds": 6}}, eventTime=EVENT_TIME
        )
