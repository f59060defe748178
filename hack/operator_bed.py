"""The one bootstrap of the demo and the benchmarks: a cluster with TaskShard's CRDs, a namespace and the operator.

``OperatorBed(run_dir, namespace).start()``:

1. a cluster: the local control plane (``hack/localkube``: etcd, kube-apiserver, controller-manager, scheduler and,
   unless ``node_agent=False``, the node agent that runs pods as local processes), or the cluster named by
   ``kubeconfig`` as it is;
2. the CRDs from ``crds/``, Established and served;
3. the namespace, and any ``manifests`` (RBAC, ...) applied into it;
4. the operator as a local process (``python -m taskshard_operator --namespace NS --standalone --liveness ''``, or
   ``operator_command`` with the same flags), its output in ``<run_dir>/operator.log``.

``stop()`` (or leaving the ``with`` block) stops the operator, then the local control plane. Every wait checks that
the operator still runs and fails with the tail of its log if not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from localkube.binaries import ensure_binaries
from localkube.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = str(Path(sys.executable).parent)
CRDS = ("crd/tasks.taskshard.io", "crd/taskshards.taskshard.io")
SERVED = ("tasks.taskshard.io", "taskshards.taskshard.io")

T = TypeVar("T")


class OperatorBed:
    """A cluster with the CRDs installed, a namespace and the operator running (module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        namespace: str,
        *,
        kubeconfig: str | None = None,
        node_agent: bool = True,
        operator_command: Sequence[str] = (sys.executable, "-m", "taskshard_operator"),
        operator_args: Sequence[str] = (),
        operator_env: dict[str, str] | None = None,
        manifests: Sequence[Path] = (),
    ) -> None:
        self.run_dir = run_dir
        self.namespace = namespace
        self.binaries = ensure_binaries()
        self.cluster: LocalCluster | None = None
        self.env = dict(os.environ)
        if kubeconfig:
            self.env["KUBECONFIG"] = kubeconfig
        else:
            self.cluster = LocalCluster(
                run_dir / "cluster", binaries=self.binaries, agent_env_path=[VENV_BIN], node_agent=node_agent
            )
        self._operator_cmd = [*operator_command, "--namespace", namespace, "--standalone", "--liveness", ""]
        self._operator_cmd += list(operator_args)
        self._operator_env = operator_env or {}
        self._manifests = list(manifests)
        self.operator: subprocess.Popen | None = None

    @property
    def kubeconfig(self) -> Path:
        return Path(self.env["KUBECONFIG"])

    @property
    def operator_log(self) -> Path:
        return self.run_dir / "operator.log"

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> OperatorBed:
        """Steps 1-4 of the module docstring; the operator is started, not waited for."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.cluster is not None:
            self.cluster.start()
            self.env = self.cluster.env()
        self.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"), namespaced=False)
        self.kubectl("wait", "--for=condition=Established", *CRDS, "--timeout=60s", namespaced=False)
        self.kubectl("create", "namespace", self.namespace, namespaced=False, check=False)
        for plural in SERVED:  # served, not just Established: the API server may answer 429 for a moment
            self.kubectl_retry("get", plural)
        for manifest in self._manifests:
            self.kubectl_retry("apply", "-f", str(manifest))
        with open(self.operator_log, "wb") as log:
            self.operator = subprocess.Popen(
                self._operator_cmd,
                env={**self.env, **self._operator_env},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def stop(self) -> None:
        """Stop the operator (SIGTERM, then SIGKILL after 60 s), then the local control plane if this bed started
        one. Safe to call twice."""
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.operator.kill()
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def __enter__(self) -> OperatorBed:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ----------------------------------------------------------------- using it
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        namespaced: bool = True,
        timeout: float = 330,
    ) -> str:
        """kubectl against the bed's cluster (in its namespace unless ``namespaced=False``); its stdout. Raises
        RuntimeError with kubectl's stderr when ``check`` and it fails."""
        out = self.run_kubectl(*args, input=input, namespaced=namespaced, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def run_kubectl(
        self, *args: str, input: str | None = None, namespaced: bool = True, timeout: float = 330
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as ``kubectl`` runs it, its exit code and both outputs returned whatever they are."""
        cmd = [self.binaries.kubectl, *(("--namespace", self.namespace) if namespaced else ()), *args]
        return subprocess.run(cmd, env=self.env, input=input, capture_output=True, text=True, timeout=timeout)

    def kubectl_retry(self, *args: str, input: str | None = None, seconds: float = 60) -> str:
        """``kubectl``, retried for up to ``seconds``: right after the CRDs are Established the API server may
        still answer 429 "storage is (re)initializing" for them."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                return self.kubectl(*args, input=input)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def check_operator(self) -> None:
        """Raise RuntimeError with the tail of its log if the operator has exited."""
        if self.operator is not None and self.operator.poll() is not None:
            tail = self.operator_log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the operator exited with code {self.operator.returncode}:\n{tail}")

    def wait(self, what: str, probe: Callable[[], T], timeout: float, interval: float = 0.5) -> T:
        """Poll ``probe`` until it returns something true, and return that; checks the operator on every round.
        Raises RuntimeError naming ``what`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            self.check_operator()
            time.sleep(interval)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (run dir {self.run_dir})")

    def delete_task(self, task: str, timeout: float = 300) -> bool:
        """Delete the Task and wait until it and its pods are gone; False (the pods still waited for) if the Task
        was not gone within ``timeout`` (its finalizer did not finish)."""
        done = self.run_kubectl("delete", "task", task, "--wait=true", f"--timeout={timeout:.0f}s")
        self.wait(
            f"the pods of {task} gone",
            lambda: not self.kubectl("get", "pods", "-l", f"taskshard.io/task={task}", "-o", "name").strip(),
            timeout,
        )
        return done.returncode == 0
