"""Where a shard keeps things: one module for every path, so nothing else builds paths by hand.

Storage root (``storage.path``, or ``s3a://<bucket>/<prefix>`` for ``storage.s3``), per
docs/design-contracts.md::

    <root>/<task>/shards/<shard>/
        checkpoint/                     Spark checkpoint = the shard's recovery log (offsets, commits, state)
        progress.json                   last committed batch: id, time, source positions, counts
        lineage.json                    range, parent and restore manifest (written at start)
        restore-plan.json               a split or merged child's verified restore plan (before its first batch;
                                        every start after its first commit reads it instead of its parents')
        standby.json                    a split child's standby: when it began, was warm, saw the parent drained
        start-positions.json            a fresh shard's concrete start positions (Kafka earliest/latest resolved
                                        once, before its first query; written once, read on every start)
        drain-requested                 drain marker: the journal source admits no new data once it exists
        drained.json                    the termination summary of a finished drain (a drained shard never
                                        processes again; a restart re-reports this and exits 0)
        handover/                       a hand-over in progress, as the parent: its successors' requests and
                                        readiness notes (request-<child>.<epoch>.json, ready-<child>.<epoch>.json:
                                        scoped to the successor's writer epoch), the pre-copy pointer
        catch-up.json                   a split child catching up: its cap and its parent's final positions
        epochs/<epoch>.json             writer epochs, one per runtime start, created only if absent: a runtime
                                        stops writing once a later epoch exists (spark_runtime.fencing)
        restore/kg-<n>.json             what the seed reader opened for key group n (files, bytes, rows)
        snapshots/batch-<id>.<epoch>/   a snapshot of batch <id>, written by writer epoch <epoch> alone
            state/key_group=<n>/*.parquet   the key-group-indexed state snapshot
            manifest.json                   written last: its presence marks the snapshot complete

Sink directory (``sink.directory.path``)::

    <sink>/shard=<shard>/batch-<id>.jsonl | .parquet           results of micro-batch <id> of <shard>, published
                                                               (renamed into place) only once <id> is committed
    <sink>/shard=<shard>/_pending/<epoch>/batch-<id>.jsonl     written by foreachBatch before the commit, in the
                                                               writer epoch's own directory; hidden from readers
                                                               (a leading "_"), see spark_runtime.sink
    <sink>/_dead_letters/shard=<shard>/p<N>-<start>-<end>.jsonl dead letters of journal partition N,
                                                               byte range [start, end)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_runtime import protocol
from spark_runtime.storage import Loc, location

__all__ = [
    "ShardPaths",
    "SinkPaths",
    "batch_file_name",
    "parse_batch_file_name",
    "read_json",
    "write_atomic",
    "write_json_atomic",
]


def snapshot_name(batch_id: int, epoch: int | None = None) -> str:
    """``batch-7.3``: the snapshot of batch 7 written by writer epoch 3 (``batch-initial.3`` for a drain before the
    first committed batch, id -1); without an epoch the name an older runtime used (``batch-7``)."""
    name = f"batch-{batch_id}" if batch_id >= 0 else "batch-initial"
    return name if epoch is None else f"{name}.{epoch}"


def parse_snapshot_name(name: str) -> tuple[int, int | None] | None:
    """``(batch_id, epoch)`` of a snapshot directory's name (:func:`snapshot_name`), None for any other name."""
    if not name.startswith("batch-"):
        return None
    stem, dot, epoch = name[len("batch-") :].partition(".")
    if dot and not epoch.isdigit():
        return None
    if stem == "initial":
        batch = -1
    elif stem.isdigit():
        batch = int(stem)
    else:
        return None
    return batch, int(epoch) if dot else None


@dataclass(frozen=True)
class ShardPaths:
    """Locations of one shard under the storage root (local directory or S3, see :mod:`spark_runtime.storage`)."""

    root: Loc
    task: str
    shard: str

    @classmethod
    def of(cls, root: Loc | str | os.PathLike[str], task: str, shard: str) -> ShardPaths:
        return cls(root if isinstance(root, Loc) else location(root), task, shard)

    @property
    def task_dir(self) -> Loc:
        return self.root / self.task

    @property
    def shard_dir(self) -> Loc:
        return self.root / self.task / "shards" / self.shard

    @property
    def checkpoint(self) -> Loc:
        return self.shard_dir / "checkpoint"

    @property
    def progress(self) -> Loc:
        return self.shard_dir / "progress.json"

    @property
    def lineage(self) -> Loc:
        return self.shard_dir / "lineage.json"

    @property
    def drain_marker(self) -> Loc:
        return self.shard_dir / protocol.DRAIN_MARKER

    @property
    def drained(self) -> Loc:
        return self.shard_dir / protocol.DRAIN_SUMMARY

    @property
    def handover_dir(self) -> Loc:
        return self.shard_dir / protocol.HANDOVER_DIR

    @property
    def late_letters(self) -> Loc:
        """``dead-letters/``: late records' dead letters of a shard without a local dead-letter directory (a Kafka
        sink with S3 storage; :mod:`spark_runtime.late`)."""
        return self.shard_dir / "dead-letters"

    @property
    def time_mode(self) -> Loc:
        """``time-mode.json``: the Spark ``timeMode`` of the Python processor's checkpoint (``None``,
        ``EventTime``, ``ProcessingTime``), recorded at its first start and checked at every later one."""
        return self.shard_dir / "time-mode.json"

    @property
    def state_schema(self) -> Loc:
        """``state-schema.json``: the Python processor's state schema the shard's state is written with (its
        columns with defaults, and the names retired by drops), checked at every start
        (:meth:`spark_runtime.shard.ShardRunner.prepare`)."""
        return self.shard_dir / "state-schema.json"

    @property
    def state_layout(self) -> Loc:
        """``state-layout.json``: the Python processor's state layout in this shard's checkpoint, written once
        before its first batch (:func:`spark_runtime.engine.choose_layout`)."""
        return self.shard_dir / "state-layout.json"

    def handover_request(self, child: str, epoch: int | None = None) -> Loc:
        """A successor's request note, scoped to the successor's writer epoch."""
        return self.handover_dir / protocol.request_name(child, epoch)

    def handover_ready(self, child: str, epoch: int | None = None) -> Loc:
        """A successor's ready note, scoped to the successor's writer epoch."""
        return self.handover_dir / protocol.ready_name(child, epoch)

    @property
    def precopy(self) -> Loc:
        return self.handover_dir / protocol.PRECOPY_POINTER

    @property
    def catch_up(self) -> Loc:
        return self.shard_dir / protocol.CATCH_UP_STATE

    @property
    def epochs(self) -> Loc:
        return self.shard_dir / protocol.EPOCHS_DIR

    def epoch(self, epoch: int) -> Loc:
        return self.epochs / protocol.epoch_name(epoch)

    @property
    def standby(self) -> Loc:
        return self.shard_dir / "standby.json"

    @property
    def start_positions(self) -> Loc:
        return self.shard_dir / "start-positions.json"

    @property
    def restore_plan(self) -> Loc:
        """``restore-plan.json``: a split or merged child's verified restore plan, recorded before its first batch
        (:func:`spark_runtime.snapshot.restore.recorded_plan`); every start after its first commit uses it."""
        return self.shard_dir / "restore-plan.json"

    @property
    def restore_report_dir(self) -> Loc:
        return self.shard_dir / "restore"

    @property
    def snapshots(self) -> Loc:
        return self.shard_dir / "snapshots"

    def snapshot_dir(self, batch_id: int, epoch: int | None = None) -> Loc:
        """``snapshots/batch-<id>.<epoch>/``: one writer epoch's snapshot of a batch (only that epoch's runtime
        writes anything in it or removes it while incomplete; a complete one never changes, and only the shard's
        retention removes it, :mod:`spark_runtime.snapshot.retention`)."""
        return self.snapshots / snapshot_name(batch_id, epoch)

    def state_dir(self, batch_id: int, epoch: int | None = None) -> Loc:
        return self.snapshot_dir(batch_id, epoch) / "state"

    def manifest(self, batch_id: int, epoch: int | None = None) -> Loc:
        return self.snapshot_dir(batch_id, epoch) / "manifest.json"

    def complete_snapshots(self, batch_id: int) -> dict[int | None, Loc]:
        """``{epoch: manifest}`` of every complete snapshot of ``batch_id`` (its manifest exists: written last)."""
        found: dict[int | None, Loc] = {}
        if not self.snapshots.exists():
            return found
        for d in self.snapshots.child_dirs():
            parsed = parse_snapshot_name(d.name)
            if parsed is not None and parsed[0] == batch_id and (d / "manifest.json").exists():
                found[parsed[1]] = d / "manifest.json"
        return found

    def shard_path(self, name: str) -> ShardPaths:
        """Paths of another shard of the same task (a parent or a child)."""
        return ShardPaths(self.root, self.task, name)


_BATCH_FILE = re.compile(r"batch-(\d+)\.(jsonl|parquet)")


def batch_file_name(batch_id: int, fmt: str) -> str:
    """``batch-7.jsonl``: the name of a batch's results file, pending or published."""
    return f"batch-{batch_id}.{fmt}"


def parse_batch_file_name(name: str) -> tuple[int, str] | None:
    """``(7, "jsonl")`` for ``batch-7.jsonl``; None for any other name (temporary files, directories)."""
    m = _BATCH_FILE.fullmatch(name)
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass(frozen=True)
class SinkPaths:
    """Paths of one shard under the sink directory."""

    root: Path
    shard: str

    @classmethod
    def of(cls, root: str | os.PathLike[str], shard: str) -> SinkPaths:
        return cls(Path(root).absolute(), shard)

    @property
    def results_dir(self) -> Path:
        return self.root / f"shard={self.shard}"

    def batch_file(self, batch_id: int, fmt: str) -> Path:
        """The published results of committed batch ``batch_id`` (what any reader of the sink reads)."""
        return self.results_dir / batch_file_name(batch_id, fmt)

    @property
    def pending_dir(self) -> Path:
        """Batches written but not known committed yet; Spark, Hadoop and pyarrow skip ``_``-prefixed paths. Each
        writer epoch writes into a directory of its own below it (:meth:`epoch_pending_dir`); files right in it
        are an older runtime's."""
        return self.results_dir / "_pending"

    def epoch_pending_dir(self, epoch: int | None) -> Path:
        """``_pending/<epoch>/``: the pending batches of one writer epoch (``_pending/`` itself for None)."""
        return self.pending_dir if epoch is None else self.pending_dir / str(epoch)

    def pending_file(self, batch_id: int, fmt: str, epoch: int | None = None) -> Path:
        return self.epoch_pending_dir(epoch) / batch_file_name(batch_id, fmt)

    def pending_epochs(self) -> dict[int | None, Path]:
        """Every directory of pending batches: ``{epoch: dir}`` (None: files of an older runtime right in
        ``_pending/``)."""
        found: dict[int | None, Path] = {}
        try:
            entries = list(os.scandir(self.pending_dir))
        except FileNotFoundError:
            return found
        if any(e.is_file() for e in entries):
            found[None] = self.pending_dir
        for e in entries:
            if e.is_dir() and e.name.isdigit():
                found[int(e.name)] = Path(e.path)
        return found

    @property
    def dead_letter_dir(self) -> Path:
        return self.root / "_dead_letters" / f"shard={self.shard}"


def write_atomic(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` all-or-nothing: a temporary file in the same directory, then ``os.replace``.

    A reader sees the old content or the new one, never a torn file; a crash leaves at most a ``.tmp-*`` file.
    (The local case of :meth:`spark_runtime.storage.Loc.write_bytes`.)
    """
    location(path).write_bytes(data, fsync=fsync)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, fsync: bool = True) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), fsync=fsync)


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)
