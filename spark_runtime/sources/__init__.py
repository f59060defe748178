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
    raise NotImplementedError(
        "source.kafka is not implemented in this runtime yet (use source.journal); the Source contract in "
        "spark_runtime/sources/base.py is what a Kafka source implements"
    )
