"""Memory sizing: a shard's JVM heap and RocksDB's memory, derived from its pod's memory limit.

A shard pod's memory holds three things, and only the first is Spark's heap:

- the JVM heap (``spark.driver.memory``; ``spark.executor.memory`` on executor pods): :data:`HEAP_SHARE`;
- RocksDB's native memory (block cache, memtables, index and filter blocks of every state store the JVM opens),
  bounded for the whole JVM (``spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage`` and ``maxMemoryUsageMB``):
  :data:`ROCKSDB_SHARE`;
- the rest: the JVM's own off-heap memory (metaspace, thread stacks, network buffers) and the Python processes (the
  runtime, Spark's Python workers, Arrow batches).

Without a bound RocksDB grows with the state until the kernel kills the pod; without a derived heap the driver keeps
Spark's 1g default whatever the limit. So the operator writes these keys into the shard's Spark conf from
``spec.spark.resources.limits.memory`` (else ``requests.memory``), and for executors from
``spec.spark.executors.resources``, where it also sets ``spark.executor.memoryOverhead`` so that the executor pods
Spark asks for have exactly that limit. State lives where the state stores run: in the driver in local mode, in the
executors with executors, so RocksDB's bound follows that pod's memory. A key the Task sets in ``spec.spark.conf``
wins over the derived one (the ``spark.executor.*`` memory keys are the operator's). docs/sizing.md explains it.
"""

from __future__ import annotations

from typing import Any

from kubernetes.utils import parse_quantity

MIB = 1024 * 1024
HEAP_SHARE = 0.5
"""Of the pod's memory: the JVM heap."""
ROCKSDB_SHARE = 0.25
"""Of the pod's memory: RocksDB's bound, for all the JVM's state stores together."""
MIN_POD_MEMORY_MIB = 1024
"""The least memory a shard pod may have: half of it is the heap, and Spark refuses a heap below 450 MiB."""

TOO_SMALL = (
    f"a shard pod's memory (its limit, else its request) must be at least {MIN_POD_MEMORY_MIB}Mi: half of it is "
    "the JVM heap, and Spark needs at least 450Mi of heap (docs/sizing.md)"
)
DRIVER_MEMORY = "spark.driver.memory"
EXECUTOR_MEMORY = "spark.executor.memory"
EXECUTOR_OVERHEAD = "spark.executor.memoryOverhead"
ROCKSDB_BOUNDED = "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage"
ROCKSDB_MAX_MB = "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB"


def pod_memory_mib(resources: Any) -> int | None:
    """A container's memory in MiB: its limit, else its request; None when it has neither."""
    if resources is None:
        return None
    quantity = (resources.limits or {}).get("memory") or (resources.requests or {}).get("memory")
    return None if quantity is None else int(parse_quantity(str(quantity)) // MIB)


def too_small(field: str, resources: Any) -> str | None:
    """The error for a pod memory below :data:`MIN_POD_MEMORY_MIB` (naming ``field`` and the value), or None."""
    mib = pod_memory_mib(resources)
    if mib is None or mib >= MIN_POD_MEMORY_MIB:
        return None
    given = (resources.limits or {}).get("memory") or (resources.requests or {}).get("memory")
    return f"{field}: {given}: {TOO_SMALL}"


def executor_conf(executors: Any) -> dict[str, str]:
    """``spark.executor.memory`` (the heap share) and ``memoryOverhead`` (the rest): Spark asks for executor pods
    with heap + overhead, exactly the memory of ``executors`` (none given: nothing, Spark's defaults)."""
    mib = pod_memory_mib(executors)
    if mib is None:
        return {}
    heap = int(mib * HEAP_SHARE)
    return {EXECUTOR_MEMORY: f"{heap}m", EXECUTOR_OVERHEAD: f"{mib - heap}m"}


def sizing_conf(driver: Any, executors: Any | None, *, with_executors: bool) -> dict[str, str]:
    """The driver's heap and RocksDB's bound, from the driver's resources and, ``with_executors``, the executors'
    where the state lives (either may be None: no memory given, Spark's defaults and no bound). The executors' own
    heap and overhead are :func:`executor_conf`, part of the executor conf."""
    conf: dict[str, str] = {}
    driver_mib = pod_memory_mib(driver)
    if driver_mib is not None:
        conf[DRIVER_MEMORY] = f"{int(driver_mib * HEAP_SHARE)}m"
    state_mib = driver_mib
    if with_executors:
        state_mib = pod_memory_mib(executors)
    if state_mib is not None:
        conf[ROCKSDB_BOUNDED] = "true"
        conf[ROCKSDB_MAX_MB] = str(int(state_mib * ROCKSDB_SHARE))
    return conf


__all__ = [
    "HEAP_SHARE",
    "executor_conf",
    "MIN_POD_MEMORY_MIB",
    "ROCKSDB_SHARE",
    "pod_memory_mib",
    "sizing_conf",
    "too_small",
]
