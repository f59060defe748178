"""The sinks (the embedded directory, exactly-once per shard; Kafka, effectively once) and the dead-letter counter.

Directory sink: write pending, publish on commit
------------------------------------------------

``foreachBatch`` hands the sink micro-batch ``N``'s updated results ``(key, key_group, result)`` *before* Spark
commits batch ``N``. A batch that never commits (the query stopped mid-batch by a drain, whose children redo it
from the parent's last committed positions; a crash, after which Spark replays it) must never be visible as
results, or a plain ``spark.read.json(<sink>)`` / pandas read counts its records twice. So the writer keeps two
names per batch (:class:`spark_runtime.layout.SinkPaths`)::

    <sink>/shard=<shard>/_pending/<epoch>/batch-<N>.<jsonl|parquet>   written by foreachBatch(N): hidden, not yet
                                                                      committed (one directory per writer epoch)
    <sink>/shard=<shard>/batch-<N>.<jsonl|parquet>                    published: batch N is committed

and the directory holds only published batches, each once. Each record is
``{"key", "key_group", "shard", "result", "batch"}``; a processor that declares several result columns
(``result_schema``) has those columns in place of ``result`` (:func:`result_columns`).

``foreachBatch(N)`` (:meth:`DirectorySinkWriter.__call__`):

1. Publish: Spark starts batch ``N`` of a query only after committing ``N - 1``, so every pending batch ``< N``
   is committed: rename it into ``batch-<id>``. Pending files ``>= N`` are dropped (an earlier, interrupted
   attempt of ``N``, rewritten in step 2; nothing later can exist). Earlier writer epochs' directories are
   adopted the same way and removed; a later epoch's is never touched (this runtime is fenced then: a paused
   runtime that wakes up after its replacement started cannot delete the replacement's committed batches).
2. Write ``_pending/<epoch>/batch-N`` all-or-nothing (a temporary file and a rename), if the batch updated any
   key.

When the shard stops (step 4 of a drain, and :meth:`spark_runtime.shard.ShardRunner.stop`), the runner calls
:meth:`DirectorySinkWriter.publish_committed` with the last batch in the commit log: pending batches up to it
are published, later ones (the batch a stop interrupted) deleted. A drained parent's sink therefore holds
exactly its committed batches; its children write their own ``shard=<child>`` directories.

Why this design: Spark's and Hadoop's file listing skip every path whose name starts with ``_`` or ``.`` (and
pyarrow datasets, hence ``pandas.read_parquet``, do the same), so ``_pending/`` is invisible to a plain read of
the sink, recursive or with partition discovery. ``os.replace`` within one local directory tree is atomic, and a
batch is one complete file in either format (the JSON lines concatenated from Spark's part files; one Parquet
file written by pyarrow, whose footer holds no path), so renaming it changes nothing in it. Spark's own file-sink
log (``_spark_metadata``) was the alternative: only Spark readers honour it, only when reading the exact
directory the log belongs to (every shard of a task shares one sink directory, with one query per shard), and it
is not a ``foreachBatch`` sink.

Exactly once: Spark calls ``foreachBatch(N)`` again only when replaying uncommitted batch ``N`` (same input
offsets, same prior state), so a replay rewrites the same pending file. What a crash leaves behind:

- before commit ``N``: ``_pending/batch-N`` (hidden); the restart replays ``N`` and rewrites it;
- after commit ``N``, before ``N + 1`` starts: a committed batch still pending; published by the next
  ``foreachBatch`` or stop of the shard;
- in the middle of a publish: some batches renamed, the rest pending; publishing again is idempotent.

Visibility: a running shard publishes batch ``N`` as soon as its poll loop sees ``N`` in the commit log (at most a
second after the commit; :meth:`DirectorySinkWriter.publish_through`), else when batch ``N + 1`` starts or the
shard stops. A plain read while shards run sees a committed prefix (a batch committed within the last poll may
still be pending); after a drain or stop it sees every committed batch.
:func:`spark_runtime.results.final_results` given the storage root also reads pending batches up to each shard's
last commit (from its recovery log), so it is current at once.
``query.stop()`` waits for a running ``foreachBatch`` (unless ``spark.sql.streaming.stopTimeout`` is set); one
that outlived it could only leave a file in ``_pending/``: hidden, and dropped by a resumed shard's first batch.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

from spark_runtime import faults
from spark_runtime.late import LATE_FILE_PREFIX
from spark_runtime.layout import SinkPaths, parse_batch_file_name, write_atomic

__all__ = ["DeadLetterCounter", "DirectorySinkWriter", "KafkaSinkWriter", "OUTPUT_COLUMNS"]

log = logging.getLogger("taskshard.shard")

OUTPUT_COLUMNS = ["key", "key_group", "shard", "result", "batch"]
ENVELOPE_COLUMNS = ("key", "key_group", "shard", "batch")
"""Every record's columns besides its result columns (names a result schema may not use)."""


def result_columns(df: Any) -> list[str]:
    """The result columns of a stateful output DataFrame: every column but ``key`` and ``key_group``."""
    return [c for c in df.columns if c not in ("key", "key_group")]


"""The columns of every output record, in order."""


def _maybe_fault(kill_after: int | None, batch_id: int) -> None:
    if kill_after is not None and batch_id == kill_after:
        log.warning("fault injection: SIGKILL after writing batch %s output", batch_id)
        os.kill(os.getpid(), signal.SIGKILL)


class DirectorySinkWriter:
    """The ``foreachBatch`` function of the directory sink, and the publisher of its committed batches (see the
    module docstring). ``epoch``: the writer epoch of the runtime (set once claimed): its pending batches live in
    ``_pending/<epoch>/``, and it never touches a later epoch's."""

    def __init__(self, paths: SinkPaths, fmt: str, shard: str, epoch: int | None = None) -> None:
        self.paths = paths
        self.fmt = fmt
        self.shard = shard
        self.epoch = epoch
        self.rows_written = 0
        self._kill_after = faults.kill_after_sink_batch()
        self._lock = threading.Lock()
        """Held by ``foreachBatch`` and by :meth:`publish_through` (the runtime's poll thread)."""

    def __call__(self, df: Any, batch_id: int) -> None:
        batch_id = int(batch_id)
        with self._lock:
            # Step 1: Spark runs batch N only after committing N - 1: publish everything below N.
            self.publish_committed(batch_id - 1)
            # Step 2: batch N, pending until it is known committed.
            if self.fmt == "jsonl":
                rows = self.write_jsonl(df, batch_id)
            else:
                rows = self.write_parquet(df, batch_id)
        self.rows_written += rows
        _maybe_fault(self._kill_after, batch_id)

    def publish_through(self, last_committed: int) -> list[int]:
        """From the runtime's poll loop, as soon as it sees batch ``last_committed`` in the commit log: publish
        this writer epoch's pending batches up to it, so a committed batch is visible within a poll, not only
        when the next batch starts (an idle shard's last batch would stay hidden). Renames only: it never drops a
        later pending file (``foreachBatch`` may be writing the next batch) nor touches another epoch's directory;
        ``foreachBatch`` and the stop do the rest as before. Returns the published ids."""
        with self._lock:
            pending_dir = self.paths.epoch_pending_dir(self.epoch)
            try:
                names = sorted(os.listdir(pending_dir))
            except FileNotFoundError:
                return []
            published = []
            for name in names:
                parsed = parse_batch_file_name(name)
                if parsed is None or parsed[0] > last_committed or self.paths.batch_file(*parsed).exists():
                    continue
                try:
                    os.replace(pending_dir / name, self.paths.batch_file(*parsed))
                except FileNotFoundError:
                    continue
                published.append(parsed[0])
            return published

    def publish_committed(self, last_committed: int) -> list[int]:
        """Publish every pending batch ``<= last_committed`` of this writer epoch and of earlier ones (rename
        ``_pending/<epoch>/batch-<id>`` to ``batch-<id>``; this epoch's file wins over an earlier epoch's of the
        same batch, a replay with the same content) and delete the pending files of later batches, which were
        never committed (a replay or the children redo them); also removes temporary files a killed write left.
        A later epoch's directory (a newer runtime of this shard: this one is fenced) is never touched.
        Idempotent; returns the published ids.

        ``last_committed`` must come from the commit log (or be ``N - 1`` inside ``foreachBatch(N)``), and no
        write of this epoch may be running (``foreachBatch`` calls of one query are sequential, and
        ``query.stop()`` waits for the running one)."""
        own = self.epoch
        dirs = {e: d for e, d in self.paths.pending_epochs().items() if own is None or e is None or e <= own}
        published: set[int] = set()
        for epoch in sorted(dirs, key=lambda e: -1 if e is None else e, reverse=True):  # this epoch's first
            published |= self._publish_dir(dirs[epoch], last_committed, published)
            if epoch != own and dirs[epoch] != self.paths.pending_dir:
                shutil.rmtree(dirs[epoch], ignore_errors=True)  # an earlier runtime's: adopted, then removed
        if published:
            log.debug("shard %s: published sink batches %s", self.shard, sorted(published))
        return sorted(published)

    def _publish_dir(self, pending_dir: Path, last_committed: int, done: set[int]) -> set[int]:
        published = set()
        try:
            names = sorted(n for n in os.listdir(pending_dir) if not (pending_dir / n).is_dir() or n.startswith("."))
        except FileNotFoundError:
            return published
        for name in names:
            path = pending_dir / name
            parsed = parse_batch_file_name(name)
            if parsed is None:  # a temporary file or directory of a killed write
                if name.startswith("."):
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                continue
            batch_id, fmt = parsed
            published_already = self.paths.batch_file(batch_id, fmt).exists()  # (a paused runtime's late file)
            if batch_id <= last_committed and batch_id not in done and not published_already:
                try:
                    os.replace(path, self.paths.batch_file(batch_id, fmt))
                except FileNotFoundError:  # an earlier runtime of the shard published or dropped it meanwhile
                    continue
                published.add(batch_id)
            else:
                path.unlink(missing_ok=True)
        return published

    def _with_columns(self, df: Any, batch_id: int) -> Any:
        from pyspark.sql import functions as F

        shard = F.lit(self.shard).alias("shard")
        batch = F.lit(batch_id).cast("bigint").alias("batch")
        return df.select("key", "key_group", shard, *result_columns(df), batch)

    def write_jsonl(self, df: Any, batch_id: int) -> int:
        """Spark's JSON writer (parallel, native) into a temporary directory, then its part files concatenated
        into one file that replaces ``_pending/batch-<id>.jsonl`` atomically."""
        tmp_dir = self.paths.epoch_pending_dir(self.epoch) / f".batch-{batch_id}-{uuid.uuid4().hex[:8]}"
        self._with_columns(df, batch_id).write.option("ignoreNullFields", "false").json(str(tmp_dir))
        try:
            parts = sorted(p for p in tmp_dir.iterdir() if p.name.startswith("part-"))
            data = b"".join(p.read_bytes() for p in parts)
            if data and not data.endswith(b"\n"):
                data += b"\n"
            rows = data.count(b"\n")
            if rows:
                write_atomic(self.paths.pending_file(batch_id, "jsonl", self.epoch), data)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        return rows

    def write_parquet(self, df: Any, batch_id: int) -> int:
        """One Parquet file (pyarrow) that replaces ``_pending/batch-<id>.parquet`` atomically."""
        import pyarrow.parquet as pq

        table = self._with_columns(df, batch_id).toArrow()
        if table.num_rows:
            buf = io.BytesIO()
            pq.write_table(table, buf)
            write_atomic(self.paths.pending_file(batch_id, "parquet", self.epoch), buf.getvalue())
        return table.num_rows


class DeadLetterCounter:
    """Counts dead-letter records of a shard incrementally (each file is counted once by name: a replayed
    range rewrites the same file with the same records)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.files: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.files.values())

    def drop_uncommitted(self, positions: dict[str, int]) -> int:
        """Remove the journal's dead-letter files of ranges at or past ``positions`` (the shard's last committed
        positions, at a drain): a batch interrupted by the drain wrote them before it could commit, and the
        successors that redo its range write their own. Returns how many dead letters were dropped."""
        from spark_runtime.sources.journal import dead_letter_past

        try:
            names = [n for n in os.listdir(self.directory) if dead_letter_past(n, positions)]
        except FileNotFoundError:
            return 0
        dropped = 0
        for name in names:
            counted = self.files.pop(name, None)
            if counted is None:
                with open(self.directory / name, "rb") as fh:
                    counted = sum(1 for line in fh if line.strip())
            (self.directory / name).unlink(missing_ok=True)
            dropped += counted
        return dropped

    def refresh(self) -> int:
        """Scan for new files; return how many new dead letters were found."""
        try:
            names = [
                n
                for n in os.listdir(self.directory)
                if n.endswith(".jsonl") and not n.startswith((".", LATE_FILE_PREFIX))  # late ones: spark_runtime.late
            ]
        except FileNotFoundError:
            return 0
        added = 0
        for name in names:
            if name in self.files:
                continue
            with open(self.directory / name, "rb") as fh:
                count = sum(1 for line in fh if line.strip())
            self.files[name] = count
            added += count
        return added


class KafkaSinkWriter:
    """The ``foreachBatch`` function of the Kafka sink: micro-batch ``<id>``'s updated results as one record per
    key, written with Spark's Kafka writer (idempotent producer, ``acks=all``).

    Record: Kafka key = the result's key (so every update of a key lands in one partition, in order), value =
    JSON ``{"key", "key_group", "shard", "result", "batch"}`` (several result columns: those in place of
    ``result``), header ``taskshard-id`` = ``<shard>/<batch>/<key>``. A Python processor may emit several records of
    one key in a batch (sessions closed by a timer and by an event, say): the second and later of them (ordered by
    their value, so a replay numbers them the same) have ids ``<shard>/<batch>/<key>/<n>``.

    Guarantee: *effectively once*, not transactional. A batch Spark replays after a crash (or a parent's batch
    interrupted by a drain and redone by its children) writes its records again; a replay writes the very same
    records (same id, same result). So the id ``(shard, batch, key)`` de-duplicates exactly, and because a
    key's updates stay in one partition in processing order, the *last* record of each key in the topic is its
    current result (a compacted topic keeps exactly that). :func:`spark_runtime.results.final_results_from_records`
    applies the lineage rule for readers that want to drop superseded records explicitly.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        shard: str,
        options: dict[str, str] | None = None,
        *,
        several_per_key: bool = False,
    ) -> None:
        self.several_per_key = several_per_key
        """Whether a batch may emit several records of a key (a Python processor): the ids then number them."""
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.shard = shard
        self.options = dict(options or {})
        """The Task's ``sink.kafka.options`` (credentials are added from the environment: :attr:`client`)."""
        self._client: dict[str, str] | None = None
        self.rows_written = 0
        self._kill_after = faults.kill_after_sink_batch()

    @property
    def client(self) -> dict[str, str]:
        """The producer's and admin client's properties (:func:`spark_runtime.kafka_client.client_properties`);
        raises ``KafkaCredentialsMissing`` (an environment problem naming the field) when credentials are missing."""
        if self._client is None:
            from spark_runtime.kafka_client import KafkaCredentialsMissing, client_properties
            from spark_runtime.problems import EnvironmentProblem

            try:
                self._client = client_properties(self.options, "sink")
            except KafkaCredentialsMissing as exc:
                raise EnvironmentProblem("KafkaCredentialsMissing", "sink.kafka.credentialsSecret", str(exc)) from None
        return self._client

    def check(self, spark: Any) -> None:
        """Preflight (raises :class:`spark_runtime.problems.EnvironmentProblem`): the brokers answer and accept the
        credentials, and the topic exists."""
        from spark_runtime.sources.kafka import kafka_topic_partitions

        kafka_topic_partitions(spark, self.bootstrap_servers, self.topic, "sink.kafka.topic", client=self.client)

    def records(self, df: Any, batch_id: int) -> Any:
        """The DataFrame Spark's Kafka writer takes: ``key``, ``value``, ``headers``."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        shard, batch = F.lit(self.shard), F.lit(batch_id).cast("bigint")
        ident = F.concat_ws("/", shard, batch.cast("string"), F.col("key"))
        value = F.to_json(
            F.struct("key", "key_group", shard.alias("shard"), *result_columns(df), batch.alias("batch")),
            {"ignoreNullFields": "false"},
        )
        out = df.select(F.col("key").cast("string").alias("key"), value.alias("value"))
        if self.several_per_key:  # the n-th record of a key in the batch, by value (identical ones are alike)
            n = F.row_number().over(Window.partitionBy("key").orderBy("value"))
            ident = F.when(n == 1, ident).otherwise(F.concat_ws("/", ident, n.cast("string")))
        header = F.array(F.struct(F.lit("taskshard-id").alias("key"), ident.cast("binary").alias("value")))
        return out.select("key", "value", header.alias("headers"))

    def __call__(self, df: Any, batch_id: int) -> None:
        batch_id = int(batch_id)
        (
            self.records(df, batch_id)
            .write.format("kafka")
            .options(**{f"kafka.{k}": v for k, v in self.client.items()})
            .option("kafka.bootstrap.servers", self.bootstrap_servers)
            .option("kafka.acks", "all")
            .option("kafka.enable.idempotence", "true")
            .option("topic", self.topic)
            .save()
        )
        _maybe_fault(self._kill_after, batch_id)
