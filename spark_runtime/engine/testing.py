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
    processor_ttl_ms,
)
from spark_runtime.engine.run_cache import RunCache
from spark_runtime.engine.runs import KEY
from spark_runtime.engine.state_layout import KeyGroupRuns, StateVars
from spark_runtime.engine.step import process_group
from spark_runtime.keygroups import key_group

__all__ = ["ProcessorHarness"]


class _GroupStore:
    def __init__(self) -> None:
        self.meta: str | None = None
        self.runs: dict[str, bytes] = {}

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
    is measured with (set it, or pass ``now_ms=`` to :meth:`run`)."""

    def __init__(self, processor: Processor, *, max_key_groups: int = 128, now_ms: int = 0) -> None:
        self.processor = processor
        self.max_key_groups = max_key_groups
        self.now_ms = now_ms
        self.schema = processor_state_schema(processor)
        self.result_names = [c.name for c in processor_result_columns(processor)]
        self.ttl_ms = processor_ttl_ms(processor)
        self._groups: dict[int, _GroupStore] = {}
        self._cache = RunCache(tempfile.mkdtemp(prefix="taskshard-harness-"))
        self._offset = 0
        self.batches = 0

    def _state(self, group: int) -> KeyGroupRuns:
        store = self._groups.setdefault(group, _GroupStore())
        return KeyGroupRuns(store.vars(), self._cache, self.schema, ttl=self.ttl_ms is not None)

    def run(self, events: Iterable[Mapping[str, Any]] | pd.DataFrame, *, now_ms: int | None = None) -> pd.DataFrame:
        """Process one micro-batch; returns its outputs (``key``, ``key_group`` and the result columns)."""
        import numpy as np

        if now_ms is not None:
            self.now_ms = now_ms
        frame = events.copy() if isinstance(events, pd.DataFrame) else pd.DataFrame(list(events))
        if KEY not in frame.columns:
            raise ValueError("events need a 'key' column")
        n = len(frame)
        if "partition" not in frame.columns:
            frame["partition"] = 0
        if "offset" not in frame.columns:
            frame["offset"] = np.arange(self._offset, self._offset + n)
        self._offset += n
        frame[KEY] = frame[KEY].astype(str)
        frame["key_group"] = frame[KEY].map(lambda k: key_group(k, self.max_key_groups)).astype("int32")
        columns = [c for c in frame.columns if c != "key_group"]
        outputs = []
        for group in sorted(set(frame["key_group"])):
            events_g = frame[frame["key_group"] == group]
            events_g = events_g.sort_values(["partition", "offset"], kind="stable").reset_index(drop=True)
            out = process_group(
                self._state(int(group)),
                self.processor,
                events_g,
                columns,
                self.result_names,
                now_ms=self.now_ms,
                ttl_ms=self.ttl_ms,
            )
            if len(out):
                outputs.append(out)
        self.batches += 1
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
