"""The integration tier's real components work: Kafka (KRaft) from Maven Central jars, MinIO from its Go module,
and a local SparkSession that reads Kafka and writes Parquet to MinIO through s3a with the cached jars."""

from __future__ import annotations

import collections
import uuid

import pytest

from testinfra import jars as jarmod
from testinfra import minio as miniomod
from testinfra.common import free_port
from testinfra.s3 import S3Error

pytestmark = pytest.mark.integration


def _records(n: int, keys: int = 7, tag: str = "") -> list[dict]:
    return [{"key": f"k{i % keys}", "n": i, "tag": tag} for i in range(n)]


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---- Kafka ---------------------------------------------------------------------------------------------------
def test_broker_round_trips_keyed_json(kafka_broker):
    topic = _topic("roundtrip")
    kafka_broker.create_topic(topic, 3)
    sent = _records(60)
    positions = kafka_broker.produce(topic, sent)

    got = kafka_broker.consume_all(topic)

    assert sorted(r.value["n"] for r in got) == list(range(60))
    assert kafka_broker.end_offsets(topic) == dict(collections.Counter(p for p, _ in positions))
    by_key = collections.defaultdict(set)
    for r in got:
        assert r.key == r.value["key"]
        by_key[r.key].add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values()), by_key  # one key, one partition
    assert len({p for parts in by_key.values() for p in parts}) > 1  # and the keys spread over partitions


def test_missing_topic_is_an_error(kafka_broker):
    with pytest.raises(KeyError, match="does not exist"):
        kafka_broker.end_offsets(_topic("missing"))


@pytest.mark.parametrize("graceful", [True, False], ids=["controlled-shutdown", "crash"])
def test_broker_restart_keeps_data(kafka_broker, graceful):
    topic = _topic("restart")
    kafka_broker.create_topic(topic, 2)
    kafka_broker.produce(topic, _records(40, tag="before"))
    bootstrap = kafka_broker.bootstrap_servers

    kafka_broker.restart(graceful=graceful)

    assert kafka_broker.bootstrap_servers == bootstrap
    kafka_broker.produce(topic, _records(10, tag="after"))
    got = kafka_broker.consume_all(topic)
    assert collections.Counter(r.value["tag"] for r in got) == {"before": 40, "after": 10}
    assert sorted(r.value["n"] for r in got if r.value["tag"] == "before") == list(range(40))


# ---- MinIO ---------------------------------------------------------------------------------------------------
def test_minio_stores_and_returns_an_object(minio):
    s3 = minio.client()
    key = f"infra/{uuid.uuid4().hex}/hello.json"
    s3.put_object(minio.bucket, key, b'{"hello": "world"}')

    assert s3.get_object(minio.bucket, key) == b'{"hello": "world"}'
    assert key in s3.list_objects(minio.bucket, "infra/")
    s3.delete_object(minio.bucket, key)
    assert key not in s3.list_objects(minio.bucket, "infra/")


def test_minio_rejects_wrong_credentials(minio):
    with pytest.raises(S3Error) as e:
        minio.client(secret_key="not-the-secret").list_objects(minio.bucket)
    assert e.value.status == 403 and e.value.code == "SignatureDoesNotMatch"


# ---- Spark with the cached jars ------------------------------------------------------------------------------
def test_spark_reads_a_kafka_topic(spark, kafka_broker):
    topic = _topic("spark-read")
    kafka_broker.create_topic(topic, 3)
    positions = kafka_broker.produce(topic, _records(50))

    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition", "offset")
    )
    rows = df.collect()

    assert sorted((r.partition, r.offset) for r in rows) == sorted(positions)
    assert sorted(r.key for r in rows) == sorted(rec["key"] for rec in _records(50))


def test_spark_writes_a_kafka_topic(spark, kafka_broker):
    topic = _topic("spark-write")
    kafka_broker.create_topic(topic, 2)
    rows = [(f"k{i % 3}", f'{{"key": "k{i % 3}", "n": {i}}}') for i in range(20)]

    spark.createDataFrame(rows, "key string, value string").write.format("kafka").option(
        "kafka.bootstrap.servers", kafka_broker.bootstrap_servers
    ).option("topic", topic).save()

    got = kafka_broker.consume_all(topic)
    assert sorted(r.value["n"] for r in got) == list(range(20))
    assert all(r.key == r.value["key"] for r in got)


def test_spark_writes_and_reads_parquet_on_s3a(spark, minio):
    prefix = f"infra/parquet-{uuid.uuid4().hex[:8]}"
    path = f"s3a://{minio.bucket}/{prefix}"
    spark.range(1000).selectExpr("id", "id % 7 AS kg").write.partitionBy("kg").parquet(path)

    back = spark.read.parquet(path)

    assert back.count() == 1000
    assert sorted(r.kg for r in back.select("kg").distinct().collect()) == list(range(7))
    keys = minio.client().list_objects(minio.bucket, prefix + "/")
    assert f"{prefix}/_SUCCESS" in keys and any(k.endswith(".parquet") for k in keys)


def test_spark_streams_kafka_with_its_checkpoint_on_s3a(spark, kafka_broker, minio):
    """The shape the shard runtime needs: a stateful Kafka stream whose checkpoint (offsets, commits, RocksDB
    state) lives on s3a, restarted from that checkpoint with no record lost or counted twice."""
    topic = _topic("spark-stream")
    kafka_broker.create_topic(topic, 2)
    checkpoint = f"s3a://{minio.bucket}/infra/stream-{uuid.uuid4().hex[:8]}/checkpoint"
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )

    def run_once(table: str) -> dict[str, int]:
        q = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(key AS STRING) AS key")
            .groupBy("key")
            .count()
            .writeStream.outputMode("complete")
            .format("memory")
            .queryName(table)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        return {r.key: r["count"] for r in spark.table(table).collect()}

    kafka_broker.produce(topic, _records(35, keys=5))
    assert run_once("first") == {f"k{i}": 7 for i in range(5)}
    kafka_broker.produce(topic, _records(10, keys=5))
    assert run_once("second") == {f"k{i}": 9 for i in range(5)}
    assert minio.client().list_objects(minio.bucket, checkpoint.split("/", 3)[3] + "/offsets/")


# ---- failing clearly -----------------------------------------------------------------------------------------
def test_jars_fail_clearly_when_maven_central_is_unreachable(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSHARD_JAR_CACHE", str(tmp_path / "jars"))
    monkeypatch.setenv("TASKSHARD_MAVEN_REPO", f"http://127.0.0.1:{free_port()}/maven2")
    with pytest.raises(jarmod.JarsUnavailable, match="is not reachable"):
        jarmod.ensure_jar_set(jarmod.kafka_broker_set())
    assert not list((tmp_path / "jars").glob("kafka-broker-*"))  # nothing half-made


def test_minio_fails_clearly_when_the_module_proxy_is_unreachable(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSHARD_BIN_CACHE", str(tmp_path / "bin"))
    monkeypatch.setenv("GOPROXY", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(miniomod.MinioUnavailable, match="did not serve"):
        miniomod.ensure_minio()
    assert not list((tmp_path / "bin").glob("minio-*"))


def test_jar_cache_is_reused(spark_jars, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn: only the cache can answer
    again = jarmod.spark_jars()
    assert again == spark_jars
    names = {p.name for p in spark_jars}
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in names)
    assert f"hadoop-aws-{jarmod.hadoop_version()}.jar" in names
    assert not any(n.startswith(("scala-library-", "hadoop-client-api-")) for n in names)  # pyspark's win


def test_minio_fails_clearly_without_go(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSHARD_BIN_CACHE", str(tmp_path / "bin"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(miniomod.MinioUnavailable, match="Go is not installed"):
        miniomod.ensure_minio()
