"""A real Kubernetes control plane on 127.0.0.1, started from locally built binaries.

:class:`LocalCluster` starts, in order, etcd, kube-apiserver (TLS, client-certificate authentication, RBAC,
service-account token signing), kube-controller-manager (garbage collection, Deployments/ReplicaSets,
namespaces, service accounts, ...), kube-scheduler and (unless ``node_agent=False``) the local node agent
(:mod:`localkube.nodeagent`), each on free loopback ports, and waits for each to be healthy before the next.
The node is ``127.0.0.1``; each pod gets a loopback address of its own (:mod:`localkube.podips`).

Contract:
- Every component's output goes to ``<run_dir>/logs/<component>.log``; on a start failure the tail of each log
  is printed and :class:`ClusterStartError` is raised, after everything already started has been stopped.
- ``stop()`` stops the components in reverse order (SIGTERM, then SIGKILL after a timeout) and is idempotent.
  The run directory is kept (logs, pod sandboxes) unless ``keep_run_dir=False``.
- The admin kubeconfig is ``<run_dir>/admin.kubeconfig``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .binaries import Binaries, ensure_binaries
from .kubeconfig import write_kubeconfig
from .pki import Pki, make_pki

NODE_NAME = "localnode"
SERVICE_CIDR = "10.0.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"


class ClusterStartError(RuntimeError):
    """A control-plane component did not become healthy."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + node agent on loopback."""

    def __init__(
        self,
        run_dir: str | os.PathLike | None = None,
        *,
        binaries: Binaries | None = None,
        node_name: str = NODE_NAME,
        keep_run_dir: bool = True,
        agent_env_path: Sequence[str] = (),
        node_agent: bool = True,
        apiserver_flags: Sequence[str] = (),
    ) -> None:
        """``apiserver_flags`` come last on kube-apiserver's command line, so they override the defaults here."""
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="localkube-")).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.run_dir / "logs"
        self.log_dir.mkdir(exist_ok=True)
        self.binaries = binaries
        self.node_name = node_name
        self.keep_run_dir = keep_run_dir
        self.agent_env_path = list(agent_env_path)
        self.node_agent = node_agent
        self.apiserver_flags = list(apiserver_flags)
        self.kubeconfig = self.run_dir / "admin.kubeconfig"
        self.api_port = 0
        self.server = ""
        self.pki: Pki | None = None
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._commands: dict[str, tuple[list[str], dict[str, str] | None]] = {}

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> LocalCluster:
        """Start every component and wait until the node is Ready. Raises ClusterStartError on failure."""
        self.binaries = self.binaries or ensure_binaries()
        try:
            self._start_all()
        except BaseException:
            self.print_log_tails()
            self.stop()
            raise
        return self

    def _start_all(self) -> None:
        b = self.binaries
        self.pki = make_pki(self.run_dir / "pki")
        p = self.pki.path
        # Step 1: etcd.
        etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                b.etcd,
                "--data-dir",
                str(self.run_dir / "etcd"),
                "--name",
                "localkube",
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"localkube=http://127.0.0.1:{peer_port}",
                "--log-level",
                "warn",
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(4 * 1024**3),
            ],
        )
        self._wait("etcd", lambda: self._http_ok(f"{etcd_url}/health"), 60)

        # Step 2: kube-apiserver.
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self._spawn(
            "kube-apiserver",
            [
                b.kube_apiserver,
                "--etcd-servers",
                etcd_url,
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                str(self.api_port),
                "--cert-dir",
                str(self.run_dir / "apiserver-certs"),
                "--tls-cert-file",
                p("apiserver.crt"),
                "--tls-private-key-file",
                p("apiserver.key"),
                "--client-ca-file",
                p("ca.crt"),
                "--service-account-issuer",
                ISSUER,
                "--api-audiences",
                ISSUER,
                "--service-account-key-file",
                p("sa.pub"),
                "--service-account-signing-key-file",
                p("sa.key"),
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--authorization-mode",
                "RBAC",
                "--endpoint-reconciler-type",
                "none",
                "--allow-privileged=true",
                "--profiling=false",
                "--enable-priority-and-fairness=false",
                "--v",
                "1",
                *self.apiserver_flags,
            ],
        )
        write_kubeconfig(
            self.kubeconfig, self.server, p("ca.crt"), user="admin", cert=p("admin.crt"), key=p("admin.key")
        )
        self._wait("kube-apiserver", self._apiserver_ready, 120)

        # Step 3: controller-manager and scheduler (admin credentials: test infrastructure).
        self._spawn(
            "kube-controller-manager",
            [
                b.kube_controller_manager,
                *self._component_flags(),
                "--service-account-private-key-file",
                p("sa.key"),
                "--root-ca-file",
                p("ca.crt"),
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--allocate-node-cidrs=false",
                "--controllers",
                "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
                "--concurrent-gc-syncs",
                "10",
                "--v",
                "1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                b.kube_scheduler,
                *self._component_flags(),
                "--v",
                "1",
            ],
        )
        # Step 4: the node agent (a stand-in for the kubelet, see localkube.nodeagent). Without it pods stay
        # Pending (no node), which is what a control-plane-only benchmark wants.
        if not self.node_agent:
            self._wait("default service account", self._default_sa_exists, 60)
            return
        agent_env = dict(os.environ)
        agent_env.pop("KUBECONFIG", None)
        if self.agent_env_path:
            agent_env["PATH"] = os.pathsep.join([*self.agent_env_path, agent_env.get("PATH", "")])
        self._spawn(
            "node-agent",
            [
                sys.executable,
                "-m",
                "localkube.nodeagent",
                "--kubeconfig",
                str(self.kubeconfig),
                "--node-name",
                self.node_name,
                "--root",
                str(self.run_dir / "node"),
                "--api-host",
                "127.0.0.1",
                "--api-port",
                str(self.api_port),
                *(f"--keep-visible={path}" for path in self._keep_visible()),
            ],
            env=agent_env,
        )
        self._wait("node-agent", self._node_ready, 90)
        self._wait("default service account", self._default_sa_exists, 60)

    def stop(self) -> None:
        """Stop every component, newest first. Safe to call more than once."""
        while self._procs:
            name, proc = self._procs.pop()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30 if name == "node-agent" else 10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if not self.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def restart_apiserver(self, timeout: float = 120) -> None:
        """Crash kube-apiserver (SIGKILL) and start it again with the same command, port and certificates, then
        wait until it is ready: what its clients see of an apiserver restart (connections and watches cut, the
        server back at the same address). Raises ClusterStartError when it does not come back."""
        index = next(i for i, (name, _) in enumerate(self._procs) if name == "kube-apiserver")
        _, proc = self._procs.pop(index)
        proc.kill()
        proc.wait()
        cmd, env = self._commands["kube-apiserver"]
        self._spawn("kube-apiserver", cmd, env)
        self._wait("kube-apiserver after its restart", self._apiserver_ready, timeout)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------------- helpers
    def env(self) -> dict[str, str]:
        """Environment for clients of this cluster: KUBECONFIG plus kubectl and helm on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        if self.binaries:
            env["PATH"] = os.pathsep.join([*self.binaries.path_dirs, env.get("PATH", "")])
        return env

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        namespace: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess:
        """Run the cluster's kubectl with the admin kubeconfig; text output; raises on failure when check."""
        cmd = [self.binaries.kubectl, "--kubeconfig", str(self.kubeconfig)]
        if namespace:
            cmd += ["--namespace", namespace]
        result = subprocess.run([*cmd, *args], input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def pod_log_path(self, namespace: str, pod: str, container: str) -> Path:
        """The file holding a container's stdout and stderr (all its restarts, appended)."""
        return self.run_dir / "node" / "logs" / f"{namespace}_{pod}_{container}.log"

    def print_log_tails(self, lines: int = 40) -> None:
        for log in sorted(self.log_dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            print(f"----- {log.name} (last {len(tail)} lines) -----", file=sys.stderr)
            print("\n".join(tail), file=sys.stderr)

    @staticmethod
    def _keep_visible() -> list[str]:
        """What pods must see whatever they mount over /tmp: this Python environment and the project's checkout
        (an editable install imports from it). They stand in for the contents of a container image."""
        project = Path(__file__).resolve().parents[2]
        return sorted({sys.prefix, str(project)})

    def _component_flags(self) -> list[str]:
        """Flags shared by controller-manager and scheduler: admin kubeconfig, loopback, no leader election."""
        kubeconfig = str(self.kubeconfig)
        return [
            *("--kubeconfig", kubeconfig, "--authentication-kubeconfig", kubeconfig),
            *("--authorization-kubeconfig", kubeconfig, "--authentication-skip-lookup=true"),
            *("--bind-address", "127.0.0.1", "--secure-port", str(free_port()), "--leader-elect=false"),
        ]

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self._procs.append((name, proc))
        self._commands[name] = (cmd, env)

    def _wait(self, what: str, probe, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise ClusterStartError(f"{name} exited with code {proc.returncode} while waiting for {what}")
            try:
                if probe():
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.5)
        raise ClusterStartError(f"{what} was not ready after {timeout:.0f}s")

    @staticmethod
    def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.status == 200

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.pki.ca_crt)
        ctx.load_cert_chain(self.pki.path("admin.crt"), self.pki.path("admin.key"))
        return ctx

    def _apiserver_ready(self) -> bool:
        return self._http_ok(f"{self.server}/readyz", self._admin_ssl())

    def _node_ready(self) -> bool:
        out = self.kubectl(
            "get", "node", self.node_name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
        )
        return out.stdout.strip() == "True"

    def _default_sa_exists(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0
