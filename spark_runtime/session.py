"""The shard's SparkSession: RocksDB state store with changelog checkpointing, and sane local defaults.

User ``spark.conf`` wins over every default here; the two state-store settings the runtime depends on (the provider
and changelog checkpointing) are reserved (``spark_runtime.reserved_conf``): the config refuses them in ``spark.conf``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from spark_runtime.logs import JVM_JSON_LOGGING, log_format

__all__ = ["DEFAULT_CONF", "EXTRA_JARS_ENV", "extra_jars_conf", "spark_session", "prepare_python_env"]

EXTRA_JARS_ENV = "TASKSHARD_EXTRA_JARS"
"""Jars (files, or directories of ``*.jar``) put on the JVM's classpath from its start, separated by ``:``:
Spark's Kafka connector and ``hadoop-aws`` with the AWS SDK for ``source.kafka``/``sink.kafka``/``storage.s3``.
The shard image sets it to ``/opt/taskshard/jars``."""

JVM_OPTIONS = "-Xss32m"
"""The driver's and executors' default JVM options (a Task's ``spark.conf`` replaces them)."""

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

DEFAULT_CONF: dict[str, str] = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Fixed at a query's first start (it is the number of state partitions); small suits one shard.
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    # The web UI shows the configuration and can kill jobs, for anyone who reaches the pod: off unless the Task
    # asks for it (spec.spark.ui; the operator writes the key into shard.json).
    "spark.ui.enabled": "false",
    # -Xss32m: a stop that interrupts a Python task makes Spark match a long traceback with a recursive regex;
    # a bigger thread stack keeps that from overflowing (the drain normally never interrupts a batch).
    # JIT settings stay HotSpot's own: see "Start-up cost" in spark_runtime/README.md for what was measured.
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
    "spark.executor.extraJavaOptions": JVM_OPTIONS,
}


def prepare_python_env() -> None:
    """Make Spark's Python workers use this interpreter and see the current directory's packages
    (``python -m spark_runtime`` semantics: a user processor module next to the config imports fine)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    cwd = os.getcwd()
    if cwd not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, cwd])


def extra_jars_conf(env: dict[str, str] | None = None) -> dict[str, str]:
    """Spark conf for :data:`EXTRA_JARS_ENV`: the jars on the driver's and executors' class path (a class path,
    not ``spark.jars``, which would copy a 650 MB AWS SDK into every session's work directory)."""
    env = dict(os.environ) if env is None else env
    jars: list[str] = []
    for entry in (env.get(EXTRA_JARS_ENV) or "").split(os.pathsep):
        entry = entry.strip()
        if not entry:
            continue
        if os.path.isdir(entry):
            jars += sorted(os.path.join(entry, n) for n in os.listdir(entry) if n.endswith(".jar"))
        else:
            jars.append(entry)
    if not jars:
        return {}
    classpath = os.pathsep.join(jars)
    return {"spark.driver.extraClassPath": classpath, "spark.executor.extraClassPath": classpath}


def spark_session(master: str, conf: dict[str, str] | None = None, app_name: str = "taskshard-shard") -> Any:
    """Get or create the SparkSession (defaults above, then ``conf``)."""
    prepare_python_env()
    from pyspark.sql import SparkSession

    merged = {**DEFAULT_CONF, **extra_jars_conf(), **(conf or {})}
    if log_format() == "json":  # the JVM's lines as JSON too (the driver's, and executors' on Kubernetes)
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            merged[key] = f"{merged.get(key, '')} {JVM_JSON_LOGGING}".strip()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in merged.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("TASKSHARD_SPARK_LOG_LEVEL", "WARN"))
    return spark
