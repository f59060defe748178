"""Event sources of the shard runtime (see :mod:`spark_runtime.sources.base` for the contract)."""

from __future__ import annotations

from typing import Any

from spark_runtime.sources.base import Source, SourceContext

__all__ = ["Source", "SourceContext", "make_source"]


def make_source(spec: Any) -> Source:
    """The :class:`Source` for a config's ``source`` object (``spark_runtime.config.SourceSpec``)."""
    if spec.journal is not None:
        from spark_runtime.sources.journal import JournalSource

        return JournalSource(spec.journal.path, spec.journal.partitions)
    from spark_runtime.sources.kafka import KafkaSource

    k = spec.kafka
    return KafkaSource(k.bootstrap_servers, k.topic, k.starting_offsets, k.starting_timestamp)
