"""Test a processor in ``pytest`` without Spark or a cluster: :class:`ProcessorHarness`.

The harness runs a processor the way a shard does, minus Spark: it groups each batch's events by key group
(Spark's ``pmod(hash(key), maxKeyGroups)``, computed in Python), calls ``process`` once per key group with the
state of the keys in the call, enforces the same contract (:func:`~spark_runtime.engine.api.call_processor`), keeps
state in the same sorted runs a shard keeps (:mod:`spark_runtime.engine.runs`, in memory), and applies the state
TTL against a clock you set. What it returns is what the shard would emit::

    from spark_runtime.engine.testing import ProcessorHarness
    from my_pkg.sessions import SessionCounter

    def test_counts_per_user():
        h = ProcessorHarness(SessionCounter({"gap": 30}))
        out = h.run([{"key": "u1", "n": 1}, {"key": "u1", "n": 2}])
        assert out.set_index("key")["result"].to_dict() == {"u1": 2}
        assert h.state()["u1"]["count"] == 2

Events are dicts (or a ``pandas.DataFrame``) with ``key`` and the processor's fields; ``partition`` and ``offset``
default to 0 and the position in the batch. Fields are not type-checked as the shard's record reader does (records
that fail their types are dead letters there, never passed to ``process``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from spark_runtime.engine.api import (
    Processor,
    processor_result_columns,
    processor_state_schema,
    processor_time_domain,
    processor_ttl_ms,
)
from spark_runtime.engine.run_cache import RunCache
from spark_runtime.engine.runs import KEY
from spark_runtime.engine.state_layout import KeyGroupRuns, StateVars
from spark_runtime.engine.step import EVENT_TIME, process_group
from spark_runtime.engine.timers import TimerIndex, TimerVars
from spark_runtime.keygroups import key_group

__all__ = ["GroupStore", "ProcessorHarness"]


class GroupStore:
    """One key group's state and timer index, in memory (the harness's store; the state layout's and the timer
    index's tests use it too)."""

    def __init__(self) -> None:
        self.meta: str | None = None
        self.runs: dict[str, bytes] = {}
        self.due: dict[int, list[str]] = {}
        self.registered: set[int] = set()

    def timer_vars(self) -> TimerVars:
        return TimerVars(
            registered=lambda: set(self.registered),
            register=self.registered.add,
            unregister=self.registered.discard,
            get_due=lambda at: list(self.due.get(at, [])),
            set_due=self.due.__setitem__,
            remove_due=lambda at: self.due.pop(at, None),
        )

    def vars(self) -> StateVars:
        return StateVars(
            get_meta=lambda: self.meta,
            set_meta=lambda text: setattr(self, "meta", text),
            get_run=lambda run_id: self.runs[run_id],
            put_run=lambda run_id, data: self.runs.__setitem__(run_id, data),
            remove_run=lambda run_id: self.runs.pop(run_id, None),
        )


class ProcessorHarness:
    """Runs ``processor`` batch by batch (see the module docstring). ``now_ms`` is the processing time the state TTL
    and processing-time timers are measured with (set it, or pass ``now_ms=`` to :meth:`run`). ``event_time``
    names the events' field holding the event time (epoch milliseconds), as the Task's ``spec.eventTime.field``:
    the events then get the column ``event_time``, and the harness keeps the watermark as a shard does (the
    largest event time of the earlier batches minus ``max_out_of_orderness_ms``); records before ``watermark -
    allowed_lateness_ms`` are late (:attr:`late`), never processed."""

    def __init__(
        self,
        processor: Processor,
        *,
        max_key_groups: int = 128,
        now_ms: int = 0,
        event_time: str | None = None,
        max_out_of_orderness_ms: int = 0,
        allowed_lateness_ms: int = 0,
    ) -> None:
        self.processor = processor
        self.max_key_groups = max_key_groups
        self.now_ms = now_ms
        self.schema = processor_state_schema(processor)
        self.result_names = [c.name for c in processor_result_columns(processor)]
        self.ttl_ms = processor_ttl_ms(processor)
        self.time_domain = processor_time_domain(processor)
        if self.time_domain == "event" and event_time is None:
            raise ValueError("a processor with event-time timers needs event_time= (the Task's spec.eventTime)")
        self.event_time = event_time
        self.delay_ms = max_out_of_orderness_ms
        self.lateness_ms = allowed_lateness_ms
        self.watermark_ms: int | None = 0 if event_time is not None else None
        """The watermark the next batch runs with (None without event time)."""
        self.late: list[dict[str, Any]] = []
        """The late records so far (as passed to :meth:`run`), in the order they came."""
        self._max_event_time: int | None = None
        self._groups: dict[int, GroupStore] = {}
        self._cache = RunCache(tempfile.mkdtemp(prefix="taskshard-harness-"))
        self._offset = 0
        self.batches = 0

    def _state(self, group: int) -> KeyGroupRuns:
        store = self._groups.setdefault(group, GroupStore())
        return KeyGroupRuns(store.vars(), self._cache, self.schema, ttl=self.ttl_ms is not None)

    def _frame(self, events: Iterable[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
        import numpy as np

        frame = events.copy() if isinstance(events, pd.DataFrame) else pd.DataFrame(list(events))
        n = len(frame)
        if n and KEY not in frame.columns:
            raise ValueError("events need a 'key' column")
        if not n:
            frame = pd.DataFrame({KEY: pd.Series([], dtype=object)})
        if "partition" not in frame.columns:
            frame["partition"] = 0
        if "offset" not in frame.columns:
            frame["offset"] = np.arange(self._offset, self._offset + n)
        self._offset += n
        frame[KEY] = frame[KEY].astype(str)
        if self.event_time is not None:
            frame[EVENT_TIME] = frame[self.event_time].astype("int64") if n else pd.Series([], dtype="int64")
        frame["key_group"] = frame[KEY].map(lambda k: key_group(k, self.max_key_groups)).astype("int32")
        return frame

    def _drop_late(self, frame: pd.DataFrame) -> pd.DataFrame:
        if self.watermark_ms is None or not len(frame):
            return frame
        late = frame[EVENT_TIME].to_numpy() < self.watermark_ms - self.lateness_ms
        if late.any():
            self.late.extend(frame[late].drop(columns=["key_group", EVENT_TIME]).to_dict("records"))
        if len(frame):
            top = int(frame[EVENT_TIME].max())
            self._max_event_time = top if self._max_event_time is None else max(self._max_event_time, top)
        return frame[~late].reset_index(drop=True)

    def run(self, events: Iterable[Mapping[str, Any]] | pd.DataFrame, *, now_ms: int | None = None) -> pd.DataFrame:
        """Process one micro-batch (it may be empty: a batch that only fires timers); returns its outputs
        (``key``, ``key_group`` and the result columns)."""
        if now_ms is not None:
            self.now_ms = now_ms
        frame = self._drop_late(self._frame(events))
        columns = [c for c in frame.columns if c != "key_group"]
        groups = set(frame["key_group"]) | (
            {g for g, s in self._groups.items() if s.registered} if self.time_domain else set()
        )
        outputs = []
        for group in sorted(groups):
            events_g = frame[frame["key_group"] == group]
            events_g = events_g.sort_values(["partition", "offset"], kind="stable").reset_index(drop=True)
            timers = (
                TimerIndex(self._groups.setdefault(int(group), GroupStore()).timer_vars()) if self.time_domain else None
            )
            out = process_group(
                self._state(int(group)),
                self.processor,
                events_g,
                columns,
                self.result_names,
                now_ms=self.now_ms,
                ttl_ms=self.ttl_ms,
                timers=timers,
                watermark_ms=self.watermark_ms,
            )
            if len(out):
                outputs.append(out)
        self.batches += 1
        if self.watermark_ms is not None and self._max_event_time is not None:
            self.watermark_ms = max(self.watermark_ms, self._max_event_time - self.delay_ms)
        if not outputs:
            return pd.DataFrame({c: [] for c in [KEY, "key_group", *self.result_names]})
        return pd.concat(outputs, ignore_index=True)

    def state(self) -> dict[str, dict[str, Any]]:
        """Every key's live state (TTL applied at :attr:`now_ms`): ``{key: {column: value}}``."""
        out: dict[str, dict[str, Any]] = {}
        now = self.now_ms if self.ttl_ms is not None else None
        for group in self._groups:
            table = self._state(group).all_rows(now_ms=now)
            for row in table.select([KEY] + self.schema.names).to_pylist():
                out[row.pop(KEY)] = row
        return out

    def snapshot_json(self) -> str:
        """The state as sorted JSON (handy for golden tests)."""
        return json.dumps(self.state(), sort_keys=True, default=str)
