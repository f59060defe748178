"""Spark executors on Kubernetes, run for real (real control plane, node agent, Spark in every pod).

The shard's driver (client mode, in its pod) asks the real kube-apiserver for executor pods through Spark's own
Kubernetes scheduler backend; the node agent runs them as local processes (the template's command,
``python -m spark_runtime`` + Spark's argument ``executor``); they connect back through the driver's headless
Service, which the node agent's DNS stand-in resolves to the driver pod's address; Spark schedules the shard's
tasks on them. One scenario, to share the pods on two cores:

1. in a namespace that enforces Pod Security "restricted" (storage on a PersistentVolumeClaim, as restricted
   requires), a Task with ``executors.instances: 2``: two executor pods are admitted and run, owned by the driver
   pod, and the executors' logs show the shard's tasks finishing on them; results exact;
   ``status.executors`` and the ``ExecutorsReady`` condition show them; the driver is closed: its executors prove
   the shard's key (a Secret mounted as a file, in no pod spec), and an executor started by hand without it is
   refused and exits; the driver's ServiceAccount may delete its executor pods and no other pod;
2. one executor process is SIGKILLed while it runs a task of a micro-batch (its log shows a task started and not
   finished): the driver loses it, Spark retries the task and asks for a replacement pod, which runs; results stay
   exact;
3. the shard is split: the parent's executor pods go with its driver (owner reference), each child runs two
   executors of its own; results exact.

The Task carries ``spec.spark.podTemplate`` (labels, annotations, a node selector, a toleration, a pull secret, a
ConfigMap volume) and ``spec.spark.volumeMounts``: the driver and executor pods carry them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from localkube.volumes import pvc_dir
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    ROOT,
    apply,
    operator_crds,
    operator_process,
    split,
    task_manifest,
    wait_phases,
    wait_results,
    write_events,
)
from tests.cluster.test_pod_security import RESTRICTED
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

START = 420  # seconds: three JVMs per shard on two cores
RBAC = ROOT / "docs" / "examples" / "spark-driver-rbac.yaml"
TASK, PARENT, LOW, HIGH = "ex", "ex-0-8", "ex-0-4", "ex-4-8"


def executor_pods(kubectl, shard: str | None = None) -> list[dict]:
    selector = "taskshard.io/component=executor" + (f",taskshard.io/shard={shard}" if shard else "")
    return get_json(kubectl, "pods", "-l", selector)["items"]


def running(pods: list[dict]) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


def wait_executors(kubectl, shard: str, count: int) -> list[str]:
    return wait_for(
        lambda: (names := running(executor_pods(kubectl, shard))) and len(names) == count and names,
        START,
        f"{count} executor pods of {shard} running",
        interval=2,
    )


def finished_tasks(kube_cluster, namespace: str, pod: str) -> int:
    log = kube_cluster.pod_log_path(namespace, pod, "executor")
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count("Executor: Finished task")


def tasks_in_flight(kube_cluster, namespace: str, pod: str) -> int:
    """Tasks an executor started and has not finished yet, from Spark's executor log."""
    log = kube_cluster.pod_log_path(namespace, pod, "executor")
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count("Executor: Running task") - text.count("Executor: Finished task")


def executors_status(kubectl, shard: str) -> tuple[dict, dict]:
    shard_status = get_json(kubectl, "taskshard", shard).get("status") or {}
    ready = next((c for c in shard_status.get("conditions") or [] if c["type"] == "ExecutorsReady"), {})
    return shard_status.get("executors") or {}, ready


def container_pid(pod: dict) -> int:
    """The node agent's container id is the process id of the container's process group."""
    (state,) = pod["status"]["containerStatuses"]
    return int(state["containerID"].split("://")[1])


AUTH_REFUSED = re.compile(
    r"IllegalArgumentException: Unknown challenge message|IOException: Connection from \S+ closed"
    r"|Failed to send RPC .*ClosedChannelException|send\(\.\.\) failed with error\(-32\): Broken pipe"
)
"""What a client without the key sees: the driver's authentication handler refuses its first message and closes the
connection; which sign of it reaches the client first (the refusal, the close, or a send on the closed channel:
Java's ClosedChannelException, or netty's native EPIPE, "Broken pipe", when the close arrives while the send is
in flight) depends on timing."""


def foreign_executor(driver_ip: str) -> subprocess.CompletedProcess:
    """Spark's executor backend, started by hand against the driver's RPC port without the shard's key (what any
    pod of the cluster could run): it must be refused and exit, not register and be given tasks."""
    from spark_runtime.kubernetes import executor_command
    from taskshard_operator.builders import DRIVER_PORT

    env = {
        "PATH": os.environ.get("PATH", ""),
        **({"JAVA_HOME": os.environ["JAVA_HOME"]} if os.environ.get("JAVA_HOME") else {}),
        "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@{driver_ip}:{DRIVER_PORT}",
        "SPARK_EXECUTOR_ID": "99",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "256m",
        "SPARK_APPLICATION_ID": "foreign",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
    }
    return subprocess.run(
        executor_command(env), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240
    )


def test_two_executors_run_tasks_survive_a_kill_and_split(kubectl, kube_cluster, namespace, operator_process):  # noqa: F811
    op = operator_process
    kube_cluster.kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    kubectl("apply", "-f", str(RBAC))
    kubectl("apply", "-f", "-", input=PVC)
    data = pvc_dir(kube_cluster.run_dir / "node", namespace, "data")  # the node agent's hostPath for the claim
    data.mkdir(parents=True, exist_ok=True)
    write_events(data, TASK, start=0, count=400)
    task = task_manifest(TASK, data, max_key_groups=8)
    task["spec"]["storage"]["volume"] = {"persistentVolumeClaim": {"claimName": "data"}, "mountPath": "/data"}
    task["spec"]["spark"]["serviceAccountName"] = "taskshard-spark"
    task["spec"]["spark"]["executors"] = {"instances": 2, "resources": {"limits": {"memory": "1Gi"}}}
    task["spec"]["spark"]["conf"]["spark.taskshard.rehearse"] = "false"  # a warm-up only; this test is about executors
    # spec.spark.podTemplate and volumeMounts reach the driver and every executor pod (the scheduler places them
    # by the node selector; the pods are still admitted under "restricted").
    node = kube_cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
    kubectl("create", "configmap", "extra", "--from-literal=greeting=hello")
    template = {
        "metadata": {"labels": {"team": "payments"}, "annotations": {"example.com/owner": "ops"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [{"name": "extra", "configMap": {"name": "extra"}}],
        },
    }
    mount = {"name": "extra", "mountPath": "/opt/extra", "readOnly": True}
    task["spec"]["spark"].update(podTemplate=template, volumeMounts=[mount])
    apply(kubectl, task)

    # 1. Two executors, admitted under "restricted", owned by the driver pod, running the shard's tasks.
    first = wait_executors(kubectl, PARENT, 2)
    wait_phases(kubectl, {PARENT: "Running"}, START, op)
    wait_results(data, TASK, START)
    driver = get_json(kubectl, "pod", f"{PARENT}-driver")
    for name in first:
        pod = get_json(kubectl, "pod", name)
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", f"{PARENT}-driver", driver["metadata"]["uid"])
        assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "spark_runtime"]
        assert pod["spec"]["containers"][0]["args"] == ["executor"]
        assert pod["spec"]["automountServiceAccountToken"] is False
    for pod in (driver, *(get_json(kubectl, "pod", n) for n in first)):
        name = pod["metadata"]["name"]
        assert pod["metadata"]["labels"]["team"] == "payments", name
        assert pod["metadata"]["annotations"]["example.com/owner"] == "ops", name
        assert pod["spec"]["nodeName"] == node and pod["spec"]["nodeSelector"] == template["spec"]["nodeSelector"]
        assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}], name
        assert template["spec"]["tolerations"][0] in pod["spec"]["tolerations"], name
        assert {"name": "extra", "configMap": {"name": "extra", "defaultMode": 420}} in pod["spec"]["volumes"], name
        assert mount in pod["spec"]["containers"][0]["volumeMounts"], name
    wait_for(
        lambda: all(finished_tasks(kube_cluster, namespace, n) > 0 for n in first),
        60,
        "tasks finished on both executors",
    )
    wait_for(
        lambda: (
            executors_status(kubectl, PARENT)[0] == {"requested": 2, "running": 2, "pending": 0}
            and executors_status(kubectl, PARENT)[1].get("status") == "True"
        ),
        60,
        f"{PARENT}'s status.executors and ExecutorsReady",
    )

    # 1b. The driver is closed: only holders of the shard's key (a Secret mounted as a file, in no pod spec) get in.
    key = get_json(kubectl, "secret", f"{PARENT}-spark-auth")
    assert key["metadata"]["ownerReferences"][0]["kind"] == "TaskShard"
    for name in first:
        env = get_json(kubectl, "pod", name)["spec"]["containers"][0].get("env") or []
        assert not any(e["name"] == "_SPARK_AUTH_SECRET" for e in env), "the key is not in the pod spec"
    foreign = foreign_executor(driver["status"]["podIP"])
    (kube_cluster.run_dir / "foreign-executor.log").write_text(foreign.stdout)
    assert foreign.returncode != 0, f"a client without the key registered as an executor:\n{foreign.stdout[-3000:]}"
    assert AUTH_REFUSED.search(foreign.stdout), foreign.stdout[-3000:]
    assert "Successfully registered with driver" not in foreign.stdout
    assert len(running(executor_pods(kubectl, PARENT))) == 2
    # The driver's ServiceAccount may delete its executors, and no other pod (the example's admission policy).
    as_driver = ("--as", f"system:serviceaccount:{namespace}:taskshard-spark", "--dry-run=server")
    kubectl("delete", "pod", first[0], *as_driver)
    refused = kubectl("delete", "pod", f"{PARENT}-driver", *as_driver, check=False)
    assert refused.returncode != 0 and "may create and delete executor pods only" in refused.stderr, refused.stderr

    # 2. SIGKILL one executor while it runs a task of a batch: Spark retries the task and replaces the executor.
    victim = get_json(kubectl, "pod", first[0])
    write_events(data, TASK, start=400, count=20000)
    wait_for(lambda: tasks_in_flight(kube_cluster, namespace, first[0]) > 0, 120, f"a task running on {first[0]}", 0.02)
    os.killpg(container_pid(victim), signal.SIGKILL)
    replaced = wait_for(
        lambda: (
            (names := running(executor_pods(kubectl, PARENT))) and first[0] not in names and len(names) == 2 and names
        ),
        START,
        f"a replacement for {first[0]}",
        interval=2,
    )
    assert set(replaced) - set(first), f"a new executor pod runs: {replaced}"
    driver_log = kube_cluster.pod_log_path(namespace, f"{PARENT}-driver", "driver").read_text(errors="replace")
    assert "Lost executor" in driver_log, "Spark saw the executor die"
    write_events(data, TASK, start=20400, count=200)
    wait_results(data, TASK, START)

    # 3. Split: the parent's executors go with its driver; each child has two of its own.
    split(kubectl, PARENT)
    wait_phases(kubectl, {LOW: "Running", HIGH: "Running"}, 2 * START, op)
    write_events(data, TASK, start=20600, count=200)
    for child in (LOW, HIGH):
        wait_executors(kubectl, child, 2)
        wait_for(lambda c=child: executors_status(kubectl, c)[0].get("running") == 2, 60, f"{child}'s status.executors")
    wait_for(lambda: not executor_pods(kubectl, PARENT), START, f"{PARENT}'s executor pods gone")
    wait_results(data, TASK, START)


PVC = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteMany]
  resources:
    requests:
      storage: 1Gi
"""
