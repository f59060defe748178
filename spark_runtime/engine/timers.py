"""Per-key timers: one event-time or processing-time timer per key, kept in the key's state, and the index that
finds the due ones without reading the whole state.

The truth is the key's state column :data:`TIMER` (epoch milliseconds; 0: no timer). It lives in the same runs as
the rest of the key's state, so it is exported in the key-group snapshot, restored by split children and merged
shards, and committed or rolled back with the batch.

The index only says *where to look*: per group of keys (a bucket of key groups on Spark, a key group in the test
harness) a map ``due[at] -> keys`` and a set of registered times, on callbacks (:class:`TimerVars`; on Spark they
are a ``transformWithStateInPandas`` MapState and the operator's own timers, which Spark fires when the watermark
or the batch time passes them). A key is added under ``slot(timer)`` (the timer rounded down to
:data:`SLOT_MS`), so a batch that moves many timers registers a few times, not one per key: each registered time
costs a few calls into Spark's state store per batch, the index's whole cost. Entries are never removed when a
key's timer changes: :func:`~spark_runtime.engine.step.fire_due` checks every candidate against its state and
drops the stale ones, so the index may hold a key too often but never too rarely. The candidates of a due slot
whose timers lie after the threshold are registered again, all under the earliest of their times.

Firing order in a batch with threshold ``T`` (the watermark for event time, the batch's time for processing
time): timers ``<= T`` fire first, then ``process`` sees the batch's events, then timers that ``process`` set at or
before ``T`` fire. A replay of the batch (same input, same ``T``, same state) fires the same timers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["SLOT_MS", "TIMER", "TIME_DOMAINS", "TimerIndex", "TimerVars", "slot_of"]

TIMER = "timer"
"""The state column of a key's timer (epoch milliseconds; 0: none), present when the processor declares timers."""
TIME_DOMAINS = ("event", "processing")
"""What a processor's timers measure: the watermark (``event``) or the batch's processing time."""
SLOT_MS = 10_000
"""Timers are indexed (not fired) at this granularity (measured: 1 s slots spent most of a session processor's
batch in state-store calls, one slot per second of event time a batch covers)."""


def slot_of(at: int) -> int:
    """The index slot of a timer at ``at`` (rounded down: a slot is due no later than its timers)."""
    return int(at) - int(at) % SLOT_MS


@dataclass(frozen=True)
class TimerVars:
    """The index's store calls for one group of keys."""

    registered: Callable[[], Iterable[int]]
    register: Callable[[int], None]
    unregister: Callable[[int], None]
    get_due: Callable[[int], list[str]]
    set_due: Callable[[int, list[str]], None]
    remove_due: Callable[[int], None]


class TimerIndex:
    """The due-timer index of one group of keys (see the module docstring)."""

    def __init__(self, vars: TimerVars) -> None:
        self.vars = vars
        self._registered: set[int] | None = None

    def _times(self) -> set[int]:
        if self._registered is None:
            self._registered = {int(t) for t in self.vars.registered()}
        return self._registered

    def add(self, keys: Any, timers: Any, *, together: bool = False) -> None:
        """Index ``keys`` under their ``timers`` (> 0); ``together``: all under the earliest of the timers."""
        keys = np.asarray(keys, dtype=object)
        timers = np.asarray(timers, dtype="int64")
        keep = timers > 0
        keys, timers = keys[keep], timers[keep]
        if not len(keys):
            return
        slots = np.full(len(timers), timers.min()) if together else timers - timers % SLOT_MS
        registered = self._times()
        for slot in np.unique(slots):
            at = int(slot)
            new = [str(k) for k in keys[slots == slot]]
            self.vars.set_due(at, self.vars.get_due(at) + new if at in registered else new)
            if at not in registered:
                self.vars.register(at)
                registered.add(at)

    def take(self, threshold: int) -> list[str]:
        """The candidate keys of every registered time ``<= threshold``; those times leave the index."""
        registered = self._times()
        keys: list[str] = []
        for at in sorted(t for t in registered if t <= threshold):
            keys.extend(self.vars.get_due(at))
            self.vars.remove_due(at)
            self.vars.unregister(at)
            registered.discard(at)
        return list(dict.fromkeys(keys))

    def index_changes(self, before: pd.DataFrame, after: pd.DataFrame) -> None:
        """Index the keys of ``after`` (``key`` + :data:`TIMER`) whose timer is set and differs from ``before``'s."""
        if not len(after):
            return
        old = before.set_index("key")[TIMER].reindex(after["key"]).fillna(0).to_numpy(dtype="int64")
        new = after[TIMER].fillna(0).to_numpy(dtype="int64")
        moved = (new > 0) & (new != old)
        self.add(after["key"].to_numpy()[moved], new[moved])


def split_due(state: pd.DataFrame, threshold: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``state`` rows (``key`` + :data:`TIMER`, of candidate keys) as ``(due, later)``: timers in ``(0,
    threshold]`` and timers after it (to be indexed again, together)."""
    timer = state[TIMER].fillna(0).to_numpy(dtype="int64")
    due = (timer > 0) & (timer <= threshold)
    return state[due].reset_index(drop=True), state[timer > threshold].reset_index(drop=True)


def cleared_fired(new_state: pd.DataFrame, threshold: int) -> pd.DataFrame:
    """``new_state`` from ``on_timer`` with every timer at or before ``threshold`` cleared: a fired timer stays
    fired unless the processor set a later one."""
    timer = new_state[TIMER].fillna(0).to_numpy(dtype="int64")
    out = new_state.copy()
    out[TIMER] = np.where(timer <= threshold, 0, timer).astype("int64")
    return out
