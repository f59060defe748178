"""Sorted runs: the Python processor's state of one key group, stored so that a batch costs what it touches.

A key group's state is a short list of immutable **runs**, newest first. A run is an Arrow table sorted by the
key's 64-bit hash (column ``_h``), at most one row per key, with the key, a tombstone flag (``_deleted``), the
state columns as they were when the run was written, and (with a TTL) the row's expiry (``_expires``, epoch ms).
Its bytes are an Arrow IPC *file* (:meth:`Run.to_bytes`), so a cached copy on local disk is memory-mapped and read
without a copy.

- **Read** (:func:`lookup`): the keys of a batch are hashed once and binary-searched in each run, newest first; the
  first run that holds a key decides it (a tombstone or an expired row: the key has no state). The cost is the
  touched keys times the number of runs times ``log`` of a run's size, not the state's size.
- **Write** (:func:`build_run`): each batch adds one run with the new rows of the keys it touched and a tombstone
  for each touched key whose state was deleted (only where an older run holds it).
- **Compact** (:func:`compaction_span`, :func:`merge_runs`): after a write, the newest runs are merged while the
  one before them is not much larger (a size-tiered, logarithmic policy), so a key group keeps ``O(log(state /
  batch))`` runs and each row is rewritten ``O(log)`` times over its life; a merge that reaches the oldest run
  drops tombstones and expired rows.

Everything here is pure (pyarrow and numpy; no Spark, no I/O) and exact: hash collisions are resolved by comparing
keys, never assumed away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = [
    "DELETED",
    "EXPIRES",
    "GROUP",
    "HASH",
    "KEY",
    "HASH_SCHEME",
    "Run",
    "build_run",
    "compaction_span",
    "key_hashes",
    "lookup",
    "merge_runs",
]

KEY = "key"
HASH = "_h"
DELETED = "_deleted"
EXPIRES = "_expires"
"""Epoch milliseconds after which the row is expired (present only when the processor declares a TTL)."""
GROUP = "_kg"
"""The row's key group (a run may hold several key groups: the runs of a shard are kept per bucket of key groups;
null on tombstones)."""
RESERVED_COLUMNS = (KEY, HASH, DELETED, EXPIRES, GROUP)
BUILT_COLUMNS = (KEY, HASH, DELETED, EXPIRES)
"""The columns :func:`build_run` makes itself (the others, ``_kg`` and the state columns, come from its rows)."""

SEQ_META = b"taskshard.seq"
HASH_META = b"taskshard.hash"

MERGE_RATIO = 2
"""Merge the newest run into the one before it while that one holds at most this many times its rows."""
MAX_RUNS = 12
"""A key group never keeps more runs than this (the newest are merged first)."""


# ---------------------------------------------------------------- key hashes


def _hash(keys: Any) -> np.ndarray:
    import pandas as pd

    values = np.asarray(keys, dtype=object)
    return pd.util.hash_array(values, categorize=False).astype(np.uint64, copy=False)


_VECTOR = ("", "a", "key-1", "\u00e9t\u00e9")


def _scheme() -> str:
    """The name of the hash in use: the algorithm and its digest of a fixed test vector, so that a run hashed by
    another algorithm (another library version) is recognised and re-hashed instead of being searched wrongly."""
    digest = ",".join(f"{int(h):x}" for h in _hash(list(_VECTOR)))
    return f"siphash24/{digest}"


HASH_SCHEME = _scheme()


def key_hashes(keys: Any) -> np.ndarray:
    """The 64-bit hashes (``uint64``) of ``keys`` (strings), as stored in column ``_h``."""
    return _hash(keys)


# ---------------------------------------------------------------- runs


@dataclass(frozen=True)
class Run:
    """One immutable run (see the module docstring). ``table`` is sorted by ``_h``; ``seq`` orders runs (a larger
    one is newer)."""

    table: Any
    seq: int

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)

    @cached_property
    def hashes(self) -> np.ndarray:
        column = self.table.column(HASH)
        if column.num_chunks == 1:
            return column.chunk(0).to_numpy(zero_copy_only=False)
        return column.to_numpy()

    @cached_property
    def keys(self) -> Any:
        return self.table.column(KEY).combine_chunks()

    def to_bytes(self) -> bytes:
        """The run as an Arrow IPC file (its schema carries ``seq`` and the hash scheme)."""
        import pyarrow as pa

        meta = dict(self.table.schema.metadata or {})
        meta[SEQ_META] = str(self.seq).encode()
        meta[HASH_META] = HASH_SCHEME.encode()
        table = self.table.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    @staticmethod
    def from_buffer(buffer: Any) -> Run:
        """The run in ``buffer`` (bytes, a ``pyarrow.Buffer`` or a memory map: read without a copy). A run hashed
        by another scheme is re-hashed and re-sorted here (once per read)."""
        import pyarrow as pa

        source = buffer if isinstance(buffer, pa.NativeFile) else pa.BufferReader(buffer)
        table = pa.ipc.open_file(source).read_all()
        meta = table.schema.metadata or {}
        seq = int(meta.get(SEQ_META, b"0"))
        if meta.get(HASH_META, b"").decode() != HASH_SCHEME:
            table = _sorted_by_hash(table.drop_columns([HASH]), key_hashes(table.column(KEY).to_pylist()))
        return Run(table, seq)


def _sorted_by_hash(table: Any, hashes: np.ndarray) -> Any:
    import pyarrow as pa

    order = np.argsort(hashes, kind="stable")
    table = table.take(pa.array(order)) if len(order) else table
    return table.add_column(0, HASH, pa.array(hashes[order], pa.uint64()))


def run_schema(columns: Sequence[tuple[str, Any]], *, ttl: bool) -> Any:
    """The Arrow schema of a run with state columns ``columns`` (``(name, arrow type)``)."""
    import pyarrow as pa

    fields = [(HASH, pa.uint64()), (KEY, pa.string()), (DELETED, pa.bool_())]
    fields += [(EXPIRES, pa.int64())] if ttl else []
    return pa.schema(fields + [(GROUP, pa.int32())] + list(columns))


def build_run(state: Any, deleted: Sequence[str], schema: Any, seq: int, *, expires: Any = None) -> Run:
    """A run of the rows of ``state`` (``pyarrow.Table`` with ``key``, ``_kg`` and the state columns of ``schema``, one
    row per key) and a tombstone for each key of ``deleted`` (not among ``state``'s keys). ``expires`` (epoch ms, one
    per row of ``state``) is required when ``schema`` has ``_expires``."""
    import pyarrow as pa

    n_live, n_dead = state.num_rows, len(deleted)
    keys = pa.concat_arrays(
        [state.column(KEY).combine_chunks().cast(pa.string()), pa.array(list(deleted), pa.string())]
    )
    arrays: list[Any] = [keys, pa.array(np.r_[np.zeros(n_live, bool), np.ones(n_dead, bool)])]
    names = [KEY, DELETED]
    if EXPIRES in schema.names:
        if expires is None:
            raise ValueError("build_run: a run with a TTL needs the rows' expiry times")
        given = expires.cast(pa.int64()) if isinstance(expires, pa.Array) else pa.array(expires, pa.int64())
        arrays.append(pa.concat_arrays([given, pa.nulls(n_dead, pa.int64())]))
        names.append(EXPIRES)
    for f in schema:
        if f.name in BUILT_COLUMNS:
            continue
        live = state.column(f.name).combine_chunks().cast(f.type)
        arrays.append(pa.concat_arrays([live, pa.nulls(n_dead, f.type)]))
        names.append(f.name)
    table = pa.Table.from_arrays(arrays, names=names)
    hashed = _sorted_by_hash(table, key_hashes(keys.to_numpy(zero_copy_only=False)))
    return Run(hashed.select(schema.names).cast(schema), seq)


# ---------------------------------------------------------------- reads


@dataclass(frozen=True)
class Found:
    """The result of :func:`lookup`: ``rows`` (``pyarrow.Table``, the live state rows of the keys that have state,
    columns as in the runs that hold them, conformed by the caller) and ``held``, the keys some run decided (live,
    deleted or expired), whose deletion needs a tombstone."""

    rows: Any
    held: frozenset[str]


def lookup(runs: Sequence[Run], keys: Sequence[str], conform: Any, *, now_ms: int | None = None) -> Found:
    """The state of ``keys`` (distinct) in ``runs`` (newest first): per key, the row of the newest run that holds
    it, unless that row is a tombstone or expired at ``now_ms`` (rows with ``_expires <= now_ms``). ``conform`` maps
    a table of run rows (any schema a run was written with, or None for none) to the current schema; the result's
    rows are in that schema."""
    import pyarrow as pa

    query = np.asarray(list(keys), dtype=object)
    hashes = key_hashes(query)
    pending = np.arange(len(query))
    parts = []
    held: list[str] = []
    for run in runs:
        if not len(pending):
            break
        rows, matched = _find(run, query[pending], hashes[pending])
        if not len(rows):
            continue
        held += list(query[pending[matched]])
        pending = pending[~matched]
        table = run.table.take(pa.array(rows))
        live = _live_mask(table, now_ms)
        table = table.filter(pa.array(live)) if not live.all() else table
        if table.num_rows:
            parts.append(conform(table))
    if not parts:
        return Found(conform(None), frozenset(held))
    return Found(parts[0] if len(parts) == 1 else pa.concat_tables(parts), frozenset(held))


def _find(run: Run, keys: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row indices in ``run`` of those of ``keys`` it holds, and the mask of ``keys`` found (same order)."""
    h = run.hashes
    if not len(h):
        return np.empty(0, np.int64), np.zeros(len(keys), bool)
    at = np.searchsorted(h, hashes, side="left")
    inside = at < len(h)
    candidate = np.zeros(len(keys), bool)
    candidate[inside] = h[at[inside]] == hashes[inside]
    rows = np.full(len(keys), -1, np.int64)
    if candidate.any():
        idx = np.nonzero(candidate)[0]
        stored = run.keys.take(at[idx]).to_numpy(zero_copy_only=False)
        same = stored == keys[idx]
        rows[idx[same]] = at[idx[same]]
        for i in idx[~same]:  # another key with the same hash sits first: look through the equal-hash rows
            j = at[i] + 1
            while j < len(h) and h[j] == hashes[i]:
                if run.keys[j].as_py() == keys[i]:
                    rows[i] = j
                    break
                j += 1
    matched = rows >= 0
    return rows[matched], matched


def _live_mask(table: Any, now_ms: int | None) -> np.ndarray:
    live = ~table.column(DELETED).to_numpy(zero_copy_only=False).astype(bool)
    if now_ms is not None and EXPIRES in table.column_names:
        expires = table.column(EXPIRES).to_numpy(zero_copy_only=False)
        live &= ~(np.nan_to_num(expires.astype("float64"), nan=np.inf) <= now_ms)
    return live


# ---------------------------------------------------------------- compaction


def compaction_span(sizes: Sequence[int]) -> int:
    """How many of the newest runs to merge into one after a write (1: none). ``sizes`` are the runs' rows, oldest
    first. The newest run absorbs the one before it while that one holds at most :data:`MERGE_RATIO` times its rows,
    and while there are more than :data:`MAX_RUNS` runs."""
    span = 1
    merged = sizes[-1] if sizes else 0
    i = len(sizes) - 2
    while i >= 0 and (sizes[i] <= MERGE_RATIO * merged or len(sizes) - span + 1 > MAX_RUNS):
        merged += sizes[i]
        span += 1
        i -= 1
    return span


def merge_runs(
    runs: Sequence[Run], schema: Any, *, oldest: bool, now_ms: int | None = None, conform: Any = None
) -> Run:
    """One run holding what ``runs`` (newest first, a contiguous newest part of a key group's runs) hold: per key the
    newest row. ``oldest``: the merge includes the group's oldest run, so tombstones and rows expired at ``now_ms``
    are dropped (nothing older can hold their keys). ``conform`` maps each run to ``schema``."""
    import pyarrow as pa

    tables = [conform(r.table) if conform is not None else r.table.select(schema.names).cast(schema) for r in runs]
    table = pa.concat_tables(tables)
    newest_seq = max(r.seq for r in runs)
    if table.num_rows == 0:
        return Run(table, newest_seq)
    h = table.column(HASH).to_numpy()
    order = np.argsort(h, kind="stable")  # equal hashes keep newest-first order
    sh = h[order]
    keep = np.ones(len(order), bool)
    same_hash = np.nonzero(sh[1:] == sh[:-1])[0] + 1
    if len(same_hash):
        keys = table.column(KEY).take(pa.array(order[same_hash])).to_pylist()
        prev = table.column(KEY).take(pa.array(order[same_hash - 1])).to_pylist()
        for pos, k, p in zip(same_hash, keys, prev, strict=True):
            if k == p:
                keep[pos] = False
            else:  # a collision run: keep the first row of each key among the equal hashes
                start = pos
                while start > 0 and sh[start - 1] == sh[pos]:
                    start -= 1
                earlier = table.column(KEY).take(pa.array(order[start:pos])).to_pylist()
                keep[pos] = k not in earlier
    picked = table.take(pa.array(order[keep]))
    if oldest:
        live = _live_mask(picked, now_ms)
        if not live.all():
            picked = picked.filter(pa.array(live))
    return Run(picked, newest_seq)
