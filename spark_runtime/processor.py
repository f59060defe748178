"""The stateful processor API for users: a vectorized, keyed, exactly-once ``process(events, state)``.

Write a subclass of :class:`Processor` in a module the shard image can import and name it in the Task::

    processor:
      python: my_pkg.my_mod:MyProcessor
      parameters: {threshold: 10}          # passed to __init__ as a dict

Contract
--------
The runtime groups a micro-batch's records by **key group** and calls :meth:`Processor.process` once per key
group that has records (many keys per call; that is what makes Python affordable: one call per key costs ~10x
Spark's native aggregation, one call per key group ~2-3x). Per call:

``events`` (``pandas.DataFrame``)
    The key group's records of this micro-batch, in source order within each partition (sorted by
    ``(partition, offset)``). Columns: ``key`` (str), one column per entry of :attr:`Processor.fields`
    (typed: string -> object, long -> int64, double -> float64, boolean -> bool, json -> str of JSON text),
    ``value`` (the whole JSON line) when :attr:`Processor.raw_value` is true, and ``partition``/``offset``
    (the record's source position). Records whose fields fail their types never get here: they are dead
    letters.
``state`` (``pandas.DataFrame``)
    The current state of the keys that occur in ``events`` and have state: column ``key`` plus the columns of
    :attr:`Processor.state_schema`, one row per key. Keys seen for the first time are absent.
Return ``(new_state, outputs)``
    ``new_state``: the complete new state of every key of ``events``: columns ``key`` + the state columns, at
    most one row per key. A key of ``events`` that is absent from ``new_state`` has its state **deleted**.
    Keys that are not in ``events`` keep their state untouched (rows for them are an error).
    ``outputs``: rows to emit, columns ``key`` and ``result`` (of :attr:`Processor.result_type`); usually one
    per updated key. Both may be empty.

Guarantees: each committed event is passed to ``process`` exactly once as far as state and committed output
are concerned (a micro-batch that fails or is interrupted is replayed from the checkpoint with the same
records and the same prior state). ``process`` must therefore be deterministic and free of external side
effects. The processor object lives in a Spark Python worker and may be re-created at any time: keep
everything that matters in ``state``. On a split, each child receives exactly the state rows of its keys.

``fields``, ``raw_value``, ``state_schema`` and ``result_type`` are read from the *instance* after
``__init__``, so they may depend on ``parameters`` (see :class:`SumProcessor`). Column types (state and
result): ``string``, ``bigint``/``long``, ``int``, ``double``, ``float``, ``boolean``, ``binary``.

:class:`CountProcessor` and :class:`SumProcessor` are the Python twins of the builtins ``count`` and ``sum``
(which run as Spark's native aggregation); copy them as a starting point.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, ClassVar

import pandas as pd

from spark_runtime.records import arrow_type

__all__ = [
    "CountProcessor",
    "Processor",
    "ProcessorError",
    "SumProcessor",
    "decode_state_table",
    "encode_state_table",
    "load_processor",
    "run_processor",
    "state_columns",
]

COLUMN_TYPES = {
    "string": "string",
    "bigint": "bigint",
    "long": "bigint",
    "int": "int",
    "integer": "int",
    "double": "double",
    "float": "float",
    "boolean": "boolean",
    "binary": "binary",
}


class ProcessorError(ValueError):
    """A processor class or its output breaks the contract (the message says which part)."""


class Processor:
    """Base class of user processors; see the module docstring for the full contract."""

    fields: ClassVar[dict[str, str]] = {}
    """Event fields read, ``{name: type}``; types ``string``, ``long``, ``double``, ``boolean``, ``json``,
    with a trailing ``?`` for optional ones (missing or null -> null instead of a dead letter)."""
    raw_value: ClassVar[bool] = False
    """Pass the whole JSON line as column ``value``."""
    state_schema: ClassVar[str] = ""
    """Per-key state columns as ``"name type, ..."`` (e.g. ``"count bigint, last string"``). Required."""
    result_type: ClassVar[str] = "string"
    """Type of the ``result`` output column."""

    def __init__(self, parameters: dict[str, Any] | None = None) -> None:
        self.parameters: dict[str, Any] = dict(parameters or {})

    def process(self, events: pd.DataFrame, state: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Fold ``events`` into ``state``; return ``(new_state, outputs)`` (see the module docstring)."""
        raise NotImplementedError


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


def state_columns(schema: str, *, what: str = "state_schema") -> list[tuple[str, str]]:
    """``"count bigint, last string"`` -> ``[("count", "bigint"), ("last", "string")]`` (types normalised)."""
    cols: list[tuple[str, str]] = []
    for part in (schema or "").split(","):
        part = part.strip()
        if not part:
            continue
        bits = part.split()
        if len(bits) != 2:
            raise ProcessorError(f"{what}: {part!r} is not 'name type' (e.g. 'count bigint')")
        name, typ = bits[0].strip("`"), bits[1].lower()
        if typ not in COLUMN_TYPES:
            raise ProcessorError(f"{what}: column {name!r} has type {typ!r}; use one of {', '.join(COLUMN_TYPES)}")
        if name in ("key", "key_group"):
            raise ProcessorError(f"{what}: column name {name!r} is reserved")
        cols.append((name, COLUMN_TYPES[typ]))
    if not cols and what == "state_schema":
        raise ProcessorError("state_schema: must name at least one column, e.g. 'count bigint'")
    if len({n for n, _ in cols}) != len(cols):
        raise ProcessorError(f"{what}: duplicate column names in {schema!r}")
    return cols


def result_column_type(result_type: str) -> str:
    typ = (result_type or "").strip().lower()
    if typ not in COLUMN_TYPES:
        raise ProcessorError(f"result_type: {result_type!r} is unknown; use one of {', '.join(COLUMN_TYPES)}")
    return COLUMN_TYPES[typ]


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
    state_columns(getattr(instance, "state_schema", ""))
    result_column_type(getattr(instance, "result_type", ""))
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


# ---------------------------------------------------------------- state tables (one per key group)


def state_arrow_schema(columns: list[tuple[str, str]]) -> Any:
    import pyarrow as pa

    return pa.schema([("key", pa.string())] + [(n, arrow_type(t)) for n, t in columns])


def encode_state_table(table: Any) -> bytes:
    """A key group's state table (``pyarrow.Table``: ``key`` + state columns) as Arrow IPC stream bytes."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_state_table(blob: bytes) -> Any:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def state_frame(table: Any | None, columns: list[tuple[str, str]]) -> pd.DataFrame:
    """A state table as a pandas DataFrame with exactly ``key`` + the state columns (single-threaded: one call
    handles one small key group, where Arrow's thread pool costs more than it saves)."""
    names = ["key"] + [n for n, _ in columns]
    if table is None or table.num_rows == 0:
        return state_arrow_schema(columns).empty_table().to_pandas(use_threads=False)[names]
    return pd.DataFrame({n: table.column(n).to_numpy(zero_copy_only=False) for n in names})


def frame_to_state_table(df: pd.DataFrame, columns: list[tuple[str, str]]) -> Any:
    import pyarrow as pa

    schema = state_arrow_schema(columns)
    arrays = [pa.array(df[f.name].to_numpy(), type=f.type, from_pandas=True) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def run_processor(
    proc: Processor, events: pd.DataFrame, state: pd.DataFrame, columns: list[tuple[str, str]]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Apply ``proc`` to one key group: ``state`` is the group's whole state table; returns the group's whole
    new state table and the outputs (``key``, ``result``). Enforces the contract of the module docstring."""
    event_keys = pd.unique(events["key"])
    in_events = state["key"].isin(event_keys)
    current = state[in_events].reset_index(drop=True)
    result = proc.process(events.reset_index(drop=True), current)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ProcessorError(f"{type(proc).__name__}.process must return (new_state, outputs), got {type(result)}")
    new_state, outputs = result
    names = ["key"] + [n for n, _ in columns]
    if new_state is None:
        new_state = pd.DataFrame({n: [] for n in names})
    missing = [n for n in names if n not in new_state.columns]
    if missing:
        raise ProcessorError(f"{type(proc).__name__}.process: new_state lacks columns {missing} (needs {names})")
    if new_state["key"].duplicated().any():
        dup = new_state["key"][new_state["key"].duplicated()].iloc[0]
        raise ProcessorError(f"{type(proc).__name__}.process: new_state has key {dup!r} more than once")
    stray = ~new_state["key"].isin(event_keys)
    if stray.any():
        raise ProcessorError(
            f"{type(proc).__name__}.process: new_state has key {new_state['key'][stray].iloc[0]!r}, which is not "
            "in events (only keys of this call's events may change)"
        )
    if outputs is None:
        outputs = pd.DataFrame({"key": [], "result": []})
    if "key" not in outputs.columns or "result" not in outputs.columns:
        raise ProcessorError(f"{type(proc).__name__}.process: outputs needs columns key and result")
    full = pd.concat([state[~in_events][names], new_state[names]], ignore_index=True)
    return full, outputs[["key", "result"]]
