"""Pinned versions of the real components the integration tests run. Why each one:

- ``KAFKA_VERSION`` 3.9.2: the broker (``org.apache.kafka:kafka_2.13``, KRaft mode). The same version as the
  ``kafka-clients`` jar Spark's Kafka connector ships with, so the test cluster speaks exactly the protocol the
  connector was built against; 3.9 is the last line with both KRaft production-ready and the 3.x client API.
- ``SPARK_KAFKA_CONNECTOR``: pyspark version -> (``spark-sql-kafka-0-10_2.13`` version,
  ``spark-token-provider-kafka-0-10_2.13`` version). The connector should equal pyspark's version, but the
  Maven Central we reach has no Spark 4.3.0 artifacts at all (its newest ``spark-sql-kafka`` is 4.2.0, and
  its newest ``spark-token-provider-kafka`` jar is 4.0.0), so pyspark 4.3.0 gets the 4.2.0 connector with the
  4.0.0 token provider. Spark 4.2.0 was built against the same Scala (2.13.18), Hadoop (3.5.0) and
  kafka-clients (3.9.2) as pyspark 4.3.0, and ``tests/integration/test_infra.py`` proves the combination reads,
  streams and writes Kafka. A pyspark version not in the table uses its own version for both.
- Hadoop: not pinned; read from pyspark's own ``hadoop-client-api-<v>.jar`` (3.5.0 for pyspark 4.3.0), and
  ``hadoop-aws`` of exactly that version brings the AWS SDK v2 ``bundle`` it was built with (2.35.4).
- ``MINIO_VERSION``: the newest version of ``github.com/minio/minio`` the Go module proxy serves (MinIO tags
  its releases ``RELEASE.<date>``, which are not semantic versions, so the module proxy knows it only by this
  pseudo-version, the commit of 2026-02-12). Its go.mod has no ``replace`` directives.
"""

KAFKA_VERSION = "3.9.2"
SLF4J_RELOAD4J_VERSION = "1.7.36"  # the broker's log binding (Kafka 3.9's own distribution ships it)

SPARK_KAFKA_CONNECTOR: dict[str, tuple[str, str]] = {
    "4.3.0": ("4.2.0", "4.0.0"),
}

MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
