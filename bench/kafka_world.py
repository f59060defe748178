"""The Kafka + MinIO world of ``bench/merge_gap.py --source kafka`` (``hack/testinfra``, loopback): per trial an
input and an output topic and an S3 prefix, answering what :func:`merge_gap.trial` asks of its world. Commit times
are object LastModified from a listing (millisecond precision); a child's first emitting batch comes from the output
records' ``taskshard-id`` header."""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path
from typing import Any

from spark_runtime.protocol import drain_summary_uri
from spark_runtime.storage import Loc, S3Settings, location

TASK = "mg"
BUCKET = "bench"


class KafkaS3World:
    """A broker and MinIO for the run; the shards inherit the S3 credentials and the jars from the environment."""

    def __init__(self, run_dir: Path) -> None:
        from testinfra.jars import spark_jars
        from testinfra.kafka import KafkaBroker
        from testinfra.minio import MinioServer

        jars = spark_jars(kafka=True, s3=True)
        self.broker = KafkaBroker(run_dir / "kafka").start()
        self.minio = MinioServer(run_dir / "minio")
        self.minio.start()
        self.minio.create_bucket(BUCKET)
        key, secret = self.minio.access_key, self.minio.secret_key
        os.environ.update(
            AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret, TASKSHARD_EXTRA_JARS=os.pathsep.join(map(str, jars))
        )
        self.s3 = S3Settings(endpoint=self.minio.endpoint, access_key=key, secret_key=secret)
        self.trials = 0

    def trial(self, partitions: int) -> KafkaS3Trial:
        self.trials += 1
        return KafkaS3Trial(self, f"{TASK}{self.trials}", partitions)

    def close(self) -> None:
        self.minio.stop()
        self.broker.stop()


class KafkaS3Trial:
    """One trial's topics (``<tag>-in``, ``<tag>-out``) and S3 prefix (``<tag>``)."""

    def __init__(self, world: KafkaS3World, tag: str, partitions: int) -> None:
        self.world, self.tag, self.partitions = world, tag, partitions
        self.topic_in, self.topic_out = f"{tag}-in", f"{tag}-out"
        for topic in (self.topic_in, self.topic_out):
            world.broker.create_topic(topic, partitions)
        self.root = f"s3a://{BUCKET}/{tag}/{TASK}"
        self._first_batch: dict[str, int] = {}
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()

    def blocks(self) -> dict[str, Any]:
        kafka = {"bootstrapServers": self.world.broker.bootstrap_servers}
        return {
            "source": {"kafka": kafka | {"topic": self.topic_in}},
            "sink": {"kafka": kafka | {"topic": self.topic_out}},
            "storage": {"s3": {"bucket": BUCKET, "prefix": self.tag, "endpoint": self.world.minio.endpoint}},
        }

    def drained_pointer(self, shard: str) -> str:
        return drain_summary_uri(self.root, shard)

    def prefill(self, keys: int, seed: int) -> dict[str, Any]:
        """One record per key (``u<i>``, shuffled); returns the topic's end offsets after it."""
        order = list(range(keys))
        random.Random(seed).shuffle(order)
        self.world.broker.produce(self.topic_in, [{"key": f"u{i}"} for i in order])
        return {self.topic_in: {str(p): o for p, o in self.world.broker.end_offsets(self.topic_in).items()}}

    def producer(self, keys: int, rate: int, seed: int) -> KafkaProducerThread:
        return KafkaProducerThread(self.world.broker.bootstrap_servers, self.topic_in, keys, rate, seed)

    def _loc(self, shard: str, *parts: str) -> Loc:
        return location("/".join([self.root, "shards", shard, *parts]), self.world.s3)

    def _listing(self, loc: Loc) -> dict[str, float]:
        from pyarrow import fs  # file name -> LastModified

        infos = loc.fs.get_file_info(fs.FileSelector(loc.path, allow_not_found=True))
        return {i.path.rsplit("/", 1)[-1]: i.mtime.timestamp() for i in infos if i.mtime is not None}

    def consumed(self, shard: str, ends: dict[str, Any]) -> bool:
        try:
            positions = self._loc(shard, "progress.json").read_json()["positions"]
        except (FileNotFoundError, OSError, ValueError, KeyError):
            return False
        got = positions.get(self.topic_in) or {}
        return all(int(got.get(p, 0)) >= int(o) for p, o in ends[self.topic_in].items())

    def commit_times(self, shard: str) -> dict[int, float]:
        return {int(n): t for n, t in self._listing(self._loc(shard, "checkpoint", "commits")).items() if n.isdigit()}

    def first_emit(self, shard: str) -> float | None:
        batch = self._first_batch.get(shard)
        return None if batch is None else self.commit_times(shard).get(batch)

    def last_commit(self, shard: str) -> float | None:
        summary = self._loc(shard, "drained.json").read_json()
        return self.commit_times(shard).get(int(summary["batchId"]))

    def drained_at(self, shard: str) -> float | None:
        return self._listing(self._loc(shard)).get("drained.json")

    def _read_output(self) -> None:
        """Follow the output topic: the first batch of each shard that wrote a record."""
        from testinfra.kafka import _confluent

        consumer = _confluent().Consumer(
            {"bootstrap.servers": self.world.broker.bootstrap_servers, "group.id": f"bench-{self.tag}"}
            | {"auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"}
        )
        consumer.subscribe([self.topic_out])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(1000, timeout=0.2):
                    for name, value in [] if msg.error() else msg.headers() or []:
                        if name == "taskshard-id" and value:
                            shard, batch = value.decode().split("/")[:2]
                            self._first_batch[shard] = min(int(batch), self._first_batch.get(shard, int(batch)))
        finally:
            consumer.close()

    def close(self) -> None:
        self._stop.set()
        self._reader.join(timeout=10)


class KafkaProducerThread(threading.Thread):
    """Produces ``rate`` records per second (keys ``u<i>`` of the pre-fill) until ``stop_event`` is set."""

    def __init__(self, servers: str, topic: str, keys: int, rate: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.servers, self.topic, self.keys, self.rate = servers, topic, keys, rate
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.events = 0

    def run(self) -> None:
        from testinfra.kafka import _confluent

        producer = _confluent().Producer({"bootstrap.servers": self.servers, "linger.ms": 20})
        while not self.stop_event.wait(0.25):
            for _ in range(max(1, self.rate // 4)):
                key = f"u{self.rng.randrange(self.keys)}"
                producer.produce(self.topic, key=key.encode(), value=json.dumps({"key": key}).encode())
                self.events += 1
            producer.poll(0)
        producer.flush(10)
