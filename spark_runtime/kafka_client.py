"""Kafka client settings of a shard's source and sink: the user's client options, credentials from a Secret, and
the keys the runtime owns (pure: no Spark, no Kafka client; the operator imports it to validate and to build the
pod's environment).

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
    "reserved_option_problems",
]

SECRET_KEYS = ("username", "password", "ca.crt", "tls.crt", "tls.key")
"""The keys of a Kafka ``credentialsSecret`` the runtime reads (each optional)."""

RESERVED: dict[str, str] = {
    "bootstrap.servers": "bootstrapServers",
    "group.id": "the runtime (Spark's Kafka source assigns a group of its own to each query)",
    "group.instance.id": "the runtime (Spark's Kafka source)",
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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
