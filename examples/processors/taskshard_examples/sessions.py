"""Sessions in event time: per key, events closer than a gap form one session; a session closes (and is emitted)
once the watermark passes its last event plus the gap. An event-time timer per key does the closing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from spark_runtime.engine import Processor


class SessionWindow(Processor):
    """Per key (a user): the open session ``start``, ``last`` (event times, epoch ms) and ``count``; its timer is
    ``last + gap``. Needs the Task's ``spec.eventTime``.

    Parameters: ``gapSeconds`` (default 1800).
    Results, one row per closed session: ``start bigint, end bigint, count bigint`` with ``end = last + gap`` (as
    Spark's ``session_window`` reports it).

    Within a batch, an event inside or next to the open session (less than the gap away) extends it; events a gap
    or more apart start a new session, and every session but the newest of a key is closed at once (no later
    event can bridge it without being late, unless ``allowedLatenessSeconds`` is above 0: then a late-but-allowed
    event that falls in a closed session's gap opens a session of its own).
    """

    timers = "event"
    state_schema = "start bigint, last bigint, count bigint"
    result_schema = "start bigint, end bigint, count bigint"

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(parameters)
        self.gap_ms = int(float(self.parameters.get("gapSeconds", 1800)) * 1000)
        if self.gap_ms <= 0:
            raise ValueError(f"gapSeconds: {self.parameters.get('gapSeconds')!r} must be positive")

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        # Every event and every open session as an interval [lo, hi] with a weight; merge intervals per key that
        # are less than the gap apart (the classic interval merge, vectorized with a running maximum per key).
        t = events["event_time"].to_numpy(dtype="int64")
        parts = pd.DataFrame(
            {
                "key": np.concatenate([events["key"].to_numpy(dtype=object), state["key"].to_numpy(dtype=object)]),
                "lo": np.concatenate([t, state["start"].to_numpy(dtype="int64")]),
                "hi": np.concatenate([t, state["last"].to_numpy(dtype="int64")]),
                "n": np.concatenate([np.ones(len(t), "int64"), state["count"].to_numpy(dtype="int64")]),
            }
        ).sort_values(["key", "lo"], kind="stable")
        reach = parts.groupby("key", sort=False)["hi"].cummax()
        before = reach.groupby(parts["key"], sort=False).shift(1)
        parts["session"] = (before.isna() | (parts["lo"] - before >= self.gap_ms)).cumsum()
        sessions = parts.groupby("session", sort=True).agg(
            key=("key", "first"), start=("lo", "min"), last=("hi", "max"), count=("n", "sum")
        )
        newest = sessions.groupby("key", sort=False)["last"].transform("max") == sessions["last"]
        newest &= ~sessions.duplicated(["key", "last"], keep="last")
        open_ = sessions[newest]
        closed = sessions[~newest]
        new_state = pd.DataFrame(
            {
                "key": open_["key"].to_numpy(),
                "start": open_["start"].to_numpy(dtype="int64"),
                "last": open_["last"].to_numpy(dtype="int64"),
                "count": open_["count"].to_numpy(dtype="int64"),
                "timer": open_["last"].to_numpy(dtype="int64") + self.gap_ms,
            }
        )
        return new_state, self._emit(closed)

    def on_timer(self, timers: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        # The watermark passed last + gap: the session is complete. Emit it and forget the key.
        return None, self._emit(state)

    def _emit(self, sessions: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "key": sessions["key"].to_numpy(),
                "start": sessions["start"].to_numpy(dtype="int64"),
                "end": sessions["last"].to_numpy(dtype="int64") + self.gap_ms,
                "count": sessions["count"].to_numpy(dtype="int64"),
            }
        )


def reference_sessions(events: list[tuple[str, int]], gap_ms: int) -> set[tuple[str, int, int, int]]:
    """Plain-Python sessionization of ``(key, event_time)`` pairs: ``{(key, start, end, count)}`` (for tests)."""
    by_key: dict[str, list[int]] = {}
    for key, t in events:
        by_key.setdefault(key, []).append(t)
    out = set()
    for key, times in by_key.items():
        times.sort()
        start = last = times[0]
        count = 0
        for t in times:
            if t - last >= gap_ms:
                out.add((key, start, last + gap_ms, count))
                start, count = t, 0
            last = max(last, t)
            count += 1
        out.add((key, start, last + gap_ms, count))
    return out
