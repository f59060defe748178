"""Append events to a journal: ``<journal>/p<N>.jsonl``, one JSON object per line.

Events go to partition ``crc32(key text) % partitions`` (so one key's events stay ordered in one partition, as
with Kafka's default partitioner); ``--partition`` pins them instead. Each partition file receives its lines in
one ``write`` on a file opened with ``O_APPEND``, so concurrent producers never interleave inside a line and a
reader never sees a line without its newline being the end of the data it admits.

CLI (``taskshard-produce`` or ``python -m spark_runtime produce``)::

    taskshard-produce --journal /data/journal/orders --partitions 4 --file events.jsonl   # or - for stdin
    taskshard-produce --journal /data/journal/orders --partitions 4 --generate 100000 --keys 1000 \\
        --field amount --seed 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["append_events", "append_lines", "generate_events", "main", "partition_for"]


def partition_for(key: Any, partitions: int) -> int:
    """The partition of a key: ``crc32(str(key)) % partitions`` (``None`` -> partition 0)."""
    if key is None or partitions <= 1:
        return 0
    return zlib.crc32(str(key).encode("utf-8", errors="surrogatepass")) % partitions


def append_lines(journal: str | os.PathLike[str], partition: int, lines: Iterable[str | bytes]) -> int:
    """Append raw lines (a newline is added to each) to partition ``partition``; returns bytes written."""
    body = b"".join((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n" for line in lines)
    if not body:
        return 0
    path = Path(journal) / f"p{partition}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(body)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)
    return len(body)


def append_events(
    journal: str | os.PathLike[str],
    partitions: int,
    events: Iterable[dict[str, Any]],
    *,
    key_field: str = "key",
    partition: int | None = None,
) -> dict[int, int]:
    """Append ``events`` (dicts) as JSON lines; returns the number of events per partition."""
    buckets: dict[int, list[str]] = {}
    for event in events:
        p = partition if partition is not None else partition_for(event.get(key_field), partitions)
        buckets.setdefault(p, []).append(json.dumps(event, separators=(",", ":")))
    for p, lines in buckets.items():
        append_lines(journal, p, lines)
    return {p: len(lines) for p, lines in buckets.items()}


def generate_events(
    n: int, keys: int, *, seed: int = 0, field: str | None = "amount", key_field: str = "key", start: int = 0
) -> Iterator[dict[str, Any]]:
    """``n`` deterministic events over ``keys`` keys ``k0..k<keys-1>``; with ``field``, an integer amount
    0..99. ``start`` numbers the events (``seq``) so consecutive calls continue a sequence."""
    rng = random.Random(seed * 1_000_003 + start)
    for i in range(start, start + n):
        event: dict[str, Any] = {key_field: f"k{rng.randrange(keys)}", "seq": i}
        if field:
            event[field] = rng.randrange(100)
        yield event


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="taskshard-produce",
        description="Append JSON events to a TaskShard journal (p<N>.jsonl files, one per partition).",
    )
    p.add_argument("--journal", required=True, help="journal directory (source.journal.path)")
    p.add_argument("--partitions", type=int, default=1, help="number of partitions (source.journal.partitions)")
    p.add_argument("--key-field", default="key", help="event field holding the key (default: key)")
    p.add_argument("--partition", type=int, default=None, help="write every event to this partition")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="read JSON lines from this file ('-' for stdin); each must be an object")
    src.add_argument("--generate", type=int, metavar="N", help="generate N events")
    p.add_argument("--keys", type=int, default=100, help="--generate: number of distinct keys (default 100)")
    p.add_argument("--field", default="amount", help="--generate: numeric field to add ('' for none)")
    p.add_argument("--seed", type=int, default=0, help="--generate: random seed")
    p.add_argument("--start", type=int, default=0, help="--generate: first sequence number")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.partitions < 1:
        print("taskshard-produce: --partitions must be >= 1", file=sys.stderr)
        return 2
    if args.generate is not None:
        events: Iterable[dict[str, Any]] = generate_events(
            args.generate,
            args.keys,
            seed=args.seed,
            field=args.field or None,
            key_field=args.key_field,
            start=args.start,
        )
    else:
        fh = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
        parsed = []
        with fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError as exc:
                    print(f"taskshard-produce: line {number}: not JSON: {exc}", file=sys.stderr)
                    return 2
                if not isinstance(event, dict):
                    print(f"taskshard-produce: line {number}: not a JSON object", file=sys.stderr)
                    return 2
                parsed.append(event)
        events = parsed
    counts = append_events(args.journal, args.partitions, events, key_field=args.key_field, partition=args.partition)
    print(json.dumps({"journal": args.journal, "events": sum(counts.values()), "perPartition": counts}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
