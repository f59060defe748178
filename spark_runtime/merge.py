"""The runtime's side of a merge: two adjacent shards hand their ranges to one child.

A merged child's config names both parents (``mergeFrom``, left first), each with its drain summary
(``.../shards/<parent>/drained.json``). Parents and child talk only through storage, as in a split
(:mod:`spark_runtime.handover`; names in :mod:`spark_runtime.protocol`).

Catch-up (``HandoverMode.CATCH_UP``: the journal or Kafka, no event time), as a split's but over two parents::

      merged child [a, c)                       left parent [a, b)          right parent [b, c)
      ───────────────────                       ──────────────────          ───────────────────
      warm up; write request ─────────────────> handover/ of both ────────> (covers each parent's range)
                                                pre-copy of batch K_L       pre-copy of batch K_R (queries run)
      <──────────────────────────────────────── precopy.json                precopy.json
      catch-up.json (kind merge, SHADOW); restore both pre-copies (batch 0): start each partition at the lower
      of K_L, K_R and skip, per key group, the rows below its own parent's K (SkipRule); follow both: every
      batch ends at or before, per file or partition, the lower of both parents' committed positions (nothing
      emitted)
      a batch ended exactly at such a cap:
      ready note into both ───────────────────> final drain, no export      final drain, no export
      <──────────────────────────────────────── drained.json (F_L)          drained.json (F_R)
      both drained: FINAL, no cap; a record of key group g is held iff it lies before F_owner(g) (the source
      cuts pieces at F_L and F_R and marks each for either parent: HELD_COLUMN, HELD_RIGHT_COLUMN); the batch
      that crosses both emits only what its unheld records produced; LIVE once its positions reach both

Restore (a processor with event time or timers, on every source, or a parent that had already drained): the child
warms up (with a rehearsal of its restore plan), writes its request and ready notes into both parents at once and
waits; each parent drains at a batch boundary exporting its final state (manifest at F_L, F_R); once both answered
the child checks both manifests (adjacent ranges that make up [a, c), same task, format, schema), verifies both
slices, starts each partition p at min(F_L[p], F_R[p]) and skips, per key group, the rows below its own parent's
final position (SkipRule); batch 0 seeds the state of both slices, and every later batch emits.

Exactly once, by construction: a row of key group ``g`` in partition ``p`` at offset ``o`` was counted by g's
parent ``P`` iff ``o`` is below P's snapshot position (``K_P[p]`` or ``F_P[p]``): the child starts p at or below
it and drops exactly those rows of g (:class:`spark_runtime.protocol.SkipRule`, applied after the key-group
filter and to the journal's dead letters). In catch-up mode P emitted the results of every row of g below
``F_P[p]``, and exactly those are held in the child. The rules depend only on the manifests and the final
positions, so a restarted child plans the same filter and decides the same.

Crash safety: the notes are written once; a parent restarted mid-hand-over finds them and drains; a child
restarted on standby writes the same notes again and waits; a child restarted while following or after its batch
0 resumes from its own recovery log and ``catch-up.json`` (the seed never replays). While one parent has drained
and the other has not, the first one's range waits (no shard emits it): the operator merges only two Running
shards, neither mid-split, so both drain at their next batch boundary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.fencing import barrier_after, is_current
from spark_runtime.handover import (
    LIMITS_KEPT,
    StandbyCalls,
    announce_and_wait,
    clear_shard_dir,
    parent_drained,
    record_standby,
    save_catch_up,
)
from spark_runtime.protocol import (
    DRAIN_SUMMARY,
    CatchUpPhase,
    DrainSummary,
    Emission,
    HandoverMode,
    HandoverNote,
    MergeAbortOutcome,
    MergeAbortSummary,
    MergeCatchUpState,
    at_or_after,
    parse_note_name,
    read_catch_up,
)
from spark_runtime.snapshot import RestoreError, utc_now
from spark_runtime.storage import Loc, location

if TYPE_CHECKING:
    from spark_runtime.shard_state import RunState, ShardIO

__all__ = ["MergeHandover", "abort_merge"]

log = logging.getLogger("taskshard.handover")


class MergeHandover:
    """A merged child's side (see the module docstring); the same interface as
    :class:`spark_runtime.handover.ChildHandover` for the runner. ``mode``: catch-up (a source that caps its reads:
    the journal, Kafka) or restore; ``positions_at(batch)``: its committed positions; ``calls``: what its standby
    asks of the runner. It writes ``run.standby_seconds``."""

    def __init__(
        self,
        io: ShardIO,
        run: RunState,
        mode: HandoverMode,
        positions_at: Callable[[int], dict[str, Any]],
        calls: StandbyCalls,
    ) -> None:
        cfg = io.config
        assert cfg.merge_from is not None
        self.io = io
        self.run = run
        self.mode = mode
        self.positions_at = positions_at
        self.calls = calls
        self.parents = [p.parent for p in cfg.merge_from]
        self.pointers = [location(p.manifest, io.s3) for p in cfg.merge_from]
        self.parent_paths = [io.paths.shard_path(p) for p in self.parents]
        self.state: MergeCatchUpState | None = None
        self._limit_batches: list[int | None] = [None, None]
        """Per parent, the batch whose positions are its current limit (None: not read from its progress yet)."""
        self._limits_given: list[dict[str, Any]] = []
        """The last caps read from the parents' progress (this process), newest last."""

    @property
    def catching_up(self) -> bool:
        return self.state is not None and self.state.phase != CatchUpPhase.LIVE

    # ---------------------------------------------------------------- before the query: which snapshots

    def manifests(self) -> list[tuple[str, Loc]]:
        """``[(parent, manifest)]`` for both parents: in catch-up mode their pre-copies (on standby until both
        answered), in restore mode (or once a parent drained before this child asked) their final snapshots
        (on standby until both drained). Raises :class:`~spark_runtime.handover.StandbyStopped` on a stop
        request."""
        if self.mode == HandoverMode.CATCH_UP and all(p.name == DRAIN_SUMMARY for p in self.pointers):
            state = self._resumed()
            if state is None and not any(self._summary(i) is not None for i in range(2)):
                state = self._catch_up_standby()
            if state is not None:
                return [(p, location(m, self.io.s3)) for p, m in zip(state.parents, state.manifests, strict=True)]
        if not self._answered():
            began, warm = announce_and_wait(
                self.io,
                self.run,
                self.calls,
                self.parent_paths,
                lambda: self._note(HandoverMode.RESTORE),
                describe=f"parents {' and '.join(self.parents)}",
                answered=self._answered,
                rehearse=True,
                ready_at_once=True,
            )
            record_standby(self.io, self.run, HandoverMode.RESTORE, self.parents, began, warm)
        return [(parent, self._manifest(i)) for i, parent in enumerate(self.parents)]

    def _note(self, mode: HandoverMode) -> HandoverNote:
        cfg = self.io.config
        start, end = cfg.key_groups.start, cfg.key_groups.end
        return HandoverNote(cfg.shard, start, end, mode, utc_now(), self.io.fence.epoch)

    def _summary(self, i: int) -> DrainSummary | None:
        """Parent ``i``'s valid drain summary naming this shard (:func:`spark_runtime.handover.parent_drained`)."""
        if self.pointers[i].name != DRAIN_SUMMARY:
            return None
        cfg = self.io.config
        me = (cfg.shard, cfg.key_groups.start, cfg.key_groups.end)
        return parent_drained(self.pointers[i], self.parent_paths[i], self.parents[i], me)

    def _answered(self) -> bool:
        return all(p.name != DRAIN_SUMMARY or self._summary(i) is not None for i, p in enumerate(self.pointers))

    def _manifest(self, i: int) -> Loc:
        pointer, parent = self.pointers[i], self.parents[i]
        if pointer.name != DRAIN_SUMMARY:
            return pointer
        summary = self._summary(i)
        if summary is None:
            raise RestoreError(
                f"mergeFrom: {pointer.uri()!r} is not a drain summary of the current writer of {parent}",
                reason="DrainSummaryVoid",
            )
        if summary.handover == HandoverMode.CATCH_UP:
            raise RestoreError(
                f"mergeFrom: parent {parent} handed over to catch-up successors at batch {summary.batch_id} (its "
                f"drain exported no snapshot of its final batch), but this shard's catch-up state "
                f"{self.io.paths.catch_up.uri()} is missing: restoring the pre-copy at the final positions would "
                "lose what came in between (was this shard's storage removed, or the parent split meanwhile?)",
                reason="CatchUpStateMissing",
            )
        return location(summary.manifest or "", self.io.s3)

    def _resumed(self) -> MergeCatchUpState | None:
        """The catch-up state a previous runtime of this shard wrote, unless an abort voided it since."""
        paths = self.io.paths
        if not paths.catch_up.exists():
            return None
        state = read_catch_up(paths.catch_up.read_json())
        barrier = barrier_after(paths, state.writer_epoch)
        if barrier is None and isinstance(state, MergeCatchUpState):
            self.state = state
            log.info("shard %s resumes its catch-up (%s)", self.io.config.shard, state.phase)
            return state
        log.warning("shard %s: its catch-up state is void (abort barrier %s); starting afresh", paths.shard, barrier)
        clear_shard_dir(paths)
        return None

    def _catch_up_standby(self) -> MergeCatchUpState | None:
        """Ask both parents for a pre-copy and wait for both (None: a parent drained meanwhile for a reason of its
        own: the restore path decides)."""
        precopies = [p.precopy for p in self.parent_paths]
        began, warm = announce_and_wait(
            self.io,
            self.run,
            self.calls,
            self.parent_paths,
            lambda: self._note(HandoverMode.CATCH_UP),
            describe=f"parents {' and '.join(self.parents)}",
            answered=lambda: all(p.exists() for p in precopies) or any(self._summary(i) for i in range(2)),
            rehearse=False,
            ready_at_once=False,
        )
        record_standby(self.io, self.run, HandoverMode.CATCH_UP, self.parents, began, warm)
        if any(self._summary(i) is not None for i in range(2)):
            return None
        left, right = (p.read_json() for p in precopies)
        boundary = int(location(str(left["manifest"]), self.io.s3).read_json()["keyGroups"]["end"])
        self.state = MergeCatchUpState(
            (self.parents[0], self.parents[1]),
            (str(left["manifest"]), str(right["manifest"])),
            boundary,
            CatchUpPhase.SHADOW,
            limits=(dict(left["positions"]), dict(right["positions"])),
        )
        self._save()
        return self.state

    # ---------------------------------------------------------------- while the query runs

    def _save(self) -> None:
        assert self.state is not None
        self.state = save_catch_up(self.io, self.state)

    def tick(self) -> None:
        """Follow both parents (the runner's poll loop): raise each one's limit to its committed positions, say
        ready to both once caught up, take each one's final positions once it drained (FINAL when both did), and
        go LIVE once this shard's positions reach both."""
        state = self.state
        if state is None or state.phase == CatchUpPhase.LIVE:
            return
        committed = last_committed_batch(self.io.paths.checkpoint)
        end = self.positions_at(committed) if committed >= 0 else None
        if state.phase == CatchUpPhase.SHADOW:
            finals = tuple(f if f is not None else self._final(i) for i, f in enumerate(state.finals))
            if finals != state.finals:
                phase = CatchUpPhase.FINAL if all(f is not None for f in finals) else CatchUpPhase.SHADOW
                state = self.state = replace(state, finals=(finals[0], finals[1]), phase=phase)
                self._save()
                log.info("shard %s: parents' final positions %s (%s)", self.io.config.shard, list(finals), phase)
            if state.phase == CatchUpPhase.SHADOW:
                self._follow(state, end)
                return
        if end is not None and all(f is not None and at_or_after(end, f) for f in state.finals):
            self.state = replace(state, phase=CatchUpPhase.LIVE, ready=True)
            self._save()
            log.info(
                "shard %s caught up with both parents' final positions at batch %d: it emits from here",
                self.io.config.shard,
                committed,
            )

    def _final(self, i: int) -> dict[str, Any] | None:
        summary = self._summary(i)
        return dict(summary.positions) if summary is not None else None

    def _follow(self, state: MergeCatchUpState, end: dict[str, Any] | None) -> None:
        """As :meth:`spark_runtime.handover.ChildHandover._follow`, over both parents: ready (a note into each
        parent's ``handover/``) once a batch of this child ended exactly at a cap it was given."""
        if not state.ready and end is not None and any(end == given for given in self._limits_given):
            self.io.fence.check("its ready notes")
            note = self._note(HandoverMode.CATCH_UP)
            for paths in self.parent_paths:
                paths.handover_ready(note.child, note.epoch).write_json(note.to_json())
            state = self.state = replace(state, ready=True)
            self._save()
            log.info("shard %s caught up with parents %s: ready", self.io.config.shard, state.parent)
        limits = list(state.limits)
        for i, paths in enumerate(self.parent_paths):
            if state.finals[i] is not None or not paths.progress.exists():
                continue
            data = paths.progress.read_json()
            batch = int(data.get("batchId", -1))
            seen = self._limit_batches[i]
            if seen is not None and batch <= seen:
                continue
            limit = dict(data["positions"])
            current = limits[i]
            if current is None or limit != current and at_or_after(limit, current):
                limits[i] = limit
            self._limit_batches[i] = batch
        if tuple(limits) != state.limits:
            state = self.state = replace(state, limits=(limits[0], limits[1]))
            self._save()
        cap = state.limit
        if cap and (not self._limits_given or self._limits_given[-1] != cap):
            self._limits_given = [*self._limits_given[-(LIMITS_KEPT - 1) :], cap]

    def emission(self, batch_id: int) -> Emission:
        """What batch ``batch_id`` writes to the sink: everything in restore mode; in catch-up mode nothing in
        its batch 0 (the seed) or before both parents drained, then by :meth:`MergeCatchUpState.emission`."""
        state = self.state
        if state is None:
            return Emission.ALL
        if batch_id == 0 or state.final is None:
            return Emission.NONE
        return state.emission(self.positions_at(batch_id - 1), self.positions_at(batch_id))


def abort_merge(io: ShardIO) -> dict[str, Any]:
    """Withdraw the merge into ``io``'s (merged) shard (``run --abort-merge``; the operator runs it once the
    left parent's ``spec.merge`` was withdrawn and the merged shard's own pod is gone) and return the termination
    message, a :class:`~spark_runtime.protocol.MergeAbortSummary`:

    1. claim the merged shard's next writer epoch as a **barrier**: a merged-shard runtime still alive is fenced,
       and its ready notes are void for every parent from this moment on;
    2. look at each parent: a valid drain summary, or a ``final`` drain marker (a final drain is sticky), means
       it drained or drains for this merge: **TooLate**, the merge completes (the merged shard's next runtime
       claims a later epoch and writes fresh notes);
    3. else **Aborted**: remove the merged shard's notes from both parents' ``handover/`` and clear its own
       directory (but ``epochs/``); both parents go on.

    Exact: a parent writes its final drain marker and only then checks that its successors' notes are still
    current (:meth:`spark_runtime.drain.Drain.run`). If that check came after step 1 the parent backs out; if it
    came before, so did its marker, and step 2 (after step 1) sees it. Idempotent: a rerun claims another barrier
    and finds the same."""
    cfg = io.config
    io.check_environment()
    epoch = io.fence.claim(barrier=True)
    parents = [p.parent for p in cfg.merge_from or ()]
    drained = []
    for parent in parents:
        paths = io.paths.shard_path(parent)
        summary = paths.drained.read_json() if paths.drained.exists() else None
        marker = paths.drain_marker
        if (summary is not None and is_current(paths, summary.get("writerEpoch"))) or (
            marker.exists() and marker.read_text().startswith("final")
        ):
            drained.append(parent)
    if drained:
        outcome = MergeAbortOutcome.TOO_LATE
        log.warning("shard %s: the merge cannot be withdrawn, %s drained for it", cfg.shard, " and ".join(drained))
    else:
        outcome = MergeAbortOutcome.ABORTED
        for parent in parents:
            handover = io.paths.shard_path(parent).handover_dir
            for f in handover.iterdir() if handover.exists() else []:
                parsed = parse_note_name(f.name)
                if parsed is not None and parsed[1] == cfg.shard:
                    f.unlink()
        removed = clear_shard_dir(io.paths)
        log.info("shard %s: merge withdrawn; fenced at epoch %s, removed %s", cfg.shard, epoch, removed or "nothing")
    return MergeAbortSummary(cfg.task, cfg.shard, outcome, tuple(drained), epoch, utc_now()).to_json()
