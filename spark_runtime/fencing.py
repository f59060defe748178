"""The writer fence: at most one runtime writes a shard's storage, and a superseded one stops without writing.

Exactly one process per shard is what every guarantee rests on (the recovery log, the snapshots, the hand-over
notes, the drain summary). Kubernetes cannot promise it: a pod on a partitioned node keeps running after the
operator (or the kubelet's eviction) replaced it, and a runtime started by hand on the same config is a second
writer too. The fence makes it safe:

- **Claim** (:meth:`WriterFence.claim`, once per runtime start, before anything is written): the runtime lists
  ``<shard>/epochs/``, takes the next epoch ``e = max + 1`` and creates ``epochs/<e>.json`` with
  :meth:`spark_runtime.storage.Loc.create_exclusive` (local: a hard link that fails if the name exists; S3: a
  conditional ``PUT`` ``If-None-Match: *``). That create is the compare-and-swap: of two runtimes claiming at the
  same moment exactly one gets ``e``; the other re-lists and takes ``e + 1``. Epochs therefore stay dense
  (1, 2, 3, ...; files are never deleted while the shard's directory lives).
- **Check** (:meth:`WriterFence.check`): a writer holding ``e`` is fenced once ``epochs/<e+1>.json`` exists
  (density makes one lookup enough: a local ``stat``, an S3 ``HEAD``). The runtime checks before everything it
  writes for the shard: at the start of each batch's ``foreachBatch`` (before the sink) and again at its end
  (right before Spark commits the batch), before ``progress.json``, the drain marker, a snapshot manifest, the
  pre-copy pointer, hand-over notes, the catch-up state and the final drain summary. A fenced runtime raises
  :class:`WriterFenced`: its query stops, nothing more is written, and the process exits 3 with reason
  ``WriterFenced`` on the TaskShard.

What is left between a check and the write it guards is milliseconds (no I/O of the batch in between). The one
write the runtime does not make itself, Spark's commit of a batch, is also fenced by Spark: offset and commit
log entries are created without overwrite, so of two writers of the same batch id the second fails ("concurrent
update to the log") and its query restarts from the log. Manifests and drain summaries are created exclusively
too, so a fenced writer can never replace what the current one wrote.
"""

from __future__ import annotations

import logging
import os
import socket

from spark_runtime.layout import ShardPaths
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.protocol import WriterEpoch, parse_epoch_name, rfc3339

__all__ = ["WriterFence", "WriterFenced", "barrier_after", "is_current"]

log = logging.getLogger(__name__)

CLAIM_ATTEMPTS = 50
"""Conflicting claims retried before giving up (each conflict means another runtime claimed at that moment)."""


class WriterFenced(EnvironmentProblem):
    """A newer runtime of the same shard holds a later writer epoch: this one must not write anything more."""

    def __init__(self, message: str) -> None:
        super().__init__("WriterFenced", "storage", message)


class WriterFence:
    """The writer epoch of one shard's runtime (see the module docstring)."""

    def __init__(self, paths: ShardPaths) -> None:
        self.paths = paths
        self.dir = paths.epochs
        self.shard = paths.shard
        self.epoch: int | None = None
        """The epoch this runtime holds (None before :meth:`claim`)."""
        self._fenced_by: int | None = None

    def latest(self) -> int:
        """The highest epoch claimed so far (0: none)."""
        if not self.dir.exists():
            return 0
        found = [parse_epoch_name(child.name) for child in self.dir.iterdir()]
        return max((e for e in found if e is not None), default=0)

    def claim(self, *, barrier: bool = False) -> int:
        """Take the next epoch (idempotent: a runtime claims once). Fences every runtime holding an earlier one;
        ``barrier`` (an abort claiming another shard's epoch) also voids every file an earlier epoch wrote
        (:func:`barrier_after`)."""
        if self.epoch is not None:
            return self.epoch
        for _ in range(CLAIM_ATTEMPTS):
            epoch = self.latest() + 1
            holder = WriterEpoch(
                epoch=epoch,
                shard=self.shard,
                pod=os.environ.get("HOSTNAME") or socket.gethostname(),
                pid=os.getpid(),
                started_at=rfc3339(),
                barrier=barrier,
            )
            if self.paths.epoch(epoch).create_exclusive_json(holder.to_json()):
                self.epoch = epoch
                log.info("shard %s: writer epoch %d (%s)", self.shard, epoch, self.dir.uri())
                return epoch
        raise EnvironmentProblem(
            "WriterEpochContended",
            "storage",
            f"storage: could not claim a writer epoch in {self.dir.uri()} after {CLAIM_ATTEMPTS} conflicting "
            "attempts: other runtimes of this shard keep starting",
        )

    def check(self, before: str) -> None:
        """Raise :class:`WriterFenced` when a later epoch exists; ``before`` names the write it guards (for the
        message). No-op before :meth:`claim` (nothing claimed, nothing to protect: tests that drive parts alone)."""
        if self.epoch is None:
            return
        if self._fenced_by is None:
            successor = self.paths.epoch(self.epoch + 1)
            if not successor.exists():
                return
            self._fenced_by = self.epoch + 1
            holder = successor.read_json()
            log.error("shard %s: fenced by writer epoch %s (%s)", self.shard, self._fenced_by, holder)
        raise WriterFenced(
            f"storage: shard {self.shard}'s writer epoch {self.epoch} was superseded by epoch {self._fenced_by} "
            f"({self.dir.uri()}): another runtime of this shard started after this one, so this one stops before "
            f"{before} and writes nothing more"
        )

    @property
    def fenced(self) -> bool:
        return self._fenced_by is not None


def is_current(paths: ShardPaths, epoch: int | None) -> bool:
    """Whether ``epoch`` is still the latest writer epoch of the shard at ``paths`` (no ``epochs/<epoch+1>.json``:
    one lookup, epochs being dense). A note or file of an older runtime (``epoch`` None) cannot be checked and
    counts as current."""
    return epoch is None or not paths.epoch(epoch + 1).exists()


def barrier_after(paths: ShardPaths, epoch: int | None) -> int | None:
    """The latest barrier epoch (an abort's claim, :attr:`WriterEpoch.barrier`) of the shard at ``paths`` later than
    ``epoch``, or None: a file written by ``epoch`` is void when one exists. Reads the epochs after ``epoch`` only
    (usually none or a few)."""
    if epoch is None:
        return None
    found = None
    at = epoch + 1
    while True:
        loc = paths.epoch(at)
        if not loc.exists():
            return found
        try:
            if WriterEpoch.from_json(loc.read_json()).barrier:
                found = at
        except (OSError, ValueError, KeyError):
            pass
        at += 1
