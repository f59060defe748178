"""Pod Security "restricted" on a real kube-apiserver: every pod the operator builds is admitted in a namespace
that enforces it, and a pod that breaks it is refused there (so the admission really runs).

The pods are created with ``--dry-run=server`` (admission, PodSecurity included, runs; nothing is stored or
scheduled). The Task uses S3 storage: a hostPath storage volume is the documented exception, refused here too.
"""

from __future__ import annotations

import copy
import json

import pytest

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import builders
from taskshard_operator.models.task import TaskSpec
from tests.unit.manifest_cases import base_task
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
EXECUTORS = {"instances": 2, "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}}
S3 = {"s3": {"bucket": "state", "endpoint": "http://minio.storage:9000", "credentialsSecret": "taskshard-s3"}}


@pytest.fixture
def restricted_namespace(kube_cluster, namespace):
    """The test's namespace, enforcing "restricted" and with its default ServiceAccount (pod admission needs it)."""
    kube_cluster.kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    wait_for(
        lambda: (
            kube_cluster.kubectl("get", "serviceaccount", "default", namespace=namespace, check=False).returncode == 0
        ),
        60,
        f"the default ServiceAccount of {namespace}",
    )
    return namespace


def _task_spec(**spark) -> TaskSpec:
    spec = base_task()["spec"]
    return TaskSpec.from_k8s(
        {**spec, "storage": S3, "checkpointRetention": "Delete", "spark": {**spec["spark"], **spark}}
    )


def operator_pods() -> dict[str, dict]:
    """Every pod the builders make for an S3 Task: the driver (local mode and with executors), the executor pod
    template wrapped as a Pod (Spark gives it a name and the image) and the cleanup pod."""
    r = KeyGroupRange(0, 64)
    local, executors = _task_spec(), _task_spec(executors=EXECUTORS)
    template = builders.build_executor_pod_template(task="orders", shard="orders-0-64", key_groups=r, spec=executors)
    template["metadata"]["name"] = "orders-0-64-exec-1"
    template["spec"]["containers"][0]["image"] = executors.spark.image
    return {
        "driver-local": builders.build_pod(
            task="orders", shard="orders-0-64", key_groups=r, spec=local, template_hash="h"
        ),
        "driver-executors": builders.build_pod(
            task="orders", shard="orders-0-64", key_groups=r, spec=executors, template_hash="h"
        ),
        "executor": template,
        "cleanup": builders.build_cleanup_pod(task="orders", spec=local),
    }


def _dry_run_create(kube_cluster, namespace: str, pod: dict):
    return kube_cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod), namespace=namespace, check=False
    )


@pytest.mark.parametrize("name", sorted(operator_pods()))
def test_operator_pods_are_admitted_under_restricted(kube_cluster, restricted_namespace, name):
    pod = operator_pods()[name]
    result = _dry_run_create(kube_cluster, restricted_namespace, pod)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr  # no audit/warn-level complaint either
    admitted = json.loads(result.stdout)
    assert admitted["metadata"]["name"] == pod["metadata"]["name"]
    assert admitted["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_pod_breaking_restricted_is_refused_there(kube_cluster, restricted_namespace):
    """The admission is live: the driver pod without its securityContexts, and with a hostPath storage volume
    (the documented exception), are refused, each naming what it breaks."""
    bare = copy.deepcopy(operator_pods()["driver-local"])
    del bare["spec"]["securityContext"]
    del bare["spec"]["containers"][0]["securityContext"]
    result = _dry_run_create(kube_cluster, restricted_namespace, bare)
    assert result.returncode != 0, result.stdout
    assert 'violates PodSecurity "restricted:latest"' in result.stderr, result.stderr
    for reason in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true"):
        assert reason in result.stderr, result.stderr

    spec = base_task()["spec"]  # storage.path on a hostPath volume
    host_path = TaskSpec.from_k8s(spec)
    pod = builders.build_pod(
        task="orders", shard="orders-0-64", key_groups=KeyGroupRange(0, 64), spec=host_path, template_hash="h"
    )
    result = _dry_run_create(kube_cluster, restricted_namespace, pod)
    assert result.returncode != 0, result.stdout
    assert "restricted volume types" in result.stderr and '"storage"' in result.stderr, result.stderr
