"""The chart installed by the real helm on the local control plane: the operator runs from it with the chart's
RBAC (its pod's in-cluster client authenticates as the chart's ServiceAccount, not as admin), acts on Tasks,
survives an upgrade without touching shards, and uninstalls leaving Tasks and checkpoints in place."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.cluster.conftest import pod_log
from tests.jvm import DRIVER_JVM_OPTIONS
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "taskshard-operator"


def task_manifest(name: str, data_dir: Path) -> str:
    return textwrap.dedent(f"""
        apiVersion: taskshard.io/v1alpha1
        kind: Task
        metadata: {{name: {name}}}
        spec:
          maxKeyGroups: 16
          initialShards: 2
          processor: {{builtin: count}}
          source: {{journal: {{path: /data/journal/{name}, partitions: 2}}}}
          sink: {{directory: {{path: /data/output/{name}, format: jsonl}}}}
          storage:
            path: /data/state
            volume: {{hostPath: {data_dir}, mountPath: /data}}
          spark:
            image: taskshard/shard:0.1.0
            conf: {{spark.sql.shuffle.partitions: "2", spark.driver.extraJavaOptions: "{DRIVER_JVM_OPTIONS}"}}
    """)


class Helm:
    def __init__(self, kube_cluster, release: str, namespace: str) -> None:
        self.cluster, self.release, self.namespace = kube_cluster, release, namespace

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [self.cluster.binaries.helm, "--kubeconfig", str(self.cluster.kubeconfig), "-n", self.namespace, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result


@pytest.fixture
def operator_release(kube_cluster, namespace):
    """The chart installed into its own namespace, watching only the test's namespace."""
    release = f"ts-{uuid.uuid4().hex[:5]}"
    system_ns = f"{release}-system"
    helm = Helm(kube_cluster, release, system_ns)
    values = {
        # The local node agent runs commands, not image entrypoints: start the operator with this venv's python.
        "command": [sys.executable, "-m", "taskshard_operator"],
        "watchNamespaces": [namespace],
        "peering": {"enabled": True, "name": release},
    }
    install = helm(
        "install",
        release,
        str(CHART),
        "--create-namespace",
        "--wait",
        "--timeout",
        "180s",
        "--set-json",
        f"command={json.dumps(values['command'])}",
        "--set-json",
        f"watchNamespaces={json.dumps(values['watchNamespaces'])}",
        "--set",
        f"peering.name={release}",
    )
    assert "STATUS: deployed" in install.stdout
    yield helm
    helm("uninstall", release, "--wait", "--timeout", "120s", check=False)
    kube_cluster.kubectl("delete", "namespace", system_ns, "--wait=false", check=False)


def operator_pod(kube_cluster, helm) -> dict:
    pods = get_json(
        lambda *a: kube_cluster.kubectl(*a, namespace=helm.namespace), "pods", "-l", "taskshard.io/component=operator"
    )["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return running[0] if len(running) == 1 else None


def test_install_runs_the_operator_with_chart_rbac_upgrade_keeps_shards_uninstall_keeps_tasks(
    kube_cluster, namespace, kubectl, operator_release, tmp_path
):
    helm = operator_release
    pod = wait_for(lambda: operator_pod(kube_cluster, helm), 120, "the operator pod Running")
    assert pod["spec"]["serviceAccountName"] == f"{helm.release}-taskshard-operator"

    # The operator (in-cluster, with the chart's RBAC) turns a Task into TaskShards that tile the key groups.
    kubectl("apply", "-f", "-", input=task_manifest("orders", tmp_path))
    shards = wait_for(
        lambda: (items := get_json(kubectl, "taskshards")["items"]) and len(items) == 2 and items,
        120,
        "two TaskShards created by the chart-installed operator",
    )
    ranges = sorted((s["spec"]["keyGroups"]["start"], s["spec"]["keyGroups"]["end"]) for s in shards)
    assert ranges == [(0, 8), (8, 16)]
    uids_before = {s["metadata"]["name"]: s["metadata"]["uid"] for s in shards}
    drivers = wait_for(
        lambda: len(items := get_json(kubectl, "pods", "-l", "taskshard.io/task=orders")["items"]) == 2 and items,
        120,
        "one driver pod per shard",
    )
    # The Task names no ServiceAccount: its shards run as the one the chart created in the watched namespace.
    assert {p["spec"]["serviceAccountName"] for p in drivers} == {"taskshard-shard"}
    # A node drain evicts one of its driver pods at a time: the Task's budget, made with the chart's RBAC, and
    # Kubernetes' disruption controller counting both driver pods under it.
    budget = get_json(kubectl, "poddisruptionbudget", "orders-shards")
    assert budget["spec"]["minAvailable"] == 1
    assert [r["kind"] for r in budget["metadata"]["ownerReferences"]] == ["Task"]
    assert wait_for(
        lambda: get_json(kubectl, "poddisruptionbudget", "orders-shards").get("status", {}).get("expectedPods") == 2,
        60,
        "the budget counting both driver pods",
    )
    checkpoints = [tmp_path / "state" / "orders" / "shards" / name / "checkpoint" for name in uids_before]
    wait_for(lambda: all(c.is_dir() for c in checkpoints), 180, "each shard's recovery log (checkpoint) on disk")
    log = pod_log(kube_cluster, helm.namespace, pod["metadata"]["name"], "operator")
    assert "Forbidden" not in log and "forbidden" not in log, log[-3000:]

    # helm upgrade changes a value: a new operator pod, the same shards.
    helm(
        "upgrade",
        helm.release,
        str(CHART),
        "--reuse-values",
        "--set",
        "resources.limits.memory=640Mi",
        "--wait",
        "--timeout",
        "180s",
    )
    new_pod = wait_for(
        lambda: (p := operator_pod(kube_cluster, helm)) and p["metadata"]["uid"] != pod["metadata"]["uid"] and p,
        180,
        "the upgraded operator pod",
    )
    limits = new_pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == "640Mi"
    after = {s["metadata"]["name"]: s["metadata"]["uid"] for s in get_json(kubectl, "taskshards")["items"]}
    assert after == uids_before

    # The upgraded operator, still with nothing but the chart's RBAC, splits a shard.
    kubectl("patch", "taskshard", "orders-0-8", "--type", "merge", "-p", '{"spec":{"split":{"requested":true}}}')
    expected = {"orders-0-8": "Split", "orders-0-4": "Running", "orders-4-8": "Running", "orders-8-16": "Running"}

    def phases():
        return {
            s["metadata"]["name"]: (s.get("status") or {}).get("phase")
            for s in get_json(kubectl, "taskshards")["items"]
        }

    wait_for(lambda: phases() == expected, 420, f"the split to finish: {expected}", interval=2)
    parent = get_json(kubectl, "taskshard", "orders-0-8")
    assert sorted(parent["status"]["lineage"]["children"]) == ["orders-0-4", "orders-4-8"]
    wait_for(
        lambda: get_json(kubectl, "poddisruptionbudget", "orders-shards")["spec"]["minAvailable"] == 2,
        60,
        "the budget following three shards",
    )
    assert parent["status"]["finalCheckpoint"]["manifest"]

    # helm uninstall removes the operator; the Task, its shards and the storage directory stay.
    helm("uninstall", helm.release, "--wait", "--timeout", "120s")
    wait_for(lambda: operator_pod(kube_cluster, helm) is None, 60, "the operator pod gone")
    assert kubectl("get", "task", "orders").returncode == 0
    assert {s["metadata"]["name"] for s in get_json(kubectl, "taskshards")["items"]} == set(expected)
    assert all(c.is_dir() and any(c.iterdir()) for c in checkpoints), "checkpoints are kept"
