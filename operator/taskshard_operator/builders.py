"""Pure builders of every object the operator creates: plain dicts, no I/O, no kopf, deterministic.

Owner references are added at the call site with ``kopf.adopt()``; everything else (names, labels, the shard
runtime config, the pod) is decided here and unit-tested as golden dicts.

Pod contract (see docs/design-contracts.md "Shard pod <-> runtime"):
- command ``python -m spark_runtime run --config /etc/taskshard/shard.json``; the config is the ConfigMap
  ``<shard>-config`` (key ``shard.json``) mounted read-only at ``/etc/taskshard``;
- no drain request reaches the pod from the operator: in a split, parent and children hand over through
  storage only (``spark_runtime.handover``), and the parent's runtime stops by itself once its children are ready;
- the runtime's JSON summary goes to ``/dev/termination-log`` and is read back from the container status;
- ``restartPolicy: OnFailure`` (a crash restarts in place from the recovery log; a drain exits 0 and stays down),
  ``terminationGracePeriodSeconds`` long enough to finish a micro-batch and export a snapshot;
- every pod (driver, executor template, cleanup) meets the Pod Security Standard "restricted", with a read-only
  root file system and an emptyDir at ``/tmp``; a hostPath storage volume is the one exception.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from spark_runtime import kafka_client, live, protocol
from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.kubernetes import POD_IP_ENV
from taskshard_operator import local_disk, memory, naming
from taskshard_operator.models.task import DEFAULT_MOUNT_PATH, UI_CONF, TaskSpec

SHARD_COMMAND = ["python", "-m", "spark_runtime", "run", "--config", naming.CONFIG_PATH]
EXECUTOR_COMMAND = ["python", "-m", "spark_runtime"]
"""The executor pod template's command; Spark appends the argument ``executor`` (``spark_runtime.kubernetes``)."""
DRAIN_GRACE_SECONDS = 120
"""Termination grace period of a driver pod: a SIGTERM stops at a batch boundary and writes a savepoint."""
DEFAULT_SERVICE_ACCOUNT = "default"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
EXECUTOR_TEMPLATE_KEY = "executor-pod-template.json"
KUBERNETES_MASTER = "k8s://https://kubernetes.default.svc:443"
LOCAL_MASTER = "local[2]"
"""Spark local mode inside the driver pod (two task threads) when the Task asks for no executors."""
S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
"""Keys of ``spec.storage.s3.credentialsSecret``, each exposed to the shard containers as the env var of that name."""


# ---------------------------------------------------------------- template identity


def template_of(spec: TaskSpec) -> dict[str, Any]:
    """The part of a Task spec that shapes a shard's pod and config; a change rolls the shards."""
    data = spec.to_k8s()
    template = {k: data.get(k) for k in ("spark", "processor", "source", "sink", "keyField")}
    if data.get("eventTime"):  # only when set: a Task without it keeps the hash its shards run with
        template["eventTime"] = data["eventTime"]
    return template


def template_hash(spec: TaskSpec) -> str:
    """A short stable hash of :func:`template_of` (16 hex digits)."""
    canonical = json.dumps(template_of(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def service_account_of(spec: TaskSpec) -> str:
    """The driver pod's service account: ``spec.spark.serviceAccountName`` when the model has it, else default."""
    return getattr(spec.spark, "service_account_name", None) or DEFAULT_SERVICE_ACCOUNT


def executor_instances(spec: TaskSpec) -> int:
    return spec.spark.executors.instances if spec.spark.executors else 0


# ---------------------------------------------------------------- TaskShard


def build_shard_spec(
    task: str,
    key_groups: KeyGroupRange,
    restore_from: dict[str, str] | None = None,
    merge_from: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """``spec`` of a TaskShard: its task, its range and (for a split child) the parent snapshot to restore, or
    (for a merged shard) both parents' drain summaries."""
    spec: dict[str, Any] = {
        "taskRef": {"name": task},
        "keyGroups": {"start": key_groups.start, "end": key_groups.end},
    }
    if restore_from is not None:
        spec["restoreFrom"] = {"parent": restore_from["parent"], "manifest": restore_from["manifest"]}
    if merge_from is not None:
        spec["mergeFrom"] = [{"parent": p["parent"], "manifest": p["manifest"]} for p in merge_from]
    return spec


def build_shard(
    task: str,
    key_groups: KeyGroupRange,
    *,
    template_hash: str,
    restore_from: dict[str, str] | None = None,
    merge_from: list[dict[str, str]] | None = None,
    family: str | None = None,
) -> dict[str, Any]:
    """A whole TaskShard object named ``<task>-<start>-<end>`` (``-<family>`` appended in a merge family, see
    :func:`taskshard_operator.naming.merge_family`; owner reference added by the caller)."""
    name = naming.shard_name(task, key_groups, family)
    labels = {**naming.shard_labels(task, name, key_groups), naming.LABEL_ACTIVE: "true"}
    if family is not None:
        labels[naming.LABEL_FAMILY] = family
    return {
        "apiVersion": naming.GROUP_VERSION,
        "kind": "TaskShard",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {naming.ANNOTATION_TEMPLATE_HASH: template_hash},
        },
        "spec": build_shard_spec(task, key_groups, restore_from, merge_from),
    }


# ---------------------------------------------------------------- shard runtime config


def _pinned_source(source: dict[str, Any], task_created: str | None) -> dict[str, Any]:
    """The Task's source, with ``kafka.startingOffsets: latest`` pinned to the Task's creation (epoch ms)."""
    kafka = source.get("kafka")
    if kafka is None or kafka.get("startingOffsets") != "latest" or not task_created:
        return source
    stamp = datetime.datetime.fromisoformat(task_created.replace("Z", "+00:00"))
    return {"kafka": {**kafka, "startingTimestamp": int(stamp.timestamp() * 1000)}}


def build_shard_config(
    *,
    task: str,
    namespace: str,
    shard: str,
    key_groups: KeyGroupRange,
    spec: TaskSpec,
    restore_from: dict[str, str] | None = None,
    merge_from: list[dict[str, str]] | None = None,
    task_created: str | None = None,
    task_uid: str | None = None,
    expected_batch: int | None = None,
    allow_fresh_start: bool = False,
) -> dict[str, Any]:
    """The runtime's ``shard.json`` (validated against ``spark_runtime.config.ShardConfig`` by the caller).

    ``expected_batch`` (``status.lastCheckpoint.batchId``) makes a shard whose recovery log ends before it refuse
    to start (``RecoveryLogMissing``) unless ``allow_fresh_start`` (the TaskShard's annotation) says otherwise.

    Paths (source, sink, storage) are the Task's, as the pod sees them under the storage volume's mount path.
    ``task_created`` (the Task's ``metadata.creationTimestamp``) pins ``source.kafka.startingOffsets: latest`` to
    one instant for every shard (``source.kafka.startingTimestamp``, epoch ms). ``task_uid`` (the Task's
    ``metadata.uid``) is the identity the Task's storage directory must hold (``spark_runtime.identity``).
    """
    data = spec.to_k8s()
    source = _pinned_source(data["source"], task_created)
    spark = data["spark"]
    instances = executor_instances(spec)
    executors = spec.spark.executors.resources if spec.spark.executors else None
    sizing = memory.sizing_conf(spec.spark.resources, executors, with_executors=instances > 0)
    conf = {**sizing, **(spark.get("conf") or {})}  # a key the Task sets wins over the derived one
    conf[UI_CONF] = str(spec.spark.ui).lower()
    if instances > 0:
        conf.update(build_executor_conf(task=task, namespace=namespace, shard=shard, spec=spec))
    storage = {k: v for k, v in data["storage"].items() if k != "volume"}
    return {
        "task": task,
        "shard": shard,
        "namespace": namespace,
        **({"taskUid": task_uid} if task_uid else {}),
        "maxKeyGroups": spec.max_key_groups,
        "keyGroups": {"start": key_groups.start, "end": key_groups.end},
        "keyField": spec.key_field,
        "processor": data["processor"],
        **({"eventTime": data["eventTime"]} if data.get("eventTime") else {}),
        "source": source,
        "sink": data["sink"],
        "storage": storage,
        "restoreFrom": dict(restore_from) if restore_from else None,
        **({"mergeFrom": [dict(p) for p in merge_from]} if merge_from else {}),
        "spark": {
            "master": KUBERNETES_MASTER if instances > 0 else LOCAL_MASTER,
            "conf": conf,
            "triggerInterval": spark.get("triggerInterval", "1 second"),
        },
        "terminationMessagePath": naming.TERMINATION_MESSAGE_PATH,
        "readyFile": naming.EMITTING_FILE,
        "heartbeatFile": naming.HEARTBEAT_FILE,
        **_recovery_and_retention(spec, expected_batch, allow_fresh_start),
    }


def _recovery_and_retention(spec: TaskSpec, expected_batch: int | None, allow_fresh_start: bool) -> dict[str, Any]:
    """The optional keys of ``shard.json`` about recovery and retention, each only when set (a Task without them
    keeps the config its shards run with)."""
    out: dict[str, Any] = {}
    if spec.history is not None and spec.history.snapshots is not None:
        out["snapshotsKept"] = spec.history.snapshots
    if expected_batch is not None:
        out["expectedBatch"] = expected_batch
    if allow_fresh_start:
        out["allowFreshStart"] = True
    return out


def build_configmap(
    *, task: str, shard: str, key_groups: KeyGroupRange, config: dict[str, Any], spec: TaskSpec | None = None
) -> dict[str, Any]:
    """ConfigMap ``<shard>-config`` holding ``shard.json`` (and the executor pod template when executors run)."""
    data = {naming.CONFIG_KEY: json.dumps(config, indent=2, sort_keys=True)}
    if spec is not None and executor_instances(spec) > 0:
        template = build_executor_pod_template(task=task, shard=shard, key_groups=key_groups, spec=spec)
        data[EXECUTOR_TEMPLATE_KEY] = json.dumps(template, indent=2, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": naming.configmap_name(shard),
            "labels": naming.shard_labels(task, shard, key_groups),
        },
        "data": data,
    }


# ---------------------------------------------------------------- driver pod


def _storage_volume(spec: TaskSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(volume, volumeMount)`` of ``spec.storage.volume``, or None when the Task names no volume (s3)."""
    volume = spec.storage.volume
    if volume is None:
        return None
    if volume.host_path is not None:
        source: dict[str, Any] = {"hostPath": {"path": volume.host_path, "type": "DirectoryOrCreate"}}
    else:
        source = {"persistentVolumeClaim": {"claimName": volume.persistent_volume_claim.claim_name}}
    mount_path = volume.mount_path or DEFAULT_MOUNT_PATH
    return {"name": "storage", **source}, {"name": "storage", "mountPath": mount_path}


def user_env(spec: TaskSpec) -> list[dict[str, Any]]:
    """``spec.spark.env`` as container env entries (the operator's own variables are reserved by the model)."""
    return [e.to_k8s() for e in spec.spark.env or []]


def s3_credentials_env(spec: TaskSpec) -> list[dict[str, Any]]:
    """Env vars ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` from ``spec.storage.s3.credentialsSecret``.

    Only references (``valueFrom.secretKeyRef``, not optional: a missing Secret or key keeps the container from
    starting with ``CreateContainerConfigError``); the operator never reads the values. Empty without a Secret.
    """
    s3 = spec.storage.s3
    secret = s3.credentials_secret if s3 is not None else None
    if not secret:
        return []
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": False}}}
        for key in S3_CREDENTIAL_KEYS
    ]


def kafka_credentials_env(spec: TaskSpec) -> list[dict[str, Any]]:
    """Env vars of the Kafka sides' ``credentialsSecret`` keys (:data:`spark_runtime.kafka_client.SECRET_KEYS`,
    named by :func:`spark_runtime.kafka_client.env_name`). References only, each optional: a Secret may hold just
    the keys its protocol needs; what the options ask for and the pod lacks, the runtime names
    (``KafkaCredentialsMissing``), and what the brokers refuse too (``KafkaAuthenticationFailed``)."""
    out: list[dict[str, Any]] = []
    for role, side in (("source", spec.source.kafka), ("sink", spec.sink.kafka)):
        secret = side.credentials_secret if side is not None else None
        if secret:
            out += [
                {
                    "name": kafka_client.env_name(role, key),
                    "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}},
                }
                for key in kafka_client.SECRET_KEYS
            ]
    return out


def _resources(resources: Any) -> dict[str, Any]:
    return resources.to_k8s() if resources is not None else {}


# The "restricted" Pod Security Standard, on every pod the operator creates (driver, executor template, cleanup):
# runAsNonRoot, seccomp RuntimeDefault, no privilege escalation, every capability dropped. uid/gid 10001 is the
# image's user (see the Dockerfile). The one exception is a hostPath storage volume, which "restricted" forbids.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
TMP_MOUNT: dict[str, Any] = {"name": "tmp", "mountPath": "/tmp"}
"""Spark's local dirs, RocksDB's native library and Python's temp files; the root file system is read-only. Its
volume is :func:`local_disk.tmp_volume` (an emptyDir with a size limit)."""


def _restricted(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """``pod_spec`` with :data:`POD_SECURITY_CONTEXT` and each container with :data:`CONTAINER_SECURITY_CONTEXT`
    (fresh copies: no two pods share a nested dict)."""
    for container in pod_spec["containers"]:
        container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
    return {**pod_spec, "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT)}


def _customised(pod: dict[str, Any], spec: TaskSpec, *, volumes: bool = True) -> dict[str, Any]:
    """``pod`` with ``spec.spark.podTemplate`` merged in: its labels and annotations added (the operator's keys are
    refused by the model, and win here), its pod-level fields set (placement, pull secrets, priority), and, with
    ``volumes``, its volumes appended and ``spec.spark.volumeMounts`` added to every container."""
    template = spec.spark.pod_template
    meta = template.metadata if template is not None else None
    if meta is not None:
        for kind, extra in (("labels", meta.labels), ("annotations", meta.annotations)):
            if extra:
                pod["metadata"][kind] = {**extra, **(pod["metadata"].get(kind) or {})}
    fields = template.spec.to_k8s() if template is not None and template.spec is not None else {}
    extra_volumes = fields.pop("volumes", [])
    pod["spec"].update(fields)
    if volumes and extra_volumes:
        pod["spec"]["volumes"] = [*pod["spec"].get("volumes", []), *extra_volumes]
        mounts = [m.to_k8s() for m in spec.spark.volume_mounts or []]
        for container in pod["spec"]["containers"]:
            container["volumeMounts"] = [*container.get("volumeMounts", []), *copy.deepcopy(mounts)]
    return pod


def _driver_volumes(shard: str, spec: TaskSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The driver container's mounts and the pod's volumes: the config, ``/tmp`` and the storage volume."""
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": naming.CONFIG_DIR, "readOnly": True},
        dict(TMP_MOUNT),
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": naming.configmap_name(shard)}},
        local_disk.tmp_volume(spec.spark.tmp_size_limit),
    ]
    storage = _storage_volume(spec)
    if storage is not None:
        volumes.append(storage[0])
        mounts.append(storage[1])
    if executor_instances(spec) > 0:
        volumes.append(_spark_auth_volume(shard))
        mounts.append(dict(SPARK_AUTH_MOUNT))
    return mounts, volumes


SPARK_AUTH_MOUNT = {"name": "spark-auth", "mountPath": naming.SPARK_AUTH_DIR, "readOnly": True}


def _spark_auth_volume(shard: str) -> dict[str, Any]:
    return {"name": "spark-auth", "secret": {"secretName": naming.spark_auth_secret_name(shard)}}


def build_spark_auth_secret(*, task: str, shard: str, key_groups: KeyGroupRange) -> dict[str, Any]:
    """The Secret with the shard's Spark authentication key: 32 random bytes, hex (the operator creates it once,
    before the shard's first pod with executors; it lives as long as the TaskShard that owns it). Driver and
    executors read it from a file (``spark.authenticate.secret.file``), so it is in no pod spec and no SparkConf."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": naming.spark_auth_secret_name(shard),
            "labels": naming.shard_labels(task, shard, key_groups),
        },
        "type": "Opaque",
        "stringData": {naming.SPARK_AUTH_KEY: secrets.token_hex(32)},
    }


def _driver_container(
    *,
    task: str,
    shard: str,
    spec: TaskSpec,
    command: list[str],
    mounts: list[dict[str, Any]],
    log_format: str,
    executors: bool,
) -> dict[str, Any]:
    """The driver container: the runtime's command and environment, the readiness probe (the shard emits), the
    liveness probe (its poll loop runs: :data:`LIVENESS_COMMAND`), the termination message (its summary) and its
    ports (metrics; the driver's own when executors run)."""
    container: dict[str, Any] = {
        "name": naming.CONTAINER_DRIVER,
        "image": spec.spark.image,
        "command": command,
        "env": [
            {"name": "TASKSHARD_TASK", "value": task},
            {"name": "TASKSHARD_SHARD", "value": shard},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": protocol.POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            # The runtime's metrics endpoint binds the pod's own address (spark_runtime.live).
            {"name": live.METRICS_HOST_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *([{"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}] if executors else []),
            *([{"name": "TASKSHARD_LOG_FORMAT", "value": "json"}] if log_format == "json" else []),
            *local_disk.run_cache_env(spec.spark.tmp_size_limit),
            *user_env(spec),
            *s3_credentials_env(spec),
            *kafka_credentials_env(spec),
        ],
        "resources": _resources(spec.spark.resources),
        "volumeMounts": mounts,
        "terminationMessagePath": naming.TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
        "readinessProbe": {
            "exec": {"command": ["test", "-e", naming.EMITTING_FILE]},
            "periodSeconds": naming.READINESS_PERIOD_SECONDS,
            "failureThreshold": 1,
        },
        "livenessProbe": {
            "exec": {"command": LIVENESS_COMMAND},
            "periodSeconds": naming.LIVENESS_PERIOD_SECONDS,
            "failureThreshold": 1,
        },
    }
    if spec.spark.image_pull_policy:
        container["imagePullPolicy"] = spec.spark.image_pull_policy
    container["ports"] = [{"name": live.PORT_NAME, "containerPort": live.METRICS_PORT}]
    if executors:
        container["ports"] += [
            {"name": "driver", "containerPort": DRIVER_PORT},
            {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT},
        ]
    return container


LIVENESS_COMMAND = [
    "sh",
    "-c",
    f'test ! -e {naming.HEARTBEAT_FILE} || test -n "$(find {naming.HEARTBEAT_FILE} '
    f'-mmin -{naming.LIVENESS_STALE_MINUTES})"',
]
"""The driver's liveness: no heartbeat file (starting, restoring, on standby, draining), or one touched within
``naming.LIVENESS_STALE_MINUTES`` (the runtime's poll loop runs)."""


def build_pod(
    *,
    task: str,
    shard: str,
    key_groups: KeyGroupRange,
    spec: TaskSpec,
    template_hash: str,
    restarts_base: int = 0,
    log_format: str = "plain",
    abort_split: tuple[str, ...] = (),
    abort_merge: bool = False,
) -> dict[str, Any]:
    """The Spark driver pod ``<shard>-driver`` of a shard (owner reference added by the caller).

    ``restarts_base`` is recorded so that ``status.restarts`` survives pod replacement. ``log_format`` ``json``
    makes the runtime log one JSON object per line (``$TASKSHARD_LOG_FORMAT``, ``spark_runtime.logs``), as the
    operator itself does with ``--log-format json``. ``abort_split`` (the split's children) makes it a pod that
    undoes the shard's split and exits (``run --abort-split``, annotation ``taskshard.io/abort-split``);
    ``abort_merge`` (a merged shard whose merge was withdrawn) a pod that fences the merged shard and reports
    whether a parent drained already (``run --abort-merge``, annotation ``taskshard.io/abort-merge``).
    """
    annotations = {
        naming.ANNOTATION_TEMPLATE_HASH: template_hash,
        naming.ANNOTATION_RESTARTS_BASE: str(restarts_base),
    }
    command = list(SHARD_COMMAND)
    if abort_split:
        annotations[naming.ANNOTATION_ABORT_SPLIT] = ",".join(abort_split)
        command += ["--abort-split", ",".join(abort_split)]
    if abort_merge:
        annotations[naming.ANNOTATION_ABORT_MERGE] = "true"
        command += ["--abort-merge"]
    mounts, volumes = _driver_volumes(shard, spec)
    executors = executor_instances(spec) > 0
    container = _driver_container(
        task=task, shard=shard, spec=spec, command=command, mounts=mounts, log_format=log_format, executors=executors
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.pod_name(shard),
            "labels": naming.shard_labels(task, shard, key_groups),
            "annotations": annotations,
        },
        "spec": _restricted(
            {
                "restartPolicy": "OnFailure",
                "terminationGracePeriodSeconds": DRAIN_GRACE_SECONDS,
                "serviceAccountName": service_account_of(spec),
                # Local mode needs no API access; the driver talks to the apiserver only to manage executors.
                "automountServiceAccountToken": executors,
                "containers": [container],
                "volumes": volumes,
            }
        ),
    }
    return _customised(pod, spec)


# ---------------------------------------------------------------- Spark executors on Kubernetes


def build_executor_conf(*, task: str, namespace: str, shard: str, spec: TaskSpec) -> dict[str, str]:
    """Spark conf that makes the driver (client mode, in its pod) run executors as Kubernetes pods.

    Executors are owned by the driver pod (``spark.kubernetes.driver.pod.name``), so they go when it goes; they
    reach the driver through the headless Service of :func:`build_executor_service`.
    """
    executors = spec.spark.executors
    conf = {
        "spark.submit.deployMode": "client",
        "spark.executor.instances": str(executors.instances),
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": spec.spark.image,
        "spark.kubernetes.driver.pod.name": naming.pod_name(shard),
        "spark.kubernetes.authenticate.driver.serviceAccountName": service_account_of(spec),
        "spark.kubernetes.executor.podNamePrefix": shard,
        "spark.kubernetes.executor.podTemplateFile": f"{naming.CONFIG_DIR}/{EXECUTOR_TEMPLATE_KEY}",
        "spark.kubernetes.executor.label." + naming.LABEL_TASK: task,
        "spark.kubernetes.executor.label." + naming.LABEL_SHARD: shard,
        "spark.kubernetes.executor.label." + naming.LABEL_COMPONENT: naming.COMPONENT_EXECUTOR,
        # executors connect back through the headless Service; the runtime binds the pod's own IP
        # (spark_runtime.kubernetes.driver_conf), which the Service resolves to
        "spark.driver.host": f"{naming.driver_service_name(shard)}.{namespace}.svc",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.blockManager.port": str(BLOCK_MANAGER_PORT),
        # what the driver's service account needs is pods only (docs/examples/spark-driver-rbac.yaml):
        # no executor ConfigMap (the conf comes from the driver anyway), no PersistentVolumeClaims
        "spark.kubernetes.executor.disableConfigMap": "true",
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
        # Only the shard's own executors talk to its driver: each side proves it holds the shard's key (a Secret
        # mounted as a file in both, never an environment variable Spark would put in the executor pod's spec),
        # and the traffic between them is encrypted (AES, keys derived from that key). No fallback to SASL, which
        # would accept a key holder's connection unencrypted; the newer key exchange (version 2).
        "spark.authenticate": "true",
        "spark.authenticate.secret.file": naming.SPARK_AUTH_FILE,
        "spark.network.crypto.enabled": "true",
        "spark.network.crypto.saslFallback": "false",
        "spark.network.crypto.authEngineVersion": "2",
    }
    if spec.spark.image_pull_policy:
        conf["spark.kubernetes.container.image.pullPolicy"] = spec.spark.image_pull_policy
    resources = executors.resources
    requests = (resources.requests or {}) if resources else {}
    limits = (resources.limits or {}) if resources else {}
    if "cpu" in requests:
        conf["spark.kubernetes.executor.request.cores"] = str(requests["cpu"])
    if "cpu" in limits:
        conf["spark.kubernetes.executor.limit.cores"] = str(limits["cpu"])
    conf.update(memory.executor_conf(resources))
    return conf


def build_executor_pod_template(*, task: str, shard: str, key_groups: KeyGroupRange, spec: TaskSpec) -> dict[str, Any]:
    """Executor pod template (``spark.kubernetes.executor.podTemplateFile``): the storage volume, env
    (``spec.spark.env`` and the S3 credentials; Spark adds its own env vars to the template container's), labels,
    and the driver's securityContexts and ``/tmp`` (Spark builds the executor container on the template's, so both
    reach the executor pods; Spark's own local-dir volumes are emptyDirs)."""
    storage = _storage_volume(spec)
    container: dict[str, Any] = {
        "name": "executor",
        "command": list(EXECUTOR_COMMAND),
        "volumeMounts": [dict(TMP_MOUNT)],
    }
    container["env"] = [
        *local_disk.run_cache_env(spec.spark.tmp_size_limit),
        *user_env(spec),
        *s3_credentials_env(spec),
    ]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "serviceAccountName": service_account_of(spec),
        "automountServiceAccountToken": False,  # executors never call the API server; the driver does
        "volumes": [local_disk.tmp_volume(spec.spark.tmp_size_limit)],
    }
    if storage is not None:
        pod_spec["volumes"].append(storage[0])
        container["volumeMounts"].append(storage[1])
    pod_spec["volumes"].append(_spark_auth_volume(shard))
    container["volumeMounts"].append(dict(SPARK_AUTH_MOUNT))
    resources = spec.spark.executors.resources if spec.spark.executors else None
    if resources is not None:
        container["resources"] = resources.to_k8s()
    labels = naming.shard_labels(task, shard, key_groups)
    labels[naming.LABEL_COMPONENT] = naming.COMPONENT_EXECUTOR
    return _customised(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": labels}, "spec": _restricted(pod_spec)}, spec
    )


def build_executor_service(*, task: str, shard: str, key_groups: KeyGroupRange) -> dict[str, Any]:
    """Headless Service ``<shard>-driver-svc`` through which executors reach the driver pod."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": naming.driver_service_name(shard),
            "labels": naming.shard_labels(task, shard, key_groups),
        },
        "spec": {
            "clusterIP": "None",
            # the driver is Ready only once it emits, which needs its executors: resolve it before that
            "publishNotReadyAddresses": True,
            "selector": {naming.LABEL_SHARD: shard, naming.LABEL_COMPONENT: naming.COMPONENT_SHARD},
            "ports": [
                {"name": "driver", "port": DRIVER_PORT, "targetPort": DRIVER_PORT},
                {"name": "blockmanager", "port": BLOCK_MANAGER_PORT, "targetPort": BLOCK_MANAGER_PORT},
            ],
        },
    }


def build_disruption_budget(*, task: str, min_available: int) -> dict[str, Any]:
    """The Task's PodDisruptionBudget ``<task>-shards``: a voluntary disruption (a node drain) leaves at least
    ``min_available`` of its driver pods running (the operator keeps it at the Task's shards minus one: one shard at a
    time restarts from its recovery log elsewhere). An integer ``minAvailable``, because Kubernetes' disruption
    controller counts ``maxUnavailable`` only for pods whose controller has a scale subresource, and driver pods
    belong to TaskShards. A pod that is not ready (starting, restoring, catching up) may always be evicted: a stuck
    shard never blocks a drain. The caller adopts it (the Task owns it)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": naming.disruption_budget_name(task), "labels": naming.task_labels(task)},
        "spec": {
            "minAvailable": min_available,
            "selector": {"matchLabels": {naming.LABEL_TASK: task, naming.LABEL_COMPONENT: naming.COMPONENT_SHARD}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


# ---------------------------------------------------------------- checkpoint retention


def task_storage_uri(task: str, spec: TaskSpec) -> str:
    """Where a task's recovery logs, snapshots and manifests live: ``<storage.path>/<task>`` or
    ``s3a://<bucket>/<prefix>/<task>``."""
    s3 = spec.storage.s3
    if s3 is not None:
        return f"s3a://{s3.bucket}/" + "/".join(p for p in ((s3.prefix or "").strip("/"), task) if p)
    return f"{(spec.storage.path or '').rstrip('/')}/{task}"


def drain_summary_uri(task: str, spec: TaskSpec, shard: str) -> str:
    """Where shard ``shard``'s runtime writes its final drain summary (``ShardPaths.drained``): a split child's
    ``restoreFrom.manifest``, so that it can start on standby before the parent finished draining."""
    return protocol.drain_summary_uri(task_storage_uri(task, spec), shard)


def build_cleanup_pod(*, task: str, spec: TaskSpec, task_uid: str | None = None) -> dict[str, Any] | None:
    """A one-shot pod that deletes the task's storage (``checkpointRetention: Delete``): ``<storage.path>/<task>``
    on the mounted volume, or every object under ``s3a://<bucket>/<prefix>/<task>/`` with the credentials of
    ``storage.s3.credentialsSecret`` (``spark_runtime.identity.remove_task_state``: never a directory whose
    ``identity.json`` names another Task's UID than ``task_uid``).

    None when the storage is a filesystem path without a volume (nothing the operator can mount).
    """
    target = task_storage_uri(task, spec)
    return _storage_pod(
        task,
        spec,
        naming.cleanup_pod_name(task),
        naming.COMPONENT_CLEANUP,
        lambda endpoint: (
            f"from spark_runtime.identity import remove_task_state; "
            f"print(remove_task_state({target!r}, {task_uid!r}, {endpoint!r}))"
        ),
    )


def build_prune_pod(
    *,
    task: str,
    spec: TaskSpec,
    shards: list[str],
    successors: Mapping[str, list[str]],
    task_uid: str | None = None,
) -> dict[str, Any] | None:
    """A one-shot pod that removes the recovery logs and snapshots of those retired ``shards`` whose successors
    (``successors``: by retired shard, the operator's view; storage adds the ones it names) no longer need them by
    storage facts (history retention, ``spark_runtime.history.prune_pod_main``: never in a directory whose
    ``identity.json`` names another Task's UID than ``task_uid``). Its termination message says what it pruned and
    kept (``spark_runtime.protocol.PruneSummary``); the shards it was given are in its annotation
    ``naming.ANNOTATION_PRUNE_SHARDS``. None when the storage is a filesystem path without a volume (nothing the
    operator can mount)."""
    target = task_storage_uri(task, spec)
    after = {s: sorted(successors.get(s) or ()) for s in shards}
    pod = _storage_pod(
        task,
        spec,
        naming.prune_pod_name(task),
        naming.COMPONENT_PRUNE,
        lambda endpoint: (
            f"from spark_runtime.history import prune_pod_main; "
            f"prune_pod_main({target!r}, {task_uid!r}, {list(shards)!r}, {endpoint!r}, {after!r})"
        ),
    )
    if pod is not None:
        pod["metadata"]["annotations"] = {naming.ANNOTATION_PRUNE_SHARDS: ",".join(shards)}
    return pod


def _storage_pod(
    task: str, spec: TaskSpec, name: str, component: str, script: Callable[[str | None], str]
) -> dict[str, Any] | None:
    """A one-shot pod of the shard image that runs ``script(endpoint)`` (Python) against the task's storage: the
    storage volume mounted, or the S3 endpoint and credentials; None when the storage is a filesystem path without
    a volume."""
    storage = _storage_volume(spec)
    s3 = spec.storage.s3
    if s3 is not None:
        endpoint, env = s3.endpoint, s3_credentials_env(spec)
    elif storage is not None and spec.storage.path is not None:
        endpoint, env = None, []
    else:
        return None
    container: dict[str, Any] = {
        "name": component,
        "image": spec.spark.image,
        "command": ["python", "-c", script(endpoint)],
        "volumeMounts": [dict(TMP_MOUNT)],
    }
    if env:
        container["env"] = env
    volumes = [local_disk.tmp_volume(spec.spark.tmp_size_limit)]
    if storage is not None and s3 is None:
        container["volumeMounts"].append(storage[1])
        volumes.append(storage[0])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {naming.LABEL_TASK: task, naming.LABEL_COMPONENT: component}},
        "spec": _restricted(
            {
                "restartPolicy": "OnFailure",
                "automountServiceAccountToken": False,
                "containers": [container],
                "volumes": volumes,
            }
        ),
    }
    return _customised(pod, spec, volumes=False)  # placement and pull secrets; it mounts only the storage
