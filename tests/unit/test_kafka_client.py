"""Kafka client settings (spark_runtime.kafka_client): the options users pass through, the keys refused by name,
the credentials a Secret gives the pod, and the Task's admission (the model and the CRD's rule agree)."""

from __future__ import annotations

import pytest

from spark_runtime.config import parse_config
from spark_runtime.kafka_client import (
    KafkaCredentialsMissing,
    client_properties,
    env_name,
    known_to_librdkafka,
    librdkafka_properties,
    reserved_option_problems,
)
from taskshard_operator import builders
from taskshard_operator.models.task import TaskSpec

from .operator_spec import SPEC

pytestmark = pytest.mark.unit

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def env(role: str, **keys: str) -> dict[str, str]:
    return {env_name(role, k.replace("_", ".")): v for k, v in keys.items()}


def test_sasl_over_tls_from_a_secret_becomes_the_clients_properties():
    props = client_properties(
        {"sasl.mechanism": "SCRAM-SHA-512", "request.timeout.ms": "20000"},
        "source",
        env("source", username="shard", password='p"w', ca_crt=CA),
    )
    assert props["security.protocol"] == "SASL_SSL", "SASL and a CA: SASL over TLS"
    assert props["sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="shard" password="p\\"w";'
    )
    assert props["ssl.truststore.type"] == "PEM" and props["ssl.truststore.certificates"] == CA
    assert props["request.timeout.ms"] == "20000", "other options pass through"
    plain = client_properties({}, "sink", env("sink", username="u", password="p"))
    assert plain["security.protocol"] == "SASL_PLAINTEXT" and "PlainLoginModule" in plain["sasl.jaas.config"]
    mtls = client_properties({}, "sink", env("sink", ca_crt=CA, tls_crt="CERT", tls_key="KEY"))
    assert mtls["security.protocol"] == "SSL" and mtls["ssl.keystore.key"] == "KEY"
    assert client_properties({"security.protocol": "SSL"}, "source", {}) == {"security.protocol": "SSL"}
    assert client_properties(None, "source", {}) == {}, "no options, no Secret: nothing"


def test_the_reader_gets_the_same_credentials_in_librdkafka_terms():
    """The Kafka reader is librdkafka: PEM inline under its own names, SASL as username and password, no JAAS."""
    options = {"sasl.mechanism": "SCRAM-SHA-512", "ssl.endpoint.identification.algorithm": ""}
    secret = env("source", username="shard", password='p"w', ca_crt=CA, tls_crt="CERT", tls_key="KEY")
    props = librdkafka_properties(options, "source", secret)
    assert props == {
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.endpoint.identification.algorithm": "none",
        "sasl.username": "shard",
        "sasl.password": 'p"w',
        "ssl.ca.pem": CA,
        "ssl.certificate.pem": "CERT",
        "ssl.key.pem": "KEY",
        "security.protocol": "SASL_SSL",
    }
    kept, dropped = known_to_librdkafka({**props, "default.api.timeout.ms": "5000", "fetch.max.bytes": "1048576"})
    assert dropped == ["default.api.timeout.ms"], "a JVM-only property is dropped for the reader, by name"
    assert kept["fetch.max.bytes"] == "1048576" and kept["sasl.password"] == 'p"w'
    with pytest.raises(Exception, match="security.protocol"):
        known_to_librdkafka({"security.protocol": "bogus"})  # a bad value is an error, never dropped


@pytest.mark.parametrize(
    "options, secret, needle",
    [
        (
            {"security.protocol": "SASL_SSL"},
            {},
            "needs both keys username and password in the Secret (the pod got neither)",
        ),
        ({}, {"username": "u"}, "the pod got username"),
        ({"sasl.mechanism": "GSSAPI"}, {"username": "u", "password": "p"}, "'GSSAPI' takes no username and password"),
        ({}, {"tls_crt": "CERT"}, "a client certificate needs both keys tls.crt and tls.key"),
    ],
)
def test_credentials_the_options_ask_for_but_the_pod_lacks_are_named(options, secret, needle):
    with pytest.raises(KafkaCredentialsMissing, match="source.kafka"):
        client_properties(options, "source", env("source", **secret))
    with pytest.raises(KafkaCredentialsMissing) as missing:
        client_properties(options, "source", env("source", **secret))
    assert needle in str(missing.value)


def test_keys_the_runtime_owns_and_secrets_are_refused_by_name():
    assert reserved_option_problems({"security.protocol": "SASL_SSL", "client.id": "x"}, "f") == []
    problems = reserved_option_problems(
        {"bootstrap.servers": "x", "sasl.jaas.config": "y", "ssl.keystore.password": "z", "bad name": "w"}, "f"
    )
    assert problems == [
        "f.bad name: not a Kafka client property name (letters, digits, '.', '_', '-')",
        "f.bootstrap.servers: this Kafka client property is set by bootstrapServers; remove it from f",
        "f.sasl.jaas.config: this Kafka client property is set by credentialsSecret (keys username and password); "
        "remove it from f",
        "f.ssl.keystore.password: this Kafka client property is set by credentialsSecret (passwords never go into a "
        "spec); remove it from f",
    ]
    source = {"kafka": {"bootstrapServers": "k:9092", "topic": "t", "options": {"group.id": "g"}}}
    with pytest.raises(ValueError, match=r"spec\.source\.kafka\.options\.group\.id: this Kafka client property"):
        TaskSpec.from_k8s({**SPEC, "source": source})
    shard = {
        "task": "t",
        "shard": "t-0-1",
        "maxKeyGroups": 1,
        "keyGroups": {"start": 0, "end": 1},
        "processor": {"builtin": "count"},
        "source": {"journal": {"path": "/j"}},
        "sink": {"kafka": {"bootstrapServers": "k:9092", "topic": "o", "options": {"acks": "1"}}},
        "storage": {"path": "/s"},
    }
    with pytest.raises(ValueError, match=r"sink\.kafka\.options\.acks: this Kafka client property is set by the"):
        parse_config(shard)


def test_the_pod_gets_each_secret_key_as_an_optional_reference():
    kafka = {"bootstrapServers": "k:9092", "topic": "t", "credentialsSecret": "kafka-creds"}
    spec = TaskSpec.from_k8s({**SPEC, "source": {"kafka": kafka}, "sink": {"kafka": {**kafka, "topic": "out"}}})
    env_vars = builders.kafka_credentials_env(spec)
    assert [e["name"] for e in env_vars] == [
        f"TASKSHARD_KAFKA_{role}_{key}"
        for role in ("SOURCE", "SINK")
        for key in ("USERNAME", "PASSWORD", "CA_CRT", "TLS_CRT", "TLS_KEY")
    ]
    assert all(
        e["valueFrom"]["secretKeyRef"]
        == {"name": "kafka-creds", "key": e["valueFrom"]["secretKeyRef"]["key"], "optional": True}
        for e in env_vars
    )
    assert builders.kafka_credentials_env(TaskSpec.from_k8s(SPEC)) == []
