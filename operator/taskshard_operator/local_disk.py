"""A shard pod's local disk: the ``/tmp`` emptyDir of its driver, its executors and its storage pods.

``/tmp`` is the one writable path of a shard container (the root file system is read-only). It holds the run cache
(:mod:`spark_runtime.engine.run_cache`), RocksDB's working copies of the state stores, Spark's local dirs in local
mode and Python's temporary files. Without a size limit one shard can fill its node's disk and get every pod on the
node evicted; with one the kubelet evicts only that pod (``Evicted``, "Usage of EmptyDir volume "tmp" exceeds the
limit"), and the operator shows the reason and starts a new one.

So every ``/tmp`` emptyDir the operator creates has ``sizeLimit`` ``spec.spark.tmpSizeLimit`` (default
:data:`DEFAULT_TMP_SIZE_LIMIT`), and the run cache, the one part that grows with the state rather than with a batch,
keeps :data:`RUN_CACHE_SHARE` of it (``$TASKSHARD_RUN_CACHE_BYTES`` on the driver and executor containers), so the
cache alone never reaches the limit. docs/sizing.md explains it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from spark_runtime.protocol import RUN_CACHE_BYTES_ENV

__all__ = ["DEFAULT_TMP_SIZE_LIMIT", "MIN_TMP_MIB", "RUN_CACHE_SHARE", "run_cache_env", "tmp_volume", "too_small"]

MIB = 1024 * 1024
DEFAULT_TMP_SIZE_LIMIT = "16Gi"
"""``/tmp``'s size limit when ``spec.spark.tmpSizeLimit`` is not set: the run cache's 4 GiB share and room for
RocksDB's working copies and Spark's spills."""
MIN_TMP_MIB = 1024
"""The least ``spec.spark.tmpSizeLimit``: a quarter of it for the run cache, the rest for a batch's files."""
RUN_CACHE_SHARE = 0.25
"""Of ``/tmp``'s size limit: the run cache's budget."""
TOO_SMALL = (
    f"must be at least {MIN_TMP_MIB}Mi: a quarter of it is the run cache, and RocksDB and Spark need the rest "
    "(docs/sizing.md)"
)


def size_limit(limit: int | str | None) -> str:
    """``spec.spark.tmpSizeLimit`` as the emptyDir's ``sizeLimit`` (None: :data:`DEFAULT_TMP_SIZE_LIMIT`)."""
    return DEFAULT_TMP_SIZE_LIMIT if limit is None else str(limit)


def too_small(limit: int | str | None) -> str | None:
    """The error for a ``spec.spark.tmpSizeLimit`` below :data:`MIN_TMP_MIB` (naming the field and the value)."""
    if limit is None or parse_quantity(str(limit)) >= MIN_TMP_MIB * MIB:
        return None
    return f"spec.spark.tmpSizeLimit: {limit}: {TOO_SMALL}"


def tmp_volume(limit: int | str | None) -> dict[str, Any]:
    """The pod's ``tmp`` volume: an emptyDir of :func:`size_limit` ``limit``."""
    return {"name": "tmp", "emptyDir": {"sizeLimit": size_limit(limit)}}


def run_cache_env(limit: int | str | None) -> list[dict[str, Any]]:
    """The driver's and executors' ``$TASKSHARD_RUN_CACHE_BYTES``: :data:`RUN_CACHE_SHARE` of the size limit."""
    budget = int(parse_quantity(size_limit(limit)) * Decimal(str(RUN_CACHE_SHARE)))
    return [{"name": RUN_CACHE_BYTES_ENV, "value": str(budget)}]
