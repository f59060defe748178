"""Late records' dead letters: one file per batch that had any, ``late-b<batch>.jsonl``, and their count.

A batch's late records (the ``_late`` output rows of :class:`spark_runtime.engine.stateful.RunsProcessor`) are
written by the runner's ``foreachBatch`` before the batch commits, all or nothing, under a name fixed by the batch
id: a replay of the batch (same input, same watermark) rewrites the same file with the same records, so each late
record is counted once. The files go next to the shard's other dead letters when it has a local dead-letter
directory (``sink.directory``, or ``storage.path``), else in the shard's directory of the Task's storage
(``<storage>/<task>/shards/<shard>/dead-letters/``, S3 included).

:class:`LateLetters` counts them: every existing file once at start (a listing), then each file this runtime
writes whose name it has not counted yet.
"""

from __future__ import annotations

from spark_runtime.storage import Loc

__all__ = ["LATE_FILE_PREFIX", "LateLetters"]

LATE_FILE_PREFIX = "late-b"
"""Late records' dead-letter files: ``late-b<batch>.jsonl``."""


def late_file_name(batch_id: int) -> str:
    return f"{LATE_FILE_PREFIX}{batch_id}.jsonl"


class LateLetters:
    """The late-record files of one shard in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Loc) -> None:
        self.directory = directory
        self.counted: dict[str, int] | None = None

    def _counted(self) -> dict[str, int]:
        if self.counted is None:
            found: dict[str, int] = {}
            if self.directory.exists():
                for f in self.directory.iterdir():
                    if f.name.startswith(LATE_FILE_PREFIX) and f.name.endswith(".jsonl"):
                        found[f.name] = sum(1 for line in f.read_text().splitlines() if line.strip())
            self.counted = found
        return self.counted

    @property
    def total(self) -> int:
        """Late records of this shard, all runs."""
        return sum(self._counted().values())

    def drop_after(self, batch_id: int) -> int:
        """Remove the files of batches after ``batch_id`` (the last committed one, at a drain): an interrupted
        batch wrote its file before it could commit, and its successors redo its input. Returns the records
        dropped."""
        counted = self._counted()
        dropped = 0
        for name in [n for n in counted if int(n[len(LATE_FILE_PREFIX) : -len(".jsonl")]) > batch_id]:
            (self.directory / name).unlink()
            dropped += counted.pop(name)
        return dropped

    def write(self, batch_id: int, letters: list[str]) -> None:
        """Write batch ``batch_id``'s late records (JSON lines) all or nothing; count them once."""
        counted = self._counted()
        name = late_file_name(batch_id)
        (self.directory / name).write_bytes("".join(line + "\n" for line in letters).encode("utf-8"), fsync=False)
        counted.setdefault(name, len(letters))
