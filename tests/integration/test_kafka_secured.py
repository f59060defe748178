"""Secured Kafka on the real broker's SASL_SSL listener (TLS with a test CA; SASL SCRAM-SHA-512 and PLAIN): a shard
reads and writes over it with the credentials a Secret gives its pod (``credentialsSecret``: username, password,
ca.crt, as environment variables) and ``options`` (``sasl.mechanism``), exact across a split; a wrong password and
a missing one stop the shard before it processes anything, naming ``source.kafka.credentialsSecret``."""

from __future__ import annotations

import random

import pytest

from spark_runtime.kafka_client import env_name
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.shard import ShardRunner

from .test_kafka_s3_shards import Reference, Running, Setup, check_results, make_events

pytestmark = pytest.mark.integration


def secured(setup: Setup, broker, mechanism: str = "SCRAM-SHA-512") -> dict:
    """``source`` and ``sink`` over the SASL_SSL listener."""
    side = {"bootstrapServers": broker.secure.bootstrap_servers, "options": {"sasl.mechanism": mechanism}}
    side["credentialsSecret"] = "kafka-credentials"
    return {
        "source": {"kafka": {**side, "topic": setup.topic_in}},
        "sink": {"kafka": {**side, "topic": setup.topic_out}},
    }


def credentials(monkeypatch, broker, *, password: str | None = None, user: str | None = None) -> None:
    """What the pod gets from the Secret (the operator maps its keys to these variables)."""
    secure = broker.secure
    for role in ("source", "sink"):
        monkeypatch.setenv(env_name(role, "username"), user or secure.SCRAM_USER)
        monkeypatch.setenv(env_name(role, "password"), password or secure.SCRAM_PASSWORD)
        monkeypatch.setenv(env_name(role, "ca.crt"), secure.ca_pem)


def test_a_split_over_sasl_ssl_is_exact(spark, kafka_broker, minio, tmp_path, monkeypatch):
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(43), Reference()
    credentials(monkeypatch, kafka_broker)
    io = secured(setup, kafka_broker)
    first = make_events(1500, rng)
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    parent = Running(setup.config("kt-0-16", 0, 16, **io), spark)
    parent.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    assert parent.runner.source.client["security.protocol"] == "SASL_SSL"
    summary = parent.finish()
    restore = {"parent": "kt-0-16", "manifest": summary["manifest"]}
    children = [
        Running(setup.config(n, a, b, restore, **io), spark) for n, a, b in (("kt-0-8", 0, 8), ("kt-8-16", 8, 16))
    ]
    second = make_events(1000, rng)
    kafka_broker.produce(setup.topic_in, second)
    ref.add(second)
    for child in children:
        child.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
        child.finish()
    check_results(setup, ref)


def test_a_wrong_or_missing_credential_names_the_field(spark, kafka_broker, minio, tmp_path, monkeypatch):
    setup = Setup(kafka_broker, minio, tmp_path, partitions=1)
    io = secured(setup, kafka_broker, mechanism="PLAIN")
    credentials(monkeypatch, kafka_broker, user=kafka_broker.secure.PLAIN_USER, password="not-the-password")
    with pytest.raises(EnvironmentProblem) as refused:
        ShardRunner(setup.config("kt-0-16", 0, 16, **io), spark).start()
    assert refused.value.reason == "KafkaAuthenticationFailed"
    assert refused.value.field == "source.kafka.credentialsSecret" and "refused the client's credentials" in str(
        refused.value
    )
    monkeypatch.delenv(env_name("source", "password"))  # a Secret without the key
    with pytest.raises(EnvironmentProblem) as missing:
        ShardRunner(setup.config("kt-0-16", 0, 16, **io), spark).start()
    assert missing.value.reason == "KafkaCredentialsMissing" and missing.value.field == "source.kafka.credentialsSecret"
    assert "needs both keys username and password" in str(missing.value)
