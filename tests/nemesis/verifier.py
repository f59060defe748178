"""The nemesis's verifier: the promise checked the way a consumer reads the output, knowing nothing of shards'
lineage, drain summaries or the runtime's result readers.

The promise (docs/design-contracts.md, the directory sink): a Task with the builtin ``count`` processor publishes,
per micro-batch, one record per key that batch updated, ``{"key", "result", ...}``, with the key's count over all
input so far; a published file is complete and final (written elsewhere, renamed into place once its batch is
committed); hidden paths (a leading ``_`` or ``.``) are not output. So for every key:

- its largest published count equals its number of input records (nothing lost, nothing counted twice);
- no count is published twice (two emitting owners, or a batch replayed into the output, would repeat one);
- every count lies in ``[1, expected]``.

Dead letters (docs/engine.md and docs/split-protocol.md): a line that is not a JSON object with a non-null
``key`` is a dead letter, written once under ``<sink>/_dead_letters/shard=<shard>/`` as a JSON line naming its
``partition`` and ``offset`` (the byte offset of its line). So every malformed line of the journal appears there
exactly once, whichever shard read it, across every hand-over and restart, and nothing else does.

The input is read from the journal files themselves (one JSON object per line, field ``key``).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Verdict:
    """What the verifier found: keys lost (largest count too small), doubled (a count published twice or larger
    than the input), unknown keys in the output, and the counts it compared."""

    expected_records: int
    published_records: int
    lost: dict[str, tuple[int, int]] = field(default_factory=dict)
    """key -> (expected, largest published)"""
    doubled: dict[str, list[int]] = field(default_factory=dict)
    """key -> the counts published more than once, or above the input's"""
    unknown: list[str] = field(default_factory=list)
    malformed: int = 0
    """malformed lines in the journal (each one dead letter)"""
    letters_missing: list[tuple[int, int]] = field(default_factory=list)
    """(partition, offset) of malformed lines with no dead letter yet"""
    letters_repeated: list[tuple[int, int]] = field(default_factory=list)
    """(partition, offset) of dead letters written twice, or of lines that are not malformed"""

    @property
    def exact(self) -> bool:
        return not (self.lost or self.doubled or self.unknown or self.letters_missing or self.letters_repeated)

    @property
    def broken(self) -> bool:
        """A violation no later output can undo: a count published twice or too large, an unknown key, a dead
        letter written twice."""
        return bool(self.doubled or self.unknown or self.letters_repeated)

    def summary(self) -> str:
        return (
            f"{self.expected_records} input records, {self.published_records} published records; lost "
            f"{len(self.lost)} keys {dict(list(self.lost.items())[:5])}, doubled {len(self.doubled)} keys "
            f"{dict(list(self.doubled.items())[:5])}, unknown {self.unknown[:5]}; {self.malformed} malformed lines, "
            f"dead letters missing {self.letters_missing[:5]}, repeated {self.letters_repeated[:5]}"
        )


def read_journal(journal: Path) -> tuple[Counter[str], set[tuple[int, int]]]:
    """Records per key in a journal directory (``p<N>.jsonl`` files), and the ``(partition, offset)`` of each
    malformed line (not a JSON object with a non-null ``key``)."""
    counts: Counter[str] = Counter()
    malformed: set[tuple[int, int]] = set()
    for part in sorted(journal.glob("p*.jsonl")):
        partition, offset = int(part.stem[1:]), 0
        for line in part.read_bytes().splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # a line still being written: not input yet
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if isinstance(record, dict) and record.get("key") is not None:
                    counts[str(record["key"])] += 1
                else:
                    malformed.add((partition, offset))
            offset += len(line)
    return counts, malformed


def dead_letters(sink: Path) -> list[tuple[int, int]]:
    """Every dead letter of a directory sink's Task as its consumer reads them: ``(partition, offset)`` of each line
    of ``_dead_letters/shard=*/p*.jsonl`` (late records' files, ``late-b*``, are not the source's)."""
    return [
        (int(record["partition"]), int(record["offset"]))
        for path in sorted((sink / "_dead_letters").glob("shard=*/p*.jsonl"))
        for record in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    ]


def published(sink: Path) -> list[tuple[str, int]]:
    """Every published ``(key, count)`` of a directory sink, as a consumer lists it (hidden paths skipped)."""
    out = []
    for path in sorted(sink.rglob("*.jsonl")):
        if any(part.startswith(("_", ".")) for part in path.relative_to(sink).parts):
            continue
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                out.append((str(record["key"]), int(record["result"])))
    return out


def verify(journal: Path, sink: Path) -> Verdict:
    expected, malformed = read_journal(journal)
    records = published(sink)
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, count in records:
        by_key[key].append(count)
    verdict = Verdict(expected_records=sum(expected.values()), published_records=len(records))
    for key, want in sorted(expected.items()):
        counts = by_key.get(key, [])
        best = max(counts, default=0)
        repeated = sorted(c for c, n in Counter(counts).items() if n > 1 or c > want or c < 1)
        if repeated:
            verdict.doubled[key] = repeated
        if best < want:
            verdict.lost[key] = (want, best)
    verdict.unknown = sorted(set(by_key) - set(expected))
    letters = Counter(dead_letters(sink))
    verdict.malformed = len(malformed)
    verdict.letters_missing = sorted(malformed - set(letters))
    verdict.letters_repeated = sorted(at for at, n in letters.items() if n > 1 or at not in malformed)
    return verdict
