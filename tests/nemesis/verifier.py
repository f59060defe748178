"""The nemesis's verifier: the promise checked the way a consumer reads the output, knowing nothing of shards'
lineage, drain summaries or the runtime's result readers.

The promise (docs/design-contracts.md, the directory sink): a Task with the builtin ``count`` processor publishes,
per micro-batch, one record per key that batch updated, ``{"key", "result", ...}``, with the key's count over all
input so far; a published file is complete and final (written elsewhere, renamed into place once its batch is
committed); hidden paths (a leading ``_`` or ``.``) are not output. So for every key:

- its largest published count equals its number of input records (nothing lost, nothing counted twice);
- no count is published twice (two emitting owners, or a batch replayed into the output, would repeat one);
- every count lies in ``[1, expected]``.

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

    @property
    def exact(self) -> bool:
        return not (self.lost or self.doubled or self.unknown)

    def summary(self) -> str:
        return (
            f"{self.expected_records} input records, {self.published_records} published records; lost "
            f"{len(self.lost)} keys {dict(list(self.lost.items())[:5])}, doubled {len(self.doubled)} keys "
            f"{dict(list(self.doubled.items())[:5])}, unknown {self.unknown[:5]}"
        )


def input_counts(journal: Path) -> Counter[str]:
    """Records per key in a journal directory (``p<N>.jsonl`` files)."""
    counts: Counter[str] = Counter()
    for part in sorted(journal.glob("p*.jsonl")):
        for line in part.read_text().splitlines():
            if line.strip():
                counts[str(json.loads(line)["key"])] += 1
    return counts


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
    expected = input_counts(journal)
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
    return verdict
