"""The final per-key results of a task: read a sink directory plus the shard lineage.

Every shard writes ``<sink>/shard=<shard>/batch-<id>.*`` with the updated results of each micro-batch. A key's
latest result is the one from the deepest shard of its lineage (a child starts from its parent's state, so
its results supersede the parent's) and, within a shard, the highest batch id. Batches a parent wrote after
its drain's last committed batch (possible only when a drain had to stop mid-batch) are ignored: that work was
redone by the children.

Lineage comes from ``<storage>/<task>/shards/<shard>/lineage.json`` (written by each shard at start) and the
drain manifests; pass ``lineage`` explicitly to read a sink without the storage directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from spark_runtime.storage import Loc, location

__all__ = ["final_results", "final_results_from_records", "read_lineage", "read_sink"]


def read_lineage(storage: Loc | str | os.PathLike[str], task: str) -> dict[str, dict[str, Any]]:
    """``{shard: {"parent": name|None, "drainedBatch": id|None, "keyGroups": {...}}}`` from the storage root
    (a local path, or a :class:`~spark_runtime.storage.Loc` for S3)."""
    root = storage if isinstance(storage, Loc) else location(storage)
    out: dict[str, dict[str, Any]] = {}
    for d in (root / task / "shards").child_dirs():
        lineage_file = d / "lineage.json"
        if not lineage_file.is_file():
            continue
        info = lineage_file.read_json()
        drained = None
        if (d / "drained.json").is_file():
            drained = (d / "drained.json").read_json().get("batchId")
        out[d.name] = {"parent": info.get("parent"), "drainedBatch": drained, "keyGroups": info.get("keyGroups")}
    return out


def _depth(shard: str, lineage: dict[str, dict[str, Any]]) -> int:
    depth, seen = 0, set()
    cur = lineage.get(shard, {}).get("parent")
    while cur is not None and cur not in seen:
        seen.add(cur)
        depth += 1
        cur = lineage.get(cur, {}).get("parent")
    return depth


def read_sink(sink: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every output record under ``sink`` (JSON lines and Parquet), in no particular order."""
    records: list[dict[str, Any]] = []
    root = Path(sink)
    if not root.is_dir():
        return records
    for shard_dir in sorted(root.glob("shard=*")):
        for f in sorted(shard_dir.iterdir()):
            if f.name.startswith("."):
                continue
            if f.suffix == ".jsonl":
                with open(f, encoding="utf-8") as fh:
                    records.extend(json.loads(line) for line in fh if line.strip())
            elif f.suffix == ".parquet":
                import pyarrow.parquet as pq

                records.extend(pq.read_table(f).to_pylist())
    return records


def final_results(
    sink: str | os.PathLike[str],
    storage: Loc | str | os.PathLike[str] | None = None,
    task: str | None = None,
    *,
    lineage: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``{key: result}`` of a sink directory: the latest result per key across the lineage (see the module
    docstring)."""
    if lineage is None:
        if storage is None or task is None:
            raise ValueError("final_results needs storage and task, or an explicit lineage")
        lineage = read_lineage(storage, task)
    return final_results_from_records(read_sink(sink), lineage)


def final_results_from_records(records: Iterable[dict[str, Any]], lineage: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{key: result}`` from output records ``{"key", "shard", "batch", "result", ...}`` of any sink (the
    directory's files, the Kafka topic's values): per key, the record of the deepest shard of its lineage and,
    within it, the highest batch; batches after a shard's drained batch are dropped. Duplicates (a replayed
    batch written twice to Kafka) carry the same result, so their order does not matter."""
    best: dict[str, tuple[int, int, Any]] = {}
    for rec in records:
        shard = rec["shard"]
        batch = int(rec["batch"])
        info = lineage.get(shard, {})
        drained = info.get("drainedBatch")
        if drained is not None and batch > drained:
            continue
        rank = (_depth(shard, lineage), batch)
        key = rec["key"]
        cur = best.get(key)
        if cur is None or rank > cur[:2]:
            best[key] = (rank[0], rank[1], rec["result"])
    return {k: v[2] for k, v in best.items()}
