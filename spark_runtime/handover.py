"""The runtime's side of a split: a parent keeps processing until its children have caught up.

The operator accepts a split by creating both children (``restoreFrom.manifest`` = the parent's drain summary);
from then on parent and children talk only through storage (names: :mod:`spark_runtime.protocol`), so no
signal waits for a kubelet to refresh a volume. The invariant: **for every key group, exactly one shard emits
output at any moment**. A child may build state while its parent runs; it writes nothing to the sink (results
or dead letters) for input at or before the parent's final positions.

Catch-up (``HandoverMode.CATCH_UP``, a source that can cap what it admits: the journal, Kafka; no event time)::

      child                                   parent (keeps processing and emitting throughout)
      ─────                                   ──────
      warm up (SparkSession, preflight)
      write handover/request-<child> ───────> sees a catch-up request: exports a snapshot of its latest
                                              committed batch K while its query runs, writes the manifest,
      <────────────────────────────────────── then handover/precopy.json
      catch-up.json: SHADOW, limit = K
      restore the slice of K (batch 0) and
      follow the parent: limit = the parent's
      committed positions (its progress.json);
      nothing emitted
      caught up to the limit: ──────────────> every key group has a ready child: final drain at a batch
      write handover/ready-<child>            boundary (no export); drained.json names batch N, positions F
      <────────────────────────────────────── and the pre-copy manifest
      catch-up.json: FINAL, final = F, no limit;
      the batch that reaches F may pass it:
      it emits the results of its records at
      or after F only; then catch-up.json LIVE
      and every later batch emits (the child
      owns its range)

Restore (``HandoverMode.RESTORE``: a processor with event time or timers, on every source, or a parent that had
already drained): the child warms up (with a rehearsal of its restore plan), writes its request and its ready note
at once, and waits; once every key group has a ready child the parent drains, exporting the state of its final
batch, and the children restore it.

Crash safety, by construction: every step is a file written once (atomically) and re-read on restart.

- A parent restarted mid-hand-over resumes from its recovery log, finds the pointer and the notes, and drains
  when they cover its range (a restarted final drain goes on from its drain marker, see ``shard.py``).
- A child restarted in SHADOW or FINAL resumes from its own recovery log with its ``catch-up.json``: the same
  cap, the same emission rule. A batch replayed after a crash starts where it started before, so it emits
  (or not) as before.
- Why nothing is emitted twice: while the parent has not drained, a child's batches end at or before the parent's
  committed positions (the cap), so at or before ``F``, and emit nothing. Once the parent drained at ``F`` the
  source marks each record before ``F`` as held (:data:`spark_runtime.protocol.HELD_COLUMN`; the journal cuts its
  pieces at ``F``, Kafka its per-partition ranges): a held record updates state and produces no result and no dead
  letter (a held invalid record is the parent's to count). A batch that ends at or before ``F`` emits nothing, one
  that starts at or after it emits everything, and the one that straddles it emits only what its records at or after
  ``F`` produced (:meth:`spark_runtime.protocol.CatchUpState.emission`: a Python processor is called for the held
  records first, its outputs dropped; a builtin aggregation's rows are kept for the keys with a record at or after
  ``F``). A batch replayed after a crash has the same range and the same ``F``, so it decides the same. A restored
  child's batch 0 (the seed) never emits.
- Why nothing is lost: the child's state is the parent's at ``K`` plus every record after ``K`` of its key
  groups, each processed once in its own recovery log; the parent emitted everything up to ``F``.

Abort (:func:`abort_split`; the operator starts the parent's pod with ``run --abort-split`` once the split was
withdrawn and the children's pods are gone)::

    drained.json exists? ──yes──> too late: report the drain summary (the children take over as usual)
          │ no
          ▼
    fence each child (claim its next writer epoch), remove the rest of its directory; remove handover/ and the
    drain marker; report SplitAbortSummary (exit 0). The next pod resumes the parent from its recovery log.

The parent holds its own new writer epoch first, so no earlier parent runtime writes a summary after the check
(its fence check comes before ``drained.json``); nothing a child did is visible outside its own directory (it
emits nothing before ``drained.json``), so clearing that directory undoes the split. A re-split later starts its
children afresh (same names, new epochs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.fencing import barrier_after, is_current
from spark_runtime.logs import set_phase as set_log_phase
from spark_runtime.protocol import (
    DRAIN_SUMMARY,
    CatchUpPhase,
    CatchUpState,
    DrainSummary,
    Emission,
    HandoverConflict,
    HandoverMode,
    HandoverNote,
    MergeCatchUpState,
    SplitAbortSummary,
    SummaryEvent,
    at_or_after,
    choose_successors,
    parse_note_name,
)
from spark_runtime.snapshot import RestoreError, utc_now
from spark_runtime.storage import Loc, location

if TYPE_CHECKING:
    from spark_runtime.layout import ShardPaths
    from spark_runtime.merge import MergeHandover
    from spark_runtime.shard_state import RunState, ShardIO

__all__ = [
    "ChildHandover",
    "ParentHandover",
    "StandbyCalls",
    "StandbyStopped",
    "abort_split",
    "announce_and_wait",
    "read_drain_summary",
    "record_standby",
    "save_catch_up",
]

log = logging.getLogger("taskshard.handover")

POLL_SECONDS = 0.2
"""How often a waiting child looks for its parent's answer on a filesystem."""
POLL_SECONDS_S3 = 0.5
"""The same on S3 (each look is a HEAD request)."""
PARENT_LOOK_SECONDS_S3 = 1.0
"""How often a running parent lists its ``handover/`` directory on S3 (on a filesystem: every poll)."""
STANDBY_LOG_SECONDS = 60.0
LIMITS_KEPT = 16
"""How many of the parent's recent positions a catching-up child remembers for its ready check."""


class StandbyStopped(RuntimeError):
    """A SIGTERM (or ``request_drain``) arrived while the shard was on standby: nothing was processed."""


@dataclass(frozen=True)
class StandbyCalls:
    """What a child on standby asks of its runner."""

    warm_up: Callable[[bool, Callable[[], bool]], None]
    """``warm_up(rehearse, should_stop)``: the SparkSession, the preflight and, with ``rehearse``, a rehearsal of
    the restore plan cut short once ``should_stop()``; records ``rehearsal_seconds`` in the run state."""
    stop_requested: Callable[[], bool]
    """Whether a drain or stop was requested in this process (a SIGTERM on standby)."""
    drain_reason: Callable[[], str]
    """Why (for the log)."""


class ParentHandover:
    """A shard as a parent: answers catch-up requests with a pre-copy snapshot and asks for its own final drain
    once one hand-over's successors are all ready (:func:`spark_runtime.protocol.choose_successors`); ready notes
    of two hand-overs are a conflict it refuses to act on. ``child``: the shard's own side as a successor (a
    catching-up child hands nothing on); ``write_snapshot(batch)``: the snapshot writer, for the pre-copy."""

    def __init__(
        self,
        io: ShardIO,
        child: ChildHandover | MergeHandover | None,
        write_snapshot: Callable[[int], tuple[dict[str, Any], Loc]],
    ) -> None:
        self.io = io
        self.child = child
        self.write_snapshot = write_snapshot
        self.paths = io.paths
        self._looked_at = 0.0
        self._precopy: dict[str, Any] | None = None
        self._exporting: threading.Thread | None = None
        self.successors: list[HandoverNote] = []
        """The ready notes of the successors this shard drains (or drained) for; [] before that."""
        self._conflict: str | None = None

    def notes(self) -> tuple[list[HandoverNote], list[HandoverNote]]:
        """The successors' requests and ready notes that this shard honours: those no abort voided since they
        were written (no barrier epoch of the successor after the note's: :func:`spark_runtime.fencing.barrier_after`;
        a successor's plain restart writes its notes again under its new epoch, and the newest one counts)."""
        requests: list[HandoverNote] = []
        ready: list[HandoverNote] = []
        directory = self.paths.handover_dir
        if not directory.exists():
            return requests, ready
        for f in directory.iterdir():
            parsed = parse_note_name(f.name)
            if parsed is None:
                continue
            try:
                note = HandoverNote.from_json(f.read_json())
            except FileNotFoundError:  # removed meanwhile (an abort clearing stale notes)
                continue
            if barrier_after(self.paths.shard_path(note.child), note.epoch) is None:
                (requests if parsed[0] == "request" else ready).append(note)
        return requests, ready

    def tick(self) -> str | None:
        """One look (throttled on S3): export the pre-copy when a catch-up child asked for one; return why to
        drain finally once one hand-over's successors are all ready (recorded in :attr:`successors`), else None."""
        now = time.monotonic()
        if self.io.storage.is_s3 and now - self._looked_at < PARENT_LOOK_SECONDS_S3:
            return None
        child = self.child
        if child is not None and child.catching_up:
            return None  # its own parent still emits its range: it cannot hand that range on yet
        self._looked_at = now
        requests, ready = self.notes()
        if any(r.mode == HandoverMode.CATCH_UP for r in requests):
            self._start_precopy()
        cfg = self.io.config
        chosen = choose_successors(ready, cfg.key_groups.start, cfg.key_groups.end)
        if isinstance(chosen, HandoverConflict):
            described = chosen.describe()
            if described != self._conflict:
                self._conflict = described
                log.error(
                    "shard %s: ready notes of two hand-overs overlap (%s); it hands over to neither and keeps "
                    "processing: one hand-over per shard (the operator accepts only one)",
                    cfg.shard,
                    described,
                )
            return None
        if not chosen:
            return None
        self.successors = chosen
        names = ", ".join(f"{n.child} ({n.mode})" for n in chosen)
        return f"successors ready: {names}"

    def confirm(self, successors: list[HandoverNote]) -> bool:
        """Whether no abort voided any of ``successors`` (the notes a final drain began for) since: checked after
        the drain marker is written, so an abort that fenced a successor before that moment (its barrier epoch)
        makes the drain back out, and one after it sees the marker."""
        return all(barrier_after(self.paths.shard_path(n.child), n.epoch) is None for n in successors)

    @property
    def handing_over(self) -> bool:
        """Whether a catch-up child asked this shard for its state (a pre-copy started): a split is under way."""
        return self._exporting is not None or self._precopy is not None

    def catch_up_only(self) -> bool:
        """Whether every successor this shard drains for caught up (the final drain then exports nothing)."""
        return bool(self.successors) and all(n.mode == HandoverMode.CATCH_UP for n in self.successors)

    def precopy(self) -> dict[str, Any] | None:
        if self._precopy is None and self.paths.precopy.exists():
            self._precopy = self.paths.precopy.read_json()
        return self._precopy

    def _start_precopy(self) -> None:
        """Export the pre-copy in a thread: the poll loop goes on (progress for the children, the ready check)."""
        if self.precopy() is not None or (self._exporting is not None and self._exporting.is_alive()):
            return
        self._exporting = threading.Thread(target=self._precopy_or_log, name="taskshard-precopy", daemon=True)
        self._exporting.start()

    def _precopy_or_log(self) -> None:
        try:
            self.ensure_precopy()
        except Exception:  # retried at the next look; the children wait on standby meanwhile
            log.exception("shard %s: the pre-copy export failed; retrying", self.io.config.shard)

    def wait_export(self) -> None:
        """Let a pre-copy export in progress finish (a drain must not export the same batch at the same time)."""
        if self._exporting is not None:
            self._exporting.join()

    def ensure_precopy(self) -> dict[str, Any]:
        """The pre-copy pointer, exporting the snapshot of the latest committed batch first (the query keeps
        running; the State Data Source reads a committed version). Idempotent."""
        found = self.precopy()
        if found is not None:
            return found
        t0 = time.monotonic()
        batch_id = last_committed_batch(self.paths.checkpoint)
        manifest, where = self.write_snapshot(batch_id)
        pointer = {
            "manifest": where.uri(),
            "batchId": batch_id,
            "positions": manifest["positions"],
            "stateRows": manifest["snapshot"].get("rows", 0),
            "exportSeconds": round(time.monotonic() - t0, 3),
            "time": utc_now(),
        }
        self.paths.handover_dir.mkdir()
        self.io.fence.check("the pre-copy pointer")
        self.paths.precopy.write_json(pointer)
        self._precopy = pointer
        log.info(
            "shard %s: pre-copy snapshot of batch %d for its catch-up children (%s rows, %.1fs, still processing)",
            self.io.config.shard,
            batch_id,
            pointer["stateRows"],
            pointer["exportSeconds"],
        )
        return pointer


class ChildHandover:
    """A split child's side (see the module docstring): ``mode`` is how it takes over; ``positions_at(batch)`` its
    committed positions (:meth:`spark_runtime.progress.Progress.positions_at`); ``calls`` what its standby asks of
    the runner. It writes ``run.standby_seconds``."""

    def __init__(
        self,
        io: ShardIO,
        run: RunState,
        mode: HandoverMode,
        positions_at: Callable[[int], dict[str, Any]],
        calls: StandbyCalls,
    ) -> None:
        self.io = io
        self.run = run
        self.mode = mode
        self.positions_at = positions_at
        self.calls = calls
        cfg = io.config
        assert cfg.restore_from is not None
        self.parent = cfg.restore_from.parent
        self.paths = io.paths
        self.parent_paths = io.paths.shard_path(self.parent)
        self.pointer = location(cfg.restore_from.manifest, io.s3)
        self.state: CatchUpState | None = None
        self._limit_batch: int | None = None
        """The parent's batch whose positions are the current limit (None: not read from its progress yet)."""
        self._limits_given: list[dict[str, Any]] = []
        """The last limits read from the parent's progress (this process), newest last."""

    @property
    def catching_up(self) -> bool:
        return self.state is not None and self.state.phase != CatchUpPhase.LIVE

    # ---------------------------------------------------------------- before the query: which snapshot

    def acquire(self) -> Loc:
        """The manifest to restore from; on standby until the parent answers (raises :class:`StandbyStopped`
        on a stop request). Names the manifest itself when ``restoreFrom.manifest`` is not a drain summary."""
        if self.pointer.name != DRAIN_SUMMARY:
            return self.pointer
        if self.paths.catch_up.exists():  # a restart: the same snapshot, the same cap
            state = CatchUpState.from_json(self.paths.catch_up.read_json())
            barrier = barrier_after(self.paths, state.writer_epoch)
            if barrier is None:
                self.state = state
                log.info("shard %s resumes its catch-up (%s)", self.io.config.shard, state.phase)
                return location(state.manifest, self.io.s3)
            log.warning(
                "shard %s: its catch-up state was written by writer epoch %s, before the abort that claimed epoch %s: "
                "void; starting afresh",
                self.io.config.shard,
                state.writer_epoch,
                barrier,
            )
            clear_shard_dir(self.paths)
        if self._drained() is None:
            self._standby()
        if self.state is not None:
            return location(self.state.manifest, self.io.s3)
        summary = self._drain_summary()
        if summary.handover == HandoverMode.CATCH_UP:
            raise RestoreError(
                f"restoreFrom.manifest: parent {self.parent} handed over to catch-up children at batch "
                f"{summary.batch_id}, but this shard's catch-up state {self.paths.catch_up.uri()} is missing: its "
                f"manifest is of batch {summary.snapshot_batch_id}, so restoring it at the final positions would "
                "lose what came in between (was this shard's storage removed?)",
                reason="CatchUpStateMissing",
            )
        return location(summary.manifest or "", self.io.s3)

    def manifests(self) -> list[tuple[str, Loc]]:
        """``[(parent, manifest)]``: what :func:`spark_runtime.snapshot.restore.plan_restore` restores."""
        return [(self.parent, self.acquire())]

    def _note(self) -> HandoverNote:
        cfg = self.io.config
        start, end = cfg.key_groups.start, cfg.key_groups.end
        return HandoverNote(cfg.shard, start, end, self.mode, utc_now(), self.io.fence.epoch)

    def _standby(self) -> None:
        precopy = self.parent_paths.precopy

        def answered() -> bool:
            return (self.mode == HandoverMode.CATCH_UP and precopy.exists()) or self._drained() is not None

        began, warm = announce_and_wait(
            self.io,
            self.run,
            self.calls,
            [self.parent_paths],
            self._note,
            describe=f"parent {self.parent}",
            answered=answered,
            rehearse=self.mode == HandoverMode.RESTORE,
            ready_at_once=self.mode == HandoverMode.RESTORE,
        )
        if self.mode == HandoverMode.CATCH_UP and self._drained() is None:
            answer = precopy.read_json()
            self.state = CatchUpState(
                self.parent, str(answer["manifest"]), CatchUpPhase.SHADOW, limit=dict(answer["positions"])
            )
            self._save()
        record_standby(self.io, self.run, self.mode, self.parent, began, warm)

    def _drain_summary(self) -> DrainSummary:
        summary = self._drained()
        if summary is None:
            raise RestoreError(
                f"restoreFrom.manifest: {self.pointer.uri()!r} is not a drain summary of the current writer of "
                f"{self.parent}",
                reason="DrainSummaryVoid",
            )
        return summary

    def _drained(self) -> DrainSummary | None:
        """The parent's drain summary once it exists and is valid for this shard (see :func:`parent_drained`)."""
        cfg = self.io.config
        me = (cfg.shard, cfg.key_groups.start, cfg.key_groups.end)
        return parent_drained(self.pointer, self.parent_paths, self.parent, me)

    # ---------------------------------------------------------------- while the query runs

    def _save(self) -> None:
        assert self.state is not None
        self.state = save_catch_up(self.io, self.state)

    def _own(self, positions: dict[str, Any]) -> dict[str, Any]:
        return self.io.source.validate_positions(positions)

    def tick(self) -> None:
        """Follow the parent (called by the runner's poll loop): raise the cap to the parent's committed
        positions, say ready once caught up, switch to FINAL when the parent drained and to LIVE at its final
        positions."""
        state = self.state
        if state is None or state.phase == CatchUpPhase.LIVE:
            return
        committed = last_committed_batch(self.paths.checkpoint)
        end = self.positions_at(committed) if committed >= 0 else None
        if state.phase == CatchUpPhase.SHADOW:
            if self._drained() is not None:
                final = self._own(self._drain_summary().positions)
                # No cap from here: the batch that reaches F may pass it and emits its records' results from F on.
                state = self.state = CatchUpState(
                    state.parent, state.manifest, CatchUpPhase.FINAL, final=final, ready=state.ready
                )
                self._save()
                log.info(
                    "shard %s: parent %s drained at %s; catching up to there",
                    self.io.config.shard,
                    self.parent,
                    final,
                )
            else:
                self._follow(state, end)
                return
        if end is not None and state.final is not None and at_or_after(end, state.final):
            self.state = CatchUpState(state.parent, state.manifest, CatchUpPhase.LIVE, final=state.final, ready=True)
            self._save()
            log.info(
                "shard %s caught up with its parent's final positions at batch %d: it emits from here",
                self.io.config.shard,
                committed,
            )

    def _follow(self, state: CatchUpState, end: dict[str, Any] | None) -> None:
        """Raise the limit to the parent's latest committed positions; say ready once a batch of this child ended
        exactly at a limit it was given from the parent's progress (that batch took everything the parent had
        committed when it was planned: the child keeps pace, at most one of its batches behind). Comparing with
        the *current* limit instead would depend on luck whenever the parent commits faster than the child."""
        if not state.ready and end is not None and any(end == own for own in self._limits_given):
            self.io.fence.check("its ready note")
            note = self._note()
            self.parent_paths.handover_ready(note.child, note.epoch).write_json(note.to_json())
            state = self.state = CatchUpState(state.parent, state.manifest, state.phase, limit=state.limit, ready=True)
            self._save()
            log.info("shard %s caught up with parent %s: ready", self.io.config.shard, self.parent)
        progress = self.parent_paths.progress
        if not progress.exists():
            return
        data = progress.read_json()
        batch = int(data.get("batchId", -1))
        if self._limit_batch is not None and batch <= self._limit_batch:
            return
        limit = self._own(data["positions"])
        if state.limit is None or limit != state.limit and at_or_after(limit, state.limit):
            self.state = CatchUpState(state.parent, state.manifest, state.phase, limit=limit, ready=state.ready)
            self._save()
        self._limit_batch = batch
        self._limits_given = [*self._limits_given[-(LIMITS_KEPT - 1) :], limit]

    def emission(self, batch_id: int) -> Emission:
        """What batch ``batch_id`` of this child writes to the sink (see the module docstring)."""
        state = self.state
        if state is None:
            return Emission.ALL
        if batch_id == 0 or state.final is None:
            return Emission.NONE
        return state.emission(self.positions_at(batch_id - 1), self.positions_at(batch_id))


_State = TypeVar("_State", CatchUpState, MergeCatchUpState)


def save_catch_up(io: ShardIO, state: _State) -> _State:
    """Write ``state`` as the shard's ``catch-up.json``, stamped with its writer epoch (the fence checked first);
    returns the stamped state."""
    io.paths.shard_dir.mkdir()
    io.fence.check("catch-up.json")
    stamped = replace(state, writer_epoch=io.fence.epoch)
    io.paths.catch_up.write_json(stamped.to_json())
    return stamped


def refuse_state_it_cannot_run_on(run: RunState, parents: list[ShardPaths]) -> None:
    """A restore-mode successor's Python state schema checked against each parent's recorded one
    (``state-schema.json``) before it says ready. A parent drains only once its successors are ready, so a template
    that cannot run on the parents' state is refused (:class:`~spark_runtime.problems.TemplateRefused`,
    ``StateSchemaIncompatible``) while they still own their ranges; the restore plan checks the drained manifests
    again (a parent without a record, or a builtin processor: nothing to check here)."""
    from spark_runtime.engine.schema import SchemaIncompatible, StateSchema
    from spark_runtime.problems import TemplateRefused
    from spark_runtime.protocol import STATE_SCHEMA_INCOMPATIBLE

    wanted = run.plan.schema
    if wanted is None:
        return
    for parent in parents:
        record = parent.state_schema
        if not record.exists():
            continue
        try:
            wanted.evolve(StateSchema.from_json(record.read_json()))
        except SchemaIncompatible as exc:
            raise TemplateRefused(
                STATE_SCHEMA_INCOMPATIBLE,
                "processor.python",
                f"{exc} (the state of {parent.shard}); refused before the hand-over began: {parent.shard} keeps "
                "its range, and this shard stays stopped until the Task's template changes or the hand-over is "
                "withdrawn",
            ) from None


def announce_and_wait(
    io: ShardIO,
    run: RunState,
    calls: StandbyCalls,
    parents: list[ShardPaths],
    make_note: Callable[[], HandoverNote],
    *,
    describe: str,
    answered: Callable[[], bool],
    rehearse: bool,
    ready_at_once: bool,
) -> tuple[float, float]:
    """A child's standby: warm up (until ``answered()``), write its request (and with ``ready_at_once`` its ready
    note), ``make_note()``, scoped to its writer epoch, into each parent's ``handover/`` (``parents``: their
    :class:`~spark_runtime.layout.ShardPaths`), then wait until ``answered()``; raises :class:`StandbyStopped` on a
    stop request. Returns when it began and when it was warm (epoch seconds); sets ``run.standby_seconds``."""
    cfg = io.config
    if ready_at_once:
        refuse_state_it_cannot_run_on(run, parents)
    t0, began = time.monotonic(), time.time()
    set_log_phase("standby")
    owns = "still owns the range" if len(parents) == 1 else "still own their ranges"
    note = make_note()
    log.info("shard %s on standby: %s %s; warming up (%s)", cfg.shard, describe, owns, note.mode)
    calls.warm_up(rehearse, lambda: calls.stop_requested() or answered())
    warm = time.time()
    note = make_note()
    for parent in parents:
        parent.handover_dir.mkdir()
        io.fence.check("its hand-over request")
        parent.handover_request(note.child, note.epoch).write_json(note.to_json())
        if ready_at_once:
            parent.handover_ready(note.child, note.epoch).write_json(note.to_json())
    logged = time.monotonic()
    poll = POLL_SECONDS_S3 if io.storage.is_s3 else POLL_SECONDS
    while not answered():
        if calls.stop_requested():
            raise StandbyStopped(f"stopped on standby ({calls.drain_reason()}) before {describe} answered")
        if time.monotonic() - logged >= STANDBY_LOG_SECONDS:
            logged = time.monotonic()
            log.info("still on standby for %s (%.0fs)", describe, logged - t0)
        time.sleep(poll)
    run.standby_seconds = round(time.monotonic() - t0, 3)
    log.info("%s answered after %.1fs on standby", describe, run.standby_seconds)
    return began, warm


def record_standby(
    io: ShardIO, run: RunState, mode: HandoverMode, parent: str | list[str], began: float, warm: float
) -> None:
    """Write ``standby.json`` (when the standby began, was warm, and the parents answered)."""
    io.paths.shard_dir.mkdir()
    io.paths.standby.write_json(
        {
            "parent": parent,
            "mode": str(mode),
            "began": round(began, 3),
            "warm": round(warm, 3),
            "parentAnswered": round(time.time(), 3),
            "rehearsalSeconds": run.rehearsal_seconds,
            "standbySeconds": run.standby_seconds,
        },
        fsync=False,
    )


def read_drain_summary(pointer: Loc, parent: str) -> DrainSummary:
    """The drain summary at ``pointer`` (a parent's ``drained.json``); :class:`RestoreError` unless it is a
    drained shard's summary naming a manifest, of ``parent``."""
    data = pointer.read_json()
    event = data.get("event") if isinstance(data, dict) else None
    if event != SummaryEvent.DRAINED or not data.get("manifest"):
        raise RestoreError(
            f"restoreFrom.manifest: {pointer.uri()!r} is not a drain summary naming a manifest (got event "
            f"{event if isinstance(data, dict) else type(data).__name__!r})"
        )
    if data.get("shard") not in (None, parent):
        raise RestoreError(
            f"restoreFrom.manifest: {pointer.uri()!r} is the drain summary of shard {data.get('shard')!r}, "
            f"not of restoreFrom.parent {parent!r}"
        )
    return DrainSummary.from_json(data)


def parent_drained(
    pointer: Loc, parent_paths: ShardPaths, parent: str, me: tuple[str, int, int]
) -> DrainSummary | None:
    """The drain summary at ``pointer`` (``parent``'s ``drained.json``) once it exists and is valid, else None:
    it counts only while its writer epoch is still the parent's latest (a summary a fenced parent runtime wrote
    late, after a newer runtime of it or an abort claimed a later epoch, is void). Raises :class:`RestoreError`
    ``HandedToAnother`` when the parent handed over to successors that do not include ``me`` (``(shard, start,
    end)``): this shard must not restore what another successor took over."""
    if not pointer.exists():
        return None
    summary = read_drain_summary(pointer, parent)
    if not is_current(parent_paths, summary.writer_epoch):
        log.warning(
            "%s was written by writer epoch %s of %s, which a later one superseded: void",
            pointer.uri(),
            summary.writer_epoch,
            parent,
        )
        return None
    if not summary.hands_to(*me):
        named = ", ".join(f"{n} [{a}, {b})" for n, a, b in summary.successors or ())
        raise RestoreError(
            f"{parent} handed its range over to {named} at batch {summary.batch_id}, not to {me[0]} "
            f"[{me[1]}, {me[2]}): one hand-over per shard, so {me[0]} must not restore it (delete this TaskShard)",
            reason="HandedToAnother",
        )
    return summary


def own_drain_summary(paths: ShardPaths) -> dict[str, Any] | None:
    """A shard's own ``drained.json`` while it is valid (its writer epoch is the shard's latest), else None; a void
    one (a fenced runtime wrote it late, after a newer runtime or an abort claimed a later epoch) is removed, so
    the current runtime can drain and write its own."""
    if not paths.drained.exists():
        return None
    summary = paths.drained.read_json()
    epoch = summary.get("writerEpoch") if isinstance(summary, dict) else None
    if is_current(paths, epoch if isinstance(epoch, int) else None):
        return summary
    log.warning(
        "%s was written by writer epoch %s, which a later one superseded: void, removed", paths.drained.uri(), epoch
    )
    paths.drained.unlink()
    return None


def clear_shard_dir(paths: ShardPaths) -> list[str]:
    """Remove everything in a shard's directory but ``epochs/`` (its writer epochs must stay dense); returns the
    names removed."""
    removed = []
    if paths.shard_dir.exists():
        for entry in paths.shard_dir.iterdir():
            if entry.name == paths.epochs.name:
                continue
            if entry.is_dir():
                entry.rmtree()
            else:
                entry.unlink()
            removed.append(entry.name)
    return removed


def abort_split(io: ShardIO, children: list[str]) -> dict[str, Any]:
    """Undo the split of ``io``'s shard (see the module docstring) and return the termination message: a
    :class:`~spark_runtime.protocol.SplitAbortSummary`, or the drain summary when the hand-over happened already.
    Idempotent (a restart repeats it harmlessly)."""
    from spark_runtime.fencing import WriterFence

    cfg, paths = io.config, io.paths
    io.check_environment()
    summary = own_drain_summary(paths)
    if summary is not None:
        log.warning(
            "shard %s: the split cannot be aborted, the hand-over happened at batch %s",
            cfg.shard,
            summary.get("batchId"),
        )
        return summary
    io.fence.claim(barrier=True)  # from here on a drain summary an earlier runtime writes late is void
    own_drain_summary(paths)  # removes one written between the look above and the claim (void now)
    for child in children:
        child_paths = paths.shard_path(child)
        fence = WriterFence(child_paths)
        fence.claim(barrier=True)  # a child runtime still running is fenced, and all it wrote void, from here on
        removed = clear_shard_dir(child_paths)
        removed_names = ", ".join(sorted(removed)) or "nothing"
        log.info("shard %s: child %s fenced at epoch %s; removed %s", cfg.shard, child, fence.epoch, removed_names)
    io.fence.check("clearing its hand-over")
    paths.handover_dir.rmtree()
    paths.drain_marker.unlink()
    summary = SplitAbortSummary(
        task=cfg.task,
        shard=cfg.shard,
        batch_id=last_committed_batch(paths.checkpoint),
        children=tuple(children),
        writer_epoch=io.fence.epoch,
        time=utc_now(),
    ).to_json()
    log.info("shard %s: split aborted; it resumes from batch %s", cfg.shard, summary["batchId"])
    return summary
