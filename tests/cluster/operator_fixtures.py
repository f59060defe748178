"""Fixtures for the operator's cluster tests: CRDs installed, the operator as a killable subprocess, a Task.

- ``operator_crds`` (session): ``kubectl apply -f crds/`` and wait until the CRDs are Established.
- ``operator_process`` (function): a started :class:`OperatorProcess` watching the test's namespace
  (``python -m taskshard_operator --namespace NS --standalone``), its log in the test's tmp dir; stopped after.
- :func:`task_manifest`: a Task whose storage, journal and output live under a host directory (hostPath).
- :func:`write_events` / :func:`expected_counts` / :func:`actual_counts`: the input and a plain-Python reference.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

from spark_runtime.produce import append_events
from spark_runtime.results import final_results
from tests.jvm import DRIVER_JVM_CONF
from tests.waiting import get_json, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def operator_crds(kube_cluster):
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for crd in ("tasks.taskshard.io", "taskshards.taskshard.io"):
        kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    return kube_cluster


class OperatorProcess:
    """The operator under test as a subprocess; ``kill()`` is SIGKILL, ``start()`` starts a fresh one."""

    def __init__(self, cluster, namespace: str, log_path: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        from testinfra.common import free_port

        self.metrics_port = free_port()

    def start(self, *, crash_after_phase: str | None = None, resync_seconds: float | None = 2) -> OperatorProcess:
        """Start the operator (``resync_seconds=None``: its production default)."""
        env = self.cluster.env()
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        env.pop("TASKSHARD_CRASH_AFTER_PHASE", None)
        if crash_after_phase:
            env["TASKSHARD_CRASH_AFTER_PHASE"] = crash_after_phase
        cmd = [
            sys.executable,
            "-m",
            "taskshard_operator",
            "--namespace",
            self.namespace,
            "--standalone",
            "--liveness",
            "",
            *(("--resync-seconds", str(resync_seconds)) if resync_seconds is not None else ()),
            "--backoff-base",
            "1",
            "--metrics-port",
            str(self.metrics_port),
            "--live-status-seconds",
            "2",
        ]
        log = open(self.log_path, "a")  # noqa: SIM115 - owned by the child
        log.write(f"----- start {self.starts} (crash after phase: {crash_after_phase}) -----\n")
        log.flush()
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()
        self.starts += 1
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The operator's Prometheus samples: ``{(name, sorted label pairs): value}`` (scraped now)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def operator_process(operator_crds, kube_cluster, namespace, tmp_path):
    op = OperatorProcess(kube_cluster, namespace, tmp_path / "operator.log").start()
    yield op
    # Stop the shards' pods while the operator still runs (its finalizers), then stop it.
    kube_cluster.kubectl(
        "delete", "tasks", "--all", "--namespace", namespace, "--wait=true", "--timeout=120s", check=False
    )
    op.stop()
    print(f"\n[operator log] {op.log_path}", file=sys.stderr)


def task_manifest(
    name: str,
    data_dir: Path,
    *,
    max_key_groups: int = 16,
    initial_shards: int = 1,
    partitions: int = 2,
    retention: str = "Retain",
    image: str = "taskshard/shard:test",
) -> dict:
    return {
        "apiVersion": "taskshard.io/v1alpha1",
        "kind": "Task",
        "metadata": {"name": name},
        "spec": {
            "maxKeyGroups": max_key_groups,
            "initialShards": initial_shards,
            "keyField": "key",
            "processor": {"builtin": "count"},
            "source": {"journal": {"path": f"/data/journal/{name}", "partitions": partitions}},
            "sink": {"directory": {"path": f"/data/output/{name}", "format": "jsonl"}},
            "storage": {"path": "/data/state", "volume": {"hostPath": str(data_dir), "mountPath": "/data"}},
            "spark": {
                "image": image,
                "conf": {**DRIVER_JVM_CONF, "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
                "triggerInterval": "1 second",
            },
            "checkpointRetention": retention,
        },
    }


def apply(kubectl, manifest: dict) -> None:
    kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def write_events(data_dir: Path, task: str, *, start: int, count: int, keys: int = 50, partitions: int = 2) -> None:
    """Append ``count`` events (event i has key ``k<i % keys>``) to the journal with the runtime's producer."""
    journal = data_dir / "journal" / task
    journal.mkdir(parents=True, exist_ok=True)
    append_events(journal, partitions, [{"key": f"k{i % keys}", "seq": i} for i in range(start, start + count)])


def expected_counts(data_dir: Path, task: str) -> dict[str, int]:
    """The plain-Python reference: events per key in the journal."""
    counts: Counter[str] = Counter()
    for part in sorted((data_dir / "journal" / task).glob("p*.jsonl")):
        for line in part.read_text().splitlines():
            if line.strip():
                counts[str(json.loads(line)["key"])] += 1
    return dict(counts)


def actual_counts(data_dir: Path, task: str) -> dict[str, int]:
    """Per-key results the shards wrote: the latest result per key across the shard lineage."""
    found = final_results(data_dir / "output" / task, data_dir / "state", task)
    return {str(k): int(v) for k, v in found.items()}


def shard_phases(kubectl) -> dict[str, str]:
    items = get_json(kubectl, "taskshards")["items"]
    return {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}


def wait_phases(kubectl, expected: dict[str, str], timeout: float, op: OperatorProcess | None = None) -> None:
    def probe():
        phases = shard_phases(kubectl)
        return all(phases.get(k) == v for k, v in expected.items()) and phases

    try:
        wait_for(probe, timeout, f"shard phases {expected}", interval=1.0)
    except AssertionError:
        if op is not None:
            print(op.log()[-6000:], file=sys.stderr)
        raise


def wait_results(data_dir: Path, task: str, timeout: float) -> dict[str, int]:
    expected = expected_counts(data_dir, task)
    wait_for(
        lambda: actual_counts(data_dir, task) == expected,
        timeout,
        f"per-key results of {task} to equal the reference ({sum(expected.values())} events)",
        interval=2.0,
    )
    return expected


def split(kubectl, shard: str, at: int | None = None) -> None:
    """Request a split of ``shard`` (at its midpoint, or at key group ``at``) as ``kubectl edit`` would."""
    body = {"spec": {"split": {"requested": True, **({"at": at} if at is not None else {})}}}
    kubectl("patch", "taskshard", shard, "--type=merge", "-p", json.dumps(body))


def running_pods(kubectl) -> dict[str, str]:
    pods = get_json(kubectl, "pods", "-l", "taskshard.io/component=shard")["items"]
    return {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in pods}


def now() -> float:
    return time.monotonic()


def driver_pid(kubectl, shard: str) -> int | None:
    """The process group of a shard's running driver container (the node agent's container id is its pid), or
    None while it is not created or not running."""
    try:
        pod = get_json(kubectl, "pod", f"{shard}-driver")
    except Exception:  # noqa: BLE001 - not created yet
        return None
    states = (pod.get("status") or {}).get("containerStatuses") or []
    if not states or "running" not in (states[0].get("state") or {}) or not states[0].get("containerID"):
        return None
    return int(states[0]["containerID"].split("://")[1])
