"""One call of the user's processor in a micro-batch, the same in a shard and in the test harness.

:func:`process_group`: look up the state of the keys in ``events``, call the user's ``process`` under the
contract (:func:`~spark_runtime.engine.api.call_processor`), and store the touched keys' new rows (with their key
group, and their expiry under a TTL) and tombstones for the keys whose state was deleted, as one run. Returns the
outputs with each key's key group. With timers, :func:`fire_due` calls ``on_timer`` for the due keys before and
after ``process`` (:mod:`~spark_runtime.engine.timers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from spark_runtime.engine.api import Processor, call_on_timer, call_processor
from spark_runtime.engine.runs import GROUP, KEY
from spark_runtime.engine.state_layout import KeyGroupRuns
from spark_runtime.engine.timers import TIMER, TimerIndex, cleared_fired, split_due
from spark_runtime.protocol import HELD_COLUMN

__all__ = ["BatchTime", "fire_due", "process_group", "split_held", "state_rows_frame"]

KEY_GROUP = "key_group"
LATE = "_late"
"""The output column of a late record's dead letter (JSON; null on result rows)."""
EVENT_TIME = "event_time"
"""The events' event-time column (epoch milliseconds) when the Task has ``spec.eventTime``."""


def split_held(events: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``events`` as ``(held, emitting)``, each in the given order: a catch-up child's records before its parent's
    final positions (:data:`spark_runtime.protocol.HELD_COLUMN`; the parent emitted their results: they update
    state only) and the rest. Held records precede the others in every partition, so processing the held part
    first keeps source order per partition. Without the column nothing is held."""
    if HELD_COLUMN not in events.columns:
        return events.iloc[:0], events
    held = events[HELD_COLUMN].eq(True).to_numpy(dtype=bool)  # null (a seed row): not held
    if not held.any():
        return events.iloc[:0], events
    return events[held].reset_index(drop=True), events[~held].reset_index(drop=True)


def state_rows_frame(table: Any, names: list[str]) -> pd.DataFrame:
    """Arrow state rows as the ``state`` frame a processor receives (``key`` + ``names``)."""
    if table.num_rows == 0:
        return table.select([KEY] + names).to_pandas(use_threads=False)
    return pd.DataFrame({n: table.column(n).to_numpy(zero_copy_only=False) for n in [KEY] + names})


@dataclass(frozen=True)
class BatchTime:
    """The times of one batch, the same on a replay: its processing time (``now_ms``; required with a state TTL or
    processing-time timers) and its event-time watermark (``watermark_ms``; None without event time)."""

    now_ms: int | None = None
    watermark_ms: int | None = None

    def threshold(self, domain: str | None) -> int | None:
        """The time up to which timers of ``domain`` are due in this batch (None: no timers)."""
        if domain == "event":
            return self.watermark_ms
        if domain == "processing":
            return self.now_ms
        return None


def process_group(
    state: KeyGroupRuns,
    proc: Processor,
    events: pd.DataFrame,
    event_columns: list[str],
    result_names: list[str],
    *,
    now_ms: int | None = None,
    ttl_ms: int | None = None,
    timers: TimerIndex | None = None,
    watermark_ms: int | None = None,
) -> pd.DataFrame:
    """Run ``proc`` over ``events`` (in source order, with a ``key_group`` column; the processor sees
    ``event_columns``; may be empty) against ``state``; returns the outputs: ``key``, ``key_group`` and
    ``result_names``. ``now_ms``: the batch's processing time (required with ``ttl_ms``). With ``timers`` (the
    group's index; the processor declares timers), due timers fire before and after ``process``
    (:mod:`~spark_runtime.engine.timers`)."""
    clock = BatchTime(now_ms, watermark_ms)
    proc.now_ms, proc.watermark_ms = now_ms, watermark_ms
    threshold = clock.threshold(getattr(proc, "timers", None)) if timers is not None else None
    parts = []
    if timers is not None and threshold is not None:
        parts.append(fire_due(state, proc, timers, threshold, result_names, now_ms=now_ms, ttl_ms=ttl_ms))
    if len(events):
        parts.append(_process(state, proc, events, event_columns, result_names, now_ms, ttl_ms, timers))
    if timers is not None and threshold is not None and len(events):
        parts.append(fire_due(state, proc, timers, threshold, result_names, now_ms=now_ms, ttl_ms=ttl_ms))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({c: [] for c in [KEY, KEY_GROUP, *result_names]})
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def _process(
    state: KeyGroupRuns,
    proc: Processor,
    events: pd.DataFrame,
    event_columns: list[str],
    result_names: list[str],
    now_ms: int | None,
    ttl_ms: int | None,
    timers: TimerIndex | None,
) -> pd.DataFrame:
    schema = state.schema
    groups = events.drop_duplicates(KEY).set_index(KEY)[KEY_GROUP]
    found = state.read(groups.index.to_numpy(), now_ms=now_ms if ttl_ms is not None else None)
    current = state_rows_frame(found.rows, schema.names)
    new_state, outputs = call_processor(
        proc, events[event_columns], current, schema.names, result_names, pd.unique(groups.to_numpy())
    )
    _store(state, new_state, groups, found.held, now_ms=now_ms, ttl_ms=ttl_ms)
    if timers is not None:
        timers.index_changes(current, new_state)
    outputs.insert(1, KEY_GROUP, groups.reindex(outputs[KEY]).to_numpy(dtype="int32"))
    return outputs


def fire_due(
    state: KeyGroupRuns,
    proc: Processor,
    timers: TimerIndex,
    threshold: int,
    result_names: list[str],
    *,
    now_ms: int | None = None,
    ttl_ms: int | None = None,
) -> pd.DataFrame:
    """Fire the group's timers at or before ``threshold``: ``on_timer`` with the due keys and their state; their
    new state is stored (fired timers cleared unless set later) and the outputs returned (``key``, ``key_group``,
    ``result_names``)."""
    candidates = timers.take(threshold)
    empty = pd.DataFrame({c: [] for c in [KEY, KEY_GROUP, *result_names]})
    if not candidates:
        return empty
    schema = state.schema
    found = state.read(candidates, now_ms=now_ms if ttl_ms is not None else None)
    current = state_rows_frame(found.rows, schema.names)
    current[KEY_GROUP] = found.rows.column(GROUP).to_numpy(zero_copy_only=False) if found.rows.num_rows else []
    due, later = split_due(current, threshold)
    timers.add(later[KEY].to_numpy(), later[TIMER].to_numpy(), together=True)
    if not len(due):
        return empty
    groups = due.set_index(KEY)[KEY_GROUP]
    new_state, outputs = call_on_timer(
        proc, due[[KEY, TIMER]], due[[KEY, *schema.names]], schema.names, result_names, pd.unique(groups.to_numpy())
    )
    new_state = cleared_fired(new_state, threshold)
    _store(state, new_state, groups, [k for k in due[KEY] if k in found.held], now_ms=now_ms, ttl_ms=ttl_ms)
    timers.index_changes(due, new_state)
    outputs.insert(1, KEY_GROUP, groups.reindex(outputs[KEY]).to_numpy(dtype="int32"))
    return outputs


def _store(
    state: KeyGroupRuns,
    new_state: pd.DataFrame,
    groups: pd.Series,
    held: Any,
    *,
    now_ms: int | None,
    ttl_ms: int | None,
) -> None:
    """Write ``new_state`` (``key`` + state columns; each key's group from ``groups``) as one run, with tombstones
    for the ``held`` keys it no longer has (and an expiry under a TTL)."""
    import pyarrow as pa

    schema = state.schema
    new_state = new_state.copy()
    new_state.insert(1, GROUP, groups.reindex(new_state[KEY]).to_numpy(dtype="int32"))
    target = pa.schema([f for f in state.run_schema if f.name in [KEY, GROUP, *schema.names]])
    table = schema.conform(pa.Table.from_pandas(new_state, preserve_index=False), target)
    written = set(new_state[KEY])
    expires = None
    if ttl_ms is not None:
        if now_ms is None:
            raise ValueError("a state TTL needs the batch's processing time")
        expires = np.full(table.num_rows, now_ms + ttl_ms, dtype="int64")
    state.write(table, [k for k in held if k not in written], expires=expires, now_ms=now_ms)
