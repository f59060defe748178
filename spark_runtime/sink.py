"""The sinks (the embedded directory, exactly-once per shard; Kafka, effectively once) and the dead-letter counter.

``foreachBatch`` hands the sink micro-batch ``<id>``'s updated results ``(key, key_group, result)``; the sink
writes them to ``<sink>/shard=<shard>/batch-<id>.<jsonl|parquet>`` with a temporary file and a rename. Spark
calls it again for the same id only when replaying that batch after a failure, with the same input and the
same prior state, so the rewrite produces the same file: output is exactly-once per shard. Each record is
``{"key", "key_group", "shard", "result", "batch"}``.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

from spark_runtime.layout import SinkPaths, write_atomic

__all__ = ["DeadLetterCounter", "DirectorySinkWriter", "KafkaSinkWriter", "OUTPUT_COLUMNS"]

log = logging.getLogger("taskshard.shard")

OUTPUT_COLUMNS = ["key", "key_group", "shard", "result", "batch"]
"""The columns of every output record, in order."""
FAULT_ENV = "TASKSHARD_FAULT_KILL_AFTER_SINK_BATCH"
"""Fault injection for crash tests: SIGKILL this process right after writing the named batch's output
(before Spark commits the batch), the worst moment for exactly-once."""


def _fault_batch() -> int | None:
    """The batch id named by :data:`FAULT_ENV`, or None."""
    kill_at = os.environ.get(FAULT_ENV, "")
    return int(kill_at) if kill_at.strip().lstrip("-").isdigit() else None


def _maybe_fault(kill_after: int | None, batch_id: int) -> None:
    if kill_after is not None and batch_id == kill_after:
        log.warning("fault injection: SIGKILL after writing batch %s output", batch_id)
        os.kill(os.getpid(), signal.SIGKILL)


class DirectorySinkWriter:
    """The ``foreachBatch`` function of the directory sink."""

    def __init__(self, paths: SinkPaths, fmt: str, shard: str) -> None:
        self.paths = paths
        self.fmt = fmt
        self.shard = shard
        self.rows_written = 0
        self._kill_after = _fault_batch()

    def __call__(self, df: Any, batch_id: int) -> None:
        batch_id = int(batch_id)
        if self.fmt == "jsonl":
            rows = self.write_jsonl(df, batch_id)
        else:
            rows = self.write_parquet(df, batch_id)
        self.rows_written += rows
        _maybe_fault(self._kill_after, batch_id)

    def _with_columns(self, df: Any, batch_id: int) -> Any:
        from pyspark.sql import functions as F

        shard = F.lit(self.shard).alias("shard")
        batch = F.lit(batch_id).cast("bigint").alias("batch")
        return df.select("key", "key_group", shard, "result", batch)

    def write_jsonl(self, df: Any, batch_id: int) -> int:
        """Spark's JSON writer (parallel, native) into a temporary directory, then its part files concatenated
        into one file that replaces ``batch-<id>.jsonl`` atomically."""
        tmp_dir = self.paths.results_dir / f".batch-{batch_id}-{uuid.uuid4().hex[:8]}"
        self._with_columns(df, batch_id).write.option("ignoreNullFields", "false").json(str(tmp_dir))
        try:
            parts = sorted(p for p in tmp_dir.iterdir() if p.name.startswith("part-"))
            data = b"".join(p.read_bytes() for p in parts)
            if data and not data.endswith(b"\n"):
                data += b"\n"
            rows = data.count(b"\n")
            if rows:
                write_atomic(self.paths.batch_file(batch_id, "jsonl"), data)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        return rows

    def write_parquet(self, df: Any, batch_id: int) -> int:
        import pyarrow.parquet as pq

        table = self._with_columns(df, batch_id).toArrow()
        if table.num_rows:
            buf = io.BytesIO()
            pq.write_table(table, buf)
            write_atomic(self.paths.batch_file(batch_id, "parquet"), buf.getvalue())
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

    def refresh(self) -> int:
        """Scan for new files; return how many new dead letters were found."""
        try:
            names = [n for n in os.listdir(self.directory) if n.endswith(".jsonl") and not n.startswith(".")]
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
    JSON ``{"key", "key_group", "shard", "result", "batch"}``, header ``taskshard-id`` = ``<shard>/<batch>/<key>``.

    Guarantee: *effectively once*, not transactional. A batch Spark replays after a crash (or a parent's batch
    interrupted by a drain and redone by its children) writes its records again; a replay writes the very same
    records (same id, same result). So the id ``(shard, batch, key)`` de-duplicates exactly, and because a
    key's updates stay in one partition in processing order, the *last* record of each key in the topic is its
    current result (a compacted topic keeps exactly that). :func:`spark_runtime.results.final_results_from_records`
    applies the lineage rule for readers that want to drop superseded records explicitly.
    """

    def __init__(self, bootstrap_servers: str, topic: str, shard: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.shard = shard
        self.rows_written = 0
        self._kill_after = _fault_batch()

    def check(self, spark: Any) -> None:
        """Preflight (raises :class:`spark_runtime.problems.EnvironmentProblem`): the topic exists."""
        from spark_runtime.sources.kafka import kafka_topic_partitions

        kafka_topic_partitions(spark, self.bootstrap_servers, self.topic, "sink.kafka.topic")

    def records(self, df: Any, batch_id: int) -> Any:
        """The DataFrame Spark's Kafka writer takes: ``key``, ``value``, ``headers``."""
        from pyspark.sql import functions as F

        shard, batch = F.lit(self.shard), F.lit(batch_id).cast("bigint")
        ident = F.concat_ws("/", shard, batch.cast("string"), F.col("key"))
        return df.select(
            F.col("key").cast("string").alias("key"),
            F.to_json(
                F.struct("key", "key_group", shard.alias("shard"), "result", batch.alias("batch")),
                {"ignoreNullFields": "false"},
            ).alias("value"),
            F.array(F.struct(F.lit("taskshard-id").alias("key"), ident.cast("binary").alias("value"))).alias("headers"),
        )

    def __call__(self, df: Any, batch_id: int) -> None:
        batch_id = int(batch_id)
        (
            self.records(df, batch_id)
            .write.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap_servers)
            .option("kafka.acks", "all")
            .option("kafka.enable.idempotence", "true")
            .option("topic", self.topic)
            .save()
        )
        _maybe_fault(self._kill_after, batch_id)
