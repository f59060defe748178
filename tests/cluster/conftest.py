"""Fixtures of the cluster tier: a real local control plane shared by the session, a namespace per test.

- ``kube_cluster`` (session): a :class:`localkube.cluster.LocalCluster` started from the cached binaries (built on
  first use: a cold build takes many minutes). ``TASKSHARD_TEST_KUBECONFIG=/path`` runs the tier against an
  existing cluster instead (its nodes must run the pods' commands, as the local node agent does).
- ``namespace`` (function): a fresh namespace, deleted after the test.
- ``kubectl`` (function): ``kubectl(*args, input=None, check=True)`` bound to that namespace; its ``get_json``
  answers the reads tests poll through the API (:mod:`tests.kubeget`), not a kubectl process per poll.

If the control plane cannot be built or started the tests fail with the reason and the components' log tails.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from localkube.binaries import BinariesUnavailable, ensure_binaries
from localkube.cluster import ClusterStartError, LocalCluster
from tests.kubeget import KubeGet

VENV_BIN = str(Path(sys.executable).parent)


class ExistingCluster:
    """The subset of LocalCluster the tests use, for a cluster named by TASKSHARD_TEST_KUBECONFIG."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.binaries = ensure_binaries()
        self.run_dir = None

    kubectl = LocalCluster.kubectl
    env = LocalCluster.env

    def pod_log_path(self, namespace: str, pod: str, container: str) -> Path:
        raise NotImplementedError("pod logs are read from the local node agent only")

    def restart_apiserver(self) -> None:
        raise NotImplementedError("an existing cluster's kube-apiserver is not the tests' to restart")


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory, request):
    existing = os.environ.get("TASKSHARD_TEST_KUBECONFIG")
    if existing:
        yield ExistingCluster(existing)
        return
    try:
        binaries = ensure_binaries()
    except BinariesUnavailable as e:
        pytest.fail(f"the cluster tier needs the control-plane binaries: {e}", pytrace=False)
    cluster = LocalCluster(tmp_path_factory.mktemp("localkube"), binaries=binaries, agent_env_path=[VENV_BIN])
    try:
        cluster.start()
    except ClusterStartError as e:
        pytest.fail(f"the local control plane did not start: {e} (logs in {cluster.log_dir})", pytrace=False)
    print(f"\n[localkube] cluster up: KUBECONFIG={cluster.kubeconfig}", file=sys.stderr)
    yield cluster
    if request.session.testsfailed:
        cluster.print_log_tails()
    cluster.stop()


@pytest.fixture
def namespace(kube_cluster, request):
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


class NamespacedKubectl:
    """The real kubectl bound to a namespace; ``get_json(*args)`` is ``kubectl get *args -o json`` parsed, read
    through the API for the kinds :mod:`tests.kubeget` knows (one pooled client per cluster) and by kubectl
    otherwise."""

    def __init__(self, cluster, namespace: str, reader: KubeGet) -> None:
        self.cluster, self.namespace, self.reader = cluster, namespace, reader

    def __call__(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.cluster.kubectl(*args, namespace=self.namespace, **kwargs)

    def get_json(self, *args: str) -> dict:
        answer = self.reader.get(args, self.namespace)
        if answer is None:
            answer = json.loads(self("get", *args, "-o", "json").stdout)
        return answer


@functools.cache
def kube_get(kubeconfig: str) -> KubeGet:
    return KubeGet(kubeconfig)


@pytest.fixture
def kubectl(kube_cluster, namespace):
    return NamespacedKubectl(kube_cluster, namespace, kube_get(str(kube_cluster.kubeconfig)))


def pod_log(kube_cluster, namespace: str, pod: str, container: str) -> str:
    path = kube_cluster.pod_log_path(namespace, pod, container)
    return path.read_text(errors="replace") if path.exists() else ""


__all__ = ["pod_log", "subprocess"]
