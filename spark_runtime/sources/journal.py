"""The embedded journal: append-only JSON-lines partition files ``<path>/p<N>.jsonl``, read by a PySpark
Python Data Source streaming reader with exact byte-offset positions.

Positions are ``{"p0.jsonl": <byte offset>, ...}``, always one entry per partition. A batch's end offset is
always a line boundary: a partial trailing line (a writer mid-append) waits for its newline. The reader

1. ``latestOffset``: per partition, the end of the last complete line (capped by ``maxBytesPerTrigger``
   when Spark passes a byte limit); unchanged while the drain marker exists;
2. ``partitions``: splits each partition's new byte range at line boundaries into pieces of at most
   ``partitionBytes`` (one Spark task each), so a few big partitions still use every core; a catch-up child's
   pieces are also cut at its parent's final positions, and each says whether its records are held
   (:data:`spark_runtime.protocol.HELD_COLUMN`, a column of such a child's stream);
3. ``read`` (in a Python worker): parses the piece with Arrow's C++ JSON reader when every line of it is a
   valid record (:func:`spark_runtime.records.parse_lines_arrow`), else line by line in Python
   (:func:`spark_runtime.records.parse_lines`); yields Arrow record batches of the valid records, and writes
   the piece's owned dead letters to
   ``<deadLetterDir>/p<N>-<start>-<end>.jsonl`` atomically (a retried or replayed piece rewrites the same file).

The journal is append-only: a file that shrinks below a committed position is an error, never silently
re-read. Writers append whole lines (see :mod:`spark_runtime.produce`).

Partitioned by key (``partitionedByKey``): the journal's producer puts every event of a key into partition
``crc32(key) % partitions``, so key groups nest in partitions (:mod:`spark_runtime.keygroups`) and a shard reads
only the files of ``readPartitions``; its positions name exactly those files. A partition file beyond the
declared count (``p<partitions>.jsonl``: a producer writing with another count, which moves keys between
partitions) stops the shard before the next batch is written (``PartitionCountChanged``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)

from spark_runtime.keygroups import KeyGrouping
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.protocol import (
    HELD_COLUMN,
    HELD_RIGHT_COLUMN,
    CatchUpPhase,
    CatchUpState,
    MergeCatchUpState,
    SkipRule,
    clamp,
    held_columns,
    held_cuts,
    held_flags,
    read_catch_up,
)
from spark_runtime.records import (
    MAX_LINE_IN_DEAD_LETTER,
    MAX_RECORD_BYTES,
    DeadLetter,
    RecordSpec,
    arrow_type,
    parse_lines,
    parse_lines_arrow,
    too_large_line,
)
from spark_runtime.sources.base import SourceContext
from spark_runtime.storage import S3Settings, location

__all__ = [
    "JournalDataSource",
    "JournalSource",
    "complete_end",
    "capped_end",
    "partition_file",
    "plan_pieces",
    "read_range_here",
]

FORMAT = "taskshard_journal"
_FILE_RE = re.compile(r"^p(\d+)\.jsonl$")
_BLOCK = 64 * 1024
ARROW_BATCH_ROWS = 65_536


def partition_file(index: int) -> str:
    """``p0.jsonl`` for partition 0."""
    return f"p{index}.jsonl"


_DEAD_LETTER_RE = re.compile(r"^p(\d+)-(\d+)-(\d+)\.jsonl$")


def dead_letter_file(index: int, start: int, end: int) -> str:
    """``p0-120-480.jsonl``: the dead letters a shard owns of partition 0's byte range [120, 480)."""
    return f"p{index}-{start}-{end}.jsonl"


def dead_letter_past(name: str, positions: dict[str, int]) -> bool:
    """Whether dead-letter file ``name`` holds a range that starts at or past ``positions`` (a shard's committed
    positions): the range of a batch that never committed. A committed batch's ranges all end at or before its
    positions; a batch after them starts there. False for any other name (late records' files, say)."""
    m = _DEAD_LETTER_RE.match(name)
    if m is None:
        return False
    at = positions.get(partition_file(int(m.group(1))))
    return at is not None and int(m.group(2)) >= at


def partition_index(name: str) -> int:
    m = _FILE_RE.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a journal partition file name (p<N>.jsonl)")
    return int(m.group(1))


def complete_end(fh: Any, start: int, size: int) -> int:
    """The offset just past the last ``\\n`` in ``[start, size)`` of the open binary file ``fh``;
    ``start`` when that range holds no complete line."""
    hi = size
    while hi > start:
        lo = max(start, hi - _BLOCK)
        fh.seek(lo)
        block = fh.read(hi - lo)
        i = block.rfind(b"\n")
        if i >= 0:
            return lo + i + 1
        hi = lo
    return start


def _first_line_end(fh: Any, start: int, end: int) -> int:
    """The offset just past the first ``\\n`` in ``[start, end)``; ``end`` if there is none."""
    pos = start
    while pos < end:
        fh.seek(pos)
        block = fh.read(min(_BLOCK, end - pos))
        i = block.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(block)
    return end


def _skip_too_large_line(fh: Any, start: int, end: int) -> tuple[int, list[DeadLetter]]:
    """Where to start reading the piece ``[start, end)``, past its first line when that line is longer than
    :data:`~spark_runtime.records.MAX_RECORD_BYTES` (a dead letter ``too_large``, found without reading the line
    whole; such a line is a piece of its own, see :func:`plan_pieces`). Memory stays bounded by the piece size."""
    if end - start <= MAX_RECORD_BYTES + 1:
        return start, []
    fh.seek(start)
    head = fh.read(MAX_RECORD_BYTES + 1)
    if b"\n" in head:
        return start, []
    line_end = _first_line_end(fh, start, end)
    return line_end, [too_large_line(start, line_end - start - 1, head[:MAX_LINE_IN_DEAD_LETTER])]


def capped_end(fh: Any, start: int, end: int, budget: int) -> int:
    """A line boundary in ``(start, end]`` admitting about ``budget`` bytes: the last line end at or before
    ``start + budget``, or, when the first line alone is longer, that line's end (so a batch always progresses).
    ``end`` must be a line boundary."""
    if end - start <= budget:
        return end
    cut = complete_end(fh, start, start + budget)
    return cut if cut > start else _first_line_end(fh, start, end)


def plan_pieces(fh: Any, start: int, end: int, piece_bytes: int) -> list[tuple[int, int]]:
    """Split the line-aligned range ``[start, end)`` at line boundaries into pieces of at most ``piece_bytes``
    (a single longer line becomes a piece of its own). Deterministic for given arguments."""
    pieces = []
    pos = start
    while pos < end:
        nxt = capped_end(fh, pos, end, piece_bytes)
        pieces.append((pos, nxt))
        pos = nxt
    return pieces


class JournalPiece(InputPartition):
    """Bytes ``[start, end)`` of partition ``index`` (line-aligned); ``held``: a catch-up child's piece before its
    parent's final positions (:data:`spark_runtime.protocol.HELD_COLUMN`), decided when the batch is planned;
    ``held_right``: a merged child's, before its right parent's (:data:`spark_runtime.protocol.HELD_RIGHT_COLUMN`;
    ``held`` is then the left parent's)."""

    def __init__(self, index: int, start: int, end: int, held: bool = False, held_right: bool = False) -> None:
        super().__init__((index, start, end, held, held_right))
        self.index = index
        self.start = start
        self.end = end
        self.held = held
        self.held_right = held_right


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring. Options are strings (set by :meth:`JournalSource.stream`)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.path = Path(options["path"])
        self.partitions_n = int(options["partitions"])
        self.spec = RecordSpec.from_json(options["recordspec"])
        self.shard = options["shard"]
        self.max_key_groups = int(options["maxkeygroups"])
        nested = options.get("nestedpartitions") or ""
        self.grouping = KeyGrouping(self.max_key_groups, int(nested) if nested else None)
        read = options.get("readpartitions") or ""
        self.read_partitions = [int(p) for p in read.split(",")] if read else list(range(self.partitions_n))
        self.range_start = int(options["rangestart"])
        self.range_end = int(options["rangeend"])
        self.dead_letter_dir = Path(options["deadletterdir"])
        self.drain_marker = location(options["drainmarker"], S3Settings.from_options(options))
        catch_up = options.get("catchupstate") or ""
        boundary = options.get("heldboundary") or ""
        self.held_boundary = int(boundary) if boundary else None
        self.catch_up = location(catch_up, S3Settings.from_options(options)) if catch_up else None
        fenced_by = options.get("fencedby") or ""
        self.fenced_by = location(fenced_by, S3Settings.from_options(options)) if fenced_by else None
        self.start_positions = json.loads(options.get("startpositions") or "null")
        skip = options.get("skiprule") or ""
        self.skip = SkipRule.from_json(json.loads(skip)) if skip else None
        self.max_bytes = int(options.get("maxbytespertrigger") or 0)
        self.piece_bytes = int(options.get("partitionbytes") or 32 * 1024 * 1024)
        self.target: dict[str, int] | None = None  # set by prepareForTriggerAvailableNow
        self.writes_dead_letters = options.get("deadletters", "true") != "false"

    # ---- driver side (Spark runs these in a Python worker next to the driver)

    def _names(self) -> list[str]:
        return [partition_file(i) for i in self.read_partitions]

    def initialOffset(self) -> dict:
        if self.start_positions is not None:
            return {name: int(self.start_positions[name]) for name in self._names()}
        return {name: 0 for name in self._names()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxBytes(self.max_bytes) if self.max_bytes > 0 else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        start = {name: 0 for name in self._names()}
        self.target = self._complete_ends(start, ReadAllAvailable())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self.drain_marker.exists():
            return start  # draining: admit nothing new, so no new micro-batch starts
        if self.fenced_by is not None and self.fenced_by.exists():
            return start  # fenced: a later runtime of this shard started; plan (and log) no further batch
        ends = self._complete_ends(start, limit)
        state = self._catch_up_state()
        if state is not None and state.limit is not None and state.phase != CatchUpPhase.LIVE:
            ends = clamp(ends, start, state.limit)  # catching up: never past the parent's positions
        return ends

    def _catch_up_state(self) -> CatchUpState | MergeCatchUpState | None:
        if self.catch_up is None or not self.catch_up.exists():
            return None
        return read_catch_up(self.catch_up.read_json())

    def columns(self) -> list[tuple[str, str]]:
        """The stream's columns: the record spec's, and a catch-up child's :data:`HELD_COLUMN` (a merged one's
        :data:`HELD_RIGHT_COLUMN` too)."""
        return self.spec.columns() + held_columns(self.catch_up is not None, self.held_boundary is not None)

    def _complete_ends(self, start: dict, limit: ReadLimit) -> dict:
        budget = None
        if isinstance(limit, ReadMaxBytes):
            budget = max(1, int(limit.max_bytes) // len(self.read_partitions))
        out = {}
        for name in self._names():
            begin = int(start.get(name, 0))
            path = self.path / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size < begin:
                raise RuntimeError(
                    f"journal {path}: size {size} is below the committed position {begin}; journal files are "
                    "append-only (was the file truncated or replaced?)"
                )
            if size == begin:
                out[name] = begin
                continue
            with open(path, "rb") as fh:
                end = complete_end(fh, begin, size)
                if self.target is not None:
                    end = max(begin, min(end, self.target[name]))
                if budget is not None and end > begin:
                    end = capped_end(fh, begin, end, budget)
            out[name] = end
        return out

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """The range's pieces; a catch-up child's are cut at its parent's final positions (a line start; a merged
        child's at both parents'), so each piece is held or not as a whole. The same range and the same final
        positions give the same pieces."""
        state = self._catch_up_state()
        pieces: list[InputPartition] = []
        for name in self._names():
            s, e = int(start.get(name, 0)), int(end.get(name, 0))
            if e <= s:
                continue
            cuts = held_cuts(state, name)
            with open(self.path / name, "rb") as fh:
                for ps, pe in plan_pieces(fh, s, e, self.piece_bytes):
                    bounds = [ps, *(c for c in cuts if ps < c < pe), pe]
                    for lo, hi in zip(bounds, bounds[1:], strict=False):
                        pieces.append(JournalPiece(partition_index(name), lo, hi, *held_flags(state, name, lo)))
        return pieces

    def commit(self, end: dict) -> None:  # positions live in Spark's offset log; nothing to do
        return None

    # ---- executor side

    def read(self, partition: JournalPiece) -> Iterator[Any]:
        import pyarrow as pa

        with open(self.path / partition_file(partition.index), "rb") as fh:
            begin, huge = _skip_too_large_line(fh, partition.start, partition.end)
            fh.seek(begin)
            data = fh.read(partition.end - begin)
        columns = self.columns()
        schema = pa.schema([(name, arrow_type(t)) for name, t in columns])
        fast = parse_lines_arrow(data, begin, self.spec)
        if fast is not None:  # every line valid: Arrow parsed the chunk in C++
            if huge:
                self._write_dead_letters(partition, huge)
            table, offsets = fast
            n = table.num_rows
            arrays = {
                "key": table.column("key"),
                "partition": pa.array(np.full(n, partition.index, dtype=np.int32)),
                "offset": offsets,
                HELD_COLUMN: pa.array(np.full(n, partition.held, dtype=bool)),
                HELD_RIGHT_COLUMN: pa.array(np.full(n, partition.held_right, dtype=bool)),
                **{f.name: table.column(f.name) for f in self.spec.fields},
            }
            out = pa.table([arrays[name] for name, _ in columns], schema=schema)
            yield from out.to_batches(max_chunksize=ARROW_BATCH_ROWS)
            return
        parsed = parse_lines(data, begin, self.spec)
        self._write_dead_letters(partition, huge + parsed.dead)
        n = len(parsed)
        py_arrays: dict[str, Any] = {
            "key": parsed.keys,
            "partition": [partition.index] * n,
            "offset": parsed.offsets,
            HELD_COLUMN: [partition.held] * n,
            HELD_RIGHT_COLUMN: [partition.held_right] * n,
            **parsed.columns,
        }
        if parsed.values is not None:
            py_arrays["value"] = parsed.values
        for lo in range(0, n, ARROW_BATCH_ROWS):
            hi = min(n, lo + ARROW_BATCH_ROWS)
            yield pa.RecordBatch.from_arrays(
                [pa.array(py_arrays[name][lo:hi], type=schema.field(name).type) for name, _ in columns], schema=schema
            )

    def _write_dead_letters(self, piece: JournalPiece, dead: list) -> None:
        from spark_runtime.layout import write_atomic

        if not self.writes_dead_letters:
            return
        owned = []
        for d in dead:
            kg = self.grouping.of(d.key, piece.index)  # its key's group, or the null key's without one
            if self.range_start <= kg < self.range_end and (
                self.skip is None or self.skip.keeps(kg, piece.index, d.offset)
            ):
                right = self.held_boundary is not None and kg >= self.held_boundary
                if not (piece.held_right if right else piece.held):  # else its parent wrote it (source contract)
                    owned.append(d.to_record(shard=self.shard, partition=piece.index, key_group=kg))
        if not owned:
            return
        body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in owned).encode("utf-8")
        write_atomic(self.dead_letter_dir / dead_letter_file(piece.index, piece.start, piece.end), body, fsync=False)


class JournalDataSource(DataSource):
    """``spark.readStream.format("taskshard_journal")``; options as in :class:`JournalStreamReader`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        ddl = RecordSpec.from_json(self.options["recordSpec"]).ddl()
        held = held_columns(bool(self.options.get("catchUpState")), bool(self.options.get("heldBoundary")))
        return ddl + "".join(f", `{name}` {kind}" for name, kind in held)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return JournalStreamReader({k.lower(): v for k, v in self.options.items()})

    def reader(self, schema: Any) -> DataSourceReader:
        return JournalRangeReader({k.lower(): v for k, v in self.options.items()})


class JournalRangeReader(DataSourceReader):
    """``spark.read.format("taskshard_journal")``: the records from positions ``rangeFrom`` to ``rangeTo`` (JSON),
    parsed as the stream parses them, writing no dead letters (:meth:`JournalSource.read_range`)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.stream = JournalStreamReader({**options, "deadletters": "false"})
        self.start = json.loads(options["rangefrom"])
        self.end = json.loads(options["rangeto"])

    def partitions(self) -> list[InputPartition]:
        return self.stream.partitions(self.start, self.end)

    def read(self, partition: JournalPiece) -> Iterator[Any]:  # type: ignore[override]
        if not isinstance(getattr(partition, "index", None), int):  # an empty range: Spark's one empty partition
            return iter(())
        return self.stream.read(partition)


READ_HERE_MAX_BYTES = 16 << 20
"""The largest range (bytes over all partitions) :func:`read_range_here` reads in the calling process."""


def read_range_here(options: dict[str, str]) -> Any | None:
    """The records of a range read (:class:`JournalRangeReader`'s ``options``) as one Arrow table, read in the
    calling process (the driver), or None when the range spans more than :data:`READ_HERE_MAX_BYTES`.

    The same records, held flags and schema as ``spark.read.format(FORMAT)``, without what a Python data source
    query costs before it reads a record: a Python runner process to plan it, 1-5 s on a 2-core machine. A
    catch-up child's fence batch and a builtin window's late-record check read their own batch's range again."""
    import pyarrow as pa

    reader = JournalRangeReader({k.lower(): v for k, v in options.items()})
    pieces = [p for p in reader.partitions() if isinstance(p, JournalPiece)]
    if sum(p.end - p.start for p in pieces) > READ_HERE_MAX_BYTES:
        return None
    schema = pa.schema([(name, arrow_type(t)) for name, t in reader.stream.columns()])
    return pa.Table.from_batches([batch for piece in pieces for batch in reader.read(piece)], schema=schema)


class JournalSource:
    """The journal as a :class:`spark_runtime.sources.base.Source`."""

    kind = "journal"
    supports_drain_marker = True
    supports_catch_up = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        partitions: int,
        *,
        read_partitions: list[int] | None = None,
        nested: bool = False,
    ) -> None:
        self.path = Path(path).absolute()
        self.partitions = partitions
        self.nested = nested
        self.read_partitions = list(range(partitions)) if read_partitions is None else list(read_partitions)

    def positions_names(self) -> list[str]:
        """The partition files this shard reads (all of them unless key groups nest in partitions)."""
        return [partition_file(i) for i in self.read_partitions]

    def check(self, spark: Any = None) -> None:
        """Preflight: with key groups nested in partitions, no partition file beyond the declared count."""
        self.before_batch(spark, -1)

    def before_batch(self, spark: Any, batch_id: int) -> None:
        """See :class:`spark_runtime.sources.base.GuardsBatches`: a nested shard stops when a partition file
        beyond ``partitions`` exists (the producer's count changed, so keys moved between partitions)."""
        if not self.nested:
            return
        extra = sorted(
            (partition_index(p.name) for p in self.path.glob("p*.jsonl") if _FILE_RE.match(p.name)),
        )
        extra = [i for i in extra if i >= self.partitions]
        if extra:
            raise EnvironmentProblem(
                "PartitionCountChanged",
                "source.journal.partitions",
                f"source.journal.partitions: journal {self.path} now has partition files up to "
                f"p{extra[-1]}.jsonl ({extra[-1] + 1} partitions), but the Task's key groups are nested in "
                f"{self.partitions}; keys may have moved between partitions, so this shard stops before batch "
                f"{batch_id if batch_id >= 0 else 0} rather than process under a wrong mapping (create a new Task "
                "for the new partition count)",
            )

    def owns_offset(self, offset: dict[str, Any]) -> bool:
        return isinstance(offset, dict) and bool(offset) and all(_FILE_RE.match(k) for k in offset)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "partitions": self.partitions}

    def partition_offsets(self, positions: dict[str, Any]) -> dict[int, int]:
        """Journal positions are byte offsets of line starts per file; a row's ``offset`` is its line's start."""
        return {partition_index(name): int(o) for name, o in positions.items()}

    def validate_positions(self, positions: dict[str, Any]) -> dict[str, Any]:
        """Check ``positions`` (a manifest's, or this shard's own) and return the part this shard reads: every
        file it reads must be named, and no file outside the journal's partitions. A nested child reads a subset
        of its parent's files."""
        want = set(self.positions_names())
        every = {partition_file(i) for i in range(self.partitions)}
        got = set(positions)
        if not want <= got or not got <= every:
            raise ValueError(
                f"restore positions name partitions {sorted(got)} but this shard reads {sorted(want)} of "
                f"source.journal.partitions {self.partitions}; a child must read (a part of) the parent's partitions"
            )
        bad = {k: v for k, v in positions.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
        if bad:
            raise ValueError(f"restore positions must be non-negative byte offsets, got {bad}")
        return {name: positions[name] for name in self.positions_names()}

    def stream(self, spark: Any, ctx: SourceContext) -> Any:
        self.path.mkdir(parents=True, exist_ok=True)
        spark.dataSource.register(JournalDataSource)
        return spark.readStream.format(FORMAT).options(**self._options(ctx)).load()

    def read_range(self, spark: Any, ctx: SourceContext, start: dict[str, Any], end: dict[str, Any]) -> Any:
        """The valid records from positions ``start`` to ``end`` (those bytes read again, no dead letters: in this
        process when short, :func:`read_range_here`, else by a Spark batch read)."""
        options = {**self._options(ctx), "rangeFrom": json.dumps(start), "rangeTo": json.dumps(end)}
        table = read_range_here(options)
        if table is not None:
            return spark.createDataFrame(table)
        spark.dataSource.register(JournalDataSource)
        return spark.read.format(FORMAT).options(**options).load()

    def _options(self, ctx: SourceContext) -> dict[str, str]:
        """The data source's options for the shard of ``ctx``."""
        return {
            "path": str(self.path),
            "partitions": str(self.partitions),
            "recordSpec": ctx.record_spec.to_json(),
            "shard": ctx.shard,
            "maxKeyGroups": str(ctx.max_key_groups),
            "nestedPartitions": str(ctx.key_grouping.partitions or ""),
            "readPartitions": ",".join(str(p) for p in self.read_partitions),
            "rangeStart": str(ctx.range_start),
            "rangeEnd": str(ctx.range_end),
            "deadLetterDir": str(ctx.dead_letter_dir),
            "drainMarker": ctx.drain_marker.uri(),
            "catchUpState": ctx.catch_up_state.uri() if ctx.catch_up_state is not None else "",
            "heldBoundary": str(ctx.held_boundary) if ctx.held_boundary is not None else "",
            "fencedBy": ctx.fenced_by.uri() if ctx.fenced_by is not None else "",
            **(ctx.drain_marker.s3.options() if ctx.drain_marker.s3 is not None else {}),
            "startPositions": json.dumps(ctx.start_positions) if ctx.start_positions is not None else "",
            "skipRule": json.dumps(ctx.skip.to_json()) if ctx.skip is not None else "",
            "maxBytesPerTrigger": str(ctx.max_bytes_per_trigger or 0),
            "partitionBytes": str(ctx.partition_bytes),
        }
