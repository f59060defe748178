"""The split protocol's contract: every name, file and record the operator and the shard runtime share.

Pure: no Spark, no Kubernetes client, no I/O. The runtime (:mod:`spark_runtime.handover`,
:mod:`spark_runtime.layout`, :mod:`spark_runtime.shard`) and the operator (``taskshard_operator.builders``,
``taskshard_operator.status``) both import it, so a file name or a summary field is spelled in one place.

Files of a split (under ``<root>/<task>/shards/``; see ``docs/split-protocol.md`` for the sequence)::

    <parent>/handover/request-<child>.json   a child asks to take over its range (HandoverNote, mode)
    <parent>/handover/precopy.json           the parent's answer to a catch-up request: the manifest of a
                                             snapshot of its latest committed batch, exported while it runs
    <parent>/handover/ready-<child>.json     a child has caught up (catch-up) or is warm (restore)
    <parent>/drained.json                    the parent's final drain summary (DrainSummary): its final
                                             batch and positions; written after its query stopped for good
    <child>/catch-up.json                    the child's catch-up state (CatchUpState): what it may read and
                                             from which positions on it emits

A merge: a merged child (``mergeFrom``: two adjacent parents) writes its request and ready note into **each**
parent's ``handover/``; each parent drains when the notes cover its range, as for a split. In catch-up mode (the
journal, Kafka) each parent answers with a pre-copy, the child restores both and follows both
(:class:`MergeCatchUpState`) before it says ready; in restore mode it restores both final snapshots once both
``drained.json`` exist. Two parents that read the same partitions stop at different positions: the child starts
each partition at the lower of the two and skips, per key group, the rows below its own parent's position
(:class:`SkipRule`).

An abort (``run --abort-split``, a split withdrawn before ``drained.json`` exists) claims the next writer epoch of
each child (fencing it), removes everything else in the children's directories and the parent's ``handover/``,
and reports a SplitAbortSummary; the parent resumes from its recovery log.

The writer fence (every shard, split or not; :mod:`spark_runtime.fencing`)::

    <shard>/epochs/<epoch>.json              one per start of the shard's runtime (WriterEpoch), created only
                                             if absent: epochs are dense (1, 2, 3, ...), and a writer holding
                                             epoch e is fenced as soon as <e+1>.json exists
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "CATCH_UP_STATE",
    "DRAIN_MARKER",
    "DRAIN_SUMMARY",
    "HANDOVER_DIR",
    "PRECOPY_POINTER",
    "CatchUpPhase",
    "CatchUpState",
    "HELD_RIGHT_COLUMN",
    "MergeCatchUpState",
    "read_catch_up",
    "DrainSummary",
    "EPOCHS_DIR",
    "FailureSummary",
    "POD_UID_ENV",
    "RUN_CACHE_BYTES_ENV",
    "MergeAbortOutcome",
    "MergeAbortSummary",
    "PruneSummary",
    "StandbyStopSummary",
    "WriterEpoch",
    "epoch_name",
    "parse_epoch_name",
    "HandoverConflict",
    "HandoverMode",
    "HandoverNote",
    "choose_successors",
    "parse_note_name",
    "SkipRule",
    "SplitAbortSummary",
    "SummaryEvent",
    "at_or_after",
    "lowest_positions",
    "clamp",
    "drain_summary_uri",
    "ready_name",
    "request_name",
]

POD_UID_ENV = "POD_UID"
"""The driver pod's UID (downward API), which a fenced runtime reports (:class:`FailureSummary`)."""
RUN_CACHE_BYTES_ENV = "TASKSHARD_RUN_CACHE_BYTES"
"""Bytes the run cache of a shard pod keeps (:mod:`spark_runtime.engine.run_cache`): the operator sets it on driver
and executor containers to a share of the pod's ``/tmp`` size limit, so that the cache alone never fills it."""
SHARDS_DIR = "shards"
DRAIN_SUMMARY = "drained.json"
"""A final drain's summary, in the parent's shard directory."""
DRAIN_MARKER = "drain-requested"
HANDOVER_DIR = "handover"
PRECOPY_POINTER = "precopy.json"
CATCH_UP_STATE = "catch-up.json"
DEFAULT_SNAPSHOTS_KEPT = 2
"""Complete snapshots of its own (savepoints, pre-copies) a running shard keeps when the Task's
``spec.history.snapshots`` is unset (:mod:`spark_runtime.snapshot.retention`)."""


EPOCHS_DIR = "epochs"
EPOCH_DIGITS = 12


def epoch_name(epoch: int) -> str:
    """``000000000007.json``: zero-padded, so names sort like the epochs."""
    if epoch < 1:
        raise ValueError(f"writer epochs start at 1, got {epoch}")
    return f"{epoch:0{EPOCH_DIGITS}d}.json"


def parse_epoch_name(name: str) -> int | None:
    """The epoch of an ``epochs/`` file name (None for anything else, e.g. a temporary file)."""
    stem, dot, ext = name.partition(".")
    if dot and ext == "json" and len(stem) == EPOCH_DIGITS and stem.isdigit() and int(stem) >= 1:
        return int(stem)
    return None


@dataclass(frozen=True)
class WriterEpoch:
    """Who holds a writer epoch of a shard: the content of ``epochs/<epoch>.json`` (for people and logs; the
    fence itself is the file's existence)."""

    epoch: int
    shard: str
    pod: str
    pid: int
    started_at: str
    barrier: bool = False
    """Claimed by an abort (of a split, for its children and the parent; of a merge, for the merged shard), not by
    a runtime that writes: every file an earlier epoch wrote is void from here on (a fenced runtime's late drain
    summary, a stale successor's catch-up state, its ready notes)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "shard": self.shard,
            "pod": self.pod,
            "pid": self.pid,
            "startedAt": self.started_at,
        }
        if self.barrier:
            out["barrier"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WriterEpoch:
        return cls(
            epoch=int(data["epoch"]),
            shard=str(data.get("shard") or ""),
            pod=str(data.get("pod") or ""),
            pid=int(data.get("pid") or 0),
            started_at=str(data.get("startedAt") or ""),
            barrier=bool(data.get("barrier")),
        )


def request_name(child: str, epoch: int | None = None) -> str:
    """``request-<child>.<epoch>.json``: a successor's request, scoped to its writer epoch (so a fenced runtime of
    the successor never replaces its current runtime's note); without an epoch the name of an older runtime."""
    return f"request-{child}.json" if epoch is None else f"request-{child}.{epoch}.json"


def ready_name(child: str, epoch: int | None = None) -> str:
    """``ready-<child>.<epoch>.json``: a successor's ready note, scoped to its writer epoch (:func:`request_name`)."""
    return f"ready-{child}.json" if epoch is None else f"ready-{child}.{epoch}.json"


def parse_note_name(name: str) -> tuple[str, str, int | None] | None:
    """``(kind, child, epoch)`` of a note's file name (kind ``request`` or ``ready``; epoch None for the unscoped
    name of an older runtime); None for any other name (the pre-copy pointer, a temporary file)."""
    kind, dash, rest = name.partition("-")
    if not dash or kind not in ("request", "ready") or not rest.endswith(".json"):
        return None
    stem = rest[: -len(".json")]
    child, dot, epoch = stem.rpartition(".")
    if dot and epoch.isdigit() and child:
        return kind, child, int(epoch)
    return (kind, stem, None) if "." not in stem and stem else None


def shard_dir_uri(task_root: str, shard: str) -> str:
    """``<task_root>/shards/<shard>``: a shard's directory given its Task's storage root (a path or a URI)."""
    return f"{task_root.rstrip('/')}/{SHARDS_DIR}/{shard}"


def drain_summary_uri(task_root: str, shard: str) -> str:
    """Where ``shard`` writes its final drain summary: a split child's ``restoreFrom.manifest``."""
    return f"{shard_dir_uri(task_root, shard)}/{DRAIN_SUMMARY}"


RFC3339 = "%Y-%m-%dT%H:%M:%SZ"
"""The one time format of the runtime and its records (notes, summaries, manifests, lineage, epochs, live values):
UTC, whole seconds."""


def rfc3339(seconds: float | None = None) -> str:
    """Epoch ``seconds`` (None: now) in :data:`RFC3339`."""
    return time.strftime(RFC3339, time.gmtime(seconds))


class SummaryEvent(StrEnum):
    """The ``event`` of the runtime's termination message."""

    DRAINED = "drained"
    """A final drain: the shard's children own its key groups from here on."""
    STOPPED = "stopped"
    """A non-final stop (a SIGTERM alone): the next pod resumes from the recovery log."""
    FAILED = "failed"
    """The runtime could not go on (:class:`FailureSummary`; exit 1, 2 or 3)."""
    FENCED = "fenced"
    """A later writer epoch of the shard exists (:class:`FailureSummary`, reason ``WriterFenced``): this runtime
    wrote nothing more and exited 0, so the kubelet does not restart it into a fencing contest."""
    ABORTED = "aborted"
    """A split undone before the hand-over (:class:`SplitAbortSummary`): the shard keeps its range and resumes."""
    MERGE_ABORT = "merge-abort"
    """A merged shard's abort pod fenced it and found whether a parent drained (:class:`MergeAbortSummary`)."""
    PRUNED = "pruned"
    """A Task's prune pod finished (:class:`PruneSummary`): which retired shards' storage it removed, which it
    kept and why."""
    REFUSED = "refused"
    """The runtime refused to run this template before processing anything (:class:`FailureSummary`; e.g. reason
    ``StateSchemaIncompatible``) and exited 0: a restart of the same template would refuse again, so the operator
    keeps the shard stopped, Degraded with the reason, until the Task's template changes."""


FAILURE_EVENTS = (SummaryEvent.FAILED, SummaryEvent.FENCED, SummaryEvent.REFUSED)
"""The events of a :class:`FailureSummary`."""
STATE_SCHEMA_INCOMPATIBLE = "StateSchemaIncompatible"
"""The reason of a refusal: the Python processor's state schema cannot read the stored state (it names the column)."""
TIME_MODE_CHANGED = "TimeModeChanged"
"""The reason of a refusal: the processor's timers or the Task's event time ask a checkpoint for another Spark
``timeMode`` than the one it was written with (Spark cannot change it)."""
REFUSAL_REASONS = frozenset({STATE_SCHEMA_INCOMPATIBLE, TIME_MODE_CHANGED})
"""Reasons of :data:`SummaryEvent.REFUSED` summaries: the operator rolls the next template to such a shard first."""


@dataclass(frozen=True)
class FailureSummary:
    """The termination message of a runtime that failed (event ``failed``) or was fenced (event ``fenced``):
    ``reason`` (a CamelCase code for the TaskShard's conditions) and ``field`` (the config field to look at) are
    optional; ``pod``/``podUid`` name the pod the runtime ran in (the operator acts on a fenced pod only if it is
    the shard's current one)."""

    shard: str
    error: str
    reason: str | None = None
    field: str | None = None
    event: SummaryEvent = SummaryEvent.FAILED
    pod: str | None = None
    pod_uid: str | None = None
    writer_epoch: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": str(self.event), "shard": self.shard, "error": self.error}
        optional = {"reason": self.reason, "field": self.field, "pod": self.pod, "podUid": self.pod_uid}
        out.update({k: v for k, v in optional.items() if v})
        if self.writer_epoch is not None:
            out["writerEpoch"] = self.writer_epoch
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailureSummary:
        event = SummaryEvent(str(data.get("event", "")))
        if event not in FAILURE_EVENTS:
            raise ValueError(f"event: {event!r} is not a failure")
        error = data.get("error")
        if not isinstance(error, str) or not error.strip():
            raise ValueError("error: a failure summary names its error")

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) and value else None

        epoch = data.get("writerEpoch")
        return cls(
            shard=str(data.get("shard") or ""),
            error=error,
            reason=text("reason"),
            field=text("field"),
            event=event,
            pod=text("pod"),
            pod_uid=text("podUid"),
            writer_epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        )


PRUNE_REASON_LIMIT = 300
"""At most this many characters of why a retired shard was kept go into a :class:`PruneSummary` (ten of them fit
a termination message)."""


@dataclass(frozen=True)
class PruneSummary:
    """The termination message of a Task's prune pod (history retention, :mod:`spark_runtime.history`): the
    retired shards whose recovery logs and snapshots are gone (``pruned``: the operator deletes their TaskShards)
    and those it kept (``kept``: shard and why, from storage: a successor that has not committed a batch of its
    own with a recorded restore plan; the operator keeps their TaskShards and tries again later)."""

    pruned: tuple[str, ...]
    kept: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "event": str(SummaryEvent.PRUNED),
            "pruned": list(self.pruned),
            "kept": [{"shard": s, "why": why[:PRUNE_REASON_LIMIT]} for s, why in self.kept],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PruneSummary:
        if data.get("event") != SummaryEvent.PRUNED:
            raise ValueError(f"event: {data.get('event')!r} is not {SummaryEvent.PRUNED!r}")
        return cls(
            pruned=tuple(str(s) for s in data.get("pruned") or ()),
            kept=tuple((str(k["shard"]), str(k.get("why") or "")) for k in data.get("kept") or ()),
        )


@dataclass(frozen=True)
class StandbyStopSummary:
    """The termination message of a successor stopped (SIGTERM) while on standby: nothing was processed."""

    task: str
    shard: str

    def to_json(self) -> dict[str, Any]:
        return {
            "event": str(SummaryEvent.STOPPED),
            "task": self.task,
            "shard": self.shard,
            "batchId": -1,
            "standby": True,
        }


class MergeAbortOutcome(StrEnum):
    """What a merged shard's abort pod found (:class:`MergeAbortSummary`)."""

    ABORTED = "Aborted"
    """Neither parent drained nor began its final drain: the merged shard is fenced, its notes are void."""
    TOO_LATE = "TooLate"
    """A parent drained (or began its final drain): the merge completes."""


@dataclass(frozen=True)
class MergeAbortSummary:
    """The termination message of ``run --abort-merge`` on a merged shard (see :mod:`spark_runtime.merge`)."""

    task: str
    shard: str
    outcome: MergeAbortOutcome
    drained: tuple[str, ...] = ()
    """The parents that drained or began their final drain (TooLate)."""
    writer_epoch: int | None = None
    """The barrier epoch the abort claimed of the merged shard."""
    time: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "event": str(SummaryEvent.MERGE_ABORT),
            "task": self.task,
            "shard": self.shard,
            "outcome": str(self.outcome),
            "drained": list(self.drained),
            "writerEpoch": self.writer_epoch,
            "time": self.time,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MergeAbortSummary:
        if data.get("event") != SummaryEvent.MERGE_ABORT:
            raise ValueError(f"event: {data.get('event')!r} is not {SummaryEvent.MERGE_ABORT!r}")
        return cls(
            task=str(data.get("task") or ""),
            shard=str(data.get("shard") or ""),
            outcome=MergeAbortOutcome(data["outcome"]),
            drained=tuple(str(d) for d in data.get("drained") or ()),
            writer_epoch=data.get("writerEpoch"),
            time=str(data.get("time") or ""),
        )


@dataclass(frozen=True)
class SplitAbortSummary:
    """The termination message of a runtime started to abort its shard's split (``run --abort-split``): the
    children were fenced and their storage cleared, the parent's ``handover/`` is gone, and the shard resumes
    from its recovery log at ``batch_id`` with its next pod."""

    task: str
    shard: str
    batch_id: int
    children: tuple[str, ...]
    writer_epoch: int | None = None
    time: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "event": str(SummaryEvent.ABORTED),
            "task": self.task,
            "shard": self.shard,
            "batchId": self.batch_id,
            "children": list(self.children),
            "writerEpoch": self.writer_epoch,
            "time": self.time,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SplitAbortSummary:
        if data.get("event") != SummaryEvent.ABORTED:
            raise ValueError(f"event: {data.get('event')!r} is not {SummaryEvent.ABORTED!r}")
        return cls(
            task=str(data.get("task") or ""),
            shard=str(data.get("shard") or ""),
            batch_id=int(data["batchId"]),
            children=tuple(str(c) for c in data.get("children") or ()),
            writer_epoch=data.get("writerEpoch"),
            time=str(data.get("time") or ""),
        )


class HandoverMode(StrEnum):
    """How a child takes over (chosen by the child from its source, written in its request)."""

    CATCH_UP = "catch-up"
    """The child restores a snapshot the parent exported while running, then processes its slice of the
    input up to the parent's committed positions without emitting; the parent stops once every child has
    caught up, and the children emit the results of their input from exactly its final positions on (a source
    that can cap what it admits and mark what it holds: the journal, Kafka; no event time or timers)."""
    RESTORE = "restore"
    """The child warms up and waits; the parent stops, exports its final state, and the child restores it
    (a processor with event time or timers, on every source; or a parent that had already drained)."""


class CatchUpPhase(StrEnum):
    SHADOW = "shadow"
    """Following the parent: reads at most up to the parent's committed positions, emits nothing."""
    FINAL = "final"
    """The parent drained: reads freely; a batch emits the results of its records at or after the parent's final
    positions only (:class:`Emission`). A ``catch-up.json`` written by an earlier runtime may still cap FINAL at
    the final positions (``limit``); that child emits from its first batch starting there, as before."""
    LIVE = "live"
    """Reached the parent's final positions: reads freely and emits; the child owns its range."""


HELD_COLUMN = "_held"
"""The boolean column a catch-up child's source adds to its records: true for a record before the parent's final
positions, or for any record while they are unknown (the parent emitted its results). A held record updates the
child's state and produces no output and no dead letter; a source marks whole pieces, never splitting a decision
inside one (the journal cuts its pieces at the final positions)."""


HELD_RIGHT_COLUMN = "_held_right"
"""A merged catch-up child's second held column: whether the record is held for the **right** parent's key groups
(before its final positions); :data:`HELD_COLUMN` is then the left parent's. The pipeline picks one per record
by key group (:func:`spark_runtime.pipeline.owned_records`), so downstream sees one :data:`HELD_COLUMN`."""


class Emission(StrEnum):
    """What a catch-up child's batch writes to the sink (:meth:`CatchUpState.emission`)."""

    NONE = "none"
    """Every record is held: the batch ends at or before the parent's final positions, or they are unknown."""
    FROM_FENCE = "from-fence"
    """The batch straddles the final positions: only the results of its records at or after them (the batch that
    reaches the fence emits, so the hand-over costs no extra batch)."""
    ALL = "all"
    """The batch starts at or after the final positions (or the shard is no catch-up child)."""


@dataclass(frozen=True)
class HandoverNote:
    """A successor's request or readiness note in its parent's ``handover/`` directory. ``epoch``: the writer
    epoch of the successor runtime that wrote it (None: an older runtime); a parent honours a note only while no
    abort claimed a later (barrier) epoch of the successor (:attr:`WriterEpoch.barrier`)."""

    child: str
    start: int
    end: int
    mode: HandoverMode
    time: str = ""
    epoch: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "child": self.child,
            "keyGroups": {"start": self.start, "end": self.end},
            "mode": str(self.mode),
            "time": self.time,
        }
        if self.epoch is not None:
            out["writerEpoch"] = self.epoch
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HandoverNote:
        kg = data["keyGroups"]
        epoch = data.get("writerEpoch")
        return cls(
            str(data["child"]),
            int(kg["start"]),
            int(kg["end"]),
            HandoverMode(data["mode"]),
            str(data.get("time") or ""),
            int(epoch) if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        )

    def describe(self) -> str:
        return f"{self.child} [{self.start}, {self.end})"


def covers(notes: list[HandoverNote], start: int, end: int) -> bool:
    """Whether the notes' key-group ranges cover ``[start, end)`` entirely."""
    at = start
    for note in sorted(notes, key=lambda n: n.start):
        if note.start > at:
            return False
        at = max(at, note.end)
    return at >= end


@dataclass(frozen=True)
class HandoverConflict:
    """Ready notes of two hand-overs in one parent's ``handover/`` (a split's child and a merged shard, or two
    merged shards): their ranges overlap inside the parent's. The parent hands over to neither (it keeps
    processing and says why); the operator lets only one hand-over per shard be accepted, so this is a backstop."""

    notes: tuple[HandoverNote, ...]

    def describe(self) -> str:
        return ", ".join(n.describe() for n in self.notes)


def choose_successors(ready: list[HandoverNote], start: int, end: int) -> list[HandoverNote] | HandoverConflict | None:
    """The successors a parent over ``[start, end)`` hands over to, from the ready notes it honours (none an abort
    voided, see :class:`HandoverNote`): one note per successor (its latest epoch), whose ranges, clipped to
    the parent's, tile it without overlap (a split's two children, or one merged shard). None while they do not
    cover it; :class:`HandoverConflict` when two of them overlap."""
    latest: dict[str, HandoverNote] = {}
    for note in ready:
        if note.end <= start or note.start >= end:
            continue
        kept = latest.get(note.child)
        if kept is None or (note.epoch or 0) >= (kept.epoch or 0):
            latest[note.child] = note
    notes = sorted(latest.values(), key=lambda n: (max(n.start, start), n.child))
    for a, b in zip(notes, notes[1:], strict=False):
        if min(a.end, end) > max(b.start, start):
            return HandoverConflict(tuple(notes))
    return notes if notes and covers(notes, start, end) else None


@dataclass(frozen=True)
class CatchUpState:
    """A catch-up child's state (``catch-up.json`` in its own directory); read by its runner and its source."""

    parent: str
    manifest: str
    """The parent's pre-copy snapshot manifest this child restored from."""
    phase: CatchUpPhase
    limit: dict[str, Any] | None = None
    """SHADOW and FINAL: the positions the source may not read past (None in LIVE)."""
    final: dict[str, Any] | None = None
    """The parent's final positions (FINAL, LIVE): a batch starting at or after them emits."""
    ready: bool = False
    """Whether the ready note was written to the parent."""
    writer_epoch: int | None = None
    """The epoch of the runtime that wrote it: void once an abort claimed a later barrier epoch of this child."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "phase": str(self.phase)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CatchUpState:
        epoch = data.get("writer_epoch")
        return cls(
            parent=str(data["parent"]),
            manifest=str(data["manifest"]),
            phase=CatchUpPhase(data["phase"]),
            limit=data.get("limit"),
            final=data.get("final"),
            ready=bool(data.get("ready")),
            writer_epoch=int(epoch) if isinstance(epoch, int) else None,
        )

    def emission(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> Emission:
        """What a batch from positions ``start`` to ``end`` emits. While the final positions are unknown the cap
        keeps every batch at or before the parent's committed positions, so at or before the final ones: a batch
        planned then is held entirely, and so is any batch ending at or before them (a replay decides the same)."""
        if self.final is None or at_or_after(self.final, end):
            return Emission.NONE
        if at_or_after(start, self.final):
            return Emission.ALL
        return Emission.FROM_FENCE

    def holds(self, name: str, offset: int) -> bool:
        """Whether a record at ``offset`` of the partition ``name`` is held (see :data:`HELD_COLUMN`)."""
        return self.final is None or offset < int(self.final.get(name, 0))


@dataclass(frozen=True)
class MergeCatchUpState:
    """A merged catch-up child's state (its ``catch-up.json``): two parents, by ascending key groups (the left one
    owns ``[start, boundary)``, the right one ``[boundary, end)``). Read by its runner and its source.

    The cap is the lowest, per position, of both parents' limits (each parent's latest committed positions, its
    pre-copy's at first, its final ones once drained): a batch planned under it ends at or before both parents'
    final positions, so it is held entirely. A record of key group ``g`` is held iff it lies before its own
    parent's final position (:meth:`held_by`; unknown: held); once both parents drained the phase is FINAL and
    the cap is gone."""

    parents: tuple[str, str]
    manifests: tuple[str, str]
    """Each parent's pre-copy snapshot manifest this child restored from."""
    boundary: int
    """The first key group of the right parent."""
    phase: CatchUpPhase
    limits: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None)
    """SHADOW: each parent's positions this child may not read past (None: that parent's pre-copy positions)."""
    finals: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None)
    """Each parent's final positions once it drained (None: not yet)."""
    ready: bool = False
    """Whether the ready notes were written to both parents."""
    writer_epoch: int | None = None

    @property
    def parent(self) -> str:
        return " and ".join(self.parents)

    @property
    def limit(self) -> dict[str, Any] | None:
        """The cap (SHADOW only): per position, the lowest of the parents' limits or final positions."""
        if self.phase != CatchUpPhase.SHADOW:
            return None
        known = [f if f is not None else lim for lim, f in zip(self.limits, self.finals, strict=True)]
        return lowest_positions([k for k in known if k is not None]) if all(k is not None for k in known) else {}

    @property
    def final(self) -> dict[str, Any] | None:
        """The lowest of both parents' final positions once both drained (None before)."""
        if any(f is None for f in self.finals):
            return None
        return lowest_positions([f for f in self.finals if f is not None])

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "phase": str(self.phase), "kind": "merge"}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MergeCatchUpState:
        epoch = data.get("writer_epoch")
        left, right = data["parents"]
        m_left, m_right = data["manifests"]
        l_limit, r_limit = data.get("limits") or (None, None)
        l_final, r_final = data.get("finals") or (None, None)
        return cls(
            parents=(str(left), str(right)),
            manifests=(str(m_left), str(m_right)),
            boundary=int(data["boundary"]),
            phase=CatchUpPhase(data["phase"]),
            limits=(l_limit, r_limit),
            finals=(l_final, r_final),
            ready=bool(data.get("ready")),
            writer_epoch=int(epoch) if isinstance(epoch, int) else None,
        )

    def emission(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> Emission:
        """What a batch from ``start`` to ``end`` emits: nothing while a parent's final positions are unknown or
        when it ends at or before both parents' (every record held); everything when it starts at or after both;
        else only its records' results at or after their own parent's final positions (``FROM_FENCE``)."""
        if any(f is None for f in self.finals) or all(at_or_after(f, end) for f in self.finals if f is not None):
            return Emission.NONE
        if all(at_or_after(start, f) for f in self.finals if f is not None):
            return Emission.ALL
        return Emission.FROM_FENCE

    def cuts(self, name: str) -> list[int]:
        """Where the source cuts its pieces of partition ``name``: the known final positions."""
        return sorted({int(f[name]) for f in self.finals if f is not None and name in f})

    def held_by(self, name: str, offset: int) -> tuple[bool, bool]:
        """Whether a record at ``offset`` of partition ``name`` is held for the left and for the right parent's key
        groups (:data:`HELD_COLUMN`, :data:`HELD_RIGHT_COLUMN`): before that parent's final position, or any
        record while it is unknown; a partition a parent's final positions do not name holds nothing for it."""
        left, right = (f is None or offset < int(f.get(name, 0)) for f in self.finals)
        return left, right


def read_catch_up(data: Mapping[str, Any]) -> CatchUpState | MergeCatchUpState:
    """A ``catch-up.json``: a split child's :class:`CatchUpState` or a merged child's :class:`MergeCatchUpState`."""
    return MergeCatchUpState.from_json(data) if data.get("kind") == "merge" else CatchUpState.from_json(data)


def held_columns(catch_up: bool, merged: bool) -> list[tuple[str, str]]:
    """The held columns a catching-up shard's source adds to its records (a merged shard's: one per parent)."""
    if not catch_up:
        return []
    return [(HELD_COLUMN, "boolean")] + ([(HELD_RIGHT_COLUMN, "boolean")] if merged else [])


def held_cuts(state: CatchUpState | MergeCatchUpState | None, name: str) -> list[int]:
    """Where a catching-up shard's source cuts its input of partition ``name`` (flat positions): at its parents'
    known final positions, so that each piece is held or not as a whole."""
    if isinstance(state, MergeCatchUpState):
        return state.cuts(name)
    if state is not None and state.final is not None:
        return [int(state.final.get(name, 0))]
    return []


def held_flags(state: CatchUpState | MergeCatchUpState | None, name: str, offset: int) -> tuple[bool, bool]:
    """A piece's held flags from ``offset`` of partition ``name`` on: (the left or only parent's, the right
    parent's); see :data:`HELD_COLUMN` and :data:`HELD_RIGHT_COLUMN`."""
    if isinstance(state, MergeCatchUpState):
        return state.held_by(name, offset)
    return state is not None and state.holds(name, offset), False


def _leaves(positions: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], int]]:
    for key, value in positions.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, (*prefix, str(key)))
        else:
            yield (*prefix, str(key)), int(value)


def at_or_after(positions: Mapping[str, Any], bound: Mapping[str, Any]) -> bool:
    """Whether every position named in ``positions`` is at or after the same one in ``bound`` (journal
    ``{file: offset}`` or Kafka ``{topic: {partition: offset}}``); a name ``bound`` lacks is not compared."""
    limits = dict(_leaves(bound))
    return all(value >= limits[name] for name, value in _leaves(positions) if name in limits)


def lowest_positions(every: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Per position (journal ``{file: offset}`` or Kafka ``{topic: {partition: offset}}``), the lowest over
    ``every``: where a merged child starts reading (each name that any of them has, from the lowest offset)."""
    out: dict[str, Any] = {}
    for positions in every:
        for name, value in positions.items():
            if isinstance(value, Mapping):
                out[name] = lowest_positions([out.get(name) or {}, value])
            else:
                out[name] = int(value) if name not in out else min(int(out[name]), int(value))
    return out


@dataclass(frozen=True)
class SkipRule:
    """What a merged child skips: per key-group range of one parent (``owners``: ``(end, {partition: offset})``,
    by ascending ``end``; a parent's range ends at ``end``, exclusive, and starts at the previous one's end), the
    first offset of each partition that this parent did **not** count. A row of key group ``g`` from ``partition``
    at ``offset`` is processed iff ``offset >= first_offset(g, partition)``; a partition a parent does not name
    (its final position is where the child starts) skips nothing.

    Why exact: the child starts each partition at the lowest final position of its parents
    (:func:`lowest_positions`); a row below its owner's final position was counted by that owner (it is in the
    owner's snapshot), a row at or after it was not, and the other parent's rows are not the owner's to count."""

    owners: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]

    @classmethod
    def of(cls, ranges: list[tuple[int, dict[int, int]]], start: dict[int, int]) -> SkipRule:
        """The rule for parents ``(range end, {partition: final offset})`` when the child starts at ``start``
        (``{partition: offset}``): only the partitions where a parent's final offset is past the start."""
        owners = []
        for end, finals in sorted(ranges, key=lambda r: r[0]):
            ahead = tuple(sorted((p, o) for p, o in finals.items() if o > start.get(p, o)))
            owners.append((end, ahead))
        return cls(tuple(owners))

    @property
    def skips_nothing(self) -> bool:
        return not any(ahead for _, ahead in self.owners)

    def first_offset(self, key_group: int, partition: int) -> int:
        for end, ahead in self.owners:
            if key_group < end:
                return dict(ahead).get(partition, -1)
        return -1

    def keeps(self, key_group: int, partition: int, offset: int) -> bool:
        return offset >= self.first_offset(key_group, partition)

    def sql(self, key_group: str = "key_group", partition: str = "partition", offset: str = "offset") -> str:
        """A Spark SQL predicate equal to :meth:`keeps` over the three columns (CASE only: no map lookups, which
        ANSI mode may fail on a missing key)."""
        cases = []
        for end, ahead in self.owners:
            if not ahead:
                first = "-1"
            else:
                inner = " ".join(f"WHEN {partition} = {p} THEN {o}" for p, o in ahead)
                first = f"CASE {inner} ELSE -1 END"
            cases.append(f"WHEN {key_group} < {end} THEN {first}")
        return f"{offset} >= CASE {' '.join(cases)} ELSE -1 END"

    def to_json(self) -> list[Any]:
        return [[end, [[p, o] for p, o in ahead]] for end, ahead in self.owners]

    @classmethod
    def from_json(cls, data: list[Any]) -> SkipRule:
        return cls(tuple((int(end), tuple((int(p), int(o)) for p, o in ahead)) for end, ahead in data))


def clamp(ends: Mapping[str, int], start: Mapping[str, int], limit: Mapping[str, Any]) -> dict[str, int]:
    """Flat (journal) end positions capped at ``limit``, never below ``start``.

    A file the limit does not name stays at its start: a catching-up child never reads where its parent has no
    committed position (records it processed there on standby would be past the parent's final positions, and
    its silent batches would never emit them)."""
    out = {}
    for name, end in ends.items():
        begin = int(start.get(name, 0))
        cap = limit.get(name)
        out[name] = begin if cap is None else max(begin, min(int(end), int(cap)))
    return out


@dataclass(frozen=True)
class DrainSummary:
    """What the runtime writes to ``drained.json`` and its termination message after a drain or stop."""

    event: SummaryEvent
    task: str
    shard: str
    batch_id: int
    manifest: str | None
    positions: dict[str, Any] = field(default_factory=dict)
    key_groups: dict[str, int] | None = None
    state_rows: int = 0
    snapshot_files: int = 0
    dead_letters: int = 0
    drain_seconds: float = 0.0
    time: str | None = None
    handover: HandoverMode | None = None
    """How the children take over (None: not a split, or an older runtime)."""
    snapshot_batch_id: int | None = None
    """The batch of the snapshot ``manifest`` names (before ``batch_id`` after a catch-up hand-over)."""
    writer_epoch: int | None = None
    """The writer epoch of the runtime that wrote it (None: an older runtime, or no fence)."""
    successors: tuple[tuple[str, int, int], ...] | None = None
    """A final drain for a hand-over: the successors it handed over to, ``(shard, start, end)`` (the ready notes
    it drained for); a successor not named here refuses to restore (``HandedToAnother``). None: no hand-over
    (a drain called directly) or an older runtime."""

    def hands_to(self, shard: str, start: int, end: int) -> bool:
        """Whether this drain handed over to ``shard`` over ``[start, end)`` (True when it names no successors)."""
        return self.successors is None or (shard, start, end) in self.successors

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event": str(self.event),
            "task": self.task,
            "shard": self.shard,
            "keyGroups": self.key_groups,
            "batchId": self.batch_id,
            "manifest": self.manifest,
            "positions": self.positions,
            "stateRows": self.state_rows,
            "snapshotFiles": self.snapshot_files,
            "deadLetters": self.dead_letters,
            "drainSeconds": self.drain_seconds,
            "time": self.time,
        }
        if self.handover is not None:
            out["handover"] = str(self.handover)
            out["snapshotBatchId"] = self.snapshot_batch_id
        if self.writer_epoch is not None:
            out["writerEpoch"] = self.writer_epoch
        if self.successors is not None:
            out["successors"] = [
                {"shard": name, "keyGroups": {"start": start, "end": end}} for name, start, end in self.successors
            ]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DrainSummary:
        handover = data.get("handover")
        successors = data.get("successors")
        return cls(
            event=SummaryEvent(data["event"]),
            task=str(data.get("task") or ""),
            shard=str(data.get("shard") or ""),
            batch_id=int(data["batchId"]),
            manifest=data.get("manifest"),
            positions=dict(data.get("positions") or {}),
            key_groups=data.get("keyGroups"),
            state_rows=int(data.get("stateRows") or 0),
            snapshot_files=int(data.get("snapshotFiles") or 0),
            dead_letters=int(data.get("deadLetters") or 0),
            drain_seconds=float(data.get("drainSeconds") or 0.0),
            time=data.get("time"),
            handover=HandoverMode(handover) if handover else None,
            snapshot_batch_id=data.get("snapshotBatchId"),
            writer_epoch=data.get("writerEpoch"),
            successors=None
            if successors is None
            else tuple((str(s["shard"]), int(s["keyGroups"]["start"]), int(s["keyGroups"]["end"])) for s in successors),
        )
