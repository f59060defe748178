"""The runs layout on Spark: ``groupBy(bucket).transformWithStateInPandas``, one call per bucket of key groups.

:class:`RunsProcessor` is the Spark ``StatefulProcessor``. The grouping key is a **bucket** of the shard's key
groups (:func:`bucket_sql`; a few per shard, fixed for the checkpoint's life): Spark's per-call cost of
``transformWithStateInPandas`` (about 1.6 ms on this machine) is paid a few times per batch, not once per key
group. Per call it

1. reads the bucket's ``meta`` and the runs it has no local copy of (:class:`~spark_runtime.engine.state_layout.
   KeyGroupRuns`, :class:`~spark_runtime.engine.run_cache.RunCache`);
2. on batch 0 of a restored child, stores the parents' slices (the ``seed`` rows, one per key group) as a run;
3. looks up the state of the keys in the batch, calls the user's ``process`` (:func:`~spark_runtime.engine.api.
   call_processor`), and stores the touched keys' new rows as one run (and a compaction's merged run);
4. yields the outputs ``(key, key_group, <result columns>)`` (each run row keeps its key group, ``_kg``, so a
   snapshot is written per key group).

Nothing else is kept between calls except the processor instance and the run cache, neither of which decides
anything: the state store does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from spark_runtime.engine.api import cached_processor
from spark_runtime.engine.packing import unpack_events
from spark_runtime.engine.run_cache import process_cache_dir, run_cache
from spark_runtime.engine.runs import EXPIRES, GROUP, KEY
from spark_runtime.engine.schema import StateSchema
from spark_runtime.engine.state_layout import KeyGroupRuns, StateVars
from spark_runtime.engine.step import EVENT_TIME, LATE, BatchTime, fire_due, process_group, split_held
from spark_runtime.engine.timers import TIMER, TimerIndex, TimerVars

__all__ = ["RunsProcessor", "RunsSettings", "bucket_sql", "default_cache_dir"]

META_VAR = "meta"
RUNS_VAR = "runs"
DUE_VAR = "due"


def bucket_sql(start: int, end: int, buckets: int, column: str = "key_group") -> str:
    """The bucket of a key group of ``[start, end)`` among ``buckets`` contiguous, near-equal buckets (SQL)."""
    if buckets < 1 or end <= start:
        raise ValueError(f"buckets: {buckets} buckets over key groups [{start}, {end})")
    return f"cast(((`{column}` - {start}) * {buckets}) div {end - start} as int)"


def default_cache_dir() -> str:
    """The run-cache directory of this (driver) process (:func:`spark_runtime.engine.run_cache.process_cache_dir`)."""
    return process_cache_dir()


@dataclass(frozen=True)
class RunsSettings:
    """What the processor needs, all plain values (it is pickled to the Python workers)."""

    ref: str
    parameters_json: str
    schema_json: dict[str, Any]
    result_names: tuple[str, ...]
    event_columns: tuple[str, ...]
    cache_dir: str
    ttl_ms: int | None = None
    time_mode: str = "None"
    """Spark's ``timeMode``: ``EventTime`` with event time, ``ProcessingTime`` for processing-time timers."""
    timers: str | None = None
    """The processor's timers (``event``, ``processing``, None)."""
    lateness_ms: int | None = None
    """With event time: records before ``watermark - lateness_ms`` are late (output rows with ``_late``)."""
    watermark_floor_ms: int = 0
    """The lowest watermark this shard runs with: its parents' final watermark (a split or merged shard)."""
    shard: str = ""


class RunsProcessor(StatefulProcessor):
    """See the module docstring."""

    def __init__(self, settings: RunsSettings) -> None:
        self.settings = settings

    def init(self, handle: StatefulProcessorHandle) -> None:
        s = self.settings
        self.meta = handle.getValueState(META_VAR, "meta string")
        self.runs = handle.getMapState(RUNS_VAR, "id string", "data binary")
        self.proc = cached_processor(s.ref, s.parameters_json)
        self.schema = StateSchema.from_json(s.schema_json)
        self.state_names = self.schema.names
        self.cache = run_cache(s.cache_dir)
        self.handle = handle
        self.due = handle.getMapState(DUE_VAR, "at bigint", "keys string") if s.timers else None

    def _vars(self) -> StateVars:
        meta, runs = self.meta, self.runs

        def get_meta() -> str | None:
            value = meta.get()
            return None if value is None else value[0]

        def get_run(run_id: str) -> bytes:
            value = runs.getValue((run_id,))
            if value is None:
                raise RuntimeError(f"run {run_id} is in the key group's meta but not in its runs (state is damaged)")
            return bytes(value[0])

        return StateVars(
            get_meta=get_meta,
            set_meta=lambda text: meta.update((text,)),
            get_run=get_run,
            put_run=lambda run_id, data: runs.updateValue((run_id,), (data,)),
            remove_run=lambda run_id: runs.removeKey((run_id,)),
        )

    def _timer_index(self) -> TimerIndex | None:
        if self.due is None:
            return None
        handle, due = self.handle, self.due

        def get_due(at: int) -> list[str]:
            value = due.getValue((at,))
            return [] if value is None else list(json.loads(value[0]))

        return TimerIndex(
            TimerVars(
                registered=handle.listTimers,
                register=handle.registerTimer,
                unregister=handle.deleteTimer,
                get_due=get_due,
                set_due=lambda at, keys: due.updateValue((at,), (json.dumps(keys),)),
                remove_due=lambda at: due.removeKey((at,)),
            )
        )

    def _times(self, timer_values: Any, packed: pd.DataFrame | None) -> BatchTime:
        """The batch's processing time and watermark (the parents' final one at least)."""
        s = self.settings
        now = _now_ms(packed) if s.ttl_ms is not None and packed is not None else None
        if now is None and s.time_mode != "None":  # the batch's timestamp, as current_timestamp() gives it
            now = int(timer_values.getCurrentProcessingTimeInMs())
        watermark = None
        if s.time_mode == "EventTime":
            watermark = max(int(timer_values.getCurrentWatermarkInMs()), s.watermark_floor_ms)
        return BatchTime(now, watermark)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        import numpy as np

        s = self.settings
        packed = pd.concat(list(rows), ignore_index=True)
        pdf = unpack_events(packed["events"]).to_pandas(use_threads=False)
        clock = self._times(timerValues, packed)
        state = KeyGroupRuns(self._vars(), self.cache, self.schema, ttl=s.ttl_ms is not None)
        timers = self._timer_index()
        seeded = pdf["seed"].notna()
        if seeded.any():  # batch 0 of a restored child: the parent's slices become the first run
            self._seed(state, pdf[seeded], clock.now_ms, timers)
            pdf = pdf[~seeded]
        if s.lateness_ms is not None and len(pdf):
            assert clock.watermark_ms is not None
            late = pdf[EVENT_TIME].to_numpy() < clock.watermark_ms - s.lateness_ms
            if late.any():
                yield self._late_rows(pdf[late], clock.watermark_ms)
                pdf = pdf[~late]
        if not len(pdf) and timers is None:
            return
        order = np.lexsort((pdf["offset"].to_numpy(), pdf["partition"].to_numpy()))  # source order per partition
        held, events = split_held(pdf.take(order).reset_index(drop=True))
        if len(held):  # a catch-up child's batch that reaches its parent's final positions: state only
            if timers is not None:
                raise RuntimeError("a processor with timers hands over in restore mode: it never gets held records")
            process_group(
                state,
                self.proc,
                held,
                list(s.event_columns),
                list(s.result_names),
                now_ms=clock.now_ms,
                ttl_ms=s.ttl_ms,
            )
        outputs = process_group(
            state,
            self.proc,
            events,
            list(s.event_columns),
            list(s.result_names),
            now_ms=clock.now_ms,
            ttl_ms=s.ttl_ms,
            timers=timers,
            watermark_ms=clock.watermark_ms,
        )
        if len(outputs):
            yield self._results(outputs)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Spark found a registered time of this bucket due: fire every timer due by the batch's threshold."""
        s = self.settings
        timers = self._timer_index()
        if timers is None:
            return
        clock = self._times(timerValues, None)
        threshold = clock.threshold(s.timers)
        if threshold is None:
            return
        state = KeyGroupRuns(self._vars(), self.cache, self.schema, ttl=s.ttl_ms is not None)
        self.proc.now_ms, self.proc.watermark_ms = clock.now_ms, clock.watermark_ms
        outputs = fire_due(
            state, self.proc, timers, threshold, list(s.result_names), now_ms=clock.now_ms, ttl_ms=s.ttl_ms
        )
        if len(outputs):
            yield self._results(outputs)

    def _results(self, outputs: pd.DataFrame) -> pd.DataFrame:
        outputs[KEY] = outputs[KEY].astype(str)
        if self.settings.lateness_ms is not None:
            outputs[LATE] = None
        return outputs

    def _late_rows(self, late: pd.DataFrame, watermark: int) -> pd.DataFrame:
        """Output rows carrying late records' dead letters (``_late``; results null)."""
        s = self.settings
        columns = [c for c in s.event_columns if c not in ("partition", "offset")]
        bound = watermark - int(s.lateness_ms or 0)
        letters = []
        for rec in late[columns + ["partition", "offset", "key_group"]].to_dict("records"):
            line = {c: _plain(rec[c]) for c in columns}
            letters.append(
                json.dumps(
                    {
                        "shard": s.shard,
                        "partition": int(rec["partition"]),
                        "offset": int(rec["offset"]),
                        "reason": "late",
                        "detail": f"event time {int(rec[EVENT_TIME])} is before the watermark {watermark} minus "
                        f"the allowed lateness ({bound})",
                        "key": str(rec[KEY]),
                        "key_group": int(rec["key_group"]),
                        "line": json.dumps(line, ensure_ascii=False, separators=(",", ":")),
                    },
                    ensure_ascii=False,
                )
            )
        out = pd.DataFrame({KEY: late[KEY].astype(str).to_numpy(), "key_group": late["key_group"].to_numpy("int32")})
        for name in s.result_names:
            out[name] = None
        out[LATE] = letters
        return out

    def _seed(self, state: KeyGroupRuns, seeds: pd.DataFrame, now_ms: int | None, timers: TimerIndex | None) -> None:
        """Store the parent's rows (one seed row per key group: its snapshot rows, possibly of an older compatible
        schema) as the first run; rows keep their expiry (none for rows written before the TTL was declared)."""
        import numpy as np
        import pyarrow as pa

        from spark_runtime.engine.blob import decode_state_table

        ttl = self.settings.ttl_ms is not None
        target = _state_arrow(self.schema, ttl=ttl)
        tables = []
        for blob, kg in zip(seeds["seed"], seeds["key_group"], strict=True):
            table = self.schema.conform(decode_state_table(blob), target)
            tables.append(table.set_column(1, GROUP, pa.array(np.full(table.num_rows, int(kg), "int32"))))
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        expires = None
        if ttl:
            expires = table.column(EXPIRES).combine_chunks()
            table = table.drop_columns([EXPIRES])
        state.write(table, [], expires=expires, now_ms=now_ms)
        if timers is not None:  # the parents' pending timers, due in this shard now
            timers.add(
                table.column(KEY).to_numpy(zero_copy_only=False), table.column(TIMER).to_numpy(zero_copy_only=False)
            )

    def close(self) -> None:
        pass


def _now_ms(packed: pd.DataFrame) -> int:
    """The batch's time the packed rows carry (:mod:`~spark_runtime.engine.packing`)."""
    now = packed["now_ms"].dropna()
    if not len(now):
        raise RuntimeError("the batch's time is missing from its packed rows (the plan must add it with a TTL)")
    return int(now.max())


def _plain(value: Any) -> Any:
    """A pandas/numpy cell as a JSON value."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


def _state_arrow(schema: StateSchema, *, ttl: bool = False) -> Any:
    """Snapshot rows as the runs take them: ``key``, ``_kg``, (``_expires``,) the state columns."""
    import pyarrow as pa

    from spark_runtime.records import arrow_type

    fields = [(KEY, pa.string()), (GROUP, pa.int32())] + ([(EXPIRES, pa.int64())] if ttl else [])
    return pa.schema(fields + [(c.name, arrow_type(c.type)) for c in schema.columns])
