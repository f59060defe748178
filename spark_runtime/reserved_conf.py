"""Spark conf keys the protocol owns: a Task's ``spec.spark.conf`` may not set them.

Pure Python (imports neither pyspark, pydantic nor kopf): one table read by three checks that must agree,

- the Task model (``taskshard_operator.models.task.SparkSpec``) and, generated from it, one CEL rule per key on
  ``spec.spark.conf`` in the Task CRD (the apiserver refuses the Task at admission);
- the runtime's config (``spark_runtime.config.ShardConfig``), for the keys the runtime sets itself: the
  operator writes the keys it owns (``Owner.OPERATOR``) into ``shard.json`` on purpose, so the runtime refuses
  only ``Owner.RUNTIME`` keys there.

Unit tests check that the table covers what the code really sets: ``spark_runtime.session.DEFAULT_CONF``'s state
store keys, ``S3Settings.hadoop_conf()``'s keys derived from ``storage.s3`` and every key of the operator's
``build_executor_conf``. Keys a Task may tune stay out (``spark.sql.shuffle.partitions``: the snapshots are
indexed by key group, not by Spark partition; the s3a retry and timeout defaults; the JVM options).

Message shape (field path, value, why, what to do instead)::

    spec.spark.conf["spark.master"]: "local[8]" is reserved: <why>; remove the key
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "RESERVED_SPARK_CONF",
    "RESERVED_SPARK_CONF_PATTERNS",
    "Owner",
    "Reserved",
    "reserved_by",
    "reserved_conf_message",
    "reserved_conf_problems",
]


class Owner(StrEnum):
    """Who sets a reserved key."""

    RUNTIME = "runtime"
    """The shard runtime, from its config (refused in a Task and in ``shard.json``)."""
    OPERATOR = "operator"
    """The operator, from the Task, into ``shard.json`` (refused in a Task only)."""


@dataclass(frozen=True)
class Reserved:
    owner: Owner
    why: str
    """Who sets the key from what, so the user knows which field to change instead."""
    secret: bool = False
    """The value is a credential: messages never show it."""


_STATE_STORE = "the runtime's recovery log and snapshots rely on the RocksDB state store with changelog checkpointing"
_S3 = "the runtime sets it from spec.storage.s3.endpoint (Spark and the runtime's own S3 client must agree)"
_S3_CREDENTIALS = (
    "the runtime sets it from the Secret named by spec.storage.s3.credentialsSecret (never put keys in a Task)"
)
_EXECUTORS = "the operator sets it from spec.spark.executors to run executors as pods of the shard"
_EXECUTOR_RESOURCES = "the operator sets it from spec.spark.executors.resources"
_DRIVER = "the operator sets it so that executors reach the driver pod through its headless Service"
_DRIVER_RBAC = "the operator sets it so that a driver's service account needs to manage pods only"
_POD = "the runtime binds the driver to its pod's IP (TASKSHARD_POD_IP) when executors run on Kubernetes"
_POD_CREDENTIALS = "the runtime sets it to the pod's service-account token and CA when executors run on Kubernetes"

RESERVED_SPARK_CONF: dict[str, Reserved] = {
    # the runtime (spark_runtime.session, spark_runtime.storage)
    "spark.master": Reserved(
        Owner.RUNTIME, "the runtime sets it (local[2] without spec.spark.executors, Kubernetes with them)"
    ),
    "spark.sql.streaming.stateStore.providerClass": Reserved(Owner.RUNTIME, _STATE_STORE),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": Reserved(Owner.RUNTIME, _STATE_STORE),
    "spark.hadoop.fs.s3a.endpoint": Reserved(Owner.RUNTIME, _S3),
    "spark.hadoop.fs.s3a.path.style.access": Reserved(Owner.RUNTIME, _S3),
    "spark.hadoop.fs.s3a.connection.ssl.enabled": Reserved(Owner.RUNTIME, _S3),
    "spark.hadoop.fs.s3a.endpoint.region": Reserved(
        Owner.RUNTIME,
        "the runtime sets it from AWS_REGION in spec.spark.env (Spark and the runtime's own S3 client must agree)",
    ),
    "spark.hadoop.fs.s3a.access.key": Reserved(Owner.RUNTIME, _S3_CREDENTIALS, secret=True),
    "spark.hadoop.fs.s3a.secret.key": Reserved(Owner.RUNTIME, _S3_CREDENTIALS, secret=True),
    "spark.hadoop.fs.s3a.aws.credentials.provider": Reserved(Owner.RUNTIME, _S3_CREDENTIALS),
    # the runtime, for executors on Kubernetes (spark_runtime.kubernetes.driver_conf)
    "spark.driver.bindAddress": Reserved(Owner.RUNTIME, _POD),
    "spark.blockManager.bindAddress": Reserved(Owner.RUNTIME, _POD),
    "spark.kubernetes.authenticate.oauthTokenFile": Reserved(Owner.RUNTIME, _POD_CREDENTIALS),
    "spark.kubernetes.authenticate.caCertFile": Reserved(Owner.RUNTIME, _POD_CREDENTIALS),
    # the operator (taskshard_operator.builders.build_executor_conf)
    "spark.submit.deployMode": Reserved(Owner.OPERATOR, "the driver runs in client mode inside its shard pod"),
    "spark.executor.instances": Reserved(Owner.OPERATOR, "the operator sets it from spec.spark.executors.instances"),
    "spark.executor.memory": Reserved(Owner.OPERATOR, _EXECUTOR_RESOURCES),
    "spark.executor.memoryOverhead": Reserved(Owner.OPERATOR, _EXECUTOR_RESOURCES),
    "spark.kubernetes.executor.request.cores": Reserved(Owner.OPERATOR, _EXECUTOR_RESOURCES),
    "spark.kubernetes.executor.limit.cores": Reserved(Owner.OPERATOR, _EXECUTOR_RESOURCES),
    "spark.kubernetes.namespace": Reserved(Owner.OPERATOR, "the operator sets it to the Task's namespace"),
    "spark.kubernetes.container.image": Reserved(Owner.OPERATOR, "the operator sets it from spec.spark.image"),
    "spark.kubernetes.container.image.pullPolicy": Reserved(
        Owner.OPERATOR, "the operator sets it from spec.spark.imagePullPolicy"
    ),
    "spark.kubernetes.driver.pod.name": Reserved(Owner.OPERATOR, _EXECUTORS),
    "spark.kubernetes.authenticate.driver.serviceAccountName": Reserved(
        Owner.OPERATOR, "the operator sets it from spec.spark.serviceAccountName"
    ),
    "spark.kubernetes.executor.podNamePrefix": Reserved(Owner.OPERATOR, _EXECUTORS),
    "spark.kubernetes.executor.podTemplateFile": Reserved(
        Owner.OPERATOR, "the operator's executor pod template carries the storage volume, env and securityContext"
    ),
    "spark.kubernetes.executor.label.taskshard.io/task": Reserved(Owner.OPERATOR, _EXECUTORS),
    "spark.kubernetes.executor.label.taskshard.io/shard": Reserved(Owner.OPERATOR, _EXECUTORS),
    "spark.kubernetes.executor.label.taskshard.io/component": Reserved(Owner.OPERATOR, _EXECUTORS),
    "spark.driver.host": Reserved(Owner.OPERATOR, _DRIVER),
    "spark.driver.port": Reserved(Owner.OPERATOR, _DRIVER),
    "spark.blockManager.port": Reserved(Owner.OPERATOR, _DRIVER),
    "spark.kubernetes.executor.disableConfigMap": Reserved(Owner.OPERATOR, _DRIVER_RBAC),
    "spark.kubernetes.driver.ownPersistentVolumeClaim": Reserved(Owner.OPERATOR, _DRIVER_RBAC),
    "spark.kubernetes.driver.reusePersistentVolumeClaim": Reserved(Owner.OPERATOR, _DRIVER_RBAC),
}
"""Every reserved key, with who sets it and why. The one list: the CRD's CEL rules are generated from it."""

_PER_BUCKET = (
    "a per-bucket s3a setting would send Spark's recovery log to another store, or with other credentials, than "
    "the runtime's own reads and writes (the runtime sets the bucket-wide ones from spec.storage.s3)"
)

RESERVED_SPARK_CONF_PATTERNS: dict[str, Reserved] = {
    r"^spark\.hadoop\.fs\.s3a\.bucket\.[^.]+\.(endpoint|endpoint\.region|path\.style\.access|"
    r"connection\.ssl\.enabled|aws\.credentials\.provider)$": Reserved(Owner.RUNTIME, _PER_BUCKET),
    r"^spark\.hadoop\.fs\.s3a\.(bucket\.[^.]+\.)?(access\.key|secret\.key|session\.token)$": Reserved(
        Owner.RUNTIME, _S3_CREDENTIALS, secret=True
    ),
    r"^spark\.hadoop\.fs\.s3a\.(bucket\.[^.]+\.)?assumed\.role\..+$": Reserved(Owner.RUNTIME, _S3_CREDENTIALS),
    r"^spark\.redaction\.(string\.)?regex$": Reserved(
        Owner.RUNTIME, "Spark's redaction keeps credentials out of logs and the UI; the runtime relies on its default"
    ),
    r"^spark\.sql\.streaming\.checkpointFileManagerClass$": Reserved(
        Owner.RUNTIME, "the recovery log needs Spark's own checkpoint file manager (its writes never overwrite)"
    ),
    r"^spark\.sql\.streaming\.minBatchesToRetain$": Reserved(
        Owner.RUNTIME, "drains, restores and the first-commit check read recent batches of the recovery log back"
    ),
    r"^spark\.authenticate(\..+)?$": Reserved(
        Owner.OPERATOR,
        "the operator turns Spark's authentication on with a key per shard (a Secret mounted as a file) when "
        "executors run on Kubernetes",
        secret=True,
    ),
    r"^spark\.network\.crypto\.(enabled|saslFallback|authEngineVersion)$": Reserved(
        Owner.OPERATOR, "the operator encrypts the traffic between a driver and its executors"
    ),
    r"^spark\.speculation(\..+)?$": Reserved(
        Owner.RUNTIME, "speculative copies of a batch's tasks would write its output twice"
    ),
}
"""Reserved keys by pattern (Python ``re`` and CEL ``matches`` syntax alike): families of keys no exact entry of
:data:`RESERVED_SPARK_CONF` can list (per-bucket s3a settings, credentials, redaction, speculation)."""


def reserved_by(key: str) -> tuple[str, Reserved] | None:
    """``(the exact key or pattern, its entry)`` that reserves ``key``, or None."""
    if key in RESERVED_SPARK_CONF:
        return key, RESERVED_SPARK_CONF[key]
    for pattern, reserved in RESERVED_SPARK_CONF_PATTERNS.items():
        if re.match(pattern, key):
            return pattern, reserved
    return None


def reserved_conf_message(key: str, *, path: str = "spec.spark.conf", value: str | None = None) -> str:
    """Why ``key`` is refused: ``<path>["<key>"]: "<value>" is reserved: <why>; remove the key`` (no value part
    when ``value`` is None, as in the CRD's static CEL message; ``"<redacted>"`` for a credential)."""
    found = reserved_by(key)
    assert found is not None, key
    reserved = found[1]
    shown = "" if value is None else f": {json.dumps('<redacted>' if reserved.secret else value)}"
    return f'{path}["{key}"]{shown} is reserved: {reserved.why}; remove the key'


def reserved_conf_problems(
    conf: Mapping[str, str], *, path: str = "spec.spark.conf", owners: Collection[Owner] = tuple(Owner)
) -> list[str]:
    """One message per key of ``conf`` that ``owners`` reserve, in ``conf``'s order (empty: nothing reserved)."""
    problems = []
    for key, value in conf.items():
        found = reserved_by(key)
        if found is not None and found[1].owner in owners:
            problems.append(reserved_conf_message(key, path=path, value=value))
    return problems
