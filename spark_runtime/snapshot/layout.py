"""Where a key-group-indexed state snapshot keeps its files: one directory per key group.

A snapshot's ``state/`` directory holds Parquet files partitioned by key group, the way Spark's
``partitionBy("key_group")`` writes them::

    state/key_group=<n>/<part>.parquet      one or more files per key group that holds state

This module is the only place that names those directories: the export (:mod:`spark_runtime.snapshot.export`),
the rehearsal's synthetic snapshot, the verification (:mod:`spark_runtime.snapshot.manifest`) and the seed
source that restores a slice (:mod:`spark_runtime.sources.seed`) all go through it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import overload

from spark_runtime.storage import Loc, location

__all__ = ["PARTITION_COLUMN", "key_group_dir", "key_group_of", "parquet_files", "slice_dirs"]

PARTITION_COLUMN = "key_group"
"""The snapshot's partition column (``int``): the key group of each state row."""

_KG_DIR = re.compile(rf"^{PARTITION_COLUMN}=(\d+)$")


def _loc(where: Loc | str | Path) -> Loc:
    return where if isinstance(where, Loc) else location(where)


@overload
def key_group_dir(state_dir: Loc, key_group: int) -> Loc: ...
@overload
def key_group_dir(state_dir: Path, key_group: int) -> Path: ...
def key_group_dir(state_dir: Loc | Path, key_group: int) -> Loc | Path:
    """The directory of ``key_group``'s files in ``state_dir`` (same type as ``state_dir``)."""
    return state_dir / f"{PARTITION_COLUMN}={int(key_group)}"


def key_group_of(name: str) -> int | None:
    """The key group a directory name ``key_group=<n>`` stands for; None for any other name."""
    m = _KG_DIR.match(name)
    return int(m.group(1)) if m else None


def slice_dirs(state_dir: Loc | str | Path, start: int, end: int) -> dict[int, Loc]:
    """The key-group directories of a snapshot with ``start <= n < end``, in key-group order (one listing)."""
    out = {}
    for child in _loc(state_dir).child_dirs():
        kg = key_group_of(child.name)
        if kg is not None and start <= kg < end:
            out[kg] = child
    return dict(sorted(out.items()))


def parquet_files(kg_dir: Loc | str | Path) -> list[Loc]:
    """The Parquet part files of one key-group directory (Spark's hidden and marker files excluded)."""
    return [p for p in _loc(kg_dir).iterdir() if p.name.endswith(".parquet") and not p.name.startswith((".", "_"))]
