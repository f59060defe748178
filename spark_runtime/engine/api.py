"""The stateful processor API for users: a vectorized, keyed, exactly-once ``process(events, state)``.

Write a subclass of :class:`Processor` in a module the shard image can import and name it in the Task::

    processor:
      python: my_pkg.my_mod:MyProcessor
      parameters: {threshold: 10}          # passed to __init__ as a dict

Contract
--------
The runtime groups a micro-batch's records by **key group** and calls :meth:`Processor.process` with the records of
one or a few key groups at a time (a bucket of the shard's key groups; many keys per call: that is what makes Python
affordable, since one call per key costs ~10x Spark's native aggregation). Which keys share a call is not part of
the contract; every key's records are in one call per micro-batch. Per call:

``events`` (``pandas.DataFrame``)
    The call's records of this micro-batch, in source order within each partition (sorted by
    ``(partition, offset)``). Columns: ``key`` (str), one column per entry of :attr:`Processor.fields`
    (typed: string -> object, long -> int64, double -> float64, boolean -> bool, json -> str of JSON text),
    ``value`` (the whole JSON line) when :attr:`Processor.raw_value` is true, and ``partition``/``offset``
    (the record's source position). Records whose fields fail their types never get here: they are dead
    letters.
``state`` (``pandas.DataFrame``)
    The current state of the keys that occur in ``events`` and have state: column ``key`` plus the columns of
    :attr:`Processor.state_schema`, one row per key. Keys seen for the first time (or whose state expired, see
    :attr:`Processor.state_ttl_seconds`) are absent.
Return ``(new_state, outputs)``
    ``new_state``: the complete new state of every key of ``events``: columns ``key`` + the state columns, at
    most one row per key. A key of ``events`` that is absent from ``new_state`` has its state **deleted**.
    Keys that are not in ``events`` keep their state untouched (rows for them are an error).
    ``outputs``: rows to emit, columns ``key`` and the result columns (:attr:`Processor.result_schema`; by
    default one column ``result`` of :attr:`Processor.result_type`); usually one per updated key, and only for
    keys of ``events`` (another key is an error). Both may be empty.

Guarantees: each committed event is passed to ``process`` exactly once as far as state and committed output
are concerned (a micro-batch that fails or is interrupted is replayed from the checkpoint with the same
records and the same prior state). ``process`` must therefore be deterministic and free of external side
effects. The processor object lives in a Spark Python worker and may be re-created at any time: keep
everything that matters in ``state``. On a split, each child receives exactly the state rows of its keys.
What a call costs follows the keys it touches, not the state's size (:mod:`spark_runtime.engine`).

Event time
----------
With the Task's ``spec.eventTime``, ``events`` has a column ``event_time`` (int64, epoch milliseconds) and the
shard keeps a **watermark**: the largest event time of the earlier batches minus ``maxOutOfOrdernessSeconds``
(never lower than a split or merged shard's parents' final watermark; constant within a batch, so a replay decides
the same). A record whose event time is before ``watermark - allowedLatenessSeconds`` is **late**: it goes to the
dead letters with reason ``late``, once, and never to ``process``. ``self.watermark_ms`` holds the batch's
watermark during a call.

Timers
------
A processor that declares ``timers = "event"`` (fires once the watermark reaches the time) or ``timers =
"processing"`` (fires once the batch's processing time reaches it) has one more state column, ``timer`` (int64
epoch milliseconds; 0: none). It is part of the key's state like any other column: ``process`` sets or clears it
in ``new_state``, it travels in snapshots to split children and merged shards, and it fires exactly once. In a
batch, due timers fire **before** ``process`` sees the batch's events, and timers that ``process`` set at or before
the threshold fire right after it. A due timer calls :meth:`Processor.on_timer` with ``timers`` (``key``,
``timer``: many due keys per call) and ``state`` (their state rows); it returns ``(new_state, outputs)`` for those
keys under the same rules as ``process``. A fired timer is cleared unless ``new_state`` sets a later one.
Processing time is not deterministic across runs: a processing-time timer fires in the first batch whose time
reaches it, and a shard whose processor declares them runs a batch every trigger even without input (that is what
lets it fire with no new events). Event-time timers are deterministic.

``fields``, ``raw_value``, ``state_schema``, ``result_type``, ``result_schema`` and ``state_ttl_seconds`` are read
from the *instance* after ``__init__``, so they may depend on ``parameters`` (see :class:`SumProcessor`).
Column types (state and result): ``string``, ``bigint``/``long``, ``int``, ``double``, ``float``, ``boolean``,
``binary``. How a state schema may change while state exists: :mod:`spark_runtime.engine.schema`.

:class:`CountProcessor` and :class:`SumProcessor` are the Python twins of the builtins ``count`` and ``sum``
(which run as Spark's native aggregation); copy them as a starting point. Test a processor without Spark or a
cluster with :class:`spark_runtime.engine.testing.ProcessorHarness`.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, ClassVar

import pandas as pd

from spark_runtime.engine.schema import Column, SchemaError, StateSchema, parse_columns, result_columns
from spark_runtime.engine.timers import TIME_DOMAINS, TIMER

__all__ = [
    "CountProcessor",
    "Processor",
    "ProcessorError",
    "ProcessorFailed",
    "SumProcessor",
    "call_on_timer",
    "call_processor",
    "load_processor",
    "processor_result_columns",
    "processor_state_schema",
    "processor_time_domain",
]


class ProcessorError(ValueError):
    """A processor class or its output breaks the contract (the message says which part)."""


class ProcessorFailed(ProcessorError):
    """One call of ``process`` failed: the user's exception (type and message) or output that breaks the contract,
    with the key groups of the call. One line; a shard that fails on it finds it in Spark's error by the class name
    (:func:`processor_failure`) and shows it on the TaskShard with the batch."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))  # one line: the driver reads it out of Spark's error text


class Processor:
    """Base class of user processors; see the module docstring for the full contract."""

    fields: ClassVar[dict[str, str]] = {}
    """Event fields read, ``{name: type}``; types ``string``, ``long``, ``double``, ``boolean``, ``json``,
    with a trailing ``?`` for optional ones (missing or null -> null instead of a dead letter)."""
    raw_value: ClassVar[bool] = False
    """Pass the whole JSON line as column ``value``."""
    state_schema: ClassVar[str] = ""
    """Per-key state columns as ``"name type [default <literal>], ..."`` (e.g. ``"count bigint, last string"``).
    Required."""
    result_type: ClassVar[str] = "string"
    """Type of the ``result`` output column (when :attr:`result_schema` is empty)."""
    result_schema: ClassVar[str] = ""
    """Several typed result columns, ``"name type, ..."`` (e.g. ``"total bigint, last string"``); empty: one
    column ``result`` of :attr:`result_type`. Sinks write them as columns (Parquet) or fields (JSON)."""
    state_ttl_seconds: ClassVar[float | None] = None
    """Forget a key's state this long after it was last written (processing time: the batch's timestamp, which
    Spark records with the batch, so a replay decides the same). None: keep it until ``process`` deletes it."""
    timers: ClassVar[str | None] = None
    """``"event"`` or ``"processing"``: each key may hold one timer of that kind, in its state column ``timer``
    (epoch milliseconds, 0: none), and :meth:`on_timer` is called once it is due (see "Timers" in the module
    docstring). ``"event"`` needs the Task's ``spec.eventTime``. None (default): no timers."""

    watermark_ms: int | None = None
    """Set by the runtime before each call: the event-time watermark of the batch (None without event time)."""
    now_ms: int | None = None
    """Set by the runtime before each call: the batch's processing time (epoch milliseconds; the same on a
    replay of the batch)."""

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        self.parameters: dict[str, Any] = dict(parameters or {})

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Fold ``events`` into ``state``; return ``(new_state, outputs)`` (see the module docstring)."""
        raise NotImplementedError

    def on_timer(self, timers: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Handle due timers (``timers``: ``key``, ``timer``; ``state``: those keys' state); return ``(new_state,
        outputs)`` for those keys, as :meth:`process` does (see "Timers" in the module docstring)."""
        raise NotImplementedError(f"{type(self).__name__} declares timers but has no on_timer(timers, state)")


class CountProcessor(Processor):
    """Count events per key. Same results as ``processor: {builtin: count}``."""

    state_schema = "count bigint"
    result_type = "bigint"

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        counts = events.groupby("key", sort=False).size()
        previous = state.set_index("key")["count"].reindex(counts.index, fill_value=0)
        total = previous.to_numpy(dtype="int64") + counts.to_numpy(dtype="int64")
        keys = counts.index.to_numpy()
        return pd.DataFrame({"key": keys, "count": total}), pd.DataFrame({"key": keys, "result": total})


class SumProcessor(Processor):
    """Sum the numeric field ``parameters["field"]`` (default ``amount``) per key. Same results as
    ``processor: {builtin: sum, field: ...}``."""

    state_schema = "sum double"
    result_type = "double"

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(parameters)
        self.field = str(self.parameters.get("field", "amount"))
        self.fields = {self.field: "double"}

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        sums = events.groupby("key", sort=False)[self.field].sum()
        previous = state.set_index("key")["sum"].reindex(sums.index, fill_value=0.0)
        total = previous.to_numpy(dtype="float64") + sums.to_numpy(dtype="float64")
        keys = sums.index.to_numpy()
        return pd.DataFrame({"key": keys, "sum": total}), pd.DataFrame({"key": keys, "result": total})


# ---------------------------------------------------------------- loading and checking

RESULT_RESERVED = ("key", "key_group", "shard", "batch")
"""Names every output record carries besides the results (see :mod:`spark_runtime.sink`)."""


def processor_time_domain(proc: Processor) -> str | None:
    """The processor's timers (``event``, ``processing``, or None); raises :class:`ProcessorError` for another
    value or a processor with timers and no ``on_timer``."""
    domain = getattr(proc, "timers", None)
    if domain is None:
        return None
    if domain not in TIME_DOMAINS:
        raise ProcessorError(f"timers: {domain!r} must be one of {', '.join(TIME_DOMAINS)} (or None)")
    if getattr(type(proc), "on_timer", None) is Processor.on_timer:
        raise ProcessorError(f"timers: {domain!r} needs an on_timer(timers, state) method")
    return str(domain)


def processor_state_schema(proc: Processor) -> StateSchema:
    """The processor's state schema: the declared columns, plus ``timer bigint default 0`` with timers (raises
    :class:`ProcessorError` naming the problem)."""
    try:
        schema = StateSchema.parse(getattr(proc, "state_schema", ""))
    except SchemaError as exc:
        raise ProcessorError(str(exc)) from None
    if processor_time_domain(proc) is None:
        return schema
    if TIMER in schema.names:
        raise ProcessorError(f"state_schema: column {TIMER!r} is the timer's (declared with timers = ...)")
    return StateSchema.parse(f"{schema.ddl()}, {TIMER} bigint default 0")


def processor_result_columns(proc: Processor) -> list[Column]:
    """The processor's result columns: :attr:`Processor.result_schema`, else ``result <result_type>``."""
    try:
        declared = str(getattr(proc, "result_schema", "") or "").strip()
        if declared:
            cols = result_columns(declared)
            taken = [c.name for c in cols if c.name in RESULT_RESERVED]
            if taken:
                raise SchemaError(
                    f"result_schema: column name {taken[0]!r} is reserved (every record has "
                    f"{', '.join(RESULT_RESERVED)})"
                )
            return cols
        return parse_columns(f"result {getattr(proc, 'result_type', '')}", what="result_type", defaults=False)
    except SchemaError as exc:
        raise ProcessorError(str(exc)) from None


def processor_ttl_ms(proc: Processor) -> int | None:
    """The state TTL in milliseconds (None: none); raises :class:`ProcessorError` for a non-positive value."""
    ttl = getattr(proc, "state_ttl_seconds", None)
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
        raise ProcessorError(f"state_ttl_seconds: {ttl!r} must be a positive number of seconds (or None)")
    return int(round(float(ttl) * 1000))


def load_processor(ref: str, parameters: dict[str, Any] | None = None) -> Processor:
    """Import ``package.module:ClassName`` and instantiate it with ``parameters``; check the declarations."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ProcessorError(f"processor.python: {ref!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProcessorError(f"processor.python: cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ProcessorError(f"processor.python: {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, type) or not callable(getattr(obj, "process", None)):
        raise ProcessorError(f"processor.python: {ref!r} is not a class with a process(events, state) method")
    try:
        instance = obj(dict(parameters or {}))
    except Exception as exc:
        raise ProcessorError(f"processor.python: {ref}(parameters) failed: {type(exc).__name__}: {exc}") from exc
    processor_time_domain(instance)
    processor_state_schema(instance)
    processor_result_columns(instance)
    processor_ttl_ms(instance)
    if not isinstance(getattr(instance, "fields", {}), dict):
        raise ProcessorError(f"processor.python: {ref}.fields must be a dict {{name: type}}")
    return instance


_CACHE: dict[tuple[str, str], Processor] = {}


def cached_processor(ref: str, parameters_json: str) -> Processor:
    """One processor instance per (class, parameters) per Python worker process."""
    key = (ref, parameters_json)
    proc = _CACHE.get(key)
    if proc is None:
        proc = _CACHE[key] = load_processor(ref, json.loads(parameters_json))
    return proc


# ---------------------------------------------------------------- one call


def call_processor(
    proc: Processor,
    events: pd.DataFrame,
    state: pd.DataFrame,
    state_names: list[str],
    result_names: list[str],
    key_groups: Any = (),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Call ``proc.process(events, state)`` (``state``: the state rows of the keys of ``events`` that have state) and
    enforce the contract of the module docstring: returns the new state of the touched keys (``key`` +
    ``state_names``; a key of ``events`` without a row has its state deleted) and the outputs (``key`` +
    ``result_names``). Raises :class:`ProcessorFailed` with the user's exception, or naming what breaks the
    contract, and ``key_groups`` (the call's key groups, for the message)."""
    return _checked_call(proc, "process", events, state, state_names, result_names, key_groups)


def call_on_timer(
    proc: Processor,
    timers: pd.DataFrame,
    state: pd.DataFrame,
    state_names: list[str],
    result_names: list[str],
    key_groups: Any = (),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`call_processor` for ``proc.on_timer(timers, state)``: the keys of ``timers`` are the call's keys."""
    return _checked_call(proc, "on_timer", timers, state, state_names, result_names, key_groups)


def _checked_call(
    proc: Processor,
    method: str,
    frame: pd.DataFrame,
    state: pd.DataFrame,
    state_names: list[str],
    result_names: list[str],
    key_groups: Any,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    name = f"{type(proc).__name__}.{method}"
    where = _call_place(key_groups)
    arg = "events" if method == "process" else "timers"
    event_keys = pd.unique(frame["key"])
    try:
        result = getattr(proc, method)(frame.reset_index(drop=True), state.reset_index(drop=True))
    except Exception as exc:
        raise ProcessorFailed(f"{name} raised {type(exc).__name__}: {exc}{where}") from exc

    def broken(what: str) -> ProcessorFailed:
        return ProcessorFailed(f"{name} {what}{where}")

    if not (isinstance(result, tuple) and len(result) == 2):
        raise broken(f"must return (new_state, outputs), got {type(result).__name__}")
    names, out_names = ["key"] + state_names, ["key"] + result_names
    new_state = _checked_frame(result[0], "new_state", names, broken)
    outputs = _checked_frame(result[1], "outputs", out_names, broken)
    if new_state["key"].duplicated().any():
        dup = new_state["key"][new_state["key"].duplicated()].iloc[0]
        raise broken(f"new_state has key {dup!r} more than once")
    stray = ~new_state["key"].isin(event_keys)
    if stray.any():
        raise broken(
            f"new_state has key {new_state['key'][stray].iloc[0]!r}, which is not in {arg} (only keys of this "
            f"call's {arg} may change)"
        )
    foreign = ~outputs["key"].isin(event_keys)
    if foreign.any():
        raise broken(
            f"outputs has key {outputs['key'][foreign].iloc[0]!r}, which is not in {arg} (a call emits results "
            "only for its own keys)"
        )
    return new_state[names].reset_index(drop=True), outputs[out_names].reset_index(drop=True)


def _checked_frame(value: Any, what: str, names: list[str], broken: Any) -> pd.DataFrame:
    """``value`` (``new_state`` or ``outputs`` as ``process`` returned it) as a frame with ``names`` (None: empty);
    ``broken(text)`` makes the error for anything else."""
    if value is None:
        return pd.DataFrame({n: [] for n in names})
    if not isinstance(value, pd.DataFrame):
        raise broken(f"{what} must be a pandas DataFrame, got {type(value).__name__}")
    missing = [n for n in names if n not in value.columns]
    if missing:
        raise broken(f"{what} lacks columns {missing} (needs {names})")
    return value


def _call_place(key_groups: Any) -> str:
    groups = sorted({int(g) for g in key_groups})
    if not groups:
        return ""
    shown = ", ".join(str(g) for g in groups[:8]) + (f", ... ({len(groups)} in all)" if len(groups) > 8 else "")
    return f" (key group{'s' if len(groups) > 1 else ''} {shown})"


PROCESSOR_FAILED = "ProcessorFailed"
"""The reason a TaskShard shows for a failing processor call (:class:`ProcessorFailed`)."""


def processor_failure(error_text: str) -> str | None:
    """The message of the last :class:`ProcessorFailed` in ``error_text`` (Spark's error of a failed query, which
    holds the Python worker's traceback), else None."""
    import re

    found = re.findall(r"ProcessorFailed: ([^\n]+)", error_text)
    return found[-1].strip() if found else None
