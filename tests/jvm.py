"""The test bed's Spark driver JVM options: the runtime's own plus C1-only JIT.

Every JVM a test starts lives for seconds to minutes on tiny inputs, where HotSpot's C2 compiler costs far more
CPU than it earns: a split child spends a third less CPU from its start to its first batch with
``-XX:TieredStopAtLevel=1`` (docs/benchmarks.md, "Where a split child's CPU goes"), and a class-data-sharing
archive of Spark's classes saves a further sixth (:mod:`tests.jvm_archive`). On the 2-core machines the
suite runs on, every shard JVM competes with the others under test, so the suite sets it on the drivers it
starts: the shared SparkSessions, the shard subprocesses and the Tasks' pods (through
``spec.spark.conf["spark.driver.extraJavaOptions"]``, as a user would). The JIT mode changes no result. The
runtime's default (:data:`spark_runtime.session.JVM_OPTIONS`) is kept in front and stays the product's default;
the executors' options are left at it, and the real-node tier and the benchmarks run the defaults.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from spark_runtime.session import JVM_OPTIONS
from tests.jvm_archive import archive_path, ensure_archive

BASE_DRIVER_JVM_OPTIONS = (
    f"{JVM_OPTIONS} -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:CICompilerCount=1 -XX:+UseSerialGC"
    " -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote -Xlog:cds=off,cds+dynamic=off"
)
"""C1 only, with the code cache tiered compilation would have (240 MB): C1-only HotSpot reserves 48 MB, which the
shared integration session filled after a few dozen Kafka queries ("CodeCache is full. Compiler has been
disabled.", then an ``InternalError`` that stopped its SparkContext and failed every later test). One compiler
thread and the serial collector (a tiny heap's GC threads only compete with the other JVMs for the 2 cores); no
re-verification of the class path's bytecode (Spark's own jars); no warning when the class archive below does
not apply. A split child's CPU from its start to its first batch, ``bench/child_cpu.py --keys 50000``, one run
each on 2026-12-02: 42.6 CPU s with C1 only, 36.4 with these options, 29.7 with the archive too."""

DRIVER_JVM_OPTIONS = f"{BASE_DRIVER_JVM_OPTIONS} -XX:SharedArchiveFile={archive_path()}"
""":data:`BASE_DRIVER_JVM_OPTIONS` and the class archive of :mod:`tests.jvm_archive` (written before the first
test that starts Spark, ``tests/conftest.py``)."""

DRIVER_JVM_CONF = {"spark.driver.extraJavaOptions": DRIVER_JVM_OPTIONS}
"""Spark conf that gives a driver JVM :data:`DRIVER_JVM_OPTIONS` (read only at the JVM's start)."""


def driver_jvm_conf(extra_classpath: Sequence[Path]) -> dict[str, str]:
    """:data:`DRIVER_JVM_CONF` for drivers with ``extra_classpath`` in front of pyspark's jars (the integration
    tier's Kafka and S3 jars, given to a shard as ``TASKSHARD_EXTRA_JARS`` or to a session as
    ``spark.driver.extraClassPath``, in this order): its class archive is written first when missing."""
    return _driver_jvm_conf(os.pathsep.join(str(p) for p in extra_classpath))


@functools.cache
def _driver_jvm_conf(classpath: str) -> dict[str, str]:
    archive = ensure_archive(BASE_DRIVER_JVM_OPTIONS, classpath)
    shared = f" -XX:SharedArchiveFile={archive}" if archive else ""
    return {"spark.driver.extraJavaOptions": BASE_DRIVER_JVM_OPTIONS + shared}


@functools.cache
def integration_jvm_conf() -> dict[str, str]:
    """:func:`driver_jvm_conf` for the integration tier's drivers (Spark's Kafka connector and s3a jars first); the
    jar cache is looked up once per process, not per shard config."""
    from testinfra.jars import spark_jars  # the integration tier's jar cache (fetched once, then cached)

    return driver_jvm_conf(spark_jars())
