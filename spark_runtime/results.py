"""The final per-key results of a task: read a sink directory plus the shard lineage.

Every shard publishes ``<sink>/shard=<shard>/batch-<id>.*`` with the updated results of each committed
micro-batch (:mod:`spark_runtime.sink`: a batch is written under ``_pending/`` and renamed into place once
committed, so any reader of the directory sees committed batches only, each once). A key's latest result is the
one from the deepest shard of its lineage (a child starts from its parent's state, so its results supersede the
parent's) and, within a shard, the highest batch id. Batches of a parent after its drain's last committed batch
are ignored: that work was redone by the children (the sink never publishes them; the rule also covers sinks
written before batches were published on commit).

A running shard publishes its latest committed batch only when its next batch starts (or it stops). Given the
storage root, :func:`final_results` also reads each shard's pending batches up to the last commit in its
recovery log, so it is current as soon as a batch commits; a plain read of the directory lags by that batch.

Lineage comes from ``<storage>/<task>/shards/<shard>/lineage.json`` (written by each shard at start) and the
drain manifests; pass ``lineage`` explicitly to read a sink without the storage directory (published batches
only).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.layout import SinkPaths, parse_batch_file_name
from spark_runtime.storage import Loc, location

__all__ = ["final_results", "final_results_from_records", "read_committed", "read_lineage", "read_sink"]


def read_lineage(storage: Loc | str | os.PathLike[str], task: str) -> dict[str, dict[str, Any]]:
    """``{shard: {"parent": name|None, "parents": [names], "drainedBatch": id|None, "keyGroups": {...}}}`` from the
    storage root (a local path, or a :class:`~spark_runtime.storage.Loc` for S3)."""
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
        parents = info.get("parents")
        if parents is None:  # lineage written before merges: one parent or none
            parents = [info["parent"]] if info.get("parent") else []
        out[d.name] = {
            "parent": info.get("parent"),
            "parents": list(parents),
            "drainedBatch": drained,
            "keyGroups": info.get("keyGroups"),
        }
    return out


def _depth(shard: str, lineage: dict[str, dict[str, Any]], seen: frozenset[str] = frozenset()) -> int:
    """How many generations ``shard`` is below its oldest ancestor: a split child is one deeper than its parent, a
    merged child one deeper than the deeper of its two parents (its state supersedes both)."""
    info = lineage.get(shard, {})
    parents = info.get("parents")
    if parents is None:
        parents = [info["parent"]] if info.get("parent") else []
    parents = [p for p in parents if p not in seen]
    if not parents:
        return 0
    return 1 + max(_depth(p, lineage, seen | {shard}) for p in parents)


def read_committed(storage: Loc | str | os.PathLike[str], task: str) -> dict[str, int]:
    """``{shard: last committed batch id}`` from each shard's recovery log (-1: nothing committed yet)."""
    root = storage if isinstance(storage, Loc) else location(storage)
    return {d.name: last_committed_batch(d / "checkpoint") for d in (root / task / "shards").child_dirs()}


def read_sink(sink: str | os.PathLike[str], committed: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Every published output record under ``sink`` (JSON lines and Parquet), in no particular order: what a
    plain Spark or pandas read of the directory sees. With ``committed`` (``{shard: last committed batch}``, see
    :func:`read_committed`), also the records of each shard's committed batches not published yet."""
    records: list[dict[str, Any]] = []
    root = Path(sink)
    if not root.is_dir():
        return records
    for shard_dir in sorted(root.glob("shard=*")):
        shard = shard_dir.name.partition("=")[2]
        # Pending before published: a batch renamed in between is then found at least once (and read once).
        files: dict[str, Path] = {}
        last = (committed or {}).get(shard, -1)
        pending = SinkPaths(root, shard).pending_epochs() if last >= 0 else {}
        for epoch in sorted(pending, key=lambda e: -1 if e is None else e):  # a later epoch's file wins
            for f in pending[epoch].iterdir():
                parsed = parse_batch_file_name(f.name)
                if f.is_file() and parsed is not None and parsed[0] <= last:
                    files[f.name] = f
        for f in shard_dir.iterdir():
            if f.is_file() and not f.name.startswith((".", "_")):
                files[f.name] = f
        for name in sorted(files):
            records.extend(_read_results_file(files[name], shard_dir / name))
    return records


def _read_results_file(path: Path, published: Path) -> list[dict[str, Any]]:
    """The records of one results file; a pending file renamed away meanwhile is read at its published name."""
    try:
        return _read_records(path)
    except FileNotFoundError:
        if path == published:
            raise
        return _read_records(published)


def _read_records(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return []


def final_results(
    sink: str | os.PathLike[str],
    storage: Loc | str | os.PathLike[str] | None = None,
    task: str | None = None,
    *,
    lineage: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``{key: result}`` of a sink directory: the latest result per key across the lineage (see the module
    docstring). With ``storage`` and ``task``, committed batches a running shard has not published yet count."""
    if lineage is None:
        if storage is None or task is None:
            raise ValueError("final_results needs storage and task, or an explicit lineage")
        lineage = read_lineage(storage, task)
    committed = read_committed(storage, task) if storage is not None and task is not None else None
    return final_results_from_records(read_sink(sink, committed), lineage)


def final_results_from_records(records: Iterable[dict[str, Any]], lineage: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{key: result}`` from output records ``{"key", "shard", "batch", "result", ...}`` of any sink (several
    result columns: ``{key: {column: value}}``; the
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
            best[key] = (rank[0], rank[1], result_of(rec))
    return {k: v[2] for k, v in best.items()}


RECORD_ENVELOPE = ("key", "key_group", "shard", "batch")


def result_of(record: dict[str, Any]) -> Any:
    """A record's result: its ``result`` field, or, for a processor with several result columns, those as a dict."""
    if "result" in record:
        return record["result"]
    return {k: v for k, v in record.items() if k not in RECORD_ENVELOPE}
