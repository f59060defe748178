"""An Apache Kafka broker in KRaft mode on loopback, from the cached Maven Central jars, plus client helpers.

:class:`KafkaBroker` (one combined broker+controller node, ``node.id=1``):
- ``start()``: the first start fetches the jars if needed (:mod:`testinfra.jars`), picks two free 127.0.0.1
  ports (client and controller listener), writes ``<run_dir>/server.properties`` and formats the log directory
  with ``kafka.tools.StorageTool format`` (the ``kafka-storage.sh format`` step); it then runs ``kafka.Kafka`` with
  the classpath ``<jars>/*`` and waits until the broker answers metadata requests with a leader for every
  partition. Output goes to ``<run_dir>/broker.log`` (appended across restarts).
- ``stop()`` is a controlled shutdown (SIGTERM, SIGKILL after the timeout); ``kill()`` is a crash (SIGKILL);
  ``restart()`` is stop + start. Ports, cluster id and data directory are kept, so clients' bootstrap address stays
  valid and committed data survives a restart.
- Topics are never auto-created (``auto.create.topics.enable=false``): a missing topic is an error, not a surprise.
- Transactions work on one node (transaction log replication factor 1, ``min.insync.replicas`` 1).

Client helpers (module functions taking the bootstrap address, also bound as broker methods) use confluent-kafka:
:func:`create_topic`, :func:`produce` (keyed JSON, idempotent producer, ``acks=all``), :func:`consume_all`
(``read_committed`` by default, no consumer group), :func:`end_offsets`, :func:`delete_topic`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import ManagedProcess, StartError, free_port, log, port_open, wait_until
from .jars import kafka_broker_jars
from .tls import make_tls

__all__ = [
    "KafkaBroker",
    "SecureListener",
    "add_scram_user",
    "KafkaRecord",
    "consume_all",
    "create_topic",
    "delete_topic",
    "end_offsets",
    "produce",
]

COMPONENT = "kafka"

LOG4J = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.org.apache.zookeeper=WARN
"""


def _confluent():
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "the Kafka test helpers need the confluent-kafka package (in the project's dev extra): "
            "pip install 'confluent-kafka>=2.6,<3'"
        ) from e
    return confluent_kafka


@dataclass(frozen=True)
class KafkaRecord:
    partition: int
    offset: int
    key: str | None
    value: Any  # parsed JSON when the payload is JSON, else the decoded text
    headers: dict[str, bytes]


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise StartError("Java is not installed (need java >= 17 on PATH or JAVA_HOME)")
    return java


def random_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64 that does not start with "-" (the storage tool's
    argument parser would take "-..." for an option; Kafka's own ``Uuid.randomUuid`` avoids it the same way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        jars_dir: str | os.PathLike | None = None,
        heap: str = "768m",
        extra_config: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``host``: the address the client listeners bind and advertise (the controller stays on loopback); the
        real-node tier passes the node's IP so that pods reach the broker."""
        self.run_dir = Path(run_dir)
        self.host = host
        self.jars_dir = Path(jars_dir) if jars_dir else None
        self.heap = heap
        self.extra_config = dict(extra_config or {})
        self.port: int | None = None
        self.controller_port: int | None = None
        self.secure_port: int | None = None
        """A second client listener, SASL_SSL (SASL PLAIN and SCRAM-SHA-512 over TLS; :attr:`secure`)."""
        self.process = ManagedProcess("kafka", self.run_dir / "broker.log")

    # ---- lifecycle -------------------------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise RuntimeError("the broker has not been started")
        return f"{self.host}:{self.port}"

    @property
    def secure(self) -> SecureListener:
        """The SASL_SSL listener: its address, the CA its certificate is signed by, and the users it knows."""
        if self.secure_port is None:
            raise RuntimeError("the broker has not been started")
        return SecureListener(f"{self.host}:{self.secure_port}", make_tls(self.run_dir / "tls").ca.read_text())

    @property
    def data_dir(self) -> Path:
        return self.run_dir / "data"

    def _config(self) -> str:
        assert self.port and self.controller_port
        tls = make_tls(self.run_dir / "tls")
        server = tls.server.read_text()
        key = server[: server.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----")] + "\n"
        chain = server[len(key) :]
        secure = "listener.name.sasl_ssl."

        def inline(pem: str) -> str:  # a Java properties value: newlines as \n escapes
            return pem.strip().replace("\n", "\\n")

        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},"
                f"SASL_SSL://{self.host}:{self.secure_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port},SASL_SSL://{self.host}:{self.secure_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            f"{secure}sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            f"{secure}plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{SecureListener.PLAIN_USER}="{SecureListener.PLAIN_PASSWORD}";'
            ),
            f"{secure}scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{secure}ssl.keystore.type": "PEM",
            f"{secure}ssl.keystore.key": inline(key),
            f"{secure}ssl.keystore.certificate.chain": inline(chain),
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.segment.bytes": str(64 * 2**20),
            "share.coordinator.state.topic.replication.factor": "1",
        }
        props.update(self.extra_config)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _jvm(self, main: str, *args: str) -> list[str]:
        assert self.jars_dir is not None
        return [
            _java(),
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.run_dir / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.run_dir / 'logs'}",
            "-cp",
            f"{self.jars_dir}/*",
            main,
            *args,
        ]

    def _format(self) -> None:
        cluster_file = self.run_dir / "cluster.id"
        if not cluster_file.exists():
            cluster_file.write_text(random_cluster_id())
        cmd = self._jvm(
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            "-t",
            cluster_file.read_text().strip(),
            "-c",
            str(self.run_dir / "server.properties"),
        )
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if res.returncode != 0:
            raise StartError(
                f"kafka-storage format failed (exit {res.returncode}):\n{res.stdout[-1500:]}{res.stderr[-1500:]}"
            )

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        if self.process.alive():
            return self
        if self.jars_dir is None:
            self.jars_dir = kafka_broker_jars()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        first = self.port is None
        if first:
            self.port, self.controller_port, self.secure_port = free_port(), free_port(), free_port()
            (self.run_dir / "server.properties").write_text(self._config())
            (self.run_dir / "log4j.properties").write_text(LOG4J)
            self._format()
        self.process.start(self._jvm("kafka.Kafka", str(self.run_dir / "server.properties")))
        started = time.monotonic()
        wait_until(
            lambda: port_open(self.port or 0, self.host),
            timeout=timeout,
            what=f"Kafka on {self.bootstrap_servers}",
            process=self.process,
        )
        wait_until(
            self._healthy, timeout=timeout, what="the broker to serve metadata with leaders", process=self.process
        )
        if first:
            add_scram_user(self.bootstrap_servers, SecureListener.SCRAM_USER, SecureListener.SCRAM_PASSWORD)
        log(
            COMPONENT,
            f"broker {'up' if first else 'restarted'} at {self.bootstrap_servers} (SASL_SSL at {self.host}:"
            f"{self.secure_port}) in {time.monotonic() - started:.1f}s (pid {self.process.pid}, log "
            f"{self.process.log_path})",
        )
        return self

    def _healthy(self) -> bool:
        ck = _confluent()
        admin = ck.admin.AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        md = admin.list_topics(timeout=3)
        if 1 not in md.brokers:
            return False
        return all(
            p.leader >= 0 and p.error is None
            for t in md.topics.values()
            if t.error is None
            for p in t.partitions.values()
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Controlled shutdown; idempotent."""
        if self.process.alive():
            rc = self.process.stop(timeout)
            log(COMPONENT, f"broker stopped (exit {rc})")

    def kill(self) -> None:
        """Crash the broker (SIGKILL)."""
        if self.process.alive():
            self.process.kill()
            log(COMPONENT, "broker killed")

    def restart(self, *, graceful: bool = True, down_for: float = 0.0, timeout: float = 90.0) -> None:
        self.stop() if graceful else self.kill()
        if down_for:
            time.sleep(down_for)
        self.start(timeout)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- helpers bound to this broker ------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, **kw: Any) -> None:
        create_topic(self.bootstrap_servers, name, partitions, **kw)

    def produce(self, topic: str, records: Iterable[Mapping[str, Any]], **kw: Any) -> list[tuple[int, int]]:
        return produce(self.bootstrap_servers, topic, records, **kw)

    def consume_all(self, topic: str, **kw: Any) -> list[KafkaRecord]:
        return consume_all(self.bootstrap_servers, topic, **kw)

    def end_offsets(self, topic: str) -> dict[int, int]:
        return end_offsets(self.bootstrap_servers, topic)

    def delete_topic(self, name: str) -> None:
        delete_topic(self.bootstrap_servers, name)

    def add_partitions(self, name: str, total: int) -> None:
        add_partitions(self.bootstrap_servers, name, total)


# ---- client helpers ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SecureListener:
    """The broker's SASL_SSL listener as a client sees it."""

    PLAIN_USER = "taskshard"
    PLAIN_PASSWORD = "taskshard-plain-secret"
    SCRAM_USER = "taskshard-scram"
    SCRAM_PASSWORD = "taskshard-scram-secret"

    bootstrap_servers: str
    ca_pem: str
    """The CA certificate the listener's certificate is signed by (PEM)."""

    def client_config(self, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
        """confluent-kafka settings for this listener with ``mechanism`` (PLAIN or SCRAM-SHA-512)."""
        user, password = (
            (self.PLAIN_USER, self.PLAIN_PASSWORD) if mechanism == "PLAIN" else (self.SCRAM_USER, self.SCRAM_PASSWORD)
        )
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.pem": self.ca_pem,
        }


def add_scram_user(bootstrap: str, user: str, password: str, timeout: float = 30) -> None:
    """Create (or reset) a SCRAM-SHA-512 credential on the broker."""
    _confluent()  # a clear error when confluent-kafka is missing
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    admin = _admin(bootstrap)  # kept referenced until the futures resolve
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout)


def _admin(bootstrap: str):
    return _confluent().admin.AdminClient({"bootstrap.servers": bootstrap})


def create_topic(
    bootstrap: str, name: str, partitions: int, *, config: Mapping[str, str] | None = None, timeout: float = 30
) -> None:
    """Create ``name`` with ``partitions`` partitions (replication 1) and wait until every partition has a leader."""
    ck = _confluent()
    admin = _admin(bootstrap)
    futures = admin.create_topics([ck.admin.NewTopic(name, partitions, 1, config=dict(config or {}))])
    futures[name].result(timeout)

    def ready() -> bool:
        t = admin.list_topics(name, timeout=5).topics.get(name)
        return bool(
            t
            and t.error is None
            and len(t.partitions) == partitions
            and all(p.leader >= 0 for p in t.partitions.values())
        )

    wait_until(ready, timeout=timeout, what=f"topic {name} to have leaders")


def add_partitions(bootstrap: str, name: str, total: int, timeout: float = 30) -> None:
    """Grow topic ``name`` to ``total`` partitions (Kafka can only add partitions) and wait for their leaders."""
    ck = _confluent()
    admin = _admin(bootstrap)
    admin.create_partitions([ck.admin.NewPartitions(name, total)])[name].result(timeout)

    def ready() -> bool:
        t = admin.list_topics(name, timeout=5).topics.get(name)
        return bool(t and len(t.partitions) == total and all(p.leader >= 0 for p in t.partitions.values()))

    wait_until(ready, timeout=timeout, what=f"topic {name} to have {total} partitions with leaders")


def delete_topic(bootstrap: str, name: str, timeout: float = 30) -> None:
    _admin(bootstrap).delete_topics([name])[name].result(timeout)


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[Mapping[str, Any]],
    *,
    key_field: str | None = "key",
    partition: int | None = None,
    timestamps: Sequence[int] | None = None,
    timeout: float = 60,
) -> list[tuple[int, int]]:
    """Produce each record as JSON, keyed by ``str(record[key_field])`` (Kafka's default partitioner then picks the
    partition unless ``partition`` is given), with the record timestamp ``timestamps[i]`` (epoch ms) when given.
    Idempotent producer, ``acks=all``. Returns ``(partition, offset)`` per record in order; raises when any delivery
    failed."""
    ck = _confluent()
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    results: list[tuple[int, int] | None] = []
    errors: list[str] = []

    def on_delivery(i: int):
        def cb(err, msg) -> None:
            if err is not None:
                errors.append(f"record {i}: {err}")
            else:
                results[i] = (msg.partition(), msg.offset())

        return cb

    for i, rec in enumerate(records):
        results.append(None)
        key = None if key_field is None or rec.get(key_field) is None else str(rec[key_field])
        kw: dict[str, Any] = {
            "key": key,
            "value": json.dumps(rec, separators=(",", ":")),
            "on_delivery": on_delivery(i),
        }
        if partition is not None:
            kw["partition"] = partition
        if timestamps is not None:
            kw["timestamp"] = int(timestamps[i])
        while True:
            try:
                producer.produce(topic, **kw)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(timeout)
    if left or errors or any(r is None for r in results):
        raise RuntimeError(f"producing to {topic} at {bootstrap} failed: {left} undelivered; {errors[:5]}")
    return [r for r in results if r is not None]


def end_offsets(bootstrap: str, topic: str, timeout: float = 10) -> dict[int, int]:
    """``{partition: high watermark}``; raises ``KeyError`` when the topic does not exist."""
    ck = _confluent()
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"taskshard-probe-{uuid.uuid4().hex}"})
    try:
        t = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if t is None or t.error is not None:
            raise KeyError(f"topic {topic} does not exist at {bootstrap} ({t.error if t else 'no metadata'})")
        return {
            p: consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=timeout)[1]
            for p in sorted(t.partitions)
        }
    finally:
        consumer.close()


def consume_all(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 60
) -> list[KafkaRecord]:
    """Every record of ``topic`` from the beginning up to the end offsets at call time, ordered by partition
    and offset. ``read_committed`` skips aborted transactions and waits for open ones (then times out)."""
    ck = _confluent()
    highs = end_offsets(bootstrap, topic)
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"taskshard-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    out: list[KafkaRecord] = []
    try:
        tps = [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in highs]
        consumer.assign(tps)
        deadline = time.monotonic() + timeout

        def done() -> bool:
            positions = consumer.position([ck.TopicPartition(topic, p) for p in highs])
            return all(tp.offset >= highs[tp.partition] for tp in positions if highs[tp.partition] > 0)

        while not done():
            if time.monotonic() > deadline:
                pos = {
                    tp.partition: tp.offset for tp in consumer.position([ck.TopicPartition(topic, p) for p in highs])
                }
                raise TimeoutError(f"consuming {topic}: reached {pos} of end offsets {highs} within {timeout:.0f}s")
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    raise RuntimeError(f"consuming {topic}: {msg.error()}")
                if msg.offset() >= highs[msg.partition()]:
                    continue
                raw = msg.value()
                try:
                    value: Any = json.loads(raw) if raw is not None else None
                except ValueError:
                    value = raw.decode(errors="replace")
                key = msg.key()
                out.append(
                    KafkaRecord(
                        msg.partition(),
                        msg.offset(),
                        key.decode() if key is not None else None,
                        value,
                        dict(msg.headers() or []),
                    )
                )
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))
