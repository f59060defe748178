"""What runs inside a shard: the user's processor API, the state layouts it runs on, and (next) time.

- :mod:`~spark_runtime.engine.api`: :class:`Processor` and its contract, ``process(events, state)`` over many
  keys per call; the builtin twins :class:`CountProcessor` and :class:`SumProcessor`.
- :mod:`~spark_runtime.engine.schema`: state and result schemas, defaults, and the rules by which a state schema
  may change while state exists.
- State layouts of the Python processor in Spark's state store (RocksDB):

  - ``runs`` (every new checkpoint): per key group a short list of immutable sorted runs
    (:mod:`~spark_runtime.engine.runs`) in ``transformWithStateInPandas`` state
    (:mod:`~spark_runtime.engine.state_layout`, :mod:`~spark_runtime.engine.stateful`), read through a local
    memory-mapped copy (:mod:`~spark_runtime.engine.run_cache`). A batch reads and writes what it touches.
  - ``blob`` (checkpoints written before the runs layout): per key group one Arrow table
    (:mod:`~spark_runtime.engine.blob`); a batch rewrites every key of the groups it touches.

  Why runs: ``docs/benchmarks.md`` (state layouts) measures them against the blob and two per-key
  ``transformWithState`` layouts.

The builtins (count, sum, min, max, with or without windows) do not use this package: they are Spark's native
aggregation (:mod:`spark_runtime.pipeline`, :mod:`spark_runtime.windows`).
"""

from dataclasses import dataclass
from typing import Any

from spark_runtime.engine.api import CountProcessor, Processor, ProcessorError, SumProcessor

__all__ = [
    "LAYOUTS",
    "NEW_LAYOUT",
    "CountProcessor",
    "Processor",
    "ProcessorError",
    "StateLayout",
    "SumProcessor",
    "checkpoint_layout",
    "record_layout",
]

LAYOUTS = ("runs", "blob")
NEW_LAYOUT = "runs"


@dataclass(frozen=True)
class StateLayout:
    """A checkpoint's state layout: ``runs`` (with its number of buckets of key groups) or ``blob``."""

    layout: str
    buckets: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout, **({"buckets": self.buckets} if self.layout == "runs" else {})}


def checkpoint_layout(marker: Any, committed: int, buckets: int) -> StateLayout:
    """The state layout of a shard's checkpoint: the one its ``marker`` (``state-layout.json`` in the shard's
    directory, a :class:`~spark_runtime.storage.Loc`) names; else ``blob`` for a checkpoint with a committed batch
    (``committed`` >= 0; written before the marker existed); else :data:`NEW_LAYOUT` with ``buckets`` (recorded by
    :func:`record_layout` before the first batch)."""
    if marker.exists():
        data = marker.read_json()
        layout = str(data.get("layout"))
        if layout not in LAYOUTS:
            raise ValueError(f"{marker.uri()}: unknown state layout {layout!r} (known: {', '.join(LAYOUTS)})")
        return StateLayout(layout, int(data.get("buckets", 0)))
    return StateLayout("blob") if committed >= 0 else StateLayout(NEW_LAYOUT, buckets)


def record_layout(marker: Any, committed: int, buckets: int) -> StateLayout:
    """:func:`checkpoint_layout`, recorded in ``marker`` by an exclusive create when the checkpoint has no committed
    batch and no marker yet (a concurrent start that recorded first wins). Call before the query starts."""
    layout = checkpoint_layout(marker, committed, buckets)
    if committed < 0 and not marker.exists() and not marker.create_exclusive_json(layout.to_json()):
        return checkpoint_layout(marker, committed, buckets)
    return layout
