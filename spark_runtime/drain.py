"""A shard's drain: stop at a micro-batch boundary and leave exact positions and state behind.

Steps, each safe to crash in (a restart with the drain marker present repeats the drain from the step it
reached, without starting the query again; :mod:`spark_runtime.faults` kills the process after each one in the
crash tests). A query that failed (a poison record) does not stop a drain: the failing batch never committed, so
steps 4-7 export the last committed one and the split finishes; the children, new pods, redo the rest.

1. Persist the request: create ``drain-requested`` (``final`` or ``stop``). From now on the journal source
   admits no new data, so no new micro-batch starts (the running one, if any, finishes).
2. Wait for the batch boundary: no trigger active and every planned batch committed.
3. Stop the query (nothing is running, so nothing is interrupted); account for batches whose progress event
   the stop cut off (:meth:`Drain.recount_unreported_batches`).
4. Read the last committed batch ``N`` and its source end positions (concrete) from the checkpoint; the
   directory sink publishes its batches up to ``N`` and deletes the output of any later, uncommitted one, and
   the dead letters such a batch wrote go too (:meth:`Drain.drop_uncommitted_dead_letters`).
5. Export the state at ``N`` as a key-group-indexed snapshot (:mod:`spark_runtime.snapshot.export`). Skipped by
   a final drain whose children all caught up: they hold the state already, and the summary names the pre-copy
   manifest (:mod:`spark_runtime.handover`).
6. The snapshot's ``manifest.json``, written last: its presence marks the snapshot complete.
7. Final drain: write ``drained.json`` (:class:`spark_runtime.protocol.DrainSummary`, event ``drained``),
   exclusively: it is never replaced once written. Stop (SIGTERM alone): remove the drain marker instead (event
   ``stopped``), so the next pod resumes from the recovery log.

A *final* drain (a split's hand-over, or ``drain()`` called directly) is sticky: once its marker exists, a
SIGTERM cannot turn it into a stop, because the children own the key groups from then on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_runtime import faults
from spark_runtime.checkpoint import last_committed_batch, last_planned_batch
from spark_runtime.handover import own_drain_summary
from spark_runtime.logs import set_phase as set_log_phase
from spark_runtime.protocol import DrainSummary, HandoverMode, HandoverNote, SummaryEvent
from spark_runtime.sink import DirectorySinkWriter
from spark_runtime.snapshot import load_manifest, utc_now
from spark_runtime.sources import RecountsBatches
from spark_runtime.storage import location

if TYPE_CHECKING:
    from spark_runtime.handover import ParentHandover
    from spark_runtime.progress import Progress
    from spark_runtime.shard_state import RunState, ShardIO
    from spark_runtime.snapshot.export import SnapshotWriter

__all__ = ["Drain", "marker_successors", "marker_text", "wait_until"]

log = logging.getLogger("taskshard.shard")

STOP_SOON_SECONDS = 10.0
"""The boundary wait of a source that cannot hold back new data (Kafka): stop soon, the children redo the rest."""


def marker_text(kind: str, successors: list[HandoverNote]) -> str:
    """The drain marker's content: ``final`` or ``stop``, the time, and the ready notes of the successors a final
    drain is for (JSON), so a restart can check them again."""
    notes = json.dumps([n.to_json() for n in successors], separators=(",", ":"))
    return f"{kind} {utc_now()} {notes}\n"


def marker_successors(text: str) -> list[HandoverNote]:
    """The successors a drain marker names ([] for a stop, a drain called directly, or an older runtime's)."""
    parts = text.strip().split(" ", 2)
    if len(parts) < 3:
        return []
    try:
        return [HandoverNote.from_json(n) for n in json.loads(parts[2])]
    except (ValueError, KeyError, TypeError):
        return []


def wait_until(predicate: Any, timeout: float, interval: float = 0.2) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Drain:
    """The drain of one shard: its request (thread- and signal-safe) and its steps, over the shard's I/O and run
    state (its query, stopped here), its side as a parent (the successors it drains for, the pre-copy), its
    progress and snapshot writer; ``poll_after_stop()`` accounts for the batches the stopped query reported."""

    def __init__(
        self,
        io: ShardIO,
        run: RunState,
        parent: ParentHandover,
        progress: Progress,
        snapshots: SnapshotWriter,
        poll_after_stop: Callable[[], None],
        timeout: float,
    ) -> None:
        self.io = io
        self.run_state = run
        self.parent = parent
        self.progress = progress
        self.snapshots = snapshots
        self.poll_after_stop = poll_after_stop
        self.timeout = timeout
        self._requested = threading.Event()
        self.reason = ""
        self._final = False

    # ---------------------------------------------------------------- the request

    def request(self, reason: str, *, final: bool) -> None:
        """Ask for a drain; the runner performs it at its next poll. ``final=False`` (a SIGTERM alone) stops
        at a batch boundary with a savepoint and leaves the shard resumable. Once final, always final."""
        self.reason = self.reason or reason
        self._final = self._final or final
        self._requested.set()

    def requested_here(self) -> bool:
        """A drain or stop was requested in this process (SIGTERM, ready children, a caller)."""
        return self._requested.is_set()

    def final_pending(self) -> bool:
        """A final drain began in an earlier run (a ``final`` drain marker)."""
        marker = self.io.paths.drain_marker
        return marker.exists() and marker.read_text().startswith("final")

    def withdraw(self) -> None:
        """Forget a drain request whose successors are no longer current (see :meth:`run`): the shard goes on."""
        self._requested.clear()
        self._final = False
        self.reason = ""

    def back_out_of_earlier(self) -> bool:
        """A final drain an earlier run began (its marker) for successors that are no longer current (an abort
        fenced one since): remove the marker and return True, so the shard starts as before; False otherwise."""
        marker = self.io.paths.drain_marker
        successors = marker_successors(marker.read_text()) if marker.exists() else []
        if not successors or self.parent.confirm(successors):
            return False
        log.warning(
            "shard %s: the final drain an earlier run began was for %s, no longer current (fenced by an abort): "
            "backing out, the shard goes on",
            self.io.config.shard,
            ", ".join(n.describe() for n in successors),
        )
        self.io.fence.check("removing the drain marker")
        marker.unlink()
        return True

    def requested(self) -> bool:
        """A drain is due: requested in this process, or begun by an earlier run (its marker exists)."""
        if self._requested.is_set():
            return True
        if self.io.paths.drain_marker.exists():
            self.request("drain marker from an earlier run", final=True)
            return True
        return False

    # ---------------------------------------------------------------- the steps

    def run(self) -> dict[str, Any] | None:
        """Drain (see the module docstring); returns the summary, or None when a final drain for successors backed
        out (an abort fenced one of them before the marker was written: the shard goes on). Idempotent. A
        superseded runtime raises :class:`~spark_runtime.fencing.WriterFenced` even when a summary exists (its
        successor wrote it)."""
        r = self.io
        r.fence.check("the drain")
        found = own_drain_summary(r.paths)
        if found is not None:
            return found
        t0 = time.monotonic()
        # called directly it is final, and so is one a restart found begun (a SIGTERM cannot make it a stop)
        final = self._final or not self._requested.is_set() or self.final_pending()
        kind = "final" if final else "stop"
        set_log_phase("draining")
        log.info("shard %s draining (%s, %s)", r.config.shard, self.reason or "request", kind)
        # Step 1: persist the request; the source stops admitting data.
        if not self._mark(final, kind):
            return None
        faults.crash_point("marker")  # crash tests only (spark_runtime.faults), as at each step below
        # Steps 2-3: the micro-batch boundary, then stop.
        self.stop_at_boundary()
        self.parent.wait_export()
        faults.crash_point("stopped")
        # Step 4: the last committed batch and its positions (concrete: a child resumes exactly there).
        batch_id = last_committed_batch(r.paths.checkpoint)
        if isinstance(r.sink, DirectorySinkWriter):  # publish batches <= N; drop an interrupted batch's file
            r.sink.publish_committed(batch_id)
        positions = self.progress.positions_at(batch_id)
        r.source.validate_positions(positions)
        self.drop_uncommitted_dead_letters(batch_id, positions)
        # Steps 5-6: the snapshot and its manifest, unless every child caught up (it has the state already).
        if r.dead_letters is not None:
            r.dead_letters.refresh()
        caught_up = final and self.parent.catch_up_only()
        if caught_up:
            precopy = self.parent.ensure_precopy()
            manifest_uri, snapshot_batch = precopy["manifest"], int(precopy["batchId"])
            manifest = load_manifest(location(manifest_uri, r.s3))
        else:
            manifest, where = self.snapshots.write(batch_id, in_drain=True)
            manifest_uri, snapshot_batch = where.uri(), batch_id
        faults.crash_point("manifest")
        # Step 7: the summary.
        summary = self._summary(
            final, caught_up, batch_id, positions, manifest, manifest_uri, snapshot_batch, time.monotonic() - t0
        )
        if final:
            summary = self._write_summary(summary)
            faults.crash_point("summary")
        else:
            r.paths.drain_marker.unlink()
        set_log_phase(str(summary["event"]))
        log.info("shard %s %s at batch %d: %s", r.config.shard, summary["event"], batch_id, manifest_uri)
        return summary

    def drop_uncommitted_dead_letters(self, batch_id: int, positions: dict[str, Any]) -> None:
        """Step 4: dead letters exactly once. A batch the drain interrupted (its boundary bound passed, its query
        failed, a kill during a final drain) wrote its dead letters before it could commit; the successors redo
        its input from ``positions`` and write their own. So the drain removes the source's files of ranges past
        them and the late records' files of batches after ``batch_id``, before the summary counts them."""
        r = self.io
        dropped = 0
        if r.dead_letters is not None:
            dropped += r.dead_letters.drop_uncommitted(positions)
        if r.late_letters is not None:
            dropped += r.late_letters.drop_after(batch_id)
        if dropped:
            log.warning(
                "shard %s: removed %d dead letters of a batch after %d that never committed (its successors redo it)",
                r.config.shard,
                dropped,
                batch_id,
            )

    def _mark(self, final: bool, kind: str) -> bool:
        """Step 1: the drain marker. A final drain for successors names them in it and then checks them once
        more: an abort that fenced one before the marker existed makes it back out (False: the marker is removed,
        the request forgotten, the shard goes on); an abort after it finds the marker (spark_runtime.merge,
        abort_merge). A marker an earlier run wrote is kept, with the successors it names."""
        r = self.io
        r.fence.check("the drain marker")
        r.paths.shard_dir.mkdir()
        marker = r.paths.drain_marker
        if self.final_pending():
            successors = marker_successors(marker.read_text())
            self.parent.successors = successors
        else:
            successors = self.parent.successors if final else []
            marker.write_text(marker_text(kind, successors))
        if successors and not self.parent.confirm(successors):
            log.warning("shard %s: a successor was fenced before the drain began; backing out", r.config.shard)
            marker.unlink()
            self.withdraw()
            self.parent.successors = []
            return False
        return True

    def _write_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Step 7 of a final drain: ``drained.json``, created exclusively; a valid one written before is kept (and
        returned), a void one (written late by a fenced runtime) is replaced."""
        r = self.io
        r.fence.check("the drain summary")
        if r.paths.drained.create_exclusive_json(summary):
            return summary
        kept = own_drain_summary(r.paths)  # removes a void one
        if kept is not None:
            log.warning("shard %s: a drain summary was already written; keeping it: %s", r.config.shard, kept)
            return kept
        return summary if r.paths.drained.create_exclusive_json(summary) else r.paths.drained.read_json()

    def _summary(
        self,
        final: bool,
        caught_up: bool,
        batch_id: int,
        positions: dict[str, Any],
        manifest: dict[str, Any],
        manifest_uri: str,
        snapshot_batch: int,
        seconds: float,
    ) -> dict[str, Any]:
        r = self.io
        cfg = r.config
        return DrainSummary(
            event=SummaryEvent.DRAINED if final else SummaryEvent.STOPPED,
            task=cfg.task,
            shard=cfg.shard,
            key_groups=manifest["keyGroups"],
            batch_id=batch_id,
            manifest=manifest_uri,
            positions=positions,
            state_rows=manifest["snapshot"].get("rows", 0),
            snapshot_files=manifest["snapshot"].get("files", 0),
            dead_letters=self.progress.dead_letter_total() if caught_up else manifest.get("deadLetters", 0),
            drain_seconds=round(seconds, 3),
            time=utc_now() if caught_up else manifest.get("createdAt"),
            handover=(HandoverMode.CATCH_UP if caught_up else HandoverMode.RESTORE) if final else None,
            snapshot_batch_id=snapshot_batch,
            writer_epoch=r.fence.epoch,
            successors=tuple((n.child, n.start, n.end) for n in self.parent.successors)
            if final and self.parent.successors
            else None,
        ).to_json()

    def at_boundary(self) -> bool:
        """No micro-batch runs: no active trigger, and every planned batch committed."""
        r = self.io
        q = self.run_state.query
        if q is None or not q.isActive:
            return True
        if q.status.get("isTriggerActive"):
            return False
        return last_planned_batch(r.paths.checkpoint) == last_committed_batch(r.paths.checkpoint)

    def stop_at_boundary(self) -> None:
        """Steps 2-3: wait for the micro-batch boundary (bounded), stop the query, account for its last
        batches. A failed query does not stop a drain (its failing batch never committed)."""
        r = self.io
        query = self.run_state.query
        if query is None:
            return
        # A source that cannot hold back new data (Kafka) may run batches back to back under a backlog, and a
        # processor with processing-time timers runs a batch every trigger even without input, so waiting long for
        # a boundary only delays the split: stop soon and let the children redo the interrupted batch (the
        # snapshot is of the last committed one).
        back_to_back = not r.source.supports_drain_marker or self.run_state.plan.time_mode == "ProcessingTime"
        timeout = min(self.timeout, STOP_SOON_SECONDS) if back_to_back else self.timeout
        if not wait_until(self.at_boundary, timeout):
            log.warning(
                "no batch boundary within %.0fs; stopping anyway (the snapshot uses the last "
                "committed batch, so it stays exact)",
                timeout,
            )
        if query.isActive:
            query.stop()
        exc = query.exception()
        if exc is not None:
            # A failed query (a poison record, a lost dependency) must not make the split impossible: its
            # failing batch never committed, so the snapshot of the last committed batch is exact, and the
            # children (new pods, with any template fix) redo the rest. Crash-looping here never ends.
            log.warning(
                "the streaming query failed before or during the drain (%s); exporting the last committed batch %d",
                str(exc).splitlines()[0][:300],
                last_committed_batch(r.paths.checkpoint),
            )
        self.poll_after_stop()
        self.recount_unreported_batches()

    def recount_unreported_batches(self) -> None:
        """Spark posts a batch's progress, and with it the batch's observed source metrics, right after the
        batch's commit; a stop that lands in between loses them (the children start after that batch, so nobody
        would count its dead letters). Recount each such committed batch of this runner from the source, where
        the source can (Kafka: a batch read of exactly the batch's offset range); otherwise log the gap."""
        r = self.io
        progress, context = self.progress, self.run_state.source_context
        recount = r.source.recount if isinstance(r.source, RecountsBatches) else None
        if progress.batches_from is None or context is None:
            return
        committed = last_committed_batch(r.paths.checkpoint)
        for bid in range(progress.batches_from + 1, committed + 1):
            if progress.reported(bid):
                continue
            metrics = None
            if recount is not None:
                try:
                    start, end = progress.positions_at(bid - 1), progress.positions_at(bid)
                    metrics = recount(self.run_state.spark, context, start, end)
                except Exception:  # the counts are reported, not load-bearing: the drain goes on
                    log.exception("could not recount the source metrics of batch %s", bid)
            if metrics is None:
                log.warning("batch %s committed without a progress event; its source metrics are not counted", bid)
                continue
            progress.add_source_metrics(bid, metrics)
            log.warning(
                "batch %s committed without a progress event (the stop came in between); recounted from the "
                "source: %s (dead letters total %d)",
                bid,
                metrics,
                self.progress.dead_letter_total(),
            )
