"""The main job: bring up a cluster and show TaskShard working on it.

Cluster: the local control plane (etcd, kube-apiserver, controller-manager, scheduler and the local node agent,
all on 127.0.0.1) unless ``KUBECONFIG`` is set, in which case that cluster is used as it is.

Until the operator lands, the demo proves the platform it will run on: the node is Ready, a Pod runs as a local
process and its output is read back, and everything is torn down cleanly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from localkube.binaries import ensure_binaries
from localkube.cluster import LocalCluster

VENV_BIN = str(Path(sys.executable).parent)


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def main() -> int:
    binaries = ensure_binaries()
    existing = os.environ.get("KUBECONFIG")
    cluster = None
    if existing:
        say(f"using the existing cluster from KUBECONFIG={existing}")
        env = dict(os.environ)
    else:
        say("starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, node agent)")
        cluster = LocalCluster(
            Path(".run") / time.strftime("demo-%Y%m%d-%H%M%S"), binaries=binaries, agent_env_path=[VENV_BIN]
        ).start()
        env = cluster.env()
        print(f"    KUBECONFIG={cluster.kubeconfig}\n    component logs: {cluster.log_dir}")

    def kubectl(*args: str, input: str | None = None) -> str:
        out = subprocess.run([binaries.kubectl, *args], env=env, input=input, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {out.stderr}")
        return out.stdout

    try:
        say("kubectl version / get nodes")
        print(kubectl("version"))
        print(kubectl("get", "nodes", "-o", "wide"))
        say("running a Pod and reading its output")
        kubectl("create", "namespace", "taskshard-demo")
        kubectl(
            "apply",
            "-n",
            "taskshard-demo",
            "-f",
            "-",
            input=textwrap.dedent("""
            apiVersion: v1
            kind: Pod
            metadata: {name: hello}
            spec:
              restartPolicy: Never
              containers:
              - name: main
                image: example.invalid/hello:1
                command: ["python", "-c", "import platform; print('hello from a pod on', platform.node())"]
        """),
        )
        kubectl(
            "wait", "-n", "taskshard-demo", "--for=jsonpath={.status.phase}=Succeeded", "pod/hello", "--timeout=120s"
        )
        print(kubectl("get", "pods", "-n", "taskshard-demo"))
        if cluster:
            print(cluster.pod_log_path("taskshard-demo", "hello", "main").read_text())
        kubectl("delete", "namespace", "taskshard-demo", "--wait=true", "--timeout=120s")
        say("demo finished")
    finally:
        if cluster:
            say("stopping the local control plane")
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
