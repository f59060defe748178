"""Fixtures of the integration tier: real Kafka, real S3-compatible storage (MinIO), real connector jars.

- ``spark_jars`` (session): Spark's Kafka connector and ``hadoop-aws`` + AWS SDK jars, fetched from Maven Central
  into ``$TASKSHARD_JAR_CACHE`` on first use (the AWS SDK bundle is about 650 MB; later runs reuse the cache).
- ``kafka_broker`` (session): a :class:`testinfra.kafka.KafkaBroker` (KRaft, loopback) from cached jars.
- ``minio`` (session): a :class:`testinfra.minio.MinioServer` built from its Go module on first use (a cold build
  takes minutes), with the bucket ``minio.bucket`` created.
- ``spark`` (session): a local SparkSession with those jars on its classpath, the shard runtime's defaults
  (RocksDB state store) and s3a pointed at ``minio`` (path-style access, the test credentials, also exported
  as ``AWS_*`` environment variables the way a shard pod gets them from its Secret). It must be the first
  SparkSession of the pytest process: the JVM's classpath is fixed when pyspark starts it, so a session created
  earlier by another tier cannot load the Kafka source.

A fixture whose component cannot be fetched, built or started fails the test with the reason (never a skip).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

try:
    import testinfra  # noqa: F401  (installed from hack/ once pyproject lists it)
except ImportError:  # pragma: no cover - until the package is installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))

from testinfra.common import StartError
from testinfra.jars import JarsUnavailable
from testinfra.jars import spark_jars as fetch_spark_jars
from testinfra.kafka import KafkaBroker
from testinfra.minio import MinioServer, MinioUnavailable
from testinfra.s3 import S3Error
from tests.jvm import integration_jvm_conf

BUCKET = "taskshard-it"


@pytest.fixture(scope="session")
def spark_jars() -> list[Path]:
    try:
        return fetch_spark_jars()
    except JarsUnavailable as e:
        pytest.fail(f"the integration tier needs Spark's Kafka and s3a jars: {e}", pytrace=False)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory, request):
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    try:
        broker.start()
    except (JarsUnavailable, StartError) as e:
        broker.stop()
        pytest.fail(f"the Kafka broker did not start: {e}", pytrace=False)
    except BaseException:
        broker.stop()
        raise
    yield broker
    if request.session.testsfailed:
        print(f"\n[kafka] last broker log lines ({broker.process.log_path}):\n{broker.process.log_tail(30)}")
    broker.stop()


@pytest.fixture(scope="session")
def minio(tmp_path_factory, request):
    server = MinioServer(tmp_path_factory.mktemp("minio"))
    try:
        server.start()
        server.create_bucket(BUCKET)
    except (MinioUnavailable, StartError, S3Error) as e:
        server.stop()
        pytest.fail(f"MinIO did not start: {e}", pytrace=False)
    except BaseException:
        server.stop()  # never leave a server running behind a failed fixture
        raise
    server.bucket = BUCKET
    yield server
    if request.session.testsfailed:
        print(f"\n[minio] last log lines ({server.process.log_path}):\n{server.process.log_tail(30)}")
    server.stop()


def s3a_conf(minio: MinioServer, *, access_key: str | None = None, secret_key: str | None = None) -> dict[str, str]:
    """Spark conf that points s3a at ``minio`` (path-style, plain HTTP, static credentials, fail fast)."""
    return {
        "spark.hadoop.fs.s3a.endpoint": minio.endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": minio.region,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": access_key or minio.access_key,
        "spark.hadoop.fs.s3a.secret.key": secret_key or minio.secret_key,
        "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.attempts.maximum": "2",
        "spark.hadoop.fs.s3a.retry.limit": "2",
        "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",
        "spark.hadoop.fs.s3a.connection.timeout": "20s",
    }


@pytest.fixture(scope="session")
def spark(spark_jars, minio, kafka_broker):  # stops before the servers it talks to (no reconnect noise)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None or SparkContext._gateway is not None:
        pytest.fail(
            "a JVM was already started in this pytest process without the Kafka/s3a jars; run the integration "
            "tier in its own process: .venv/bin/pytest tests/integration",
            pytrace=False,
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # The JVM and its Python workers inherit the environment from here: the shard runtime reads S3 credentials
    # from it (as a pod gets them from the Task's Secret).
    os.environ["AWS_ACCESS_KEY_ID"] = minio.access_key
    os.environ["AWS_SECRET_ACCESS_KEY"] = minio.secret_key
    os.environ["AWS_REGION"] = minio.region
    from spark_runtime.session import DEFAULT_CONF

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"taskshard-integration-{uuid.uuid4().hex[:6]}")
        # On the JVM's classpath from its start (local mode: driver and executors share it); ``spark.jars``
        # would also copy the 650 MB AWS SDK bundle into every session's work directory.
        .config("spark.driver.extraClassPath", os.pathsep.join(str(p) for p in spark_jars))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for k, v in {**DEFAULT_CONF, **integration_jvm_conf(), **s3a_conf(minio)}.items():
        if k != "spark.sql.shuffle.partitions":
            builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
