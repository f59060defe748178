"""Event sources of the shard runtime (see :mod:`spark_runtime.sources.base` for the contract)."""

from __future__ import annotations

from typing import Any

from spark_runtime.sources.base import (
    ChecksEnvironment,
    GainsPartitions,
    GuardsBatches,
    NamesFixedPositions,
    ReadsRanges,
    RecountsBatches,
    ResolvesStartPositions,
    Source,
    SourceContext,
)

__all__ = [
    "ChecksEnvironment",
    "GainsPartitions",
    "GuardsBatches",
    "NamesFixedPositions",
    "ReadsRanges",
    "RecountsBatches",
    "ResolvesStartPositions",
    "Source",
    "SourceContext",
    "make_source",
]


def make_source(spec: Any, read_partitions: list[int] | None = None) -> Source:
    """The :class:`Source` for a config's ``source`` object (``spark_runtime.config.SourceSpec``);
    ``read_partitions``: the partitions the shard reads (``ShardConfig.partitions_to_read``; None: all)."""
    if spec.journal is not None:
        from spark_runtime.sources.journal import JournalSource

        j = spec.journal
        return JournalSource(j.path, j.partitions, read_partitions=read_partitions, nested=j.partitioned_by_key)
    from spark_runtime.sources.kafka import KafkaReader

    k = spec.kafka
    return KafkaReader(
        k.bootstrap_servers,
        k.topic,
        k.starting_offsets,
        k.starting_timestamp,
        declared_partitions=k.partitions if k.partitioned_by_key else None,
        read_partitions=read_partitions,
        options=k.options,
    )
