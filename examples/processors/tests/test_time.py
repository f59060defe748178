"""The event-time session processor and the processing-time silence alert, tested with ProcessorHarness."""

from __future__ import annotations

import random

import pytest
from taskshard_examples.sessions import SessionWindow, reference_sessions
from taskshard_examples.silence import SilenceAlert

from spark_runtime.engine.testing import ProcessorHarness

pytestmark = pytest.mark.unit

GAP = 10_000


def sessions_of(out):
    return {(r["key"], r["start"], r["end"], r["count"]) for r in out.to_dict("records")}


def test_a_session_closes_when_the_watermark_passes_its_gap():
    h = ProcessorHarness(SessionWindow({"gapSeconds": 10}), event_time="ts", max_out_of_orderness_ms=2_000)
    assert h.run([{"key": "u", "ts": 1_000}, {"key": "u", "ts": 4_000}]).empty
    assert h.run([{"key": "v", "ts": 13_000}]).empty  # watermark 2 s: nothing due
    out = h.run([{"key": "v", "ts": 17_000}])  # watermark 11 s: u's session (ends at 14 s) stays open
    assert out.empty and h.state()["u"]["timer"] == 14_000
    # Watermark 15 s: u's timer fires; v's event 13 s after its last one closes v's session and opens another.
    out = h.run([{"key": "v", "ts": 30_000}])
    assert sessions_of(out) == {("u", 1_000, 14_000, 2), ("v", 13_000, 27_000, 2)}
    assert "u" not in h.state()
    assert h.run([]).empty  # watermark 28 s: v's new session ends at 40 s
    assert h.state()["v"] == {"start": 30_000, "last": 30_000, "count": 1, "timer": 40_000}
    assert h.run([{"key": "x", "ts": 42_000}]).empty  # runs at watermark 28 s; the next batch at 40 s
    assert sessions_of(h.run([])) == {("v", 30_000, 40_000, 1)}
    assert h.run([]).empty


def test_late_records_never_reach_state_and_are_kept_once():
    h = ProcessorHarness(SessionWindow({"gapSeconds": 10}), event_time="ts", max_out_of_orderness_ms=1_000)
    h.run([{"key": "u", "ts": 50_000}])
    h.run([{"key": "u", "ts": 48_999}, {"key": "w", "ts": 49_000}])  # watermark 49 s: 48.999 s is late
    assert [r["ts"] for r in h.late] == [48_999]
    assert h.state()["u"]["count"] == 1 and h.state()["w"]["count"] == 1


def test_sessions_over_random_batches_equal_a_plain_sessionization():
    rng = random.Random(7)
    events, t = [], 0
    for _ in range(1_500):
        t += rng.randrange(0, 400)
        events.append((f"k{rng.randrange(40)}", t + rng.randrange(0, 900)))  # out of order by < 1 s
    h = ProcessorHarness(SessionWindow({"gapSeconds": 10}), event_time="ts", max_out_of_orderness_ms=1_000)
    out = []
    i = 0
    while i < len(events):
        n = rng.randrange(1, 300)
        out.append(h.run([{"key": k, "ts": ts} for k, ts in events[i : i + n]]))
        i += n
    out.append(h.run([{"key": "end", "ts": 10**9}]))
    out.append(h.run([]))
    assert not h.late
    got = set().union(*(sessions_of(o) for o in out)) - {("end", 10**9, 10**9 + GAP, 1)}
    assert got == reference_sessions(events, GAP)
    assert sum(len(o) for o in out) == len(got)  # each session emitted once


def test_a_silent_key_alerts_once_without_new_events():
    h = ProcessorHarness(SilenceAlert({"silenceSeconds": 60}), now_ms=1_000)
    h.run([{"key": "s1"}, {"key": "s2"}])
    h.run([{"key": "s2"}], now_ms=40_000)
    assert h.run([], now_ms=60_999).empty
    out = h.run([], now_ms=61_000)
    assert out.to_dict("records") == [{"key": "s1", "key_group": out["key_group"][0], "silent_since": 1_000}]
    assert h.run([], now_ms=99_000).empty and "s1" not in h.state()
    assert h.run([], now_ms=100_000)["key"].tolist() == ["s2"]
