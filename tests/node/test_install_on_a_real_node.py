"""docs/install.md on a real node: the project's images as containers on a real kubelet, under Pod Security
"restricted", a Kafka + S3 Task installed and split with the page's own commands, results exact per key.

Steps 2-6 of the install page run here as written there, with this bed's values in place of the placeholders
(the image repository and tag, the brokers, the bucket's endpoint and credentials). Step 1 (`make images`) is the
``node_images`` fixture: the same Dockerfile targets, with the Kafka and S3 jars in the shard image.

What a real node adds to the cluster tier's process pods, each asserted below: the kubelet pulls nothing (the
images are in containerd), the runtime enforces uid 10001 and the read-only root filesystem, the namespaces enforce
Pod Security "restricted" at admission, the operator reaches the shard pods' IPs on the pod network (live status),
and pods reach the apiserver through the ``kubernetes`` Service (kube-proxy). Before the uninstall, docs/executors.md's
set-up runs a second Task with two executor pods, which find their driver by its Service's name (CoreDNS).
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from spark_runtime.results import final_results_from_records, read_lineage
from spark_runtime.storage import S3Settings, location
from tests.node.conftest import OPERATOR_IMAGE, SHARD_IMAGE
from tests.waiting import wait_for

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parents[2]
NS, OP_NS, TASK = "streaming", "taskshard-system", "orders-sum"
BUCKET = "taskshard-state"
START = 600  # seconds: images' JVMs starting as containers on a loaded 2-core machine
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}


def test_install_page_on_a_real_node(real_node, node_kafka, node_minio):
    cluster = real_node.cluster

    def run(*cmd: str, input: str | None = None) -> str:
        """A command from the install page, with the bed's kubeconfig, kubectl and helm."""
        result = subprocess.run(cmd, cwd=ROOT, env=cluster.env(), input=input, capture_output=True, text=True)
        assert result.returncode == 0, f"{' '.join(cmd)} failed: {result.stderr[-2000:]}"
        return result.stdout

    def get(kind: str, name: str = "", ns: str = NS) -> dict:
        return json.loads(run("kubectl", "-n", ns, "get", kind, *([name] if name else []), "-o", "json"))

    # The namespaces enforce Pod Security "restricted" before anything is admitted into them.
    for ns in (NS, OP_NS):
        run("kubectl", "create", "namespace", ns)
        run("kubectl", "label", "namespace", ns, *(f"{k}={v}" for k, v in RESTRICTED.items()))

    # Step 2: the chart, with the images the node holds.
    repository, tag = OPERATOR_IMAGE.split(":")
    run(
        "helm", "install", "taskshard", "charts/taskshard-operator",
        "--namespace", OP_NS, "--create-namespace",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
        "--set-json", f'watchNamespaces=["{NS}"]',
        "--wait", "--timeout", "5m",
    )  # fmt: skip

    # Step 3: the storage credentials.
    run(
        "kubectl", "-n", NS, "create", "secret", "generic", "taskshard-s3",
        f"--from-literal=AWS_ACCESS_KEY_ID={node_minio.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={node_minio.secret_key}",
    )  # fmt: skip

    # Step 4: the example Task with this bed's brokers, bucket, endpoint and image; requests that let three shard
    # pods and the operator share two cores.
    node_minio.create_bucket(BUCKET)
    node_kafka.create_topic("orders", 3)
    node_kafka.create_topic("order-totals", 2)
    task = yaml.safe_load((ROOT / "examples" / "task-kafka-s3.yaml").read_text())
    spec = task["spec"]
    for side in ("source", "sink"):
        spec[side]["kafka"]["bootstrapServers"] = node_kafka.bootstrap_servers
    spec["storage"]["s3"]["endpoint"] = node_minio.endpoint
    spec["spark"]["image"], spec["spark"]["imagePullPolicy"] = SHARD_IMAGE, "Never"
    spec["spark"]["resources"] = {"requests": {"cpu": "200m", "memory": "1536Mi"}, "limits": {"memory": "1536Mi"}}
    run("kubectl", "-n", NS, "apply", "-f", "-", input=yaml.safe_dump(task))

    rng = random.Random(7)
    reference: dict[str, float] = defaultdict(float)

    def produce(n: int) -> None:
        events = [{"key": f"k{rng.randrange(300)}", "amount": rng.randrange(1, 100)} for _ in range(n)]
        node_kafka.produce("orders", events)
        for e in events:
            reference[e["key"]] += e["amount"]

    def results() -> dict[str, float]:
        return sink_results(node_kafka, node_minio, task)

    def phases() -> dict[str, str]:
        return {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in get("taskshards")["items"]}

    def wait_phases(expected: dict[str, str]) -> None:
        wait_for(lambda: all(phases().get(k) == v for k, v in expected.items()), START, f"phases {expected}", 2)

    parent, other = f"{TASK}-0-64", f"{TASK}-64-128"
    produce(3000)
    wait_phases({parent: "Running", other: "Running"})
    wait_for(lambda: results() == reference, START, "per-key sums to equal the reference", interval=3)

    # The runtime, not the image's good manners: uid 10001, a read-only root filesystem, /tmp writable.
    pod = get("taskshard", parent)["status"]["pod"]
    assert run("kubectl", "-n", NS, "exec", pod, "--", "id", "-u").strip() == "10001"
    probe = subprocess.run(
        ["kubectl", "-n", NS, "exec", pod, "--", "touch", "/opt/taskshard/x"],
        env=cluster.env(), capture_output=True, text=True,
    )  # fmt: skip
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr, probe
    # The operator reads each shard's metrics at its pod IP on the pod network into status.live.
    wait_for(lambda: get("taskshard", parent)["status"].get("live") or {}, START, "live status of the parent", 2)

    # Step 5: watch it.
    listing = run("kubectl", "-n", NS, "get", "tasks,taskshards")
    assert parent in listing and other in listing
    assert "Conditions" in run("kubectl", "-n", NS, "describe", "task", TASK)

    # Step 6: split it, with records arriving before and after the request.
    produce(1500)
    run("kubectl", "-n", NS, "patch", "taskshard", parent, "--type", "merge", "-p",
        '{"spec":{"split":{"requested":true}}}')  # fmt: skip
    produce(1500)
    wait_phases({parent: "Split", f"{TASK}-0-32": "Running", f"{TASK}-32-64": "Running", other: "Running"})
    produce(1000)
    wait_for(lambda: results() == reference, START, "per-key sums after the split to equal the reference", 3)

    # Every shard pod ran from the node's images under the restricted profile (admission would have refused it).
    for item in get("pods")["items"]:
        container = item["spec"]["containers"][0]
        assert container["image"] == SHARD_IMAGE, item["metadata"]["name"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    operator_pods = get("pods", ns=OP_NS)["items"]
    assert [p["spec"]["containers"][0]["image"] for p in operator_pods] == [OPERATOR_IMAGE]

    # Executors on the node: their pods find the driver through its headless Service (CoreDNS on the node).
    run("kubectl", "-n", NS, "delete", "task", TASK, "--wait")
    run_with_executors(run, get, node_kafka, node_minio, task)

    # Uninstall as upgrade.md says: Tasks first (the operator removes their finalizer), then the release.
    run("kubectl", "delete", "tasks", "--all", "--all-namespaces", "--wait")
    run("helm", "uninstall", "taskshard", "--namespace", OP_NS)
    wait_for(
        lambda: all(p["metadata"].get("deletionTimestamp") for p in get("pods")["items"]),
        120,
        "every shard and executor pod deleted with its Task",
    )


def sink_results(kafka, minio, task: dict) -> dict[str, float]:
    """Per-key results of ``task`` from its sink topic, as its lineage on S3 says to read them."""
    spec = task["spec"]
    values = [r.value for r in kafka.consume_all(spec["sink"]["kafka"]["topic"])]
    settings = S3Settings(minio.endpoint, minio.region, minio.access_key, minio.secret_key)
    root = location(f"s3a://{BUCKET}/{spec['storage']['s3']['prefix']}", settings)
    lineage = read_lineage(root, task["metadata"]["name"])
    return {k: float(v) for k, v in final_results_from_records(values, lineage).items()}


def run_with_executors(run, get, kafka, minio, base: dict) -> None:
    """docs/executors.md's set-up on the node: the drivers' account from its example, a Task with two executors
    (S3 storage, which every executor reaches); the executor pods run, the shard's status counts them, sums exact."""
    run("kubectl", "apply", "-n", NS, "-f", "docs/examples/spark-driver-rbac.yaml")
    task = copy.deepcopy(base)
    name = task["metadata"]["name"] = "orders-exec"
    spec = task["spec"]
    spec["initialShards"] = 1
    spec["source"]["kafka"]["topic"], spec["sink"]["kafka"]["topic"] = "orders-exec", "order-totals-exec"
    spec["storage"]["s3"]["prefix"] = name
    spec["spark"]["serviceAccountName"] = "taskshard-spark"
    # Spark asks one core per executor by default: two would not fit next to the driver on this 2-core node.
    spec["spark"]["executors"] = {
        "instances": 2,
        "resources": {"requests": {"cpu": "300m"}, "limits": {"memory": "1Gi"}},
    }
    kafka.create_topic("orders-exec", 2)
    kafka.create_topic("order-totals-exec", 2)
    run("kubectl", "-n", NS, "apply", "-f", "-", input=yaml.safe_dump(task))

    rng = random.Random(11)
    reference: dict[str, float] = defaultdict(float)
    events = [{"key": f"e{rng.randrange(100)}", "amount": rng.randrange(1, 50)} for _ in range(2000)]
    kafka.produce("orders-exec", events)
    for e in events:
        reference[e["key"]] += e["amount"]
    shard = f"{name}-0-128"

    def executors() -> list[str]:
        pods = get("pods", f"--selector=taskshard.io/component=executor,taskshard.io/shard={shard}")["items"]
        return [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"]

    wait_for(lambda: len(executors()) == 2, START, f"two executor pods of {shard} running", 2)
    wait_for(lambda: sink_results(kafka, minio, task) == reference, START, "sums computed on executors", 3)
    status = get("taskshard", shard)["status"]
    assert status["executors"] == {"requested": 2, "running": 2, "pending": 0}, status
    for pod in executors():
        assert get("pod", pod)["spec"]["containers"][0]["image"] == SHARD_IMAGE
