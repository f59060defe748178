"""The blob layout (``python/blob``): each key group's whole state as one Arrow IPC table in one state row.

This was the Python processor's only layout; it stays for shards whose checkpoint holds it (their next hand-over
moves them to the runs layout, :mod:`spark_runtime.engine.stateful`) and as the reference in the benchmark
``bench/state_layouts.py``. A batch that touches a key group decodes, rebuilds and re-encodes all of that group's
keys and writes the whole table into the state store's changelog: its cost grows with the state, not with the batch.

``groupBy(key_group).applyInPandasWithState`` calls :func:`make_group_function`'s function once per key group per
batch; the state row is ``(state binary)``. Seeded by one blob per key group (batch 0 of a restored child).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from spark_runtime.engine.api import cached_processor, call_processor
from spark_runtime.engine.schema import StateSchema
from spark_runtime.engine.step import split_held
from spark_runtime.records import arrow_type

__all__ = [
    "decode_state_table",
    "encode_state_table",
    "frame_to_state_table",
    "make_group_function",
    "run_processor",
    "state_frame",
]


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
    proc: Any,
    events: pd.DataFrame,
    state: pd.DataFrame,
    columns: list[tuple[str, str]],
    results: list[str] | None = None,
    key_group: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Apply ``proc`` to one key group: ``state`` is the group's whole state table; returns the group's whole
    new state table and the outputs (``key`` + ``results``, default ``result``)."""
    names = ["key"] + [n for n, _ in columns]
    event_keys = pd.unique(events["key"])
    in_events = state["key"].isin(event_keys)
    new_state, outputs = call_processor(
        proc,
        events,
        state[in_events],
        [n for n, _ in columns],
        results if results is not None else ["result"],
        () if key_group is None else (key_group,),
    )
    full = pd.concat([state[~in_events][names], new_state[names]], ignore_index=True)
    return full, outputs


def make_group_function(
    ref: str, params_json: str, schema: StateSchema, event_columns: list[str], result_names: list[str]
) -> Any:
    """The ``applyInPandasWithState`` function: one call per key group per micro-batch."""
    columns = schema.pairs

    def process_key_group(key: tuple, frames: Any, state: Any) -> Any:
        import warnings

        import numpy as np

        # pyspark's worker concatenates our output frames; pandas 2.x warns about all-NA columns there.
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*concatenation with empty or all-NA")

        proc = cached_processor(ref, params_json)
        pdf = pd.concat(list(frames), ignore_index=True)
        group = int(key[0])
        table = decode_state_table(state.get[0]) if state.exists else None
        current = state_frame(table, columns)
        seeded = pdf["seed"].notna()
        if seeded.any():  # batch 0 of a restored child: install the parent's slice
            parts = [current] + [state_frame(_conformed(schema, b), columns) for b in pdf.loc[seeded, "seed"]]
            current = pd.concat(parts, ignore_index=True)
            pdf = pdf[~seeded]
        order = np.lexsort((pdf["offset"].to_numpy(), pdf["partition"].to_numpy()))  # source order per partition
        held, ordered = split_held(pdf.take(order).reset_index(drop=True))
        if len(held):  # a catch-up child's records before its parent's final positions: state only
            current, _ = run_processor(proc, held[event_columns], current, columns, result_names, group)
        events = ordered[event_columns]
        outputs = None
        if len(events):
            current, outputs = run_processor(proc, events, current, columns, result_names, group)
        if len(current):
            state.update((encode_state_table(frame_to_state_table(current, columns)),))
        elif state.exists:
            state.remove()
        if outputs is not None and len(outputs):
            out = outputs.copy()
            out["key"] = out["key"].astype(str)
            out.insert(1, "key_group", group)
            yield out

    return process_key_group


def _conformed(schema: StateSchema, blob: bytes) -> Any:
    return schema.conform(decode_state_table(blob), state_arrow_schema(schema.pairs))
