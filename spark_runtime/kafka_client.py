"""Kafka client settings of a shard's source and sink: the user's client options, credentials from a Secret, and
the keys the runtime owns (pure: no Spark, and no Kafka client but :func:`known_to_librdkafka`'s probe; the operator
imports it to validate and to build the pod's environment).

A Task names, per side (``source.kafka`` / ``sink.kafka``):

- ``options``: Kafka client properties passed through to the consumer, producer and admin client (for example
  ``security.protocol: SASL_SSL``, ``sasl.mechanism: SCRAM-SHA-512``, ``ssl.endpoint.identification.algorithm``,
  timeouts). Keys the runtime owns are refused by name (:data:`RESERVED`), and so is every secret
  (``sasl.jaas.config``, ``*.password``, inline keys and certificates): those come from
- ``credentialsSecret``: a Secret in the Task's namespace with any of the keys :data:`SECRET_KEYS` (``username``
  and ``password`` for SASL/PLAIN or SCRAM; ``ca.crt`` to trust the brokers' certificates; ``tls.crt`` and
  ``tls.key`` for a client certificate). The operator passes each key to the pod as an environment variable
  (:func:`env_name`; optional, so a Secret may hold only some of them), and :func:`client_properties` turns them
  into the client's properties: a JAAS configuration for the SASL mechanism, PEM trust and key stores inline.
  ``security.protocol`` defaults from what is there (SASL_SSL, SASL_PLAINTEXT or SSL) unless ``options`` sets it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = [
    "RESERVED",
    "SECRET_KEYS",
    "KafkaCredentialsMissing",
    "client_properties",
    "env_name",
    "librdkafka_properties",
    "reserved_option_problems",
]

SECRET_KEYS = ("username", "password", "ca.crt", "tls.crt", "tls.key")
"""The keys of a Kafka ``credentialsSecret`` the runtime reads (each optional)."""

RESERVED: dict[str, str] = {
    "bootstrap.servers": "bootstrapServers",
    "group.id": "the runtime (the reader joins no consumer group: it assigns partitions and commits nothing)",
    "group.instance.id": "the runtime (the reader joins no consumer group)",
    "key.deserializer": "the runtime (records are read as bytes)",
    "value.deserializer": "the runtime (records are read as bytes)",
    "key.serializer": "the runtime (results are written as bytes)",
    "value.serializer": "the runtime (results are written as bytes)",
    "enable.auto.commit": "the runtime (positions live in the shard's recovery log, never in Kafka)",
    "auto.offset.reset": "startingOffsets",
    "enable.idempotence": "the runtime (the sink's effectively-once writes)",
    "acks": "the runtime (the sink writes with acks=all)",
    "transactional.id": "the runtime (the sink is effectively once, not transactional)",
    "sasl.jaas.config": "credentialsSecret (keys username and password)",
    "ssl.truststore.certificates": "credentialsSecret (key ca.crt)",
    "ssl.keystore.certificate.chain": "credentialsSecret (key tls.crt)",
    "ssl.keystore.key": "credentialsSecret (key tls.key)",
}
"""Client properties ``options`` may not set, and who sets them instead. Any key ending in ``password`` is refused
too: secrets come from ``credentialsSecret``, never from the spec."""

OPTION_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}")
"""A Kafka client property name."""

LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
"""The JAAS login module of each SASL mechanism with a username and password."""


class KafkaCredentialsMissing(ValueError):
    """The options ask for SASL but the Secret gave no username or password (the message names the field)."""


def env_name(role: str, key: str) -> str:
    """The pod's environment variable of a ``credentialsSecret`` key: ``TASKSHARD_KAFKA_SOURCE_CA_CRT``, ..."""
    return f"TASKSHARD_KAFKA_{role.upper()}_{key.upper().replace('.', '_')}"


def reserved_option_problems(options: Mapping[str, str] | None, field: str) -> list[str]:
    """One message per key of ``options`` (at ``field``, e.g. ``spec.source.kafka.options``) the runtime owns or
    that holds a secret, naming the key and what to use instead."""
    problems = []
    for key in sorted(options or {}):
        if not OPTION_NAME.fullmatch(key):
            problems.append(f"{field}.{key}: not a Kafka client property name (letters, digits, '.', '_', '-')")
            continue
        owner = RESERVED.get(key.strip().lower())
        if owner is None and key.strip().lower().endswith("password"):
            owner = "credentialsSecret (passwords never go into a spec)"
        if owner is not None:
            problems.append(f"{field}.{key}: this Kafka client property is set by {owner}; remove it from {field}")
    return problems


def client_properties(
    options: Mapping[str, str] | None, role: str, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Kafka client properties of one side (``role``: ``source`` or ``sink``): ``options`` plus what the
    credentials in ``env`` (the pod's environment, :func:`env_name`) make of them. Raises
    :class:`KafkaCredentialsMissing` when ``options`` asks for SASL but there is no username or password."""
    env = os.environ if env is None else env
    props = {str(k): str(v) for k, v in (options or {}).items()}
    secret = {key: env.get(env_name(role, key)) or "" for key in SECRET_KEYS}
    field = f"{role}.kafka.credentialsSecret"
    protocol = props.get("security.protocol", "").upper()
    sasl = bool(secret["username"] or secret["password"]) or protocol.startswith("SASL")
    tls = bool(secret["ca.crt"] or secret["tls.crt"]) or protocol.endswith("SSL")
    if sasl:
        if not (secret["username"] and secret["password"]):
            got = " and ".join(k for k in ("username", "password") if secret[k]) or "neither"
            raise KafkaCredentialsMissing(
                f"{field}: SASL ({props.get('security.protocol') or 'a username or password'}) needs both keys "
                f"username and password in the Secret (the pod got {got})"
            )
        mechanism = props.setdefault("sasl.mechanism", "PLAIN").upper()
        module = LOGIN_MODULES.get(mechanism)
        if module is None:
            raise KafkaCredentialsMissing(
                f"{role}.kafka.options.sasl.mechanism: {mechanism!r} takes no username and password; one of "
                f"{', '.join(LOGIN_MODULES)} does"
            )
        props["sasl.jaas.config"] = (
            f'{module} required username="{_escape(secret["username"])}" password="{_escape(secret["password"])}";'
        )
    if secret["ca.crt"]:
        props["ssl.truststore.type"] = "PEM"
        props["ssl.truststore.certificates"] = secret["ca.crt"]
    if secret["tls.crt"] or secret["tls.key"]:
        if not (secret["tls.crt"] and secret["tls.key"]):
            raise KafkaCredentialsMissing(f"{field}: a client certificate needs both keys tls.crt and tls.key")
        props["ssl.keystore.type"] = "PEM"
        props["ssl.keystore.certificate.chain"] = secret["tls.crt"]
        props["ssl.keystore.key"] = secret["tls.key"]
    if "security.protocol" not in props and (sasl or tls):
        props["security.protocol"] = ("SASL_" if sasl else "") + ("SSL" if tls else "PLAINTEXT")
    return props


LIBRDKAFKA_NAMES = {
    "ssl.truststore.certificates": "ssl.ca.pem",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem",
    "ssl.keystore.key": "ssl.key.pem",
}
"""Client properties whose librdkafka name differs (PEM material inline)."""
LIBRDKAFKA_CREDENTIALS = ("ssl.ca.pem", "ssl.certificate.pem", "ssl.key.pem", "sasl.username", "sasl.password")
"""What :func:`librdkafka_properties` takes from the Secret (known names; their values are checked on connect)."""
JVM_ONLY = ("ssl.truststore.type", "ssl.keystore.type", "sasl.jaas.config")
"""Properties :func:`client_properties` sets that librdkafka does not know (it takes the PEM and the username and
password directly)."""


def librdkafka_properties(
    options: Mapping[str, str] | None, role: str, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The same client properties as :func:`client_properties`, for a librdkafka (confluent-kafka) client: PEM
    material as ``ssl.ca.pem``, ``ssl.certificate.pem`` and ``ssl.key.pem``; SASL credentials as ``sasl.username``
    and ``sasl.password``; an empty ``ssl.endpoint.identification.algorithm`` (the JVM's "off") as ``none``.
    Properties librdkafka does not know are the caller's to drop (:func:`known_to_librdkafka`)."""
    env = os.environ if env is None else env
    props = client_properties(options, role, env)
    out = {LIBRDKAFKA_NAMES.get(k, k): v for k, v in props.items() if k not in JVM_ONLY}
    if "sasl.jaas.config" in props:
        out["sasl.username"] = env.get(env_name(role, "username")) or ""
        out["sasl.password"] = env.get(env_name(role, "password")) or ""
    if out.get("ssl.endpoint.identification.algorithm", None) == "":
        out["ssl.endpoint.identification.algorithm"] = "none"
    return out


def known_to_librdkafka(props: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``(kept, dropped)``: ``props`` without the properties librdkafka refuses as unknown (JVM-only client
    properties such as ``default.api.timeout.ms``, which the JVM clients of the same Task still use), and their
    names. A value librdkafka refuses raises ``confluent_kafka.KafkaException``; the credentials are not probed."""
    from confluent_kafka import Consumer, KafkaException

    kept, dropped = dict(props), []
    for key, value in props.items():
        if key in LIBRDKAFKA_CREDENTIALS:
            continue
        try:  # one property at a time: only its name and value are judged
            Consumer({"group.id": "taskshard-probe", key: value}).close()
        except KafkaException as exc:
            message = str(exc.args[0]) if exc.args else str(exc)
            if "No such configuration property" in message:
                dropped.append(key)
                del kept[key]
            elif "Invalid value" in message:
                raise
    return kept, dropped


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
