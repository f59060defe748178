"""The test bed's Spark driver JVM options: the runtime's own plus C1-only JIT.

Every JVM a test starts lives for seconds to minutes on tiny inputs, where HotSpot's C2 compiler costs far more
CPU than it earns: a split child spends a third less CPU from its start to its first batch with
``-XX:TieredStopAtLevel=1`` (docs/benchmarks.md, "Where a split child's CPU goes"). On the 2-core machines the
suite runs on, every shard JVM competes with the others under test, so the suite sets it on the drivers it
starts: the shared SparkSessions, the shard subprocesses and the Tasks' pods (through
``spec.spark.conf["spark.driver.extraJavaOptions"]``, as a user would). The JIT mode changes no result. The
runtime's default (:data:`spark_runtime.session.JVM_OPTIONS`) is kept in front and stays the product's default;
the executors' options are left at it, and the real-node tier and the benchmarks run the defaults.
"""

from __future__ import annotations

from spark_runtime.session import JVM_OPTIONS

DRIVER_JVM_OPTIONS = f"{JVM_OPTIONS} -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
"""C1 only, with the code cache tiered compilation would have (240 MB): C1-only HotSpot reserves 48 MB, which the
shared integration session filled after a few dozen Kafka queries ("CodeCache is full. Compiler has been
disabled.", then an ``InternalError`` that stopped its SparkContext and failed every later test)."""

DRIVER_JVM_CONF = {"spark.driver.extraJavaOptions": DRIVER_JVM_OPTIONS}
"""Spark conf that gives a driver JVM :data:`DRIVER_JVM_OPTIONS` (read only at the JVM's start)."""
