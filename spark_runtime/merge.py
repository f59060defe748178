"""The runtime's side of a merge: two adjacent shards hand their ranges to one child.

A merged child's config names both parents (``mergeFrom``, left first), each with its drain summary
(``.../shards/<parent>/drained.json``). Parents and child talk only through storage, as in a split
(:mod:`spark_runtime.handover`; names in :mod:`spark_runtime.protocol`). A merge always hands over in restore
mode: a child cannot follow two parents' commits at once::

      merged child [a, c)                       left parent [a, b)          right parent [b, c)
      ───────────────────                       ──────────────────          ───────────────────
      warm up (SparkSession, preflight,
      rehearsal of the restore plan)
      write request + ready note ─────────────> handover/ of both ────────> (the note covers each
                                                parents' directories         parent's whole range)
                                                drains at a batch boundary  drains at a batch boundary
                                                (export, manifest at F_L)   (export, manifest at F_R)
      <──────────────────────────────────────── drained.json                drained.json
      both answered: check both manifests (adjacent ranges that make up [a, c), same task, format, schema),
      verify both slices, start each partition p at min(F_L[p], F_R[p]) and skip, per key group, the rows
      below its own parent's final position (SkipRule); batch 0 seeds the state of both slices
      every later batch emits (the child owns [a, c))

Exactly once, by construction: a row of key group ``g`` in partition ``p`` at offset ``o`` was counted by g's
parent ``P`` iff ``o < F_P[p]`` (it is in P's snapshot); the child starts p at or below ``F_P[p]`` and drops
exactly those rows of g below ``F_P[p]`` (:class:`spark_runtime.protocol.SkipRule`, applied after the key-group
filter and to the journal's dead letters). The rule depends only on the manifests, so a restarted child plans
the same filter.

Crash safety: the notes are written once; a parent restarted mid-hand-over finds them and drains; a child
restarted on standby writes the same notes again and waits for both summaries; a child restarted after its
batch 0 resumes from its own recovery log (the parents' manifests are checked again, the seed never replays).
While one parent has drained and the other has not, the first one's range waits (no shard emits it): the
operator merges only two Running shards, neither mid-split, so both drain at their next batch boundary.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from spark_runtime.fencing import is_current
from spark_runtime.handover import StandbyCalls, announce_and_wait, clear_shard_dir, parent_drained, record_standby
from spark_runtime.protocol import (
    DRAIN_SUMMARY,
    DrainSummary,
    Emission,
    HandoverMode,
    HandoverNote,
    MergeAbortOutcome,
    MergeAbortSummary,
    parse_note_name,
)
from spark_runtime.snapshot import RestoreError, utc_now
from spark_runtime.storage import Loc, location

if TYPE_CHECKING:
    from spark_runtime.shard_state import RunState, ShardIO

__all__ = ["MergeHandover", "abort_merge"]

log = logging.getLogger("taskshard.handover")


class MergeHandover:
    """A merged child's side (see the module docstring); the same interface as
    :class:`spark_runtime.handover.ChildHandover` for the runner: it never catches up, and every batch emits.
    ``calls``: what its standby asks of the runner; it writes ``run.standby_seconds``."""

    mode = HandoverMode.RESTORE
    state = None
    catching_up = False

    def __init__(self, io: ShardIO, run: RunState, calls: StandbyCalls) -> None:
        cfg = io.config
        assert cfg.merge_from is not None
        self.io = io
        self.run = run
        self.calls = calls
        self.parents = [p.parent for p in cfg.merge_from]
        self.pointers = [location(p.manifest, io.s3) for p in cfg.merge_from]

    def manifests(self) -> list[tuple[str, Loc]]:
        """``[(parent, manifest)]`` for both parents; on standby until both answered (raises
        :class:`~spark_runtime.handover.StandbyStopped` on a stop request)."""
        if not self._answered():
            began, warm = announce_and_wait(
                self.io,
                self.run,
                self.calls,
                [self.io.paths.shard_path(p) for p in self.parents],
                self._note,
                describe=f"parents {' and '.join(self.parents)}",
                answered=self._answered,
                rehearse=True,
                ready_at_once=True,
            )
            record_standby(self.io, self.run, self.mode, self.parents, began, warm)
        return [
            (parent, self._manifest(parent, pointer))
            for parent, pointer in zip(self.parents, self.pointers, strict=True)
        ]

    def _note(self) -> HandoverNote:
        cfg = self.io.config
        start, end = cfg.key_groups.start, cfg.key_groups.end
        return HandoverNote(cfg.shard, start, end, self.mode, utc_now(), self.io.fence.epoch)

    def _summary(self, parent: str, pointer: Loc) -> DrainSummary | None:
        """The parent's valid drain summary naming this shard (:func:`spark_runtime.handover.parent_drained`)."""
        cfg = self.io.config
        me = (cfg.shard, cfg.key_groups.start, cfg.key_groups.end)
        return parent_drained(pointer, self.io.paths.shard_path(parent), parent, me)

    def _answered(self) -> bool:
        return all(
            p.name != DRAIN_SUMMARY or self._summary(parent, p) is not None
            for parent, p in zip(self.parents, self.pointers, strict=True)
        )

    def _manifest(self, parent: str, pointer: Loc) -> Loc:
        if pointer.name != DRAIN_SUMMARY:
            return pointer
        summary = self._summary(parent, pointer)
        if summary is None:
            raise RestoreError(
                f"mergeFrom: {pointer.uri()!r} is not a drain summary of the current writer of {parent}",
                reason="DrainSummaryVoid",
            )
        if summary.handover == HandoverMode.CATCH_UP:
            raise RestoreError(
                f"mergeFrom: parent {parent} handed over to catch-up children at batch {summary.batch_id}, not to "
                "this merge (its drain exported no snapshot of its final batch); a shard that was split cannot be "
                "merged",
                reason="MergeParentSplit",
            )
        return location(summary.manifest or "", self.io.s3)

    def tick(self) -> None:
        """Nothing to follow: the child restored both parents' final state."""

    def emission(self, batch_id: int) -> Emission:
        return Emission.ALL


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
