"""The source contract: what the shard runtime needs from any event source (the journal, Kafka).

A source turns its input into a streaming DataFrame of **valid** records with the columns of
:meth:`spark_runtime.records.RecordSpec.columns`::

    key string (never null), partition int, offset bigint, <processor fields...>, [value string]

and takes care of the rest of the record contract itself:

- **Positions.** Its Spark offsets are a JSON object the runtime treats as the source's *positions*
  (per-partition resume points, e.g. ``{"p0.jsonl": 1234, "p1.jsonl": 0}`` for the journal, a
  ``{topic: {partition: offset}}`` object for Kafka). The runtime reads the end positions of the last
  committed batch from the checkpoint's offset log, puts them into the drain manifest, and a restored child
  passes them back as ``SourceContext.start_positions``: the child's first batch starts exactly there.
- **Dead letters.** Records that fail the :class:`~spark_runtime.records.RecordSpec` (malformed JSON, no key,
  wrong types) never reach the DataFrame. The journal writes them under ``SourceContext.dead_letter_dir``,
  exactly once per position range (deterministic file names, atomic writes, so a replayed batch rewrites the
  same files), and only those the shard owns (:func:`spark_runtime.records.dead_letter_key_group`). Kafka
  counts the ones the shard owns in an observed metric and leaves them in the topic.
- **Preflight.** A source with a ``check(spark)`` method runs it before the query starts; it raises
  :class:`spark_runtime.problems.EnvironmentProblem` for what the shard cannot fix itself (a missing topic).
- **Drain.** When ``SourceContext.drain_marker`` exists the source admits no new data (its latest offset stays
  at its start), so no new micro-batch begins and the runtime can stop at a batch boundary without
  interrupting one. A source that cannot do that sets ``supports_drain_marker = False``; the runtime then
  stops between triggers (still exact: the snapshot is taken at the last *committed* batch).
- **Catch-up cap and held records.** A source with ``supports_catch_up = True`` reads
  ``SourceContext.catch_up_state`` (a split child's :class:`spark_runtime.protocol.CatchUpState`) before each
  micro-batch: until its phase is ``live`` no batch ends past its ``limit`` (when it has one), and it adds the
  column :data:`spark_runtime.protocol.HELD_COLUMN`, true for input before the parent's ``final`` positions (or
  all input while they are unknown), decided per piece of input (the journal cuts its pieces at ``final``, Kafka
  its per-partition ranges); it writes or counts no dead letters for held input. A split child of such a source
  (the journal and Kafka both are) catches up while its parent runs (:mod:`spark_runtime.handover`) unless its
  processor uses event time or timers; one of any other source restores the parent's final snapshot instead.

Key-group filtering is not the source's job: the runtime applies it natively in Spark right after the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from spark_runtime.keygroups import KeyGrouping
from spark_runtime.protocol import SkipRule
from spark_runtime.records import RecordSpec
from spark_runtime.storage import Loc

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "ChecksEnvironment",
    "GuardsBatches",
    "NamesFixedPositions",
    "ReadsRanges",
    "RecountsBatches",
    "ResolvesStartPositions",
    "Source",
    "SourceContext",
]


@dataclass(frozen=True)
class SourceContext:
    """Everything a source needs to know about the shard it feeds."""

    shard: str
    max_key_groups: int
    range_start: int
    range_end: int
    record_spec: RecordSpec
    dead_letter_dir: Path | None
    """Where the source writes dead-letter files (None: the source only counts them, see its docs)."""
    drain_marker: Loc
    start_positions: dict[str, Any] | None = None
    max_bytes_per_trigger: int | None = None
    partition_bytes: int = 32 * 1024 * 1024
    max_records_per_trigger: int | None = None
    grouping: KeyGrouping | None = None
    """How records map to key groups (None: ``pmod(hash(key), max_key_groups)``); nested in partitions with a
    source partitioned by the key, which then reads only ``read_partitions``."""
    read_partitions: list[int] | None = None
    """The partitions this shard reads (None: every partition)."""
    catch_up_state: Loc | None = None
    """A catching-up child's ``catch-up.json`` (None: not catching up)."""
    held_boundary: int | None = None
    """A merged catch-up child's first key group of its right parent: the source adds
    :data:`spark_runtime.protocol.HELD_RIGHT_COLUMN` and holds each dead letter by its key group's parent."""
    skip: SkipRule | None = None
    """A merged child's skip rule: rows (and dead letters) a parent already counted (None: skip nothing)."""
    fenced_by: Loc | None = None
    """The file whose existence fences this runtime (its writer epoch's successor, ``epochs/<e+1>.json``): a source
    that plans its own batches admits no new data once it exists, so a fenced runtime plans no further batch."""

    @property
    def key_grouping(self) -> KeyGrouping:
        return self.grouping or KeyGrouping(self.max_key_groups)


class Source(Protocol):
    """An event source (see the module docstring for the contract)."""

    kind: str
    supports_drain_marker: bool
    supports_catch_up: bool

    def stream(self, spark: SparkSession, ctx: SourceContext) -> DataFrame:
        """The streaming DataFrame of valid records."""
        ...

    def owns_offset(self, offset: dict[str, Any]) -> bool:
        """True when ``offset`` (one source entry of a checkpoint offset-log file) belongs to this source."""
        ...

    def describe(self) -> dict[str, Any]:
        """A JSON summary for manifests (kind, location, partitions)."""
        ...

    def validate_positions(self, positions: dict[str, Any]) -> dict[str, Any]:
        """Raise ``ValueError`` when ``positions`` (from a parent's manifest) cannot start this source; else return
        the part of them this shard reads."""
        ...

    def partition_offsets(self, positions: dict[str, Any]) -> dict[int, int]:
        """``positions`` (valid for this source) as ``{partition: offset}``, in the terms of the records'
        ``partition`` and ``offset`` columns: a row at ``offset`` is at or after the position iff
        ``offset >= position`` (a merge's skip rule, :class:`spark_runtime.protocol.SkipRule`)."""
        ...


@runtime_checkable
class ResolvesStartPositions(Protocol):
    """A source whose fresh start depends on *when* it is asked (Kafka's ``earliest``/``latest``).

    The runtime asks once per shard, before the shard's first query, persists the answer
    (``ShardPaths.start_positions``) and starts the query exactly there; a drain before the first commit puts
    the same concrete positions into its manifest. A source without this capability starts at fixed positions
    (the journal: byte 0 of every partition file)."""

    def resolve_start_positions(self, spark: SparkSession) -> dict[str, Any]:
        """Concrete positions (no symbolic offsets) where a shard that committed nothing starts."""
        ...


@runtime_checkable
class GuardsBatches(Protocol):
    """A source that must confirm, before each micro-batch is written, that the key-group mapping still holds
    (key groups nested in partitions: the partition count is part of the mapping).

    The runtime calls :meth:`before_batch` at the start of ``foreachBatch``, before anything of the batch is
    written or committed; it raises :class:`spark_runtime.problems.EnvironmentProblem` (reason
    ``PartitionCountChanged``) to stop the shard. A batch's records were all in the source when the batch was
    planned, which is before this check, so a count found unchanged here held for every record of the batch."""

    def before_batch(self, spark: SparkSession, batch_id: int) -> None: ...


@runtime_checkable
class ChecksEnvironment(Protocol):
    """A source or sink with a preflight: the runtime calls :meth:`check` once per process, before its first
    query (and on standby), so a missing topic or an unreachable broker stops the shard before anything is
    processed."""

    def check(self, spark: SparkSession) -> None:
        """Raise :class:`spark_runtime.problems.EnvironmentProblem` naming the field when it cannot be used."""
        ...


@runtime_checkable
class RecountsBatches(Protocol):
    """A source that can recount the observed metrics of one committed batch (rows, bytes, dead letters) by
    reading exactly that batch's position range again (Kafka). The drain uses it for a batch committed without a
    progress event (the stop came between the commit and the event)."""

    def recount(
        self, spark: SparkSession, ctx: SourceContext, start: dict[str, Any], end: dict[str, Any]
    ) -> dict[str, int] | None: ...


@runtime_checkable
class ReadsRanges(Protocol):
    """A source that can read exactly one batch's position range again, as a batch DataFrame of valid records with
    the stream's columns, writing no dead letters (journal, Kafka). A builtin window's late records are found that
    way (:mod:`spark_runtime.windows`)."""

    def read_range(self, spark: SparkSession, ctx: SourceContext, start: dict[str, Any], end: dict[str, Any]) -> Any:
        """The valid records from positions ``start`` to ``end``."""
        ...


@runtime_checkable
class NamesFixedPositions(Protocol):
    """A source whose positions have fixed names known without Spark (the journal: its partition files), so the
    positions of batch -1 (nothing committed yet) are 0 for each."""

    def positions_names(self) -> list[str]: ...


@runtime_checkable
class GainsPartitions(Protocol):
    """A source whose partitions can appear while shards run (a Kafka topic read with ``subscribe``): a
    partition a shard never read is not named in its positions. For a successor that means the shard **counted
    nothing** there: its records in that partition are read from the partition's first offset (0), never from
    where another parent happened to be."""

    def counted_nothing_filled(
        self, every: list[dict[str, Any]], partitions: int | None = None
    ) -> list[dict[str, Any]]:
        """Each of ``every`` (positions, one per parent) with the partitions it does not name (but another one
        does, or below ``partitions``) at offset 0."""
        ...
