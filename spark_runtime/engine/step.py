"""One call of the user's processor in a micro-batch, the same in a shard and in the test harness.

:func:`process_group`: look up the state of the keys in ``events``, call the user's ``process`` under the
contract (:func:`~spark_runtime.engine.api.call_processor`), and store the touched keys' new rows (with their key
group, and their expiry under a TTL) and tombstones for the keys whose state was deleted, as one run. Returns the
outputs with each key's key group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from spark_runtime.engine.api import Processor, call_processor
from spark_runtime.engine.runs import GROUP, KEY
from spark_runtime.engine.state_layout import KeyGroupRuns

__all__ = ["process_group", "state_rows_frame"]

KEY_GROUP = "key_group"


def state_rows_frame(table: Any, names: list[str]) -> pd.DataFrame:
    """Arrow state rows as the ``state`` frame a processor receives (``key`` + ``names``)."""
    if table.num_rows == 0:
        return table.select([KEY] + names).to_pandas(use_threads=False)
    return pd.DataFrame({n: table.column(n).to_numpy(zero_copy_only=False) for n in [KEY] + names})


def process_group(
    state: KeyGroupRuns,
    proc: Processor,
    events: pd.DataFrame,
    event_columns: list[str],
    result_names: list[str],
    *,
    now_ms: int | None = None,
    ttl_ms: int | None = None,
) -> pd.DataFrame:
    """Run ``proc`` over ``events`` (in source order, with a ``key_group`` column; the processor sees
    ``event_columns``) against ``state``; returns the outputs: ``key``, ``key_group`` and ``result_names``.
    ``now_ms``: the batch's processing time (required with ``ttl_ms``)."""
    import pyarrow as pa

    schema = state.schema
    groups = events.drop_duplicates(KEY).set_index(KEY)[KEY_GROUP]
    found = state.read(groups.index.to_numpy(), now_ms=now_ms if ttl_ms is not None else None)
    current = state_rows_frame(found.rows, schema.names)
    new_state, outputs = call_processor(
        proc, events[event_columns], current, schema.names, result_names, pd.unique(groups.to_numpy())
    )
    new_state.insert(1, GROUP, groups.reindex(new_state[KEY]).to_numpy(dtype="int32"))
    target = pa.schema([f for f in state.run_schema if f.name in [KEY, GROUP, *schema.names]])
    table = schema.conform(pa.Table.from_pandas(new_state, preserve_index=False), target)
    written = set(new_state[KEY])
    expires = None
    if ttl_ms is not None:
        if now_ms is None:
            raise ValueError("a state TTL needs the batch's processing time")
        expires = np.full(table.num_rows, now_ms + ttl_ms, dtype="int64")
    state.write(table, [k for k in found.held if k not in written], expires=expires, now_ms=now_ms)
    outputs.insert(1, KEY_GROUP, groups.reindex(outputs[KEY]).to_numpy(dtype="int32"))
    return outputs
