"""Builders: golden dicts for the TaskShard, the runtime config, the ConfigMap, the pod and the executors."""

from __future__ import annotations

import copy
import json

import pytest

from spark_runtime.keygroups import KeyGroupRange as R
from taskshard_operator import builders, naming
from taskshard_operator.models.task import TaskSpec
from taskshard_operator.reconcile_shard import validate_shard_config

from .pod_security import restricted_violations

pytestmark = pytest.mark.unit

SPEC = {
    "maxKeyGroups": 128,
    "initialShards": 2,
    "keyField": "key",
    "processor": {"builtin": "count"},
    "source": {"journal": {"path": "/data/journal/orders", "partitions": 4}},
    "sink": {"directory": {"path": "/data/output/orders", "format": "jsonl"}},
    "storage": {"path": "/data/state", "volume": {"hostPath": "/srv/taskshard", "mountPath": "/data"}},
    "spark": {
        "image": "taskshard/shard:0.1.0",
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        "conf": {"spark.sql.shuffle.partitions": "4"},
        "triggerInterval": "1 second",
    },
}


def spec(**changes) -> TaskSpec:
    data = copy.deepcopy(SPEC)
    for path, value in changes.items():
        cur = data
        *parents, leaf = path.split("__")
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[leaf] = value
    return TaskSpec.from_k8s(data)


def test_build_shard():
    assert builders.build_shard("orders", R(0, 64), template_hash="abc") == {
        "apiVersion": "taskshard.io/v1alpha1",
        "kind": "TaskShard",
        "metadata": {
            "name": "orders-0-64",
            "labels": {
                "taskshard.io/task": "orders",
                "taskshard.io/shard": "orders-0-64",
                "taskshard.io/key-groups": "0-64",
                "taskshard.io/component": "shard",
                "taskshard.io/active": "true",
            },
            "annotations": {"taskshard.io/template-hash": "abc"},
        },
        "spec": {"taskRef": {"name": "orders"}, "keyGroups": {"start": 0, "end": 64}},
    }
    child = builders.build_shard(
        "orders", R(0, 32), template_hash="abc", restore_from={"parent": "orders-0-64", "manifest": "/data/m.json"}
    )
    assert child["spec"]["restoreFrom"] == {"parent": "orders-0-64", "manifest": "/data/m.json"}


def test_build_shard_config_golden_and_valid_for_the_runtime():
    config = builders.build_shard_config(
        task="orders",
        namespace="ns1",
        shard="orders-0-64",
        key_groups=R(0, 64),
        spec=spec(),
        restore_from={"parent": "orders-0-128", "manifest": "/data/state/orders/shards/x/manifest.json"},
        task_uid="6f1c-uid",
    )
    assert config == {
        "task": "orders",
        "shard": "orders-0-64",
        "namespace": "ns1",
        "taskUid": "6f1c-uid",
        "maxKeyGroups": 128,
        "keyGroups": {"start": 0, "end": 64},
        "keyField": "key",
        "processor": {"builtin": "count"},
        "source": {"journal": {"path": "/data/journal/orders", "partitions": 4}},
        "sink": {"directory": {"path": "/data/output/orders", "format": "jsonl"}},
        "storage": {"path": "/data/state"},
        "restoreFrom": {"parent": "orders-0-128", "manifest": "/data/state/orders/shards/x/manifest.json"},
        "spark": {
            "master": "local[2]",
            "conf": {
                # from the pod's 2Gi limit (taskshard_operator.memory): half heap, a quarter RocksDB
                "spark.driver.memory": "1024m",
                "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
                "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": "512",
                "spark.sql.shuffle.partitions": "4",
                "spark.ui.enabled": "false",
            },
            "triggerInterval": "1 second",
        },
        "terminationMessagePath": "/dev/termination-log",
        "readyFile": "/tmp/taskshard-emitting",
        "heartbeatFile": "/tmp/taskshard-heartbeat",
    }
    validate_shard_config(config)
    config["restoreFrom"] = None
    validate_shard_config(config)


def test_invalid_config_names_the_field():
    config = builders.build_shard_config(
        task="orders", namespace="ns1", shard="orders-0-64", key_groups=R(0, 64), spec=spec()
    )
    config["keyGroups"] = {"start": 0, "end": 256}
    with pytest.raises(ValueError, match="keyGroups.end"):
        validate_shard_config(config)


def test_build_configmap():
    cm = builders.build_configmap(task="orders", shard="orders-0-64", key_groups=R(0, 64), config={"a": 1})
    assert cm["metadata"]["name"] == "orders-0-64-config"
    assert cm["metadata"]["labels"]["taskshard.io/key-groups"] == "0-64"
    assert json.loads(cm["data"]["shard.json"]) == {"a": 1}
    assert set(cm["data"]) == {"shard.json"}


def test_build_pod_golden():
    pod = builders.build_pod(
        task="orders", shard="orders-0-64", key_groups=R(0, 64), spec=spec(), template_hash="h1", restarts_base=2
    )
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "orders-0-64-driver",
            "labels": {
                "taskshard.io/task": "orders",
                "taskshard.io/shard": "orders-0-64",
                "taskshard.io/key-groups": "0-64",
                "taskshard.io/component": "shard",
            },
            "annotations": {"taskshard.io/template-hash": "h1", "taskshard.io/restarts-base": "2"},
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 120,
            "serviceAccountName": "default",
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "fsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "driver",
                    "image": "taskshard/shard:0.1.0",
                    "command": ["python", "-m", "spark_runtime", "run", "--config", "/etc/taskshard/shard.json"],
                    "env": [
                        {"name": "TASKSHARD_TASK", "value": "orders"},
                        {"name": "TASKSHARD_SHARD", "value": "orders-0-64"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                        {"name": "TASKSHARD_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "TASKSHARD_RUN_CACHE_BYTES", "value": str(4 << 30)},
                    ],
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/taskshard", "readOnly": True},
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "storage", "mountPath": "/data"},
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "readinessProbe": {
                        "exec": {"command": ["test", "-e", "/tmp/taskshard-emitting"]},
                        "periodSeconds": 2,
                        "failureThreshold": 1,
                    },
                    "livenessProbe": {
                        "exec": {
                            "command": [
                                "sh",
                                "-c",
                                'test ! -e /tmp/taskshard-heartbeat || test -n "$(find /tmp/taskshard-heartbeat '
                                '-mmin -10)"',
                            ]
                        },
                        "periodSeconds": 30,
                        "failureThreshold": 1,
                    },
                    "ports": [{"name": "metrics", "containerPort": 9108}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "orders-0-64-config"}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}},
                {"name": "storage", "hostPath": {"path": "/srv/taskshard", "type": "DirectoryOrCreate"}},
            ],
        },
    }


def test_pod_variants():
    with pytest.raises(TypeError):  # no drain request reaches a pod from the operator any more
        builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=spec(), template_hash="h", drain=True)
    pvc = spec(storage__volume={"persistentVolumeClaim": {"claimName": "state"}, "mountPath": "/mnt/s"})
    pod = builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=pvc, template_hash="h")
    assert {"name": "storage", "persistentVolumeClaim": {"claimName": "state"}} in pod["spec"]["volumes"]
    assert {"name": "storage", "mountPath": "/mnt/s"} in pod["spec"]["containers"][0]["volumeMounts"]
    s3 = TaskSpec.from_k8s({**SPEC, "storage": {"s3": {"bucket": "bkt"}}})
    pod = builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=s3, template_hash="h")
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["config", "tmp"]
    assert [m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]] == ["config", "tmp"]
    pulled = spec(spark__imagePullPolicy="IfNotPresent")
    pod = builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=pulled, template_hash="h")
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"


def test_template_hash_changes_with_the_template_only():
    base = builders.template_hash(spec())
    assert builders.template_hash(spec()) == base
    assert builders.template_hash(spec(spark__image="taskshard/shard:0.2.0")) != base
    assert builders.template_hash(spec(processor={"builtin": "sum", "field": "amount"})) != base
    assert builders.template_hash(spec(initialShards=4)) == base  # not part of a shard's template
    assert builders.template_hash(spec(checkpointRetention="Delete")) == base


EXECUTORS = {"instances": 2, "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}}


def test_executor_manifests():
    s = spec(spark__executors=EXECUTORS)
    conf = builders.build_executor_conf(task="orders", namespace="ns1", shard="orders-0-64", spec=s)
    assert conf == {
        "spark.submit.deployMode": "client",
        "spark.executor.instances": "2",
        "spark.kubernetes.namespace": "ns1",
        "spark.kubernetes.container.image": "taskshard/shard:0.1.0",
        "spark.kubernetes.driver.pod.name": "orders-0-64-driver",
        "spark.kubernetes.authenticate.driver.serviceAccountName": "default",
        "spark.kubernetes.executor.podNamePrefix": "orders-0-64",
        "spark.kubernetes.executor.podTemplateFile": "/etc/taskshard/executor-pod-template.json",
        "spark.kubernetes.executor.label.taskshard.io/task": "orders",
        "spark.kubernetes.executor.label.taskshard.io/shard": "orders-0-64",
        "spark.kubernetes.executor.label.taskshard.io/component": "executor",
        "spark.driver.host": "orders-0-64-driver-svc.ns1.svc",
        "spark.driver.port": "7078",
        "spark.blockManager.port": "7079",
        "spark.kubernetes.executor.disableConfigMap": "true",
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
        "spark.authenticate": "true",
        "spark.authenticate.secret.file": "/etc/taskshard-spark-auth/secret",
        "spark.network.crypto.enabled": "true",
        "spark.network.crypto.saslFallback": "false",
        "spark.network.crypto.authEngineVersion": "2",
        "spark.kubernetes.executor.request.cores": "1",
        "spark.kubernetes.executor.limit.cores": "2",
        "spark.executor.memory": "512m",  # half of the 1Gi limit; the rest is Spark's overhead
        "spark.executor.memoryOverhead": "512m",
    }
    config = builders.build_shard_config(
        task="orders", namespace="ns1", shard="orders-0-64", key_groups=R(0, 64), spec=s
    )
    assert config["spark"]["master"] == "k8s://https://kubernetes.default.svc:443"
    assert config["spark"]["conf"]["spark.sql.shuffle.partitions"] == "4"
    assert config["spark"]["conf"]["spark.executor.instances"] == "2"
    validate_shard_config(config)

    template = builders.build_executor_pod_template(task="orders", shard="orders-0-64", key_groups=R(0, 64), spec=s)
    assert template == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "labels": {
                "taskshard.io/task": "orders",
                "taskshard.io/shard": "orders-0-64",
                "taskshard.io/key-groups": "0-64",
                "taskshard.io/component": "executor",
            }
        },
        "spec": {
            "serviceAccountName": "default",
            "automountServiceAccountToken": False,
            "securityContext": builders.POD_SECURITY_CONTEXT,
            "containers": [
                {
                    "name": "executor",
                    "command": ["python", "-m", "spark_runtime"],
                    "env": [{"name": "TASKSHARD_RUN_CACHE_BYTES", "value": str(4 << 30)}],
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "storage", "mountPath": "/data"},
                        {"name": "spark-auth", "mountPath": "/etc/taskshard-spark-auth", "readOnly": True},
                    ],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}},
                    "securityContext": builders.CONTAINER_SECURITY_CONTEXT,
                }
            ],
            "volumes": [
                {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}},
                {"name": "storage", "hostPath": {"path": "/srv/taskshard", "type": "DirectoryOrCreate"}},
                {"name": "spark-auth", "secret": {"secretName": "orders-0-64-spark-auth"}},
            ],
        },
    }
    cm = builders.build_configmap(task="orders", shard="orders-0-64", key_groups=R(0, 64), config=config, spec=s)
    assert json.loads(cm["data"]["executor-pod-template.json"]) == template

    svc = builders.build_executor_service(task="orders", shard="orders-0-64", key_groups=R(0, 64))
    assert svc["metadata"]["name"] == "orders-0-64-driver-svc"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True, "executors reach a driver that is not Ready yet"
    assert svc["spec"]["selector"] == {"taskshard.io/shard": "orders-0-64", "taskshard.io/component": "shard"}
    assert [p["port"] for p in svc["spec"]["ports"]] == [7078, 7079]

    pod = builders.build_pod(task="orders", shard="orders-0-64", key_groups=R(0, 64), spec=s, template_hash="h")
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert [p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]] == [9108, 7078, 7079]
    pod_ip = {"name": "TASKSHARD_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert pod_ip in pod["spec"]["containers"][0]["env"], "the runtime binds the driver to its pod IP"
    auth = {"name": "spark-auth", "secret": {"secretName": "orders-0-64-spark-auth"}}
    assert auth in pod["spec"]["volumes"], "the driver reads the shard's Spark key from its Secret"
    assert {"name": "spark-auth", "mountPath": "/etc/taskshard-spark-auth", "readOnly": True} in pod["spec"][
        "containers"
    ][0]["volumeMounts"]
    assert "_SPARK_AUTH_SECRET" not in json.dumps(pod) + json.dumps(template), "the key is in no pod spec"
    key = builders.build_spark_auth_secret(task="orders", shard="orders-0-64", key_groups=R(0, 64))
    assert key["metadata"]["name"] == "orders-0-64-spark-auth" and len(key["stringData"]["secret"]) == 64
    other = builders.build_spark_auth_secret(task="orders", shard="orders-0-64", key_groups=R(0, 64))
    assert other["stringData"] != key["stringData"], "a random key"
    local = builders.build_pod(task="orders", shard="orders-0-64", key_groups=R(0, 64), spec=spec(), template_hash="h")
    assert pod_ip not in local["spec"]["containers"][0]["env"]
    assert auth not in local["spec"]["volumes"], "local mode: no executors, no key"


def test_every_tmp_emptydir_has_the_tasks_size_limit_and_the_run_cache_a_quarter_of_it():
    """#63 point 8: /tmp (the run cache, RocksDB's copies, Spark's local files) is bounded on every pod the
    operator creates, so one shard cannot fill its node's disk, and the run cache alone stays below the bound."""
    s = spec(spark__tmpSizeLimit="2Gi", spark__executors=EXECUTORS)
    pod = builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=s, template_hash="h")
    template = builders.build_executor_pod_template(task="o", shard="o-0-8", key_groups=R(0, 8), spec=s)
    prune = builders.build_prune_pod(task="o", spec=s, task_uid="u", shards=["o-0-4"], successors={})
    cleanup = builders.build_cleanup_pod(task="o", spec=s)
    for made in (pod, template, prune, cleanup):
        assert {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}} in made["spec"]["volumes"]
    budget = {"name": "TASKSHARD_RUN_CACHE_BYTES", "value": str(512 << 20)}
    assert budget in pod["spec"]["containers"][0]["env"] and budget in template["spec"]["containers"][0]["env"]
    assert builders.template_hash(s) != builders.template_hash(spec(spark__executors=EXECUTORS)), "a change rolls"
    with pytest.raises(ValueError, match="spec.spark.tmpSizeLimit: 900Mi: must be at least 1024Mi"):
        spec(spark__tmpSizeLimit="900Mi")
    with pytest.raises(ValueError, match="'TASKSHARD_RUN_CACHE_BYTES' is set by the operator"):
        spec(spark__env=[{"name": "TASKSHARD_RUN_CACHE_BYTES", "value": "1"}])


def test_cleanup_pod():
    pod = builders.build_cleanup_pod(task="orders", spec=spec(checkpointRetention="Delete"))
    assert pod["metadata"]["name"] == "orders-cleanup"
    assert "remove_task_state('/data/state/orders', None, None)" in pod["spec"]["containers"][0]["command"][2]
    assert pod["spec"]["volumes"] == [
        {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}},
        {"name": "storage", "hostPath": {"path": "/srv/taskshard", "type": "DirectoryOrCreate"}},
    ]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "storage", "mountPath": "/data"},
    ]
    no_volume = TaskSpec.from_k8s({**SPEC, "storage": {"path": "/data/state"}})
    assert builders.build_cleanup_pod(task="o", spec=no_volume) is None


def test_cleanup_pod_on_s3_deletes_the_task_prefix_with_the_secrets_credentials():
    s3 = {"s3": {**S3_STORAGE["s3"], "prefix": "prod/"}}
    pod = builders.build_cleanup_pod(task="orders", spec=TaskSpec.from_k8s({**SPEC, "storage": s3}), task_uid="u-1")
    container = pod["spec"]["containers"][0]
    # Only this Task's state (identity.json with its uid, or none) is removed.
    assert "remove_task_state('s3a://bkt/prod/orders', 'u-1', 'http://minio:9000')" in container["command"][2]
    assert container["env"] == CREDENTIALS_ENV
    assert pod["spec"]["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}}]  # no storage volume: S3 only
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]


RUN_CACHE_ENV = {"name": "TASKSHARD_RUN_CACHE_BYTES", "value": str(4 << 30)}
"""A quarter of the default /tmp size limit (16Gi)."""
S3_STORAGE = {"s3": {"bucket": "bkt", "endpoint": "http://minio:9000", "credentialsSecret": "taskshard-s3"}}
CREDENTIALS_ENV = [
    {
        "name": "AWS_ACCESS_KEY_ID",
        "valueFrom": {"secretKeyRef": {"name": "taskshard-s3", "key": "AWS_ACCESS_KEY_ID", "optional": False}},
    },
    {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "taskshard-s3", "key": "AWS_SECRET_ACCESS_KEY", "optional": False}},
    },
]


def test_s3_credentials_secret_becomes_secret_key_refs():
    s = TaskSpec.from_k8s({**SPEC, "storage": S3_STORAGE, "spark": {**SPEC["spark"], "executors": EXECUTORS}})
    pod = builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=s, template_hash="h")
    env = pod["spec"]["containers"][0]["env"]
    assert env[-2:] == CREDENTIALS_ENV
    assert [e["name"] for e in env[:4]] == ["TASKSHARD_TASK", "TASKSHARD_SHARD", "POD_NAME", "POD_NAMESPACE"]
    template = builders.build_executor_pod_template(task="o", shard="o-0-8", key_groups=R(0, 8), spec=s)
    assert template["spec"]["containers"][0]["env"] == [RUN_CACHE_ENV, *CREDENTIALS_ENV]
    # The ConfigMap names the Secret (the config's storage) and holds the template's references, never a value.
    config = builders.build_shard_config(task="o", namespace="ns1", shard="o-0-8", key_groups=R(0, 8), spec=s)
    assert config["storage"] == {"s3": S3_STORAGE["s3"]}
    validate_shard_config(config)
    cm = builders.build_configmap(task="o", shard="o-0-8", key_groups=R(0, 8), config=config, spec=s)
    assert "AWS_" not in cm["data"]["shard.json"]
    assert json.loads(cm["data"]["executor-pod-template.json"]) == template


def test_no_credentials_env_without_a_secret():
    for storage in ({"s3": {"bucket": "bkt"}}, SPEC["storage"]):
        s = TaskSpec.from_k8s({**SPEC, "storage": storage, "spark": {**SPEC["spark"], "executors": EXECUTORS}})
        pod = builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=s, template_hash="h")
        assert not any(e["name"].startswith("AWS_") for e in pod["spec"]["containers"][0]["env"])
        template = builders.build_executor_pod_template(task="o", shard="o-0-8", key_groups=R(0, 8), spec=s)
        assert template["spec"]["containers"][0]["env"] == [RUN_CACHE_ENV]


def test_spark_env_reaches_driver_and_executors_and_reserved_names_are_refused():
    env = [
        {"name": "TASKSHARD_EXTRA_JARS", "value": "/opt/jars"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
    ]
    s = TaskSpec.from_k8s({**SPEC, "spark": {**SPEC["spark"], "env": env}})
    pod = builders.build_pod(task="orders", shard="orders-0-64", key_groups=R(0, 64), spec=s, template_hash="h")
    got = pod["spec"]["containers"][0]["env"]
    assert [e for e in got if e["name"] in ("TASKSHARD_EXTRA_JARS", "TOKEN")] == env
    assert {e["name"] for e in got} >= {"TASKSHARD_SHARD", "POD_NAME"}
    template = builders.build_executor_pod_template(task="orders", shard="orders-0-64", key_groups=R(0, 64), spec=s)
    assert template["spec"]["containers"][0]["env"] == [RUN_CACHE_ENV, *env]
    with pytest.raises(ValueError, match="'TASKSHARD_SHARD' is set by the operator"):
        TaskSpec.from_k8s({**SPEC, "spark": {**SPEC["spark"], "env": [{"name": "TASKSHARD_SHARD", "value": "x"}]}})
    with pytest.raises(ValueError, match="value or valueFrom, not both"):
        TaskSpec.from_k8s(
            {**SPEC, "spark": {**SPEC["spark"], "env": [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {}}}]}}
        )


def test_kafka_latest_is_pinned_to_the_task_creation_time_for_every_shard():
    kafka = {"bootstrapServers": "k:9092", "topic": "orders"}
    latest = TaskSpec.from_k8s({**SPEC, "source": {"kafka": {**kafka, "startingOffsets": "latest"}}})
    configs = [
        builders.build_shard_config(
            task="orders", namespace="ns", shard=name, key_groups=r, spec=latest, task_created="2026-11-22T06:40:01Z"
        )
        for name, r in (("orders-0-64", R(0, 64)), ("orders-64-128", R(64, 128)))
    ]
    stamps = {c["source"]["kafka"]["startingTimestamp"] for c in configs}
    assert stamps == {1795329601000}
    for c in configs:
        validate_shard_config(c)  # the runtime accepts the field
    earliest = TaskSpec.from_k8s({**SPEC, "source": {"kafka": kafka}})
    config = builders.build_shard_config(
        task="orders", namespace="ns", shard="orders-0-64", key_groups=R(0, 64), spec=earliest, task_created="x"
    )
    assert "startingTimestamp" not in config["source"]["kafka"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            {"journal": {"path": "/data/journal/orders", "partitions": 4, "partitionedByKey": True}},
            {"journal": {"path": "/data/journal/orders", "partitions": 4, "partitionedByKey": True}},
        ),
        (
            {"kafka": {"bootstrapServers": "k:9092", "topic": "orders", "partitionedByKey": True, "partitions": 8}},
            {
                "kafka": {
                    "bootstrapServers": "k:9092",
                    "topic": "orders",
                    "startingOffsets": "earliest",
                    "partitionedByKey": True,
                    "partitions": 8,
                }
            },
        ),
        (
            {
                "kafka": {
                    "bootstrapServers": "k:9092",
                    "topic": "orders",
                    "startingOffsets": "latest",
                    "partitionedByKey": True,
                    "partitions": 8,
                }
            },
            {
                "kafka": {
                    "bootstrapServers": "k:9092",
                    "topic": "orders",
                    "startingOffsets": "latest",
                    "startingTimestamp": 1795329601000,
                    "partitionedByKey": True,
                    "partitions": 8,
                }
            },
        ),
    ],
    ids=["journal", "kafka", "kafka-latest"],
)
def test_shard_config_carries_partitioned_by_key_and_partitions(source, expected):
    s = TaskSpec.from_k8s({**SPEC, "source": source})
    config = builders.build_shard_config(
        task="orders",
        namespace="ns",
        shard="orders-0-64",
        key_groups=R(0, 64),
        spec=s,
        task_created="2026-11-22T06:40:01Z",
    )
    assert config["source"] == expected
    validate_shard_config(config)  # the runtime's config model accepts both fields


def test_partitioned_by_key_false_changes_neither_config_nor_template_hash():
    """A Task that does not use the mode gets the config and hash it had before the field existed (no roll)."""
    explicit = spec(source={"journal": {"path": "/data/journal/orders", "partitions": 4, "partitionedByKey": False}})
    assert builders.template_hash(explicit) == builders.template_hash(spec())
    config = builders.build_shard_config(
        task="orders", namespace="ns", shard="orders-0-64", key_groups=R(0, 64), spec=explicit
    )
    assert config["source"] == {"journal": {"path": "/data/journal/orders", "partitions": 4}}


# ---------------------------------------------------------------- Pod Security "restricted"

PVC_STORAGE = {"path": "/data/state", "volume": {"persistentVolumeClaim": {"claimName": "state"}}}
RESTRICTED_SPECS = {
    "s3-local": {"storage": S3_STORAGE},
    "s3-executors": {"storage": S3_STORAGE, "spark": {**SPEC["spark"], "executors": EXECUTORS}},
    "pvc-local": {"storage": PVC_STORAGE},
    "pvc-executors": {"storage": PVC_STORAGE, "spark": {**SPEC["spark"], "executors": EXECUTORS}},
}


def every_pod(s: TaskSpec) -> dict[str, dict]:
    """Every pod the operator creates for a Task ``s``; the executor template (a Pod manifest without name or
    image: Spark fills them) only with executors, the cleanup pod only where it can reach the storage."""
    r = R(0, 64)
    pods = {
        "driver": builders.build_pod(task="orders", shard="orders-0-64", key_groups=r, spec=s, template_hash="h"),
        "cleanup": builders.build_cleanup_pod(task="orders", spec=s),
    }
    if builders.executor_instances(s):
        pods["executor"] = builders.build_executor_pod_template(
            task="orders", shard="orders-0-64", key_groups=r, spec=s
        )
    return {name: pod for name, pod in pods.items() if pod is not None}


@pytest.mark.parametrize("case", sorted(RESTRICTED_SPECS))
def test_every_pod_meets_pod_security_restricted(case):
    s = TaskSpec.from_k8s({**SPEC, **RESTRICTED_SPECS[case], "checkpointRetention": "Delete"})
    pods = every_pod(s)
    assert {"driver", "cleanup"} <= set(pods)
    for name, pod in pods.items():
        assert restricted_violations(pod) == [], name
        assert pod["spec"]["securityContext"] == builders.POD_SECURITY_CONTEXT, name
        for container in pod["spec"]["containers"]:
            assert container["securityContext"] == builders.CONTAINER_SECURITY_CONTEXT, name
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], name  # read-only root


def test_restricted_security_contexts_are_the_standard_and_not_shared_between_pods():
    assert builders.POD_SECURITY_CONTEXT["runAsNonRoot"] is True
    assert builders.POD_SECURITY_CONTEXT["runAsUser"] != 0
    assert builders.POD_SECURITY_CONTEXT["seccompProfile"] == {"type": "RuntimeDefault"}
    assert builders.CONTAINER_SECURITY_CONTEXT["allowPrivilegeEscalation"] is False
    assert builders.CONTAINER_SECURITY_CONTEXT["capabilities"] == {"drop": ["ALL"]}
    a, b = (
        builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=spec(), template_hash="h") for _ in "ab"
    )
    a["spec"]["securityContext"]["seccompProfile"]["type"] = "Unconfined"
    a["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"].clear()
    assert b["spec"]["securityContext"] == builders.POD_SECURITY_CONTEXT
    assert b["spec"]["containers"][0]["securityContext"] == builders.CONTAINER_SECURITY_CONTEXT


def test_hostpath_storage_is_the_one_restricted_violation():
    """A Task on a hostPath volume cannot run in a "restricted" namespace (docs/design-contracts.md): its pods
    fail exactly the volume-type check, nothing else."""
    s = spec(checkpointRetention="Delete", spark__executors=EXECUTORS)
    pods = every_pod(s)
    assert set(pods) == {"driver", "cleanup", "executor"}
    for name, pod in pods.items():
        assert restricted_violations(pod) == ["restrictedVolumes: volumes ['storage'] have restricted types"], name


def test_the_restricted_reading_refuses_a_pod_without_security_contexts():
    """The offline checker is not vacuous: the cleanup pod as it was before securityContexts fails every check."""
    pod = builders.build_cleanup_pod(task="orders", spec=TaskSpec.from_k8s({**SPEC, "storage": S3_STORAGE}))
    del pod["spec"]["securityContext"]
    del pod["spec"]["containers"][0]["securityContext"]
    checks = {v.split(":")[0] for v in restricted_violations(pod)}
    assert checks == {"allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile", "capabilities_restricted"}
    pod["spec"]["securityContext"] = {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
    assert {v.split(":")[0] for v in restricted_violations(pod)} >= {"runAsUser", "seccompProfile"}


def test_the_driver_pod_is_ready_only_when_the_runtime_emits():
    pod = builders.build_pod(task="o", shard="o-0-8", key_groups=R(0, 8), spec=spec(), template_hash="h")
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["exec"]["command"] == ["test", "-e", naming.EMITTING_FILE]
    tmp = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in tmp and naming.EMITTING_FILE.startswith("/tmp/"), "the runtime can write it: an emptyDir"
    config = builders.build_shard_config(task="o", namespace="ns", shard="o-0-8", key_groups=R(0, 8), spec=spec())
    assert config["readyFile"] == naming.EMITTING_FILE


def test_the_spark_ui_is_off_unless_the_task_turns_it_on():
    """No web UI by default (it shows the configuration and can kill jobs); spec.spark.ui: true turns it on, and
    spark.conf may not set it (the one switch is the field)."""
    from pydantic import ValidationError

    def ui(spark: dict) -> str:
        spec = TaskSpec.from_k8s({**SPEC, "spark": {**SPEC["spark"], **spark}})
        config = builders.build_shard_config(
            task="orders", namespace="ns1", shard="orders-0-64", key_groups=R(0, 64), spec=spec
        )
        return config["spark"]["conf"]["spark.ui.enabled"]

    assert ui({}) == "false"
    assert ui({"ui": True}) == "true"
    with pytest.raises(ValidationError, match=r'spec.spark.conf\["spark.ui.enabled"\]: "true": .*spec.spark.ui: true'):
        ui({"conf": {"spark.ui.enabled": "true"}})
    assert ui({"conf": {"spark.ui.enabled": "false"}}) == "false", "saying the default stays valid"
