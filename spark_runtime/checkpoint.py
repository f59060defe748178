"""Reading a shard's recovery log (its Spark checkpoint) without Spark: committed batches and positions.

Spark's checkpoint layout (``HDFSMetadataLog``): ``offsets/<N>`` is written when batch N is planned (first line
``v1``, then the batch metadata JSON, then one JSON line per source: that source's end offset for batch N);
``commits/<N>`` is written once batch N's state and sink output are committed. So the positions of the last
*committed* batch are the source lines of ``offsets/<max commits>``.

State: batch N commits version ``N + 1`` of every stateful partition's store, under
``state/<operator>/<partition>/`` (``<v>.changelog`` with changelog checkpointing, ``<v>.zip`` snapshots, ``<v>.delta``
for the HDFS-backed store; ``<v>_<id>.*`` with checkpoint format 2). A commit log that holds batch N while a
partition lacks version ``N + 1`` was written for a batch whose state never committed
(:func:`uncommitted_state`): a restart would look for that version and fail on every start.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from spark_runtime.storage import Loc, location

__all__ = [
    "batch_metadata",
    "last_batch",
    "last_committed_batch",
    "last_planned_batch",
    "next_watermark_ms",
    "read_offsets",
    "StateGap",
    "uncommitted_state",
]

_STATE_FILE = re.compile(r"^(\d+)(?:_[^.]*)?\.(?:changelog|zip|delta|snapshot)$")
"""A state store version file: ``<version>[_<unique id>].<kind>``."""


def _loc(where: Loc | str | os.PathLike[str]) -> Loc:
    return where if isinstance(where, Loc) else location(where)


def last_batch(directory: Loc | str | os.PathLike[str]) -> int:
    """The largest ``<N>`` file name in ``directory``; -1 when there is none (or no directory)."""
    names = [p.name for p in _loc(directory).iterdir()]
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else -1


def last_committed_batch(checkpoint: Loc | str | os.PathLike[str]) -> int:
    return last_batch(_loc(checkpoint) / "commits")


def last_planned_batch(checkpoint: Loc | str | os.PathLike[str]) -> int:
    return last_batch(_loc(checkpoint) / "offsets")


def read_offsets(checkpoint: Loc | str | os.PathLike[str], batch_id: int) -> list[Any]:
    """The per-source end offsets of ``batch_id`` (JSON-decoded, in Spark's source order)."""
    lines = (_loc(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ValueError(f"{checkpoint}/offsets/{batch_id}: not a Spark offset log file")
    return [json.loads(line) if line.strip() not in ("", "-") else None for line in lines[2:]]


def batch_metadata(checkpoint: Loc | str | os.PathLike[str], batch_id: int) -> dict[str, Any]:
    """The batch metadata of ``batch_id`` (the offset log's second line: ``batchWatermarkMs``,
    ``batchTimestampMs`` and the session conf Spark pinned)."""
    lines = (_loc(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise ValueError(f"{checkpoint}/offsets/{batch_id}: not a Spark offset log file")
    return json.loads(lines[1])


def next_watermark_ms(checkpoint: Loc | str | os.PathLike[str], batch_id: int) -> int:
    """The event-time watermark the batch after committed ``batch_id`` runs with: the commit log's
    ``nextBatchWatermarkMs`` (0 without a watermark, or for ``batch_id`` -1)."""
    if batch_id < 0:
        return 0
    lines = (_loc(checkpoint) / "commits" / str(batch_id)).read_text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise ValueError(f"{checkpoint}/commits/{batch_id}: not a Spark commit log file")
    return int(json.loads(lines[1]).get("nextBatchWatermarkMs", 0))


@dataclass(frozen=True)
class StateGap:
    """Committed batch ``batch`` has no state: ``version`` (``batch + 1``) is missing from ``partitions``
    (``state/<operator>/<partition>`` paths relative to the checkpoint)."""

    batch: int
    version: int
    partitions: tuple[str, ...]

    def describe(self) -> str:
        shown = ", ".join(self.partitions[:4]) + (
            f" and {len(self.partitions) - 4} more" if len(self.partitions) > 4 else ""
        )
        return (
            f"the commit log holds batch {self.batch}, but state version {self.version} (written when batch "
            f"{self.batch} commits its state) is missing from {shown}"
        )


def _versions(partition: Loc) -> set[int]:
    found = set()
    for entry in partition.iterdir():
        match = _STATE_FILE.match(entry.name)
        if match:
            found.add(int(match.group(1)))
    return found


def uncommitted_state(checkpoint: Loc | str | os.PathLike[str]) -> StateGap | None:
    """The state gap of the last committed batch (see the module docstring), or None when every stateful
    partition holds its version (or the query has no state, or nothing committed). Lists each partition once."""
    root = _loc(checkpoint)
    batch = last_committed_batch(root)
    if batch < 0:
        return None
    missing = []
    for operator in sorted((e for e in (root / "state").iterdir() if e.name.isdigit()), key=lambda e: int(e.name)):
        for partition in sorted((e for e in operator.iterdir() if e.name.isdigit()), key=lambda e: int(e.name)):
            versions = _versions(partition)
            if versions and batch + 1 not in versions:
                missing.append(f"state/{operator.name}/{partition.name}")
    return StateGap(batch, batch + 1, tuple(missing)) if missing else None
